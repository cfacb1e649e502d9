"""Pure tensor math of classic RLHF PPO. No models, no I/O: every function is tested against hand-worked numbers.

Sources:
    - PPO, clipped surrogate objective (eq. 7) and value clipping: Schulman et al. 2017,
      "Proximal Policy Optimization Algorithms", https://arxiv.org/abs/1707.06347
    - GAE: Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized Advantage
      Estimation", https://arxiv.org/abs/1506.02438 (eq. 16)
    - Per-token KL penalty against a frozen reference, reward model score added at the last token,
      adaptive KL coefficient: Ziegler et al. 2019, "Fine-Tuning Language Models from Human Preferences",
      https://arxiv.org/abs/1909.08593 (sec. 2.2); Ouyang et al. 2022, "Training language models to
      follow instructions with human feedback", https://arxiv.org/abs/2203.02155 (eq. 2).
    - KL estimators k1 / k3: J. Schulman 2020, "Approximating KL Divergence",
      http://joschu.net/blog/kl-approx.html

Conventions (shapes):
    B: batch size, T: completion length (generated tokens, right-padded after the first EOS), V: vocab size.
    ``mask`` is a (B, T) 0/1 (or bool) *position* mask: 1 for real completion tokens, 0 for padding.
    Padding is always identified by position (the mask), never by token id: with pad == eos (SmolLM2) the
    final EOS is a real token and the pads after it are not.
    Every function returns exactly 0 at masked positions, and a NaN/inf at a masked position never leaks
    into a result (``torch.where``, not multiplication by the mask).
"""

from __future__ import annotations

from typing import Literal, NamedTuple, Sequence

import torch

KLEstimator = Literal["k1", "k3"]


# --------------------------------------------------------------------------------------------------
# masks and reductions
# --------------------------------------------------------------------------------------------------


