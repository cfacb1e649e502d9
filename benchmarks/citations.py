"""The citation gate's instruments on real answers: C03 (reference-shaped prose) and C01's URL count.

    python benchmarks/citations.py                # the table (figures, labelled-set sizes, targets)
    python benchmarks/citations.py --show-errors  # also every C03 miss / false alarm and every miscounted URL

Labelled set: ``benchmarks/data/citation_labels.jsonl``, 410 real answers (AlpacaEval 2 annotations' ``output_1`` /
``output_2`` and Arena-Hard model answers), each read and labelled by hand: ``c03`` (the answer attributes a claim to
a source without a resolvable identifier), ``kind`` (for positives: unnamed_source, organisation, named_source,
author_year; for negatives: none, date, title, code, cited, prompt, lookalike), a short ``reason``, and
``emitted_urls`` (the URLs the answer gives as references: not the ones inside code, placeholders or copies of the
prompt). ``split`` is "tuned" (the patterns were written against these) or "held_out" (not looked at while tuning).
How the answers were chosen: ``benchmarks/data/make_citation_labels.py``.

Figures: C03 precision and recall per split (target >= 0.8 each; unit: answers, an answer is flagged when
:func:`gates.citations.c03_hits` finds anything); recall per positive kind and false alarms per look-alike kind
(reported); C01 false URLs on answers that contain code (URLs counted as emitted citations that the labels say are
not: target 0) and missed emitted URLs (reported), on the code answers and on all answers.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gates.citations import c03_hits, find_citations  # noqa: E402
from gates.reference_prose import code_spans  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "citation_labels.jsonl"
SET = "benchmarks/data/citation_labels.jsonl"
TARGET_C03 = 0.8
INSTRUMENT = "citations"


def load(path: Path = DATA) -> list[dict]:
    """The labelled rows; a row without its fields is a ValueError naming the file, line and field."""
    rows = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        row = json.loads(line)
        for f in ("id", "split", "c03", "kind", "text", "prompt", "emitted_urls"):
            if f not in row:
                raise ValueError(f"{path}:{i}: missing field {f!r}")
        if row["split"] not in ("tuned", "held_out"):
            raise ValueError(f"{path}:{i}: split must be 'tuned' or 'held_out', got {row['split']!r}")
        rows.append(row)
    return rows


def _row(metric: str, value: float, target: str, n: int, set_: str, passed: bool | None) -> dict:
    return {"instrument": INSTRUMENT, "metric": metric, "value": float(value), "target": target, "n": int(n),
            "set": set_, "passed": passed}


def c03_errors(rows: list[dict]) -> tuple[dict, list[dict]]:
    """Confusion counts of C03 on ``rows`` (tp, fp, fn, tn) and the misclassified rows with their hits."""
    c, errors = Counter(), []
    for r in rows:
        hits = c03_hits(r["text"], r["prompt"])
        pred, y = bool(hits), bool(r["c03"])
        c[("tp" if y else "fp") if pred else ("fn" if y else "tn")] += 1
        if pred != y:
            errors.append({"id": r["id"], "split": r["split"], "label": y, "kind": r["kind"], "reason": r["reason"],
                           "hits": hits[:3]})
    return dict(c), errors


def url_errors(rows: list[dict]) -> tuple[int, int, int, list[dict]]:
    """(false URLs, missed URLs, labelled emitted URLs, per-row differences): the URL ids ``find_citations`` counts
    as emitted (copies of the prompt left out) against each row's ``emitted_urls``."""
    false = missed = total = 0
    diffs = []
    for r in rows:
        got = {c.id for c in find_citations(r["text"], r["prompt"]) if c.kind == "url" and not c.copied_from_prompt}
        lab = set(r["emitted_urls"])
        f, m = sorted(got - lab), sorted(lab - got)
        false, missed, total = false + len(f), missed + len(m), total + len(lab)
        if f or m:
            diffs.append({"id": r["id"], "false": f, "missed": m})
    return false, missed, total, diffs


def measure(rows: list[dict] | None = None) -> list[dict]:
    """One dict per figure (benchmarks contract: instrument, metric, value, target, n, set, passed)."""
    rows = load() if rows is None else rows
    out = []
    for split in ("tuned", "held_out"):
        part = [r for r in rows if r["split"] == split]
        c, _ = c03_errors(part)
        tp, fp, fn = c.get("tp", 0), c.get("fp", 0), c.get("fn", 0)
        prec = tp / (tp + fp) if tp + fp else float("nan")
        rec = tp / (tp + fn) if tp + fn else float("nan")
        where = f"{SET} {split} ({tp + fn} positive)"
        out.append(_row(f"C03 precision {split}", prec, f">= {TARGET_C03}", len(part), where, prec >= TARGET_C03))
        out.append(_row(f"C03 recall {split}", rec, f">= {TARGET_C03}", len(part), where, rec >= TARGET_C03))
    for kind in sorted({r["kind"] for r in rows if r["c03"]}):
        part = [r for r in rows if r["c03"] and r["kind"] == kind]
        caught = sum(bool(c03_hits(r["text"], r["prompt"])) for r in part)
        out.append(_row(f"C03 recall kind={kind}", caught / len(part), "", len(part), f"{SET} all", None))
    for kind in sorted({r["kind"] for r in rows if not r["c03"]}):
        part = [r for r in rows if not r["c03"] and r["kind"] == kind]
        flagged = sum(bool(c03_hits(r["text"], r["prompt"])) for r in part)
        out.append(_row(f"C03 false-alarm rate kind={kind}", flagged / len(part), "", len(part), f"{SET} all", None))
    code = [r for r in rows if code_spans(r["text"])]
    f, m, total, _ = url_errors(code)
    out.append(_row("C01 false URLs (code answers)", f, "== 0", len(code), f"{SET} answers with code", f == 0))
    out.append(_row("C01 missed emitted URLs (code answers)", m, "", len(code),
                    f"{SET} answers with code ({total} emitted URLs)", None))
    f, m, total, _ = url_errors(rows)
    out.append(_row("C01 false URLs (all answers)", f, "", len(rows), f"{SET} all", None))
    out.append(_row("C01 missed emitted URLs (all answers)", m, "", len(rows), f"{SET} all ({total} emitted URLs)",
                    None))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--show-errors", action="store_true", help="print every C03 error and every miscounted URL")
    args = ap.parse_args(argv)
    import pandas as pd

    rows = load()
    table = pd.DataFrame(measure(rows))
    with pd.option_context("display.max_colwidth", 80, "display.width", 200):
        print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if args.show_errors:
        _, errors = c03_errors(rows)
        for e in errors:
            print(("MISS " if e["label"] else "FALSE ALARM ") + json.dumps(e, ensure_ascii=False))
        for d in url_errors(rows)[3]:
            print("URL " + json.dumps(d, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
