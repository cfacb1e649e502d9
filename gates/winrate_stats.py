"""Raw win rate in AlpacaEval's convention: the numbers of one head-to-head row, and nothing else.

Preference convention (AlpacaEval 2): one value per item in [1, 2]; 2 = the candidate wins,
1 = the baseline wins, 1.5 = draw; values in between are *weighted* preferences (AlpacaEval's
``weighted_alpaca_eval_gpt4_turbo`` annotator stores the judge's probability that the candidate
wins, plus 1). ``0`` is AlpacaEval's legacy draw code and is read as 1.5.

As ``alpaca_eval/metrics/winrate.py``: ``describe`` is its head-to-head row (win rate, standard error, wins,
losses, draws, total, discrete win rate); the length-controlled figures live in ``gates.length_control`` and
``gates.glm_winrate``, which import this module (and nothing here imports them).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

from dataclasses import dataclass

import numpy as np
import pandas as pd

from judging.intervals import mean_design_effect, normal

logger = logging.getLogger("gates.winrate")

#: alpaca_eval's leaderboard columns, in its order, that every win-rate table here uses.
WIN_RATE_COLUMNS: tuple[str, ...] = (
    "win_rate",
    "standard_error",
    "n_wins",
    "n_wins_base",
    "n_draws",
    "n_total",
    "discrete_win_rate",
    "length_controlled_winrate",
    "lc_standard_error",
)

DEFAULT_CONFIDENCE = 0.95


def preferences_to_scores(preferences: Any) -> np.ndarray:
    """Validate AlpacaEval preferences and return per-item candidate scores in [0, 1].

    Args:
        preferences: array-like, shape (n_items,), floats in [1, 2] (or 0 = legacy draw, or NaN =
            no annotation).

    Returns:
        float array, shape (n_valid,): ``preference - 1`` for the non-NaN items (NaN items are
        dropped, as alpaca_eval does, and logged with their count).

    Raises:
        ValueError: not 1-D, or a finite value outside [1, 2] other than 0 (likely another
            convention, e.g. 0/1 labels; alpaca_eval drops such values silently, we refuse).
    """
    p = as_float_1d("preferences", preferences)
    p = np.where(p == 0.0, 1.5, p)
    finite = ~np.isnan(p)
    bad = finite & ((p < 1.0) | (p > 2.0))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"preferences must lie in [1, 2] (AlpacaEval convention: 2 = candidate wins, 1.5 = draw, "
            f"1 = baseline wins); item {i} is {p[i]!r} ({int(bad.sum())} such items)"
        )
    n_nan = int((~finite).sum())
    if n_nan:
        logger.info("dropping %d preferences that are NaN (no annotation)", n_nan)
    return p[finite] - 1.0


def as_float_1d(name: str, values: Any) -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    return arr


def describe(scores: np.ndarray, n_draws: int | None = None) -> dict[str, float]:
    """alpaca_eval's head-to-head numbers for scores in [0, 1] (preference - 1)."""
    n = int(scores.size)
    return {
        "win_rate": float(scores.mean() * 100) if n else math.nan,
        "standard_error": float(pd.Series(scores).sem() * 100) if n > 1 else math.nan,
        "n_wins": int((scores > 0.5).sum()),
        "n_wins_base": int((scores < 0.5).sum()),
        "n_draws": int((scores == 0.5).sum()) if n_draws is None else int(n_draws),
        "n_total": n,
        "discrete_win_rate": discrete_win_rate_of_scores(scores),
    }


def discrete_win_rate_of_scores(scores: np.ndarray) -> float:
    """alpaca_eval's ``discrete_win_rate`` (``ZeroOneScoringRule().describe_head2head``), in percent.

    Each item's score s = preference - 1 in [0, 1] becomes 1 if s > 0.5, 0 if s < 0.5 and 0.5 for an exact
    draw (preference 1.5, or the legacy 0); the discrete win rate is their mean * 100, i.e.
    ``(n_wins + n_draws / 2) / n_total * 100``. NaN for no items.
    """
    s = np.asarray(scores, dtype=float)
    if not s.size:
        return math.nan
    return float(np.where(s > 0.5, 1.0, np.where(s < 0.5, 0.0, 0.5)).mean() * 100)


def normal_win_rate_ci(value: float, se: float, confidence: float) -> tuple[float, float]:
    """A win rate's normal interval in percent, clipped to [0, 100]."""
    return normal(value, se, confidence, low=0.0, high=100.0)


def check_lengths(preferences: Any, len_candidate: Any, len_baseline: Any):
    p = as_float_1d("preferences", preferences)
    lc = as_float_1d("len_candidate", len_candidate)
    lb = as_float_1d("len_baseline", len_baseline)
    if not (p.shape == lc.shape == lb.shape):
        raise ValueError(
            f"preferences {p.shape}, len_candidate {lc.shape} and len_baseline {lb.shape} must have the same length"
        )
    for nm, arr in (("len_candidate", lc), ("len_baseline", lb)):
        if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
            i = int(np.flatnonzero(~np.isfinite(arr) | (arr <= 0))[0])
            raise ValueError(f"{nm} must be finite and > 0; item {i} is {arr[i]!r}")
    return p, lc, lb


def per_item_lengths(texts: Sequence[str]) -> np.ndarray:
    """Character lengths of ``texts`` (alpaca_eval's length unit), shape (n_items,)."""
    return np.asarray([len(t) for t in texts], dtype=float)


@dataclass(frozen=True)
class ClusteredSE:
    """A win-rate figure's SE once items sharing an instruction are counted as one cluster.

    Fields:
        n: items the figure uses; n_clusters: instructions among them.
        design_effect: cluster-robust variance over the item-level one (>= 1; 1 when every instruction is once).
        n_eff: n / design_effect.
        standard_error: the figure's item-level SE times sqrt(design_effect) (percent, as the SE given).
    """

    n: int
    n_clusters: int
    design_effect: float
    n_eff: float
    standard_error: float


def clustered_se(contributions: np.ndarray, clusters: Any, standard_error: float) -> ClusteredSE:
    """Scale a linear win-rate figure's ``standard_error`` by the design effect of its instruction clusters.

    Args:
        contributions: shape (n,), each used item's weight times (its score - its stratum's mean)
            (``judging.intervals.mean_design_effect``; for the raw win rate, s_i - mean).
        clusters: shape (n,) instruction keys of those items, or None (every item its own: design effect 1).
        standard_error: the figure's item-level SE (any unit; NaN stays NaN).

    Returns:
        :class:`ClusteredSE`. With every item its own cluster the SE is returned unchanged: the cluster-robust
        variance with G/(G-1) is then exactly the ddof=1 variance the item-level SE uses.
    """
    e = np.asarray(contributions, dtype=float)
    n = int(e.size)
    if n == 0:
        return ClusteredSE(0, 0, math.nan, 0.0, float(standard_error))
    deff, g = mean_design_effect(e, clusters)
    if not math.isfinite(deff):
        deff = 1.0
    return ClusteredSE(n, g, float(deff), n / deff, float(standard_error) * math.sqrt(deff))
