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
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import DPOTrainer

from data.decontamination import decontaminate_stage_rows
from data.fingerprint import data_fingerprint, local_path
from data.loaders import load_pairs
from data.pairs import prepare_pairs
from data.schemas import pair_to_trl
from data.validation import handle_rejects
from rlhf.checkpoint import verify_hash
from rlhf.manifest import read_manifest
from rlhf.tracking import add_config
from rlhf.trainer_stage import TrainerStage, TrainingData
from rlhf.weights import load_checked

from .config import DPOStageConfig
from .trainer import FP32LogProbDPOTrainer

logger = logging.getLogger("dpo.train")


def step0_check(trainer: DPOTrainer, dataset: Dataset, tolerance: float) -> dict:
    """Check the step-0 DPO invariant (policy = pi_ref, dropout off): every pair's loss is ln 2, every margin 0.

    One ``evaluate`` call over all pairs in one batch (one call per pair costs about a training step each).
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


def last_logged(trainer) -> dict:
    """The last logged training step's DPO numbers (``rewards/*``, ``logps/*``, ``loss``), keyed ``last_<name>``
    (the final log entry is the run's summary, so the one before it)."""
    history = trainer.state.log_history
    last = history[-2] if len(history) > 1 else {}
    return {f"last_{k}": v for k, v in last.items() if k.startswith(("rewards/", "logps/", "loss"))}


def _evaluate(trainer: DPOTrainer, dataset: Dataset) -> dict:
    """``trainer.evaluate`` under the trainer's autocast. Before training, accelerate has wrapped only the reference
    in autocast (TRL prepares it at construction; the policy is prepared when training starts), so under bf16 the
    policy would be scored in fp32 and the reference in bf16; training scores both under autocast."""
    with trainer.accelerator.autocast():
        return trainer.evaluate(eval_dataset=dataset, metric_key_prefix="step0")


def main(argv: list[str] | None = None) -> dict:
    stage = TrainerStage.start("dpo", DPOStageConfig, argv)
    args = stage.args
    if not args.sft_dir:
        raise SystemExit("dpo.train needs --sft_dir (the SFT stage's output directory)")
    sft = read_manifest(args.sft_dir)
    pi_ref_path, pi_ref_hash = sft["outputs"]["pi_ref"], sft["outputs"]["pi_ref_hash"]
    verify_hash(pi_ref_path, pi_ref_hash, when="before training")
    # The model this stage trains is the SFT stage's pi_ref, not the --model_name_or_path default (the flow gives
    # that only to SFT): the config the W&B callback logs (args.to_dict()) and the manifest name it.
    args.model_name_or_path = pi_ref_path
    add_config({"base_model": (sft.get("inputs") or {}).get("base_model"), "pi_ref_hash": pi_ref_hash})

    pairs = load_pairs(args.train_data, **stage.load_options())
    decontamination = decontaminate_stage_rows(
        pairs, args.decontaminate_against, args.decontaminate, label=args.train_data, log=logger.info
    )
    tokenizer = AutoTokenizer.from_pretrained(pi_ref_path)
    prepared = prepare_pairs(pairs, tokenizer, args.max_length, file=args.train_data,
                             truncation_mode=args.truncation_mode, special_tokens=args.special_tokens_in_text)
    handle_rejects(prepared.rejects, len(pairs), args, "truncation")

    # The policy starts as a copy of pi_ref (it is the SFT model); pi_ref itself is a separate frozen instance.
    # attach: fp32 master weights checked, W&B at the trainer's step (before the step-0 evaluation logs)
    trainer = stage.attach(FP32LogProbDPOTrainer(  # log-probs from an fp32 LM head, under bf16 autocast too
        model=load_checked(AutoModelForCausalLM, pi_ref_path, what="DPO policy (pi_ref)", dtype=stage.weights_dtype,
                           trained=True),
        ref_model=load_checked(AutoModelForCausalLM, pi_ref_path, what="DPO reference (pi_ref)",
                               dtype=stage.weights_dtype),
        train_dataset=Dataset.from_list([pair_to_trl(p) for p in prepared.pairs]),
        **stage.trainer_kwargs(tokenizer),
    ))
    n_step0 = min(args.step0_pairs, len(prepared.pairs))  # the step-0 invariant, before the first update
    step0 = step0_check(trainer, trainer.train_dataset.select(range(n_step0)), args.step0_tolerance) if n_step0 else {}

    trained = stage.train(
        trainer, length_of=lambda row: len(row["prompt_ids"]) + len(row["chosen_ids"]) + len(row["rejected_ids"])
    )
    verify_hash(pi_ref_path, pi_ref_hash, when="after training")
    return stage.finish(
        trained,
        tokenizer,
        data=TrainingData(data_fingerprint(args.train_data), decontamination,
                          n_data_rejected=len(pairs.rejects), n_rejected=len(prepared.rejects),
                          path=local_path(args.train_data)),
        inputs={
            "pi_ref": pi_ref_path,
            "pi_ref_hash": pi_ref_hash,
            "sft_manifest": str(Path(args.sft_dir).resolve()),
        },
        metrics={
            "n_pairs": len(prepared.pairs),
            "n_prompt_turns_dropped": prepared.n_prompt_turns_dropped,
            "beta": args.beta,
            "loss_type": args.loss_type,
            **step0,
            **last_logged(trainer),
        },
    )


if __name__ == "__main__":
    main(sys.argv[1:])
