"""Scale-out overheads (issue 11, point 6): a stage through the flow vs the same training launched directly with TRL,
and the gate stage's generation throughput on 1 and 2 processes, in one run.

1. SFT through the flow: a Prefect flow whose task calls ``flows.stages.run_stage`` (what the round flow's stage task
   calls: ``accelerate launch -m sft.train`` with the recipe, cache key, stage folder, manifest), against
   ``accelerate launch`` (same threads per process) of a plain TRL script: ``SFTTrainer`` on the same file, model and
   recipe values (batch, steps, learning rate, schedule, max length, seed, precision). Reported: step time of each
   (``train_runtime / steps``, the Trainer's own clock) and their ratio (target <= 1.05), and apart from it the fixed
   start-up cost (process wall time minus training time: imports, model conversion / loading, data validation,
   decontamination, hashing, the step-0 and style checks, saving pi_ref, the Prefect server and flow run).
   The stage trains on length-grouped batches with completion-only loss; the direct script is TRL's default path
   (``messages`` rows, length-grouping off), so the ratio also carries that difference (the stage pads less).
2. Gate generation tokens/s: ``gates.evaluate`` on 1 process and on 2 (``torchrun --nproc_per_node 2``, gloo), same
   inputs (the smoke suites with ``--n`` items each, two noisy tiny models): generated tokens of both models over the
   generation wall time, from each run's manifest (``metrics.efficiency``); the generations are checked identical.

    python benchmarks/scale_out.py                 # tiny model, 20 SFT steps, 24 items a suite
    python benchmarks/scale_out.py --steps 40 --n 48

Prints the load average before and after: on a shared machine the numbers move with it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DIRECT_SFT = r'''
import json, sys, time
t0 = time.perf_counter()
import yaml
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer
from data.loaders import load_sft
from rlhf.models import resolve_base_model
recipe, out, steps, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
r = yaml.safe_load(open(recipe))
base = resolve_base_model(r["model_name_or_path"])
rows = [{"messages": [{"role": m.role, "content": m.content} for m in c.messages]}
        for c in load_sft(r["train_data"], use_first=n)]
args = SFTConfig(output_dir=out, per_device_train_batch_size=r["per_device_train_batch_size"], max_steps=steps,
                 learning_rate=r["learning_rate"], lr_scheduler_type=r["lr_scheduler_type"], warmup_steps=0,
                 logging_steps=r["logging_steps"], seed=r["seed"], max_length=r["max_length"], bf16=False,
                 report_to="none", save_strategy="no", gradient_checkpointing=False)
trainer = SFTTrainer(model=AutoModelForCausalLM.from_pretrained(base), args=args,
                     train_dataset=Dataset.from_list(rows), processing_class=AutoTokenizer.from_pretrained(base))
result = trainer.train()
print("DIRECT " + json.dumps({"train_seconds": result.metrics["train_runtime"], "steps": result.global_step,
                              "wall_to_end": time.perf_counter() - t0}), flush=True)
'''


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def sft_through_flow(work: Path, steps: int, n: int) -> dict:
    """The SFT stage in a Prefect flow (run_stage in a task); wall time of the whole flow and the manifest."""
    os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="scale-out-prefect-"))
    t0 = time.perf_counter()
    from prefect import flow, task

    from flows.stages import run_stage

    @task
    def sft_task():
        return run_stage("sft", "sft.train", ROOT / "recipes/smoke/sft.yaml", work / "flow_sft", force=True,
                         extra_args=["--max_steps", str(steps), "--max_train_samples", str(n), "--report_to", "none"],
                         log=lambda line: None)

    @flow(name="scale-out-sft")
    def one_stage():
        return sft_task()

    run = one_stage()
    wall = time.perf_counter() - t0
    eff = run.manifest["metrics"]["efficiency"]
    return {"wall": wall, "stage_wall": run.seconds, "train_seconds": eff["train_seconds"],
            "steps": run.manifest["metrics"]["train_steps"], "threads": eff["threads"]}


def sft_direct(work: Path, steps: int, n: int) -> dict:
    from rlhf.machine import threads_per_process

    script = work / "direct_sft.py"
    script.write_text(f"import sys; sys.path.insert(0, {str(ROOT)!r})\n" + DIRECT_SFT)
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "--num_cpu_threads_per_process",
           str(threads_per_process(1)), str(script), str(ROOT / "recipes/smoke/sft.yaml"), str(work / "direct"),
           str(steps), str(n)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "WANDB_MODE": "disabled"})
    wall = time.perf_counter() - t0
    line = next((x for x in proc.stdout.splitlines() if x.startswith("DIRECT ")), None)
    if proc.returncode != 0 or line is None:
        sys.exit(f"direct TRL run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return {"wall": wall, **json.loads(line[len("DIRECT "):])}


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
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "WANDB_MODE": "disabled"})
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
    a = ap.parse_args()
    print(f"load average before: {loadavg()} ({os.cpu_count()} CPUs)")
    with tempfile.TemporaryDirectory(prefix="scale-out-") as tmp:
        work = Path(tmp)
        flow = sft_through_flow(work, a.steps, max(2 * a.steps, 8))
        direct = sft_direct(work, a.steps, max(2 * a.steps, 8))
        step_flow, step_direct = flow["train_seconds"] / flow["steps"], direct["train_seconds"] / direct["steps"]
        print(f"\nSFT, tiny model, {flow['steps']} steps, batch 2, {flow['threads']} threads")
        print(f"  step time through the flow : {step_flow:.3f} s")
        print(f"  step time direct TRL       : {step_direct:.3f} s")
        print(f"  ratio flow / direct        : {step_flow / step_direct:.3f}  (target <= 1.05)")
        print(f"  fixed start-up, flow       : {flow['wall'] - flow['train_seconds']:.1f} s "
              f"(of which the stage process {flow['stage_wall'] - flow['train_seconds']:.1f} s; the rest Prefect)")
        print(f"  fixed start-up, direct TRL : {direct['wall'] - direct['train_seconds']:.1f} s")

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
