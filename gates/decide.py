"""From measurements to the gates' results: one pure function, no I/O (DESIGN.md "Release gates").

Each gate decides on its own numbers with its own rule, and every rule lives in its gate's module: the judge
gate (measured or not, ``gates.judge.judge_gate``), the win-rate gates (inconclusive without a measured judge,
``gates.judge.judge_decides``; in ``judge_decision: corrected`` mode decided on the judge-corrected win rate,
``gates.winrate_corrected``), capability (on the items both sides parsed, inconclusive when too
few did, ``gates.capability.capability_gate_on_parsed``), two-sided refusal, sycophancy, drift, citations and, when
run, long-conversation consistency (``gates.consistency.consistency_gate``). Nothing is
averaged; ``gates.result.release_verdict`` combines the verdicts.
"""

from __future__ import annotations

import numpy as np

from . import intent as _intent
from . import winrate as _winrate
from .c03_labelled import C03_LABELLED
from .capability import capability_gate_on_parsed
from .citations import c03_false_positive_cost, citation_gate
from .config import GateStageConfig
from .consistency import consistency_gate
from .drift import drift_gate
from .intent import intent_matrix_gate
from .judge import judge_decides, named_judge_gate, unparsed_judge_gates
from .measure import Measurements
from .refusal import RefusalThresholds, two_sided_refusal_gate
from .result import GateResult
from .sycophancy import sycophancy_gate
from .winrate import win_rate_gate


def decide(m: Measurements, config: GateStageConfig) -> list[GateResult]:
    """Every release gate's result on the round's measurements.

    Args:
        m: the round's measurements (``gates.measure.measure``).
        config: thresholds (``lc_bar``, ``judge_floor``, ``judge_decision``, ``intent_min_share``,
            ``intent_min_items``, ``max_violation_increase_pp``, ``max_false_refusal_increase_pp``,
            ``max_flip_rate``, ``capability_min_parsed``).

    Returns:
        GateResults in the order judge agreement, win rate, per-intent matrix, two-sided refusal, capability,
        sycophancy, drift, citations, then consistency (``consistency_recall``) when ``config.consistency`` is on
        and the suite was measured (``m.consistency``).
    """
    a = None if m.judge is None else m.judge.agreement
    # Pairs whose judge answer was unparsable (NaN preference) are left out of the win rates and counted apart.
    parsed = np.isfinite(m.preferences)
    prefs = m.preferences[parsed]
    len_c, len_b = np.asarray(m.len_candidate)[parsed], np.asarray(m.len_baseline)[parsed]
    intents = [x for x, ok in zip(m.intents, parsed) if ok]
    answered = None if m.answered is None else [x for x, ok in zip(m.answered, parsed) if ok]
    # items sharing an instruction are one draw: the win-rate interval clusters them (item-level when not recorded)
    instructions = None if m.winrate_prompts is None else [x for x, ok in zip(m.winrate_prompts, parsed) if ok]
    win_rate = float(np.mean(prefs - 1.0) * 100) if parsed.any() else float("nan")
    mode = config.judge_decision
    judge = named_judge_gate(m.judge, win_rate, source=m.judge_source, floor=config.judge_floor, info=m.judge_info,
                             decision=mode)
    if parsed.any():
        winrate = judge_decides(
            [
                win_rate_gate(prefs, len_c, len_b, bar=config.lc_bar, glm_prior=m.glm_prior, answered=answered,
                              min_decisive=config.min_decisive, clusters=instructions, judge_decision=mode,
                              judge_agreement=m.judge),
                intent_matrix_gate(prefs, intents, m.traffic, min_share=config.intent_min_share,
                                   bar=config.lc_bar, min_items=config.intent_min_items, answered=answered,
                                   judge_decision=mode),
            ],
            judge, a, floor=config.judge_floor, decision=mode,
        )
    else:
        judge_name = (m.judge_info or {}).get("name", m.judge_source)
        winrate = unparsed_judge_gates([(_winrate.GATE_NAME, _winrate.GATE_VERSION),
                                        (_intent.GATE_NAME, _intent.GATE_VERSION)], len(m.preferences), judge_name)
    thresholds = RefusalThresholds(config.max_violation_increase_pp, config.max_false_refusal_increase_pp,
                                   min_n=config.refusal_min_n)
    consistency = []
    if config.consistency and m.consistency is not None:
        consistency = [consistency_gate(m.consistency, max_drop_pp=config.consistency_max_drop_pp,
                                        min_items=config.consistency_min_items)]
    return [
        judge,
        *winrate,
        two_sided_refusal_gate(
            m.refusal["candidate"], m.refusal["baseline"], thresholds, classifier=m.refusal_quality,
            min_classifier_agreement=None if m.refusal_quality is None else config.refusal_classifier_min_agreement,
            unparsed=m.refusal_unparsed,
        ),
        capability_gate_on_parsed(m.capability_letters["candidate"], m.capability_letters["baseline"],
                                  m.capability_key, min_both_parsed=config.capability_min_parsed),
        sycophancy_gate(m.sycophancy["candidate"], m.sycophancy["baseline"], max_flip_rate=config.max_flip_rate,
                        min_eligible=config.sycophancy_min_eligible),
        drift_gate(m.drift["candidate"], m.drift_previous),
        # No corpus in this suite: C02 (resolution) is not checked; C03's cost on the hand-labelled set is shown.
        citation_gate(m.citation_turns, None, c03_validation=c03_false_positive_cost(*zip(*C03_LABELLED))),
        *consistency,
    ]
