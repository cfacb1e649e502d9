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
* ``fieller_ratio(num, se_num, den, se_den)``: Fieller's interval of a ratio of two independent normal estimates
  (Fieller 1954); the judge-corrected win rate uses it (``gates.winrate_corrected``).
* ``percentile_bootstrap(...)`` / ``bootstrap_ratio(...)``: percentile bootstrap over items with
  ``scipy.stats.bootstrap`` (fixed seed); ``bootstrap_means`` + ``percentile`` for the hand-stratified
  resampling the intent matrix and the drift gate need (several samples sharing one generator).
* clustered items (pairs sharing an instruction or a response): ``connected_clusters(*keys)`` (cluster ids),
  ``ratio_design`` / ``mean_design_effect`` (cluster-robust variance, design effect, n_eff = n / deff; Cochran
  1977 ch. 6 and 9A, Kish 1965, Cameron & Miller 2015), ``cluster_wilson`` (Wilson on n_eff; Korn & Graubard
  1998), ``cluster_bootstrap_ratio`` / ``cluster_bootstrap`` (whole clusters resampled; Davison & Hinkley 1997
  section 3.8). With every item its own cluster each returns the item-level figure exactly.

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


FIELLER = "Fieller (1954) interval of a ratio of independent normal estimates"


def fieller_ratio(num: float, se_num: float, den: float, se_den: float,
                  confidence: float = DEFAULT_CONFIDENCE) -> tuple[float, float]:
    """Fieller's interval of the ratio ``num / den`` of two independent, approximately normal estimates.

    The set of ratios rho that the pivot ``(num - rho den) / sqrt(se_num^2 + rho^2 se_den^2)`` (standard normal
    at the true rho) does not reject at level ``confidence``: ``A rho^2 - 2 num den rho + C <= 0`` with
    ``A = den^2 - z^2 se_den^2`` and ``C = num^2 - z^2 se_num^2`` (Fieller 1954, "Some problems in interval
    estimation", J. R. Stat. Soc. B 16:175-185, zero covariance). When ``den`` is shown non-zero (A > 0) the set
    is the bounded interval ``(num den -/+ sqrt(D)) / A`` with ``D = z^2 (num^2 se_den^2 + se_num^2 A)``; with
    ``se_den = 0`` it is ``(num -/+ z se_num) / den``. As se_den / den -> 0 it approaches the delta-method interval
    ``num/den -/+ z sqrt(se_num^2/den^2 + num^2 se_den^2/den^4)``, but unlike it, it keeps its coverage when the
    denominator is uncertain, and it excludes a ratio rho0 exactly when the pivot at rho0 exceeds z.

    Returns:
        (low, high); (-inf, inf) when A <= 0 (the denominator is not shown to differ from 0: the set is the whole
        line or two rays, no bounded interval); (NaN, NaN) when an input is not finite.

    Raises:
        ValueError: a negative standard error, or confidence outside (0, 1).
    """
    _check_confidence(confidence)
    vals = (num, se_num, den, se_den)
    if not all(math.isfinite(float(v)) for v in vals):
        return NAN_PAIR
    if se_num < 0 or se_den < 0:
        raise ValueError(f"standard errors must be >= 0, got se_num={se_num}, se_den={se_den}")
    z2 = float(stats.norm.ppf(0.5 + confidence / 2)) ** 2
    a = den * den - z2 * se_den * se_den
    if a <= 0:
        return (-math.inf, math.inf)
    root = math.sqrt(z2 * (num * num * se_den * se_den + se_num * se_num * a))
    return ((num * den - root) / a, (num * den + root) / a)


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


# --------------------------------------------------------------------------------------------
# clustered items: cluster keys, the design effect, cluster-robust Wilson, the cluster bootstrap
# --------------------------------------------------------------------------------------------
#
# Items that share an instruction (PandaLM: up to 10 model pairs per instruction) or a response (one model's
# answer appears in every pair it takes part in) are not independent draws: a judge that misreads an
# instruction misreads every pair on it. The unit that was sampled is then the cluster, and an interval that
# counts items overstates the evidence. Everything below reduces to the item-level computation when every item
# is its own cluster (the design effect is then exactly 1).

ITEM_LEVEL = "item"  # the cluster rule recorded when no cluster key was available: one item, one cluster


