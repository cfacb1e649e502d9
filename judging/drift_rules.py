"""Style counters of responses: the per-response rules and the four counters of one set of responses.

Preference optimisation drifts style before it drifts quality: answers get longer, open by restating the question,
turn into bullet lists and hedge. The counters (DESIGN.md "Release gates", personality-drift row):

* ``median_length_tokens`` - median response length in tokens (``tokenizer_len``; the default counts
  whitespace-separated words, pass the round tokenizer's length for real tokens);
* ``restating_pct`` - percent of responses whose opening restates the question (:func:`restates_question`);
* ``bullets_pct`` - percent of responses with a list: at least 2 lines that start with a bullet (``-``, ``*``,
  ``+``, ``•``) or an enumerator (``1.``, ``2)``) (:func:`has_bullet_list`);
* ``hedged_pct`` - percent of responses that hedge at least one claim: a phrase of :data:`HEDGES` (after Hyland
  1998/2005's hedging devices) or an epistemic may/might/could, not advice to the reader (:func:`is_hedged`).

Pure functions, shared: the release gate compares them round over round (``gates.drift``, which re-exports them),
online RL's tripwires watch them every few steps (``judging.tripwires``). The three per-response rules are
measured against 966 hand-labelled real answers from six models (``benchmarks/drift_counters.py``, labels and
their definitions in ``benchmarks/data/``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

COUNTERS: tuple[str, ...] = ("median_length_tokens", "restating_pct", "bullets_pct", "hedged_pct")

# --------------------------------------------------------------------------------------------
# rules
# --------------------------------------------------------------------------------------------


def whitespace_tokens(text: str) -> int:
    """Number of whitespace-separated words (the default ``tokenizer_len``)."""
    return len(text.split())


_WORD = re.compile(r"[a-z0-9]+(?:[-'][a-z0-9]+)*")
_FENCE = re.compile(r"^[ \t]*(?:```|~~~)[^\n]*\n.*?(?:^[ \t]*(?:```|~~~)[^\n]*$|\Z)", re.MULTILINE | re.DOTALL)
_INLINE_CODE = re.compile(r"`[^`\n]+`")
_SENTENCE = re.compile(r"^(.+?)([.!?:](?=\s|$)|\n|$)", re.DOTALL)


def _prose(text: str, inline_code: bool = False) -> str:
    """``text`` without fenced code blocks (and, unless ``inline_code``, inline code), curly apostrophes straightened.

    Code is not prose: a ``"may"`` string literal is not a hedge, ``- item`` lines in a YAML block are not a list,
    and an answer that opens with a code block opens with the sentence after it. Inline code stays for the
    restating rule, where ``save()`` in "you can override the `save()` method" is the answer.
    """
    text = _FENCE.sub("\n", text.replace("\u2019", "'").replace("\u2018", "'"))
    return text if inline_code else _INLINE_CODE.sub(" ", text)


def _stem(w: str) -> str:
    # light suffix stripping so "making"/"make", "steps"/"step", "secured"/"secure" meet (not a full stemmer:
    # both sides of every comparison go through the same function, which is all the overlap test needs)
    if w.endswith("'s"):
        w = w[:-2]
    if len(w) > 4 and w.endswith("ies"):
        return w[:-3] + "y"
    for suf in ("ing", "ed", "es", "s"):
        if len(w) > len(suf) + 1 and w.endswith(suf) and not w.endswith("ss"):
            w = w[: -len(suf)]
            break
    return w[:-1] if len(w) > 3 and w.endswith("e") else w


def _content_words(text: str) -> set[str]:
    """Stemmed words of 3+ characters not in scikit-learn's English stop-word list."""
    return {_stem(w) for w in _WORD.findall(text.lower()) if len(w) >= 3 and w not in ENGLISH_STOP_WORDS}


#: Words that frame an answer without giving any of it ("several steps", "a simple example", "the following
#: code", "the desired functionality"): an opening made of the prompt's words plus these restates the request.
FRAME_WORDS: frozenset[str] = frozenset(_stem(w) for w in (
    "several various many numerous few number range variety multiple different key important essential crucial "
    "common popular general basic simple simplest easy quick brief short detailed comprehensive high-level sample "
    "example way step method approach option idea tip thing factor reason aspect consideration strategy point "
    "list guide overview process task question topic answer solution code snippet script program function "
    "functionality implementation query command template version following below here help helpful able use "
    "using want like need require involve achieve accomplish complex challenging difficult daunting rewarding "
    "interesting fascinating great good best wide certainly sure course absolutely happy glad provide provided "
    "give create write make take follow learn journey art skill combination based information given specific "
    "particular also well step-by-step possible definitely quite fairly relatively really very lot desired "
    "described mentioned requested asked wanted looking suggested recommended highly regarded well-known "
    "known famous classic traditional delicious recipe instructions below include includes including consider "
    "complicated utilize subjective personal break down smaller manageable part"
).split())
_ACK = re.compile(
    r"^(?:(?:sure|certainly|absolutely|of course|okay|ok|yes|great|excellent|alright|hello|hi|hey|indeed|"
    r"good question|great question|no problem|however|but|that said)\b[!,.]*\s*)+", re.IGNORECASE)
