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

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StrictInt, StrictStr

__all__ = [
    "MAX_LINE_BYTES",
    "MAX_TURN_ID",
    "SIGNALS",
    "EventRow",
    "Signal",
    "Timestamp",
    "WeakSignal",
    "epoch_seconds",
    "no_nul",
]

#: Largest ``turn_id`` the store keeps (its column is a 32-bit INTEGER on both databases): ``2**31 - 1``.
MAX_TURN_ID = 2**31 - 1
#: Longest JSONL line the reader accepts, in bytes (4 MiB, newline included): a longer line is refused with its
#: file and row after reading at most this much of it (never the whole line into memory).
MAX_LINE_BYTES = 4 * 2**20

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


def utc_naive(ts: dt.datetime) -> dt.datetime:
    """A datetime as naive UTC (naive values are already UTC), as the store keeps it.

    Raises:
        ValueError: the instant in UTC falls outside years 1-9999 (e.g. ``9999-12-31T23:00:00-05:00``).
    """
    if ts.tzinfo is None:
        return ts
    try:
        return ts.astimezone(dt.UTC).replace(tzinfo=None)
    except OverflowError:
        raise ValueError(f"timestamp {ts.isoformat()} is outside years 1-9999 in UTC") from None


def _in_utc_range(ts: dt.datetime) -> dt.datetime:
    utc_naive(ts)
    return ts


def no_nul(value: str | None) -> str | None:
    """Refuse a string holding a NUL character (PostgreSQL's text cannot store one; DuckDB would keep it, so both
    refuse it here, at validation, with file, row and field) or a lone surrogate (JSON's ``"\\ud800"``: not
    encodable as UTF-8)."""
    if value is None:
        return value
    if "\x00" in value:
        raise ValueError(f"contains a NUL character (\\x00) at position {value.index(chr(0))}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(f"not valid Unicode (a lone surrogate at position {err.start})") from None
    return value


#: A timestamp field: ISO 8601 string, datetime, or a number of epoch seconds (:func:`epoch_seconds`); its UTC
#: instant must lie in years 1-9999.
Timestamp = Annotated[dt.datetime, BeforeValidator(epoch_seconds), AfterValidator(_in_utc_range)]
#: A non-empty string without NUL characters.
Text = Annotated[StrictStr, Field(min_length=1), AfterValidator(no_nul)]

#: An e-mail address anywhere in a value (RE2 syntax too: the Parquet reader runs it through Arrow).
EMAIL_PATTERN = r"[^@\s]+@[^@\s]+\.[A-Za-z]{2,}"


def pseudonymous(value: str) -> str:
    """Refuse a user id holding an e-mail address: ids are written as they are (the selection, the store), and
    the scrub runs on texts, not on ids. The error never shows the value (it is personal data)."""
    if re.search(EMAIL_PATTERN, value):
        raise ValueError("holds an e-mail address (value not shown): user ids must be pseudonymous; hash or map "
                         "them to opaque ids before ingest")
    return value


class EventRow(BaseModel):
    """One weak-signal event.

    Attributes:
        event_id: globally unique id of the event (the store's primary key: the same id twice is stored once).
        conversation_id: the conversation the turn belongs to.
        turn_id: 0-based index of the user/assistant exchange within the conversation, at most
            :data:`MAX_TURN_ID`.
        user_id: pseudonymous user id (never an email or a name: the scrub runs on texts, not on ids; one holding
            an e-mail address is refused, :func:`pseudonymous`). A
            conversation belongs to its user: the same ``conversation_id`` under two users is two conversations.
        model_version: the model that wrote ``response`` (e.g. a round id).
        intent: intent cluster when known (traffic-table name), else ``None``.
        signal: one of :data:`SIGNALS`.
        timestamp: when the signal happened: an ISO 8601 string, a datetime, or a number of seconds since
            1970-01-01 UTC (always seconds, never milliseconds: :func:`epoch_seconds`); naive values are read as
            UTC. In Parquet: a timestamp column of any unit (read by its own unit and time zone), an integer or
            float column (epoch seconds), or a string column (ISO 8601, parsed as in JSONL).
        prompt: the user's message of this turn.
        response: the assistant's reply the signal is about (a regenerated reply is another response of the
            same turn: its own row in the store, with its own signals).

    Every string field refuses NUL characters; ``timestamp`` must lie in years 1-9999 (UTC). The Parquet reader
    (:func:`flywheel.arrow_events.check_batch`) accepts and refuses exactly the same values.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    event_id: Text
    conversation_id: Text
    turn_id: StrictInt = Field(ge=0, le=MAX_TURN_ID)
    user_id: Annotated[Text, AfterValidator(pseudonymous)]
    model_version: Text
    intent: Annotated[StrictStr | None, AfterValidator(no_nul)] = None
    signal: Signal
    timestamp: Timestamp
    prompt: Text
    response: Text


#: A weak signal as the rest of the code sees it. Deliberately a distinct name: ``data.expert`` refuses it.
WeakSignal = EventRow
