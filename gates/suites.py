"""The prompt suites of the gate stage: which prompts each gate sees, built from the round's data sources.

Kept apart from gates/evaluate.py so the choice of items is testable without a model.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Sequence

from .capability import NeutralQuestion, neutral_question

# The BCT prompts ask for chain-of-thought first; a 135M model rambles past any token budget we can afford on
# CPU, so the probes ask for the letter directly (neutral_question's "direct" format) and the biased prompts
# get the same instruction. Both models see identical prompts, so the comparison stays fair.
_COT_TAIL = "\n\nPlease think step by step"


def stratified(items: Sequence[Any], n: int, key=lambda p: p.intent) -> list[Any]:
    """Up to ``n`` items, taking one per stratum in turn (strata in first-seen order, items in file order).

    With 5 intents and n=24 that is 5, 5, 5, 5, 4 items, so every cluster is measured; the first-N of a file
    sorted by cluster would measure one.
    """
    groups: OrderedDict[Any, list[Any]] = OrderedDict()
    for item in items:
        groups.setdefault(key(item), []).append(item)
    out: list[Any] = []
    depth = 0
    while len(out) < n and any(depth < len(g) for g in groups.values()):
        for g in groups.values():
            if depth < len(g) and len(out) < n:
                out.append(g[depth])
        depth += 1
    return out


def held_back(items: Sequence[Any], n_measured: int, n: int, key=lambda p: p.intent,
              keep=lambda p: True) -> list[Any]:
    """Up to ``n`` items of a suite that its gate does not measure: the items left after
    ``stratified(items, n_measured)`` (and passing ``keep``), taken the same way (one per stratum in turn). A slice
    to watch during training (online RL's tripwire) that shares no prompt with what the gate will score.
    """
    measured = {id(x) for x in stratified(items, n_measured, key)}
    return stratified([x for x in items if id(x) not in measured and keep(x)], n, key)


def capability_questions(rows: Sequence[Any], n: int) -> list[NeutralQuestion]:
    """The first ``n`` sycophancy-set questions asked neutrally (no suggestion), answer-with-a-letter format."""
    return [neutral_question(r, answer_format="direct") for r in rows[:n]]


@dataclass(frozen=True)
class SuggestedQuestion:
    """A question with the user's suggested wrong answer in front of it (contradiction probe)."""

    id: str
    prompt: str
    correct_answer: str
    suggested_answer: str
    n_choices: int


def suggested_questions(rows: Sequence[Any], n: int) -> list[SuggestedQuestion]:
    """The first ``n`` suggested-answer rows whose suggestion is wrong, in the direct answer format.

    The biased prompt is the BCT text up to its chain-of-thought instruction, followed by the same letter
    instruction the neutral questions use.
    """
    out: list[SuggestedQuestion] = []
    for row in rows:
        if len(out) == n:
            break
        meta = row.meta
        suggested, correct = meta.get("suggested_answer"), meta.get("correct_answer")
        if not suggested or suggested == correct:
            continue
        neutral = neutral_question(row, answer_format="direct")
        instruction = neutral.prompt.rsplit("\n\n", 1)[-1]
        biased = row.prompt.split(_COT_TAIL, 1)[0].rstrip() + "\n\n" + instruction
        out.append(SuggestedQuestion(row.id, biased, correct, suggested, neutral.n_choices))
    return out
