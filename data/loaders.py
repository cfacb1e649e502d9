"""Load datasets into validated rows: local files, the demo bundle, or Hugging Face datasets.

``source`` may be:

* a local file: ``.jsonl`` / ``.ndjson`` / ``.json`` / ``.csv`` / ``.tsv`` (each optionally
  ``.gz``) or ``.parquet``, in our native schema or in one of the shared formats;
* a local dataset folder of such files: the ``split``'s files, found as for a hub dataset folder
  (:func:`folder_data_files`);
* ``"demo:<name>"`` -- a file of the bundled demo set (see :func:`data.bundle.demo_path`);
* a Hugging Face dataset id (``"Anthropic/hh-rlhf"``, or ``"hf:<id>"`` to force it), loaded with
  :func:`datasets.load_dataset` (``split`` and ``hf_kwargs`` are passed on). On machines without
  the hub this raises :class:`SourceUnavailableError`;
* an in-memory sequence of row dicts (label ``"<memory>"``) or a :class:`datasets.Dataset`.

The format is detected from the fields of the first rows (override with ``source_format=``):

===============  ===================================================================
kind             formats (detected by)
===============  ===================================================================
SFT              ``native`` (messages), ``hh`` (chosen transcript string),
                 ``implicit`` (chosen message list), ``prompt_completion``,
                 ``instruction`` (instruction/output)
pairs            ``native`` (prompt + chosen/rejected), ``hh`` (transcripts),
                 ``implicit`` (message lists), ``pandalm`` (response1/annotator1)
eval prompts     ``native`` (prompt + set), ``xstest`` (label/type), ``harmbench``
                 (Behavior), ``sycophancy`` (bias_name), ``mt_bench`` (turns),
                 ``alpaca_eval`` (instruction/output_1), any pair format, ``prompt``
===============  ===================================================================

Every loader validates row by row (:func:`data.validation.validate_rows`): ``mode="strict"``
raises on the first bad row; ``mode="lenient"`` writes every reject to ``rejects_path`` (default
``$RLHF_REJECTS_DIR/<stem>.<kind>.rejects.jsonl``, ``RLHF_REJECTS_DIR`` defaulting to
``runs/rejects``) and raises above ``max_reject_rate``. The returned :class:`LoadedRows` is a
``list`` that also carries ``rejects``, ``n_read`` and ``rejects_path``. Rows keep a stable id:
their own when the format has one, else ``"<file stem>-<row>"`` (row 0-based). Ids must be
unique within a source (a duplicate is a bad row).
"""

from __future__ import annotations

import gzip
import io
import json
import logging
import os
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from data import converters as cv
from data.bundle import demo_path
from data.schemas import (
    AlpacaEvalRecord,
    Conversation,
    EvalPrompt,
    PreferencePair,
    conversation_to_trl,
    pair_to_trl,
)
from data.validation import (
    DEFAULT_MAX_REJECT_RATE,
    DataValidationError,
    InvalidRecord,
    Mode,
    RowReject,
    validate_rows,
)

__all__ = [
    "SourceUnavailableError",
    "LoadedRows",
    "RawSource",
    "open_source",
    "read_records",
    "detect_format",
    "load_sft",
    "load_pairs",
    "load_eval_prompts",
    "load_alpaca_eval",
    "load_judge_labels",
    "to_hf_dataset",
    "default_rejects_path",
    "ALPACA_EVAL_BASELINE_FILE",
]

T = TypeVar("T")
logger = logging.getLogger(__name__)

_DATA_SUFFIXES = (".jsonl", ".ndjson", ".json", ".csv", ".tsv", ".parquet")
#: Demo AlpacaEval model files hold only ``idx, generator_2, output_2, preference``; the shared
#: baseline columns live in this file of the same folder and are joined on ``idx``.
ALPACA_EVAL_BASELINE_FILE = "baseline_gpt4_1106_preview.jsonl.gz"
_DETECT_ROWS = 50
#: Longest JSONL row a training or evaluation file may hold (bytes, as the flywheel's event lines): a longer one is a
#: bad row (rejected in lenient mode, an error naming it in strict mode) rather than text the tokenizer would take
#: whole into memory before truncating it.
MAX_ROW_BYTES = 4 * 2**20


class SourceUnavailableError(OSError):
    """A Hugging Face dataset could not be loaded (hub unreachable, unknown id, ...)."""


class LoadedRows(list, Generic[T]):
    """A ``list`` of validated rows plus the accounting of the load.

    Attributes:
        source: label of the source (path, ``demo:<name>``, ``hf:<id>[split]``, ``<memory>``).
        source_format: the detected or forced format.
        n_read: number of rows read (accepted + rejected; before ``set_name`` filtering).
        rejects: every rejected row (empty in strict mode).
        rejects_path: where the rejects were written (lenient mode), else ``None``.
    """

    def __init__(
        self,
        rows: Iterable[T] = (),
        *,
        source: str = "<memory>",
        source_format: str = "",
        n_read: int = 0,
        rejects: list[RowReject] | None = None,
        rejects_path: Path | None = None,
    ):
        super().__init__(rows)
        self.source = source
        self.source_format = source_format
        self.n_read = n_read
        self.rejects = rejects or []
        self.rejects_path = rejects_path


