"""Parquet event columns read the way the JSONL reader reads the same values (:class:`flywheel.schema.EventRow`).

- :func:`timestamp_column`: the ``timestamp`` column of any Arrow type the schema documents, as naive UTC
  ``timestamp("us")``: a timestamp column by its own unit and time zone, an integer or float column as epoch
  seconds (never micro- or nanoseconds: Arrow's plain int -> timestamp cast would read ``1700000000`` as
  1970-01-01 00:28:20), a string column as ISO 8601 through the same pydantic parser as JSONL.
- :func:`column_type_error`: when a batch cannot be cast to the store's Arrow schema, the error that names the
  file, the row (0-based row of the file), the column and the reason (its Arrow type and the value).
- :func:`check_batch`: the value checks of :class:`EventRow` (non-empty strings without NUL, ``0 <= turn_id <=
  2**31 - 1``, a known signal, a timestamp in years 1-9999), vectorised, run on every batch of BOTH formats (the
  JSONL reader builds the same Arrow table and calls it too), so JSONL and Parquet accept and refuse the same values.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import TypeAdapter, ValidationError

from data.validation import DataValidationError

from .schema import EMAIL_PATTERN, MAX_TURN_ID, SIGNALS, EventRow, Timestamp

__all__ = ["check_batch", "column_type_error", "conflicting_ids_error", "read_columns", "timestamp_column"]

#: Event fields that are strings (``StrictStr`` in :class:`EventRow`): a Parquet column of another type is refused,
#: as JSONL refuses a number there, instead of Arrow's silent int -> string cast.
STRING_FIELDS = ("event_id", "conversation_id", "user_id", "model_version", "intent", "signal", "prompt", "response")

_TS = TypeAdapter(Timestamp)
_US = pa.timestamp("us")


def _utc_naive(ts: dt.datetime) -> dt.datetime:
    return ts.astimezone(dt.UTC).replace(tzinfo=None) if ts.tzinfo else ts


def read_columns(table: pa.Table, *, file: str | Path, base: int = 0) -> pa.Table:
    """One Parquet batch with its columns checked as :class:`EventRow` checks a JSONL row, and ``timestamp`` read
    by :func:`timestamp_column`. ``turn_id`` must be an integer column (JSONL refuses ``3.0``, ``"3"`` and
    ``true`` there; so does this: a float, string or boolean column is refused, not cast).

    Raises:
        data.validation.DataValidationError: a string field or ``turn_id`` stored as another type (names file, the
            first non-null row, the field, its Arrow type and value), or a bad timestamp.
    """
    for name in STRING_FIELDS:
        if name not in table.column_names:
            continue
        col = table[name]
        t = col.type
        if pa.types.is_dictionary(t):
            t = t.value_type
        if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_null(t)):
            valid = pc.is_valid(col)
            row = int(pc.index(valid, True).as_py()) if pc.any(valid).as_py() else 0
            value = col[row].as_py() if len(col) else None
            raise DataValidationError(
                f"column type {col.type} is not a string column (value {value!r}); write it as strings",
                file=str(file),
                row=base + row,
                field=name,
            )
    if "turn_id" in table.column_names:
        col = table["turn_id"]
        t = col.type.value_type if pa.types.is_dictionary(col.type) else col.type
        if not (pa.types.is_integer(t) or pa.types.is_null(t)):
            valid = pc.is_valid(col)
            row = int(pc.index(valid, True).as_py()) if pc.any(valid).as_py() else 0
            raise DataValidationError(
                f"column type {col.type} is not an integer column (value {_value(col, row)!r}); write it as integers",
                file=str(file),
                row=base + row,
                field="turn_id",
            )
    ts = timestamp_column(table["timestamp"], file=file, base=base)
    return table.set_column(table.column_names.index("timestamp"), "timestamp", ts)


def timestamp_column(col: pa.ChunkedArray | pa.Array, *, file: str | Path, base: int = 0) -> pa.Array:
    """The ``timestamp`` column as naive UTC ``timestamp("us")`` (nulls stay null: the row check reports them).

    Args:
        col: the column as read from Parquet.
        file: the file (for errors).
        base: 0-based file row of ``col``'s first value (for errors).

    Returns:
        a ``timestamp("us")`` array. Timestamp columns keep their instant (time zone applied; nanoseconds are
        truncated to microseconds, the store's resolution).

    Raises:
        data.validation.DataValidationError: a string that is not ISO 8601, a non-finite or out-of-range number,
            or a column type that cannot hold a time (names file, row, field ``timestamp`` and reason).
    """
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    t = arr.type
    if pa.types.is_timestamp(t):
        # to microseconds: from a finer unit only truncation can happen (wanted); from a coarser one only
        # overflow, which the checked cast refuses (an unchecked one would wrap around into a wrong year)
        try:
            out = pc.cast(arr, pa.timestamp("us", t.tz), safe=t.unit in ("s", "ms"))
        except pa.ArrowInvalid:
            out = None
        if out is None or not _in_datetime_range(out.cast(pa.int64())):
            ints = arr.cast(pa.int64()).to_numpy(zero_copy_only=False)
            scale = {"s": 1_000_000, "ms": 1_000, "us": 1, "ns": 1e-3}[t.unit]
            bad = (ints * float(scale) < _MIN_US) | (ints * float(scale) > _MAX_US)
            bad &= arr.is_valid().to_numpy(zero_copy_only=False)
            i = int(np.argmax(bad))
            raise DataValidationError(
                f"timestamp {int(ints[i])} {t.unit} since 1970 is outside years 1-9999",
                file=str(file),
                row=base + i,
                field="timestamp",
            )
        return out.cast(_US) if t.tz is not None else out  # tz-aware values are stored as UTC: drop the zone
    if pa.types.is_null(t):
        return pa.nulls(len(arr), _US)
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return _from_epoch_seconds(arr, file=file, base=base)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return _from_strings(arr, file=file, base=base)
    raise DataValidationError(
        f"column type {t} cannot hold a time; expected a timestamp column, epoch seconds (integer or float) or "
        "ISO 8601 strings",
        file=str(file),
        field="timestamp",
    )


def _from_epoch_seconds(arr: pa.Array, *, file, base: int) -> pa.Array:
    values = arr.to_numpy(zero_copy_only=False).astype(np.float64) if pa.types.is_floating(arr.type) else None
    if values is not None:
        bad = ~np.isfinite(values) & arr.is_valid().to_numpy(zero_copy_only=False)
        if bad.any():
            i = int(np.argmax(bad))
            raise DataValidationError(
                f"timestamp {values[i]!r} is not a finite number of epoch seconds",
                file=str(file),
                row=base + i,
                field="timestamp",
            )
        micros = pc.cast(pc.round(pc.multiply(arr, 1_000_000.0)), pa.int64(), safe=False)
    else:
        try:
            micros = pc.multiply_checked(pc.cast(arr, pa.int64()), 1_000_000)
        except pa.ArrowInvalid:
            micros = None
    if micros is None or not _in_datetime_range(micros):
        ints = arr.to_pylist()
        for i, v in enumerate(ints):  # the error path only: find the first value out of range
            try:
                _TS.validate_python(v)
            except ValidationError as err:
                raise DataValidationError.from_pydantic(err, file=str(file), row=base + i, prefix="timestamp")
        raise DataValidationError("epoch seconds outside the datetime range", file=str(file), field="timestamp")
    return micros.cast(_US)


_MIN_US = int((dt.datetime(1, 1, 1) - dt.datetime(1970, 1, 1)).total_seconds()) * 1_000_000
_MAX_US = int((dt.datetime(9999, 12, 31, 23, 59, 59) - dt.datetime(1970, 1, 1)).total_seconds()) * 1_000_000


def _in_datetime_range(micros: pa.Array) -> bool:
    mm = pc.min_max(micros).as_py()
    return mm["min"] is None or (mm["min"] >= _MIN_US and mm["max"] <= _MAX_US)


def _from_strings(arr: pa.Array, *, file, base: int) -> pa.Array:
    enc = pc.dictionary_encode(arr)
    parsed = []
    for s in enc.dictionary.to_pylist():
        try:
            parsed.append(_utc_naive(_TS.validate_python(s)))
        except ValidationError as err:
            row = int(pc.index(arr, s).as_py())
            raise DataValidationError.from_pydantic(err, file=str(file), row=base + row, prefix="timestamp") from None
    return pc.take(pa.array(parsed, _US), enc.indices)


def column_type_error(file: str | Path, table: pa.Table, schema: pa.Schema, *, base: int = 0) -> DataValidationError:
    """Why ``table`` cannot be cast to ``schema``: the first column that fails, its first failing row, and the
    reason (pydantic's, as in JSONL, when the row is also invalid there; else the Arrow type and value).

    Args:
        file: the file (for the message); table: one batch; schema: the target schema; base: the batch's first
            0-based file row.
    """
    for f in schema:
        col = table[f.name]
        try:
            col.cast(f.type)
            continue
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as err:
            whole = str(err).splitlines()[0]
        for i in range(table.num_rows):
            try:
                col.slice(i, 1).cast(f.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as err:
                raw = table.slice(i, 1).to_pylist()[0]
                try:
                    EventRow.model_validate(raw)
                except ValidationError as verr:
                    return DataValidationError.from_pydantic(verr, file=str(file), row=base + i)
                return DataValidationError(
                    f"value {raw[f.name]!r} of column type {col.type} cannot be read as {f.type} "
                    f"({str(err).splitlines()[0]})",
                    file=str(file),
                    row=base + i,
                    field=f.name,
                )
        return DataValidationError(
            f"column type {col.type} cannot be read as {f.type} ({whole})", file=str(file), field=f.name
        )
    return DataValidationError("batch does not match the event schema", file=str(file))


_CONTENT = (
    "conversation_id",
    "turn_id",
    "user_id",
    "model_version",
    "intent",
    "signal",
    "timestamp",
    "prompt",
    "response",
)


def conflicting_ids_error(
    batch: pa.Table, *, file: str | Path, base: int = 0, skip: pa.Array | None = None
) -> DataValidationError | None:
    """Two rows of one batch with the same ``event_id`` but different content: that is a conflict (two events
    under one id), not a repeated event, so the store must not keep one and count the other as a duplicate.
    Vectorised (Arrow ``group_by``), and only run when the batch repeats an id at all.

    The error names the EARLIEST row (in file order) that conflicts with an earlier row of its id, and that
    earlier (first) row: the same pair the store names when the two rows fall in different batches or files, so
    the outcome does not depend on the batch size. ``skip``: event ids to leave out (ids already stored: the
    store compares those with the stored row instead).

    Returns:
        the error (names the file, the later row (0-based row of the file), the ``event_id``, the first field
        that differs, both values and both rows), or ``None``.
    """
    if pc.count_distinct(batch["event_id"]).as_py() == batch.num_rows:
        return None
    cols = [c for c in _CONTENT if c in batch.column_names]
    idx = pa.array(np.arange(batch.num_rows, dtype=np.int64))
    keyed = batch.select(["event_id", *cols]).append_column("_i", idx)
    if skip is not None and len(skip):
        keyed = keyed.filter(pc.invert(pc.is_in(keyed["event_id"], value_set=skip)))
    grouped = keyed.group_by("event_id", use_threads=False).aggregate(
        [(c, "count_distinct", pc.CountOptions(mode="all")) for c in cols]
    )
    mask = None
    for c in cols:
        m = pc.greater(grouped[f"{c}_count_distinct"], 1)
        mask = m if mask is None else pc.or_(mask, m)
    if mask is None or not pc.any(mask).as_py():
        return None
    bad_ids = grouped.filter(mask)["event_id"]
    rows = keyed.filter(pc.is_in(keyed["event_id"], value_set=bad_ids))
    # the earliest row that differs from the first row of its id
    first: dict[str, dict] = {}
    best = None
    for r in rows.to_pylist():  # only the rows of conflicting ids: few
        f = first.setdefault(r["event_id"], r)
        if f is r:
            continue
        diff = next((c for c in cols if r[c] != f[c]), None)
        if diff is not None and (best is None or r["_i"] < best[0]["_i"]):
            best = (r, f, diff)
    r, f, diff = best
    # texts are never written into an error message (they may hold personal data)
    detail = f"the {diff} text differs" if diff in ("prompt", "response") else (
        f"{diff} {_short(r[diff])} here, {_short(f[diff])} there")
    return DataValidationError(
        f"event_id {r['event_id']!r} conflicts with row {base + f['_i']} of this file: {detail} (one id, two "
        "different events; fix the ids or drop one row)",
        file=str(file),
        row=base + r["_i"],
        field=diff,
    )


def refuse_conflicting_ids(batch: pa.Table, *, file: str | Path, base: int = 0) -> None:
    """Raise :func:`conflicting_ids_error`'s error, if any.

    Raises:
        data.validation.DataValidationError: one id, two different events in ``batch``.
    """
    err = conflicting_ids_error(batch, file=file, base=base)
    if err is not None:
        raise err


def _short(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _value(col, row: int):
    try:
        return col[row].as_py() if len(col) else None
    except (ValueError, OverflowError):  # e.g. a timestamp Python's datetime cannot hold
        return str(col[row])


_TEXT_FIELDS = ("event_id", "conversation_id", "user_id", "model_version", "prompt", "response")


def check_batch(table: pa.Table, *, file: str | Path, base: int = 0) -> None:
    """The value checks of :class:`EventRow` on a batch already in the store's Arrow schema (``event_id`` ...
    ``response``, ``turn_id`` int64, ``timestamp`` naive UTC ``timestamp("us")``), vectorised. Both readers run it
    on every batch (JSONL after its per-row pydantic validation, which refuses the same values), so what one
    format accepts the other accepts too.

    Raises:
        data.validation.DataValidationError: the first failing row in file order and its first failing field in
            schema order (pydantic's reason where it can read the row, as in JSONL; else the check's).
    """
    n = table.num_rows
    if not n:
        return
    checks: list[tuple[str, pa.Array, str]] = []
    for name in _TEXT_FIELDS:
        col = table[name]
        ok = pc.and_kleene(pc.greater(pc.utf8_length(col), 0), pc.invert(pc.match_substring(col, "\x00")))
        checks.append((name, ok, "must be a non-empty string without NUL characters"))
    checks.append(("user_id", pc.invert(pc.match_substring_regex(table["user_id"], EMAIL_PATTERN)),
                   "holds an e-mail address (value not shown): user ids must be pseudonymous"))
    intent = table["intent"]
    checks.append(("intent", pc.invert(pc.match_substring(intent, "\x00")), "contains a NUL character"))
    tid = table["turn_id"]
    checks.append(
        ("turn_id", pc.and_kleene(pc.greater_equal(tid, 0), pc.less_equal(tid, MAX_TURN_ID)),
         f"must be an integer in [0, {MAX_TURN_ID}]")
    )
    checks.append(("signal", pc.is_in(table["signal"], value_set=pa.array(SIGNALS)), f"must be one of {SIGNALS}"))
    micros = table["timestamp"].cast(pa.int64())
    checks.append(
        ("timestamp", pc.and_kleene(pc.greater_equal(micros, _MIN_US), pc.less_equal(micros, _MAX_US)),
         "must be a time in years 1-9999")
    )
    first_bad = n
    masks = {}
    for name, ok, _ in checks:
        if name == "intent":
            ok = pc.fill_null(ok, True)  # intent may be null
        ok = pc.fill_null(ok, False)
        masks[name] = ok
        if not pc.all(ok).as_py():
            first_bad = min(first_bad, int(pc.index(ok, False).as_py()))
    if first_bad == n:
        return
    field, reason = next((name, why) for name, _, why in checks if not masks[name][first_bad].as_py())
    raw = {c: _value(table[c], first_bad) for c in table.column_names}
    try:
        EventRow.model_validate(raw)
    except ValidationError as err:
        got = DataValidationError.from_pydantic(err, file=str(file), row=base + first_bad)
        if got.field == field:
            return_err = got
        else:
            return_err = None
    else:
        return_err = None
    shown = "" if field == "user_id" else f" (got {_short(raw[field])})"  # a user id is personal data
    raise return_err or DataValidationError(f"{reason}{shown}", file=str(file), row=base + first_bad, field=field)
