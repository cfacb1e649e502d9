"""Per-row validation: strict and lenient modes, reject files, reject-rate threshold.

Row numbering (used everywhere in ``data/``: errors, reject files, default ids) is **0-based, in
source order**:

* JSONL: row ``N`` is physical line ``N + 1`` (blank lines are skipped but keep their number);
* CSV: row ``N`` is the ``N``-th data record after the header;
* JSON array: row ``N`` is element ``N``;
* Hugging Face dataset: row ``N`` is index ``N`` of the split.

Modes:

* ``"strict"`` -- the first bad row raises :class:`DataValidationError` naming file, row, field
  and reason.
* ``"lenient"`` -- every bad row becomes a :class:`RowReject`; they are all written to a rejects
  JSONL file (one line per reject: ``file, row, field, reason, raw``) and returned to the caller.
  If the reject rate is above ``max_reject_rate`` (default 0.05) :class:`RejectRateExceeded` is
  raised after the file is written.

Nothing is dropped silently: the caller always gets ``(accepted, rejects)`` and the counts are
logged on the ``data.validation`` logger.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import ValidationError

from rlhf.serialization import to_jsonable

__all__ = [
    "Mode",
    "DEFAULT_MAX_REJECT_RATE",
    "DataValidationError",
    "RejectRateExceeded",
    "RowReject",
    "InvalidRecord",
    "format_location",
    "validate_rows",
    "write_rejects",
    "handle_rejects",
]

logger = logging.getLogger(__name__)

Mode = Literal["strict", "lenient"]
DEFAULT_MAX_REJECT_RATE = 0.05

T = TypeVar("T")


def format_location(file: str | None, row: int | None, field: str | None) -> str:
    """``"hh.jsonl row 17 field 'chosen'"`` (parts that are ``None`` are left out)."""
    parts = [file if file is not None else "<input>"]
    if row is not None:
        parts.append(f"row {row}")
    if field:
        parts.append(f"field '{field}'")
    return " ".join(parts)


def _loc_to_path(loc: Iterable[Any]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path


def _describe_pydantic_error(err: dict[str, Any]) -> tuple[str, str]:
    """(field path, reason) of one entry of ``ValidationError.errors()``."""
    path = _loc_to_path(err.get("loc", ()))
    ctx = err.get("ctx") or {}
    kind = err.get("type", "")
    if kind == "rlhf_data":
        sub = ctx.get("field")
        if sub:
            path = f"{path}.{sub}" if path else sub
        return path, str(ctx.get("reason", err.get("msg", "")))
    if kind == "missing":
        return path, "missing (field required)"
    given = err.get("input")
    if kind.endswith("_type"):
        return path, f"{err.get('msg', 'wrong type')}, got {type(given).__name__} {_short(given)}"
    if kind == "literal_error":
        return path, f"{err.get('msg', 'not an allowed value')}, got {_short(given)}"
    return path, str(err.get("msg", kind))


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class DataValidationError(Exception):
    """A bad data row: names the file, the row (0-based), the field and the reason.

    ``str(err)`` reads like ``"hh.jsonl row 17 field 'chosen': empty assistant turn"``.

    Attributes:
        file: source label (path, ``demo:<name>`` or ``hf:<id>``); ``None`` when unknown.
        row: 0-based row number (see module docstring); ``None`` for file-level errors.
        field: dotted field path (``"messages[3].content"``); ``None`` for whole-row errors.
        reason: human-readable reason.
    """

    def __init__(self, reason: str, *, file: str | None = None, row: int | None = None, field: str | None = None):
        super().__init__(reason)
        self.reason = reason
        self.file = file
        self.row = row
        self.field = field

    def __str__(self) -> str:
        return f"{format_location(self.file, self.row, self.field)}: {self.reason}"

    def __reduce__(self):  # keyword-only constructor: keep the exception picklable (Prefect, multiprocessing)
        return (_rebuild_error, (type(self), self.__dict__.copy()))

    def located(self, *, file: str | None = None, row: int | None = None) -> DataValidationError:
        """Fill ``file`` / ``row`` where they are still unknown; returns ``self``."""
        if self.file is None:
            self.file = file
        if self.row is None:
            self.row = row
        return self

    @classmethod
    def from_pydantic(
        cls, exc: ValidationError, *, file: str | None = None, row: int | None = None, prefix: str | None = None
    ) -> DataValidationError:
        """Translate the first error of a :class:`pydantic.ValidationError`.

        Args:
            exc: the pydantic error.
            file, row: location of the row.
            prefix: field path to put in front of pydantic's ``loc`` (when a sub-object was validated).
        """
        errors = exc.errors()
        field, reason = _describe_pydantic_error(errors[0]) if errors else ("", str(exc))
        if prefix:
            field = f"{prefix}.{field}" if field and not field.startswith("[") else f"{prefix}{field}"
        if len(errors) > 1:
            reason += f" (+{len(errors) - 1} more error{'s' if len(errors) > 2 else ''} in this row)"
        return cls(reason, file=file, row=row, field=field or None)


def _rebuild_error(kind: type, state: dict[str, Any]) -> DataValidationError:
    err = kind.__new__(kind)
    Exception.__init__(err, state.get("reason", ""))
    err.__dict__.update(state)
    return err


class RejectRateExceeded(DataValidationError):
    """Lenient mode rejected more than ``max_reject_rate`` of the rows.

    Attributes (besides those of :class:`DataValidationError`):
        n_rejected, n_total: counts of rejected and read rows.
        max_reject_rate: the threshold in force (a fraction, 0.05 = 5 %).
        rejects_path: where every reject was written (``None`` if no path was given).
    """

    def __init__(
        self,
        *,
        file: str,
        n_rejected: int,
        n_total: int,
        max_reject_rate: float,
        rejects_path: Path | None,
        summary: str = "",
    ):
        rate = n_rejected / n_total if n_total else 0.0
        reason = (
            f"{n_rejected} of {n_total} rows rejected ({rate:.2%}) > max_reject_rate {max_reject_rate:.2%}; "
            f"rejects written to {rejects_path if rejects_path is not None else '<not written>'}"
        )
        if summary:
            reason += f"; {summary}"
        super().__init__(reason, file=file)
        self.n_rejected = n_rejected
        self.n_total = n_total
        self.max_reject_rate = max_reject_rate
        self.rejects_path = rejects_path


@dataclass(frozen=True)
class RowReject:
    """One rejected row, as written to the rejects file.

    Attributes:
        file: source label.
        row: 0-based row number.
        field: dotted field path, ``None`` for whole-row problems.
        reason: why it was rejected.
        raw: the row as read (a dict, or the undecodable text).
    """

    file: str
    row: int | None
    field: str | None
    reason: str
    raw: Any

    @classmethod
    def from_error(cls, err: DataValidationError, raw: Any) -> RowReject:
        return cls(file=err.file or "<input>", row=err.row, field=err.field, reason=err.reason, raw=raw)

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "row": self.row, "field": self.field, "reason": self.reason, "raw": self.raw}

    def __str__(self) -> str:
        return f"{format_location(self.file, self.row, self.field)}: {self.reason}"


@dataclass(frozen=True)
class InvalidRecord:
    """Placeholder a reader yields for a record it could not decode (e.g. a JSONL line that is not JSON).

    :func:`validate_rows` turns it into a reject (lenient) or an error (strict).
    """

    text: str
    reason: str


def write_rejects(rejects: Iterable[RowReject], path: str | Path) -> Path:
    """Write rejects as JSONL (``file, row, field, reason, raw`` per line); returns the path.

    The file is always (re)written, so an empty file means "validated, nothing rejected".
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for reject in rejects:
            fh.write(json.dumps(to_jsonable(reject.to_dict()), ensure_ascii=False) + "\n")
    return path