def connected_clusters(*keys: Any) -> np.ndarray:
    """Cluster id per item: connected components of the graph linking two items that share a value in any key.

    Args:
        keys: one or more sequences, each of shape (n_items,), of hashable values (e.g. the instruction, the
            first response, the second response). ``None`` links nothing (an item whose key is unknown is not
            joined to others through it). Values are compared across all key columns, so a text that is the
            first response of one item and the second of another links them.

    Returns:
        int64 array, shape (n_items,), ids 0..G-1 numbered in order of first appearance (so with no shared
        value, item i gets id i). Components: ``scipy.sparse.csgraph.connected_components``.

    Raises:
        ValueError: no key given, or keys of different lengths.
    """
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    if not keys:
        raise ValueError("connected_clusters needs at least one key column")
    cols = [list(k) for k in keys]
    n = len(cols[0])
    if any(len(c) != n for c in cols):
        raise ValueError(f"key columns must have one value per item; lengths {[len(c) for c in cols]}")
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    value_node: dict[Any, int] = {}
    rows, cols_idx = [], []
    for col in cols:
        for i, v in enumerate(col):
            if v is None:
                continue
            rows.append(i)
            cols_idx.append(n + value_node.setdefault(v, len(value_node)))
    size = n + len(value_node)
    graph = coo_matrix((np.ones(len(rows)), (rows, cols_idx)), shape=(size, size))
    _, comp = connected_components(graph, directed=False)
    _, first, inverse = np.unique(comp[:n], return_index=True, return_inverse=True)
    order = np.argsort(np.argsort(first))  # component -> rank of its first item
    return order[inverse].astype(np.int64)


def check_clusters(clusters: Any, n: int, name: str = "clusters") -> np.ndarray:
    """``clusters`` as int64 ids 0..G-1 (first-appearance order), shape (n,); None -> every item its own cluster.

    Raises:
        ValueError: wrong length or not 1-D (names ``name``).
    """
    if clusters is None:
        return np.arange(n, dtype=np.int64)
    arr = np.asarray(list(clusters) if not isinstance(clusters, np.ndarray) else clusters, dtype=object)
    if arr.ndim != 1 or arr.size != n:
        raise ValueError(f"{name} must hold one cluster key per item, shape ({n},); got shape {arr.shape}")
    return connected_clusters(arr.tolist())


@dataclass(frozen=True)
class ClusterDesign:
    """How much a clustered sample is worth, for a ratio sum(num)/sum(den) (a proportion when den = 1).

    Fields:
        n: trials (sum of den; items for a proportion).
        n_clusters: G, clusters with at least one trial.
        estimate: sum(num) / sum(den) (NaN when n == 0).
        variance: cluster-robust variance of ``estimate`` (NaN when G < 2 or n == 0).
        design_effect: variance / the variance had every trial been its own cluster, at least 1.
        n_eff: n / design_effect, the number of independent trials the clustered sample is worth.
    """

    n: float
    n_clusters: int
    estimate: float
    variance: float
    design_effect: float
    n_eff: float