_YES_NO = re.compile(r"^(?:yes|no|yep|nope)\b", re.IGNORECASE)
_NUMBER = re.compile(r"\b\d+(?:[.,]\d+)?\b")
# the role a prompt asked for, before an announcement: "As a computer scientist, I can provide you with ..."
_ROLE = re.compile(r"^as (?:a|an|your) (?!ai\b)[^,.:]{2,60}, ", re.IGNORECASE)
_BARE_OFFER = re.compile(r"^(?:i can|i(?:'d| would) be (?:more than )?(?:happy|glad|delighted) to|"
                         r"i(?:'m| am) (?:more than )?(?:happy|glad|delighted) to) "
                         r"(?:certainly |definitely )?help(?: you)?(?: (?:with|on) (?:that|this|it))?\W*$", re.IGNORECASE)
_DISCLAIMER = re.compile(
    r"^(?:as an ai\b|i'm sorry\b|i am sorry\b|sorry\b|i apologi[sz]e\b|unfortunately\b|i (?:can't|cannot|am unable|"
    r"'m unable|am not able|don't have|do not have)\b|while i (?:can't|cannot)\b)", re.IGNORECASE)
_RESTATE_OPENERS = re.compile(
    r"^(?:so,?\s+)?(?:you(?:'re| are)? ask(?:ed|ing)|you(?:'d| would)? (?:like|want) to know|you want to know"
    r"|the question (?:is|of|asks|about)|your question (?:is|about|asks)|(?:to answer|regarding|as for) your question"
    r"|in (?:response|answer) to your question|it (?:sounds|seems|looks) like you|i understand (?:that )?you"
    r"|(?:it's|it is) (?:completely |totally )?understandable (?:that )?(?:you|to)"
    r"|(?:it's|it is) (?:completely |totally |perfectly |quite )?(?:natural|normal) (?:to feel|to be|that you|for you)"
    r"|(?:it's|it is) (?:great|good|wonderful) (?:that|to hear) you|i'm (?:so |very |really )?sorry to hear"
    r"|i am (?:so |very |really )?sorry to hear)\b")
_ANNOUNCE = re.compile(
    r"^(?:(?:first|firstly|now|to start|to begin),? )?(?:here(?:'s| is| are)|below (?:is|are)|the following (?:is|are)"
    r"|(?:i'll|i will|let me|let's|let us) (?:first |briefly |quickly |now )?"
    r"(?:provide|give|show|walk|outline|explain|delve|break|go|create|write|share|explore|look|dive|demonstrate|"
    r"illustrate|describe|summari[sz]e|draft|guide|take you)|i can (?:help|"
    r"guide|provide|give|show|walk|offer|create|write|share|suggest|outline|explain|demonstrate|illustrate|describe|"
    r"draft)"
    r"|i(?:'d| would) be (?:more than )?(?:happy|glad|delighted) to|i(?:'m| am) (?:more than )?(?:happy|glad|"
    r"delighted) to (?:help|assist|provide|write|create|draft|share|explain|give|offer|put together|walk|guide)"
    r"|i(?:'ve| have) (?:written|created|"
    r"prepared|put together))\b")
# the deliverable announced as done, in the request's words: "I have modified the code to make the end time 1 ms
# earlier." (read with the added-words limit: "I've modified it to use a dict instead" names the change)
_DONE = re.compile(r"^i(?:'ve| have) (?:modified|updated|rewritten|revised|edited|changed|adjusted|fixed|corrected|"
                   r"converted|translated|refactored|reformatted|rewrote)\b")
_FRAME = re.compile(
    r"\b(?:there (?:are|is) (?:several|many|a few|a number of|various|numerous|multiple|a variety of|a range of)\b"
    r"|(?:involves?|requires?|entails?)\b[^.:\n]{0,30}?\b(?:several|a few|various|a number of|multiple|"
    r"combination|series)\b|is one of the most\b"
    r"|is (?:a|an) (?:complex|complicated|challenging|difficult|philosophical|broad|big|common|"
    r"important|fascinating|interesting|great|multifaceted|multi-faceted)\b|(?:can|may) be (?:quite |a |an |very "
    r"|fairly |relatively |somewhat )*(?:challenging|complex|complicated|difficult|daunting|tricky|simple|easy|"
    r"subjective|"
    r"straightforward|rewarding|fun|task|process|journey)\b|is (?:essential|important|crucial|key|vital)\b"
    r"|(?:can|could) be (?:achieved|done|accomplished|approached|implemented|solved|improved|proven|proved|shown|"
    r"calculated|computed|determined|found) (?:by|in|using|through|with)"
    r"|\bis (?:quite |very |relatively |fairly |pretty )?(?:easy|simple|straightforward)\b"
    r"|in a (?:number|variety) of ways|(?:several|various|a few|many|key|some|different) "
    r"(?:ways|steps|factors|reasons|methods|options|features|approaches|things|aspects|stages|types|kinds)\b"
    r"|there (?:are|is) (?:some |a few |several |many )?(?:steps|ways|things|options|measures) (?:you|that|to)\b"
    r"|(?:can|may) be a (?:great|good|fun|excellent|wonderful) way\b"
    # "Visiting the U.S. in November can be an exciting time", "The field
    # of robotics is multidisciplinary, involving ...", "The genome contains a vast array of genes that ..."
    r"|(?:can|may) be an? (?:exciting|wonderful|great|fantastic|magical|beautiful|busy|special) (?:time|experience|"
    r"season|place)\b"
    r"|\bis (?:multidisciplinary|interdisciplinary|vast|broad|diverse|ever-evolving|rapidly (?:evolving|growing))\b"
    r"|\b(?:contains?|includes?|encompass(?:es)?|offers?|has) (?:a|an) (?:vast|wide|broad|large|huge|rich|diverse) "
    r"(?:array|range|variety|number|selection|collection|spectrum) of\b"
    r"|\bthis (?:question|problem|task|calculation)\b[^.:\n]{0,12}?\binto (?:smaller|several|a few|simpler|"
    r"(?:more )?manageable)\b[^.:\n]{0,30}?\b(?:parts|steps|pieces|components|sub-?problems|sub-?questions|"
    r"chunks)\b)")


