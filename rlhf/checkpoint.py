"""Checkpoints on disk: atomic save with an empty-tensor check, and the frozen, content-hashed pi_ref.

DESIGN.md principle 3 (pi_ref never moves) and the ZeRO-3 empty-save pitfall live here, once for every stage.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path

from .lineage import content_hash, every_byte, remembered_hashes
from .models import hash_memo_path

logger = logging.getLogger(__name__)


def gather_full_state_dict(trainer) -> dict | None:
    """The full (unpartitioned) weights of a ZeRO-3 trainer's model, or None where the model is not partitioned.

    Under DeepSpeed ZeRO-3 each rank holds a shard of every parameter, so ``save_pretrained`` on rank 0 alone
    writes empty tensors (DESIGN.md pitfall) and a gather that only rank 0 enters hangs. This is a collective:
    EVERY rank must call it before any rank returns; rank 0 gets the state dict (``accelerator.get_state_dict``,
    which needs ``zero3_save_16bit_model: true`` in the accelerate config), the other ranks get ``{}`` or None.
    Not run in this project's CI (no GPU; DeepSpeed's CPU path needs oneCCL).

    Raises:
        ValueError: from accelerate, when ZeRO-3 runs without ``zero3_save_16bit_model``.
    """
    plugin = getattr(trainer.accelerator.state, "deepspeed_plugin", None)
    if plugin is None or plugin.zero_stage != 3:
        return None
    return trainer.accelerator.get_state_dict(trainer.model_wrapped)


def save_checkpoint(model, tokenizer, final_dir: str | os.PathLike, state_dict: dict | None = None) -> Path:
    """Save ``model`` + ``tokenizer`` to ``final_dir`` atomically (temp dir, check, rename).

    ``state_dict``: the weights to write instead of ``model``'s own (the gathered ZeRO-3 weights of
    :func:`gather_full_state_dict`); its shapes are checked against the saved file.

    Raises:
        RuntimeError: a saved tensor is empty (the ZeRO-3 empty-save pitfall) or differs in shape from
            ``state_dict``; nothing is left at ``final_dir``.
    """
    final = Path(final_dir)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}."))
    try:
        model.save_pretrained(tmp, safe_serialization=True, **({"state_dict": state_dict} if state_dict else {}))
        tokenizer.save_pretrained(tmp)
        check_checkpoint(tmp, {k: tuple(v.shape) for k, v in state_dict.items()} if state_dict else None)
        tmp.chmod(0o755)  # mkdtemp makes it owner-only; a checkpoint is shared like any saved model
        if final.exists():
            make_writable(final)
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def check_checkpoint(path: str | os.PathLike, expected_shapes: Mapping[str, tuple[int, ...]] | None = None) -> None:
    """Refuse a checkpoint with no weights, with empty tensors (shape with a 0, as a bad ZeRO-3 save writes), or
    (given ``expected_shapes``, tensor name -> shape, e.g. of the gathered state dict that was saved) with a tensor
    whose saved shape differs from the expected one.

    Raises:
        RuntimeError: naming the file and tensor.
    """
    from safetensors import safe_open

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise RuntimeError(f"{path}: checkpoint has no .safetensors weights")
    n = 0
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for key in st.keys():
                n += 1
                shape = tuple(st.get_slice(key).get_shape())
                if 0 in shape:
                    raise RuntimeError(f"{f}: tensor {key} is empty (shape {shape}); refusing the checkpoint")
                want = (expected_shapes or {}).get(key)
                if want is not None and tuple(want) != shape:
                    raise RuntimeError(f"{f}: tensor {key} saved with shape {shape}, expected {tuple(want)}")
    if not n:
        raise RuntimeError(f"{path}: the checkpoint holds no tensors")


def make_writable(path: Path) -> None:
    for p in [path, *path.rglob("*")]:
        p.chmod(p.stat().st_mode | stat.S_IWUSR)


def written_hash(path: str | os.PathLike) -> str:
    """:func:`rlhf.lineage.content_hash` of what this process just wrote, every byte read, with its large files'
    digests remembered (``rlhf.lineage.HashMemo``, ``reuse=False``): the flow's check that a reused stage's outputs
    are intact then need not read a multi-GB checkpoint again."""
    with remembered_hashes(hash_memo_path(), reuse=False):
        return content_hash(path)


def freeze_dir(path: str | os.PathLike) -> str:
    """Make a checkpoint read-only and return its content hash (the pi_ref contract, DESIGN.md principle 3)."""
    path = Path(path)
    for p in path.rglob("*"):
        if p.is_file():
            p.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    return written_hash(path)


def verify_hash(path: str | os.PathLike, expected: str, *, when: str) -> None:
    """Raise if ``path``'s content hash differs from ``expected`` (pi_ref moved).

    Raises:
        RuntimeError: naming the path, the moment (``before training``/``after training``) and both hashes.
    """
    with every_byte():  # never a remembered digest: this is the check that pi_ref's bytes did not move
        actual = content_hash(path)
    if actual != expected:
        raise RuntimeError(f"pi_ref at {path} changed {when}: expected hash {expected}, found {actual}")
    logger.info("pi_ref hash verified %s: %s", when, actual[:16])
