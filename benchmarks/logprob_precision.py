"""What bf16 autocast does to the numbers DPO and the reward model decide on, against full fp32, on real pairs.

DPO's loss is built from per-sequence log-probabilities (sums over the completion's tokens) and the reward model's
verdicts from its scores, so those are what precision must not move; a 3-step loss drift mixes that error with the
weights' updates. Three ways of computing them, same fp32 weights, same pairs, in one run:

- ``fp32``: no autocast (the baseline);
- ``bf16``: bf16 autocast with TRL's default LM head (the projection in bf16, the log-softmax in fp32) and the
  reward model's score head in bf16;
- ``bf16+fp32-head``: bf16 autocast for the backbone, the LM-head projection and log-softmax (``dpo.trainer``) and
  the score head (``rlhf.precision.keep_in_fp32``) in fp32, as the stages train under ``precision: auto``.

Printed per mode against fp32, on ``--pairs`` held-out pairs (prompt + chosen, prompt + rejected):
the per-sequence log-probability error |Δ logp| in nats (median, 95th percentile, max) and relative to the
sequence's |logp|; the sign agreement of logp(chosen) - logp(rejected) (the comparison DPO's margin is built on);
the score error |Δ score|, the sign agreement of score(chosen) - score(rejected), and the held-out agreement with
the labels (chosen preferred) in each mode; and DPO's margin against a policy a little away from the reference
(``--perturb``), whose error is what moves DPO's loss (the two models' rounding largely cancels in it). The reward model is the base model with a seeded new score head, as
the reward stage starts: precision error does not depend on the head being trained. Targets (``rlhf.precision``):
per-sequence |Δ logp| 95th percentile <= 0.05 nats, sign agreements = 1.0, held-out agreement unchanged.

    python benchmarks/logprob_precision.py                    # SmolLM2-135M, 48 held-out pairs
    python benchmarks/logprob_precision.py --model tiny --pairs 16
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from pathlib import Path

import numpy as np
import torch

# the repository root first: run from a clone that is not installed, the script's folder (with its own ``data/``
# of labels) would otherwise shadow the project's ``data`` package
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MODES = ("fp32", "bf16", "bf16+fp32-head")


def _autocast(mode: str):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return contextlib.nullcontext() if mode == "fp32" else torch.autocast(device, dtype=torch.bfloat16)


def sequence_logps(model_path: str, pairs, tokenizer, mode: str, perturb: float = 0.0) -> np.ndarray:
    """Per-sequence completion log-probabilities, shape ``(2 * len(pairs),)``: chosen then rejected, pair by pair.

    The sequences are tokenized as TRL's DPO collator sees them (prompt rendered with the chat template, the
    completion appended), scored one at a time (no padding), through TRL's fused LM head.
    """
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    if perturb:  # a policy a few updates away from the reference: every weight moved by ``perturb`` of its scale
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=g) * perturb * p.abs().mean())
    return model_logps(model, pairs, tokenizer, mode)


def model_logps(model, pairs, tokenizer, mode: str = "fp32") -> np.ndarray:
    """:func:`sequence_logps` of a loaded causal LM (fp32 weights), shape ``(2 * len(pairs),)``."""
    from trl.trainer.utils import add_fused_lm_head

    model = model.eval()
    add_fused_lm_head(model, cast_lm_head_to_fp32=mode != "bf16")
    out = []
    for pair in pairs:
        prompt = tokenizer.apply_chat_template(pair["prompt"], tokenize=False, add_generation_prompt=True)
        for side in ("chosen", "rejected"):
            full = tokenizer.apply_chat_template(pair["prompt"] + pair[side], tokenize=False)
            p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            ids = tokenizer(full, add_special_tokens=False)["input_ids"]
            input_ids = torch.tensor([ids])
            labels = input_ids.clone()
            labels[0, : len(p_ids)] = -100
            with torch.no_grad(), _autocast(mode):
                lp = model(input_ids=input_ids, labels=labels, fused_lm_head=True).log_probs
            out.append(float(lp.float().sum()))
    return np.asarray(out)


def reward_scores(model_path: str, pairs, mode: str) -> np.ndarray:
    """Scores of a seeded new score head on the base model, shape ``(2 * len(pairs),)`` like :func:`sequence_logps`."""
    from judging.scoring import load_reward_model, score
    from rlhf.precision import keep_in_fp32

    torch.manual_seed(0)
    model, tok = load_reward_model(model_path, new_head=True)
    if mode == "bf16+fp32-head":
        keep_in_fp32(model.score)
    prompts = [p["prompt"] for p in pairs for _ in (0, 1)]
    responses = [p[side][0]["content"] for p in pairs for side in ("chosen", "rejected")]
    with _autocast(mode):
        return score(model, tok, prompts, responses, batch_size=8, max_length=512)


def _sign_agreement(a: np.ndarray, b: np.ndarray) -> float:
    da, db = a[0::2] - a[1::2], b[0::2] - b[1::2]
    return float(np.mean(np.sign(da) == np.sign(db)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--data", default="demo:hh_rlhf/pairs_heldout.jsonl")
    ap.add_argument("--pairs", type=int, default=48)
    ap.add_argument("--max-length", type=int, default=512)
    ap.add_argument("--perturb", type=float, default=0.01,
                    help="The policy for the DPO-margin check: the reference with every weight moved by this share of "
                         "its layer's mean magnitude (a stand-in for a few training steps).")
    ap.add_argument("--beta", type=float, default=0.1)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)

    import transformers
    from transformers import AutoTokenizer

    transformers.logging.set_verbosity_error()

    from data.loaders import load_pairs
    from data.pairs import prepare_pairs
    from data.schemas import pair_to_trl
    from rlhf.machine import native_bf16, threads_per_process
    from rlhf.models import resolve_base_model

    torch.set_num_threads(threads_per_process(1))
    path = resolve_base_model(args.model)
    tok = AutoTokenizer.from_pretrained(path)
    raw = load_pairs(args.data, limit=args.pairs)
    pairs = [pair_to_trl(p) for p in prepare_pairs(raw, tok, args.max_length, file=args.data).pairs]
    native, evidence = native_bf16()
    print(f"model {args.model}, {len(pairs)} pairs of {args.data} ({2 * len(pairs)} sequences), "
          f"{torch.get_num_threads()} threads; bf16: {evidence}{'' if native else ' (EMULATED: errors hold, speed not)'}")
    logps = {m: sequence_logps(path, pairs, tok, m) for m in MODES}
    policy = {m: sequence_logps(path, pairs, tok, m, perturb=args.perturb) for m in MODES}
    # DPO's margin: beta * ((log pi_c - log ref_c) - (log pi_r - log ref_r)), the policy a perturbed reference
    margins = {m: args.beta * ((policy[m][0::2] - logps[m][0::2]) - (policy[m][1::2] - logps[m][1::2])) for m in MODES}
    scores = {m: reward_scores(path, pairs, m) for m in MODES}
    labels_fp32 = float(np.mean(scores["fp32"][0::2] > scores["fp32"][1::2]))
    print(f"{'mode':16s} {'|dlogp| med':>11s} {'p95':>7s} {'max':>7s} {'rel p95':>8s} {'sign':>5s} | "
          f"{'|dscore| max':>12s} {'sign':>5s} {'RM agree':>8s} (fp32 {labels_fp32:.3f})")
    for m in MODES[1:]:
        d = np.abs(logps[m] - logps["fp32"])
        rel = d / np.maximum(np.abs(logps["fp32"]), 1e-9)
        ds = np.abs(scores[m] - scores["fp32"])
        agree = float(np.mean(scores[m][0::2] > scores[m][1::2]))
        print(f"{m:16s} {np.median(d):11.4f} {np.percentile(d, 95):7.4f} {d.max():7.4f} "
              f"{np.percentile(rel, 95):8.2e} {_sign_agreement(logps[m], logps['fp32']):5.3f} | "
              f"{ds.max():12.2e} {_sign_agreement(scores[m], scores['fp32']):5.3f} {agree:8.3f}", flush=True)
    print(f"DPO margin (beta {args.beta}, policy = reference perturbed by {args.perturb}): fp32 |margin| median "
          f"{np.median(np.abs(margins['fp32'])):.4f}")
    for m in MODES[1:]:
        dm = np.abs(margins[m] - margins["fp32"])
        same = float(np.mean(np.sign(margins[m]) == np.sign(margins["fp32"])))
        print(f"{m:16s} |d margin| median {np.median(dm):.4f} p95 {np.percentile(dm, 95):.4f} max {dm.max():.4f}; "
              f"margin sign agreement {same:.3f}; loss -logsigmoid(margin) max |d| "
              f"{np.max(np.abs(np.logaddexp(0, -margins[m]) - np.logaddexp(0, -margins['fp32']))):.4f}", flush=True)


if __name__ == "__main__":
    main()
