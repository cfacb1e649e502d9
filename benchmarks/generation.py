"""Gate-evaluation generation: batched (left padding, KV cache) vs one prompt at a time, same run, same outputs.

Target (README, Benchmarks): on the 135M default, batched generation reaches at least 5x the tokens/s of
one-prompt-at-a-time generation, with identical greedy outputs. Baseline: one-at-a-time greedy generation
through the same function (batch_size=1), measured in the same run on the first ``--n-baseline`` prompts (at
~8 tok/s, 500 prompts one at a time would take over an hour on 2 cores); the batched run covers all ``--n``.

Second comparison: the gate stage's settings (``batch_size: auto``: 128 on CPU unless memory says otherwise, prompts
sorted by token length) against its former fixed batch 16, on the same prompts in the same run: target >= 1.6x the
tokens/s, with identical greedy outputs.

    python benchmarks/generation.py                 # 500 prompts, 64 new tokens, auto vs batch 16
    python benchmarks/generation.py --n 64 --model tiny
    python benchmarks/generation.py --n 128 --n-baseline 0   # skip the one-at-a-time run
    python benchmarks/generation.py --n 64 --n-baseline 0 --skip-heldout --max-new-tokens 32
    python benchmarks/generation.py --precision bf16    # the weights' dtype; default auto (fp32 on a CPU)
    python benchmarks/generation.py --prefill-precision fp32  # no bf16 copy for long prompts (default: as the gate)

The weights are loaded as the gate stage loads them (``generation_precision``: bf16 on a CUDA device with native
bf16, fp32 on a CPU). The memory bound is printed too: decoding reads every weight once per step, so batch-1
decoding cannot beat copy bandwidth / weight bytes tokens/s (``rlhf.machine.measure_copy_bandwidth``), and batch B, B times that.
Target (gate generation at the memory bound): auto >= 12x one at a time, identical outputs in the same precision.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

# the repository root first: run from a clone that is not installed, the script's folder (with its own ``data/``
# of labels) would otherwise shadow the project's ``data`` package
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from data.loaders import load_eval_prompts  # noqa: E402
from rlhf.generation import generate  # noqa: E402
from rlhf.models import resolve_base_model  # noqa: E402
from rlhf.prefix_cache import BF16_PREFILL_MIN_TOKENS  # noqa: E402


SOURCES = ("demo:hh_rlhf/pairs_heldout.jsonl", "demo:xstest/xstest_prompts.csv",
           "demo:harmbench/harmbench_behaviors_text_val.csv", "demo:harmbench/advbench_behaviors.csv",
           "demo:mt_bench/mt_bench_question.jsonl")


def prompts(n: int, skip_heldout: bool = False) -> list[str]:
    """Held-out gate prompts: HH-RLHF held-out, XSTest, HarmBench, AdvBench, MT-bench (first n in that order);
    ``skip_heldout``: without the long multi-turn HH-RLHF conversations (the refusal suites' short prompts)."""
    out: list[str] = []
    for src in SOURCES[1:] if skip_heldout else SOURCES:
        out += [p.prompt for p in load_eval_prompts(src)]
    if len(out) < n:
        raise SystemExit(f"only {len(out)} prompts available, asked for {n}")
    return out[:n]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--n", type=int, default=500, help="Prompts generated batched.")
    ap.add_argument("--n-baseline", type=int, default=32, help="Prompts generated one at a time (the baseline).")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--batch-size", default="auto", help="The new setting: an int or auto.")
    ap.add_argument("--old-batch-size", type=int, default=16, help="The old fixed gate batch.")
    ap.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"],
                    help="The weights' dtype (rlhf.precision.generation_precision).")
    ap.add_argument("--prefill-precision", default="auto", choices=["auto", "fp32", "bf16"],
                    help="Long prompts' prefill dtype, as the gate config's prefill_precision "
                         "(rlhf.precision.prefill_precision): bf16 on a CPU with native bf16 and fp32 weights.")
    ap.add_argument("--skip-heldout", action="store_true",
                    help="Leave out the long HH-RLHF conversations (prefill-bound): the refusal suites' short prompts.")
    args = ap.parse_args()
    torch.manual_seed(0)
    path = resolve_base_model(args.model)
    tok = AutoTokenizer.from_pretrained(path)
    from rlhf.machine import measure_copy_bandwidth
    from rlhf.precision import generation_precision, prefill_precision

    precision = generation_precision(args.precision)
    model = AutoModelForCausalLM.from_pretrained(path, dtype={"fp32": torch.float32, "bf16": torch.bfloat16}[precision])
    prefill = prefill_precision(args.prefill_precision, precision)
    # the gate stage's rule (gates.generation.answer_suites): a bf16 copy prefills each long prompt alone
    prefill_model = (AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
                     if prefill != precision else None)
    run = dict(max_new_tokens=args.max_new_tokens, prefill_model=prefill_model)
    ps = prompts(args.n, args.skip_heldout)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    bandwidth = measure_copy_bandwidth()
    bound_1 = bandwidth / weight_bytes

    from rlhf.machine import auto_batch_size

    longest = max(len(tok(tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                  add_generation_prompt=True))["input_ids"]) for p in ps)
    new_bs = auto_batch_size(args.batch_size, model.config, min(longest, 512) + args.max_new_tokens)
    t0 = time.perf_counter()
    batched, batched_len = generate(model, tok, ps, **run, batch_size=new_bs,
                                    desc=f"batch {new_bs}")
    t_batched = time.perf_counter() - t0
    t0 = time.perf_counter()
    old, old_len = generate(model, tok, ps, **run, batch_size=args.old_batch_size,
                            desc=f"batch {args.old_batch_size}")
    t_old = time.perf_counter() - t0
    tps_batched = sum(batched_len) / t_batched
    tps_old = sum(old_len) / t_old
    print(f"model {args.model} in {precision}, long prompts (>= {BF16_PREFILL_MIN_TOKENS} tokens) prefilled in "
          f"{prefill}: {args.n} prompts, {args.max_new_tokens} new tokens max, "
          f"{torch.get_num_threads()} threads; weights {weight_bytes / 2**20:.0f} MiB, copy bandwidth "
          f"{bandwidth / 1e9:.1f} GB/s -> memory bound {bound_1:.1f} tok/s at batch 1, {new_bs * bound_1:.0f} at "
          f"batch {new_bs}")
    print(f"new (batch {args.batch_size} = {new_bs}): {sum(batched_len)} tokens in {t_batched:.1f} s = "
          f"{tps_batched:.1f} tok/s")
    print(f"old (batch {args.old_batch_size}):  {sum(old_len)} tokens in {t_old:.1f} s = {tps_old:.1f} tok/s")
    print(f"speed-up vs batch {args.old_batch_size}: {tps_batched / tps_old:.2f}x (target >= 1.6x)")
    print(f"identical greedy outputs vs batch {args.old_batch_size}: {sum(a == b for a, b in zip(batched, old))}/{args.n}")
    if args.n_baseline:
        t0 = time.perf_counter()
        single, single_len = generate(model, tok, ps[: args.n_baseline], **run,
                                      batch_size=1, desc="one at a time")
        t_single = time.perf_counter() - t0
        tps_single = sum(single_len) / t_single
        print(f"one at a time: {sum(single_len)} tokens in {t_single:.1f} s = {tps_single:.1f} tok/s "
              f"(first {args.n_baseline})")
        print(f"one at a time: {tps_single / bound_1:.0%} of the batch-1 memory bound; batch {new_bs}: "
              f"{tps_batched / (new_bs * bound_1):.0%} of its bound (prefill and padding included)")
        print(f"speed-up vs one at a time: {tps_batched / tps_single:.2f}x (target >= 12x)")
        print(f"identical greedy outputs vs one at a time: {sum(a == b for a, b in zip(batched, single))}/{args.n_baseline}")


if __name__ == "__main__":
    main()
