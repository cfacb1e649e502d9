"""The consistency gate's constraint checkers (``gates.constraints``) against hand labels of real model replies.

    python benchmarks/constraint_checkers.py               # per kind: n, positives, precision, recall vs target
    python benchmarks/constraint_checkers.py --show-misses # also every reply whose check differs from its label

Labelled set: ``benchmarks/data/constraint_checker_labels.jsonl``, real replies from the AlpacaEval annotation files
in ``/work/shared/datasets/alpaca_eval/annotations`` (``source``, ``row``, ``field`` = output_1 / output_2, the
reply text verbatim), each read and labelled by hand for compliance with one constraint (``kind``, ``params``; the
labelling rule is in ``why``). "Positive" = compliant. Precision = replies checked compliant that are labelled
compliant / replies checked compliant; recall = labelled-compliant replies checked compliant / labelled compliant; specificity = labelled-violating replies
checked violating / labelled violating (the one figure a kind with no compliant reply here can show).
Target: each >= 0.95 per kind; a figure with no denominator prints "n/a". ``measure()`` gives the rows
``benchmarks/instruments.py`` prints. The shared data holds almost no non-English, all-capital or bare-JSON replies, so those classes are thin
here (see the printed counts); ``max_words``, ``use_name`` and ``all_caps`` are string rules covered by hand-worked
cases in tests/test_gates_consistency.py. Runs in a second on a CPU.

Measured (93 replies: all_caps 10 (5 compliant), bullet_list 14 (8), forbidden 10 (6), json 19 (5), language 18 (3),
max_words 12 (6), use_name 10 (5)): every kind precision, recall and specificity 1.000; pooled 38/38 precision and
recall (95% Wilson 0.908-1.000), 55/55 specificity (0.935-1.000). The sets are small: the pooled lower bounds are
below the 0.95 target, so these figures show no error found, not the target met with confidence.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DATA = ROOT / "benchmarks" / "data" / "constraint_checker_labels.jsonl"
TARGET = 0.95


SET_NAME = "constraint_checker_labels (AlpacaEval + Arena-Hard replies)"


def load(path: Path = DATA) -> list[dict]:
    """The labelled rows (``source``, ``row``, ``field``, ``kind``, ``params``, ``label``, ``reply``, ``why``)."""
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def confusion(rows: list[dict]) -> tuple[dict[str, dict[str, int]], list[tuple[dict, bool]]]:
    """Per kind the counts tp / fp / fn / tn of ``gates.constraints.check`` against the labels, and the misses."""
    from gates.constraints import check

    cells: dict[str, dict[str, int]] = defaultdict(lambda: {"tp": 0, "fp": 0, "fn": 0, "tn": 0})
    misses = []
    for r in rows:
        got = check(r["kind"], r["reply"], **r["params"])
        cells[r["kind"]][("tp" if r["label"] else "fp") if got else ("fn" if r["label"] else "tn")] += 1
        if got != r["label"]:
            misses.append((r, got))
    return dict(sorted(cells.items())), misses


def _ratio(k: int, n: int) -> float:
    return k / n if n else math.nan


def measure(path: Path = DATA) -> list[dict]:
    """One row per (kind, metric): precision, recall and specificity, then the pooled figures with their 95% Wilson
    interval in ``set``. Keys as the benchmark contract (instrument, metric, value, target, n, set, passed); a
    figure with no denominator is NaN with ``passed`` None."""
    from judging.intervals import wilson

    cells, _ = confusion(load(path))
    out = []

    def row(metric: str, k: int, n: int, where: str) -> dict:
        v = _ratio(k, n)
        return {"instrument": "constraint checkers", "metric": metric, "value": round(v, 3) if n else v,
                "target": f">= {TARGET}", "n": n, "set": where, "passed": None if not n else bool(v >= TARGET)}

    for kind, c in cells.items():
        out += [row(f"{kind} precision", c["tp"], c["tp"] + c["fp"], SET_NAME),
                row(f"{kind} recall", c["tp"], c["tp"] + c["fn"], SET_NAME),
                row(f"{kind} specificity", c["tn"], c["tn"] + c["fp"], SET_NAME)]
    tot = {k: sum(c[k] for c in cells.values()) for k in ("tp", "fp", "fn", "tn")}
    for metric, k, n in (("precision", tot["tp"], tot["tp"] + tot["fp"]), ("recall", tot["tp"], tot["tp"] + tot["fn"]),
                         ("specificity", tot["tn"], tot["tn"] + tot["fp"])):
        lo, hi = wilson(k, n)
        out.append(row(f"pooled {metric}", k, n, f"{SET_NAME}, all kinds; 95% Wilson {lo:.3f}-{hi:.3f}"))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--show-misses", action="store_true")
    args = ap.parse_args(argv)
    rows = load(Path(args.data))
    cells, misses = confusion(rows)
    print(f"constraint checkers on {len(rows)} hand-labelled real replies ({args.data}); target precision, recall "
          f"and specificity >= {TARGET}")
    print(f"{'kind':<12} {'n':>4} {'pos':>4} {'precision':>10} {'recall':>8} {'specificity':>12}")
    fmt = lambda k, n: "n/a" if not n else f"{k / n:.3f}"
    for kind, c in cells.items():
        print(f"{kind:<12} {sum(c.values()):>4} {c['tp'] + c['fn']:>4} {fmt(c['tp'], c['tp'] + c['fp']):>10} "
              f"{fmt(c['tp'], c['tp'] + c['fn']):>8} {fmt(c['tn'], c['tn'] + c['fp']):>12}")
    for r in measure(Path(args.data)):
        if r["metric"].startswith("pooled"):
            print(f"{r['metric']}: {r['value']} (n={r['n']}; {r['set'].split('; ', 1)[1]})")
    if args.show_misses:
        for r, got in misses:
            print(f"- {r['source']} row {r['row']} {r['field']} [{r['kind']}] label {r['label']} checked {got}: "
                  f"{r['reply'][:160]!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
