"""ppo.core against hand-worked numbers (the arithmetic is in the comments)."""

import math

import pytest
import torch

from ppo import core

LN2 = math.log(2.0)
NAN = float("nan")


def close(actual, expected, tol=1e-5):
    torch.testing.assert_close(torch.as_tensor(actual, dtype=torch.float32),
                               torch.as_tensor(expected, dtype=torch.float32), atol=tol, rtol=0)  # fmt: skip


# ---- log-probs and entropy -----------------------------------------------------------------------


def test_logprobs_from_logits_hand_values():
    # logits [0, 0, ln 2] -> exp [1, 1, 2] / 4 -> probs [1/4, 1/4, 1/2]
    logits = torch.tensor([[[0.0, 0.0, LN2], [0.0, 0.0, LN2]]])  # (B=1, T=2, V=3)
    labels = torch.tensor([[2, 0]])
    close(core.logprobs_from_logits(logits, labels), [[math.log(0.5), math.log(0.25)]])
    # temperature 2: logits / 2 = [0, 0, ln2 / 2] -> exp [1, 1, sqrt 2] -> p(2) = sqrt2 / (2 + sqrt2) = 0.414214
    close(core.logprobs_from_logits(logits, labels, temperature=2.0)[0, 0], math.log(0.414214))


def test_entropy_from_logits_hand_values():
    # uniform over 4 -> ln 4 = 1.386294;  [1/4, 1/4, 1/2] -> 0.5 ln 4 + 0.5 ln 2 = 1.039721
    close(core.entropy_from_logits(torch.zeros(1, 1, 4)), [[1.386294]])
    close(core.entropy_from_logits(torch.tensor([[[0.0, 0.0, LN2]]])), [[1.039721]])


# ---- masks and reductions ------------------------------------------------------------------------


def test_masked_mean_ignores_padding_even_nan():
    x = torch.tensor([[1.0, 2.0, NAN], [4.0, float("inf"), 6.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 1]])
    # (1 + 2 + 4 + 6) / 4 = 3.25;  per row: 1.5 and 5
    close(core.masked_mean(x, mask), 3.25)
    close(core.masked_mean(x, mask, dim=-1), [1.5, 5.0])
    close(core.masked_sum(x, mask, dim=-1), [3.0, 10.0])


def test_masked_whiten_hand_values():
    # real [1, 2, 3]: mean 2, unbiased var (1 + 0 + 1) / 2 = 1 -> [-1, 0, 1]; padding stays 0
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    close(core.masked_whiten(x, mask), [[-1.0, 0.0, 1.0, 0.0]])
    # shift_mean=False keeps the mean: [1, 2, 3]
    close(core.masked_whiten(x, mask, shift_mean=False), [[1.0, 2.0, 3.0, 0.0]])


def test_completion_mask_pad_equals_eos():
    EOS = 0  # pad == eos, as in SmolLM2: generate writes EOS after the first EOS
    ids = torch.tensor([
        [5, 6, EOS, EOS, EOS],   # ended at position 2; positions 3-4 are pads that look like EOS
        [5, 6, 7, 8, 9],         # truncated at max_new_tokens: all real
        [EOS, EOS, EOS, EOS, EOS],  # ended at once: only the first EOS is real
    ])  # fmt: skip
    mask = core.completion_mask_from_ids(ids, EOS)
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]
    assert core.last_real_index(mask).tolist() == [2, 4, 0]
    # several stop ids
    assert core.completion_mask_from_ids(torch.tensor([[5, 9, 6, 0]]), [0, 9]).tolist() == [[1, 1, 0, 0]]


def test_last_real_index_rejects_empty_row():
    with pytest.raises(ValueError, match="no real"):
        core.last_real_index(torch.tensor([[1, 0], [0, 0]]))


# ---- KL ------------------------------------------------------------------------------------------


def test_per_token_kl_hand_values():
    # pi = 1/2, pi_ref = 1/4:  k1 = ln(1/2) - ln(1/4) = ln 2 = 0.693147
    # r = pi_ref / pi = 1/2:   k3 = (r - 1) - ln r = -0.5 + 0.693147 = 0.193147
    # pi = 1/4, pi_ref = 1/2:  k1 = -ln 2 = -0.693147 (a single token can be negative);
    #                          r = 2: k3 = 1 - ln 2 = 0.306853 (never negative)
    lp = torch.tensor([[math.log(0.5), math.log(0.25), 7.0]])
    ref = torch.tensor([[math.log(0.25), math.log(0.5), NAN]])
    mask = torch.tensor([[1, 1, 0]])  # the pad holds garbage, it must give 0
    close(core.per_token_kl(lp, ref, mask, "k1"), [[0.693147, -0.693147, 0.0]])
    close(core.per_token_kl(lp, ref, mask, "k3"), [[0.193147, 0.306853, 0.0]])
    with pytest.raises(ValueError):
        core.per_token_kl(lp, ref, mask, "k2")