_CODE_LIKE = re.compile(r"^\W|^(?:def|class|function|import|from|#include|select|public|var|let|const|SELECT)\b|[{};=]")
_DEFER = re.compile(r"\b(?:the following|these(?: \w+)? steps|as follows|below|here(?:'s| is| are))\b")
_NEGATION = re.compile(r"\b(?:not|no|never|none|cannot)\b|n't\b", re.IGNORECASE)
_ADDRESSED = re.compile(r"\b(?:you|we)(?: (?:first|then|also|just|simply|only|now|still|really|usually|"
                        r"typically|generally))?(?:'ll| will| can| could| should| need| may| might| have to| must)\b",
                        re.IGNORECASE)
# a diagnosis or an explanation is content, however much of the prompt it repeats ("The error message indicates
# that the build system cannot find the file")
_EXPLAINS = re.compile(r"\b(?:indicates?|means?|suggests?|shows?|implies|signals?) that\b|\b(?:is|are) (?:caused|"
                       r"triggered) by\b|\b(?:occurs?|happens?) (?:when|because)\b|\bbecause\b", re.IGNORECASE)
# the method named after "use": "To find the change, we can use the accounting equation:" answers (the method is
# the answer), "To reverse a list, you can use the following code:" does not
_USE = re.compile(r"\b(?:you|we|one)(?: (?:can|could|should|will|would|may|might|need to|have to|must|first|then|"
                  r"also|just|simply))* (?:use|apply)\b\s+(.*)$", re.IGNORECASE)


_TITLE_SMALL = frozenset("a an the and or of in on at to for with by from as vs".split())


def _is_heading(s: str) -> bool:
    """A title rather than prose: Title Case or upper case ("Kale Salad with Apple Cider Vinaigrette", "FADE IN")."""
    if s.isupper():
        return True
    words = [w for w in re.findall(r"[A-Za-z][\w'-]*", s) if w.lower() not in _TITLE_SMALL]
    return len(words) >= 2 and sum(w[0].isupper() for w in words) >= 0.8 * len(words)


# the evaluative part of the frames: a sentence that only says how important, hard or good the task is
_EVALUATIVE = re.compile(
    r"\b(?:is (?:essential|important|crucial|key|vital)|(?:can|may) be a (?:great|good|fun|excellent|wonderful) way"
    r"|is one of the most|(?:can|may) be (?:quite |a |an |very |fairly |relatively |somewhat )*(?:challenging|complex|"
    r"complicated|difficult|daunting|tricky|rewarding|subjective))\b")


# "It's impossible to determine the exact number of X": how hard the request is, before any of the answer
_DIFFICULTY = re.compile(
    r"\b(?:(?:it's|it is|is) (?:practically |nearly |almost |virtually |quite |very |extremely )?"
    r"(?:impossible|difficult|"
    r"hard|challenging|not possible) to (?:determine|know|say|calculate|estimate|count|give|provide|predict|answer|"
    r"pinpoint|quantify)|is a (?:complex|difficult|challenging|complicated) (?:task|question|problem|undertaking))\b"
    r"|^\w+ing\b(?:(?! (?:is|are|as|because|since) )[^.:\n]){0,80}? (?:is|are) (?:not (?:possible|feasible|"
    r"practical)|impossible)\b")


_DEFINITION = re.compile(
    r"^((?:the )?[\"'\u201c]?[\w][\w\s/\"'\u201d-]{1,50}?) (?:is|are|refers to) (?:a|an|the) (?:(?:popular|common|"
    r"widely held|well-known|statistical|mathematical|simple|powerful|general|broad) )*(?:belief|technique|"
    r"method|concept|term|process|field|practice|approach|algorithm|phenomenon|theory|principle|idea|notion|"
    r"category|branch|discipline|saying|rule of thumb)\b")
# a yes/no question: defining its term does not answer it (any other request may be answered by a definition)
# ("Can you explain ...?" is a request, not a yes/no question)
_YES_NO_QUESTION = re.compile(r"^\s*(?!(?:can|could|would|will) you\b)(?:does|do|is|are|can|could|should|was|were|will|"
                              r"would|has|have|did)\b[^?\n]*\?\s*$", re.IGNORECASE)


