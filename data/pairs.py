"""Refuse the truncation pitfalls of preference pairs before DPO / reward training (DESIGN.md "Known pitfalls").

TRL truncates ``prompt + completion`` to ``max_length`` keeping the start, and silently drops a pair whose prompt
alone fills the budget. Here, per pair and before any training:

    * a prompt over budget loses its oldest (user, assistant) turns, keeping the last user turn;
    * a prompt that still leaves no room for a completion token is an error (prompt budget >= max length);
    * a side left with zero completion tokens after truncation is an error (its log-prob would be NaN);
    * chosen and rejected that become identical after truncation are an error (the pair teaches nothing and
      its margin is 0 by construction).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from data.schemas import Message, PreferencePair
from data.special_tokens import guard_pair
from data.truncation import kept_completion, kept_tokens
from data.validation import DataValidationError


@dataclass
class PreparedPairs:
    pairs: list[PreferencePair]
    n_prompt_turns_dropped: int = 0
    n_completion_truncated: int = 0
    rejects: list[DataValidationError] = field(default_factory=list)


def _n_tokens(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def prepare_pairs(
    pairs: list[PreferencePair],
    tokenizer,
    max_length: int | None,
    *,
    file: str,
    min_completion_tokens: int = 1,
    require_fit: bool = False,
    truncation_mode: str = "keep_start",
    special_tokens: str = "refuse",
) -> PreparedPairs:
    """Check and fit each pair to ``max_length`` (tokens, prompt + one completion).

    ``truncation_mode``: TRL's (``keep_start`` / ``keep_end``); the identical-after-truncation and
    zero-completion-token checks look at the tokens that mode keeps. ``special_tokens``: ``refuse`` or ``escape``
    chat special tokens inside the text (data/special_tokens.py).

    ``require_fit``: a pair whose prompt + longer completion still exceeds ``max_length`` (after dropping old
    turns) is an error instead of being truncated. TRL's RewardTrainer drops such pairs silently, so the reward
    stage asks for this.

    Returns:
        ``PreparedPairs`` with the pairs that are safe to train on (prompts possibly shortened) and one
        ``DataValidationError`` per refused pair (file, row, field, reason). Nothing is dropped silently.
    """
    out = PreparedPairs(pairs=[])
    for i, pair in enumerate(pairs):
        try:  # chat special tokens inside the text would forge turns (data/special_tokens.py)
            pair = guard_pair(pair, tokenizer, special_tokens, file=file, row=i)
        except DataValidationError as err:
            out.rejects.append(err)
            continue
        prompt = list(pair.prompt)
        system = [m for m in prompt[:1] if m.role == "system"]
        turns = prompt[len(system) :]
        dropped = False

        def render(ms: list[Message]) -> list[int]:
            text = tokenizer.apply_chat_template(
                [m.model_dump(include={"role", "content"}) for m in ms], tokenize=False, add_generation_prompt=True
            )
            return _n_tokens(tokenizer, text)

        p_ids = render(system + turns)
        longest = max(len(_n_tokens(tokenizer, pair.chosen)), len(_n_tokens(tokenizer, pair.rejected))) + 2
        while max_length is not None and len(p_ids) + longest > max_length and len(turns) > 1:
            turns, dropped = turns[2:], True
            p_ids = render(system + turns)
        budget = None if max_length is None else max_length - len(p_ids)
        try:
            if budget is not None and budget < min_completion_tokens:
                raise DataValidationError(
                    f"prompt alone is {len(p_ids)} tokens >= max_length {max_length}", file=file, row=i, field="prompt"
                )
            c_ids, r_ids = _n_tokens(tokenizer, pair.chosen), _n_tokens(tokenizer, pair.rejected)
            for name, ids in (("chosen", c_ids), ("rejected", r_ids)):
                if len(kept_completion(p_ids, ids, max_length, truncation_mode)) < min_completion_tokens:
                    raise DataValidationError("zero completion tokens after truncation", file=file, row=i, field=name)
            if require_fit and budget is not None and max(len(c_ids), len(r_ids)) + 2 > budget:
                raise DataValidationError(
                    f"{len(p_ids)} prompt + {max(len(c_ids), len(r_ids))} completion tokens "
                    f"exceed max_length {max_length}",
                    file=file,
                    row=i,
                    field="chosen",
                )
            if truncation_mode == "keep_end" and kept_tokens(p_ids, c_ids, max_length, truncation_mode) == kept_tokens(
                p_ids, r_ids, max_length, truncation_mode
            ):
                raise DataValidationError(
                    f"chosen and rejected identical after truncation_mode keep_end to the last {max_length} tokens",
                    file=file,
                    row=i,
                    field="rejected",
                )
            if truncation_mode == "keep_start" and budget is not None and c_ids[:budget] == r_ids[:budget]:
                raise DataValidationError(
                    f"chosen and rejected identical after truncation to {budget} tokens",
                    file=file,
                    row=i,
                    field="rejected",
                )
        except DataValidationError as err:
            err.reason = f"{err.reason} (id {pair.id})"
            out.rejects.append(err)
            continue
        out.n_prompt_turns_dropped += dropped
        out.n_completion_truncated += budget is not None and max(len(c_ids), len(r_ids)) > budget
        out.pairs.append(pair.model_copy(update={"prompt": system + turns}) if dropped else pair)
    return out
