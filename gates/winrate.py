"""The length-controlled win-rate gate, and AlpacaEval's one-row table (DESIGN.md principle 6).

The statistics live in their own modules, each importing only those below it:
``gates.winrate_stats`` (raw win rate, alpaca_eval's head-to-head row) <- ``gates.length_control`` (matched and
balanced length buckets, the plain GLM) and ``gates.glm_winrate`` (``length_controlled_v1`` with published priors)
<- this module (``win_rate``'s one row with every figure, ``win_rate_evidence``, ``win_rate_gate``).

Every row carries alpaca_eval's leaderboard columns (``WIN_RATE_COLUMNS``), including ``discrete_win_rate``
(``ZeroOneScoringRule``: each preference rounded to a win, a loss or an exact draw) and
``lc_standard_error`` (the SE of the length-controlled figure; for the GLMs alpaca_eval's definition,
``sem`` of the per-item predicted preferences). ``length_controlled_winrate`` / ``lc_standard_error`` hold only a
GLM's figure (alpaca_eval's meaning); the length-bucketed figures have their own columns (``BUCKETED_COLUMNS``:
``length_matched_winrate`` / ``length_matched_standard_error``, or the ``length_balanced_`` pair).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd

from gates import wording
from gates.glm_winrate import glm_v1_win_rate
from gates.length_control import (  # noqa: F401  (re-exported: the win-rate API callers know)
    BUCKET_EDGE_EPS,
    _bucket_index,
    DEFAULT_N_BUCKETS,
    DEFAULT_TOLERANCE,
    LengthControlledWinRate,
    glm_length_controlled_win_rate,
    length_bucket_edges,
    length_bucketed_win_rate,
)
from gates.result import Finding, GateResult, Metric, Verdict
from gates.winrate_corrected import HARD_MIN_AGREEMENT, JUDGE_DECISIONS, corrected_win_rate
from gates.winrate_stats import (  # noqa: F401  (re-exported)
    DEFAULT_CONFIDENCE,
    WIN_RATE_COLUMNS,
    ClusteredSE,
    as_float_1d,
    clustered_se,
    check_lengths,
    describe,
    discrete_win_rate_of_scores,
    normal_win_rate_ci,
    per_item_lengths,
    preferences_to_scores,
)

GATE_NAME = "length_controlled_win_rate"
GATE_VERSION = "1"
DEFAULT_BAR = 50.0
#: Decisive (non-tie) items, both answers non-empty, that a win rate needs before it can decide.
DEFAULT_MIN_DECISIVE = 10

LcMethod = Literal["matched", "balanced", "glm", "glm_v1"]

#: The columns (figure, SE) a length-bucketed method's figure goes in, after ``WIN_RATE_COLUMNS``.
BUCKETED_COLUMNS: dict[str, tuple[str, str]] = {
    "matched": ("length_matched_winrate", "length_matched_standard_error"),
    "balanced": ("length_balanced_winrate", "length_balanced_standard_error"),
}
#: The gate metric of each bucketed method's figure (the one that decides).
BUCKETED_METRICS: dict[str, str] = {"matched": "length_matched_win_rate", "balanced": "length_balanced_win_rate"}


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
            characters, the same unit for both). When given, the figure of ``lc_method`` is filled in:
            ``length_controlled_winrate`` / ``lc_standard_error`` for the GLMs, the method's ``BUCKETED_COLUMNS``
            (added after ``WIN_RATE_COLUMNS``) for "matched" and "balanced"; otherwise the LC columns are NaN.
        lc_method: "matched" or "balanced" (``length_bucketed_win_rate``), "glm"
            (``glm_length_controlled_win_rate``) or "glm_v1" (``gates.glm_winrate.glm_v1_win_rate`` with
            ``glm_prior`` and ``instruction_difficulty``).
        n_buckets, tolerance: bucket settings for the bucketed methods.
        name: index label of the row (alpaca_eval indexes its leaderboard by model name).
        glm_prior, instruction_difficulty: for "glm_v1" only (see ``glm_v1_win_rate``).

    Returns:
        DataFrame with one row: ``WIN_RATE_COLUMNS``, then ``BUCKETED_COLUMNS[lc_method]`` for a bucketed method;
        percent (lc_standard_error: alpaca_eval's definition for "glm_v1", NaN for "glm" and the bucketed methods).

    Raises:
        ValueError: invalid preferences or lengths (see ``preferences_to_scores``), lengths given
            for one side only, or an unknown ``lc_method``.
    """
    row = describe(preferences_to_scores(preferences))
    if (len_candidate is None) != (len_baseline is None):
        raise ValueError("give both len_candidate and len_baseline, or neither")
    lc, lc_se = math.nan, math.nan
    extra: dict[str, float] = {}
    if len_candidate is not None:
        if lc_method == "glm":
            lc = glm_length_controlled_win_rate(preferences, len_candidate, len_baseline).length_controlled_winrate
        elif lc_method == "glm_v1":
            g = glm_v1_win_rate(
                preferences, len_candidate, len_baseline, instruction_difficulty=instruction_difficulty, prior=glm_prior
            )
            lc, lc_se = g.length_controlled_winrate, g.lc_standard_error
        elif lc_method in ("matched", "balanced"):
            r = length_bucketed_win_rate(
                preferences, len_candidate, len_baseline, n_buckets=n_buckets, tolerance=tolerance, method=lc_method
            )
            extra = dict(zip(BUCKETED_COLUMNS[lc_method], (r.length_controlled_winrate, r.standard_error)))
        else:
            raise ValueError(f"lc_method must be 'matched', 'balanced', 'glm' or 'glm_v1', got {lc_method!r}")
    row["length_controlled_winrate"] = lc
    row["lc_standard_error"] = lc_se
    row.update(extra)
    return pd.DataFrame([row], columns=[*WIN_RATE_COLUMNS, *extra], index=[name] if name is not None else None)


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
    p, lc, lb = check_lengths(preferences, len_candidate, len_baseline)
    ok = np.ones(p.shape, dtype=bool) if answered is None else np.asarray(answered, dtype=bool)
    if ok.shape != p.shape:
        raise ValueError(f"answered has shape {ok.shape}, preferences {p.shape}: one flag per item")
    p = np.where(p == 0.0, 1.5, p)
    in_set = ~np.isnan(p)
    if method == "matched":
        edges_lo = math.log1p(tolerance) + BUCKET_EDGE_EPS  # the matched bucket: |ln(lc / lb)| <= ln(1 + tolerance)
        in_set &= np.abs(np.log(lc / lb)) <= edges_lo
    decisive = in_set & (p != 1.5)
    return {
        "n_items": int(p.size),
        "n_in_set": int(in_set.sum()),
        "n_decisive": int((decisive & ok).sum()),
        "n_draws": int((in_set & (p == 1.5)).sum()),
        "n_unanswered": int((~ok).sum()),
    }


