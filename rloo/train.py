"""RLOO stage: REINFORCE leave-one-out (Ahmadian et al. 2024, via TRL's RLOOTrainer), an online-RL alternative
to ``ppo/`` that needs no value model: each completion's baseline is the mean reward of the other
``num_generations - 1`` completions of its prompt, and the KL to pi_ref is folded into the reward.

Launch alone:
    accelerate launch -m rloo.train --config recipes/demo/rloo.yaml --output_dir runs/<round>/rloo \\
        --sft_dir runs/<round>/sft --policy_dir runs/<round>/dpo --reward_model_dir runs/<round>/reward_model \\
        --ppo_unlock_json runs/<round>/ppo_unlock.json

The policy starts from the DPO candidate, the KL term is against pi_ref (the SFT model; hash verified before and
after), and the unlock decision must say unlocked, as for PPO (``rlhf.online_rl``'s docstring has the details).
"""

from __future__ import annotations

import sys

from trl import RLOOTrainer

from judging.online_stage import run_trl_online_rl_stage

from .config import RLOOStageConfig

NAME = "rloo"


def main(argv: list[str] | None = None, callbacks: list | None = None) -> dict:
    """Run the stage; returns the manifest's metrics (rank 0). ``callbacks``: extra ``TrainerCallback``s (after the
    reward-hacking tripwire, ``--tripwire_steps``; its record is the manifest's ``tripwire``).

    Raises:
        RuntimeError: locked (no override), pi_ref moved, or the reference model is not pi_ref.
    """
    return run_trl_online_rl_stage(NAME, RLOOTrainer, RLOOStageConfig, argv, callbacks)


if __name__ == "__main__":
    main(sys.argv[1:])
