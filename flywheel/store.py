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
           prompt_hash -> texts, response_hash -> texts)
    turns(conversation_id, turn_id, intent, model_version, user_id, prompt_hash, response_hash, prompt_norm_hash,
          one count per signal)          one row per turn, kept by the ingest in the same transaction as its events:
                                         equal to a GROUP BY over all stored events (``min()`` of each metadata
                                         column in byte order, exact counts), so selection reads 1 row per turn
                                         instead of aggregating strings over every event
    ingests(file_hash PK, path, rows, finished_at)   a file is listed only once all its rows are committed
    (``texts.hash``, ``events.event_id`` and the judge key are unique; primary keys on PostgreSQL only)
    judge_scores(judge, prompt_hash, response_hash, score)   the judge's score per turn, cached by content hash

Ingestion (:func:`SignalStore.ingest`) reads JSONL or Parquet, validates every row against
:class:`flywheel.schema.EventRow` (errors name file, row, field and reason; nothing is written then), and writes a
file in ONE transaction: an ingest killed mid-file (even with SIGKILL) leaves nothing of that file, and a rerun
ends with exact counts. The same event twice (same ``event_id``, in one file or across files) is stored once.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import logging
import re
import threading
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

from .arrow_events import column_type_error, read_columns, refuse_conflicting_ids
from .read_ahead import ReadAhead
from .schema import SIGNALS, EventRow

