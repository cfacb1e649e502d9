"""The sentences of a gate's reason, rendered from its findings (``gates.result.Finding``).

A gate computes its numbers (``metrics``), applies its rule (``verdict`` -> verdict and findings) and leaves the
words to this module, so a rule can be tested on its findings and the prose can change without touching a rule.
Each sentence function takes a finding's ``values``; ``reason(findings)`` joins the sentences in order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from gates.result import Finding


def _win_rate_summary(v: dict[str, Any]) -> str:
    pct = f"{100 * v['confidence']:g}%"
    glm = ""
    if v.get("length_controlled_winrate") is not None:
        glm = (f"; AlpacaEval-style GLM length-controlled win rate (length prior from {v['glm_models']} published "
               f"models): {v['length_controlled_winrate']:.1f}% (phi {v['glm_phi']:.2f}; shown, not deciding)")
    return (f"{v['method']}-length win rate {v['bucketed_win_rate']:.1f}% "
            f"({pct} CI {v['ci_low']:.1f}-{v['ci_high']:.1f}, "
            f"n={v['n']}); raw {v['raw_win_rate']:.1f}%, {v['points_explained_by_length']:.1f} points explained by "
            f"length{glm}; evidence {v['n_decisive']} decisive items with both answers non-empty (needs "
            f"{v['min_decisive']})")


def corrected_win_rate(v: dict[str, Any]) -> str:
    """The corrected win rate of a ``corrected_win_rate`` finding: point, interval and what it carries."""
    pct = f"{100 * v['confidence']:g}%"
    return (f"judge-corrected win rate {v['corrected']:.1f}% = 50 + ({v['measured']:.1f} - 50) / (2a-1 = "
            f"{v['attenuation']:.3f}) ({pct} Fieller interval {v['ci_low']:.1f}-{v['ci_high']:.1f}, carrying the "
            f"win rate's SE {v['measured_se']:.2f} points on {v['n']} items and the judge's agreement a = "
            f"{v['agreement']:.3f} +/- {v['agreement_se']:.3f} on {v['n_labels']} decisive expert labels)")


def _needed(v: dict[str, Any]) -> str:
    items, labels = v["items_needed"], v["labels_needed"]
    if items is not None:
        out = f"about {items} items in this figure's set would decide it at this win rate and agreement (have {v['n']})"
    else:
        out = "no number of win-rate items decides it at this agreement's uncertainty"
    if labels is not None and items is None:
        out += f"; about {labels} decisive expert labels would (have {v['n_labels']})"
    return out


def _corrected_win_rate_reason(by: dict[str, dict[str, Any]], s: str) -> str:
    cw, bar = corrected_win_rate(by["corrected_win_rate"]), by["corrected_win_rate"]["bar"]
    mode = ("Decision mode: corrected (the win rate decides on the judge-corrected effect, not on the judge floor; "
            f"no decision at a <= {by['judge_decision']['hard_min']:g}). ")
    if "corrected_above_bar" in by:
        return f"{mode}Passed on evidence: the whole interval of the {cw} is above {bar:g}%. {s}."
    if "corrected_below_bar" in by:
        return f"{mode}Blocked on evidence: the whole interval of the {cw} is below {bar:g}%. {s}."
    if "corrected_unbounded" in by:
        v = by["corrected_unbounded"]
        return (f"{mode}Inconclusive: the judge is not shown better than chance on its expert labels, so the "
                f"{cw} has no bounded interval; {_needed(v)}. {s}.")
    return (f"{mode}Inconclusive: the interval of the {cw} contains {bar:g}%; {_needed(by['corrected_straddles_bar'])}. "
            f"{s}.")


def _win_rate_reason(findings: Sequence[Finding]) -> str:
    by = {f.code: f.values for f in findings}
    s = _win_rate_summary(by["win_rate"])
    if "corrected_win_rate" in by:
        return _corrected_win_rate_reason(by, s)
    if "judge_decision" in by:  # corrected mode, stopped before the correction (no set, too little evidence)
        rest = _win_rate_reason([f for f in findings if f.code != "judge_decision"])
        return f"Decision mode: corrected. {rest[:1].upper()}{rest[1:]}"
    if "no_length_controlled_set" in by:
        return f"no pairs in the {by['win_rate']['method']}-length set, so no length-controlled win rate. {s}."
    if "too_little_evidence" in by:
        v = by["too_little_evidence"]
        return (f"too little evidence: {v['n_decisive']} decisive items with both answers non-empty in the "
                f"{v['method']}-length set, needs at least {v['min_decisive']} ({v['n_draws']} draws there; "
                f"{v['n_unanswered']} of {v['n_items']} items have an empty answer on a side). {s}.")
    if "below_bar" in by:
        v = by["below_bar"]
        basis = ("on evidence: the whole interval is below the bar" if v["on_evidence"]
                 else "could be noise: the interval still reaches the bar")
        return f"blocked {basis} ({v['bar']:g}%). {s}."
    if "interval_not_above_bar" in by:
        return (f"blocked, could be noise: the point estimate clears {by['interval_not_above_bar']['bar']:g}% but the "
                f"interval does not (require_ci_above_bar). {s}.")
    return f"passed: {s}, at or above {by['at_or_above_bar']['bar']:g}%."


def judge_cannot_decide(v: dict[str, Any]) -> str:
    """Why a judged gate is inconclusive: the judge was not measured, is at or below the hard minimum, is below its
    floor, or has not cleared it."""
    a, floor, hard_min = v.get("agreement"), v.get("floor"), v.get("hard_min")
    if a is None:
        why = "the judge's agreement with humans was not measured"
    elif hard_min is not None and math.isfinite(a) and a <= hard_min:
        why = (f"judge agreement {a:.3f} is at or below the hard minimum {hard_min:g}, at which no judged gate "
               f"decides in either decision mode (measured gaps are shrunk by 2a-1 = {2 * a - 1:.2f})")
    elif v.get("decision") == "corrected":
        why = (f"in corrected mode the judge-agreement gate is {v.get('judge_verdict') or 'missing'}, so there is no "
               "measured agreement above the hard minimum to correct with")
    elif floor is not None and math.isfinite(a) and a < floor:
        why = (f"judge agreement {a:.3f} is below the floor {floor:.2f} (measured gaps are shrunk by "
               f"2a-1 = {2 * a - 1:.2f})")
    else:
        why = f"the judge-agreement gate is {v.get('judge_verdict') or 'missing'}"
    return f"Inconclusive: {why}, so the judge's preferences cannot decide this gate."


def _axis(v: dict[str, Any]) -> str:
    return (f"{v['label']} {100 * v['baseline_rate']:.1f}% -> {100 * v['candidate_rate']:.1f}% ({v['delta']:+.1f} "
            f"points, {100 * v['confidence']:g}% CI {100 * v['ci_low']:+.1f} to {100 * v['ci_high']:+.1f}; "
            f"n {v['n_baseline']} -> {v['n_candidate']}; allowed +{v['limit']:g})")


def _regressed(v: dict[str, Any]) -> str:
    basis = ("on evidence (the interval of the change is above 0)" if v["on_evidence"]
             else "could be noise (the interval of the change includes 0)")
    return f"{_axis(v)}: regressed beyond its threshold, {basis}"


def _untrusted(v: dict[str, Any]) -> str:
    if v["agreement"] is None:
        return f"{v['label']}: the classifier's agreement with humans on this kind of set is unknown ({v['source']})"
    return (f"{v['label']}: the classifier agrees with humans {v['agreement']:.3f} of the time on this kind of set "
            f"(worst held-out model), below the floor {v['floor']:.2f}")


def _corrected(v: dict[str, Any]) -> str:
    raw = f"{v['label']}: raw {100 * v['baseline_rate']:.1f}% -> {100 * v['candidate_rate']:.1f}%"
    if not v["measured"]:
        return f"{raw}, no correction (the classifier's error on this kind of set is not measured)"
    c = v["candidate_corrected"]
    return (f"{raw}, corrected {100 * v['baseline_corrected']:.1f}% -> {100 * c[0]:.1f}% (candidate's interval "
            f"{100 * c[1]:.1f}-{100 * c[2]:.1f}%, bootstrapped over its answers and the labelled completions the "
            f"classifier's error on this kind of set is measured on: fpr {v['fpr']:.3f}, fnr {v['fnr']:.3f}; "
            f"agreement {v['agreement']:.3f})")


def _refusal_reason(findings: Sequence[Finding]) -> str:
    def all_of(code: str) -> list[dict[str, Any]]:
        return [f.values for f in findings if f.code == code]

    untrusted, missing = all_of("classifier_untrusted"), [v["label"] for v in all_of("axis_without_items")]
    few = [f"{v['label']} (n {v['n_baseline']} -> {v['n_candidate']}, needs {v['min_n']} on each side)"
           for v in all_of("axis_below_min_n")]
    blocks, notes = [_regressed(v) for v in all_of("axis_regressed")], [_axis(v) for v in all_of("axis_within")]
    (naive,) = all_of("naive_average")
    naive_txt = (f"The naive average of (100 - rate) goes {naive['baseline']:.2f} -> {naive['candidate']:.2f}; it is "
                 "shown only to show why it is not used: the axes are judged separately.")
    if untrusted:
        out = ("Inconclusive: the refusal classifier is not trusted for " + "; ".join(map(_untrusted, untrusted))
               + ", so it cannot decide the release on its own.")
        out += (" Measured (not deciding): " + "; ".join(blocks) + ".") if blocks else ""
        out += f" No items for: {', '.join(missing)}." if missing else ""
        out += f" Too few items to decide: {'; '.join(few)}." if few else ""
        out += " " + naive_txt
    elif few:
        out = ("Inconclusive: too few items to decide " + "; ".join(few) + ". Measured (not deciding): "
               + "; ".join(blocks + notes) + "." + (f" No items for: {', '.join(missing)}." if missing else "")
               + " " + naive_txt)
    elif missing:
        out = f"no items for: {', '.join(missing)}; cannot judge that axis. " + naive_txt
    elif blocks:
        out = "Blocked: " + "; ".join(blocks) + "." + (" Within threshold: " + "; ".join(notes) + "." if notes else "")
        out += " " + naive_txt
    else:
        out = "Both axes within threshold: " + "; ".join(notes) + ". " + naive_txt
    for q in all_of("classifier"):
        out += (f" Classifier: {q['name']}; measured 3-class agreement with humans {q['agreement']:.3f} "
                f"({q['source']}). " + "; ".join(map(_corrected, all_of("corrected"))) + ".")
    unparsed = [f"{v['label']}: baseline {v['baseline']} of {v['baseline_total']}, candidate {v['candidate']} of "
                f"{v['candidate_total']}" for v in all_of("unparsed")]
    if unparsed:
        out += (" Unparsable grades (left out of the rates, never counted as compliance or refusal): "
                + "; ".join(unparsed) + ".")
    return out


def _clusters_said(v: dict[str, Any]) -> str:
    """How many independent pairs the interval counts: clusters and effective n, or that it is item-level."""
    rule = v.get("cluster_rule")
    if rule is None or v.get("n_eff") is None:
        return ""
    if rule == "item":
        return " (item-level: no cluster key)"
    return (f" on the effective n {v['n_eff']:.1f} of {v['n_clusters']} clusters ({rule}; design effect "
            f"{v['design_effect']:.2f})")


def _judge_reason(findings: Sequence[Finding]) -> str:
    by = {f.code: f.values for f in findings}
    if "judge_unmeasured" in by:
        return (f"judge agreement not measured: {by['judge_unmeasured']['source']} has no per-pair agreement scores "
                "(outputs.agreement_scores), so win-rate gates cannot decide")
    if "no_agreement_pairs" in by:
        v = by["no_agreement_pairs"]
        return (f"judge agreement not measured: no pair of {v['source']} could be judged by {v['judge']} (a labels "
                "file must label agreement pairs), so win-rate gates cannot decide")
    if "no_decisive_labels" in by:
        mode = f"Decision mode: {by['judge_decision']['mode']}. " if "judge_decision" in by else ""
        return f"{mode}no decisive expert labels, so judge agreement is unknown."
    v = by["agreement"]
    txt = (f"judge agreement a = {v['agreement']:.3f} (share of {v['n']} decisive expert labels whose side the judge "
           f"picked; 95% Wilson CI {v['ci_low']:.3f}-{v['ci_high']:.3f}{_clusters_said(v)}; {v['n_expert_tie']} "
           "expert ties reported apart)")
    att = f" Attenuation 2a-1 = {v['attenuation']:.3f}: a true win-rate gap shows up multiplied by it."
    if "judge_decision" in by:
        return _judge_corrected_reason(by, txt, att)
    floor = v["floor"]
    if "below_floor" in by:
        return (f"Blocked on evidence: {txt}; the whole interval is below the floor {floor:.2f}; "
                f"win-rate gates are inconclusive.{att}")
    if "at_or_above_floor" in by:
        return f"Passed: {txt}; the whole interval is at or above the floor {floor:.2f}.{att}"
    s = by["straddles_floor"]
    need = s["items_needed"]
    how = ("no sample size decides it (the estimate equals the floor)" if need is None else
           f"about {need} decisive expert-labelled items would decide it if a stays at {v['agreement']:.3f}")
    return (f"Inconclusive: {txt}; the estimate is {s['side']} the floor {floor:.2f} but the interval contains it, "
            f"so the judge is not shown to clear it; {how} (have {s['n']}); win-rate gates cannot decide.{att}")


def _judge_corrected_reason(by: dict[str, dict[str, Any]], txt: str, att: str) -> str:
    """The judge gate's reason in corrected mode: a, its interval and the hard minimum (no floor)."""
    hard = by["judge_decision"]["hard_min"]
    mode = (f"Decision mode: corrected (the {by['judge_decision']['floor']:.2f} floor does not apply; the win-rate "
            f"gates decide on the judge-corrected effect, whose interval carries this agreement's uncertainty; no "
            f"judged gate decides at a <= {hard:g}). ")
    if "usable" in by:
        clears = ("the whole interval is above" if by["usable"]["interval_above_hard_min"]
                  else "the estimate is above, its interval still reaches,")
        return f"{mode}Passed: {txt}; {clears} the hard minimum {hard:g}.{att}"
    if "below_hard_minimum" in by:
        return (f"{mode}Blocked on evidence: {txt}; the whole interval is at or below the hard minimum {hard:g}; "
                f"win-rate gates are inconclusive.{att}")
    s = by["at_or_below_hard_minimum"]
    need = s["items_needed"]
    how = ("no sample size decides it" if need is None else
           f"about {need} decisive expert-labelled items would show it below {hard:g} if a stays at "
           f"{by['agreement']['agreement']:.3f}")
    return (f"{mode}Inconclusive: {txt}; the estimate is at or below the hard minimum {hard:g} but the interval "
            f"reaches above it; {how} (have {s['n']}); win-rate gates cannot decide.{att}")


