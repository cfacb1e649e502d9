"""The weak-signal store on DuckDB and on a real PostgreSQL server, through the same code."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from data.validation import DataValidationError
from flywheel.store import SignalStore, normalise_prompt, text_hash
from tests.pg_server import PostgresUnavailable, start_postgres

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def pg_server():
    try:
        with start_postgres() as url:
            yield url
    except PostgresUnavailable as err:
        print(f"PostgreSQL tests skipped: {err}")
        pytest.skip(f"PostgreSQL server cannot be started: {err}")


@pytest.fixture(params=["duckdb", "postgresql"])
def db_url(request, tmp_path):
    """A fresh, empty database of each kind."""
    if request.param == "duckdb":
        return f"duckdb:///{tmp_path / 'signals.duckdb'}"
    server = request.getfixturevalue("pg_server")
    name = f"t_{uuid.uuid4().hex[:12]}"
    eng = sa.create_engine(server, isolation_level="AUTOCOMMIT")
    with eng.connect() as c:
        c.exec_driver_sql(f"CREATE DATABASE {name}")
    eng.dispose()
    return server.rsplit("/", 1)[0] + f"/{name}"


def _rows(n: int, *, prefix: str = "e", n_prompts: int = 3) -> list[dict]:
    signals = ["thumbs_up", "thumbs_down", "regenerate", "copy"]
    return [
        {
            "event_id": f"{prefix}{i}",
            "conversation_id": f"{prefix}c{i // 4}",
            "turn_id": (i // 2) % 2,
            "user_id": f"u{(i // 4) % 5}",
            "model_version": "round-1",
            "intent": "oasst" if (i // 4) % 3 else None,
            "signal": signals[i % 4],
            "timestamp": "2026-03-01T12:00:00+00:00",
            "prompt": f"Question {(i // 2) % n_prompts}, please?",
            "response": f"Answer to conversation {i // 4}, turn {(i // 2) % 2}.",
        }
        for i in range(n)
    ]


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_ingest_counts_and_texts_stored_once(db_url, tmp_path):
    rows = _rows(12)
    store = SignalStore(db_url)
    rep = store.ingest(_jsonl(tmp_path / "a.jsonl", rows + rows[:3]), chunk_rows=5)  # 3 repeated in the file
    assert (rep.rows, rep.inserted, rep.duplicates) == (15, 12, 3)
    c = store.counts()
    # 12 events, 3 distinct prompts + 3 conversations x 2 turns = 6 distinct responses = 9 texts, 6 turns
    assert (c["events"], c["texts"], c["turns"], c["files"]) == (12, 9, 6, 1)
    assert (c["signal_thumbs_up"], c["signal_thumbs_down"], c["signal_regenerate"], c["signal_copy"]) == (3, 3, 3, 3)
    # The same content again: skipped as a file; the same events in a new file: stored once.
    assert store.ingest(tmp_path / "a.jsonl").skipped_file
    t = pa.Table.from_pylist([{**r, "timestamp": dt.datetime(2026, 3, 1, 12)} for r in rows[6:] + _rows(14)[12:]])
    pq.write_table(t, tmp_path / "b.parquet")
    rep = store.ingest(tmp_path / "b.parquet")
    assert (rep.rows, rep.inserted, rep.duplicates) == (8, 2, 6)
    assert store.counts()["events"] == 14
    # Texts are referenced by content hash and come back intact.
    turn = store.conversation("u0", "ec0")
    assert [t["prompt"] for t in turn] == ["Question 0, please?", "Question 1, please?"]
    turns = store.turns().to_pylist()
    assert turns[0]["prompt_hash"] == text_hash("Question 0, please?")
    assert turns[0]["prompt_norm_hash"] == text_hash("question 0 please")
    assert (turns[0]["thumbs_up"], turns[0]["thumbs_down"]) == (1, 1)
    store.close()


def test_schema_errors_name_file_row_field_and_write_nothing(db_url, tmp_path):
    store = SignalStore(db_url)
    rows = _rows(6)
    bad = [dict(r) for r in rows]
    bad[4]["signal"] = "like"
    with pytest.raises(DataValidationError) as err:
        store.ingest(_jsonl(tmp_path / "bad.jsonl", bad), chunk_rows=2)  # rows 0-3 were already loaded
    assert (err.value.file, err.value.row, err.value.field) == (str(tmp_path / "bad.jsonl"), 4, "signal")
    assert "'like'" in err.value.reason
    assert store.counts()["events"] == 0 and store.counts()["files"] == 0  # the transaction was rolled back

    missing = [dict(r) for r in rows]
    del missing[2]["user_id"]
    with pytest.raises(DataValidationError) as err:
        store.ingest(_jsonl(tmp_path / "missing.jsonl", missing))
    assert (err.value.row, err.value.field, err.value.reason) == (2, "user_id", "missing (field required)")

    t = pa.Table.from_pylist([{**r, "timestamp": dt.datetime(2026, 3, 1)} for r in rows])
    t = t.set_column(t.column_names.index("prompt"), "prompt", pa.array(["ok", "ok", "ok", "", "ok", "ok"]))
    pq.write_table(t, tmp_path / "bad.parquet")
    with pytest.raises(DataValidationError) as err:
        store.ingest(tmp_path / "bad.parquet")
    assert (err.value.row, err.value.field) == (3, "prompt")
    assert "at least 1 character" in err.value.reason
    assert store.counts()["events"] == 0
    store.close()


def test_sigkill_mid_file_then_rerun_ends_with_exact_counts(db_url, tmp_path):
    """An ingest process killed with SIGKILL in the middle of a file leaves nothing of that file; a rerun stores
    every event exactly once."""
    first = _jsonl(tmp_path / "first.jsonl", _rows(40, prefix="f"))
    big_rows = _rows(12_000, prefix="b", n_prompts=500)
    big = _jsonl(tmp_path / "big.jsonl", big_rows)
    cmd = [sys.executable, "-m", "flywheel.ingest", "--db", db_url, "--chunk-rows", "200", "--progress"]
    proc = subprocess.Popen(
        [*cmd, str(first), str(big)], cwd=REPO, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    for line in proc.stderr:
        if "big.jsonl: chunk 3 loaded" in line:
            os.kill(proc.pid, signal.SIGKILL)
            break
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    store = SignalStore(db_url)
    c = store.counts()
    assert (c["events"], c["files"]) == (40, 1)  # the first file committed, nothing of the killed one
    store.close()
    # Rerun both files: the first is skipped, the second goes in whole.
    out = subprocess.run([*cmd, str(first), str(big)], cwd=REPO, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.splitlines()[0])["skipped_file"] is True
    store = SignalStore(db_url)
    c = store.counts()
    assert (c["events"], c["files"]) == (40 + 12_000, 2)
    assert c["signal_thumbs_up"] == 10 + 3_000
    store.close()


def test_normalise_prompt():
    assert normalise_prompt("  Hi,   THERE!\n") == "hi there"
    assert normalise_prompt("Ｈｉ there") == "hi there"  # NFKC folds full-width letters
    assert normalise_prompt("what's up?") == normalise_prompt("What s up")


def test_judge_score_cache_on_both_databases(db_url, tmp_path):
    store = SignalStore(db_url)
    store.ingest(_jsonl(tmp_path / "a.jsonl", _rows(8)))
    turns = store.turns("j1").to_pylist()
    assert all(t["judge_score"] is None for t in turns)
    keys = {(t["prompt_hash"], t["response_hash"]): float(i) for i, t in enumerate(turns)}
    store.put_scores("j1", keys)
    store.put_scores("j1", {k: 99.0 for k in keys})  # already stored: kept, not overwritten
    scored = store.turns("j1").to_pylist()
    assert {(t["prompt_hash"], t["response_hash"]): t["judge_score"] for t in scored} == keys
    assert [t["judge_score"] for t in scored] == [float(i) for i in range(len(turns))]
    assert all(t["judge_score"] is None for t in store.turns("j2").to_pylist())  # scores are per judge
    store.close()
