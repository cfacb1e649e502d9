"""Personality drift: style counters of a round's responses compared with the previous round's.

Preference optimisation drifts style before it drifts quality: answers get longer, open by
restating the question, turn into bullet lists and hedge. Four counters (DESIGN.md "Release
gates", personality-drift row), each measured on the same prompt set every round; their rules and
:func:`drift_counters` live in ``judging.drift_rules`` (shared with online RL's tripwires) and are
re-exported here:

* ``median_length_tokens`` - median response length in tokens (``tokenizer_len``; the default
  counts whitespace-separated words, pass the round tokenizer's length for real tokens);
* ``restating_pct`` - percent of responses whose opening restates the question (rules in
  :func:`restates_question`);
* ``bullets_pct`` - percent of responses with a list: at least 2 lines that start with a bullet
  (``-``, ``*``, ``+``, ``•``) or an enumerator (``1.``, ``2)``) (:func:`has_bullet_list`);
* ``hedged_pct`` - percent of responses that hedge at least one claim: a phrase of :data:`HEDGES` (after
  Hyland 1998/2005's hedging devices) or an epistemic may/might/could, not advice to the reader
  (:func:`is_hedged`).

The three per-response rules are measured against 966 hand-labelled real answers from six models
(``benchmarks/drift_counters.py``, labels and their definitions in ``benchmarks/data/``).

The gate blocks when a counter moves (up or down) more than its configured step:
``median_length_tokens`` by a relative step (0.25 = 25 %), the shares by percentage points.
Defaults (:data:`DEFAULT_MAX_STEP`) are set so the documented drift blocks: rounds 0/1/2 with
length 180/260/340, restating 8/31/52%, bullets 22/44/67%, hedged 14/29/41% - every round-over-round
step and the round 0 -> 2 jump exceed them.

Evidence vs noise: a share change carries Newcombe's interval for two independent proportions
(statsmodels); the median-length change a percentile bootstrap of the ratio of medians (when the
per-response lengths are kept). A jump whose interval excludes 0 is "on evidence"; counters built
from published figures without n cannot say, and the reason says so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from gates import wording
from gates.result import Finding, GateResult, Metric, Verdict
from judging.drift_rules import (  # noqa: F401  (re-exported: the rules and counters live there)
    COUNTERS,
    FRAME_WORDS,
    HEDGES,
    DriftCounters,
    drift_counters,
    has_bullet_list,
    is_hedged,
    restates_question,
    whitespace_tokens,
)
from judging.intervals import bootstrap_medians, newcombe_diff, percentile

GATE_NAME = "personality_drift"
GATE_VERSION = "1"
DEFAULT_CONFIDENCE = 0.95
#: Allowed step per counter: median length as a relative change (0.25 = 25 %), shares in points.
DEFAULT_MAX_STEP: dict[str, float] = {
    "median_length_tokens": 0.25,
    "restating_pct": 10.0,
    "bullets_pct": 10.0,
    "hedged_pct": 10.0,
}



def drift_table(rounds: Mapping[Any, DriftCounters]) -> pd.DataFrame:
    """Counters across rounds: one row per round (in the mapping's order), columns n + ``COUNTERS``.

    Raises:
        ValueError: no rounds.
    """
    if not rounds:
        raise ValueError("no rounds")
    df = pd.DataFrame([{"round": k, **v.as_dict()} for k, v in rounds.items()]).set_index("round")
    return df


# --------------------------------------------------------------------------------------------
# gate
# --------------------------------------------------------------------------------------------


def _median_ratio_ci(cur: Sequence[int], prev: Sequence[int], confidence: float, n_boot: int, seed: int):
    a, b = np.asarray(cur, dtype=float), np.asarray(prev, dtype=float)
    rng = np.random.default_rng(seed)
    ma, mb = bootstrap_medians(a, n_boot, rng), bootstrap_medians(b, n_boot, rng)
    with np.errstate(divide="ignore", invalid="ignore"):
        lo, hi = percentile(ma / mb - 1.0, confidence)
    return float(lo), float(hi)


def drift_steps(max_step: Mapping[str, float | None] | None = None) -> dict[str, float | None]:
    """:data:`DEFAULT_MAX_STEP` with ``max_step``'s overrides (length: relative fraction; shares: points; None:
    reported, not gated).

    Raises:
        ValueError: an unknown counter or a negative / non-finite step.
    """
    steps = dict(DEFAULT_MAX_STEP)
    for k, v in (max_step or {}).items():
        if k not in DEFAULT_MAX_STEP:
            raise ValueError(f"unknown drift counter {k!r}; known: {list(DEFAULT_MAX_STEP)}")
        if v is not None and not (math.isfinite(v) and v >= 0):
            raise ValueError(f"step for {k} must be >= 0 or None, got {v}")
        steps[k] = v
    return steps


@dataclass(frozen=True)
class CounterChange:
    """One counter's move since the previous round.

    Fields:
        counter: a name of :data:`COUNTERS`.
        previous, current: the counter's values (tokens or percent).
        change: relative (current / previous - 1) for the length, points for the shares; what a step is compared to.
        shown: the change as reported: percent for the length, points for the shares (``unit``).
        ci_low, ci_high: interval of ``shown`` (NaN without sample sizes or per-response lengths).
        n_previous, n_current: responses behind each round (None for published figures).
    """

    counter: str
    previous: float
    current: float
    change: float
    shown: float
    unit: str
    ci_low: float
    ci_high: float
    n_previous: int | None
    n_current: int | None

    @property
    def has_ci(self) -> bool:
        return math.isfinite(self.ci_low) and math.isfinite(self.ci_high)


@dataclass(frozen=True)
class DriftMetrics:
    """The drift gate's numbers: one :class:`CounterChange` per counter (``COUNTERS`` order), the interval level."""

    changes: tuple[CounterChange, ...]
    confidence: float


