"""Resolve training precision per device (DESIGN.md: bf16 only where the hardware has it, and log the choice).

TRL 1.16 defaults to bf16=True. On CPUs, mixed bf16 training is emulated or poorly kernelled (measured here on
2 cores: a DPO step of the 135M model takes 120-155 s in bf16 vs 15 s in fp32, even though /proc/cpuinfo lists
avx512_bf16), and transformers refuses bf16 without a GPU unless use_cpu is set. So the CPU always trains in fp32.
"""

from __future__ import annotations

import logging
from typing import Literal

logger = logging.getLogger(__name__)

Precision = Literal["auto", "fp32", "bf16", "fp16"]


def resolve_precision(requested: str = "auto") -> Literal["fp32", "bf16", "fp16"]:
    """Pick the training dtype for this machine.

    Args:
        requested: ``auto`` (bf16 on a CUDA device that supports it, fp16 on older CUDA devices, fp32 on CPU),
            or an explicit ``fp32`` / ``bf16`` / ``fp16``.

    Returns:
        The dtype actually used. A bf16/fp16 request on a device without it falls back to fp32 with a warning.

    Raises:
        ValueError: an unknown ``requested`` value.
    """
    import torch

    if requested not in ("auto", "fp32", "bf16", "fp16"):
        raise ValueError(f"precision must be auto, fp32, bf16 or fp16, got {requested!r}")
    cuda = torch.cuda.is_available()
    cuda_bf16 = cuda and torch.cuda.is_bf16_supported()
    if requested == "auto":
        chosen = "bf16" if cuda_bf16 else "fp16" if cuda else "fp32"
        reason = (
            "CUDA with bf16" if cuda_bf16 else "CUDA without bf16" if cuda else "CPU: fp32 (bf16 is 8-10x slower here)"
        )
    elif requested == "bf16" and not cuda_bf16:
        chosen, reason = "fp32", "bf16 requested but this device has no native bf16 training path"
    elif requested == "fp16" and not cuda:
        chosen, reason = "fp32", "fp16 requested but mixed fp16 needs CUDA"
    else:
        chosen, reason = requested, "requested"
    (logger.warning if chosen != requested and requested != "auto" else logger.info)(
        "precision: %s (%s)", chosen, reason
    )
    return chosen


def accelerate_mixed_precision(requested: str = "auto") -> Literal["no", "bf16", "fp16"]:
    """:func:`resolve_precision`'s choice in accelerate's vocabulary (``Accelerator(mixed_precision=...)``):
    fp32 is ``"no"``. For stages that drive accelerate themselves (PPO) instead of a TRL trainer."""
    chosen = resolve_precision(requested)
    return "no" if chosen == "fp32" else chosen
