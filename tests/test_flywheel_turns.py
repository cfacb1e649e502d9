"""The per-turn table the ingest keeps: equal to a GROUP BY over every stored event, on DuckDB and PostgreSQL,
whatever the batch boundaries and arrival order; rebuilt for a store written before it existed; and the store-side
selection gives the pure function's result."""

from __future__ import annotations

import json
import math

import pandas as pd

from flywheel.schema import SIGNALS
from flywheel.select import SelectionConfig, select_turns
from flywheel.select_store import select_from_store
from flywheel.store import TURN_COLUMNS, SignalStore, normalise_prompt, text_hash
from tests.test_flywheel_store import db_url, pg_server  # noqa: F401  (fixtures: a fresh database of each kind)


def _event(i, conv, turn, signal, *, intent="oasst", user="u1", model="round-1", prompt="Hi?", response="Hello."):
    return {
        "event_id": f"e{i}",
        "conversation_id": conv,
        "turn_id": turn,
        "user_id": user,
        "model_version": model,
        "intent": intent,
        "signal": signal,
        "timestamp": "2026-03-01T12:00:00Z",
        "prompt": prompt,
        "response": response,
    }


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _group_by(store: SignalStore) -> list[dict]:
    """What the turns table must equal: one row per (user, conversation, turn, prompt, response), min() of intent
    and model version (byte order), the earliest time, a count per signal."""
    coll = ' COLLATE "C"' if store.dialect == "postgresql" else ""
    key = "user_id, conversation_id, turn_id, prompt_hash, response_hash"
    meta = ", ".join(f"min({c}{coll}) AS {c}" for c in ["intent", "model_version"])
    sig = ", ".join(f"count(*) FILTER (WHERE signal = '{s}') AS {s}" for s in SIGNALS)
    sql = (
        f"SELECT {key}, {meta}, min(ts) AS first_ts, {sig} FROM events GROUP BY {key} "
        "ORDER BY conversation_id, turn_id, user_id, response_hash"
    )
    with store.engine.connect() as conn:
        return [dict(r._mapping) for r in conn.exec_driver_sql(sql)]


def _sorted_turns(store):
    return sorted(store.turns().to_pylist(), key=lambda t: (t["conversation_id"], t["turn_id"], t["user_id"],
                                                             t["response_hash"]))


def test_turns_table_equals_group_by_over_events(db_url, tmp_path):  # noqa: F811
    rows = [
        # c1 turn 0 of u1: metadata differs between events, spread over batches and files; the minimum wins
        _event(0, "c1", 0, "thumbs_up", intent=None, model="round-2"),
        _event(1, "c1", 0, "thumbs_down", intent="vicuna"),
        _event(2, "c1", 1, "regenerate", prompt="Second, question!"),
        _event(3, "c2", 0, "copy", intent=None),
        _event(4, "c1", 0, "thumbs_up", intent="koala", model="round-1"),
        _event(5, "c2", 0, "copy", intent=None),
        # another user under the same conversation id: another conversation, another prompt is fine
        _event(6, "c1", 0, "thumbs_down", user="u9", prompt="Mine?", response="Yours."),
        # the reply of c1 turn 1 regenerated: its own row, with its own signal
        _event(7, "c1", 1, "thumbs_up", prompt="Second, question!", response="Better."),
    ]
    store = SignalStore(db_url)
    store.ingest(_jsonl(tmp_path / "a.jsonl", rows[:4] + rows[:2]), chunk_rows=2)  # repeats inside the file
    store.ingest(_jsonl(tmp_path / "b.jsonl", rows[3:]), chunk_rows=1)  # row 3 again, across files
    want = _group_by(store)
    got = _sorted_turns(store)
    assert [{k: t[k] for k in want[0]} for t in got] == want
    assert len(got) == 5 and store.counts()["turns"] == 5
    c1 = next(t for t in got if (t["conversation_id"], t["turn_id"], t["user_id"]) == ("c1", 0, "u1"))
    assert (c1["intent"], c1["model_version"]) == ("koala", "round-1")  # "koala" < "vicuna"
    assert c1["response_hash"] == text_hash("Hello.") and c1["prompt_hash"] == text_hash("Hi?")
    assert (c1["thumbs_up"], c1["thumbs_down"]) == (2, 1)
    u9 = next(t for t in got if t["user_id"] == "u9")
    assert (u9["prompt_hash"], u9["thumbs_down"], u9["thumbs_up"]) == (text_hash("Mine?"), 1, 0)
    regen = sorted((t["response_hash"], t["regenerate"], t["thumbs_up"]) for t in got if t["turn_id"] == 1)
    assert regen == sorted([(text_hash("Hello."), 1, 0), (text_hash("Better."), 0, 1)])
    c2 = next(t for t in got if t["conversation_id"] == "c2")
    assert c2["intent"] is None and c2["copy"] == 2  # c2: intent never known, two copies (e3 once)
    second = next(t for t in got if t["turn_id"] == 1)
    assert second["prompt_norm_hash"] == text_hash(normalise_prompt("Second, question!"))
    store.close()


