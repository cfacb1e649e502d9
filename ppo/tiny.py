"""Tiny models and a tokenizer built from code, for tests and smoke runs (no hub, seconds on a CPU).

The tokenizer mirrors SmolLM2's pitfall on purpose: pad == eos == ``<|im_end|>``, which is also the
end-of-turn token of the chat template, so every chat prompt contains an EOS.
"""

from __future__ import annotations

import copy
import string
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification, PreTrainedTokenizerFast

EOS = "<|im_end|>"
BOS = "<|im_start|>"
UNK = "<unk>"
CHAT_TEMPLATE = (
    "{% for m in messages %}" + BOS + "{{ m['role'] }}\n{{ m['content'] }}" + EOS + "\n{% endfor %}"
    "{% if add_generation_prompt %}" + BOS + "assistant\n{% endif %}"
)


def build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level tokenizer: 3 special tokens + printable ASCII; pad == eos; no BOS added on encode."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    chars = sorted(set(string.printable) - set("\r\x0b\x0c"))
    vocab = {EOS: 0, BOS: 1, UNK: 2}
    for c in chars:
        vocab[c] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, pad_token=EOS, unk_token=UNK, bos_token=BOS, add_bos_token=False
    )
    fast.add_special_tokens({"additional_special_tokens": [BOS]})
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_llama_config(vocab_size: int, pad_token_id: int = 0, eos_token_id: int = 0, **overrides) -> LlamaConfig:
    kwargs = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=vocab_size,
        max_position_embeddings=256,
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        bos_token_id=1,
        tie_word_embeddings=False,
    )
    kwargs.update(overrides)
    return LlamaConfig(**kwargs)


def build_tiny_models(
    tokenizer: PreTrainedTokenizerFast, seed: int = 0, **config_overrides
) -> dict[str, torch.nn.Module]:
    """policy, ref (an independent deep copy of the policy), reward and value (a copy of the reward model)."""
    torch.manual_seed(seed)
    cfg = tiny_llama_config(len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id, **config_overrides)
    policy = LlamaForCausalLM(cfg)
    ref = copy.deepcopy(policy)
    rm_cfg = tiny_llama_config(
        len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id, num_labels=1, **config_overrides
    )
    reward = LlamaForSequenceClassification(rm_cfg)
    value = copy.deepcopy(reward)
    return {"policy": policy, "ref": ref, "reward": reward, "value": value}


def save_tiny_models(root: str | Path, seed: int = 0) -> dict[str, Path]:
    """Save tiny policy / ref / reward models (with the tokenizer) under ``root``; return their directories."""
    root = Path(root)
    tokenizer = build_tiny_tokenizer()
    models = build_tiny_models(tokenizer, seed=seed)
    paths = {}
    for name in ("policy", "ref", "reward"):
        d = root / name
        models[name].save_pretrained(d)
        tokenizer.save_pretrained(d)
        paths[name] = d
    return paths
