"""Prefill once, reuse the KV cache: the shared prefix of a batch (the chat template's headers), and prompts that
extend an earlier prompt (the flip probe's second turn repeats its first-turn question).

On a CPU, gate generation is prefill-bound: the 135M model prefills about 400 tokens/s on 2 cores, and the flip
probe's "are you sure?" turn re-sends the whole first-turn question (about 150 of its 190 tokens). A key/value pair
in a causal model depends only on the tokens before it, and rotary positions follow the attention mask
(transformers counts unmasked tokens), so a stored prefix can be laid out as ``pads + prefix + pads + rest`` with
the pads masked: ``generate`` then prefills only ``rest``, and every token keeps the position it has in the prompt
alone. Answers equal plain left padding up to float rounding.

Where bf16 is native but decoding stays fp32 (``rlhf.precision.prefill_precision``), a long row can be prefilled
alone by a bf16 copy of the model and decoded in fp32 from those keys and values (``batch_inputs``, case 0).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import torch
from transformers.cache_utils import DynamicLayer

logger = logging.getLogger("rlhf.prefix_cache")

#: Prefixes shorter than this are prefilled with the rest (a cache lookup and layout for a few tokens saves nothing).
#: The chat template's system and user headers are 24 tokens for SmolLM2, a third of a short win-rate prompt.
MIN_PREFIX_TOKENS = 8

#: A row with at least this many tokens before its last is prefilled alone, from scratch, by the bf16 copy of
#: the model where one is given (``batch_inputs``'s ``prefill_model``). Below it the batched fp32 forward is cheaper
#: than a forward of its own: on the demo gate suites (2 cores, AVX-512 bf16, SmolLM2-135M) prefilling every row
#: alone in bf16 took the multiple-choice suites (89-301 tokens) from 45.7 to 35.8 s but the win-rate suites (most
#: under 100 tokens, 64 new tokens each) from 53.5 to 57.0 s.
BF16_PREFILL_MIN_TOKENS = 128


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
    layers = getattr(cache, "layers", None)
    return bool(layers) and all(type(layer) in (DynamicLayer, ReservedLayer) for layer in layers)


def plain_layers(model) -> bool:
    """The model's default generation cache is full-attention ``DynamicLayer``s only (what this module can lay out
    by position and :class:`ReservedLayer` can replace)."""
    from transformers import DynamicCache

    try:
        return _full_attention_layers(DynamicCache(config=model.config))
    except Exception:  # a config the cache cannot read (encoder-decoder, custom code): leave generation alone
        return False


class ReservedLayer(DynamicLayer):
    """A full-attention KV layer that writes new positions into a buffer with spare room instead of
    ``torch.cat``-ing them on: ``DynamicLayer`` copies the whole cache once per generated token (O(L) a step),
    42% of a decode step at 16 rows x 1,900 cached tokens on a CPU (135M model); here a step writes its own
    position. ``keys`` / ``values`` are views ``buffer[..., :length, :]``, so everything that reads a
    ``DynamicLayer`` reads this one; an operation that replaces them (batch selection, repeat) makes the next
    ``update`` copy into a new buffer. Values and answers equal ``DynamicLayer``'s.

    Args:
        reserve: positions of spare room allocated whenever the buffer is (re)allocated (``max_new_tokens`` + 1
            for a generation: one allocation per batch).
    """

    def __init__(self, reserve: int = 64, **kwargs):
        super().__init__(**kwargs)
        self.reserve = max(int(reserve), 1)
        self._key_buffer = self._value_buffer = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = self.keys.shape[-2] if self.keys.numel() else 0
        end = n + key_states.shape[-2]
        kb, vb = self._key_buffer, self._value_buffer
        if (kb is None or kb.shape[-2] < end or kb.shape[:2] != key_states.shape[:2]
                or vb.shape[:2] != value_states.shape[:2] or kb.dtype != key_states.dtype
                or (n and (self.keys.data_ptr() != kb.data_ptr() or self.values.data_ptr() != vb.data_ptr()))):
            kb = key_states.new_empty((*key_states.shape[:2], end + self.reserve, key_states.shape[-1]))
            vb = value_states.new_empty((*value_states.shape[:2], end + self.reserve, value_states.shape[-1]))
            if n:
                kb[..., :n, :] = self.keys
                vb[..., :n, :] = self.values
            self._key_buffer, self._value_buffer = kb, vb
        kb[..., n:end, :] = key_states
        vb[..., n:end, :] = value_states
        self.keys, self.values = kb[..., :end, :], vb[..., :end, :]
        return self.keys, self.values

    def reset(self) -> None:
        self._key_buffer = self._value_buffer = None
        super().reset()


def reserved_cache(model, reserve: int, data: list[tuple[torch.Tensor, torch.Tensor]] | None = None):
    """A ``transformers.DynamicCache`` of :class:`ReservedLayer` (spare room for ``reserve`` positions), holding
    ``data`` (per layer ``(keys, values)``, each ``(batch, kv_heads, len, head_dim)``) or empty. Only for models
    whose default cache is :func:`plain_layers`."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    cache.layers = [ReservedLayer(reserve=reserve) for _ in cache.layers]
    for layer, (keys, values) in zip(cache.layers, data or []):
        layer.update(keys, values)
    return cache


