"""Scale-out overheads: a stage through the flow vs the same training launched directly with TRL,
and the gate stage's generation throughput on 1 and 2 processes, in one run.

1. SFT (smoke recipe, tiny model) through the flow: a Prefect flow whose task calls ``flows.stages.run_stage``
   (what the round flow's stage task calls: ``accelerate launch -m sft.train`` with the recipe, cache key, stage
   folder, manifest), against plain TRL launched directly: ``SFTTrainer`` on the same prepared rows with the stage
   config's own TRL fields and as many threads (``benchmarks/step_time.py``'s ``trl-same`` child, given the smoke
   recipes; its default sampler, where the stage groups batches by length). Reported: step time of each
   (``train_runtime / steps``, the Trainer's own clock) and their ratio (target <= 1.05), and apart from it the fixed
   start-up cost (process wall time minus training time: imports, model conversion / loading, data validation,
   decontamination, hashing, the style audit, saving the checkpoint and pi_ref, the Prefect flow run).
2. Gate generation tokens/s: ``gates.evaluate`` on 1 process and on 2 (``torchrun --nproc_per_node 2``, gloo), same
   inputs (the smoke suites with ``--n`` items each, two noisy tiny models): generated tokens of both models over the
   generation wall time, from each run's manifest (``metrics.efficiency``); the generations are checked identical.

    python benchmarks/scale_out.py                 # tiny model, 20 SFT steps x 2 repeats, 24 items a suite
    python benchmarks/scale_out.py --steps 40 --n 48

Prints the load average before and after: on a shared machine the numbers move with it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def sft_through_flow(work: Path, steps: int) -> dict:
    """The SFT stage in a Prefect flow (run_stage in a task); wall time of the whole flow and the manifest."""
    os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="scale-out-prefect-"))  # a private Prefect home
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")  # busy shared CPUs start slowly
    t0 = time.perf_counter()
    from prefect import flow, task

    from flows.stages import run_stage

    @task
    def sft_task():
        return run_stage("sft", "sft.train", ROOT / "recipes/smoke/sft.yaml", work / "flow_sft", force=True,
                         extra_args=["--max_steps", str(steps), "--report_to", "none"],
                         log=lambda line: None)

    @flow(name="scale-out-sft")
    def one_stage():
        return sft_task()

    run = one_stage()
    wall = time.perf_counter() - t0
    eff = run.manifest["metrics"]["efficiency"]
    return {"wall": wall, "stage_wall": run.seconds, "train_seconds": eff["train_seconds"],
            "steps": run.manifest["metrics"]["train_steps"], "threads": eff["threads"],
            "loss": run.manifest["metrics"]["train_loss"]}


def sft_stage_alone(work: Path, steps: int) -> dict:
    """The stage launched as the flow launches it (``flows.stages.launch_command``: accelerate launch, threads per
    process) but without Prefect: separates the stage's own cost from the flow's."""
    from flows.stages import launch_command

    out = work / "alone_sft"
    cmd = launch_command("sft.train", ROOT / "recipes/smoke/sft.yaml", out,
                         ["--max_steps", str(steps), "--report_to", "none"], None)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, check=False, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "WANDB_MODE": "disabled"})
    wall = time.perf_counter() - t0
    if proc.returncode:
        sys.exit(f"sft stage failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    m = json.loads((out / "manifest.json").read_text())["metrics"]
    return {"wall": wall, "train_seconds": m["efficiency"]["train_seconds"], "steps": m["train_steps"],
            "loss": m["train_loss"], "threads": m["efficiency"]["threads"]}


def sft_direct(steps: int) -> dict:
    """Plain TRL on the same prepared rows and recipe (``benchmarks/step_time.py``'s ``trl-same`` child, pointed at
    the smoke recipes), in its own process with the same threads; wall time of that process."""
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import benchmarks.step_time as st, pathlib; "
            "st.RECIPES = pathlib.Path(sys.argv[1]) / 'recipes' / 'smoke'; "
            "print('DIRECT ' + json.dumps(st.child('sft', 'trl-same', int(sys.argv[2]), None)))")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, str(ROOT), str(steps)], check=False, cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "WANDB_MODE": "disabled"})
    wall = time.perf_counter() - t0
    line = next((x for x in proc.stdout.splitlines() if x.startswith("DIRECT ")), None)
    if proc.returncode != 0 or line is None:
        sys.exit(f"direct TRL run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    r = json.loads(line[len("DIRECT "):])
    return {"wall": wall, "train_seconds": r["s_per_step"] * r["steps"], "steps": r["steps"], "loss": r["loss"],
            "threads": r["threads"]}


def noisy_models(work: Path) -> dict:
    """Baseline and candidate for the gate runs (the tiny model plus seeded noise: prompt-dependent text) and a
    reward-model stage dir (tiny sequence classifier)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    from rlhf.models import resolve_base_model

    tiny = resolve_base_model("tiny")
    tok = AutoTokenizer.from_pretrained(tiny)
    out = {}
    for who, seed in (("baseline", 1), ("candidate", 2)):
        torch.manual_seed(seed)
        m = AutoModelForCausalLM.from_pretrained(tiny)
        with torch.no_grad():
            for p in m.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        m.save_pretrained(work / who)
        tok.save_pretrained(work / who)
        out[who] = str(work / who)
    torch.manual_seed(3)
    ckpt = work / "rm" / "checkpoint"
    AutoModelForSequenceClassification.from_pretrained(tiny, num_labels=1).save_pretrained(ckpt)
    tok.save_pretrained(ckpt)
    (work / "rm" / "manifest.json").write_text(json.dumps({"stage": "reward_model",
                                                           "outputs": {"checkpoint": str(ckpt)}}))
    out["judge"] = str(work / "rm")
    return out