def _summarise(rejects: list[RowReject], top: int = 3) -> str:
    counts = Counter(r.reason for r in rejects)
    parts = []
    for reason, n in counts.most_common(top):
        first = next(r for r in rejects if r.reason == reason)
        parts.append(f"{reason!r} x{n} (first: {format_location(None, first.row, first.field).removeprefix('<input> ')})")
    return "most common: " + ", ".join(parts) if parts else ""


def _json_type(value: Any) -> str:
    """The JSON name of a decoded value's type (``array``, ``string``, ``number``, ``boolean``, ``null``)."""
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return "null" if value is None else type(value).__name__


def validate_rows(
    records: Iterable[tuple[int, Any]],
    parse: Callable[[Any, int], T],
    *,
    file: str,
    mode: Mode = "strict",
    max_reject_rate: float = DEFAULT_MAX_REJECT_RATE,
    rejects_path: str | Path | None = None,
) -> tuple[list[T], list[RowReject]]:
    """Run ``parse`` on every row and apply the strict / lenient policy.

    Args:
        records: ``(row_number, raw_row)`` pairs, row numbers 0-based (see module docstring).
            ``raw_row`` may be an :class:`InvalidRecord` for undecodable input.
        parse: ``parse(raw_row, row_number)`` turns one raw row into a validated object (the row
            number is there for default ids like ``"<file stem>-<row>"``). It may raise
            :class:`DataValidationError` (file/row are filled in here when missing) or
            :class:`pydantic.ValidationError` (translated). Other exceptions are bugs and propagate.
        file: source label used in errors and rejects.
        mode: ``"strict"`` or ``"lenient"``.
        max_reject_rate: lenient mode only: the largest accepted fraction of rejected rows, in [0, 1].
        rejects_path: lenient mode only: where to write the rejects JSONL (always written, even
            when empty). ``None``: rejects are only returned and logged.

    Returns:
        ``(accepted, rejects)``: parsed rows in source order, and every rejected row.

    Raises:
        DataValidationError: strict mode, on the first bad row.
        RejectRateExceeded: lenient mode, when ``len(rejects) / n_rows > max_reject_rate``.
        ValueError: unknown ``mode`` or ``max_reject_rate`` outside [0, 1].
    """
    if mode not in ("strict", "lenient"):
        raise ValueError(f"mode must be 'strict' or 'lenient', got {mode!r}")
    if not 0.0 <= max_reject_rate <= 1.0:
        raise ValueError(f"max_reject_rate must be in [0, 1], got {max_reject_rate!r}")

    accepted: list[T] = []
    rejects: list[RowReject] = []
    n_total = 0
    for row, raw in records:
        n_total += 1
        try:
            if isinstance(raw, InvalidRecord):
                raise DataValidationError(raw.reason, file=file, row=row)
            if not isinstance(raw, Mapping):  # a JSON array or scalar row: said as such, not as a missing field
                raise DataValidationError(f"not an object (a JSON {_json_type(raw)}); each row must be a "
                                          "JSON object of named fields", file=file, row=row)
            try:
                accepted.append(parse(raw, row))
            except RecursionError:  # hostile nesting (e.g. 100,000 brackets): this row's error, with its location
                raise DataValidationError("value nested too deeply to validate", file=file, row=row) from None
        except ValidationError as exc:
            err = DataValidationError.from_pydantic(exc, file=file, row=row)
            if mode == "strict":
                raise err from exc
            rejects.append(RowReject.from_error(err, raw.text if isinstance(raw, InvalidRecord) else raw))
        except DataValidationError as err:
            err.located(file=file, row=row)
            if mode == "strict":
                raise
            rejects.append(RowReject.from_error(err, raw.text if isinstance(raw, InvalidRecord) else raw))

    written: Path | None = None
    if mode == "lenient" and rejects_path is not None:
        written = write_rejects(rejects, rejects_path)
    rate = len(rejects) / n_total if n_total else 0.0
    log = logger.warning if rejects else logger.info
    log(
        "%s: %d rows read, %d accepted, %d rejected (%.2f%%, mode=%s)%s",
        file,
        n_total,
        len(accepted),
        len(rejects),
        100 * rate,
        mode,
        f", rejects -> {written}" if written is not None else "",
    )
    if mode == "lenient" and rate > max_reject_rate:
        raise RejectRateExceeded(
            file=file,
            n_rejected=len(rejects),
            n_total=n_total,
            max_reject_rate=max_reject_rate,
            rejects_path=written,
            summary=_summarise(rejects),
        )
    return accepted, rejects