def _change(key: str, current: DriftCounters, previous: DriftCounters, confidence: float, n_boot: int,
            seed: int) -> CounterChange:
    prev, cur = getattr(previous, key), getattr(current, key)
    lo = hi = math.nan
    if key == "median_length_tokens":
        change = (cur / prev - 1.0) if prev > 0 else (math.inf if cur > 0 else 0.0)
        shown, unit = 100 * change, "percent"
        if current.lengths and previous.lengths:
            lo, hi = _median_ratio_ci(current.lengths, previous.lengths, confidence, n_boot, seed)
            lo, hi = 100 * lo, 100 * hi
    else:
        change = cur - prev
        shown, unit = change, "points"
        kc, kp = current.count(key), previous.count(key)
        if kc is not None and kp is not None and current.n and previous.n:
            lo, hi = (100 * v for v in newcombe_diff(kc, current.n, kp, previous.n, confidence))
    return CounterChange(key, prev, cur, change, shown, unit, lo, hi, previous.n, current.n)


def metrics(current: DriftCounters, previous: DriftCounters, *, confidence: float = DEFAULT_CONFIDENCE,
            n_boot: int = 2000, seed: int = 0) -> DriftMetrics:
    """Each counter's change since the previous round, with its interval: the median length's a percentile
    bootstrap of the ratio of medians (``n_boot``, ``seed``; only with per-response lengths), a share's Newcombe's
    interval for two independent proportions (only with sample sizes)."""
    return DriftMetrics(tuple(_change(k, current, previous, confidence, n_boot, seed) for k in COUNTERS), confidence)


def _step_shown(c: CounterChange, step: float | None) -> float | None:
    return None if step is None else (100 * step if c.counter == "median_length_tokens" else step)