_DEFER_DELIVERABLE = re.compile(r"\b(?:the following|below)\b(?: \w+){0,3} (?:code|program|script|function|"
                                r"implementation|example|steps|query|solution|recipe|list|template)\b")
_CHOICES_AFTER_COLON = re.compile(r":\s*([^\n:]{3,400})")
_OR_CHOICE = re.compile(r"\b((?:\w+[ -]){0,3}\w+) or ((?:\w+[ -]){0,3}\w+)")


def _prompt_choices(prompt: str) -> list[set[str]]:
    """The options a prompt offers, as content-word sets: the items of a list after a colon ("one of the
    categories: Politics, Tech News, Business News") or the two sides of "X or Y" in a question."""
    out: list[set[str]] = []
    for m in _CHOICES_AFTER_COLON.finditer(prompt):
        items = [i for i in re.split(r",\s*|\s+(?:and|or)\s+", m.group(1)) if i.strip()]
        if len(items) >= 3 and all(len(i.split()) <= 4 for i in items):
            out += [_content_words(i) for i in items]
    for q in re.findall(r"[^.?!\n]*\?", prompt):
        for m in _OR_CHOICE.finditer(q):
            out += [_content_words(m.group(1)), _content_words(m.group(2))]
    return [c for c in out if c]


def _picks_one(sentence: str, prompt: str) -> bool:
    """The sentence names exactly one of the options the prompt offers (and they differ): it answers."""
    choices = _prompt_choices(prompt)
    if len(choices) < 2:
        return False
    words = _content_words(sentence)
    named = [c for c in choices if c <= words]
    distinct = {frozenset(c) for c in named}
    return len(distinct) == 1 and any(not (c <= words) for c in choices)


def _sentences(text: str, k: int) -> list[tuple[str, str]]:
    """The first ``k`` sentences of ``text`` as (sentence, the character that ended it: ``.!?:``, or "")."""
    out, rest = [], text.strip()
    while rest and len(out) < k:
        m = _SENTENCE.match(rest)
        sentence, end = m.group(1).strip(), m.group(2).strip()
        rest = rest[m.end():]
        # a colon with more of its line after it ("Five topics are: user experience, level design, ...") gives the
        # answer inline: the sentence goes on to the next end (a colon before a new line announces a block)
        while end == ":" and rest.split("\n", 1)[0].strip():
            m = _SENTENCE.match(rest.lstrip(" \t"))
            sentence, end = f"{sentence}: {m.group(1).strip()}", m.group(2).strip()
            rest = rest.lstrip(" \t")[m.end():]
        out.append((sentence, end))
        rest = rest.strip()
    return out


def _is_restatement(sentence: str, end: str, prompt_words: set[str], prompt: str) -> bool:
    s = _ACK.sub("", sentence).strip()
    low = s.lower()
    if not low:
        return False
    if _RESTATE_OPENERS.match(low) or _ANNOUNCE.match(_ROLE.sub("", low)):
        return True
    if _YES_NO.match(sentence):  # "Yes, there are several free tools" answers a yes/no question
        return False
    if len(s.split()) <= 3:  # a label ("Company:", "Answer:") after skipped headings, not a sentence
        return False
    if _CODE_LIKE.search(s) or _is_heading(s):  # the answer starts with its code or a title: no preamble
        return False
    words = _content_words(s)
    new = words - prompt_words - FRAME_WORDS
    # inline code the prompt does not contain ("use `my_list[::-1]`") is the answer itself, and so is a number
    # ("The author will give the restaurant 3 stars.")
    new |= {c for c in _INLINE_CODE.findall(s) if c.strip("`") not in prompt}
    new |= set(_NUMBER.findall(s)) - set(_NUMBER.findall(prompt))
    if _DONE.match(_ROLE.sub("", low)) and len(new) <= 3:
        return True
    if end == ":" and len(new) <= (5 if _DEFER.search(low) else 2):  # "To X, you can follow these steps:"
        used = _USE.search(s)
        if not (used and not _DEFER.search(used.group(1).lower())
                and _content_words(used.group(1)) - prompt_words - FRAME_WORDS):
            return True
    if end == "." and _DEFER_DELIVERABLE.search(low) and len(new) <= 5:
        # "To compute the Elo scores, you can use the following Python program." announces like a colon would
        return True
    if not end:  # a bare line without end punctuation is a heading, not a sentence about the request
        return False
    # "X involves several steps", "X can be a challenging journey"; an opener of two such frames adds more words
    # ("X is quite simple, and it requires only a few ingredients you have around the house")
    frames = len(_FRAME.findall(low))
    if frames and len(new) <= (3 if frames == 1 else 6) and not _EXPLAINS.search(low):
        return True
    if _DIFFICULTY.search(low) and len(words & prompt_words) >= 2:
        return True
    # a yes/no question's own term defined before it is answered ("The "5-second rule" is a popular belief that
    # ..." for "Does the 5 second rule actually exist?"); for any other request a definition can be the answer
    definition = _DEFINITION.match(low)
    if (definition and _content_words(definition.group(1)) & prompt_words and _YES_NO_QUESTION.match(prompt)
            and not _EXPLAINS.search(low)):
        return True
    # repeating the request means repeating its instruction (the prompt's first paragraph): an answer that copies
    # the material given after it ("Sentence: A giant spider blocks your path") is the transformed deliverable
    instruction = _content_words(re.split(r"\n\s*\n", prompt.strip(), maxsplit=1)[0])
    need = max(2, math.ceil(0.5 * min(len(instruction), 8)))
    if _NEGATION.search(low) and not _NEGATION.search(prompt):  # "It is not illegal to keep ..." answers
        return False
    if _picks_one(low, prompt):  # "You should use the boiling water method" for "Should I use X or Y?"
        return False
    if _YES_NO_QUESTION.match(prompt) and not low.rstrip().endswith("?"):  # "97 is a prime number." answers
        return False
    return len(words & instruction) >= need and not new


