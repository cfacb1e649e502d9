"""Which items each gate sees: stratified win-rate prompts, neutral and suggested-answer questions."""

from __future__ import annotations

from types import SimpleNamespace

from data.loaders import load_eval_prompts
from gates.capability import mc_answer_letter
from gates.suites import capability_questions, stratified, suggested_questions


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
