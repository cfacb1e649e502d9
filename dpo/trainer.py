"""TRL's DPOTrainer with the policy's and the reference's per-token log-probabilities computed from an fp32
projection, under bf16 autocast too, and on a CPU scored only where there is a label.

TRL 1.16 scores tokens with a fused, chunked LM head (``trl.trainer.utils.add_fused_lm_head``): the log-softmax is
fp32, but the projection runs in the autocast dtype, so under bf16 every logit is rounded to 8 mantissa bits before
it (a logit of 12 moves by up to 0.03 nats per token). DPO's loss is a difference of summed log-probabilities of
two nearly equal models, so that rounding, not the backbone's, is what moves it. ``add_fused_lm_head`` has a
``cast_lm_head_to_fp32`` switch that the trainer does not expose; this subclass turns it on for both models
(the backbone stays in bf16, where the time goes). ``benchmarks/logprob_precision.py`` measures the effect.

On a CPU, TRL's head costs about half of a bf16 DPO step on SmolLM2-135M (``torch.profiler``): without Triton it
scores every position, prompt and padding included (only its Triton path keeps the labelled ones), and folds each
``[tokens, 32768]`` tile into its statistics with about ten elementwise passes forward and twelve backward. The
head here (:func:`add_fp32_lm_head`) scores only the labelled positions, in fp32, with ATen's ``logsumexp`` and
three elementwise passes in the backward; on GPUs and for models it does not cover it hands over to TRL's.
"""

from __future__ import annotations

import functools
import types
from unittest import mock

import torch
from torch.distributed.tensor import DTensor
from trl import DPOTrainer
from trl.trainer import dpo_trainer, utils

# fp32 logits held at once per token chunk: 2**25 elements = 128 MiB (682 tokens of a 49,152-token vocabulary).
TILE_ELEMENTS = 2**25
# Config fields that rescale or cap the logits before the softmax (``add_fused_lm_head`` reads the same ones); a
# model that sets any of them is left to TRL's head.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "output_multiplier", "lm_head_multiplier",
                     "logits_scaling")


