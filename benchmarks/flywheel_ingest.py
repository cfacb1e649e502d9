"""Flywheel store benchmark: ingest and select from N generated events (target: 10M events in < 60 s, < 4 GB peak,
on 2 cores); DuckDB and PostgreSQL (COPY) ingest rates side by side in the same run.

    python benchmarks/flywheel_ingest.py                      # 10M events into DuckDB, 1M into PostgreSQL
    python benchmarks/flywheel_ingest.py --events 2000000 --pg-events 500000

Events are generated as Parquet files (1M rows each: 3 signals per turn, 2 turns per conversation, 50k distinct
prompts, one distinct response per turn), then ingested through ``SignalStore.ingest_files`` (the same validated,
transactional path as production, one transaction per file, the next file read while the current one loads:
vectorised schema checks, content hashes, ``INSERT ... SELECT`` anti-joins, the per-turn table). Select = :func:`flywheel.select_store.select_from_store` (the turns table joined
with the judge cache + :func:`flywheel.select.select_turns` on every turn), with synthetic judge scores
(bulk-stored in the judge cache first; a real reward model scoring millions of turns is a GPU job, not this
benchmark). PostgreSQL runs on a throwaway local server (initdb/pg_ctl), at a smaller count by
default. Prints rows/s, wall and CPU seconds (on a shared machine CPU seconds / cores bounds what an idle one
takes), the load average, and the peak RSS of this process (DuckDB runs in-process; the PostgreSQL server's memory
is its own).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SIGNALS = ["thumbs_up", "thumbs_down", "regenerate", "edit", "copy", "abandon", "continued"]
PG_SETTINGS = {"shared_buffers": "512MB", "max_wal_size": "4GB"}
INTENTS = ["helpful_base", "oasst", "koala", "vicuna", "selfinstruct"]


def generate(out: Path, n_events: int, rows_per_file: int = 1_000_000, seed: int = 0) -> list[Path]:
    """Parquet event files with ``n_events`` rows in total."""
    rng = np.random.default_rng(seed)
    prompts = pa.array([f"Question {i}: how do I do task number {i % 977} well?" for i in range(50_000)])
    files = []
    for f, start in enumerate(range(0, n_events, rows_per_file)):
        n = min(rows_per_file, n_events - start)
        idx = np.arange(start, start + n)
        turn = idx // 3  # 3 signals per turn
        conv = turn // 2  # 2 turns per conversation
        conv_s = pc.cast(pa.array(conv), pa.string())
        table = pa.table(
            {
                "event_id": pc.binary_join_element_wise("e", pc.cast(pa.array(idx), pa.string()), ""),
                "conversation_id": pc.binary_join_element_wise("c", conv_s, ""),
                "turn_id": pa.array(turn % 2, pa.int64()),
                "user_id": pc.binary_join_element_wise("u", pc.cast(pa.array(conv % 100_000), pa.string()), ""),
                "model_version": pa.array(["round-1"] * n),
                "intent": pc.take(pa.array(INTENTS), pa.array(conv % 5)),
                "signal": pc.take(pa.array(SIGNALS), pa.array(rng.integers(0, 7, n))),
                "timestamp": pa.array(np.datetime64("2026-03-01") + (idx // 3).astype("timedelta64[s]")),
                "prompt": pc.take(prompts, pa.array((conv * 7 + turn % 2) % 50_000)),
                "response": pc.binary_join_element_wise(
                    "Here is my answer for turn ", pc.cast(pa.array(turn), pa.string()), "."
                ),
            }
        )
        path = out / f"events-{f:03d}.parquet"
        pq.write_table(table, path)
        files.append(path)
    return files


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_s() -> float:
    """CPU seconds of this process (all threads, DuckDB's included): on a loaded machine, the figure that says
    what an idle 2-core machine would take (wall <= cpu / 2 at best)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def ingest(url: str, files: list[Path], threads: int, memory_limit: str, compression: str | None):
    """(wall seconds, cpu seconds, rows, store)."""
    from flywheel.store import SignalStore

    store = SignalStore(
        url, duckdb_threads=threads, duckdb_memory_limit=memory_limit, duckdb_compression=compression
    )
    t0, c0 = time.perf_counter(), cpu_s()
    rows = sum(r.rows for r in store.ingest_files(files))
    return time.perf_counter() - t0, cpu_s() - c0, rows, store


def fill_judge_cache(store, judge: str) -> float:
    """Store a deterministic pseudo-score per turn (its response hash's first 6 hex digits / 0xFFFFFF), vectorised.
    Returns seconds (not part of the target: a real judge scoring millions of turns is a GPU job)."""
    t0 = time.perf_counter()
    import sqlalchemy as sa

    from flywheel.store import turn_table

    keys = store.fetch_arrow(sa.select(turn_table.c.prompt_hash, turn_table.c.response_hash).distinct())
    digits = pc.utf8_slice_codeunits(keys["response_hash"], 0, 6)
    score = np.array([int(h, 16) for h in pc.unique(digits).to_pylist()], dtype=np.float64) / 0xFFFFFF
    score = pc.take(pa.array(score), pc.index_in(digits, value_set=pc.unique(digits)))
    store.put_scores(judge, keys.append_column("score", score))
    return time.perf_counter() - t0


def select(store, judge: str = "b" * 64) -> tuple[float, float, dict]:
    """(wall seconds, cpu seconds) of what the flow's select step does (:func:`flywheel.select_store.select_from_store`:
    the turns table with the judge's cached scores, :func:`flywheel.select.select_turns` on every turn, the selected
    turns' other columns); and a summary."""
    from data.bundle import demo_path
    from flywheel.select import load_traffic
    from flywheel.select_store import select_from_store

    traffic = load_traffic(demo_path("traffic/alpaca_eval_clusters.csv"))
    t0, c0 = time.perf_counter(), cpu_s()
    sel = select_from_store(store, traffic, judge=judge)
    return (
        time.perf_counter() - t0,
        cpu_s() - c0,
        {"turns": sel.n_turns, "scored": sel.n_scored, "candidates": sel.n_candidates, "selected": len(sel.selected)},
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=10_000_000)
    ap.add_argument("--pg-events", type=int, default=1_000_000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-pg", action="store_true")
    ap.add_argument("--memory-limit", default="2GB", help="DuckDB memory_limit")
    ap.add_argument(
        "--duckdb-compression",
        default="uncompressed",
        help="DuckDB force_compression: 'uncompressed' (default here: about twice the write speed, a larger file; the "
        "size is printed) or 'auto' (DuckDB chooses per column, the store's default)",
    )
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    pa.set_cpu_count(args.threads)
    load = os.getloadavg()
    print(f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="flywheel-bench-"))
    t0 = time.perf_counter()
    files = generate(tmp, args.events)
    print(f"generated {args.events:,} events in {len(files)} Parquet files: {time.perf_counter() - t0:.1f} s", flush=True)
    pg_files = []
    if not args.no_pg:
        (tmp / "pg").mkdir()
        pg_files = generate(tmp / "pg", args.pg_events)

    compression = None if args.duckdb_compression == "auto" else args.duckdb_compression
    result: dict = {"threads": args.threads, "duckdb_compression": args.duckdb_compression}
    secs, cpu, rows, store = ingest(f"duckdb:///{tmp / 'bench.duckdb'}", files, args.threads, args.memory_limit, compression)
    load_ingest = os.getloadavg()[0]
    result["peak_rss_mb_after_ingest"] = round(peak_rss_mb())
    print(
        f"DuckDB ingest: {rows:,} events in {secs:.1f} s = {rows / secs:,.0f} rows/s ({cpu:.1f} CPU s), load average "
        f"{load_ingest:.2f}, peak RSS so far {result['peak_rss_mb_after_ingest']} MB",
        flush=True,
    )
    t_judge = fill_judge_cache(store, "b" * 64)
    t_sel, cpu_sel, summary = select(store)
    result["duckdb"] = {
        "events": rows,
        "ingest_s": round(secs, 1),
        "ingest_cpu_s": round(cpu, 1),
        "ingest_rows_per_s": round(rows / secs),
        "judge_cache_fill_s": round(t_judge, 1),
        "select_s": round(t_sel, 1),
        "select_cpu_s": round(cpu_sel, 1),
        "ingest_plus_select_s": round(secs + t_sel, 1),
        "ingest_plus_select_cpu_s": round(cpu + cpu_sel, 1),
        "load_avg_1m_after_ingest": round(load_ingest, 2),
        "load_avg_1m_after_select": round(os.getloadavg()[0], 2),
        "db_file_mb": round((tmp / "bench.duckdb").stat().st_size / 2**20),
        **summary,
    }
    store.close()
    result["peak_rss_mb_after_duckdb"] = round(peak_rss_mb())
    print(json.dumps(result["duckdb"]), flush=True)
    if not args.no_pg:
        from tests.pg_server import PostgresUnavailable, start_postgres

        try:
            # bulk-load settings for the throwaway server (defaults: 128MB buffers, 1GB of WAL between checkpoints)
            with start_postgres(PG_SETTINGS) as url:
                secs, cpu, rows, store = ingest(url, pg_files, args.threads, args.memory_limit, None)
                result["postgresql"] = {
                    "events": rows,
                    "ingest_s": round(secs, 1),
                    "ingest_client_cpu_s": round(cpu, 1),
                    "ingest_rows_per_s": round(rows / secs),
                    "load_avg_1m": round(os.getloadavg()[0], 2),
                    "server_settings": PG_SETTINGS,
                }
                store.close()
        except PostgresUnavailable as err:
            result["postgresql"] = {"skipped": str(err)}
        print(json.dumps(result["postgresql"]), flush=True)
    result["peak_rss_mb"] = round(peak_rss_mb())
    d = result["duckdb"]
    print(
        f"\nDuckDB ({result['duckdb_compression']} compression): {d['events']:,} events ingested in {d['ingest_s']} s"
        f" = {d['ingest_rows_per_s']:,} rows/s ({d['ingest_cpu_s']} CPU s); select over {d['turns']:,} turns "
        f"{d['select_s']} s ({d['select_cpu_s']} CPU s); ingest + select {d['ingest_plus_select_s']} s wall, "
        f"{d['ingest_plus_select_cpu_s']} CPU s (target < 60 s for 10M on 2 cores); "
        f"peak RSS {result['peak_rss_mb']} MB (target < 4096); load average {d['load_avg_1m_after_ingest']} "
        f"after ingest, {d['load_avg_1m_after_select']} after select"
    )
    if "ingest_rows_per_s" in result.get("postgresql", {}):
        p = result["postgresql"]
        print(
            f"PostgreSQL (COPY + anti-join INSERT): {p['events']:,} events in {p['ingest_s']} s = "
            f"{p['ingest_rows_per_s']:,} rows/s (load average {p['load_avg_1m']})"
        )
    print(json.dumps(result))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
