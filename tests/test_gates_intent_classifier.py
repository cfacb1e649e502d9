"""Embedding-based intents for unlabelled prompts: fitted on AlpacaEval's labelled clusters, measured held out."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binomtest
from transformers import AutoModelForCausalLM

from data.loaders import load_eval_prompts
from gates.intent_classifier import embed, fit_intent_classifier
from gates.suites import stratified


def test_classifier_beats_chance_on_held_out_alpaca_eval_clusters(tiny_model_dir, tokenizer):
    prompts = stratified(load_eval_prompts("demo:alpaca_eval/annotations/baseline_gpt4_1106_preview.jsonl.gz"), 400)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    x = embed(model, tokenizer, [p.prompt for p in prompts])
    assert x.shape == (400, model.config.hidden_size)
    assert np.allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-5)
    clf = fit_intent_classifier(x, [p.intent for p in prompts])
    assert clf.n_test == 100 and len(clf.labels) == 5
    # 5 balanced clusters: chance is 0.2. Even a random 2-layer model's pooled states carry the prompts' words.
    k = round(clf.held_out_accuracy * clf.n_test)
    assert binomtest(k, clf.n_test, 0.2, alternative="greater").pvalue < 0.01, clf.held_out_accuracy
    assert set(clf.predict(x[:10])) <= set(clf.labels)


def test_classifier_needs_two_intents_with_two_prompts_each():
    x = np.eye(4, dtype=np.float32)
    with pytest.raises(ValueError, match="at least two intents"):
        fit_intent_classifier(x, ["a"] * 4)
    with pytest.raises(ValueError, match="'b' has 1 prompt"):
        fit_intent_classifier(x, ["a", "a", "a", "b"])


def test_gate_stage_keeps_data_labels_and_classifies_only_unlabelled_prompts(tiny_model_dir):
    from gates.config import GateStageConfig
    from gates.generation import label_intents

    alpaca = stratified(load_eval_prompts("demo:alpaca_eval/annotations/baseline_gpt4_1106_preview.jsonl.gz"), 2)
    hh = load_eval_prompts("demo:hh_rlhf/pairs_heldout.jsonl", limit=3)  # HH-RLHF carries no intent
    intents, summary = label_intents(hh + alpaca, tiny_model_dir, GateStageConfig())
    assert intents[3:] == [p.intent for p in alpaca]
    assert summary["n_classified"] == 3 and 0 <= summary["held_out_accuracy"] <= 1
    assert set(intents[:3]) <= {"helpful_base", "koala", "oasst", "selfinstruct", "vicuna"}
    assert label_intents(alpaca, tiny_model_dir, GateStageConfig()) == ([p.intent for p in alpaca], None)
