"""Per-turn decontamination (data.decontamination.check_per_turn / decontaminate(per_turn=True)): a suite prompt
asked as one user turn of a multi-turn conversation is found; the default (joined turns) is unchanged."""

from __future__ import annotations

from data.decontamination import check, check_per_turn, decontaminate, row_text, row_turns, suites_from_generations
from data.expert import ExpertLabel, ExpertPair
from data.schemas import Message

SUITES = {
    "safe": ["How do I kill a Python process?"],  # 7 words: exact, or contained as its own clause
    "winrate": ["Write a short poem about the sea at night in winter please"],  # 12 words: 8-grams
}


def _pair(pid: str, *user_turns: str) -> ExpertPair:
    msgs: list[Message] = []
    for i, t in enumerate(user_turns):
        if i:
            msgs.append(Message(role="assistant", content=f"reply {i}"))
        msgs.append(Message(role="user", content=t))
    return ExpertPair(
        id=pid,
        prompt=msgs,
        response_a="a",
        response_b="b",
        labels=[ExpertLabel(annotator_id="ann-1", verdict=0), ExpertLabel(annotator_id="ann-2", verdict=0)],
    )


PAIRS = [
    _pair("hello-then-suite", "Hello there.", "how do I  KILL a python process?"),  # turn 2 = safe[0] (case, space)
    _pair("clean", "What is the capital of France?"),
    _pair("ngram-in-turn", "Hi.", "Could you write a short poem about the sea at night in winter for me?"),
    _pair("single-turn-exact", "How do I kill a Python process?"),
]


def test_row_turns_and_row_text():
    assert row_turns(PAIRS[0]) == ["Hello there.", "how do I  KILL a python process?"]
    assert row_text(PAIRS[0]) == "Hello there.\nhow do I  KILL a python process?"
    assert row_turns("just text") == ["just text"]


def test_joined_text_holds_the_turn_and_per_turn_finds_it_exact():
    joined = check([row_text(p) for p in PAIRS], SUITES)
    # the joined text of pair 0 holds the safe prompt as its own line: contained (before: missed, 6 words < 8)
    assert [(o.train_index, o.suite, o.match) for o in joined.overlaps] == [
        (0, "safe", "contained"), (2, "winrate", "ngram"), (3, "safe", "exact")]
    per_turn = check_per_turn(PAIRS, SUITES)
    assert per_turn.contaminated_rows == [0, 2, 3]
    assert per_turn.n_train == 4
    got = [(o.train_index, o.suite, o.suite_index, o.match) for o in per_turn.overlaps]
    assert got == [(0, "safe", 0, "exact"), (2, "winrate", 0, "ngram"), (3, "safe", 0, "exact")]
    # "write a short poem about the sea at night in winter" = 11 words shared -> 11 - 8 + 1 = 4 shared 8-grams
    assert per_turn.overlaps[1].shared_ngrams == 4
    assert per_turn.seen == {"safe": 1, "winrate": 1}
    assert per_turn.by_kind == {"exact": 2, "contained": 0, "ngram": 1, "fuzzy": 0}


def test_a_two_word_suite_prompt_asked_as_one_turn_is_found_per_turn_only():
    suites = {"winrate": ["Kickball rules?"]}  # 2 words: exact only (contained needs 3)
    pairs = [_pair("two-word-turn", "Hi.", "kickball  RULES"), _pair("inside", "What are the kickball rules here?")]
    assert check([row_text(p) for p in pairs], suites).overlaps == []
    assert [(o.train_index, o.match) for o in check_per_turn(pairs, suites).overlaps] == [(0, "exact")]


def test_decontaminate_per_turn_removes_and_reports_default_unchanged():
    kept, record = decontaminate(PAIRS, SUITES, per_turn=True)
    assert [p.id for p in kept] == ["clean"]
    assert (record["removed"], record["per_turn"], record["n_train"]) == (3, True, 4)
    assert [o["train_id"] for o in record["overlaps"]] == ["hello-then-suite", "ngram-in-turn", "single-turn-exact"]
    assert [o["match"] for o in record["overlaps"]] == ["exact", "ngram", "exact"]
    kept, record = decontaminate(PAIRS, SUITES)  # the other callers' behaviour: joined user turns only
    assert [p.id for p in kept] == ["clean"]
    assert "per_turn" not in record and record["removed"] == 3
    assert [o["match"] for o in record["overlaps"]] == ["contained", "ngram", "exact"]
    assert record["by_kind"] == {"exact": 1, "contained": 1, "ngram": 1, "fuzzy": 0}


def test_suites_from_generations(tmp_path):
    path = tmp_path / "generations.jsonl"
    path.write_text(
        '{"suite": "winrate", "prompt": "Plain prompt"}\n\n'
        '{"suite": "mt", "prompt": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "x"},'
        ' {"role": "user", "content": "b"}]}\n'
    )
    assert suites_from_generations(path) == {"winrate": ["Plain prompt"], "mt": ["a\nb"]}
    path.write_text('{"suite": "winrate"}\n')
    import pytest

    with pytest.raises(ValueError, match="line 0"):
        suites_from_generations(path)
