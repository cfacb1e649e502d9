"""The weak-signal event row (pydantic v2): what production logs hand the flywheel, one row per
(conversation, turn, signal).

A row carries the turn's texts (the user's ``prompt`` for this turn and the model's ``response``); the store keeps
each text once, under its sha256 content hash, and the event references it.
"""

from __future__ import annotations

import datetime as dt
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

__all__ = ["SIGNALS", "EventRow", "Signal", "WeakSignal"]

Signal = Literal["thumbs_up", "thumbs_down", "regenerate", "edit", "copy", "abandon", "continued"]
#: Every signal the store accepts, in a fixed order (report columns follow it).
SIGNALS: tuple[str, ...] = get_args(Signal)


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
        timestamp: when the signal happened (ISO 8601 string or datetime; naive values are read as UTC).
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
    timestamp: dt.datetime
    prompt: StrictStr = Field(min_length=1)
    response: StrictStr = Field(min_length=1)


#: A weak signal as the rest of the code sees it. Deliberately a distinct name: ``data.expert`` refuses it.
WeakSignal = EventRow