def _bool(mask: torch.Tensor) -> torch.Tensor:
    return mask if mask.dtype == torch.bool else mask != 0


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``x`` over positions where ``mask`` is set. Shapes: x, mask (..., T) -> scalar or reduced over dim."""
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    masked = torch.where(_bool(mask), x, zero)
    return masked.sum() if dim is None else masked.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` over positions where ``mask`` is set; padding (even NaN) never contributes.

    Shapes: x, mask (B, T) -> scalar (dim=None) or (B,) (dim=-1). A fully masked row has mean 0.
    """
    count = _bool(mask).sum() if dim is None else _bool(mask).sum(dim=dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1).to(x.dtype)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``x`` over masked positions (Bessel-corrected if ``unbiased``). Shapes: (B, T) -> scalar."""
    n = _bool(mask).sum()
    if n == 0:
        raise ValueError("masked_var: the mask selects no position")
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    if unbiased:
        if n < 2:
            raise ValueError("masked_var: an unbiased variance needs at least 2 masked positions")
        var = var * n / (n - 1)
    return var


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """Normalise ``x`` to unit variance over masked positions (zero mean if ``shift_mean``); 0 at padding.

    Shapes: x, mask (B, T) -> (B, T). ``shift_mean=False`` keeps the original mean (TRL's convention).
    """
    mean = masked_mean(x, mask)
    var = masked_var(x, mask)
    whitened = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(_bool(mask), whitened, torch.zeros_like(whitened))


def completion_mask_from_ids(completion_ids: torch.Tensor, eos_token_ids: int | Sequence[int]) -> torch.Tensor:
    """Position mask of a generated completion: 1 up to and including the first EOS, 0 after it.

    Shapes: completion_ids (B, T) -> (B, T) long. A row without EOS (truncated at max_new_tokens) is all 1.
    Only *completion* ids may be passed here (never prompt + completion): an EOS inside the prompt (a chat
    template's end-of-turn) must not end the completion. With pad == eos the pads that ``generate`` writes
    after the first EOS are masked by their position, the first EOS itself stays a real token.
    """
    eos = torch.as_tensor(
        [eos_token_ids] if isinstance(eos_token_ids, int) else list(eos_token_ids), device=completion_ids.device
    )
    is_eos = torch.isin(completion_ids, eos)
    # number of EOS strictly before position t; a position is real while that number is 0
    eos_before = torch.cumsum(is_eos.long(), dim=-1) - is_eos.long()
    return (eos_before == 0).long()


def last_real_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of the last real (mask == 1) position of each row. Shapes: (B, T) -> (B,) long.

    Raises if a row has no real position (a zero-length completion would put the reward nowhere).
    """
    m = _bool(mask)
    if not bool(m.any(dim=-1).all()):
        raise ValueError("last_real_index: a row has no real (unmasked) position")
    positions = torch.arange(m.shape[-1], device=m.device).expand_as(m)
    return torch.where(m, positions, torch.full_like(positions, -1)).max(dim=-1).values


# --------------------------------------------------------------------------------------------------
# log-probabilities, entropy, KL
# --------------------------------------------------------------------------------------------------


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / temperature) at ``labels``. Shapes: logits (B, T, V), labels (B, T) -> (B, T) float32.

    Uses logit[label] - logsumexp(logits) so that no (B, T, V) log-softmax is materialised. The temperature
    must be the sampling temperature, so that the log-probs are those of the distribution that was sampled.
    """
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    picked = torch.gather(logits, dim=-1, index=labels.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of softmax(logits / temperature) per position. Shapes: (B, T, V) -> (B, T) float32.

    H = logsumexp(z) - sum_v softmax(z)_v z_v.
    """
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def per_token_kl(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    estimator: KLEstimator = "k1",
) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) at tokens sampled from pi; 0 at padding.

    Shapes: logprobs, ref_logprobs, mask (B, T) -> (B, T).

    With log r = ref_logprobs - logprobs (Schulman 2020):
        k1 = -log r = logprobs - ref_logprobs       unbiased, a single token can be negative
        k3 = (r - 1) - log r                          unbiased, >= 0 at every token (log x <= x - 1)
    Both are >= 0 only in expectation over samples of pi: a negative batch mean of k1 beyond noise
    means the samples did not come from pi (top-k/top-p, a temperature mismatch) or padding leaked in.
    """
    delta = logprobs.float() - ref_logprobs.float()
    if estimator == "k1":
        kl = delta
    elif estimator == "k3":
        log_r = -delta
        kl = torch.expm1(log_r) - log_r
    else:
        raise ValueError(f"per_token_kl: unknown estimator {estimator!r}; expected 'k1' or 'k3'")
    return torch.where(_bool(mask), kl, torch.zeros_like(kl))


# --------------------------------------------------------------------------------------------------
# rewards
# --------------------------------------------------------------------------------------------------


class Rewards(NamedTuple):
    """Output of :func:`compute_rewards`. All (B, T), 0 at padding."""

    rewards: torch.Tensor  #: -kl_coef * kl at every real token, + score at the last real token
    kl: torch.Tensor  #: the per-token KL estimate that was penalised
    non_score_reward: torch.Tensor  #: -kl_coef * kl


def compute_rewards(
    score: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    kl_coef: float,
    estimator: KLEstimator = "k1",
) -> Rewards:
    """Per-token RLHF reward (Ziegler et al. 2019 sec. 2.2; Ouyang et al. 2022 eq. 2).

        r_t = -kl_coef * KL_t                       for every real completion token t
        r_T += score                                 at T = the last real (non-pad) token, by position

    Shapes: score (B,), logprobs/ref_logprobs/mask (B, T) -> :class:`Rewards` of (B, T) tensors.
    When policy == pi_ref, KL_t = 0 and the reward is the score at the last real token only.
    """
    kl = per_token_kl(logprobs, ref_logprobs, mask, estimator)
    non_score = -kl_coef * kl
    last = last_real_index(mask)
    rows = torch.arange(score.shape[0], device=score.device)
    rewards = non_score.clone()
    rewards[rows, last] += score.to(rewards.dtype)
    return Rewards(rewards=rewards, kl=kl, non_score_reward=non_score)


def missing_eos_penalty(
    scores: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    eos_token_ids: int | Sequence[int],
    penalty: float,
) -> torch.Tensor:
    """Subtract ``penalty`` (>= 0) from the score of every completion that has no EOS among its real tokens.

    Shapes: scores (B,), completion_ids (B, T), completion_mask (B, T) -> (B,).
    Takes the *completion* tokens only, by design: chat prompts end their turns with the same token
    (``<|im_end|>`` is SmolLM2's EOS and pad), so an EOS found in the prompt must never excuse a completion
    that ran to max_new_tokens. Padding positions are ignored by the mask.
    """
    if penalty < 0:
        raise ValueError(f"missing_eos_penalty: penalty must be >= 0 (it is subtracted), got {penalty}")
    eos = torch.as_tensor(
        [eos_token_ids] if isinstance(eos_token_ids, int) else list(eos_token_ids), device=completion_ids.device
    )
    has_eos = (torch.isin(completion_ids, eos) & _bool(completion_mask)).any(dim=-1)
    return torch.where(has_eos, scores, scores - penalty)


def adaptive_kl_coef(kl_coef: float, current_kl: float, target_kl: float, n_steps: int, horizon: int) -> float:
    """Ziegler et al. 2019 adaptive KL controller (sec. 2.2): a proportional controller on log(beta).

        e = clip(KL / KL_target - 1, -0.2, 0.2);   beta <- beta * (1 + e * n_steps / horizon)
    """
    error = min(max(current_kl / target_kl - 1.0, -0.2), 0.2)
    return kl_coef * (1.0 + error * n_steps / horizon)


# --------------------------------------------------------------------------------------------------
# advantages
# --------------------------------------------------------------------------------------------------


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised Advantage Estimation (Schulman et al. 2016, eq. 16). Returns (advantages, returns).

    Shapes: rewards, values, mask (B, T) -> advantages (B, T), returns (B, T); both 0 at padding.

        delta_t = r_t + gamma * V_{t+1} - V_t          (V_{T} = 0 after the last real token)
        A_t     = delta_t + gamma * lam * A_{t+1}
        R_t     = A_t + V_t                             (the value target)

    ``mask`` must be a prefix mask (real tokens, then padding), which completion masks are. Rewards and
    values at padding are zeroed before the recursion, so padding never contributes. Advantages are
    returned raw; whiten them with :func:`masked_whiten` if wanted.
    """
    m = _bool(mask)
    zero = torch.zeros((), dtype=torch.float32, device=rewards.device)
    r = torch.where(m, rewards.float(), zero)
    v = torch.where(m, values.float(), zero)
    T = r.shape[-1]
    last = torch.zeros_like(r[:, 0])
    out = []
    for t in reversed(range(T)):
        next_v = v[:, t + 1] if t + 1 < T else torch.zeros_like(v[:, t])
        delta = r[:, t] + gamma * next_v - v[:, t]
        last = delta + gamma * lam * last
        last = torch.where(m[:, t], last, zero)
        out.append(last)
    advantages = torch.stack(out[::-1], dim=-1)
    returns = torch.where(m, advantages + v, zero)
    return advantages, returns


# --------------------------------------------------------------------------------------------------
# losses
# --------------------------------------------------------------------------------------------------


def _token_loss(per_token: torch.Tensor, mask: torch.Tensor, num_tokens: float | torch.Tensor | None) -> torch.Tensor:
    """Sum of ``per_token`` over real tokens divided by ``num_tokens`` (None: their number, i.e. the token mean)."""
    if num_tokens is None:
        return masked_mean(per_token, mask)
    if float(num_tokens) <= 0:
        raise ValueError(f"num_tokens must be > 0 (the mini-batch's real tokens), got {float(num_tokens)}")
    return masked_sum(per_token, mask) / torch.as_tensor(num_tokens, dtype=per_token.dtype, device=per_token.device)


class PolicyLoss(NamedTuple):
    loss: torch.Tensor  #: scalar, differentiable
    clipfrac: torch.Tensor  #: share of real tokens where the clipped term was the active one
    approx_kl: torch.Tensor  #: 0.5 * mean (log pi - log pi_old)^2, the KL between old and new policy
    ratio: torch.Tensor  #: mean probability ratio pi / pi_old


class ValueLoss(NamedTuple):
    loss: torch.Tensor  #: scalar, differentiable
    clipfrac: torch.Tensor  #: share of real tokens where the clipped value gave the larger error


def ppo_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cliprange: float,
    num_tokens: float | torch.Tensor | None = None,
) -> PolicyLoss:
    """Clipped surrogate loss (Schulman et al. 2017, eq. 7), as a loss to minimise.

        ratio = exp(log pi - log pi_old)
        L     = sum_t max(-A_t * ratio, -A_t * clip(ratio, 1 - eps, 1 + eps)) / num_tokens

    Shapes: logprobs, old_logprobs, advantages, mask (B, T) -> :class:`PolicyLoss` of scalars.
    The sum is over real tokens of the batch, padding never contributes. ``num_tokens`` (a count, > 0) is the
    denominator: None = the real tokens of this batch (its token mean). A micro-batch of a larger mini-batch passes
    the *mini-batch's* token count, so that the accumulated losses are the mini-batch's token mean whatever the
    micro-batch split (verl ``agg_loss`` "token-mean"; verl #5625 is the bug of dividing per micro-batch). The
    statistics (clipfrac, approx_kl, ratio) are always means over this batch's real tokens.
    """
    # padding is zeroed *before* the arithmetic, so that a NaN/inf there reaches neither the loss nor the
    # gradient (torch.where after the fact would still backpropagate 0 * NaN = NaN)
    m = _bool(mask)
    log_ratio = torch.where(m, logprobs - old_logprobs, torch.zeros_like(logprobs))
    advantages = torch.where(m, advantages, torch.zeros_like(advantages))
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange)
    loss = _token_loss(torch.maximum(unclipped, clipped), mask, num_tokens)
    with torch.no_grad():
        clipfrac = masked_mean((clipped > unclipped).float(), mask)
        approx_kl = 0.5 * masked_mean(log_ratio.detach() ** 2, mask)
        ratio_mean = masked_mean(ratio.detach(), mask)
    return PolicyLoss(loss=loss, clipfrac=clipfrac, approx_kl=approx_kl, ratio=ratio_mean)


