"""Rollout type of the PPO stage (cf. torchtune ``rlhf/_types.py``).

Shapes: B = completions in the rollout, P = prompt length (left-padded), T = completion length (right-padded
after the first EOS). Masks are 0/1 position masks (long): padding is identified by position, never by token id.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class Rollout(NamedTuple):
    """Everything one PPO step needs from sampling, scored once in eval mode without gradients."""

    prompt_ids: torch.Tensor  #: (B, P) left-padded prompt tokens
    prompt_mask: torch.Tensor  #: (B, P) 1 for real prompt tokens
    prompt_index: torch.Tensor  #: (B,) index of each row's prompt in the trainer's prompt list
    completion_ids: torch.Tensor  #: (B, T) generated tokens; after the first EOS: pad
    completion_mask: torch.Tensor  #: (B, T) 1 up to and including the first EOS
    logprobs: torch.Tensor  #: (B, T) log pi_old(token), at the sampling temperature
    ref_logprobs: torch.Tensor  #: (B, T) log pi_ref(token), same temperature
    values: torch.Tensor  #: (B, T) V_old(state before the token)
    scores: torch.Tensor  #: (B,) reward-model score of (prompt, decoded completion), before any penalty
    penalized_scores: torch.Tensor  #: (B,) scores minus the missing-EOS penalty where it applies
    rewards: torch.Tensor  #: (B, T) -kl_coef * KL_t, + penalized score at the last real token
    kl_k1: torch.Tensor  #: (B, T) log pi - log pi_ref (0 at padding)
    kl_k3: torch.Tensor  #: (B, T) (r - 1) - log r, r = pi_ref / pi (0 at padding, >= 0)
    advantages: torch.Tensor  #: (B, T) GAE advantages (whitened if configured), 0 at padding
    returns: torch.Tensor  #: (B, T) value targets A + V, 0 at padding

    @property
    def input_ids(self) -> torch.Tensor:
        """(B, P + T) prompt and completion."""
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        """(B, P + T) 1 for real prompt and completion tokens."""
        return torch.cat([self.prompt_mask, self.completion_mask], dim=1)