def _capability_parse(v: dict[str, Any]) -> str:
    n = v["n_items"]
    return (f"unparsed answers (left out of the comparison, never counted wrong): candidate {v['candidate_unparsed']}, "
            f"baseline {v['baseline_unparsed']} of {n}; parsed on both sides: {v['both_parsed']} of {n} (parse rates "
            "are reported, never decided on)")


def _capability_reason(findings: Sequence[Finding]) -> str:
    by = {f.code: f.values for f in findings}
    parse = _capability_parse(by["parse"]) if "parse" in by else ""
    if "nothing_parsed" in by:
        return f"Inconclusive: no answer could be read as a letter (unparsed: {dict(by['nothing_parsed'])}); {parse}."
    if "too_few_parsed" in by:
        v = by["too_few_parsed"]
        return (f"Inconclusive: only {v['both_parsed']} item(s) parsed on both sides, fewer than the "
                f"{v['min_both_parsed']} the gate needs to decide; {parse}.")
    if "no_paired_items" in by:
        return "no paired items, so accuracy cannot be compared."
    v = by["paired_accuracy"]
    txt = (f"accuracy {100 * v['baseline_rate']:.1f}% -> {100 * v['candidate_rate']:.1f}% ({v['change']:+.1f} points, "
           f"{100 * v['confidence']:g}% CI {100 * v['ci_low']:+.1f} to {100 * v['ci_high']:+.1f}; n = {v['n']} paired "
           f"items, {v['baseline_only']} right only for the baseline, {v['candidate_only']} only for the candidate; "
           f"McNemar exact p = {v['p_value']:.4g})")
    if "significant_drop" in by:
        t = by["significant_drop"]
        out = (f"Blocked on evidence: {txt}; the drop is significant at alpha = {t['alpha']:g}"
               + (f" and larger than the tolerated {t['max_drop_pp']:g} points." if t["max_drop_pp"] else "."))
    elif "drop_not_significant" in by:
        out = (f"Passed: {txt}; the candidate is lower but p >= {by['drop_not_significant']['alpha']:g}: could be "
               "noise, so it does not block.")
    elif "drop_within_tolerance" in by:
        out = (f"Passed: {txt}; the candidate is lower but within the tolerated "
               f"{by['drop_within_tolerance']['max_drop_pp']:g} points, so it does not block.")
    else:
        out = f"Passed: {txt}; the candidate is not below the baseline."
    return out + (f" Compared on the items both sides parsed; {parse}." if parse else "")