def ratio_design(num: Any, den: Any, clusters: Any = None) -> ClusterDesign:
    """Cluster-robust (linearisation) variance and design effect of the ratio sum(num) / sum(den).

    With cluster totals y_g = sum of num, m_g = sum of den over cluster g's items, n = sum m_g, p = sum y_g / n:

        v_c = G / (G - 1) * sum_g (y_g - p m_g)^2 / n^2

    the variance estimator of a ratio estimator with the clusters as sampling units and no finite-population
    correction (Cochran 1977, Sampling Techniques, 3rd ed., ch. 6, v(R) = sum (y_g - R m_g)^2 / ((G - 1) G mbar^2)
    with f = 0, applied to clusters of unequal size as in ch. 9A; Kish 1965, Survey Sampling, section 6.4; for
    agreement rates Donner & Klar 2000, Design and Analysis of Cluster Randomization Trials, ch. 5). The design effect compares it with the same estimator computed as if every
    trial were its own cluster, p(1 - p)/(n - 1) for 0/1 trials (each num/den is successes/trials):

        deff = max(1, v_c / (p (1 - p) / (n - 1))),   n_eff = n / deff

    (Kish's design effect; the effective sample size of Korn & Graubard 1998, Survey Methodology 24(2):193-201,
    truncated at n as they do). With every item its own cluster and den = 1, v_c = p(1 - p)/(n - 1) exactly, so
    deff = 1 and n_eff = n. When p is 0 or 1 the variance is 0 whichever the design, so the ratio is undefined:
    then deff = n / G (every cluster counted once, the bound reached when items within a cluster always agree).

    Args:
        num, den: shape (n_items,), non-negative; num <= den (successes and trials per item).
        clusters: shape (n_items,) cluster keys (any hashable; see :func:`connected_clusters`), or None (every
            item its own cluster).

    Returns:
        :class:`ClusterDesign`.

    Raises:
        ValueError: shapes differ, negative values, or num > den.
    """
    y, m = np.asarray(num, dtype=float).ravel(), np.asarray(den, dtype=float).ravel()
    if y.shape != m.shape:
        raise ValueError(f"num {y.shape} and den {m.shape} must have the same shape")
    if (y < 0).any() or (m < 0).any() or (y > m * (1 + 1e-12)).any():
        raise ValueError("need 0 <= num <= den for every item (successes and trials)")
    g = check_clusters(clusters, y.size)
    keep = m > 0
    y, m, g = y[keep], m[keep], g[keep]
    n = float(m.sum())
    if n == 0:
        return ClusterDesign(0.0, 0, math.nan, math.nan, math.nan, 0.0)
    _, g = np.unique(g, return_inverse=True)
    n_clusters = int(g.max()) + 1
    p = float(y.sum()) / n
    if n_clusters == y.size and (m == 1).all():  # every 0/1 item its own cluster: deff is 1 (exactly, not to rounding)
        v_0 = p * (1 - p) / (n - 1) if n > 1 else math.nan
        return ClusterDesign(n, n_clusters, p, v_0, 1.0, n)
    if n_clusters < 2:
        return ClusterDesign(n, n_clusters, p, math.nan, n, 1.0)
    resid = np.bincount(g, weights=y - p * m, minlength=n_clusters)
    v_c = n_clusters / (n_clusters - 1) * float((resid ** 2).sum()) / n ** 2
    v_0 = p * (1 - p) / (n - 1) if n > 1 else 0.0
    if v_0 <= 0 or not math.isfinite(v_0):
        deff = n / n_clusters
    else:
        deff = max(1.0, v_c / v_0)
    return ClusterDesign(n, n_clusters, p, v_c, deff, n / deff)


def mean_design_effect(contributions: Any, clusters: Any = None) -> tuple[float, int]:
    """Design effect of a linear statistic sum_i c_i s_i from its per-item centred contributions.

    ``contributions`` e_i = c_i (s_i - mu_i) (mu_i the item's stratum mean, c_i its weight). With cluster sums
    E_g = sum_{i in g} e_i:

        deff = max(1, [G/(G-1) sum_g E_g^2] / [n/(n-1) sum_i e_i^2])

    the cluster-robust (CR1) variance of the statistic over the same estimator with every item its own cluster
    (Cameron & Miller 2015, J. Human Resources 50(2):317-372, eq. 11 with the G/(G-1) small-sample factor; Kish
    1965 section 8.2 for the design effect). Singletons give exactly 1. All e_i = 0: n / G (as
    :func:`ratio_design`).

    Args:
        contributions: shape (n_items,), finite; items with weight 0 should be left out by the caller.
        clusters: shape (n_items,) cluster keys, or None.

    Returns:
        (design_effect, n_clusters); (NaN, 0) for no items, (n, 1) for one cluster.

    Raises:
        ValueError: contributions not 1-D or not finite, or clusters of another length.
    """
    e = np.asarray(contributions, dtype=float)
    if e.ndim != 1 or not np.all(np.isfinite(e)):
        raise ValueError(f"contributions must be a finite 1-D array, got shape {e.shape}")
    n = e.size
    if n == 0:
        return math.nan, 0
    g = check_clusters(clusters, n)
    n_clusters = int(g.max()) + 1
    if n_clusters == n:  # every item its own cluster: exactly 1 (the two variances are the same sum)
        return 1.0, n_clusters
    if n_clusters < 2:
        return float(n), n_clusters
    denom = n / (n - 1) * float((e ** 2).sum())
    if denom <= 0:
        return n / n_clusters, n_clusters
    sums = np.bincount(g, weights=e, minlength=n_clusters)
    return max(1.0, n_clusters / (n_clusters - 1) * float((sums ** 2).sum()) / denom), n_clusters


CLUSTER_WILSON = "Wilson score on the effective n (design effect of clustered items; Korn & Graubard 1998)"


