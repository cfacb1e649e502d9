"""Resume as a contract: a TRL stage killed mid-training continues from its last complete
Trainer checkpoint, and says so truthfully.

The machinery is transformers' own: the Trainer saves ``<output_dir>/checkpoint-<step>`` every ``save_steps``
(weights, ``optimizer.pt``, ``scheduler.pt``, ``rng_state.pth``, ``trainer_state.json``; ``save_total_limit`` are
kept) and ``Trainer.train(resume_from_checkpoint=path)`` restores weights, optimizer, scheduler, RNG state and the
data position. This module adds what the Trainer leaves out:

* **Which checkpoint is complete.** The Trainer writes ``checkpoint-<step>`` in place, so a kill during a save
  leaves a folder that looks like a checkpoint. :class:`ResumeCallback` writes ``COMPLETE_MARKER`` into it after
  the Trainer's ``on_save`` (all files written); :func:`check_trainer_checkpoint` also checks the files themselves
  (state, optimizer, scheduler, RNG, weights against the live model's shapes). :func:`last_complete_checkpoint`
  skips incomplete ones, newest first, and says why.
* **An explicit resume from a missing or corrupt checkpoint is an error** (:func:`resolve_resume`): before, the
  stage configs accepted ``--resume_from_checkpoint`` and ignored it (the run restarted at step 1 while the manifest
  recorded a resume). ``--resume_from_checkpoint last`` takes the newest complete one in ``output_dir``.
* **No silent short run** (:func:`check_finished`): the Trainer must end at ``max_steps``; a resume that skipped an
  epoch (a public report: resume at an epoch boundary skipped the next epoch and exited 0) fails loudly.
* **A truthful record** (:func:`training_record`): resumed-from path and step, global step, epochs, the loss over
  every step of the run (the Trainer's ``training_loss`` after a resume averages only the steps of the last process).

Fault injection for the resume tests: ``RLHF_FAULT_SIGKILL_AFTER_STEP=N`` makes :class:`ResumeCallback` send
SIGKILL to its own process when optimizer step ``N`` is done (logged and saved), at the start of step ``N + 1``.
It is a real kill (no cleanup, no exception handler runs); nothing sets it outside tests.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import time
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

logger = logging.getLogger(__name__)

CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
COMPLETE_MARKER = ".rlhf-complete"
FAULT_ENV = "RLHF_FAULT_SIGKILL_AFTER_STEP"
# files a Trainer checkpoint needs to resume everything (rng: one file, or one per process)
STATE_FILES = ("trainer_state.json", "optimizer.pt", "scheduler.pt")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors")


class ResumeError(RuntimeError):
    """A checkpoint cannot be resumed from (missing, incomplete, corrupt); the message names the file and why."""


def trainer_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """``<output_dir>/checkpoint-<step>`` folders, newest (highest step) first."""
    out = Path(output_dir)
    if not out.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in out.iterdir() if p.is_dir() and (m := CHECKPOINT_RE.match(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def check_trainer_checkpoint(
    path: str | os.PathLike, expected_shapes: Mapping[str, tuple[int, ...]] | None = None, *, require_marker: bool = True
) -> int:
    """Check that a Trainer checkpoint folder holds everything a resume restores; return its global step.

    Args:
        expected_shapes: tensor name -> shape of the model being trained (its ``state_dict``); the saved weights
            must hold every one of them (tied names count once via ``tied``) with that shape.
        require_marker: the checkpoint must carry ``COMPLETE_MARKER`` (written after the Trainer finished saving).

    Raises:
        ResumeError: naming the folder or file: no such folder, no marker (killed mid-save), unreadable or
            inconsistent ``trainer_state.json``, a missing or zero-byte or truncated state file, missing weights,
            a missing tensor, a tensor of the wrong shape.
    """
    path = Path(path)
    if not path.is_dir():
        raise ResumeError(f"--resume_from_checkpoint {path}: no such checkpoint folder")
    if require_marker and not (path / COMPLETE_MARKER).is_file():
        raise ResumeError(f"{path}: not marked complete ({COMPLETE_MARKER} missing): the save was interrupted")
    state_file = path / "trainer_state.json"
    for name in STATE_FILES:
        f = path / name
        if not f.is_file():
            raise ResumeError(f"{f}: missing; {path} cannot restore the optimizer, scheduler and step")
        if f.stat().st_size == 0:
            raise ResumeError(f"{f}: zero-byte file (a partial save)")
        if f.suffix == ".pt" and not zipfile.is_zipfile(f):  # torch.save writes a zip; a truncated one has no index
            raise ResumeError(f"{f}: truncated or corrupt (not a complete torch.save archive)")
    rng = sorted(path.glob("rng_state*.pth"))
    if not rng:
        raise ResumeError(f"{path}: no rng_state.pth; the RNG state (dropout, data order) cannot be restored")
    for f in rng:
        if not zipfile.is_zipfile(f):
            raise ResumeError(f"{f}: truncated or corrupt (not a complete torch.save archive)")
    try:
        state = json.loads(state_file.read_text())
        step = int(state["global_step"])
    except (ValueError, KeyError, TypeError) as err:
        raise ResumeError(f"{state_file}: unreadable trainer state ({type(err).__name__}: {err})") from None
    m = CHECKPOINT_RE.match(path.name)
    if m and int(m.group(1)) != step:
        raise ResumeError(f"{state_file}: global_step {step} but the folder is {path.name}")
    if step <= 0:
        raise ResumeError(f"{state_file}: global_step {step}; nothing to resume")
    if not any((path / w).is_file() for w in WEIGHT_FILES):
        raise ResumeError(f"{path}: no model weights ({' / '.join(WEIGHT_FILES)})")
    _check_weights(path, expected_shapes)
    return step


def _check_weights(path: Path, expected: Mapping[str, tuple[int, ...]] | None) -> None:
    from .weights import IncompleteCheckpoint, _saved_tensors

    try:
        saved = _saved_tensors(path, "Trainer checkpoint")
    except IncompleteCheckpoint as err:
        raise ResumeError(str(err)) from None
    for key, (f, shape) in saved.items():
        if 0 in shape:
            raise ResumeError(f"{f}: tensor {key} is empty (shape {list(shape)})")
    if not expected or (path / "adapter_model.safetensors").is_file():
        return  # LoRA checkpoints hold adapters only: checked for readability and empty tensors above
    names = set(saved)
    groups = _tied_groups(expected)
    missing = [k for k in expected if k not in names and not (groups.get(k, set()) & names)]
    if missing:
        raise ResumeError(
            f"{_files(saved)}: {len(missing)} tensor(s) of the model missing from the checkpoint: "
            f"{', '.join(sorted(missing)[:10])}"
        )
    for key, want in expected.items():
        if key in saved and tuple(saved[key][1]) != tuple(want):
            raise ResumeError(f"{saved[key][0]}: tensor {key} saved with shape {list(saved[key][1])}, "
                              f"the model has {list(want)}")


def _tied_groups(expected: Mapping[str, tuple[int, ...]]) -> dict[str, set[str]]:
    return getattr(expected, "tied", {}) or {}


class ModelShapes(dict):
    """``state_dict`` shapes of a live model plus ``tied``: name -> the other names sharing its tensor."""

    tied: dict[str, set[str]]


def model_shapes(model) -> ModelShapes:
    """Tensor name -> shape of ``model.state_dict()``, with tied weights (one tensor, several names) recorded."""
    state = model.state_dict(keep_vars=True)
    by_id: dict[int, set[str]] = {}
    for name, t in state.items():
        by_id.setdefault(id(t), set()).add(name)
    shapes = ModelShapes({k: tuple(v.shape) for k, v in state.items()})
    shapes.tied = {n: g - {n} for g in by_id.values() if len(g) > 1 for n in g}
    return shapes


def last_complete_checkpoint(output_dir: str | os.PathLike, expected_shapes=None) -> Path | None:
    """The newest ``checkpoint-<step>`` in ``output_dir`` that passes :func:`check_trainer_checkpoint`, or None.

    Incomplete ones (killed mid-save, truncated files) are skipped with a warning naming why.
    """
    for p in trainer_checkpoints(output_dir):
        try:
            check_trainer_checkpoint(p, expected_shapes)
            return p
        except ResumeError as err:
            logger.warning("skipping %s: %s", p, err)
    return None


def resolve_resume(args, model=None) -> str | None:
    """The checkpoint ``args.resume_from_checkpoint`` asks for, checked; sets the field to that path (or None).

    ``None``/empty: a fresh run. ``last``: the newest complete checkpoint in ``args.output_dir`` (error if none).
    A path: that checkpoint, which must be complete (a checkpoint without ``COMPLETE_MARKER``, e.g. from another
    tool, is accepted with a warning when its files pass every check).

    Args:
        model: the model being trained; its tensor shapes are checked against the checkpoint's.

    Raises:
        ResumeError: the checkpoint is missing or incomplete (named, with the reason), or already at or past
            ``args.max_steps``.
    """
    value = args.resume_from_checkpoint
    if value in (None, "", False):
        args.resume_from_checkpoint = None
        return None
    expected = model_shapes(model) if model is not None else None
    if str(value) == "last":
        found = last_complete_checkpoint(args.output_dir, expected)
        if found is None:
            raise ResumeError(f"--resume_from_checkpoint last: no complete Trainer checkpoint in {args.output_dir}")
        path = found
    else:
        path = Path(value)
        try:
            check_trainer_checkpoint(path, expected)
        except ResumeError as err:
            if COMPLETE_MARKER not in str(err):
                raise
            check_trainer_checkpoint(path, expected, require_marker=False)
            logger.warning("%s carries no %s (not written by this pipeline); its files pass every check", path,
                           COMPLETE_MARKER)
    step, max_steps = checkpoint_step(path), getattr(args, "max_steps", -1)
    if max_steps is not None and max_steps > 0 and step >= max_steps:
        raise ResumeError(
            f"{path}: checkpoint is at step {step}, at or past --max_steps {max_steps}: resuming would train past "
            "the run it asks for (or not at all); raise max_steps or start over without --resume_from_checkpoint"
        )
    args.resume_from_checkpoint = str(Path(path).resolve())
    logger.info("resuming from %s (step %d)", args.resume_from_checkpoint, step)
    return args.resume_from_checkpoint


def checkpoint_step(path: str | os.PathLike) -> int:
    """``global_step`` recorded in a checkpoint's ``trainer_state.json``."""
    return int(json.loads((Path(path) / "trainer_state.json").read_text())["global_step"])