_DRIFT_BASIS = {"on_evidence": "on evidence (the interval of the change excludes 0)",
                "could_be_noise": "could be noise (the interval of the change includes 0)",
                "no_sample_sizes": "no sample sizes given, so evidence and noise cannot be told apart"}


def _drift_counter(v: dict[str, Any]) -> str:
    if v["counter"] == "median_length_tokens":
        vals = f"{v['previous']:g} -> {v['current']:g} tokens ({v['change']:+.1f}%"
    else:
        vals = f"{v['previous']:g}% -> {v['current']:g}% ({v['change']:+.1f} points"
    ci = "" if v["ci_low"] is None else f", {100 * v['confidence']:g}% CI {v['ci_low']:+.1f} to {v['ci_high']:+.1f}"
    step = ("; not gated)" if v["step"] is None else
            f"; allowed step {v['step']:g} {'%' if v['unit'] == 'percent' else 'points'})")
    return f"{v['counter']} {vals}{ci}{step}"


def _drift_reason(findings: Sequence[Finding]) -> str:
    jumps = [f"{_drift_counter(f.values)} jumped, {_DRIFT_BASIS[f.values['basis']]}" for f in findings
             if f.code == "counter_jumped"]
    within = [_drift_counter(f.values) for f in findings if f.code == "counter_within"]
    tail = (" Within step: " + "; ".join(within) + ".") if within else ""
    if jumps:
        return "Blocked: " + "; ".join(jumps) + "." + tail
    return "Passed: no counter moved more than its step." + tail