@dataclass(frozen=True)
class WinRateThresholds:
    """What the win-rate gate's rule compares against.

    Fields:
        bar: percent the length-controlled win rate must reach (default 50).
        min_decisive: decisive items with both answers non-empty the figure needs before it can decide.
        require_ci_above_bar: stricter policy: the interval's low end must reach the bar too.
    """

    bar: float = DEFAULT_BAR
    min_decisive: int = DEFAULT_MIN_DECISIVE
    require_ci_above_bar: bool = False

    def __post_init__(self) -> None:
        if self.min_decisive < 1:
            raise ValueError(f"min_decisive must be >= 1, got {self.min_decisive}")


@dataclass(frozen=True)
class WinRateMetrics:
    """The win-rate gate's numbers (``metrics``), before any rule.

    Fields:
        figure: the length-bucketed figure (``length_bucketed_win_rate``); lc_ci, raw_ci: its intervals (percent).
        evidence: ``win_rate_evidence``; confidence: the interval level.
        glm: the AlpacaEval-style GLM figure (shown, never deciding) and glm_models its prior's model count.
        row: alpaca_eval's row (``WIN_RATE_COLUMNS``; its LC columns from the GLM, NaN without one), then the
            bucketed figure and its SE (``BUCKETED_COLUMNS[method]``).
        lc_design, raw_design: the clustering of the length-controlled set and of all items
            (``gates.winrate_stats.ClusteredSE``: clusters, design effect, effective n, the SE the intervals use);
            with every instruction once, design effect 1 and the intervals are the item-level ones.
    """

    figure: LengthControlledWinRate
    lc_ci: tuple[float, float]
    raw_ci: tuple[float, float]
    evidence: dict[str, int]
    confidence: float
    glm: Any
    glm_models: int | None
    row: dict[str, Any]
    lc_design: ClusteredSE | None = None
    raw_design: ClusteredSE | None = None


