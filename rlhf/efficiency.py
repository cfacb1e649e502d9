"""What a training stage reports about its own efficiency: threads, tokens/s, padding share and model
FLOPs utilisation, plus length-grouped batches for TRL trainers.

MFU follows the PaLM paper's convention (Chowdhery et al. 2022, appendix B): a training token costs 6·N FLOPs
(forward 2·N + backward 4·N, N = trainable + frozen parameters of the trained model; attention FLOPs and a frozen
reference model's forward are not counted), so ``MFU = 6·N·tokens_per_s / peak``.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)


class CountingCollator:
    """Wraps a data collator and counts the tokens of every batch it builds.

    ``real`` = sum of every ``*attention_mask`` tensor of the batch (tokens the model attends to), ``total`` = their
    sizes (real + padding). Batches without an attention mask count their ``input_ids`` as all real.
    """

    def __init__(self, collator):
        self.collator = collator
        self.reset()

    def reset(self) -> None:
        self.real = self.total = self.batches = 0
        self.batch_totals: list[int] = []  # batched tokens of each batch, in the order they were built

    def __call__(self, examples):
        batch = self.collator(examples)
        masks = [v for k, v in batch.items() if k.endswith("attention_mask") and hasattr(v, "sum")]
        total = 0
        if masks:
            self.real += int(sum(int(m.sum()) for m in masks))
            total = int(sum(m.numel() for m in masks))
        elif "input_ids" in batch:
            self.real += batch["input_ids"].numel()
            total = batch["input_ids"].numel()
        self.total += total
        self.batch_totals.append(total)
        self.batches += 1
        return batch

    @property
    def padding_share(self) -> float | None:
        """Share of the batched tokens that were padding (None before any batch)."""
        return None if not self.total else 1 - self.real / self.total


def count_tokens(trainer) -> CountingCollator:
    """Make ``trainer`` count its batches' tokens and time its optimizer steps (:class:`StepTimer`, as
    ``counter.step_timer``); call after building it, before ``train()``."""
    counter = CountingCollator(trainer.data_collator)
    trainer.data_collator = counter
    counter.step_timer = StepTimer()
    trainer.add_callback(counter.step_timer)
    return counter


def _step_timer_base():
    from transformers import TrainerCallback

    return TrainerCallback


class StepTimer(_step_timer_base()):
    """Wall seconds of every optimizer step (``on_step_begin`` to ``on_step_end``, data loading and logging
    outside), so the first step's warm-up (allocator, kernel and optimizer-state set-up) is reported apart from the
    steady state instead of inflating the mean.

    transformers' ``LengthGroupedSampler`` puts the longest batch first (to fail early on memory), so a first step
    slower than the median is partly its tokens. With ``step_tokens`` (batched tokens, padding included, of each
    optimizer step, in order) the warm-up is what the tokens do not explain: the first step's seconds minus its
    tokens at the steady seconds per token.

    Each step's minor page faults are recorded too (the whole process's): memory the allocator took from the kernel,
    each page faulted in and zeroed once (4 KiB pages: 0.44 s/GiB measured on a 2-core AMD EPYC; a transparent huge
    page is one fault for 2 MiB). A caching allocator (``rlhf.machine.allocator_env``) takes its memory in the first
    steps, at the peak batch, and reuses it after; faults in every later step mean freed memory went back to the
    kernel."""

    def __init__(self):
        self.seconds: list[float] = []
        self.faults: list[int] = []
        self.step_tokens: list[int] | None = None
        self._t0: float | None = None
        self._f0: int | None = None

    @staticmethod
    def _minor_faults() -> int | None:
        try:
            import resource
        except ImportError:  # not a POSIX system: no fault counts
            return None
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    def on_step_begin(self, args, state, control, **kwargs):
        import time

        self._f0 = self._minor_faults()
        self._t0 = time.perf_counter()
        return control

    def on_step_end(self, args, state, control, **kwargs):
        import time

        if self._t0 is not None:
            self.seconds.append(time.perf_counter() - self._t0)
            self._t0 = None
            f1 = self._minor_faults()
            if f1 is not None and self._f0 is not None:
                self.faults.append(f1 - self._f0)
        return control

    def summary(self) -> dict[str, float | None]:
        """``first_step_seconds``, ``steady_step_seconds`` (median of the later steps; None with one step) and
        ``warmup_seconds``, all None before any step. Without ``step_tokens``, warm-up = first - steady; with them
        (one count per timed step), also ``first_step_tokens``, ``steady_seconds_per_1k_tokens`` (median over the
        later steps) and ``first_step_token_seconds`` (the first step's tokens at that rate), and warm-up = first -
        that. Seconds, tokens as batched (padding included). With one fault count per timed step, also
        ``first_step_page_faults`` and ``later_steps_page_faults`` (minor page faults in the first step, and in all
        later steps together)."""
        import statistics

        if not self.seconds:
            return {"first_step_seconds": None, "steady_step_seconds": None, "warmup_seconds": None}
        first = self.seconds[0]
        steady = statistics.median(self.seconds[1:]) if len(self.seconds) > 1 else None
        out = {"first_step_seconds": first, "steady_step_seconds": steady,
               "warmup_seconds": None if steady is None else first - steady}
        tokens = self.step_tokens
        if steady is not None and tokens is not None and len(tokens) == len(self.seconds) and min(tokens) > 0:
            rate = statistics.median(s / t for s, t in zip(self.seconds[1:], tokens[1:]))
            out.update(first_step_tokens=tokens[0], steady_seconds_per_1k_tokens=1000 * rate,
                       first_step_token_seconds=rate * tokens[0], warmup_seconds=first - rate * tokens[0])
        if len(self.faults) == len(self.seconds):
            out.update(first_step_page_faults=self.faults[0], later_steps_page_faults=sum(self.faults[1:]))
        return out


def _length_grouped_sampler_class():
    from transformers.trainer_pt_utils import LengthGroupedSampler

    return LengthGroupedSampler


class EpochSeededLengthGroupedSampler(_length_grouped_sampler_class()):
    """transformers' ``LengthGroupedSampler`` drawing its shuffle from its own generator seeded with
    ``seed + epoch`` (the Trainer calls ``set_epoch`` before each epoch), not from the global RNG.

    With the global RNG the order of a later epoch depends on everything that drew random numbers before it
    (dropout, the step-0 check), so a run resumed in the middle of epoch 2 drew other batches than the run it
    continues (measured: DPO final loss 0.6604 vs 0.6632 uninterrupted). Now it is a function of
    ``(seed, epoch)`` alone: the same on every resume and on every process.
    """

    def __init__(self, batch_size: int, lengths: list[int], seed: int):
        import torch

        super().__init__(batch_size, lengths=list(lengths), generator=torch.Generator())
        self.seed, self.epoch = int(seed), 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self):
        self.generator.manual_seed(self.seed + self.epoch)
        return super().__iter__()


def group_by_length(trainer, length_of) -> None:
    """Train ``trainer`` on length-grouped batches (transformers' ``LengthGroupedSampler``: batches of similar
    length, shuffled, so less padding), shuffled per epoch from the seed (:class:`EpochSeededLengthGroupedSampler`).

    Adds a ``length`` column (``length_of(row) -> int``) to the trainer's tokenized train dataset and keeps it
    through TRL's unused-column removal (DPO and reward rows have no ``input_ids`` the sampler could measure).
    """
    ds = trainer.train_dataset
    if "length" not in ds.column_names:
        trainer.train_dataset = ds.map(lambda row: {"length": int(length_of(row))})
    trainer.args.train_sampling_strategy = "group_by_length"
    trainer.args.length_column_name = "length"
    # an order that depends on (seed, epoch) only, so a resumed run draws the batches the killed one would have
    trainer._get_train_sampler = lambda train_dataset=None: EpochSeededLengthGroupedSampler(
        trainer.args.train_batch_size * trainer.args.gradient_accumulation_steps,
        lengths=(train_dataset if train_dataset is not None else trainer.train_dataset)["length"],
        seed=trainer.args.data_seed if trainer.args.data_seed is not None else trainer.args.seed,
    )
    trainer._set_signature_columns_if_needed()
    if "length" not in trainer._signature_columns:
        trainer._signature_columns = [*trainer._signature_columns, "length"]


def n_parameters(model) -> int:
    """Parameters of ``model`` (all of them, trainable or not)."""
    return sum(p.numel() for p in model.parameters())


def efficiency(n_params: int, tokens: int, seconds: float, dtype: str = "fp32", flops_per_param: int = 6) -> dict[str, Any]:
    """Throughput and MFU of a training run.

    Args:
        n_params: model parameters N.
        tokens: real (non-padding) tokens trained on.
        seconds: wall time of the training loop.
        dtype: the training precision, which picks the peak (``fp32`` / ``bf16`` / ``fp16``).
        flops_per_param: FLOPs per parameter per token: 6 for training (forward 2, backward 4), 2 for decoding.

    Returns:
        ``{"threads", "allocator", "tokens", "tokens_per_s", "mfu", "peak_flops", "peak_source"}``
        (``allocator``: :func:`rlhf.machine.allocator_in_use`); ``mfu`` =
        flops_per_param·N·tokens/s / peak. An MFU above 1 after the peak was measured again is ``None`` with
        ``mfu_null_reason`` (and logged as an error): that count undercounts the FLOPs, so the peak is wrong.
    """
    import torch

    from .machine import allocator_in_use, peak_flops

    peak, source = peak_flops(dtype)
    tps = tokens / seconds if seconds > 0 else 0.0
    mfu = flops_per_param * n_params * tps / peak if peak else None
    if mfu is not None and mfu > 1:  # the count undercounts the FLOPs, so above 1 the peak is wrong: measure again
        peak, source = peak_flops(dtype, remeasure=True)
        mfu = flops_per_param * n_params * tps / peak
    out = {
        "threads": torch.get_num_threads(),
        "allocator": allocator_in_use(),
        "tokens": int(tokens),
        "tokens_per_s": tps,
        "mfu": mfu,
        "peak_flops": peak,
        "peak_source": source,
    }
    if mfu is not None and mfu > 1:
        logger.error("MFU %.1f%% is impossible: the %s peak %.3g FLOP/s (%s) is wrong; MFU not reported",
                     100 * mfu, dtype, peak, source)
        out.update(mfu=None, mfu_null_reason=f"{100 * mfu:.1f}% against a {dtype} peak of {peak:.3g} FLOP/s that a "
                   "re-measurement did not correct: the peak is wrong")
    return out


def train_efficiency(trainer, result, counter: CountingCollator, dtype: str) -> dict[str, Any]:
    """:func:`efficiency` of a finished ``trainer.train()`` (``result.metrics["train_runtime"]``) with the padding
    share of the batches ``counter`` saw."""
    seconds = float(result.metrics.get("train_runtime", 0.0))
    out = efficiency(n_parameters(trainer.model), counter.real, seconds, dtype)
    out.update(padding_share=counter.padding_share, batched_tokens=counter.total, train_seconds=seconds)
    timer = getattr(counter, "step_timer", None)
    if timer is not None:
        # batches are built in training order (a loader reading ahead builds the same ones earlier), so step i
        # trained on batches [i * accumulation, (i + 1) * accumulation); a resumed run (it timed fewer steps than
        # the trainer counts, and may have built the skipped batches) gets no token split
        accumulation = max(1, int(getattr(trainer.args, "gradient_accumulation_steps", 1) or 1))
        totals = counter.batch_totals
        steps = [sum(totals[i:i + accumulation]) for i in range(0, len(totals) - accumulation + 1, accumulation)]
        fresh = int(getattr(trainer.state, "global_step", 0)) == len(timer.seconds) <= len(steps)
        timer.step_tokens = steps[: len(timer.seconds)] if fresh else None
        out.update(timer.summary())
    logger.info(
        "efficiency: %d threads, %s allocator, %.0f tokens/s, MFU %.1f%% of %.3g FLOP/s (%s), padding %.1f%%; first step %s s "
        "(warm-up beyond its tokens %s s), steady %s s/step",
        out["threads"], out["allocator"], out["tokens_per_s"], 100 * (out["mfu"] or 0), out["peak_flops"], out["peak_source"],
        100 * (out["padding_share"] or 0), _fmt(out.get("first_step_seconds")), _fmt(out.get("warmup_seconds")),
        _fmt(out.get("steady_step_seconds")),
    )
    return out


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def summary(eff: dict[str, Any]) -> dict[str, float]:
    """The numeric entries of an :func:`efficiency` dict, keyed ``efficiency/<name>`` (for the W&B summary)."""
    return {f"efficiency/{k}": v for k, v in eff.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
