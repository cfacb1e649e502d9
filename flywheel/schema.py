"""The weak-signal event row (pydantic v2): what production logs hand the flywheel, one row per
(conversation, turn, signal).

A row carries the turn's texts (the user's ``prompt`` for this turn and the model's ``response``); the store keeps
each text once, under its sha256 content hash, and the event references it.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictInt, StrictStr

__all__ = ["SIGNALS", "EventRow", "Signal", "Timestamp", "WeakSignal", "epoch_seconds"]

Signal = Literal["thumbs_up", "thumbs_down", "regenerate", "edit", "copy", "abandon", "continued"]
#: Every signal the store accepts, in a fixed order (report columns follow it).
SIGNALS: tuple[str, ...] = get_args(Signal)

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_NUMBER = re.compile(r"[+-]?\d+(\.\d*)?")


def epoch_seconds(value: Any) -> Any:
    """A number (or a numeric string) as a UTC datetime, read as seconds since 1970-01-01 UTC; anything else
    unchanged (pydantic then parses ISO 8601 strings and datetimes).

    Always seconds: pydantic's own rule (numbers above 2e10 read as milliseconds) is not used, so ``1700000000``
    and ``1700000000000`` never mean the same instant, and a Parquet integer/float column means what the same
    number means in JSONL (see :func:`flywheel.arrow_events.timestamp_column`). Floats keep microseconds.

    Raises:
        ValueError: a non-finite number, or one outside the datetime range.
    """
    if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
        s = value.strip()
        value = float(s) if "." in s else int(s)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    if not math.isfinite(value):
        raise ValueError(f"timestamp {value!r} is not a finite number of epoch seconds")
    try:
        return _EPOCH + dt.timedelta(seconds=value)
    except OverflowError:
        raise ValueError(f"timestamp {value!r} epoch seconds is outside the datetime range") from None


#: A timestamp field: ISO 8601 string, datetime, or a number of epoch seconds (:func:`epoch_seconds`).
Timestamp = Annotated[dt.datetime, BeforeValidator(epoch_seconds)]


class EventRow(BaseModel):
    """One weak-signal event.

    Attributes:
        event_id: globally unique id of the event (the store's primary key: the same id twice is stored once).
        conversation_id: the conversation the turn belongs to.
        turn_id: 0-based index of the user/assistant exchange within the conversation.
        user_id: pseudonymous user id (never an email or a name: the scrub runs on texts, not on ids).
        model_version: the model that wrote ``response`` (e.g. a round id).
        intent: intent cluster when known (traffic-table name), else ``None``.
        signal: one of :data:`SIGNALS`.
        timestamp: when the signal happened: an ISO 8601 string, a datetime, or a number of seconds since
            1970-01-01 UTC (always seconds, never milliseconds: :func:`epoch_seconds`); naive values are read as
            UTC. In Parquet: a timestamp column of any unit (read by its own unit and time zone), an integer or
            float column (epoch seconds), or a string column (ISO 8601, parsed as in JSONL).
        prompt: the user's message of this turn.
        response: the assistant's reply the signal is about.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    event_id: StrictStr = Field(min_length=1)
    conversation_id: StrictStr = Field(min_length=1)
    turn_id: StrictInt = Field(ge=0)
    user_id: StrictStr = Field(min_length=1)
    model_version: StrictStr = Field(min_length=1)
    intent: StrictStr | None = None
    signal: Signal
    timestamp: Timestamp
    prompt: StrictStr = Field(min_length=1)
    response: StrictStr = Field(min_length=1)


#: A weak signal as the rest of the code sees it. Deliberately a distinct name: ``data.expert`` refuses it.
WeakSignal = EventRow
