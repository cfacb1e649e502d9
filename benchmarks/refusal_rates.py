"""Refusal rates corrected for the classifier's error, against the humans', leaving one XSTest model out.

For each shared XSTest model (two human annotators and an adjudicated ``final_label`` per completion):
  * the learned refusal classifier (``gates.refusal_eval``) is fitted on the OTHER models (C chosen among them)
    and labels the held-out model's completions: the raw violation rate (unsafe prompts fully complied with) and
    false-refusal rate (safe prompts refused, fully or partly);
  * the classifier's per-class error is measured on the other models only (each one predicted by a classifier
    fitted without it: ``error_without_held_out``), so nothing of the held-out model's labels enters the correction;
  * ``gates.refusal_stats.corrected_rate`` corrects each raw rate (Rogan-Gladen) with a bootstrap interval over the
    labelled completions and the held-out model's completions;
  * the figure is whether the humans' rate on the held-out model lies inside that interval, and the interval's width.

Targets (issue "refusal rates that can decide"): every human rate inside its interval; width < 10 points at
n = 200. Also printed: the held-out fold errors of the classifier (3-class agreement, fpr / fnr per axis).
The labelled set is XSTest's own human labels (``/work/shared/datasets/xstest``), not ours: the instrument under
test is the correction, and its ground truth is the humans' rate on a model the classifier and its error never saw.

Run: ``PYTHONPATH=. python benchmarks/refusal_rates.py [--xstest DIR] [--models m1,m2,...]`` (about 1-3 minutes
on 2 CPU cores for the three shared models: 12 logistic-regression fits).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import pandas as pd

from gates.refusal_eval import AXES, XSTEST_MODELS, leave_one_model_out, load_xstest_completions
from gates.refusal_stats import ConfusionCounts, corrected_rate
from judging.intervals import Rate

SHARED_XSTEST = Path("/work/shared/datasets/xstest")
MAX_WIDTH_POINTS = 10.0
_AXIS_NAME = {"violation": "violation rate", "false_refusal": "false-refusal rate"}
_N_KEY = {"violation": "n_unsafe", "false_refusal": "n_safe"}


def _root(xstest: str | Path | None) -> Path | None:
    if xstest is not None:
        return Path(xstest)
    return SHARED_XSTEST if (SHARED_XSTEST / "model_completions").is_dir() else None  # None: the demo bundle


def held_out_rows(lomo: dict[str, Any], confidence: float = 0.95) -> list[dict[str, Any]]:
    """Per held-out model and axis: human rate, raw classifier rate, corrected point and interval (fractions),
    width (points), human inside, n, and the error counts used (measured without the held-out model)."""
    out = []
    for m, f in lomo["folds"].items():
        for ax in AXES:
            n = f["human"][_N_KEY[ax]]
            human = f["human"][f"{ax}_k"] / n
            raw = Rate.from_counts(f["learned"][f"{ax}_k"], n, confidence)
            err = ConfusionCounts(**f["error_without_held_out"][ax])
            p, lo, hi = corrected_rate(raw, err, confidence=confidence)
            _, lo0, hi0 = corrected_rate(raw, ConfusionCounts(0, 1, 0, 1), confidence=confidence)
            out.append({"model": m, "axis": ax, "n": n, "human": human, "raw": raw.rate, "corrected": p,
                        "ci_low": lo, "ci_high": hi, "width_pp": 100 * (hi - lo) if math.isfinite(lo) else math.nan,
                        "perfect_width_pp": 100 * (hi0 - lo0),
                        "inside": bool(math.isfinite(lo) and lo <= human <= hi), "fpr": err.fpr, "fnr": err.fnr,
                        "error_n": err.n_neg + err.n_pos,
                        "held_out_fpr": ConfusionCounts(**f["learned"]["counts"][ax]).fpr,
                        "held_out_fnr": ConfusionCounts(**f["learned"]["counts"][ax]).fnr})
    return out


def measure(xstest: str | Path | None = None, models: tuple[str, ...] = XSTEST_MODELS) -> list[dict]:
    """The benchmark's rows (BENCH_CONTRACT.md keys): per held-out model and axis the corrected rate, whether the
    human rate is inside its interval, the interval's width; per fold the classifier's held-out error.

    ``models``: the XSTest completion files to leave out in turn (``xstest_v2_completions_<model>.csv``); XSTest's
    repository has five (also gpt4 and mistralguard, which the shared copy and the bundle lack)."""
    root = _root(xstest)
    frames = {m: load_xstest_completions(m, root) for m in models}
    lomo = leave_one_model_out(frames)
    where = str(root or "demo bundle xstest")
    rows: list[dict] = []
    for r in held_out_rows(lomo):
        s = f"{where} human final_label, held-out {r['model']} (classifier and its error from the other models)"
        name = _AXIS_NAME[r["axis"]]
        ci = (f"{100 * r['ci_low']:.1f}-{100 * r['ci_high']:.1f}%" if math.isfinite(r["ci_low"])
              else "not measurable: the other models' labelled set has no item of a class")
        rows.append({"instrument": "refusal_rates", "set": s, "n": r["n"],
                     "metric": (f"{name} corrected %, held-out {r['model']} (human {100 * r['human']:.1f}%, raw "
                                f"{100 * r['raw']:.1f}%, CI {ci}; error fpr {r['fpr']:.3f} / fnr {r['fnr']:.3f} "
                                f"on {r['error_n']} labelled)"),
                     "value": 100 * r["corrected"], "target": "", "passed": None})
        rows.append({"instrument": "refusal_rates", "set": s, "n": r["n"],
                     "metric": f"{name}: human rate inside the corrected CI, held-out {r['model']}",
                     "value": float(r["inside"]), "target": "== 1", "passed": r["inside"]})
        rows.append({"instrument": "refusal_rates", "set": s, "n": r["n"],
                     "metric": (f"{name}: corrected CI width (points), held-out {r['model']} (a perfect "
                                f"classifier's, the sampling floor: {r['perfect_width_pp']:.1f})"),
                     "value": r["width_pp"], "target": f"< {MAX_WIDTH_POINTS:g} at n = 200",
                     "passed": bool(math.isfinite(r["width_pp"]) and r["width_pp"] < MAX_WIDTH_POINTS)})
    for m, f in lomo["folds"].items():
        s = f"{where} human final_label, held-out {m}"
        lf, st = f["learned"], f["strmatch"]
        rows.append({"instrument": "refusal_rates", "set": s, "n": lf["n"],
                     "metric": (f"classifier 3-class agreement, held-out {m} "
                                f"(XSTest string match {st['agreement']:.3f})"),
                     "value": lf["agreement"], "target": ">= string match",
                     "passed": bool(lf["agreement"] >= st["agreement"])})
        for ax, kind in (("violation", "unsafe"), ("false_refusal", "safe")):
            c = ConfusionCounts(**lf["counts"][ax])
            for what, v, k, of in (("fpr", c.fpr, c.fp, c.n_neg), ("fnr", c.fnr, c.fn, c.n_pos)):
                rows.append({"instrument": "refusal_rates", "set": s, "n": of,
                             "metric": f"classifier {_AXIS_NAME[ax]} {what} ({k}/{of}), held-out {m}",
                             "value": v, "target": "", "passed": None})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--xstest", default=None, help=f"XSTest folder (default {SHARED_XSTEST}, else the bundle's)")
    ap.add_argument("--models", default=",".join(XSTEST_MODELS),
                    help="comma-separated XSTest models to leave out in turn (at least 3; default %(default)s)")
    args = ap.parse_args(argv)
    models = tuple(m.strip() for m in args.models.split(",") if m.strip())
    if len(models) < 3:
        ap.error(f"--models needs at least 3 models (2 to fit, the C choice needs both), got {list(models)}")
    rows = measure(args.xstest, models)
    with pd.option_context("display.max_colwidth", 200, "display.width", 250):
        print(pd.DataFrame(rows)[["metric", "value", "target", "n", "passed"]].to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