def probe_short(v: dict[str, Any]) -> str:
    """Why a sycophancy probe cannot decide (a ``too_little_evidence`` finding of ``gates.sycophancy``)."""
    return (f"needs at least {v['min_eligible']} eligible parsed items, has {v['n']} "
            f"({v['n_ineligible']} of {v['n_items']} ineligible, {v['n_unparsed']} unparsed)")


def _probe_rate(v: dict[str, Any]) -> str:
    s = (f"{v['label']} {100 * v['rate']:.1f}% ({v['k']}/{v['n']}, {100 * v['confidence']:g}% CI "
         f"{100 * v['ci_low']:.1f}-{100 * v['ci_high']:.1f}")
    if v.get("n_unparsed"):
        s += (f"; {v['n_unparsed']} unparsed: {100 * v['rate_unparsed_as_holds']:.1f}% if all kept, "
              f"{100 * v['rate_unparsed_as_flips']:.1f}% if all flipped, bounds {100 * v['bounds_low']:.1f}-"
              f"{100 * v['bounds_high']:.1f}")
    return s + ")"


def _probe_change(v: dict[str, Any]) -> str:
    return (f"{v['label']} baseline {100 * v['baseline_rate']:.1f}% -> candidate {100 * v['candidate_rate']:.1f}% "
            f"({v['delta']:+.1f} points, {100 * v['confidence']:g}% CI {100 * v['ci_low']:+.1f} to "
            f"{100 * v['ci_high']:+.1f}; allowed +{v['allowed']:g})")


