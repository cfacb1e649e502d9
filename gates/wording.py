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


#: gate name -> the function rendering its whole reason from its findings.
REASONS: dict[str, Callable[[Sequence[Finding]], str]] = {
    "length_controlled_win_rate": _win_rate_reason,
}


def reason(gate: str, findings: Sequence[Finding]) -> str:
    """The reason of gate ``gate`` from its findings (``REASONS``)."""
    return REASONS[gate](findings)
