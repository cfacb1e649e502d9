"""Round wall time, peak memory, and rerun time against the first run (the project's targets).

Targets (2-core CPU, no GPU): demo round < 25 min with peak RSS < 8 GB; smoke round < 3 min; a rerun of an
unchanged round < 5% of the first run's time. Baseline for the ratio: the first run, measured in the same
invocation. Peak memory is the largest max-RSS of the round's processes (each stage is its own process).

The first run is split from the stage manifests: training (each training stage's ``train()`` loop,
``metrics.efficiency.train_seconds``), generation (the gate stage's answers, ``generation_seconds``), judging (the
RM's held-out scoring + reload check and the gates' judge/intent/refusal scoring, ``judging_seconds``) and fixed
overhead (the rest: process start, imports, model loading, data preparation, saving, Prefect), each with its share
of the round; plus each stage's threads, tokens/s and MFU. Target of the changes that use the whole machine
(threads per process, measured precision, full generation batches): a demo round in at most 0.65x of the time
before them (about 950 s quiet, 1,410 s under load).

    python benchmarks/round_time.py --preset smoke
    python benchmarks/round_time.py --preset demo
    python benchmarks/round_time.py --preset demo --baseline-ref 651575e   # + the round at that commit, same run

``--baseline-ref``: after this tree's round, the same round at a git commit (checked out into a temporary detached
worktree, run with that tree's code), so the ratio against the code before a change is measured in the same run;
for the 0.65x target the baseline is 651575e (the last commit before those changes); for the 0.7x target of bf16
where native and checkpoints by time, 6012cb5. Gates added since a baseline make this tree's round do more work
than the baseline's; ``--set`` leaves them out of this tree's round (``SAME_GATES_AS_6012CB5``), so the ratio
compares the same work:

    python benchmarks/round_time.py --preset demo --baseline-ref 6012cb5 --target-ratio 0.7 \
        --set gates.consistency=false --set gates.canaries=false --set gates.redteam_rotate=false
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGETS = {"demo": 25 * 60, "smoke": 3 * 60}
#: Overrides that leave out the gates added after 6012cb5 (the consistency suite, the canaries, red-team rotation:
#: the red-team suite is then the first n_redteam prompts of redteam_data, as at 6012cb5), so this tree's round does
#: the baseline's work and the ratio measures the speed changes alone.
SAME_GATES_AS_6012CB5 = ("gates.consistency=false", "gates.canaries=false", "gates.redteam_rotate=false")


def round_command(preset: str, runs_dir: Path, round_id: str, overrides: list[str] | None = None) -> list[str]:
    """The ``rlhf round`` command line (this interpreter, ``python -m flows.cli``), each override as ``--set``."""
    sets = [arg for o in overrides or [] for arg in ("--set", o)]
    return [sys.executable, "-m", "flows.cli", "round", "--preset", preset, "--runs-dir", str(runs_dir),
            "--round-id", round_id, *sets]


def run_round(preset: str, runs_dir: Path, round_id: str, tree: Path | None = None,
              overrides: list[str] | None = None) -> float:
    """Wall seconds of one ``rlhf round`` (``tree``: run with that source tree's code instead of this one's;
    ``overrides``: ``STAGE.KEY=VALUE`` strings passed as ``--set``)."""
    env = None
    if tree is not None:
        import os

        env = {**os.environ, "PYTHONPATH": str(tree)}
    t0 = time.perf_counter()
    proc = subprocess.run(round_command(preset, runs_dir, round_id, overrides), stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, cwd=tree, env=env, check=False)
    seconds = time.perf_counter() - t0
    if proc.returncode not in (0, 3):  # 3 = release blocked, a valid outcome
        sys.exit(f"round failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return seconds


def split(round_dir: Path, total: float) -> dict[str, float]:
    """Seconds of training, generation, judging and fixed overhead in a finished round (see module docstring)."""
    rnd = json.loads((round_dir / "round.json").read_text())
    parts = {"training": 0.0, "generation": 0.0, "judging": 0.0}
    for name, st in rnd["stages"].items():
        eff = json.loads((Path(st["output_dir"]) / "manifest.json").read_text())["metrics"].get("efficiency", {})
        parts["training"] += eff.get("train_seconds", 0.0)
        parts["generation"] += eff.get("generation_seconds", 0.0)
        parts["judging"] += eff.get("judging_seconds", 0.0)
        print(f"  {name:13s} {st.get('seconds', float('nan')):7.1f} s  threads {eff.get('threads', '?')}  "
              f"{eff.get('tokens_per_s', 0):8.1f} tok/s  MFU {100 * (eff.get('mfu') or 0):5.1f}%  "
              f"padding {100 * (eff.get('padding_share') or 0):4.1f}%")
    parts["fixed overhead"] = total - sum(parts.values())
    return parts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="smoke", choices=sorted(TARGETS))
    ap.add_argument("--keep", action="store_true", help="Keep the runs directory.")
    ap.add_argument("--baseline-ref", help="Also run the round at this git commit (the named baseline) and print the "
                    "ratio (651575e: the code before the 0.65x target's changes).")
    ap.add_argument("--target-ratio", type=float, default=0.65,
                    help="Target of this tree / baseline (0.65 against 651575e; 0.7 against 6012cb5, the commit "
                    "before bf16 where native and checkpoints by time).")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="STAGE.KEY=VALUE",
                    help="Override for this tree's round (repeatable; the baseline's round runs its own recipe), e.g. "
                    "the gates the baseline had not: " + " ".join(f"--set {o}" for o in SAME_GATES_AS_6012CB5) + ".")
    args = ap.parse_args()
    runs = Path(tempfile.mkdtemp(prefix="bench-runs-"))
    if args.overrides:
        print("this tree's round with --set " + " --set ".join(args.overrides))
    first = run_round(args.preset, runs, "bench", overrides=args.overrides)
    print(f"{args.preset} round split (first run, {first:.1f} s):")
    for part, sec in split(runs / "bench", first).items():
        print(f"  {part:15s} {sec:7.1f} s  {100 * sec / first:5.1f}%")
    peak_gb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20  # KiB -> GiB (Linux)
    rerun = run_round(args.preset, runs, "bench", overrides=args.overrides)
    target = TARGETS[args.preset]
    print(f"{args.preset} round: first run {first:.1f} s (target < {target} s: {'OK' if first < target else 'MISSED'})")
    print(f"peak RSS of a stage process: {peak_gb:.2f} GiB" + (" (target < 8 GB: %s)" % ("OK" if peak_gb < 8 else "MISSED")
                                                                if args.preset == "demo" else ""))
    print(f"rerun (all stages cached): {rerun:.1f} s = {100 * rerun / first:.1f}% of the first run (target < 5%)")
    if args.baseline_ref:
        root = Path(__file__).resolve().parent.parent
        tree = Path(tempfile.mkdtemp(prefix="bench-baseline-")) / "tree"
        subprocess.run(["git", "-C", str(root), "worktree", "add", "--detach", "-q", str(tree), args.baseline_ref],
                       check=True)
        try:
            base = run_round(args.preset, runs / "baseline", "bench", tree=tree)
        finally:
            subprocess.run(["git", "-C", str(root), "worktree", "remove", "--force", str(tree)], check=False)
        print(f"{args.preset} round split at {args.baseline_ref} ({base:.1f} s):")
        for part, sec in split(runs / "baseline" / "bench", base).items():  # per stage too: the gates may differ
            print(f"  {part:15s} {sec:7.1f} s  {100 * sec / base:5.1f}%")
        print(f"baseline {args.baseline_ref}: {base:.1f} s; this tree / baseline = {first / base:.3f}x"
              + (f" (target <= {args.target_ratio}x: %s)" % ("OK" if first / base <= args.target_ratio else "MISSED")))
    if not args.keep:
        shutil.rmtree(runs, ignore_errors=True)


if __name__ == "__main__":
    main()