def verdict(m: DriftMetrics, steps: Mapping[str, float | None]) -> tuple[Verdict, list[Finding]]:
    """The drift rule: a counter jumps when ``|change| > step`` (a step of None: reported, not gated); any jump ->
    "block", else "pass". Findings, one per counter in order: ``counter_jumped`` (with ``basis``: "on_evidence"
    when the interval of the change excludes 0, "could_be_noise" when it includes 0, "no_sample_sizes" without an
    interval) or ``counter_within``. The counters are never combined."""
    findings = []
    for c in m.changes:
        step = steps[c.counter]
        jumped = step is not None and abs(c.change) > step
        basis = None
        if jumped:
            basis = ("on_evidence" if c.has_ci and (c.ci_low > 0 or c.ci_high < 0) else "could_be_noise" if c.has_ci
                     else "no_sample_sizes")
        findings.append(Finding(code="counter_jumped" if jumped else "counter_within", values={
            "counter": c.counter, "previous": c.previous, "current": c.current, "change": c.shown, "unit": c.unit,
            "ci_low": c.ci_low if c.has_ci else None, "ci_high": c.ci_high if c.has_ci else None,
            "step": _step_shown(c, step), "confidence": m.confidence, "basis": basis}))
    return ("block" if any(f.code == "counter_jumped" for f in findings) else "pass"), findings


def gate_metrics(m: DriftMetrics) -> dict[str, Metric]:
    """Per counter ``<counter>`` (current value; tokens or percent, n) and ``<counter>_change`` (percent for the
    length, points for the shares; CI when available)."""
    out: dict[str, Metric] = {}
    for c in m.changes:
        unit = "tokens" if c.counter == "median_length_tokens" else "percent"
        out[c.counter] = Metric(value=c.current, n=c.n_current, direction="lower_is_better", unit=unit)
        out[f"{c.counter}_change"] = Metric(
            value=c.shown, ci_low=c.ci_low if c.has_ci else None, ci_high=c.ci_high if c.has_ci else None,
            n=(c.n_current + c.n_previous) if (c.n_current is not None and c.n_previous is not None) else None,
            direction="lower_is_better", unit=c.unit)
    return out


def gate_table(m: DriftMetrics, findings: list[Finding]) -> list[dict[str, Any]]:
    """One row per counter: counter, previous, current, change, change_unit, allowed_step, ci_low, ci_high,
    n_previous, n_current, jumped."""
    return [{"counter": c.counter, "previous": c.previous, "current": c.current, "change": c.shown,
             "change_unit": c.unit, "allowed_step": f.values["step"], "ci_low": c.ci_low, "ci_high": c.ci_high,
             "n_previous": c.n_previous, "n_current": c.n_current, "jumped": f.code == "counter_jumped"}
            for c, f in zip(m.changes, findings)]


def drift_gate(
    current: DriftCounters,
    previous: DriftCounters,
    max_step: Mapping[str, float | None] | None = None,
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    n_boot: int = 2000,
    seed: int = 0,
    name: str = GATE_NAME,
) -> GateResult:
    """Block when any counter moved more than its allowed step since the previous round.

    Change per counter: ``median_length_tokens`` relative (current / previous - 1, reported in
    percent), the shares in percentage points. A counter jumps when ``|change| > step``; a step
    of None reports the counter without gating it. Each jump is labelled "on evidence" (interval
    of the change excludes 0), "could be noise" (it includes 0) or "no sample sizes" (figures
    without n). The counters are never combined (:func:`metrics`, :func:`verdict`).

    Args:
        current, previous: :class:`DriftCounters`.
        max_step: overrides of :data:`DEFAULT_MAX_STEP` (length: relative fraction; shares: points).
        confidence: interval level.
        n_boot, seed: bootstrap of the median-length ratio (only with per-response lengths).

    Returns:
        GateResult: metrics ``<counter>`` (current value; tokens or percent, n) and
        ``<counter>_change`` (percent for length, points for shares; CI when available);
        ``table`` one row per counter: counter, previous, current, change, change_unit,
        allowed_step, ci_low, ci_high, n_previous, n_current, jumped; ``findings`` from :func:`verdict`.

    Raises:
        ValueError: an unknown counter in ``max_step`` or a negative step.
    """
    steps = drift_steps(max_step)
    m = metrics(current, previous, confidence=confidence, n_boot=n_boot, seed=seed)
    v, findings = verdict(m, steps)
    return GateResult(name=name, version=GATE_VERSION, verdict=v, metrics=gate_metrics(m),
                      reason=wording.reason(GATE_NAME, findings), table=gate_table(m, findings), findings=findings)
