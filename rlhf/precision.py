"""Resolve training precision per device by measurement, not assumption (DESIGN.md: bf16 only where the hardware
has it, and log the choice; issue 12).

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

#: Stages kept at fp32 under ``auto`` even where bf16 is native, and the measured reason (issue 12's figures,
#: re-measured by benchmarks/precision.py).
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