_SYCOPHANCY_SENTENCES: dict[str, Callable[[dict[str, Any]], str]] = {
    "probe_not_measured": lambda v: f"{v['label']}: not measured",
    "no_eligible_item": lambda v: f"{v['label']}: no eligible parsed item (n_unparsed={v['n_unparsed']})",
    "too_little_evidence": lambda v: f"{v['label']}: {probe_short(v)}",
    "rate_above_cap": lambda v: (f"{_probe_rate(v)} is above the cap {100 * v['cap']:g}%, " + (
        "on evidence (the whole interval is above it)" if v["on_evidence"]
        else "could be noise (the interval still reaches it)")),
    "rate_within_cap": lambda v: f"{_probe_rate(v)} is within the cap {100 * v['cap']:g}%",
    "unparsed_straddle_cap": lambda v: (f"{_probe_rate(v)}: the unparsed replies decide which side of the cap "
                                        f"{100 * v['cap']:g}% it is on, so it cannot decide"),
    "rate": _probe_rate,
    "baseline_not_compared": lambda v: f"{v['label']}: baseline not compared, {probe_short(v)}",
    "change_regressed": lambda v: f"{_probe_change(v)}: above the baseline on evidence",
    "change_could_be_noise": lambda v: (f"{_probe_change(v)}: above the baseline but could be noise (the interval "
                                        "includes 0), not blocking"),
    "change_within": _probe_change,
}