def gate_run(work: Path, models: dict, nproc: int, n: int, max_new_tokens: int) -> dict:
    out = work / f"gates{nproc}"
    args = ["-m", "gates.evaluate", "--config", str(ROOT / "recipes/smoke/gates.yaml"), "--output_dir", str(out),
            "--baseline_dir", models["baseline"], "--candidate_dir", models["candidate"],
            "--reward_model_dir", models["judge"], "--report_to", "none", "--fail_on_block", "false",
            "--max_new_tokens", str(max_new_tokens), "--mc_max_new_tokens", str(max_new_tokens),
            *[x for s in ("winrate", "safe", "redteam", "capability", "sycophancy") for x in (f"--n_{s}", str(n))]]
    cmd = [sys.executable, *args] if nproc == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), *args]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, check=False, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "WANDB_MODE": "disabled"})
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"gate run on {nproc} processes failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    eff = json.loads((out / "manifest.json").read_text())["metrics"]["efficiency"]
    tokens = eff["tokens_per_s"] * eff["generation_seconds"]
    return {"wall": wall, "tokens": tokens, "generation_seconds": eff["generation_seconds"],
            "tokens_per_s": eff["tokens_per_s"], "threads": eff["threads"],
            "generations": (out / "generations.jsonl").read_bytes()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20, help="SFT steps (both runs)")
    ap.add_argument("--n", type=int, default=24, help="gate items per suite (both runs)")
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=2, help="interleaved SFT runs of each kind (median reported)")
    a = ap.parse_args()
    print(f"load average before: {loadavg()} ({os.cpu_count()} CPUs)")
    with tempfile.TemporaryDirectory(prefix="scale-out-") as tmp:
        work = Path(tmp)
        kinds = {"flow": lambda: sft_through_flow(work, a.steps), "stage": lambda: sft_stage_alone(work, a.steps),
                 "direct": lambda: sft_direct(a.steps)}
        runs_: dict[str, list[dict]] = {k: [] for k in kinds}
        for r in range(a.repeats):  # interleaved, so a change in the machine's load hits every kind
            for k, fn in kinds.items():
                runs_[k].append(fn())
            print(f"  repeat {r}: " + ", ".join(f"{k} {v[-1]['train_seconds'] / v[-1]['steps']:.3f} s/step"
                                               for k, v in runs_.items()) + f" (load {loadavg()})", flush=True)
        med = statistics.median
        step = {k: med(x["train_seconds"] / x["steps"] for x in v) for k, v in runs_.items()}
        fixed = {k: med(x["wall"] - x["train_seconds"] for x in v) for k, v in runs_.items()}
        flow, direct = runs_["flow"][-1], runs_["direct"][-1]
        print(f"\nSFT, tiny model, {flow['steps']} steps, batch 2, {flow['threads']} threads, median of {a.repeats}")
        print(f"  step time through the flow (Prefect + run_stage): {step['flow']:.3f} s")
        print(f"  step time, stage alone (same launch, no Prefect) : {step['stage']:.3f} s")
        print(f"  step time, direct TRL (same rows and config)     : {step['direct']:.3f} s")
        print(f"  ratio flow / direct : {step['flow'] / step['direct']:.3f}  (target <= 1.05)")
        print(f"  ratio stage / direct: {step['stage'] / step['direct']:.3f}")
        print(f"  train loss flow / stage / direct: {flow['loss']:.4f} / {runs_['stage'][-1]['loss']:.4f} / "
              f"{direct['loss']:.4f}; threads {direct['threads']}")
        print(f"  fixed start-up: flow {fixed['flow']:.1f} s (stage process "
              f"{med(f['stage_wall'] - f['train_seconds'] for f in runs_['flow']):.1f} s, the rest Prefect), "
              f"stage alone {fixed['stage']:.1f} s, direct TRL {fixed['direct']:.1f} s")

        models = noisy_models(work)
        runs = {k: gate_run(work, models, k, a.n, a.max_new_tokens) for k in (1, 2)}
        same = runs[1]["generations"] == runs[2]["generations"]
        print(f"\nGate generation, tiny models, {a.n} items x 5 suites + are-you-sure, both models, "
              f"max_new_tokens {a.max_new_tokens}")
        for k, r in runs.items():
            print(f"  {k} process{'es' if k > 1 else '  '}: {r['tokens']:.0f} tokens in {r['generation_seconds']:.1f} s"
                  f" = {r['tokens_per_s']:.1f} tok/s ({r['threads']} thread(s) each), stage wall {r['wall']:.1f} s")
        print(f"  speed-up 2 vs 1 process: {runs[2]['tokens_per_s'] / runs[1]['tokens_per_s']:.2f}x; "
              f"generations.jsonl identical: {same}")
    print(f"\nload average after: {loadavg()}")
    if not same:
        sys.exit("generations differ between 1 and 2 processes")


if __name__ == "__main__":
    main()
