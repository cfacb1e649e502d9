"""alpaca_eval's length-controlled win rate: our LC and lc_standard_error against the published leaderboard.

alpaca_eval (src/alpaca_eval/metrics/glm_winrate.py, commit cd543a1) computes ``lc_standard_error`` as the ``sem``
over instructions of the GLM's predicted preferences at zero length difference, with a fixed, precomputed
instruction difficulty (hub-only file); ours is the same formula with the fixed stand-in difficulty
(gates/alpaca_eval_instruction_difficulty.csv, built once by benchmarks/build_alpaca_eval_difficulty.py).

Figures (labelled sets: the published leaderboard and weights in shared/datasets/alpaca_eval, and the GLM inputs of
56 models in benchmarks/data/alpaca_eval_glm_inputs.csv.gz):
  * SE and LC from the published coefficients (alpaca_eval's predict path) vs the published figures; the models
    with a published lc_standard_error were not used to choose the difficulty's prior SD (held out);
  * SE and LC refitted from each model's own annotations, with a difficulty fitted without that model (held out);
  * the three shared annotation sets (published_lc_comparison, the shipped difficulty);
  * stability: the largest move of any other model's LC when one model is added to or removed from the set the
    difficulty is fitted on, and when one model is added to the evaluated set.

    python benchmarks/alpaca_eval_lc.py [--shared ../shared/datasets] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import pandas as pd
from threadpoolctl import threadpool_limits

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from build_alpaca_eval_difficulty import INPUTS, load_inputs  # noqa: E402

from gates.glm_winrate import (  # noqa: E402
    DIFFICULTY_TERM,
    lc_moves_when_reference_changes,
    load_glm_weights,
    load_instruction_difficulty,
    predicted_lc_from_weights,
    published_lc_comparison,
)

INSTRUMENT = "alpaca_eval length-controlled win rate"
SHARED_MODELS = ("alpaca-7b", "gpt-3.5-turbo-1106", "gpt-3.5-turbo-1106_concise")
SE_TARGET = 0.05  # points of lc_standard_error
MOVE_TARGET = 0.5  # LC points
ADVERSARIAL = ("NullModel", "gpt4_gamed")  # models built to game the judge; their LC is reported, not averaged
INPUTS_SET = "benchmarks/data/alpaca_eval_glm_inputs.csv.gz"
LB_FILE = "weighted_alpaca_eval_gpt4_turbo_leaderboard.csv"
W_FILE = "weighted_alpaca_eval_gpt4_turbo.length_controlled_v1.baseline_gpt4_1106_preview.csv"


def shared_dir(shared: str | None = None) -> Path:
    default = os.environ.get("RLHF_SHARED_DATASETS", str(ROOT.parent / "shared" / "datasets"))
    return Path(shared or default) / "alpaca_eval"


def tables(shared: str | None = None, quick: bool = False) -> dict[str, pd.DataFrame]:
    """Every per-model table behind the figures (see the module docstring)."""
    a = shared_dir(shared)
    weights = load_glm_weights(a / "weights" / W_FILE)
    lb = pd.read_csv(a / "leaderboards" / LB_FILE, index_col=0)
    d = load_instruction_difficulty()[DIFFICULTY_TERM].to_numpy()
    inputs = load_inputs(INPUTS)

    pub_models = [m for m in weights.index if m in lb.index and m != "gpt4_1106_preview"]
    pred = predicted_lc_from_weights(weights, d, pub_models)
    pred["published_lc"] = lb.loc[pub_models, "length_controlled_winrate"].astype(float)
    pred["published_lc_standard_error"] = lb.loc[pub_models, "lc_standard_error"].astype(float)
    pred["lc_error"] = pred["length_controlled_winrate"] - pred["published_lc"]
    pred["lc_standard_error_error"] = pred["lc_standard_error"] - pred["published_lc_standard_error"]

    evaluate = list(inputs) if not quick else [m for m in inputs if m in SHARED_MODELS
                                               or pd.notna(lb.loc[m, "lc_standard_error"])]
    moves = lc_moves_when_reference_changes(inputs, weights, evaluate=evaluate, change=list(inputs),
                                            n_instructions=d.size)
    held = moves.loc[evaluate, ["held_out_lc", "held_out_lc_standard_error"]].copy()
    held["published_lc"] = lb.loc[evaluate, "length_controlled_winrate"].astype(float)
    held["published_lc_standard_error"] = lb.loc[evaluate, "lc_standard_error"].astype(float)
    held["lc_error"] = held["held_out_lc"] - held["published_lc"]
    held["lc_standard_error_error"] = held["held_out_lc_standard_error"] - held["published_lc_standard_error"]

    ann = {m: json.loads((a / "annotations" / f"{m}.weighted_alpaca_eval_gpt4_turbo.annotations.json").read_text())
           for m in SHARED_MODELS}
    shared_t = published_lc_comparison(ann, weights, lb)
    # adding a model to the evaluated set: each model's LC alone vs with the others (fixed difficulty: no refit)
    alone = pd.concat([published_lc_comparison({m: ann[m]}, weights, lb) for m in SHARED_MODELS])
    shared_t["move_when_evaluated_with_others"] = (alone["length_controlled_winrate"]
                                                   - shared_t["length_controlled_winrate"]).abs()
    return {"predicted": pred, "held_out": held, "moves": moves, "shared": shared_t}


def rows_of(t: dict[str, pd.DataFrame]) -> list[dict]:
    """The contract's rows from ``tables``."""
    pred, held, moves, shared_t = t["predicted"], t["held_out"], t["moves"], t["shared"]
    se = pred.dropna(subset=["published_lc_standard_error"])
    lc_only = pred[pred["published_lc_standard_error"].isna()]
    held_se = held.dropna(subset=["published_lc_standard_error"])
    held_lc = held.drop(index=[m for m in ADVERSARIAL if m in held.index])
    pub_set = f"shared/datasets/alpaca_eval leaderboard + weights"

    def row(metric, value, target, n, set_, passed=None):
        return {"instrument": INSTRUMENT, "metric": metric, "value": float(value), "target": target, "n": int(n),
                "set": set_, "passed": passed}

    max_se = float(se["lc_standard_error_error"].abs().max())
    max_held_se = float(held_se["lc_standard_error_error"].abs().max())
    max_move = float(moves["max_move"].max())
    max_eval_move = float(shared_t["move_when_evaluated_with_others"].max())
    out = [
        row("lc_standard_error, published coefficients: max |ours - published|", max_se, f"<= {SE_TARGET}", len(se),
            f"{pub_set}: models with a published lc_standard_error (held out from the prior-SD choice)",
            max_se <= SE_TARGET),
        row("lc_standard_error, published coefficients: mean (ours - published)",
            se["lc_standard_error_error"].mean(), "", len(se), f"{pub_set}: same models"),
        row("LC, published coefficients: mean |ours - published| (points)", lc_only["lc_error"].abs().mean(), "",
            len(lc_only),
            f"{pub_set}: models without a published lc_standard_error (the prior-SD choice was tuned on)"),
        row("LC, published coefficients: max |ours - published| (points)", pred["lc_error"].abs().max(), "",
            len(pred), f"{pub_set}: every model with weights"),
        row("lc_standard_error, refit on own annotations: max |ours - published|", max_held_se, f"<= {SE_TARGET}",
            len(held_se), f"{INPUTS_SET}: models with a published lc_standard_error; difficulty without the model",
            max_held_se <= SE_TARGET),
        row("LC, refit on own annotations: mean |ours - published| (points)", held_lc["lc_error"].abs().mean(), "",
            len(held_lc), f"{INPUTS_SET}: difficulty without the model; adversarial {ADVERSARIAL} left out"),
        row("LC, refit on own annotations: max |ours - published| (points)", held_lc["lc_error"].abs().max(), "",
            len(held_lc), f"{INPUTS_SET}: same models"),
        row("max LC move of another model when one model joins/leaves the difficulty's reference set (points)",
            max_move, f"<= {MOVE_TARGET}", len(moves), f"{INPUTS_SET}: every model added/removed in turn",
            max_move <= MOVE_TARGET),
        row("max LC move when a model is added to the evaluated set (points)", max_eval_move, f"<= {MOVE_TARGET}",
            len(shared_t), "shared/datasets/alpaca_eval/annotations (the 3 shared models, fixed difficulty)",
            max_eval_move <= MOVE_TARGET),
    ]
    for m, r in shared_t.iterrows():
        out.append(row(f"LC error {m} (ours - published, points; shipped difficulty)", r["lc_error"], "", 805,
                       "shared/datasets/alpaca_eval/annotations"))
    return out