class PromptCache:
    """KV caches of prompts already prefilled by one model, to reuse for prompts that extend them.

    Entries are ``(token ids, [(keys, values) per layer])`` with keys/values of shape ``(kv_heads, len, head_dim)``
    on the model's device. Storing stops (logged once) when the stored tensors would pass ``max_bytes``.

    It also holds, apart, the bf16 copy's keys and values of prompts the copy prefilled (``batch_inputs``, case 0),
    by their exact token ids: a later prompt that declares one of them as its prefix (``generate_report``'s
    ``prefixes``) prefills only its own rest on top. They are kept while :attr:`keep_copies` is True (a prefix a
    later prompt declares is always stored when it is computed); both kinds share ``max_bytes``.

    Args:
        max_bytes: memory budget for stored keys and values, in bytes.
        keep_copies: also keep the copy's keys and values of every prompt the copy prefills (set it while
            generating prompts that later prompts will extend, e.g. the flip probe's first turn).
    """

    def __init__(self, max_bytes: int, keep_copies: bool = False):
        self.max_bytes = max_bytes
        self.keep_copies = keep_copies
        self.bytes = 0
        self.entries: list[tuple[np.ndarray, list[tuple[torch.Tensor, torch.Tensor]]]] = []
        self.copies: dict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self._full = False

    def _fits(self, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> bool:
        """Count ``layers``' bytes against ``max_bytes``; False (logged once) when they would pass it."""
        size = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)
        if self.bytes + size > self.max_bytes:
            if not self._full:
                logger.info("prompt cache full (%d prompts, %d copy prefixes, %.0f MB): later prompts are not stored",
                            len(self.entries), len(self.copies), self.bytes / 2**20)
            self._full = True
            return False
        self.bytes += size
        return True

    def add(self, ids: list[int], layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Store one prompt's KV (``layers``: per layer ``(keys, values)``, each ``(kv_heads, len(ids), head_dim)``)."""
        if self._fits(layers):
            self.entries.append((np.asarray(ids), layers))

    def add_copy(self, ids: list[int], layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Store the bf16 copy's prefill of ``ids`` but its last token (``layers``: per layer ``(keys, values)``,
        each ``(kv_heads, len(ids) - 1, head_dim)``, as the copy computed them)."""
        key = tuple(ids)
        if key not in self.copies and self._fits(layers):
            self.copies[key] = layers

    def copy_of(self, ids: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        """The copy's stored prefill of exactly ``ids`` (:meth:`add_copy`), or None."""
        return self.copies.get(tuple(ids))

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

    def store_batch(self, rows: list[list[int]], mask: torch.Tensor, cache, skip: list[bool] | None = None) -> None:
        """Store every row's prompt KV from a finished batch: ``mask`` is the batch's input attention mask
        ``(rows, width)``; the first ``width`` positions of ``cache`` hold the prompts (generated tokens follow).
        ``skip``: rows not to store (those a bf16 copy prefilled: the store holds the model's own keys only)."""
        if cache is None or not _full_attention_layers(cache):
            return
        for r, ids in enumerate(rows):
            if skip is not None and skip[r]:
                continue
            pos = torch.nonzero(mask[r], as_tuple=True)[0]
            if len(pos) != len(ids):
                return
            self.add(ids, [(layer.keys[r, :, pos, :].clone(), layer.values[r, :, pos, :].clone())
                           for layer in cache.layers])


def prefilled_by_copy(ids: list[int], min_tokens: int = BF16_PREFILL_MIN_TOKENS) -> bool:
    """Whether ``batch_inputs`` with a ``prefill_model`` prefills this prompt by the copy: all but its last token
    number at least ``min_tokens``. Such a prompt is prefilled from scratch and never stored, so its keys and values
    are a function of its own tokens only."""
    return len(ids) - 1 >= min_tokens


def _shared_length(a: list[int], b: list[int]) -> int:
    """Leading tokens ``a`` and ``b`` share."""
    m = min(len(a), len(b))
    diff = np.flatnonzero(np.asarray(a[:m]) != np.asarray(b[:m]))
    return int(diff[0]) if diff.size else m


def _copy_prefill(prefill_model, ids: list[int], prefix: list[int] | None, store: PromptCache | None,
                  out_dtype: torch.dtype) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]]]:
    """Case 0 of :func:`batch_inputs`: ``ids`` prefilled by the bf16 copy alone; returns ``(n, layers)``
    (:meth:`PromptCache.longest_prefix`'s form: keys/values of the first ``n`` tokens, cast to ``out_dtype``).

    From scratch (``n = len(ids) - 1``), unless ``prefix`` (the token ids of an earlier prompt that ``ids`` extends,
    e.g. the flip probe's first turn) shares at least :data:`MIN_PREFIX_TOKENS` leading tokens with it: then those
    positions (at most ``len(prefix) - 1``, what the prefix's own copy prefill computes) hold the copy's prefill of
    ``prefix`` alone, read from ``store`` when it has it and computed (and stored) when not; the rest is prefilled
    on top by the copy when it has at least :data:`BF16_PREFILL_MIN_TOKENS` tokens before its last, else it is
    left to the batched forward of ``model``, as a short prompt's is. Either way the copy's keys are a function of
    ``ids`` and ``prefix`` only, never of what was stored before."""
    n, past = 0, None
    if prefix is not None:
        n = min(_shared_length(ids, prefix), len(prefix) - 1, len(ids) - 1)
        if n >= MIN_PREFIX_TOKENS:
            past = store.copy_of(prefix) if store is not None else None
            if past is None:
                _, past = _prefill_alone(prefill_model, prefix, 0, None)
                if store is not None:
                    store.add_copy(prefix, past)
        else:
            n = 0
    if past is None or prefilled_by_copy(ids[n:]):
        n, past = _prefill_alone(prefill_model, ids, n, past)
    layers = [(k[:, :n], v[:, :n]) for k, v in past]
    if store is not None and store.keep_copies and n == len(ids) - 1:
        store.add_copy(ids, layers)
    return n, [(k.to(out_dtype), v.to(out_dtype)) for k, v in layers]


