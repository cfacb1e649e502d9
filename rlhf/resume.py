"""Resume as a contract: a TRL stage killed mid-training continues from its last complete
Trainer checkpoint, and says so truthfully.

The machinery is transformers' own: the Trainer saves ``<output_dir>/checkpoint-<step>`` every ``save_steps``
(weights, optimizer and scheduler state, ``rng_state.pth``, ``trainer_state.json``, in the layout of one process,
DeepSpeed or FSDP: :mod:`rlhf.checkpoint_integrity`; ``save_total_limit`` are kept) and ``Trainer.train(resume_from_checkpoint=path)`` restores weights, optimizer, scheduler, RNG state and the
data position. This module adds what the Trainer leaves out:

* **Which checkpoint is complete, and unaltered.** The Trainer writes ``checkpoint-<step>`` in place, so a kill
  during a save leaves a folder that looks like a checkpoint. :class:`ResumeCallback` writes ``COMPLETE_MARKER``
  into it after the Trainer's ``on_save`` (all files written, on every rank), recording every file's sha256;
  :func:`check_trainer_checkpoint` checks the files of its layout, loads ``trainer_state.json`` with transformers'
  own loader, checks the weights against the live model's shapes, and re-hashes every file.
  :func:`select_checkpoint` skips failing ones, newest first, and says why; :func:`set_aside` keeps each refused
  one as ``refused-checkpoint-<step>`` with its reason (never deleted), and the manifest lists them
  (``training.refused_checkpoints``).
* **No save of a diverged run** (:mod:`rlhf.training_health`): a non-finite or exploded loss or weight at a save
  point fails the stage naming the step.
* **An explicit resume from a missing or corrupt checkpoint is an error** (:func:`resolve_resume`): before, the
  stage configs accepted ``--resume_from_checkpoint`` and ignored it (the run restarted at step 1 while the manifest
  recorded a resume). ``--resume_from_checkpoint last`` takes the newest complete one in ``output_dir``.
* **No silent short run** (:func:`check_finished`): the Trainer must end at ``max_steps``; a resume that skipped an
  epoch (a public report: resume at an epoch boundary skipped the next epoch and exited 0) fails loudly.
* **A truthful record** (:func:`training_record`): resumed-from path and step, global step, epochs, the loss over
  every step of the run (the Trainer's ``training_loss`` after a resume averages only the steps of the last process).

Fault injection for the resume tests: ``RLHF_FAULT_SIGKILL_AFTER_STEP=N`` makes :class:`ResumeCallback` send
SIGKILL to its own process when optimizer step ``N`` is done (logged and saved), at the start of step ``N + 1``.
It is a real kill (no cleanup, no exception handler runs); nothing sets it outside tests. ``RLHF_FAULT_NAN_AT_STEP=N``
multiplies the model's output (every floating tensor of it) by NaN during optimizer step ``N``, as an overflow in the
forward pass would: the NaN flows through the Trainer's own loss logging, backward and optimizer step.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from .checkpoint_integrity import (
    WEIGHT_FILES,
    CheckpointDamaged,
    check_layout,
    check_trainer_state,
    detect_layout,
    marker_record,
    verify_marker,
)
from .training_health import check_loss, check_weights, local_tensors

logger = logging.getLogger(__name__)

CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
COMPLETE_MARKER = ".rlhf-complete"
FAULT_ENV = "RLHF_FAULT_SIGKILL_AFTER_STEP"
NAN_FAULT_ENV = "RLHF_FAULT_NAN_AT_STEP"
# files a Trainer checkpoint needs to resume everything (rng: one file, or one per process)
REFUSED_PREFIX = "refused-"  # a checkpoint that failed its checks is renamed refused-checkpoint-<step>, kept
REFUSED_MARKER = ".rlhf-refused"  # in it: why it was refused, and when


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
    path: str | os.PathLike, expected_shapes: Mapping[str, tuple[int, ...]] | None = None, *,
    require_marker: bool = True, world_size: int | None = None,
) -> int:
    """Check that a Trainer checkpoint folder holds everything a resume restores, unaltered; return its step.

    In order: the folder and its completion marker; the files of its layout (``plain``, ``deepspeed`` or ``fsdp``,
    :mod:`rlhf.checkpoint_integrity`); ``trainer_state.json`` through transformers' ``TrainerState.load_from_json``;
    the saved weights against the live model's shapes; last, every file's sha256 against the marker's record.

    Args:
        expected_shapes: tensor name -> shape of the model being trained (its ``state_dict``); the saved weights
            must hold every one of them (tied names count once via ``tied``) with that shape.
        require_marker: the checkpoint must carry ``COMPLETE_MARKER`` with its file hashes (written after the
            Trainer finished saving). False: a checkpoint of another tool, checked without hashes.
        world_size: processes of the run about to resume; one saved by another number is refused (None: unchecked).

    Raises:
        ResumeError: naming the folder or file: no such folder, no marker (killed mid-save), a missing, zero-byte,
            truncated or altered file (sha256), malformed ``trainer_state.json``, missing weights, a missing tensor,
            a tensor of the wrong shape, another world size.
    """
    path = Path(path)
    if not path.is_dir():
        raise ResumeError(f"--resume_from_checkpoint {path}: no such checkpoint folder")
    if require_marker and not (path / COMPLETE_MARKER).is_file():
        raise ResumeError(f"{path}: not marked complete ({COMPLETE_MARKER} missing): the save was interrupted")
    m = CHECKPOINT_RE.match(path.name)
    try:
        layout = detect_layout(path)
        check_layout(path, layout)
        step = int(check_trainer_state(path, int(m.group(1)) if m else None).global_step)
    except CheckpointDamaged as err:
        raise ResumeError(str(err)) from None
    if layout == "plain" or any((path / w).is_file() for w in WEIGHT_FILES):
        _check_weights(path, expected_shapes)  # DeepSpeed ZeRO-3 without a 16-bit gather writes no weight file
    if require_marker:
        try:
            verify_marker(path, COMPLETE_MARKER, world_size)
        except CheckpointDamaged as err:
            raise ResumeError(str(err)) from None
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


def select_checkpoint(
    output_dir: str | os.PathLike, expected_shapes=None, world_size: int | None = None
) -> tuple[Path | None, list[dict[str, Any]]]:
    """The newest ``checkpoint-<step>`` in ``output_dir`` that passes :func:`check_trainer_checkpoint`, and the
    newer ones that did not: ``[{"checkpoint", "step", "marked_complete", "reason"}]``, newest first.

    Each refusal is logged with its reason. Nothing is moved or removed (:func:`set_aside` does that).
    """
    refused: list[dict[str, Any]] = []
    for p in trainer_checkpoints(output_dir):
        try:
            check_trainer_checkpoint(p, expected_shapes, world_size=world_size)
            return p, refused
        except ResumeError as err:
            logger.warning("skipping %s: %s", p, err)
            refused.append({"checkpoint": str(p), "step": int(CHECKPOINT_RE.match(p.name).group(1)),
                            "marked_complete": (p / COMPLETE_MARKER).is_file(), "reason": str(err)})
    return None, refused


def last_complete_checkpoint(output_dir: str | os.PathLike, expected_shapes=None) -> Path | None:
    """The newest ``checkpoint-<step>`` in ``output_dir`` that passes :func:`check_trainer_checkpoint`, or None.

    Incomplete or damaged ones are skipped with a warning naming why (:func:`select_checkpoint`).
    """
    return select_checkpoint(output_dir, expected_shapes)[0]


def set_aside(refused: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rename each refused ``checkpoint-<step>`` to ``refused-checkpoint-<step>`` next to it, with its reason in
    ``REFUSED_MARKER``; returns the records with ``kept_at`` added.

    Never deleted: a checkpoint the pipeline marked complete may hold hours of training, and what went wrong with
    it is evidence. Renamed so that the Trainer neither saves into it (a resumed run reaches its step again) nor
    rotates it away (``save_total_limit`` counts ``checkpoint-*`` only).
    """
    kept = []
    for rec in refused:
        src = Path(rec["checkpoint"])
        if not src.is_dir():
            continue
        dst, n = src.with_name(REFUSED_PREFIX + src.name), 1
        while dst.exists():
            n += 1
            dst = src.with_name(f"{REFUSED_PREFIX}{src.name}.{n}")
        os.replace(src, dst)
        rec = {**rec, "kept_at": str(dst), "refused_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        (dst / REFUSED_MARKER).write_text(json.dumps(rec, indent=1) + "\n")
        logger.warning("%s refused and kept as %s: %s", src.name, dst.name, rec["reason"])
        kept.append(rec)
    return kept


def refused_checkpoints(output_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of every checkpoint set aside in ``output_dir`` (:func:`set_aside`), oldest refusal first."""
    out = Path(output_dir)
    found = []
    for f in sorted(out.glob(f"{REFUSED_PREFIX}checkpoint-*/{REFUSED_MARKER}")) if out.is_dir() else []:
        try:
            found.append(json.loads(f.read_text()))
        except ValueError:
            found.append({"kept_at": str(f.parent), "reason": f"{f}: unreadable refusal record"})
    return sorted(found, key=lambda r: (r.get("refused_at", ""), r.get("kept_at", "")))


def resolve_resume(args, model=None) -> str | None:
    """The checkpoint ``args.resume_from_checkpoint`` asks for, checked; sets the field to that path (or None).

    ``None``/empty: a fresh run. ``last``: the newest complete checkpoint in ``args.output_dir`` (error if none);
    newer ones that fail a check are set aside (:func:`set_aside`) with their reasons. A path: that checkpoint,
    which must be complete (a checkpoint without ``COMPLETE_MARKER``, e.g. from another tool, is accepted with a
    warning when its files pass every check but the hashes). In a multi-process run rank 0 checks (and hashes)
    once and every rank takes its answer.

    Args:
        model: the model being trained; its tensor shapes are checked against the checkpoint's.

    Raises:
        ResumeError: the checkpoint is missing, incomplete or damaged (named, with the reason), was saved by another
            number of processes, or is already at or past ``args.max_steps``.
    """
    value = args.resume_from_checkpoint
    if value in (None, "", False):
        args.resume_from_checkpoint = None
        return None
    expected = model_shapes(model) if model is not None else None
    world_size = getattr(args, "world_size", None)

    def decide() -> tuple[str | None, str | None]:
        try:
            return str(_resolve(args, value, expected, world_size)), None
        except ResumeError as err:
            return None, str(err)

    path, error = _rank0_decides(decide)
    if error is not None:
        raise ResumeError(error)
    step, max_steps = checkpoint_step(path), getattr(args, "max_steps", -1)
    if max_steps is not None and max_steps > 0 and step >= max_steps:
        raise ResumeError(
            f"{path}: checkpoint is at step {step}, at or past --max_steps {max_steps}: resuming would train past "
            "the run it asks for (or not at all); raise max_steps or start over without --resume_from_checkpoint"
        )
    args.resume_from_checkpoint = str(Path(path).resolve())
    logger.info("resuming from %s (step %d)", args.resume_from_checkpoint, step)
    return args.resume_from_checkpoint


def _resolve(args, value, expected, world_size) -> Path:
    if str(value) == "last":
        found, refused = select_checkpoint(args.output_dir, expected, world_size)
        set_aside(refused)
        if found is None:
            raise ResumeError(f"--resume_from_checkpoint last: no complete Trainer checkpoint in {args.output_dir}"
                              + "".join(f"; {r['checkpoint']}: {r['reason']}" for r in refused))
        return found
    path = Path(value)
    try:
        check_trainer_checkpoint(path, expected, world_size=world_size)
    except ResumeError as err:
        if not str(err).endswith(f"({COMPLETE_MARKER} missing): the save was interrupted"):
            raise
        check_trainer_checkpoint(path, expected, require_marker=False)
        logger.warning("%s carries no %s (not written by this pipeline); its files pass every check but the "
                       "hashes", path, COMPLETE_MARKER)
    return path


def _rank0_decides(fn):
    """``fn()`` on rank 0 of an initialised process group, its (picklable) result on every rank; else ``fn()``."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return fn()
    box = [fn() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


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

    Before every save the loss of the step is logged and checked, and the weights are checked
    (:mod:`rlhf.training_health`: non-finite, or a loss above ``max(10 x the first logged loss, 1)``, or a weight
    beyond 1e4): a diverged run fails with :class:`rlhf.training_health.TrainingDiverged` naming the step, and
    writes no checkpoint of the diverged weights.
    """

    def __init__(self):
        raw = os.environ.get(FAULT_ENV)
        self.kill_after = int(raw) if raw else None
        raw = os.environ.get(NAN_FAULT_ENV)
        self.nan_at = int(raw) if raw else None
        self._nan_hook = None
        self.start_step: int | None = None  # the global step training began at (the resumed checkpoint's)
        self._last_save = time.monotonic()
        self._logged: tuple[int | None, float | None] = (None, None)  # (step, loss) of the last logged loss

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
        return self._before_save(control)

    def on_epoch_end(self, args, state, control, **kwargs):
        # A resume point at an epoch boundary, unless epochs are short (many epochs of a few rows would save every
        # few steps): only a minute or more after the last save.
        if (float(getattr(args, "save_minutes", 0) or 0) > 0 and state.global_step < state.max_steps
                and not control.should_save and _same_on_every_rank(time.monotonic() - self._last_save >= 60)):
            control.should_save = True
        if control.should_save and self._logged[0] == state.global_step:  # logged already: no new log will come
            self._check(state, kwargs.get("model"))
        return self._before_save(control)

    @staticmethod
    def _before_save(control):
        # A save is due: log this step's loss first. The Trainer logs before it saves, so on_log checks the loss
        # and the weights before anything is written.
        if control.should_save:
            control.should_log = True
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self._logged = (state.global_step, logs["loss"])
            if control.should_save:
                self._check(state, kwargs.get("model"))
        return control

    def _check(self, state, model) -> None:
        """Refuse a diverged loss, then non-finite or exploded weights (every rank: the check is agreed)."""
        check_loss(self._logged[1], state.global_step, state.log_history)
        if model is not None:
            check_weights(local_tensors(model), state.global_step)

    def on_save(self, args, state, control, **kwargs):
        """Mark the checkpoint complete, with every file's size and sha256 (:mod:`rlhf.checkpoint_integrity`),
        once every rank has written its files (a barrier: DeepSpeed and FSDP shards, per-rank RNG states)."""
        self._last_save = time.monotonic()
        _barrier()
        if state.is_world_process_zero:
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if folder.is_dir():
                mark_complete(folder, global_step=state.global_step, epoch=state.epoch,
                              world_size=getattr(args, "world_size", 1))
        return control

    def on_step_begin(self, args, state, control, **kwargs):
        if self.kill_after is not None and state.global_step == self.kill_after:
            logger.warning("%s=%d: sending SIGKILL to this process (pid %d)", FAULT_ENV, self.kill_after, os.getpid())
            os.kill(os.getpid(), signal.SIGKILL)
        if self.nan_at is not None and state.global_step + 1 == self.nan_at and kwargs.get("model") is not None:
            logger.warning("%s=%d: the model's output is NaN during this step", NAN_FAULT_ENV, self.nan_at)
            self._nan_hook = kwargs["model"].register_forward_hook(_poison_output)
        elif self._nan_hook is not None:
            self._nan_hook.remove()
            self._nan_hook = None
        return control


def mark_complete(folder: str | os.PathLike, *, global_step: int, epoch, world_size: int) -> Path:
    """Write ``COMPLETE_MARKER`` into a checkpoint folder whose every file is written (on every rank): the record of
    :func:`rlhf.checkpoint_integrity.marker_record` (step, epoch, layout, world size, each file's size and sha256),
    through a temporary file and a rename, so the marker is there whole or not at all. Returns the marker's path."""
    folder = Path(folder)
    record = marker_record(folder, COMPLETE_MARKER, global_step=global_step, epoch=epoch, world_size=world_size)
    tmp = folder / f"{COMPLETE_MARKER}.tmp"
    tmp.write_text(json.dumps(record) + "\n")
    os.replace(tmp, folder / COMPLETE_MARKER)
    return folder / COMPLETE_MARKER


def _poison_output(module, inputs, output):
    # every floating tensor of the output: TRL's SFT reads fused log-probabilities, DPO and the reward model logits
    for key, value in list(output.items()):
        if hasattr(value, "is_floating_point") and value.is_floating_point():
            output[key] = value * float("nan")
    return output


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


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
        # checkpoints that failed their checks (damaged, altered, malformed state) and were kept aside, with why
        "refused_checkpoints": refused_checkpoints(args.output_dir),
    }


def prune_trainer_checkpoints(output_dir: str | os.PathLike) -> int:
    """Remove ``checkpoint-<step>`` folders (resume state only) once the stage's own outputs are written, and the
    set-aside ones that were never marked complete (interrupted saves); returns how many. Refused checkpoints the
    pipeline had marked complete are kept (:func:`set_aside`). Call after the manifest: a kill before it leaves
    them for the rerun."""
    found = trainer_checkpoints(output_dir)
    found += [Path(r["kept_at"]) for r in refused_checkpoints(output_dir)
              if r.get("marked_complete") is False and Path(r.get("kept_at", "")).is_dir()]
    for p in found:
        shutil.rmtree(p)
    return len(found)


def _files(saved) -> str:
    return ", ".join(sorted({f for f, _ in saved.values()}))