def handle_rejects(rejects: list, n_total: int, args, what: str) -> None:
    """What a stage does with the rows its preparation rejected (e.g. truncation, tokenization).

    Strict: raise the first reject. Lenient: write them all to ``<output_dir>/rejects-<what>.jsonl`` and raise
    when their share exceeds ``args.max_reject_rate``. Never silent: the count is logged either way.

    Args:
        rejects: the rejected rows (each with ``file, row, field, reason``; the strict mode raises the first, so they
            are exceptions, e.g. :class:`DataValidationError`).
        n_total: rows before rejection (the rate's denominator).
        args: the stage config: ``data_mode`` (``"strict"``/``"lenient"``), ``output_dir``, ``max_reject_rate``.
        what: the step that rejected them, used in the file name and the log.

    Raises:
        the first reject (strict); DataValidationError: the reject rate is above ``args.max_reject_rate``.
    """
    if not rejects:
        return
    if args.data_mode == "strict":
        raise rejects[0]
    path = Path(args.output_dir) / f"rejects-{what}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for r in rejects:
            f.write(json.dumps({"file": r.file, "row": r.row, "field": r.field, "reason": r.reason}) + "\n")
    rate = len(rejects) / max(n_total, 1)
    logger.warning("%s: %d of %d rows rejected (%.1f%%), listed in %s", what, len(rejects), n_total, 100 * rate, path)
    if rate > args.max_reject_rate:
        raise DataValidationError(
            f"{len(rejects)}/{n_total} rows rejected > max_reject_rate {args.max_reject_rate}", file=str(path)
        )
