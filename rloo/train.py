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

import logging
import sys

from trl import RLOOTrainer

from data.decontamination import decontaminate_stage_rows
from data.fingerprint import data_fingerprint, local_path
from data.loaders import load_eval_prompts
from judging.online_tripwire import tripwire_callback
from judging.unlock import require_unlocked
from rlhf.online_rl import resolve_inputs, run_online_rl
from rlhf.trainer_stage import TrainerStage, TrainingData

from .config import RLOOStageConfig

logger = logging.getLogger("rloo.train")

NAME = "rloo"


def main(argv: list[str] | None = None, callbacks: list | None = None) -> dict:
    """Run the stage; returns the manifest's metrics (rank 0). ``callbacks``: extra ``TrainerCallback``s (after the
    reward-hacking tripwire, ``--tripwire_steps``; its record is the manifest's ``tripwire``).

    Raises:
        RuntimeError: locked (no override), pi_ref moved, or the reference model is not pi_ref.
    """
    stage = TrainerStage.start(NAME, RLOOStageConfig, argv)
    args = stage.args
    inputs = resolve_inputs(args)  # pi_ref's hash verified before anything loads
    inputs["ppo_unlock"] = require_unlocked(args.ppo_unlock_json, inputs["_rm_metrics"], stage=NAME,
                                            rm_manifest=inputs["reward_model_manifest"])
    rows = load_eval_prompts(args.train_data, mode=args.data_mode, max_reject_rate=args.max_reject_rate,
                             rejects_path=stage.out / "rejects-data.jsonl", limit=args.max_train_samples)
    # prompts that overlap a gate suite are removed (or fail the stage) as every training stage's rows are
    decontamination = decontaminate_stage_rows(rows, args.decontaminate_against, args.decontaminate,
                                               label=args.train_data, log=logger.info)
    data = TrainingData(data_fingerprint(args.train_data), decontamination, n_data_rejected=len(rows.rejects),
                        n_rejected=0, path=local_path(args.train_data))
    prompts = [r.prompt for r in rows]
    # the reward-hacking tripwire (judging.online_tripwire): None when off or when the run is shorter than a check
    tripwire = tripwire_callback(args, prompts, inputs["reward_model_hash"])
    metrics = run_online_rl(stage, RLOOTrainer, inputs, prompts, data,
                            callbacks=[*([tripwire] if tripwire else []), *(callbacks or [])])
    if tripwire is not None and args.process_index == 0:
        tripwire.remove_snapshots()  # after the manifest: the saved checkpoint holds what it had
    return metrics


if __name__ == "__main__":
    main(sys.argv[1:])
