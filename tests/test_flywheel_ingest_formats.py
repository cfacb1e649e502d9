"""JSONL and Parquet read the same values the same way: a number is epoch seconds in both,
Arrow timestamp columns by their own unit, ISO strings in Parquet parsed as in JSONL, and a column of a wrong type
names file, row, field and reason."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data.validation import DataValidationError
from flywheel.store import SignalStore

# 1700000000 s after the epoch (hand-checked: 19675 days = 2023-11-14, + 80000 s = 22:13:20)
WHEN = dt.datetime(2023, 11, 14, 22, 13, 20)


def _rows(n: int = 3, ts=1_700_000_000) -> list[dict]:
    return [
        {
            "event_id": f"e{i}",
            "conversation_id": f"c{i}",
            "turn_id": 0,
            "user_id": "u1",
            "model_version": "round-1",
            "intent": None,
            "signal": "thumbs_up",
            "timestamp": ts,
            "prompt": f"Question {i}?",
            "response": f"Answer {i}.",
        }
        for i in range(n)
    ]


def _stored_ts(tmp_path: Path, path: Path) -> list[dt.datetime]:
    store = SignalStore(tmp_path / f"{path.stem}.duckdb")
    try:
        store.ingest(path)
        with store.engine.connect() as c:
            return [r[0] for r in c.exec_driver_sql("SELECT ts FROM events ORDER BY event_id").all()]
    finally:
        store.close()


def _parquet(tmp_path: Path, name: str, column: pa.Array, rows: list[dict] | None = None) -> Path:
    rows = rows or _rows()
    t = pa.Table.from_pylist([{k: v for k, v in r.items() if k != "timestamp"} for r in rows])
    t = t.append_column("timestamp", column)
    pq.write_table(t, tmp_path / name)
    return tmp_path / name


def test_epoch_seconds_mean_the_same_instant_in_jsonl_and_parquet(tmp_path):
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    assert _stored_ts(tmp_path, tmp_path / "a.jsonl") == [WHEN] * 3
    s = 1_700_000_000
    columns = {
        "int64.parquet": pa.array([s] * 3, pa.int64()),
        "int32.parquet": pa.array([s] * 3, pa.int32()),
        "float.parquet": pa.array([float(s)] * 3, pa.float64()),
        "ts_s.parquet": pa.array([s] * 3, pa.timestamp("s")),
        "ts_ms.parquet": pa.array([s * 1000] * 3, pa.timestamp("ms")),
        "ts_ns_utc.parquet": pa.array([s * 10**9] * 3, pa.timestamp("ns", "UTC")),
        # the same instant written in Paris (UTC+1 in November): stored as UTC
        "ts_paris.parquet": pa.array([s * 10**6] * 3, pa.timestamp("us", "Europe/Paris")),
        "iso.parquet": pa.array(["2023-11-14T23:13:20+01:00", "2023-11-14T22:13:20Z", "2023-11-14 22:13:20"]),
        "large_iso.parquet": pa.array(["2023-11-14T22:13:20Z"] * 3, pa.large_string()),
    }
    for name, col in columns.items():
        assert _stored_ts(tmp_path, _parquet(tmp_path, name, col)) == [WHEN] * 3, name
    # fractional seconds keep their microseconds in both formats
    (tmp_path / "f.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows(ts=s + 0.25)))
    quarter = WHEN + dt.timedelta(microseconds=250_000)
    assert _stored_ts(tmp_path, tmp_path / "f.jsonl") == [quarter] * 3
    assert _stored_ts(tmp_path, _parquet(tmp_path, "f.parquet", pa.array([s + 0.25] * 3))) == [quarter] * 3


def test_a_number_is_always_seconds_never_milliseconds(tmp_path):
    """pydantic alone reads numbers above 2e10 as milliseconds; the schema does not: 1.7e12 s is past year 9999."""
    (tmp_path / "ms.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows(ts=1_700_000_000_000)))
    with pytest.raises(DataValidationError) as err:
        _stored_ts(tmp_path, tmp_path / "ms.jsonl")
    assert (err.value.row, err.value.field) == (0, "timestamp")
    assert "outside the datetime range" in err.value.reason
    p = _parquet(tmp_path, "ms.parquet", pa.array([0, 1_700_000_000_000, 0], pa.int64()))
    with pytest.raises(DataValidationError) as err:
        _stored_ts(tmp_path, p)
    assert (err.value.row, err.value.field) == (1, "timestamp")
    assert "outside the datetime range" in err.value.reason


def test_bad_parquet_timestamps_name_file_row_field_and_reason(tmp_path):
    p = _parquet(tmp_path, "bad_iso.parquet", pa.array(["2023-11-14T22:13:20Z", "2023-11-14T22:13:20Z", "yesterday"]))
    with pytest.raises(DataValidationError) as err:
        _stored_ts(tmp_path, p)
    assert (err.value.file, err.value.row, err.value.field) == (str(p), 2, "timestamp")
    assert "valid datetime" in err.value.reason
    p = _parquet(tmp_path, "nan.parquet", pa.array([1.0, float("nan"), 2.0]))
    with pytest.raises(DataValidationError) as err:
        _stored_ts(tmp_path, p)
    assert (err.value.row, err.value.field) == (1, "timestamp")
    assert "not a finite number" in err.value.reason
    p = _parquet(tmp_path, "bool.parquet", pa.array([True, False, True]))
    with pytest.raises(DataValidationError) as err:
        _stored_ts(tmp_path, p)
    assert (err.value.file, err.value.field) == (str(p), "timestamp")
    assert "column type bool cannot hold a time" in err.value.reason


def test_wrong_column_type_names_the_column_and_row(tmp_path):
    rows = _rows()
    t = pa.Table.from_pylist([{**r, "timestamp": WHEN} for r in rows])
    # a list column where an integer is expected: Arrow cannot cast it; the error names the column and its type
    t = t.set_column(t.column_names.index("turn_id"), "turn_id", pa.array([[0], [1], [2]]))
    pq.write_table(t, tmp_path / "list.parquet")
    with pytest.raises(DataValidationError) as err:
        _stored_ts(tmp_path, tmp_path / "list.parquet")
    assert (err.value.file, err.value.field) == (str(tmp_path / "list.parquet"), "turn_id")
    assert err.value.row == 0 and "integer" in err.value.reason
    # an integer user id: named as in JSONL (pydantic's reason)
    t = pa.Table.from_pylist([{**r, "timestamp": WHEN, "user_id": 7} for r in rows])
    pq.write_table(t, tmp_path / "uid.parquet")
    with pytest.raises(DataValidationError) as err:
        _stored_ts(tmp_path, tmp_path / "uid.parquet")
    assert (err.value.row, err.value.field) == (0, "user_id")
    assert "column type int64 is not a string column (value 7)" in err.value.reason


def test_pandas_parquet_with_iso_string_timestamps_is_accepted(tmp_path):
    """What the review did: JSONL -> pandas -> Parquet keeps ``timestamp`` as an ISO string column."""
    pd = pytest.importorskip("pandas")
    rows = _rows(ts="2023-11-14T22:13:20+00:00")
    pd.DataFrame(rows).drop(columns=["intent"]).to_parquet(tmp_path / "pd.parquet")
    assert _stored_ts(tmp_path, tmp_path / "pd.parquet") == [WHEN] * 3


def test_same_event_id_with_different_content_is_a_conflict_not_a_duplicate(tmp_path):
    rows = _rows(4)
    same = dict(rows[1])  # an exact repeat: an ordinary duplicate
    clash = {**rows[1], "signal": "thumbs_down"}  # the same id for another event
    (tmp_path / "dup.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [*rows, same]))
    store = SignalStore(tmp_path / "s.duckdb")
    rep = store.ingest(tmp_path / "dup.jsonl")
    assert (rep.rows, rep.inserted, rep.duplicates) == (5, 4, 1)
    path = tmp_path / "clash.jsonl"
    path.write_text("".join(json.dumps({**r, "event_id": "x" + r["event_id"]}) + "\n" for r in [*rows, clash]))
    with pytest.raises(DataValidationError) as err:
        store.ingest(path)
    assert (err.value.file, err.value.row, err.value.field) == (str(path), 4, "signal")
    assert err.value.reason.startswith(
        "event_id 'xe1' conflicts with row 1 of this file: signal 'thumbs_down' here, 'thumbs_up'"
    )
    assert store.counts()["files"] == 1  # the conflicting file was rolled back
    store.close()


def test_empty_events_file_is_reported_with_a_warning(tmp_path, capsys):
    from flywheel.ingest import main

    (tmp_path / "empty.jsonl").write_text("")
    assert main(["--db", str(tmp_path / "s.duckdb"), str(tmp_path / "empty.jsonl")]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out.splitlines()[0])["rows"] == 0
    assert f"warning: {tmp_path / 'empty.jsonl'}: empty file, 0 events ingested" in err


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_user_id_holding_an_email_is_refused_without_showing_it(tmp_path, fmt):
    """User ids are written as they are (store, selection): one holding an e-mail address is refused in both
    readers, at its row, and the error never repeats the address."""
    rows = _rows()
    rows[1]["user_id"] = "Jane.Doe+rlhf@mail.example.com"
    path = tmp_path / f"pii.{fmt}"
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        pq.write_table(pa.Table.from_pylist([{**r, "timestamp": WHEN} for r in rows]), path)
    with pytest.raises(DataValidationError) as err:
        _stored_ts(tmp_path, path)
    assert (err.value.file, err.value.row, err.value.field) == (str(path), 1, "user_id")
    assert "e-mail address" in err.value.reason and "Jane" not in str(err.value) and "example" not in str(err.value)
    # an opaque id with an "@" but no address (a handle, a hash with a separator) is a pseudonym and kept
    rows[1]["user_id"] = "u@7f3a9c"
    ok = tmp_path / "ok.jsonl"
    ok.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert len(_stored_ts(tmp_path, ok)) == 3
