"""Confidence intervals: the one place the pipeline computes them.

Every interval a gate, a judge's agreement or a reward model's agreement reports comes from here, so
two reports that say "Wilson" or "Newcombe" mean the same computation:

* ``wilson(k, n)``: Wilson score interval of a proportion (statsmodels ``proportion_confint``,
  ``method="wilson"``; Wilson 1927). ``k`` may be fractional (a rate times a fractional n).
* ``exact(k, n)``: Clopper-Pearson interval (statsmodels ``method="beta"``); :class:`Rate` carries it.
* ``newcombe_diff(k1, n1, k2, n2)``: Newcombe's hybrid score interval of p1 - p2 for two independent
  samples (statsmodels ``confint_proportions_2indep``, ``method="newcomb"``; Newcombe 1998, method 10).
* ``newcombe_paired_diff(n11, n12, n21, n22)``: Newcombe's interval of p1 - p2 for paired data (same items
  under both models; Newcombe 1998, Stat. Med. 17:2635, method 10). statsmodels has no paired form, so the
  square-and-add step is written here on top of its Wilson limits.
* ``normal(value, se)``: value +/- z se (the interval alpaca_eval's standard error implies).
* ``percentile_bootstrap(...)`` / ``bootstrap_ratio(...)``: percentile bootstrap over items with
  ``scipy.stats.bootstrap`` (fixed seed); ``bootstrap_means`` + ``percentile`` for the hand-stratified
  resampling the intent matrix and the drift gate need (several samples sharing one generator).

All bounds are fractions unless the caller scales them; an interval that cannot be computed (n == 0)
is (NaN, NaN), never a made-up number.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats
from statsmodels.stats.proportion import confint_proportions_2indep, proportion_confint

from rlhf.serialization import to_jsonable

DEFAULT_CONFIDENCE = 0.95

NAN_PAIR = (math.nan, math.nan)


def _check_confidence(confidence: float) -> float:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return float(confidence)


@dataclass(frozen=True)
class ConfidenceInterval:
    """An interval with its level and the method that produced it (bounds NaN when undefined)."""

    low: float
    high: float
    level: float
    method: str

    def to_dict(self) -> dict[str, Any]:
        return to_jsonable(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ConfidenceInterval":
        def num(v: Any) -> float:
            return math.nan if v is None else float(v)

        return cls(num(data["low"]), num(data["high"]), float(data["level"]), str(data["method"]))


# --------------------------------------------------------------------------------------------
# one proportion
# --------------------------------------------------------------------------------------------

WILSON = "Wilson score (statsmodels proportion_confint)"


def wilson(k: float, n: float, confidence: float = DEFAULT_CONFIDENCE) -> tuple[float, float]:
    """Wilson score interval of k successes in n trials (both may be fractional); (NaN, NaN) when n == 0.

    ``(p + z^2/2n -/+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)``, z the two-sided normal quantile.

    Raises:
        ValueError: n < 0, k outside [0, n], or confidence outside (0, 1).
    """
    _check_confidence(confidence)
    if n < 0 or k < 0 or k > n * (1 + 1e-12):
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    if n == 0:
        return NAN_PAIR
    lo, hi = proportion_confint(min(k, n), n, alpha=1 - confidence, method="wilson")
    return max(0.0, float(lo)), min(1.0, float(hi))


def wilson_interval(k: float, n: float, confidence: float = DEFAULT_CONFIDENCE) -> ConfidenceInterval:
    """``wilson`` as a :class:`ConfidenceInterval`."""
    return ConfidenceInterval(*wilson(k, n, confidence), confidence, WILSON)


def exact(k: int, n: int, confidence: float = DEFAULT_CONFIDENCE) -> tuple[float, float]:
    """Clopper-Pearson (exact binomial) interval of k of n; (NaN, NaN) when n == 0.

    Raises:
        ValueError: k < 0, n < 0, k > n, or confidence outside (0, 1).
    """
    _check_confidence(confidence)
    if n < 0 or k < 0 or k > n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    if n == 0:
        return NAN_PAIR
    lo, hi = proportion_confint(k, n, alpha=1 - confidence, method="beta")
    return float(lo), float(hi)


@dataclass(frozen=True)
class Rate:
    """A proportion with its exact (Clopper-Pearson) interval.

    Fields: k (count), n (items), rate = k / n (fraction, NaN when n == 0), ci_low, ci_high
    (fractions), confidence.
    """

    k: int
    n: int
    rate: float
    ci_low: float
    ci_high: float
    confidence: float

    @classmethod
    def from_counts(cls, k: int, n: int, confidence: float = DEFAULT_CONFIDENCE) -> "Rate":
        """k of n with :func:`exact`'s interval.

        Raises:
            ValueError: k < 0, n < 0, k > n, or confidence outside (0, 1).
        """
        k, n = int(k), int(n)
        lo, hi = exact(k, n, confidence)
        return cls(k, n, k / n if n else math.nan, lo, hi, confidence)


# --------------------------------------------------------------------------------------------
# difference of two proportions
# --------------------------------------------------------------------------------------------


def newcombe_diff(k1: int, n1: int, k2: int, n2: int, confidence: float = DEFAULT_CONFIDENCE) -> tuple[float, float]:
    """Newcombe's score interval of k1/n1 - k2/n2 (independent samples); (NaN, NaN) when a sample is empty."""
    _check_confidence(confidence)
    if n1 == 0 or n2 == 0:
        return NAN_PAIR
    lo, hi = confint_proportions_2indep(k1, n1, k2, n2, method="newcomb", compare="diff", alpha=1 - confidence)
    return float(lo), float(hi)