class TokenLogProbs(torch.autograd.Function):
    """Per-token ``log softmax(hidden @ weight.T + bias)[target] / temperature`` in fp32, ``token chunk`` by chunk,
    without holding the ``[N, V]`` logits.

    Forward inputs: ``hidden`` ``[N, H]`` fp32, ``weight`` ``[V, H]``, ``bias`` ``[V]`` or None, ``targets``
    ``[N]`` int64 in ``[0, V)``, ``inv_temperature`` (float), ``outputs`` (the names wanted, as
    ``add_fused_lm_head``'s). Returns ``(log_probs, entropy, log_sum_sq_probs, mean_logits, is_top1)``, each
    ``[N]`` (None when not in ``outputs``); only ``log_probs`` carries a gradient, the others are metrics
    (DPOTrainer detaches its entropy; backpropagating through one raises autograd's "does not require grad").

    Backward: ``d log p_t / d z_j = 1[j = t] - p_j`` (the softmax's Jacobian), recomputing each chunk's logits
    from the saved ``hidden`` and its log-normaliser, gradients accumulated in fp32.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, inv_temperature, outputs):
        n, vocab = hidden.shape[0], weight.shape[0]
        rows = max(1, TILE_ELEMENTS // vocab)
        weight32 = weight.float()
        bias32 = None if bias is None else bias.float()
        log_z = hidden.new_empty(n)
        log_probs = hidden.new_empty(n)
        entropy = hidden.new_empty(n) if "entropy" in outputs else None
        log_sum_sq = hidden.new_empty(n) if "log_sum_sq_probs" in outputs else None
        mean_logits = hidden.new_empty(n) if "mean_logits" in outputs else None
        is_top1 = torch.empty(n, dtype=torch.bool, device=hidden.device) if "is_top1" in outputs else None
        for start in range(0, n, rows):
            end = min(start + rows, n)
            z = _logits(hidden[start:end], weight32, bias32, inv_temperature)
            target = targets[start:end]
            torch.logsumexp(z, dim=-1, out=log_z[start:end])
            log_probs[start:end] = z.gather(1, target[:, None]).squeeze(1) - log_z[start:end]
            if mean_logits is not None:
                torch.mean(z, dim=-1, out=mean_logits[start:end])
            if is_top1 is not None:  # argmax returns the first maximum: a tie with an earlier token is not top-1
                torch.eq(z.argmax(dim=-1), target, out=is_top1[start:end])
            if log_sum_sq is not None:  # log sum_v p_v^2 = logsumexp(2z) - 2 log Z
                log_sum_sq[start:end] = torch.logsumexp(2 * z, dim=-1) - 2 * log_z[start:end]
            if entropy is not None:  # H = log Z - sum_v p_v z_v
                p = torch.sub(z, log_z[start:end, None]).exp_()
                entropy[start:end] = log_z[start:end] - p.mul_(z).sum(dim=-1)
        ctx.save_for_backward(hidden, weight, bias, targets, log_z)
        ctx.inv_temperature = inv_temperature
        ctx.mark_non_differentiable(*(x for x in (entropy, log_sum_sq, mean_logits, is_top1) if x is not None))
        return log_probs, entropy, log_sum_sq, mean_logits, is_top1

    @staticmethod
    def backward(ctx, grad_log_probs, *_):
        hidden, weight, bias, targets, log_z = ctx.saved_tensors
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        if grad_log_probs is None:
            return None, None, None, None, None, None
        n, vocab = hidden.shape[0], weight.shape[0]
        rows = max(1, TILE_ELEMENTS // vocab)
        weight32 = weight.float()
        bias32 = None if bias is None else bias.float()
        g = grad_log_probs.float()
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_weight else None
        grad_bias = torch.zeros(vocab, dtype=torch.float32, device=weight.device) if need_bias else None
        for start in range(0, n, rows):
            end = min(start + rows, n)
            h, g_rows = hidden[start:end], g[start:end]
            # dL/dz = g (1[j = t] - p_j), built in place in the recomputed logits' buffer
            dz = _logits(h, weight32, bias32, ctx.inv_temperature)
            dz.sub_(log_z[start:end, None]).exp_().mul_(-g_rows[:, None])
            dz.scatter_add_(1, targets[start:end, None], g_rows[:, None])
            if ctx.inv_temperature != 1.0:
                dz.mul_(ctx.inv_temperature)
            if grad_hidden is not None:
                torch.mm(dz, weight32, out=grad_hidden[start:end])
            if grad_weight is not None:
                grad_weight.addmm_(dz.t(), h)
            if grad_bias is not None:
                grad_bias += dz.sum(dim=0)
        return (grad_hidden,
                None if grad_weight is None else grad_weight.to(weight.dtype),
                None if grad_bias is None else grad_bias.to(bias.dtype),
                None, None, None)


def _logits(hidden: torch.Tensor, weight32: torch.Tensor, bias32: torch.Tensor | None,
            inv_temperature: float) -> torch.Tensor:
    """``[rows, V]`` fp32 logits of ``hidden`` ``[rows, H]``, divided by the temperature."""
    z = torch.mm(hidden, weight32.t()) if bias32 is None else torch.addmm(bias32, hidden, weight32.t())
    return z if inv_temperature == 1.0 else z.mul_(inv_temperature)


def add_fp32_lm_head(model, temperature: float = 1.0, cast_lm_head_to_fp32: bool = False,
                     outputs: tuple[str, ...] = ("log_probs",)) -> None:
    """TRL's ``add_fused_lm_head`` (same arguments, same ``FusedCausalLMOutput``), with the fp32 projection
    (``cast_lm_head_to_fp32``) on a CPU computed by :class:`TokenLogProbs` on the labelled positions only.

    TRL's head stays in charge of everything this one does not cover: ``cast_lm_head_to_fp32`` False, a CUDA or
    other device, pre-shifted ``shift_labels``, MoE router logits, sharded (DTensor) heads, multimodal models and
    models whose config rescales or caps the logits.
    """
    utils.add_fused_lm_head(model, temperature=temperature, cast_lm_head_to_fp32=cast_lm_head_to_fp32,
                            outputs=outputs)
    text_config = model.config.get_text_config()
    if (not cast_lm_head_to_fp32 or text_config is not model.config
            or any(getattr(text_config, k, None) is not None for k in _LOGIT_TRANSFORMS)):
        return
    trl_forward = model.forward

    @functools.wraps(type(model).forward)
    def forward(self, *args, fused_lm_head=False, labels=None, shift_labels=None, num_items_in_batch=None,
                **kwargs):
        lm_head = self.get_output_embeddings()
        if (not fused_lm_head or shift_labels is not None or kwargs.get("output_router_logits")
                or getattr(text_config, "output_router_logits", False)
                or lm_head.weight.device.type != "cpu" or isinstance(lm_head.weight, DTensor)):
            return trl_forward(*args, fused_lm_head=fused_lm_head, labels=labels, shift_labels=shift_labels,
                               num_items_in_batch=num_items_in_batch, **kwargs)
        kwargs["use_cache"] = False
        hidden = self.base_model(*args, **kwargs).last_hidden_state[:, :-1]
        labels = labels[:, 1:].to(hidden.device)
        mask = labels != -100
        with torch.autocast(hidden.device.type, enabled=False):
            fields = TokenLogProbs.apply(hidden[mask].float(), lm_head.weight, lm_head.bias, labels[mask],
                                         1.0 / temperature, outputs)
        # masked_scatter keeps an all-masked batch connected to the model (a differentiable zero), as TRL's head
        log_probs, entropy, log_sum_sq, mean_logits, is_top1 = (
            None if x is None else x.new_zeros(mask.shape).masked_scatter(mask, x) for x in fields)
        loss = -log_probs.sum() / (mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch)
        return utils.FusedCausalLMOutput(loss=loss, log_probs=log_probs, entropy=entropy,
                                         log_sum_sq_probs=log_sum_sq, mean_logits=mean_logits, is_top1=is_top1,
                                         label_mask=mask, aux_loss=None)

    model.forward = types.MethodType(forward, model)


class FP32LogProbDPOTrainer(DPOTrainer):
    """``DPOTrainer`` whose policy and reference log-probabilities come from an fp32 LM-head projection.

    Args:
        fp32_log_probs: run the LM head in fp32 outside autocast (False: TRL's behaviour, the autocast dtype).
        *args, **kwargs: ``DPOTrainer``'s.
    """

    def __init__(self, *args, fp32_log_probs: bool = True, **kwargs):
        self.fp32_log_probs = fp32_log_probs
        patched = functools.partial(add_fp32_lm_head, cast_lm_head_to_fp32=fp32_log_probs)
        # DPOTrainer.__init__ patches both models through this module-level name; nothing else reads it.
        with mock.patch.object(dpo_trainer, "add_fused_lm_head", patched):
            super().__init__(*args, **kwargs)
