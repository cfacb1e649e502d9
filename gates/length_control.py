"""Length-controlled win rates from length buckets and from a plain logistic GLM (DESIGN.md principle 6).

* ``length_bucketed_win_rate(method="matched")`` - the win rate over the pairs whose lengths match
  (the central length-ratio bucket). "Points explained by length" = raw - matched.
* ``length_bucketed_win_rate(method="balanced")`` - every length-ratio bucket reweighted so the
  length-difference distribution is symmetric (candidate longer by x counts as much as shorter by x).
* ``glm_length_controlled_win_rate`` - AlpacaEval's GLM idea (Dubois et al. 2024, "Length-Controlled
  AlpacaEval", arXiv:2404.04475) without the instruction-difficulty term and the gamed-baseline
  regularisation (alpaca_eval's ``length_controlled_minimal`` formula, fitted without penalty).

AlpacaEval's own ``length_controlled_v1`` (published priors, instruction difficulty) is ``gates.glm_winrate``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd
from sklearn.linear_model import LogisticRegression

from gates.winrate_stats import (
    DEFAULT_CONFIDENCE,
    check_lengths,
    describe,
    normal_win_rate_ci,
    preferences_to_scores,
)

DEFAULT_N_BUCKETS = 5
DEFAULT_TOLERANCE = 0.10

BUCKET_EDGE_EPS = 1e-12  # slack on bucket edges for float rounding of ln(a / b)


@dataclass(frozen=True)
class LengthControlledWinRate:
    """Raw vs length-controlled win rate.

    Fields (percent unless noted):
        method: "matched", "balanced" or "glm".
        raw: ``win_rate`` over all items.
        raw_standard_error: its SE.
        length_controlled_winrate: the length-controlled win rate (see the producing function).
        standard_error: its SE (NaN if not computable).
        n: items behind the length-controlled figure.
        n_total: all valid items.
        points_explained_by_length: ``raw - length_controlled_winrate`` (percentage points).
        buckets: per-bucket table (bucketed methods) or the GLM coefficients (glm); see producer.
    """

    method: str
    raw: float
    raw_standard_error: float
    length_controlled_winrate: float
    standard_error: float
    n: int
    n_total: int
    points_explained_by_length: float
    buckets: pd.DataFrame

    def ci(self, confidence: float = DEFAULT_CONFIDENCE) -> tuple[float, float]:
        """Normal interval of ``length_controlled_winrate`` (percent, clipped to [0, 100])."""
        return normal_win_rate_ci(self.length_controlled_winrate, self.standard_error, confidence)


def length_bucket_edges(n_buckets: int = DEFAULT_N_BUCKETS, tolerance: float = DEFAULT_TOLERANCE) -> np.ndarray:
    """Edges of the length-ratio buckets, in r = ln(len_candidate / len_baseline).

    The central ("matched") bucket is ``|r| <= ln(1 + tolerance)``, i.e. lengths within a factor
    ``1 + tolerance`` of each other. The others have the same width ``w = 2 ln(1 + tolerance)``
    on each side; the outermost two are open-ended.

    Args:
        n_buckets: odd number >= 3.
        tolerance: > 0, relative length difference still counted as matched (0.10 = 10 %).

    Returns:
        float array, shape (n_buckets + 1,), from -inf to +inf.

    Raises:
        ValueError: n_buckets even or < 3, or tolerance <= 0.
    """
    if n_buckets < 3 or n_buckets % 2 == 0:
        raise ValueError(f"n_buckets must be an odd number >= 3, got {n_buckets}")
    if not tolerance > 0:
        raise ValueError(f"tolerance must be > 0, got {tolerance}")
    h = math.log1p(tolerance)
    k = (n_buckets - 1) // 2
    inner = [h * (2 * j + 1) for j in range(k)]  # h, 3h, 5h, ...
    return np.array([-math.inf] + [-x for x in reversed(inner)] + inner + [math.inf])


def length_bucketed_win_rate(
    preferences: Any,
    len_candidate: Any,
    len_baseline: Any,
    n_buckets: int = DEFAULT_N_BUCKETS,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    method: Literal["matched", "balanced"] = "matched",
) -> LengthControlledWinRate:
    """Win rate with the length confound removed by bucketing pairs on their length ratio.

    Each pair gets ``r = ln(len_candidate / len_baseline)`` and falls in one of ``n_buckets``
    buckets (``length_bucket_edges``): bucket 0 = matched length (within a factor 1 + tolerance),
    bucket +k = candidate longer, -k = candidate shorter. A bucket's win rate is alpaca_eval's
    ``win_rate`` over its pairs.

    method="matched" (default): the length-controlled win rate is the win rate over bucket 0 only,
    i.e. the win rate restricted to pairs whose lengths match; its SE is that subset's SE.

    method="balanced": every bucket is used, reweighted so that the length-difference
    distribution is symmetric::

        LC = [ n_0 * WR_0 + sum_k (n_-k + n_+k) * (WR_-k + WR_+k) / 2 ] / N'

    where k runs over the side-bucket pairs with both sides non-empty and N' is the number of
    pairs in bucket 0 and in those pairs (a pair with one empty side cannot be balanced and is
    left out; its rows show ``used = False``). Then "candidate longer by x" and "candidate shorter
    by x" weigh the same, so a constant length preference cancels to first order.
    SE = sqrt(sum_b c_b^2 s_b^2 / n_b) with c_b the bucket's weight and s_b the sample SD of its
    scores (0.5, the maximum for scores in [0, 1], when n_b = 1).

    "Points explained by length" = raw win rate - length-controlled win rate (DESIGN.md
    principle 6; seed figure 53.6 raw, 50.8 matched, 2.8 of the 3.6 points above 50 were length).

    Args:
        preferences: shape (n_items,), AlpacaEval preferences; NaN items are dropped everywhere.
        len_candidate, len_baseline: shape (n_items,), lengths > 0 in the same unit.
        n_buckets: odd >= 3.
        tolerance: relative difference still counted as matched.
        method: "matched" or "balanced".

    Returns:
        ``LengthControlledWinRate``; ``buckets`` has one row per bucket: bucket (-k..k),
        r_low, r_high, ratio_low, ratio_high, used, and alpaca_eval's columns win_rate,
        standard_error, n_wins, n_wins_base, n_draws, n_total. With no usable pair the
        length-controlled figure is NaN and n = 0.

    Raises:
        ValueError: shapes differ, a length <= 0 or non-finite, preferences invalid, bad
            n_buckets / tolerance / method.
    """
    if method not in ("matched", "balanced"):
        raise ValueError(f"method must be 'matched' or 'balanced', got {method!r}")
    p, lc, lb = check_lengths(preferences, len_candidate, len_baseline)
    keep = ~np.isnan(p)
    scores = preferences_to_scores(p)
    idx = _bucket_index(np.log(lc[keep] / lb[keep]), n_buckets, tolerance)
    raw = describe(scores)
    table = _bucket_table(scores, idx, n_buckets, tolerance)
    k = (n_buckets - 1) // 2
    if method == "matched":
        d0 = describe(scores[idx == 0])
        table.loc[0, "used"] = d0["n_total"] > 0
        lcwr, se, n = d0["win_rate"], d0["standard_error"], d0["n_total"]
    else:
        lcwr, se, n = _balanced(scores, idx, k, table)
    return LengthControlledWinRate(
        method=method,
        raw=raw["win_rate"],
        raw_standard_error=raw["standard_error"],
        length_controlled_winrate=float(lcwr),
        standard_error=float(se),
        n=int(n),
        n_total=raw["n_total"],
        points_explained_by_length=float(raw["win_rate"] - lcwr),
        buckets=table.reset_index(drop=True),
    )


def _bucket_index(r: np.ndarray, n_buckets: int, tolerance: float) -> np.ndarray:
    """Bucket of each log length ratio ``r``: the matched bucket is closed on both sides (|r| <= h), the side
    buckets (a, b] / [a, b)."""
    length_bucket_edges(n_buckets, tolerance)  # validates n_buckets and tolerance
    h = math.log1p(tolerance)
    idx = np.zeros(r.shape, dtype=int)
    for j in range(1, (n_buckets - 1) // 2 + 1):
        lo = h * (2 * j - 1) + BUCKET_EDGE_EPS  # a ratio of exactly 1 + tolerance counts as matched
        idx[r > lo] = j
        idx[r < -lo] = -j
    return idx


def _bucket_table(scores: np.ndarray, idx: np.ndarray, n_buckets: int, tolerance: float) -> pd.DataFrame:
    """One row per bucket (-k..k): edges in r and as ratios, ``used`` (False until a method uses it), and
    alpaca_eval's win-rate columns of its pairs; indexed by bucket."""
    edges, k = length_bucket_edges(n_buckets, tolerance), (n_buckets - 1) // 2
    rows = []
    for b in range(-k, k + 1):
        lo_e, hi_e = edges[b + k], edges[b + k + 1]
        rows.append({"bucket": b, "r_low": lo_e, "r_high": hi_e, "ratio_low": math.exp(lo_e),
                     "ratio_high": math.exp(hi_e), "used": False, **describe(scores[idx == b])})
    return pd.DataFrame(rows).set_index("bucket", drop=False)