class ResumeCallback(TrainerCallback):
    """Marks each Trainer checkpoint complete once saved; saves by wall time; optional fault injection (see module
    docstring).

    Checkpoints by time: where the stage config has ``save_minutes`` > 0, a Trainer checkpoint is saved once that
    many minutes have passed since training began or since the last save, and at the end of each epoch (not at the
    last step, and only a minute or more after the last save), on top of the Trainer's own ``save_strategy``. A
    checkpoint of a 135M model (weights and Adam state, about 1.6 GB) takes seconds: every few steps it is a share of
    the stage's time, every 30 minutes it is noise, and a kill still loses at most ``save_minutes`` of training. In a
    multi-process run rank 0's clock decides for every rank (a broadcast per step), since a save is collective under
    DeepSpeed and FSDP.
    """

    def __init__(self):
        raw = os.environ.get(FAULT_ENV)
        self.kill_after = int(raw) if raw else None
        self.start_step: int | None = None  # the global step training began at (the resumed checkpoint's)
        self._last_save = time.monotonic()

    def on_train_begin(self, args, state, control, **kwargs):
        self.start_step = int(state.global_step)  # after the Trainer restored the checkpoint's state
        self._last_save = time.monotonic()
        return control

    def on_step_end(self, args, state, control, **kwargs):
        minutes = float(getattr(args, "save_minutes", 0) or 0)
        if minutes > 0 and state.global_step < state.max_steps and not control.should_save:
            due = _same_on_every_rank(time.monotonic() - self._last_save >= 60 * minutes)
            if due:
                logger.info("checkpoint at step %d: %.0f minutes since the last one", state.global_step, minutes)
                control.should_save = True
        return control

    def on_epoch_end(self, args, state, control, **kwargs):
        # A resume point at an epoch boundary, unless epochs are short (many epochs of a few rows would save every
        # few steps): only a minute or more after the last save.
        if (float(getattr(args, "save_minutes", 0) or 0) > 0 and state.global_step < state.max_steps
                and not control.should_save and _same_on_every_rank(time.monotonic() - self._last_save >= 60)):
            control.should_save = True
        return control

    def on_save(self, args, state, control, **kwargs):
        self._last_save = time.monotonic()
        if state.is_world_process_zero:
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if folder.is_dir():
                tmp = folder / f"{COMPLETE_MARKER}.tmp"
                tmp.write_text(json.dumps({"global_step": state.global_step, "epoch": state.epoch}) + "\n")
                os.replace(tmp, folder / COMPLETE_MARKER)
        return control

    def on_step_begin(self, args, state, control, **kwargs):
        if self.kill_after is not None and state.global_step == self.kill_after:
            logger.warning("%s=%d: sending SIGKILL to this process (pid %d)", FAULT_ENV, self.kill_after, os.getpid())
            os.kill(os.getpid(), signal.SIGKILL)
        return control


