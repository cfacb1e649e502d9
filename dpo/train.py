"""DPO stage: train the policy against the frozen pi_ref (Rafailov et al. 2023, via TRL's DPOTrainer).

Launch alone:
    accelerate launch -m dpo.train --config recipes/demo/dpo.yaml --sft_dir runs/<round>/sft

pi_ref is loaded from the SFT stage's frozen copy and passed to DPOTrainer explicitly (with LoRA too, so the
reference is never the base model). Its content hash is verified before and after training. Before the first
update the stage checks the DPO invariant: with policy = pi_ref and dropout off, every pair's loss is ln 2 and
every reward margin is 0 (DESIGN.md principle 3).
"""

from __future__ import annotations

import logging
import math
import sys
from pathlib import Path

from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, set_seed
from trl import DPOTrainer

from .trainer import FP32LogProbDPOTrainer

from data.decontamination import decontaminate_stage_rows
from data.fingerprint import data_fingerprint
from data.loaders import load_pairs
from data.schemas import pair_to_trl
from data.validation import handle_rejects
from rlhf.lineage import content_hash
from rlhf.rundir import install_failure_hook
from rlhf.resume import ResumeCallback, check_finished, prune_trainer_checkpoints, resolve_resume, training_record
from rlhf.weights import load_checked
from rlhf.manifest import read_manifest
from rlhf.checkpoint import gather_full_state_dict, save_checkpoint, verify_hash
from rlhf.config import parse_stage_config, peft_config
from rlhf.efficiency import count_tokens, group_by_length, summary as _numbers, train_efficiency
from rlhf.entrypoint import setup_stage
from rlhf.manifest import stage_manifest
from rlhf.tracking import log_summary

from .config import DPOStageConfig
from data.pairs import prepare_pairs

logger = logging.getLogger("dpo.train")


def step0_check(trainer: DPOTrainer, dataset: Dataset, tolerance: float) -> dict:
    """Check the step-0 DPO invariant (policy = pi_ref, dropout off): every pair's loss is ln 2, every margin 0.

    One ``evaluate`` call over all pairs in one batch (issue 12: it was one call per pair, about a training step).
    It gives the mean loss and mean margin; per pair, loss = softplus(-m) with m the reward margin, and
    softplus(-m) - ln 2 = -m/2 + m^2/8 + O(m^4), so mean loss within ``tolerance`` of ln 2 and |mean margin| within
    ``tolerance / n`` hold only if no single pair's margin exceeds ``tolerance`` (and canceling margins raise the
    mean loss by mean(m^2)/8). When the batch check fails, each pair is evaluated alone to name the broken one.

    Returns:
        ``{"step0_loss_max_dev": float, "step0_margin_max_abs": float, "step0_n": int}`` (deviations of the batch
        means when it passes).

    Raises:
        RuntimeError: a pair deviates, naming the pair's index and values (pi_ref is not the policy's start, or
            dropout is on).
    """
    n = len(dataset)
    saved = trainer.args.per_device_eval_batch_size
    trainer.args.per_device_eval_batch_size = max(n, 1)
    try:
        m = _evaluate(trainer, dataset)
    finally:
        trainer.args.per_device_eval_batch_size = saved
    # TRL 1.16 reports its own DPO metrics under "eval_" whatever the prefix.
    mean_loss, mean_margin = m["step0_loss"], m.get("step0_rewards/margins", m.get("eval_rewards/margins"))
    if abs(mean_loss - math.log(2)) <= tolerance and abs(mean_margin) <= tolerance / max(n, 1):
        return {"step0_loss_max_dev": abs(mean_loss - math.log(2)), "step0_margin_max_abs": abs(mean_margin),
                "step0_n": n}
    worst_loss = worst_margin = 0.0
    for i in range(n):
        m = _evaluate(trainer, dataset.select([i]))
        loss, margin = m["step0_loss"], m.get("step0_rewards/margins", m.get("eval_rewards/margins"))
        worst_loss, worst_margin = max(worst_loss, abs(loss - math.log(2))), max(worst_margin, abs(margin))
        if abs(loss - math.log(2)) > tolerance or abs(margin) > tolerance:
            raise RuntimeError(
                f"DPO step-0 invariant broken on pair {i}: loss {loss:.6f} (ln 2 = 0.693147), "
                f"margin {margin:.6f}; the policy does not start at pi_ref or dropout is on"
            )
    raise RuntimeError(
        f"DPO step-0 invariant broken over {n} pairs together (mean loss {mean_loss:.6f}, mean margin {mean_margin:.6f}) "
        f"though no pair alone exceeds {tolerance}; the policy does not start at pi_ref or dropout is on"
    )


def _evaluate(trainer: DPOTrainer, dataset: Dataset) -> dict:
    """``trainer.evaluate`` under the trainer's autocast. Before training, accelerate has wrapped only the reference
    in autocast (TRL prepares it at construction; the policy is prepared when training starts), so under bf16 the
    policy would be scored in fp32 and the reference in bf16; training scores both under autocast."""
    with trainer.accelerator.autocast():
        return trainer.evaluate(eval_dataset=dataset, metric_key_prefix="step0")


