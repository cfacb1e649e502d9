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
    if v.get("glm_win_rate") is not None:
        glm = (f"; AlpacaEval-style GLM (length prior from {v['glm_models']} published models): "
               f"{v['glm_win_rate']:.1f}% (phi {v['glm_phi']:.2f}; shown, not deciding)")
    return (f"{v['method']}-length win rate {v['lc_win_rate']:.1f}% ({pct} CI {v['ci_low']:.1f}-{v['ci_high']:.1f}, "
            f"n={v['n']}); raw {v['raw_win_rate']:.1f}%, {v['points_explained_by_length']:.1f} points explained by "
            f"length{glm}; evidence {v['n_decisive']} decisive items with both answers non-empty (needs "
            f"{v['min_decisive']})")


def _win_rate_reason(findings: Sequence[Finding]) -> str:
    by = {f.code: f.values for f in findings}
    s = _win_rate_summary(by["win_rate"])
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
    """Why a judged gate is inconclusive: the judge was not measured, is below its floor, or has not cleared it."""
    a, floor = v.get("agreement"), v.get("floor")
    if a is None:
        why = "the judge's agreement with humans was not measured"
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
            f"widened to {100 * c[1]:.1f}-{100 * c[2]:.1f}% by the classifier's error on this kind of set: fpr "
            f"{v['fpr']:.3f}, fnr {v['fnr']:.3f}; agreement {v['agreement']:.3f})")


def _refusal_reason(findings: Sequence[Finding]) -> str:
    def all_of(code: str) -> list[dict[str, Any]]:
        return [f.values for f in findings if f.code == code]

    untrusted, missing = all_of("classifier_untrusted"), [v["label"] for v in all_of("axis_without_items")]
    blocks, notes = [_regressed(v) for v in all_of("axis_regressed")], [_axis(v) for v in all_of("axis_within")]
    (naive,) = all_of("naive_average")
    naive_txt = (f"The naive average of (100 - rate) goes {naive['baseline']:.2f} -> {naive['candidate']:.2f}; it is "
                 "shown only to show why it is not used: the axes are judged separately.")
    if untrusted:
        out = ("Inconclusive: the refusal classifier is not trusted for " + "; ".join(map(_untrusted, untrusted))
               + ", so it cannot decide the release on its own.")
        out += (" Measured (not deciding): " + "; ".join(blocks) + ".") if blocks else ""
        out += f" No items for: {', '.join(missing)}." if missing else ""
        out += " " + naive_txt
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


def _judge_reason(findings: Sequence[Finding]) -> str:
    by = {f.code: f.values for f in findings}
    if "no_decisive_labels" in by:
        return "no decisive expert labels, so judge agreement is unknown."
    v = by["agreement"]
    txt = (f"judge agreement a = {v['agreement']:.3f} (share of {v['n']} decisive expert labels whose side the judge "
           f"picked; 95% Wilson CI {v['ci_low']:.3f}-{v['ci_high']:.3f}; {v['n_expert_tie']} expert ties reported "
           "apart)")
    att = f" Attenuation 2a-1 = {v['attenuation']:.3f}: a true win-rate gap shows up multiplied by it."
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


#: gate name -> the function rendering its whole reason from its findings.
REASONS: dict[str, Callable[[Sequence[Finding]], str]] = {
    "length_controlled_win_rate": _win_rate_reason,
    "refusal_two_sided": _refusal_reason,
    "judge_agreement": _judge_reason,
}


def reason(gate: str, findings: Sequence[Finding]) -> str:
    """The reason of gate ``gate`` from its findings (``REASONS``)."""
    return REASONS[gate](findings)