def test_k3_is_non_negative_and_both_zero_when_policy_is_ref():
    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(4, 7, generator=g) * 5
    ref = -torch.rand(4, 7, generator=g) * 5
    mask = torch.ones(4, 7, dtype=torch.long)
    assert (core.per_token_kl(lp, ref, mask, "k3") >= 0).all()
    assert (core.per_token_kl(lp, lp.clone(), mask, "k1") == 0).all()
    assert (core.per_token_kl(lp, lp.clone(), mask, "k3") == 0).all()


# ---- rewards -------------------------------------------------------------------------------------


def test_compute_rewards_hand_values():
    # k1 = [-1 - -1.5, -2 - -2, -0.5 - -1] = [0.5, 0, 0.5];  -0.1 * k1 = [-0.05, 0, -0.05]
    # score 1.0 goes to the last real token (index 2): rewards = [-0.05, 0, 0.95, 0]
    score = torch.tensor([1.0])
    lp = torch.tensor([[-1.0, -2.0, -0.5, 0.0]])
    ref = torch.tensor([[-1.5, -2.0, -1.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    out = core.compute_rewards(score, lp, ref, mask, kl_coef=0.1)
    close(out.rewards, [[-0.05, 0.0, 0.95, 0.0]])
    close(out.kl, [[0.5, 0.0, 0.5, 0.0]])
    close(out.non_score_reward, [[-0.05, 0.0, -0.05, 0.0]])


def test_rewards_are_score_at_last_token_only_when_policy_is_ref():
    scores = torch.tensor([0.7, -1.3])
    lp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.1, NAN]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    same = core.compute_rewards(scores, lp, lp.clone(), mask, kl_coef=0.5)
    assert torch.equal(same.kl, torch.zeros(2, 3))
    assert torch.equal(same.rewards, torch.tensor([[0.0, 0.0, 0.7], [0.0, -1.3, 0.0]]))
    # ... and only then: a different ref adds a KL term at every real token
    other = core.compute_rewards(scores, lp, lp - 0.1, mask, kl_coef=0.5)
    close(other.rewards, [[-0.05, -0.05, 0.65], [-0.05, -1.35, 0.0]])


def test_missing_eos_penalty_looks_only_in_the_completion():
    EOS, PAD = 0, 0
    # prompt: "<|im_start|> u s e r <|im_end|> <|im_start|> a" holds an EOS (end of the user turn)
    prompt = torch.tensor([[1, 30, 31, EOS, 1, 40]])
    completion = torch.tensor([
        [50, 51, 52, 53],    # ran to max_new_tokens: no EOS -> penalised
        [50, EOS, PAD, PAD], # ended -> kept
    ])  # fmt: skip
    full = torch.cat([prompt.expand(2, -1), completion], dim=1)
    assert full[0].eq(EOS).any(), "the prompt holds an EOS: searching the whole sequence would excuse row 0"
    mask = core.completion_mask_from_ids(completion, EOS)
    scores = torch.tensor([2.0, 2.0])
    close(core.missing_eos_penalty(scores, completion, mask, EOS, penalty=1.5), [0.5, 2.0])
    # an EOS id at a masked (padding) position does not count either
    close(core.missing_eos_penalty(scores[:1], torch.tensor([[50, EOS]]), torch.tensor([[1, 0]]), EOS, 1.5), [0.5])
    with pytest.raises(ValueError):
        core.missing_eos_penalty(scores, completion, mask, EOS, penalty=-1.0)


def test_adaptive_kl_coef_hand_values():
    # KL 12 vs target 6: error = clip(12 / 6 - 1, -0.2, 0.2) = 0.2; beta = 0.1 * (1 + 0.2 * 256 / 10000) = 0.100512
    close(core.adaptive_kl_coef(0.1, 12.0, 6.0, n_steps=256, horizon=10000), 0.100512, tol=1e-9)
    # KL 3 vs target 6: error = -0.5 -> clipped to -0.2; beta = 0.1 * (1 - 0.2 * 0.0256) = 0.099488
    close(core.adaptive_kl_coef(0.1, 3.0, 6.0, n_steps=256, horizon=10000), 0.099488, tol=1e-9)


# ---- GAE -----------------------------------------------------------------------------------------


def test_gae_three_tokens_gamma_1_lam_095():
    # rewards [-0.05, 0, 0.95] (from test_compute_rewards_hand_values), values [0.5, 0.6, 0.7], gamma 1, lam 0.95
    # t=2: delta = 0.95 + 1 * 0 (after the last real token) - 0.7 = 0.25;   A2 = 0.25
    # t=1: delta = 0 + 0.7 - 0.6 = 0.1;                                        A1 = 0.1 + 0.95 * 0.25 = 0.3375
    # t=0: delta = -0.05 + 0.6 - 0.5 = 0.05;                                   A0 = 0.05 + 0.95 * 0.3375 = 0.370625
    # returns = A + V = [0.870625, 0.9375, 0.95]; the pad (reward 5, value 9 garbage) gives 0
    rewards = torch.tensor([[-0.05, 0.0, 0.95, 5.0]])
    values = torch.tensor([[0.5, 0.6, 0.7, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    adv, ret = core.gae(rewards, values, mask, gamma=1.0, lam=0.95)
    close(adv, [[0.370625, 0.3375, 0.25, 0.0]])
    close(ret, [[0.870625, 0.9375, 0.95, 0.0]])


def test_gae_lambda_limits_and_discount():
    rewards = torch.tensor([[-0.05, 0.0, 0.95]])
    values = torch.tensor([[0.5, 0.6, 0.7]])
    mask = torch.ones(1, 3)
    # lam = 1, gamma = 1: returns are the rewards-to-go [0.9, 0.95, 0.95] (Monte Carlo)
    _, ret = core.gae(rewards, values, mask, gamma=1.0, lam=1.0)
    close(ret, [[0.9, 0.95, 0.95]])
    # lam = 0: A_t = delta_t = [0.05, 0.1, 0.25] (TD(0))
    adv, _ = core.gae(rewards, values, mask, gamma=1.0, lam=0.0)
    close(adv, [[0.05, 0.1, 0.25]])
    # gamma 0.9, lam 0.5, rewards [0, 1], values [0, 0]: A1 = 1; A0 = 0 + 0.9 * 0 - 0 + 0.9 * 0.5 * 1 = 0.45
    adv, ret = core.gae(torch.tensor([[0.0, 1.0]]), torch.zeros(1, 2), torch.ones(1, 2), gamma=0.9, lam=0.5)
    close(adv, [[0.45, 1.0]])
    close(ret, [[0.45, 1.0]])


def test_gae_padding_never_contributes():
    mask = torch.tensor([[1, 1, 0, 0]])
    a1, r1 = core.gae(torch.tensor([[0.1, 1.0, 0.0, 0.0]]), torch.tensor([[0.2, 0.3, 0.0, 0.0]]), mask, 1.0, 0.95)
    a2, r2 = core.gae(torch.tensor([[0.1, 1.0, 7.0, NAN]]), torch.tensor([[0.2, 0.3, -4.0, NAN]]), mask, 1.0, 0.95)
    assert torch.equal(a1, a2) and torch.equal(r1, r2)


# ---- losses --------------------------------------------------------------------------------------


def test_ppo_policy_loss_hand_values():
    # eps = 0.2
    # tok 0: ratio 1.5, A = +1: unclipped -1.5, clipped -1.2 -> max -1.2 (clipped)
    # tok 1: ratio 0.5, A = +1: unclipped -0.5, clipped -0.8 -> max -0.5 (unclipped, the pessimistic one)
    # tok 2: ratio 0.5, A = -1: unclipped  0.5, clipped  0.8 -> max  0.8 (clipped)
    # tok 3: padding (garbage)
    # loss = (-1.2 - 0.5 + 0.8) / 3 = -0.3;  clipfrac = 2 / 3
    # approx_kl = 0.5 * (ln1.5^2 + 2 ln0.5^2) / 3 = 0.5 * (0.164402 + 2 * 0.480453) / 3 = 0.187551
    # ratio mean = (1.5 + 0.5 + 0.5) / 3 = 0.833333
    old = torch.zeros(1, 4)
    lp = torch.tensor([[math.log(1.5), math.log(0.5), math.log(0.5), 50.0]], requires_grad=True)
    adv = torch.tensor([[1.0, 1.0, -1.0, NAN]])
    mask = torch.tensor([[1, 1, 1, 0]])
    out = core.ppo_policy_loss(lp, old, adv, mask, cliprange=0.2)
    close(out.loss, -0.3)
    close(out.clipfrac, 2 / 3)
    close(out.approx_kl, 0.187551)
    close(out.ratio, 0.833333)
    out.loss.backward()
    # only the unclipped token 1 has a gradient: d/dlp (-A * exp(lp)) / 3 = -1 * 0.5 / 3
    close(lp.grad, [[0.0, -0.5 / 3, 0.0, 0.0]])


def test_ppo_policy_loss_at_ratio_one_is_minus_mean_advantage():
    lp = torch.tensor([[-1.0, -2.0, -3.0]])
    adv = torch.tensor([[0.5, -1.0, 2.0]])
    out = core.ppo_policy_loss(lp, lp.clone(), adv, torch.ones(1, 3), cliprange=0.2)
    close(out.loss, -(0.5 - 1.0 + 2.0) / 3)
    close(out.clipfrac, 0.0)
    close(out.approx_kl, 0.0)


def test_ppo_value_loss_hand_values():
    # eps_v = 0.2
    # tok 0: old 0, V 0.5, R 1: V_clip 0.2; (0.5-1)^2 = 0.25, (0.2-1)^2 = 0.64 -> 0.64 (clipped)
    # tok 1: old 0, V 0.1, R 1: V_clip 0.1; 0.81, 0.81 -> 0.81 (not clipped: equal)
    # tok 2: old 1, V 0.5, R 0: V_clip 0.8; 0.25, 0.64 -> 0.64 (clipped)
    # loss = 0.5 * (0.64 + 0.81 + 0.64) / 3 = 0.348333;  clipfrac = 2 / 3
    values = torch.tensor([[0.5, 0.1, 0.5, 3.0]])
    old = torch.tensor([[0.0, 0.0, 1.0, -3.0]])
    returns = torch.tensor([[1.0, 1.0, 0.0, NAN]])
    mask = torch.tensor([[1, 1, 1, 0]])
    values.requires_grad_(True)
    out = core.ppo_value_loss(values, old, returns, mask, cliprange_value=0.2)
    close(out.loss, 0.348333)
    close(out.clipfrac, 2 / 3)
    out.loss.backward()
    # only the unclipped token 1 has a gradient: 0.5 * 2 * (0.1 - 1) / 3 = -0.3; the pad's NaN return gives 0
    close(values.grad, [[0.0, -0.3, 0.0, 0.0]])


def test_losses_of_micro_batches_add_up_to_the_token_mean_of_the_mini_batch():
    # A mini-batch of two completions, 1 and 8 real tokens (9 in all), ratio 1 (log pi = log pi_old).
    # Advantages: row 0 A = +2 (its one token), row 1 A = -0.5 at each of its 8 tokens.
    # Per-token policy loss at ratio 1 is -A: row 0 sums to -2, row 1 to +4; token mean over the mini-batch
    # (-2 + 4) / 9 = 0.222222. Micro-batches of one row each, divided by the mini-batch's 9 tokens:
    # -2/9 + 4/9 = 2/9, the same. Weighting each micro-batch's own token mean by its share of sequences (the old
    # behaviour) gives 0.5 * -2 + 0.5 * 0.5 = -0.75: the 1-token completion weighs 8 times as much per token.
    # Value loss with V = V_old = 0, R = 3 (row 0) and 1 (row 1), no clipping in play: 0.5 * (9 + 8 * 1) / 9 =
    # 0.944444; per row 0.5 * 9 / 9 + 0.5 * 8 / 9; sequence-weighted 0.5 * 4.5 + 0.5 * 0.5 = 2.5.
    mask = torch.tensor([[1, 0, 0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1]])
    adv = torch.tensor([[2.0] + [NAN] * 7, [-0.5] * 8])
    old = torch.full((2, 8), -1.0)
    values = torch.zeros(2, 8)
    returns = torch.tensor([[3.0] + [NAN] * 7, [1.0] * 8])

    lp = old.clone().requires_grad_(True)
    whole = core.ppo_policy_loss(lp, old, adv, mask, cliprange=0.2)
    close(whole.loss, 2 / 9)
    whole.loss.backward()
    # d/dlp of -A * ratio / 9 at ratio 1: -A / 9 at every real token, 0 at padding
    close(lp.grad, [[-2 / 9] + [0.0] * 7, [0.5 / 9] * 8])

    lp_micro = old.clone().requires_grad_(True)
    parts = [core.ppo_policy_loss(lp_micro[i : i + 1], old[i : i + 1], adv[i : i + 1], mask[i : i + 1], 0.2,
                                  num_tokens=9) for i in range(2)]
    close(parts[0].loss, -2 / 9)
    close(parts[1].loss, 4 / 9)
    (parts[0].loss + parts[1].loss).backward()
    torch.testing.assert_close(lp_micro.grad, lp.grad, atol=1e-7, rtol=0)
    old_weighting = sum(0.5 * core.ppo_policy_loss(old[i : i + 1], old[i : i + 1], adv[i : i + 1], mask[i : i + 1],
                                                    0.2).loss for i in range(2))
    close(old_weighting, -0.75)

    close(core.ppo_value_loss(values, values, returns, mask, 0.2).loss, 17 / 18)
    rows = [core.ppo_value_loss(values[i : i + 1], values[i : i + 1], returns[i : i + 1], mask[i : i + 1], 0.2,
                                num_tokens=9).loss for i in range(2)]
    close(rows[0], 0.5)
    close(rows[1], 4 / 9)
    close(rows[0] + rows[1], 17 / 18)
    with pytest.raises(ValueError, match="num_tokens must be > 0"):
        core.ppo_policy_loss(lp, old, adv, mask, 0.2, num_tokens=0)
