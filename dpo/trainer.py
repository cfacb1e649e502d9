"""TRL's DPOTrainer with the policy's and the reference's per-token log-probabilities computed from an fp32
projection, under bf16 autocast too.

TRL 1.16 scores tokens with a fused, chunked LM head (``trl.trainer.utils.add_fused_lm_head``): the log-softmax is
fp32, but the projection runs in the autocast dtype, so under bf16 every logit is rounded to 8 mantissa bits before
it (a logit of 12 moves by up to 0.03 nats per token). DPO's loss is a difference of summed log-probabilities of
two nearly equal models, so that rounding, not the backbone's, is what moves it. ``add_fused_lm_head`` has a
``cast_lm_head_to_fp32`` switch that the trainer does not expose; this subclass turns it on for both models
(the backbone stays in bf16, where the time goes). ``benchmarks/logprob_precision.py`` measures the effect.
"""

from __future__ import annotations

import functools
from unittest import mock

from trl import DPOTrainer
from trl.trainer import dpo_trainer, utils


class FP32LogProbDPOTrainer(DPOTrainer):
    """``DPOTrainer`` whose policy and reference log-probabilities come from an fp32 LM-head projection.

    Args:
        fp32_log_probs: run the LM head in fp32 outside autocast (False: TRL's behaviour, the autocast dtype).
        *args, **kwargs: ``DPOTrainer``'s.
    """

    def __init__(self, *args, fp32_log_probs: bool = True, **kwargs):
        self.fp32_log_probs = fp32_log_probs
        patched = functools.partial(utils.add_fused_lm_head, cast_lm_head_to_fp32=fp32_log_probs)
        # DPOTrainer.__init__ patches both models through this module-level name; nothing else reads it.
        with mock.patch.object(dpo_trainer, "add_fused_lm_head", patched):
            super().__init__(*args, **kwargs)
