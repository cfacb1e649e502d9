"""AlpacaEval row: our raw, discrete and length-controlled win rates vs the published leaderboard.

For the three shared annotation sets (alpaca-7b, gpt-3.5-turbo-1106, gpt-3.5-turbo-1106_concise, judged by
weighted_alpaca_eval_gpt4_turbo against gpt4_1106_preview): raw and discrete win rate (must be exact), the
offline length_controlled_v1 GLM (gates/glm_winrate.py; difficulty from the other two models, priors from the
published weights minus the model itself), the minimal GLM (no difficulty), and the sensitivity of the LC figure
to the difficulty prior's SD.

    python benchmarks/alpaca_eval_lc.py [--shared ../shared/datasets]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pandas as pd

from gates.glm_winrate import load_glm_weights, published_lc_comparison

MODELS = ("alpaca-7b", "gpt-3.5-turbo-1106", "gpt-3.5-turbo-1106_concise")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = os.environ.get("RLHF_SHARED_DATASETS", str(Path(__file__).resolve().parents[2] / "shared" / "datasets"))
    ap.add_argument("--shared", default=default, help="The shared datasets folder (default ../shared/datasets).")
    args = ap.parse_args()
    a = Path(args.shared) / "alpaca_eval"
    ann = {m: json.loads((a / "annotations" / f"{m}.weighted_alpaca_eval_gpt4_turbo.annotations.json").read_text())
           for m in MODELS}
    weights = load_glm_weights(a / "weights" / "weighted_alpaca_eval_gpt4_turbo.length_controlled_v1.baseline_gpt4_1106_preview.csv")
    lb = pd.read_csv(a / "leaderboards" / "weighted_alpaca_eval_gpt4_turbo_leaderboard.csv", index_col=0)
    pd.set_option("display.width", 200)
    t = published_lc_comparison(ann, weights, lb)
    print(t.round(3).to_string())
    print("\nLC sensitivity to the difficulty prior SD (s):")
    sens = {s: published_lc_comparison(ann, weights, lb, prior_sd=s)["length_controlled_winrate"] for s in (1, 2, 3, 5, 10)}
    print(pd.DataFrame(sens).round(2).to_string())


if __name__ == "__main__":
    main()
