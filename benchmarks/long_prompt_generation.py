"""Long-prompt gate generation: each long prompt prefilled alone and a KV cache with room for the answer, against
padded prefill and a cache that grows by concatenation, on the demo round's consistency probes, same run.

The consistency suite (``gates/consistency.py``, the demo recipe's depths 5/10/20, 12 conversations x 2 positions =
72 probes of about 290-1,900 tokens) is prefill-bound on a CPU: a padded batch runs its linear layers on every pad
and, with the padding masked, full ``W x W`` attention per row. ``rlhf.batching.separate_prefill_pays`` decides per
batch whether to prefill each row alone; ``rlhf.prefix_cache.ReservedLayer`` writes each decode step in place.
Baseline: the same ``generate_report`` call with both switched off (the default cache of plain ``DynamicLayer``s,
so every batch prefills padded), measured in the same run. Target: faster than the baseline with identical greedy
answers (they are the same computation up to float rounding; ``tests/test_prefix_cache.py``).

Where bf16 is native (``rlhf.precision.prefill_precision``, what the gate stage does at ``prefill_precision:
auto``), a third variant prefills every probe alone with a bf16 copy of the model and decodes in fp32
(``rlhf.prefix_cache.batch_inputs`` case 0): its time against this tree's fp32 prefill, its answers against fp32's
(they differ: the cached keys and values carry bf16 rounding), and, the target, its answers against the same
variant one probe at a time on ``--n-alone`` probes spread over the depths (identical: the rule reads each prompt's
own length, not its batch).

    python benchmarks/long_prompt_generation.py                  # the demo's consistency suite, SmolLM2-135M
    python benchmarks/long_prompt_generation.py --model tiny --depths 5 10
    python benchmarks/long_prompt_generation.py --n-alone 72     # every probe one at a time in the bf16 variant
"""

from __future__ import annotations

import argparse
import copy
import time
from unittest import mock

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from gates.consistency import build_suite, load_exchanges
from gates.inputs import source_path
from rlhf.generation import chat_prompt, generate_report
from rlhf.models import resolve_base_model
from rlhf.precision import prefill_precision


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--depths", type=int, nargs="+", default=[5, 10, 20])
    ap.add_argument("--n-per-depth", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=1, help="Interleaved runs of each variant (the median counts).")
    ap.add_argument("--prefill-precision", default="auto", choices=["auto", "fp32", "bf16"],
                    help="The third variant's prefill dtype (rlhf.precision.prefill_precision); fp32: no third variant.")
    ap.add_argument("--n-alone", type=int, default=24,
                    help="Probes the bf16-prefill variant also answers one at a time (spread over the depths).")
    args = ap.parse_args()

    path = resolve_base_model(args.model)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    convs = load_exchanges(source_path("demo:hh_heldout"), source_path("demo:mt_bench_reference"))
    suite = build_suite(convs, depths=args.depths, positions=[0.0, 0.5], n_per_depth=args.n_per_depth, seed=0,
                        count_tokens=lambda m: len(tok(chat_prompt(tok, m), add_special_tokens=False)["input_ids"]))
    prompts = [it.messages for it in suite.items]
    lengths = [len(tok(chat_prompt(tok, p), add_special_tokens=False)["input_ids"]) for p in prompts]
    print(f"{len(prompts)} probes, {sum(lengths)} prompt tokens ({min(lengths)}-{max(lengths)} a probe), "
          f"{args.max_new_tokens} new tokens, {torch.get_num_threads()} threads")

    half = None
    if prefill_precision(args.prefill_precision, "fp32") == "bf16":
        half = copy.deepcopy(model).to(torch.bfloat16).eval()

    def run(variant: str, which: list | None = None, batch_size: int | str = "auto") -> tuple[float, list[str]]:
        off = mock.patch("rlhf.prefix_cache.plain_layers", return_value=False) if variant == "baseline" else None
        if off:
            off.start()
        try:
            t0 = time.perf_counter()
            texts, _, _ = generate_report(model, tok, prompts if which is None else which,
                                          max_new_tokens=args.max_new_tokens, batch_size=batch_size,
                                          max_prompt_length=1 << 30, desc=variant,
                                          prefill_model=half if variant == "bf16 prefill" else None)
            return time.perf_counter() - t0, texts
        finally:
            if off:
                off.stop()

    times: dict[str, list[float]] = {"baseline": [], "this tree": [], **({"bf16 prefill": []} if half else {})}
    outs: dict[str, list[str]] = {}
    for _ in range(args.repeats):
        for variant in times:
            seconds, outs[variant] = run(variant)
            times[variant].append(seconds)
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    same = sum(a == b for a, b in zip(outs["baseline"], outs["this tree"]))
    print(f"baseline (padded prefill, concatenated cache): {med['baseline']:.1f} s")
    print(f"this tree (prefill alone where it pays, reserved cache): {med['this tree']:.1f} s "
          f"= {med['this tree'] / med['baseline']:.2f}x the baseline (target < 1.00x: "
          f"{'OK' if med['this tree'] < med['baseline'] else 'MISSED'})")
    verdict = "OK" if same == len(prompts) else "MISSED"
    print(f"identical greedy answers: {same} of {len(prompts)} (target all: {verdict})")
    if half is None:
        print("bf16 prefill: not run (bf16 is not native here, or --prefill-precision fp32)")
        return
    same_fp32 = sum(a == b for a, b in zip(outs["this tree"], outs["bf16 prefill"]))
    print(f"bf16 prefill alone, fp32 decode: {med['bf16 prefill']:.1f} s = "
          f"{med['bf16 prefill'] / med['this tree']:.2f}x this tree's fp32 prefill, "
          f"{med['bf16 prefill'] / med['baseline']:.2f}x the baseline; answers equal to fp32's: {same_fp32} of "
          f"{len(prompts)} (bf16 rounding in the cached keys and values)")
    k = min(args.n_alone, len(prompts))
    picked = [j * len(prompts) // k for j in range(k)]
    alone = [run("bf16 prefill", [prompts[j]], batch_size=1)[1][0] for j in picked]
    same_alone = sum(a == outs["bf16 prefill"][j] for a, j in zip(alone, picked))
    verdict = "OK" if same_alone == k else "MISSED"
    print(f"bf16 prefill, batched vs one probe at a time: {same_alone} of {k} identical (target all: {verdict})")


if __name__ == "__main__":
    main()
