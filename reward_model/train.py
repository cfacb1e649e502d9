"""Reward-model stage: a Bradley-Terry reward model (TRL RewardTrainer) and its agreement with expert labels.

Launch alone:
    accelerate launch -m reward_model.train --config recipes/demo/reward.yaml --sft_dir runs/<round>/sft

The stage records its measurements only: the RM's agreement with the expert (majority) label on held-out pairs
(``metrics.rm_agreement``) and the inter-annotator agreement on the same pairs
(``metrics.inter_annotator_agreement``). The flow decides the PPO unlock from them (``judging.unlock``,
DESIGN.md principle 2: DPO first), so the research override never reaches this stage or its cache key.
With LoRA the score head is trained and saved (``modules_to_save=["score"]``); after saving, the checkpoint is
reloaded and must reproduce the held-out scores (the "random head after reload" pitfall).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

import numpy as np
from datasets import Dataset
from transformers import set_seed
from trl import RewardTrainer

from data.decontamination import decontaminate_stage_rows
from data.fingerprint import data_fingerprint
from data.loaders import load_pairs
from data.pairs import prepare_pairs
from data.schemas import pair_to_trl
from data.validation import handle_rejects
from judging.agreement import expert_labels, inter_annotator_agreement, rm_agreement
from judging.judges import judge_pairs
from judging.model_judges import RewardModelJudge, judgment_scores
from judging.scoring import check_reload_scores, load_reward_model
from rlhf.checkpoint import gather_full_state_dict, save_checkpoint
from rlhf.precision import keep_in_fp32
from rlhf.config import parse_stage_config, peft_config
from rlhf.efficiency import count_tokens, group_by_length, summary as _numbers, train_efficiency
from rlhf.machine import auto_batch_size
from rlhf.entrypoint import setup_stage
from rlhf.lineage import content_hash
from rlhf.manifest import read_manifest, stage_manifest
from rlhf.rundir import install_failure_hook
from rlhf.resume import ResumeCallback, check_finished, prune_trainer_checkpoints, resolve_resume, training_record
from rlhf.tracking import log_summary

from .config import RewardStageConfig

logger = logging.getLogger("reward_model.train")


def main(argv: list[str] | None = None) -> dict:
    (args,) = parse_stage_config((RewardStageConfig,), argv)
    install_failure_hook(args.output_dir)  # the flow reads the reason, whatever the exception
    setup_stage("reward_model", args)
    set_seed(args.seed)  # before any module is built: a new head or LoRA adapter is seeded too
    out = Path(args.output_dir)
    start = read_manifest(args.sft_dir)["outputs"]["checkpoint"] if args.sft_dir else args.model_name_or_path

    pairs = load_pairs(
        args.train_data,
        mode=args.data_mode,
        max_reject_rate=args.max_reject_rate,
        rejects_path=out / "rejects-data.jsonl",
        use_first=args.max_train_samples,
    )
    decontamination = decontaminate_stage_rows(
        pairs, args.decontaminate_against, args.decontaminate, label=args.train_data, log=logger.info
    )
    held_out = load_pairs(
        args.agreement_data,
        mode=args.agreement_data_mode,
        max_reject_rate=args.agreement_max_reject_rate,
        rejects_path=out / "rejects-agreement.jsonl",
        min_labels=2,  # checked before training: a pair without 2+ annotator labels cannot measure agreement
    )
    scored = held_out[: args.max_agreement_pairs] if args.max_agreement_pairs else held_out
    model, tokenizer = load_reward_model(start, new_head=True)
    keep_in_fp32(model.score)  # scores in fp32 under bf16 autocast too: they decide ties and agreement
    prepared = prepare_pairs(
        pairs, tokenizer, args.max_length, file=args.train_data, require_fit=True,
        special_tokens=args.special_tokens_in_text,
    )
    handle_rejects(prepared.rejects, len(pairs), args, "truncation")
    trainer = RewardTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list([pair_to_trl(p) for p in prepared.pairs]),
        processing_class=tokenizer,
        peft_config=peft_config(args, task_type="SEQ_CLS", modules_to_save=["score"]),
        callbacks=[ResumeCallback()],  # marks complete Trainer checkpoints (rlhf/resume.py)
    )
    if len(trainer.train_dataset) != len(prepared.pairs):  # TRL filters over-long pairs without naming them
        raise RuntimeError(f"RewardTrainer kept {len(trainer.train_dataset)} of {len(prepared.pairs)} checked pairs")
    group_by_length(trainer, lambda row: len(row["chosen_ids"]) + len(row["rejected_ids"]))
    tokens = count_tokens(trainer)
    resumed_from = resolve_resume(args, trainer.model)  # a missing or incomplete checkpoint is an error
    result = trainer.train(resume_from_checkpoint=resumed_from)
    check_finished(trainer, resumed_from)
    training = training_record(trainer, resumed_from, result)
    efficiency = train_efficiency(trainer, result, tokens, "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32")
    full_weights = None if args.use_peft else gather_full_state_dict(trainer)  # ZeRO-3: a collective, every rank
    # accelerate leaves its autocast wrapper on the model's forward; the held-out scores are taken without it, in
    # fp32 as every later reader of the checkpoint scores (the reload check, the gates).
    model = trainer.accelerator.unwrap_model(trainer.model, keep_fp32_wrapper=False)
    model = model.merge_and_unload() if args.use_peft else model
    checkpoint = save_checkpoint(model, tokenizer, out / "checkpoint", state_dict=full_weights)

    # Agreement on held-out multi-annotator pairs; the reloaded checkpoint must reproduce the live model's scores.
    # Scored once, at full batch; the reload check re-scores only its 8 pairs and the gates reuse these scores
    # (agreement_scores.jsonl) instead of scoring again.
    max_len = args.max_length or 512
    batch = auto_batch_size(args.scoring_batch_size, model.config, max_len)
    t_score = time.perf_counter()
    # The RM judges the held-out pairs through the one judge interface (judging.judges), as the gates' judge does.
    rm_judge = RewardModelJudge(model, tokenizer, path=str(checkpoint), batch_size=batch, max_length=max_len)
    first, second = judgment_scores(judge_pairs(rm_judge, scored))
    reload_dev = check_reload_scores(str(checkpoint), tokenizer, first, second, scored, batch, max_len)
    efficiency["judging_seconds"] = time.perf_counter() - t_score  # held-out scoring + the reload check

    # Inter-annotator agreement on every held-out pair; the RM on the (possibly smaller) scored subset.
    labels = [[lab.preference for lab in p.labels] for p in held_out]  # ragged: annotators per pair may differ
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
    logger.info(
        "RM agreement with expert labels %.4f (n %d) vs inter-annotator agreement %.4f (n %d); the flow decides PPO",
        rm.agreement, rm.n, iaa.pairwise_agreement_decisive, iaa.n_decisive_comparisons,
    )

    metrics = {
        "train_loss": training["train_loss"],  # over every step, a resumed run included
        "train_steps": result.global_step,
        "n_pairs": len(prepared.pairs),
        "n_data_rejected": len(pairs.rejects),
        "n_rejected": len(prepared.rejects),
        "n_held_out": len(held_out),
        "n_held_out_rejected": len(held_out.rejects),
        "n_scored": len(scored),
        "reload_max_abs_diff": reload_dev,
        "scoring_batch_size": batch,
        "threads": efficiency["threads"],
        "efficiency": efficiency,
        "rm_agreement": rm.to_dict(),
        "inter_annotator_agreement": iaa.to_dict(),
    }
    log_summary(
        {
            "train_loss": training["train_loss"],
            "rm_agreement": rm.agreement,
            "inter_annotator_agreement": iaa.pairwise_agreement_decisive,
            **_numbers(efficiency),
        },
        report_to=args.report_to,
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
            "agreement_scores": str((out / "agreement_scores.jsonl").resolve()),
            "decontamination": decontamination,
        },
        metrics={**metrics, "rejects_files": sorted(str(p) for p in out.glob("rejects-*.jsonl"))},
        extra={"training": training},
    )
    prune_trainer_checkpoints(out)  # resume state only; after the manifest, so a kill before it keeps them
    return metrics


if __name__ == "__main__":
    main(sys.argv[1:])
