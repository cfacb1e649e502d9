"""Score (prompt, response) pairs with a Bradley-Terry reward model, in batches."""

from __future__ import annotations

import numpy as np
import torch
from tqdm.auto import tqdm


def render(tokenizer, prompt: list[dict] | str, response: str) -> str:
    """Chat-template render of a prompt (messages or a user string) followed by one assistant response."""
    msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    return tokenizer.apply_chat_template(msgs + [{"role": "assistant", "content": response}], tokenize=False)


@torch.no_grad()
def score(
    model,
    tokenizer,
    prompts: list,
    responses: list[str],
    *,
    batch_size: int = 8,
    max_length: int = 512,
    desc: str = "scoring",
) -> np.ndarray:
    """Reward of each (prompt, response).

    Args:
        model: an ``AutoModelForSequenceClassification`` with ``num_labels=1`` (put in eval mode here).
        prompts: chat messages or user strings, one per response.
        responses: assistant responses, same length as ``prompts``.

    Returns:
        float64 array of shape ``(len(responses),)``: the score head's output at the last non-pad token.

    Raises:
        ValueError: the two lists differ in length.
    """
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
    model.eval()
    texts = [render(tokenizer, p, r) for p, r in zip(prompts, responses)]
    # Longest first keeps padding small; the original order is restored below.
    order = np.argsort([-len(t) for t in texts], kind="stable")
    out = np.empty(len(texts), dtype=np.float64)
    tokenizer.padding_side = "right"
    for start in tqdm(range(0, len(texts), batch_size), desc=desc, disable=len(texts) <= batch_size):
        idx = order[start : start + batch_size]
        # Truncate from the left so the response end (where the score is read) is always kept.
        tokenizer.truncation_side = "left"
        enc = tokenizer(
            [texts[i] for i in idx],
            return_tensors="pt",
            padding=True,
            truncation=True,
            max_length=max_length,
            add_special_tokens=False,
        ).to(model.device)
        out[idx] = model(**enc).logits[:, 0].float().cpu().numpy()
    return out
