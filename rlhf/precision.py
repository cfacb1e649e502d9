"""Resolve training precision per device by measurement, not assumption (DESIGN.md: bf16 only where the hardware
has it, and log the choice).

``auto`` picks bf16 autocast only where the device computes bf16 natively (``rlhf.machine.native_bf16``: CUDA
capability 8.0+, or a CPU whose /proc/cpuinfo lists avx512_bf16 / amx_bf16); a CPU without those flags emulates
bf16 through fp32 and was measured 8-10x slower (a DPO step of the 135M model: 120-155 s bf16 vs 15 s fp32), so it
stays fp32. Stages whose numbers bf16 changes stay fp32 under ``auto`` (``FP32_UNDER_AUTO``): on a CPU with
avx512_bf16, DPO's loss drifted 0.651 (bf16) vs 0.685 (fp32) at step 2 and its step-0 ln 2 check needs the
log-probabilities to 1e-3; the reward model's held-out scores decide agreement ties and must reproduce after a
reload to 1e-3. SFT's loss matched (2.868 bf16 vs 2.871 fp32), so SFT takes bf16 where native.
``python benchmarks/precision.py`` re-measures step time and loss drift per stage; this table follows it.
"""

from __future__ import annotations

import logging
from typing import Literal

logger = logging.getLogger(__name__)

Precision = Literal["auto", "fp32", "bf16", "fp16"]

#: Stages kept at fp32 under ``auto`` even where bf16 is native, and the measured reason (figures measured with
#: benchmarks/precision.py, which re-measures them).
FP32_UNDER_AUTO = {
    "dpo": "bf16 drift changes DPO's loss (0.651 bf16 vs 0.685 fp32 at step 2) and its ln 2 step-0 check",
    "reward_model": "bf16 drift changes held-out scores, which decide agreement and must reproduce after reload",
}


def resolve_precision(requested: str = "auto", stage: str | None = None) -> Literal["fp32", "bf16", "fp16"]:
    """Pick the training dtype for this machine and stage, and log the choice with its reason.

    Args:
        requested: ``auto`` (bf16 where native and the stage tolerates it, fp16 on CUDA without bf16, else fp32),
            or an explicit ``fp32`` / ``bf16`` / ``fp16``.
        stage: the stage asking (``FP32_UNDER_AUTO`` keys stay fp32 under ``auto``); None: no stage rule.

    Returns:
        The dtype actually used. A bf16 request on a device without native bf16, or fp16 without CUDA, falls back
        to fp32 with a warning.

    Raises:
        ValueError: an unknown ``requested`` value.
    """
    import torch

    from .machine import native_bf16

    if requested not in ("auto", "fp32", "bf16", "fp16"):
        raise ValueError(f"precision must be auto, fp32, bf16 or fp16, got {requested!r}")
    cuda = torch.cuda.is_available()
    bf16_ok, evidence = native_bf16()
    if requested == "auto":
        if bf16_ok and stage in FP32_UNDER_AUTO:
            chosen, reason = "fp32", f"{evidence}, but {FP32_UNDER_AUTO[stage]}"
        elif bf16_ok:
            chosen, reason = "bf16", evidence
        elif cuda:
            chosen, reason = "fp16", evidence
        else:
            chosen, reason = "fp32", f"{evidence}: emulated bf16 measured 8-10x slower than fp32"
    elif requested == "bf16" and not bf16_ok:
        chosen, reason = "fp32", f"bf16 requested but {evidence}"
    elif requested == "fp16" and not cuda:
        chosen, reason = "fp32", "fp16 requested but mixed fp16 needs CUDA"
    else:
        chosen, reason = requested, f"requested ({evidence})"
    (logger.warning if chosen != requested and requested != "auto" else logger.info)(
        "precision%s: %s (%s)", f" of {stage}" if stage else "", chosen, reason
    )
    return chosen


