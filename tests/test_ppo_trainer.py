"""PPOTrainer on tiny Llama models (rlhf.models) with a character-level tokenizer (CPU, seconds)."""

import copy
import math

import pytest
import torch

from ppo import core
from ppo.config import PPOConfig
from char_tokenizer import BOS, build_tiny_tokenizer
from rlhf.models import build_tiny_models
from ppo.trainer import (
    PPOTrainer,
    completion_logits,
    position_ids_from_mask,
    tokenize_prompts,
)

# chat prompts end their user turn with <|im_end|> = EOS = pad: the missing-EOS check must not see it
PROMPTS = [[{"role": "user", "content": f"say {i}"}] for i in range(6)] + [f"raw prompt {i}" for i in range(6)]


def small_config(**overrides) -> PPOConfig:
    kwargs = dict(
        num_steps=2,
        batch_size=4,
        mini_batch_size=2,
        micro_batch_size=1,
        ppo_epochs=2,
        max_new_tokens=8,
        learning_rate=1e-3,
        output_dir="unused",
        seed=0,
    )
    kwargs.update(overrides)
    return PPOConfig(**kwargs)


@pytest.fixture
def tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture
def models(tokenizer):
    # attention dropout on, so that the trainer's dropout switch-off is exercised
    return build_tiny_models(tokenizer, seed=0, attention_dropout=0.1)


def make_trainer(models, tokenizer, **overrides) -> PPOTrainer:
    return PPOTrainer(
        small_config(**overrides),
        models["policy"],
        models["ref"],
        models["reward"],
        models["value"],
        tokenizer,
        PROMPTS,
    )


