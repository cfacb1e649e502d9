"""A character-level tokenizer built from code, for the PPO trainer tests (the models come from rlhf.models).

It mirrors SmolLM2's pitfall on purpose: pad == eos == ``<|im_end|>``, which is also the end-of-turn token of
its chat template, so every chat prompt contains an EOS; unlike SmolLM2's template it adds no system turn, so a
prompt's tokens can be counted by hand.
"""

from __future__ import annotations

import string

from transformers import PreTrainedTokenizerFast

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
