"""Every gate instrument against its labelled set, in one table: ``python benchmarks/instruments.py``.

Each instrument has its own benchmark (runnable alone, with options to list its errors); this runs their
``measure()`` and prints every figure with the labelled set it was measured on, its size and its target:

- decontamination (``benchmarks/decontamination.py``): recall per near-duplicate class of every gate suite's
  prompts, short and long, and false positives on training rows that are no gate prompt;
- the flip probe's answer reader (``benchmarks/flip_probe.py``): hand-labelled "Are you sure?" replies;
- citations C03 / C01 (``benchmarks/citations.py``): hand-labelled AlpacaEval 2 and Arena-Hard answers;
- drift counters (``benchmarks/drift_counters.py``): hand-labelled answers of six models;
- refusal rates (``benchmarks/refusal_rates.py``): XSTest's human labels, one model held out at a time;
- clustered agreement intervals (``benchmarks/clustered_intervals.py``): PandaLM's repeated instructions;
- alpaca_eval's LC and its standard error (``benchmarks/alpaca_eval_lc.py``): the published leaderboard;
- the consistency gate's constraint checkers (``benchmarks/constraint_checkers.py``): hand-labelled AlpacaEval and
  Arena-Hard replies.

``--only NAME`` (repeatable) runs some of them; ``--json PATH`` writes the rows (strict JSON). Exit code 0 even
when a target is missed: this measures, the tests decide.
"""

from __future__ import annotations

import argparse
import importlib
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks import each other as top-level modules
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

#: Benchmark module -> what it measures.
BENCHMARKS = {
    "decontamination": "near-duplicates of gate prompts",
    "flip_probe": "the flip probe's answer reader",
    "citations": "C03 reference-shaped prose and C01 emitted URLs",
    "drift_counters": "drift counters",
    "refusal_rates": "corrected refusal rates",
    "clustered_intervals": "agreement intervals by instruction",
    "alpaca_eval_lc": "alpaca_eval's LC win rate and standard error",
    "constraint_checkers": "the consistency gate's constraint checkers",
}
COLUMNS = ("instrument", "metric", "value", "target", "passed", "n", "set")


def run(names: list[str]) -> tuple[list[dict], dict[str, str]]:
    """The rows of every benchmark in ``names`` (each with its seconds) and, per benchmark that failed to run, the
    error's one line (a benchmark whose module is missing is reported, not skipped silently)."""
    rows, errors = [], {}
    for name in names:
        t0 = time.perf_counter()
        try:
            module = importlib.import_module(name)
            got = module.measure()
        except Exception as err:  # noqa: BLE001 - one broken benchmark must not hide the others' figures
            errors[name] = f"{type(err).__name__}: {err}"
            continue
        seconds = time.perf_counter() - t0
        rows += [{**{c: r.get(c) for c in COLUMNS}, "benchmark": name, "seconds": round(seconds, 1)} for r in got]
    return rows, errors


def _cell(value) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return "" if value is None else str(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", choices=sorted(BENCHMARKS), help="run only this benchmark")
    parser.add_argument("--json", type=Path, help="also write the rows to this file (strict JSON)")
    args = parser.parse_args(argv)
    names = args.only or list(BENCHMARKS)
    rows, errors = run(names)
    import pandas as pd

    table = pd.DataFrame([{c: _cell(r[c]) for c in COLUMNS} for r in rows], columns=list(COLUMNS))
    with pd.option_context("display.max_rows", None, "display.max_colwidth", 60, "display.width", 250):
        print(table.to_string(index=False))
    missed = [r for r in rows if r["passed"] is False]
    print(f"\n{len(rows)} figures from {len(names) - len(errors)} benchmarks; {len(missed)} below target"
          + "".join(f"\n  below target: {r['instrument']} / {r['metric']} = {_cell(r['value'])} ({r['target']})"
                    for r in missed))
    for name, err in errors.items():
        print(f"benchmark {name} did not run: {err}", file=sys.stderr)
    if args.json:
        from rlhf.manifest import atomic_write_text, dumps_strict

        atomic_write_text(args.json, dumps_strict({"rows": rows, "errors": errors}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
