"""Reward-model stage: a Bradley-Terry reward model (TRL RewardTrainer), its agreement with expert labels, and
the PPO unlock decision (DESIGN.md principle 2: DPO first).

Launch alone:
    accelerate launch -m reward_model.train --config recipes/demo/reward.yaml --sft_dir runs/<round>/sft

PPO is unlocked only if the RM's agreement with the expert (majority) label on held-out pairs is higher than
the inter-annotator agreement on the same pairs. Both numbers and the decision go into the manifest.
With LoRA the score head is trained and saved (``modules_to_save=["score"]``); after saving, the checkpoint is
reloaded and must reproduce the held-out scores (the "random head after reload" pitfall).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import numpy as np
from datasets import Dataset
from transformers import AutoModelForSequenceClassification, AutoTokenizer
from trl import RewardTrainer, TrlParser

from data.loaders import load_pairs
from data.schemas import pair_to_trl
from rlhf.hashing import content_hash
from rlhf.manifest import read_manifest
from rlhf.stage import data_fingerprint, handle_rejects, peft_config, save_checkpoint, setup_stage, stage_manifest
from rlhf.tracking import log_summary

from dpo.prepare import prepare_pairs

from judging.agreement import expert_labels, inter_annotator_agreement, rm_agreement
from .config import RewardStageConfig
from .scoring import score
from judging.unlock import ppo_unlock_decision

logger = logging.getLogger("reward_model.train")


def load_reward_model(path: str):
    """Load a reward model (sequence classifier, 1 label) with its pad token set (pad == eos on SmolLM2)."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)
    model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def score_pairs(model, tokenizer, pairs, batch_size: int, max_length: int) -> tuple[np.ndarray, np.ndarray]:
    """Scores of (first, second) responses of each pair: two float arrays of shape ``(len(pairs),)``."""
    prompts = [[m.model_dump() for m in p.prompt] for p in pairs]
    first = score(
        model,
        tokenizer,
        prompts,
        [p.chosen for p in pairs],
        batch_size=batch_size,
        max_length=max_length,
        desc="scoring first responses",
    )
    second = score(
        model,
        tokenizer,
        prompts,
        [p.rejected for p in pairs],
        batch_size=batch_size,
        max_length=max_length,
        desc="scoring second responses",
    )
    return first, second


def main(argv: list[str] | None = None) -> dict:
    (args,) = TrlParser((RewardStageConfig,)).parse_args_and_config(argv)
    setup_stage("reward_model", args)
    out = Path(args.output_dir)
    start = read_manifest(args.sft_dir)["outputs"]["checkpoint"] if args.sft_dir else args.model_name_or_path

    pairs = load_pairs(
        args.train_data,
        mode=args.data_mode,
        max_reject_rate=args.max_reject_rate,
        rejects_path=out / "rejects-data.jsonl",
        limit=args.max_train_samples,
    )
    held_out = load_pairs(
        args.agreement_data,
        mode=args.agreement_data_mode,
        max_reject_rate=args.agreement_max_reject_rate,
        rejects_path=out / "rejects-agreement.jsonl",
    )
    scored = held_out[: args.max_agreement_pairs] if args.max_agreement_pairs else held_out
    model, tokenizer = load_reward_model(start)
    prepared = prepare_pairs(pairs, tokenizer, args.max_length, file=args.train_data, require_fit=True)
    handle_rejects(prepared.rejects, len(pairs), args, "truncation")
    trainer = RewardTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list([pair_to_trl(p) for p in prepared.pairs]),
        processing_class=tokenizer,
        peft_config=peft_config(args, task_type="SEQ_CLS", modules_to_save=["score"]),
    )
    if len(trainer.train_dataset) != len(prepared.pairs):  # TRL filters over-long pairs without naming them
        raise RuntimeError(f"RewardTrainer kept {len(trainer.train_dataset)} of {len(prepared.pairs)} checked pairs")
    result = trainer.train()
    model = trainer.model.merge_and_unload() if args.use_peft else trainer.model
    checkpoint = save_checkpoint(model, tokenizer, out / "checkpoint")

    # Agreement on held-out multi-annotator pairs; the reloaded checkpoint must reproduce the live model's scores.
    max_len = args.max_length or 512
    first, second = score_pairs(model, tokenizer, scored, args.scoring_batch_size, max_len)
    reloaded, _ = load_reward_model(str(checkpoint))
    r_first, r_second = score_pairs(reloaded, tokenizer, scored[:8], args.scoring_batch_size, max_len)
    reload_dev = float(
        np.max(np.abs(np.concatenate([r_first - first[: len(r_first)], r_second - second[: len(r_second)]])))
    )
    if reload_dev > 1e-3:
        raise RuntimeError(
            f"{checkpoint}: reloaded reward model gives different scores (max |diff| {reload_dev:.4g}); "
            "was the score head saved?"
        )

    # Inter-annotator agreement on every held-out pair; the RM on the (possibly smaller) scored subset.
    labels = np.array([[lab.preference for lab in p.labels] for p in held_out])
    iaa = inter_annotator_agreement(labels)
    rm = rm_agreement(first, second, expert_labels(labels[: len(scored)]))
    # Per-pair judgments, so the gate stage can measure this judge's agreement with the humans item by item.
    with open(out / "agreement_scores.jsonl", "w") as f:
        for p, s1, s2 in zip(scored, first, second):
            f.write(
                json.dumps(
                    {
                        "id": p.id,
                        "score_first": float(s1),
                        "score_second": float(s2),
                        "labels": [lab.preference for lab in p.labels],
                    }
                )
                + "\n"
            )
    decision = ppo_unlock_decision(rm, iaa, override=args.ppo_override, override_reason=args.ppo_override_reason)
    logger.info("PPO unlock: %s", decision.summary())

    metrics = {
        "train_loss": result.training_loss,
        "train_steps": result.global_step,
        "n_pairs": len(prepared.pairs),
        "n_data_rejected": len(pairs.rejects),
        "n_rejected": len(prepared.rejects),
        "n_held_out": len(held_out),
        "n_held_out_rejected": len(held_out.rejects),
        "n_scored": len(scored),
        "reload_max_abs_diff": reload_dev,
        "rm_agreement": rm.to_dict(),
        "inter_annotator_agreement": iaa.to_dict(),
    }
    log_summary(
        {
            "train_loss": result.training_loss,
            "rm_agreement": decision.rm_agreement,
            "inter_annotator_agreement": decision.inter_annotator_agreement,
            "ppo_unlocked": decision.unlocked,
        }
    )
    stage_manifest(
        "reward_model",
        args,
        inputs={
            "start_checkpoint": start,
            "train_data": args.train_data,
            "train_data_hash": data_fingerprint(args.train_data),
            "agreement_data": args.agreement_data,
            "agreement_data_hash": data_fingerprint(args.agreement_data),
        },
        outputs={
            "checkpoint": str(checkpoint.resolve()),
            "checkpoint_hash": content_hash(checkpoint),
            "ppo_unlock": decision.to_dict(),
            "agreement_scores": str((out / "agreement_scores.jsonl").resolve()),
        },
        metrics={**metrics, "rejects_files": sorted(str(p) for p in out.glob("rejects-*.jsonl"))},
    )
    return metrics


if __name__ == "__main__":
    main(sys.argv[1:])
