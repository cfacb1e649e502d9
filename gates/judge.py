"""Judge agreement and the attenuation it causes (DESIGN.md "Release gates", judge-agreement row).

If an automated judge agrees with the expert verdict on a pairwise item with probability ``a``,
independently of which side is truly better (symmetric label noise), then the measured win
probability is ``p_m = a p + (1 - a)(1 - p)``, so ``p_m - 1/2 = (2a - 1)(p - 1/2)``: every gap from
50 % (and every difference of win rates) is multiplied by the attenuation factor ``2a - 1``.
Seed figure: a = 0.85 shrinks a true 4-point gap to 4 * 0.7 = 2.8 measured points.

Two decision modes (``GateStageConfig.judge_decision``): ``floor`` (the default) lets the win-rate gates decide only
once the judge's agreement clears ``floor`` on its interval (:func:`verdict`); ``corrected`` drops the floor and lets
them decide on the attenuation-corrected win rate, whose interval carries the judge's measured error
(``gates.winrate_corrected``; :func:`corrected_verdict` here). In both, a judge at or below ``HARD_MIN_AGREEMENT``
decides nothing (:func:`judge_decides`).

Label convention (``data.labels``): 0 = tie, 1 = first response
better, 2 = second response better, -1 = unparsed judge output / no expert majority.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gates import wording
from gates.result import Finding, GateResult, Metric, Verdict
from gates.winrate_corrected import HARD_MIN_AGREEMENT, JUDGE_DECISIONS
from judging.agreement import Agreement
from judging.intervals import wilson

GATE_NAME = "judge_agreement"
GATE_VERSION = "2"
DEFAULT_FLOOR = 0.85
DEFAULT_CONFIDENCE = 0.95


def _check_a(a: float) -> float:
    a = float(a)
    if not 0.0 <= a <= 1.0 or math.isnan(a):
        raise ValueError(f"agreement a must be in [0, 1], got {a}")
    return a


def attenuation(a: float) -> float:
    """Attenuation factor ``2a - 1`` of a judge with agreement ``a`` (see module docstring).

    Args:
        a: judge-vs-expert agreement on decisive pairs, in [0, 1].

    Returns:
        2a - 1, in [-1, 1] (0 = the judge carries no information; negative = worse than chance).

    Raises:
        ValueError: a outside [0, 1].
    """
    return 2.0 * _check_a(a) - 1.0


def measured_gap(true_gap: float, a: float) -> float:
    """The gap a judge with agreement ``a`` measures for a true gap: ``true_gap * (2a - 1)``.

    Units are those of ``true_gap`` (win-rate points above 50, or a difference of win rates).

    Raises:
        ValueError: a outside [0, 1].
    """
    return float(true_gap) * attenuation(a)


def corrected_gap(measured: float, a: float) -> float:
    """Invert the attenuation: ``measured / (2a - 1)``.

    Raises:
        ValueError: a outside [0, 1], or a <= 0.5 (the judge is at or below chance; a gap cannot
            be recovered from it).
    """
    f = attenuation(a)
    if f <= 0:
        raise ValueError(f"a = {a} <= 0.5: the judge is no better than chance, the gap is not recoverable")
    return float(measured) / f


def items_needed(rate: float, floor: float, *, confidence: float = DEFAULT_CONFIDENCE, max_n: int = 10**7,
                 design_effect: float = 1.0) -> int | None:
    """Smallest n at which a Wilson interval around the observed ``rate`` no longer contains ``floor``.

    If the agreement stays at the rate measured now, this many decisive human-labelled items decide
    the judge-agreement gate (lower bound >= floor when rate > floor, upper bound < floor when
    rate < floor). Found by doubling then bisection on n (the interval narrows monotonically in n).
    With clustered items (``design_effect`` > 1, ``Agreement.design_effect``) the interval is Wilson's on
    n / design_effect, so the items needed are the effective n needed times the design effect (rounded up),
    assuming new items are clustered as the measured ones are.

    Returns:
        n (int), or None when rate == floor (no n decides it) or more than ``max_n`` would be needed.

    Raises:
        ValueError: rate outside [0, 1] or design_effect < 1 or not finite.
    """
    if not (math.isfinite(design_effect) and design_effect >= 1.0):
        raise ValueError(f"design_effect must be a finite number >= 1, got {design_effect}")
    if design_effect > 1.0:
        eff = items_needed(rate, floor, confidence=confidence, max_n=max_n)
        return None if eff is None or eff * design_effect > max_n else int(math.ceil(eff * design_effect - 1e-9))
    rate, floor = _check_a(rate), float(floor)

    def decided(n: int) -> bool:
        lo, hi = wilson(rate * n, n, confidence)
        return lo >= floor if rate > floor else hi < floor

    if rate == floor:
        return None
    hi = 1
    while not decided(hi):
        hi *= 2
        if hi > max_n:
            return None
    lo = hi // 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if decided(mid) else (mid, hi)
    return hi


def verdict(agreement: Agreement, floor: float = DEFAULT_FLOOR) -> tuple[Verdict, list[Finding]]:
    """The judge-agreement rule, decided on the interval (DESIGN.md "The judge is pluggable").

    The interval is ``Agreement.ci``: Wilson's on the effective n of the clustered pairs (pairs sharing an
    instruction or a response are not independent, ``judging.agreement.pair_clusters``); item-level when the
    record has no cluster key (``cluster_rule`` ``"item"``).
    No decisive expert label -> "inconclusive" (judge unmeasured). Wilson interval's lower bound >= ``floor`` ->
    "pass". Upper bound < ``floor`` -> "block" (on evidence; the win-rate gates are then inconclusive). Otherwise
    the interval straddles the floor -> "inconclusive", with :func:`items_needed`, the decisive items that would
    decide it at the observed rate. The point estimate alone never passes or blocks.

    Returns:
        (verdict, findings): ``agreement`` (a, its interval, n, ties, attenuation) and the rule's outcome:
        ``no_decisive_labels``, ``below_floor``, ``at_or_above_floor`` or ``straddles_floor`` (with
        ``items_needed``, None when no n decides it).
    """
    ag = agreement
    found = Finding(code="agreement", values={
        "agreement": ag.agreement, "ci_low": ag.ci.low, "ci_high": ag.ci.high, "n": ag.n,
        "n_expert_tie": ag.n_expert_tie, "attenuation": ag.attenuation, "floor": floor,
        "n_eff": ag.n_eff, "n_clusters": ag.n_clusters, "design_effect": ag.design_effect,
        "cluster_rule": ag.cluster_rule})
    if ag.n == 0:
        return "inconclusive", [Finding(code="no_decisive_labels")]
    if ag.ci.high < floor:
        return "block", [found, Finding(code="below_floor", values={"floor": floor})]
    if ag.ci.low >= floor:
        return "pass", [found, Finding(code="at_or_above_floor", values={"floor": floor})]
    return "inconclusive", [found, Finding(code="straddles_floor", values={
        "floor": floor, "items_needed": items_needed(ag.agreement, floor, design_effect=_deff(ag)), "n": ag.n,
        "side": "above" if ag.agreement >= floor else "below"})]


def corrected_verdict(agreement: Agreement, floor: float = DEFAULT_FLOOR) -> tuple[Verdict, list[Finding]]:
    """The judge-agreement rule in ``corrected`` mode: no floor, only the hard minimum ``HARD_MIN_AGREEMENT``.

    The win-rate gates carry this judge's measured error in their own intervals
    (``gates.winrate.corrected_verdict``), so the gate reports a and its interval and blocks only when the judge is
    shown at or below the hard minimum. No decisive expert label -> "inconclusive". a > hard minimum -> "pass"
    (``usable``, saying whether the whole interval is above it). Interval's upper bound <= hard minimum -> "block"
    (``below_hard_minimum``). Otherwise (a at or below it, the interval reaching above) -> "inconclusive"
    (``at_or_below_hard_minimum``, with :func:`items_needed` to show it below). ``floor`` is reported, not applied.

    Returns:
        (verdict, findings): ``judge_decision`` (mode, hard minimum, floor), ``agreement`` (as :func:`verdict`), then
        the outcome.
    """
    ag = agreement
    mode = Finding(code="judge_decision", values={"mode": "corrected", "hard_min": HARD_MIN_AGREEMENT,
                                                  "floor": floor})
    if ag.n == 0:
        return "inconclusive", [mode, Finding(code="no_decisive_labels")]
    found = verdict(ag, floor)[1][0]
    if ag.agreement > HARD_MIN_AGREEMENT:
        return "pass", [mode, found, Finding(code="usable", values={
            "hard_min": HARD_MIN_AGREEMENT, "interval_above_hard_min": bool(ag.ci.low > HARD_MIN_AGREEMENT)})]
    if ag.ci.high <= HARD_MIN_AGREEMENT:
        return "block", [mode, found, Finding(code="below_hard_minimum", values={"hard_min": HARD_MIN_AGREEMENT})]
    return "inconclusive", [mode, found, Finding(code="at_or_below_hard_minimum", values={
        "hard_min": HARD_MIN_AGREEMENT, "n": ag.n,
        "items_needed": items_needed(ag.agreement, HARD_MIN_AGREEMENT, design_effect=_deff(ag))})]


def _check_decision(decision: str) -> str:
    if decision not in JUDGE_DECISIONS:
        raise ValueError(f"judge_decision must be one of {list(JUDGE_DECISIONS)}, got {decision!r}")
    return decision


def _deff(ag: Agreement) -> float:
    d = float(ag.design_effect)
    return d if math.isfinite(d) and d >= 1.0 else 1.0


def judge_agreement_gate(
    agreement: Agreement, *, floor: float = DEFAULT_FLOOR, name: str = GATE_NAME, decision: str = "floor"
) -> GateResult:
    """The judge-agreement gate: the record's numbers, :func:`verdict` (``decision`` "floor") or
    :func:`corrected_verdict` ("corrected"), and the words (``gates.wording``). The table row's ``judge_decision``
    names the mode.

    Returns:
        GateResult with metrics ``agreement`` (fraction, CI, n = decisive labels), ``effective_n`` (the
        independent pairs the clustered decisive labels are worth, n = decisive labels), ``attenuation``
        (2a - 1) and, when inconclusive on the interval, ``items_needed`` (count; null when no n
        decides it); ``table`` holds the tie and abstention counts and the clusters (``n_clusters``,
        ``design_effect``, ``n_eff``, ``cluster_rule``); ``findings`` as :func:`verdict` returns them.
    """
    ag = agreement
    v, findings = (verdict if _check_decision(decision) == "floor" else corrected_verdict)(ag, floor)
    metrics = {
        "agreement": Metric(value=ag.agreement, ci_low=ag.ci.low, ci_high=ag.ci.high, n=ag.n,
                            direction="higher_is_better", unit="fraction"),
        "effective_n": Metric(value=float(ag.n_eff), n=ag.n, direction="higher_is_better", unit="items"),
        "attenuation": Metric(value=ag.attenuation, n=ag.n, direction="higher_is_better", unit="factor"),
    }
    straddles = next((f for f in findings if f.code in ("straddles_floor", "at_or_below_hard_minimum")), None)
    if straddles is not None:
        need = straddles.values["items_needed"]
        metrics["items_needed"] = Metric(value=math.nan if need is None else float(need), n=ag.n,
                                         direction="lower_is_better", unit="items")
    table = [{
        "n_items": ag.n_items, "n_decisive": ag.n, "n_agree": ag.n_agree,
        "n_expert_ties": ag.n_expert_tie, "n_expert_no_majority": ag.n_expert_no_majority,
        "n_judge_ties_on_decisive": ag.n_tie, "n_judge_unparsed": ag.n_unparsed_total,
        "agreement_both_decisive": ag.agreement_excluding_abstentions, "tie_agreement": ag.tie_agreement,
        "three_class_agreement": ag.three_class_accuracy,
        "n_clusters": ag.n_clusters, "design_effect": ag.design_effect, "n_eff": ag.n_eff,
        "cluster_rule": ag.cluster_rule, "judge_decision": decision,
    }]
    return GateResult(name=name, version=GATE_VERSION, verdict=v, metrics=metrics,
                      reason=wording.reason(GATE_NAME, findings), table=table, findings=findings)


def judge_unmeasured_gate(source: str, *, name: str = GATE_NAME) -> GateResult:
    """The judge-agreement gate when the judge's agreement with humans was not measured: "inconclusive" (and the
    win-rate gates cannot decide either, see ``judge_decides``).

    Args:
        source: where the per-pair judgments were looked for (the reward-model stage directory), for the reason.
    """
    found = Finding(code="judge_unmeasured", values={"source": source})
    return GateResult(name=name, version=GATE_VERSION, verdict="inconclusive", metrics={},
                      reason=wording.reason(GATE_NAME, [found]), findings=[found])


def judge_gate(
    agreement: Agreement | None,
    measured_win_rate: float,
    *,
    source: str,
    floor: float = DEFAULT_FLOOR,
    decision: str = "floor",
) -> GateResult:
    """The judge-agreement gate of a round: ``judge_agreement_gate_with_effect`` when the agreement was measured,
    else ``judge_unmeasured_gate(source)``; ``decision`` is the judge-decision mode ("floor" or "corrected")."""
    if agreement is None:
        return judge_unmeasured_gate(source)
    return judge_agreement_gate_with_effect(agreement, measured_win_rate, floor=floor, decision=decision)


def judge_decides(results: list[GateResult], judge: GateResult | None, agreement: float | None, *,
                  floor: float = DEFAULT_FLOOR, decision: str = "floor") -> list[GateResult]:
    """The judge rule, applied once, in the decision step, to every gate whose numbers the judge measured.

    A win rate is measured by the judge; a judge that is unmeasured, at or below ``HARD_MIN_AGREEMENT`` (either
    mode), or whose judge-agreement gate did not pass (floor mode: below the floor or not shown to clear it on the
    interval; corrected mode: at or below the hard minimum) cannot decide a win rate, whatever the win rate says
    (DESIGN.md "Release gates", judge-agreement row). Such a gate becomes "inconclusive" with a
    ``judge_cannot_decide`` finding first (its sentence leads the reason); its metrics are kept and, when measured,
    the judge's agreement is added to them as ``judge_agreement``; its values add ``decision`` in corrected mode and
    ``hard_min`` when the hard minimum is why. Pure: returns copies.

    Args:
        results: the win-rate and per-intent gates' results.
        judge: the judge-agreement gate's result (None: no judge gate).
        agreement: the judge's measured agreement a in [0, 1] (None: not measured).
        floor: the judge floor (reported in the finding).
        decision: the judge-decision mode, "floor" or "corrected" (reported in the finding).

    Raises:
        TypeError: ``agreement`` not a number; ValueError: outside [0, 1], an unknown ``decision``, or, in corrected
            mode, a deciding gate not decided in corrected mode (no ``judge_decision`` finding).
    """
    if agreement is not None:
        if isinstance(agreement, bool) or not isinstance(agreement, (int, float)):
            raise TypeError(f"judge agreement must be a number in [0, 1], got {type(agreement).__name__}")
        agreement = float(agreement) if math.isnan(agreement) else _check_a(agreement)  # NaN: no decisive label
    _check_decision(decision)
    hard = agreement is not None and math.isfinite(agreement) and agreement <= HARD_MIN_AGREEMENT
    decides = agreement is not None and judge is not None and judge.verdict == "pass" and not hard
    out = []
    for r in results:
        metrics = dict(r.metrics)
        if agreement is not None:
            metrics["judge_agreement"] = Metric(value=agreement, direction="higher_is_better", unit="fraction")
        if decides:
            if decision == "corrected" and r.finding("judge_decision") is None:
                # a floor-mode verdict (point estimate vs the bar) must not pass for a corrected one
                raise ValueError(f"{r.name}: judge_decision corrected, but the gate was not decided in corrected mode")
            out.append(r.model_copy(update={"metrics": metrics}))
            continue
        said = {"judge_verdict": None if judge is None else judge.verdict, "agreement": agreement, "floor": floor}
        if decision == "corrected":
            said["decision"] = decision
        if hard:
            said["hard_min"] = HARD_MIN_AGREEMENT
        found = Finding(code="judge_cannot_decide", values=said)
        out.append(r.model_copy(update={
            "verdict": "inconclusive", "metrics": metrics, "findings": [found, *r.findings],
            "reason": f"{wording.judge_cannot_decide(found.values)} {r.reason}",
        }))
    return out


# --------------------------------------------------------------------------------------------
# corrected effect size (added with the per-intent matrix; see gates/intent.py)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CorrectedEffect:
    """A measured win rate and the effect it implies once the judge's attenuation is undone.

    Fields (percent / points):
        measured_win_rate: as the judge measured it.
        measured_gap: measured_win_rate - bar.
        attenuation: 2a - 1.
        corrected_gap: measured_gap / (2a - 1) (NaN when a <= 0.5: not recoverable).
        corrected_win_rate: bar + corrected_gap, clipped to [0, 100] (NaN when not recoverable).
    """

    measured_win_rate: float
    measured_gap: float
    attenuation: float
    corrected_gap: float
    corrected_win_rate: float


def corrected_effect_size(measured_win_rate: float, a: float, *, bar: float = 50.0) -> CorrectedEffect:
    """Undo the judge's attenuation on a measured win rate (see the module docstring).

    Seed figure: a = 0.85, measured 52.8% -> gap 2.8 points -> corrected 2.8 / 0.7 = 4.0 points
    (54.0%).

    Args:
        measured_win_rate: percent.
        a: judge-vs-expert agreement in [0, 1].
        bar: percent, the no-effect point (50).

    Raises:
        ValueError: a outside [0, 1] or a non-finite win rate.
    """
    f = attenuation(a)
    m = float(measured_win_rate)
    if not math.isfinite(m):
        raise ValueError(f"measured_win_rate must be finite, got {measured_win_rate}")
    gap = m - bar
    if f <= 0:
        return CorrectedEffect(m, gap, f, math.nan, math.nan)
    cg = gap / f
    return CorrectedEffect(m, gap, f, cg, min(100.0, max(0.0, bar + cg)))


def judge_agreement_gate_with_effect(
    agreement: Agreement,
    measured_win_rate: float,
    *,
    floor: float = DEFAULT_FLOOR,
    bar: float = 50.0,
    name: str = GATE_NAME,
    decision: str = "floor",
) -> GateResult:
    """``judge_agreement_gate`` plus the effect size a measured win rate implies at this agreement.

    Adds metrics ``measured_gap`` and ``corrected_gap`` (points above ``bar``) and a sentence to the
    reason, e.g. "measured gap +2.8 points / attenuation 0.70 = corrected +4.0 points". The
    verdict is ``judge_agreement_gate``'s in the mode ``decision`` (floor mode: below ``floor`` the win-rate gates are
    inconclusive; corrected mode: only at or below ``HARD_MIN_AGREEMENT``).
    """
    base = judge_agreement_gate(agreement, floor=floor, name=name, decision=decision)
    if not math.isfinite(agreement.agreement):
        return base
    eff = corrected_effect_size(measured_win_rate, agreement.agreement, bar=bar)
    metrics = dict(base.metrics)
    metrics["measured_gap"] = Metric(value=eff.measured_gap, n=agreement.n, direction="higher_is_better",
                                     unit="points")
    metrics["corrected_gap"] = Metric(value=eff.corrected_gap, n=agreement.n, direction="higher_is_better",
                                      unit="points")
    found = Finding(code="corrected_effect", values={
        "measured_win_rate": eff.measured_win_rate, "measured_gap": eff.measured_gap, "attenuation": eff.attenuation,
        "corrected_gap": eff.corrected_gap, "corrected_win_rate": eff.corrected_win_rate, "bar": bar})
    return GateResult(name=base.name, version=base.version, verdict=base.verdict, metrics=metrics,
                      reason=base.reason + wording.corrected_effect(found.values), table=base.table,
                      findings=[*base.findings, found])


# --------------------------------------------------------------------------------------------
# the judge is visible (pluggable judges, judging.judges): which judge, its position consistency and unparsed answers
# --------------------------------------------------------------------------------------------

#: Gates whose verdict rests on the pairwise judge (their table rows name it).
JUDGED_GATES = (GATE_NAME, "length_controlled_win_rate", "intent_matrix")


def named_judge_gate(
    agreement: Agreement | None,
    measured_win_rate: float,
    *,
    source: str,
    floor: float = DEFAULT_FLOOR,
    info: dict | None = None,
    decision: str = "floor",
) -> GateResult:
    """``judge_gate`` for a round whose judge is described by ``info`` (``gates.measure.run_judge``).

    ``info`` None: exactly ``judge_gate`` (``decision``: the judge-decision mode, passed on). Else the reason starts with the judge's name and backend; metrics add
    ``position_consistency`` (share of items whose two orders agreed, when asked in both orders; n = items with both
    orders parsed) and ``unparsed_judgments`` (win-rate pairs whose judge answer could not be parsed, counted apart,
    never as ties; n = pairs judged); the table row adds the judge, backend, identity hash and those counts. A NaN
    ``measured_win_rate`` (every answer unparsable) gives the agreement gate without the corrected effect.
    """
    if agreement is not None and not math.isfinite(measured_win_rate):
        base = judge_agreement_gate(agreement, floor=floor, decision=decision)
    else:
        base = judge_gate(agreement, measured_win_rate if math.isfinite(measured_win_rate) else 50.0, source=source,
                          floor=floor, decision=decision)
    if info is None:
        return base
    name, backend = info["name"], info["backend"]
    reason, findings = base.reason, list(base.findings)
    if agreement is None and backend != "reward_model":
        findings = [Finding(code="no_agreement_pairs", values={"source": source, "judge": name})]
        reason = wording.reason(GATE_NAME, findings)
    pc, n_pc = info.get("position_consistency"), int(info.get("n_position_checked") or 0)
    metrics = dict(base.metrics)
    said = []
    if n_pc:
        metrics["position_consistency"] = Metric(value=pc, n=n_pc, direction="higher_is_better", unit="fraction")
        said.append(Finding(code="position_consistency", values={"value": pc, "n": n_pc}))
    metrics["unparsed_judgments"] = Metric(value=float(info["n_unparsed"]), n=int(info["n_judged"]),
                                           direction="lower_is_better", unit="count")
    if info["n_unparsed"]:
        said.append(Finding(code="unparsed_judgments", values={"n_unparsed": info["n_unparsed"],
                                                               "n_judged": info["n_judged"]}))
    judge = Finding(code="judge", values={"name": name, "backend": backend})
    row = {"judge": name, "backend": backend, "judge_identity": str(info.get("identity_hash", ""))[:16],
           "position_consistency": pc if n_pc else None, "n_position_checked": n_pc,
           "n_unparsed_winrate": info["n_unparsed"], "n_judged_winrate": info["n_judged"]}
    table = [{**row, **r} for r in base.table] or [row]
    return base.model_copy(update={"reason": wording.named_judge(judge, reason, said), "metrics": metrics,
                                   "table": table, "findings": [judge, *findings, *said]})


def unparsed_judge_gates(names_versions: list[tuple[str, str]], n_judged: int, judge: str) -> list[GateResult]:
    """Win-rate gates when none of the ``n_judged`` judge answers could be parsed: "inconclusive" (nothing to
    decide on), one per (gate name, version)."""
    found = Finding(code="no_parsed_judgment", values={"n_judged": n_judged, "judge": judge})
    return [GateResult(name=n, version=v, verdict="inconclusive", metrics={}, reason=wording.no_parsed_judgment(
        found.values), findings=[found]) for n, v in names_versions]
