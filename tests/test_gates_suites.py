"""Which items each gate sees: stratified win-rate prompts, neutral and suggested-answer questions."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from data.loaders import load_eval_prompts
from gates.capability import mc_answer_letter
from gates.suites import capability_questions, held_back, stratified, suggested_questions


def test_stratified_takes_one_per_intent_in_turn():
    items = [SimpleNamespace(id=i, intent=k) for i, k in enumerate("aaaabbc")]
    assert [x.id for x in stratified(items, 5)] == [0, 4, 6, 1, 5]
    assert len(stratified(items, 100)) == 7  # never invents items


def test_stratified_alpaca_eval_covers_all_five_clusters():
    prompts = load_eval_prompts("demo:alpaca_eval/annotations/baseline_gpt4_1106_preview.jsonl.gz")
    picked = stratified(prompts, 30)
    counts = {k: sum(p.intent == k for p in picked) for k in {p.intent for p in prompts}}
    assert sorted(counts.values()) == [6, 6, 6, 6, 6] and len(counts) == 5


def test_suggested_questions_keep_the_wrong_suggestion_and_ask_for_a_letter():
    rows = load_eval_prompts("demo:sycophancy_bct/truthfulqa_suggested_answer.jsonl.gz")
    qs = suggested_questions(rows, 5)
    assert len(qs) == 5
    for q in qs:
        assert q.suggested_answer != q.correct_answer
        assert "think step by step" not in q.prompt
        assert q.prompt.rstrip().endswith('"The best answer is: (X)."')
    assert qs[0].prompt.startswith("I was contemplating whether A could be true.")
    assert mc_answer_letter("The best answer is: (F).", qs[0].n_choices) == "F"


def test_capability_questions_carry_no_suggestion():
    qs = capability_questions(load_eval_prompts("demo:sycophancy_bct/truthfulqa_are_you_sure.jsonl.gz", limit=3), 3)
    assert [q.suggested_answer for q in qs] == [None, None, None]
    assert qs[0].correct_answer == "G" and qs[0].n_choices == 8


def _config(**kw):
    from gates.config import GateStageConfig

    return GateStageConfig(**kw)


def test_gate_inputs_are_checked_before_any_generation(tmp_path):
    from gates.inputs import check_inputs

    traffic, previous, _ = check_inputs(_config())
    assert abs(sum(traffic.values()) - 1) < 1e-9 and previous is None
    bad = tmp_path / "traffic.csv"
    bad.write_text("intent,share\na,0.6\nb,0.5\n")
    for kw, message in [({"n_winrate": 0}, "--n_winrate must be at least 1"),
                        ({"judge_floor": 2.0}, r"--judge_floor must be in \[0.5, 1\]"),
                        ({"max_flip_rate": -1.0}, "--max_flip_rate"),
                        ({"max_violation_increase_pp": -1.0}, "--max_violation_increase_pp is an allowed increase"),
                        ({"traffic_data": str(bad)}, f"--traffic_data {bad}: .*1.1"),
                        ({"previous_round_dir": str(tmp_path)}, "--previous_round_dir .*not a gates stage directory")]:
        with pytest.raises(ValueError, match=message):
            check_inputs(_config(**kw))


def test_a_judge_without_a_score_head_is_refused(tiny_model_dir):
    from judging.scoring import check_score_head

    with pytest.raises(ValueError, match="no score head"):
        check_score_head(tiny_model_dir)  # a causal LM would load as a reward model with a random head


def test_an_earlier_report_is_removed_before_a_new_run(tmp_path):
    from gates.inputs import clear_previous_outputs

    for name in ("report.md", "report.json", "report.junit.xml", "manifest.json", "notes.txt"):
        (tmp_path / name).write_text("old")
    (tmp_path / "plots").mkdir()
    clear_previous_outputs(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_held_back_takes_what_the_gate_does_not_score():
    # intents a a a b b c: stratified(., 3) scores a0 b3 c5; what is left is a1 a2 b4, taken one per intent in turn
    items = [("a", 0), ("a", 1), ("a", 2), ("b", 3), ("b", 4), ("c", 5)]
    key = lambda x: x[0]  # noqa: E731
    assert stratified(items, 3, key) == [("a", 0), ("b", 3), ("c", 5)]
    assert held_back(items, 3, 2, key) == [("a", 1), ("b", 4)]
    assert held_back(items, 3, 9, key) == [("a", 1), ("b", 4), ("a", 2)]
    assert held_back(items, 6, 9, key) == []  # the gate scores everything: nothing held back
    assert held_back(items, 3, 9, key, keep=lambda x: x[1] != 4) == [("a", 1), ("a", 2)]
