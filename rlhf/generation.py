"""Batched greedy generation with KV cache and left padding (DESIGN.md: 8 tok/s one at a time, 57 tok/s at 16)."""

from __future__ import annotations

import torch
from tqdm.auto import tqdm


def chat_prompt(tokenizer, prompt: list[dict] | str) -> str:
    """Render a prompt (messages or a user string) with the generation prompt appended."""
    msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)


@torch.no_grad()
def generate(
    model,
    tokenizer,
    prompts: list,
    *,
    max_new_tokens: int = 128,
    batch_size: int = 16,
    max_prompt_length: int = 512,
    desc: str = "generating",
) -> tuple[list[str], list[int]]:
    """Greedy completions for chat prompts.

    Prompts are sorted by length (less padding), left-padded (so every row's next token sits at the last position)
    and generated with the KV cache; outputs come back in the input order and are identical to one-at-a-time
    greedy decoding up to float rounding.

    Args:
        prompts: chat messages or user strings.
        max_new_tokens: cap on generated tokens per prompt.
        max_prompt_length: longer prompts keep their last tokens (the question is at the end).

    Returns:
        ``(texts, n_tokens)``: decoded completions without special tokens, and generated token counts
        (up to and including the first EOS), each of length ``len(prompts)``.
    """
    model.eval()
    texts = [chat_prompt(tokenizer, p) for p in prompts]
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    outs: list[str] = [""] * len(texts)
    lengths: list[int] = [0] * len(texts)
    tokenizer.padding_side, tokenizer.truncation_side = "left", "left"
    eos = tokenizer.eos_token_id
    for start in tqdm(range(0, len(order), batch_size), desc=desc):
        idx = order[start : start + batch_size]
        enc = tokenizer(
            [texts[i] for i in idx],
            return_tensors="pt",
            padding=True,
            truncation=True,
            max_length=max_prompt_length,
            add_special_tokens=False,
        ).to(model.device)
        gen = model.generate(
            **enc,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            use_cache=True,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=eos,
            temperature=None,
            top_p=None,
            top_k=None,
        )
        new = gen[:, enc["input_ids"].shape[1] :]
        for row, i in zip(new.tolist(), idx):
            n = row.index(eos) + 1 if eos in row else len(row)
            lengths[i] = n
            outs[i] = tokenizer.decode(row[:n], skip_special_tokens=True).strip()
    return outs, lengths
