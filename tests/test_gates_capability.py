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
    paired_accuracy,
)
from judging.intervals import newcombe_paired_diff


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
    assert g.finding("drop_not_significant").values["alpha"] == 0.05
    assert g.finding("paired_accuracy").values["p_value"] == pytest.approx(0.052479, abs=5e-7)
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
    assert g.finding("significant_drop").values == {"alpha": 0.05, "max_drop_pp": 0.0}
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
    assert [f.code for f in g.findings] == ["paired_accuracy", "drop_not_significant"]


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
        newcombe_paired_diff(-1, 0, 0, 0)
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


# ---------------------------------------------------------------------------------------------
# wrapped answers (a letter inside markdown or a sentence: inspect_ai #5145 / #5055, PR #5170) and deciding on
# parsed items only
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("ANSWER: **B**", "B"),
        ("ANSWER: $B$", "B"),
        ("The best answer is: **B**.", "B"),
        ("**Answer:** B", "B"),
        ("The answer is **B**", "B"),
        (r"\boxed{B}", "B"),
        (r"The final answer is $\boxed{C}$.", "C"),
        (r"Final answer: \(\boxed{D}\)", "D"),
        (r"The answer is $\text{(C)}$.", "C"),
        ("**(B)**", "B"),
        ("(B)", "B"),
        ("B)", "B"),
        ("Answer: `D`", "D"),
        ("**The best answer is: (B).**", "B"),
        ("**Final answer:** **C) Paris**", "C"),
        ("I'd go with **B**.", "B"),
        # not answers: a wrapper glued to a word, an unclosed wrapper, a formula, a bold word, a bold list
        ("In **A**merica it rains.", None),
        ("ANSWER: **B", None),
        ("The answer is $A = \\pi r^2$", None),
        ("The answer is **not** clear", None),
        ("**Note:** A good question", None),
        ("**(A)** is tempting, but **(C)** is right.", None),
        ("Either **A** or **C**.", None),
        ("ANSWER: **H**", None),  # beyond n_choices
    ],
)
def test_wrapped_answers(text, expected):
    assert mc_answer_letter(text, 4) == expected


def _wrapped_trigger():
    """The issue's trigger: 20 questions; the candidate answers all 20 right as "ANSWER: **X**", the baseline
    answers in the plain "(X)" style and gets 10 right (the other 10 are wrong letters)."""
    from gates.capability import capability_gate_on_parsed

    correct = list("ABCD" * 5)
    wrong = {"A": "B", "B": "C", "C": "D", "D": "A"}
    cand_text = [f"ANSWER: **{c}**" for c in correct]
    base_text = [f"The best answer is: ({c if i < 10 else wrong[c]})." for i, c in enumerate(correct)]
    return capability_gate_on_parsed, correct, cand_text, base_text


def test_wrapped_style_candidate_is_not_blocked():
    gate, correct, cand_text, base_text = _wrapped_trigger()
    # what the issue saw: the 20 answers read as unparsed, counted wrong, blocked "on evidence" at p = 0.00195
    seen = capability_gate(np.zeros(20, dtype=bool), np.arange(20) < 10)
    assert seen.verdict == "block" and seen.table[0]["mcnemar_exact_p"] == pytest.approx(0.001953125)
    _, cand = grade_mc(cand_text, correct, 4)
    _, base = grade_mc(base_text, correct, 4)
    assert cand == correct
    g = gate(cand, base, correct)
    assert g.verdict == "pass"
    assert g.metrics["candidate_accuracy"].value == 100.0 and g.metrics["baseline_accuracy"].value == 50.0
    assert g.table[0]["candidate_only_correct"] == 10 and g.table[0]["mcnemar_exact_p"] == pytest.approx(2 / 2**10)


def test_unparsed_answers_are_left_out_not_counted_wrong():
    # the candidate writes 10 of its 20 answers in a style nothing can read: those items are left out,
    # the 10 both sides parsed decide (candidate 10/10 right vs baseline 0/10 there), parse rates are reported
    gate, correct, cand_text, base_text = _wrapped_trigger()
    cand_text = ["I'd pick the second-to-last option." if i < 10 else t for i, t in enumerate(cand_text)]
    _, cand = grade_mc(cand_text, correct, 4)
    _, base = grade_mc(base_text, correct, 4)
    g = gate(cand, base, correct)
    assert g.verdict == "pass"
    row = g.table[0]
    assert (row["n"], row["both_parsed"], row["candidate_unparsed"], row["baseline_unparsed"]) == (10, 10, 10, 0)
    assert g.metrics["candidate_parse_rate"].value == 50.0 and g.metrics["baseline_parse_rate"].value == 100.0
    assert g.metrics["candidate_parse_rate"].n == 20
    assert g.finding("parse").values == {"candidate_unparsed": 10, "baseline_unparsed": 0, "n_items": 20,
                                         "both_parsed": 10}
    # the same answers with a higher bar on parsed items: too few to decide
    g = gate(cand, base, correct, min_both_parsed=11)
    assert g.verdict == "inconclusive"
    assert g.finding("too_few_parsed").values == {"both_parsed": 10, "min_both_parsed": 11}


def test_a_really_worse_candidate_is_still_blocked():
    gate, correct, _, _ = _wrapped_trigger()
    wrong = {"A": "B", "B": "C", "C": "D", "D": "A"}
    cand_text = [f"ANSWER: **{c if i < 4 else wrong[c]}**" for i, c in enumerate(correct)]  # 4/20 right
    base_text = [f"The best answer is: ({c})." for c in correct]  # 20/20 right
    _, cand = grade_mc(cand_text, correct, 4)
    _, base = grade_mc(base_text, correct, 4)
    g = gate(cand, base, correct)
    assert g.verdict == "block" and g.finding("significant_drop") is not None
    assert g.table[0]["baseline_only_correct"] == 16 and g.table[0]["mcnemar_exact_p"] == pytest.approx(2 / 2**16)
    assert g.metrics["accuracy_change"].value == pytest.approx(-80.0)


def test_capability_gate_on_parsed_checks_inputs():
    from gates.capability import capability_gate_on_parsed

    with pytest.raises(ValueError, match="differ in length"):
        capability_gate_on_parsed(["A"], ["A", "B"], ["A"])
    with pytest.raises(ValueError, match="min_both_parsed"):
        capability_gate_on_parsed(["A"], ["A"], ["A"], min_both_parsed=0)
    g = capability_gate_on_parsed([None, None], [None, "A"], ["A", "A"], min_both_parsed=1)
    assert g.verdict == "inconclusive" and g.metrics["candidate_parse_rate"].value == 0.0
    assert g.finding("too_few_parsed").values == {"both_parsed": 0, "min_both_parsed": 1}
    g = capability_gate_on_parsed([None, None], [None, None], ["A", "A"])
    assert g.finding("nothing_parsed").values == {"candidate": 2, "baseline": 2}