def metrics(
    preferences: Any,
    len_candidate: Any,
    len_baseline: Any,
    *,
    method: Literal["matched", "balanced"] = "matched",
    n_buckets: int = DEFAULT_N_BUCKETS,
    tolerance: float = DEFAULT_TOLERANCE,
    confidence: float = DEFAULT_CONFIDENCE,
    answered: Sequence[bool] | None = None,
    glm_prior: Any = None,
    clusters: Any = None,
) -> WinRateMetrics:
    """The win-rate gate's numbers: the length-controlled figure, its evidence, the raw row, the GLM figure.

    ``clusters``: shape (n_items,), the instruction of each item (any hashable key; None: every item its own
    instruction). Items that share an instruction are one draw of the instruction population the win rate
    estimates, so the intervals use the cluster-robust SE (``gates.winrate_stats.clustered_se``). Only the
    instruction clusters a win rate: its responses are what is measured, not a sampling stage, so a response
    shared across instructions (a canned refusal) does not join them.
    """
    evidence = win_rate_evidence(
        preferences, len_candidate, len_baseline, answered, method=method, n_buckets=n_buckets, tolerance=tolerance
    )
    res = length_bucketed_win_rate(preferences, len_candidate, len_baseline, n_buckets, tolerance=tolerance,
                                   method=method)
    glm = None if glm_prior is None else _glm_v1_figure(preferences, len_candidate, len_baseline, glm_prior)
    row = {**describe(preferences_to_scores(preferences)),
           "length_controlled_winrate": math.nan if glm is None else glm.length_controlled_winrate,
           "lc_standard_error": math.nan if glm is None else glm.lc_standard_error,
           **dict(zip(BUCKETED_COLUMNS[method], (res.length_controlled_winrate, res.standard_error)))}
    lc_design, raw_design = _designs(preferences, len_candidate, len_baseline, res, clusters, method=method,
                                     n_buckets=n_buckets, tolerance=tolerance)
    return WinRateMetrics(
        figure=res, lc_ci=normal_win_rate_ci(res.length_controlled_winrate, lc_design.standard_error, confidence),
        raw_ci=normal_win_rate_ci(res.raw, raw_design.standard_error, confidence),
        evidence=evidence, confidence=confidence, glm=glm, glm_models=None if glm is None else glm_prior.n_models,
        row=row, lc_design=lc_design, raw_design=raw_design,
    )


def _designs(preferences: Any, len_candidate: Any, len_baseline: Any, res: LengthControlledWinRate, clusters: Any,
             *, method: str, n_buckets: int, tolerance: float) -> tuple[ClusteredSE, ClusteredSE]:
    """The clustered SEs of the length-controlled figure and of the raw win rate (percent).

    Each figure is linear in the item scores s_i (preference - 1): raw = mean over all items; matched = mean over
    the matched bucket; balanced = sum_b c_b mean_b (``length_bucketed_win_rate``'s weights). Item i's centred
    contribution is its weight times (s_i - its bucket's mean); ``clustered_se`` scales the figure's own SE by
    the square root of the design effect those contributions give.
    """
    p, lc, lb = check_lengths(preferences, len_candidate, len_baseline)
    keep = ~np.isnan(p)
    keys = None if clusters is None else np.asarray(list(clusters), dtype=object)
    if keys is not None and keys.shape != p.shape:
        raise ValueError(f"clusters has shape {keys.shape}, preferences {p.shape}: one instruction key per item")
    scores = preferences_to_scores(p)
    keys = None if keys is None else keys[keep]
    raw = clustered_se(scores - scores.mean() if scores.size else scores, keys, res.raw_standard_error)
    idx = _bucket_index(np.log(lc[keep] / lb[keep]), n_buckets, tolerance)
    if method == "matched":
        weight = (idx == 0).astype(float)
    else:
        used = set(res.buckets.loc[res.buckets["used"], "bucket"].astype(int))
        weight = np.zeros(scores.size)
        for b in used:
            in_b = idx == b
            partner = idx == -b
            weight[in_b] = 1.0 if b == 0 else (in_b.sum() + partner.sum()) / 2.0 / in_b.sum()
    centred = np.zeros(scores.size)
    for b in np.unique(idx[weight > 0]):
        in_b = (idx == b) & (weight > 0)
        centred[in_b] = weight[in_b] * (scores[in_b] - scores[in_b].mean())
    sel = weight > 0
    lc_design = clustered_se(centred[sel], None if keys is None else keys[sel], res.standard_error)
    return lc_design, raw


