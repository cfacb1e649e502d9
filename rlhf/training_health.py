"""Refuse to save a model whose training has diverged: a non-finite or exploded loss, non-finite or exploded weights.

Bounds (checked at every Trainer checkpoint and before the stage's final save):

* **Loss**: finite, and at most ``LOSS_FACTOR`` (10) times the run's first logged loss, or ``LOSS_FLOOR`` (1.0)
  when that is larger. Every stage's loss starts at or below its chance value (next-token cross-entropy: ln V, about
  10.8 nats for SmolLM2's V = 49,152; the DPO and Bradley-Terry losses: ln 2 = 0.693) and training lowers it, so a
  loss ten times where the run began is past any chance-level model: the weights have diverged (the public failure:
  a corrupted optimizer state trained to a loss of 1.7e12 and exited 0). Logging windows of a few small batches vary
  by 2-3x, well inside the bound. The floor keeps a run whose first loss is near 0 from failing on noise.
* **Weights**: every entry finite and ``|w| <= WEIGHT_BOUND`` (1e4). Trained language models' weights lie within a
  few tens (the largest entries are norms' gains and embedding outliers); fp16's range ends at 65,504, so an entry
  of 1e4 is blown up, not trained.

A refusal is :class:`TrainingDiverged`, naming the step, the value and the bound, raised on every rank at once
(the check is agreed across processes, since a save is collective under DeepSpeed and FSDP).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

LOSS_FACTOR = 10.0
LOSS_FLOOR = 1.0
WEIGHT_BOUND = 1e4


class TrainingDiverged(RuntimeError):
    """Training diverged at a save point; the message names the step, what was out of bounds and the bound."""


def first_loss(log_history: list[dict]) -> float | None:
    """The first logged training ``loss`` of the run (the Trainer's log history, restored on resume), or None."""
    return next((float(e["loss"]) for e in log_history if "loss" in e), None)


def loss_bound(first: float) -> float:
    """The largest loss a save accepts: ``max(LOSS_FACTOR * first, LOSS_FLOOR)`` (module docstring)."""
    return max(LOSS_FACTOR * first, LOSS_FLOOR)


def check_loss(loss: float | None, step: int, log_history: list[dict], *, what: str = "checkpoint") -> None:
    """Raise :class:`TrainingDiverged` when ``loss`` (the loss logged at ``step``) is non-finite or exploded.

    ``None`` (no loss logged yet) passes. A non-finite first loss is itself a refusal.
    """
    if loss is None:
        return
    loss = float(loss)
    if not math.isfinite(loss):
        raise TrainingDiverged(f"refusing to save the {what} at step {step}: the training loss is {loss}")
    first = first_loss(log_history)
    if first is None or not math.isfinite(first):
        return
    bound = loss_bound(first)
    if loss > bound:
        raise TrainingDiverged(
            f"refusing to save the {what} at step {step}: the training loss {loss:.6g} exceeds {bound:.6g} "
            f"(max({LOSS_FACTOR:g} x the first logged loss {first:.6g}, {LOSS_FLOOR:g})): training diverged"
        )


def local_tensors(model) -> Iterable[tuple[str, object]]:
    """``(name, tensor)`` of this process's share of ``model``'s parameters: DeepSpeed ZeRO-3's partition
    (``ds_tensor``), a DTensor's local shard (FSDP2), else the parameter itself (one process, DDP, ZeRO-1/2)."""
    for name, p in model.named_parameters():
        t = getattr(p, "ds_tensor", None)
        if t is None:
            t = p.to_local() if hasattr(p, "to_local") else p
        if t.numel():
            yield name, t.detach()


def weights_problem(tensors: Iterable[tuple[str, object]]) -> str | None:
    """The first tensor whose entries are non-finite or beyond ``WEIGHT_BOUND`` (name and value), or None."""
    import torch

    named = list(tensors)
    if not named:
        return None
    peaks = torch.stack([t.abs().amax().float().cpu() for _, t in named])  # NaN propagates through amax
    for (name, _), peak in zip(named, peaks.tolist()):
        if not math.isfinite(peak):
            return f"weight {name} has non-finite entries"
        if peak > WEIGHT_BOUND:
            return f"weight {name} has an entry of magnitude {peak:.6g} > {WEIGHT_BOUND:g}"
    return None


def agreed(problem: str | None) -> str | None:
    """The first non-None ``problem`` over every rank of an initialised process group (else ``problem``)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return problem
    gathered: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, problem)
    return next((p for p in gathered if p is not None), None)


def check_weights(tensors: Iterable[tuple[str, object]], step: int, *, what: str = "checkpoint",
                  collective: bool = True) -> None:
    """Raise :class:`TrainingDiverged` when any weight is non-finite or beyond ``WEIGHT_BOUND``.

    ``collective``: every rank calls it and all raise if any rank's share is bad (a Trainer checkpoint); False
    for a check only rank 0 makes (the final save).
    """
    problem = weights_problem(tensors)
    if collective:
        problem = agreed(problem)
    if problem is not None:
        raise TrainingDiverged(f"refusing to save the {what} at step {step}: {problem}: training diverged")
