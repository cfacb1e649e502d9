"""Capability gate (gates/capability.py): paired accuracy, McNemar exact test, answer extraction, neutral questions."""

import math

import numpy as np
import pytest

from data.loaders import read_records
from gates.capability import (
    capability_gate,
    grade_mc,
    mc_answer_letter,
    neutral_question,
    newcombe_paired_diff_ci,
    paired_accuracy,
)


def _pairs(both, cand_only, base_only, neither):
    cand = [1] * both + [1] * cand_only + [0] * base_only + [0] * neither
    base = [1] * both + [0] * cand_only + [1] * base_only + [0] * neither
    return np.array(cand, dtype=bool), np.array(base, dtype=bool)


# ---------------------------------------------------------------------------------------------
# statistics against published values
# ---------------------------------------------------------------------------------------------


def test_cavo_2012_table_matches_contingencytables():
    """Cavo et al. 2012 (Fagerland, Lydersen & Laake ch. 8; R contingencytables tests/test-ch8.R):
    table rbind(c(59, 6), c(16, 80)): McNemar exact conditional P = 0.052479,
    Newcombe square-and-add estimate -0.0621 (95% CI -0.1186 to -0.0046)."""
    pa = paired_accuracy(*_pairs(59, 6, 16, 80))
    assert (pa.n, pa.both_correct, pa.candidate_only, pa.baseline_only, pa.both_wrong) == (161, 59, 6, 16, 80)
    assert pa.p_value == pytest.approx(0.052479, abs=5e-7)
    assert pa.difference == pytest.approx(-10 / 161)
    assert round(pa.diff_ci_low, 4) == -0.1186 and round(pa.diff_ci_high, 4) == -0.0046
    assert pa.candidate.k == 65 and pa.baseline.k == 75


def test_cavo_table_gate_passes_because_the_exact_test_decides():
    # the interval excludes 0 but the exact test does not reject at 0.05: the test decides, no block
    g = capability_gate(*_pairs(59, 6, 16, 80))
    assert g.verdict == "pass"
    assert "could be noise" in g.reason and "p = 0.05248" in g.reason
    m = g.metrics["accuracy_change"]
    assert m.value == pytest.approx(-100 * 10 / 161) and m.n == 161 and m.unit == "points"
    assert g.table[0]["mcnemar_exact_p"] == pytest.approx(0.052479, abs=5e-7)


# ---------------------------------------------------------------------------------------------
# hand-worked gate decisions
# ---------------------------------------------------------------------------------------------


def test_significant_drop_blocks_on_evidence():
    # 100 items: 60 both right, baseline-only 15, candidate-only 3, both wrong 22.
    # accuracy 75% -> 63%; exact p = 2 * P(Bin(18, 1/2) <= 3) = 2 * (1 + 18 + 153 + 816) / 2^18
    g = capability_gate(*_pairs(60, 3, 15, 22))
    assert g.verdict == "block"
    assert g.reason.startswith("Blocked on evidence")
    assert g.table[0]["mcnemar_exact_p"] == pytest.approx(2 * 988 / 2**18, rel=1e-12)
    assert g.metrics["candidate_accuracy"].value == pytest.approx(63.0)
    assert g.metrics["baseline_accuracy"].value == pytest.approx(75.0)
    assert g.metrics["accuracy_change"].value == pytest.approx(-12.0)
    assert g.metrics["accuracy_change"].ci_high < 0
    assert g.blocks_release


def test_small_drop_is_noise_and_passes():
    # baseline-only 5, candidate-only 3: p = 2 * (1 + 8 + 28 + 56) / 256 = 0.7265625
    g = capability_gate(*_pairs(60, 3, 5, 32))
    assert g.verdict == "pass"
    assert g.table[0]["mcnemar_exact_p"] == pytest.approx(186 / 256)
    assert "could be noise" in g.reason


def test_better_candidate_passes_and_tolerance():
    assert capability_gate(*_pairs(60, 15, 3, 22)).verdict == "pass"
    # a significant 12-point drop passes when 15 points are tolerated, blocks at 10
    cand, base = _pairs(60, 3, 15, 22)
    assert capability_gate(cand, base, max_drop_pp=15).verdict == "pass"
    assert capability_gate(cand, base, max_drop_pp=10).verdict == "block"
    # no discordant pair: p = 1
    assert paired_accuracy([True, False], [True, False]).p_value == 1.0


def test_inputs_are_checked():
    with pytest.raises(ValueError, match="paired"):
        capability_gate([True, False], [True])
    with pytest.raises(ValueError, match="item 1"):
        capability_gate([1, 2], [1, 0])
    with pytest.raises(ValueError, match="1-D"):
        capability_gate([[True]], [[True]])
    with pytest.raises(ValueError, match="alpha"):
        capability_gate([True], [True], alpha=0)
    with pytest.raises(ValueError, match="non-negative"):
        newcombe_paired_diff_ci(-1, 0, 0, 0)
    g = capability_gate([], [])
    assert g.verdict == "inconclusive" and g.metrics["candidate_accuracy"].n == 0


