"""Expert labels and the only pair type the flywheel hands to training (DESIGN.md principle 4).

Weak signals select, they never reward. This is enforced by types:

* :class:`ExpertLabel` is one expert's verdict on a comparison; it needs an annotator id and a verdict.
* :class:`ExpertPair` is a prompt, two responses and at least one :class:`ExpertLabel`. Its constructor refuses
  anything that looks like a weak-signal event (a ``signal`` field, thumbs/regenerate counts, an event row
  object), so a pair cannot be made from production signals however it is called.
* :func:`write_training_pairs` is how a training file of pairs is written from the flywheel; it accepts only
  ``ExpertPair`` objects. Its rows are the native pair format :func:`data.loaders.load_pairs` reads, and
  :class:`data.schemas.PreferencePair` itself refuses rows carrying weak-signal fields, so the DPO and reward-model
  stages cannot train on a weak signal even from a hand-written file.

Verdicts use the ``labels`` convention of :mod:`data.schemas`: 0 tie, 1 response A better, 2 response B better.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr, field_validator, model_validator

from data.schemas import (
    FIRST_BETTER,
    SECOND_BETTER,
    TIE,
    WEAK_SIGNAL_FIELDS,
    AnnotatorLabel,
    Message,
    PreferencePair,
    check_turns,
    refuse_weak_signals,
)

__all__ = ["ExpertLabel", "ExpertPair", "WeakSignalRefused", "write_agreement_data", "write_training_pairs"]


class WeakSignalRefused(TypeError):
    """A weak signal was offered where only expert labels are accepted."""


def _is_weak(value: Any) -> bool:
    if isinstance(value, BaseModel):
        return bool(WEAK_SIGNAL_FIELDS & set(type(value).model_fields))
    return isinstance(value, dict) and bool(WEAK_SIGNAL_FIELDS & set(value))


class ExpertLabel(BaseModel):
    """One expert's verdict on response A vs response B.

    Attributes:
        annotator_id: the expert (Label Studio user id or e-mail pseudonym), non-empty.
        verdict: 0 tie, 1 A better, 2 B better (an int; ``True``, ``"1"`` are refused).
        task_id: the annotation task the verdict came from, for lineage.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    annotator_id: StrictStr = Field(min_length=1)
    verdict: Literal[0, 1, 2]
    task_id: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _no_weak_signals(cls, data: Any) -> Any:
        if _is_weak(data):
            raise WeakSignalRefused(
                "an ExpertLabel needs an expert's verdict; a weak signal (thumbs, regenerate, ...) is not one "
                "(DESIGN.md principle 4: weak signals select, they never reward)"
            )
        return data

    @field_validator("verdict", mode="before")
    @classmethod
    def _int_only(cls, v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"verdict must be the int 0, 1 or 2, got {v!r}")  # noqa: TRY004 (pydantic wants ValueError)
        return v


