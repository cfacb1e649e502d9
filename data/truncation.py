"""What survives truncation of ``prompt + completion`` to ``max_length`` tokens, as TRL's collators do it.

TRL 1.16's ``DataCollatorForPreference`` truncates each ``prompt_ids + completion_ids`` sequence to
``max_length``: ``keep_start`` keeps the first tokens (``[:max_length]``), ``keep_end`` the last
(``[-max_length:]``). The pair checks (data/pairs.py) ask the same question of both modes: which tokens does the
model see, and are they different for chosen and rejected?
"""

from __future__ import annotations

TRUNCATION_MODES = ("keep_start", "keep_end")


def kept_tokens(prompt_ids: list[int], completion_ids: list[int], max_length: int | None, mode: str) -> list[int]:
    """Tokens of ``prompt_ids + completion_ids`` left after truncation to ``max_length`` under ``mode``.

    Raises:
        ValueError: ``mode`` is not ``keep_start`` or ``keep_end``.
    """
    if mode not in TRUNCATION_MODES:
        raise ValueError(f"truncation_mode {mode!r}: expected one of {TRUNCATION_MODES}")
    seq = list(prompt_ids) + list(completion_ids)
    if max_length is None or len(seq) <= max_length:
        return seq
    return seq[:max_length] if mode == "keep_start" else seq[-max_length:]


def kept_completion(prompt_ids: list[int], completion_ids: list[int], max_length: int | None, mode: str) -> list[int]:
    """The completion tokens that survive truncation (those that carry the loss)."""
    kept = kept_tokens(prompt_ids, completion_ids, max_length, mode)
    n_prompt_kept = max(0, len(kept) - len(completion_ids)) if mode == "keep_end" else min(len(prompt_ids), len(kept))
    return kept[n_prompt_kept:]
