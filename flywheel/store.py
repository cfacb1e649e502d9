"""The weak-signal store: one event per (conversation, turn, signal) in a real database.

Embedded default: a DuckDB file (``duckdb:///runs/flywheel/signals.duckdb``, or just a path). At scale: PostgreSQL
by URL (``postgresql+psycopg://user@host:port/db``). Both go through the same code: SQLAlchemy Core defines the
tables and builds every query; only the staging differs (DuckDB scans an Arrow table in place, PostgreSQL takes
``COPY ... FROM STDIN`` into a temporary table), and both then run the same ``INSERT ... SELECT`` anti-joins
(``LEFT JOIN ... WHERE key IS NULL``; deduplication without a unique index on DuckDB; PostgreSQL keeps its primary
keys and adds ``ON CONFLICT DO NOTHING``). Writers to one store are serialised: DuckDB's file lock across processes, a lock per
URL in this process, and on PostgreSQL ``LOCK TABLE events IN SHARE ROW EXCLUSIVE MODE`` for the ingest
transaction (readers are not blocked), because the per-turn counts are added from the rows the anti-join found new.

Tables:
    texts(hash, text, norm_hash)         every prompt and response once, under its sha256; ``norm_hash`` is the hash
                                         of the normalised text (selection deduplicates prompts on it)
    events(event_id, conversation_id, turn_id, user_id, model_version, intent, signal, ts,
           prompt_hash -> texts, response_hash -> texts, source_file -> ingests.file_id, source_row)
    turns(conversation_id, turn_id, user_id, prompt_hash, response_hash, intent, model_version, prompt_norm_hash,
          first_ts, one count per signal)
                                         one row per turn RESPONSE: (user, conversation, turn, prompt, response)
                                         is its identity (conversations are scoped by user; a regenerated reply is
                                         its own row with the signals given on it; one (user, conversation, turn)
                                         with two prompts is refused at ingest, naming both rows); kept by the
                                         ingest in the same transaction as its events: equal to a GROUP BY over all
                                         stored events on that key (``min()`` of intent and model version in byte
                                         order, never of a hash column; exact counts), so selection reads 1 row per
                                         turn response instead of aggregating strings over every event
    ingests(file_hash PK, path, rows, finished_at, file_id)   a file is listed only once all its rows are committed
    (``texts.hash``, ``events.event_id`` and the judge key are unique; primary keys on PostgreSQL only)
    judge_scores(judge, prompt_hash, response_hash, score)   the judge's score per turn, cached by content hash

Ingestion (:func:`SignalStore.ingest`) reads JSONL or Parquet, validates every row against
:class:`flywheel.schema.EventRow` (errors name file, row, field and reason; nothing is written then), and writes a
file in ONE transaction: an ingest killed mid-file (even with SIGKILL) leaves nothing of that file, and a rerun
ends with exact counts. The same event twice (same ``event_id`` and content, in one file or across files) is stored
once and counted as a duplicate; the same ``event_id`` with different content is refused wherever the two rows are
(same batch, other batch, other file, an earlier ingest), naming both, whatever ``chunk_rows`` is. Ctrl-C (a
``stop`` event) ends an ingest between batches and rolls back the current file. A second process opening one
DuckDB file waits for it (``lock_timeout_s``), then fails naming the holder.
"""

from __future__ import annotations

import datetime as dt
import gzip
import hashlib
import io
import json
import logging
import re
import threading
import time
import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import sqlalchemy as sa
from pydantic import ValidationError

from data.validation import DataValidationError
from rlhf.credentials import url_with_env_password

from .arrow_events import check_batch, column_type_error, conflicting_ids_error, read_columns
from .read_ahead import ReadAhead
from .schema import MAX_LINE_BYTES, SIGNALS, EventRow, utc_naive

__all__ = [
    "EVENT_COLUMNS",
    "TURN_COLUMNS",
    "TURN_KEY",
    "IngestInterrupted",
    "IngestReport",
    "SignalStore",
    "StoreLockedError",
    "normalise_prompt",
    "text_hash",
]

logger = logging.getLogger(__name__)

metadata = sa.MetaData()
texts = sa.Table(
    "texts",
    metadata,
    sa.Column("hash", sa.String(64), nullable=False),
    sa.Column("text", sa.Text, nullable=False),
    sa.Column("norm_hash", sa.String(64), nullable=False),
    sa.PrimaryKeyConstraint("hash").ddl_if(dialect="postgresql"),
)
events = sa.Table(
    "events",
    metadata,
    sa.Column("event_id", sa.String, nullable=False),
    sa.Column("conversation_id", sa.String, nullable=False),
    sa.Column("turn_id", sa.Integer, nullable=False),
    sa.Column("user_id", sa.String, nullable=False),
    sa.Column("model_version", sa.String, nullable=False),
    sa.Column("intent", sa.String, nullable=True),
    sa.Column("signal", sa.String, nullable=False),
    sa.Column("ts", sa.DateTime, nullable=False),  # UTC, naive
    sa.Column("prompt_hash", sa.String(64), nullable=False),
    sa.Column("response_hash", sa.String(64), nullable=False),
    # where the event was read: ``ingests.file_id`` and its 0-based row (errors name the stored row of a conflict);
    # NULL for events stored before these columns existed
    sa.Column("source_file", sa.Integer, nullable=True),
    sa.Column("source_row", sa.BigInteger, nullable=True),
    sa.PrimaryKeyConstraint("event_id").ddl_if(dialect="postgresql"),
)
ingests = sa.Table(
    "ingests",
    metadata,
    sa.Column("file_hash", sa.String(64), primary_key=True),
    sa.Column("path", sa.String, nullable=False),
    sa.Column("rows", sa.BigInteger, nullable=False),
    sa.Column("finished_at", sa.DateTime, nullable=False),
    sa.Column("file_id", sa.Integer, nullable=True),  # events.source_file; 1, 2, ... in ingest order
)
judge_scores = sa.Table(
    "judge_scores",
    metadata,
    sa.Column("judge", sa.String(64), nullable=False),
    sa.Column("prompt_hash", sa.String(64), nullable=False),
    sa.Column("response_hash", sa.String(64), nullable=False),
    sa.Column("score", sa.Float, nullable=False),
    sa.PrimaryKeyConstraint("judge", "prompt_hash", "response_hash").ddl_if(dialect="postgresql"),
)

#: One row per turn response: (user, conversation, turn, prompt, response). A conversation belongs to its user (two
#: users reusing a conversation id are two conversations); a turn whose reply was regenerated has one row per reply,
#: each with the signals given on that reply; one (user, conversation, turn) never has two prompts (refused at
#: ingest). Kept at ingest in the same transaction as its events (so selection does not re-aggregate strings over
#: every event): ``intent`` and ``model_version`` as ``min()`` over the row's events, ``first_ts`` the earliest
#: event's time (which reply the user saw before the next turn), the prompt's normal-form hash, and one count column
#: per signal (events stored once, so counts are exact). Rebuilt from ``events`` when a store written with another
#: turns layout is opened.
turn_table = sa.Table(
    "turns",
    metadata,
    sa.Column("conversation_id", sa.String, nullable=False),
    sa.Column("turn_id", sa.Integer, nullable=False),
    sa.Column("user_id", sa.String, nullable=False),
    sa.Column("prompt_hash", sa.String(64), nullable=False),
    sa.Column("response_hash", sa.String(64), nullable=False),
    sa.Column("intent", sa.String, nullable=True),
    sa.Column("model_version", sa.String, nullable=False),
    sa.Column("prompt_norm_hash", sa.String(64), nullable=False),
    sa.Column("first_ts", sa.DateTime, nullable=False),
    *[sa.Column(s, sa.BigInteger, nullable=False) for s in SIGNALS],
    sa.PrimaryKeyConstraint(
        "user_id", "conversation_id", "turn_id", "prompt_hash", "response_hash"
    ).ddl_if(dialect="postgresql"),
)
#: What identifies a turn row (see ``turn_table``).
TURN_KEY = ["user_id", "conversation_id", "turn_id", "prompt_hash", "response_hash"]
_TURN_META = ["intent", "model_version"]

