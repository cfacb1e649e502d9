"""Ingest weak-signal event files into the store: ``python -m flywheel.ingest --db URL FILE...``.

Prints one JSON report per file (rows, inserted, duplicates) and, with ``--progress``, a line per loaded batch on
stderr; an empty file (0 events) gets a warning on stderr. Each file is one transaction: killing this process
mid-file leaves nothing of that file behind.

Exit codes: 0 every file ingested; 1 an error, printed as ONE line on stderr (``error: FILE row N field 'F':
reason`` for a bad row; the files before it stay committed, that file is rolled back); 130 interrupted (Ctrl-C or
SIGTERM: the ingest stops between batches, the current file is rolled back, the files before it stay committed).
A DuckDB store held by another process is waited for (``--lock-timeout``), then refused naming that process.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import signal
import sys
import threading

import sqlalchemy as sa

from data.validation import DataValidationError
from rlhf.credentials import SecretValueError

from .store import FileChangedError, IngestInterrupted, SignalStore, StoreLockedError

INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT, what shells report for Ctrl-C
ERROR_EXIT_CODE = 1


@contextlib.contextmanager
def stop_on_signals(stop: threading.Event):
    """SIGINT/SIGTERM set ``stop`` (checked by the ingest between batches) instead of raising inside whatever runs:
    DuckDB's calls would swallow a KeyboardInterrupt. A second signal raises KeyboardInterrupt at once (the
    transaction is still rolled back). Outside the main thread (no signal handlers there) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        if stop.is_set():
            raise KeyboardInterrupt(f"interrupted again by {signal.Signals(signum).name}")
        stop.set()
        print(
            f"{signal.Signals(signum).name}: stopping after the current batch (the current file is rolled back)",
            file=sys.stderr,
            flush=True,
        )

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m flywheel.ingest", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--db", required=True, help="duckdb:///file.duckdb, postgresql+psycopg://user@host/db, or a file "
                    "path; never with a password in it (refused): see --db-password-env")
    ap.add_argument("--db-password-env", default=None, metavar="NAME",
                    help="environment variable holding the database password (default: PGPASSWORD or ~/.pgpass, "
                    "which PostgreSQL's driver reads itself)")
    ap.add_argument(
        "--chunk-rows", type=int, default=None, help="rows per loaded batch (default: the store's, by file type)"
    )
    ap.add_argument(
        "--lock-timeout", type=float, default=60.0, help="seconds to wait for another process holding a DuckDB store"
    )
    ap.add_argument("--progress", action="store_true", help="print a line per batch on stderr")
    ap.add_argument("files", nargs="+")
    args = ap.parse_args(argv)
    if args.chunk_rows is not None and args.chunk_rows < 1:
        ap.error(f"--chunk-rows must be >= 1, got {args.chunk_rows}")

    def progress(path, i, n):
        print(f"{path}: chunk {i} loaded ({n} rows so far, not committed)", file=sys.stderr, flush=True)

    stop = threading.Event()
    store = None
    try:
        with stop_on_signals(stop):
            try:
                store = SignalStore(args.db, password_env=args.db_password_env, lock_timeout_s=args.lock_timeout)
            except SecretValueError as err:  # one line naming the option (a refused secret is never repeated)
                print(f"error: {err}", file=sys.stderr)
                return 2
            # one transaction per file; the next file is read while the current one loads
            for report in store.ingest_files(
                args.files, chunk_rows=args.chunk_rows, progress=progress if args.progress else None, stop=stop
            ):
                print(json.dumps(dataclasses.asdict(report)), flush=True)
                if report.rows == 0 and not report.skipped_file:
                    print(
                        f"warning: {report.path}: empty file, 0 events ingested (recorded as ingested)",
                        file=sys.stderr,
                        flush=True,
                    )
            if stop.is_set():
                raise IngestInterrupted("interrupted after the last file was committed")
            print(json.dumps(store.counts()), flush=True)
    except (IngestInterrupted, KeyboardInterrupt) as err:
        print(f"error: {err or 'interrupted'}", file=sys.stderr, flush=True)
        return INTERRUPTED_EXIT_CODE
    except (DataValidationError, FileChangedError, StoreLockedError, ValueError, OSError, sa.exc.SQLAlchemyError) as err:
        print(f"error: {_one_line(err)}", file=sys.stderr, flush=True)
        return ERROR_EXIT_CODE
    finally:
        if store is not None:
            store.close()
    return 0


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split("\n")[0].split())
    return text or type(err).__name__


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
