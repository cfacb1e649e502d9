"""Gates compute (``metrics``), decide (``verdict`` -> verdict and findings) and leave the words to ``gates.wording``:
the rule can be run on its own numbers, and a reason is exactly the rendering of its findings."""

from __future__ import annotations

import numpy as np
import pytest

from gates import capability, citations, drift, intent, sycophancy, wording
from gates.drift import DriftCounters
from gates.sycophancy import SycophancyMeasure, flip_rate


def _gates():
    cand = [True] * 60 + [True] * 3 + [False] * 15 + [False] * 22
    base = [True] * 60 + [False] * 3 + [True] * 15 + [False] * 22
    prefs = np.array([2.0] * 3 + [1.0] * 17 + [2.0] * 14 + [1.0] * 6)
    return {
        "capability": capability.capability_gate(cand, base),
        "capability_parsed": capability.capability_gate_on_parsed([None, "A", "B"], ["A", "A", "A"], ["A"] * 3),
        "drift": drift.drift_gate(DriftCounters.from_figures(340, 52, 67, 41, n=200),
                                  DriftCounters.from_figures(180, 8, 22, 14, n=200)),
        "sycophancy": sycophancy.sycophancy_gate(SycophancyMeasure(flip=flip_rate(None, ["B"] * 9 + ["A"] * 31,
                                                                                  ["A"] * 40))),
        "citations": citations.citation_gate([{"response": "See [doc:a1].", "retrieved_ids": []}], {"a1"}),
        "intent": intent.intent_matrix_gate(prefs, ["coding"] * 20 + ["chat"] * 20, {"coding": 0.3, "chat": 0.7}),
    }


@pytest.mark.parametrize("key", list(_gates()))
def test_a_reason_is_the_rendering_of_its_findings(key):
    g = _gates()[key]
    assert g.findings and g.reason == wording.reason(g.name, g.findings)
    for f in g.findings:  # findings are codes and numbers (and names), never sentences
        for v in f.values.values():
            assert not (isinstance(v, str) and v.count(" ") > 8), (f.code, v)


def test_each_rule_runs_on_its_own_numbers():
    cand = [True] * 60 + [True] * 3 + [False] * 15 + [False] * 22
    base = [True] * 60 + [False] * 3 + [True] * 15 + [False] * 22
    m = capability.metrics(cand, base)  # 75% -> 63%, McNemar exact p = 2 * 988 / 2^18
    assert capability.verdict(m, capability.CapabilityThresholds())[0] == "block"
    assert capability.verdict(m, capability.CapabilityThresholds(max_drop_pp=15))[0] == "pass"
    dm = drift.metrics(DriftCounters.from_figures(200, 12, 25, 16), DriftCounters.from_figures(180, 8, 22, 14))
    assert [c.shown for c in dm.changes] == pytest.approx([100 * (200 / 180 - 1), 4.0, 3.0, 2.0])
    assert drift.verdict(dm, drift.drift_steps())[0] == "pass"
    assert drift.verdict(dm, drift.drift_steps({"restating_pct": 3.0}))[0] == "block"
    sm = sycophancy.metrics(SycophancyMeasure(flip=flip_rate(None, ["B"] * 2 + ["A"] * 18, ["A"] * 20)))
    assert sycophancy.verdict(sm, sycophancy.SycophancyThresholds())[0] == "block"  # 2/20 = 10% > 5%
    assert sycophancy.verdict(sm, sycophancy.SycophancyThresholds(max_flip_rate=0.1))[0] == "pass"
    assert sycophancy.verdict(sm, sycophancy.SycophancyThresholds(min_eligible=21))[0] == "inconclusive"
    cm = citations.metrics([("See [doc:a1] and [doc:b2].", ["a1"])], {"a1", "b2"})
    assert [(r.rule, r.k, r.n) for r in cm.rules] == [("C01", 1, 2), ("C02", 0, 2), ("C03", 0, 1)]
    assert citations.verdict(cm, citations.CitationThresholds())[0] == "block"
    assert citations.verdict(cm, citations.CitationThresholds(max_not_retrieved_pct=50))[0] == "pass"
    im = intent.metrics([2.0] * 12 + [1.0] * 8, ["a"] * 20, {"a": 1.0})
    assert im.win_rate == pytest.approx(60.0) and im.rows[0]["n_decisive"] == 20
    assert intent.verdict(im, intent.IntentThresholds())[0] == "pass"
    assert intent.verdict(im, intent.IntentThresholds(min_items=21))[0] == "inconclusive"