def main(argv: list[str] | None = None) -> dict:
    (args,) = parse_stage_config((DPOStageConfig,), argv)
    install_failure_hook(args.output_dir)  # the flow reads the reason, whatever the exception
    setup_stage("dpo", args)
    set_seed(args.seed)  # before any module is built: a new head or LoRA adapter is seeded too
    out = Path(args.output_dir)
    if not args.sft_dir:
        raise SystemExit("dpo.train needs --sft_dir (the SFT stage's output directory)")
    sft = read_manifest(args.sft_dir)
    pi_ref_path, pi_ref_hash = sft["outputs"]["pi_ref"], sft["outputs"]["pi_ref_hash"]
    verify_hash(pi_ref_path, pi_ref_hash, when="before training")

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
    tokenizer = AutoTokenizer.from_pretrained(pi_ref_path)
    prepared = prepare_pairs(
        pairs,
        tokenizer,
        args.max_length,
        file=args.train_data,
        truncation_mode=args.truncation_mode,
        special_tokens=args.special_tokens_in_text,
    )
    handle_rejects(prepared.rejects, len(pairs), args, "truncation")
    dataset = Dataset.from_list([pair_to_trl(p) for p in prepared.pairs])
    # The policy starts as a copy of pi_ref (it is the SFT model); pi_ref itself is a separate frozen instance.
    policy = load_checked(AutoModelForCausalLM, pi_ref_path, what="DPO policy (pi_ref)")
    ref_model = load_checked(AutoModelForCausalLM, pi_ref_path, what="DPO reference (pi_ref)")
    trainer = FP32LogProbDPOTrainer(  # log-probs from an fp32 LM head, under bf16 autocast too
        model=policy,
        ref_model=ref_model,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config(args),
        callbacks=[ResumeCallback()],  # marks complete Trainer checkpoints (rlhf/resume.py)
    )
    step0 = (
        step0_check(
            trainer, trainer.train_dataset.select(range(min(args.step0_pairs, len(dataset)))), args.step0_tolerance
        )
        if args.step0_pairs
        else {}
    )
    group_by_length(trainer, lambda row: len(row["prompt_ids"]) + len(row["chosen_ids"]) + len(row["rejected_ids"]))
    tokens = count_tokens(trainer)  # after the step-0 evaluation: only training batches count
    resumed_from = resolve_resume(args, trainer.model)  # a missing or incomplete checkpoint is an error
    result = trainer.train(resume_from_checkpoint=resumed_from)
    check_finished(trainer, resumed_from)
    training = training_record(trainer, resumed_from, result)
    efficiency = train_efficiency(trainer, result, tokens, "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32")
    verify_hash(pi_ref_path, pi_ref_hash, when="after training")
    full_weights = None if args.use_peft else gather_full_state_dict(trainer)  # ZeRO-3: a collective, every rank
    if not trainer.accelerator.is_main_process:  # multi-process (DDP): rank 0 alone saves and writes the manifest
        return {"train_loss": result.training_loss, "train_steps": result.global_step, "rank": trainer.args.process_index}

    model = trainer.model.merge_and_unload() if args.use_peft else trainer.model
    checkpoint = save_checkpoint(model, tokenizer, out / "checkpoint", state_dict=full_weights)
    last = {
        k: v
        for k, v in (trainer.state.log_history[-2] if len(trainer.state.log_history) > 1 else {}).items()
        if k.startswith(("rewards/", "logps/", "loss"))
    }
    metrics = {
        "train_loss": training["train_loss"],  # over every step, a resumed run included
        "train_steps": result.global_step,
        "n_pairs": len(prepared.pairs),
        "n_data_rejected": len(pairs.rejects),
        "n_rejected": len(prepared.rejects),
        "n_prompt_turns_dropped": prepared.n_prompt_turns_dropped,
        "beta": args.beta,
        "loss_type": args.loss_type,
        **step0,
        **{f"last_{k}": v for k, v in last.items()},
        "threads": efficiency["threads"],
        "efficiency": efficiency,
        "processes": trainer.args.world_size,
        "loss_curve": [h["loss"] for h in trainer.state.log_history if "loss" in h],  # per logging step
    }
    log_summary({**{k: v for k, v in metrics.items() if k != "efficiency"}, **_numbers(efficiency)},
                report_to=args.report_to)
    stage_manifest(
        "dpo",
        args,
        inputs={
            "pi_ref": pi_ref_path,
            "pi_ref_hash": pi_ref_hash,
            "sft_manifest": str(Path(args.sft_dir).resolve()),
            "train_data": args.train_data,
            "train_data_hash": data_fingerprint(args.train_data),
        },
        outputs={
            "checkpoint": str(checkpoint.resolve()),
            "checkpoint_hash": content_hash(checkpoint),
            "decontamination": decontamination,
        },
        metrics={**metrics, "rejects_files": sorted(str(p) for p in out.glob("rejects-*.jsonl"))},
        extra={"training": training},
    )
    prune_trainer_checkpoints(out)  # resume state only; after the manifest, so a kill before it keeps them
    logger.info("DPO done: loss %.4f over %d steps", training["train_loss"], result.global_step)
    return metrics


if __name__ == "__main__":
    main(sys.argv[1:])
