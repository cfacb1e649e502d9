"""Row schemas shared by every stage (pydantic v2).

Every dataset the pipeline reads is converted into one of these models before it reaches a
trainer or a gate:

* :class:`Conversation` -- an SFT demonstration (``user``/``assistant`` turns, ending on the assistant).
* :class:`PreferencePair` -- a DPO / reward-model pair: a prompt (the conversation up to, excluding,
  the final assistant turn) plus two final assistant replies.
* :class:`EvalPrompt` -- one prompt of an evaluation set (XSTest, HarmBench, AdvBench, MT-bench,
  sycophancy probes, held-out win-rate prompts, ...).
* :class:`AlpacaEvalRecord` -- one judged comparison of AlpacaEval (baseline output vs model output).

Validation errors are ordinary :class:`pydantic.ValidationError` s. Structural errors (turn order,
empty replies) are raised as ``PydanticCustomError`` of type ``"rlhf_data"`` whose context carries
the precise sub-field (e.g. ``"messages[3].role"``), so that :mod:`data.validation` can report
"file, row, field, reason" for each bad row.

``pair_to_trl`` / ``conversation_to_trl`` render rows in TRL's *conversational* dataset formats.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal, NoReturn

from pydantic import BaseModel, ConfigDict, Field, StrictStr, field_validator, model_validator
from pydantic_core import PydanticCustomError

from data.labels import FIRST, SECOND, TIE

__all__ = [
    "Role",
    "TIE",
    "FIRST_BETTER",
    "SECOND_BETTER",
    "Message",
    "Conversation",
    "AnnotatorLabel",
    "PreferencePair",
    "EvalPrompt",
    "AlpacaEvalRecord",
    "check_turns",
    "WEAK_SIGNAL_FIELDS",
    "refuse_weak_signals",
    "pair_to_trl",
    "conversation_to_trl",
]

Role = Literal["system", "user", "assistant"]

#: The expert-label convention of :class:`AnnotatorLabel`, declared once in ``data.labels``: 0 = tie,
#: 1 = the first response (``PreferencePair.chosen``) is better, 2 = the second (``rejected``) is better.
FIRST_BETTER, SECOND_BETTER = FIRST, SECOND

#: Error type of the structural checks below (see ``PydanticCustomError``).
ERROR_TYPE = "rlhf_data"

#: Fields that mark a row (or its ``meta``) as a production weak signal. Weak signals select, they never reward
#: (DESIGN.md principle 4): a preference pair carrying any of them is refused (see :mod:`data.expert`).
WEAK_SIGNAL_FIELDS = frozenset({"signal", "signals", "event_id", "thumbs_up", "thumbs_down", "regenerate", "weak_signal"})


def refuse_weak_signals(data: Any, *, what: str = "a preference pair") -> None:
    """Raise (type ``"rlhf_data"``, field = the offending key) when ``data`` or its ``meta`` has a weak-signal field."""
    if not isinstance(data, dict):
        return
    meta = data.get("meta") if isinstance(data.get("meta"), dict) else {}
    for where, keys in (("", data), ("meta.", meta)):
        hit = sorted(WEAK_SIGNAL_FIELDS & set(keys))
        if hit:
            _fail(
                f"{where}{hit[0]}",
                f"{what} cannot carry a weak signal ({hit[0]!r}): weak signals select what experts label, they "
                "never become training pairs (DESIGN.md principle 4); pairs come from expert labels (data.expert)",
            )


def _fail(field: str, reason: str) -> NoReturn:
    """Raise a structural error naming the offending sub-field (e.g. ``messages[3].role``)."""
    raise PydanticCustomError(ERROR_TYPE, "{field}: {reason}", {"field": field, "reason": reason})


def _bad_value(reason: str) -> NoReturn:
    """Raise a value error from a field validator (the field path comes from pydantic's ``loc``)."""
    raise PydanticCustomError(ERROR_TYPE, "{reason}", {"reason": reason})


class _Row(BaseModel):
    # Unknown keys are ignored (HF datasets often carry extra columns); a misspelled required key
    # still fails as "Field required".
    model_config = ConfigDict(extra="ignore", frozen=True)


class Message(_Row):
    """One chat turn.

    Attributes:
        role: ``"system"``, ``"user"`` or ``"assistant"``.
        content: the text of the turn. Must be a ``str`` -- ``None``, numbers, booleans and
            bytes are rejected, never coerced.
    """

    role: Role
    content: StrictStr


def check_turns(messages: Sequence[Message], *, field: str, final: Literal["user", "assistant"]) -> None:
    """Check the turn structure of ``messages``.

    Rules: non-empty; optional ``system`` messages only at the start; the first non-system turn
    is from the user; roles then alternate user/assistant; the last turn is from ``final``;
    no assistant turn is empty or whitespace-only.

    Args:
        messages: the turns to check.
        field: name used in error paths (``"messages"`` or ``"prompt"``).
        final: role the sequence must end on.

    Raises:
        pydantic_core.PydanticCustomError: type ``"rlhf_data"``; its context names the field
            (``f"{field}[i].role"`` / ``f"{field}[i].content"``) and the reason.
    """
    if not messages:
        _fail(field, "no messages")
    start = 0
    while start < len(messages) and messages[start].role == "system":
        start += 1
    if start == len(messages):
        _fail(field, "only system messages, no user turn")
    if messages[start].role != "user":
        _fail(f"{field}[{start}].role", f"first turn is from the {messages[start].role}; expected user")
    expected = "user"
    for i in range(start, len(messages)):
        msg = messages[i]
        if msg.role == "system":
            _fail(f"{field}[{i}].role", "system message after the conversation started")
        if msg.role != expected:
            _fail(f"{field}[{i}].role", f"two {msg.role} turns in a row (turns {i - 1} and {i})")
        if msg.role == "assistant" and not msg.content.strip():
            _fail(f"{field}[{i}].content", "empty assistant turn")
        expected = "assistant" if expected == "user" else "user"
    if messages[-1].role != final:
        _fail(
            f"{field}[{len(messages) - 1}].role",
            f"ends on {'an' if messages[-1].role == 'assistant' else 'a'} {messages[-1].role} turn; "
            f"expected the last turn from the {final}",
        )


class Conversation(_Row):
    """An SFT demonstration.

    Attributes:
        id: stable row id (``"<file stem>-<row>"`` when the source has none).
        messages: turns, see :func:`check_turns` (must end on a non-empty assistant turn).
        source: where the row came from (file, demo name or HF id), for lineage.
    """

    id: StrictStr = Field(min_length=1)
    messages: list[Message]
    source: str | None = None

    @model_validator(mode="after")
    def _check_structure(self) -> Conversation:
        check_turns(self.messages, field="messages", final="assistant")
        return self


class AnnotatorLabel(_Row):
    """One annotator's verdict on a pair (PandaLM convention).

    Attributes:
        annotator_id: who labelled (e.g. ``"annotator1"``, an expert id, ``"gpt-3.5-turbo"``).
        preference: ``0`` tie, ``1`` the first response (``chosen``) is better, ``2`` the second
            (``rejected``) is better. Must be an ``int`` (``True``, ``"1"``, ``1.0`` are rejected).
    """

    annotator_id: StrictStr = Field(min_length=1)
    preference: Literal[0, 1, 2]

    @field_validator("preference", mode="before")
    @classmethod
    def _int_only(cls, v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, int):
            _bad_value(f"must be the int 0, 1 or 2, got {v!r}")
        return v


class PreferencePair(_Row):
    """A preference pair for DPO / reward modelling.

    ``prompt`` is the conversation up to (excluding) the final assistant turn; ``chosen`` and
    ``rejected`` are the two final assistant replies. For sources labelled by position (PandaLM),
    ``chosen`` is simply the first response and ``rejected`` the second: ``labels`` say which one
    the annotators preferred.

    Attributes:
        id: stable row id.
        prompt: turns ending on a user turn (see :func:`check_turns`).
        chosen: first / preferred final reply, non-empty.
        rejected: second / dispreferred final reply, non-empty, different from ``chosen``
            (compared after stripping whitespace).
        intent: intent cluster (e.g. PandaLM ``motivation_app``), used by the per-intent matrix.
        labels: per-annotator verdicts, annotator ids unique.
        source: where the row came from.
        meta: anything else worth keeping (e.g. PandaLM ``cmp_key``).
    """

    id: StrictStr = Field(min_length=1)
    prompt: list[Message]
    chosen: StrictStr
    rejected: StrictStr
    intent: str | None = None
    labels: list[AnnotatorLabel] | None = None
    source: str | None = None
    meta: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _no_weak_signals(cls, data: Any) -> Any:
        refuse_weak_signals(data)
        return data

    @model_validator(mode="after")
    def _check_structure(self) -> PreferencePair:
        check_turns(self.prompt, field="prompt", final="user")
        for name in ("chosen", "rejected"):
            if not getattr(self, name).strip():
                _fail(name, "empty assistant turn")
        if self.chosen.strip() == self.rejected.strip():
            _fail("rejected", "identical to chosen")
        if self.labels is not None:
            ids = [label.annotator_id for label in self.labels]
            if len(set(ids)) != len(ids):
                _fail("labels", f"duplicate annotator ids {sorted(ids)}")
        return self


class EvalPrompt(_Row):
    """One prompt of an evaluation set.

    Attributes:
        id: stable row id, unique within its set.
        prompt: the first user message to send (non-empty ``str``).
        set: evaluation set, e.g. ``"xstest_safe"``, ``"xstest_unsafe"``, ``"harmbench"``,
            ``"advbench"``, ``"mt_bench"``, ``"sycophancy_are_you_sure"``,
            ``"sycophancy_suggested_answer"``, ``"alpaca_eval"``, ``"pairs_heldout"``.
        intent: intent / category cluster (XSTest ``type``, MT-bench ``category``, ...).
        reference: reference answer when the source has one (MT-bench reference, sycophancy
            correct letter, held-out chosen reply, AlpacaEval baseline output).
        label: expected safety label where the set defines one (``"safe"`` / ``"unsafe"``).
        meta: source-specific extras (e.g. MT-bench second turn, sycophancy answer letters).
    """

    id: StrictStr = Field(min_length=1)
    prompt: StrictStr
    set: StrictStr = Field(min_length=1)
    intent: str | None = None
    reference: str | None = None
    label: str | None = None
    meta: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check_prompt(self) -> EvalPrompt:
        if not self.prompt.strip():
            _fail("prompt", "empty prompt")
        return self


class AlpacaEvalRecord(_Row):
    """One AlpacaEval judge annotation: the baseline (``output_1``) vs a model (``output_2``).

    Attributes:
        id: stable row id (``"alpaca_eval-<row>"``; the row order is the same in every AlpacaEval
            annotation file, so the same id means the same instruction across models).
        instruction: the user prompt.
        output_1: baseline output (``generator_1``, gpt4_1106_preview for AlpacaEval 2).
        output_2: evaluated model's output (``generator_2``).
        preference: judge preference in ``[1, 2]``: 1 = baseline wins, 2 = model wins, 1.5 = draw;
            ``None`` when the judge gave no verdict.
        dataset: AlpacaEval source cluster (helpful_base, koala, oasst, selfinstruct, vicuna),
            used as the intent.
    """

    id: StrictStr = Field(min_length=1)
    instruction: StrictStr
    output_1: StrictStr
    output_2: StrictStr
    generator_1: str | None = None
    generator_2: str | None = None
    preference: float | None = None
    dataset: str | None = None
    annotator: str | None = None

    @field_validator("preference", mode="before")
    @classmethod
    def _finite_in_range(cls, v: Any) -> Any:
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 1.0 <= v <= 2.0:
            _bad_value(f"must be a number in [1, 2], got {v!r}")
        return float(v)

    @property
    def intent(self) -> str | None:
        """Alias of ``dataset``."""
        return self.dataset


def pair_to_trl(pair: PreferencePair) -> dict[str, list[dict[str, str]]]:
    """Render a pair in TRL's conversational preference format (explicit prompt).

    Returns:
        ``{"prompt": [{"role", "content"}, ...], "chosen": [{"role": "assistant", "content": ...}],
        "rejected": [{"role": "assistant", "content": ...}]}``.
    """
    return {
        "prompt": [{"role": m.role, "content": m.content} for m in pair.prompt],
        "chosen": [{"role": "assistant", "content": pair.chosen}],
        "rejected": [{"role": "assistant", "content": pair.rejected}],
    }


def conversation_to_trl(conv: Conversation) -> dict[str, list[dict[str, str]]]:
    """Render a demonstration in TRL's conversational language-modelling format.

    Returns:
        ``{"messages": [{"role", "content"}, ...]}``.
    """
    return {"messages": [{"role": m.role, "content": m.content} for m in conv.messages]}