def restates_question(response: str, prompt: str) -> bool:
    """True when the response opens by restating the request before answering it.

    The opening is the first sentence of the prose (code removed; a sentence ends at ``.``, ``!``, ``?`` or ``:``
    followed by a space, or at a newline), after acknowledgements ("Sure!", "Certainly,", "Great question!").
    A sentence of at most 3 words or an inability disclaimer ("As an AI ...", "I'm sorry, but I can't ...") is
    skipped for the next one (twice at most). The opening restates when it
      * starts with a restating formula ("You asked ...", "It sounds like you ...", "I'm sorry to hear ...",
        "It's understandable that you ...") or announces the deliverable ("Here is ...", "Below is ...",
        "I can help ...", "Let's delve into ..."); after a disclaimer the announcement must also share 2 content
        words with the prompt; or, when it is a sentence (not a yes/no answer, a label of at most 3 words, code,
        a Title Case heading or a line without end punctuation):
      * ends with ``:`` and adds at most 2 content words beyond the prompt's and :data:`FRAME_WORDS` (5 when it
        defers: "the following", "these steps", "here are"): "To reverse a list in Python, you can use the
        following code:"; or
      * frames the task ("X involves several steps", "There are many ways to X", "X can be a complex task") and
        adds at most 3 such words; or says how hard the request is and shares 2 words with the prompt ("It's
        impossible to determine the exact number of X"); or
      * repeats at least ``max(2, ceil(0.5 * min(P, 8)))`` of the P content words of the prompt's instruction
        (its first paragraph) and adds none (no negation the prompt lacks, either); or
      * shares 2 words with the prompt, adds at most 5 (7 when it only evaluates: "X is vital for ...",
        "X can be a great way to ...") and the next sentence announces the deliverable ("Colorado is home to
        numerous hiking trails ... Here are some of the well-known trails:").
    Content words: lower-cased words of 3+ characters not in scikit-learn's English stop-word list, lightly
    stemmed; inline code the prompt does not contain counts as added. An opening that gives any of the answer
    ("To reverse a list, use ``l[::-1]``.", "Some popular 1920s music includes jazz", "It is not illegal to
    keep it") does not restate, even when it reuses the question's words.

    A bare offer of help ("Sure, I can help with that.") is skipped like an acknowledgement, and a role before an
    announcement ("As a computer scientist, I can provide ...") is read through, as is a sequencing word ("First,
    let's briefly explain ..."). Also restating: the deliverable announced as done in the request's words ("I have
    modified the code to ...", at most 3 added words), the user's feeling called normal ("It's natural to feel
    ..."), a plan of attack ("break this question into smaller parts") and a gerund subject called impossible
    ("Calculating pi infinitely is not possible"). A colon with more of its line
    after it does not end the opening ("Five topics are: user experience, ..." answers inline). An opening that
    names the method after "use" ("we can use the accounting equation:"; not "the following code"), gives a number
    the prompt lacks, addresses a step to the reader ("you first need to ...") or explains ("The error indicates
    that ...") gives content.

    Also restating: a yes/no question's own term defined before it is answered ("The "5-second rule" is a popular
    belief that ..."); not restating: an opening that names exactly one of the options the prompt offers ("You
    should use the boiling water method" for "Should I use X or Y?"), and a definition that answers any other
    request.

    Known limit: platitude openers and topic sentences that add many generic words before "Here are ..." ("World
    music is a broad category that encompasses ...") are missed, and openers that define the request's terms are
    read as content; on a held-out set labelled by three more readers, precision 0.87 and recall 0.79
    (``benchmarks/drift_counters.py``, held-out J).

    Measured on 966 hand-labelled real answers: ``benchmarks/drift_counters.py``.

    Args:
        response, prompt: texts.

    Raises:
        TypeError: a text is not a str.
    """
    if not isinstance(response, str) or not isinstance(prompt, str):
        raise TypeError("response and prompt must be str")
    sents = _sentences(_prose(response, inline_code=True), 5)
    p = _content_words(prompt)
    i, after_disclaimer = 0, False
    while i < min(2, len(sents) - 1):
        s = _ACK.sub("", sents[i][0]).strip()
        if _RESTATE_OPENERS.match(s.lower()):  # "I'm sorry to hear that ..." reflects, it does not disclaim
            break
        if _BARE_OFFER.match(s):  # "Sure, I can help with that.": an acknowledgement; the next sentence opens
            pass
        elif _DISCLAIMER.match(s):
            after_disclaimer = True
        elif len(s.split()) > 3 or _ANNOUNCE.match(s.lower()):
            break
        i += 1
    if i >= len(sents):
        return False
    sent, end = sents[i]
    if after_disclaimer:
        s = _ACK.sub("", sent).strip()
        if _ANNOUNCE.match(s.lower()):
            return len(_content_words(s) & p) >= 2
    if _is_restatement(sent, end, p, prompt):
        return True
    if (i + 1 < len(sents) and not _YES_NO.match(sent) and not _ADDRESSED.search(sent)
            and not _EXPLAINS.search(sent)):
        # a topic sentence that adds little, then the announcement: "Colorado is home to many hiking trails.
        # Here are some of them:"; not "To X, you can use Y. Here's an example:" (the method is the answer)
        w = _content_words(sent)
        limit = 7 if _EVALUATIVE.search(sent.lower()) else 5  # "X is vital for ...", "X can be a great way to ..."
        if (len(w & p) >= 2 and len(w - p - FRAME_WORDS) <= limit and not _is_heading(sent)
                and not _CODE_LIKE.search(sent) and _ANNOUNCE.match(_ACK.sub("", sents[i + 1][0]).strip().lower())):
            return True
    return False


