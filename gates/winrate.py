"""Win rates in AlpacaEval's convention, raw and length-controlled (DESIGN.md principle 6).

Preference convention (AlpacaEval 2): one value per item in [1, 2]; 2 = the candidate wins,
1 = the baseline wins, 1.5 = draw; values in between are *weighted* preferences (AlpacaEval's
``weighted_alpaca_eval_gpt4_turbo`` annotator stores the judge's probability that the candidate
wins, plus 1). ``0`` is AlpacaEval's legacy draw code and is read as 1.5.

Three length-controlled figures are offered; each is defined where it is computed:

* ``length_bucketed_win_rate(method="matched")`` - the win rate over the pairs whose lengths match
  (the central length-ratio bucket). "Points explained by length" = raw - matched.
* ``length_bucketed_win_rate(method="balanced")`` - every length-ratio bucket reweighted so the
  length-difference distribution is symmetric (candidate longer by x counts as much as shorter by x).
* ``glm_length_controlled_win_rate`` - AlpacaEval's GLM idea (Dubois et al. 2024, "Length-Controlled
  AlpacaEval", arXiv:2404.04475) without the instruction-difficulty term and the gamed-baseline
  regularisation, whose inputs are only on the Hugging Face hub (alpaca_eval's ``length_controlled_minimal``
  formula, fitted without penalty).
* ``gates.glm_winrate.glm_v1_win_rate`` - ``length_controlled_v1`` as closely as offline data allow: the
  published coefficients of 200 models as priors, instruction difficulty when known (``lc_method="glm_v1"``).

Every row carries alpaca_eval's leaderboard columns (``WIN_RATE_COLUMNS``), including ``discrete_win_rate``
(``ZeroOneScoringRule``: each preference rounded to a win, a loss or an exact draw) and
``lc_standard_error`` (the SE of the length-controlled figure; for the GLMs alpaca_eval's definition,
``sem`` of the per-item predicted preferences).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd
from sklearn.linear_model import LogisticRegression

from gates.result import GateResult, Metric, mark_inconclusive
from judging.intervals import normal

logger = logging.getLogger(__name__)

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

GATE_NAME = "length_controlled_win_rate"
GATE_VERSION = "1"
DEFAULT_CONFIDENCE = 0.95
DEFAULT_N_BUCKETS = 5
DEFAULT_TOLERANCE = 0.10
DEFAULT_BAR = 50.0
#: Decisive (non-tie) items, both answers non-empty, that a win rate needs before it can decide.
DEFAULT_MIN_DECISIVE = 10

_EPS = 1e-12  # slack on bucket edges for float rounding of ln(a / b)

LcMethod = Literal["matched", "balanced", "glm", "glm_v1"]


# --------------------------------------------------------------------------------------------
# raw win rate (alpaca_eval.metrics.helpers.AbsoluteScoringRule.describe_head2head)
# --------------------------------------------------------------------------------------------


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
    p = _as_float_1d("preferences", preferences)
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


def _as_float_1d(name: str, values: Any) -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    return arr


def _describe(scores: np.ndarray, n_draws: int | None = None) -> dict[str, float]:
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


def win_rate(
    preferences: Any,
    len_candidate: Any = None,
    len_baseline: Any = None,
    *,
    lc_method: LcMethod = "matched",
    n_buckets: int = DEFAULT_N_BUCKETS,
    tolerance: float = DEFAULT_TOLERANCE,
    name: str | None = None,
    glm_prior: Any = None,
    instruction_difficulty: Any = None,
) -> pd.DataFrame:
    """AlpacaEval's win-rate row for one candidate against one baseline.

    Computed as ``alpaca_eval.metrics.winrate.get_winrate`` does (AbsoluteScoringRule):
    ``win_rate = mean(preference - 1) * 100`` (a draw counts half, a weighted preference counts its
    weight), ``standard_error = sem(preference - 1) * 100`` (ddof = 1), ``n_wins`` = items with
    preference > 1.5, ``n_wins_base`` = items < 1.5, ``n_draws`` = items == 1.5 exactly,
    ``n_total`` = non-NaN items.

    Args:
        preferences: shape (n_items,), AlpacaEval preferences (see module docstring).
        len_candidate, len_baseline: optional shape (n_items,) positive lengths (tokens or
            characters, the same unit for both). When given, ``length_controlled_winrate`` is
            filled with ``lc_method``; otherwise it is NaN.
        lc_method: "matched" or "balanced" (``length_bucketed_win_rate``), "glm"
            (``glm_length_controlled_win_rate``) or "glm_v1" (``gates.glm_winrate.glm_v1_win_rate`` with
            ``glm_prior`` and ``instruction_difficulty``).
        n_buckets, tolerance: bucket settings for the bucketed methods.
        name: index label of the row (alpaca_eval indexes its leaderboard by model name).
        glm_prior, instruction_difficulty: for "glm_v1" only (see ``glm_v1_win_rate``).

    Returns:
        DataFrame with one row and exactly ``WIN_RATE_COLUMNS``; win_rate, standard_error,
        discrete_win_rate, length_controlled_winrate and lc_standard_error in percent
        (lc_standard_error: the bucketed figure's SE, alpaca_eval's definition for "glm_v1", NaN for "glm").

    Raises:
        ValueError: invalid preferences or lengths (see ``preferences_to_scores``), lengths given
            for one side only, or an unknown ``lc_method``.
    """
    row = _describe(preferences_to_scores(preferences))
    if (len_candidate is None) != (len_baseline is None):
        raise ValueError("give both len_candidate and len_baseline, or neither")
    lc, lc_se = math.nan, math.nan
    if len_candidate is not None:
        if lc_method == "glm":
            lc = glm_length_controlled_win_rate(preferences, len_candidate, len_baseline).length_controlled_winrate
        elif lc_method == "glm_v1":
            from gates.glm_winrate import glm_v1_win_rate

            g = glm_v1_win_rate(
                preferences, len_candidate, len_baseline, instruction_difficulty=instruction_difficulty, prior=glm_prior
            )
            lc, lc_se = g.length_controlled_winrate, g.lc_standard_error
        elif lc_method in ("matched", "balanced"):
            r = length_bucketed_win_rate(
                preferences, len_candidate, len_baseline, n_buckets=n_buckets, tolerance=tolerance, method=lc_method
            )
            lc, lc_se = r.length_controlled_winrate, r.standard_error
        else:
            raise ValueError(f"lc_method must be 'matched', 'balanced', 'glm' or 'glm_v1', got {lc_method!r}")
    row["length_controlled_winrate"] = lc
    row["lc_standard_error"] = lc_se
    return pd.DataFrame([row], columns=list(WIN_RATE_COLUMNS), index=[name] if name is not None else None)


def win_rate_ci(preferences: Any, confidence: float = DEFAULT_CONFIDENCE) -> tuple[float, float]:
    """Normal-approximation interval for ``win_rate``, in percent, clipped to [0, 100].

    ``win_rate +/- z * standard_error`` with the same SE alpaca_eval reports (CLT on the mean of
    per-item scores in [0, 1]). NaN bounds when fewer than 2 items.
    """
    row = _describe(preferences_to_scores(preferences))
    return _normal_ci(row["win_rate"], row["standard_error"], confidence)


def _normal_ci(value: float, se: float, confidence: float) -> tuple[float, float]:
    """A win rate's normal interval in percent, clipped to [0, 100]."""
    return normal(value, se, confidence, low=0.0, high=100.0)


