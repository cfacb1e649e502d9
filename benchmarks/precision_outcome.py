"""What bf16 autocast does to what DPO and the reward model learn, against fp32, measured against training noise.

``benchmarks/logprob_precision.py`` measures the rounding of one forward pass; what a stage hands on is a trained
model. This trains each stage three times from the same weights on the same rows, as the demo recipes do (DPO: 12
steps of 2 pairs, lr 5e-6, beta 0.1; reward model: 12 steps of 4 pairs, lr 1e-5, a seeded new score head):

- ``fp32``: no autocast, seed 42 (the baseline);
- ``bf16``: bf16 autocast with the fp32 LM head and log-softmax (``dpo.trainer``) and the fp32 score head
  (``rlhf.precision.keep_in_fp32``), seed 42: what ``precision: bf16`` trains;
- ``fp32 seed 43``: no autocast, the rows in another order: the noise of training itself, the yardstick.

Every trained model is then evaluated in fp32 on ``--heldout`` held-out pairs, so the differences are what
training learned, not how the evaluation rounds. Printed per stage and run:

- DPO: the implicit reward margin beta * ((log pi(c) - log ref(c)) - (log pi(r) - log ref(r))) on each held-out
  pair; its held-out accuracy (margin > 0); its sign agreement with the fp32 run and the relative distance
  ||m - m_fp32|| / ||m_fp32|| (0: the same update; 1: as far from fp32's update as no update at all);
- reward model: held-out agreement (score(chosen) > score(rejected)), sign agreement of the score difference with
  the fp32 run, and the relative distance of the score differences;
- both: the relative distance of the weight update ||dW - dW_fp32|| / ||dW_fp32||, and seconds per step.

Decision (``rlhf.precision``): bf16 is within training noise for a stage when, on every distance, bf16 is no
farther from fp32 than the reordered fp32 run is; ``auto`` then trains the stage in bf16 where bf16 is native.

    python benchmarks/precision_outcome.py                       # SmolLM2-135M, 64 held-out pairs
    python benchmarks/precision_outcome.py --model tiny --heldout 16 --emulated-bf16
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from logprob_precision import model_logps  # noqa: E402
from precision import run_stage  # noqa: E402

#: The demo recipes' training settings (recipes/demo/dpo.yaml, recipes/demo/reward_model.yaml).
DEMO = {"dpo": {"steps": 12, "batch": 2, "rows": 24, "learning_rate": 5e-6},
        "reward_model": {"steps": 12, "batch": 4, "rows": 48, "learning_rate": 1e-5}}
RUNS = (("fp32", False, 42), ("bf16", True, 42), ("fp32 seed 43", False, 43))


def _distance(a: np.ndarray, ref: np.ndarray) -> float:
    """||a - ref|| / ||ref||: 0 for the same vector, 1 for as far from ``ref`` as the zero vector."""
    return float(np.linalg.norm(a - ref) / max(np.linalg.norm(ref), 1e-12))


def within_noise(bf16: dict, noise: dict) -> bool:
    """bf16's run is within training noise: on every measure it is no farther from fp32 than the reordered fp32 run
    (``out_dist`` and ``update_dist`` no larger, ``sign`` agreement no smaller)."""
    return bf16["out_dist"] <= noise["out_dist"] and bf16["update_dist"] <= noise["update_dist"] \
        and bf16["sign"] >= noise["sign"]


def _update_distance(model, base: dict, ref_update: dict | None) -> tuple[dict, float | None]:
    update = {n: (p.detach().float() - base[n]) for n, p in model.named_parameters() if n in base}
    if ref_update is None:
        return update, None
    num = sum(float(((update[n] - ref_update[n]) ** 2).sum()) for n in ref_update)
    den = sum(float((ref_update[n] ** 2).sum()) for n in ref_update)
    return update, (num / max(den, 1e-30)) ** 0.5


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--data", default="demo:hh_rlhf/pairs_heldout.jsonl")
    ap.add_argument("--heldout", type=int, default=64)
    ap.add_argument("--stages", nargs="+", default=list(DEMO), choices=list(DEMO))
    ap.add_argument("--steps-scale", type=float, default=1.0,
                    help="Train this many times the demo recipe's steps (longer training, more rounding).")
    ap.add_argument("--beta", type=float, default=0.1)
    ap.add_argument("--emulated-bf16", action="store_true", help="Run bf16 even where it is not native.")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)

    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    transformers.logging.set_verbosity_error()

    from data.loaders import load_pairs
    from data.pairs import prepare_pairs
    from data.schemas import pair_to_trl
    from judging.scoring import load_reward_model, score
    from rlhf.machine import native_bf16, threads_per_process
    from rlhf.models import resolve_base_model

    torch.set_num_threads(threads_per_process(1))
    native, evidence = native_bf16()
    if not native and not args.emulated_bf16:
        print(f"bf16: {evidence}; nothing to compare (pass --emulated-bf16 to measure the emulation's numbers)")
        return
    path = resolve_base_model(args.model)
    tok = AutoTokenizer.from_pretrained(path)
    heldout = [pair_to_trl(p) for p in
               prepare_pairs(load_pairs(args.data, limit=args.heldout), tok, 256, file=args.data).pairs]
    print(f"model {args.model}, {len(heldout)} held-out pairs of {args.data}, {torch.get_num_threads()} threads; "
          f"bf16: {evidence}{'' if native else ' (EMULATED)'}", flush=True)

    verdicts = {}
    for stage in args.stages:
        settings = dict(DEMO[stage])
        settings["steps"] = max(1, round(settings["steps"] * args.steps_scale))
        if stage == "dpo":
            base_model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
            ref_logps = model_logps(base_model, heldout, tok)
        else:
            torch.manual_seed(0)  # the head run_stage starts from
            base_model, _ = load_reward_model(path, new_head=True)
        base = {n: p.detach().float().clone() for n, p in base_model.named_parameters()}
        del base_model
        rows = []
        ref_out = ref_update = None
        for name, bf16, seed in RUNS:
            run = run_stage(stage, path, settings["steps"], bf16, settings["rows"], batch=settings["batch"],
                            seed=seed, learning_rate=settings["learning_rate"], keep_model=True)
            model = run["model"].float()
            if stage == "dpo":
                lp = model_logps(model, heldout, tok)
                out = args.beta * ((lp[0::2] - ref_logps[0::2]) - (lp[1::2] - ref_logps[1::2]))
            else:
                prompts = [p["prompt"] for p in heldout for _ in (0, 1)]
                responses = [p[side][0]["content"] for p in heldout for side in ("chosen", "rejected")]
                s = score(model.eval(), tok, prompts, responses, batch_size=8, max_length=512)
                out = np.asarray(s)[0::2] - np.asarray(s)[1::2]
            update, upd_dist = _update_distance(model, base, ref_update)
            if ref_out is None:
                ref_out, ref_update = out, update
            rows.append({"run": name, "step_s": run["step_s"], "accuracy": float(np.mean(out > 0)),
                         "sign": float(np.mean(np.sign(out) == np.sign(ref_out))),
                         "out_dist": _distance(out, ref_out), "update_dist": upd_dist or 0.0,
                         "median_abs": float(np.median(np.abs(out)))})
            del model, run
        what = "margin" if stage == "dpo" else "score diff"
        print(f"\n{stage}: {settings['steps']} steps x {settings['batch']}, lr {settings['learning_rate']}; "
              f"{what} evaluated in fp32 on {len(heldout)} held-out pairs")
        print(f"  {'run':14s} {'s/step':>7s} {'accuracy':>8s} {'|' + what + '| med':>17s} "
              f"{'sign = fp32':>11s} {'dist ' + what:>16s} {'dist update':>11s}")
        for r in rows:
            print(f"  {r['run']:14s} {r['step_s']:7.2f} {r['accuracy']:8.3f} {r['median_abs']:17.4f} "
                  f"{r['sign']:11.3f} {r['out_dist']:16.4f} {r['update_dist']:11.4f}")
        fp32, bf16, noise = rows
        within = within_noise(bf16, noise)
        verdicts[stage] = within
        print(f"  bf16/fp32 step time {bf16['step_s'] / fp32['step_s']:.2f}x ({fp32['step_s'] / bf16['step_s']:.2f}x "
              f"faster); bf16 {'within' if within else 'OUTSIDE'} training noise (distance {bf16['out_dist']:.4f} vs "
              f"reordering's {noise['out_dist']:.4f}; update {bf16['update_dist']:.4f} vs "
              f"{noise['update_dist']:.4f}; signs {bf16['sign']:.3f} vs {noise['sign']:.3f})", flush=True)
    from rlhf.precision import resolve_precision

    for stage, within in verdicts.items():
        auto = resolve_precision("auto", stage)
        measured = "bf16" if within and native else "fp32"
        print(f"{stage}: measured choice {measured}, auto picks {auto} "
              f"({'agrees' if auto == measured else 'DISAGREES: update rlhf.precision'})")


if __name__ == "__main__":
    main()
