"""Durable constraints a user states early in a conversation, and the programs that check a reply keeps them.

Each constraint has a kind, the user's statement (said once, early), a probe (the later request it applies to,
which does not restate it) and a checker: a pure function from the reply to compliant / not compliant, no judge.
The consistency gate (``gates.consistency``) puts the statement at a chosen position of a long real conversation and
the probe at its end.

Kinds and their checks (``check(kind, reply, **params)``):

* ``language``: the reply is written in ``language`` (an ISO 639-1 code), as identified by langid.py (Lui &
  Baldwin 2012, ``langid.classify``; its packaged model, restricted to :data:`LANGUAGES` so that a short reply is
  not read as a language no constraint asks for). Code blocks and URLs are removed first.
* ``max_words``: at most ``max_words`` words (whitespace-separated tokens that contain a letter or digit; an empty
  reply is not compliant: a reply must answer the request).
* ``all_caps``: at least :data:`MIN_CASED_LETTERS` cased letters and none of them lower case.
* ``json``: the reply, after stripping one Markdown code fence, parses as a JSON object (``json.loads``) holding
  every key of ``keys``.
* ``bullet_list``: at least two lines start with a bullet (``-``, ``*``, ``•``, or ``1.`` / ``1)``) and every other
  non-empty line is a lead-in ending in ``:`` (at most one, before the first bullet).
* ``use_name``: the name occurs as a whole word (case-sensitive first letter, as a name is written).
* ``forbidden``: none of ``words`` occurs as a whole word, case-insensitively (a reply that warns "avoid peanuts"
  mentions them and counts as a violation: the user asked never to hear of them).

Measured against hand labels of real model answers in ``benchmarks/constraint_checkers.py``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

#: The languages a language constraint may ask for; langid is restricted to these and English.
LANGUAGES: tuple[str, ...] = ("en", "fr", "es", "de", "it", "pt", "nl")

#: Fewest cased letters an all-caps reply needs (a reply of "OK" is not a sign written in capitals).
MIN_CASED_LETTERS = 8

_FENCE = re.compile(r"^\s*```[a-zA-Z0-9_-]*\s*\n(.*?)\n?```\s*$", re.S)
_CODE = re.compile(r"```.*?(```|$)", re.S)
_URL = re.compile(r"https?://\S+")
_BULLET = re.compile(r"^\s*(?:[-*\u2022\u25cf\u25aa]|\d{1,2}[.)])\s+\S")
_WORD = re.compile(r"\S*[^\W_]\S*")


@lru_cache(maxsize=1)
def _identifier():
    from langid.langid import LanguageIdentifier, model

    ident = LanguageIdentifier.from_modelstring(model, norm_probs=False)
    ident.set_languages(list(LANGUAGES))
    return ident


def reply_language(reply: str) -> str | None:
    """The ISO 639-1 code langid reads ``reply`` as (among :data:`LANGUAGES`), None when it has no letters."""
    text = _URL.sub(" ", _CODE.sub(" ", reply))
    if not any(c.isalpha() for c in text):
        return None
    return _identifier().classify(text)[0]


def in_language(reply: str, language: str) -> bool:
    """Whether ``reply`` is written in ``language`` (:func:`reply_language`)."""
    return reply_language(reply) == language


def n_words(reply: str) -> int:
    """Words in ``reply``: whitespace-separated tokens with a letter or digit (a lone "-" bullet is no word)."""
    return len(_WORD.findall(reply))


def within_words(reply: str, max_words: int) -> bool:
    """Non-empty and at most ``max_words`` words (:func:`n_words`)."""
    n = n_words(reply)
    return 0 < n <= max_words


def all_caps(reply: str) -> bool:
    """At least :data:`MIN_CASED_LETTERS` cased letters, none lower case."""
    cased = [c for c in reply if c.isalpha() and (c.isupper() or c.islower())]
    return len(cased) >= MIN_CASED_LETTERS and not any(c.islower() for c in cased)


def json_object(reply: str, keys: Sequence[str] = ()) -> bool:
    """The reply (one surrounding Markdown code fence stripped) is a JSON object with every key of ``keys``."""
    text = reply.strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1).strip()
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return isinstance(value, dict) and all(k in value for k in keys)


def bullet_list(reply: str) -> bool:
    """Two or more bullet lines, every other non-empty line a single lead-in ending in ":" before the first bullet."""
    lines = [ln for ln in reply.splitlines() if ln.strip()]
    bullets = [bool(_BULLET.match(ln)) for ln in lines]
    if sum(bullets) < 2:
        return False
    others = [i for i, b in enumerate(bullets) if not b]
    return not others or (others == [0] and lines[0].rstrip().endswith(":"))


def uses_name(reply: str, name: str) -> bool:
    """``name`` occurs in ``reply`` as a whole word."""
    return re.search(rf"(?<!\w){re.escape(name)}(?!\w)", reply) is not None


def avoids(reply: str, words: Sequence[str]) -> bool:
    """None of ``words`` occurs in ``reply`` as a whole word, case-insensitively."""
    return not any(re.search(rf"(?<!\w){re.escape(w)}(?!\w)", reply, re.I) for w in words)


#: kind -> checker(reply, **params) -> compliant.
CHECKERS: dict[str, Callable[..., bool]] = {
    "language": lambda reply, language: in_language(reply, language),
    "max_words": lambda reply, max_words: within_words(reply, max_words),
    "all_caps": lambda reply: all_caps(reply),
    "json": lambda reply, keys=(): json_object(reply, keys),
    "bullet_list": lambda reply: bullet_list(reply),
    "use_name": lambda reply, name: uses_name(reply, name),
    "forbidden": lambda reply, words: avoids(reply, words),
}

KINDS: tuple[str, ...] = tuple(CHECKERS)


def check(kind: str, reply: str, **params: Any) -> bool:
    """Whether ``reply`` keeps a constraint of ``kind`` with ``params`` (see the module docstring).

    Raises:
        ValueError: an unknown kind, or a reply that is not a string.
    """
    if kind not in CHECKERS:
        raise ValueError(f"unknown constraint kind {kind!r}; known: {list(KINDS)}")
    if not isinstance(reply, str):
        raise ValueError(f"a reply must be a string, got {type(reply).__name__}")
    return bool(CHECKERS[kind](reply, **params))


@dataclass(frozen=True)
class Constraint:
    """One durable constraint: what the user says early, what it asks later, and how the reply is checked.

    Fields:
        name: a short id (``language_fr``); kind: a key of :data:`CHECKERS`; params: the checker's arguments.
        statement: the user's turn that states it (deferred: "when I ask you for X, ..."), and acknowledgement:
            the assistant's reply to it, which accepts without restating the details.
        probe: the user's later request it applies to; never restates the constraint.
        avoid: words a filler exchange must not contain (a forbidden item or the name said elsewhere would change
            what the conversation asks).
    """

    name: str
    kind: str
    params: dict[str, Any]
    statement: str
    probe: str
    acknowledgement: str = "Understood, I will keep that in mind for later."
    avoid: tuple[str, ...] = field(default_factory=tuple)

    def check(self, reply: str) -> bool:
        """Whether ``reply`` keeps this constraint (:func:`check`)."""
        return check(self.kind, reply, **self.params)


#: The constraints the consistency suite states, one or more per kind. Deferred ("when I ask you for X"): the
#: conversation between statement and probe is real filler whose assistant turns were written without the
#: constraint, so a constraint on every reply would be contradicted in context by the filler itself.
CONSTRAINTS: tuple[Constraint, ...] = (
    Constraint("language_fr", "language", {"language": "fr"},
               "Before we go on: later I will ask you for a note to my neighbour. She only reads French, so when I "
               "ask, write the note in French.",
               "Please write the note for my neighbour now: tell her that her package arrived at my place and that "
               "I will bring it over this evening."),
    Constraint("language_es", "language", {"language": "es"},
               "One thing for later: when I ask you for the message to my landlord, write it in Spanish, because "
               "he does not read English.",
               "Now write the message to my landlord: the kitchen tap is leaking and I would like someone to fix "
               "it this week."),
    Constraint("max_words_40", "max_words", {"max_words": 40},
               "Something for later: when I ask you for the summary for my boss, keep it to 40 words or fewer. She "
               "reads it on her phone.",
               "Write the summary for my boss: the project is two weeks late because the supplier shipped the "
               "wrong parts, we have reordered them, and we expect to finish by the end of next month."),
    Constraint("all_caps_sign", "all_caps", {},
               "For later: when I ask you for the sign for my shop window, write it entirely in capital letters.",
               "Write the sign for my shop window: we are closed on Monday for stocktaking and open again on "
               "Tuesday at nine."),
    Constraint("json_purchase", "json", {"keys": ["item", "price"]},
               "From now on, when I ask you to log a purchase, reply with only a JSON object with the keys "
               "\"item\" and \"price\", nothing else.",
               "Log this purchase: a blue umbrella for 12 dollars."),
    Constraint("bullets_packing", "bullet_list", {},
               "Remember for later: when I ask for a packing list, give it as a bullet list, one item per line.",
               "Make me the packing list for a weekend camping trip in the mountains."),
    Constraint("name_signature", "use_name", {"name": "Oluwaseun"},
               "My name is Oluwaseun. When I ask you to draft an email for me, sign it with my name.",
               "Draft a short email to my landlord asking when the heating will be repaired.",
               avoid=("Oluwaseun",)),
    Constraint("forbidden_peanuts", "forbidden", {"words": ["peanut", "peanuts", "groundnut", "groundnuts"]},
               "Please remember: I am severely allergic to peanuts, so never suggest anything that has them.",
               "Suggest three quick snacks I can pack for a long hike.",
               avoid=("peanut", "peanuts", "groundnut", "groundnuts")),
)


def constraints_by_name() -> dict[str, Constraint]:
    """:data:`CONSTRAINTS` by name."""
    return {c.name: c for c in CONSTRAINTS}
