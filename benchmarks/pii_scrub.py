"""The flywheel scrub's recall per class and false-scrub rate, on the labelled set ``benchmarks/data/pii_eval.jsonl``.

    python benchmarks/pii_scrub.py                 # the table (recall per class, false scrubs, set sizes, targets)
    python benchmarks/pii_scrub.py --show-misses   # also every missed span and every clean turn altered
    python benchmarks/pii_scrub.py --split heldout # only the templates written after tuning

A labelled span counts as found when every non-space character of it lies inside a span the scrub replaces (of any
class: what matters is that nothing of it reaches annotators). Recall per class = found / labelled; a clean turn
(code, math, versions, dates in prose, ISBNs, product names) counts as falsely scrubbed when anything in it is
replaced: false-scrub rate = altered clean turns / clean turns. "extra" counts replaced spans in the personal-data
turns that overlap no labelled span (over-scrubbing there). Targets: recall >= 0.98 on every structured class,
>= 0.90 on PERSON, false scrubs <= 2 %. The set is synthetic (``benchmarks/data/make_pii_eval.py``); exit status
1 when a target is missed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DATA = ROOT / "benchmarks" / "data" / "pii_eval.jsonl"
TARGET_STRUCTURED, TARGET_NAMES, TARGET_FALSE = 0.98, 0.90, 0.02


def covered(start: int, end: int, text: str, found: list[tuple[int, int, str]]) -> bool:
    """Every non-space character of ``text[start:end]`` inside one of ``found``."""
    return all(text[i].isspace() or any(s <= i < e for s, e, _ in found) for i in range(start, end))


def measure(rows: list[dict], scrubber) -> dict:
    """``{"classes": {cls: {"n", "found", "recall", "target"}}, "clean": {...}, "extra", "misses", "altered"}``."""
    n, hit, misses, altered, extra = Counter(), Counter(), [], [], 0
    n_clean = 0
    for row in rows:
        found = scrubber.find(row["text"])
        if row["kind"] == "clean":
            n_clean += 1
            if found:
                altered.append({"id": row["id"], "found": [(row["text"][s:e], c) for s, e, c in found]})
            continue
        for sp in row["spans"]:
            n[sp["class"]] += 1
            if covered(sp["start"], sp["end"], row["text"], found):
                hit[sp["class"]] += 1
            else:
                misses.append({"id": row["id"], "class": sp["class"], "value": sp["value"], "text": row["text"]})
        for s, e, _ in found:
            if not any(s < sp["end"] and sp["start"] < e for sp in row["spans"]):
                extra += 1
    classes = {
        c: {
            "n": n[c],
            "found": hit[c],
            "recall": hit[c] / n[c],
            "target": TARGET_NAMES if c == "PERSON" else TARGET_STRUCTURED,
        }
        for c in sorted(n)
    }
    return {
        "classes": classes,
        "clean": {"n": n_clean, "altered": len(altered), "rate": len(altered) / max(n_clean, 1), "target": TARGET_FALSE},
        "pii_turns": sum(r["kind"] == "pii" for r in rows),
        "spans": sum(n.values()),
        "extra": extra,
        "misses": misses,
        "altered": altered,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--show-misses", action="store_true")
    ap.add_argument("--split", choices=["all", "tune", "heldout"], default="all",
                    help="rows to count (heldout: templates written after the recognizers were tuned)")
    args = ap.parse_args(argv)
    from flywheel.scrub import Scrubber

    rows = [json.loads(line) for line in Path(args.data).read_text(encoding="utf-8").splitlines() if line.strip()]
    if args.split != "all":
        rows = [r for r in rows if r.get("split") == args.split]
    t0 = time.perf_counter()
    scrubber = Scrubber()
    t1 = time.perf_counter()
    res = measure(rows, scrubber)
    t2 = time.perf_counter()
    langs = sorted({r["lang"] for r in rows})
    print(f"set: {args.data} (split {args.split}): {res['pii_turns']} turns with personal data ({res['spans']} labelled spans), "
          f"{res['clean']['n']} clean turns; languages/scripts: {', '.join(langs)}")
    print(f"scrubber: {scrubber.manifest()['ner_model']}, {len(scrubber.recognizers)} recognizers; "
          f"load {t1 - t0:.1f} s, {1000 * (t2 - t1) / len(rows):.1f} ms per turn")
    print(f"{'class':<24}{'spans':>7}{'found':>7}{'recall':>9}{'target':>9}  ok")
    ok = True
    for c, v in res["classes"].items():
        good = v["recall"] >= v["target"]
        ok &= good
        print(f"{c:<24}{v['n']:>7}{v['found']:>7}{v['recall']:>9.3f}{'>= ' + format(v['target'], '.2f'):>9}  "
              f"{'yes' if good else 'NO'}")
    structured = [v for c, v in res["classes"].items() if c != "PERSON"]
    s_n, s_f = sum(v["n"] for v in structured), sum(v["found"] for v in structured)
    print(f"{'all structured':<24}{s_n:>7}{s_f:>7}{s_f / s_n:>9.3f}")
    cl = res["clean"]
    good = cl["rate"] <= cl["target"]
    ok &= good
    print(f"false scrubs: {cl['altered']}/{cl['n']} clean turns altered = {cl['rate']:.3f} (target <= "
          f"{cl['target']:.2f}) {'yes' if good else 'NO'}; extra spans in personal-data turns: {res['extra']}")
    if args.show_misses:
        for m in res["misses"]:
            print(f"MISS {m['id']} {m['class']}: {m['value']!r} in {m['text']!r}")
        for a in res["altered"]:
            print(f"ALTERED {a['id']}: {a['found']}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