#: Columns of the ``events`` table, in order (the staged batch has the same columns).
EVENT_COLUMNS = [c.name for c in events.columns]
_INPUT_FIELDS = list(EventRow.model_fields)


def text_hash(text: str) -> str:
    """sha256 hex digest of a text's UTF-8 bytes (the content hash prompts and responses are stored under)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


_PUNCT_WS = re.compile(r"[\W_]+", re.UNICODE)


def normalise_prompt(text: str) -> str:
    """NFKC, casefold, punctuation and whitespace runs -> one space, stripped. ``"Hi,  there!" -> "hi there"``."""
    return _PUNCT_WS.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()


@dataclass(frozen=True)
class IngestReport:
    """What one file's ingest did: ``rows`` read, ``inserted`` new events, ``duplicates`` (true duplicates: the
    same event, already stored or repeated in the file, same content; an id with different content is a conflict
    and refuses the file instead), ``skipped_file`` True when the same file content was ingested before."""

    path: str
    file_hash: str
    rows: int
    inserted: int
    duplicates: int
    skipped_file: bool = False


class IngestInterrupted(Exception):
    """The ingest was asked to stop (``stop`` event set, e.g. by Ctrl-C): raised between batches; the current
    file's transaction is rolled back, files committed before it stay."""


class StoreLockedError(RuntimeError):
    """Another process holds the DuckDB file's write lock for longer than the wait allowed; names the holder."""


_LOCK_HOLDER = re.compile(r"Conflicting lock is held in (.*?) \(PID (\d+)\)")


_WRITE_LOCKS: dict[str, threading.Lock] = {}


def _write_lock(url: str) -> threading.Lock:
    """One lock per store URL in this process (PostgreSQL too: harmless, its keys already guard it)."""
    return _WRITE_LOCKS.setdefault(url, threading.Lock())


def _url(url_or_path: str | Path) -> str:
    s = str(url_or_path)
    if "://" in s:
        return s
    Path(s).parent.mkdir(parents=True, exist_ok=True)
    return f"duckdb:///{Path(s).resolve()}"


#: Where a DuckDB database file carries its magic bytes (after an 8-byte checksum; DuckDB's storage format).
_DUCKDB_MAGIC_OFFSET, _DUCKDB_MAGIC = 8, b"DUCK"


def _check_duckdb_file(url: str) -> None:
    """Refuse a DuckDB store URL whose file exists but is not a DuckDB database.

    DuckDB opens such a file (a JSONL or Parquet events file, say, given as ``--db`` by mistake) as an in-memory
    database that reads it as a table: every write then lands in memory and is gone when the process ends, while
    the ingest reports its rows as inserted. An empty file, a missing one (created) and ``:memory:`` pass.

    Raises:
        ValueError: the file, and that it is not a DuckDB database; nothing was opened or written.
    """
    if not url.startswith("duckdb:///"):
        return
    path = Path(url.removeprefix("duckdb:///").split("?", 1)[0])
    if not path.is_file() or path.stat().st_size == 0:
        return
    with path.open("rb") as f:
        head = f.read(_DUCKDB_MAGIC_OFFSET + len(_DUCKDB_MAGIC))
    if head[_DUCKDB_MAGIC_OFFSET:] != _DUCKDB_MAGIC:
        raise ValueError(f"{path}: not a DuckDB database file (DuckDB would open it as a table of an in-memory "
                         "database, and every write would be lost); give --db a new or existing .duckdb file")


