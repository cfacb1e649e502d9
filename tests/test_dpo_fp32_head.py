"""The DPO stage's CPU LM head (dpo.trainer.add_fp32_lm_head): the same numbers and gradients as TRL's fused head
with ``cast_lm_head_to_fp32``, and as a plain fp64 log-softmax, computed on the labelled positions only."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM
from trl.trainer import utils

from dpo import trainer as dpo_head

OUTPUTS = ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1")


def _reference(hidden, weight, bias, targets, temperature):
    """fp64 log-softmax over the full logits: the textbook definitions of each field."""
    z = (hidden.double() @ weight.double().t() + (0 if bias is None else bias.double())) / temperature
    logp = torch.log_softmax(z, dim=-1)
    p = logp.exp()
    return {"log_probs": logp.gather(1, targets[:, None]).squeeze(1), "entropy": -(p * logp).sum(-1),
            "log_sum_sq_probs": torch.log((p * p).sum(-1)), "mean_logits": z.mean(-1),
            "is_top1": z.argmax(-1) == targets}


@pytest.mark.parametrize("bias,temperature", [(False, 1.0), (True, 0.7)])
def test_token_log_probs_match_an_fp64_log_softmax_with_their_gradients(bias, temperature, monkeypatch):
    monkeypatch.setattr(dpo_head, "TILE_ELEMENTS", 3 * 50)  # 3 tokens per chunk: the chunk seams are crossed
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(10, 8, generator=g, requires_grad=True)
    weight = torch.randn(50, 8, generator=g, requires_grad=True)
    b = torch.randn(50, generator=g, requires_grad=True) if bias else None
    targets = torch.randint(0, 50, (10,), generator=g)
    targets[3] = int((hidden[3] @ weight.t()).argmax())  # one certain top-1
    got = dict(zip(OUTPUTS, dpo_head.TokenLogProbs.apply(hidden, weight, b, targets, 1 / temperature, OUTPUTS)))
    want = _reference(hidden, weight, b, targets, temperature)
    for name in OUTPUTS[:4]:
        assert torch.allclose(got[name].double(), want[name], atol=1e-5), name
    assert torch.equal(got["is_top1"], want["is_top1"]) and bool(got["is_top1"][3])
    upstream = torch.randn(10, generator=g)
    params = [hidden, weight] + ([b] if bias else [])
    ours = torch.autograd.grad((got["log_probs"] * upstream).sum(), params)
    theirs = torch.autograd.grad((want["log_probs"] * upstream.double()).sum(), params)
    for a, e in zip(ours, theirs):
        assert a.dtype == torch.float32 and torch.allclose(a, e.float(), atol=1e-5)
    assert not got["entropy"].requires_grad and got["log_probs"].requires_grad


def _batch(vocab: int):
    """Two rows, the second right-padded: prompt and padding labelled -100, as DPOTrainer labels them."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (2, 24), generator=g)
    attention = torch.ones_like(ids)
    attention[1, 18:] = 0
    labels = ids.clone()
    labels[0, :9] = -100
    labels[1, :5] = -100
    labels[1, 18:] = -100
    return ids, attention, labels


def test_dpo_head_on_a_cpu_gives_trl_fp32_heads_outputs_and_gradients(tiny_model_dir):
    trl_model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    ours = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    utils.add_fused_lm_head(trl_model, cast_lm_head_to_fp32=True, outputs=OUTPUTS)
    dpo_head.add_fp32_lm_head(ours, cast_lm_head_to_fp32=True, outputs=OUTPUTS)
    ids, attention, labels = _batch(ours.config.vocab_size)
    results = []
    for model in (trl_model, ours):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(input_ids=ids, attention_mask=attention, labels=labels, fused_lm_head=True)
        (out.log_probs.sum() + out.loss).backward()
        results.append((out, {n: p.grad.clone() for n, p in model.named_parameters()}))
    (want, want_grads), (got, got_grads) = results
    assert torch.equal(got.label_mask, want.label_mask)
    for name in OUTPUTS[:4]:
        assert torch.allclose(getattr(got, name), getattr(want, name), atol=2e-5), name
        assert torch.all(getattr(got, name)[~got.label_mask] == 0), name
    assert torch.equal(got.is_top1, want.is_top1)
    assert torch.allclose(got.loss, want.loss, atol=1e-6)
    for name, grad in want_grads.items():
        assert torch.allclose(got_grads[name], grad, rtol=1e-4, atol=1e-6), name


def test_dpo_head_keeps_an_all_masked_batch_differentiable(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    dpo_head.add_fp32_lm_head(model, cast_lm_head_to_fp32=True)
    ids, attention, _ = _batch(model.config.vocab_size)
    out = model(input_ids=ids, attention_mask=attention, labels=torch.full_like(ids, -100), fused_lm_head=True)
    out.loss.backward()
    assert out.loss.item() == 0.0 and torch.all(out.log_probs == 0)
    assert all(p.grad is None or torch.all(p.grad == 0) for p in model.parameters())


def test_dpo_head_leaves_trls_head_in_charge_without_the_fp32_cast_or_for_logit_transforms(tiny_model_dir):
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    dpo_head.add_fp32_lm_head(plain, cast_lm_head_to_fp32=False)
    capped = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    capped.config.final_logit_softcapping = 30.0
    dpo_head.add_fp32_lm_head(capped, cast_lm_head_to_fp32=True)
    for model in (plain, capped):
        assert model.forward.__func__.__code__.co_filename == utils.__file__
    ours = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    dpo_head.add_fp32_lm_head(ours, cast_lm_head_to_fp32=True)
    assert ours.forward.__func__.__code__.co_filename == dpo_head.__file__
    # a plain forward (generation) is the model's own
    ids, attention, _ = _batch(ours.config.vocab_size)
    assert ours(input_ids=ids, attention_mask=attention).logits.shape == (2, 24, ours.config.vocab_size)
