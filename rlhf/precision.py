"""Resolve training precision per device by measurement, not assumption (DESIGN.md: bf16 only where the hardware
has it, and log the choice).

``auto`` picks bf16 autocast only where the device computes bf16 natively (``rlhf.machine.native_bf16``: CUDA
capability 8.0+, or a CPU whose /proc/cpuinfo lists avx512_bf16 / amx_bf16); a CPU without those flags emulates
bf16 through fp32 and was measured 8-10x slower (a DPO step of the 135M model: 120-155 s bf16 vs 15 s fp32), so it
stays fp32. ``RLHF_NATIVE_BF16=0|1`` forces the detection (the test suite runs both paths on every machine).

Under bf16, DPO keeps the LM head's projection and log-softmax (``dpo.trainer``) and the reward model its score head
(:func:`keep_in_fp32`) in fp32, which halves the rounding of one forward pass (``python
benchmarks/logprob_precision.py``, SmolLM2-135M, 24 held-out HH-RLHF pairs: per-sequence log-probability error
median 0.13 nats with the fp32 head, 0.19 without). What decides ``auto`` is what the stages learn under it, against
the noise of training itself (``python benchmarks/precision_outcome.py``, SmolLM2-135M, the demo recipes, a CPU with
AMX bf16, every trained model evaluated in fp32 on 64 held-out HH-RLHF pairs; :data:`BF16_UNDER_AUTO`): bf16's
DPO margins are 1.8% (relative L2) from fp32's with all 64 signs the same, its reward model's score differences 3.8%
with all 64 the same, while training fp32 again with the rows in another order moves them 66% and 63% and flips 12
and 10 signs. So every stage takes bf16 where bf16 is native. Held-out reward-model scores are always taken in fp32
(the stage drops accelerate's autocast wrapper before scoring), so the reload check holds under either precision.

Whatever the precision, a stage trains fp32 master weights: ``bf16`` and ``fp16`` are autocast (mixed precision),
never weights cast to 16 bits. transformers 5 loads a checkpoint in the dtype its ``config.json`` names when no
``dtype`` is given, so a base saved in bf16 would train in pure bf16 (one SFT step of the tiny model at lr 1e-5
changed 15% of its weights in pure bf16: updates below bf16's resolution round away). Every stage therefore loads
in :func:`weights_dtype`, checks what it loaded and what autocast the trainer applies (:func:`check_precision`),
measures the autocast of a real training forward (:class:`AutocastProbe`) and records both in its manifest
(:func:`precision_record`).
"""

from __future__ import annotations

import logging
from typing import Any, Literal

logger = logging.getLogger(__name__)

Precision = Literal["auto", "fp32", "bf16", "fp16"]

#: What ``auto``'s bf16 was measured to do to the stages that decide on log-probabilities and scores, logged with
#: the choice (module docstring; re-measured by benchmarks/precision_outcome.py).
BF16_UNDER_AUTO = {
    "dpo": "bf16 autocast with the fp32 LM head moved held-out DPO margins 1.8% against 66% for reordering the rows "
           "(benchmarks/precision_outcome.py)",
    "reward_model": "bf16 autocast with the fp32 score head moved held-out score differences 3.8% against 63% for "
                    "reordering the rows (benchmarks/precision_outcome.py)",
}


