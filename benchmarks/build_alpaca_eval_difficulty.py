"""Build the fixed AlpacaEval instruction difficulty (gates/alpaca_eval_instruction_difficulty.csv), once.

alpaca_eval computes its ``instruction_difficulty`` once (``notebooks/instruction_difficulty.ipynb``: a joint fit over
the leaderboard's models) and ships it as a file that every later LC uses unchanged; that file is on the Hugging Face
hub only. This script fits the stand-in once from the GLM inputs of every model whose alpaca_eval annotations we have
(``benchmarks/data/alpaca_eval_glm_inputs.csv.gz``: per model and instruction the preference and the two output
lengths, taken from the alpaca_eval repository at the commit of ``shared/datasets/alpaca_eval/SOURCE.txt``), with the
models' published coefficients held fixed (``gates.glm_winrate.build_instruction_difficulty``).

    python benchmarks/build_alpaca_eval_difficulty.py                       # refit from the committed inputs
    python benchmarks/build_alpaca_eval_difficulty.py --from-git DIR        # re-extract the inputs from a checkout
                                                                            # (bare git dir of tatsu-lab/alpaca_eval)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gates.glm_winrate import (  # noqa: E402
    DIFFICULTY_TERM,
    build_instruction_difficulty,
    load_glm_weights,
)

INPUTS = ROOT / "benchmarks" / "data" / "alpaca_eval_glm_inputs.csv.gz"
OUTPUT = ROOT / "gates" / "alpaca_eval_instruction_difficulty.csv"
ANNOTATOR = "weighted_alpaca_eval_gpt4_turbo"
BASELINE = "gpt4_1106_preview"
COMMIT = "cd543a149df89434d8a54582c0151c0b945c3d20"


def shared_dir() -> Path:
    return Path(os.environ.get("RLHF_SHARED_DATASETS", ROOT.parent / "shared" / "datasets")) / "alpaca_eval"


def extract_inputs(git_dir: Path, weights: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Per (model, instruction) GLM inputs from every readable annotations file of models with published weights.

    Returns (rows: model, index, preference, len_output_1, len_output_2; the instruction order of the baseline's
    outputs). Files whose blob is absent from the snapshot are skipped (listed on stderr).
    """

    def show(path: str) -> bytes | None:
        r = subprocess.run(["git", "-C", str(git_dir), "show", f"{COMMIT}:{path}"], capture_output=True)
        return r.stdout if r.returncode == 0 else None

    order = [r["instruction"] for r in json.loads(show(f"results/{BASELINE}/model_outputs.json"))]
    pos = {s: i for i, s in enumerate(order)}
    names = subprocess.run(["git", "-C", str(git_dir), "ls-tree", "-r", "--name-only", COMMIT, "results"],
                           capture_output=True, text=True, check=True).stdout.split()
    rows, skipped = [], []
    for f in names:
        parts = f.split("/")
        if len(parts) != 4 or parts[2] != ANNOTATOR or parts[3] != "annotations.json":
            continue
        model = parts[1]
        if model not in weights.index or model == BASELINE:
            continue
        blob = show(f)
        if blob is None:
            skipped.append(model)
            continue
        for i, a in enumerate(json.loads(blob)):
            if a["instruction"] not in pos:
                raise ValueError(f"{f}: row {i}: instruction not in the baseline's 805")
            rows.append({"model": model, "index": pos[a["instruction"]], "preference": a["preference"],
                         "len_output_1": len(a["output_1"] or ""), "len_output_2": len(a["output_2"] or "")})
    print(f"skipped (blob absent from the snapshot): {len(skipped)} models", file=sys.stderr)
    return pd.DataFrame(rows), order


def load_inputs(path: Path = INPUTS) -> dict[str, tuple]:
    """model -> (preferences, len_model, len_baseline, index) from the committed inputs file."""
    df = pd.read_csv(path)
    return {m: (g["preference"].to_numpy(float), g["len_output_2"].to_numpy(float),
                g["len_output_1"].to_numpy(float), g["index"].to_numpy(int)) for m, g in df.groupby("model", sort=True)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from-git", type=Path, help="bare git dir of tatsu-lab/alpaca_eval to re-extract the inputs from")
    args = ap.parse_args(argv)
    a = shared_dir()
    weights = load_glm_weights(a / "weights" / f"{ANNOTATOR}.length_controlled_v1.baseline_{BASELINE}.csv")
    lb = pd.read_csv(a / "leaderboards" / f"{ANNOTATOR}_leaderboard.csv", index_col=0)
    if args.from_git:
        rows, order = extract_inputs(args.from_git, weights)
        rows.to_csv(INPUTS, index=False, compression="gzip")
        pd.DataFrame({"index": range(len(order)), "instruction": order}).to_csv(OUTPUT, index=False)
    order = pd.read_csv(OUTPUT, keep_default_na=False)["instruction"].tolist()
    d, cal = build_instruction_difficulty(load_inputs(), weights, lb, n_instructions=len(order))
    print(cal.to_string(index=False))
    pd.DataFrame({"index": range(len(order)), "instruction": order, DIFFICULTY_TERM: d}).to_csv(
        OUTPUT, index=False, float_format="%.10f")
    print(f"wrote {OUTPUT} ({len(order)} instructions, {len(load_inputs())} models)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
