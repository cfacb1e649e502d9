"""What the canaries cost a gate run (gates/canaries.py): the gate stage (``gates.evaluate.main``) run once with a
preset's suite sizes, the round's reward model as judge (a sequence-classifier head on ``--model``, as the smoke
round's), and the stage's own timings read from its manifest: generation, judging (the candidate), canaries
(judging and measuring null, padded, flattering and refuse_all), total.

    PYTHONPATH=. python benchmarks/canary_cost.py --preset smoke --model tiny
    PYTHONPATH=. python benchmarks/canary_cost.py --preset demo --model tiny

Target: the canaries add judging only; on the smoke and demo presets their seconds stay below the candidate's
judging-and-measuring seconds times 4 (4 canaries, 3 of them judged) and well below generation.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import yaml

SIZES = ("n_winrate", "n_safe", "n_redteam", "n_capability", "n_sycophancy", "max_new_tokens", "mc_max_new_tokens")


def reward_model_dir(model: str, root: Path) -> Path:
    """A reward-model stage folder: ``model`` with a one-label score head and 60 held-out judgments that all agree
    with the experts (so the judge gate passes and the win-rate gates decide, as in tests/test_gates_stage.py)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    ckpt = root / "checkpoint"
    AutoModelForSequenceClassification.from_pretrained(model, num_labels=1).save_pretrained(ckpt)
    AutoTokenizer.from_pretrained(model).save_pretrained(ckpt)
    rows = [{"id": f"p{i}", "score_first": 1.0, "score_second": 0.0, "labels": [1, 1, 2]} for i in range(36)]
    rows += [{"id": f"q{i}", "score_first": -1.0, "score_second": 0.5, "labels": [2, 2, 0]} for i in range(24)]
    (root / "agreement_scores.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "manifest.json").write_text(json.dumps({"stage": "reward_model", "outputs": {
        "checkpoint": str(ckpt), "agreement_scores": str(root / "agreement_scores.jsonl")}}))
    return root


def main() -> None:
    from gates.evaluate import main as gates_main
    from rlhf.models import resolve_base_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="smoke", choices=["smoke", "demo"])
    ap.add_argument("--model", default="tiny", help="rlhf.models.resolve_base_model spec (baseline = candidate)")
    a = ap.parse_args()
    recipe = yaml.safe_load((Path(__file__).parent.parent / "recipes" / a.preset / "gates.yaml").read_text())
    model = resolve_base_model(a.model)
    with tempfile.TemporaryDirectory() as tmp:
        judge = reward_model_dir(model, Path(tmp) / "rm")
        out = Path(tmp) / "gates"
        sizes = [x for k in SIZES for x in (f"--{k}", str(recipe[k]))]
        t0 = time.perf_counter()
        gates_main(["--output_dir", str(out), "--baseline_dir", model, "--candidate_dir", model,
                    "--reward_model_dir", str(judge), "--report_to", "none", "--allow_same_model", "true",
                    "--fail_on_block", "false", *sizes])
        total = time.perf_counter() - t0
        manifest = json.loads((out / "manifest.json").read_text())
    eff, can = manifest["metrics"]["efficiency"], manifest["metrics"]["canaries"]
    gen, judging, canary = eff["generation_seconds"], eff["judging_seconds"], eff["canary_seconds"]
    print(f"preset {a.preset}, model {a.model}: " + ", ".join(f"{k} {recipe[k]}" for k in SIZES))
    print(f"generation {gen:.1f} s | judging+measuring (candidate) {judging:.1f} s | canaries {canary:.1f} s "
          f"({can['metrics']['canary_pairs_judged']['value']:.0f} pairs judged, "
          f"{can['metrics']['canary_judge_calls']['value']:.0f} judge requests) | stage total {total:.1f} s")
    print(f"canaries / (judging+measuring): {canary / judging:.2f} (target < 4); canaries share of the stage: "
          f"{100 * canary / total:.1f}%")
    print("canary verdicts: " + ", ".join(f"{r['canary']}/{r['gate']} {r['verdict']}" for r in can["table"]))


if __name__ == "__main__":
    main()
