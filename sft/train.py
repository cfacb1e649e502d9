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
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTTrainer

from data.decontamination import decontaminate_stage_rows
from data.fingerprint import data_fingerprint, local_path
from data.loaders import load_sft
from data.validation import handle_rejects
from rlhf.checkpoint import freeze_dir
from rlhf.models import model_fingerprint, resolve_base_model
from rlhf.trainer_stage import Published, TrainerStage, TrainingData
from rlhf.weights import atomic_copytree, load_checked

from .config import SFTStageConfig
from .prepare import check_fully_masked, prepare_sft_rows
from .style_audit import audit_demonstrations

logger = logging.getLogger("sft.train")


def freeze_pi_ref(model, checkpoint: Path) -> Published:
    """pi_ref: a frozen, content-hashed copy of the SFT output next to it (DESIGN.md principle 3), copied to a temp
    folder and renamed, so it is never half-copied."""
    pi_ref = atomic_copytree(checkpoint, checkpoint.parent / "pi_ref")
    pi_ref_hash = freeze_dir(pi_ref)
    logger.info("pi_ref %s (hash %s)", pi_ref, pi_ref_hash[:16])
    return Published(outputs={"pi_ref": str(pi_ref.resolve()), "pi_ref_hash": pi_ref_hash})


def main(argv: list[str] | None = None) -> dict:
    stage = TrainerStage.start("sft", SFTStageConfig, argv)
    args = stage.args
    base = resolve_base_model(args.model_name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(base)

    conversations = load_sft(args.train_data, **stage.load_options())
    decontamination = decontaminate_stage_rows(
        conversations, args.decontaminate_against, args.decontaminate, label=args.train_data, log=logger.info
    )
    prepared = prepare_sft_rows(
        conversations, tokenizer, args.max_length, file=args.train_data, special_tokens=args.special_tokens_in_text
    )
    handle_rejects(prepared.rejects, len(conversations), args, "tokenization")
    audit = audit_demonstrations(
        prepared.rows, max_opener_share=args.style_audit_max_opener_share, action=args.style_audit_action
    )

    trainer = stage.attach(SFTTrainer(  # attach: fp32 master weights checked, W&B at the trainer's step
        model=load_checked(AutoModelForCausalLM, base, what="SFT base model", dtype=stage.weights_dtype,
                           trained=True),
        train_dataset=Dataset.from_list(prepared.rows),
        **stage.trainer_kwargs(tokenizer),
    ))
    check_fully_masked(trainer.train_dataset, prepared.rows, args.max_fully_masked_rate, file=args.train_data)

    trained = stage.train(trainer, length_of=lambda row: len(row["input_ids"]))
    return stage.finish(
        trained,
        tokenizer,
        data=TrainingData(data_fingerprint(args.train_data), decontamination,
                          n_data_rejected=len(conversations.rejects), n_rejected=len(prepared.rejects),
                          path=local_path(args.train_data)),
        inputs={"base_model": args.model_name_or_path, "base_model_hash": model_fingerprint(base)},
        metrics={
            "n_rows": len(prepared.rows),
            "n_prompt_turns_dropped": prepared.n_prompt_turns_dropped,
            "style_audit": audit.to_dict(),
        },
        publish=freeze_pi_ref,
        table={"style_audit_openers": [dict(opener=o, count=c, share=s) for o, c, s in audit.top_openers]},
    )


if __name__ == "__main__":
    main(sys.argv[1:])
