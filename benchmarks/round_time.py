"""Round wall time, peak memory, and rerun time against the first run (issue targets).

Targets (2-core CPU, no GPU): demo round < 25 min with peak RSS < 8 GB; smoke round < 3 min; a rerun of an
unchanged round < 5% of the first run's time. Baseline for the ratio: the first run, measured in the same
invocation. Peak memory is the largest max-RSS of the round's processes (each stage is its own process).

    python benchmarks/round_time.py --preset smoke
    python benchmarks/round_time.py --preset demo
"""

from __future__ import annotations

import argparse
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGETS = {"demo": 25 * 60, "smoke": 3 * 60}


def run_round(preset: str, runs_dir: Path, round_id: str) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "flows.cli", "round", "--preset", preset, "--runs-dir", str(runs_dir),
                           "--round-id", round_id], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode not in (0, 3):  # 3 = release blocked, a valid outcome
        sys.exit(f"round failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="smoke", choices=sorted(TARGETS))
    ap.add_argument("--keep", action="store_true", help="Keep the runs directory.")
    args = ap.parse_args()
    runs = Path(tempfile.mkdtemp(prefix="bench-runs-"))
    first = run_round(args.preset, runs, "bench")
    peak_gb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20  # KiB -> GiB (Linux)
    rerun = run_round(args.preset, runs, "bench")
    target = TARGETS[args.preset]
    print(f"{args.preset} round: first run {first:.1f} s (target < {target} s: {'OK' if first < target else 'MISSED'})")
    print(f"peak RSS of a stage process: {peak_gb:.2f} GiB" + (" (target < 8 GB: %s)" % ("OK" if peak_gb < 8 else "MISSED")
                                                                if args.preset == "demo" else ""))
    print(f"rerun (all stages cached): {rerun:.1f} s = {100 * rerun / first:.1f}% of the first run (target < 5%)")
    if not args.keep:
        shutil.rmtree(runs, ignore_errors=True)


if __name__ == "__main__":
    main()