class ExpertPair(BaseModel):
    """A comparison labelled by experts: the only thing :func:`write_training_pairs` writes.

    Attributes:
        id: stable id (the annotation task's).
        prompt: the conversation up to the compared reply, ending on a user turn.
        response_a, response_b: the two replies shown to the experts (different after stripping).
        labels: at least one :class:`ExpertLabel`, annotator ids unique.
        intent: intent cluster, when known.
        lineage: hashes of what produced the labels (selection, export, labels file).

    Raises:
        WeakSignalRefused: built from a weak-signal event or with weak-signal fields.
        pydantic.ValidationError: no labels, duplicate annotators, bad turns, identical responses.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: StrictStr = Field(min_length=1)
    prompt: list[Message]
    response_a: StrictStr = Field(min_length=1)
    response_b: StrictStr = Field(min_length=1)
    labels: list[ExpertLabel] = Field(min_length=1)
    intent: str | None = None
    lineage: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _no_weak_signals(cls, data: Any) -> Any:
        if _is_weak(data):
            raise WeakSignalRefused(
                "an ExpertPair is built from expert labels (annotator ids + verdicts), never from a weak-signal "
                "event (DESIGN.md principle 4)"
            )
        if isinstance(data, dict):
            for label in data.get("labels") or []:
                if _is_weak(label):
                    raise WeakSignalRefused("a weak-signal event is not an expert label (DESIGN.md principle 4)")
        return data

    @model_validator(mode="after")
    def _check(self) -> ExpertPair:
        check_turns(self.prompt, field="prompt", final="user")
        if self.response_a.strip() == self.response_b.strip():
            raise ValueError("response_b is identical to response_a")
        ids = [label.annotator_id for label in self.labels]
        if len(set(ids)) != len(ids):
            raise ValueError(f"duplicate annotator ids {sorted(ids)}")
        return self

    def majority(self) -> int | None:
        """The strict-majority verdict (0, 1 or 2), or ``None`` when no verdict has more than half the labels."""
        counts = Counter(label.verdict for label in self.labels)
        verdict, n = counts.most_common(1)[0]
        return verdict if n * 2 > len(self.labels) else None

    def to_preference_pair(self) -> PreferencePair | None:
        """The training pair: the majority's preferred reply as ``chosen``; ``None`` for a tie or no majority.

        The labels are carried along, re-expressed for the ``chosen``/``rejected`` order (1 = chosen better).
        """
        m = self.majority()
        if m in (None, TIE):
            return None
        chosen, rejected = (
            (self.response_a, self.response_b) if m == FIRST_BETTER else (self.response_b, self.response_a)
        )
        flip = {TIE: TIE, FIRST_BETTER: SECOND_BETTER, SECOND_BETTER: FIRST_BETTER}
        labels = [
            AnnotatorLabel(
                annotator_id=lab.annotator_id, preference=lab.verdict if m == FIRST_BETTER else flip[lab.verdict]
            )
            for lab in self.labels
        ]
        return PreferencePair(
            id=self.id,
            prompt=self.prompt,
            chosen=chosen,
            rejected=rejected,
            intent=self.intent,
            labels=labels,
            source="expert",
            meta={"lineage": dict(self.lineage)},
        )

    def to_agreement_pair(self) -> PreferencePair:
        """The multi-annotator agreement row (PandaLM convention: ``chosen`` = A, ``rejected`` = B, labels as given)."""
        return PreferencePair(
            id=self.id,
            prompt=self.prompt,
            chosen=self.response_a,
            rejected=self.response_b,
            intent=self.intent,
            labels=[AnnotatorLabel(annotator_id=lab.annotator_id, preference=lab.verdict) for lab in self.labels],
            source="expert",
            meta={"lineage": dict(self.lineage)},
        )


def _row(pair: PreferencePair) -> dict:
    return pair.model_dump(mode="json")


def _check_types(pairs: Iterable[Any]) -> list[ExpertPair]:
    out = []
    for i, p in enumerate(pairs):
        if not isinstance(p, ExpertPair):
            if _is_weak(p):
                raise WeakSignalRefused(f"item {i}: a weak-signal event cannot be written as a training pair")
            raise TypeError(
                f"item {i}: training pairs are written from ExpertPair objects only, got {type(p).__name__}"
            )
        out.append(p)
    return out


def write_training_pairs(pairs: Sequence[ExpertPair], path: str | Path) -> tuple[Path, int, int]:
    """Write the preference pairs of ``pairs`` (majority winner as ``chosen``) as JSON Lines, atomically.

    Returns:
        ``(path, n_written, n_without_majority)``: ties and splits are not training pairs (they stay in the
        agreement data).

    Raises:
        WeakSignalRefused / TypeError: an item is not an :class:`ExpertPair`.
    """
    from rlhf.manifest import atomic_write_text

    items = _check_types(pairs)
    rows = [pp for pp in (p.to_preference_pair() for p in items) if pp is not None]
    path = Path(path)
    atomic_write_text(path, "".join(json.dumps(_row(r), ensure_ascii=False) + "\n" for r in rows))
    return path, len(rows), len(items) - len(rows)


def write_agreement_data(
    pairs: Sequence[ExpertPair], path: str | Path, *, min_annotators: int = 2, n_annotators: int | None = None
) -> tuple[Path, int]:
    """Write the multi-annotator agreement rows, atomically: pairs with at least ``min_annotators`` labels, or, with
    ``n_annotators``, exactly that many (the agreement statistics need a rectangular (items x annotators) matrix).

    Returns:
        ``(path, n_written)``.
    """
    from rlhf.manifest import atomic_write_text

    items = [
        p
        for p in _check_types(pairs)
        if (len(p.labels) == n_annotators if n_annotators is not None else len(p.labels) >= min_annotators)
    ]
    path = Path(path)
    atomic_write_text(path, "".join(json.dumps(_row(p.to_agreement_pair()), ensure_ascii=False) + "\n" for p in items))
    return path, len(items)


_ = refuse_weak_signals  # re-exported for callers that check raw rows