def verdict(m: WinRateMetrics, thresholds: WinRateThresholds) -> tuple[Verdict, list[Finding]]:
    """The rule, in order: no pair in the length-controlled set -> "inconclusive"; fewer than ``min_decisive``
    decisive answered items there -> "inconclusive" (draws and empty answers are not evidence); LC win rate below
    the bar -> "block" (on evidence when the whole interval is below it); ``require_ci_above_bar`` and the
    interval's low end below the bar -> "block"; else "pass". The judge's floor is not applied here but once, in
    the decision step (``gates.judge.judge_decides``).

    Returns:
        (verdict, findings): the first finding (``win_rate``) holds the numbers, the second the rule's outcome.
    """
    res, ev, th = m.figure, m.evidence, thresholds
    lo, hi = m.lc_ci
    summary = Finding(code="win_rate", values={
        "method": res.method, "confidence": m.confidence, "bucketed_win_rate": res.length_controlled_winrate,
        "ci_low": lo, "ci_high": hi, "n": res.n, "raw_win_rate": res.raw,
        "points_explained_by_length": res.points_explained_by_length, "n_decisive": ev["n_decisive"],
        "min_decisive": th.min_decisive,
        "length_controlled_winrate": None if m.glm is None else m.glm.length_controlled_winrate,
        "glm_phi": None if m.glm is None else m.glm.phi, "glm_models": m.glm_models,
        "n_eff": None if m.lc_design is None else m.lc_design.n_eff,
        "n_clusters": None if m.lc_design is None else m.lc_design.n_clusters,
        "design_effect": None if m.lc_design is None else m.lc_design.design_effect,
    })
    if res.n == 0 or not math.isfinite(res.length_controlled_winrate):
        return "inconclusive", [summary, Finding(code="no_length_controlled_set", values={"method": res.method})]
    if ev["n_decisive"] < th.min_decisive:
        return "inconclusive", [summary, Finding(code="too_little_evidence", values={
            "method": res.method, "min_decisive": th.min_decisive, **ev})]
    if res.length_controlled_winrate < th.bar:
        return "block", [summary, Finding(code="below_bar", values={
            "bar": th.bar, "on_evidence": bool(math.isfinite(hi) and hi < th.bar)})]
    if th.require_ci_above_bar and not (math.isfinite(lo) and lo >= th.bar):
        return "block", [summary, Finding(code="interval_not_above_bar", values={"bar": th.bar})]
    return "pass", [summary, Finding(code="at_or_above_bar", values={"bar": th.bar})]