def rate_diff(first: Rate, second: Rate, confidence: float = DEFAULT_CONFIDENCE) -> tuple[float, float]:
    """``newcombe_diff`` of two :class:`Rate` (first.rate - second.rate)."""
    return newcombe_diff(first.k, first.n, second.k, second.n, confidence)


def newcombe_paired_diff(
    both: int, first_only: int, second_only: int, neither: int, confidence: float = DEFAULT_CONFIDENCE
) -> tuple[float, float]:
    """Newcombe's square-and-add interval for p1 - p2 from a paired 2x2 table.

    Table: ``both`` = n11 (both succeed), ``first_only`` = n12, ``second_only`` = n21,
    ``neither`` = n22; p1 = (n11 + n12) / N, p2 = (n11 + n21) / N. With Wilson intervals
    (l1, u1), (l2, u2) and psi Newcombe's continuity-corrected correlation (A = n11 n22 - n12 n21;
    psi = (A - N/2)/sqrt(prod of margins) if A > N/2, 0 if 0 <= A <= N/2, A/sqrt(...) if A < 0):

        L = d - sqrt((p1 - l1)^2 + (u2 - p2)^2 - 2 psi (p1 - l1)(u2 - p2))
        U = d + sqrt((p2 - l2)^2 + (u1 - p1)^2 - 2 psi (p2 - l2)(u1 - p1))

    Returns:
        (L, U) as fractions; (NaN, NaN) when N == 0.

    Raises:
        ValueError: a negative count or confidence outside (0, 1).
    """
    cells = (both, first_only, second_only, neither)
    if any(int(c) != c or c < 0 for c in cells):
        raise ValueError(f"cell counts must be non-negative integers, got {cells}")
    _check_confidence(confidence)
    n11, n12, n21, n22 = (int(c) for c in cells)
    N = n11 + n12 + n21 + n22
    if N == 0:
        return NAN_PAIR
    r1, r2, c1, c2 = n11 + n12, n21 + n22, n11 + n21, n12 + n22
    p1, p2 = r1 / N, c1 / N
    l1, u1 = wilson(r1, N, confidence)
    l2, u2 = wilson(c1, N, confidence)
    if 0 in (r1, r2, c1, c2):
        psi = 0.0
    else:
        A = n11 * n22 - n12 * n21
        denom = math.sqrt(float(r1) * r2 * c1 * c2)
        psi = (A - N / 2) / denom if A > N / 2 else (0.0 if A >= 0 else A / denom)
    d = p1 - p2
    lo = d - math.sqrt(max(0.0, (p1 - l1) ** 2 + (u2 - p2) ** 2 - 2 * psi * (p1 - l1) * (u2 - p2)))
    hi = d + math.sqrt(max(0.0, (p2 - l2) ** 2 + (u1 - p1) ** 2 - 2 * psi * (p2 - l2) * (u1 - p1)))
    return (max(-1.0, float(lo)), min(1.0, float(hi)))


