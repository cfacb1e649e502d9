"""Step time and loss drift, fp32 vs bf16 autocast, for each training stage (SFT, DPO, reward model), in one run.

Baseline: fp32, same rows, seed, batches and steps, measured in the same run. bf16 is autocast (``bf16=True``) as
the stages run it (DPO's LM head and the reward model's score head in fp32: ``dpo.trainer``,
``rlhf.precision.keep_in_fp32``), activation checkpointing off in both. Printed per stage: seconds per step (and
the bf16/fp32 ratio), the loss at every step in each precision and the largest drift, plus what
``precision: auto`` picks for the stage here (rlhf.precision) and whether that matches the measurement (bf16 only
where it is native and faster). The loss drift after a few steps mixes rounding with the updates it causes, so it
is printed, not decided on; what bf16 does to the numbers DPO and the reward model decide on is measured by
``benchmarks/logprob_precision.py`` (one forward pass) and ``benchmarks/precision_outcome.py`` (what training
learns, against the noise of training itself).

Both precisions run in this process, with the memory allocator a stage process gets
(``rlhf.machine.allocator_env``: the benchmark starts itself again with it), or with ``--allocator system`` the
allocator of the environment it was started in; the first line names it.

On a device without native bf16 (a CPU without avx512_bf16 / amx_bf16), bf16 would be emulated: the benchmark
says so and measures fp32 only, unless ``--emulated-bf16`` asks to time the emulation anyway (labelled as such).

    python benchmarks/precision.py                         # 135M model, 3 steps per stage
    python benchmarks/precision.py --model tiny --steps 2 --emulated-bf16
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
from datasets import Dataset

# the repository root first: run from a clone that is not installed, the script's folder (with its own ``data/``
# of labels) would otherwise shadow the project's ``data`` package
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

STAGES = ("sft", "dpo", "reward_model")


def _config(cls, out: str, steps: int, bf16: bool, batch: int = 2, seed: int = 42, **kw):
    cfg = cls(output_dir=out, max_steps=steps, per_device_train_batch_size=batch, logging_steps=1, report_to=[],
              seed=seed, precision="fp32", save_strategy="no", activation_checkpointing=False, **kw)
    if bf16:  # autocast in bf16 (set after the config resolved fp32, so the emulated case can be timed too)
        # transformers reads bf16 into mixed_precision in __post_init__: set both, or autocast never starts
        cfg.bf16, cfg.mixed_precision, cfg.use_cpu = True, "bf16", not torch.cuda.is_available()
    return cfg


def run_stage(stage: str, model_path: str, steps: int, bf16: bool, rows: int, *, batch: int = 2, seed: int = 42,
              learning_rate: float = 1e-5, keep_model: bool = False) -> dict:
    """Train ``stage`` for ``steps`` steps of ``batch`` rows (pairs) at ``learning_rate``, the data shuffled by
    ``seed`` (the models and the reward head start from the same weights whatever the seed); returns
    ``{"losses": [...], "step_s": float}``, plus ``"model"`` (the trained fp32 model, autocast wrapper removed)
    with ``keep_model``."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    out = tempfile.mkdtemp(prefix=f"bench-precision-{stage}-")  # the Trainer's run files; removed at the end
    try:
        return _train(stage, model_path, steps, bf16, rows, batch, seed, learning_rate, keep_model, tok, out)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _train(stage: str, model_path: str, steps: int, bf16: bool, rows: int, batch: int, seed: int,
           learning_rate: float, keep_model: bool, tok, out: str) -> dict:
    from transformers import AutoModelForCausalLM

    from data.loaders import load_pairs, load_sft
    from data.pairs import prepare_pairs
    from data.schemas import pair_to_trl
    from rlhf.weights import into_process_memory  # as the stages: trained weights out of the file mapping

    torch.manual_seed(0)
    if stage == "sft":
        from trl import SFTTrainer

        from sft.config import SFTStageConfig
        from sft.prepare import prepare_sft_rows

        prepared = prepare_sft_rows(load_sft("demo:hh_rlhf/sft.jsonl", limit=rows), tok, 256, file="demo")
        trainer = SFTTrainer(model=into_process_memory(AutoModelForCausalLM.from_pretrained(model_path)),
                             args=_config(SFTStageConfig, out, steps, bf16, batch, seed, max_length=256,
                                          learning_rate=learning_rate),
                             train_dataset=Dataset.from_list(prepared.rows), processing_class=tok)
    else:
        pairs = prepare_pairs(load_pairs("demo:hh_rlhf/pairs_train.jsonl", limit=rows), tok, 256, file="demo",
                              require_fit=stage == "reward_model").pairs
        data = Dataset.from_list([pair_to_trl(p) for p in pairs])
        if stage == "dpo":
            from dpo.config import DPOStageConfig
            from dpo.trainer import FP32LogProbDPOTrainer as DPOTrainer  # the stage's: fp32 LM head under bf16

            trainer = DPOTrainer(model=into_process_memory(AutoModelForCausalLM.from_pretrained(model_path)),
                                 ref_model=AutoModelForCausalLM.from_pretrained(model_path),
                                 args=_config(DPOStageConfig, out, steps, bf16, batch, seed, max_length=256,
                                              learning_rate=learning_rate),
                                 train_dataset=data, processing_class=tok)
        else:
            from trl import RewardTrainer

            from judging.scoring import load_reward_model
            from reward_model.config import RewardStageConfig

            from rlhf.precision import keep_in_fp32

            model, tok = load_reward_model(model_path, new_head=True, trained=True)
            keep_in_fp32(model.score)  # as the stage: the score head in fp32 under bf16 autocast
            trainer = RewardTrainer(model=model,
                                    args=_config(RewardStageConfig, out, steps, bf16, batch, seed, max_length=256,
                                                 learning_rate=learning_rate),
                                    train_dataset=data, processing_class=tok)
    t0 = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - t0
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    result = {"losses": losses, "step_s": seconds / steps}
    if keep_model:
        result["model"] = trainer.accelerator.unwrap_model(trainer.model, keep_fp32_wrapper=False)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--stages", nargs="+", default=list(STAGES), choices=STAGES)
    ap.add_argument("--emulated-bf16", action="store_true", help="Time bf16 even where it is not native.")
    ap.add_argument("--allocator", choices=["stage", "system"], default="stage",
                    help="the stage processes' memory allocator (default) or this environment's")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)

    from rlhf.machine import allocator_env, allocator_in_use, native_bf16, threads_per_process

    extra = allocator_env() if args.allocator == "stage" else {}
    if extra:  # an allocator is chosen when a process starts: start again with it (then allocator_env is empty)
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **extra})
    from rlhf.models import resolve_base_model
    from rlhf.precision import resolve_precision

    torch.set_num_threads(threads_per_process(1))
    native, evidence = native_bf16()
    path = resolve_base_model(args.model)
    print(f"model {args.model}, {args.steps} steps x batch 2, {torch.get_num_threads()} threads, allocator "
          f"{allocator_in_use()}; bf16: {evidence}")
    if not native and not args.emulated_bf16:
        print("no native bf16 on this device: precision auto stays fp32 for every stage; bf16 not measured "
              "(pass --emulated-bf16 to time the emulation)")
    for stage in args.stages:
        fp32 = run_stage(stage, path, args.steps, False, args.rows)
        line = f"{stage:13s} fp32 {fp32['step_s']:6.2f} s/step  losses {[round(x, 4) for x in fp32['losses']]}"
        auto = resolve_precision("auto", stage)
        if native or args.emulated_bf16:
            bf16 = run_stage(stage, path, args.steps, True, args.rows)
            drift = max(abs(a - b) / max(abs(a), 1e-9) for a, b in zip(fp32["losses"], bf16["losses"]))
            ok = native and bf16["step_s"] < fp32["step_s"]
            line += (f"\n{'':13s} bf16 {bf16['step_s']:6.2f} s/step  losses {[round(x, 4) for x in bf16['losses']]}"
                     f"{'' if native else ' (EMULATED)'}\n{'':13s} bf16/fp32 step time {bf16['step_s'] / fp32['step_s']:.2f}x, "
                     f"max relative loss drift {100 * drift:.2f}% -> measured choice {'bf16' if ok else 'fp32'}, "
                     f"auto picks {auto} ({'agrees' if (auto == 'bf16') == ok else 'DISAGREES: update rlhf.precision'})")
        else:
            line += f"  auto picks {auto}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
