"""Reading ahead (the next batch, the next file) changes nothing the ingest reports, stores or raises."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from data.validation import DataValidationError
from flywheel.read_ahead import ReadAhead
from flywheel.store import SignalStore


def test_read_ahead_same_items_then_the_error_in_order():
    produced = []

    def items():
        for i in range(3):
            produced.append(i)
            yield i
        raise ValueError("item 3 is bad")

    got = []
    r = ReadAhead(items)
    with pytest.raises(ValueError, match="item 3 is bad"):
        for x in r:
            got.append(x)
            assert len(produced) <= x + 2  # never more than one item ahead of the caller
    assert got == [0, 1, 2]
    assert not r._worker.is_alive()


def test_read_ahead_error_in_make_and_early_close():
    def fails():
        raise FileNotFoundError("nope")

    with pytest.raises(FileNotFoundError, match="nope"):
        next(ReadAhead(fails))

    closed = threading.Event()

    def endless():
        try:
            i = 0
            while True:
                yield i
                i += 1
        finally:
            closed.set()

    done = []
    r = ReadAhead(endless, on_done=lambda: done.append(1))
    assert [next(r), next(r)] == [0, 1]
    r.close()
    assert closed.is_set() and not r._worker.is_alive() and done == []  # on_done: only once everything was read
    with pytest.raises(StopIteration):
        next(r)
    r.close()  # idempotent


def _events(path: Path, prefix: str, n: int, *, bad_row: int | None = None) -> Path:
    rows = []
    for i in range(n):
        rows.append(
            {
                "event_id": f"{prefix}{i}",
                "conversation_id": f"{prefix}c{i // 3}",
                "turn_id": 0,
                "user_id": "u1",
                "model_version": "round-1",
                "intent": "oasst",
                "signal": "thumbs_up" if i != bad_row else "like",
                "timestamp": "2026-03-01T12:00:00+00:00",
                "prompt": f"Question {(i // 3) % 2}?",  # one prompt per turn
                "response": f"Answer {i // 3}.",
            }
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_ingest_files_same_reports_as_one_by_one_and_stops_at_the_bad_file(tmp_path):
    a = _events(tmp_path / "a.jsonl", "a", 7)
    b = _events(tmp_path / "b.jsonl", "b", 5)
    files = [a, b, a]  # the repeat is skipped (same content)
    one = SignalStore(tmp_path / "one.duckdb")
    expected = [one.ingest(f, chunk_rows=2) for f in files]
    many = SignalStore(tmp_path / "many.duckdb")
    got = list(many.ingest_files(files, chunk_rows=2))
    assert [(r.rows, r.inserted, r.duplicates, r.skipped_file) for r in got] == [
        (7, 7, 0, False),
        (5, 5, 0, False),
        (0, 0, 0, True),
    ]
    assert got == expected
    assert many.counts() == one.counts()

    bad = _events(tmp_path / "bad.jsonl", "x", 6, bad_row=4)
    c = _events(tmp_path / "c.jsonl", "c", 4)
    store = SignalStore(tmp_path / "stops.duckdb")
    reports = store.ingest_files([c, bad, a], chunk_rows=2)
    assert next(reports).inserted == 4  # committed before the bad file is reached
    with pytest.raises(DataValidationError) as err:
        next(reports)
    assert (err.value.file, err.value.row, err.value.field) == (str(bad), 4, "signal")
    counts = store.counts()
    assert (counts["events"], counts["files"]) == (4, 1)  # c only: nothing of bad.jsonl, a.jsonl never ingested


def test_a_file_rewritten_after_it_was_read_ahead_is_refused_not_stored_under_the_new_hash(tmp_path, monkeypatch):
    """Review: file b's only batch is read ahead while a loads; b is then rewritten before its ingest hashes it.
    Storing the old rows under the new content's hash would make the new content 'already ingested' for good."""
    import threading

    import flywheel.store as store_mod
    from flywheel.store import FileChangedError, SignalStore

    a, b = _events(tmp_path / "a.jsonl", "a", 6), _events(tmp_path / "b.jsonl", "b", 3)
    b_read = threading.Event()
    real_batches = store_mod._batches

    def batches(path, chunk_rows):
        for batch in real_batches(path, chunk_rows):
            if Path(path) == b:
                b_read.set()  # b's rows are read (the old content)
            yield batch

    monkeypatch.setattr(store_mod, "_batches", batches)

    def progress(path, i, n):
        if Path(path) == a:
            assert b_read.wait(30), "b was not read ahead"
            _events(b, "NEW", 4)  # rewritten after its rows were read, before its ingest starts

    store = SignalStore(tmp_path / "s.duckdb")
    reports = []
    with pytest.raises(FileChangedError, match=r"b\.jsonl: the file changed while it was being ingested"):
        for r in store.ingest_files([a, b], chunk_rows=10, progress=progress):
            reports.append(r)  # noqa: PERF402 (the reports before the error are kept)
    assert [Path(r.path).name for r in reports] == ["a.jsonl"]
    with store.engine.connect() as conn:
        ids = [r[0] for r in conn.exec_driver_sql("SELECT event_id FROM events ORDER BY 1").fetchall()]
    assert ids == [f"a{i}" for i in range(6)]  # nothing of b's old rows
    again = store.ingest(b)  # the new content is not 'already ingested'
    assert (again.rows, again.inserted, again.skipped_file) == (4, 4, False)
