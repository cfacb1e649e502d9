"""Judge agreement and attenuation (gates/judge.py)."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from gates.judge import (
    attenuation,
    corrected_gap,
    judge_agreement_gate,
    measured_gap,
)
from judging.agreement import expert_labels, judge_agreement

PANDALM = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "pandalm"
needs_pandalm = pytest.mark.skipif(not PANDALM.is_dir(), reason=f"PandaLM files not found at {PANDALM}")


def test_seed_figure_085_shrinks_4_points_to_2_8():
    assert attenuation(0.85) == pytest.approx(0.7, abs=1e-12)
    assert measured_gap(4.0, 0.85) == pytest.approx(2.8, abs=1e-12)
    assert corrected_gap(2.8, 0.85) == pytest.approx(4.0, abs=1e-12)
    # the derivation, through the product: humans prefer the candidate (side 2) on 540 of 1000 items (a true 54%); a
    # judge that errs on 15% of each side (81 of the 540, 69 of the 460) agrees with them at a = 0.85 and measures
    # 540 - 81 + 69 = 528 wins: 52.8%, a 2.8-point gap where the true one is 4
    from gates.winrate import win_rate

    human = np.array([2] * 540 + [1] * 460)
    judge = human.copy()
    judge[:81], judge[540:540 + 69] = 1, 2
    a = judge_agreement(judge, human).agreement
    measured = win_rate(judge.astype(float))["win_rate"].iloc[0]
    assert a == pytest.approx(0.85, abs=1e-12) and measured == pytest.approx(52.8, abs=1e-9)
    assert measured - 50 == pytest.approx(measured_gap(54.0 - 50, a), abs=1e-9)


def test_attenuation_edges_and_errors():
    assert attenuation(1.0) == 1.0 and attenuation(0.5) == 0.0
    with pytest.raises(ValueError):
        attenuation(1.2)
    with pytest.raises(ValueError):
        attenuation(float("nan"))
    with pytest.raises(ValueError, match="chance"):
        corrected_gap(1.0, 0.5)


def test_expert_labels():
    m = expert_labels([[1, 1, 2], [0, 0, 1], [0, 1, 2], [2, 2, 2]])
    assert m.tolist() == [1, 0, -1, 2]
    with pytest.raises(ValueError):
        expert_labels([1, 2])


def test_judge_agreement_hand_worked_with_ties():
    human = [1, 1, 2, 2, 0, 0, 1, -1]
    judge = [1, 2, 2, 0, 0, 1, -1, 1]
    a = judge_agreement(judge, human)
    # decisive human items: 0,1,2,3,6 -> judge agrees on 0 and 2
    assert (a.n_items, a.n, a.n_agree) == (8, 5, 2)
    assert a.agreement == pytest.approx(0.4) and a.attenuation == pytest.approx(-0.2)
    assert a.n_expert_tie == 2 and a.n_expert_no_majority == 1
    assert a.n_tie == 1 and a.n_unparsed_total == 1
    assert a.agreement_excluding_abstentions == pytest.approx(2 / 3)  # items 0, 1, 2
    assert a.tie_agreement == pytest.approx(0.5)  # items 4, 5
    assert a.three_class_accuracy == pytest.approx(3 / 7)  # items 0, 2, 4 of 7 labelled
    with pytest.raises(ValueError, match="differ"):
        judge_agreement([1, 2], [1])
    with pytest.raises(ValueError):
        judge_agreement([3], [1])


def test_judge_gate():
    # decided on the Wilson interval. 190/200: CI 0.910-0.973, wholly above 0.85 -> pass
    good = judge_agreement([1] * 190 + [2] * 10, [1] * 200)
    assert judge_agreement_gate(good).verdict == "pass"
    # 90/100 = 0.90 but CI 0.826-0.945 reaches below the floor -> inconclusive, not a pass
    assert judge_agreement_gate(judge_agreement([1] * 90 + [2] * 10, [1] * 100)).verdict == "inconclusive"
    # 84/100: the estimate is below 0.85 but the interval (0.756-0.899) contains it -> inconclusive, not a block
    bad = judge_agreement([1] * 84 + [2] * 16, [1] * 100)
    g = judge_agreement_gate(bad)
    assert g.verdict == "inconclusive" and g.finding("straddles_floor").values["side"] == "below"
    assert g.metrics["attenuation"].value == pytest.approx(0.68)
    # 70/100: CI 0.604-0.781, wholly below -> block on evidence
    g70 = judge_agreement_gate(judge_agreement([1] * 70 + [2] * 30, [1] * 100))
    assert g70.verdict == "block" and g70.finding("below_floor").values == {"floor": 0.85}
    none = judge_agreement([1, 2], [0, 0])
    assert judge_agreement_gate(none).verdict == "inconclusive"


def _parse(raw) -> int:
    return {"1": 1, "2": 2, "0": 0, "tie": 0}.get(str(raw).strip().lower(), -1)


@needs_pandalm
def test_pandalm_gpt35_judge_below_floor_on_evidence():
    humans = json.loads((PANDALM / "testset-v1.json").read_text())
    judge = {int(r["idx"]): _parse(r["gpt_result"]) for r in json.loads((PANDALM / "gpt-3.5-turbo-testset-v1.json").read_text())}
    ids = [int(r["idx"]) for r in humans]
    H = np.array([[r["annotator1"], r["annotator2"], r["annotator3"]] for r in humans])
    J = np.array([judge[i] for i in ids])
    a = judge_agreement(J, H)
    print(f"\nPandaLM gpt-3.5-turbo vs human majority: a = {a.agreement:.4f} "
          f"({a.n_agree}/{a.n}), ties {a.n_expert_tie}, unparsed {a.n_unparsed_total}")
    assert (a.n_items, a.n, a.n_agree, a.n_expert_tie) == (999, 894, 692, 105)
    assert a.agreement == pytest.approx(692 / 894, abs=1e-12)
    assert (a.n_tie, a.n_unparsed_total) == (33, 25)
    g = judge_agreement_gate(a)
    assert g.verdict == "block" and g.finding("below_floor") is not None  # Wilson CI high 0.800 < 0.85
    assert a.ci.high < 0.85
    assert math.isclose(g.metrics["attenuation"].value, 2 * 692 / 894 - 1)


@needs_pandalm
def test_the_gate_reports_the_agreement_record_it_is_given():
    # one record from the measurement to the gate: the gate's metric is the record's a, CI and n, unchanged
    humans = json.loads((PANDALM / "testset-v1.json").read_text())
    judge = {int(r["idx"]): _parse(r["gpt_result"]) for r in json.loads((PANDALM / "gpt-3.5-turbo-testset-v1.json").read_text())}
    H = np.array([[r["annotator1"], r["annotator2"], r["annotator3"]] for r in humans])
    J = np.array([judge[int(r["idx"])] for r in humans])
    ours = judge_agreement(J, H)
    m = judge_agreement_gate(ours).metrics["agreement"]
    assert (m.value, m.ci_low, m.ci_high, m.n) == (ours.agreement, ours.ci.low, ours.ci.high, ours.n)
