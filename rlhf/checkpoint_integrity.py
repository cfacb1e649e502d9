"""What a Trainer checkpoint folder must hold to be resumed from, per layout, and proof that it is what was saved.

Layouts, as transformers 5 writes them (``Trainer._save_checkpoint`` / ``_save_optimizer_and_scheduler``) and reads
them back (``Trainer._load_from_checkpoint`` / ``_load_optimizer_and_scheduler``, ``deepspeed_load_checkpoint``):

* ``plain`` (one process, DDP): ``optimizer.pt``, ``scheduler.pt``, the weights (``model.safetensors`` or its
  index, or ``adapter_model.safetensors`` under LoRA).
* ``deepspeed``: no ``optimizer.pt``; ``latest`` (a text file naming the tag, ``global_step<N>``) and the folder
  ``<tag>/`` holding ``*model_states.pt`` (``mp_rank_00_model_states.pt`` under ZeRO-0/1/2, one
  ``zero_pp_rank_<r>_mp_rank_00_model_states.pt`` per rank under ZeRO-3) and one ``*optim_states.pt`` per rank
  (``[bf16_]zero_pp_rank_<r>_mp_rank_00_optim_states.pt``). ``scheduler.pt`` only when the scheduler is the
  Trainer's own (not DeepSpeed's). ``model.safetensors`` is absent under ZeRO-3 without a 16-bit gather; the
  DeepSpeed engine restores the weights from ``<tag>/`` either way.
* ``fsdp`` (accelerate's ``save_fsdp_model`` / ``save_fsdp_optimizer``): weights ``pytorch_model_fsdp.bin``
  (FULL_STATE_DICT), ``pytorch_model_fsdp_0/`` (SHARDED_STATE_DICT, a torch.distributed.checkpoint folder with
  ``.metadata``) or ``pytorch_model_fsdp_rank<r>.bin`` (LOCAL_STATE_DICT); optimizer ``optimizer.bin`` (FULL) or
  ``optimizer_0/`` (sharded, with ``.metadata``); ``scheduler.pt``.

Every layout also has ``trainer_state.json`` and ``rng_state.pth`` (one process) or ``rng_state_<rank>.pth``.

Integrity: the completion marker (``rlhf.resume.COMPLETE_MARKER``, written once the Trainer finished saving)
records the layout, the world size and every file's size and sha256 (FIPS 180-4, ``hashlib``). Before a resume
:func:`verify_marker` re-hashes every file: a flipped byte anywhere (inside ``optimizer.pt`` with its zip directory
intact, which ``zipfile.is_zipfile`` accepts) fails it. :func:`check_trainer_state` loads ``trainer_state.json``
with transformers' own ``TrainerState.load_from_json`` and checks the fields a resume reads.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

MARKER_VERSION = 2  # 1: {global_step, epoch} only (no hashes): not verifiable, so not resumed from
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors")
FSDP_MODEL = "pytorch_model_fsdp"  # transformers.trainer.FSDP_MODEL_NAME
FSDP_OPTIMIZER = "optimizer"  # accelerate.utils.constants.OPTIMIZER_NAME (+ ".bin" or "_0/")
_TAG_RE = re.compile(r"^[A-Za-z0-9_.-]+$")


class CheckpointDamaged(RuntimeError):
    """A checkpoint's files are missing, altered or malformed; the message names the file and why."""


def detect_layout(path: Path) -> str:
    """``deepspeed``, ``fsdp`` or ``plain`` (see module docstring), from the files in ``path``."""
    names = {p.name for p in path.iterdir()}
    if "latest" in names or any(n.startswith("global_step") for n in names):
        return "deepspeed"
    if any(n.startswith(FSDP_MODEL) for n in names) or "optimizer.bin" in names or (path / "optimizer_0").is_dir():
        return "fsdp"
    return "plain"


def _torch_archive(f: Path) -> None:
    if not f.is_file():
        raise CheckpointDamaged(f"{f}: missing")
    if f.stat().st_size == 0:
        raise CheckpointDamaged(f"{f}: zero-byte file (a partial save)")
    if not zipfile.is_zipfile(f):  # torch.save writes a zip; a truncated one has no central directory
        raise CheckpointDamaged(f"{f}: truncated or corrupt (not a complete torch.save archive)")


def _dcp_folder(d: Path) -> None:
    if not (d / ".metadata").is_file() or not any(d.glob("*.distcp")):
        raise CheckpointDamaged(f"{d}: sharded (torch.distributed.checkpoint) folder without .metadata or *.distcp")


