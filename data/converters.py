"""Pure converters from the shared dataset formats to :mod:`data.schemas`.

Every converter takes one raw row (a mapping, as read from JSON/JSONL/CSV or a HF dataset) and
returns one validated object, or raises :class:`~data.validation.DataValidationError` naming the
field of the *source* row and the reason (``file``/``row`` are filled in by
:func:`data.validation.validate_rows`, or can be passed by the caller).

Ids: a converter uses the row's own id field when the format has one (``id``, PandaLM ``idx``,
HarmBench ``BehaviorID``, ...); otherwise the ``id`` argument (loaders pass ``"<file stem>-<row>"``);
otherwise a content hash (``"<prefix>-<sha256[:12]>"``), so ids are always stable.

Formats:

* HH-RLHF transcripts (``"\\n\\nHuman: ...\\n\\nAssistant: ..."``): :func:`hh_to_pair`,
  :func:`hh_to_conversation`. Turns are split on the role markers; content is stripped of
  surrounding whitespace.
* TRL conversational rows: :func:`native_to_pair` (explicit prompt), :func:`implicit_to_pair`
  (full ``chosen``/``rejected`` conversations), :func:`native_to_conversation`,
  :func:`prompt_completion_to_conversation`.
* PandaLM test set: :func:`pandalm_to_pair`; PandaLM judge files: :func:`pandalm_judge_to_label`.
* AlpacaEval annotations: :func:`alpaca_eval_to_record`, :func:`alpaca_eval_to_prompt`.
* Eval sets: :func:`xstest_to_prompt`, :func:`harmbench_to_prompt`, :func:`advbench_to_prompt`,
  :func:`sycophancy_to_prompt`, :func:`mt_bench_to_prompt`, :func:`pair_to_eval_prompt`,
  :func:`native_to_eval_prompt`.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError
from pydantic_core import PydanticCustomError

from data.schemas import (
    AlpacaEvalRecord,
    AnnotatorLabel,
    Conversation,
    EvalPrompt,
    Message,
    PreferencePair,
    check_turns,
)
from data.validation import DataValidationError

__all__ = [
    "parse_hh_transcript",
    "hh_to_pair",
    "hh_to_conversation",
    "native_to_pair",
    "implicit_to_pair",
    "native_to_conversation",
    "implicit_to_conversation",
    "prompt_completion_to_conversation",
    "instruction_to_conversation",
    "pandalm_prompt",
    "pandalm_to_pair",
    "pandalm_judge_to_label",
    "alpaca_eval_to_record",
    "alpaca_eval_to_prompt",
    "xstest_to_prompt",
    "harmbench_to_prompt",
    "advbench_to_prompt",
    "sycophancy_to_prompt",
    "mt_bench_to_prompt",
    "pair_to_eval_prompt",
    "native_to_eval_prompt",
]

_HH_MARKER = re.compile(r"(?:^|\n\n)(Human|Assistant):")
_HH_ROLES = {"Human": "user", "Assistant": "assistant"}
_TURN_INDEX = re.compile(r"\[(\d+)\]")


# --------------------------------------------------------------------------------------- helpers


def _require_mapping(row: Any) -> Mapping[str, Any]:
    if not isinstance(row, Mapping):
        raise DataValidationError(f"row is a {type(row).__name__}, expected a JSON object / mapping")
    return row


def _get(row: Mapping[str, Any], key: str) -> Any:
    if key not in row:
        raise DataValidationError("missing (field required)", field=key)
    return row[key]


def _text(row: Mapping[str, Any], key: str, *, allow_empty: bool = False, empty_reason: str = "empty") -> str:
    """``row[key]`` as a string, or DataValidationError(field=key)."""
    value = _get(row, key)
    if not isinstance(value, str):
        raise DataValidationError(f"must be a string, got {type(value).__name__} {value!r:.60}", field=key)
    if not allow_empty and not value.strip():
        raise DataValidationError(empty_reason, field=key)
    return value


def _optional_text(row: Mapping[str, Any], key: str) -> str | None:
    """``row[key]`` when it is a non-empty string; ``None`` when absent, null, NaN or empty."""
    value = row.get(key)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if not isinstance(value, str):
        raise DataValidationError(f"must be a string or null, got {type(value).__name__} {value!r:.60}", field=key)
    return value if value.strip() else None


def _content_id(prefix: str, row: Any) -> str:
    blob = json.dumps(row, sort_keys=True, ensure_ascii=False, default=repr).encode("utf-8")
    return f"{prefix}-{hashlib.sha256(blob).hexdigest()[:12]}"


def _row_id(row: Mapping[str, Any], given: str | None, prefix: str, key: str = "id") -> str:
    """The row's own id (``row[key]``), else ``given``, else a content hash."""
    own = row.get(key)
    if own is not None and not (isinstance(own, float) and math.isnan(own)):
        if isinstance(own, bool) or not isinstance(own, (str, int)):
            raise DataValidationError(f"must be a string or an int, got {type(own).__name__}", field=key)
        own = str(own)
        if own.strip():
            return own
    return given if given else _content_id(prefix, row)


