"""Chat special tokens inside message text: refuse (default) or escape them.

A message whose text contains ``<|im_end|>\\n<|im_start|>assistant\\n...`` renders, through the chat template, as
a forged assistant turn: the tokenizer turns the literal string into the real control tokens, so the model is
trained (or judged) on a turn nobody wrote. The tokens checked are the tokenizer's own special tokens
(``all_special_tokens`` plus every added token marked special: for SmolLM2 ``<|im_start|>``, ``<|im_end|>``,
``<|endoftext|>`` and its other control tokens).

Modes (the stages' ``special_tokens_in_text`` option):

* ``refuse`` (default): the row is a bad row naming file, row (0-based), field and the token found;
* ``escape``: a zero-width space (U+200B) is put after the token's first character (``<\\u200b|im_end|>``), so
  the text still reads the same but no longer tokenizes to the control token. Rows changed are logged.
"""

from __future__ import annotations

import logging

from data.schemas import PreferencePair
from data.validation import DataValidationError

logger = logging.getLogger(__name__)

MODES = ("refuse", "escape")
ESCAPE = "\u200b"


def special_tokens(tokenizer) -> list[str]:
    """The tokenizer's special token strings, longest first (so overlapping ones are matched whole)."""
    found = set(getattr(tokenizer, "all_special_tokens", []) or [])
    for tok in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(tok, "special", False):
            found.add(str(tok.content))
    return sorted((t for t in found if t), key=len, reverse=True)


def guard_text(text: str, tokens: list[str], mode: str, *, file: str | None, row: int | None, field: str) -> str:
    """``text`` unchanged if it holds no special token; else escaped (``escape``) or refused (``refuse``).

    Raises:
        DataValidationError: ``refuse`` mode and a token is in the text (names the token and where it is).
        ValueError: unknown mode.
    """
    if mode not in MODES:
        raise ValueError(f"special_tokens_in_text {mode!r}: expected one of {MODES}")
    hits = [t for t in tokens if t in text]
    if not hits:
        return text
    if mode == "refuse":
        raise DataValidationError(
            f"text contains the chat special token {hits[0]!r} (at character {text.index(hits[0])}), which would "
            "render as a control token (a forged turn); remove it or set special_tokens_in_text: escape",
            file=file,
            row=row,
            field=field,
        )
    for t in hits:
        text = text.replace(t, t[0] + ESCAPE + t[1:])
    return text


def guard_messages(messages: list[dict], tokenizer, mode: str, *, file: str | None, row: int | None, field: str):
    """Apply ``guard_text`` to each ``{"role", "content"}`` dict; returns new dicts (fields ``field[i].content``)."""
    tokens = special_tokens(tokenizer)
    return [
        {**m, "content": guard_text(m["content"], tokens, mode, file=file, row=row, field=f"{field}[{i}].content")}
        for i, m in enumerate(messages)
    ]


def guard_pair(pair: PreferencePair, tokenizer, mode: str, *, file: str | None, row: int | None) -> PreferencePair:
    """A preference pair with its prompt, chosen and rejected text guarded (see module docstring)."""
    tokens = special_tokens(tokenizer)
    prompt = [
        m.model_copy(
            update={"content": guard_text(m.content, tokens, mode, file=file, row=row, field=f"prompt[{i}].content")}
        )
        for i, m in enumerate(pair.prompt)
    ]
    chosen = guard_text(pair.chosen, tokens, mode, file=file, row=row, field="chosen")
    rejected = guard_text(pair.rejected, tokens, mode, file=file, row=row, field="rejected")
    unchanged = all(a.content == b.content for a, b in zip(prompt, pair.prompt))
    if unchanged and chosen == pair.chosen and rejected == pair.rejected:
        return pair
    logger.warning("%s row %s: chat special tokens escaped (special_tokens_in_text: escape)", file, row)
    return pair.model_copy(update={"prompt": prompt, "chosen": chosen, "rejected": rejected})

