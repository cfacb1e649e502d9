"""Parquet event columns read the way the JSONL reader reads the same values (:class:`flywheel.schema.EventRow`).

- :func:`timestamp_column`: the ``timestamp`` column of any Arrow type the schema documents, as naive UTC
  ``timestamp("us")``: a timestamp column by its own unit and time zone, an integer or float column as epoch
  seconds (never micro- or nanoseconds: Arrow's plain int -> timestamp cast would read ``1700000000`` as
  1970-01-01 00:28:20), a string column as ISO 8601 through the same pydantic parser as JSONL.
- :func:`column_type_error`: when a batch cannot be cast to the store's Arrow schema, the error that names the
  file, the row (0-based row of the file), the column and the reason (its Arrow type and the value).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import TypeAdapter, ValidationError

from data.validation import DataValidationError

from .schema import EventRow, Timestamp

__all__ = ["column_type_error", "read_columns", "timestamp_column"]

#: Event fields that are strings (``StrictStr`` in :class:`EventRow`): a Parquet column of another type is refused,
#: as JSONL refuses a number there, instead of Arrow's silent int -> string cast.
STRING_FIELDS = ("event_id", "conversation_id", "user_id", "model_version", "intent", "signal", "prompt", "response")

_TS = TypeAdapter(Timestamp)
_US = pa.timestamp("us")


def _utc_naive(ts: dt.datetime) -> dt.datetime:
    return ts.astimezone(dt.UTC).replace(tzinfo=None) if ts.tzinfo else ts


def read_columns(table: pa.Table, *, file: str | Path, base: int = 0) -> pa.Table:
    """One Parquet batch with its columns checked as :class:`EventRow` checks a JSONL row, and ``timestamp`` read
    by :func:`timestamp_column`. ``turn_id`` may be an integer column, or a float column of whole numbers (cast
    later; a fraction is refused there).

    Raises:
        data.validation.DataValidationError: a string field stored as another type (names file, the first
            non-null row, the field, its Arrow type and value), or a bad timestamp.
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
        out = pc.cast(arr, pa.timestamp("us", t.tz), safe=False)
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


def refuse_conflicting_ids(batch: pa.Table, *, file: str | Path, base: int = 0) -> None:
    """Refuse two rows of one batch with the same ``event_id`` but different content: that is a conflict (two
    events under one id), not a repeated event, so the store must not keep one and count the other as a
    duplicate. Vectorised (Arrow ``group_by``), and only run when the batch repeats an id at all.

    Scope: rows within one loaded batch (``chunk_rows``, 200,000 by default). A repeat across batches or files,
    or of an event already stored, is still deduplicated by id (the first stored copy is kept) and counted in
    ``IngestReport.duplicates``.

    Raises:
        data.validation.DataValidationError: names the file, the later row (0-based row of the file), the
            ``event_id`` and the first field that differs, with both values and both rows.
    """
    if pc.count_distinct(batch["event_id"]).as_py() == batch.num_rows:
        return
    cols = [c for c in _CONTENT if c in batch.column_names]
    grouped = (
        batch.select(["event_id", *cols])
        .group_by("event_id", use_threads=False)
        .aggregate([(c, "count_distinct", pc.CountOptions(mode="all")) for c in cols])
    )
    bad = None
    for c in cols:
        mask = pc.greater(grouped[f"{c}_count_distinct"], 1)
        if pc.any(mask).as_py():
            bad = grouped.filter(mask)["event_id"][0].as_py()
            break
    if bad is None:
        return
    rows = pc.indices_nonzero(pc.equal(batch["event_id"], bad)).to_pylist()
    first = batch.slice(rows[0], 1).to_pylist()[0]
    for r in rows[1:]:
        other = batch.slice(r, 1).to_pylist()[0]
        diff = next((c for c in cols if other[c] != first[c]), None)
        if diff is not None:
            raise DataValidationError(
                f"event_id {bad!r} conflicts with row {base + rows[0]}: {diff} {other[diff]!r} here, "
                f"{first[diff]!r} there (one id, two different events; fix the ids or drop one row)",
                file=str(file),
                row=base + r,
                field=diff,
            )
