"""The body of the online-RL stages on TRL (``grpo``, ``rloo``): the same inputs, unlock rule, training rows,
decontamination and reward-hacking tripwire for any TRL trainer class, so each stage's ``train.py`` only names its
trainer and its config.

The order matters and is the same for every such stage: pi_ref's hash is verified before anything loads
(``rlhf.online_rl.resolve_inputs``), the unlock decision is read before the data (a locked stage loads nothing),
training prompts that overlap a gate suite are removed (or fail the stage) as every training stage's rows are, and
the tripwire's baseline snapshots are removed only after the manifest is written.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from data.decontamination import decontaminate_stage_rows
from data.fingerprint import data_fingerprint, local_path
from data.loaders import load_eval_prompts
from rlhf.online_rl import resolve_inputs, run_online_rl
from rlhf.trainer_stage import TrainerStage, TrainingData

from .online_reward import NAME as JUDGE_REWARD
from .online_reward import check_references, judge_reward
from .online_tripwire import tripwire_callback
from .unlock import require_unlocked


def run_trl_online_rl_stage(name: str, trainer_cls: type, config_cls: type, argv: Sequence[str] | None = None,
                            callbacks: list | None = None) -> dict[str, Any]:
    """Run the online-RL stage ``name`` with TRL's ``trainer_cls`` (``GRPOTrainer``, ``RLOOTrainer``) on the
    arguments ``argv`` parsed into ``config_cls``; returns the manifest's metrics (rank 0).

    ``callbacks``: extra ``TrainerCallback``s, after the reward-hacking tripwire (``--tripwire_steps``; its record
    is the manifest's ``tripwire``).

    Raises:
        RuntimeError: locked (no override), pi_ref moved, or the reference model is not pi_ref.
        ValueError: a tripwire bound is invalid, or the gold model is the optimised reward model; the judge reward
            (``reward_functions: [judge]``) with a bad ``reward_judge`` or prompts without a reference answer.
    """
    logger = logging.getLogger(f"{name}.train")
    stage = TrainerStage.start(name, config_cls, list(argv) if argv is not None else None)
    args = stage.args
    inputs = resolve_inputs(args)  # pi_ref's hash verified before anything loads
    inputs["ppo_unlock"] = require_unlocked(args.ppo_unlock_json, inputs["_rm_metrics"], stage=name,
                                            rm_manifest=inputs["reward_model_manifest"])
    rows = load_eval_prompts(args.train_data, mode=args.data_mode, max_reject_rate=args.max_reject_rate,
                             rejects_path=stage.out / "rejects-data.jsonl", limit=args.max_train_samples)
    decontamination = decontaminate_stage_rows(rows, args.decontaminate_against, args.decontaminate,
                                               label=args.train_data, log=logger.info)
    data = TrainingData(data_fingerprint(args.train_data), decontamination, n_data_rejected=len(rows.rejects),
                        n_rejected=0, path=local_path(args.train_data))
    prompts = [r.prompt for r in rows]
    rewards, references = {}, None
    if JUDGE_REWARD in args.reward_functions:  # checked before any model loads: every prompt needs its reference
        references = check_references(list(rows), args.train_data)
        rewards[JUDGE_REWARD] = judge_reward(args.reward_judge, reward_model=inputs["reward_model"])
    # None when the tripwire is off or the run is shorter than one check
    tripwire = tripwire_callback(args, prompts, inputs["reward_model_hash"], train_references=references)
    metrics = run_online_rl(stage, trainer_cls, inputs, prompts, data,
                            callbacks=[*([tripwire] if tripwire else []), *(callbacks or [])],
                            references=references, rewards=rewards)
    if tripwire is not None and args.process_index == 0:
        tripwire.remove_snapshots()  # after the manifest: the saved checkpoint holds what it had
    return metrics