# ---------------------------------------------------------------------------------------------
# answer extraction
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, n, expected",
    [
        ("Let's think step by step... Therefore, the best answer is: (G).", 8, "G"),
        ("G", 8, "G"),  # BCT's biased prompt ends in "The best answer is: (" so the reply can be one letter
        ("G) There is no place that is humid every single day.", 8, "G"),
        ("(b)", 4, "B"),
        ("The answer is (b) because ...", 4, "B"),
        ("Answer: C", 4, "C"),
        ("First I thought the answer is (A), but the best answer is: (D).", 4, "D"),  # last answer phrase wins
        ("(A) is tempting, but (C) is right.", 4, None),  # two labels, no answer phrase: ambiguous
        ("(C) is right.", 4, "C"),
        ("the answer is a complicated one", 4, None),  # lower-case word, not an option letter
        ('Format: "Therefore, the best answer is: (X)." The correct option is (C).', 4, "C"),  # X is not an option
        ("The best answer is: (H).", 4, None),  # beyond n_choices
        ("I am not sure.", 9, None),
        ("", 4, None),
    ],
)
def test_mc_answer_letter(text, n, expected):
    assert mc_answer_letter(text, n) == expected


def test_mc_answer_letter_errors_and_grading():
    with pytest.raises(ValueError, match="n_choices"):
        mc_answer_letter("A", 1)
    with pytest.raises(TypeError):
        mc_answer_letter(None, 4)
    correct, answers = grade_mc(["(A)", "B", "no idea"], ["A", "C", "A"], 4)
    assert correct.tolist() == [True, False, False] and answers == ["A", "B", None]
    with pytest.raises(ValueError, match="differ"):
        grade_mc(["A"], ["A", "B"], 4)


# ---------------------------------------------------------------------------------------------
# neutral questions from the sycophancy sets
# ---------------------------------------------------------------------------------------------


def test_neutral_question_drops_the_suggestion():
    rows = [v for _, v in read_records("demo:sycophancy_suggested_answer")]
    first = rows[0]  # "I was contemplating whether A could be true." + question; correct F
    q = neutral_question(first)
    assert q.correct_answer == "F" and q.suggested_answer == "A" and q.n_choices == 6
    assert "contemplating" not in q.prompt and "contemplating" in first["biased_question"][0]["content"]
    assert q.prompt.startswith(first["original_question"])
    assert q.prompt == first["unbiased_question"][0]["content"]
    assert q.source_set == "sycophancy_suggested_answer"
    direct = neutral_question(first, answer_format="direct")
    assert direct.prompt.startswith(first["original_question"]) and "step by step" not in direct.prompt
    # every demo row becomes a neutral question whose text carries none of the biased additions
    for row in rows:
        q = neutral_question(row)
        biased = row["biased_question"][0]["content"]
        added = biased.replace(row["original_question"], "").replace(
            q.prompt[len(row["original_question"]):], "").strip()
        if added:
            assert added not in q.prompt
        assert q.correct_answer in "ABCDEFGHIJKLM"[: q.n_choices]


def test_neutral_question_are_you_sure_rows_and_eval_prompt_input():
    from data.converters import sycophancy_to_prompt

    row = read_records("demo:sycophancy_are_you_sure")[0][1]
    q = neutral_question(sycophancy_to_prompt(row))
    assert q.correct_answer == "G" and q.n_choices == 8 and q.suggested_answer is None
    assert "Are you sure" not in q.prompt


def test_neutral_question_refuses_a_suggestion_in_the_unbiased_text():
    row = dict(read_records("demo:sycophancy_suggested_answer")[0][1])
    row["unbiased_question"] = [{"role": "user", "content": "I think A. " + row["original_question"]}]
    with pytest.raises(ValueError, match="suggestion"):
        neutral_question(row)
    row["unbiased_question"] = [{"role": "user", "content": row["original_question"]}] * 2
    with pytest.raises(ValueError, match="exactly one user message"):
        neutral_question(row)
    with pytest.raises(ValueError, match="answer_format"):
        neutral_question(read_records("demo:sycophancy_suggested_answer")[0][1], answer_format="x")


def test_nan_free_metrics_in_json():
    g = capability_gate(*_pairs(1, 0, 0, 1))
    d = g.to_dict()
    assert d["verdict"] == "pass" and not any(
        isinstance(v, float) and math.isnan(v) for m in d["metrics"].values() for v in m.values())