def _sycophancy_reason(findings: Sequence[Finding]) -> str:
    def said(codes: tuple[str, ...]) -> list[str]:
        return [_SYCOPHANCY_SENTENCES[f.code](f.values) for f in findings if f.code in codes]

    blocks = said(("rate_above_cap", "change_regressed"))
    missing = said(("probe_not_measured", "no_eligible_item", "too_little_evidence", "unparsed_straddle_cap"))
    notes = said(("rate_within_cap", "rate", "baseline_not_compared", "change_could_be_noise", "change_within"))
    tail = (" " + "; ".join(notes) + ".") if notes else ""
    if blocks:
        return "Blocked: " + "; ".join(blocks) + "." + tail
    if missing:
        return "Cannot judge: " + "; ".join(missing) + "." + tail
    return "Passed:" + tail


def _citation_rule(v: dict[str, Any]) -> str:
    return (f"{v['rule']} ({v['what']}) {100 * v['rate']:.1f}% ({v['k']}/{v['n']} {v['unit']}, "
            f"{100 * v['confidence']:g}% CI {100 * v['ci_low']:.1f}-{100 * v['ci_high']:.1f}; threshold "
            f"{v['threshold']:g}%)")


def _citation_reason(findings: Sequence[Finding]) -> str:
    by = {f.code: f.values for f in findings}
    blocks, notes = [], []
    for f in findings:
        v = f.values
        if f.code == "rule_exceeded":
            basis = ("on evidence (the whole interval is above the threshold)" if v["on_evidence"]
                     else "could be noise (the interval still reaches the threshold)")
            blocks.append(f"{_citation_rule(v)}, {basis}")
        elif f.code == "rule_within":
            notes.append(_citation_rule(v))
        elif f.code == "rule_not_checked":
            notes.append(f"{v['rule']}: no corpus given, resolution not checked" if v["why"] == "no_corpus"
                         else f"{v['rule']}: no {v['unit']}, nothing to check")
    if "copied_from_prompt" in by:
        notes.append(f"{by['copied_from_prompt']['n']} references copied from the prompt not counted as emitted")
    fp_txt = ""
    if "c03_cost" in by:
        c = by["c03_cost"]
        fp_txt = (f" C03 false-positive cost: on a hand-labelled set of {c['n']} texts, {c['fp']} of {c['flagged']} "
                  f"flagged were false alarms (precision {c['precision']:.2f}, recall {c['recall']:.2f}), so about "
                  f"{100 * (1 - c['precision']):.0f}% of the C03 count may be false positives.")
    tail = (" " + "; ".join(notes) + ".") if notes else ""
    if "no_turns" in by:
        return "no turns to check." + fp_txt
    if blocks:
        return "Blocked: " + "; ".join(blocks) + "." + tail + fp_txt
    return "Passed:" + tail + fp_txt


_INTENT_STATUS: dict[str, Callable[[dict[str, Any]], str]] = {
    "not_in_traffic_table": lambda v: "not in traffic table (share 0, not weighted)",
    "no_data": lambda v: "no data" + (" (meaningful share untested)" if v["meaningful"] else ""),
    "too_few_items": lambda v: f"too few items (< {v['min_items']})",
    "too_little_evidence": lambda v: f"too little evidence (< {v['min_items']} decisive answered items)",
    "below_bar_on_evidence": lambda v: "below bar on evidence" + (
        "" if v["meaningful"] else " (share below min_share: reported only)"),
    "below_bar_noise": lambda v: "below bar, could be noise",
    "ok": lambda v: "ok",
}


def intent_status(finding: Finding) -> str:
    """The table's ``status`` of one intent of the per-intent matrix, from its finding."""
    return _INTENT_STATUS[finding.code](finding.values)


def _intent_desc(v: dict[str, Any]) -> str:
    return (f"{v['intent']} (share {100 * v['share']:.1f}%): {v['win_rate']:.1f}% "
            f"(CI {v['ci_low']:.1f}-{v['ci_high']:.1f}, n={v['n']})")


def _intent_untested(f: Finding) -> str | None:
    v = f.values
    if "intent" not in v:
        return None
    share = f"{v['intent']} (share {100 * v['share']:.1f}%"
    if f.code == "no_data" and v["meaningful"]:
        return f"{share}, n=0)"
    if f.code == "too_few_items":
        return f"{share}, n={v['n']} < {v['min_items']})"
    if f.code == "too_little_evidence":
        return f"{share}, {v['n_decisive']} decisive answered of n={v['n']} < {v['min_items']})"
    return None


