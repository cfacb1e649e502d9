"""Flywheel store benchmark: ingest and select from N generated events (target: 10M events in < 60 s, < 4 GB peak,
on 2 cores); DuckDB and PostgreSQL (COPY) ingest rates side by side in the same run.

    python benchmarks/flywheel_ingest.py                      # 10M events into DuckDB, 1M into PostgreSQL
    python benchmarks/flywheel_ingest.py --events 2000000 --pg-events 500000

Events are generated as Parquet files (1M rows each: 3 signals per turn, 2 turns per conversation, 50k distinct
prompts, one distinct response per turn), then ingested through ``SignalStore.ingest`` (the same validated,
transactional path as production: vectorised schema checks, content hashes, ``INSERT ... ON CONFLICT``). Select =
the per-turn aggregation query + :func:`flywheel.select.select_turns` on every turn, with synthetic judge scores
(bulk-stored in the judge cache first; a real reward model scoring millions of turns is a GPU job, not this
benchmark). PostgreSQL runs on a throwaway local server (initdb/pg_ctl), at a smaller count by default.
Prints rows/s and the peak RSS of this process (DuckDB runs in-process; the PostgreSQL server's memory is its own).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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


def ingest(url: str, files: list[Path], threads: int, memory_limit: str) -> tuple[float, int, object]:
    from flywheel.store import SignalStore

    store = SignalStore(url, duckdb_threads=threads, duckdb_memory_limit=memory_limit)
    t0 = time.perf_counter()
    rows = sum(store.ingest(f).rows for f in files)
    return time.perf_counter() - t0, rows, store


def select(store, judge: str = "b" * 64) -> tuple[float, float, dict]:
    """(seconds to store synthetic judge scores, seconds for turns query + selection, selection summary)."""
    from data.bundle import demo_path
    from flywheel.select import load_traffic, select_turns

    t0 = time.perf_counter()
    base = store.turns().select(["prompt_hash", "response_hash"])
    # a deterministic pseudo-score per response (its hash's first 8 hex digits)
    score = np.array([int(h[:6], 16) / 0xFFFFFF for h in base["response_hash"].to_pylist()])
    store.put_scores(judge, dict(zip(zip(base["prompt_hash"].to_pylist(), base["response_hash"].to_pylist()), score)))
    t_judge = time.perf_counter() - t0
    t0 = time.perf_counter()
    turns = store.turns(judge).to_pandas()
    sel = select_turns(turns, load_traffic(demo_path("traffic/alpaca_eval_clusters.csv")))
    t_sel = time.perf_counter() - t0
    return t_judge, t_sel, {"turns": sel.n_turns, "candidates": sel.n_candidates, "selected": len(sel.selected)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=10_000_000)
    ap.add_argument("--pg-events", type=int, default=1_000_000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-pg", action="store_true")
    ap.add_argument("--memory-limit", default="2GB", help="DuckDB memory_limit")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    pa.set_cpu_count(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="flywheel-bench-"))
    t0 = time.perf_counter()
    files = generate(tmp, args.events)
    print(f"generated {args.events:,} events in {len(files)} Parquet files: {time.perf_counter() - t0:.1f} s")

    secs, rows, store = ingest(f"duckdb:///{tmp / 'bench.duckdb'}", files, args.threads, args.memory_limit)
    t_judge, t_sel, summary = select(store)
    result = {
        "duckdb": {
            "events": rows,
            "ingest_s": round(secs, 1),
            "ingest_rows_per_s": round(rows / secs),
            "judge_cache_fill_s": round(t_judge, 1),
            "select_s": round(t_sel, 1),
            "ingest_plus_select_s": round(secs + t_sel, 1),
            **summary,
        }
    }
    store.close()
    print(json.dumps(result["duckdb"]), flush=True)
    if not args.no_pg:
        from tests.pg_server import PostgresUnavailable, start_postgres

        (tmp / "pg").mkdir()
        pg_files = generate(tmp / "pg", args.pg_events)
        try:
            with start_postgres() as url:
                secs, rows, store = ingest(url, pg_files, args.threads, args.memory_limit)
                result["postgresql"] = {
                    "events": rows,
                    "ingest_s": round(secs, 1),
                    "ingest_rows_per_s": round(rows / secs),
                }
                store.close()
        except PostgresUnavailable as err:
            result["postgresql"] = {"skipped": str(err)}
        print(json.dumps(result["postgresql"]), flush=True)
    result["peak_rss_mb"] = round(peak_rss_mb())
    result["threads"] = args.threads
    d = result["duckdb"]
    print(
        f"\nDuckDB: {d['events']:,} events ingested in {d['ingest_s']} s = {d['ingest_rows_per_s']:,} rows/s; "
        f"select over {d['turns']:,} turns {d['select_s']} s; ingest + select {d['ingest_plus_select_s']} s "
        f"(target < 60 s for 10M); peak RSS {result['peak_rss_mb']} MB (target < 4096)"
    )
    if "ingest_rows_per_s" in result.get("postgresql", {}):
        p = result["postgresql"]
        print(f"PostgreSQL (COPY): {p['events']:,} events in {p['ingest_s']} s = {p['ingest_rows_per_s']:,} rows/s")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
