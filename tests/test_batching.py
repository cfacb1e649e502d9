"""rlhf/batching.py: the padding-aware batch plan (hand-worked costs), and generation and scoring through it."""

from __future__ import annotations

import itertools

import pytest

from rlhf.batching import (FORWARD_OVERHEAD_TOKENS, attention_break_even_tokens, forward_overhead_tokens, plan_batches,
                           separate_prefill_pays)


def test_one_long_prompt_gets_its_own_batch_when_padding_costs_more_than_a_forward():
    # one batch: 4 rows x 100 tokens + 48 = 448; [100] + [10, 10, 10]: 100 + 48 + 30 + 48 = 226 (the cheapest)
    assert plan_batches([100, 10, 10, 10], max_batch=4, forwards=1, overhead_tokens=48) == [(0, 1), (1, 4)]
    # a forward worth 1000 tokens: one batch (400 + 1000) beats two (130 + 2000)
    assert plan_batches([100, 10, 10, 10], max_batch=4, forwards=1, overhead_tokens=1000) == [(0, 4)]
    # generation pays the overhead per decode step: 16 new tokens (17 forwards) make the split cost 130 + 2*17*48
    # = 1762 vs 400 + 816 = 1216 in one batch
    assert plan_batches([100, 10, 10, 10], max_batch=4, forwards=17, overhead_tokens=48) == [(0, 4)]


def test_the_plan_respects_the_cap_and_covers_every_prompt_in_order():
    lengths = sorted([301, 290, 250, 180, 170, 169, 150, 120, 100, 95, 90, 89] * 11, reverse=True)
    plan = plan_batches(lengths, max_batch=16, forwards=17, overhead_tokens=48)
    assert plan[0][0] == 0 and plan[-1][1] == len(lengths)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(plan))
    assert all(1 <= end - start <= 16 for start, end in plan)
    fixed = [(s, min(s + 16, len(lengths))) for s in range(0, len(lengths), 16)]

    def cost(p):
        return sum((e - s) * lengths[s] + 17 * 48 for s, e in p)

    assert cost(plan) <= cost(fixed)
    assert plan_batches([], max_batch=8, forwards=1, overhead_tokens=48) == []


def test_bad_plans_are_refused():
    with pytest.raises(ValueError, match="position 2 has 30 > 20"):
        plan_batches([40, 20, 30], max_batch=4, forwards=1, overhead_tokens=48)
    with pytest.raises(ValueError, match="max_batch must be >= 1"):
        plan_batches([1], max_batch=0, forwards=1, overhead_tokens=48)


def test_overhead_by_device():
    import torch

    assert forward_overhead_tokens(torch.device("cpu")) == FORWARD_OVERHEAD_TOKENS["cpu"] == 48
    assert forward_overhead_tokens("cuda:1") == FORWARD_OVERHEAD_TOKENS["cuda"]


def test_auto_batches_split_by_the_plan_give_one_at_a_time_outputs(tiny_model_dir, tokenizer):
    """A long prompt among short ones: ``auto`` splits them (the plan says so for these lengths) and every answer
    equals the prompt generated alone (greedy, left padding)."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlhf.generation import chat_prompt, generate_report

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    prompts = ["Summarise: " + " ".join(f"fact{i}" for i in range(120)), "Hi", "What is 2 + 2?", "Name a colour."]
    lengths = sorted((len(tokenizer(chat_prompt(tokenizer, p), add_special_tokens=False)["input_ids"])
                      for p in prompts), reverse=True)
    assert len(plan_batches(lengths, 64, 3, forward_overhead_tokens(model.device))) == 2  # the long one alone
    texts, n, _ = generate_report(model, tokenizer, prompts, max_new_tokens=2, batch_size="auto")
    for i, p in enumerate(prompts):
        alone, k, _ = generate_report(model, tokenizer, [p], max_new_tokens=2, batch_size=1)
        assert (alone[0], k[0]) == (texts[i], n[i])


def test_planned_scoring_splits_by_padding_cost_and_keeps_each_texts_score(tiny_model_dir, tmp_path):
    """Reward-model scoring under the plan (one forward a batch): a long text among short ones is scored apart,
    the batches are the plan's over token counts (longest first), and every score equals the text scored alone up to
    float32 rounding, in the input order."""
    import numpy as np
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from judging.scoring import render, score

    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1).save_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    model.config.pad_token_id = tok.pad_token_id
    prompts = ["Hi", "Summarise: " + " ".join(f"fact{i}" for i in range(120)), "What is 2 + 2?", "Name a colour."]
    answers = ["Hello.", "Facts.", "4", "Blue."]
    lengths = [len(tok(render(tok, p, a), add_special_tokens=False)["input_ids"]) for p, a in zip(prompts, answers)]
    sorted_lengths = sorted(lengths, reverse=True)
    plan = plan_batches(sorted_lengths, 4, 1, forward_overhead_tokens(model.device))
    assert plan == [(0, 1), (1, 4)] and sorted_lengths[0] == lengths[1]  # the long text alone, the rest together

    widths: list[tuple[int, int]] = []  # (rows, width) of each forward
    forward = model.forward
    model.forward = lambda *a, **kw: widths.append(kw["input_ids"].shape) or forward(*a, **kw)
    planned = score(model, tok, prompts, answers, batch_size=4, planned=True)
    assert [w[0] for w in widths] == [1, 3] and widths[0][1] == lengths[1]
    model.forward = forward
    alone = np.array([score(model, tok, [p], [a], batch_size=1)[0] for p, a in zip(prompts, answers)])
    np.testing.assert_allclose(planned, alone, rtol=0, atol=1e-5)
    np.testing.assert_allclose(score(model, tok, prompts, answers, batch_size=4), alone, rtol=0, atol=1e-5)
    assert score(model, tok, [], [], planned=True).shape == (0,)


def test_attention_break_even_is_the_linear_parameters_over_the_attention_width(tiny_model_dir):
    """The tiny Llama, by hand: per layer q, o 64x64, k, v 64x32 (2 KV heads of 16), MLP 3 x 64x128, two norms of 64:
    36,992; two layers and the final norm 74,048 (the tied embedding / LM head excluded); attention width 4 heads x
    16 = 64, so K = 74,048 / (2 x 2 x 64) = 289.25 tokens."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert attention_break_even_tokens(model) == pytest.approx(289.25)


def test_separate_prefill_pays_for_long_uneven_prompts_only():
    K = 3000.0
    # 16 rows of 1,883 and 1,299 tokens (the demo's deepest consistency batch): padded 16*1883*(1+1883/3000)
    # = 49,038; alone 8*1883*(1+1883/6000) + 8*1299*(1+1299/6000) + 16*48 = 33,201: 0.68 of padded
    assert separate_prefill_pays([1883] * 8 + [1299] * 8, 48, K)
    # 64 short prompts of equal length: 64 forwards' fixed cost outweighs the attention saved (16,303 > 13,653)
    assert not separate_prefill_pays([200] * 64, 48, K)
    # equal long rows save only the masked half of attention: 4*2000*(1+2000/6000) + 4*48 = 10,859 against
    # 4*2000*(1+2000/3000) = 13,333: 0.81 < 0.9 pays; at 600 tokens 0.98 does not
    assert separate_prefill_pays([2000] * 4, 48, K) and not separate_prefill_pays([600] * 4, 48, K)
    assert not separate_prefill_pays([5000], 48, K)  # one row is already alone
    # a CUDA forward is worth thousands of tokens: batches stay padded
    assert not separate_prefill_pays([1883] * 8 + [1299] * 8, FORWARD_OVERHEAD_TOKENS["cuda"], K)