def _intent_notes(findings: Sequence[Finding], min_share: float) -> str:
    def of(code: str, meaningful: bool | None = None) -> list[dict[str, Any]]:
        return [f.values for f in findings if f.code == code and meaningful in (None, f.values["meaningful"])]

    notes = []
    if noise := of("below_bar_noise"):
        notes.append("below the bar but could be noise: " + "; ".join(map(_intent_desc, noise)))
    if small := of("below_bar_on_evidence", False):
        notes.append(f"below the bar on evidence but under min_share {100 * min_share:g}% (not blocking): "
                     + "; ".join(map(_intent_desc, small)))
    if extra := of("not_in_traffic_table"):
        notes.append("in the data but not in the traffic table (not weighted): "
                     + ", ".join(f"{v['intent']} (n={v['n']})" for v in extra))
    if missing := of("no_data", False):
        notes.append("traffic intents with no data (share below min_share): " + ", ".join(v["intent"] for v in missing))
    return (" " + ". ".join(notes) + ".") if notes else ""


def _intent_reason(findings: Sequence[Finding]) -> str:
    by = {f.code: f.values for f in findings}
    if "corrected_bar_not_50" in by:
        v = by["corrected_bar_not_50"]
        rest = _intent_reason([f for f in findings if f.code not in ("corrected_bar_not_50", "judge_decision")])
        return (f"Decision mode: corrected. Inconclusive: per-intent corrected intervals are computed only for a bar "
                f"of 50% (bar here {v['bar']:g}%), so the judge's preferences cannot decide this gate. Measured: "
                f"{rest}")
    if "judge_decision" in by:
        rest = _intent_reason([f for f in findings if f.code != "judge_decision"])
        return ("Decision mode: corrected (at a bar of 50% the correction moves no intent across it: for a judge "
                "with a > 1/2 the corrected win rate is 50% exactly when the measured one is, so the measured "
                f"per-intent intervals test it). {rest}")
    s = next(f.values for f in findings if f.code == "summary")
    pct, bar = f"{100 * s['confidence']:g}%", s["bar"]
    summary = (f"traffic-weighted win rate {s['win_rate']:.1f}% ({pct} CI {s['ci_low']:.1f}-{s['ci_high']:.1f}) over "
               f"{100 * s['covered']:.1f}% of traffic; the prompt-count average {s['by_count']:.1f}% is not used (it "
               "weights intents by how many prompts were written, not by traffic)")
    tail = _intent_notes(findings, s["min_share"])
    untested = [u for u in map(_intent_untested, findings) if u is not None]
    blocks = [_intent_desc(f.values) for f in findings if f.code == "below_bar_on_evidence" and f.values["meaningful"]]
    if any(f.code == "no_annotated_items" for f in findings):
        return f"no annotated items, so no per-intent win rate.{tail}"
    if blocks:
        out = (f"Blocked on evidence: intents with a meaningful traffic share (>= {100 * s['min_share']:g}%) whose "
               f"whole {pct} interval is below {bar:g}%: " + "; ".join(blocks) + f". {summary}.{tail}")
        return out + (" Also untested: " + "; ".join(untested) + "." if untested else "")
    if untested:
        return ("intents with a meaningful traffic share have no or too little data, so the matrix cannot clear "
                "them: " + "; ".join(untested) + f". {summary}.{tail}")
    return f"Passed: no intent with a meaningful traffic share is below {bar:g}% on evidence. {summary}.{tail}"


def corrected_effect(v: dict[str, Any]) -> str:
    """The judge gate's sentence on the effect a measured win rate implies once the attenuation is undone."""
    if math.isfinite(v["corrected_gap"]):
        return (f" Measured win rate {v['measured_win_rate']:.1f}% = gap {v['measured_gap']:+.1f} points over "
                f"{v['bar']:g}%; divided by the attenuation {v['attenuation']:.2f}, the corrected effect is "
                f"{v['corrected_gap']:+.1f} points ({v['corrected_win_rate']:.1f}%).")
    return (f" Measured gap {v['measured_gap']:+.1f} points cannot be corrected: attenuation {v['attenuation']:.2f} "
            "<= 0 (the judge is no better than chance).")


def named_judge(judge: Finding, reason: str, said: Sequence[Finding]) -> str:
    """The judge gate's reason, then the judge's name (a checkpoint path or a model id, so after the finding: a
    state message or a table cell cut short keeps the finding), then its position consistency and unparsable
    answers (``position_consistency`` / ``unparsed_judgments`` findings)."""
    out = f"{reason} Judge: {judge.values['name']} ({judge.values['backend']})."
    for f in said:
        v = f.values
        if f.code == "position_consistency":
            out += f" Position consistency on the win-rate pairs {v['value']:.3f} (n={v['n']} asked in both orders)."
        else:
            out += (f" {v['n_unparsed']} of {v['n_judged']} win-rate judge answers were unparsable (excluded from "
                    "the win rate, not counted as ties).")
    return out


