"""Classic RLHF PPO on accelerate (Ziegler et al. 2019; Ouyang et al. 2022), math in :mod:`ppo.core`.

One step:
    1. rollout (eval mode, no dropout, no gradients): left-padded batched sampling from the policy at
       ``temperature`` with no top-k/top-p; log-probs of the completion under the policy and pi_ref; values;
       the reward model's score of (prompt, decoded completion), placed at the last real completion token; the
       missing-EOS penalty (completion tokens only);
       per-token rewards -kl_coef * KL_t (+ score at the last real token); GAE; whitened advantages.
    2. ``ppo_epochs`` passes of shuffled minibatches: clipped policy loss + vf_coef * clipped value loss, each a
       token mean over the whole mini-batch whatever the micro-batch split (every micro-batch's summed token loss
       divided by the mini-batch's real-token count, all-reduced over processes: :meth:`PPOTrainer.accumulate_minibatch`).

Tripwire (``judging.tripwires``): every ``tripwire_steps`` steps (and once before the first), greedy responses to a
fixed slice of prompts are scored by the reward model and a second, gold scorer, and counted (median length,
refusal rate, style shares); with the KL since the last check, the rules say pass or trip. A passing check writes
the policy's weights to ``output_dir/tripwire-last-pass``; a trip stops training and loads them back
(:meth:`PPOTrainer.tripwire_check`), so what is saved afterwards is the policy of the last passing check.

Resume: every ``save_steps`` a checkpoint holds weights, optimizer, scheduler, RNG states and the loop state
(:meth:`PPOTrainer.save_state`); :meth:`PPOTrainer.load_state` continues from it to the uninterrupted run's result.

Models:
    - policy: ``AutoModelForCausalLM``, trained.
    - ref_model (pi_ref): a separate ``AutoModelForCausalLM``, frozen, always in eval mode; its parameters are
      fingerprinted (sha256 of its tensors) at construction and checked after training
      (:meth:`PPOTrainer.verify_frozen`); ``ppo.train`` also verifies pi_ref's content hash on disk before and
      after training (``rlhf.checkpoint.verify_hash``).
    - reward_model: ``AutoModelForSequenceClassification`` with one label, frozen and fingerprinted too.
    - value_model: a *separate* ``AutoModelForSequenceClassification`` with one label (by default initialised
      from the reward model, as Ouyang et al. 2022 initialise the value function from the RM), trained.
      Chosen over a value head on the policy because (a) the value loss then never pulls on the policy's
      representation, (b) an RM-initialised critic starts with a sensible value scale, (c) it is the layout of
      TRL's former PPO trainer. Cost: one more model in memory (for SmolLM2-135M, +0.5 GB fp32 + Adam state).

Reward: scored exactly as the reward-model stage scores (``judging.scoring.score``): the completion is
decoded (special tokens skipped, stripped, as ``rlhf.generation`` decodes responses), rendered with the prompt
through the chat template (``judging.scoring.render``: "...<|im_start|>assistant\n{completion}<|im_end|>\n")
and read by transformers' default sequence-classification pooling, at the last non-pad token of that render.
That is the position TRL's RewardTrainer trained the score at, so PPO optimises the number the RM was trained
to give (and the number the release gates read). The scalar is then placed at the last real completion token.

Values: per-token, ``value_model.score(backbone(input_ids).last_hidden_state)`` read by position (the value
of the state before each completion token), never through the pooled ``forward`` (pad == eos would move it).

Policy and value are wrapped in one ``nn.Module`` (:class:`PolicyAndValue`) so that ``accelerator.prepare``
sees one model and one optimizer (DDP / DeepSpeed need that). Generation uses the unwrapped policy; ZeRO-3
would need its parameters gathered for generation, which is not done here.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import logging
import math
import os
import signal
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import GenerationConfig, PreTrainedTokenizerBase, get_scheduler

from ppo import core
from ppo.config import PPOConfig
from ppo.types import Rollout
from judging.scoring import score as rm_score
from judging.tripwires import CheckResult, Signals, Tripwire, gold_win_rate, style_signals
from rlhf.generation import chat_prompt
from rlhf.checkpoint import check_checkpoint, save_checkpoint
from rlhf.precision import accelerate_mixed_precision, stage_accelerator
from rlhf.resume import FAULT_ENV

logger = logging.getLogger(__name__)

#: A callback receives the PPO step (1-based) and that step's metrics.
Callback = Callable[[int, dict[str, float]], None]

Prompt = str | Sequence[Mapping[str, Any]] | Mapping[str, Any]

#: The gold check's scorer: (prompts as chat messages, responses) -> one score per response, higher is better.
GoldScorer = Callable[[list[list[dict[str, Any]]], list[str]], Sequence[float]]

#: Folder under output_dir holding the policy of the last passing tripwire check.
TRIPWIRE_SNAPSHOT = "tripwire-last-pass"


# --------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------


def disable_dropout(model: nn.Module) -> None:
    """Set every dropout probability of ``model`` to 0 (``nn.Dropout`` modules and attention-dropout floats)."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0