def _balanced(scores: np.ndarray, idx: np.ndarray, k: int, table: pd.DataFrame) -> tuple[float, float, int]:
    """The balanced length-controlled win rate, its SE (percent) and n; marks the used buckets in ``table``."""
    comps: list[tuple[float, np.ndarray]] = []  # (weight numerator, scores)
    n0 = int((idx == 0).sum())
    if n0:
        comps.append((float(n0), scores[idx == 0]))
        table.loc[0, "used"] = True
    for j in range(1, k + 1):
        sm, sp = scores[idx == -j], scores[idx == j]
        if sm.size and sp.size:
            w = float(sm.size + sp.size) / 2.0
            comps += [(w, sm), (w, sp)]
            table.loc[[-j, j], "used"] = True
    n = int(sum(c[1].size for c in comps))
    if n == 0:
        return math.nan, math.nan, 0
    lcwr = sum(w * s.mean() for w, s in comps) / n * 100
    var = sum((w / n) ** 2 * ((s.var(ddof=1) if s.size > 1 else 0.25) / s.size) for w, s in comps)
    return lcwr, math.sqrt(var) * 100, n


# --------------------------------------------------------------------------------------------
# AlpacaEval-style GLM (simplified)
# --------------------------------------------------------------------------------------------


def glm_length_controlled_win_rate(
    preferences: Any, len_candidate: Any, len_baseline: Any
) -> LengthControlledWinRate:
    """Length-controlled win rate from a logistic GLM, after AlpacaEval's ``length_controlled_v1``.

    Model (Dubois et al. 2024, arXiv:2404.04475; alpaca_eval ``metrics/glm_winrate.py``):
    ``logit P(candidate wins item i) = theta + phi * tanh(delta_i / sd(delta))`` with
    ``delta_i = len_baseline_i - len_candidate_i`` (alpaca_eval's ``len(output_1) - len(output_2)``).
    Fitted by maximum likelihood with the preference as a soft label (each item enters twice,
    y = 1 with weight p_i and y = 0 with weight 1 - p_i, as alpaca_eval does), no penalty. The
    length-controlled win rate is the prediction at delta = 0: ``sigmoid(theta) * 100``.

    Differences from alpaca_eval's published LC: no per-instruction difficulty term and no
    regularisation towards gamed baselines (their inputs are on the HF hub only), so the figure
    is close to but not equal to the leaderboard's ``length_controlled_winrate``.

    Args:
        preferences: shape (n_items,), AlpacaEval preferences.
        len_candidate, len_baseline: shape (n_items,), lengths > 0.

    Returns:
        ``LengthControlledWinRate`` with method "glm"; ``buckets`` holds the coefficients
        (theta, phi); standard_error is NaN (no analytic SE is claimed for the soft-label fit).

    Raises:
        ValueError: invalid inputs, or fewer than 2 items.
    """
    p, lc, lb = check_lengths(preferences, len_candidate, len_baseline)
    keep = ~np.isnan(p)
    y = preferences_to_scores(p)
    if y.size < 2:
        raise ValueError("the GLM needs at least 2 annotated items")
    delta = lb[keep] - lc[keep]
    sd = delta.std(ddof=1)
    x = np.tanh(delta / sd) if sd > 0 else np.zeros_like(delta)
    X = np.concatenate([x, x])[:, None]
    Y = np.concatenate([np.ones_like(y), np.zeros_like(y)]).astype(int)
    W = np.concatenate([y, 1.0 - y])
    model = LogisticRegression(C=np.inf, fit_intercept=True, solver="lbfgs", max_iter=1000, tol=1e-10)
    model.fit(X, Y, sample_weight=W)
    theta, phi = float(model.intercept_[0]), float(model.coef_[0, 0])
    lcwr = float(1.0 / (1.0 + math.exp(-theta)) * 100)
    raw = describe(y)
    return LengthControlledWinRate(
        method="glm",
        raw=raw["win_rate"],
        raw_standard_error=raw["standard_error"],
        length_controlled_winrate=lcwr,
        standard_error=math.nan,
        n=int(y.size),
        n_total=int(y.size),
        points_explained_by_length=raw["win_rate"] - lcwr,
        buckets=pd.DataFrame([{"theta": theta, "phi_tanh_std_delta_len": phi}]),
    )