def ppo_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    cliprange_value: float,
    num_tokens: float | torch.Tensor | None = None,
) -> ValueLoss:
    """Clipped value loss (Schulman et al. 2017; OpenAI baselines ppo2), as a loss to minimise.

        V_clip = V_old + clip(V - V_old, -eps_v, eps_v)
        L      = 0.5 * sum_t max((V - R)^2, (V_clip - R)^2) / num_tokens

    Shapes: values, old_values, returns, mask (B, T) -> :class:`ValueLoss` of scalars. ``num_tokens`` as in
    :func:`ppo_policy_loss` (None: this batch's real tokens, the token mean).
    """
    m = _bool(mask)
    values = torch.where(m, values, torch.zeros_like(values))  # see ppo_policy_loss: padding zeroed first
    old_values = torch.where(m, old_values, torch.zeros_like(old_values))
    returns = torch.where(m, returns, torch.zeros_like(returns))
    values_clipped = old_values + torch.clamp(values - old_values, -cliprange_value, cliprange_value)
    err_unclipped = (values - returns) ** 2
    err_clipped = (values_clipped - returns) ** 2
    loss = 0.5 * _token_loss(torch.maximum(err_unclipped, err_clipped), mask, num_tokens)
    with torch.no_grad():
        clipfrac = masked_mean((err_clipped > err_unclipped).float(), mask)
    return ValueLoss(loss=loss, clipfrac=clipfrac)


__all__ = [
    "KLEstimator",
    "PolicyLoss",
    "Rewards",
    "ValueLoss",
    "adaptive_kl_coef",
    "completion_mask_from_ids",
    "compute_rewards",
    "entropy_from_logits",
    "gae",
    "last_real_index",
    "logprobs_from_logits",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "missing_eos_penalty",
    "per_token_kl",
    "ppo_policy_loss",
    "ppo_value_loss",
]
