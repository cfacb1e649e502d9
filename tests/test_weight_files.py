"""Every load checks the weight files against the model config first and
refuses an empty or partial checkpoint, naming the file and the tensor (rlhf.weights.check_weight_files, called
by load_checked, which SFT, DPO, the reward model and the gates load through, and by PPO's loader)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from rlhf.weights import IncompleteCheckpoint, check_weight_files, load_checked

RECIPES = Path(__file__).resolve().parent.parent / "recipes" / "smoke"


@pytest.fixture(scope="module")
def sharded(tiny_model_dir, tmp_path_factory) -> Path:
    """The tiny model saved in 1 MB shards with an index (as large checkpoints are)."""
    out = tmp_path_factory.mktemp("sharded") / "model"
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.save_pretrained(out, max_shard_size="1MB")
    for f in Path(tiny_model_dir).glob("tokenizer*"):
        shutil.copy(f, out)
    assert len(list(out.glob("model-*.safetensors"))) >= 2 and (out / "model.safetensors.index.json").is_file()
    return out


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _shards(path: Path) -> list[Path]:
    return sorted(path.glob("model-*.safetensors"))


def test_a_complete_checkpoint_passes_with_every_tensor_checked(sharded, tiny_model_dir):
    shapes = check_weight_files(AutoModelForCausalLM, sharded, what="base")
    assert shapes["model.embed_tokens.weight"] == shapes["lm_head.weight"]  # tied: saved once, both checked
    assert len(shapes) == 21  # 2 layers x 9 tensors + embeddings + final norm + lm_head
    load_checked(AutoModelForCausalLM, sharded, what="base", dtype=torch.float32)
    # a reward model from a causal LM: the unused lm_head is ignored, the new score head allowed by name only
    check_weight_files(AutoModelForSequenceClassification, tiny_model_dir, what="rm", new_heads=["score"], num_labels=1)


def test_a_missing_shard_is_refused_naming_the_shard(sharded, tmp_path):
    bad = _copy(sharded, tmp_path / "m")
    gone = _shards(bad)[1]
    gone.unlink()
    with pytest.raises(IncompleteCheckpoint, match=f"SFT base model {gone}: shard missing") as err:
        load_checked(AutoModelForCausalLM, bad, what="SFT base model", dtype=torch.float32)
    assert "model.safetensors.index.json" in str(err.value)


def test_a_zero_byte_or_truncated_file_is_refused_naming_it(sharded, tiny_model_dir, tmp_path):
    bad = _copy(sharded, tmp_path / "z")
    empty = _shards(bad)[0]
    empty.write_bytes(b"")
    with pytest.raises(IncompleteCheckpoint, match=f"{empty}: zero-byte weight file"):
        load_checked(AutoModelForCausalLM, bad, what="base", dtype=torch.float32)
    bad = _copy(Path(tiny_model_dir), tmp_path / "t")
    f = bad / "model.safetensors"
    f.write_bytes(f.read_bytes()[:100])
    with pytest.raises(IncompleteCheckpoint, match=f"{f}: unreadable weight file"):
        load_checked(AutoModelForCausalLM, bad, what="base", dtype=torch.float32)


def test_an_empty_checkpoint_is_refused(tiny_model_dir, tmp_path):
    bad = tmp_path / "e"
    bad.mkdir()
    shutil.copy(Path(tiny_model_dir) / "config.json", bad)
    with pytest.raises(IncompleteCheckpoint, match=f"{bad}: no .safetensors weights"):
        load_checked(AutoModelForCausalLM, bad, what="base", dtype=torch.float32)


def test_a_tensor_the_index_names_but_the_shard_lacks_is_refused(sharded, tmp_path):
    bad = _copy(sharded, tmp_path / "i")
    shard = _shards(bad)[0]
    tensors = load_file(str(shard))
    key = min(tensors)
    del tensors[key]
    save_file(tensors, str(shard), metadata={"format": "pt"})
    with pytest.raises(IncompleteCheckpoint, match=f"{shard}: tensor {key} is named by model.safetensors.index.json"):
        load_checked(AutoModelForCausalLM, bad, what="base", dtype=torch.float32)


def test_a_shape_that_differs_from_the_config_is_refused_naming_file_tensor_and_shapes(tiny_model_dir, tmp_path):
    bad = _copy(Path(tiny_model_dir), tmp_path / "s")
    cfg = json.loads((bad / "config.json").read_text())
    cfg["intermediate_size"] += 8  # the config says one thing, the saved MLP weights another
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(IncompleteCheckpoint) as err:
        check_weight_files(AutoModelForCausalLM, bad, what="gate model")
    msg = str(err.value)
    inter = cfg["intermediate_size"]
    assert "6 tensor(s) of the wrong shape" in msg  # gate, up, down of both layers
    assert (f"model.layers.0.mlp.down_proj.weight in {bad / 'model.safetensors'}: saved [{cfg['hidden_size']}, "
            f"{inter - 8}], config gives [{cfg['hidden_size']}, {inter}]") in msg


def test_the_sft_stage_refuses_a_zero_byte_base_model_before_training(tiny_model_dir, tmp_path, monkeypatch):
    from sft.train import main

    monkeypatch.setenv("WANDB_MODE", "disabled")
    bad = _copy(Path(tiny_model_dir), tmp_path / "base")
    (bad / "model.safetensors").write_bytes(b"")
    out = tmp_path / "sft"
    with pytest.raises(IncompleteCheckpoint, match=f"SFT base model {bad / 'model.safetensors'}: zero-byte"):
        main(["--config", str(RECIPES / "sft.yaml"), "--report_to", "none", "--max_steps", "1",
              "--model_name_or_path", str(bad), "--output_dir", str(out)])
    assert not (out / "manifest.json").exists() and not (out / "checkpoint").exists()