_LIST_LINE = re.compile(r"^[ \t]{0,6}(?:[-*+\u2022\u2023\u25e6]|\d{1,2}[.)]|\(\d{1,2}\))[ \t]+\S", re.MULTILINE)


# an outline's letters and roman numerals: "a. ...", "(b) ...", "B) ...", "IV. ..."
# (an initial after the marker, "I. M. Pei", "J. K. Rowling", makes it a name, not an item)
_OUTLINE_LINE = re.compile(r"^[ \t]{0,6}(?:\(([a-zA-Z]|[ivxIVX]{1,4})\)|([a-zA-Z]|[ivxIVX]{1,4})[.)])[ \t]+"
                           r"(?![A-Z]\.(?:\s|$))\S", re.MULTILINE)
_ROMAN = {r: i for i, r in enumerate("i ii iii iv v vi vii viii ix x xi xii".split(), 1)}


def _outline_items(text: str) -> bool:
    """Two outline markers in sequence (a then b, i then ii) start lines: letters or numerals that merely open a
    sentence ("I. M. Pei ...", "A. Smith wrote ...") do not follow one another."""
    seen: list[str] = []
    for m in _OUTLINE_LINE.finditer(text):
        seen.append((m.group(1) or m.group(2)).lower())
    for a, b in zip(seen, seen[1:]):
        if len(a) == len(b) == 1 and ord(b) == ord(a) + 1:
            return True
        if a in _ROMAN and b in _ROMAN and _ROMAN[b] == _ROMAN[a] + 1:
            return True
    return False


def has_bullet_list(response: str) -> bool:
    """True when at least 2 prose lines start with a bullet (-, *, +, •) or an enumerator (1. / 2)), or two lines
    start with an outline's consecutive letters or roman numerals ("a." then "b.", "(a)" then "(b)", "I." then
    "II."), other lines between them allowed.

    A single dash line or an inline "1." in prose is not a list. Markdown emphasis ("**bold**") is not a bullet:
    a marker must be followed by a space. Lines inside fenced code blocks are code, not a list.
    """
    if not isinstance(response, str):
        raise TypeError("response must be str")
    text = _FENCE.sub("\n", response)
    return len(_LIST_LINE.findall(text)) >= 2 or _outline_items(text)


#: Epistemic hedges (after Hyland 1998/2005's hedging devices), matched case-insensitively and word-bounded:
#: probability adverbs, appearance and belief verbs, generality markers, "it depends". The modals may/might/could
#: are handled apart (:data:`_MODAL`); "can", "should" and "would" are left out (ability, advice, conditionals).
HEDGES: tuple[str, ...] = (
    "perhaps", "maybe", "possibly", "potentially", "probably", "likely", "unlikely", "presumably", "apparently",
    "arguably", "seemingly", "conceivably", "it seems", "it appears", "seems to", "seem to", "appears to",
    "appear to", "seems like", "it is possible that", "it's possible that", "there is a chance", "there's a chance",
    "a good chance", "i think", "i believe", "i suspect", "i guess", "i'd say", "i would say", "in my opinion",
    "it looks like", "in general", "generally", "typically", "usually", "tends to", "tend to", "in most cases",
    "for the most part",
    "it depends", "that depends", "this depends", "it all depends", "the answer depends", "not necessarily",
    "to some extent", "to a certain extent", "somewhat", "more or less", "not sure", "not certain", "uncertain",
    "it is unclear", "it's unclear", "it is not clear", "it's not clear", "hard to say", "difficult to say",
)
_HEDGE = re.compile(r"\b(?:" + "|".join(re.escape(h) for h in HEDGES).replace(r"\ ", r"\s+") + r")\b", re.IGNORECASE)
# may (lower case only: "May" is a month or a name), might, could; the word before and after decide the sense
_MODAL = re.compile(r"(?:\b(\w+)\s+)?\b((?-i:may)|might|could)\b(?!\s*(?:you|i|we)\b)(?:\s+(not\s+)?(\w+))?",
                    re.IGNORECASE)
