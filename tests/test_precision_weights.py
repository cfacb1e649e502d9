"""Precision is what runs: a base checkpoint saved in bf16 is trained as fp32 master weights (under bf16 autocast
where the precision resolves to bf16), the manifest records the dtypes of the loaded and trained weights and the
autocast a training forward measured, and a model or accelerator in another precision is refused in one line.

Why the fraction of changed weights: transformers 5 loads a checkpoint in the dtype its config names unless told
otherwise, so a bf16-saved base used to train in pure bf16 while the manifest said fp32. Measured on the tiny model
(one SFT step, lr 1e-5, Adam): pure bf16 changed 15% of the weights (Adam's first step moves every weight by about
the learning rate, below bf16's resolution of 2^-8 relative for most of them, so it rounds away); fp32 master
weights changed 100%, in fp32 as under bf16 autocast.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

RECIPES = Path(__file__).resolve().parent.parent / "recipes" / "smoke"
# one step, a learning rate whose updates are below bf16's resolution, short rows (bf16 is emulated on most CPUs)
ONE_STEP = ["--report_to", "none", "--max_steps", "1", "--learning_rate", "1e-5", "--max_length", "128",
            "--max_train_samples", "2", "--per_device_train_batch_size", "2"]


@pytest.fixture(scope="module")
def bf16_base(tiny_model_dir, tmp_path_factory) -> Path:
    """The tiny model saved in bf16 (config.json says ``"dtype": "bfloat16"``)."""
    base = tmp_path_factory.mktemp("bf16") / "base"
    AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).to(torch.bfloat16).save_pretrained(base)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(base)
    assert {str(t.dtype) for t in load_file(str(base / "model.safetensors")).values()} == {"torch.bfloat16"}
    assert json.loads((base / "config.json").read_text())["dtype"] == "bfloat16"
    return base


def _changed_share(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> float:
    assert before.keys() == after.keys()
    n = sum(t.numel() for t in before.values())
    return sum(int((before[k].float() != after[k].float()).sum()) for k in before) / n


@pytest.mark.parametrize("native,precision,autocast", [("0", "fp32", "off"), ("1", "bf16", "bfloat16")])
def test_a_bf16_saved_base_trains_fp32_master_weights_as_the_manifest_says(native, precision, autocast, bf16_base,
                                                                           tmp_path, monkeypatch):
    from sft.train import main

    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("RLHF_NATIVE_BF16", native)  # the bf16 path runs on any CPU (emulated where not native)
    out = tmp_path / "sft"
    main(["--config", str(RECIPES / "sft.yaml"), "--output_dir", str(out), "--model_name_or_path", str(bf16_base),
          "--precision", precision, *ONE_STEP])
    manifest = json.loads((out / "manifest.json").read_text())
    trained = load_file(str(out / "checkpoint" / "model.safetensors"))
    assert {str(t.dtype) for t in trained.values()} == {"torch.float32"}  # the trained state, as saved
    assert manifest["precision"] == precision
    dtypes = manifest["precision_dtypes"]
    assert dtypes["weights_loaded"] == {"model": {"float32": 20}}  # the tiny Llama's 20 floating-point tensors
    assert dtypes["weights_trained"] == {"model": {"float32": 20}}
    assert dtypes["autocast"] == autocast and dtypes["autocast_measured"] == autocast
    share = _changed_share(load_file(str(bf16_base / "model.safetensors")), trained)
    print(f"{precision}: one step changed {share:.4f} of the weights (pure bf16 measured 0.15)")
    assert share > 0.99


def _dpo_sft_dir(bf16_base: Path, root: Path) -> Path:
    """An SFT stage folder whose frozen pi_ref is the bf16-saved base (what DPO reads: the manifest's pi_ref and
    its content hash)."""
    from rlhf.checkpoint import freeze_dir
    from rlhf.manifest import write_manifest
    from rlhf.weights import atomic_copytree

    sft = root / "sft"
    pi_ref = atomic_copytree(bf16_base, sft / "pi_ref")
    write_manifest(sft, {"stage": "sft", "outputs": {"pi_ref": str(pi_ref), "pi_ref_hash": freeze_dir(pi_ref)}})
    return sft


@pytest.mark.parametrize("stage", ["dpo", "reward_model"])
def test_dpo_and_the_reward_model_load_a_bf16_checkpoint_as_fp32_master_weights(stage, bf16_base, tmp_path,
                                                                                monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    out = tmp_path / stage
    common = ["--output_dir", str(out), "--report_to", "none", "--max_steps", "1",
              "--max_train_samples", "2", "--per_device_train_batch_size", "2"]
    if stage == "dpo":
        from dpo.train import main

        main(["--config", str(RECIPES / "dpo.yaml"), "--sft_dir", str(_dpo_sft_dir(bf16_base, tmp_path)),
              "--step0_pairs", "2", *common])
        want = {"model": {"float32": 20}, "ref_model": {"float32": 20}}  # the reference's log-probs count too
    else:
        from reward_model.train import main

        main(["--config", str(RECIPES / "reward_model.yaml"), "--model_name_or_path", str(bf16_base),
              "--max_agreement_pairs", "4", *common])
        want = {"model": {"float32": 21}}  # the 20 tensors of the causal LM (tied LM head) + the new score head
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["precision"] == "fp32"
    dtypes = manifest["precision_dtypes"]
    assert dtypes["weights_loaded"] == want and dtypes["weights_trained"] == want
    assert dtypes["autocast"] == dtypes["autocast_measured"] == "off"
    assert {str(t.dtype) for t in load_file(str(out / "checkpoint" / "model.safetensors")).values()} == {
        "torch.float32"}


def test_a_model_in_another_dtype_or_an_accelerator_in_another_precision_is_refused_in_one_line(tiny_model_dir,
                                                                                               tokenizer, tmp_path):
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from rlhf.precision import PrecisionMismatch, check_precision
    from rlhf.trainer_stage import TrainerStage

    bf16 = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16)
    args = SFTConfig(output_dir=str(tmp_path), report_to=[], use_cpu=True, bf16=False, max_length=32)
    rows = Dataset.from_list([{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}])
    trainer = SFTTrainer(model=bf16, args=args, train_dataset=rows, processing_class=tokenizer)
    with pytest.raises(PrecisionMismatch) as err:
        TrainerStage("sft", args).attach(trainer)  # what every stage calls before its trainer runs
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("sft: precision fp32 trains float32 master weights")
    assert "model holds 20 bfloat16 of 20 floating-point tensors" in msg

    fp32 = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    check_precision("sft", "bf16", {"model": fp32}, "bf16")  # fp32 weights under bf16 autocast: as it should be
    with pytest.raises(PrecisionMismatch, match=r"^dpo: precision bf16 implies autocast bfloat16, but the "
                                                r"accelerator runs mixed_precision='no' \(autocast off\)$"):
        check_precision("dpo", "bf16", {"model": fp32}, "no")


def test_the_autocast_probe_reads_the_autocast_of_the_first_training_forward(tiny_model_dir):
    from rlhf.precision import AutocastProbe

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    ids = torch.tensor([[1, 2, 3]])
    probe = AutocastProbe(model)
    model.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        model(input_ids=ids)  # evaluation (DPO's step-0 check): not training, not recorded
    assert not probe.measured
    model.train()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        model(input_ids=ids)
    assert probe.measured and probe.dtype == "bfloat16"
    with torch.no_grad():
        model(input_ids=ids)  # the hook removed itself after the first training forward
    assert probe.dtype == "bfloat16"
    plain = AutocastProbe(model)
    with torch.no_grad():
        model(input_ids=ids)
    assert plain.measured and plain.dtype is None