def check_layout(path: Path, layout: str) -> None:
    """The files ``layout`` needs to restore the optimizer, scheduler and weights are there and readable.

    Raises:
        CheckpointDamaged: naming the missing or unreadable file.
    """
    names = {p.name for p in path.iterdir()}
    if layout == "plain":
        _torch_archive(path / "optimizer.pt")
        _torch_archive(path / "scheduler.pt")
        if not names & set(WEIGHT_FILES):
            raise CheckpointDamaged(f"{path}: no model weights ({' / '.join(WEIGHT_FILES)})")
    elif layout == "deepspeed":
        latest = path / "latest"
        if not latest.is_file():
            raise CheckpointDamaged(f"{latest}: missing; DeepSpeed cannot tell which global_step folder to load")
        tag = latest.read_text().strip()
        if not _TAG_RE.match(tag) or not (path / tag).is_dir():
            raise CheckpointDamaged(f"{latest}: names {tag!r}, which is no folder of {path}")
        models, optims = sorted((path / tag).glob("*model_states.pt")), sorted((path / tag).glob("*optim_states.pt"))
        if not models:
            raise CheckpointDamaged(f"{path / tag}: no *model_states.pt (DeepSpeed's module weights)")
        if not optims:
            raise CheckpointDamaged(f"{path / tag}: no *optim_states.pt (DeepSpeed's optimizer shards)")
        for f in [*models, *optims]:
            _torch_archive(f)
        if (path / "scheduler.pt").exists():
            _torch_archive(path / "scheduler.pt")
    elif layout == "fsdp":
        # each part is one file (full state dict), a distributed-checkpoint folder, or one file per rank
        for name, per_rank, missing in (
            (FSDP_MODEL, f"{FSDP_MODEL}*_rank*.bin", f"FSDP weights ({FSDP_MODEL}.bin, {FSDP_MODEL}_0/ or *_rank<r>.bin)"),
            (FSDP_OPTIMIZER, f"{FSDP_OPTIMIZER}_0_rank*.bin", "FSDP optimizer state (optimizer.bin or optimizer_0/)"),
        ):
            if (path / f"{name}.bin").exists():
                _torch_archive(path / f"{name}.bin")
            elif (path / f"{name}_0").is_dir():
                _dcp_folder(path / f"{name}_0")
            elif not any(path.glob(per_rank)):
                raise CheckpointDamaged(f"{path}: no {missing}")
        _torch_archive(path / "scheduler.pt")
    else:
        raise ValueError(f"unknown checkpoint layout {layout!r}")
    rng = sorted(path.glob("rng_state*.pth"))
    if not rng:
        raise CheckpointDamaged(f"{path}: no rng_state.pth; the RNG state (dropout, data order) cannot be restored")
    for f in rng:
        _torch_archive(f)


