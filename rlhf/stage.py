"""What every stage shares: pipeline arguments mixed into each stage's TRL config, launch-time setup, saving.

Each stage config is ``@dataclass class XStageConfig(TRLConfig, PipelineArguments)``: TRL's fields keep their
meaning and help; ours are listed here once. Recipes are YAML files parsed strictly by ``trl.TrlParser``
(unknown keys are errors; ``--key value`` on the command line overrides the file).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .hashing import code_version, content_hash, json_hash
from .manifest import write_manifest
from .tracking import setup_wandb

logger = logging.getLogger(__name__)


@dataclass
class PipelineArguments:
    """Fields every stage adds to its TRL config."""

    model_name_or_path: str = field(
        default="smollm2-135m",
        metadata={"help": "Base/parent checkpoint: smollm2-135m, tiny, a .gguf file, a local dir or a hub id."},
    )
    round_id: str | None = field(default=None, metadata={"help": "Round id; groups W&B runs and names outputs."})
    precision: str = field(
        default="auto",
        metadata={
            "help": "auto | fp32 | bf16 | fp16. auto: bf16 only where the device has it (logged).",
            "choices": ["auto", "fp32", "bf16", "fp16"],
        },
    )
    data_mode: str = field(
        default="strict",
        metadata={
            "help": "strict: stop at the first bad row. lenient: write rejects to a file, stop above max_reject_rate.",
            "choices": ["strict", "lenient"],
        },
    )
    max_reject_rate: float = field(
        default=0.05, metadata={"help": "Lenient mode: largest tolerated share of bad rows."}
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Use the first N training rows."})
    use_peft: bool = field(default=False, metadata={"help": "Train LoRA adapters (peft) instead of all weights."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha."})
    lora_dropout: float = field(default=0.05, metadata={"help": "LoRA dropout."})
    lora_target_modules: list[str] | None = field(
        default=None, metadata={"help": "LoRA target modules (default: all linear layers)."}
    )

    def __post_init__(self):
        # Resolve precision before TrainingArguments validates it: TRL's default bf16=True raises on a CPU
        # without bf16, and is emulated (8-10x slower) on one that only fakes it.
        from .precision import resolve_precision

        chosen = resolve_precision(self.precision)
        self.bf16, self.fp16 = chosen == "bf16", chosen == "fp16"
        super().__post_init__()


def peft_config(args: PipelineArguments, task_type: str = "CAUSAL_LM", modules_to_save: list[str] | None = None):
    """A ``peft.LoraConfig`` from the stage arguments, or None when ``use_peft`` is off."""
    if not args.use_peft:
        return None
    from peft import LoraConfig

    return LoraConfig(
        r=args.lora_r,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        target_modules=args.lora_target_modules or "all-linear",
        task_type=task_type,
        modules_to_save=modules_to_save,
    )


def setup_stage(name: str, args) -> None:
    """Logging and W&B for a stage (precision was resolved when the config was built). Call first in ``main()``."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logger.info("%s: precision %s", name, "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32")
    if "wandb" in (args.report_to or []):
        setup_wandb(run_name=args.run_name or name, group=args.round_id, output_dir=args.output_dir)


def save_checkpoint(model, tokenizer, final_dir: str | os.PathLike) -> Path:
    """Save ``model`` + ``tokenizer`` to ``final_dir`` atomically (temp dir, check, rename).

    Raises:
        RuntimeError: a saved tensor is empty (the ZeRO-3 empty-save pitfall); nothing is left at ``final_dir``.
    """
    final = Path(final_dir)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}."))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        check_checkpoint(tmp)
        tmp.chmod(0o755)  # mkdtemp makes it owner-only; a checkpoint is shared like any saved model
        if final.exists():
            make_writable(final)
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def check_checkpoint(path: str | os.PathLike) -> None:
    """Refuse a checkpoint with no weights or with empty tensors (shape with a 0, as a bad ZeRO-3 save writes).

    Raises:
        RuntimeError: naming the file and tensor.
    """
    from safetensors import safe_open

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise RuntimeError(f"{path}: checkpoint has no .safetensors weights")
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for key in st.keys():
                shape = st.get_slice(key).get_shape()
                if 0 in shape:
                    raise RuntimeError(f"{f}: tensor {key} is empty (shape {shape}); refusing the checkpoint")


def make_writable(path: Path) -> None:
    for p in [path, *path.rglob("*")]:
        p.chmod(p.stat().st_mode | stat.S_IWUSR)


def freeze_dir(path: str | os.PathLike) -> str:
    """Make a checkpoint read-only and return its content hash (the pi_ref contract, DESIGN.md principle 3)."""
    path = Path(path)
    for p in path.rglob("*"):
        if p.is_file():
            p.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    return content_hash(path)


def verify_hash(path: str | os.PathLike, expected: str, *, when: str) -> None:
    """Raise if ``path``'s content hash differs from ``expected`` (pi_ref moved).

    Raises:
        RuntimeError: naming the path, the moment (``before training``/``after training``) and both hashes.
    """
    actual = content_hash(path)
    if actual != expected:
        raise RuntimeError(f"pi_ref at {path} changed {when}: expected hash {expected}, found {actual}")
    logger.info("pi_ref hash verified %s: %s", when, actual[:16])


def stage_manifest(
    stage: str, args, *, inputs: dict[str, Any], outputs: dict[str, Any], metrics: dict[str, Any]
) -> Path:
    """Write ``<output_dir>/manifest.json`` with lineage: input hashes, config hash, code version, outputs, metrics."""
    config = {k: v for k, v in sorted(vars(args).items()) if not k.startswith("_")}
    return write_manifest(
        args.output_dir,
        {
            "stage": stage,
            "round_id": args.round_id,
            "inputs": inputs,
            "config_hash": json_hash(config),
            "config": config,
            "code_version": code_version(),
            "precision": "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32",
            "outputs": outputs,
            "metrics": metrics,
        },
    )


def data_fingerprint(source: str) -> str:
    """Content hash of a data source: ``demo:<name>`` (bundled file), a local path, or ``hub:<id>``."""
    if source.startswith("demo:"):
        from data.bundle import demo_path

        return content_hash(demo_path(source.removeprefix("demo:")))
    p = Path(source).expanduser()
    return content_hash(p) if p.exists() else f"hub:{source}"


# Exit code of a gate run whose report is written and whose release is blocked (CI fails on it).
BLOCKED_EXIT_CODE = 3


def handle_rejects(rejects: list, n_total: int, args, what: str) -> None:
    """Strict: raise the first reject. Lenient: write them all to ``<output_dir>/rejects-<what>.jsonl`` and raise
    when their share exceeds ``args.max_reject_rate``. Never silent: the count is logged either way."""
    from data.validation import DataValidationError

    if not rejects:
        return
    if args.data_mode == "strict":
        raise rejects[0]
    path = Path(args.output_dir) / f"rejects-{what}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for r in rejects:
            f.write(json.dumps({"file": r.file, "row": r.row, "field": r.field, "reason": r.reason}) + "\n")
    rate = len(rejects) / max(n_total, 1)
    logger.warning("%s: %d of %d rows rejected (%.1f%%), listed in %s", what, len(rejects), n_total, 100 * rate, path)
    if rate > args.max_reject_rate:
        raise DataValidationError(
            f"{len(rejects)}/{n_total} rows rejected > max_reject_rate {args.max_reject_rate}", file=str(path)
        )