def corrected_verdict(m: WinRateMetrics, thresholds: WinRateThresholds,
                      agreement: Any) -> tuple[Verdict, list[Finding]]:
    """The rule in ``corrected`` judge-decision mode: decided on the judge-corrected win rate
    (``gates.winrate_corrected``), whose interval carries the figure's sampling error and the judge's measured one.

    In order: no pair in the length-controlled set, or too little evidence -> "inconclusive" (as :func:`verdict`);
    the corrected interval wholly above the bar -> "pass" (``corrected_above_bar``); wholly below -> "block", on
    evidence (``corrected_below_bar``); otherwise "inconclusive" (``corrected_straddles_bar``, or
    ``corrected_unbounded`` when the judge is not shown better than chance), with the items (and expert labels)
    that would decide it at the current win rate and agreement. The point estimate alone never decides here.
    A judge at or below ``HARD_MIN_AGREEMENT`` is left to ``gates.judge.judge_decides`` (no decision in either mode).

    Args:
        agreement: the judge's ``judging.agreement.Agreement`` (a = ``agreement``, ``n_eff``, ``design_effect``),
            with a > ``HARD_MIN_AGREEMENT``.

    Returns:
        (verdict, findings): ``win_rate`` (as :func:`verdict`), ``corrected_win_rate`` (``CorrectedWinRate`` fields),
        then the outcome.

    Raises:
        ValueError: a at or below ``HARD_MIN_AGREEMENT`` or not finite.
    """
    a = float(agreement.agreement)
    if not (math.isfinite(a) and a > HARD_MIN_AGREEMENT):
        raise ValueError(f"corrected_verdict needs a judge agreement above {HARD_MIN_AGREEMENT}, got {a}")
    v, findings = verdict(m, thresholds)
    summary = findings[0]
    if findings[1].code in ("no_length_controlled_set", "too_little_evidence"):
        return v, findings
    res, th = m.figure, thresholds
    se = m.lc_design.standard_error if m.lc_design is not None else res.standard_error
    deff = float(agreement.design_effect) if math.isfinite(agreement.design_effect) else 1.0
    cw = corrected_win_rate(res.length_controlled_winrate, se, res.n, a, float(agreement.n_eff), bar=th.bar,
                            confidence=m.confidence, labels_design_effect=max(1.0, deff))
    found = Finding(code="corrected_win_rate", values={**cw.to_dict(), "n_labels": int(agreement.n)})
    outcome = {"above": ("pass", "corrected_above_bar"), "below": ("block", "corrected_below_bar"),
               "straddles": ("inconclusive", "corrected_straddles_bar"),
               "unbounded": ("inconclusive", "corrected_unbounded")}[cw.side]
    return outcome[0], [summary, found, Finding(code=outcome[1], values={
        "bar": th.bar, "items_needed": cw.items_needed, "labels_needed": cw.labels_needed, "n": cw.n,
        "n_labels": int(agreement.n)})]


def corrected_metrics(cw: dict[str, Any]) -> dict[str, Metric]:
    """The corrected-mode metrics from a ``corrected_win_rate`` finding's values: ``corrected_win_rate`` (percent,
    its interval, n = items) and, when not decisive, ``items_needed`` (items; NaN when no n decides it)."""
    out = {"corrected_win_rate": Metric(value=cw["corrected"], ci_low=cw["ci_low"], ci_high=cw["ci_high"],
                                        n=cw["n"], direction="higher_is_better", unit="percent")}
    if cw["side"] not in ("above", "below"):
        need = cw["items_needed"]
        out["items_needed"] = Metric(value=math.nan if need is None else float(need), n=cw["n"],
                                     direction="lower_is_better", unit="items")
    return out


