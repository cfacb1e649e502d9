"""Multi-process launches: the world-size contract, collective timeouts, and data-parallel map (shard, gather in order).

The contract the cluster launch scripts rely on (Slurm / Kubernetes templates set ``RLHF_EXPECTED_WORLD_SIZE``):

- ``RLHF_EXPECTED_WORLD_SIZE=N``: a stage whose launch has another world size fails at start-up with
  :class:`WorldSizeMismatch`, naming expected and actual sizes and the launcher variables it saw (``WORLD_SIZE``,
  ``SLURM_NTASKS``, ...), instead of training on one process (the public failure: a launcher that ignores the
  scheduler's environment and silently runs at world size 1).
- ``RLHF_COLLECTIVE_TIMEOUT_S`` (seconds, default :data:`DEFAULT_COLLECTIVE_TIMEOUT_S`): the timeout of every
  collective (process-group init, all-reduce, all-gather), so a rank that died or hangs ends the job with an error
  instead of a weight sync that waits forever. Training stages get it as ``TrainingArguments.ddp_timeout`` (which
  the Trainer passes to accelerate's ``InitProcessGroupKwargs``); the gate stage passes it to ``PartialState``.

Both are checked by :func:`check_launch`, which ``rlhf.entrypoint.setup_stage`` (every training stage) and the gate
stage call first.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

logger = logging.getLogger(__name__)

EXPECTED_ENV = "RLHF_EXPECTED_WORLD_SIZE"
TIMEOUT_ENV = "RLHF_COLLECTIVE_TIMEOUT_S"
#: 30 minutes: torch's own default for NCCL/gloo process groups; long enough for a rank-0-only step (judging,
#: writing a report) between two collectives on the smoke and demo presets.
DEFAULT_COLLECTIVE_TIMEOUT_S = 1800

#: Launcher variables that carry a world size, in the order they are trusted (torchrun / accelerate, then schedulers
#: and MPI); all that are set are named in the error.
WORLD_SIZE_VARS = ("WORLD_SIZE", "SLURM_NTASKS", "SLURM_NPROCS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
                   "LOCAL_WORLD_SIZE", "SLURM_NNODES", "SLURM_JOB_NUM_NODES", "PET_NNODES", "PET_NPROC_PER_NODE")


class WorldSizeMismatch(RuntimeError):
    """The launch has another number of processes than ``RLHF_EXPECTED_WORLD_SIZE`` asked for."""


def _int_env(name: str, env: dict) -> int | None:
    raw = env.get(name)
    if raw in (None, ""):
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None
    if value < 1:
        raise ValueError(f"{name}={value} must be at least 1")
    return value


def actual_world_size(env: dict | None = None) -> int:
    """Processes in this launch: ``torch.distributed``'s world size when a process group is up, else ``WORLD_SIZE``
    (set by torchrun, accelerate launch and the cluster templates), else 1 (a plain ``python -m`` start)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return _int_env("WORLD_SIZE", os.environ if env is None else env) or 1


def collective_timeout_s(default: float | None = None, env: dict | None = None) -> float:
    """The collective timeout in seconds: ``RLHF_COLLECTIVE_TIMEOUT_S``, else ``default`` (a config field), else
    :data:`DEFAULT_COLLECTIVE_TIMEOUT_S`. Raises ValueError for a value under 1 s (``TrainingArguments.ddp_timeout``
    is whole seconds), not finite (nan, inf) or not numeric."""
    env = os.environ if env is None else env
    raw = env.get(TIMEOUT_ENV)
    if raw in (None, ""):
        value = DEFAULT_COLLECTIVE_TIMEOUT_S if default is None else default
    else:
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"{TIMEOUT_ENV}={raw!r} is not a number of seconds") from None
    if not math.isfinite(value) or value < 1:  # ddp_timeout is whole seconds: 0.5 would become 0 (no timeout)
        raise ValueError(f"collective timeout must be a finite number of seconds >= 1, got {value!r} "
                         f"({TIMEOUT_ENV} or config)")
    return float(value)


def check_world_size(env: dict | None = None) -> int:
    """Raise :class:`WorldSizeMismatch` when ``RLHF_EXPECTED_WORLD_SIZE`` is set and differs from
    :func:`actual_world_size`. Returns the actual world size.

    The message names both sizes and every launcher variable that was set (``WORLD_SIZE_VARS``), e.g.
    ``expected world size 3 (RLHF_EXPECTED_WORLD_SIZE) but this launch has 2 processes; seen: WORLD_SIZE=2,
    LOCAL_WORLD_SIZE=2``.
    """
    env = os.environ if env is None else env
    expected = _int_env(EXPECTED_ENV, env)
    actual = actual_world_size(env)
    if expected is not None and expected != actual:
        seen = ", ".join(f"{k}={env[k]}" for k in WORLD_SIZE_VARS if env.get(k) not in (None, "")) or "none of " + \
            ", ".join(WORLD_SIZE_VARS)
        hint = (" (started without a launcher? use torchrun / accelerate launch / srun with the scheduler's environment)"
                if actual == 1 else "")
        raise WorldSizeMismatch(
            f"expected world size {expected} ({EXPECTED_ENV}) but this launch has {actual} process"
            f"{'es' if actual != 1 else ''}{hint}; launcher variables seen: {seen}"
        )
    return actual


