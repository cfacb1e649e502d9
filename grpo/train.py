"""GRPO stage: group-relative policy optimisation (Shao et al. 2024, via TRL's GRPOTrainer), an online-RL
alternative to ``ppo/`` that needs no value model: each prompt's ``num_generations`` completions are scored by the
reward functions and each one's advantage is its reward against the group's mean.

Launch alone:
    accelerate launch -m grpo.train --config recipes/demo/grpo.yaml --output_dir runs/<round>/grpo \\
        --sft_dir runs/<round>/sft --policy_dir runs/<round>/dpo --reward_model_dir runs/<round>/reward_model \\
        --ppo_unlock_json runs/<round>/ppo_unlock.json

The policy starts from the DPO candidate, the KL term is against pi_ref (the SFT model; hash verified before and
after), and the unlock decision must say unlocked, as for PPO (``rlhf.online_rl``'s docstring has the details).
"""

from __future__ import annotations

import sys

from trl import GRPOTrainer

from judging.online_stage import run_trl_online_rl_stage

from .config import GRPOStageConfig

NAME = "grpo"


def main(argv: list[str] | None = None, callbacks: list | None = None) -> dict:
    """Run the stage; returns the manifest's metrics (rank 0). ``callbacks``: extra ``TrainerCallback``s (after the
    reward-hacking tripwire, ``--tripwire_steps``; its record is the manifest's ``tripwire``).

    Raises:
        RuntimeError: locked (no override), pi_ref moved, or the reference model is not pi_ref.
    """
    return run_trl_online_rl_stage(NAME, GRPOTrainer, GRPOStageConfig, argv, callbacks)


if __name__ == "__main__":
    main(sys.argv[1:])