# --------------------------------------------------------------------------------------------
# length-bucketed (matched-length) win rate
# --------------------------------------------------------------------------------------------


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
        return _normal_ci(self.length_controlled_winrate, self.standard_error, confidence)


def _check_lengths(preferences: Any, len_candidate: Any, len_baseline: Any):
    p = _as_float_1d("preferences", preferences)
    lc = _as_float_1d("len_candidate", len_candidate)
    lb = _as_float_1d("len_baseline", len_baseline)
    if not (p.shape == lc.shape == lb.shape):
        raise ValueError(
            f"preferences {p.shape}, len_candidate {lc.shape} and len_baseline {lb.shape} must have the same length"
        )
    for nm, arr in (("len_candidate", lc), ("len_baseline", lb)):
        if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
            i = int(np.flatnonzero(~np.isfinite(arr) | (arr <= 0))[0])
            raise ValueError(f"{nm} must be finite and > 0; item {i} is {arr[i]!r}")
    return p, lc, lb


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
    p, lc, lb = _check_lengths(preferences, len_candidate, len_baseline)
    keep = ~np.isnan(p)
    scores = preferences_to_scores(p)
    r = np.log(lc[keep] / lb[keep])
    edges = length_bucket_edges(n_buckets, tolerance)
    k = (n_buckets - 1) // 2
    # bucket index: matched bucket closed on both sides (|r| <= h); side buckets (a, b] / [a, b)
    h = math.log1p(tolerance)
    idx = np.zeros(r.shape, dtype=int)
    for j in range(1, k + 1):
        lo = h * (2 * j - 1) + _EPS  # a ratio of exactly 1 + tolerance counts as matched
        idx[r > lo] = j
        idx[r < -lo] = -j
    raw = _describe(scores)

    rows = []
    for b in range(-k, k + 1):
        s = scores[idx == b]
        d = _describe(s)
        lo_e, hi_e = edges[b + k], edges[b + k + 1]
        rows.append(
            {
                "bucket": b,
                "r_low": lo_e,
                "r_high": hi_e,
                "ratio_low": math.exp(lo_e),
                "ratio_high": math.exp(hi_e),
                "used": False,
                **d,
            }
        )
    table = pd.DataFrame(rows).set_index("bucket", drop=False)

    if method == "matched":
        s0 = scores[idx == 0]
        d0 = _describe(s0)
        table.loc[0, "used"] = d0["n_total"] > 0
        lcwr, se, n = d0["win_rate"], d0["standard_error"], d0["n_total"]
    else:
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
            lcwr, se = math.nan, math.nan
        else:
            lcwr = sum(w * s.mean() for w, s in comps) / n * 100
            var = sum((w / n) ** 2 * ((s.var(ddof=1) if s.size > 1 else 0.25) / s.size) for w, s in comps)
            se = math.sqrt(var) * 100
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
    p, lc, lb = _check_lengths(preferences, len_candidate, len_baseline)
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
    raw = _describe(y)
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