def _same_on_every_rank(flag: bool) -> bool:
    """Rank 0's ``flag`` on every rank of an initialised process group (else ``flag``)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    box = [flag]
    dist.broadcast_object_list(box, src=0)
    return bool(box[0])


def check_finished(trainer, resumed_from: str | None) -> None:
    """Refuse a run that did not end at ``max_steps`` (a resume that skipped steps or an epoch, or one that ran past
    the steps asked for, must not exit 0).

    Raises:
        RuntimeError: naming the step reached, the steps asked for and the checkpoint resumed from.
    """
    state = trainer.state
    if state.global_step != state.max_steps:
        raise RuntimeError(
            f"training ended at step {state.global_step} of {state.max_steps} (epoch {state.epoch} of "
            f"{trainer.args.num_train_epochs}{', resumed from ' + resumed_from if resumed_from else ''}); "
            "refusing to save a model trained for other than the steps asked for"
        )


def mean_train_loss(state) -> float | None:
    """Mean loss over every optimizer step of the run, from the Trainer's log history (restored on resume).

    Each logged ``loss`` is the mean over the steps since the previous log, so the mean over the run is
    ``sum(loss_i * (step_i - step_{i-1})) / global_step``. None when the logged steps do not cover the run.
    """
    prev, total = 0, 0.0
    for entry in state.log_history:
        if "loss" in entry and "step" in entry:
            total += float(entry["loss"]) * (int(entry["step"]) - prev)
            prev = int(entry["step"])
    return total / prev if prev and prev == state.global_step else None


def training_record(trainer, resumed_from: str | None, result) -> dict[str, Any]:
    """What the manifest says about how the training ran (see module docstring). ``train_loss`` is over every step
    (:func:`mean_train_loss`, falling back to ``result.training_loss`` when the log does not cover the run)."""
    from .tracking import wandb_run_id

    state, args = trainer.state, trainer.args
    losses = [e["loss"] for e in state.log_history if "loss" in e]
    full = mean_train_loss(state)
    # the step training began at, as the Trainer restored it (the checkpoint itself may be rotated away by now)
    start = next((c.start_step for c in trainer.callback_handler.callbacks if isinstance(c, ResumeCallback)), None)
    return {
        "resumed_from": resumed_from,
        "resumed_from_step": start if resumed_from else None,
        "steps_this_run": int(state.global_step - (start or 0)),
        "global_step": int(state.global_step),
        "max_steps": int(state.max_steps),
        "epoch": state.epoch,
        "num_train_epochs": state.num_train_epochs,
        "train_loss": full if full is not None else result.training_loss,
        "train_loss_this_run": result.training_loss,
        "final_logged_loss": losses[-1] if losses else None,
        "save_strategy": str(getattr(args.save_strategy, "value", args.save_strategy)),
        "save_steps": args.save_steps,
        "save_total_limit": args.save_total_limit,
        "wandb_run_id": wandb_run_id(),
    }


def prune_trainer_checkpoints(output_dir: str | os.PathLike) -> int:
    """Remove ``checkpoint-<step>`` folders (resume state only) once the stage's own outputs are written; returns
    how many. Call after the manifest: a kill before it leaves them for the rerun."""
    found = trainer_checkpoints(output_dir)
    for p in found:
        shutil.rmtree(p)
    return len(found)


def _files(saved) -> str:
    return ", ".join(sorted({f for f, _ in saved.values()}))
