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
    """What the turns table must equal: min() per metadata column (byte order), a count per signal."""
    coll = ' COLLATE "C"' if store.dialect == "postgresql" else ""
    meta = ", ".join(
        f"min({c}{coll}) AS {c}" for c in ["intent", "model_version", "user_id", "prompt_hash", "response_hash"]
    )
    sig = ", ".join(f"count(*) FILTER (WHERE signal = '{s}') AS {s}" for s in SIGNALS)
    sql = (
        f"SELECT conversation_id, turn_id, {meta}, {sig} FROM events GROUP BY conversation_id, turn_id "
        "ORDER BY conversation_id, turn_id"
    )
    with store.engine.connect() as conn:
        return [dict(r._mapping) for r in conn.exec_driver_sql(sql)]


def test_turns_table_equals_group_by_over_events(db_url, tmp_path):  # noqa: F811
    rows = [
        # c1 turn 0: metadata differs between events, spread over batches and files; the minimum wins
        _event(0, "c1", 0, "thumbs_up", intent=None, user="u9", model="round-2", response="Zed."),
        _event(1, "c1", 0, "thumbs_down", intent="vicuna", user="u3"),
        _event(2, "c1", 1, "regenerate", prompt="Second, question!"),
        _event(3, "c2", 0, "copy", intent=None),
        _event(4, "c1", 0, "thumbs_up", intent="koala", model="round-1", response="Aardvark."),
        _event(5, "c2", 0, "copy", intent=None),
    ]
    store = SignalStore(db_url)
    store.ingest(_jsonl(tmp_path / "a.jsonl", rows[:4] + rows[:2]), chunk_rows=2)  # repeats inside the file
    store.ingest(_jsonl(tmp_path / "b.jsonl", rows[3:]), chunk_rows=1)  # row 3 again, across files
    want = _group_by(store)
    got = store.turns().to_pylist()
    assert [{k: t[k] for k in want[0]} for t in got] == want
    c1 = got[0]
    assert (c1["intent"], c1["user_id"], c1["model_version"]) == ("koala", "u1", "round-1")  # "koala" < "vicuna"
    assert c1["response_hash"] == min(text_hash("Zed."), text_hash("Hello."), text_hash("Aardvark."))
    assert (c1["thumbs_up"], c1["thumbs_down"]) == (2, 1)
    assert got[2]["intent"] is None and got[2]["copy"] == 2  # c2: intent never known, two copies (e3 once)
    assert got[1]["prompt_norm_hash"] == text_hash(normalise_prompt("Second, question!"))
    assert store.counts()["turns"] == 3
    store.close()


def test_turns_table_rebuilt_for_an_older_store(db_url, tmp_path):  # noqa: F811
    rows = [_event(i, f"c{i // 3}", i % 2, SIGNALS[i % 7], user=f"u{i % 4}", response=f"R{i // 2}") for i in range(30)]
    store = SignalStore(db_url)
    store.ingest(_jsonl(tmp_path / "a.jsonl", rows), chunk_rows=7)
    before = store.turns().to_pylist()
    with store.engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE turns")  # as a store written before the turns table existed
    store.close()
    store = SignalStore(db_url)
    assert store.turns().to_pylist() == before
    assert len(before) == len(_group_by(store)) == 20
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