__all__ = ["EVENT_COLUMNS", "TURN_COLUMNS", "IngestReport", "SignalStore", "normalise_prompt", "text_hash"]

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
    sa.PrimaryKeyConstraint("event_id").ddl_if(dialect="postgresql"),
)
ingests = sa.Table(
    "ingests",
    metadata,
    sa.Column("file_hash", sa.String(64), primary_key=True),
    sa.Column("path", sa.String, nullable=False),
    sa.Column("rows", sa.BigInteger, nullable=False),
    sa.Column("finished_at", sa.DateTime, nullable=False),
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

#: One row per (conversation, turn), kept at ingest in the same transaction as its events (so selection does not
#: re-aggregate strings over every event): the turn's metadata as ``min()`` over its events (what the per-turn GROUP
#: BY gave), the normal-form hash of its prompt, and one count column per signal (events stored once, so counts are
#: exact). Rebuilt from ``events`` when a store written before this table existed is opened.
turn_table = sa.Table(
    "turns",
    metadata,
    sa.Column("conversation_id", sa.String, nullable=False),
    sa.Column("turn_id", sa.Integer, nullable=False),
    sa.Column("intent", sa.String, nullable=True),
    sa.Column("model_version", sa.String, nullable=False),
    sa.Column("user_id", sa.String, nullable=False),
    sa.Column("prompt_hash", sa.String(64), nullable=False),
    sa.Column("response_hash", sa.String(64), nullable=False),
    sa.Column("prompt_norm_hash", sa.String(64), nullable=False),
    *[sa.Column(s, sa.BigInteger, nullable=False) for s in SIGNALS],
    sa.PrimaryKeyConstraint("conversation_id", "turn_id").ddl_if(dialect="postgresql"),
)
_TURN_META = ["intent", "model_version", "user_id", "prompt_hash", "response_hash"]

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
    """What one file's ingest did: ``rows`` read, ``inserted`` new events, ``duplicates`` (already stored or
    repeated in the file), ``skipped_file`` True when the same file content was ingested before."""

    path: str
    file_hash: str
    rows: int
    inserted: int
    duplicates: int
    skipped_file: bool = False


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


class SignalStore:
    """The store behind one SQLAlchemy engine (DuckDB file or PostgreSQL URL).

    Args:
        url: ``duckdb:///path``, ``postgresql+psycopg://...``, or a plain file path (DuckDB).
        duckdb_threads, duckdb_memory_limit: DuckDB settings (e.g. ``2``, ``"2GB"``); ignored for PostgreSQL.
        duckdb_compression: DuckDB ``force_compression`` for what this store writes (e.g. ``"uncompressed"``:
            about twice the write speed, a larger file); ``None`` lets DuckDB choose per column.
        password_env: NAME of the environment variable holding the database password, read only into the engine
            (None: PostgreSQL's driver reads ``PGPASSWORD`` or ``~/.pgpass`` itself).

    Raises:
        rlhf.credentials.SecretValueError: a password inside ``url`` (it would be logged and recorded; give it by
            ``password_env``), or ``password_env`` not a variable name. ValueError: ``password_env`` unset.
    """

    def __init__(
        self,
        url: str | Path,
        *,
        duckdb_threads: int | None = None,
        duckdb_memory_limit: str | None = None,
        duckdb_compression: str | None = None,
        password_env: str | None = None,
    ):
        self.url = _url(url)  # holds no password (refused below), so it may be logged and recorded
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

        had_turns = sa.inspect(self.engine).has_table("turns")
        metadata.create_all(self.engine)
        if not had_turns:
            self._rebuild_turns()
        self._prompts = _PromptMemo()  # prompt -> sha256 and normal-form hash, reused across batches and files

    def close(self) -> None:
        self.engine.dispose()

    def _rebuild_turns(self) -> None:
        """Fill the ``turns`` table from ``events`` (a store written before that table existed; a no-op on an empty
        store). One GROUP BY over every event, once."""
        with _write_lock(self.url), self.engine.begin() as conn:
            if conn.execute(sa.select(events.c.event_id).limit(1)).first() is None:
                return
            conn.exec_driver_sql("DELETE FROM turns")
            _insert_turns_from(conn, "events", self.dialect)

    # ---- ingestion -------------------------------------------------------------------------------------------------
    def ingest(self, path: str | Path, *, chunk_rows: int | None = None, progress=None) -> IngestReport:
        """Ingest one JSONL (``.jsonl``, ``.ndjson``) or Parquet file of :class:`EventRow` rows, atomically.

        Args:
            path: the file.
            chunk_rows: rows validated and loaded per batch (memory stays flat; the transaction spans the file).
                Default 1,000,000 for Parquet (each batch costs one scan of the stored event ids), 200,000 for JSONL
                (rows pass through Python objects).
            progress: optional callable ``(path, chunk_index, rows_so_far)`` called after each batch is loaded.

        Returns:
            :class:`IngestReport`.

        Raises:
            data.validation.DataValidationError: a bad row, naming file, row (0-based), field and reason; the
                transaction is rolled back, so nothing of the file is stored.
            ValueError: an unsupported file type.
        """
        path = Path(path)
        return self._ingest(path, lambda: ReadAhead(lambda: _batches(path, _chunk_rows(path, chunk_rows))), progress)

    def ingest_files(
        self, paths: Sequence[str | Path], *, chunk_rows: int | None = None, progress=None
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
                report = self._ingest(path, lambda: reader(k), progress,  # noqa: B023 (called before k changes)
                                      opened=lambda: opened.get(k))  # noqa: B023
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

    def _ingest(self, path: Path, open_batches, progress, opened=None) -> IngestReport:
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
            n = 0
            # the next batch is read and validated while this one is loaded (same batches, same errors, in order)
            with open_batches() as batches:
                for i, batch in enumerate(batches):
                    self._load(conn, batch, file=path, base=n)
                    n += batch.num_rows
                    if progress:
                        progress(path, i, n)
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
                    file_hash=fhash, path=str(path), rows=n, finished_at=dt.datetime.now(dt.UTC).replace(tzinfo=None)
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

    def _load(self, conn: sa.Connection, batch: pa.Table, *, file: Path, base: int) -> None:
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
        (:func:`_merge_turns`). No unique index is maintained on DuckDB (its ART index on a string key was the
        ingest's bottleneck).
        """
        batch = self._new_events(conn, batch, file=file, base=base)
        if not batch.num_rows:
            return
        prompts, responses, event_tab = _split_texts(batch, self._prompts, lambda t: self._text_hashes(conn, t))
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
        _merge_turns(conn, "staging_events", self.dialect)
        self._unstage(conn, "staging_prompts", "staging_responses", "staging_events")

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

    def _new_events(self, conn: sa.Connection, batch: pa.Table, *, file: Path, base: int) -> pa.Table:
        """The rows of ``batch`` whose ``event_id`` is not stored yet, each id once (its first row), in file order:
        one GROUP BY on the ids alone, LEFT JOINed with the stored ids. Earlier batches of the same file are
        visible in the transaction and writers are serialised, so what is inserted next is exactly this.

        The same GROUP BY counts each id's rows: when the batch repeats an id at all,
        :func:`flywheel.arrow_events.refuse_conflicting_ids` checks that the copies are the same event (``file``,
        ``base``: for its error, which names the file row).

        Raises:
            data.validation.DataValidationError: one ``event_id`` with two different contents in the batch.
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
        self._unstage(conn, "staging_keys")
        if (reps > 1).any():
            refuse_conflicting_ids(batch, file=file, base=base)
        idx = idx[new.astype(bool)]
        if len(idx) == batch.num_rows:
            return batch
        return batch.take(pa.array(np.sort(np.asarray(idx, dtype=np.int64))))

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
        """One row per (conversation, turn): ids, intent, model version, user id, text hashes, the normalised-prompt
        hash, one count column per signal, and (with ``judge``) that judge's cached score (NULL where not scored).

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
        return q.order_by(t.c.conversation_id, t.c.turn_id) if ordered else q

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

    def turn_details(self, conversation_ids: Sequence[str], turn_ids: Sequence[int]) -> pa.Table:
        """Every ``turns`` column for the given (conversation id, turn id) pairs (unknown pairs are absent; order
        not kept). One staged key table and a join: for the few thousand turns a selection picks."""
        keys = pa.table(
            {
                "conversation_id": pa.array(list(conversation_ids), pa.string()),
                "turn_id": pa.array(list(turn_ids), pa.int64()),
            }
        )
        cols = ", ".join(f"t.{c}" for c in TURN_COLUMNS)
        sql = (
            f"SELECT {cols} FROM turns t JOIN staging_turn_keys k "
            "ON k.conversation_id = t.conversation_id AND k.turn_id = t.turn_id"
        )
        with self.engine.begin() as conn:
            self._stage(conn, "staging_turn_keys", keys)
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

    def conversation(self, conversation_id: str) -> list[dict]:
        """The turns of one conversation in order: ``[{"turn_id", "prompt", "response", "intent"}, ...]``."""
        p, r = texts.alias("p"), texts.alias("r")
        q = (
            sa.select(events.c.turn_id, p.c.text, r.c.text, sa.func.min(events.c.intent))
            .select_from(events.join(p, p.c.hash == events.c.prompt_hash).join(r, r.c.hash == events.c.response_hash))
            .where(events.c.conversation_id == conversation_id)
            .group_by(events.c.turn_id, p.c.text, r.c.text)
            .order_by(events.c.turn_id)
        )
        with self.engine.connect() as conn:
            return [{"turn_id": t, "prompt": a, "response": b, "intent": i} for t, a, b, i in conn.execute(q).all()]

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
    """SQL: one row per (conversation, turn) of the events in ``source``: ``min()`` of each metadata column (byte
    order) and a BIGINT count per signal (``count(*) FILTER``: sum(case) is a HUGEINT on DuckDB)."""
    coll = _collate(dialect)
    meta = ", ".join(f"min({c}{coll}) AS {c}" for c in _TURN_META)
    sig = ", ".join(f"count(*) FILTER (WHERE signal = '{s}') AS {s}" for s in SIGNALS)
    return f"SELECT conversation_id, turn_id, {meta}, {sig} FROM {source} GROUP BY conversation_id, turn_id"


#: Columns of the ``turns`` table, in order.
TURN_COLUMNS = ["conversation_id", "turn_id", *_TURN_META, "prompt_norm_hash", *SIGNALS]


def _insert_turns_from(conn: sa.Connection, source: str, dialect: str) -> None:
    """Insert the turns of ``source``'s events (none of them in ``turns`` yet), the prompt's normal-form hash read
    from ``texts`` (a prompt whose text was first stored as a response has none there: it keeps its own hash)."""
    conn.exec_driver_sql(
        f"INSERT INTO turns ({', '.join(TURN_COLUMNS)}) SELECT "
        + ", ".join(f"a.{c}" for c in TURN_COLUMNS[: -len(SIGNALS) - 1])
        + ", coalesce(nullif(p.norm_hash, ''), a.prompt_hash), "
        + ", ".join(f"a.{s}" for s in SIGNALS)
        + f" FROM ({_turn_aggregate(source, dialect)}) a LEFT JOIN texts p ON p.hash = a.prompt_hash"
    )


def _merge_turns(conn: sa.Connection, new: str, dialect: str) -> None:
    """Fold the batch's new events (the table or subquery ``new``) into ``turns``: a turn already stored gets its counts
    added and its metadata lowered to the minimum (so the table equals a GROUP BY over all events, whatever the
    order events arrive in); a new turn is inserted. Runs inside the ingest transaction."""
    conn.exec_driver_sql("DROP TABLE IF EXISTS staging_turns")
    # ``stored``: the turn is already in ``turns`` (one LEFT JOIN, built on the batch's side; turns are unique by
    # (conversation, turn)), so the UPDATE touches only those and the INSERT needs no second anti-join
    conn.exec_driver_sql(
        "CREATE TEMP TABLE staging_turns AS SELECT a.*, p.norm_hash AS prompt_norm_hash, "
        "t.conversation_id IS NOT NULL AS stored FROM "
        f"({_turn_aggregate(new, dialect)}) a JOIN staging_prompts p ON p.hash = a.prompt_hash "
        "LEFT JOIN turns t ON t.conversation_id = a.conversation_id AND t.turn_id = a.turn_id"
    )
    n_stored = conn.exec_driver_sql("SELECT count(*) FROM staging_turns WHERE stored").scalar_one()
    on = "turns.conversation_id = d.conversation_id AND turns.turn_id = d.turn_id"
    coll = _collate(dialect)

    def lower(c: str) -> str:  # min(old, new), NULL (unknown intent) only when both are
        return (
            f"CASE WHEN turns.{c} IS NULL OR d.{c}{coll} < turns.{c}{coll} THEN coalesce(d.{c}, turns.{c}) "
            f"ELSE turns.{c} END"
        )

    sets = [f"{c} = {lower(c)}" for c in _TURN_META]
    sets.append(
        f"prompt_norm_hash = CASE WHEN d.prompt_hash{coll} < turns.prompt_hash{coll} THEN d.prompt_norm_hash "
        "ELSE turns.prompt_norm_hash END"
    )
    sets += [f"{s} = turns.{s} + d.{s}" for s in SIGNALS]
    if n_stored:
        conn.exec_driver_sql(f"UPDATE turns SET {', '.join(sets)} FROM staging_turns d WHERE d.stored AND {on}")
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


def _utc_naive(ts: dt.datetime) -> dt.datetime:
    return ts.astimezone(dt.UTC).replace(tzinfo=None) if ts.tzinfo else ts


def _jsonl_batches(path: Path, chunk_rows: int) -> Iterator[pa.Table]:
    rows: list[dict] = []
    base = 0
    opener = __import__("gzip").open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for i, line in enumerate(f):
            if not line.strip():
                raise DataValidationError("empty line", file=str(path), row=i)
            try:
                raw = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataValidationError(f"not valid JSON ({err.msg})", file=str(path), row=i) from None
            if not isinstance(raw, dict):
                raise DataValidationError(f"expected a JSON object, got {type(raw).__name__}", file=str(path), row=i)
            try:
                ev = EventRow.model_validate(raw)
            except ValidationError:
                raise _row_error(path, i, raw) from None
            d = ev.model_dump()
            d["timestamp"] = _utc_naive(d["timestamp"])
            rows.append(d)
            if len(rows) >= chunk_rows:
                yield pa.Table.from_pylist(rows, schema=_ARROW_SCHEMA)
                base += len(rows)
                rows = []
    if rows:
        yield pa.Table.from_pylist(rows, schema=_ARROW_SCHEMA)


def _parquet_batches(path: Path, chunk_rows: int) -> Iterator[pa.Table]:
    """Vectorised checks mirroring :class:`EventRow`; the first failing row is re-validated by pydantic for the
    message, so both readers report the same field and reason."""
    pf = pq.ParquetFile(path)
    names = set(pf.schema_arrow.names)
    missing = [f for f in _INPUT_FIELDS if f not in names and f != "intent"]
    if missing:
        raise DataValidationError(f"missing column(s) {missing}", file=str(path), field=missing[0])
    extra = sorted(names - set(_INPUT_FIELDS))
    if extra:
        raise DataValidationError(f"unknown column(s) {extra}", file=str(path), field=extra[0])
    base = 0
    signals = pa.array(SIGNALS)
    for rb in pf.iter_batches(batch_size=chunk_rows):
        t = pa.Table.from_batches([rb])
        if "intent" not in t.column_names:
            t = t.append_column("intent", pa.nulls(t.num_rows, pa.string()))
        t = read_columns(t, file=path, base=base)  # types as JSONL reads them; timestamps by unit, numbers in seconds
        try:
            t = t.select(_ARROW_SCHEMA.names).cast(_ARROW_SCHEMA)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            raise column_type_error(path, t, _ARROW_SCHEMA, base=base) from None
        ok = pc.is_in(t["signal"], value_set=signals)
        for name in ("event_id", "conversation_id", "user_id", "model_version", "prompt", "response"):
            ok = pc.and_kleene(ok, pc.greater(pc.utf8_length(t[name]), 0))
        ok = pc.and_kleene(ok, pc.greater_equal(t["turn_id"], 0))
        ok = pc.and_kleene(ok, pc.is_valid(t["timestamp"]))
        ok = pc.fill_null(ok, False)
        if not pc.all(ok).as_py():
            bad = int(pc.index(ok, False).as_py())
            raise _row_error(path, base + bad, t.slice(bad, 1).to_pylist()[0])
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