# --------------------------------------------------------------------------------------------
# normal approximation
# --------------------------------------------------------------------------------------------


def normal(value: float, se: float, confidence: float = DEFAULT_CONFIDENCE, *,
           low: float = -math.inf, high: float = math.inf) -> tuple[float, float]:
    """``value -/+ z se`` clipped to [low, high]; (NaN, NaN) when value or se is not finite."""
    _check_confidence(confidence)
    if not (math.isfinite(value) and math.isfinite(se)):
        return NAN_PAIR
    z = float(stats.norm.ppf(0.5 + confidence / 2))
    return (max(low, value - z * se), min(high, value + z * se))


# --------------------------------------------------------------------------------------------
# bootstrap
# --------------------------------------------------------------------------------------------


def percentile(distribution: Any, confidence: float = DEFAULT_CONFIDENCE) -> tuple[float, float]:
    """Equal-tailed percentile interval of a bootstrap distribution (non-finite draws dropped)."""
    _check_confidence(confidence)
    dist = np.asarray(distribution, dtype=float)
    dist = dist[np.isfinite(dist)]
    if dist.size == 0:
        return NAN_PAIR
    tail = (1 - confidence) / 2
    lo, hi = np.quantile(dist, [tail, 1 - tail])
    return float(lo), float(hi)


def bootstrap_means(scores: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """``n_boot`` means of ``scores`` resampled with replacement (for stratified bootstraps sharing ``rng``)."""
    idx = rng.integers(0, scores.size, size=(n_boot, scores.size))
    return scores[idx].mean(axis=1)


def bootstrap_medians(values: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """``n_boot`` medians of ``values`` resampled with replacement."""
    return np.median(values[rng.integers(0, values.size, size=(n_boot, values.size))], axis=1)


def percentile_bootstrap(
    data: tuple[np.ndarray, ...],
    statistic: Callable[..., Any],
    *,
    vectorized: bool,
    confidence: float,
    n_resamples: int,
    seed: int,
) -> ConfidenceInterval:
    """Percentile bootstrap CI with ``scipy.stats.bootstrap`` (rows = items resampled together).

    Resamples on which the statistic is undefined (NaN, e.g. no decisive comparison drawn) are
    skipped; NaN bounds when every resample is undefined.
    """
    method = f"percentile bootstrap over items, {n_resamples} resamples, seed {seed}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        res = stats.bootstrap(
            data, statistic, paired=True, vectorized=vectorized, n_resamples=n_resamples,
            confidence_level=confidence, method="percentile", rng=np.random.default_rng(seed),
        )
    return ConfidenceInterval(*percentile(res.bootstrap_distribution, confidence), confidence, method)


def bootstrap_ratio(
    num: np.ndarray, den: np.ndarray, confidence: float, n_resamples: int, seed: int
) -> ConfidenceInterval:
    """Percentile bootstrap CI of sum(num)/sum(den), items (rows) resampled with replacement."""
    if den.sum() == 0 or len(num) < 2:
        point = float(num.sum()) / float(den.sum()) if den.sum() else math.nan
        return ConfidenceInterval(point, point, confidence, "no resampling possible")

    def statistic(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
        d = b.sum(axis=axis)
        return np.where(d > 0, a.sum(axis=axis) / np.where(d > 0, d, 1), np.nan)

    return percentile_bootstrap(
        (num.astype(float), den.astype(float)), statistic, vectorized=True,
        confidence=confidence, n_resamples=n_resamples, seed=seed,
    )