# --------------------------------------------------------------------------------------------
# gate
# --------------------------------------------------------------------------------------------


def win_rate_evidence(
    preferences: Any,
    len_candidate: Any,
    len_baseline: Any,
    answered: Sequence[bool] | None = None,
    *,
    method: Literal["matched", "balanced"] = "matched",
    n_buckets: int = DEFAULT_N_BUCKETS,
    tolerance: float = DEFAULT_TOLERANCE,
) -> dict[str, int]:
    """How much of a win rate is evidence: items the judge decided between two real answers.

    A draw carries no information on which model is better, and neither does a comparison in which
    one side (or both) said nothing: two empty answers score the same and read as a 50% "win rate"
    with a zero-width interval. The evidence is therefore the number of *decisive* items (preference
    != 1.5, not NaN) whose answers are both non-empty, counted in the set the length-controlled
    figure uses (the matched-length bucket for ``method="matched"``, every item for "balanced").

    Args:
        preferences, len_candidate, len_baseline: as :func:`length_bucketed_win_rate`, shape (n_items,).
        answered: shape (n_items,), True where both answers are non-empty (None: all answered).
        method, n_buckets, tolerance: as :func:`length_bucketed_win_rate`.

    Returns:
        dict: ``n_items``, ``n_in_set`` (items in the length-controlled set), ``n_decisive`` (decisive
        items with both answers non-empty in that set), ``n_draws`` (ties in the set),
        ``n_unanswered`` (items, anywhere, with an empty answer on either side).

    Raises:
        ValueError: invalid inputs (see :func:`length_bucketed_win_rate`) or ``answered`` of another length.
    """
    p, lc, lb = _check_lengths(preferences, len_candidate, len_baseline)
    ok = np.ones(p.shape, dtype=bool) if answered is None else np.asarray(answered, dtype=bool)
    if ok.shape != p.shape:
        raise ValueError(f"answered has shape {ok.shape}, preferences {p.shape}: one flag per item")
    p = np.where(p == 0.0, 1.5, p)
    in_set = ~np.isnan(p)
    if method == "matched":
        edges_lo = math.log1p(tolerance) + _EPS  # the matched bucket: |ln(lc / lb)| <= ln(1 + tolerance)
        in_set &= np.abs(np.log(lc / lb)) <= edges_lo
    decisive = in_set & (p != 1.5)
    return {
        "n_items": int(p.size),
        "n_in_set": int(in_set.sum()),
        "n_decisive": int((decisive & ok).sum()),
        "n_draws": int((in_set & (p == 1.5)).sum()),
        "n_unanswered": int((~ok).sum()),
    }