def apply_timeout(args) -> float:
    """Set ``args.ddp_timeout`` (a ``TrainingArguments``) to the collective timeout and return it in seconds.

    ``RLHF_COLLECTIVE_TIMEOUT_S`` wins; else a ``collective_timeout_s`` field, else the recipe's own ``ddp_timeout``.
    Called from the stage configs' ``__post_init__`` (``rlhf.config.CommonArguments``), BEFORE
    ``TrainingArguments.__post_init__`` creates the process group with ``timedelta(seconds=ddp_timeout)``: set
    later, the timeout would not reach the group. Objects without ``ddp_timeout`` are left alone.
    """
    default = getattr(args, "collective_timeout_s", None)
    if default is None:
        default = getattr(args, "ddp_timeout", None)
    timeout = collective_timeout_s(default)
    if hasattr(args, "ddp_timeout"):
        args.ddp_timeout = math.ceil(timeout)  # whole seconds, never rounded down to 0
    return timeout


def prepare_training_args(args) -> None:
    """What a ``TrainingArguments`` needs, before its ``__post_init__`` creates the process group, to run on every
    process of the launch: the collective timeout (:func:`apply_timeout`), and on a machine without CUDA in a
    multi-process launch ``use_cpu = True``: accelerate (1.15, ``PartialState._prepare_backend``) picks its
    multi-CPU (gloo, DDP) mode only with ``cpu=True``; without it the processes each train alone at world size 1
    (transformers warns "process group is initialized, but parallel_mode != ParallelMode.DISTRIBUTED")."""
    apply_timeout(args)
    if hasattr(args, "use_cpu") and _launched() and not _cuda() and not args.use_cpu:
        args.use_cpu = True
        logger.info("multi-process launch without CUDA: use_cpu = true (gloo DDP)")


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def check_launch(args=None) -> dict[str, Any]:
    """The start-up check of every stage: world size (:func:`check_world_size`) and collective timeout
    (:func:`apply_timeout`; the process group, when up, is checked to carry it).

    Returns:
        ``{"world_size": int, "collective_timeout_s": float}``.

    Raises:
        WorldSizeMismatch: see :func:`check_world_size`.
        ValueError: a malformed environment variable.
    """
    world = check_world_size()
    timeout = apply_timeout(args) if args is not None else collective_timeout_s()
    if world > 1:
        group = group_timeout_s()
        logger.info("launch: %d processes (rank %s), collective timeout %.0f s%s", world, os.environ.get("RANK", "?"),
                    timeout, "" if group is None else f" (process group: {group:.0f} s)")
    return {"world_size": world, "collective_timeout_s": timeout}


def group_timeout_s() -> float | None:
    """The default process group's timeout in seconds (None without a group): what every collective waits at most."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    try:  # private API (torch 2.13: the backend's options carry the timeout); only used to report it
        import torch
        from torch.distributed.distributed_c10d import _get_default_group

        group = _get_default_group()
        device = torch.device("cuda" if torch.cuda.is_available() and dist.get_backend() == "nccl" else "cpu")
        return group._get_backend(device).options._timeout.total_seconds()
    except (AttributeError, RuntimeError, TypeError, ValueError):
        return None


def init_state(timeout_s: float | None = None):
    """accelerate's ``PartialState`` for this launch, its process group (gloo on CPU, NCCL on GPU) created with the
    collective timeout (:func:`collective_timeout_s`). ``PartialState`` is a singleton: the first call decides."""
    from accelerate import PartialState

    # cpu=True without CUDA: accelerate's multi-CPU mode (gloo); otherwise it would see one process (see above).
    return PartialState(cpu=not _cuda(), timeout=timedelta(seconds=collective_timeout_s(timeout_s)))


def map_sharded(fn: Callable[[list], Sequence], items: Sequence, *, shard: bool = True) -> list:
    """``fn(items)`` computed data-parallel: each process runs ``fn`` on its contiguous share of ``items``
    (``PartialState.split_between_processes``: the first ``len % world`` processes get one more) and every process
    receives all results, in the order of ``items`` (``accelerate.utils.gather_object`` concatenates by rank).

    Args:
        fn: maps a list of items to a list of results of the same length (it may see an empty list).
        items: the full input, identical on every process.
        shard: False (or a one-process launch): plain ``fn(items)``, no collective.

    Returns:
        ``list(fn(items))`` as a one-process run would return it.

    Raises:
        RuntimeError: a process returned a result list of another length than its share (names the rank).
    """
    from accelerate.utils import gather_object

    if not shard:
        return list(fn(list(items)))
    state = init_state() if _launched() else None
    if state is None or state.num_processes == 1:
        return list(fn(list(items)))
    with state.split_between_processes(list(items)) as mine:
        out = list(fn(list(mine))) if len(mine) else []
        if len(out) != len(mine):
            raise RuntimeError(f"rank {state.process_index}: {len(out)} results for {len(mine)} items")
    gathered = gather_object(out)
    if len(gathered) != len(items):
        raise RuntimeError(f"gathered {len(gathered)} results for {len(items)} items")
    return gathered


def _launched() -> bool:
    """True in a multi-process launch (a process group is up, or the launcher set ``WORLD_SIZE`` > 1)."""
    return actual_world_size() > 1


def is_main_process() -> bool:
    """Rank 0 of the launch (True without a launcher). The process that writes reports, manifests and checkpoints."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    return int(os.environ.get("RANK", "0")) == 0
