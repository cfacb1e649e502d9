"""PPO, GRPO and RLOO side by side: the same round's SFT (pi_ref), DPO policy and reward model, the same prompts and
the same budget (optimizer steps x completions per step, completion length), each method run as its stage's own
process (``python -m <stage>.train`` with its preset's recipe), then every trained policy measured the same way.

    PYTHONPATH=. python benchmarks/online_rl.py --build-smoke                 # tiny model: builds the round first
    PYTHONPATH=. python benchmarks/online_rl.py --round-dir runs/demo-20261201 --preset demo --gold-model DIR

Printed per method (one table, plus ``online_rl.json`` in the output folder):

* ``train reward``: the reward model's mean score of the last step's completions, as the stage logged it (PPO
  ``objective/score``, GRPO/RLOO ``reward``; GRPO/RLOO with more than one reward function log the weighted sum);
* ``held-out reward``: the round's reward model's mean score of greedy answers to ``--n-eval`` held-out prompts;
* ``gold``: win rate (ties 1/2, ``judging.tripwires.gold_win_rate``) of those answers over the DPO start's, scored
  by ``--gold-model`` (a second reward model, never the optimised one; ``--build-smoke`` trains one with another
  seed); without one the column says so;
* ``KL``: KL(pi || pi_ref) in nats per completion, the same estimator for every method: one sampled completion per
  held-out prompt, the mean over prompts of sum_t [log pi(y_t) - log pi_ref(y_t)] (k1, unbiased for the sequence
  KL; Schulman 2020, "Approximating KL divergence"); the stages' own KL logs differ (PPO's per sequence, TRL's a
  per-token mean), so they are not compared;
* ``wall s``: the stage process's wall time (start-up and model loading included).

A first row measures the DPO start the same way (gold 0.5 by construction; its KL is DPO's own distance from
pi_ref), so each method's change reads against it.

No target: the benchmark compares methods on one budget; the README says which to pick when.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

METHODS = ("ppo", "grpo", "rloo")


def budget_args(method: str, *, steps: int, completions: int, samples: int, max_new_tokens: int, prompts: int,
                prompts_data: str) -> list[str]:
    """The stage flags that give ``method`` the common budget: ``steps`` optimizer steps of ``completions``
    completions each (GRPO/RLOO: ``completions / samples`` prompts x ``samples`` completions), ``max_new_tokens``
    per completion, the first ``prompts`` prompts of ``prompts_data``.

    Raises:
        ValueError: ``completions`` is not a multiple of ``samples`` (GRPO/RLOO group completions by prompt).
    """
    if completions % samples:
        raise ValueError(f"--completions {completions} must be a multiple of --samples {samples}")
    if method == "ppo":
        return ["--num_steps", str(steps), "--batch_size", str(completions), "--mini_batch_size", str(completions),
                "--micro_batch_size", str(completions), "--max_new_tokens", str(max_new_tokens),
                "--prompts_data", prompts_data, "--max_prompts", str(prompts), "--save_steps", "0"]
    return ["--max_steps", str(steps), "--per_device_train_batch_size", str(completions),
            "--num_generations", str(samples), "--max_completion_length", str(max_new_tokens),
            "--train_data", prompts_data, "--max_train_samples", str(prompts), "--save_strategy", "no"]


def build_smoke_round(root: Path) -> tuple[Path, Path]:
    """The smoke preset's sft, dpo and reward_model stages (as the round flow runs them) in ``root``, plus a second
    reward model trained with another seed as the gold scorer. Returns ``(round_dir, gold_reward_model_dir)``."""
    from flows.round import RoundParameters, gate_suites_file, stage_args
    from flows.stages import run_stage
    from rlhf.registry import STAGES

    params = RoundParameters(preset="smoke")
    recipes = ROOT / "recipes" / "smoke"
    gate_suites_file(params, root)
    dirs: dict[str, str] = {}
    for stage in ("sft", "dpo", "reward_model"):
        run = run_stage(stage, STAGES[stage].module, recipes / f"{stage}.yaml", root / stage, runs_dir=root.parent,
                        extra_args=[*stage_args(stage, params, root, dirs), "--round_id", root.name,
                                    "--report_to", "none"], log=lambda *_: None)
        dirs[stage] = run.output_dir
    gold = run_stage("reward_model", STAGES["reward_model"].module, recipes / "reward_model.yaml",
                     root / "gold_reward_model", runs_dir=root.parent, log=lambda *_: None,
                     extra_args=[*stage_args("reward_model", params, root, dirs), "--round_id", root.name,
                                 "--report_to", "none", "--seed", "7"])
    return root, Path(gold.output_dir)


def unlock_file(round_dir: Path, out: Path) -> Path:
    """An unlock decision with the benchmark's override recorded (the methods are compared whatever the rule says)."""
    from judging.unlock import decide_from_metrics
    from rlhf.manifest import read_manifest

    metrics = read_manifest(round_dir / "reward_model").get("metrics", {})
    decision = decide_from_metrics(metrics, override=True, override_reason="benchmarks/online_rl.py compares methods")
    path = out / "unlock.json"
    path.write_text(json.dumps(decision.to_dict()))
    return path