class SignalStore:
    """The store behind one SQLAlchemy engine (DuckDB file or PostgreSQL URL).

    Args:
        url: ``duckdb:///path``, ``postgresql+psycopg://...``, or a plain file path (DuckDB).
        duckdb_threads, duckdb_memory_limit: DuckDB settings (e.g. ``2``, ``"2GB"``); ignored for PostgreSQL.
        duckdb_compression: DuckDB ``force_compression`` for what this store writes (e.g. ``"uncompressed"``:
            about twice the write speed, a larger file); ``None`` lets DuckDB choose per column.
        password_env: NAME of the environment variable holding the database password, read only into the engine
            (None: PostgreSQL's driver reads ``PGPASSWORD`` or ``~/.pgpass`` itself).
        lock_timeout_s: DuckDB only: how long to wait for another process that holds the file (DuckDB lets one
            process open a file for writing) before giving up.

    Raises:
        rlhf.credentials.SecretValueError: a password inside ``url`` (it would be logged and recorded; give it by
            ``password_env``), or ``password_env`` not a variable name. ValueError: ``password_env`` unset.
        StoreLockedError: DuckDB: the file stayed locked by another process for ``lock_timeout_s``; the message
            names that process (program and PID, as DuckDB reports it).
    """

    def __init__(
        self,
        url: str | Path,
        *,
        duckdb_threads: int | None = None,
        duckdb_memory_limit: str | None = None,
        duckdb_compression: str | None = None,
        password_env: str | None = None,
        lock_timeout_s: float = 60.0,
    ):
        self.url = _url(url)  # holds no password (refused below), so it may be logged and recorded
        _check_duckdb_file(self.url)
        self.engine = sa.create_engine(url_with_env_password(self.url, password_env))
        self.dialect = self.engine.dialect.name  # "duckdb" or "postgresql"
        if self.dialect not in ("duckdb", "postgresql"):
            raise ValueError(f"{self.url}: unsupported database {self.dialect!r}; use duckdb:/// or postgresql://")
        if (duckdb_threads or duckdb_memory_limit or duckdb_compression) and self.dialect == "duckdb":

            @sa.event.listens_for(self.engine, "connect")
            def _settings(dbapi_conn, _record):
                if duckdb_threads:
                    dbapi_conn.execute(f"SET threads TO {int(duckdb_threads)}")
                if duckdb_memory_limit:
                    dbapi_conn.execute(f"SET memory_limit = '{duckdb_memory_limit}'")
                if duckdb_compression:
                    dbapi_conn.execute(f"SET force_compression = '{duckdb_compression}'")

        if self.dialect == "duckdb":
            self._wait_for_file_lock(lock_timeout_s)
        insp = sa.inspect(self.engine)
        turn_cols = self._columns("turns") if insp.has_table("turns") else None
        if turn_cols is not None and turn_cols != TURN_COLUMNS:  # another layout: rebuilt from the events
            with self.engine.begin() as conn:
                conn.exec_driver_sql("DROP TABLE turns")
        if insp.has_table("events"):
            self._add_missing_columns(insp)
        metadata.create_all(self.engine)
        if turn_cols != TURN_COLUMNS:
            self._rebuild_turns()
        self._prompts = _PromptMemo()  # prompt -> sha256 and normal-form hash, reused across batches and files

    def close(self) -> None:
        self.engine.dispose()

    def _wait_for_file_lock(self, timeout_s: float) -> None:
        """Open the DuckDB file, retrying while another process holds its lock, for up to ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with self.engine.connect():
                    return
            except sa.exc.DBAPIError as err:
                match = _LOCK_HOLDER.search(str(err.orig))
                if match is None:
                    raise
                if time.monotonic() >= deadline:
                    self.engine.dispose()
                    path = self.url.removeprefix("duckdb:///")
                    raise StoreLockedError(
                        f"{path}: locked by another process ({match.group(1)}, PID {match.group(2)}) for "
                        f"{timeout_s:g} s of waiting; one process writes a DuckDB store at a time: retry when it "
                        "has finished (or use PostgreSQL for concurrent writers)"
                    ) from None
                time.sleep(min(0.2, max(deadline - time.monotonic(), 0.0)))

    def _columns(self, table: str) -> list[str]:
        """A stored table's column names, in order (SQLAlchemy's inspector cannot read them on DuckDB)."""
        with self.engine.connect() as conn:
            return list(conn.exec_driver_sql(f"SELECT * FROM {table} LIMIT 0").keys())

    def _add_missing_columns(self, insp) -> None:
        """Columns added since a store was written (``events.source_file/source_row``, ``ingests.file_id``):
        added as NULL (errors about those old events then name the event id only)."""
        with self.engine.begin() as conn:
            for table in (events, ingests):
                have = set(self._columns(table.name))
                for col in table.columns:
                    if col.name not in have:
                        kind = col.type.compile(dialect=self.engine.dialect)
                        conn.exec_driver_sql(f"ALTER TABLE {table.name} ADD COLUMN {col.name} {kind}")

    def _rebuild_turns(self) -> None:
        """Fill the ``turns`` table from ``events`` (a store written before that table, or its present layout,
        existed; a no-op on an empty store). One GROUP BY over every event, once."""
        with _write_lock(self.url), self.engine.begin() as conn:
            if conn.execute(sa.select(events.c.event_id).limit(1)).first() is None:
                return
            conn.exec_driver_sql("DELETE FROM turns")
            _insert_turns_from(conn, "events", self.dialect)

    # ---- ingestion -------------------------------------------------------------------------------------------------
    def ingest(
        self, path: str | Path, *, chunk_rows: int | None = None, progress=None, stop: threading.Event | None = None
    ) -> IngestReport:
        """Ingest one JSONL (``.jsonl``, ``.ndjson``) or Parquet file of :class:`EventRow` rows, atomically.

        Args:
            path: the file.
            chunk_rows: rows validated and loaded per batch (memory stays flat; the transaction spans the file).
                Default 1,000,000 for Parquet (each batch costs one scan of the stored event ids), 200,000 for JSONL
                (rows pass through Python objects).
            progress: optional callable ``(path, chunk_index, rows_so_far)`` called after each batch is loaded.
            stop: optional event, checked before each batch and before the commit: once set, the ingest stops
                there (:class:`IngestInterrupted`; the file's transaction is rolled back).

        Returns:
            :class:`IngestReport`.

        Raises:
            data.validation.DataValidationError: a bad row, naming file, row (0-based), field and reason; the
                transaction is rolled back, so nothing of the file is stored. Also: an ``event_id`` stored (or read
                earlier) with different content, or a (user, conversation, turn) with two prompts, naming both rows.
            IngestInterrupted: ``stop`` was set.
            ValueError: an unsupported file type.
        """
        path = Path(path)
        return self._ingest(
            path, lambda: ReadAhead(lambda: _batches(path, _chunk_rows(path, chunk_rows))), progress, stop=stop
        )

    def ingest_files(
        self,
        paths: Sequence[str | Path],
        *,
        chunk_rows: int | None = None,
        progress=None,
        stop: threading.Event | None = None,
    ) -> Iterator[IngestReport]:
        """:meth:`ingest` each file in turn (each in its own transaction: the same reports, rows and errors), yielding
        each file's report once it is committed. The next file's first batch is read and validated while the
        current file's last batch is loaded (one batch ahead in all, as inside a file). Stops at the first error;
        the files before it stay committed.

        Raises:
            as :meth:`ingest`; FileChangedError: a file was rewritten between being read (ahead) and hashed;
            TypeError: ``paths`` is one path, not a list.
        """
        if isinstance(paths, (str, Path)):
            raise TypeError(f"ingest_files takes a list of paths, got one path {str(paths)!r}: use ingest() or [path]")
        paths = [Path(p) for p in paths]
        readers: dict[int, ReadAhead] = {}
        opened: dict[int, tuple | None] = {}  # file k's signature when its reader opened it (maybe ahead of time)
        lock = threading.Lock()
        closed = False

        def reader(k: int) -> ReadAhead | None:
            # called by the ingest of file k, or by file k-1's reader once it has read everything
            with lock:
                if not closed and k < len(paths) and k not in readers:
                    p = paths[k]

                    def open_file(p=p, k=k):  # in the reader thread, before the first row is read
                        opened[k] = file_signature(p) if p.is_file() else None
                        return _batches(p, _chunk_rows(p, chunk_rows))

                    readers[k] = ReadAhead(open_file, on_done=lambda: reader(k + 1))
                return readers.get(k)

        try:
            for k, path in enumerate(paths):
                if stop is not None and stop.is_set():
                    raise IngestInterrupted(f"{path}: interrupted before this file; nothing of it was stored")
                report = self._ingest(path, lambda: reader(k), progress,  # noqa: B023 (called before k changes)
                                      opened=lambda: opened.get(k), stop=stop)  # noqa: B023
                with lock:
                    done = readers.pop(k, None)
                if done is not None:  # closed outside the lock: its thread may be starting the next reader
                    done.close()
                yield report
        finally:
            with lock:
                closed = True
                rest = list(readers.values())
                readers.clear()
            for r in rest:
                r.close()

    def _ingest(self, path: Path, open_batches, progress, opened=None, stop=None) -> IngestReport:
        """One file's transaction; ``open_batches()``: its validated batches (a :class:`ReadAhead`), opened only
        when the file was not ingested before; ``opened()``: the file's :func:`file_signature` when its reader
        opened it (it may have read ahead, before this hash), or None.

        Raises:
            FileChangedError: the file's signature differs between reading and hashing (rolled back).
        """
        signature = file_signature(path) if path.is_file() else None  # before the hash: a later change shows
        fhash = _file_hash(path)
        # DuckDB keeps no unique index on events: its anti-joins are the guarantee, so writes to one file are
        # serialised (other processes are kept out by DuckDB's own file lock; this lock covers threads here).
        with _write_lock(self.url), self.engine.begin() as conn:
            if self.dialect == "postgresql":
                # one writer at a time (readers unaffected), as DuckDB's file lock does: the per-turn counts are
                # added from the rows this transaction's anti-join found new, which a concurrent writer could race
                conn.exec_driver_sql("LOCK TABLE events IN SHARE ROW EXCLUSIVE MODE")
            if conn.execute(sa.select(ingests.c.rows).where(ingests.c.file_hash == fhash)).first() is not None:
                logger.info("%s: already ingested (same content), skipped", path)
                return IngestReport(str(path), fhash, 0, 0, 0, skipped_file=True)
            before = conn.execute(sa.select(sa.func.count()).select_from(events)).scalar_one()
            file_id = conn.execute(sa.select(sa.func.coalesce(sa.func.max(ingests.c.file_id), 0))).scalar_one() + 1
            n = 0

            def interrupted() -> None:
                if stop is not None and stop.is_set():
                    raise IngestInterrupted(
                        f"{path}: interrupted after {n} rows; this file was rolled back (nothing of it stored)"
                    )

            # the next batch is read and validated while this one is loaded (same batches, same errors, in order)
            with open_batches() as batches:
                for i, batch in enumerate(batches):
                    interrupted()
                    self._load(conn, batch, file=path, base=n, file_id=file_id)
                    n += batch.num_rows
                    if progress:
                        progress(path, i, n)
            interrupted()
            seen = {signature, file_signature(path) if path.is_file() else None}
            if opened is not None and opened() is not None:
                seen.add(opened())
            if len(seen) > 1:  # rows read from one content, hash taken of another: store neither
                raise FileChangedError(
                    f"{path}: the file changed while it was being ingested (inode, size or modification time differ "
                    "between reading and hashing); nothing of it was stored: ingest it again once it is complete"
                )
            after = conn.execute(sa.select(sa.func.count()).select_from(events)).scalar_one()
            conn.execute(
                ingests.insert().values(
                    file_hash=fhash,
                    path=str(path),
                    rows=n,
                    finished_at=dt.datetime.now(dt.UTC).replace(tzinfo=None),
                    file_id=file_id,
                )
            )
        report = IngestReport(str(path), fhash, n, after - before, n - (after - before))
        if n == 0:
            logger.warning("%s: empty file, 0 events ingested", path)
        logger.info("%s: %d rows, %d new events, %d duplicates", path, n, report.inserted, report.duplicates)
        return report

    def _stage(self, conn: sa.Connection, name: str, table: pa.Table) -> None:
        """Make ``table`` readable as ``name`` inside ``conn``'s transaction: DuckDB scans the Arrow table in place;
        PostgreSQL gets a temporary table filled by ``COPY ... FROM STDIN`` (CSV written by pyarrow)."""
        raw = conn.connection.driver_connection
        if self.dialect == "duckdb":
            raw.register(name, table)
            return
        import pyarrow.csv as pacsv

        cols = ", ".join(f"{c} {_pg_type(t)}" for c, t in zip(table.column_names, table.schema.types))
        conn.exec_driver_sql(f"CREATE TEMP TABLE IF NOT EXISTS {name} ({cols})")
        conn.exec_driver_sql(f"TRUNCATE {name}")
        buf = io.BytesIO()
        pacsv.write_csv(table, buf)
        with raw.cursor().copy(
            f"COPY {name} ({', '.join(table.column_names)}) FROM STDIN (FORMAT csv, HEADER true)"
        ) as cp:
            cp.write(buf.getvalue())
        conn.exec_driver_sql(f"ANALYZE {name}")  # temporary tables get no autovacuum statistics: plan with real ones

    def _unstage(self, conn: sa.Connection, *names: str) -> None:
        if self.dialect == "duckdb":
            for name in names:
                conn.connection.driver_connection.unregister(name)

    def _sha256(self, column: str) -> str:
        """SQL for the sha256 hex digest of a text column's UTF-8 bytes (same value as :func:`text_hash`)."""
        if self.dialect == "duckdb":
            return f"sha256({column})"
        return f"encode(sha256(convert_to({column}, 'UTF8')), 'hex')"

    @property
    def _or_nothing(self) -> str:
        """PostgreSQL keeps its primary keys, so a concurrent writer's row is skipped there, not an error; DuckDB
        has no key on the bulk tables (one writer per file; the anti-joins are the whole guarantee)."""
        return " ON CONFLICT DO NOTHING" if self.dialect == "postgresql" else ""

    def _load(self, conn: sa.Connection, batch: pa.Table, *, file: Path, base: int, file_id: int) -> None:
        """Stage one validated batch and insert it (texts once, events once) inside ``conn``'s transaction.

        Bulk design (the same statements on both databases, but for the hash function): first the new events are
        found by one GROUP BY + join on the ids (:meth:`_new_events`, which also refuses one id with two different
        contents in the batch; an id repeated inside the batch keeps its first row; earlier batches of the same
        file are visible in the transaction) and only those rows go on; prompts (few distinct values) are hashed
        here, with their normal-form hash; responses are made distinct in Arrow (dictionary encoding) and hashed
        once per distinct text (by DuckDB's ``sha256``, or hashlib for PostgreSQL), the per-row hash taken from
        the distinct ones; texts are inserted with an anti-join against ``texts`` (written ``LEFT JOIN ... IS
        NULL``: DuckDB then builds its hash table on the batch, not on every stored text); events are inserted
        straight from the staged batch; the batch's turns are aggregated from it and merged into ``turns``
        (:func:`_merge_turns`, which refuses a second prompt for one (user, conversation, turn)). No unique index
        is maintained on DuckDB (its ART index on a string key was the ingest's bottleneck). Each event keeps its
        file (``file_id``) and 0-based row, so a later conflict names both rows.
        """
        batch = batch.append_column("_row", pa.array(np.arange(base, base + batch.num_rows, dtype=np.int64)))
        batch = self._new_events(conn, batch, file=file, base=base, file_id=file_id)
        if not batch.num_rows:
            return
        prompts, responses, event_tab = _split_texts(batch, self._prompts, lambda t: self._text_hashes(conn, t))
        event_tab = event_tab.append_column(
            "source_file", pa.array(np.full(batch.num_rows, file_id, dtype=np.int32))
        ).append_column("source_row", batch["_row"])
        self._stage(conn, "staging_prompts", prompts)
        self._stage(conn, "staging_responses", responses)
        self._stage(conn, "staging_events", event_tab)
        x = self._or_nothing
        conn.exec_driver_sql(
            "INSERT INTO texts (hash, text, norm_hash) SELECT s.hash, s.text, s.norm_hash FROM staging_prompts s "
            f"LEFT JOIN texts t ON t.hash = s.hash WHERE t.hash IS NULL{x}"
        )
        conn.exec_driver_sql(
            "INSERT INTO texts (hash, text, norm_hash) SELECT s.hash, s.text, '' FROM staging_responses s "
            f"LEFT JOIN texts t ON t.hash = s.hash WHERE t.hash IS NULL{x}"
        )
        cols = ", ".join(EVENT_COLUMNS)
        conn.exec_driver_sql(f"INSERT INTO events ({cols}) SELECT {cols} FROM staging_events{x}")

        def two_prompts(user_id, conversation_id, turn_id):
            raise self._prompt_conflict(conn, user_id, conversation_id, turn_id, file=file, file_id=file_id)

        _merge_turns(conn, "staging_events", self.dialect, on_conflict=two_prompts)
        self._unstage(conn, "staging_prompts", "staging_responses", "staging_events")

    def _where(self, conn: sa.Connection, source_file, source_row, event_id, *, file: Path, file_id: int) -> str:
        """A stored event's place for an error: ``row 5 of this file``, ``row 5 of a.jsonl (ingested earlier)``."""
        if source_file is None or source_row is None:
            return f"event {event_id!r} (stored before rows were recorded)"
        if source_file == file_id:
            return f"row {source_row} of this file"
        found = conn.execute(sa.select(ingests.c.path).where(ingests.c.file_id == source_file)).all()  # all: DuckDB
        path = found[0][0] if found else f"file #{source_file}"  # wants every result read before the next query
        return f"row {source_row} of {path} (ingested earlier)"

    def _prompt_conflict(self, conn, user_id, conversation_id, turn_id, *, file: Path, file_id: int):
        """The error for one (user, conversation, turn) with two prompts: the earliest row (stored or in this file)
        against the earliest row with another prompt (a row of this batch: earlier ones were checked)."""
        rows = conn.execute(
            sa.select(events.c.source_file, events.c.source_row, events.c.event_id, events.c.prompt_hash)
            .where(events.c.user_id == user_id, events.c.conversation_id == conversation_id,
                   events.c.turn_id == turn_id)
        ).all()
        rows.sort(key=lambda r: (r[0] is not None, r[0] or 0, r[1] if r[1] is not None else -1))
        first = rows[0]
        later = next(r for r in rows if r[3] != first[3])
        where = self._where(conn, first[0], first[1], first[2], file=file, file_id=file_id)
        return DataValidationError(
            f"user {user_id!r} conversation {conversation_id!r} turn {turn_id}: the prompt differs from the one at "
            f"{where} (one turn of one user's conversation has one prompt; a regenerated reply keeps its prompt): "
            "fix the conversation or turn ids",
            file=str(file),
            row=later[1],
            field="prompt",
        )

    def _text_hashes(self, conn: sa.Connection, values: pa.Array) -> pa.Array:
        """sha256 hex digest of each string of ``values`` (distinct texts), in order (same value as
        :func:`text_hash`): DuckDB hashes them in place (its threads); for PostgreSQL hashlib does it here (sending
        the texts to the server and back would cost more)."""
        if self.dialect != "duckdb":
            return pa.array([text_hash(s) for s in values.to_pylist()], pa.string())
        raw = conn.connection.driver_connection
        raw.register("staging_hash_in", pa.table({"i": pa.array(np.arange(len(values), dtype=np.int64)), "t": values}))
        out = raw.sql("SELECT i, sha256(t) AS h FROM staging_hash_in").to_arrow_table()
        raw.unregister("staging_hash_in")
        i = out["i"].to_numpy()
        h = out["h"].combine_chunks()
        if len(i) and not (np.diff(i) > 0).all():  # DuckDB keeps insertion order by default; do not rely on it
            h = h.take(pa.array(np.argsort(i, kind="stable")))
        return h

    def _new_events(self, conn: sa.Connection, batch: pa.Table, *, file: Path, base: int, file_id: int) -> pa.Table:
        """The rows of ``batch`` whose ``event_id`` is not stored yet, each id once (its first row), in file order:
        one GROUP BY on the ids alone, LEFT JOINed with the stored ids. Earlier batches of the same file are
        visible in the transaction and writers are serialised, so what is inserted next is exactly this.

        A repeated id must be the same event: an id already stored (earlier batch, earlier file, earlier ingest)
        is compared field by field with the stored row (:meth:`_stored_conflict`, run only when the batch holds
        stored ids), an id repeated inside the batch with its first row
        (:func:`flywheel.arrow_events.conflicting_ids_error`). The earliest conflicting row of the batch is
        reported, with the row it conflicts with: the same pair whatever the batch boundaries.

        Raises:
            data.validation.DataValidationError: one ``event_id`` with two different contents, naming both rows.
        """
        keys = pa.table({"event_id": batch["event_id"], "i": pa.array(np.arange(batch.num_rows, dtype=np.int64))})
        self._stage(conn, "staging_keys", keys)
        # ids are unique in events (anti-joined on insert; PostgreSQL's primary key), so the LEFT JOIN keeps one row
        # per batch id; rows already stored are fetched only when their id repeats in the batch
        sql = (
            "SELECT g.i, g.n, s.event_id IS NULL AS new FROM "
            "(SELECT event_id, min(i) AS i, count(*) AS n FROM staging_keys GROUP BY event_id) g "
            "LEFT JOIN events s ON s.event_id = g.event_id WHERE s.event_id IS NULL OR g.n > 1"
        )
        if self.dialect == "duckdb":
            got = conn.connection.driver_connection.sql(sql).fetchnumpy()
            idx, reps, new = (np.asarray(got[c]) for c in ("i", "n", "new"))
        else:
            rows = conn.exec_driver_sql(sql).fetchall()
            idx = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
            reps = np.fromiter((r[1] for r in rows), dtype=np.int64, count=len(rows))
            new = np.fromiter((bool(r[2]) for r in rows), dtype=bool, count=len(rows))
        new = new.astype(bool)
        # ids in the batch; those not found new are stored already
        n_distinct = pc.count_distinct(batch["event_id"]).as_py() if (reps > 1).any() else batch.num_rows
        errors = []
        stored_ids = None
        if int(new.sum()) < n_distinct:  # some ids are stored already: each must be the stored event
            err, stored_ids = self._stored_conflict(conn, batch, file=file, file_id=file_id)
            if err is not None:
                errors.append(err)
        self._unstage(conn, "staging_keys")
        if (reps > 1).any():
            err = conflicting_ids_error(batch.drop_columns(["_row"]), file=file, base=base, skip=stored_ids)
            if err is not None:
                errors.append(err)
        if errors:
            raise min(errors, key=lambda e: e.row)
        idx = idx[new]
        if len(idx) == batch.num_rows:
            return batch
        return batch.take(pa.array(np.sort(np.asarray(idx, dtype=np.int64))))

    def _stored_conflict(self, conn, batch: pa.Table, *, file: Path, file_id: int):
        """``(error or None, the batch's stored ids)``: the earliest row of ``batch`` whose ``event_id`` is stored
        with other content (compared on every field; texts by their sha256), naming the stored row."""
        cols = ["conversation_id", "turn_id", "user_id", "model_version", "intent", "signal", "ts",
                "prompt_hash", "response_hash"]
        sql = (
            f"SELECT k.i, {', '.join('s.' + c for c in cols)}, s.source_file, s.source_row, s.event_id "
            "FROM staging_keys k JOIN events s ON s.event_id = k.event_id ORDER BY k.i"
        )
        result = conn.exec_driver_sql(sql)
        names = list(result.keys())
        rows = result.fetchall()
        types = {"i": pa.int64(), "turn_id": pa.int64(), "ts": pa.timestamp("us"), "source_file": pa.int64(),
                 "source_row": pa.int64()}
        stored = pa.table({n: pa.array([r[j] for r in rows], types.get(n, pa.string())) for j, n in enumerate(names)})
        ids = pc.unique(stored["event_id"])
        mine = batch.take(stored["i"])
        here = {
            "conversation_id": mine["conversation_id"], "turn_id": mine["turn_id"], "user_id": mine["user_id"],
            "model_version": mine["model_version"], "intent": mine["intent"], "signal": mine["signal"],
            "ts": mine["timestamp"],
            "prompt_hash": pa.array([text_hash(t) for t in mine["prompt"].to_pylist()], pa.string()),
            "response_hash": pa.array([text_hash(t) for t in mine["response"].to_pylist()], pa.string()),
        }
        differs = None
        first_field = {}
        for c in cols:
            a, b = here[c], stored[c]
            if c == "turn_id":
                a = a.cast(pa.int64())
            same = pc.or_kleene(pc.fill_null(pc.equal(a, b), False), pc.and_(pc.is_null(a), pc.is_null(b)))
            d = pc.invert(same)
            first_field[c] = d
            differs = d if differs is None else pc.or_(differs, d)
        if differs is None or not pc.any(differs).as_py():
            return None, ids
        j = int(pc.index(differs, True).as_py())
        field = next(c for c in cols if first_field[c][j].as_py())
        r = rows[j]
        where = self._where(conn, r[-3], r[-2], r[-1], file=file, file_id=file_id)
        shown = {"prompt_hash": "prompt", "response_hash": "response", "ts": "timestamp"}.get(field, field)
        if field in ("prompt_hash", "response_hash"):
            detail = f"the {shown} text differs"  # texts are not written into error messages
        else:
            detail = f"{shown} {here[field][j].as_py()!r} here, {stored[field][j].as_py()!r} there"
        return DataValidationError(
            f"event_id {r[-1]!r} conflicts with {where}: {detail} (one id, two different events; fix the ids or "
            "drop one row)",
            file=str(file),
            row=int(mine["_row"][j].as_py()),
            field=shown,
        ), ids

    # ---- reads -----------------------------------------------------------------------------------------------------
    def counts(self) -> dict[str, int]:
        """Row counts: ``events``, ``texts``, ``turns`` (distinct conversation/turn), ``files``, and per signal."""
        with self.engine.connect() as conn:
            out = {
                "events": conn.execute(sa.select(sa.func.count()).select_from(events)).scalar_one(),
                "texts": conn.execute(sa.select(sa.func.count()).select_from(texts)).scalar_one(),
                "files": conn.execute(sa.select(sa.func.count()).select_from(ingests)).scalar_one(),
                "turns": conn.execute(sa.select(sa.func.count()).select_from(turn_table)).scalar_one(),
            }
            rows = conn.execute(sa.select(events.c.signal, sa.func.count()).group_by(events.c.signal)).all()
        out.update({f"signal_{s}": 0 for s in SIGNALS})
        out.update({f"signal_{s}": int(c) for s, c in rows})
        return {k: int(v) for k, v in out.items()}

    def turns_query(
        self, judge: str | None = None, columns: Sequence[str] | None = None, *, ordered: bool = True
    ) -> sa.Select:
        """One row per turn response (user, conversation, turn, reply): ids, intent, model version, text hashes, the normalised-prompt
        hash, one count column per signal, and (with ``judge``) that judge's cached score (NULL where not scored);
        ordered by conversation id, turn id, user id, response hash.

        Reads the ``turns`` table the ingest keeps (no aggregation over events). ``columns``: only these (plus
        ``judge_score`` with a judge); ``ordered=False`` drops the ORDER BY (conversation id, turn id)."""
        t = turn_table
        cols = [t.c[c] for c in (columns or TURN_COLUMNS)]
        source = t
        if judge is not None:
            js = judge_scores.alias("js")
            cols.append(js.c.score.label("judge_score"))
            source = source.outerjoin(
                js,
                sa.and_(
                    js.c.judge == judge,
                    js.c.prompt_hash == t.c.prompt_hash,
                    js.c.response_hash == t.c.response_hash,
                ),
            )
        q = sa.select(*cols).select_from(source)
        return q.order_by(t.c.conversation_id, t.c.turn_id, t.c.user_id, t.c.response_hash) if ordered else q

    def fetch_arrow(self, query: sa.Select) -> pa.Table:
        """Run a query and return an Arrow table (DuckDB: zero-copy ``.arrow()``; PostgreSQL: a cursor fetch)."""
        with self.engine.connect() as conn:
            if self.dialect == "duckdb":
                sql = str(query.compile(dialect=self.engine.dialect, compile_kwargs={"literal_binds": True}))
                return conn.connection.driver_connection.sql(sql).to_arrow_table()
            result = conn.execute(query)
            names = list(result.keys())
            rows = result.fetchall()
            return pa.table({n: [r[i] for r in rows] for i, n in enumerate(names)})

    def turns(
        self, judge: str | None = None, columns: Sequence[str] | None = None, *, ordered: bool = True
    ) -> pa.Table:
        """:meth:`turns_query` as an Arrow table."""
        return self.fetch_arrow(self.turns_query(judge, columns, ordered=ordered))

    def turns_frame(self, judge: str | None = None, columns: Sequence[str] | None = None, *, ordered: bool = True):
        """:meth:`turns_query` as a pandas DataFrame, converted column by column while the Arrow table is released
        (``self_destruct``), so millions of turns are not held twice."""
        return self.turns(judge, columns, ordered=ordered).to_pandas(self_destruct=True, split_blocks=True)

    def turn_details(self, keys: dict[str, Sequence]) -> pa.Table:
        """Every ``turns`` column for the given turn responses (``keys``: equal-length columns ``user_id``,
        ``conversation_id``, ``turn_id``, ``response_hash``; unknown ones are absent; order not kept). One staged key
        table and a join: for the few thousand turns a selection picks."""
        key = ["user_id", "conversation_id", "turn_id", "response_hash"]
        table = pa.table(
            {c: pa.array(list(keys[c]), pa.int64() if c == "turn_id" else pa.string()) for c in key}
        )
        cols = ", ".join(f"t.{c}" for c in TURN_COLUMNS)
        on = " AND ".join(f"k.{c} = t.{c}" for c in key)
        sql = f"SELECT {cols} FROM turns t JOIN staging_turn_keys k ON {on}"
        with self.engine.begin() as conn:
            self._stage(conn, "staging_turn_keys", table)
            if self.dialect == "duckdb":
                out = conn.connection.driver_connection.sql(sql).to_arrow_table()
            else:
                result = conn.exec_driver_sql(sql)
                rows = result.fetchall()
                out = pa.table({n: [r[i] for r in rows] for i, n in enumerate(result.keys())})
            self._unstage(conn, "staging_turn_keys")
        return out

    def texts_for(self, hashes: Sequence[str]) -> dict[str, str]:
        """``{hash: text}`` for the given content hashes (unknown hashes are absent)."""
        out: dict[str, str] = {}
        hashes = list(dict.fromkeys(hashes))
        with self.engine.connect() as conn:
            for start in range(0, len(hashes), 5000):
                chunk = hashes[start : start + 5000]
                out.update(conn.execute(sa.select(texts.c.hash, texts.c.text).where(texts.c.hash.in_(chunk))).all())
        return out

    def conversation(self, user_id: str, conversation_id: str) -> list[dict]:
        """Every turn response of one user's conversation, by turn then first time: ``[{"turn_id", "prompt",
        "response", "response_hash", "intent", "first_ts", "continued"}, ...]`` (a regenerated turn has one entry
        per reply)."""
        t, p, r = turn_table, texts.alias("p"), texts.alias("r")
        q = (
            sa.select(t.c.turn_id, p.c.text, r.c.text, t.c.response_hash, t.c.intent, t.c.first_ts, t.c.continued)
            .select_from(t.join(p, p.c.hash == t.c.prompt_hash).join(r, r.c.hash == t.c.response_hash))
            .where(t.c.user_id == user_id, t.c.conversation_id == conversation_id)
            .order_by(t.c.turn_id, t.c.first_ts, t.c.response_hash)
        )
        keys = ("turn_id", "prompt", "response", "response_hash", "intent", "first_ts", "continued")
        with self.engine.connect() as conn:
            return [dict(zip(keys, row)) for row in conn.execute(q).all()]

    def history(self, user_id: str, conversation_id: str, turn_id: int, response_hash: str) -> list[dict]:
        """The conversation as the user saw it when they got the reply ``response_hash`` at ``turn_id``:
        ``[{"turn_id", "prompt", "response"}, ...]`` for turns ``0..turn_id``, the last one that reply; ``[]`` when
        that turn response is not stored. Turns the user never sent (gaps) are absent.

        An earlier turn whose reply was regenerated shows the reply the user went on from: among its replies
        (those with a ``continued`` signal, when any has one), the latest whose first event is not after the
        selected turn's first event (the next turns were asked after it); when none is (clocks disagree), the
        earliest.
        """
        rows = self.conversation(user_id, conversation_id)
        this = next((x for x in rows if x["turn_id"] == turn_id and x["response_hash"] == response_hash), None)
        if this is None:
            return []
        start = min(x["first_ts"] for x in rows if x["turn_id"] == turn_id)
        out = []
        for j in sorted({x["turn_id"] for x in rows if x["turn_id"] < turn_id}):
            replies = [x for x in rows if x["turn_id"] == j]
            replies = [x for x in replies if x["continued"]] or replies
            before = [x for x in replies if x["first_ts"] <= start]
            seen = max(before, key=lambda x: (x["first_ts"], x["response_hash"])) if before else replies[0]
            out.append({"turn_id": j, "prompt": seen["prompt"], "response": seen["response"]})
        out.append({"turn_id": turn_id, "prompt": this["prompt"], "response": this["response"]})
        return out

    # ---- judge cache -----------------------------------------------------------------------------------------------
    def put_scores(self, judge: str, scores: dict[tuple[str, str], float] | pa.Table) -> None:
        """Store judge scores in one transaction (bulk staged like events; a score already stored is kept).

        ``scores``: ``{(prompt_hash, response_hash): score}``, or an Arrow table with those three columns (keys
        unique; for millions of turns without Python objects)."""
        if isinstance(scores, pa.Table):
            tab = scores.select(["prompt_hash", "response_hash", "score"])
            tab = tab.add_column(0, "judge", pa.array([judge], pa.string()).take(np.zeros(tab.num_rows, np.int64)))
        else:
            tab = pa.table(
                {
                    "judge": pa.array([judge] * len(scores), pa.string()),
                    "prompt_hash": pa.array([k[0] for k in scores], pa.string()),
                    "response_hash": pa.array([k[1] for k in scores], pa.string()),
                    "score": pa.array(np.asarray(list(scores.values()), dtype=np.float64)),
                }
            )
        if not tab.num_rows:
            return
        with _write_lock(self.url), self.engine.begin() as conn:
            self._stage(conn, "staging_scores", tab)
            conn.exec_driver_sql(
                "INSERT INTO judge_scores (judge, prompt_hash, response_hash, score) "
                "SELECT s.judge, s.prompt_hash, s.response_hash, s.score FROM staging_scores s WHERE NOT EXISTS ("
                "SELECT 1 FROM judge_scores j WHERE j.judge = s.judge AND j.prompt_hash = s.prompt_hash "
                f"AND j.response_hash = s.response_hash){self._or_nothing}"
            )
            self._unstage(conn, "staging_scores")


# ---- the per-turn table -------------------------------------------------------------------------------------------
def _collate(dialect: str) -> str:
    """Strings compare by bytes (code points) on both databases: DuckDB's default; PostgreSQL's ``"C"`` collation."""
    return ' COLLATE "C"' if dialect == "postgresql" else ""


def _turn_aggregate(source: str, dialect: str) -> str:
    """SQL: one row per turn response (:data:`TURN_KEY`) of the events in ``source``: ``min()`` of ``intent`` and
    ``model_version`` (byte order; never of a hash column: the texts are the key), the earliest event time, and a
    BIGINT count per signal (``count(*) FILTER``: sum(case) is a HUGEINT on DuckDB)."""
    coll = _collate(dialect)
    meta = ", ".join(f"min({c}{coll}) AS {c}" for c in _TURN_META)
    sig = ", ".join(f"count(*) FILTER (WHERE signal = '{s}') AS {s}" for s in SIGNALS)
    key = ", ".join(TURN_KEY)
    return f"SELECT {key}, {meta}, min(ts) AS first_ts, {sig} FROM {source} GROUP BY {key}"


#: Columns of the ``turns`` table, in order.
TURN_COLUMNS = [c.name for c in turn_table.columns]
_AGG_COLUMNS = [c for c in TURN_COLUMNS if c != "prompt_norm_hash"]


def _insert_turns_from(conn: sa.Connection, source: str, dialect: str) -> None:
    """Insert the turns of ``source``'s events (none of them in ``turns`` yet), the prompt's normal-form hash read
    from ``texts`` (a prompt whose text was first stored as a response has none there: it keeps its own hash)."""
    cols = [f"a.{c}" if c != "prompt_norm_hash" else "coalesce(nullif(p.norm_hash, ''), a.prompt_hash)"
            for c in TURN_COLUMNS]
    conn.exec_driver_sql(
        f"INSERT INTO turns ({', '.join(TURN_COLUMNS)}) SELECT {', '.join(cols)} "
        f"FROM ({_turn_aggregate(source, dialect)}) a LEFT JOIN texts p ON p.hash = a.prompt_hash"
    )


def _merge_turns(conn: sa.Connection, new: str, dialect: str, on_conflict=None) -> None:
    """Fold the batch's new events (the table or subquery ``new``) into ``turns``: a turn response already stored
    gets its counts added, its metadata lowered to the minimum and its first time to the earliest (so the table
    equals a GROUP BY over all events, whatever the order events arrive in); a new one is inserted (a new reply to
    a stored turn is a regeneration: its own row). Runs inside the ingest transaction.

    ``on_conflict(user_id, conversation_id, turn_id)``: called (and expected to raise) when one of the batch's turns
    has a prompt other than the stored one or another in the batch (a (user, conversation, turn) has one prompt)."""
    conn.exec_driver_sql("DROP TABLE IF EXISTS staging_turns")
    on_key = " AND ".join(f"t.{c} = a.{c}" for c in TURN_KEY)
    # ``stored``: the turn response is already in ``turns`` (one LEFT JOIN, built on the batch's side; rows are
    # unique by TURN_KEY), so the UPDATE touches only those and the INSERT needs no second anti-join
    conn.exec_driver_sql(
        "CREATE TEMP TABLE staging_turns AS SELECT a.*, p.norm_hash AS prompt_norm_hash, "
        "t.conversation_id IS NOT NULL AS stored FROM "
        f"({_turn_aggregate(new, dialect)}) a JOIN staging_prompts p ON p.hash = a.prompt_hash "
        f"LEFT JOIN turns t ON {on_key}"
    )
    n_stored, n_new = conn.exec_driver_sql(
        "SELECT count(*) FILTER (WHERE stored), count(*) FILTER (WHERE NOT stored) FROM staging_turns"
    ).one()
    if n_new:
        # one prompt per (user, conversation, turn): inside the batch, and against the stored turns (only a new
        # row can bring a second prompt; a stored row matched on its prompt already)
        clash = conn.exec_driver_sql(
            "SELECT user_id, conversation_id, turn_id FROM staging_turns GROUP BY user_id, conversation_id, turn_id "
            "HAVING count(DISTINCT prompt_hash) > 1 LIMIT 1"
        ).all() or conn.exec_driver_sql(
            "SELECT d.user_id, d.conversation_id, d.turn_id FROM staging_turns d JOIN turns t ON "
            "t.user_id = d.user_id AND t.conversation_id = d.conversation_id AND t.turn_id = d.turn_id "
            "WHERE NOT d.stored AND t.prompt_hash <> d.prompt_hash LIMIT 1"
        ).all()
        clash = clash[0] if clash else None
        if clash is not None and on_conflict is not None:
            on_conflict(*clash)
    coll = _collate(dialect)
    on = " AND ".join(f"turns.{c} = d.{c}" for c in TURN_KEY)

    def lower(c: str) -> str:  # min(old, new), NULL (unknown intent) only when both are
        return (
            f"CASE WHEN turns.{c} IS NULL OR d.{c}{coll} < turns.{c}{coll} THEN coalesce(d.{c}, turns.{c}) "
            f"ELSE turns.{c} END"
        )

    sets = [f"{c} = {lower(c)}" for c in _TURN_META]
    sets.append("first_ts = CASE WHEN d.first_ts < turns.first_ts THEN d.first_ts ELSE turns.first_ts END")
    sets += [f"{s} = turns.{s} + d.{s}" for s in SIGNALS]
    if n_stored:
        conn.exec_driver_sql(f"UPDATE turns SET {', '.join(sets)} FROM staging_turns d WHERE d.stored AND {on}")
    if n_new:
        conn.exec_driver_sql(
            f"INSERT INTO turns ({', '.join(TURN_COLUMNS)}) SELECT {', '.join('d.' + c for c in TURN_COLUMNS)} "
            "FROM staging_turns d WHERE NOT d.stored"
        )
    conn.exec_driver_sql("DROP TABLE staging_turns")


# ---- file reading and validation -----------------------------------------------------------------------------------
_ARROW_SCHEMA = pa.schema(
    [
        ("event_id", pa.string()),
        ("conversation_id", pa.string()),
        ("turn_id", pa.int64()),
        ("user_id", pa.string()),
        ("model_version", pa.string()),
        ("intent", pa.string()),
        ("signal", pa.string()),
        ("timestamp", pa.timestamp("us")),
        ("prompt", pa.string()),
        ("response", pa.string()),
    ]
)


def file_signature(path: Path) -> tuple[int, int, int]:
    """``(inode, size, mtime_ns)`` of a file: it changes when the file is rewritten or replaced."""
    st = path.stat()
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class FileChangedError(RuntimeError):
    """An events file was rewritten or replaced while it was being ingested (its rows and its hash could belong to
    different contents); the transaction is rolled back."""


def _file_hash(path: Path) -> str:
    from rlhf.lineage import file_hash

    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    return file_hash(path)


def _row_error(path: Path, row: int, raw: dict) -> DataValidationError:
    """The first schema error of one row, as file/row/field/reason."""
    try:
        EventRow.model_validate(raw)
    except ValidationError as err:
        return DataValidationError.from_pydantic(err, file=str(path), row=row)
    return DataValidationError("row failed validation", file=str(path), row=row)


def _jsonl_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """``(0-based row, line bytes)`` of a JSONL file (gzip when ``.gz``), reading at most :data:`MAX_LINE_BYTES`
    + 1 bytes of any line: a longer line is refused before the rest of it is read.

    Raises:
        data.validation.DataValidationError: a line over the cap (names file and row).
    """
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        i = 0
        while True:
            line = f.readline(MAX_LINE_BYTES + 1)
            if not line:
                return
            if len(line) > MAX_LINE_BYTES:
                raise DataValidationError(
                    f"line longer than {MAX_LINE_BYTES} bytes (the reader's cap, flywheel.schema.MAX_LINE_BYTES); "
                    "not read further",
                    file=str(path),
                    row=i,
                )
            yield i, line
            i += 1


def _parse_line(path: Path, i: int, line: bytes) -> dict:
    """One JSONL line as a dict, or a file/row error (not UTF-8, not JSON, nested too deeply, not an object)."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataValidationError(f"not valid UTF-8 (byte {err.start} of the line)", file=str(path), row=i) from None
    if not text.strip():
        raise DataValidationError("empty line", file=str(path), row=i)
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        raise DataValidationError(f"not valid JSON ({err.msg})", file=str(path), row=i) from None
    except RecursionError:
        raise DataValidationError("JSON nested too deeply to read", file=str(path), row=i) from None
    except ValueError as err:  # e.g. an integer literal over Python's digit limit
        raise DataValidationError(f"not readable JSON ({str(err).splitlines()[0]})", file=str(path), row=i) from None
    if not isinstance(raw, dict):
        raise DataValidationError(f"expected a JSON object, got {type(raw).__name__}", file=str(path), row=i)
    return raw


def _jsonl_batches(path: Path, chunk_rows: int) -> Iterator[pa.Table]:
    """Validated batches of a JSONL file: each row through :class:`EventRow`, then each batch through the same
    vectorised :func:`flywheel.arrow_events.check_batch` as Parquet."""
    rows: list[dict] = []
    base = 0
    for i, line in _jsonl_lines(path):
        raw = _parse_line(path, i, line)
        try:
            ev = EventRow.model_validate(raw)
        except ValidationError:
            raise _row_error(path, i, raw) from None
        except RecursionError:  # a deeply nested value inside a field
            raise DataValidationError("value nested too deeply", file=str(path), row=i) from None
        d = ev.model_dump()
        d["timestamp"] = utc_naive(d["timestamp"])  # in range: EventRow checked it
        rows.append(d)
        if len(rows) >= chunk_rows:
            t = pa.Table.from_pylist(rows, schema=_ARROW_SCHEMA)
            check_batch(t, file=path, base=base)
            yield t
            base += len(rows)
            rows = []
    if rows:
        t = pa.Table.from_pylist(rows, schema=_ARROW_SCHEMA)
        check_batch(t, file=path, base=base)
        yield t


def _parquet_batches(path: Path, chunk_rows: int) -> Iterator[pa.Table]:
    """Column types checked as :class:`EventRow` checks JSONL values (:func:`flywheel.arrow_events.read_columns`),
    then the same vectorised value checks as JSONL (:func:`flywheel.arrow_events.check_batch`). A file that is
    not Parquet or is cut short is refused naming the file and the first row of the batch that could not be read."""
    try:
        pf = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as err:
        raise DataValidationError(f"not a readable Parquet file ({err})", file=str(path)) from None
    names = set(pf.schema_arrow.names)
    missing = [f for f in _INPUT_FIELDS if f not in names and f != "intent"]
    if missing:
        raise DataValidationError(f"missing column(s) {missing}", file=str(path), field=missing[0])
    extra = sorted(names - set(_INPUT_FIELDS))
    if extra:
        raise DataValidationError(f"unknown column(s) {extra}", file=str(path), field=extra[0])
    base = 0
    batches = pf.iter_batches(batch_size=chunk_rows)
    while True:
        try:
            rb = next(batches)
        except StopIteration:
            return
        except (OSError, pa.ArrowException) as err:
            raise DataValidationError(
                f"Parquet data cannot be read from this row on (truncated or corrupt file: {err})",
                file=str(path),
                row=base,
            ) from None
        t = pa.Table.from_batches([rb])
        if "intent" not in t.column_names:
            t = t.append_column("intent", pa.nulls(t.num_rows, pa.string()))
        t = read_columns(t, file=path, base=base)  # types as JSONL reads them; timestamps by unit, numbers in seconds
        try:
            t = t.select(_ARROW_SCHEMA.names).cast(_ARROW_SCHEMA)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            raise column_type_error(path, t, _ARROW_SCHEMA, base=base) from None
        check_batch(t, file=path, base=base)
        base += t.num_rows
        yield t


def _chunk_rows(path: Path, chunk_rows: int | None) -> int:
    """Rows per batch: ``chunk_rows``, else 1,000,000 for Parquet, 200,000 for JSONL."""
    if chunk_rows is not None:
        return chunk_rows
    return 1_000_000 if path.name.lower().endswith(".parquet") else 200_000


def _batches(path: Path, chunk_rows: int) -> Iterator[pa.Table]:
    name = path.name.lower()
    if name.endswith((".jsonl", ".ndjson", ".jsonl.gz")):
        return _jsonl_batches(path, chunk_rows)
    if name.endswith(".parquet"):
        return _parquet_batches(path, chunk_rows)
    raise ValueError(f"{path}: unsupported event file type; expected .jsonl, .ndjson, .jsonl.gz or .parquet")


def _pg_type(t: pa.DataType) -> str:
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "text"
    if pa.types.is_integer(t):
        return "bigint"
    if pa.types.is_timestamp(t):
        return "timestamp"
    return "double precision"


class _PromptMemo:
    """Prompts already hashed (sha256 and normal-form hash), as Arrow columns: a batch looks all its prompts up at
    once (``index_in``) and only prompts not seen before go through Python. Bounded: past ``limit`` prompts it
    keeps only the current batch's (a miss later only costs a re-hash)."""

    def __init__(self, limit: int = 200_000):
        self.limit = limit
        self.table = pa.table(
            {
                "hash": pa.array([], pa.string()),
                "text": pa.array([], pa.string()),
                "norm_hash": pa.array([], pa.string()),
            }
        )

    def lookup(self, col: pa.ChunkedArray) -> tuple[pa.Table, pa.Array]:
        """(the batch's distinct prompts: ``hash, text, norm_hash``; the sha256 of each row's prompt)."""
        col = col.combine_chunks()
        idx = pc.index_in(col, value_set=self.table["text"])
        missing = pc.is_null(idx)
        if pc.any(missing).as_py():
            new = pc.unique(col.filter(missing)).to_pylist()
            add = pa.table(
                {
                    "hash": pa.array([text_hash(t) for t in new], pa.string()),
                    "text": pa.array(new, pa.string()),
                    "norm_hash": pa.array([text_hash(normalise_prompt(t)) for t in new], pa.string()),
                }
            )
            keep = self.table
            if keep.num_rows + add.num_rows > self.limit:  # start again, from this batch's prompts
                keep = keep.take(pc.unique(pc.drop_null(idx)))
            self.table = pa.concat_tables([keep, add]).combine_chunks()
            idx = pc.index_in(col, value_set=self.table["text"])
        return self.table.take(pc.unique(idx)), self.table["hash"].take(idx)


def _split_texts(batch: pa.Table, prompt_memo: _PromptMemo, hash_texts) -> tuple[pa.Table, pa.Table, pa.Table]:
    """(prompt texts: ``hash, text, norm_hash``; distinct responses: ``hash, text``; staging events:
    ``EVENT_COLUMNS``). ``hash_texts``: distinct response texts (``pa.Array``) -> their sha256 hex digests, in order."""
    prompts, p_row = prompt_memo.lookup(batch["prompt"])
    enc = pc.dictionary_encode(batch["response"].combine_chunks())
    r_hash = hash_texts(enc.dictionary)
    responses = pa.table({"hash": r_hash, "text": enc.dictionary})
    event_tab = pa.table(
        {
            "event_id": batch["event_id"],
            "conversation_id": batch["conversation_id"],
            "turn_id": pc.cast(batch["turn_id"], pa.int32()),
            "user_id": batch["user_id"],
            "model_version": batch["model_version"],
            "intent": batch["intent"],
            "signal": batch["signal"],
            "ts": batch["timestamp"],
            "prompt_hash": p_row,
            "response_hash": pc.take(r_hash, enc.indices),
        }
    )
    return prompts, responses, event_tab