def gate_metrics(m: WinRateMetrics) -> dict[str, Metric]:
    """The GateResult's metrics of ``m``."""
    res, (lo, hi), (raw_lo, raw_hi) = m.figure, m.lc_ci, m.raw_ci
    out = {
        "raw_win_rate": Metric(value=res.raw, ci_low=raw_lo, ci_high=raw_hi, n=res.n_total,
                               direction="higher_is_better", unit="percent"),
        BUCKETED_METRICS[res.method]: Metric(value=res.length_controlled_winrate, ci_low=lo, ci_high=hi, n=res.n,
                                             direction="higher_is_better", unit="percent"),
        "points_explained_by_length": Metric(value=res.points_explained_by_length, n=res.n_total,
                                             direction="lower_is_better", unit="points"),
        "decisive_items": Metric(value=float(m.evidence["n_decisive"]), n=m.evidence["n_in_set"],
                                 direction="higher_is_better", unit="items"),
    }
    if m.lc_design is not None:
        out["effective_n"] = Metric(value=float(m.lc_design.n_eff), n=res.n, direction="higher_is_better",
                                    unit="items")
    if m.glm is not None:
        out["length_controlled_winrate"] = Metric(value=m.glm.length_controlled_winrate, n=m.glm.n,
                                                  direction="higher_is_better", unit="percent")
    return out


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
    answered: Sequence[bool] | None = None,
    min_decisive: int = DEFAULT_MIN_DECISIVE,
    name: str = GATE_NAME,
    glm_prior: Any = None,
    clusters: Any = None,
    judge_decision: str = "floor",
    judge_agreement: Any = None,
) -> GateResult:
    """The length-controlled win-rate gate (DESIGN.md "Release gates"): ``metrics``, then ``verdict`` (or
    ``corrected_verdict``), then the words (``gates.wording``).

    Args:
        preferences, len_candidate, len_baseline: as ``length_bucketed_win_rate``.
        bar, min_decisive, require_ci_above_bar: ``WinRateThresholds``.
        method, n_buckets, tolerance: passed to ``length_bucketed_win_rate``; confidence: the interval level.
        answered: shape (n_items,), True where both answers are non-empty (None: all answered).
        glm_prior: a ``gates.glm_winrate.GlmPrior``; when given, the AlpacaEval-style GLM figure
            (``glm_v1_win_rate``, no difficulty term) is reported as metric ``length_controlled_winrate`` and in
            the table's ``length_controlled_winrate`` / ``lc_standard_error``. It does not decide: the bucketed
            figure does.
        clusters: shape (n_items,), each item's instruction (None: every item its own): the intervals are
            cluster-robust where items share an instruction (see :func:`metrics`).
        judge_decision: "floor" (:func:`verdict`; the judge must clear its floor, ``gates.judge.judge_decides``) or
            "corrected" (:func:`corrected_verdict` on ``judge_agreement``, when its a is above
            ``HARD_MIN_AGREEMENT``; otherwise :func:`verdict`, which ``judge_decides`` then makes inconclusive).
        judge_agreement: the judge's ``judging.agreement.Agreement`` (corrected mode only).

    Returns:
        GateResult with metrics ``raw_win_rate``, ``length_matched_win_rate`` (``length_balanced_win_rate`` for
        method "balanced"; percent, the deciding figure), ``decisive_items`` (count, the evidence; ``n`` = items in
        the length-controlled set), ``effective_n`` (the independent items the length-controlled set is worth,
        n / design effect of its instruction clusters), ``points_explained_by_length`` (points) and, with ``glm_prior``,
        ``length_controlled_winrate`` (the GLM); ``table`` is alpaca_eval's row (``WIN_RATE_COLUMNS``, its LC
        columns from the GLM or NaN) followed by the bucketed figure's ``BUCKETED_COLUMNS``; ``findings`` as
        ``verdict`` returns them. In corrected mode, metrics add ``corrected_win_rate`` (percent, Fieller interval,
        n = items) and, when not decisive, ``items_needed``; findings start with ``judge_decision`` (the mode).

    Raises:
        ValueError: invalid inputs (see ``length_bucketed_win_rate``), min_decisive < 1, or an unknown
            judge_decision.
    """
    if judge_decision not in JUDGE_DECISIONS:
        raise ValueError(f"judge_decision must be one of {list(JUDGE_DECISIONS)}, got {judge_decision!r}")
    th = WinRateThresholds(bar=bar, min_decisive=min_decisive, require_ci_above_bar=require_ci_above_bar)
    m = metrics(preferences, len_candidate, len_baseline, method=method, n_buckets=n_buckets, tolerance=tolerance,
                confidence=confidence, answered=answered, glm_prior=glm_prior, clusters=clusters)
    a = math.nan if judge_agreement is None else float(judge_agreement.agreement)
    if judge_decision == "corrected" and math.isfinite(a) and a > HARD_MIN_AGREEMENT:
        v, findings = corrected_verdict(m, th, judge_agreement)
        out = gate_metrics(m)
        cw = next((f.values for f in findings if f.code == "corrected_win_rate"), None)
        if cw is not None:
            out.update(corrected_metrics(cw))
        findings = [Finding(code="judge_decision", values={"mode": "corrected", "hard_min": HARD_MIN_AGREEMENT}),
                    *findings]
        return GateResult(name=name, version=GATE_VERSION, verdict=v, metrics=out,
                          reason=wording.reason(GATE_NAME, findings), table=[m.row], findings=findings)
    v, findings = verdict(m, th)
    return GateResult(name=name, version=GATE_VERSION, verdict=v, metrics=gate_metrics(m),
                      reason=wording.reason(GATE_NAME, findings), table=[m.row], findings=findings)


def _glm_v1_figure(preferences: Any, len_candidate: Any, len_baseline: Any, prior: Any):
    """``glm_v1_win_rate`` with ``prior``, or None when fewer than 2 items are annotated."""
    if int(np.sum(~np.isnan(as_float_1d("preferences", preferences)))) < 2:
        return None
    return glm_v1_win_rate(preferences, len_candidate, len_baseline, prior=prior)