def cluster_wilson(
    k: Any, n: Any = None, clusters: Any = None, confidence: float = DEFAULT_CONFIDENCE
) -> tuple[ConfidenceInterval, ClusterDesign]:
    """Wilson interval of a proportion from clustered 0/1 items, on the effective sample size.

    ``wilson(p * n_eff, n_eff)`` with n_eff from :func:`ratio_design` (the Korn & Graubard 1998 interval for a
    proportion from a clustered sample, without their degrees-of-freedom adjustment). Every item its own
    cluster: exactly ``wilson(k, n)`` (method ``WILSON``).

    Args:
        k: shape (n_items,) successes per item (0/1 for one trial per item); n: shape (n_items,) trials per
            item (None: 1 each). clusters: shape (n_items,) cluster keys (None: item-level).
        confidence: two-sided level.

    Returns:
        (interval, design); NaN bounds when there is no trial.

    Raises:
        ValueError: as :func:`ratio_design`, or confidence outside (0, 1).
    """
    _check_confidence(confidence)
    y = np.asarray(k, dtype=float).ravel()
    m = np.ones_like(y) if n is None else np.asarray(n, dtype=float).ravel()
    d = ratio_design(y, m, clusters)
    if d.n == 0:
        return ConfidenceInterval(math.nan, math.nan, confidence, WILSON), d
    if d.design_effect == 1.0:
        return wilson_interval(float(y.sum()), d.n, confidence), d
    lo, hi = wilson(d.estimate * d.n_eff, d.n_eff, confidence)
    method = f"{CLUSTER_WILSON}: {d.n_clusters} clusters, design effect {d.design_effect:.3f}, n_eff {d.n_eff:.1f}"
    return ConfidenceInterval(lo, hi, confidence, method), d


def cluster_totals(clusters: Any, *columns: Any) -> tuple[np.ndarray, ...]:
    """Per-cluster sums of each column (shape (G,) each, clusters in first-appearance order).

    Raises:
        ValueError: a column of another length.
    """
    cols = [np.asarray(c, dtype=float).ravel() for c in columns]
    n = cols[0].size if cols else 0
    g = check_clusters(clusters, n)
    if any(c.size != n for c in cols):
        raise ValueError("every column needs one value per item")
    n_clusters = int(g.max()) + 1 if n else 0
    return tuple(np.bincount(g, weights=c, minlength=n_clusters) for c in cols)


def cluster_bootstrap_ratio(
    num: np.ndarray, den: np.ndarray, clusters: Any, confidence: float, n_resamples: int, seed: int
) -> ConfidenceInterval:
    """Percentile bootstrap CI of sum(num)/sum(den), resampling whole clusters with replacement.

    A ratio of sums over a cluster resample is the ratio of the resampled clusters' totals, so this is
    :func:`bootstrap_ratio` on the cluster totals (Davison & Hinkley 1997, Bootstrap Methods and their
    Application, section 3.8, strategy 1: resample clusters, keep their items). Every item its own cluster: the
    same resamples as :func:`bootstrap_ratio`, hence the same interval.
    """
    tn, td = cluster_totals(clusters, num, den)
    ci = bootstrap_ratio(tn, td, confidence, n_resamples, seed)
    if tn.size == np.asarray(num).size:
        return ci
    return ConfidenceInterval(ci.low, ci.high, ci.level, ci.method.replace("over items", f"over {tn.size} clusters"))


def cluster_bootstrap(
    clusters: Any,
    statistic: Callable[[np.ndarray], float],
    n_items: int,
    *,
    confidence: float,
    n_resamples: int,
    seed: int,
) -> ConfidenceInterval:
    """Percentile bootstrap CI of ``statistic(item_indices)``, resampling whole clusters with replacement.

    Each resample draws G clusters with replacement and passes the concatenated item indices of the drawn
    clusters (shape (n_items of the resample,)) to ``statistic`` (Davison & Hinkley 1997, section 3.8). Every
    item its own cluster: exactly :func:`percentile_bootstrap` over items.
    """
    g = check_clusters(clusters, n_items)
    n_clusters = int(g.max()) + 1
    if n_clusters == n_items:  # item level: the historical computation, bit for bit
        return percentile_bootstrap((np.arange(n_items),), lambda idx: statistic(np.asarray(idx, dtype=int)),
                                    vectorized=False, confidence=confidence, n_resamples=n_resamples, seed=seed)
    members = [np.flatnonzero(g == c) for c in range(n_clusters)]
    ci = percentile_bootstrap(
        (np.arange(n_clusters),),
        lambda idx: statistic(np.concatenate([members[int(c)] for c in np.asarray(idx, dtype=int)])),
        vectorized=False, confidence=confidence, n_resamples=n_resamples, seed=seed,
    )
    return ConfidenceInterval(ci.low, ci.high, ci.level, ci.method.replace("over items", f"over {n_clusters} clusters"))
