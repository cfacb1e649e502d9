"""Training step time of the project's SFT, DPO and reward-model stages against plain TRL on the same rows.

Three variants per stage, each in its own process, interleaved ``--repeats`` times, median reported:

- ``project``: the stage itself, launched as the round flow launches it (``flows.stages.launch_command``:
  accelerate launch with threads per process, in ``flows.stages.stage_env``'s environment: the stage's memory
  allocator, ``rlhf.machine.allocator_env``), seconds per step from its manifest
  (``metrics.efficiency.train_seconds / train_steps``);
- ``trl-same``: TRL's trainer (SFTTrainer / DPOTrainer / RewardTrainer) on the same prepared rows with the same settings (the
  stage config's own TRL fields: batch, lengths, precision, no activation checkpointing), as many threads;
- ``trl-defaults``: the same, with TRL 1.16's own defaults for precision and activation checkpointing (bf16 and
  gradient checkpointing on; on a CPU without native bf16 the bf16 is emulated).

Both TRL variants run with the allocator of the benchmark's own environment (plain TRL as its users run it);
``--trl-allocator stage`` gives them the stage's, to separate what the allocator buys from the rest. Each line
names the allocator its process ran with.

Seconds per step = ``train_runtime / global_step`` of ``trainer.train()`` for both TRL variants (the project's
``train_seconds`` is the same figure), so start-up (imports, loading, data preparation, saving) is outside it.
Targets: project / trl-same <= 1.05 and project <= trl-defaults.

    python benchmarks/step_time.py                   # demo recipes, SmolLM2-135M, 6 steps, 2 repeats, SFT and DPO
    python benchmarks/step_time.py --stages reward_model --steps 6 --repeats 1
    python benchmarks/step_time.py --steps 4 --repeats 1 --stages sft
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the repository root first: run as ``python benchmarks/step_time.py`` from a clone that is not installed, the
# script's folder (with its own ``data/`` of labels) would otherwise shadow the project's ``data`` package
sys.path.insert(0, str(ROOT))
RECIPES = ROOT / "recipes" / "demo"


def _stage_config(stage: str, argv: list[str]):
    from trl import TrlParser

    from rlhf.registry import STAGES

    (args,) = TrlParser(STAGES[stage].config_classes()).parse_args_and_config(argv)
    return args


def _trl_args(stage_args, trl_cls, defaults: bool, out: str):
    """The stage config's TRL fields as a plain TRL config; ``defaults`` puts TRL's precision/checkpointing back."""
    names = {f.name for f in dataclasses.fields(trl_cls) if f.init}
    values = {n: getattr(stage_args, n) for n in names if hasattr(stage_args, n)}
    values.update(output_dir=out, report_to=["none"], save_strategy="no", logging_steps=1)
    values.pop("train_sampling_strategy", None)  # plain TRL: its default sampler
    for key in ("bf16", "fp16", "gradient_checkpointing", "activation_checkpointing", "use_cpu", "mixed_precision"):
        values.pop(key, None)
    values.update(precision_values(stage_args.bf16, stage_args.fp16, defaults, _cuda()))
    if not defaults and hasattr(stage_args, "activation_checkpointing"):
        values["activation_checkpointing"] = False
    return trl_cls(**values)


def precision_values(bf16: bool, fp16: bool, defaults: bool, cuda: bool) -> dict:
    """The precision fields of a plain TRL config: the stage's own (``defaults`` False) or TRL's defaults (bf16 and
    activation checkpointing on), on CUDA or a CPU. transformers refuses bf16 on a CPU unless ``use_cpu`` is set
    ("Your setup doesn't support bf16/gpu"), which a CPU with native bf16 needs as much as one without."""
    if defaults:
        return {} if cuda else {"use_cpu": True}
    values = {"bf16": bf16, "fp16": fp16, "gradient_checkpointing": False}
    if bf16 and not cuda:
        values["use_cpu"] = True
    return values


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def child(stage: str, variant: str, steps: int, sft_dir: str | None) -> dict:
    """One TRL run in this process: seconds per step and the precision it ran in (its output folder removed)."""
    import torch

    from rlhf.machine import threads_per_process

    torch.set_num_threads(threads_per_process(1))
    with tempfile.TemporaryDirectory(prefix=f"steptime-{stage}-") as out:  # TRL writes its run files there
        return _child_run(stage, variant, steps, sft_dir, out)


def _child_run(stage: str, variant: str, steps: int, sft_dir: str | None, out: str) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, set_seed

    from rlhf.machine import allocator_in_use

    argv = ["--config", str(RECIPES / f"{stage}.yaml"), "--max_steps", str(steps), "--output_dir", out,
            "--report_to", "none"]
    if stage == "sft":
        from trl import SFTConfig, SFTTrainer

        from data.loaders import load_sft
        from rlhf.models import resolve_base_model
        from sft.prepare import prepare_sft_rows

        args = _stage_config("sft", argv)
        set_seed(args.seed)
        base = resolve_base_model(args.model_name_or_path)
        tok = AutoTokenizer.from_pretrained(base)
        rows = prepare_sft_rows(load_sft(args.train_data, use_first=args.max_train_samples), tok, args.max_length,
                                file=args.train_data).rows
        trainer = SFTTrainer(model=AutoModelForCausalLM.from_pretrained(base),
                             args=_trl_args(args, SFTConfig, variant == "trl-defaults", out),
                             train_dataset=Dataset.from_list(rows), processing_class=tok)
    elif stage == "reward_model":
        from trl import RewardConfig, RewardTrainer

        from data.loaders import load_pairs
        from data.pairs import prepare_pairs
        from data.schemas import pair_to_trl
        from judging.scoring import load_reward_model
        from rlhf.manifest import read_manifest

        args = _stage_config("reward_model", argv + ["--sft_dir", sft_dir])
        set_seed(args.seed)
        start = read_manifest(sft_dir)["outputs"]["checkpoint"]
        model, tok = load_reward_model(start, new_head=True)  # the stage's own start; plain TRL's head in its dtype
        pairs = prepare_pairs(load_pairs(args.train_data, use_first=args.max_train_samples), tok, args.max_length,
                              file=args.train_data, require_fit=True).pairs
        trainer = RewardTrainer(model=model, args=_trl_args(args, RewardConfig, variant == "trl-defaults", out),
                                train_dataset=Dataset.from_list([pair_to_trl(p) for p in pairs]),
                                processing_class=tok)
    else:
        from trl import DPOConfig, DPOTrainer

        from data.loaders import load_pairs
        from data.pairs import prepare_pairs
        from data.schemas import pair_to_trl
        from rlhf.manifest import read_manifest

        args = _stage_config("dpo", argv + ["--sft_dir", sft_dir])
        set_seed(args.seed)
        pi_ref = read_manifest(sft_dir)["outputs"]["pi_ref"]
        tok = AutoTokenizer.from_pretrained(pi_ref)
        pairs = prepare_pairs(load_pairs(args.train_data, use_first=args.max_train_samples), tok, args.max_length,
                              file=args.train_data, truncation_mode=args.truncation_mode).pairs
        trainer = DPOTrainer(model=AutoModelForCausalLM.from_pretrained(pi_ref),
                             ref_model=AutoModelForCausalLM.from_pretrained(pi_ref),
                             args=_trl_args(args, DPOConfig, variant == "trl-defaults", out),
                             train_dataset=Dataset.from_list([pair_to_trl(p) for p in pairs]), processing_class=tok)
    result = trainer.train()
    a = trainer.args
    return {"s_per_step": result.metrics["train_runtime"] / result.global_step, "steps": result.global_step,
            "loss": result.training_loss, "precision": "bf16" if a.bf16 else "fp16" if a.fp16 else "fp32",
            "checkpointing": bool(getattr(a, "gradient_checkpointing", False)
                                  or getattr(a, "activation_checkpointing", False)),
            "threads": torch.get_num_threads(), "allocator": allocator_in_use()}


def run_project(stage: str, steps: int, out: Path, sft_dir: str | None, more: list[str] | None = None) -> dict:
    from flows.stages import launch_command

    extra = ["--max_steps", str(steps), "--report_to", "none"] + (["--sft_dir", sft_dir] if sft_dir else [])
    extra += more or []
    cmd = launch_command(f"{stage}.train", RECIPES / f"{stage}.yaml", out, extra, None)
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=stage_env())
    if proc.returncode:
        sys.exit(f"{stage} stage failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    m = json.loads((out / "manifest.json").read_text())["metrics"]
    return {"s_per_step": m["efficiency"]["train_seconds"] / m["train_steps"], "steps": m["train_steps"],
            "loss": m["train_loss"], "threads": m["efficiency"]["threads"],
            "allocator": m["efficiency"].get("allocator")}


def stage_env() -> dict:
    from flows.stages import stage_env as env

    return env()


def run_trl(stage: str, variant: str, steps: int, sft_dir: str | None, allocator: str = "system") -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_child", stage, variant, "--steps", str(steps)]
    if sft_dir:
        cmd += ["--sft-dir", sft_dir]
    env = {**(stage_env() if allocator == "stage" else os.environ), "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled"}
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    if proc.returncode:
        sys.exit(f"{stage} {variant} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--stages", nargs="+", default=["sft", "dpo"], choices=["sft", "dpo", "reward_model"])
    ap.add_argument("--variants", nargs="+", default=["project", "trl-same", "trl-defaults"],
                    help="project, trl-same, trl-defaults, project-every-4-steps: the stage with a Trainer "
                         "checkpoint every 4 steps (the demo recipes' setting before checkpoints by time), and "
                         "project-checkpointing / project-no-checkpointing: the stage with activation "
                         "checkpointing on (TRL's default) / off.")
    ap.add_argument("--trl-allocator", choices=["system", "stage"], default="system",
                    help="the TRL variants' memory allocator: this environment's (default) or the stage's")
    ap.add_argument("--keep", action="store_true", help="Keep the project stages' output folders (printed).")
    ap.add_argument("--_child", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--sft-dir", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a._child:
        print(json.dumps(child(a._child[0], a._child[1], a.steps, a.sft_dir)))
        return
    os.environ.setdefault("WANDB_MODE", "disabled")
    work = Path(tempfile.mkdtemp(prefix="steptime-"))
    try:  # the stage runs' checkpoints (about 0.5 GB each) are this benchmark's own: removed unless --keep
        _compare(a, work)
    finally:
        if a.keep:
            print(f"stage outputs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def _compare(a: argparse.Namespace, work: Path) -> None:
    """Each variant of each stage in ``a.stages``, interleaved ``a.repeats`` times; prints medians and ratios."""
    sft_dir = None
    if {"dpo", "reward_model"} & set(a.stages):  # both start from an SFT stage's output: make one (not timed)
        sft_dir = str(work / "sft-for-dpo")
        run_project("sft", 2, Path(sft_dir), None)
    print(f"load average at start: {os.getloadavg()}")
    for stage in a.stages:
        times: dict[str, list[dict]] = {v: [] for v in a.variants}
        for r in range(a.repeats):  # interleaved: each variant once per repeat
            for v in a.variants:
                dpo_dir = sft_dir if stage != "sft" else None
                if v.startswith("project"):
                    more = {"project-every-4-steps": ["--save_strategy", "steps", "--save_steps", "4"],
                            "project-checkpointing": ["--activation_checkpointing", "true"],
                            "project-no-checkpointing": ["--activation_checkpointing", "false"]}.get(v, [])
                    res = run_project(stage, a.steps, work / f"{stage}-{v}-{r}", dpo_dir, more)
                else:
                    res = run_trl(stage, v, a.steps, dpo_dir, a.trl_allocator)
                times[v].append(res)
                print(f"  {stage} {v:12s} repeat {r}: {res['s_per_step']:.2f} s/step, loss {res['loss']:.4f}, "
                      f"{res.get('precision', '')} threads {res.get('threads')}, allocator {res.get('allocator')}",
                      flush=True)
        med = {v: statistics.median(x["s_per_step"] for x in rs) for v, rs in times.items()}
        line = ", ".join(f"{v} {s:.2f} s/step" for v, s in med.items())
        print(f"{stage}: {line}")
        if "project" in med and "trl-same" in med:
            print(f"  {stage} project / trl-same = {med['project'] / med['trl-same']:.3f} (target <= 1.05)")
        if "project" in med and "project-every-4-steps" in med:
            print(f"  {stage} checkpoint every 4 steps / by time = "
                  f"{med['project-every-4-steps'] / med['project']:.3f} (what the step-based checkpoints cost)")
        if "project" in med and "project-checkpointing" in med:
            print(f"  {stage} activation checkpointing on / recipe = {med['project-checkpointing'] / med['project']:.3f}")
        if "project" in med and "project-no-checkpointing" in med:
            print(f"  {stage} activation checkpointing off / recipe = "
                  f"{med['project-no-checkpointing'] / med['project']:.3f}")
        if "project" in med and "trl-defaults" in med:
            print(f"  {stage} project / trl-defaults = {med['project'] / med['trl-defaults']:.3f} (target <= 1.00)")
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