def parameter_fingerprint(model: nn.Module) -> str:
    """sha256 over the names, dtypes, shapes and bytes of all parameters and buffers of an in-memory ``model``.

    Complements ``rlhf.checkpoint.verify_hash`` (pi_ref's files on disk): this one catches a frozen model that moved
    in memory during training, which the files would not show.
    """
    h = hashlib.sha256()
    tensors = list(model.named_parameters()) + list(model.named_buffers())
    for name, tensor in sorted(tensors, key=lambda kv: kv[0]):
        t = tensor.detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over real tokens only, as ``generate`` does for left padding. (B, L) -> (B, L)."""
    position_ids = attention_mask.long().cumsum(-1) - 1
    return position_ids.clamp(min=0)


def token_scores(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
) -> torch.Tensor:
    """Per-position scalar scores of a 1-label sequence-classification model. (B, L) -> (B, L) float32."""
    backbone = getattr(model, getattr(model, "base_model_prefix", "model"), None)
    head = getattr(model, "score", None)
    if backbone is None or head is None:
        raise TypeError(
            f"{type(model).__name__}: reward and value models must be AutoModelForSequenceClassification-style "
            "models with a backbone (base_model_prefix) and a `score` head"
        )
    hidden = backbone(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
    ).last_hidden_state
    scores = head(hidden)
    if scores.shape[-1] != 1:
        raise ValueError(f"{type(model).__name__}: the score head must have 1 output, has {scores.shape[-1]}")
    return scores.squeeze(-1).float()


def left_pad(sequences: Sequence[Sequence[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists. Returns ids (B, P) and a 0/1 position mask (B, P)."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, seq in enumerate(sequences):
        if len(seq):
            ids[i, width - len(seq) :] = torch.as_tensor(seq, dtype=torch.long)
            mask[i, width - len(seq) :] = 1
    return ids, mask


def prompt_messages(prompt: Prompt, row: int) -> list[dict[str, Any]]:
    """A prompt as chat messages. A string is one user message, as ``judging.scoring.render`` and
    ``rlhf.generation.chat_prompt`` read it (``data.loaders.load_eval_prompts`` gives user strings); a mapping
    contributes its ``prompt`` field. Errors name the row.
    """
    if isinstance(prompt, Mapping):
        if "prompt" not in prompt:
            raise ValueError(f"prompt row {row}: no 'prompt' field (fields: {sorted(prompt)})")
        prompt = prompt["prompt"]
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError(f"prompt row {row}: empty prompt")
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, Sequence):
        if not prompt:
            raise ValueError(f"prompt row {row}: empty list of messages")
        for j, message in enumerate(prompt):
            if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
                raise ValueError(f"prompt row {row}, message {j}: expected a mapping with a string 'role'")
            if not isinstance(message.get("content"), str):
                raise ValueError(f"prompt row {row}, message {j}: 'content' must be a string")
        if prompt[-1]["role"] == "assistant":
            raise ValueError(f"prompt row {row}: the conversation ends on an assistant turn; nothing to complete")
        return [dict(m) for m in prompt]
    raise ValueError(f"prompt row {row}: expected a string or a list of messages, got {type(prompt).__name__}")


def tokenize_prompts(
    tokenizer: PreTrainedTokenizerBase, prompts: Sequence[Prompt], max_prompt_length: int
) -> list[list[int]]:
    """Tokenize prompts (see :func:`prompt_messages`) rendered with the chat template and a generation prompt.

    The render is ``rlhf.generation.chat_prompt``'s, tokenized without special tokens (the template already
    holds them: no double BOS). Errors name the row.
    """
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("the tokenizer has no chat template: PPO renders prompts as the reward model scores them")
    out: list[list[int]] = []
    for i, prompt in enumerate(prompts):
        text = chat_prompt(tokenizer, prompt_messages(prompt, i))
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        bos = tokenizer.bos_token_id
        if bos is not None and len(ids) >= 2 and ids[0] == bos and ids[1] == bos:
            raise ValueError(f"prompt row {i}: starts with two BOS tokens (template + tokenizer both added one)")
        if not ids:
            raise ValueError(f"prompt row {i}: tokenizes to no tokens")
        if len(ids) > max_prompt_length:
            raise ValueError(f"prompt row {i}: {len(ids)} tokens > max_prompt_length={max_prompt_length}")
        out.append(ids)
    return out


def decode_completions(
    tokenizer: PreTrainedTokenizerBase, completion_ids: torch.Tensor, completion_mask: torch.Tensor
) -> list[str]:
    """Text of each completion as the pipeline scores responses (cf. ``rlhf.generation.generate``): the real
    tokens (up to and including the first EOS), special tokens skipped, surrounding whitespace stripped."""
    lengths = completion_mask.long().sum(-1).tolist()
    return [tokenizer.decode(ids[:n], skip_special_tokens=True).strip()
            for ids, n in zip(completion_ids.tolist(), lengths)]


def completion_logits(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    completion_length: int,
) -> torch.Tensor:
    """Logits that predict the last ``completion_length`` tokens of ``input_ids``. (B, L) -> (B, T, V).

    Position L - T - 1 predicts the first completion token, L - 2 the last one; only the last T + 1 positions
    are projected on the vocabulary (``logits_to_keep``) where the model supports it.
    """
    T = completion_length
    kwargs: dict[str, Any] = {}
    if "logits_to_keep" in inspect.signature(model.forward).parameters:
        kwargs["logits_to_keep"] = T + 1
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False, **kwargs
    ).logits
    return logits[:, -(T + 1) : -1]


class PolicyAndValue(nn.Module):
    """The trained pair, one module for ``accelerate.prepare``: forward returns (completion logits, values)."""

    def __init__(self, policy: nn.Module, value_model: nn.Module):
        super().__init__()
        self.policy = policy
        self.value_model = value_model

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        completion_length: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, P + T) inputs -> policy logits (B, T, V) predicting the completion, values (B, T).

        values[:, t] = V(state before completion token t) = the value head at position P - 1 + t.
        """
        T = completion_length
        logits = completion_logits(self.policy, input_ids, attention_mask, position_ids, T)
        values = token_scores(self.value_model, input_ids, attention_mask, position_ids)[:, -(T + 1) : -1]
        return logits, values


# --------------------------------------------------------------------------------------------------
# trainer
# --------------------------------------------------------------------------------------------------


