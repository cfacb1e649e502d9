"""Every event kept or refused, never lost or mixed: on real DuckDB and a real PostgreSQL server.

- Turns that cannot mix: the same conversation id under two users is two conversations; a regenerated reply is its
  own turn row with the signals given on it; one (user, conversation, turn) with two prompts is refused naming both
  rows; the annotation task shows the history that user saw.
- An event id with different content is refused wherever the two rows are (same batch, other batch, other file,
  an earlier ingest), naming both; true duplicates are counted; the outcome does not depend on ``chunk_rows``.
- One validator: JSONL and Parquet accept and refuse the same values, with file, row and field.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data.validation import DataValidationError
from flywheel.annotation import build_tasks
from flywheel.schema import MAX_LINE_BYTES, MAX_TURN_ID
from flywheel.store import SignalStore, text_hash
from tests.test_flywheel_store import db_url, pg_server  # noqa: F401  (fixtures: a fresh database of each kind)

REPO = Path(__file__).resolve().parent.parent
CHUNKS = [1, 2, 3, 1000]


def _ev(i, conv="c1", turn=0, signal="thumbs_up", *, user="u1", prompt="Hi?", response="Hello.", ts=None, eid=None):
    return {
        "event_id": eid or f"e{i}",
        "conversation_id": conv,
        "turn_id": turn,
        "user_id": user,
        "model_version": "round-1",
        "intent": "oasst",
        "signal": signal,
        "timestamp": ts or f"2026-03-01T12:{i // 60:02d}:{i % 60:02d}Z",
        "prompt": prompt,
        "response": response,
    }


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _counts(store):
    c = store.counts()
    return (c["events"], c["turns"], c["files"])


# ---- turns that cannot mix -----------------------------------------------------------------------------------------
def test_two_users_reusing_a_conversation_id_stay_two_conversations(db_url, tmp_path):  # noqa: F811
    rows = [
        _ev(0, user="alice", prompt="My HIV test came back positive, what now?", response="Talk to your doctor."),
        _ev(1, user="alice", turn=1, prompt="Is it treatable?", response="Yes, very."),
        _ev(2, user="bob", prompt="Best pizza dough?", response="Use 00 flour."),
        _ev(3, user="bob", turn=1, prompt="How long to proof?", response="24 hours.", signal="thumbs_down"),
    ]
    store = SignalStore(db_url)
    store.ingest(_jsonl(tmp_path / "a.jsonl", rows))
    assert _counts(store) == (4, 4, 1)
    bob = store.history("bob", "c1", 1, text_hash("24 hours."))
    assert [(x["prompt"], x["response"]) for x in bob] == [
        ("Best pizza dough?", "Use 00 flour."),
        ("How long to proof?", "24 hours."),
    ]
    seen = json.dumps(bob)
    assert "HIV" not in seen and "treatable" not in seen  # alice's turns never appear as bob's history
    # the export task for bob's turn shows exactly that history
    turn = {"user_id": "bob", "conversation_id": "c1", "turn_id": 1, "response_hash": text_hash("24 hours.")}
    export = build_tasks(
        [turn],
        lambda t: store.history(t["user_id"], t["conversation_id"], t["turn_id"], t["response_hash"]),
        lambda t: ["24 hours.", "One to three days in the fridge."],
        scrub=lambda s: (s, Counter()),
    )
    assert [m["content"] for m in export.tasks[0]["data"]["messages"]] == [
        "Best pizza dough?",
        "Use 00 flour.",
        "How long to proof?",
    ]
    assert "bob" not in json.dumps(export.tasks)
    store.close()


@pytest.mark.parametrize("chunk", CHUNKS)
def test_a_regenerated_reply_is_its_own_row_with_its_own_signals(db_url, tmp_path, chunk):  # noqa: F811
    rows = [
        _ev(0, signal="thumbs_down", response="Go away."),
        _ev(1, signal="regenerate", response="Go away."),
        _ev(2, signal="thumbs_up", response="Hello! How can I help?"),  # the regenerated reply
        _ev(3, signal="continued", response="Hello! How can I help?"),
        _ev(4, turn=1, prompt="Plan a trip to Rome.", response="Day 1: the Colosseum."),
    ]
    store = SignalStore(db_url)
    store.ingest(_jsonl(tmp_path / "a.jsonl", rows), chunk_rows=chunk)
    got = {
        t["response_hash"]: (t["thumbs_up"], t["thumbs_down"], t["regenerate"], t["continued"])
        for t in store.turns().to_pylist()
        if t["turn_id"] == 0
    }
    assert got == {text_hash("Go away."): (0, 1, 1, 0), text_hash("Hello! How can I help?"): (1, 0, 0, 1)}
    # the history of turn 1 shows the reply the user went on from, never the one they regenerated away
    hist = store.history("u1", "c1", 1, text_hash("Day 1: the Colosseum."))
    assert [x["response"] for x in hist] == ["Hello! How can I help?", "Day 1: the Colosseum."]
    assert _counts(store) == (5, 3, 1)
    store.close()


def test_history_without_continued_signal_takes_the_last_reply_before_the_next_turn(db_url, tmp_path):  # noqa: F811
    rows = [
        _ev(0, response="First try.", ts="2026-03-01T12:00:00Z"),
        _ev(1, response="Second try.", ts="2026-03-01T12:01:00Z"),
        _ev(2, turn=1, prompt="Thanks. And then?", response="Then rest.", ts="2026-03-01T12:02:00Z"),
        _ev(3, response="Third try, after the fact.", ts="2026-03-01T12:05:00Z"),  # a later regeneration
    ]
    store = SignalStore(db_url)
    store.ingest(_jsonl(tmp_path / "a.jsonl", rows))
    hist = store.history("u1", "c1", 1, text_hash("Then rest."))
    assert [x["response"] for x in hist] == ["Second try.", "Then rest."]
    assert store.history("u1", "c1", 1, text_hash("not stored")) == []
    store.close()


@pytest.mark.parametrize("chunk", CHUNKS)
def test_a_turn_with_two_prompts_is_refused_naming_both_rows(db_url, tmp_path, chunk):  # noqa: F811
    rows = [_ev(0), _ev(1, turn=1, prompt="Next?", response="Next."), _ev(2, prompt="Something else?")]
    store = SignalStore(db_url)
    path = _jsonl(tmp_path / "a.jsonl", rows)
    with pytest.raises(DataValidationError) as err:
        store.ingest(path, chunk_rows=chunk)
    assert (err.value.file, err.value.row, err.value.field) == (str(path), 2, "prompt")
    assert "user 'u1' conversation 'c1' turn 0: the prompt differs from the one at row 0 of this file" in str(err.value)
    assert _counts(store) == (0, 0, 0)
    # across files and ingests: the earlier file is named
    store.ingest(_jsonl(tmp_path / "b.jsonl", rows[:2]), chunk_rows=chunk)
    later = _jsonl(tmp_path / "c.jsonl", [_ev(9, turn=1, prompt="Changed?", response="Next.")])
    with pytest.raises(DataValidationError) as err:
        store.ingest(later, chunk_rows=chunk)
    assert (err.value.file, err.value.row, err.value.field) == (str(later), 0, "prompt")
    assert f"row 1 of {tmp_path / 'b.jsonl'} (ingested earlier)" in str(err.value)
    assert _counts(store) == (2, 2, 1)
    store.close()


# ---- kept or refused, never lost -----------------------------------------------------------------------------------
def _conflict_rows():
    base = [_ev(i, conv=f"c{i}") for i in range(6)]
    same = dict(base[1])  # an exact repeat: a true duplicate
    other = {**base[3], "signal": "thumbs_down"}  # event id e3 for another event
    return [*base, same, other]  # rows 0-5, 6 (dup of 1), 7 (conflicts with 3)


@pytest.mark.parametrize("chunk", CHUNKS)
def test_conflicting_event_id_refused_whatever_the_batch_size(db_url, tmp_path, chunk):  # noqa: F811
    store = SignalStore(db_url)
    path = _jsonl(tmp_path / "a.jsonl", _conflict_rows())
    with pytest.raises(DataValidationError) as err:
        store.ingest(path, chunk_rows=chunk)
    # same batch (chunk 1000) or other batches (1, 2, 3): the same pair of rows, the same field
    assert (err.value.file, err.value.row, err.value.field) == (str(path), 7, "signal")
    assert err.value.reason.startswith(
        "event_id 'e3' conflicts with row 3 of this file: signal 'thumbs_down' here, 'thumbs_up' there"
    )
    assert _counts(store) == (0, 0, 0)  # rolled back
    # true duplicates only: the same report whatever the chunk size
    rep = store.ingest(_jsonl(tmp_path / "dups.jsonl", _conflict_rows()[:7]), chunk_rows=chunk)
    assert (rep.rows, rep.inserted, rep.duplicates) == (7, 6, 1)
    store.close()


@pytest.mark.parametrize("where", ["other file", "earlier ingest"])
def test_conflicting_event_id_in_another_file_names_it(db_url, tmp_path, where):  # noqa: F811
    store = SignalStore(db_url)
    first = _jsonl(tmp_path / "first.jsonl", [_ev(i, conv=f"c{i}") for i in range(3)])
    again = _jsonl(tmp_path / "again.jsonl", [_ev(5, conv="c5"), _ev(1, conv="c1")])  # e1 again: a duplicate
    clash = _jsonl(tmp_path / "clash.jsonl", [_ev(7, conv="c7"), _ev(2, conv="c2", response="Changed.")])
    if where == "other file":
        reports = []
        with pytest.raises(DataValidationError) as err:
            for r in store.ingest_files([first, again, clash], chunk_rows=1):
                reports.append(r)  # noqa: PERF402 (the reports before the error are kept)
        assert [(r.inserted, r.duplicates) for r in reports] == [(3, 0), (1, 1)]
    else:
        store.ingest(first)
        assert (store.ingest(again).duplicates, store.counts()["events"]) == (1, 4)
        with pytest.raises(DataValidationError) as err:
            store.ingest(clash)
    assert (err.value.file, err.value.row, err.value.field) == (str(clash), 1, "response")
    assert f"event_id 'e2' conflicts with row 2 of {first} (ingested earlier): the response text differs" in str(
        err.value
    )
    assert "Changed." not in str(err.value)  # texts are not written into errors
    assert _counts(store) == (4, 4, 2)
    store.close()


_GOOD = _ev(0)


def _parquet_value(field, value):
    """The Parquet column for one case (the same value as in JSONL, in the column type a writer would use)."""
    if field == "timestamp" and isinstance(value, str) and value.startswith("@"):  # a timestamp column, by micros
        return pa.array([int(value[1:])], pa.timestamp("us", tz="UTC"))
    return pa.array([value])


#: (case, field, value, refused): one table for both formats. Epoch seconds, ISO strings and ``@micros`` (a
#: Parquet timestamp column; in JSONL the same instant as ISO) are the timestamp forms.
CASES = [
    ("good", None, None, False),
    ("nul in prompt", "prompt", "a\x00b", True),
    ("nul in intent", "intent", "x\x00", True),
    ("nul in event id", "event_id", "e\x00", True),
    ("empty response", "response", "", True),
    ("turn id 2^31", "turn_id", MAX_TURN_ID + 1, True),
    ("turn id 2^31 - 1", "turn_id", MAX_TURN_ID, False),
    ("negative turn id", "turn_id", -1, True),
    ("string turn id", "turn_id", "3", True),
    ("boolean turn id", "turn_id", True, True),
    ("float turn id", "turn_id", 3.0, True),
    ("year 10000 as epoch seconds", "timestamp", 253402300800, True),
    ("year 9999 as epoch seconds", "timestamp", 253402300799, False),
    ("year 10000 as ISO", "timestamp", "10000-01-01T00:00:00Z", True),
    ("year 10000 in UTC via its zone", "timestamp", "9999-12-31T23:00:00-05:00", True),
    ("year 10000 timestamp column", "timestamp", "@253402300800000000", True),
    ("year 9999 timestamp column", "timestamp", "@253402300799000000", False),
    ("unknown signal", "signal", "love", True),
    ("numeric user id", "user_id", 7, True),
]


def _case_files(tmp_path, case, field, value):
    """The case as a one-row JSONL file and a one-row Parquet file (the column in the value's own type)."""
    row = dict(_GOOD)
    cols = {k: pa.array([v]) for k, v in row.items()}
    cols["timestamp"] = pa.array([dt.datetime(2026, 3, 1, 12)], pa.timestamp("us"))
    if field is not None:
        jv = value
        if isinstance(value, str) and value.startswith("@"):  # the same instant, as JSONL writes it
            micros = int(value[1:])
            jv = "10000-01-01T00:00:00Z" if micros >= 253402300800000000 else "9999-12-31T23:59:59Z"
        row[field] = jv
        cols[field] = _parquet_value(field, value)
    j = _jsonl(tmp_path / f"{case.replace(' ', '_')}.jsonl", [row])
    pq_path = j.with_suffix(".parquet")
    pq.write_table(pa.table(cols), pq_path)
    return j, pq_path


@pytest.mark.parametrize("case,field,value,refused", CASES, ids=[c[0] for c in CASES])
def test_jsonl_and_parquet_accept_and_refuse_the_same_values(db_url, tmp_path, case, field, value, refused):  # noqa: F811
    store = SignalStore(db_url)
    verdicts = {}
    for path in _case_files(tmp_path, case, field, value):
        try:
            store.ingest(path)
            verdicts[path.suffix] = None
        except DataValidationError as err:
            assert err.file == str(path)
            verdicts[path.suffix] = (err.row, err.field)
    want = (0, field) if refused else None
    assert verdicts == {".jsonl": want, ".parquet": want}, verdicts
    store.close()


def test_over_long_line_is_refused_without_reading_it_whole(tmp_path):
    path = tmp_path / "long.jsonl"
    with path.open("w") as f:
        f.write(json.dumps(_ev(0)) + "\n")
        f.write(json.dumps({**_ev(1), "response": "x" * (50 * 2**20)}) + "\n")  # a 50 MB line
    code = (
        "import resource, sys\n"
        "from data.validation import DataValidationError\n"
        "from flywheel.store import SignalStore\n"
        "s = SignalStore(sys.argv[1])\n"
        "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "try:\n"
        "    s.ingest(sys.argv[2])\n"
        "except DataValidationError as e:\n"
        "    print(e.row, e.field, e.reason.split(' (')[0])\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) // 1024)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "s.duckdb"), str(path)], cwd=REPO, capture_output=True,
        text=True, check=True,
    ).stdout.splitlines()
    assert out[0] == f"1 None line longer than {MAX_LINE_BYTES} bytes"
    assert int(out[1]) < 64, f"{out[1]} MB more memory for a refused 50 MB line"  # the cap is 4 MiB


def test_deeply_nested_json_and_truncated_parquet_name_file_and_row(tmp_path):
    store = SignalStore(tmp_path / "s.duckdb")
    nested = tmp_path / "nested.jsonl"
    nested.write_text(json.dumps(_ev(0)) + "\n" + '{"event_id": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    with pytest.raises(DataValidationError) as err:
        store.ingest(nested)
    assert (err.value.file, err.value.row, err.value.reason) == (str(nested), 1, "JSON nested too deeply to read")
    whole = tmp_path / "whole.parquet"
    pq.write_table(pa.Table.from_pylist([{**_ev(i, conv=f"c{i}"), "timestamp": 1_700_000_000} for i in range(50)]),
                   whole, row_group_size=10)
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    with pytest.raises(DataValidationError) as err:
        store.ingest(cut)
    assert err.value.file == str(cut) and "Parquet" in err.value.reason
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(json.dumps(_ev(0)).encode() + b"\n" + b'{"event_id": "\xff"}\n')
    with pytest.raises(DataValidationError) as err:
        store.ingest(bad)
    assert (err.value.row, err.value.reason) == (1, "not valid UTF-8 (byte 14 of the line)")
    surrogate = _jsonl(tmp_path / "surrogate.jsonl", [_ev(0)])
    surrogate.write_text(surrogate.read_text() + json.dumps(_ev(1))[:-1].replace('"Hi?"', '"\\ud800"') + "}\n")
    with pytest.raises(DataValidationError) as err:
        store.ingest(surrogate)
    assert (err.value.row, err.value.field) == (1, "prompt")
    assert store.counts()["events"] == 0
    store.close()