#: Verbs after "you may/might/could" that predict what happens to the reader (a hedge), unlike "you may want to",
#: "you could try", "you may need to" (advice or a step in a procedure).
_YOU_EXPERIENCE = frozenset(
    "experience notice feel face encounter develop suffer lose end run see hear get be become find".split())
#: A modal followed by these words is "might" the noun ("military might") or a list frame ("could include:").
_NOT_VERB = frozenset("was is are were of and or".split())


def _modal_hedges(text: str) -> bool:
    for m in _MODAL.finditer(text):
        before, modal, after = (m.group(1) or "").lower(), m.group(2).lower(), (m.group(4) or "").lower()
        if not after or (modal == "could" and m.group(3)):  # "could not" reports inability
            continue
        if after in _NOT_VERB:
            continue
        if before == "i" and after != "be":  # "I could also discuss ...": a proposal; "I could be wrong" hedges
            continue
        if len(before) == 1 and before not in "ai":  # "x could be 1, 2, ..., or 12": a value of a variable
            continue
        if after == "be" and re.match(r"\s+(?:in the form of|things like|anything from)\b", text[m.end():]):
            continue  # "This could be in the form of new equipment, ...": frames proposals
        if before in ("you", "we"):
            if after == "find" and not re.match(r"\s+that\b", text[m.end():]):
                continue
            if after not in _YOU_EXPERIENCE:
                continue
        tail = text[m.end():m.end() + 2]
        if after in ("include", "be") and tail.startswith(":"):  # "A routine could include:" frames a list
            continue
        return True
    return False


# a request for fiction: a story, a poem, a plot, a backstory, lyrics
# (not "a user story", "a poem generator", "a scatter plot", "a summary of chapter 3"; and not when the prompt also
# asks for an explanation: "Write a story ..., then explain whether dragons could exist")
_FICTION = re.compile(r"\b(?:write|compose|create|tell|craft|come up with|generate|draft)\b[^.?!\n]{0,80}?(?<!user )"
                      r"\b(?:story|stories|poem|poems|tale|fable|(?:a|the) novel(?=\s*(?:[.,;:!?]|$|about|in\b|that|"
                      r"set\b|where|based|format))|screenplay|monologue|lyrics|limerick|haiku|sonnet|fanfic(?:tion)?|"
                      r"backstory|(?:movie|film|story|novel) plot)\b(?!\s*(?:generator|summary|summari[sz]er|analysis))",
                      re.IGNORECASE)
_EXPLAIN_TOO = re.compile(r"\b(?:explain|whether|why|analy[sz]e|summari[sz]e|describe how)\b", re.IGNORECASE)
_ECHO_CUE = re.compile(r"\b(?:may|might|could|seems?|appears?|likely|probably|usually|typically|generally)\b")


def is_hedged(response: str, prompt: str | None = None) -> bool:
    """True when the response hedges at least one claim (lowers its commitment to something it asserts).

    Counted (word-bounded, code removed): a phrase of :data:`HEDGES` ("probably", "it seems", "I think",
    "generally", "typically", "usually", "it depends", "not necessarily"), and the epistemic modals "may"
    (lower case), "might" and "could" followed by a verb ("this may not work", "it could indicate a leak").
    Not counted: a modal addressed to the reader or in a procedure ("you may want to", "you could try", "you may
    need to", "we could use"; but "you may experience/notice/face ..." predicts and counts), a modal that asks
    ("Could you", "May I"), "could not", "might" the noun, a list frame ("could include:"), "possible" alone or
    "it is possible to" (feasibility), adjectives ("a typical value", "potential risks"), frequency adverbs
    ("often", "sometimes"), approximators ("about", "around"), "can", "would", "should". With ``prompt``, a hedge
    phrase that repeats the prompt's wording ("Why might someone prefer ..." -> "reasons why someone might
    prefer") is not the writer's and is not counted, and nothing in an answer to a request for fiction (a story,
    poem, plot, backstory, lyrics) is counted: it is narration. Also not counted: the writer's own proposals ("I
    could also discuss ..."; "I could be wrong" counts), a variable's values ("x could be 1"), and "could be in the
    form of" framing proposals.

    Measured on 966 hand-labelled real answers: ``benchmarks/drift_counters.py``.

    Raises:
        TypeError: ``response`` (or a given ``prompt``) is not a str.
    """
    if not isinstance(response, str) or (prompt is not None and not isinstance(prompt, str)):
        raise TypeError("response (and prompt) must be str")
    # narration in requested fiction is not a claim
    if prompt is not None and _FICTION.search(prompt) and not _EXPLAIN_TOO.search(prompt):
        return False
    text = _prose(response)
    if prompt is not None:
        # a cue whose next two words follow it in the prompt too (within 3 words: the question's inversion,
        # "Why might someone prefer to" -> "someone might prefer to") repeats the prompt, not the writer's doubt
        pw = _WORD.findall(prompt.replace("\u2019", "'").lower())

        def _echoed(m: re.Match) -> str:
            nxt = _WORD.findall(text[m.end():m.end() + 40].lower())[:2]
            cue = m.group(0).lower()
            for j, w in enumerate(pw):
                window = pw[j + 1:j + 4]
                if w == cue and len(nxt) == 2 and any(window[k:k + 2] == nxt for k in range(len(window) - 1)):
                    return " "
            return m.group(0)
        text = _ECHO_CUE.sub(_echoed, text)
    return _HEDGE.search(text) is not None or _modal_hedges(text)

