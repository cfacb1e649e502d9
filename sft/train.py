"""SFT stage: fine-tune the base checkpoint on demonstrations, then freeze the result as pi_ref.

Launch alone:
    accelerate launch -m sft.train --config recipes/demo/sft.yaml [--key value ...]

Writes ``<output_dir>/checkpoint`` (the SFT model), ``<output_dir>/pi_ref`` (a read-only copy whose content hash
DPO and PPO verify) and ``<output_dir>/manifest.json``.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, set_seed
from trl import SFTTrainer

from data.decontamination import decontaminate_stage_rows
from data.loaders import load_sft
from data.fingerprint import data_fingerprint
from data.validation import DataValidationError, handle_rejects
from rlhf.lineage import content_hash
from rlhf.models import model_fingerprint, resolve_base_model
from rlhf.checkpoint import freeze_dir, gather_full_state_dict, save_checkpoint
from rlhf.config import parse_stage_config, peft_config
from rlhf.efficiency import count_tokens, group_by_length, summary as _numbers, train_efficiency
from rlhf.entrypoint import setup_stage
from rlhf.manifest import stage_manifest
from rlhf.rundir import install_failure_hook
from rlhf.resume import ResumeCallback, check_finished, prune_trainer_checkpoints, resolve_resume, training_record
from rlhf.weights import atomic_copytree, load_checked
from rlhf.tracking import log_summary

from .config import SFTStageConfig
from .prepare import prepare_sft_rows
from .style_audit import audit_style

logger = logging.getLogger("sft.train")


def main(argv: list[str] | None = None) -> dict:
    (args,) = parse_stage_config((SFTStageConfig,), argv)
    install_failure_hook(args.output_dir)  # the flow reads the reason, whatever the exception
    setup_stage("sft", args)
    set_seed(args.seed)  # before any module is built: a new head or LoRA adapter is seeded too
    out = Path(args.output_dir)
    base = resolve_base_model(args.model_name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(base)

    conversations = load_sft(
        args.train_data,
        mode=args.data_mode,
        max_reject_rate=args.max_reject_rate,
        rejects_path=out / "rejects-data.jsonl",
        use_first=args.max_train_samples,
    )
    decontamination = decontaminate_stage_rows(
        conversations, args.decontaminate_against, args.decontaminate, label=args.train_data, log=logger.info
    )
    prepared = prepare_sft_rows(
        conversations, tokenizer, args.max_length, file=args.train_data, special_tokens=args.special_tokens_in_text
    )
    handle_rejects(prepared.rejects, len(conversations), args, "tokenization")
    audit = audit_style(
        [r["completion"][0]["content"] for r in prepared.rows], max_opener_share=args.style_audit_max_opener_share
    )
    (logger.warning if not audit.passed else logger.info)("style audit: %s", audit.message)
    if not audit.passed and args.style_audit_action == "fail":
        raise SystemExit(f"style audit failed: {audit.message}")

    model = load_checked(AutoModelForCausalLM, base, what="SFT base model")
    train_dataset = Dataset.from_list(prepared.rows)
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=train_dataset,
        processing_class=tokenizer,
        peft_config=peft_config(args),
        callbacks=[ResumeCallback()],  # marks complete Trainer checkpoints (rlhf/resume.py)
    )
    # TRL drops rows whose labels are all masked ("Dropping fully masked examples"); we name and count them.
    kept = set(trainer.train_dataset["id"]) if "id" in trainer.train_dataset.column_names else None
    if kept is not None and len(kept) != len(prepared.rows):
        lost = [r["id"] for r in prepared.rows if r["id"] not in kept]
        rate = len(lost) / len(prepared.rows)
        logger.warning("TRL dropped %d fully masked rows: %s", len(lost), lost[:20])
        if rate > args.max_fully_masked_rate:
            raise DataValidationError(
                f"{len(lost)} rows fully masked after tokenization (ids {lost[:10]})",
                file=args.train_data,
                field="messages",
            )
    group_by_length(trainer, lambda row: len(row["input_ids"]))
    tokens = count_tokens(trainer)
    resumed_from = resolve_resume(args, trainer.model)  # a missing or incomplete checkpoint is an error
    result = trainer.train(resume_from_checkpoint=resumed_from)
    check_finished(trainer, resumed_from)
    training = training_record(trainer, resumed_from, result)
    efficiency = train_efficiency(trainer, result, tokens, "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32")
    full_weights = None if args.use_peft else gather_full_state_dict(trainer)  # ZeRO-3: a collective, every rank
    if not trainer.accelerator.is_main_process:  # multi-process (DDP): rank 0 alone saves and writes the manifest
        return {"train_loss": result.training_loss, "train_steps": result.global_step, "rank": trainer.args.process_index}

    model = trainer.model
    if args.use_peft:  # pi_ref must be a whole model: merge the adapters so DPO's reference is the SFT model
        model = model.merge_and_unload()
    checkpoint = save_checkpoint(model, tokenizer, out / "checkpoint", state_dict=full_weights)
    # pi_ref: a frozen, content-hashed copy of the SFT output (DESIGN.md principle 3).
    pi_ref = atomic_copytree(checkpoint, out / "pi_ref")  # temp folder, then rename: never half-copied
    pi_ref_hash = freeze_dir(pi_ref)

    metrics = {
        "train_loss": training["train_loss"],  # over every step, a resumed run included
        "train_steps": result.global_step,
        "n_rows": len(prepared.rows),
        "n_data_rejected": len(conversations.rejects),  # schema rejects (lenient mode), listed in rejects-data.jsonl
        "n_rejected": len(prepared.rejects),  # tokenization rejects (rejects-tokenization.jsonl)
        "n_prompt_turns_dropped": prepared.n_prompt_turns_dropped,
        "style_audit": audit.to_dict(),
        "threads": efficiency["threads"],
        "efficiency": efficiency,
        "processes": trainer.args.world_size,
        "loss_curve": [h["loss"] for h in trainer.state.log_history if "loss" in h],  # per logging step
    }
    log_summary(
        {**{k: v for k, v in metrics.items() if not isinstance(v, dict)}, **_numbers(efficiency)},
        table={"style_audit_openers": [dict(opener=o, count=c, share=s) for o, c, s in audit.top_openers]},
        report_to=args.report_to,
    )
    stage_manifest(
        "sft",
        args,
        inputs={
            "base_model": args.model_name_or_path,
            "base_model_hash": model_fingerprint(base),
            "train_data": args.train_data,
            "train_data_hash": data_fingerprint(args.train_data),
        },
        outputs={
            "checkpoint": str(checkpoint.resolve()),
            "checkpoint_hash": content_hash(checkpoint),
            "pi_ref": str(pi_ref.resolve()),
            "pi_ref_hash": pi_ref_hash,
            "decontamination": decontamination,
        },
        metrics={**metrics, "rejects_files": sorted(str(p) for p in out.glob("rejects-*.jsonl"))},
        extra={"training": training},
    )
    prune_trainer_checkpoints(out)  # resume state only; after the manifest, so a kill before it keeps them
    logger.info("SFT done: loss %.4f, pi_ref %s (hash %s)", training["train_loss"], pi_ref, pi_ref_hash[:16])
    return metrics


if __name__ == "__main__":
    main(sys.argv[1:])