def win_rate_gate(
    preferences: Any,
    len_candidate: Any,
    len_baseline: Any,
    *,
    bar: float = DEFAULT_BAR,
    method: Literal["matched", "balanced"] = "matched",
    n_buckets: int = DEFAULT_N_BUCKETS,
    tolerance: float = DEFAULT_TOLERANCE,
    confidence: float = DEFAULT_CONFIDENCE,
    require_ci_above_bar: bool = False,
    judge_agreement: float | None = None,
    judge_floor: float = 0.85,
    answered: Sequence[bool] | None = None,
    min_decisive: int = DEFAULT_MIN_DECISIVE,
    name: str = GATE_NAME,
    glm_prior: Any = None,
) -> GateResult:
    """The length-controlled win-rate gate (DESIGN.md "Release gates").

    Rule, in order:
      1. ``judge_agreement`` given and below ``judge_floor`` -> "inconclusive" (the judge's
         verdicts are too attenuated to decide a win rate; the release is then blocked).
      2. no pair in the length-controlled set -> "inconclusive".
      2b. fewer than ``min_decisive`` decisive items with both answers non-empty in that set
         (:func:`win_rate_evidence`) -> "inconclusive": draws and empty answers are not evidence.
      3. LC win rate < ``bar`` -> "block". The reason says "on evidence" if the whole interval
         is below the bar, "could be noise" if the interval still reaches it.
      4. ``require_ci_above_bar`` and the interval's low end < bar -> "block" (not shown to clear).
      5. otherwise "pass".

    Args:
        preferences, len_candidate, len_baseline: as ``length_bucketed_win_rate``.
        bar: percent, default 50.
        method, n_buckets, tolerance: passed to ``length_bucketed_win_rate``.
        confidence: level of the normal interval.
        require_ci_above_bar: stricter policy, see rule 4.
        judge_agreement: the judge-vs-human agreement a in [0, 1], if measured this round.
        judge_floor: minimum a (default 0.85).
        glm_prior: a ``gates.glm_winrate.GlmPrior``; when given, the AlpacaEval-style GLM figure
            (``glm_v1_win_rate``, no difficulty term) is reported as metric ``glm_length_controlled_win_rate``.
            It does not decide: the bucketed figure does.
        answered: shape (n_items,), True where both answers are non-empty (None: all answered).
        min_decisive: the minimum evidence, decisive answered items (default 10).

    Returns:
        GateResult with metrics ``raw_win_rate``, ``length_controlled_win_rate`` (percent),
        ``decisive_items`` (count, the evidence; ``n`` = items in the length-controlled set),
        ``points_explained_by_length`` (points) and, when given, ``judge_agreement`` and
        ``glm_length_controlled_win_rate``; ``table`` is alpaca_eval's row (``WIN_RATE_COLUMNS``) with
        the LC columns filled from the bucketed figure (``lc_standard_error`` = its SE).

    Raises:
        ValueError: invalid inputs (see ``length_bucketed_win_rate``), judge_agreement outside [0, 1].
        TypeError: judge_agreement not a number.
    """
    if judge_agreement is not None:
        if isinstance(judge_agreement, bool) or not isinstance(judge_agreement, (int, float, np.floating)):
            raise TypeError(f"judge_agreement must be a number in [0, 1], got {type(judge_agreement).__name__}")
        if not 0.0 <= float(judge_agreement) <= 1.0:
            raise ValueError(f"judge_agreement must be in [0, 1], got {judge_agreement}")
        judge_agreement = float(judge_agreement)
    if min_decisive < 1:
        raise ValueError(f"min_decisive must be >= 1, got {min_decisive}")
    evidence = win_rate_evidence(
        preferences, len_candidate, len_baseline, answered, method=method, n_buckets=n_buckets, tolerance=tolerance
    )
    res = length_bucketed_win_rate(
        preferences, len_candidate, len_baseline, n_buckets, tolerance=tolerance, method=method
    )
    raw_lo, raw_hi = _normal_ci(res.raw, res.raw_standard_error, confidence)
    lo, hi = res.ci(confidence)
    metrics = {
        "raw_win_rate": Metric(
            value=res.raw, ci_low=raw_lo, ci_high=raw_hi, n=res.n_total, direction="higher_is_better", unit="percent"
        ),
        "length_controlled_win_rate": Metric(
            value=res.length_controlled_winrate, ci_low=lo, ci_high=hi, n=res.n,
            direction="higher_is_better", unit="percent",
        ),
        "points_explained_by_length": Metric(
            value=res.points_explained_by_length, n=res.n_total, direction="lower_is_better", unit="points"
        ),
    }
    metrics["decisive_items"] = Metric(
        value=float(evidence["n_decisive"]), n=evidence["n_in_set"], direction="higher_is_better", unit="items"
    )
    if judge_agreement is not None:
        metrics["judge_agreement"] = Metric(
            value=judge_agreement, direction="higher_is_better", unit="fraction"
        )
    row = {
        **_describe(preferences_to_scores(preferences)),
        "length_controlled_winrate": res.length_controlled_winrate,
        "lc_standard_error": res.standard_error,
    }
    glm_txt = ""
    if glm_prior is not None:
        glm = _glm_v1_figure(preferences, len_candidate, len_baseline, glm_prior)
        if glm is not None:
            metrics["glm_length_controlled_win_rate"] = Metric(
                value=glm.length_controlled_winrate, n=glm.n, direction="higher_is_better", unit="percent"
            )
            glm_txt = (
                f"; AlpacaEval-style GLM (length prior from {glm_prior.n_models} published models): "
                f"{glm.length_controlled_winrate:.1f}% (phi {glm.phi:.2f}; shown, not deciding)"
            )
    pct = f"{100 * confidence:g}%"
    lc_txt = (
        f"{method}-length win rate {res.length_controlled_winrate:.1f}% ({pct} CI {lo:.1f}-{hi:.1f}, n={res.n}); "
        f"raw {res.raw:.1f}%, {res.points_explained_by_length:.1f} points explained by length{glm_txt}; evidence "
        f"{evidence['n_decisive']} decisive items with both answers non-empty (needs {min_decisive})"
    )
    if judge_agreement is not None and judge_agreement < judge_floor:
        verdict, reason = "inconclusive", (
            f"judge agreement {judge_agreement:.3f} is below the floor {judge_floor:.2f}: measured gaps are shrunk "
            f"by 2a-1 = {2 * judge_agreement - 1:.2f}, so the win rate cannot decide the release. {lc_txt}."
        )
    elif res.n == 0 or not math.isfinite(res.length_controlled_winrate):
        verdict, reason = "inconclusive", f"no pairs in the {method}-length set, so no length-controlled win rate. {lc_txt}."
    elif evidence["n_decisive"] < min_decisive:
        verdict, reason = "inconclusive", (
            f"too little evidence: {evidence['n_decisive']} decisive items with both answers non-empty in the "
            f"{method}-length set, needs at least {min_decisive} ({evidence['n_draws']} draws there; "
            f"{evidence['n_unanswered']} of {evidence['n_items']} items have an empty answer on a side). {lc_txt}."
        )
    elif res.length_controlled_winrate < bar:
        basis = (
            "on evidence: the whole interval is below the bar"
            if math.isfinite(hi) and hi < bar
            else "could be noise: the interval still reaches the bar"
        )
        verdict, reason = "block", f"blocked {basis} ({bar:g}%). {lc_txt}."
    elif require_ci_above_bar and not (math.isfinite(lo) and lo >= bar):
        verdict, reason = "block", (
            f"blocked, could be noise: the point estimate clears {bar:g}% but the interval does not "
            f"(require_ci_above_bar). {lc_txt}."
        )
    else:
        verdict, reason = "pass", f"passed: {lc_txt}, at or above {bar:g}%."
    return GateResult(name=name, version=GATE_VERSION, verdict=verdict, metrics=metrics, reason=reason, table=[row])


def _glm_v1_figure(preferences: Any, len_candidate: Any, len_baseline: Any, prior: Any):
    """``glm_v1_win_rate`` with ``prior``, or None when fewer than 2 items are annotated."""
    from gates.glm_winrate import glm_v1_win_rate

    if int(np.sum(~np.isnan(_as_float_1d("preferences", preferences)))) < 2:
        return None
    return glm_v1_win_rate(preferences, len_candidate, len_baseline, prior=prior)


def per_item_lengths(texts: Sequence[str]) -> np.ndarray:
    """Character lengths of ``texts`` (alpaca_eval's length unit), shape (n_items,)."""
    return np.asarray([len(t) for t in texts], dtype=float)


def without_measured_judge(results: Sequence[GateResult], judge_agreement: float | None) -> list[GateResult]:
    """Win-rate gates (raw / length-controlled, per-intent matrix) decided by a judge whose agreement with humans
    was not measured (``judge_agreement`` None) are inconclusive: an unmeasured judge cannot decide a win rate
    (DESIGN.md "Release gates", judge-agreement row). With a measured judge the results are returned unchanged.
    """
    if judge_agreement is not None:
        return list(results)
    return [mark_inconclusive(r, "the judge's agreement with humans was not measured.") for r in results]