def resolve_precision(requested: str = "auto", stage: str | None = None, log: bool = True
                      ) -> Literal["fp32", "bf16", "fp16"]:
    """Pick the training dtype for this machine and stage, and log the choice with its reason.

    Args:
        requested: ``auto`` (bf16 where native, fp16 on CUDA without bf16, else fp32),
            or an explicit ``fp32`` / ``bf16`` / ``fp16``.
        stage: the stage asking (named in the log line, with :data:`BF16_UNDER_AUTO`'s measurement); None: none.
        log: log the choice (off for a caller that only keys on it, such as a stage's cache key).

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
        if bf16_ok:
            chosen, reason = "bf16", evidence + (f"; {BF16_UNDER_AUTO[stage]}" if stage in BF16_UNDER_AUTO else "")
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
    if log:
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


def generation_precision(requested: str = "auto", log: bool = True) -> Literal["fp32", "bf16"]:
    """The weights' dtype for greedy generation on this device, logged with its reason.

    ``auto`` is bf16 on a CUDA device with native bf16 (decoding is bound by memory bandwidth, and bf16 halves the
    bytes read per token) and fp32 on a CPU, with or without native bf16: measured on a 2-core CPU with AVX-512
    bf16, SmolLM2-135M, 128 prompts, 64 new tokens (``python benchmarks/generation.py --n 128 --precision bf16``
    against ``--precision fp32``), bf16 weights decode the gate's batches only 1.18x faster (232 vs 197 tok/s) and
    their greedy answers depend on the batch: 10 of 32 equal one-at-a-time decoding in bf16 and 56 of 128 equal
    batch 16, against 32 of 32 and 128 of 128 in fp32. A gate whose answers change with how the prompts were batched
    cannot be re-measured, so a CPU generates in fp32 unless bf16 is asked for. Long prompts may still be prefilled
    by a bf16 copy there (:func:`prefill_precision`), which keeps the answers independent of the batch.

    Args:
        requested: ``auto``, ``fp32`` or ``bf16`` (fp32, with a warning, where bf16 is not native).
        log: log the choice (off for a stage's cache key).

    Raises:
        ValueError: an unknown ``requested`` value.
    """
    import torch

    from .machine import native_bf16

    if requested not in ("auto", "fp32", "bf16"):
        raise ValueError(f"generation precision must be auto, fp32 or bf16, got {requested!r}")
    ok, evidence = native_bf16()
    if requested == "auto" and ok and not torch.cuda.is_available():
        chosen, evidence = "fp32", f"{evidence}; auto is fp32 on a CPU: bf16 greedy answers change with the batch"
    else:
        chosen = "fp32" if requested == "fp32" or not ok else "bf16"
    if log:
        (logger.warning if requested == "bf16" and chosen != "bf16" else logger.info)(
            "generation precision: %s (requested %s; %s)", chosen, requested, evidence
        )
    return chosen


def prefill_precision(requested: str = "auto", generation: str = "fp32", log: bool = True) -> Literal["fp32", "bf16"]:
    """The weights' dtype that prefills a long prompt alone before greedy decoding in ``generation``'s weights.

    On a CPU with native bf16, gate generation decodes in fp32 (:func:`generation_precision`), but prefilling a long
    prompt is bound by arithmetic, where bf16 runs 1.4-1.8x faster (one prompt of 300-1,900 tokens, SmolLM2-135M,
    2 cores with AVX-512 bf16). A row with at least ``rlhf.prefix_cache.BF16_PREFILL_MIN_TOKENS`` tokens before its
    last is then prefilled alone, from scratch, by a bf16 copy of the model and its keys/values are cast to fp32 for the batched fp32
    decode (``rlhf.prefix_cache.batch_inputs``). The rule reads the row's own token count only, so a prompt's answer
    does not depend on the prompts batched with it; it does differ from an all-fp32 prefill (the cached keys and
    values carry bf16 rounding), so the baseline and the candidate always share it and the report records it.

    Args:
        requested: ``auto`` (bf16 on a CPU with native bf16 when ``generation`` is fp32; fp32 on a CUDA device,
            where auto generates in bf16 and a copy would cost device memory), ``fp32`` (off) or ``bf16`` (fp32,
            with a warning, where bf16 is not native).
        generation: the resolved weights' dtype (``fp32`` | ``bf16``); under bf16 the model prefills in bf16
            anyway and no copy is made.
        log: log the choice (off for a stage's cache key).

    Returns:
        ``bf16`` when long prompts are prefilled by a bf16 copy (or the weights are bf16), else ``fp32``.

    Raises:
        ValueError: an unknown ``requested`` or ``generation`` value.
    """
    from .machine import native_bf16

    if requested not in ("auto", "fp32", "bf16"):
        raise ValueError(f"prefill precision must be auto, fp32 or bf16, got {requested!r}")
    if generation not in ("fp32", "bf16"):
        raise ValueError(f"generation precision must be fp32 or bf16, got {generation!r}")
    if generation == "bf16":
        return "bf16"
    import torch

    ok, evidence = native_bf16()
    if requested == "auto" and ok and torch.cuda.is_available():
        # fp32 weights on a GPU were asked for explicitly (auto generates in bf16 there); a bf16 copy would cost
        # half the weights' memory again on the device
        chosen, evidence = "fp32", f"{evidence}; auto adds no bf16 copy on a CUDA device"
    else:
        chosen = "bf16" if requested != "fp32" and ok else "fp32"
    if log:
        (logger.warning if requested == "bf16" and chosen != "bf16" else logger.info)(
            "long-prompt prefill precision: %s (requested %s; %s)", chosen, requested, evidence
        )
    return chosen


#: The torch autocast dtype each resolved precision trains under (fp32: none, the forward runs in fp32).
AUTOCAST_DTYPE = {"fp32": None, "bf16": "bfloat16", "fp16": "float16"}


class PrecisionMismatch(RuntimeError):
    """What a stage loaded or ran in is not what its resolved precision implies (one line, naming the model)."""


def weights_dtype(precision: str):
    """The dtype a stage loads and trains its models' weights in under the resolved ``precision``
    (``fp32`` | ``bf16`` | ``fp16``): ``torch.float32`` for all three (master weights; bf16 and fp16 are autocast).

    Raises:
        ValueError: ``precision`` is not a resolved precision (``auto`` is resolved first by
            :func:`resolve_precision`).
    """
    import torch

    if precision not in AUTOCAST_DTYPE:
        raise ValueError(f"resolved precision must be fp32, bf16 or fp16, got {precision!r}")
    return torch.float32


def weight_dtypes(model) -> dict[str, int]:
    """Floating-point parameters of ``model`` counted per dtype name (``{"float32": 24}``); integer (quantized)
    tensors are not master weights and are left out."""
    counts: dict[str, int] = {}
    for p in model.parameters():
        if p.is_floating_point():
            name = str(p.dtype).removeprefix("torch.")
            counts[name] = counts.get(name, 0) + 1
    return counts


def _autocast_name(mixed_precision: str) -> str | None:
    """accelerate's ``mixed_precision`` (``no`` | ``bf16`` | ``fp16``) as the autocast dtype name it applies."""
    return {"no": None, "bf16": "bfloat16", "fp16": "float16"}[str(mixed_precision)]


def check_precision(stage: str, precision: str, models: dict[str, Any], mixed_precision: str) -> None:
    """Refuse models or an accelerator that do not train as ``precision`` says.

    Args:
        stage: the stage's name, for the error.
        precision: the resolved precision the manifest will record (``fp32`` | ``bf16`` | ``fp16``).
        models: what each model is (``"policy"``, ``"reference"``) -> the model (loaded or trained).
        mixed_precision: the accelerator's (``trainer.accelerator.mixed_precision``): ``no`` | ``bf16`` | ``fp16``.

    Raises:
        PrecisionMismatch: a model holds a floating-point parameter in another dtype than :func:`weights_dtype`, or
            the accelerator's autocast is not ``precision``'s, naming the model, the dtypes and the counts.
    """
    want = str(weights_dtype(precision)).removeprefix("torch.")
    for what, model in models.items():
        counts = weight_dtypes(model)
        wrong = {k: v for k, v in counts.items() if k != want}
        if wrong:
            found = ", ".join(f"{n} {k}" for k, n in sorted(wrong.items()))
            raise PrecisionMismatch(
                f"{stage}: precision {precision} trains {want} master weights, but the {what} holds {found} of "
                f"{sum(counts.values())} floating-point tensors; load it with dtype={want}"
            )
    got = _autocast_name(mixed_precision)
    if got != AUTOCAST_DTYPE[precision]:
        raise PrecisionMismatch(
            f"{stage}: precision {precision} implies autocast {AUTOCAST_DTYPE[precision] or 'off'}, but the "
            f"accelerator runs mixed_precision={mixed_precision!r} (autocast {got or 'off'})"
        )


class AutocastProbe:
    """Records the autocast a real training forward of ``model`` ran under: a forward pre-hook on its first
    ``torch.nn.Linear`` (inside the model, so inside the autocast accelerate wraps the model's forward in) reads
    ``torch.is_autocast_enabled`` / ``torch.get_autocast_dtype`` for the input's device at the first forward in
    training mode, then removes itself.

    ``dtype``: ``"bfloat16"`` | ``"float16"`` | None (autocast off) once measured; ``measured``: whether a training
    forward ran. Raises ValueError at construction when ``model`` has no Linear layer.
    """

    def __init__(self, model):
        import torch

        self.measured, self.dtype = False, None
        linear = next((m for m in model.modules() if isinstance(m, torch.nn.Linear)), None)
        if linear is None:
            raise ValueError(f"{type(model).__name__} has no Linear layer to measure autocast on")
        self._handle = linear.register_forward_pre_hook(self._record)

    def _record(self, module, args):
        import torch

        if not module.training or self.measured:
            return
        x = next((a for a in args if isinstance(a, torch.Tensor)), None)
        device = x.device.type if x is not None else "cpu"
        self.measured = True
        on = torch.is_autocast_enabled(device)
        self.dtype = str(torch.get_autocast_dtype(device)).removeprefix("torch.") if on else None
        self.remove()

    def remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None


def precision_record(
    stage: str, precision: str, loaded: dict[str, dict[str, int]], models: dict[str, Any], probe: AutocastProbe | None
) -> dict:
    """The manifest's ``precision_dtypes``, after checking the trained models and the measured autocast against
    ``precision``.

    Args:
        loaded: model -> :func:`weight_dtypes` of it as loaded (before training; checked then by
            :func:`check_precision`).
        models: model -> the trained model.
        probe: the :class:`AutocastProbe` of the training run (None: not measured).

    Returns:
        ``{"weights_loaded", "weights_trained"}`` (model -> dtype name -> count of floating-point tensors),
        ``"autocast"`` (what ``precision`` implies: ``bfloat16`` | ``float16`` | ``off``) and
        ``"autocast_measured"`` (what a training forward ran under, the same vocabulary; null with
        ``autocast_measured_null_reason`` when no training forward ran in this process).

    Raises:
        PrecisionMismatch: a trained model's weights or the measured autocast differ from ``precision``'s.
    """
    check_precision(stage, precision, models, "no" if precision == "fp32" else precision)
    implied = AUTOCAST_DTYPE[precision] or "off"
    record: dict[str, Any] = {
        "weights_loaded": loaded,
        "weights_trained": {what: weight_dtypes(m) for what, m in models.items()},
        "autocast": implied,
    }
    if probe is None or not probe.measured:
        return {**record, "autocast_measured": None,
                "autocast_measured_null_reason": "no training forward ran in this process"}
    measured = probe.dtype or "off"
    if measured != implied:
        raise PrecisionMismatch(
            f"{stage}: precision {precision} implies autocast {implied}, but the training forward ran with "
            f"autocast {measured}"
        )
    return {**record, "autocast_measured": measured}