def snapshot(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_first_rollout_with_policy_equal_to_ref(models, tokenizer):
    trainer = make_trainer(models, tokenizer)
    batch = next(trainer._batches)
    ro = trainer.rollout(batch["prompt_ids"], batch["prompt_mask"], batch["prompt_index"])
    mask = ro.completion_mask
    # policy == pi_ref: KL is exactly 0 at every token, both estimators
    assert torch.equal(ro.kl_k1, torch.zeros_like(ro.kl_k1))
    assert torch.equal(ro.kl_k3, torch.zeros_like(ro.kl_k3))
    # ... and the reward is the score at the last real token, nothing anywhere else
    expected = torch.zeros_like(ro.rewards)
    expected[torch.arange(len(mask)), core.last_real_index(mask)] = ro.penalized_scores
    assert torch.equal(ro.rewards, expected)
    # padding never holds anything
    pad = mask == 0
    for t in (ro.rewards, ro.advantages, ro.returns, ro.values, ro.kl_k1, ro.kl_k3):
        assert torch.equal(t[pad], torch.zeros_like(t[pad]))
    # the completion mask is a prefix mask with at least one real token
    assert (mask.sum(-1) >= 1).all()
    assert torch.equal(mask, mask.cummin(dim=-1).values)


def test_sampling_distribution_is_the_scored_one(models, tokenizer):
    # log-probs recomputed by a forward pass equal the ones generate() sampled from (temperature included,
    # no top-k/top-p): otherwise the KL estimate is biased and can go negative
    with torch.no_grad():
        for p in models["policy"].parameters():
            p.add_(0.05 * torch.randn_like(p))
    trainer = make_trainer(models, tokenizer, temperature=0.7, max_new_tokens=10)
    batch = next(trainer._batches)
    out = trainer.generate(batch["prompt_ids"], batch["prompt_mask"], output_scores=True, return_dict_in_generate=True)
    P = batch["prompt_ids"].shape[1]
    completion = out.sequences[:, P:]
    sampled_lp = torch.log_softmax(torch.stack(out.scores, 1).float(), -1)
    sampled_lp = sampled_lp.gather(-1, completion.unsqueeze(-1)).squeeze(-1)
    mask = core.completion_mask_from_ids(completion, trainer.eos_token_ids)
    ids = torch.cat([batch["prompt_ids"], completion], 1)
    am = torch.cat([batch["prompt_mask"], mask], 1)
    trainer.policy.eval()
    with torch.no_grad():
        logits = completion_logits(trainer.policy, ids, am, position_ids_from_mask(am), completion.shape[1])
    scored_lp = core.logprobs_from_logits(logits, completion, temperature=0.7)
    assert core.masked_mean((sampled_lp - scored_lp).abs(), mask) < 1e-4
    assert torch.where(mask.bool(), (sampled_lp - scored_lp).abs(), 0).max() < 1e-4


def test_two_steps_train_policy_and_value_and_freeze_ref(models, tokenizer):
    ref_before = snapshot(models["ref"])
    rm_before = snapshot(models["reward"])
    policy_before = snapshot(models["policy"])
    value_before = snapshot(models["value"])
    seen = []
    trainer = make_trainer(models, tokenizer, missing_eos_penalty=1.0)
    trainer.callbacks.append(lambda step, metrics: seen.append(step))
    history = trainer.train()

    assert len(history) == 2 and seen == [1, 2]
    for metrics in history:
        for key in (
            "objective/score", "objective/kl_k1", "objective/kl_k3", "loss/policy", "loss/value",
            "policy/clipfrac", "policy/approx_kl", "policy/entropy", "response/length_mean",
        ):  # fmt: skip
            assert key in metrics and math.isfinite(metrics[key]), key
        assert metrics["objective/kl_k3"] >= 0.0
    assert history[0]["objective/kl_k1"] == 0.0  # step 1 samples before any update: policy == ref
    # dropout is off and rollouts are scored in eval mode: the very first minibatch has ratio exactly 1
    assert trainer._first_minibatch_approx_kl < 1e-10

    # policy and value moved; pi_ref and the reward model are bit-identical
    policy_after = trainer.policy.state_dict()
    assert any(not torch.equal(policy_before[k], policy_after[k]) for k in policy_before)
    value_after = trainer.value_model.state_dict()
    assert any(not torch.equal(value_before[k], value_after[k]) for k in value_before)
    for k, v in models["ref"].state_dict().items():
        assert torch.equal(v, ref_before[k]), k
    for k, v in models["reward"].state_dict().items():
        assert torch.equal(v, rm_before[k]), k
    assert not models["ref"].training and not models["reward"].training
    assert all(not p.requires_grad for p in models["ref"].parameters())
    trainer.verify_frozen()


def test_missing_eos_penalty_ignores_the_eos_in_chat_prompts(models, tokenizer):
    penalty = 2.5
    trainer = make_trainer(models, tokenizer, missing_eos_penalty=penalty, max_new_tokens=3, batch_size=12)
    batch = next(trainer._batches)
    eos = tokenizer.eos_token_id
    assert (batch["prompt_ids"] == eos).any(), "chat prompts hold an EOS"
    ro = trainer.rollout(batch["prompt_ids"], batch["prompt_mask"], batch["prompt_index"])
    has_eos = ((ro.completion_ids == eos) & ro.completion_mask.bool()).any(-1)
    assert (~has_eos).any(), "3 random tokens from a 100-token vocab rarely include EOS"
    torch.testing.assert_close(ro.penalized_scores[~has_eos], ro.scores[~has_eos] - penalty)
    torch.testing.assert_close(ro.penalized_scores[has_eos], ro.scores[has_eos])


def test_verify_frozen_detects_a_moved_ref(models, tokenizer):
    trainer = make_trainer(models, tokenizer)
    trainer.verify_frozen()
    with torch.no_grad():
        next(models["ref"].parameters()).view(-1)[0] += 1e-6
    with pytest.raises(RuntimeError, match="pi_ref parameters changed"):
        trainer.verify_frozen()


def test_ref_must_be_a_separate_model(models, tokenizer):
    with pytest.raises(ValueError, match="separate"):
        PPOTrainer(small_config(), models["policy"], models["policy"], models["reward"], models["value"],
                   tokenizer, PROMPTS)  # fmt: skip
    shallow = copy.copy(models["policy"])  # a new object whose parameters are the policy's tensors
    with pytest.raises(ValueError, match="share parameter storage"):
        PPOTrainer(small_config(), models["policy"], shallow, models["reward"], models["value"], tokenizer, PROMPTS)


def test_tokenize_prompts_errors_name_the_row(tokenizer):
    ids = tokenize_prompts(tokenizer, [{"prompt": [{"role": "user", "content": "hi"}]}, "hi"], 64)
    assert ids[0][0] == tokenizer.convert_tokens_to_ids(BOS) and ids[0].count(tokenizer.eos_token_id) == 1
    assert ids[1] == ids[0], "a string prompt is one user message, as reward_model.scoring.render reads it"
    with pytest.raises(ValueError, match="row 1: .*max_prompt_length"):
        tokenize_prompts(tokenizer, ["ok", "x" * 100], 64)  # one token per character here
    with pytest.raises(ValueError, match="row 0, message 0"):
        tokenize_prompts(tokenizer, [[{"role": "user", "content": 3}]], 64)
    with pytest.raises(ValueError, match="row 0: .*assistant"):
        tokenize_prompts(tokenizer, [[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]], 64)
    double = build_tiny_tokenizer()
    double.chat_template = "{{ bos_token }}" + double.chat_template  # the template adds a BOS before its own
    with pytest.raises(ValueError, match="two BOS"):
        tokenize_prompts(double, ["hi"], 64)


def test_one_step_with_gradient_checkpointing(models, tokenizer):
    before = snapshot(models["policy"])
    trainer = make_trainer(models, tokenizer, gradient_checkpointing=True, num_steps=1, ppo_epochs=1)
    (metrics,) = trainer.train()
    assert math.isfinite(metrics["loss/total"])
    after = trainer.policy.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_ppo_score_equals_reward_model_scoring_on_the_same_pair(models, tokenizer):
    # The RM was trained (TRL RewardTrainer) on chat-template renders and is read by transformers' pooling at the
    # last non-pad token of "...<|im_end|>\n". PPO must optimise that same number, not the head at another token.
    from judging.scoring import render, score

    trainer = make_trainer(models, tokenizer)
    eos = tokenizer.eos_token_id
    prompts = [[{"role": "user", "content": "say 1"}], "raw prompt 2"]
    texts = ["hello there", "cut off before the end"]  # the second ran to max_new_tokens: no EOS
    rows = [tokenizer(texts[0])["input_ids"] + [eos, eos, eos], tokenizer(texts[1])["input_ids"]]  # EOS + pads; none
    width = max(map(len, rows))
    completion_ids = torch.tensor([r + [eos] * (width - len(r)) for r in rows])
    completion_mask = core.completion_mask_from_ids(completion_ids, eos)
    assert completion_mask.sum(-1).tolist() == [len(texts[0]) + 1, len(texts[1])]

    padding_side = tokenizer.padding_side
    got = trainer.score_completions(prompts, completion_ids, completion_mask)
    assert tokenizer.padding_side == padding_side, "scoring must not change the tokenizer that gets saved"
    want = score(models["reward"], tokenizer, prompts, texts)
    torch.testing.assert_close(got.double(), torch.as_tensor(want), atol=1e-5, rtol=0)

    # ... and that number is the score head at the final "\n" after <|im_end|> of the full render, one pair alone
    for prompt, text, value in zip(prompts, texts, got.tolist()):
        ids = tokenizer(render(tokenizer, prompt, text), add_special_tokens=False, return_tensors="pt")["input_ids"]
        assert ids[0, -2].item() == eos and tokenizer.decode(ids[0, -1:]) == "\n"
        with torch.no_grad():
            hidden = models["reward"].model(input_ids=ids).last_hidden_state
            direct = models["reward"].score(hidden)[0, -1, 0].item()
        assert abs(direct - value) < 1e-5

    # in a rollout, every row's score is reward_model.scoring.score of (its prompt, its decoded completion)
    from ppo.trainer import decode_completions

    batch = next(trainer._batches)
    ro = trainer.rollout(batch["prompt_ids"], batch["prompt_mask"], batch["prompt_index"])
    decoded = decode_completions(tokenizer, ro.completion_ids, ro.completion_mask)
    want = score(models["reward"], tokenizer, [trainer.prompts[i] for i in ro.prompt_index.tolist()], decoded)
    torch.testing.assert_close(ro.scores.double(), torch.as_tensor(want), atol=1e-5, rtol=0)
    last = core.last_real_index(ro.completion_mask)
    torch.testing.assert_close(ro.rewards[torch.arange(len(last)), last], ro.penalized_scores)  # policy == ref: KL 0


def _grads(trainer):
    return {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters() if p.grad is not None}


def test_accumulated_gradient_is_the_same_at_every_micro_batch_size(models, tokenizer):
    """One mini-batch of 4 completions of 1, 13, 2 and 8 real tokens: the gradient accumulated over micro-batches
    of 1, of 2, and the whole mini-batch at once agree within 1e-6 (the loss is the mini-batch's token mean, each
    micro-batch's summed token loss divided by the mini-batch's 24 tokens). Weighting each micro-batch's token
    mean by its share of sequences, as before, moves them apart by far more than that (checked below)."""
    trainer = make_trainer(models, tokenizer, batch_size=4, mini_batch_size=4, micro_batch_size=4, max_new_tokens=13)
    batch = next(trainer._batches)
    ro = trainer.rollout(batch["prompt_ids"], batch["prompt_mask"], batch["prompt_index"])
    T = ro.completion_ids.shape[1]
    if T < 13:  # every row stopped early: pad the completion so a 13-token row exists
        pad = torch.full((4, 13 - T), tokenizer.eos_token_id)
        ro = ro._replace(**{k: torch.cat([getattr(ro, k), pad.to(getattr(ro, k).dtype)], 1)
                            for k in ("completion_ids", "completion_mask", "logprobs", "ref_logprobs", "values",
                                      "rewards", "kl_k1", "kl_k3", "advantages", "returns")})
    lengths = torch.tensor([1, 13, 2, 8])
    mask = (torch.arange(13)[None, :] < lengths[:, None]).long()
    g = torch.Generator().manual_seed(0)
    ro = ro._replace(
        completion_mask=mask,
        advantages=torch.randn(4, 13, generator=g) * mask,
        returns=torch.randn(4, 13, generator=g) * mask,
        logprobs=ro.logprobs + 0.3 * torch.randn(4, 13, generator=g),  # ratios off 1, some clipped
    )
    assert int(mask.sum()) == 24
    trainer.model.train()
    grads, stats = {}, {}
    for micro in (1, 2, 4):
        trainer.config.micro_batch_size = micro
        trainer.optimizer.zero_grad(set_to_none=True)
        stats[micro] = trainer.accumulate_minibatch(ro, torch.arange(4))
        grads[micro] = _grads(trainer)
    assert grads[4].keys() == grads[1].keys() and len(grads[4]) > 0
    norm = math.sqrt(sum(float(v.pow(2).sum()) for v in grads[4].values()))
    assert norm > 1e-3, "a non-trivial gradient"
    for micro in (1, 2):
        diff = max(float((grads[micro][k] - grads[4][k]).abs().max()) for k in grads[4])
        print(f"micro-batch {micro} vs the whole mini-batch: max |grad diff| {diff:.3g}")
        assert diff <= 1e-6, (micro, diff)
        for key in ("loss/policy", "loss/value", "loss/total", "policy/clipfrac", "policy/approx_kl"):
            assert abs(stats[micro][key] - stats[4][key]) <= 1e-6, (micro, key)
    assert stats[4]["policy/clipfrac"] > 0, "ratios off 1: the clipped branch is exercised"

    # the old weighting (each micro-batch's token mean x its share of the sequences) at micro-batch 1
    trainer.optimizer.zero_grad(set_to_none=True)
    ids, am = ro.input_ids, ro.attention_mask
    pos = position_ids_from_mask(am)
    for i in range(4):
        logits, values = trainer.model(ids[i : i + 1], am[i : i + 1], pos[i : i + 1], 13)
        lp = core.logprobs_from_logits(logits, ro.completion_ids[i : i + 1])
        pl = core.ppo_policy_loss(lp, ro.logprobs[i : i + 1], ro.advantages[i : i + 1], mask[i : i + 1], 0.2)
        vl = core.ppo_value_loss(values, ro.values[i : i + 1], ro.returns[i : i + 1], mask[i : i + 1], 0.2)
        ((pl.loss + 0.1 * vl.loss) / 4).backward()
    sequence_weighted = _grads(trainer)
    gap = math.sqrt(sum(float((sequence_weighted[k] - grads[4][k]).pow(2).sum()) for k in grads[4])) / norm
    print(f"sequence-weighted micro-batches of 1: gradient {100 * gap:.0f}% off the token mean")
    assert gap > 0.1, gap


def test_the_mini_batch_gradient_on_two_processes_equals_one_process(tmp_path):
    """DDP (2 CPU processes, gloo; tests/ppo_ddp_grads.py): rank 0 holds the completions of 1 and 13 tokens, rank 1
    those of 2 and 8. Each divides its summed token loss by the all-reduced mini-batch count over the processes
    (24 / 2), DDP averages: the gradient equals the 1-process gradient of the same 4 completions within 1e-6.
    (Dividing by each rank's own count, 14 and 10, would weight rank 1's tokens 1.4 times rank 0's.)"""
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
           "WANDB_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    env.pop("RLHF_EXPECTED_WORLD_SIZE", None)
    grads = {}
    for nproc in (1, 2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        out = tmp_path / f"grads-{nproc}.pt"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_addr",
               "127.0.0.1", "--master_port", str(port), str(root / "tests" / "ppo_ddp_grads.py"), str(out)]
        done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        grads[nproc] = torch.load(out)
    assert grads[1].keys() == grads[2].keys() and len(grads[1]) > 0
    norm = math.sqrt(sum(float(v.pow(2).sum()) for v in grads[1].values()))
    diff = max(float((grads[2][k] - grads[1][k]).abs().max()) for k in grads[1])
    print(f"2 processes vs 1: max |grad diff| {diff:.3g} (gradient norm {norm:.3g})")
    assert norm > 1e-3 and diff <= 1e-6