class PPOTrainer:
    """Classic RLHF PPO. See the module docstring for the models and the step.

    Args:
        config: hyper-parameters.
        policy: ``AutoModelForCausalLM`` to train.
        ref_model: pi_ref, a separate ``AutoModelForCausalLM``; frozen and put in eval mode here.
        reward_model: 1-label ``AutoModelForSequenceClassification``; frozen and put in eval mode here. Its
            ``config.pad_token_id`` must be set (transformers' pooling finds the last non-pad token with it).
        value_model: 1-label ``AutoModelForSequenceClassification`` to train (a separate model, not a head).
        tokenizer: of the policy, pi_ref and value model; needs ``pad_token_id`` and ``eos_token_id`` (pad may
            equal eos) and a chat template.
        prompts: user strings, lists of chat messages, or mappings with a ``prompt`` field (a
            ``datasets.Dataset`` with a ``prompt`` column works); rendered with the chat template.
        reward_tokenizer: the reward model's own tokenizer (default: ``tokenizer``); renders and tokenizes the
            (prompt, completion) pairs it scores, as the reward-model stage does.
        accelerator: an ``Accelerator``; created from ``config.precision`` (``rlhf.precision``) if omitted.
        callbacks: called as ``callback(step, metrics)`` every ``logging_steps`` steps on the main process.
        tripwire_prompts: the tripwire's fixed slice (as ``prompts``); default the first ``tripwire_n_prompts``
            of ``prompts``.
        gold_scorer: the gold check's scorer (:data:`GoldScorer`), never the optimised reward model; None: no gold
            rule. Gold = :func:`judging.tripwires.gold_win_rate` of its scores of the current greedy responses over
            its scores of the initial policy's.
    """

    def __init__(
        self,
        config: PPOConfig,
        policy: nn.Module,
        ref_model: nn.Module,
        reward_model: nn.Module,
        value_model: nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        prompts: Sequence[Prompt],
        accelerator: Accelerator | None = None,
        callbacks: Sequence[Callback] | None = None,
        reward_tokenizer: PreTrainedTokenizerBase | None = None,
        tripwire_prompts: Sequence[Prompt] | None = None,
        gold_scorer: GoldScorer | None = None,
    ):
        self.config = config
        if accelerator is None:
            accelerator = stage_accelerator(accelerate_mixed_precision(config.precision))
        self.accelerator = accelerator
        self.mixed_precision = str(accelerator.mixed_precision)
        logger.info(
            "PPO precision: requested %r -> accelerate mixed_precision %r (device %s)",
            config.precision,
            self.mixed_precision,
            self.accelerator.device,
        )
        set_seed(config.seed)
        self.callbacks: list[Callback] = list(callbacks or [])
        self.log_history: list[dict[str, float]] = []
        self.kl_coef = config.kl_coef
        self.global_step = 0
        self.data_position = (0, 0)  # (data epoch, batches of it used): where a resumed run continues
        self.resumed_from: str | None = None
        self.resumed_from_step: int | None = None
        # tokens through the update passes (prompt + completion, real / with padding), for tokens/s and MFU
        self.tokens_trained = 0
        self.tokens_batched = 0
        self.tokens_generated = 0  # real completion tokens sampled in the rollouts
        self.rollout_seconds = 0.0
        self.step_seconds: list[float] = []  # wall seconds of each step of this run (rollout + update)

        self.reward_tokenizer = reward_tokenizer or tokenizer
        self._check_models(policy, ref_model, reward_model, value_model, tokenizer, self.reward_tokenizer)
        self.tokenizer = tokenizer
        self.pad_token_id: int = tokenizer.pad_token_id
        eos = {tokenizer.eos_token_id}
        gen_eos = getattr(getattr(policy, "generation_config", None), "eos_token_id", None)
        if gen_eos is not None:
            eos.update([gen_eos] if isinstance(gen_eos, int) else gen_eos)
        self.eos_token_ids: list[int] = sorted(eos)

        # frozen models: no gradients, eval mode, fingerprinted
        for frozen in (ref_model, reward_model):
            frozen.requires_grad_(False)
            frozen.eval()
        self.ref_model = ref_model
        self.reward_model = reward_model
        self.ref_fingerprint = parameter_fingerprint(ref_model)
        self.reward_fingerprint = parameter_fingerprint(reward_model)

        if config.disable_dropout:
            disable_dropout(policy)
            disable_dropout(value_model)
        if config.gradient_checkpointing:
            for m in (policy, value_model):
                if hasattr(m, "activation_checkpointing_enable"):  # transformers >= 5.2x name
                    m.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
                else:
                    m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
                if hasattr(m, "config"):
                    m.config.use_cache = False

        # data: the loader yields prompt indices; the collator turns them into left-padded ids (for the policy)
        # and keeps the index (for the reward model, which scores the prompt's messages + the decoded completion)
        self.prompts = [prompt_messages(p, i) for i, p in enumerate(prompts)]
        self.prompt_ids = tokenize_prompts(tokenizer, self.prompts, config.max_prompt_length)
        needed = config.batch_size * self.accelerator.num_processes
        if len(self.prompt_ids) < needed:
            raise ValueError(f"{len(self.prompt_ids)} prompts < batch_size x processes = {needed}")
        # the order of epoch e is drawn from this generator seeded with seed + e (:meth:`_cycle`), never from the
        # global RNG: a resumed run then draws the prompts the killed one would have, and the global RNG (sampling,
        # minibatch shuffles) is a function of the steps taken alone, so restoring it restores the run
        self._data_generator = torch.Generator()
        dataloader = DataLoader(
            list(range(len(self.prompt_ids))),  # type: ignore[arg-type]
            batch_size=config.batch_size,
            shuffle=True,
            drop_last=True,
            collate_fn=self._collate,
            generator=self._data_generator,
        )

        # optimisation
        model = PolicyAndValue(policy, value_model)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(
            params, lr=config.learning_rate, eps=config.adam_epsilon, weight_decay=config.weight_decay
        )
        scheduler = get_scheduler(
            config.lr_scheduler_type,
            optimizer=optimizer,
            num_warmup_steps=config.warmup_steps,
            num_training_steps=config.num_steps * config.optimizer_steps_per_ppo_step,
        )
        self.model, self.optimizer, self.dataloader, self.scheduler = self.accelerator.prepare(
            model, optimizer, dataloader, scheduler
        )
        self.ref_model.to(self.accelerator.device)
        self.reward_model.to(self.accelerator.device)
        self._batches = self._cycle()

        # tripwire: only when the run reaches a check (a run shorter than tripwire_steps measures nothing)
        self.tripwire: Tripwire | None = None
        self.gold_scorer = gold_scorer
        self._gold_reference: list[float] | None = None  # the gold scorer's scores of the initial policy's responses
        self.tripwire_restored_step: int | None = None
        if config.tripwire_steps and config.num_steps >= config.tripwire_steps:
            kind = str(self.accelerator.distributed_type).split(".")[-1]
            if kind in ("DEEPSPEED", "FSDP", "MEGATRON_LM", "XLA"):
                raise ValueError(f"the PPO tripwire keeps the whole weights of the last passing check: one process or "
                                 f"DDP only, this run is {kind}; set tripwire_steps: 0")
            rows = (list(tripwire_prompts) if tripwire_prompts is not None
                    else list(prompts)[: config.tripwire_n_prompts])
            self.tripwire_prompts = [prompt_messages(p, i) for i, p in enumerate(rows)]
            self.tripwire_prompt_ids = tokenize_prompts(tokenizer, self.tripwire_prompts, config.max_prompt_length)
            self.tripwire = Tripwire(config.tripwire_config())

    # ---- checks -----------------------------------------------------------------------------------

    @staticmethod
    def _check_models(policy, ref_model, reward_model, value_model, tokenizer, reward_tokenizer) -> None:
        if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer needs a pad_token_id and an eos_token_id (pad may equal eos)")
        if getattr(reward_model.config, "pad_token_id", None) is None:
            raise ValueError("reward_model.config.pad_token_id is unset: transformers' pooling needs it to find the "
                             "last real token (set it to the reward tokenizer's pad_token_id)")
        if ref_model is policy:
            raise ValueError("ref_model is the policy object: pi_ref must be a separate, frozen copy")
        if value_model is reward_model:
            raise ValueError("value_model is the reward_model object: load the value model separately")
        trained = {p.data_ptr() for m in (policy, value_model) for p in m.parameters()}
        frozen = {p.data_ptr() for m in (ref_model, reward_model) for p in m.parameters()}
        if trained & frozen:
            raise ValueError("policy/value share parameter storage with pi_ref/reward model: training would move them")
        for name, m, tok in (("policy", policy, tokenizer), ("ref_model", ref_model, tokenizer),
                             ("reward_model", reward_model, reward_tokenizer), ("value_model", value_model, tokenizer)):
            n_emb = m.get_input_embeddings().num_embeddings
            if n_emb < len(tok):
                raise ValueError(f"{name}: {n_emb} input embeddings < tokenizer size {len(tok)}")

    def verify_frozen(self) -> None:
        """Raise if pi_ref's (or the reward model's) parameters changed since construction."""
        ref_now = parameter_fingerprint(self.ref_model)
        if ref_now != self.ref_fingerprint:
            raise RuntimeError(f"pi_ref parameters changed during PPO: {self.ref_fingerprint} -> {ref_now}")
        rm_now = parameter_fingerprint(self.reward_model)
        if rm_now != self.reward_fingerprint:
            raise RuntimeError(f"reward model parameters changed during PPO: {self.reward_fingerprint} -> {rm_now}")

    # ---- data -------------------------------------------------------------------------------------

    def _collate(self, batch: list[int]) -> dict[str, torch.Tensor]:
        ids, mask = left_pad([self.prompt_ids[i] for i in batch], self.pad_token_id)
        return {"prompt_ids": ids, "prompt_mask": mask, "prompt_index": torch.as_tensor(batch, dtype=torch.long)}

    def _cycle(self, epoch: int = 0, skip: int = 0) -> Iterator[dict[str, torch.Tensor]]:
        """Batches forever, epoch after epoch, starting at batch ``skip`` of ``epoch``; the order of epoch e is a
        function of (seed, e) alone. ``self.data_position`` is (epoch, batches of it handed out) after each yield."""
        while True:
            self._data_generator.manual_seed(self.config.seed + epoch)
            self.data_position = (epoch, 0)
            for i, batch in enumerate(self.dataloader):
                if i < skip:
                    continue
                self.data_position = (epoch, i + 1)
                yield batch
            epoch, skip = epoch + 1, 0

    @property
    def policy(self) -> nn.Module:
        """The unwrapped policy being trained."""
        return self.accelerator.unwrap_model(self.model).policy

    @property
    def value_model(self) -> nn.Module:
        return self.accelerator.unwrap_model(self.model).value_model

    # ---- rollout ----------------------------------------------------------------------------------

    def generation_config(self) -> GenerationConfig:
        """Pure sampling at ``temperature``: every logits warper that would make the sampled distribution
        differ from the scored one is set to its neutral value explicitly (None would let a checkpoint's
        generation_config fill it in; transformers' global default is top_k=50)."""
        return GenerationConfig(
            max_new_tokens=self.config.max_new_tokens,
            do_sample=True,
            temperature=self.config.temperature,
            top_k=0,
            top_p=1.0,
            typical_p=1.0,
            epsilon_cutoff=0.0,
            eta_cutoff=0.0,
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            encoder_repetition_penalty=1.0,
            num_beams=1,
            num_return_sequences=1,
            pad_token_id=self.pad_token_id,
            eos_token_id=self.eos_token_ids,
            use_cache=True,
        )

    @torch.no_grad()
    def generate(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, **kwargs: Any) -> Any:
        """Sample completions for left-padded prompts; returns what ``generate`` returns ((B, P + T) ids)."""
        policy = self.policy
        was_training = policy.training
        policy.eval()
        saved = getattr(policy, "generation_config", None)
        # the checkpoint's generation_config must not fill in min_p, suppress_tokens, ... (see generation_config)
        policy.generation_config = GenerationConfig()
        generation_config = self.generation_config()
        model_kwargs = generation_config.update(**kwargs)  # e.g. output_scores=True; returns the non-generation rest
        try:
            return policy.generate(
                input_ids=prompt_ids, attention_mask=prompt_mask, generation_config=generation_config, **model_kwargs
            )
        finally:
            policy.generation_config = saved
            policy.train(was_training)

    def _forward_chunks(self, fn: Callable[[slice], torch.Tensor], n: int) -> torch.Tensor:
        step = self.config.micro_batch_size
        return torch.cat([fn(slice(i, min(i + step, n))) for i in range(0, n, step)], dim=0)

    @torch.no_grad()
    def score_completions(
        self, prompts: Sequence[Prompt], completion_ids: torch.Tensor, completion_mask: torch.Tensor
    ) -> torch.Tensor:
        """Reward-model score of each (prompt, completion), exactly as the reward-model stage scores a pair.

        The real completion tokens are decoded (:func:`decode_completions`) and scored with
        ``judging.scoring.score``: chat-template render of the prompt + the completion as the assistant
        turn, read at the last non-pad token by transformers' pooling. Shapes: completion_ids/mask (B, T) -> (B,).
        """
        messages = [prompt_messages(p, i) for i, p in enumerate(prompts)]
        texts = decode_completions(self.tokenizer, completion_ids, completion_mask)
        tok = self.reward_tokenizer
        sides = (tok.padding_side, tok.truncation_side)  # score() sets them; do not leak that into the checkpoint
        try:
            scores = rm_score(self.reward_model, tok, messages, texts, batch_size=self.config.micro_batch_size,
                              max_length=self.config.reward_max_length, desc="reward")
        finally:
            tok.padding_side, tok.truncation_side = sides
        return torch.as_tensor(scores, dtype=torch.float32, device=completion_ids.device)

    @torch.no_grad()
    def rollout(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, prompt_index: torch.Tensor) -> Rollout:
        """Sample and score one batch (``prompt_index``: each row's index in ``self.prompts``, as the loader's
        batches carry it). Everything in eval mode (no dropout), without gradients."""
        cfg = self.config
        device = self.accelerator.device
        prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
        self.model.eval()
        self.ref_model.eval()
        self.reward_model.eval()

        sequences = self.generate(prompt_ids, prompt_mask)
        P = prompt_ids.shape[1]
        completion_ids = sequences[:, P:]
        T = completion_ids.shape[1]
        completion_mask = core.completion_mask_from_ids(completion_ids, self.eos_token_ids)
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        position_ids = position_ids_from_mask(attention_mask)
        B = input_ids.shape[0]
        unwrapped = self.accelerator.unwrap_model(self.model)

        def args(s: slice) -> dict[str, torch.Tensor]:
            return {"input_ids": input_ids[s], "attention_mask": attention_mask[s], "position_ids": position_ids[s]}

        def policy_logprobs(s: slice) -> torch.Tensor:
            with self.accelerator.autocast():
                logits = completion_logits(unwrapped.policy, **args(s), completion_length=T)
            return core.logprobs_from_logits(logits, completion_ids[s], cfg.temperature)

        def ref_logprobs(s: slice) -> torch.Tensor:
            with self.accelerator.autocast():
                logits = completion_logits(self.ref_model, **args(s), completion_length=T)
            return core.logprobs_from_logits(logits, completion_ids[s], cfg.temperature)

        def values(s: slice) -> torch.Tensor:
            with self.accelerator.autocast():
                return token_scores(unwrapped.value_model, **args(s))[:, P - 1 : -1]

        logprobs = self._forward_chunks(policy_logprobs, B)
        ref_lp = self._forward_chunks(ref_logprobs, B)
        old_values = self._forward_chunks(values, B)
        # (B,) scores; compute_rewards places each at the last real completion token
        prompts = [self.prompts[i] for i in torch.as_tensor(prompt_index).tolist()]
        scores = self.score_completions(prompts, completion_ids, completion_mask)
        penalized = scores
        if cfg.missing_eos_penalty is not None:
            penalized = core.missing_eos_penalty(
                scores, completion_ids, completion_mask, self.eos_token_ids, cfg.missing_eos_penalty
            )

        r = core.compute_rewards(penalized, logprobs, ref_lp, completion_mask, self.kl_coef, cfg.kl_estimator)
        kl_k1 = core.per_token_kl(logprobs, ref_lp, completion_mask, "k1")
        kl_k3 = core.per_token_kl(logprobs, ref_lp, completion_mask, "k3")
        old_values = torch.where(completion_mask.bool(), old_values, torch.zeros_like(old_values))
        advantages, returns = core.gae(r.rewards, old_values, completion_mask, cfg.gamma, cfg.lam)
        if cfg.whiten_advantages and int(completion_mask.sum()) >= 2:
            advantages = core.masked_whiten(advantages, completion_mask)
        return Rollout(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            prompt_index=torch.as_tensor(prompt_index, device=device),
            completion_ids=completion_ids,
            completion_mask=completion_mask,
            logprobs=logprobs,
            ref_logprobs=ref_lp,
            values=old_values,
            scores=scores,
            penalized_scores=penalized,
            rewards=r.rewards,
            kl_k1=kl_k1,
            kl_k3=kl_k3,
            advantages=advantages,
            returns=returns,
        )

    # ---- update -----------------------------------------------------------------------------------

    def minibatch_token_normalizer(self, mask: torch.Tensor) -> tuple[float, int]:
        """What each micro-batch's summed token loss is divided by, and this process's real tokens.

        ``mask`` (b, T): the completion mask of this process's mini-batch. Returns ``(num_tokens / processes,
        local_tokens)`` where ``num_tokens`` = the real completion tokens of the mini-batch summed over every
        process (an all-reduce of one number).
        Dividing by ``num_tokens / processes`` rather than ``num_tokens``: DDP (and DeepSpeed) *average* the
        gradients over processes, so that average is then exactly the gradient of the token mean over the whole
        global mini-batch, whatever the micro-batch size and however the tokens fall across processes. With one
        process it is the mini-batch's own token count.
        """
        local = int(mask.sum())
        if self.accelerator.num_processes == 1:
            return float(max(local, 1)), local
        total = self.accelerator.reduce(torch.tensor(float(local), device=self.accelerator.device), "sum")
        return max(float(total), 1.0) / self.accelerator.num_processes, local

    def accumulate_minibatch(self, ro: Rollout, minibatch: torch.Tensor) -> dict[str, float]:
        """Forward/backward of one mini-batch (rows ``minibatch`` of ``ro``) in micro-batches of
        ``micro_batch_size``, gradients accumulated in ``.grad``; no optimizer step. Returns the mini-batch's
        statistics (losses and per-token statistics as token means over the mini-batch, micro-batch independent).

        Loss of micro-batch m: (sum over its real tokens of the policy loss + vf_coef * the value loss) divided by
        :meth:`minibatch_token_normalizer`: the accumulated gradient is that of the mini-batch's token mean, the
        same at any micro-batch size (``tests/test_ppo_trainer.py`` checks 1, 2 and the whole mini-batch at 1e-6).
        """
        cfg = self.config
        T = ro.completion_ids.shape[1]
        input_ids, attention_mask = ro.input_ids, ro.attention_mask
        position_ids = position_ids_from_mask(attention_mask)
        normalizer, n_local = self.minibatch_token_normalizer(ro.completion_mask[minibatch])
        stats: dict[str, float] = defaultdict(float)
        micro_starts = list(range(0, len(minibatch), cfg.micro_batch_size))
        for k, m_start in enumerate(micro_starts):
            idx = minibatch[m_start : m_start + cfg.micro_batch_size]
            last_micro = k == len(micro_starts) - 1
            sync = contextlib.nullcontext() if last_micro else self.accelerator.no_sync(self.model)
            with sync:
                logits, values = self.model(input_ids[idx], attention_mask[idx], position_ids[idx], T)
                mask = ro.completion_mask[idx]
                new_logprobs = core.logprobs_from_logits(logits, ro.completion_ids[idx], cfg.temperature)
                pl = core.ppo_policy_loss(
                    new_logprobs, ro.logprobs[idx], ro.advantages[idx], mask, cfg.cliprange, num_tokens=normalizer
                )
                vl = core.ppo_value_loss(
                    values, ro.values[idx], ro.returns[idx], mask, cfg.cliprange_value, num_tokens=normalizer
                )
                loss = pl.loss + cfg.vf_coef * vl.loss
                self.accelerator.backward(loss)
            with torch.no_grad():
                entropy = core.masked_mean(core.entropy_from_logits(logits.detach(), cfg.temperature), mask)
            # statistics over this process's mini-batch: sums rescaled to its own token count, and per-token means
            # weighted by each micro-batch's share of the tokens
            rescale = normalizer / max(n_local, 1)
            share = int(mask.sum()) / max(n_local, 1)
            stats["loss/policy"] += pl.loss.item() * rescale
            stats["loss/value"] += vl.loss.item() * rescale
            stats["loss/total"] += loss.item() * rescale
            stats["policy/clipfrac"] += pl.clipfrac.item() * share
            stats["policy/approx_kl"] += pl.approx_kl.item() * share
            stats["policy/ratio"] += pl.ratio.item() * share
            stats["policy/entropy"] += entropy.item() * share
            stats["value/clipfrac"] += vl.clipfrac.item() * share
        self.tokens_trained += int(attention_mask[minibatch].sum())
        self.tokens_batched += int(attention_mask[minibatch].numel())
        return dict(stats)

    def update(self, ro: Rollout) -> dict[str, float]:
        """``ppo_epochs`` passes of minibatch updates on one rollout. Returns mean update statistics (over the
        mini-batches; each mini-batch's figures are token means, :meth:`accumulate_minibatch`)."""
        cfg = self.config
        self.model.train()
        B = ro.prompt_ids.shape[0]
        stats: dict[str, list[float]] = defaultdict(list)
        for _epoch in range(cfg.ppo_epochs):
            perm = torch.randperm(B, device=ro.prompt_ids.device)
            for start in range(0, B, cfg.mini_batch_size):
                for key, value in self.accumulate_minibatch(ro, perm[start : start + cfg.mini_batch_size]).items():
                    stats[key].append(value)
                grad_norm = self.accelerator.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
                if grad_norm is not None:
                    stats["policy/grad_norm"].append(float(grad_norm))
                self.optimizer.step()
                self.scheduler.step()
                self.optimizer.zero_grad(set_to_none=True)
        self.model.eval()
        self._first_minibatch_approx_kl = stats["policy/approx_kl"][0]
        return {k: sum(v) / len(v) for k, v in stats.items()}

    # ---- step / train -----------------------------------------------------------------------------

    def step(self, batch: Mapping[str, torch.Tensor] | None = None) -> dict[str, float]:
        """One PPO step: rollout, then update. Returns the step's metrics (averaged over processes)."""
        t0 = time.perf_counter()
        batch = batch if batch is not None else next(self._batches)
        ro = self.rollout(batch["prompt_ids"], batch["prompt_mask"], batch["prompt_index"])
        t_rollout = time.perf_counter() - t0
        kl_coef_used = self.kl_coef
        update_stats = self.update(ro)
        self.global_step += 1

        mask = ro.completion_mask
        seq_k1 = core.masked_sum(ro.kl_k1, mask, dim=-1)  # (B,) KL of each sampled sequence
        seq_k3 = core.masked_sum(ro.kl_k3, mask, dim=-1)
        lengths = mask.sum(-1).float()
        has_eos = (torch.isin(ro.completion_ids, torch.as_tensor(self.eos_token_ids, device=mask.device))
                   & mask.bool()).any(-1)  # fmt: skip
        non_score = -kl_coef_used * core.masked_sum(
            core.per_token_kl(ro.logprobs, ro.ref_logprobs, mask, self.config.kl_estimator), mask, dim=-1
        )
        local = {
            "objective/score": ro.scores.mean().item(),
            "objective/score_penalized": ro.penalized_scores.mean().item(),
            "objective/kl_k1": seq_k1.mean().item(),
            "objective/kl_k3": seq_k3.mean().item(),
            "objective/non_score_reward": non_score.mean().item(),
            "objective/rlhf_reward": (ro.penalized_scores + non_score).mean().item(),
            "objective/kl_coef": kl_coef_used,
            "value/mean": core.masked_mean(ro.values, mask).item(),
            "value/returns_mean": core.masked_mean(ro.returns, mask).item(),
            "response/length_mean": lengths.mean().item(),
            "response/eos_rate": has_eos.float().mean().item(),
            **update_stats,
        }
        keys = sorted(local)
        reduced = self.accelerator.reduce(
            torch.tensor([local[k] for k in keys], device=self.accelerator.device, dtype=torch.float64), "mean"
        )
        metrics = {k: float(v) for k, v in zip(keys, reduced.tolist())}

        n = seq_k1.numel()
        if n > 1:
            se = float(seq_k1.std()) / math.sqrt(n)
            if float(seq_k1.mean()) < -3.0 * se - 1e-6:
                logger.warning(
                    "step %d: k1 KL %.4f is negative beyond noise (3 x se = %.4f): samples may not come from the "
                    "policy (sampling settings) or padding leaked into the log-probs",
                    self.global_step,
                    float(seq_k1.mean()),
                    3 * se,
                )
        if self.config.kl_target is not None:
            self.kl_coef = core.adaptive_kl_coef(
                self.kl_coef,
                metrics["objective/kl_k1"],
                self.config.kl_target,
                n_steps=n * self.accelerator.num_processes,
                horizon=self.config.kl_horizon,
            )
        metrics["lr"] = float(self.scheduler.get_last_lr()[0])
        metrics["step"] = float(self.global_step)
        metrics["time/rollout_s"] = t_rollout
        metrics["time/step_s"] = time.perf_counter() - t0
        self.tokens_generated += int(mask.sum())
        self.rollout_seconds += t_rollout
        self.step_seconds.append(metrics["time/step_s"])
        self.last_rollout = ro
        return metrics

    def train(self) -> list[dict[str, float]]:
        """Run the PPO steps from ``global_step`` (0, or a resumed checkpoint's step) to ``num_steps`` with a progress
        bar, writing a resume checkpoint every ``save_steps`` (:meth:`save_state`); verify pi_ref is unchanged at
        the end. Returns the metrics of every step of the run (a resumed run's include the checkpoint's).

        With the tripwire on: a baseline check first, then one every ``tripwire_steps`` (:meth:`tripwire_check`); a
        trip ends the loop early with the last passing check's policy loaded (``tripwire_restored_step``).

        Fault injection for the resume tests (``rlhf.resume.FAULT_ENV`` = N, never set outside tests): SIGKILL to
        this process when step N is done (and saved, if it was a save step), at the start of step N + 1.
        """
        self.verify_frozen()
        raw = os.environ.get(FAULT_ENV)
        kill_after = int(raw) if raw else None
        bar = tqdm(range(self.global_step, self.config.num_steps), desc="PPO", initial=self.global_step,
                   total=self.config.num_steps, disable=not self.accelerator.is_local_main_process)
        if self.tripwire is not None and not self.tripwire.results:
            self.tripwire_check()  # the baseline: the policy before this run's first step
        for _ in bar:
            if kill_after is not None and self.global_step == kill_after:
                logger.warning("%s=%d: sending SIGKILL to this process (pid %d)", FAULT_ENV, kill_after, os.getpid())
                os.kill(os.getpid(), signal.SIGKILL)
            metrics = self.step()
            self.log_history.append(metrics)
            bar.set_postfix(
                score=f"{metrics['objective/score']:.3f}",
                kl=f"{metrics['objective/kl_k1']:.3f}",
                len=f"{metrics['response/length_mean']:.1f}",
            )
            result = None
            if self.tripwire is not None and self.tripwire.due(self.global_step):
                result = self.tripwire_check()
                metrics.update(tripwire_metrics(result))
            if self.global_step % self.config.logging_steps == 0 and self.accelerator.is_main_process:
                for callback in self.callbacks:
                    callback(self.global_step, metrics)
            if result is not None and not result.passed:
                break  # the policy of the last passing check is loaded back: no further step, no resume checkpoint
            save_steps = self.config.save_steps
            if save_steps and self.global_step % save_steps == 0 and self.global_step < self.config.num_steps:
                self.save_state()
        self.accelerator.wait_for_everyone()
        self.verify_frozen()
        return self.log_history

    # ---- tripwire -----------------------------------------------------------------------------------

    @torch.no_grad()
    def tripwire_signals(self) -> Signals:
        """Measure the tripwire's signals now (``judging.tripwires`` for units and rules).

        Greedy responses (no sampling: the same weights give the same responses) to the fixed slice, in chunks of
        ``batch_size``; ``reward`` = the reward model's mean score of them (:meth:`score_completions`, the optimised
        scorer); ``gold`` = :func:`judging.tripwires.gold_win_rate` of the gold scorer's scores over its scores at
        the first check (None without a gold scorer); ``kl`` = the mean of the steps' ``objective/kl_k1`` since the
        previous check (None at the first; each step's KL is its rollout's, sampled before that step's update, so a
        check sees the policy's KL up to the update before the last one); lengths in completion tokens (up to and
        including EOS). Every process measures the same slice (:meth:`tripwire_check` applies the rules to the main
        process's numbers on all).
        """
        cfg, device = self.config, self.accelerator.device
        texts: list[str] = []
        lengths: list[int] = []
        rewards: list[float] = []
        for start in range(0, len(self.tripwire_prompt_ids), cfg.batch_size):
            rows = self.tripwire_prompt_ids[start : start + cfg.batch_size]
            ids, mask = left_pad(rows, self.pad_token_id)
            sequences = self.generate(ids.to(device), mask.to(device), do_sample=False)
            completion_ids = sequences[:, ids.shape[1] :]
            completion_mask = core.completion_mask_from_ids(completion_ids, self.eos_token_ids)
            prompts = self.tripwire_prompts[start : start + cfg.batch_size]
            rewards += self.score_completions(prompts, completion_ids, completion_mask).tolist()
            texts += decode_completions(self.tokenizer, completion_ids, completion_mask)
            lengths += completion_mask.sum(-1).tolist()
        gold = None
        if self.gold_scorer is not None:
            scores = [float(x) for x in self.gold_scorer(self.tripwire_prompts, texts)]
            if len(scores) != len(texts):
                raise ValueError(f"gold scorer returned {len(scores)} scores for {len(texts)} responses")
            if self._gold_reference is None:
                self._gold_reference = scores
            gold = gold_win_rate(scores, self._gold_reference)
        previous = self.tripwire.results[-1].signals.step if self.tripwire.results else None
        window = [m["objective/kl_k1"] for m in self.log_history if previous is not None and m["step"] > previous]
        user_texts = [next((m["content"] for m in reversed(p) if m["role"] == "user"), "")
                      for p in self.tripwire_prompts]
        return Signals(step=self.global_step, reward=sum(rewards) / len(rewards), gold=gold,
                       kl=sum(window) / len(window) if window else None, **style_signals(user_texts, texts, lengths))

    def tripwire_check(self) -> CheckResult:
        """One tripwire check (:meth:`tripwire_signals`, ``Tripwire.check``). Pass: the policy's weights go to
        ``output_dir/tripwire-last-pass/model.safetensors`` (with ``step.json``), replacing the previous pass's.
        Trip: those weights are loaded back into the policy and ``tripwire_restored_step`` is set. Every process
        calls it.

        Raises:
            RuntimeError: on a trip, the snapshot on disk is not the last passing check's.
        """
        import json

        from safetensors.torch import load_model, save_model

        signals = self.tripwire_signals()
        if self.accelerator.num_processes > 1:
            # every process measured the same slice with the same weights, but the verdict must not hang on the last
            # bits of a float: all apply the rules to the main process's numbers, so all stop (or go on) together
            from accelerate.utils import broadcast_object_list

            signals = broadcast_object_list([signals], from_process=0)[0]
        result = self.tripwire.check(signals)
        folder = Path(self.config.output_dir) / TRIPWIRE_SNAPSHOT
        weights = folder / "model.safetensors"
        if result.passed:
            self.accelerator.wait_for_everyone()
            if self.accelerator.is_main_process:
                folder.mkdir(parents=True, exist_ok=True)
                tmp = folder / "model.safetensors.partial"
                save_model(self.policy, str(tmp))
                os.replace(tmp, weights)  # a kill mid-write leaves the previous pass's weights whole
                (folder / "step.json").write_text(json.dumps({"step": self.global_step}) + "\n")
            self.accelerator.wait_for_everyone()
            return result
        self.accelerator.wait_for_everyone()
        step = self.tripwire.restore_step
        saved = json.loads((folder / "step.json").read_text())["step"] if (folder / "step.json").is_file() else None
        if saved != step:
            raise RuntimeError(f"{folder}: holds the policy of step {saved}, the last passing check is step {step}")
        load_model(self.policy, str(weights), device="cpu")  # read on the CPU, copied into the policy's parameters
        self.tripwire_restored_step = step
        logger.warning("tripwire tripped at step %d (%s): policy of step %d restored from %s", self.global_step,
                       ", ".join(t.signal for t in result.trips), step, weights)
        return result

    def tripwire_record(self) -> dict[str, Any] | None:
        """``Tripwire.record()`` plus the slice's size and whether a gold scorer was used; None when off."""
        if self.tripwire is None:
            return None
        return {**self.tripwire.record(), "n_prompts": len(self.tripwire_prompts),
                "gold_scorer": self.gold_scorer is not None}

    # ---- resume checkpoints -----------------------------------------------------------------------

    def _check_resumable_layout(self) -> None:
        kind = str(self.accelerator.distributed_type).split(".")[-1]
        if kind in ("DEEPSPEED", "FSDP", "MEGATRON_LM", "XLA"):
            raise ValueError(f"PPO resume checkpoints hold whole (unsharded) optimizer states: one process or DDP "
                             f"only, this run is {kind}; set save_steps: 0 and no resume_from_checkpoint")

    def _rng_file(self) -> str:
        n = self.accelerator.num_processes
        return "rng_state.pth" if n == 1 else f"rng_state_{self.accelerator.process_index}.pth"

    def save_state(self) -> Path:
        """Write ``output_dir/checkpoint-<global_step>``, everything a resumed run needs to continue as this one
        would, in the layout ``rlhf.resume`` checks (and ``flows.stages.run_stage`` resumes from):

            model.safetensors   the policy and value model (``PolicyAndValue``'s state dict, tied tensors once)
            optimizer.pt, scheduler.pt
            rng_state.pth       python, numpy, torch CPU and CUDA RNG states (``rng_state_<rank>.pth`` per process)
            trainer_state.json  transformers' ``TrainerState`` (step, num_steps, data epoch, loss per step)
            ppo_state.json      the loop's state: step, kl_coef (adaptive), data position, every step's metrics
            .rlhf-complete      written last, once every rank wrote its files: each file's sha256
                                (``rlhf.resume.mark_complete``); a folder without it is an interrupted save

        Refuses (``rlhf.training_health.TrainingDiverged``) to save non-finite or exploded weights. Keeps the newest
        ``save_total_limit`` checkpoints. Every process calls it. Returns the folder.
        """
        import json
        import random
        import shutil

        import numpy as np
        from safetensors.torch import save_model
        from transformers import TrainerState

        from rlhf.resume import mark_complete, trainer_checkpoints
        from rlhf.training_health import check_weights, local_tensors

        self._check_resumable_layout()
        cfg, step = self.config, self.global_step
        folder = Path(cfg.output_dir) / f"checkpoint-{step}"
        unwrapped = self.accelerator.unwrap_model(self.model)
        check_weights(local_tensors(unwrapped), step)
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            if folder.exists():  # an interrupted save of this step (no marker: never resumed from)
                shutil.rmtree(folder)
            folder.mkdir(parents=True)
            save_model(unwrapped, str(folder / "model.safetensors"))
            torch.save(self.optimizer.state_dict(), folder / "optimizer.pt")
            torch.save(self.scheduler.state_dict(), folder / "scheduler.pt")
            epoch, used = self.data_position
            epoch_float = epoch + used / max(len(self.dataloader), 1)
            TrainerState(
                global_step=step, max_steps=cfg.num_steps, epoch=epoch_float, train_batch_size=cfg.batch_size,
                log_history=[{"step": int(m["step"]), "loss": m["loss/total"]} for m in self.log_history],
            ).save_to_json(str(folder / "trainer_state.json"))
            state = {"global_step": step, "kl_coef": self.kl_coef, "data_epoch": epoch, "data_batches": used,
                     "world_size": self.accelerator.num_processes, "history": self.log_history}
            if self.tripwire is not None:
                state["tripwire"] = {"checks": self.tripwire.record()["checks"], "gold_reference": self._gold_reference}
            (folder / "ppo_state.json").write_text(json.dumps(state) + "\n")
        self.accelerator.wait_for_everyone()
        rng = {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.get_rng_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        torch.save(rng, folder / self._rng_file())
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            mark_complete(folder, global_step=step, epoch=epoch_float, world_size=self.accelerator.num_processes)
            for old in trainer_checkpoints(cfg.output_dir)[cfg.save_total_limit :]:
                shutil.rmtree(old)
        self.accelerator.wait_for_everyone()
        logger.info("resume checkpoint %s written", folder)
        return folder

    def load_state(self, folder: str | os.PathLike[str]) -> int:
        """Continue from a checkpoint :meth:`save_state` wrote (check it first: ``rlhf.resume.resolve_resume``):
        weights, optimizer, scheduler, step, kl_coef, metrics so far, data position, and this process's RNG states,
        restored last. Returns the step. Every process calls it.

        Raises:
            ValueError: the checkpoint was written by another number of processes, or is not a PPO checkpoint
                (no ``ppo_state.json``), or its weights do not match the models.
        """
        import json
        import random

        import numpy as np
        from safetensors.torch import load_model

        self._check_resumable_layout()
        folder = Path(folder)
        state_file = folder / "ppo_state.json"
        if not state_file.is_file():
            raise ValueError(f"{folder}: no ppo_state.json: not a PPO resume checkpoint")
        state = json.loads(state_file.read_text())
        if int(state["world_size"]) != self.accelerator.num_processes:
            raise ValueError(f"{folder}: written by {state['world_size']} process(es), this run has "
                             f"{self.accelerator.num_processes}")
        unwrapped = self.accelerator.unwrap_model(self.model)
        missing, unexpected = load_model(unwrapped, str(folder / "model.safetensors"), strict=False)
        if missing or unexpected:
            raise ValueError(f"{folder / 'model.safetensors'}: does not match the policy and value models "
                             f"(missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]})")
        device = self.accelerator.device
        self.optimizer.load_state_dict(torch.load(folder / "optimizer.pt", map_location=device, weights_only=True))
        self.scheduler.load_state_dict(torch.load(folder / "scheduler.pt", weights_only=True))
        self.global_step = int(state["global_step"])
        self.kl_coef = float(state["kl_coef"])
        self.log_history = list(state["history"])
        self._batches = self._cycle(int(state["data_epoch"]), int(state["data_batches"]))
        self.data_position = (int(state["data_epoch"]), int(state["data_batches"]))
        self.resumed_from, self.resumed_from_step = str(folder.resolve()), self.global_step
        if self.tripwire is not None and "tripwire" in state:  # the checks so far, replayed: the killed run's state
            self.tripwire.replay(state["tripwire"]["checks"])
            self._gold_reference = state["tripwire"]["gold_reference"]
        # the file's sha256 was checked against the completion marker before this: only then is it unpickled
        rng = torch.load(folder / self._rng_file(), weights_only=False)
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        torch.set_rng_state(rng["cpu"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        logger.info("resumed from %s at step %d of %d", folder, self.global_step, self.config.num_steps)
        return self.global_step

    # ---- efficiency -------------------------------------------------------------------------------

    def efficiency(self, seconds: float, dtype: str) -> dict[str, Any]:
        """Throughput and MFU of this process's run, as the other stages report them (``rlhf.efficiency``).

        ``tokens`` = the real (prompt + completion) tokens that went through the update's forward and backward
        passes (each rollout token counted ``ppo_epochs`` times); N = the parameters of the trained pair (policy +
        value model); ``mfu = 6 N tokens_per_s / peak`` over ``seconds`` (the whole loop, rollouts included). The
        rollout's FLOPs (sampling, and the scoring forwards of policy, pi_ref, value and reward models) are not
        counted, as the frozen reference model's forward is not in DPO's MFU: the figure understates what the
        hardware did, by the share ``rollout_seconds / train_seconds`` shows. ``generated_tokens_per_s`` is the
        sampling rate over the rollouts' wall time (scoring included). Per process: multiply by the number of
        processes for the whole run. A resumed run reports the steps it ran itself (after the checkpoint).

        Returns:
            :func:`rlhf.efficiency.efficiency`'s dict plus ``padding_share``, ``batched_tokens``, ``train_seconds``,
            ``generated_tokens``, ``rollout_seconds``, ``generated_tokens_per_s``, ``first_step_seconds``,
            ``steady_step_seconds`` (median of the later steps; None with one step) and ``warmup_seconds``.
        """
        import statistics

        from rlhf.efficiency import efficiency, n_parameters

        out = efficiency(n_parameters(self.accelerator.unwrap_model(self.model)), self.tokens_trained, seconds, dtype)
        first = self.step_seconds[0] if self.step_seconds else None
        steady = statistics.median(self.step_seconds[1:]) if len(self.step_seconds) > 1 else None
        out.update(
            padding_share=1 - self.tokens_trained / self.tokens_batched if self.tokens_batched else None,
            batched_tokens=self.tokens_batched,
            train_seconds=seconds,
            generated_tokens=self.tokens_generated,
            rollout_seconds=self.rollout_seconds,
            generated_tokens_per_s=self.tokens_generated / self.rollout_seconds if self.rollout_seconds else None,
            first_step_seconds=first,
            steady_step_seconds=steady,
            warmup_seconds=None if steady is None else first - steady,
        )
        logger.info("efficiency: %d threads, %.0f update tokens/s, MFU %.2f%% of %.3g FLOP/s (%s), %.0f generated "
                    "tokens/s, rollouts %.0f%% of the time", out["threads"], out["tokens_per_s"],
                    100 * (out["mfu"] or 0), out["peak_flops"], out["peak_source"],
                    out["generated_tokens_per_s"] or 0, 100 * self.rollout_seconds / seconds if seconds else 0)
        return out

    # ---- save -------------------------------------------------------------------------------------

    def save_policy(self, directory: str | os.PathLike[str]) -> Path:
        """Save the policy (safetensors) and tokenizer with ``rlhf.checkpoint.save_checkpoint`` (temp dir, empty-tensor
        check, rename; an existing checkpoint is replaced as a whole).

        The state dict is gathered by accelerate (ZeRO-3 safe) and the saved tensors are read back and compared
        with its shapes, so an empty or truncated save fails here rather than in the next stage.
        """
        final = Path(directory)
        state_dict = self.accelerator.get_state_dict(self.model)
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            policy_sd = {k[len("policy.") :]: v for k, v in state_dict.items() if k.startswith("policy.")}
            save_checkpoint(_GatheredPolicy(self.policy, policy_sd), self.tokenizer, final)
        self.accelerator.wait_for_everyone()
        return final


def tripwire_metrics(result: CheckResult) -> dict[str, float]:
    """A check's numbers as step metrics (``tripwire/*``; a signal not measured is left out)."""
    s = result.signals
    out = {"tripwire/reward": s.reward, "tripwire/passed": float(result.passed)}
    for key in ("gold", "kl", "median_length", "refusal_rate"):
        if getattr(s, key) is not None:
            out[f"tripwire/{key}"] = float(getattr(s, key))
    out.update({f"tripwire/{k}": float(v) for k, v in s.style.items()})
    return out


class _GatheredPolicy:
    """What ``save_checkpoint`` saves: the policy with an explicit (gathered) state dict, checked after writing."""

    def __init__(self, policy: nn.Module, state_dict: dict[str, torch.Tensor]):
        self.policy, self.state_dict = policy, state_dict

    def save_pretrained(self, directory: str | os.PathLike[str], **kwargs: Any) -> None:
        self.policy.save_pretrained(directory, state_dict=self.state_dict, **kwargs)
        check_checkpoint(directory, {k: tuple(v.shape) for k, v in self.state_dict.items()})