def train_reward(method: str, manifest: dict) -> float | None:
    """The last step's mean reward of the training completions, as the stage logged it."""
    history = manifest.get("metrics", {}).get("history") or []
    if not history:
        return None
    return history[-1].get("objective/score" if method == "ppo" else "reward")


def measure_policy(policy_dir: Path, start_dir: Path, pi_ref_dir: Path, reward_dir: Path, gold_dir: Path | None,
                   prompts: list, max_new_tokens: int, seed: int) -> dict:
    """Held-out reward, gold win rate over the start policy, and the sampled k1 KL to pi_ref (module docstring)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from judging.scoring import load_reward_model, score
    from judging.tripwires import gold_win_rate
    from rlhf.generation import chat_prompt, generate

    tok = AutoTokenizer.from_pretrained(policy_dir)
    policy = AutoModelForCausalLM.from_pretrained(policy_dir).eval()
    start = AutoModelForCausalLM.from_pretrained(start_dir).eval()
    answers, _ = generate(policy, tok, prompts, max_new_tokens=max_new_tokens, desc="policy")
    start_answers, _ = generate(start, tok, prompts, max_new_tokens=max_new_tokens, desc="start")
    rm, rm_tok = load_reward_model(str(reward_dir))
    out = {"held_out_reward": float(score(rm, rm_tok, prompts, answers).mean())}
    if gold_dir is not None:
        gold, gold_tok = load_reward_model(str(gold_dir))
        out["gold"] = gold_win_rate(score(gold, gold_tok, prompts, answers).tolist(),
                                    score(gold, gold_tok, prompts, start_answers).tolist())
    ref = AutoModelForCausalLM.from_pretrained(pi_ref_dir).eval()
    torch.manual_seed(seed)
    kls = []
    with torch.no_grad():
        for p in prompts:
            ids = tok(chat_prompt(tok, p), return_tensors="pt", add_special_tokens=False).input_ids
            seq = policy.generate(ids, do_sample=True, max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id
                                  or tok.eos_token_id)
            n = ids.shape[1]
            if seq.shape[1] == n:
                kls.append(0.0)
                continue

            def logp(model):
                logits = model(seq).logits[0, n - 1:-1].float()
                return torch.log_softmax(logits, -1).gather(-1, seq[0, n:, None]).squeeze(-1)

            kls.append(float((logp(policy) - logp(ref)).sum()))
    out["kl"] = sum(kls) / len(kls)
    return out


def run_method(method: str, preset: str, round_dir: Path, out: Path, unlock: Path, budget: list[str]) -> dict:
    """One stage process; returns its manifest and wall seconds.

    Raises:
        RuntimeError: the stage failed (its last lines of output in the message).
    """
    from rlhf.manifest import read_manifest

    stage_out = out / method
    cmd = [sys.executable, "-m", f"{method}.train", "--config", str(ROOT / "recipes" / preset / f"{method}.yaml"),
           "--output_dir", str(stage_out), "--sft_dir", str(round_dir / "sft"), "--policy_dir", str(round_dir / "dpo"),
           "--reward_model_dir", str(round_dir / "reward_model"), "--ppo_unlock_json", str(unlock),
           "--round_id", f"{round_dir.name}-bench", "--report_to", "none", *budget]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
        raise RuntimeError(f"{method} failed (exit {proc.returncode}):\n{tail}")
    return {"manifest": read_manifest(stage_out), "seconds": seconds}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--round-dir", type=Path, help="A round folder with sft/, dpo/ and reward_model/ stage outputs.")
    ap.add_argument("--build-smoke", action="store_true", help="Build the smoke round (tiny model) in --out first.")
    ap.add_argument("--preset", default="smoke", help="Recipe folder of the online-RL stages (default smoke).")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--gold-model", type=Path, help="A second reward-model stage folder: the gold scorer.")
    ap.add_argument("--steps", type=int, default=4, help="Optimizer steps per method.")
    ap.add_argument("--completions", type=int, default=4, help="Completions per step.")
    ap.add_argument("--samples", type=int, default=2, help="GRPO/RLOO completions per prompt.")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--prompts", type=int, default=16, help="Training prompts (the first N of --prompts-data).")
    ap.add_argument("--prompts-data", default="demo:hh_rlhf/pairs_train.jsonl")
    ap.add_argument("--eval-data", default="demo:hh_rlhf/pairs_heldout.jsonl", help="Held-out prompts.")
    ap.add_argument("--n-eval", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="Output folder (default: a temporary one).")
    args = ap.parse_args(argv)
    if not args.round_dir and not args.build_smoke:
        ap.error("give --round-dir DIR or --build-smoke")

    from data.loaders import load_eval_prompts

    out = args.out or Path(tempfile.mkdtemp(prefix="online-rl-"))
    out.mkdir(parents=True, exist_ok=True)
    round_dir, gold = args.round_dir, args.gold_model
    if args.build_smoke:
        print(f"building the smoke round in {out / 'round'} (sft, dpo, reward model, gold reward model) ...",
              flush=True)
        round_dir, built_gold = build_smoke_round(out / "round")
        gold = gold or built_gold
    round_dir = round_dir.resolve()
    unlock = unlock_file(round_dir, out)
    eval_prompts = [r.prompt for r in load_eval_prompts(args.eval_data, limit=args.n_eval)]
    pi_ref = Path(read_pi_ref(round_dir))
    start = round_dir / "dpo" / "checkpoint"
    gold_ckpt = None if gold is None else gold / "checkpoint"
    # the DPO policy every method starts from, measured the same way: the row each method's change is read against
    rows = [{"method": "dpo (start)", "train_reward": None, "wall_s": None, "tokens_per_s": None,
             **measure_policy(start, start, pi_ref, round_dir / "reward_model" / "checkpoint", gold_ckpt,
                              eval_prompts, args.max_new_tokens, args.seed)}]
    for method in args.methods:
        budget = budget_args(method, steps=args.steps, completions=args.completions, samples=args.samples,
                             max_new_tokens=args.max_new_tokens, prompts=args.prompts, prompts_data=args.prompts_data)
        print(f"{method}: {args.steps} steps x {args.completions} completions ...", flush=True)
        run = run_method(method, args.preset, round_dir, out, unlock, budget)
        m = measure_policy(out / method / "checkpoint", start, pi_ref, round_dir / "reward_model" / "checkpoint",
                           gold_ckpt, eval_prompts, args.max_new_tokens, args.seed)
        rows.append({"method": method, "train_reward": train_reward(method, run["manifest"]), **m,
                     "wall_s": run["seconds"],
                     "tokens_per_s": run["manifest"].get("metrics", {}).get("efficiency", {}).get("tokens_per_s")})
    (out / "online_rl.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                     "round_dir": str(round_dir), "rows": rows}, indent=2))
    fmt = (lambda v, spec=".3f": "-" if v is None else format(v, spec))
    print(f"\nsame budget: {args.steps} steps x {args.completions} completions of <= {args.max_new_tokens} tokens, "
          f"{args.prompts} prompts; measured on {len(eval_prompts)} held-out prompts "
          f"({'gold: ' + str(gold) if gold else 'no --gold-model: gold not measured'})")
    print(f"{'method':<11} {'train reward':>12} {'held-out reward':>15} {'gold':>6} {'KL nats':>8} {'wall s':>7} "
          f"{'tok/s':>7}")
    for r in rows:
        print(f"{r['method']:<11} {fmt(r['train_reward']):>12} {fmt(r['held_out_reward']):>15} "
              f"{fmt(r.get('gold')):>6} {fmt(r['kl']):>8} {fmt(r['wall_s'], '.1f'):>7} "
              f"{fmt(r['tokens_per_s'], '.1f'):>7}")
    print(f"\n{out / 'online_rl.json'}")
    return 0


def read_pi_ref(round_dir: Path) -> str:
    """The frozen pi_ref folder the SFT stage recorded (``outputs.pi_ref``)."""
    from rlhf.manifest import read_manifest

    return read_manifest(round_dir / "sft")["outputs"]["pi_ref"]


if __name__ == "__main__":
    sys.exit(main())
