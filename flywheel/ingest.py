"""Ingest weak-signal event files into the store: ``python -m flywheel.ingest --db URL FILE...``.

Prints one JSON report per file (rows, inserted, duplicates) and, with ``--progress``, a line per loaded batch on
stderr; an empty file (0 events) gets a warning on stderr. Each file is one transaction: killing this process mid-file leaves nothing of that file behind.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from .store import SignalStore


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m flywheel.ingest", description=__doc__)
    ap.add_argument("--db", required=True, help="duckdb:///file.duckdb, postgresql+psycopg://user@host/db, or a file "
                    "path; never with a password in it (refused): see --db-password-env")
    ap.add_argument("--db-password-env", default=None, metavar="NAME",
                    help="environment variable holding the database password (default: PGPASSWORD or ~/.pgpass, "
                    "which PostgreSQL's driver reads itself)")
    ap.add_argument(
        "--chunk-rows", type=int, default=None, help="rows per loaded batch (default: the store's, by file type)"
    )
    ap.add_argument("--progress", action="store_true", help="print a line per batch on stderr")
    ap.add_argument("files", nargs="+")
    args = ap.parse_args(argv)
    try:
        store = SignalStore(args.db, password_env=args.db_password_env)
    except ValueError as err:  # one line naming the option (a refused secret is never repeated)
        print(f"error: {err}", file=sys.stderr)
        return 2

    def progress(path, i, n):
        print(f"{path}: chunk {i} loaded ({n} rows so far, not committed)", file=sys.stderr, flush=True)

    # one transaction per file; the next file is read while the current one loads
    for report in store.ingest_files(
        args.files, chunk_rows=args.chunk_rows, progress=progress if args.progress else None
    ):
        print(json.dumps(dataclasses.asdict(report)), flush=True)
        if report.rows == 0 and not report.skipped_file:
            print(
                f"warning: {report.path}: empty file, 0 events ingested (recorded as ingested)",
                file=sys.stderr,
                flush=True,
            )
    print(json.dumps(store.counts()), flush=True)
    store.close()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