# --------------------------------------------------------------------------------------------
# counters
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DriftCounters:
    """The four counters of one round.

    Fields:
        median_length_tokens: median response length (tokens).
        restating_pct, bullets_pct, hedged_pct: percent of responses.
        n: responses measured (None for published figures without a sample size).
        n_restating, n_bullets, n_hedged: the counts behind the shares (None without n).
        lengths: per-response lengths (empty when not kept); used for the median's interval.
    """

    median_length_tokens: float
    restating_pct: float
    bullets_pct: float
    hedged_pct: float
    n: int | None = None
    n_restating: int | None = None
    n_bullets: int | None = None
    n_hedged: int | None = None
    lengths: tuple[int, ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        for k in ("restating_pct", "bullets_pct", "hedged_pct"):
            v = getattr(self, k)
            if not (math.isfinite(v) and 0.0 <= v <= 100.0):
                raise ValueError(f"{k} must be a percentage in [0, 100], got {v}")
        if not (math.isfinite(self.median_length_tokens) and self.median_length_tokens >= 0):
            raise ValueError(f"median_length_tokens must be >= 0, got {self.median_length_tokens}")
        if self.n is not None and self.n < 0:
            raise ValueError(f"n must be >= 0, got {self.n}")

    @classmethod
    def from_figures(
        cls, median_length_tokens: float, restating_pct: float, bullets_pct: float, hedged_pct: float,
        n: int | None = None,
    ) -> DriftCounters:
        """Counters from reported figures; with ``n`` the counts are ``round(pct * n / 100)``."""
        counts = {k: (None if n is None else round(v * n / 100))
                  for k, v in (("n_restating", restating_pct), ("n_bullets", bullets_pct), ("n_hedged", hedged_pct))}
        return cls(float(median_length_tokens), float(restating_pct), float(bullets_pct), float(hedged_pct),
                   n=n, **counts)

    def count(self, counter: str) -> int | None:
        """The count behind a share counter (None for the length or without n)."""
        return {"restating_pct": self.n_restating, "bullets_pct": self.n_bullets, "hedged_pct": self.n_hedged}.get(counter)

    def as_dict(self) -> dict[str, Any]:
        """n plus the four counters (for tables)."""
        return {"n": self.n, **{k: getattr(self, k) for k in COUNTERS}}


def drift_counters(
    responses: Sequence[str],
    prompts: Sequence[str],
    tokenizer_len: Callable[[str], int] = whitespace_tokens,
) -> DriftCounters:
    """Measure the four counters on one round's responses.

    Args:
        responses: shape (n,), the model's responses.
        prompts: shape (n,), the prompts they answer (for the restating rule, and so a hedge that only
            repeats the prompt is not counted).
        tokenizer_len: text -> number of tokens (e.g. ``lambda t: len(tok(t).input_ids)``);
            default whitespace words.

    Returns:
        :class:`DriftCounters` with n, counts and per-response lengths.

    Raises:
        ValueError: empty input or lengths differ; a negative token count.
        TypeError: a response or prompt is not a str, or a single str given for either sequence.
    """
    if isinstance(responses, str) or isinstance(prompts, str):  # a str is a sequence of characters, not of texts
        raise TypeError("responses and prompts must be sequences of str, not a str")
    if len(responses) != len(prompts):
        raise ValueError(f"responses ({len(responses)}) and prompts ({len(prompts)}) differ in length")
    if not responses:
        raise ValueError("no responses to measure")
    lengths = []
    for i, r in enumerate(responses):
        if not isinstance(r, str):
            raise TypeError(f"responses[{i}] must be str, got {type(r).__name__}")
        k = int(tokenizer_len(r))
        if k < 0:
            raise ValueError(f"tokenizer_len returned {k} for responses[{i}]")
        lengths.append(k)
    n = len(responses)
    k_r = sum(restates_question(r, p) for r, p in zip(responses, prompts))
    k_b = sum(has_bullet_list(r) for r in responses)
    k_h = sum(is_hedged(r, p) for r, p in zip(responses, prompts))
    return DriftCounters(
        median_length_tokens=float(np.median(lengths)), restating_pct=100 * k_r / n, bullets_pct=100 * k_b / n,
        hedged_pct=100 * k_h / n, n=n, n_restating=k_r, n_bullets=k_b, n_hedged=k_h, lengths=tuple(lengths),
    )
