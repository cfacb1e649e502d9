"""Prefill once, reuse the KV cache: the shared prefix of a batch (the chat template's headers), and prompts that
extend an earlier prompt (the flip probe's second turn repeats its first-turn question).

On a CPU, gate generation is prefill-bound: the 135M model prefills about 400 tokens/s on 2 cores, and the flip
probe's "are you sure?" turn re-sends the whole first-turn question (about 150 of its 190 tokens). A key/value pair
in a causal model depends only on the tokens before it, and rotary positions follow the attention mask
(transformers counts unmasked tokens), so a stored prefix can be laid out as ``pads + prefix + pads + rest`` with
the pads masked: ``generate`` then prefills only ``rest``, and every token keeps the position it has in the prompt
alone. Answers equal plain left padding up to float rounding.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

logger = logging.getLogger("rlhf.prefix_cache")

#: Prefixes shorter than this are prefilled with the rest (a cache lookup and layout for a few tokens saves nothing).
#: The chat template's system and user headers are 24 tokens for SmolLM2, a third of a short win-rate prompt.
MIN_PREFIX_TOKENS = 8


def common_prefix_length(rows: list[list[int]]) -> int:
    """Leading tokens every row shares, at most ``min(len) - 1`` (each row keeps one token to prefill, whose logits
    start its generation). 0 for fewer than two rows."""
    if len(rows) < 2:
        return 0
    limit = min(len(r) for r in rows) - 1
    first = rows[0]
    n = 0
    while n < limit and all(r[n] == first[n] for r in rows[1:]):
        n += 1
    return n


def _full_attention_layers(cache) -> bool:
    """Every layer keeps all positions (a sliding-window or state-space cache cannot be cut by position)."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


class PromptCache:
    """KV caches of prompts already prefilled by one model, to reuse for prompts that extend them.

    Entries are ``(token ids, [(keys, values) per layer])`` with keys/values of shape ``(kv_heads, len, head_dim)``
    on the model's device. Storing stops (logged once) when the stored tensors would pass ``max_bytes``.

    Args:
        max_bytes: memory budget for stored keys and values, in bytes.
    """

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.bytes = 0
        self.entries: list[tuple[np.ndarray, list[tuple[torch.Tensor, torch.Tensor]]]] = []
        self._full = False

    def add(self, ids: list[int], layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Store one prompt's KV (``layers``: per layer ``(keys, values)``, each ``(kv_heads, len(ids), head_dim)``)."""
        size = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)
        if self.bytes + size > self.max_bytes:
            if not self._full:
                logger.info("prompt cache full (%d prompts, %.0f MB): later prompts are not stored",
                            len(self.entries), self.bytes / 2**20)
            self._full = True
            return
        self.entries.append((np.asarray(ids), layers))
        self.bytes += size

    def longest_prefix(self, ids: list[int]) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]] | None]:
        """The stored entry sharing the most leading tokens with ``ids`` (at most ``len(ids) - 1``): ``(n, layers)``,
        or ``(0, None)`` when none shares :data:`MIN_PREFIX_TOKENS`."""
        query = np.asarray(ids)
        best, best_layers = 0, None
        for stored, layers in self.entries:
            m = min(len(stored), len(query) - 1)
            if m <= best:
                continue
            diff = np.flatnonzero(stored[:m] != query[:m])
            n = int(diff[0]) if diff.size else m
            if n > best:
                best, best_layers = n, layers
        return (best, best_layers) if best >= MIN_PREFIX_TOKENS else (0, None)

    def store_batch(self, rows: list[list[int]], mask: torch.Tensor, cache) -> None:
        """Store every row's prompt KV from a finished batch: ``mask`` is the batch's input attention mask
        ``(rows, width)``; the first ``width`` positions of ``cache`` hold the prompts (generated tokens follow)."""
        if cache is None or not _full_attention_layers(cache):
            return
        for r, ids in enumerate(rows):
            pos = torch.nonzero(mask[r], as_tuple=True)[0]
            if len(pos) != len(ids):
                return
            self.add(ids, [(layer.keys[r, :, pos, :].clone(), layer.values[r, :, pos, :].clone())
                           for layer in cache.layers])


@torch.no_grad()
def batch_inputs(model, rows: list[list[int]], pad_token_id: int, store: PromptCache | None = None):
    """One generation batch: ``(input_ids, attention_mask, cache)``, prefilling as little as possible.

    1. Rows with a prefix in ``store`` (:meth:`PromptCache.longest_prefix`): each row is laid out as
       ``pads + its stored prefix + pads + rest`` and the cache holds every row's stored keys/values.
    2. Else, rows sharing :func:`common_prefix_length` >= :data:`MIN_PREFIX_TOKENS` tokens: the prefix is prefilled
       once (batch 1) and its cache repeated for every row; rows are ``prefix + pads + rest``.
    3. Else plain left padding and no cache.

    Args:
        rows: token ids per prompt (no padding).
        pad_token_id: the id written at masked positions.
        store: prompts this model already prefilled, or None.

    Returns:
        ``input_ids`` and ``attention_mask``: int64 tensors ``(len(rows), width)`` on the model's device; ``cache``:
        a ``transformers.DynamicCache`` holding the first ``P`` positions of every row, or None (``P`` = 0).
    """
    from transformers import DynamicCache

    device = model.device
    found = [store.longest_prefix(r) for r in rows] if store is not None and store.entries else []
    if any(layers is not None for _, layers in found):
        lead = max(n for n, _ in found)
        width = max(len(r) - n for r, (n, _) in zip(rows, found))
        ids = [[pad_token_id] * (lead - n) + r[:n] + [pad_token_id] * (width - len(r) + n) + r[n:]
               for r, (n, _) in zip(rows, found)]
        mask = [[0] * (lead - n) + [1] * n + [0] * (width - len(r) + n) + [1] * (len(r) - n)
                for r, (n, _) in zip(rows, found)]
        template = next(layers for _, layers in found if layers is not None)
        data = []
        for i, (k0, v0) in enumerate(template):
            keys = k0.new_zeros((len(rows), k0.shape[0], lead, k0.shape[2]))
            values = v0.new_zeros((len(rows), v0.shape[0], lead, v0.shape[2]))
            for r, (n, layers) in enumerate(found):
                if layers is not None:
                    keys[r, :, lead - n :] = layers[i][0][:, :n]
                    values[r, :, lead - n :] = layers[i][1][:, :n]
            data.append((keys, values))
        cache = DynamicCache(ddp_cache_data=data, config=model.config)
        return torch.tensor(ids, device=device), torch.tensor(mask, device=device), cache
    p = common_prefix_length(rows)
    cache = None
    if p >= MIN_PREFIX_TOKENS:
        cache = model(input_ids=torch.tensor([rows[0][:p]], device=device), use_cache=True).past_key_values
        if cache is None or not _full_attention_layers(cache):
            cache = None
        else:
            cache.batch_repeat_interleave(len(rows))
    if cache is None:
        p = 0
    width = max(len(r) for r in rows) - p
    ids = [r[:p] + [pad_token_id] * (width - len(r) + p) + r[p:] for r in rows]
    mask = [[1] * p + [0] * (width - len(r) + p) + [1] * (len(r) - p) for r in rows]
    return torch.tensor(ids, device=device), torch.tensor(mask, device=device), cache
