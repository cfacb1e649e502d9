"""The drift gate's per-response counters against hand labels on real answers (``benchmarks/data/drift_labels.jsonl``).

    python benchmarks/drift_counters.py                  # precision/recall per counter, tune and held-out parts
    python benchmarks/drift_counters.py --show-errors    # also every false positive / negative of the tune part
    python benchmarks/drift_counters.py --show-errors --errors-split heldout_j # ... of held-out J

Counters measured (``gates/drift.py``): :func:`restates_question`, :func:`has_bullet_list`, :func:`is_hedged`; the
fourth drift counter, median length, is a plain count and has no label. The labelled set: 966 (prompt, answer) pairs
from six models (AlpacaEval 2 annotations: gpt4_1106_preview, alpaca-7b, gpt-3.5-turbo-1106, its "concise" variant;
Arena-Hard: gpt-4-0314, gpt-3.5-turbo-0125), each labelled by reading it (definitions:
``benchmarks/data/drift_labels.md``). Parts, by the ``split`` field:

* tuned on: "tune" (170 rows: 120 random, 50 drawn among candidates for positives and look-alikes), and
  "heldout_b" (60), "heldout_c" (72), "heldout_d" (66), "heldout_e" (66), "heldout_f" (90), "heldout_g" (90), all
  random: each was labelled after the rules of the moment were frozen and measured once, then its errors were used
  for tuning (first-read figures in the note; restates_question precision / recall on E 0.706 / 0.750, on F
  0.870 / 0.645, on G 0.909 / 0.690; F was labelled by a second reader and G by a third, blind to the counters);
* held-out A ("heldout", 70 rows drawn at random from the first 240 after labelling): never used for a rule, its
  figures read along the way (and its errors listed once, late);
* "heldout_h" (90 random rows, 15 per model, drawn from answers and prompts not yet in the set, a fifth reader)
  and "heldout_i" (96, 16 per model, three more readers, ``reader`` 6-8): each labelled blind after the rules of
  the moment were frozen, measured once, then tuned on (first reads: restates_question precision / recall on H
  0.912 / 0.756, is_hedged 0.818 / 1.000; on I 0.793 / 0.821 and 0.733 / 1.000);
* held-out J ("heldout_j", 96 random rows, 16 per model, drawn the same way, labelled by three more readers,
  ``reader`` 9-11, blind to the counters, after the final rules; measured once). It measures the rules and how
  well the definitions carry to other readers.

Target per counter: precision and recall >= 0.85.

How far another reader carries the definitions bounds what a counter can score against one reader's labels: held-out
G was read again, blind, by a fourth reader (``benchmarks/data/drift_labels_g_reader4.jsonl``). Printed per counter:
the readers' agreement with each other and the counter's with each (share of rows and Cohen's kappa,
scikit-learn's), and the counter's precision / recall on the rows both readers label alike.

Also reported: the time to run the three counters over 1000 answers (the gate's scale), from the set's answers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gates.drift import has_bullet_list, is_hedged, restates_question  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "drift_labels.jsonl"
SECOND_READER = ROOT / "benchmarks" / "data" / "drift_labels_g_reader4.jsonl"
SET_NAME = "benchmarks/data/drift_labels.jsonl"
TARGET = 0.85
LABELS = ("restates_question", "has_bullet_list", "is_hedged")
COUNTER = {
    "restates_question": lambda r: restates_question(r["answer"], r["prompt"]),
    "has_bullet_list": lambda r: has_bullet_list(r["answer"]),
    "is_hedged": lambda r: is_hedged(r["answer"], r["prompt"]),
}


def load(path: Path = DATA) -> list[dict]:
    """Rows of the labelled set.

    Raises:
        ValueError: a row without a field the benchmark needs (names file, line and field).
    """
    rows = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        for k in ("id", "split", "prompt", "answer", "labels"):
            if k not in row:
                raise ValueError(f"{path}:{i}: missing field {k!r}")
        for k in LABELS:
            if not isinstance(row["labels"].get(k), bool):
                raise ValueError(f"{path}:{i}: labels.{k} must be true/false")
        rows.append(row)
    return rows


def confusion(rows: list[dict], label: str) -> dict:
    """tp, fp, fn, tn, precision, recall of one counter on ``rows`` (precision/recall NaN when undefined) and the
    ids it got wrong."""
    tp = fp = fn = tn = 0
    fps, fns = [], []
    for r in rows:
        pred, gold = bool(COUNTER[label](r)), r["labels"][label]
        if pred and gold:
            tp += 1
        elif pred:
            fp += 1
            fps.append(r["id"])
        elif gold:
            fn += 1
            fns.append(r["id"])
        else:
            tn += 1
    nan = float("nan")
    return {"tp": tp, "fp": fp, "fn": fn, "tn": tn, "precision": tp / (tp + fp) if tp + fp else nan,
            "recall": tp / (tp + fn) if tp + fn else nan, "fp_ids": fps, "fn_ids": fns}


def counters_seconds_per_1000(rows: list[dict]) -> float:
    """Seconds to run the three counters over 1000 answers (the set's answers cycled)."""
    pairs = [(rows[i % len(rows)]["answer"], rows[i % len(rows)]["prompt"]) for i in range(1000)]
    t0 = time.perf_counter()
    for a, p in pairs:
        restates_question(a, p)
        has_bullet_list(a)
        is_hedged(a)
    return time.perf_counter() - t0


def measure(path: Path = DATA) -> list[dict]:
    """One row per (counter, metric, part): precision and recall on the tune part, the held-out part and all rows,
    plus the time per 1000 answers. Keys as the benchmark contract (instrument, metric, value, target, n, set,
    passed)."""
    rows = load(path)
    # rows the rules were tuned on: "tune", and held-out B to I (each measured once, then its errors read)
    tuned = [r for r in rows if r["split"] in ("tune", "heldout_b", "heldout_c", "heldout_d", "heldout_e",
                                               "heldout_f", "heldout_g", "heldout_h", "heldout_i")]
    held_a = [r for r in rows if r["split"] == "heldout"]
    held_j = [r for r in rows if r["split"] == "heldout_j"]
    parts = {"tuned-on": tuned, "held-out A": held_a, "held-out J": held_j, "held-out A+J": held_a + held_j,
             "all": rows}
    out = []
    for label in LABELS:
        for part, rr in parts.items():
            c = confusion(rr, label)
            for metric in ("precision", "recall"):
                v = c[metric]
                out.append({"instrument": "drift counters", "metric": f"{label} {metric}", "value": round(v, 3),
                            "target": f">= {TARGET}", "n": len(rr), "set": f"{SET_NAME} {part}",
                            "passed": None if v != v else bool(v >= TARGET)})
    out.append({"instrument": "drift counters", "metric": "seconds per 1000 answers (3 counters)",
                "value": round(counters_seconds_per_1000(rows), 3), "target": "", "n": 1000,
                "set": f"{SET_NAME} answers",
                "passed": None})
    return out


def load_second_reader(path: Path, rows: list[dict]) -> dict[str, dict]:
    """``{id: labels}`` of a second reading of some of ``rows``.

    Raises:
        ValueError: a row without ``id`` or a boolean label, or an id not in ``rows`` (names file, line and field).
    """
    known = {r["id"] for r in rows}
    out = {}
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        if row.get("id") not in known:
            raise ValueError(f"{path}:{i}: id {row.get('id')!r} is not a row of the labelled set")
        for k in LABELS:
            if not isinstance((row.get("labels") or {}).get(k), bool):
                raise ValueError(f"{path}:{i}: labels.{k} must be true/false")
        out[row["id"]] = row["labels"]
    return out


def reader_agreement(rows: list[dict], second: dict[str, dict]) -> list[dict]:
    """Per counter, on the rows ``second`` read again: agreement of the two readers, of the counter with each (share
    of rows alike and Cohen's kappa), and the counter's precision / recall on the rows both readers label alike."""
    from sklearn.metrics import cohen_kappa_score

    both = [r for r in rows if r["id"] in second]
    out = []
    for label in LABELS:
        first = [r["labels"][label] for r in both]
        other = [second[r["id"]][label] for r in both]
        pred = [bool(COUNTER[label](r)) for r in both]

        def alike(a, b):
            return sum(x == y for x, y in zip(a, b)) / len(a)

        def kappa(a, b):
            return float(cohen_kappa_score(a, b)) if len(set(a) | set(b)) > 1 else float("nan")

        agreed = [r for r, a, b in zip(both, first, other) if a == b]
        c = confusion(agreed, label)
        for who, (a, b) in {"reader 3 vs reader 4": (first, other), "counter vs reader 3": (pred, first),
                            "counter vs reader 4": (pred, other)}.items():
            out.append({"counter": label, "pair": who, "n": len(both), "alike": round(alike(a, b), 3),
                        "kappa": round(kappa(a, b), 3)})
        out.append({"counter": label, "pair": f"counter on the {len(agreed)} rows both readers label alike",
                    "n": len(agreed), "alike": round(alike([bool(COUNTER[label](r)) for r in agreed],
                                                           [r["labels"][label] for r in agreed]), 3),
                    "kappa": float("nan"), "precision": round(c["precision"], 3), "recall": round(c["recall"], 3)})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--show-errors", action="store_true", help="list the rows each counter gets wrong")
    ap.add_argument("--errors-split", default="tune",
                    choices=["tune", "heldout", "heldout_b", "heldout_c", "heldout_d", "heldout_e", "heldout_f",
                             "heldout_g", "heldout_h", "heldout_i", "heldout_j", "all"],
                    help="which split --show-errors lists (tune by default: held-out rows are not for tuning)")
    args = ap.parse_args(argv)
    path = Path(args.data)
    rows = load(path)
    n = {k: sum(r["split"] == k for r in rows) for k in ("tune", "heldout", "heldout_b", "heldout_c", "heldout_d",
                                                          "heldout_e", "heldout_f", "heldout_g", "heldout_h",
                                                          "heldout_i")}
    print(f"set: {path}: {len(rows)} labelled answers (tuned on: {n['tune']} tune + {n['heldout_b']} B + "
          f"{n['heldout_c']} C + {n['heldout_d']} D + {n['heldout_e']} E + {n['heldout_f']} F + {n['heldout_g']} G + "
          f"{n['heldout_h']} H + {n['heldout_i']} I; held-out A {n['heldout']}, held-out J "
          f"{sum(r['split'] == 'heldout_j' for r in rows)}); "
          "positives: "
          + ", ".join(f"{k} {sum(r['labels'][k] for r in rows)}" for k in LABELS))
    print(pd.DataFrame(measure(path)).to_string(index=False))
    if path == DATA and SECOND_READER.is_file():
        second = load_second_reader(SECOND_READER, rows)
        print(f"\nG (tuned on since) read again, blind, by a fourth reader ({SECOND_READER.name}, {len(second)} "
              "rows):")
        print(pd.DataFrame(reader_agreement(rows, second)).to_string(index=False))
    if args.show_errors:
        by_id = {r["id"]: r for r in rows}
        for label in LABELS:
            c = confusion([r for r in rows if args.errors_split in ("all", r["split"])], label)
            for kind, ids in (("FP", c["fp_ids"]), ("FN", c["fn_ids"])):
                for i in ids:
                    r = by_id[i]
                    print(f"{label} {kind} {i} [{r['split']}] Q: {r['prompt'][:90]!r} A: {r['answer'][:140]!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