def no_parsed_judgment(v: dict[str, Any]) -> str:
    """A win-rate gate's reason when none of the judge's answers could be parsed."""
    return (f"Inconclusive: none of the {v['n_judged']} judge answers of {v['judge']} could be parsed, so there is "
            "no win rate to decide on (unparsable answers are counted apart, never as ties).")


def _canary_reason(findings: Sequence[Finding]) -> str:
    """The canaries gate: each canary that passed a gate it attacks is an instrument failure (the verdict is
    invalid); else which canaries held, and what they cost."""
    cost = next(f.values for f in findings if f.code == "canary_cost")
    spent = (f"Canaries cost {cost['judge_calls']} judge requests and {cost['pairs_judged']} judged pairs, "
             "no generation.")  # their seconds are in the manifest's efficiency (a reason must not vary by run)
    failed = [f.values for f in findings if f.code == "canary_passed"]
    if failed:
        each = "; ".join(f"instrument failure: {v['canary']} passed {v['gate']} ({v['metric']} {v['value']:.4g})"
                         for v in failed)
        return (f"Verdict invalid: {each}. A constructed candidate that must lose passed a gate it attacks, so that "
                f"gate cannot tell this round's candidate from a degenerate one. {spent}")
    held = next(f.values["verdicts"] for f in findings if f.code == "canaries_held")
    return ("Passed: every canary was blocked or inconclusive on the gates it attacks ("
            + ", ".join(f"{k} {v}" for k, v in held.items()) + f"). {spent}")


def _consistency_depth(v: dict[str, Any]) -> str:
    return (f"depth {v['depth']}: recall {v['candidate_recall']:.1f}% vs baseline {v['baseline_recall']:.1f}%, "
            f"change {v['delta_pp']:+.1f} points ({100 * v['confidence']:.4g}% paired CI {v['ci_low_pp']:+.1f} to "
            f"{v['ci_high_pp']:+.1f}, n={v['n']} probes in {v['n_conversations']} conversations, design effect "
            f"{v['design_effect']:.2f})")


def _consistency_reason(findings: Sequence[Finding]) -> str:
    by_code: dict[str, list[dict[str, Any]]] = {}
    for f in findings:
        by_code.setdefault(f.code, []).append(f.values)
    parts = []
    if "depth_regressed" in by_code:
        parts.append("blocked on evidence: constraint recall dropped beyond the allowed "
                     f"{by_code['depth_regressed'][0]['allowed_pp']:g} points with the whole adjusted interval below 0 "
                     "at " + "; ".join(_consistency_depth(v) for v in by_code["depth_regressed"]))
    if "depth_drop_could_be_noise" in by_code:
        parts.append("inconclusive: a drop beyond the allowed points whose interval still reaches 0 at "
                     + "; ".join(_consistency_depth(v) for v in by_code["depth_drop_could_be_noise"]))
    if "depth_too_little_evidence" in by_code:
        parts.append("too little evidence at " + "; ".join(
            f"depth {v['depth']} ({v['n']} probes, needs {v['min_items']})" for v in by_code["depth_too_little_evidence"]))
    if "no_depth_measured" in by_code:
        parts.append("inconclusive: no depth was measured")
    if "depth_within" in by_code:
        parts.append(("passed: " if len(parts) == 0 else "within the allowed drop: ")
                     + "; ".join(_consistency_depth(v) for v in by_code["depth_within"]))
    if "depths_skipped" in by_code:
        v = by_code["depths_skipped"][0]
        parts.append("skipped (not measured): " + "; ".join(f"depth {d}: {r}" for d, r in v["skipped"].items()))
    return ". ".join(p[0].upper() + p[1:] for p in parts) + "."


#: gate name -> the function rendering its whole reason from its findings.
REASONS: dict[str, Callable[[Sequence[Finding]], str]] = {
    "length_controlled_win_rate": _win_rate_reason,
    "refusal_two_sided": _refusal_reason,
    "judge_agreement": _judge_reason,
    "capability": _capability_reason,
    "personality_drift": _drift_reason,
    "sycophancy": _sycophancy_reason,
    "citation_honesty": _citation_reason,
    "intent_matrix": _intent_reason,
    "canaries": _canary_reason,
    "consistency_recall": _consistency_reason,
}


def reason(gate: str, findings: Sequence[Finding]) -> str:
    """The reason of gate ``gate`` from its findings (``REASONS``)."""
    return REASONS[gate](findings)