def check_trainer_state(path: Path, folder_step: int | None) -> Any:
    """``trainer_state.json`` loaded by transformers' ``TrainerState.load_from_json`` (what the Trainer itself
    reads on resume), with the fields a resume uses checked; returns the ``TrainerState``.

    Raises:
        CheckpointDamaged: unreadable JSON, unknown or missing fields, a wrong type, a ``global_step`` that is not
            the folder's, a log entry past ``global_step``.
    """
    from transformers import TrainerState

    f = path / "trainer_state.json"
    if not f.is_file():
        raise CheckpointDamaged(f"{f}: missing; {path} cannot restore the step and log history")
    try:
        state = TrainerState.load_from_json(str(f))
    except (ValueError, TypeError, UnicodeDecodeError) as err:
        raise CheckpointDamaged(f"{f}: unreadable trainer state ({type(err).__name__}: {err})") from None

    def bad(field: str, why: str) -> CheckpointDamaged:
        return CheckpointDamaged(f"{f}: malformed trainer state: {field} {why}")

    def is_int(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    if not is_int(state.global_step) or state.global_step <= 0:
        raise bad("global_step", f"is {state.global_step!r}, not a positive integer")
    if folder_step is not None and state.global_step != folder_step:
        raise bad("global_step", f"is {state.global_step} but the folder is checkpoint-{folder_step}")
    if not is_int(state.max_steps) or state.max_steps < state.global_step:
        raise bad("max_steps", f"is {state.max_steps!r}, not an integer >= global_step {state.global_step}")
    if not isinstance(state.epoch, (int, float)) or isinstance(state.epoch, bool) or not math.isfinite(state.epoch) \
            or state.epoch < 0:
        raise bad("epoch", f"is {state.epoch!r}, not a finite number >= 0")
    if not isinstance(state.log_history, list) or not all(isinstance(e, dict) for e in state.log_history):
        raise bad("log_history", "is not a list of objects")
    for i, entry in enumerate(state.log_history):
        step = entry.get("step")
        if step is not None and (not is_int(step) or step > state.global_step):
            raise bad(f"log_history[{i}].step", f"is {step!r}, past global_step {state.global_step}")
        loss = entry.get("loss")
        if loss is not None and (not isinstance(loss, (int, float)) or isinstance(loss, bool)):
            raise bad(f"log_history[{i}].loss", f"is {loss!r}, not a number")
    if not isinstance(state.stateful_callbacks, dict):
        raise bad("stateful_callbacks", f"is {type(state.stateful_callbacks).__name__}, not an object")
    if state.train_batch_size is not None and (not is_int(state.train_batch_size) or state.train_batch_size <= 0):
        raise bad("train_batch_size", f"is {state.train_batch_size!r}")
    return state


def _sha256(f: Path) -> str:
    with open(f, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def checkpoint_files(path: Path, marker_name: str) -> list[Path]:
    """Every file under ``path`` (recursively) but the marker and its temporary file, sorted."""
    skip = {marker_name, f"{marker_name}.tmp"}
    return sorted(p for p in path.rglob("*") if p.is_file() and not (p.parent == path and p.name in skip))


def file_hashes(path: Path, files: list[Path]) -> dict[str, dict[str, Any]]:
    """Relative path -> ``{"bytes", "sha256"}``; files hashed in parallel threads (hashlib releases the GIL), since
    an 8B checkpoint with Adam state is about 100 GB in tens of files."""
    with ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1, len(files)))) as pool:
        digests = list(pool.map(_sha256, files))
    return {str(f.relative_to(path)): {"bytes": f.stat().st_size, "sha256": d} for f, d in zip(files, digests)}


def marker_record(path: Path, marker_name: str, *, global_step: int, epoch, world_size: int) -> dict[str, Any]:
    """What the completion marker of ``path`` holds: version, step, epoch, layout, world size, every file's hash."""
    files = checkpoint_files(path, marker_name)
    return {"version": MARKER_VERSION, "global_step": int(global_step), "epoch": epoch,
            "layout": detect_layout(path), "world_size": int(world_size), "files": file_hashes(path, files)}


def verify_marker(path: Path, marker_name: str, world_size: int | None = None) -> dict[str, Any]:
    """Re-hash every file of ``path`` against its completion marker; return the marker's record.

    Args:
        world_size: the processes of the run about to resume; a checkpoint saved by another number is refused
            (DeepSpeed and FSDP shards, and the per-rank RNG files, are per process). None: not checked.

    Raises:
        CheckpointDamaged: the marker is unreadable or records no hashes; a recorded file is missing, or its size or
            sha256 changed; a file is there that the marker does not list; the world size differs.
    """
    marker = path / marker_name
    try:
        record = json.loads(marker.read_text())
        files = record["files"]
        if not isinstance(files, dict) or not files:
            raise KeyError("files")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CheckpointDamaged(f"{marker}: records no file hashes ({type(err).__name__}: {err}); the checkpoint "
                                "cannot be verified") from None
    present = {str(f.relative_to(path)): f for f in checkpoint_files(path, marker_name)}
    extra = sorted(set(present) - set(files))
    if extra:
        raise CheckpointDamaged(f"{path / extra[0]}: not among the files recorded when the checkpoint was saved")
    for rel, want in files.items():
        f = path / rel
        if rel not in present:
            raise CheckpointDamaged(f"{f}: recorded when the checkpoint was saved, now missing")
        if f.stat().st_size != want.get("bytes"):
            raise CheckpointDamaged(f"{f}: {f.stat().st_size} bytes, {want.get('bytes')} when saved")
    got = file_hashes(path, [path / rel for rel in files])
    for rel, want in files.items():
        if got[rel]["sha256"] != want.get("sha256"):
            raise CheckpointDamaged(f"{path / rel}: sha256 {got[rel]['sha256'][:16]}..., "
                                    f"{str(want.get('sha256'))[:16]}... when saved: the file changed after the save")
    saved_world = record.get("world_size")
    if world_size is not None and saved_world is not None and int(saved_world) != int(world_size):
        raise CheckpointDamaged(f"{marker}: saved by {saved_world} process(es), this run has {world_size}; its "
                                "per-process optimizer shards and RNG states do not map onto this run")
    return record