def accelerate_mixed_precision(requested: str = "auto", stage: str | None = None) -> Literal["no", "bf16", "fp16"]:
    """:func:`resolve_precision`'s choice in accelerate's vocabulary (``Accelerator(mixed_precision=...)``):
    fp32 is ``"no"``. For stages that drive accelerate themselves (PPO) instead of a TRL trainer."""
    chosen = resolve_precision(requested, stage)
    return "no" if chosen == "fp32" else chosen


def stage_accelerator(mixed_precision: str, **kwargs):
    """``accelerate.Accelerator(mixed_precision=..., **kwargs)`` for a stage that drives accelerate itself (PPO),
    in a process where something else may already have set accelerate's process-wide state.

    accelerate keeps one ``AcceleratorState`` per process and refuses a second ``Accelerator`` with another mixed
    precision ("AcceleratorState has already been initialized and cannot be changed"); a TRL trainer run earlier in
    the same process (a test, a notebook) leaves its precision there. Like transformers' ``TrainingArguments``, this
    resets that state when its precision differs, keeping the process group (``PartialState``) so a distributed
    launch is unaffected.

    Args:
        mixed_precision: accelerate's vocabulary, ``"no"`` | ``"bf16"`` | ``"fp16"``
            (:func:`accelerate_mixed_precision`).
        kwargs: passed on to ``Accelerator``.
    """
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, PartialState

    shared = AcceleratorState._shared_state
    initialized = bool(shared) and shared != PartialState._shared_state
    previous = str(shared.get("_mixed_precision", "no")) if initialized else None
    if initialized and previous != mixed_precision:
        logger.info("accelerate state had mixed precision %r; reset for %r", previous, mixed_precision)
        AcceleratorState._reset_state(reset_partial_state=False)
    return Accelerator(mixed_precision=mixed_precision, **kwargs)


def keep_in_fp32(module):
    """Run ``module`` (a reward model's score head) in fp32 with autocast off, whatever the surrounding autocast.

    Under bf16 autocast a ``Linear`` rounds its output to bf16 (8 mantissa bits: a score of 3.0 moves by up to
    0.008), and reward-model scores decide agreement ties and must reproduce after a reload. The input is cast to
    fp32 and autocast is switched off for the module's own forward by a forward pre-hook and an always-called
    forward hook (hooks survive the deep copy PEFT makes of a ``modules_to_save`` head; a patched ``forward``
    would not). The weights stay as they are (fp32 master weights under autocast). Idempotent.

    Returns:
        ``module``.
    """
    import torch

    if getattr(module, "_rlhf_fp32", False):
        return module
    contexts: list = []

    def enter(mod, args):
        x = args[0] if args else None
        device = x.device.type if isinstance(x, torch.Tensor) else "cpu"
        ctx = torch.autocast(device, enabled=False)
        ctx.__enter__()
        contexts.append(ctx)
        return tuple(a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)

    def leave(mod, args, output):
        if contexts:
            contexts.pop().__exit__(None, None, None)
        return output

    module.register_forward_pre_hook(enter)
    module.register_forward_hook(leave, always_call=True)
    module._rlhf_fp32 = True
    return module


def generation_precision(requested: str = "auto") -> Literal["fp32", "bf16"]:
    """The weights' dtype for greedy generation on this device, logged with its reason.

    Decoding is bound by memory bandwidth (every weight is read once per generated token), so bf16 weights halve
    its cost where bf16 is native (:func:`rlhf.machine.native_bf16`); where it is emulated, fp32 is faster.

    Args:
        requested: ``auto`` (bf16 where native, else fp32), ``fp32`` or ``bf16`` (fp32, with a warning, where bf16
            is not native).

    Raises:
        ValueError: an unknown ``requested`` value.
    """
    from .machine import native_bf16

    if requested not in ("auto", "fp32", "bf16"):
        raise ValueError(f"generation precision must be auto, fp32 or bf16, got {requested!r}")
    ok, evidence = native_bf16()
    chosen = "fp32" if requested == "fp32" or not ok else "bf16"
    (logger.warning if requested == "bf16" and chosen != "bf16" else logger.info)(
        "generation precision: %s (requested %s; %s)", chosen, requested, evidence
    )
    return chosen