def test_turns_table_rebuilt_for_an_older_store(db_url, tmp_path):  # noqa: F811
    rows = [_event(i, f"c{i // 3}", i % 2, SIGNALS[i % 7], user=f"u{i % 4}", response=f"R{i // 2}") for i in range(30)]
    with_old_layout = "CREATE TABLE turns (conversation_id VARCHAR, turn_id INTEGER, user_id VARCHAR)"
    store = SignalStore(db_url)
    store.ingest(_jsonl(tmp_path / "a.jsonl", rows), chunk_rows=7)
    before = store.turns().to_pylist()
    with store.engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE turns")  # as a store written before the turns table existed
    store.close()
    store = SignalStore(db_url)
    assert store.turns().to_pylist() == before
    with store.engine.begin() as conn:  # as a store written with the older (conversation, turn) layout
        conn.exec_driver_sql("DROP TABLE turns")
        conn.exec_driver_sql(with_old_layout)
    store.close()
    store = SignalStore(db_url)
    assert store.turns().to_pylist() == before
    assert len(before) == len(_group_by(store)) == 30  # every event its own (user, turn, reply) here
    store.close()


def test_select_from_store_equals_select_turns_on_the_full_table(db_url, tmp_path):  # noqa: F811
    rows = []
    for c in range(40):
        for k, s in enumerate(["thumbs_down", "thumbs_up", "regenerate"][: 1 + c % 3]):
            rows.append(
                _event(
                    len(rows),
                    f"c{c:02d}",
                    0,
                    s,
                    intent=["a", "b", None][c % 3],
                    prompt=f"P{c % 13}?",
                    response=f"Answer {c}.",
                )
            )
    store = SignalStore(db_url)
    store.ingest(_jsonl(tmp_path / "a.jsonl", rows))
    full = store.turns().to_pylist()
    store.put_scores("j", {(t["prompt_hash"], t["response_hash"]): float((i * 7) % 40) for i, t in enumerate(full)})
    cfg = SelectionConfig(budget=6)
    want = select_turns(store.turns_frame("j"), {"a": 0.5, "b": 0.3}, cfg)
    got = select_from_store(store, {"a": 0.5, "b": 0.3}, cfg, judge="j")
    assert (got.n_turns, got.n_scored, got.n_candidates, got.n_duplicates, got.budget) == (
        want.n_turns,
        want.n_scored,
        want.n_candidates,
        want.n_duplicates,
        want.budget,
    )
    assert got.by_kind == want.by_kind and got.by_intent == want.by_intent
    assert len(got.selected) == 6
    cols = [*TURN_COLUMNS, "judge_score", "q", "kind", "disagreement", "stratum"]
    pd.testing.assert_frame_equal(
        got.selected[cols].reset_index(drop=True), want.selected[cols].reset_index(drop=True), check_dtype=False
    )
    none = select_from_store(store, {"a": 1.0}, cfg)  # no judge: nothing scored, nothing selected
    assert (none.n_turns, none.n_scored, len(none.selected)) == (40, 0, 0)
    assert not math.isnan(got.selected["judge_score"].iloc[0])
    store.close()