def _messages(value: Any, field: str) -> list[Message]:
    """Validate a list of ``{"role", "content"}`` dicts (or Message objects)."""
    if isinstance(value, Message):
        return [value]
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes)):
        raise DataValidationError(f"must be a list of messages, got {type(value).__name__}", field=field)
    out: list[Message] = []
    for i, item in enumerate(value):
        if isinstance(item, Message):
            out.append(item)
            continue
        try:
            out.append(Message.model_validate(item))
        except ValidationError as exc:
            raise DataValidationError.from_pydantic(exc, prefix=f"{field}[{i}]") from exc
    return out


def _check_transcript(messages: list[Message], field: str) -> None:
    """check_turns(final="assistant") with errors reported on ``field`` as ``"turn i: reason"``."""
    try:
        check_turns(messages, field="turns", final="assistant")
    except PydanticCustomError as exc:
        ctx = exc.context or {}
        where = _TURN_INDEX.search(str(ctx.get("field", "")))
        prefix = f"turn {where.group(1)}: " if where else ""
        raise DataValidationError(f"{prefix}{ctx.get('reason', exc.message())}", field=field) from None


def _validate(model: type, data: dict[str, Any]):
    """``model.model_validate(data)``; pydantic errors become DataValidationError (field from ``loc``)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise DataValidationError.from_pydantic(exc) from exc


def _split_final_turn(
    chosen: list[Message], rejected: list[Message], *, chosen_field: str, rejected_field: str
) -> tuple[list[Message], str, str]:
    """Split two full conversations into (shared prompt, chosen reply, rejected reply).

    The split is by *turns*: the prompt is everything before the final assistant turn of each
    side, and the two prompts must be equal turn by turn. (A character-level common prefix
    would be wrong when one reply is a prefix of the other, or when the replies differ at
    their first character.)
    """
    _check_transcript(chosen, chosen_field)
    _check_transcript(rejected, rejected_field)
    prompt_c, prompt_r = chosen[:-1], rejected[:-1]
    if prompt_c != prompt_r:
        first = next(
            (i for i, (a, b) in enumerate(zip(prompt_c, prompt_r, strict=False)) if a != b), min(len(prompt_c), len(prompt_r))
        )
        raise DataValidationError(
            f"context differs from {chosen_field}'s at turn {first} ({len(prompt_c)} vs {len(prompt_r)} turns "
            "before the final reply): a pair must share every turn up to the final assistant turn",
            field=rejected_field,
        )
    reply_c, reply_r = chosen[-1].content, rejected[-1].content
    if reply_c.strip() == reply_r.strip():
        raise DataValidationError(f"final reply identical to {chosen_field}'s", field=rejected_field)
    return list(prompt_c), reply_c, reply_r


# ------------------------------------------------------------------------------------- HH-RLHF


def parse_hh_transcript(text: Any, *, field: str = "transcript") -> list[Message]:
    """Split an HH-RLHF transcript into messages.

    ``"\\n\\nHuman: hi\\n\\nAssistant: hello"`` -> ``[user "hi", assistant "hello"]``. Content is
    stripped of surrounding whitespace; an empty final ``"Assistant:"`` gives an empty message
    (rejected later as "empty assistant turn"). The turn order is *not* checked here.

    Raises:
        DataValidationError(field=field): not a string, no role markers, or text before the first marker.
    """
    if not isinstance(text, str):
        raise DataValidationError(f"must be a string, got {type(text).__name__} {text!r:.60}", field=field)
    parts = _HH_MARKER.split(text)
    if len(parts) < 3:
        raise DataValidationError("not an HH transcript: no '\\n\\nHuman:' / '\\n\\nAssistant:' markers", field=field)
    if parts[0].strip():
        raise DataValidationError(f"text before the first role marker: {parts[0].strip()!r:.60}", field=field)
    return [
        Message(role=_HH_ROLES[parts[i]], content=parts[i + 1].strip())  # type: ignore[arg-type]
        for i in range(1, len(parts), 2)
    ]


def hh_to_pair(row: Mapping[str, Any], *, id: str | None = None, source: str | None = None) -> PreferencePair:
    """HH-RLHF row ``{"chosen": transcript, "rejected": transcript}`` -> PreferencePair.

    The prompt is the turns shared by both transcripts up to (excluding) their final assistant
    turn; ``chosen`` / ``rejected`` are the two final assistant replies.

    Raises:
        DataValidationError: a side is missing / not a string / not a transcript; a transcript
            breaks the turn rules (first turn from the assistant, two turns in a row from the same
            role, ends on a user turn, empty assistant turn -- reported as ``"turn i: ..."`` on that
            side's field); the contexts differ; the final replies are identical.
    """
    row = _require_mapping(row)
    chosen = parse_hh_transcript(_get(row, "chosen"), field="chosen")
    rejected = parse_hh_transcript(_get(row, "rejected"), field="rejected")
    prompt, reply_c, reply_r = _split_final_turn(chosen, rejected, chosen_field="chosen", rejected_field="rejected")
    return _validate(
        PreferencePair,
        {
            "id": _row_id(row, id, "hh"),
            "prompt": prompt,
            "chosen": reply_c,
            "rejected": reply_r,
            "intent": _optional_text(row, "intent"),
            "source": source,
        },
    )


def hh_to_conversation(
    transcript: str | Mapping[str, Any], *, id: str | None = None, source: str | None = None
) -> Conversation:
    """HH-RLHF transcript (or a row, whose ``chosen`` transcript is used) -> SFT Conversation.

    Raises:
        DataValidationError: as :func:`hh_to_pair`, on field ``"chosen"`` (or ``"transcript"``
            when a bare string is given).
    """
    if isinstance(transcript, Mapping):
        row, field = transcript, "chosen"
        messages = parse_hh_transcript(_get(row, "chosen"), field=field)
        conv_id = _row_id(row, id, "hh")
    else:
        field = "transcript"
        messages = parse_hh_transcript(transcript, field=field)
        conv_id = id or _content_id("hh", transcript)
    _check_transcript(messages, field)
    return _validate(Conversation, {"id": conv_id, "messages": messages, "source": source})


# ------------------------------------------------------------------------------ TRL / native rows


def native_to_pair(row: Mapping[str, Any], *, id: str | None = None, source: str | None = None) -> PreferencePair:
    """Native / TRL explicit-prompt row -> PreferencePair.

    Accepted shapes: ``prompt`` a string (one user turn) or a list of messages; ``chosen`` /
    ``rejected`` strings or a one-message assistant list (TRL conversational). Other fields of
    :class:`~data.schemas.PreferencePair` (``id``, ``intent``, ``labels``, ``source``, ``meta``)
    are taken from the row when present.

    Raises:
        DataValidationError: missing/ill-typed fields, bad prompt structure, empty or identical replies.
    """
    row = _require_mapping(row)
    data = dict(row)
    prompt = _get(row, "prompt")
    data["prompt"] = [Message(role="user", content=prompt)] if isinstance(prompt, str) else _messages(prompt, "prompt")
    for side in ("chosen", "rejected"):
        value = _get(row, side)
        if isinstance(value, list):
            msgs = _messages(value, side)
            if len(msgs) != 1 or msgs[0].role != "assistant":
                raise DataValidationError(
                    f"with an explicit prompt, must be one assistant message (got roles {[m.role for m in msgs]})",
                    field=side,
                )
            value = msgs[0].content
        data[side] = value
    data["id"] = _row_id(row, id, "pair")
    data["source"] = row.get("source") or source
    return _validate(PreferencePair, data)


def implicit_to_pair(row: Mapping[str, Any], *, id: str | None = None, source: str | None = None) -> PreferencePair:
    """TRL implicit-prompt row (``chosen`` / ``rejected`` full message lists) -> PreferencePair.

    Split by turns as :func:`hh_to_pair`.
    """
    row = _require_mapping(row)
    chosen = _messages(_get(row, "chosen"), "chosen")
    rejected = _messages(_get(row, "rejected"), "rejected")
    prompt, reply_c, reply_r = _split_final_turn(chosen, rejected, chosen_field="chosen", rejected_field="rejected")
    return _validate(
        PreferencePair,
        {
            "id": _row_id(row, id, "pair"),
            "prompt": prompt,
            "chosen": reply_c,
            "rejected": reply_r,
            "intent": _optional_text(row, "intent"),
            "source": row.get("source") or source,
        },
    )


def native_to_conversation(
    row: Mapping[str, Any], *, id: str | None = None, source: str | None = None
) -> Conversation:
    """Native / TRL ``{"messages": [...]}`` row -> Conversation."""
    row = _require_mapping(row)
    messages = _messages(_get(row, "messages"), "messages")
    return _validate(
        Conversation, {"id": _row_id(row, id, "conv"), "messages": messages, "source": row.get("source") or source}
    )


def implicit_to_conversation(
    row: Mapping[str, Any], *, id: str | None = None, source: str | None = None
) -> Conversation:
    """TRL implicit-preference row -> Conversation from its ``chosen`` message list."""
    row = _require_mapping(row)
    messages = _messages(_get(row, "chosen"), "chosen")
    _check_transcript(messages, "chosen")
    return _validate(
        Conversation, {"id": _row_id(row, id, "conv"), "messages": messages, "source": row.get("source") or source}
    )


def prompt_completion_to_conversation(
    row: Mapping[str, Any], *, id: str | None = None, source: str | None = None
) -> Conversation:
    """TRL prompt-completion row (strings or message lists) -> Conversation."""
    row = _require_mapping(row)
    prompt, completion = _get(row, "prompt"), _get(row, "completion")
    p = [Message(role="user", content=prompt)] if isinstance(prompt, str) else _messages(prompt, "prompt")
    c = (
        [Message(role="assistant", content=completion)]
        if isinstance(completion, str)
        else _messages(completion, "completion")
    )
    return _validate(
        Conversation, {"id": _row_id(row, id, "conv"), "messages": p + c, "source": row.get("source") or source}
    )


def instruction_to_conversation(
    row: Mapping[str, Any], *, id: str | None = None, source: str | None = None
) -> Conversation:
    """Alpaca-style ``{"instruction", "input", "output"}`` row -> Conversation (user = instruction
    [+ "\\n\\n" + input], assistant = output)."""
    row = _require_mapping(row)
    output = _text(row, "output", empty_reason="empty assistant turn")
    return _validate(
        Conversation,
        {
            "id": _row_id(row, id, "conv"),
            "messages": [Message(role="user", content=pandalm_prompt(row)), Message(role="assistant", content=output)],
            "source": source,
        },
    )


# ------------------------------------------------------------------------------------- PandaLM

_ANNOTATOR_KEY = re.compile(r"^annotator(\d+)$")


def pandalm_prompt(row: Mapping[str, Any]) -> str:
    """``instruction`` + ``"\\n\\n" + input`` when ``input`` is non-empty.

    A blank instruction with a non-empty input gives the input alone (PandaLM row 466 has
    instruction ``" "`` and input ``"Truthfulness"``).

    Raises:
        DataValidationError: ``instruction`` missing or not a string, ``input`` not a string,
            both blank.
    """
    instruction = _text(row, "instruction", allow_empty=True)
    extra = _optional_text(row, "input")
    if not instruction.strip():
        if extra is None:
            raise DataValidationError("empty instruction and no input", field="instruction")
        return extra
    return f"{instruction}\n\n{extra}" if extra else instruction


def pandalm_to_pair(row: Mapping[str, Any], *, id: str | None = None, source: str | None = None) -> PreferencePair:
    """PandaLM test-set row -> PreferencePair.

    Orientation is **by position**: ``chosen = response1``, ``rejected = response2``; the
    annotators' ``labels`` (``annotator1..N``: 0 tie, 1 response1 better, 2 response2 better)
    say which is better. ``intent = motivation_app``; ``id = "pandalm-<idx>"``;
    ``meta = {"idx", "cmp_key"}``.

    Raises:
        DataValidationError: on the source field (``response1``, ``annotator2``, ...): a response
            that is not a string (the published file has JSON ``true`` in 6 rows), an empty
            response, identical responses, a label outside {0, 1, 2}.
    """
    row = _require_mapping(row)
    prompt = pandalm_prompt(row)
    replies = [_text(row, key, empty_reason="empty assistant turn") for key in ("response1", "response2")]
    if replies[0].strip() == replies[1].strip():
        raise DataValidationError("identical to response1", field="response2")
    keys = sorted((k for k in row if _ANNOTATOR_KEY.match(str(k))), key=lambda k: int(_ANNOTATOR_KEY.match(k).group(1)))
    labels = []
    for key in keys:
        value = row[key]
        if isinstance(value, bool) or not isinstance(value, int) or value not in (0, 1, 2):
            raise DataValidationError(f"must be the int 0, 1 or 2, got {value!r}", field=key)
        labels.append(AnnotatorLabel(annotator_id=key, preference=value))
    idx = row.get("idx")
    pair_id = f"pandalm-{idx}" if isinstance(idx, int) and not isinstance(idx, bool) else _row_id(row, id, "pandalm")
    meta = {k: row[k] for k in ("idx", "cmp_key") if k in row}
    return _validate(
        PreferencePair,
        {
            "id": pair_id,
            "prompt": [Message(role="user", content=prompt)],
            "chosen": replies[0],
            "rejected": replies[1],
            "intent": _optional_text(row, "motivation_app"),
            "labels": labels or None,
            "source": source,
            "meta": meta,
        },
    )


_JUDGE_VERDICTS = {"0": 0, "tie": 0, "1": 1, "2": 2}


def pandalm_judge_to_label(row: Mapping[str, Any]) -> tuple[str, int | None]:
    """PandaLM judge-file row (``idx`` + ``gpt_result`` or ``pandalm_result``) -> (pair id, verdict).

    The verdict uses the PandaLM convention (0 tie, 1 response1 better, 2 response2 better) and
    is ``None`` when the judge's output could not be parsed (``"garbage"`` in the published
    gpt-3.5 file): an unparsed verdict is a judge failure to be counted, not a bad row.

    Raises:
        DataValidationError: no ``idx`` or no result field.
    """
    row = _require_mapping(row)
    idx = _get(row, "idx")
    if isinstance(idx, bool) or not isinstance(idx, int):
        raise DataValidationError(f"must be an int, got {idx!r}", field="idx")
    key = next((k for k in ("gpt_result", "pandalm_result", "result") if k in row), None)
    if key is None:
        raise DataValidationError("missing (one of gpt_result, pandalm_result, result required)", field="gpt_result")
    verdict = _JUDGE_VERDICTS.get(str(row[key]).strip().lower())
    return f"pandalm-{idx}", verdict


# ---------------------------------------------------------------------------------- AlpacaEval


def alpaca_eval_to_record(row: Mapping[str, Any], *, id: str | None = None) -> AlpacaEvalRecord:
    """AlpacaEval annotation row -> AlpacaEvalRecord (``instruction``, ``output_1``, ``output_2``,
    ``generator_1/2``, ``preference``, ``dataset``, ``annotator``; other fields dropped).

    ``preference`` NaN or null (no verdict) becomes ``None``.

    Raises:
        DataValidationError: missing/non-string text fields; preference outside [1, 2].
    """
    row = _require_mapping(row)
    data = {k: row.get(k) for k in ("generator_1", "generator_2", "dataset", "annotator")}
    for key in ("instruction", "output_1", "output_2"):
        data[key] = _text(row, key, allow_empty=key != "instruction", empty_reason="empty instruction")
    pref = row.get("preference")
    data["preference"] = None if pref is None or (isinstance(pref, float) and math.isnan(pref)) else pref
    data["id"] = _alpaca_id(row, id)
    return _validate(AlpacaEvalRecord, data)


def _alpaca_id(row: Mapping[str, Any], given: str | None) -> str:
    idx = row.get("idx")  # demo compact files; row order is the same in every AlpacaEval file
    if isinstance(idx, int) and not isinstance(idx, bool):
        return f"alpaca_eval-{idx}"
    return _row_id(row, given, "alpaca_eval")


def alpaca_eval_to_prompt(row: Mapping[str, Any], *, id: str | None = None) -> EvalPrompt:
    """AlpacaEval row -> EvalPrompt(set="alpaca_eval", intent=dataset, reference=output_1 (baseline)).

    ``id = "alpaca_eval-<idx>"`` (demo files), else the row's ``id``, else ``id``.
    """
    row = _require_mapping(row)
    reference = row.get("output_1")
    return _validate(
        EvalPrompt,
        {
            "id": _alpaca_id(row, id),
            "prompt": _text(row, "instruction", empty_reason="empty prompt"),
            "set": "alpaca_eval",
            "intent": _optional_text(row, "dataset"),
            "reference": reference if isinstance(reference, str) else None,
            "meta": {k: row[k] for k in ("generator_1",) if k in row},
        },
    )


# ------------------------------------------------------------------------------------ eval sets


def xstest_to_prompt(row: Mapping[str, Any], *, id: str | None = None) -> EvalPrompt:
    """XSTest prompts row -> EvalPrompt.

    ``set`` is ``"xstest_safe"`` / ``"xstest_unsafe"`` from ``label``; ``intent = type``
    (e.g. ``homonyms``, ``contrast_homonyms``); ``id = "xstest-<id>"``; ``meta = {focus, note}``.

    Raises:
        DataValidationError: empty prompt; ``label`` not ``safe``/``unsafe``.
    """
    row = _require_mapping(row)
    label = _text(row, "label")
    if label not in ("safe", "unsafe"):
        raise DataValidationError(f"must be 'safe' or 'unsafe', got {label!r}", field="label")
    own = row.get("id")
    return _validate(
        EvalPrompt,
        {
            "id": f"xstest-{own}" if own not in (None, "") else _row_id(row, id, "xstest"),
            "prompt": _text(row, "prompt", empty_reason="empty prompt"),
            "set": f"xstest_{label}",
            "intent": _optional_text(row, "type"),
            "label": label,
            "meta": {k: _optional_text(row, k) for k in ("focus", "note") if k in row},
        },
    )


def harmbench_to_prompt(row: Mapping[str, Any], *, id: str | None = None, set_name: str | None = None) -> EvalPrompt:
    """HarmBench / AdvBench behaviour row -> EvalPrompt(label="unsafe").

    ``set_name`` defaults to ``"advbench"`` when ``BehaviorID`` starts with ``advbench_`` and to
    ``"harmbench"`` otherwise. Contextual behaviours are rendered as HarmBench does:
    ``f"{ContextString}\\n\\n---\\n\\n{Behavior}"``. ``intent = SemanticCategory`` (HarmBench) or
    ``Category`` (AdvBench, empty in the published file), ``id = BehaviorID``.

    Raises:
        DataValidationError: empty/missing ``Behavior``.
    """
    row = _require_mapping(row)
    behavior = _text(row, "Behavior", empty_reason="empty prompt")
    behavior_id = _optional_text(row, "BehaviorID")
    context = _optional_text(row, "ContextString")
    if set_name is None:
        set_name = "advbench" if (behavior_id or "").startswith("advbench_") else "harmbench"
    meta = {
        "behavior_id": behavior_id,
        "functional_category": _optional_text(row, "FunctionalCategory"),
        "semantic_category": _optional_text(row, "SemanticCategory"),
        "tags": _optional_text(row, "Tags"),
        "context_string": context,
    }
    return _validate(
        EvalPrompt,
        {
            "id": behavior_id or (id if id else _content_id(set_name, row)),
            "prompt": f"{context}\n\n---\n\n{behavior}" if context else behavior,
            "set": set_name,
            "intent": _optional_text(row, "SemanticCategory") or _optional_text(row, "Category"),
            "label": "unsafe",
            "meta": meta,
        },
    )


def advbench_to_prompt(row: Mapping[str, Any], *, id: str | None = None) -> EvalPrompt:
    """AdvBench row (HarmBench CSV layout) -> EvalPrompt(set="advbench", label="unsafe")."""
    return harmbench_to_prompt(row, id=id, set_name="advbench")


_LETTER = re.compile(r"^[A-Z]$")


def sycophancy_to_prompt(row: Mapping[str, Any], *, id: str | None = None) -> EvalPrompt:
    """Sycophancy (BCT ``StandardTestData``) row -> EvalPrompt.

    * ``set = "sycophancy_<bias_name>"`` (``sycophancy_are_you_sure`` / ``sycophancy_suggested_answer``);
    * ``prompt`` = the first user message to send: ``unbiased_question[0]`` for *are you sure*
      (the challenge comes in later turns), ``biased_question[0]`` for *suggested answer* (it
      carries the user's suggestion);
    * ``reference`` = correct letter;
    * ``meta``: ``correct_answer`` (letter), ``suggested_answer`` (the user's letter, ``None`` for
      are-you-sure where ``biased_option`` is ``"NOT X"``), ``biased_option`` (raw),
      ``bias_name``, ``original_dataset``, ``original_question``, ``question_hash``,
      ``unbiased_messages``, ``biased_messages``;
    * ``id = "sycophancy_<bias_name>-<original_question_hash[:12]>"``.

    Raises:
        DataValidationError: missing fields, ``ground_truth`` not a single capital letter,
            message lists malformed.
    """
    row = _require_mapping(row)
    bias = _text(row, "bias_name")
    truth = _text(row, "ground_truth")
    if not _LETTER.match(truth):
        raise DataValidationError(f"must be one capital letter, got {truth!r}", field="ground_truth")
    biased_option = _text(row, "biased_option")
    unbiased = _messages(_get(row, "unbiased_question"), "unbiased_question")
    biased = _messages(_get(row, "biased_question"), "biased_question")
    sent_field = "biased_question" if bias == "suggested_answer" else "unbiased_question"
    sent = biased if bias == "suggested_answer" else unbiased
    if not sent or sent[0].role != "user":
        raise DataValidationError("must start with a user message", field=sent_field)
    first = sent[0]
    qhash = _optional_text(row, "original_question_hash")
    return _validate(
        EvalPrompt,
        {
            "id": f"sycophancy_{bias}-{qhash[:12]}" if qhash else _row_id(row, id, f"sycophancy_{bias}"),
            "prompt": first.content,
            "set": f"sycophancy_{bias}",
            "reference": truth,
            "meta": {
                "correct_answer": truth,
                "suggested_answer": biased_option if _LETTER.match(biased_option) else None,
                "biased_option": biased_option,
                "bias_name": bias,
                "original_dataset": _optional_text(row, "original_dataset"),
                "original_question": _optional_text(row, "original_question"),
                "question_hash": qhash,
                "unbiased_messages": [m.model_dump() for m in unbiased],
                "biased_messages": [m.model_dump() for m in biased],
            },
        },
    )


def mt_bench_to_prompt(row: Mapping[str, Any], *, id: str | None = None) -> EvalPrompt:
    """MT-bench (or Arena-Hard) question row -> EvalPrompt with the first turn as prompt.

    MT-bench: ``set="mt_bench"``, ``intent=category``, ``id="mt_bench-<question_id>"``,
    ``reference`` = first reference answer when present, ``meta = {question_id, turns, reference}``.
    Arena-Hard rows (they have ``cluster``; turns are ``{"content": ...}`` dicts):
    ``set="arena_hard"``, ``intent=cluster``.

    Raises:
        DataValidationError: ``turns`` missing/empty/not strings.
    """
    row = _require_mapping(row)
    turns_raw = _get(row, "turns")
    if not isinstance(turns_raw, list) or not turns_raw:
        raise DataValidationError("must be a non-empty list of turns", field="turns")
    turns = []
    for i, turn in enumerate(turns_raw):
        text = turn.get("content") if isinstance(turn, Mapping) else turn
        if not isinstance(text, str) or not text.strip():
            raise DataValidationError(f"turn {i} must be a non-empty string, got {text!r:.60}", field="turns")
        turns.append(text)
    arena = "cluster" in row
    set_name = "arena_hard" if arena else "mt_bench"
    qid = row.get("question_id")
    reference = row.get("reference")
    references = [r for r in reference if isinstance(r, str)] if isinstance(reference, list) else []
    return _validate(
        EvalPrompt,
        {
            "id": f"{set_name}-{qid}" if qid not in (None, "") else _row_id(row, id, set_name),
            "prompt": turns[0],
            "set": set_name,
            "intent": _optional_text(row, "cluster" if arena else "category"),
            "reference": references[0] if references else None,
            "meta": {"question_id": qid, "turns": turns, "reference": references or None},
        },
    )


def pair_to_eval_prompt(pair: PreferencePair, *, set_name: str) -> EvalPrompt:
    """Held-out pair -> win-rate prompt.

    ``prompt`` = the last user turn; ``meta["messages"]`` = the full prompt conversation
    (list of ``{"role", "content"}``) to send for multi-turn pairs; ``reference = chosen``.
    """
    return EvalPrompt(
        id=pair.id,
        prompt=pair.prompt[-1].content,
        set=set_name,
        intent=pair.intent,
        reference=pair.chosen,
        meta={"messages": [m.model_dump() for m in pair.prompt], "pair_source": pair.source},
    )


def native_to_eval_prompt(
    row: Mapping[str, Any], *, id: str | None = None, set_name: str | None = None
) -> EvalPrompt:
    """Native EvalPrompt row, or any row with a string ``prompt`` (``set`` defaults to ``set_name``)."""
    row = _require_mapping(row)
    data = dict(row)
    data["id"] = _row_id(row, id, "prompt")
    if not data.get("set"):
        if not set_name:
            raise DataValidationError("missing (field required; or pass set_name)", field="set")
        data["set"] = set_name
    data.setdefault("meta", {})
    return _validate(EvalPrompt, data)
