"""Turn SFT conversations into TRL prompt/completion rows and refuse the known tokenization pitfalls.

Per row (DESIGN.md "Known pitfalls"):
    * the prompt render (with the generation prompt) must be a token prefix of the full render, otherwise
      completion-only masking labels the wrong tokens;
    * no double BOS after rendering the template and tokenizing again;
    * the completion must end in the end-of-turn/EOS token, and that token must get a real label (pad == eos on
      SmolLM2, so padding is masked by position, never by token id: TRL's collator does this);
    * over ``max_length``, whole earlier turns are dropped from the prompt (never the completion's end, which
      would cut the EOS); a row whose final reply alone does not fit has no place to put its EOS and is an error.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from data.special_tokens import guard_messages
from data.validation import DataValidationError

logger = logging.getLogger(__name__)


@dataclass
class PreparedSFT:
    """Rows in TRL prompt/completion format plus what preparation did to them."""

    rows: list[dict]
    n_prompt_turns_dropped: int = 0  # rows whose oldest turns were dropped to fit max_length
    rejects: list[DataValidationError] = field(default_factory=list)


def _ids(tokenizer, text: str) -> list[int]:
    # The chat template already renders any special tokens; adding them again is the double-BOS pitfall.
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def check_row(
    tokenizer, prompt: list[dict], completion: list[dict], max_length: int | None, *, file: str, row: int
) -> int:
    """Validate one prompt/completion row; returns its number of completion (trainable) tokens.

    Raises:
        DataValidationError: naming file, row, field and reason.
    """
    prompt_text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    full_text = tokenizer.apply_chat_template(prompt + completion, tokenize=False)
    p_ids, f_ids = _ids(tokenizer, prompt_text), _ids(tokenizer, full_text)
    if f_ids[: len(p_ids)] != p_ids:
        raise DataValidationError(
            "prompt render is not a token prefix of the full render", file=file, row=row, field="messages"
        )
    bos = tokenizer.bos_token_id
    if bos is not None and len(f_ids) > 1 and f_ids[0] == bos and f_ids[1] == bos:
        raise DataValidationError("double BOS after rendering the chat template", file=file, row=row, field="messages")
    completion_ids = f_ids[len(p_ids) :]
    if not completion_ids:
        raise DataValidationError("no trainable (completion) tokens", file=file, row=row, field="messages")
    eos = tokenizer.eos_token_id
    # Templates may follow the end-of-turn token with whitespace ("<|im_end|>\n"): look past trailing whitespace.
    tail = list(completion_ids)
    while tail and tail[-1] != eos and tokenizer.decode([tail[-1]]).strip() == "":
        tail.pop()
    if not tail or tail[-1] != eos:
        raise DataValidationError(
            f"completion does not end in EOS {tokenizer.eos_token!r}", file=file, row=row, field="messages"
        )
    if max_length is not None and len(f_ids) > max_length:
        raise DataValidationError(
            f"{len(f_ids)} tokens > max_length {max_length}: truncation would cut the EOS",
            file=file,
            row=row,
            field="messages",
        )
    return len(completion_ids)


def prepare_sft_rows(
    conversations, tokenizer, max_length: int | None, *, file: str, special_tokens: str = "refuse"
) -> PreparedSFT:
    """Conversations -> ``{"id", "prompt", "completion"}`` rows (conversational, TRL format).

    The completion is the final assistant turn; earlier turns are the prompt. Rows over ``max_length`` lose their
    oldest (user, assistant) turn pairs until they fit. Bad rows are returned in ``rejects`` (never dropped
    silently); the caller decides between strict and lenient handling. Chat special tokens inside message text
    are refused or escaped per ``special_tokens`` (data/special_tokens.py).
    """
    out = PreparedSFT(rows=[])
    for i, conv in enumerate(conversations):
        msgs = [{"role": m.role, "content": m.content} for m in conv.messages]
        try:
            msgs = guard_messages(msgs, tokenizer, special_tokens, file=file, row=i, field="messages")
        except DataValidationError as err:
            out.rejects.append(DataValidationError(f"{err.reason} (id {conv.id})", file=file, row=i, field=err.field))
            continue
        prompt, completion = msgs[:-1], msgs[-1:]
        system = [m for m in prompt[:1] if m["role"] == "system"]
        turns = prompt[len(system) :]
        dropped = False
        while True:
            try:
                check_row(tokenizer, system + turns, completion, max_length, file=file, row=i)
            except DataValidationError as err:
                if "max_length" in err.reason and len(turns) > 1:
                    turns, dropped = turns[2:], True  # drop the oldest user+assistant pair; the last user turn stays
                    continue
                out.rejects.append(
                    DataValidationError(f"{err.reason} (id {conv.id})", file=file, row=i, field=err.field)
                )
            else:
                out.n_prompt_turns_dropped += dropped
                out.rows.append({"id": conv.id, "prompt": system + turns, "completion": completion})
            break
    return out


def check_fully_masked(train_dataset, rows: list[dict], max_rate: float, *, file: str) -> list:
    """Name and count the rows TRL's SFTTrainer dropped as fully masked, and stop above ``max_rate``.

    TRL 1.16 drops rows whose labels are all masked ("Dropping fully masked examples") without naming them. The
    trainer's tokenized ``train_dataset`` keeps each row's ``id``; the ids of ``rows`` missing from it are logged.

    Returns:
        the dropped rows' ids (empty when the dataset has no ``id`` column to compare).

    Raises:
        DataValidationError: their share exceeds ``max_rate`` (names the first ids).
    """
    if "id" not in train_dataset.column_names:
        return []
    kept = set(train_dataset["id"])
    lost = [r["id"] for r in rows if r["id"] not in kept]
    if lost:
        logger.warning("TRL dropped %d fully masked rows: %s", len(lost), lost[:20])
    if lost and len(lost) / len(rows) > max_rate:
        raise DataValidationError(f"{len(lost)} rows fully masked after tokenization (ids {lost[:10]})", file=file,
                                  field="messages")
    return lost
