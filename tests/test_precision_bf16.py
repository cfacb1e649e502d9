"""The bf16 path runs on every machine: the detection is forced (``RLHF_NATIVE_BF16``), so a CPU without native bf16
runs the same code (emulated: slower, the same numbers up to rounding) and a CPU with it runs the fp32 path too.

- accelerate's process-wide state left by one precision does not break a stage with another (PPO in-process);
- the reward model's score head and DPO's LM-head projection stay fp32 under bf16 autocast (hand-computed values);
- DPO's step-0 invariant is exactly ln 2 under bf16; the reward stage trained under bf16 scores its held-out pairs
  in fp32, so the reloaded checkpoint reproduces them.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM

RECIPES = Path(__file__).resolve().parent.parent / "recipes" / "smoke"


def test_stage_accelerator_replaces_a_state_left_with_another_precision():
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    from rlhf.precision import stage_accelerator

    AcceleratorState._reset_state()
    assert str(Accelerator(mixed_precision="bf16", cpu=True).mixed_precision) == "bf16"
    with pytest.raises(ValueError, match="already been initialized"):  # what accelerate itself does
        Accelerator(mixed_precision="no", cpu=True)
    assert str(stage_accelerator("no", cpu=True).mixed_precision) == "no"
    assert str(stage_accelerator("no", cpu=True).mixed_precision) == "no"  # same precision: state kept
    assert str(stage_accelerator("bf16", cpu=True).mixed_precision) == "bf16"
    AcceleratorState._reset_state()


def test_keep_in_fp32_runs_a_score_head_in_fp32_under_bf16_autocast():
    from rlhf.precision import keep_in_fp32

    torch.manual_seed(0)
    head, x = torch.nn.Linear(64, 1, bias=False), torch.randn(8, 64) * 3
    exact = head(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = head(x)
    assert plain.dtype == torch.bfloat16 and not torch.equal(plain.float(), exact)
    keep_in_fp32(head)
    copied = copy.deepcopy(head)  # PEFT's modules_to_save wraps a deep copy of the head
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours, ours_copy = head(x.bfloat16()), copied(x)
        after = torch.nn.functional.linear(x, head.weight)  # autocast is back on after the head
    assert ours.dtype == torch.float32 and torch.allclose(ours, head(x.bfloat16().float()))
    assert torch.equal(ours_copy, exact)
    assert after.dtype == torch.bfloat16
    assert keep_in_fp32(head) is head and len(head._forward_hooks) == 1  # idempotent


def _dpo_trainer(tiny_model_dir, tokenizer, tmp_path, fp32_log_probs: bool, bf16: bool, n: int = 4):
    from trl import DPOConfig

    from data.loaders import load_pairs
    from data.pairs import prepare_pairs
    from data.schemas import pair_to_trl
    from dpo.trainer import FP32LogProbDPOTrainer

    pairs = prepare_pairs(load_pairs("demo:hh_rlhf/pairs_train.jsonl", limit=n), tokenizer, 256, file="demo").pairs
    args = DPOConfig(output_dir=str(tmp_path), report_to=[], bf16=bf16, use_cpu=True, max_length=256,
                     per_device_eval_batch_size=1)
    return FP32LogProbDPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        ref_model=AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        args=args, train_dataset=Dataset.from_list([pair_to_trl(p) for p in pairs]), processing_class=tokenizer,
        fp32_log_probs=fp32_log_probs,
    )


def _fp32_projection_log_probs(model, input_ids, labels):
    """Hand-computed: the backbone under bf16 autocast, then the LM head and log-softmax in fp32, outside it."""
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        hidden = model.model(input_ids=input_ids).last_hidden_state[:, :-1]
    logits = hidden.float() @ model.lm_head.weight.float().t()
    lp = torch.log_softmax(logits, dim=-1).gather(-1, labels[:, 1:].clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return lp.masked_fill(labels[:, 1:] == -100, 0)


@pytest.mark.parametrize("fp32_log_probs", [True, False])
def test_dpo_log_probs_come_from_an_fp32_projection_under_bf16_autocast(fp32_log_probs, tiny_model_dir, tokenizer,
                                                                        tmp_path):
    trainer = _dpo_trainer(tiny_model_dir, tokenizer, tmp_path, fp32_log_probs, bf16=False, n=1)
    row = trainer.train_dataset[0]
    ids = torch.tensor([row["prompt_ids"] + row["chosen_ids"]])
    labels = ids.clone()
    labels[0, : len(row["prompt_ids"])] = -100
    for model in (trainer.model, trainer.ref_model):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            got = model(input_ids=ids, labels=labels, fused_lm_head=True).log_probs.float()
        want = _fp32_projection_log_probs(model, ids, labels)
        # the fp32 projection matches the hand computation to fp32 rounding; TRL's bf16 projection does not
        assert torch.allclose(got, want, atol=1e-5) == fp32_log_probs, float((got - want).abs().max())


def test_dpo_step0_is_exactly_ln2_under_bf16_autocast(tiny_model_dir, tokenizer, tmp_path):
    from dpo.train import step0_check

    trainer = _dpo_trainer(tiny_model_dir, tokenizer, tmp_path, fp32_log_probs=True, bf16=True)
    assert str(trainer.accelerator.mixed_precision) == "bf16"
    result = step0_check(trainer, trainer.train_dataset, tolerance=1e-4)
    assert result["step0_n"] == 4 and result["step0_loss_max_dev"] < 1e-6 and result["step0_margin_max_abs"] < 1e-6
    # Why step0_check evaluates under the trainer's autocast: before training only the reference is autocast, so
    # a plain evaluate scores the policy in fp32 and the reference in bf16, and misses ln 2.
    m = trainer.evaluate(eval_dataset=trainer.train_dataset, metric_key_prefix="plain")
    assert abs(m["plain_loss"] - math.log(2)) > 1e-6


def test_reward_stage_under_bf16_scores_held_out_pairs_as_its_reloaded_checkpoint_does(tiny_model_dir, tmp_path,
                                                                                          monkeypatch):
    from reward_model.train import main

    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("RLHF_NATIVE_BF16", "1")  # the native-bf16 path, on any CPU
    out = tmp_path / "rm"
    metrics = main(["--config", str(RECIPES / "reward_model.yaml"), "--report_to", "none", "--output_dir", str(out),
                    "--model_name_or_path", tiny_model_dir, "--precision", "bf16", "--max_steps", "1",
                    "--max_agreement_pairs", "8"])
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["precision"] == "bf16"
    assert metrics["reload_max_abs_diff"] < 1e-5  # held-out scores taken in fp32, as the reload scores


@pytest.mark.parametrize("native", ["0", "1"])
def test_generation_precision_is_fp32_on_a_cpu_unless_bf16_is_asked_for(native, monkeypatch):
    """auto is fp32 on a CPU either way (bf16 answers change with the batch); bf16 on request only where native."""
    from rlhf.precision import generation_precision

    monkeypatch.setenv("RLHF_NATIVE_BF16", native)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert generation_precision("auto") == "fp32"
    assert generation_precision("bf16") == ("bf16" if native == "1" else "fp32")
    assert generation_precision("fp32") == "fp32"
    with pytest.raises(ValueError):
        generation_precision("fp16")


def test_generation_precision_auto_is_bf16_on_a_cuda_device_with_native_bf16(monkeypatch):
    from rlhf.precision import generation_precision

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("RLHF_NATIVE_BF16", "1")
    assert generation_precision("auto") == "bf16"
    monkeypatch.setenv("RLHF_NATIVE_BF16", "0")
    assert generation_precision("auto") == "fp32"


def test_bf16_generation_at_auto_batch_equals_one_at_a_time_in_bf16(tiny_model_dir, tokenizer):
    """Batched greedy decoding in bf16 weights gives the one-at-a-time answers in the same precision."""
    from data.loaders import load_eval_prompts
    from rlhf.generation import generate

    prompts = [p.prompt for p in load_eval_prompts("demo:mt_bench/mt_bench_question.jsonl")][:12]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16).eval()
    batched, n_batched = generate(model, tokenizer, prompts, max_new_tokens=12, batch_size="auto")
    alone = [generate(model, tokenizer, [p], max_new_tokens=12, batch_size=1) for p in prompts]
    assert batched == [t[0][0] for t in alone] and n_batched == [t[1][0] for t in alone]


@pytest.mark.parametrize("native", ["0", "1"])
def test_long_prompt_prefill_is_bf16_where_bf16_is_native_and_the_weights_are_fp32(native, monkeypatch):
    """auto prefills long prompts in bf16 on a CPU with native bf16 (then decodes in fp32); never without it."""
    from rlhf.precision import prefill_precision

    monkeypatch.setenv("RLHF_NATIVE_BF16", native)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert prefill_precision("auto", "fp32") == "fp32"  # fp32 asked for on a GPU: no bf16 copy in device memory
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert prefill_precision("auto", "fp32") == ("bf16" if native == "1" else "fp32")
    assert prefill_precision("bf16", "fp32") == ("bf16" if native == "1" else "fp32")
    assert prefill_precision("fp32", "fp32") == "fp32"
    assert prefill_precision("auto", "bf16") == "bf16"  # bf16 weights prefill in bf16: no copy
    with pytest.raises(ValueError, match="prefill precision must be auto, fp32 or bf16"):
        prefill_precision("fp16")
    with pytest.raises(ValueError, match="generation precision must be fp32 or bf16"):
        prefill_precision("auto", "auto")
