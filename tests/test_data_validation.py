"""Strict / lenient validation, reject files and the reject-rate threshold."""

import json
import logging
import pickle

import pytest

from data.converters import hh_to_pair
from data.validation import (
    DataValidationError,
    InvalidRecord,
    RejectRateExceeded,
    validate_rows,
    write_rejects,
)

GOOD = {"chosen": "\n\nHuman: hi\n\nAssistant: hello", "rejected": "\n\nHuman: hi\n\nAssistant: go away"}
EMPTY = {"chosen": "\n\nHuman: hi\n\nAssistant: ", "rejected": "\n\nHuman: hi\n\nAssistant: go away"}
NO_CHOSEN = {"rejected": "\n\nHuman: hi\n\nAssistant: go away"}


def parse(raw, row):
    return hh_to_pair(raw, id=f"hh-{row}")


def rows(n_good, bad_at):
    """n_good + len(bad_at) rows; bad rows (alternating empty reply / missing chosen) at the given indices."""
    total = n_good + len(bad_at)
    bad_rows = [EMPTY, NO_CHOSEN]
    out, k = [], 0
    for i in range(total):
        if i in bad_at:
            out.append((i, bad_rows[k % 2]))
            k += 1
        else:
            out.append((i, GOOD))
    return out


def test_error_message_names_file_row_field_reason():
    err = DataValidationError("empty assistant turn", file="hh.jsonl", row=17, field="chosen")
    assert str(err) == "hh.jsonl row 17 field 'chosen': empty assistant turn"
    assert str(DataValidationError("no rows", file="x.csv")) == "x.csv: no rows"
    again = pickle.loads(pickle.dumps(err))
    assert (again.file, again.row, again.field, again.reason) == ("hh.jsonl", 17, "chosen", "empty assistant turn")


def test_strict_raises_on_first_bad_row_with_location():
    with pytest.raises(DataValidationError) as info:
        validate_rows(rows(5, {2, 4}), parse, file="hh.jsonl", mode="strict")
    err = info.value
    assert (err.file, err.row, err.field) == ("hh.jsonl", 2, "chosen")
    assert "empty assistant turn" in err.reason
    assert str(err) == "hh.jsonl row 2 field 'chosen': turn 1: empty assistant turn"


def test_strict_missing_chosen():
    with pytest.raises(DataValidationError) as info:
        validate_rows([(0, GOOD), (1, NO_CHOSEN)], parse, file="hh.jsonl")
    assert str(info.value) == "hh.jsonl row 1 field 'chosen': missing (field required)"


def test_lenient_below_threshold_returns_counts_and_writes_every_reject(tmp_path, caplog):
    out = tmp_path / "rejects.jsonl"
    with caplog.at_level(logging.INFO, logger="data.validation"):
        accepted, rejects = validate_rows(
            rows(38, {5, 20}), parse, file="hh.jsonl", mode="lenient", max_reject_rate=0.06, rejects_path=out
        )
    assert len(accepted) == 38 and len(rejects) == 2  # 2 / 40 = 5 % <= 6 %
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["file"], r["row"], r["field"]) for r in lines] == [("hh.jsonl", 5, "chosen"), ("hh.jsonl", 20, "chosen")]
    assert set(lines[0]) == {"file", "row", "field", "reason", "raw"}
    assert lines[0]["raw"] == EMPTY and lines[1]["raw"] == NO_CHOSEN
    assert "empty assistant turn" in lines[0]["reason"] and "missing" in lines[1]["reason"]
    assert any("40 rows read, 38 accepted, 2 rejected" in r.getMessage() for r in caplog.records)


def test_lenient_at_threshold_passes_and_above_raises(tmp_path):
    # exactly 5 %: passes (the rule is rate > max_reject_rate)
    accepted, rejects = validate_rows(rows(19, {3}), parse, file="f", mode="lenient", rejects_path=tmp_path / "a.jsonl")
    assert (len(accepted), len(rejects)) == (19, 1)
    out = tmp_path / "b.jsonl"
    with pytest.raises(RejectRateExceeded) as info:
        validate_rows(rows(17, {0, 7, 19}), parse, file="hh.jsonl", mode="lenient", rejects_path=out)
    err = info.value
    assert (err.n_rejected, err.n_total, err.max_reject_rate, err.rejects_path) == (3, 20, 0.05, out)
    assert "3 of 20 rows rejected (15.00%) > max_reject_rate 5.00%" in str(err)
    assert str(out) in str(err)
    # the file is written before raising and holds every bad row
    assert [json.loads(line)["row"] for line in out.read_text().splitlines()] == [0, 7, 19]


def test_lenient_without_rejects_writes_empty_file(tmp_path):
    out = tmp_path / "sub" / "r.jsonl"
    accepted, rejects = validate_rows(rows(3, set()), parse, file="f", mode="lenient", rejects_path=out)
    assert len(accepted) == 3 and rejects == [] and out.read_text() == ""


def test_invalid_record_is_a_reject_with_its_text(tmp_path):
    out = tmp_path / "r.jsonl"
    records = [(0, GOOD), (1, InvalidRecord('{"chosen": ', "invalid JSON: Expecting value (column 12)"))]
    _, rejects = validate_rows(records, parse, file="x.jsonl", mode="lenient", max_reject_rate=1.0, rejects_path=out)
    assert rejects[0].row == 1 and rejects[0].field is None and rejects[0].raw == '{"chosen": '
    assert json.loads(out.read_text())["reason"].startswith("invalid JSON")


def test_bad_arguments():
    with pytest.raises(ValueError):
        validate_rows([], parse, file="f", mode="loose")
    with pytest.raises(ValueError):
        validate_rows([], parse, file="f", max_reject_rate=1.5)


def test_write_rejects_handles_non_json_values(tmp_path):
    from data.validation import RowReject

    path = write_rejects([RowReject("f", 0, None, "r", {"x": float("nan"), "b": b"1"})], tmp_path / "r.jsonl")
    assert json.loads(path.read_text())["raw"] == {"x": None, "b": "b'1'"}