def _output_cache(out):
    """A forward's KV cache (``cache`` in recent transformers, ``past_key_values`` before)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def _prefill_alone(model, ids: list[int], n: int, layers,
                   out_dtype: torch.dtype | None = None) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]] | None]:
    """Prefill ``ids`` but its last token alone (batch 1), on top of its first ``n`` tokens' stored ``layers`` (per
    layer ``(keys, values)`` of shape ``(kv_heads, >= n, head_dim)``) when given. Returns ``(len(ids) - 1, layers)``
    in :meth:`PromptCache.longest_prefix`'s form; ``(n, layers)`` unchanged when nothing is left to prefill.
    The returned keys/values are cast to ``out_dtype`` (default: as computed), so a bf16 copy of the model can
    prefill for an fp32 decode."""
    from transformers import DynamicCache

    if len(ids) - 1 <= n:
        return n, layers
    past = None
    if layers is not None and n > 0:
        past = DynamicCache(ddp_cache_data=[(k[None, :, :n], v[None, :, :n]) for k, v in layers], config=model.config)
    x = torch.tensor([ids[n:-1]], device=model.device)
    try:
        out = model(input_ids=x, cache=past, use_cache=True, logits_to_keep=1)
    except TypeError:  # a model whose forward takes no logits_to_keep (custom code): all positions are scored
        out = model(input_ids=x, cache=past, use_cache=True)
    cast = (lambda t: t) if out_dtype is None else (lambda t: t.to(out_dtype))
    return len(ids) - 1, [(cast(layer.keys[0]), cast(layer.values[0])) for layer in _output_cache(out).layers]


@torch.no_grad()
def batch_inputs(model, rows: list[list[int]], pad_token_id: int, store: PromptCache | None = None, *,
                 prefill_alone: Callable[[list[int]], bool] | bool = False, reserve: int = 0,
                 prefill_model=None, prefixes: list[list[int] | None] | None = None):
    """One generation batch: ``(input_ids, attention_mask, cache)``, prefilling as little as possible.

    0. With ``prefill_model`` (a bf16 copy of ``model``; ``rlhf.precision.prefill_precision``), every row with at
       least :data:`BF16_PREFILL_MIN_TOKENS` tokens before its last (:func:`prefilled_by_copy`) is prefilled alone
       by it, from scratch (the store's fp32 prompts are not read for it), or, where the row declares a prefix
       (``prefixes``), from the copy's prefill of that prefix with the rest on top (:func:`_copy_prefill`: a short
       rest is left to the batched forward; a row whose declared prefix is too short for the copy is the fp32
       model's, as in 1); its keys/values are cast to ``model``'s dtype and laid out as in 1. The
       rule reads the row's own tokens and its declared prefix only, also for a batch of one, so the copy's part of
       a row is the same whatever it is batched with or whatever was stored before.
    1. Rows with a prefix in ``store`` (:meth:`PromptCache.longest_prefix`) or from 0: each row is laid out as
       ``pads + its stored prefix + pads + rest`` and the cache holds every row's stored keys/values.
    2. With ``prefill_alone`` (True, or a rule given the tokens each row still has to prefill after its stored
       prefix, ``rlhf.batching.separate_prefill_pays``): every row but its last token is prefilled alone (batch 1:
       no padding, and causal attention that skips the masked half), on top of its stored prefix, then laid out as
       in 1, so the batched forward prefills one token a row.
    3. Else, rows sharing :func:`common_prefix_length` >= :data:`MIN_PREFIX_TOKENS` tokens: the prefix is prefilled
       once (batch 1) and its cache repeated for every row; rows are ``prefix + pads + rest``.
    4. Else plain left padding and no cache.

    Args:
        rows: token ids per prompt (no padding).
        pad_token_id: the id written at masked positions.
        store: prompts this model already prefilled, or None.
        prefill_alone: case 2, always (True), never (False), or where the rule says (only for :func:`plain_layers`
            models; ignored otherwise).
        reserve: > 0: the cache is a :func:`reserved_cache` with room for ``reserve`` more positions, and is
            returned (empty) even when nothing was prefilled; 0: a plain ``DynamicCache`` or None.
        prefill_model: the model that prefills long rows alone (case 0; only for :func:`plain_layers` models), or
            None.
        prefixes: per row, the token ids of an earlier prompt it extends, or None (read in case 0 only).

    Returns:
        ``input_ids`` and ``attention_mask``: int64 tensors ``(len(rows), width)`` on the model's device; ``cache``:
        a ``transformers.DynamicCache`` holding the first ``P`` positions of every row, or None (``P`` = 0 and
        ``reserve`` = 0).
    """
    from transformers import DynamicCache

    device = model.device
    plain = plain_layers(model)
    reserve = reserve if plain else 0

    def make_cache(data):
        return reserved_cache(model, reserve, data) if reserve else DynamicCache(ddp_cache_data=data,
                                                                                 config=model.config)

    prefixes = prefixes or [None] * len(rows)
    # a row extending a prompt the fp32 model prefilled extends that prompt's fp32 keys, as any row finds them
    by_copy = [plain and prefill_model is not None and prefilled_by_copy(r) and (p is None or prefilled_by_copy(p))
               for r, p in zip(rows, prefixes)]
    lookup = store is not None and bool(store.entries)
    # a row the copy prefills does so from scratch, never on a stored prefix: what the store holds depends on the
    # batches before this one
    found = [(0, None) if c or not lookup else store.longest_prefix(r) for r, c in zip(rows, by_copy)]
    if any(by_copy):
        dtype = next(model.parameters()).dtype
        found = [_copy_prefill(prefill_model, r, p, store, dtype) if c else f
                 for r, c, f, p in zip(rows, by_copy, found, prefixes)]
    elif not lookup:
        found = []
    if plain and len(rows) > 1 and prefill_alone:
        known = found or [(0, None)] * len(rows)
        if prefill_alone is True or prefill_alone([len(r) - n for r, (n, _) in zip(rows, known)]):
            found = [_prefill_alone(model, r, n, layers) for r, (n, layers) in zip(rows, known)]
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
        return torch.tensor(ids, device=device), torch.tensor(mask, device=device), make_cache(data)
    p = common_prefix_length(rows)
    cache = None
    if p >= MIN_PREFIX_TOKENS:
        cache = _output_cache(model(input_ids=torch.tensor([rows[0][:p]], device=device), use_cache=True))
        if cache is None or not _full_attention_layers(cache):
            cache = None
        else:
            cache.batch_repeat_interleave(len(rows))
    if cache is None:
        p = 0
    if reserve:
        cache = make_cache([] if cache is None else [(layer.keys, layer.values) for layer in cache.layers])
    width = max(len(r) for r in rows) - p
    ids = [r[:p] + [pad_token_id] * (width - len(r) + p) + r[p:] for r in rows]
    mask = [[1] * p + [0] * (width - len(r) + p) + [1] * (len(r) - p) for r in rows]
    return torch.tensor(ids, device=device), torch.tensor(mask, device=device), cache