def measure(shared: str | None = None, quick: bool = False) -> list[dict]:
    return rows_of(_limited(tables, shared, quick))


def _limited(fn, *args):
    # ~3,000 three-parameter L-BFGS fits: BLAS threads only add contention there (8x slower on a busy 2-core machine)
    with threadpool_limits(1):
        return fn(*args)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", default=None, help="The shared datasets folder (default ../shared/datasets).")
    ap.add_argument("--quick", action="store_true",
                    help="stability over the 3 shared and the published-SE models only (all 56 otherwise)")
    args = ap.parse_args(argv)
    t = _limited(tables, args.shared, args.quick)
    pd.set_option("display.width", 250)
    pd.set_option("display.max_rows", 500)
    print("lc_standard_error and LC from the published coefficients (models with a published lc_standard_error):")
    print(t["predicted"].dropna(subset=["published_lc_standard_error"]).round(4).to_string())
    print("\nRefit on each model's own annotations, difficulty fitted without it (held out):")
    print(t["held_out"].round(4).to_string())
    print("\nLargest LC move of another model when each model joins/leaves the difficulty's reference set:")
    print(t["moves"][["max_move", "worst", "n_evaluated"]].round(4).to_string())
    print("\nThe three shared annotation sets (shipped difficulty):")
    print(t["shared"].round(4).T.to_string())
    print()
    print(pd.DataFrame(rows_of(t)).to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