@dataclass
class RawSource:
    """Undecoded rows of a source.

    Attributes:
        label: used in errors and rejects (``"demo:hh_rlhf/sft.jsonl"``, a path, ``"hf:id[split]"``).
        stem: file name without data suffixes, used for default ids (``"sft"``).
        path: local file, ``None`` for HF / in-memory sources.
        records: ``(row, raw)`` pairs, row 0-based; ``raw`` is a dict, or an
            :class:`~data.validation.InvalidRecord` for undecodable input.
    """

    label: str
    stem: str
    path: Path | None
    records: list[tuple[int, Any]]


# ----------------------------------------------------------------------------------- reading


def _stem(name: str) -> str:
    if name.endswith(".gz"):
        name = name[:-3]
    for suffix in _DATA_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return Path(name).stem


def _open_bytes(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if path.name.endswith(".gz") else data


def _read_jsonl(data: bytes) -> list[tuple[int, Any]]:
    out: list[tuple[int, Any]] = []
    for row, line in enumerate(data.split(b"\n")):
        if not line.strip():
            continue
        if len(line) > MAX_ROW_BYTES:  # only a prefix is kept for the rejects file
            out.append((row, InvalidRecord(line[:200].decode("utf-8", "replace"),
                                           f"row of {len(line):,} bytes, over the {MAX_ROW_BYTES:,}-byte limit")))
            continue
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            out.append((row, InvalidRecord(line.decode("utf-8", "replace"), f"invalid UTF-8: {exc.reason}")))
            continue
        try:
            out.append((row, json.loads(text)))
        except json.JSONDecodeError as exc:
            out.append((row, InvalidRecord(text, f"invalid JSON: {exc.msg} (column {exc.colno})")))
        except RecursionError:  # e.g. 100,000 nested brackets: a bad row, not a crash without a location
            out.append((row, InvalidRecord(text[:200], "invalid JSON: nested too deeply to parse")))
    return out


def _read_file(path: Path, label: str) -> list[tuple[int, Any]]:
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    try:
        if name.endswith((".jsonl", ".ndjson")):
            return _read_jsonl(_open_bytes(path))
        if name.endswith(".json"):
            data = _open_bytes(path)
            try:
                obj = json.loads(data)
            except RecursionError:
                raise DataValidationError("invalid JSON: nested too deeply to parse", file=label) from None
            except json.JSONDecodeError as exc:
                if exc.msg == "Extra data":  # JSON Lines saved as .json
                    return _read_jsonl(data)
                raise DataValidationError(f"invalid JSON: {exc.msg} (line {exc.lineno})", file=label) from exc
            if isinstance(obj, Mapping):
                lists = [v for v in obj.values() if isinstance(v, list)]
                if len(lists) != 1:
                    raise DataValidationError(
                        "expected a JSON array of rows, or an object with exactly one array field", file=label
                    )
                obj = lists[0]
            if not isinstance(obj, list):
                raise DataValidationError(f"expected a JSON array of rows, got {type(obj).__name__}", file=label)
            return list(enumerate(obj))
        if name.endswith((".csv", ".tsv")):
            import pandas as pd

            frame = pd.read_csv(
                io.BytesIO(_open_bytes(path)),
                sep="\t" if name.endswith(".tsv") else ",",
                dtype=str,
                keep_default_na=False,
            )
            return list(enumerate(frame.to_dict(orient="records")))
        if name.endswith(".parquet"):
            import pandas as pd

            return list(enumerate(pd.read_parquet(path).to_dict(orient="records")))
    except DataValidationError:
        raise
    except (OSError, ValueError, EOFError) as exc:  # gzip/CSV/parquet decoding problems
        raise DataValidationError(f"cannot read file: {type(exc).__name__}: {exc}", file=label) from exc
    raise DataValidationError(
        f"unsupported file type (expected {', '.join(_DATA_SUFFIXES)}, optionally .gz)", file=label
    )


def _looks_like_path(text: str) -> bool:
    return (
        text.startswith(("/", "./", "../", "~", "\\"))
        or (len(text) > 1 and text[1] == ":")  # Windows drive
        or any(text.endswith(s) or text.endswith(s + ".gz") for s in _DATA_SUFFIXES)
    )


def _hf_records(
    name: str, split: str, hf_kwargs: Mapping[str, Any] | None, limit: int | None = None
) -> list[tuple[int, Any]]:
    try:
        import datasets

        dataset = datasets.load_dataset(name, split=split, **dict(hf_kwargs or {}))
    except Exception as exc:  # hub unreachable, unknown id, missing config ...: all mean "not available here"
        raise SourceUnavailableError(
            f"could not load Hugging Face dataset {name!r} (split {split!r}): {type(exc).__name__}: {exc}. "
            "If the hub is unreachable (offline machines), pass a local file or 'demo:<name>' instead."
        ) from exc
    if limit is not None:
        dataset = dataset.select(range(min(limit, len(dataset))))
    return list(enumerate(dataset))


def open_source(
    source: Any,
    *,
    split: str = "train",
    hf_kwargs: Mapping[str, Any] | None = None,
    limit: int | None = None,
) -> RawSource:
    """Read the raw rows of ``source`` (see module docstring for accepted sources).

    Args:
        source: path, ``"demo:<name>"``, HF id / ``"hf:<id>"``, sequence of dicts or ``datasets.Dataset``.
        split: HF split.
        hf_kwargs: extra keyword arguments for :func:`datasets.load_dataset` (e.g. ``data_dir``).
        limit: keep only the first ``limit`` rows.

    Raises:
        FileNotFoundError: a local path or demo name that does not exist.
        SourceUnavailableError: a HF dataset that cannot be loaded.
        DataValidationError: an unreadable file (bad gzip / CSV, wrong top-level JSON).
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")

    def cut(records: list[tuple[int, Any]]) -> list[tuple[int, Any]]:
        return records if limit is None else records[:limit]

    if isinstance(source, (str, os.PathLike)):
        text = os.fspath(source)
        if text.startswith("demo:"):
            path = demo_path(text)
            if not path.is_file():
                raise FileNotFoundError(f"{text} is a folder of the demo bundle, not a file")
            label = "demo:" + _demo_relative(path)
            return RawSource(label, _stem(path.name), path, cut(_read_file(path, label)))
        path = Path(text).expanduser()
        if text.startswith("hf:") or not (_looks_like_path(text) or path.is_file()):
            # a hub id, or a local dataset folder (datasets.load_dataset reads those offline)
            name = text.removeprefix("hf:")
            return RawSource(f"hf:{name}[{split}]", name.replace("/", "_"), None, _hf_records(name, split, hf_kwargs, limit))
        if path.is_dir():
            return _folder_source(path, text, split, limit)
        if not path.is_file():
            raise FileNotFoundError(f"data file not found: {text}")
        return RawSource(text, _stem(path.name), path, cut(_read_file(path, text)))
    if hasattr(source, "column_names") and hasattr(source, "__getitem__"):  # datasets.Dataset
        return RawSource("<dataset>", "dataset", None, cut(list(enumerate(source))))
    if isinstance(source, Sequence) and not isinstance(source, (str, bytes)):
        return RawSource("<memory>", "memory", None, cut(list(enumerate(source))))
    raise TypeError(f"unsupported source type {type(source).__name__}")


def _is_data_file(name: str) -> bool:
    name = name[:-3] if name.endswith(".gz") else name
    return name.endswith(_DATA_SUFFIXES)


def folder_data_files(folder: Path, split: str) -> list[Path]:
    """The data files of ``split`` in a local dataset folder, found the way :func:`datasets.load_dataset` finds a
    hub dataset's (``datasets.data_files.get_data_patterns``: ``train.jsonl``, ``data/train-00000-of-00001.parquet``,
    ``test.csv`` ...; a folder with no split names is all ``train``), keeping the files this loader reads.

    Raises:
        FileNotFoundError: no file of ``split`` with a supported suffix; the message names the folder, the
            patterns looked for, the splits and files found, and the supported suffixes.
    """
    from datasets.data_files import DataFilesDict, get_data_patterns

    try:
        patterns = get_data_patterns(str(folder))
        files = DataFilesDict.from_patterns(patterns, base_path=str(folder))
    except Exception as exc:  # datasets raises EmptyDatasetError / FileNotFoundError for an empty folder
        raise FileNotFoundError(f"{folder}: a folder with no data files ({type(exc).__name__}: {exc})") from None
    found = {str(k): [Path(f) for f in v] for k, v in files.items()}
    chosen = sorted(f for f in found.get(split, []) if _is_data_file(f.name))
    if not chosen:
        looked = patterns.get(split) or [f"**/{split}[-._ 0-9]*"]
        listing = {k: [f.relative_to(folder).as_posix() for f in v][:10] for k, v in found.items()}
        raise FileNotFoundError(
            f"{folder}: no data file for split {split!r} (looked for {looked} with a suffix in "
            f"{', '.join(_DATA_SUFFIXES)}, optionally .gz; files by split: {listing})"
        )
    return chosen


def _folder_source(folder: Path, label: str, split: str, limit: int | None) -> RawSource:
    """A local dataset folder: its ``split`` files in sorted order, rows numbered across them (0-based)."""
    files = folder_data_files(folder, split)
    if len(files) == 1:
        records = _read_file(files[0], str(files[0]))
        label, path = str(files[0]), files[0]
    else:
        records, offset = [], 0
        for f in files:
            part = _read_file(f, str(f))
            records += [(offset + row, raw) for row, raw in part]
            offset += max((row for row, _ in part), default=-1) + 1
        label, path = f"{label}[{split}: {', '.join(f.relative_to(folder).as_posix() for f in files)}]", None
    return RawSource(label, folder.name, path, records if limit is None else records[:limit])


def _demo_relative(path: Path) -> str:
    from data.bundle import DEMO_ROOT

    return path.resolve().relative_to(DEMO_ROOT.resolve()).as_posix()


def read_records(source: Any, **kwargs: Any) -> list[tuple[int, Any]]:
    """``(row, raw_dict)`` pairs of a source without any validation (e.g. the raw PandaLM labels).

    Keyword arguments are those of :func:`open_source`.
    """
    return open_source(source, **kwargs).records


def check_data_file(
    path: str | os.PathLike[str],
    *,
    kind: str | None = None,
    mode: Mode | None = None,
    max_reject_rate: float = DEFAULT_MAX_REJECT_RATE,
) -> int:
    """Read a local data file (or data folder) the way a stage will, without loading any model, so a round can
    refuse it before it starts.

    Always: the source opens (JSON, JSON Lines, CSV, Parquet, optionally gzipped; a folder holds data files), has
    rows, and not every row is unusable (undecodable, or not a JSON object). With ``kind`` (``"sft"``, ``"pairs"``,
    ``"eval"``) it is loaded as the stage loads it (:func:`load_sft`, :func:`load_pairs`, :func:`load_eval_prompts`):
    a format must be recognised and every row validated, under ``mode`` (the stage's ``data_mode``; default strict:
    the first bad row fails; lenient: more than ``max_reject_rate`` of them fails, the rejects written only to a
    temporary folder removed here).

    Returns:
        the number of rows read.

    Raises:
        FileNotFoundError: no such file, or a folder without data files. DataValidationError: the file cannot be
        read, has no rows, no usable row, an unknown format or (per ``mode``) a bad row; the message names the file,
        the row and the field.
    """
    raw = open_source(os.fspath(path))
    if not raw.records:
        raise DataValidationError("no rows", file=raw.label)
    if not any(isinstance(v, Mapping) for _, v in raw.records):  # the first row's reason, as strict mode says it
        validate_rows(raw.records[:1], lambda value, row: value, file=raw.label, mode="strict")
    if kind is None:
        return len(raw.records)
    loader = {"sft": load_sft, "pairs": load_pairs, "eval": load_eval_prompts}[kind]
    import tempfile

    with tempfile.TemporaryDirectory(prefix="rlhf-data-check-") as tmp:
        loader(os.fspath(path), mode=mode or "strict", max_reject_rate=max_reject_rate,
               rejects_path=Path(tmp) / "rejects.jsonl")
    return len(raw.records)


# ------------------------------------------------------------------------------------ formats


def _first_value(row: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        if key in row:
            return row[key]
    return None


def _sft_format(row: Mapping[str, Any]) -> str | None:
    if "messages" in row:
        return "native"
    if "chosen" in row:
        return "implicit" if isinstance(row["chosen"], list) else "hh"
    if "prompt" in row and "completion" in row:
        return "prompt_completion"
    if "instruction" in row and "output" in row:
        return "instruction"
    return None


def _pair_format(row: Mapping[str, Any]) -> str | None:
    if "annotator1" in row or ("response1" in row and "response2" in row):
        return "pandalm"
    if "prompt" in row and ("chosen" in row or "rejected" in row):
        return "native"
    if "chosen" in row or "rejected" in row:
        return "implicit" if isinstance(_first_value(row, "chosen", "rejected"), list) else "hh"
    return None


def _eval_format(row: Mapping[str, Any]) -> str | None:
    if "Behavior" in row or "BehaviorID" in row:
        return "harmbench"
    if "bias_name" in row:
        return "sycophancy"
    if "turns" in row and ("question_id" in row or "category" in row):
        return "mt_bench"
    if "prompt" in row and "label" in row and "type" in row:
        return "xstest"
    if "instruction" in row and "output_1" in row:
        return "alpaca_eval"
    pair = _pair_format(row)
    if pair is not None:
        return f"pair:{pair}"
    if "prompt" in row:
        return "native"
    return None


_DETECTORS: dict[str, Callable[[Mapping[str, Any]], str | None]] = {
    "sft": _sft_format,
    "pairs": _pair_format,
    "eval": _eval_format,
}


def detect_format(records: Sequence[tuple[int, Any]], kind: str, *, label: str = "<input>") -> str:
    """Most common format among the first rows of ``records`` for ``kind`` (``sft``/``pairs``/``eval``).

    Raises:
        DataValidationError: no row of a known format (the message lists the fields seen).
    """
    detector = _DETECTORS[kind]
    votes: Counter[str] = Counter()
    keys: set[str] = set()
    for _, raw in records[:_DETECT_ROWS]:
        if isinstance(raw, Mapping):
            keys.update(map(str, raw))
            fmt = detector(raw)
            if fmt:
                votes[fmt] += 1
    if not votes:
        raise DataValidationError(
            f"cannot recognise a {kind} format from fields {sorted(keys)[:20]}; see data.loaders for the formats",
            file=label,
        )
    return votes.most_common(1)[0][0]


# ------------------------------------------------------------------------------------ loading


def _row_format(value: Any, file_format: str, forced: str | None, detector) -> str:
    """The format of one row: the forced one, else the row's own fields, else the file's majority format."""
    if forced is not None or not isinstance(value, Mapping):
        return file_format
    return detector(value) or file_format


def default_rejects_path(stem: str, kind: str) -> Path:
    """``$RLHF_REJECTS_DIR/<stem>.<kind>.rejects.jsonl`` (``RLHF_REJECTS_DIR`` defaults to ``runs/rejects``)."""
    return Path(os.environ.get("RLHF_REJECTS_DIR", "runs/rejects")) / f"{stem}.{kind}.rejects.jsonl"


def _unique_ids(parse: Callable[[Any, int], T]) -> Callable[[Any, int], T]:
    seen: dict[str, int] = {}

    def wrapped(raw: Any, row: int) -> T:
        obj = parse(raw, row)
        ident = getattr(obj, "id", None)
        if ident is not None:
            if ident in seen:
                raise DataValidationError(f"duplicate id {ident!r} (first seen at row {seen[ident]})", field="id")
            seen[ident] = row
        return obj

    return wrapped


def _load(
    raw: RawSource,
    kind: str,
    parse_for: Callable[[str, RawSource], Callable[[Any, int], T]],
    *,
    mode: Mode,
    max_reject_rate: float,
    rejects_path: str | Path | None,
    source_format: str | None,
    use_first: int | None = None,
    use_first_name: str = "max_train_samples",
) -> LoadedRows[T]:
    if not raw.records:
        raise DataValidationError("no rows", file=raw.label)
    fmt = source_format or detect_format(raw.records, kind, label=raw.label)
    parse = _unique_ids(parse_for(fmt, raw))
    if mode == "lenient" and rejects_path is None:
        rejects_path = default_rejects_path(raw.stem, kind)
    accepted, rejects = validate_rows(
        raw.records,
        parse,
        file=raw.label,
        mode=mode,
        max_reject_rate=max_reject_rate,
        rejects_path=rejects_path if mode == "lenient" else None,
    )
    if use_first is not None and len(accepted) > use_first:
        # Every row was read and validated above; the cap only chooses which valid rows are used, and says so.
        logger.warning("%s: using the first %d of %d rows (%s)", raw.label, use_first, len(accepted), use_first_name)
        accepted = accepted[:use_first]
    return LoadedRows(
        accepted,
        source=raw.label,
        source_format=fmt,
        n_read=len(raw.records),
        rejects=rejects,
        rejects_path=Path(rejects_path) if mode == "lenient" and rejects_path is not None else None,
    )


def _unknown_format(kind: str, fmt: str, options: Iterable[str]) -> ValueError:
    return ValueError(f"unknown {kind} format {fmt!r}; expected one of {sorted(options)}")


_SFT_CONVERTERS = {
    "native": cv.native_to_conversation,
    "hh": cv.hh_to_conversation,
    "implicit": cv.implicit_to_conversation,
    "prompt_completion": cv.prompt_completion_to_conversation,
    "instruction": cv.instruction_to_conversation,
}

_PAIR_CONVERTERS = {
    "native": cv.native_to_pair,
    "hh": cv.hh_to_pair,
    "implicit": cv.implicit_to_pair,
    "pandalm": cv.pandalm_to_pair,
}


def _load_converted(
    kind: str,
    converters: Mapping[str, Callable[..., T]],
    source: Any,
    *,
    mode: Mode,
    max_reject_rate: float,
    rejects_path: str | Path | None,
    limit: int | None,
    source_format: str | None,
    split: str,
    hf_kwargs: Mapping[str, Any] | None,
    use_first: int | None = None,
    check: Callable[[T], None] | None = None,
) -> LoadedRows[T]:
    """The one body of :func:`load_sft` and :func:`load_pairs`: open ``source``, pick the converter of each row's
    format (``source_format``, else the row's own fields, else the file's majority format) and validate every row
    (plus ``check``, which may raise DataValidationError); row ids are ``<stem>-<row>``. ``use_first``: see
    :func:`load_sft`."""
    if source_format is not None and source_format not in converters:
        raise _unknown_format(kind, source_format, converters)
    raw = open_source(source, split=split, hf_kwargs=hf_kwargs, limit=limit)

    def parse_for(fmt: str, src: RawSource):
        def parse(value, row):
            obj = converters[_row_format(value, fmt, source_format, _DETECTORS[kind])](
                value, id=f"{src.stem}-{row}", source=src.label
            )
            if check is not None:
                check(obj)
            return obj

        return parse

    return _load(
        raw, kind, parse_for, mode=mode, max_reject_rate=max_reject_rate, rejects_path=rejects_path,
        source_format=source_format, use_first=use_first,
    )


def _label_check(min_labels: int | None) -> Callable[[PreferencePair], None] | None:
    """Agreement data: a pair with fewer than ``min_labels`` annotator labels is a bad row (field ``labels``)."""
    if min_labels is None:
        return None

    def check(pair: PreferencePair) -> None:
        n_labels = len(pair.labels or [])
        if n_labels < min_labels:
            raise DataValidationError(
                f"{n_labels} annotator label(s); agreement data needs at least {min_labels} per pair", field="labels"
            )

    return check


def load_sft(
    source: Any,
    *,
    mode: Mode = "strict",
    max_reject_rate: float = DEFAULT_MAX_REJECT_RATE,
    rejects_path: str | Path | None = None,
    limit: int | None = None,
    source_format: str | None = None,
    split: str = "train",
    hf_kwargs: Mapping[str, Any] | None = None,
    use_first: int | None = None,
) -> LoadedRows[Conversation]:
    """Load SFT demonstrations.

    HH-RLHF rows give their ``chosen`` transcript; TRL implicit-preference rows their ``chosen``
    conversation.

    Args:
        source: see module docstring.
        mode: ``"strict"`` (raise on the first bad row) or ``"lenient"``.
        max_reject_rate: lenient mode: largest accepted fraction of rejected rows.
        rejects_path: lenient mode: rejects JSONL (default :func:`default_rejects_path`).
        limit: read only the first ``limit`` rows (the rest is never looked at).
        source_format: force a format (``native``, ``hh``, ``implicit``, ``prompt_completion``, ``instruction``);
            by default each row's format is detected from its own fields (a file may mix formats).
        split, hf_kwargs: Hugging Face sources only.
        use_first: read and validate every row, then use the first ``use_first`` valid ones; the cap is logged
            ("using the first 4 of 6 rows (max_train_samples)"). What the stages' ``max_train_samples`` does.

    Returns:
        :class:`LoadedRows` of :class:`~data.schemas.Conversation`.

    Raises:
        DataValidationError / RejectRateExceeded: bad rows (see :mod:`data.validation`), empty source.
        FileNotFoundError, SourceUnavailableError: see :func:`open_source`.
    """
    return _load_converted(
        "sft", _SFT_CONVERTERS, source, mode=mode, max_reject_rate=max_reject_rate, rejects_path=rejects_path, limit=limit,
        source_format=source_format, split=split, hf_kwargs=hf_kwargs, use_first=use_first,
    )


def load_pairs(
    source: Any,
    *,
    mode: Mode = "strict",
    max_reject_rate: float = DEFAULT_MAX_REJECT_RATE,
    rejects_path: str | Path | None = None,
    limit: int | None = None,
    source_format: str | None = None,
    split: str = "train",
    hf_kwargs: Mapping[str, Any] | None = None,
    use_first: int | None = None,
    min_labels: int | None = None,
) -> LoadedRows[PreferencePair]:
    """Load preference pairs (native/TRL, HH-RLHF transcripts, TRL implicit, PandaLM).

    Arguments as :func:`load_sft`; ``source_format`` one of ``native``, ``hh``, ``implicit``, ``pandalm``.
    ``min_labels``: a row with fewer annotator labels is a bad row (field ``labels``): agreement data needs at
    least 2 per pair. Rows may have different numbers of annotators.

    Note:
        The published PandaLM test set has 60 of 999 rows that cannot be pairs (54 empty
        responses, 6 JSON ``true`` responses): load it with ``mode="lenient",
        max_reject_rate=0.07``, or read the raw labels with :func:`read_records`.

    Returns:
        :class:`LoadedRows` of :class:`~data.schemas.PreferencePair`.
    """
    return _load_converted(
        "pairs", _PAIR_CONVERTERS, source, mode=mode, max_reject_rate=max_reject_rate, rejects_path=rejects_path, limit=limit,
        source_format=source_format, split=split, hf_kwargs=hf_kwargs, use_first=use_first, check=_label_check(min_labels),
    )


_EVAL_CONVERTERS: dict[str, Callable[..., EvalPrompt]] = {
    "xstest": cv.xstest_to_prompt,
    "harmbench": cv.harmbench_to_prompt,
    "advbench": cv.advbench_to_prompt,
    "sycophancy": cv.sycophancy_to_prompt,
    "mt_bench": cv.mt_bench_to_prompt,
    "alpaca_eval": cv.alpaca_eval_to_prompt,
}
_EVAL_FORMATS = set(_EVAL_CONVERTERS) | {"native"} | {f"pair:{k}" for k in _PAIR_CONVERTERS}


def load_eval_prompts(
    source: Any,
    set_name: str | None = None,
    *,
    mode: Mode = "strict",
    max_reject_rate: float = DEFAULT_MAX_REJECT_RATE,
    rejects_path: str | Path | None = None,
    limit: int | None = None,
    source_format: str | None = None,
    split: str = "train",
    hf_kwargs: Mapping[str, Any] | None = None,
) -> LoadedRows[EvalPrompt]:
    """Load evaluation prompts.

    Args:
        source: see module docstring.
        set_name: for formats that define their own sets (XSTest -> ``xstest_safe`` /
            ``xstest_unsafe``, HarmBench, MT-bench, sycophancy, AlpacaEval) keep only this set;
            for formats that do not (native rows without ``set``, plain prompts, preference pairs)
            it is the set given to every prompt (default: the file stem).
        source_format: force a format: ``native``, ``xstest``, ``harmbench``, ``advbench``,
            ``sycophancy``, ``mt_bench``, ``alpaca_eval``, ``pair:<pair format>``.
        limit: without ``set_name``, read only the first ``limit`` rows; with ``set_name``, the
            whole source is read and validated and the first ``limit`` prompts *of that set* are
            returned (XSTest interleaves safe and unsafe blocks of 25, so a read limit would not do).
        Other arguments as :func:`load_sft`.

    Returns:
        :class:`LoadedRows` of :class:`~data.schemas.EvalPrompt` (``n_read`` counts rows before
        the ``set_name`` filter).

    Raises:
        ValueError: ``set_name`` matches none of the sets in the source (the message lists them).
        Others as :func:`load_sft`.
    """
    if source_format is not None and source_format not in _EVAL_FORMATS:
        raise _unknown_format("eval", source_format, _EVAL_FORMATS)
    raw = open_source(source, split=split, hf_kwargs=hf_kwargs, limit=None if set_name is not None else limit)
    own_sets = True

    def parse_for(fmt: str, src: RawSource):
        nonlocal own_sets
        default_set = set_name or src.stem
        if fmt.startswith("pair:"):
            own_sets = False
            convert_pair = _PAIR_CONVERTERS[fmt.removeprefix("pair:")]
            return lambda value, row: cv.pair_to_eval_prompt(
                convert_pair(value, id=f"{src.stem}-{row}", source=src.label), set_name=default_set
            )
        if fmt == "native":
            own_sets = False
            return lambda value, row: cv.native_to_eval_prompt(value, id=f"{src.stem}-{row}", set_name=default_set)
        convert = _EVAL_CONVERTERS[fmt]
        prefix = "alpaca_eval" if fmt == "alpaca_eval" else src.stem  # same ids as load_alpaca_eval
        return lambda value, row: convert(value, id=f"{prefix}-{row}")

    rows = _load(
        raw, "eval", parse_for, mode=mode, max_reject_rate=max_reject_rate, rejects_path=rejects_path, source_format=source_format
    )
    if set_name is not None and own_sets:
        available = sorted({p.set for p in rows})
        kept = [p for p in rows if p.set == set_name]
        if not kept:
            raise ValueError(f"{raw.label}: no prompts in set {set_name!r}; sets in this source: {available}")
        rows[:] = kept
    if set_name is not None and limit is not None:
        del rows[limit:]
    return rows


def _join_alpaca_baseline(raw: RawSource) -> RawSource:
    """Demo compact AlpacaEval model file -> full rows (baseline columns joined on ``idx``)."""
    first = next((v for _, v in raw.records if isinstance(v, Mapping)), None)
    if raw.path is None or first is None or "instruction" in first or "output_2" not in first:
        return raw
    baseline_file = raw.path.parent / ALPACA_EVAL_BASELINE_FILE
    if not baseline_file.is_file():
        raise FileNotFoundError(f"{raw.label}: compact AlpacaEval file needs {baseline_file}")
    baseline = {v.get("idx"): v for _, v in _read_file(baseline_file, str(baseline_file)) if isinstance(v, Mapping)}
    joined = []
    for row, value in raw.records:
        if isinstance(value, Mapping) and value.get("idx") in baseline:
            value = {**baseline[value["idx"]], **value}
        joined.append((row, value))
    return RawSource(raw.label, raw.stem, raw.path, joined)


def load_alpaca_eval(
    source: Any,
    *,
    mode: Mode = "strict",
    max_reject_rate: float = DEFAULT_MAX_REJECT_RATE,
    rejects_path: str | Path | None = None,
    limit: int | None = None,
    split: str = "train",
    hf_kwargs: Mapping[str, Any] | None = None,
) -> LoadedRows[AlpacaEvalRecord]:
    """Load AlpacaEval annotations (upstream ``annotations.json`` or the demo's compact files,
    e.g. ``"demo:alpaca_eval_gpt-3.5-turbo-1106"``). Ids are ``"alpaca_eval-<row>"`` (same
    instruction -> same id across models). Arguments as :func:`load_sft`.
    """
    raw = _join_alpaca_baseline(open_source(source, split=split, hf_kwargs=hf_kwargs, limit=limit))

    def parse_for(fmt: str, src: RawSource):
        return lambda value, row: cv.alpaca_eval_to_record(
            value,
            id=f"alpaca_eval-{row}",
        )

    return _load(
        raw, "alpaca_eval", parse_for, mode=mode, max_reject_rate=max_reject_rate, rejects_path=rejects_path, source_format="alpaca_eval"
    )


def load_judge_labels(source: Any, *, limit: int | None = None) -> dict[str, int | None]:
    """PandaLM-style judge file -> ``{pair id: verdict}`` (0 tie, 1 first better, 2 second better,
    ``None`` = unparsed verdict). Pair ids match :func:`load_pairs` on the PandaLM test set.

    Raises:
        DataValidationError: a row without ``idx`` / result (strict), or a duplicate ``idx``.
    """
    raw = open_source(source, limit=limit)
    out: dict[str, int | None] = {}

    def parse(value: Any, row: int) -> tuple[str, int | None]:
        key, verdict = cv.pandalm_judge_to_label(value)
        if key in out:
            raise DataValidationError(f"duplicate idx ({key})", field="idx")
        out[key] = verdict
        return key, verdict

    validate_rows(raw.records, parse, file=raw.label, mode="strict")
    return out


# ----------------------------------------------------------------------------------- HF export


def to_hf_dataset(rows: Iterable[Any], *, include_id: bool = True):
    """Rows of one schema -> :class:`datasets.Dataset` in TRL's conversational formats.

    * Conversation -> ``messages`` (language modelling / SFT);
    * PreferencePair -> ``prompt``, ``chosen``, ``rejected`` (DPO / reward modelling, explicit prompt);
    * EvalPrompt -> ``prompt`` (prompt-only: ``meta["messages"]`` when present, else one user
      turn) plus ``set``, ``intent``, ``reference``, ``label``;
    * AlpacaEvalRecord -> its fields.

    ``include_id`` adds the ``id`` column.

    Raises:
        ValueError: no rows. TypeError: mixed or unsupported row types.
    """
    import datasets

    rows = list(rows)
    if not rows:
        raise ValueError("to_hf_dataset: no rows")
    kinds = {type(r) for r in rows}
    if len(kinds) != 1:
        raise TypeError(f"to_hf_dataset: rows of one schema expected, got {sorted(k.__name__ for k in kinds)}")
    kind = kinds.pop()
    if kind is Conversation:
        records = [conversation_to_trl(r) for r in rows]
    elif kind is PreferencePair:
        records = [pair_to_trl(r) for r in rows]
    elif kind is EvalPrompt:
        records = [
            {
                "prompt": list(r.meta.get("messages") or [{"role": "user", "content": r.prompt}]),
                "set": r.set,
                "intent": r.intent,
                "reference": r.reference,
                "label": r.label,
            }
            for r in rows
        ]
    elif kind is AlpacaEvalRecord:
        records = [r.model_dump(exclude={"id"}) for r in rows]
    else:
        raise TypeError(f"to_hf_dataset: unsupported row type {kind.__name__}")
    if include_id:
        records = [{"id": r.id, **rec} for r, rec in zip(rows, records, strict=True)]
    return datasets.Dataset.from_list(records)


def load_chat_prompts(path: str | os.PathLike[str]) -> list[Any]:
    """Read a JSONL file of ``{"prompt": str | [messages]}`` rows (PPO's rollout prompts).

    Returns:
        One entry per non-blank line: the prompt string, or the list of chat messages as written.

    Raises:
        ValueError: naming the file, the 1-based line and the reason (bad JSON, no ``prompt`` field, a prompt
            that is neither a string nor a list, or no prompts at all).
    """
    path = Path(path)
    rows: list[Any] = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict) or "prompt" not in row:
                raise ValueError(f"{path}:{lineno}: expected an object with a 'prompt' field")
            prompt = row["prompt"]
            if not isinstance(prompt, (str, list)):
                raise ValueError(f"{path}:{lineno}: 'prompt' must be a string or a list of messages")
            rows.append(prompt)
    if not rows:
        raise ValueError(f"{path}: no prompts")
    return rows
