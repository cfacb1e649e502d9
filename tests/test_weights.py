"""No training on random weights, a reproducible reward model, ``--report_to none``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from rlhf.lineage import content_hash
from rlhf.weights import IncompleteCheckpoint, atomic_copytree, load_checked

RECIPES = Path(__file__).resolve().parent.parent / "recipes" / "smoke"
DROPPED = ("model.norm.weight", "model.layers.1.mlp.down_proj.weight")


@pytest.fixture(scope="module")
def partial_checkpoint(tiny_model_dir, tmp_path_factory) -> Path:
    """The tiny model with ``model.norm.weight`` and one MLP weight deleted from its safetensors file."""
    from safetensors.torch import load_file, save_file

    out = tmp_path_factory.mktemp("partial") / "model"
    shutil.copytree(tiny_model_dir, out)
    weights = load_file(str(out / "model.safetensors"))
    for key in DROPPED:
        del weights[key]
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def test_sft_refuses_a_partial_base_checkpoint_naming_file_and_tensors(partial_checkpoint, tmp_path, monkeypatch):
    from sft.train import main

    monkeypatch.setenv("WANDB_MODE", "disabled")
    out = tmp_path / "sft"
    with pytest.raises(IncompleteCheckpoint) as err:
        main(["--config", str(RECIPES / "sft.yaml"), "--report_to", "none", "--max_steps", "1",
              "--model_name_or_path", str(partial_checkpoint), "--output_dir", str(out)])
    msg = str(err.value)
    assert str(partial_checkpoint / "model.safetensors") in msg and "2 missing tensor(s)" in msg
    assert all(key in msg for key in DROPPED)
    assert not (out / "manifest.json").exists() and not (out / "checkpoint").exists()


def test_a_head_created_on_purpose_is_allowed_and_nothing_else(tiny_model_dir, partial_checkpoint):
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    load_checked(AutoModelForSequenceClassification, tiny_model_dir, what="rm", dtype=torch.float32,
                 new_heads=["score"], num_labels=1)
    with pytest.raises(IncompleteCheckpoint, match="score.weight"):  # a reward model without its head: refused
        load_checked(AutoModelForSequenceClassification, tiny_model_dir, what="reward model", dtype=torch.float32,
                     num_labels=1)
    with pytest.raises(IncompleteCheckpoint, match="model.norm.weight"):
        load_checked(AutoModelForSequenceClassification, partial_checkpoint, what="rm", dtype=torch.float32,
                     new_heads=["score"])
    # complete (tied lm_head): accepted
    load_checked(AutoModelForCausalLM, tiny_model_dir, what="base", dtype=torch.float32)


def test_pi_ref_copy_is_atomic(tmp_path):
    src = tmp_path / "checkpoint"
    src.mkdir()
    (src / "model.safetensors").write_bytes(b"new weights")
    dst = tmp_path / "pi_ref"
    dst.mkdir()
    (dst / "model.safetensors").write_bytes(b"old weights")
    (dst / "model.safetensors").chmod(0o444)  # frozen, as freeze_dir leaves it
    atomic_copytree(src, dst)
    assert (dst / "model.safetensors").read_bytes() == b"new weights"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint", "pi_ref"]  # no temp folders left
    with pytest.raises(FileNotFoundError):
        atomic_copytree(tmp_path / "missing", dst)
    assert (dst / "model.safetensors").read_bytes() == b"new weights"  # a failed copy leaves pi_ref untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint", "pi_ref"]


def _heldout(path: Path) -> Path:
    """8 held-out pairs, 2 or 3 annotators each (ragged, as real annotation rounds are)."""
    rows = []
    for i in range(8):
        labels = [1, 1, 2] if i % 2 else [2, 2]
        rows.append({"prompt": f"question {i}?", "chosen": f"answer {i}", "rejected": f"another answer {i}",
                     "labels": [{"annotator_id": f"a{j}", "preference": p} for j, p in enumerate(labels)]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_reward_model_is_reproducible(tiny_model_dir, tmp_path, monkeypatch):
    """Two runs with seed 42: the same checkpoint bytes and the same agreement (the score head is seeded)."""
    from reward_model.train import main

    monkeypatch.setenv("WANDB_MODE", "disabled")
    held_out = _heldout(tmp_path / "heldout.jsonl")
    hashes, agreements = [], []
    for run in ("a", "b"):
        out = tmp_path / run
        metrics = main(["--config", str(RECIPES / "reward_model.yaml"), "--report_to", "none", "--max_steps", "2",
                        "--model_name_or_path", tiny_model_dir, "--output_dir", str(out),
                        "--agreement_data", str(held_out), "--agreement_data_mode", "strict"])
        hashes.append(content_hash(out / "checkpoint"))
        agreements.append(metrics["rm_agreement"]["agreement"])
    assert hashes[0] == hashes[1] and agreements[0] == agreements[1]
    assert metrics["inter_annotator_agreement"]["n_annotators"] == 3  # ragged labels went through the stage
    # 4 items [2, 2] (1 comparison, agree) and 4 items [1, 1, 2] (3 comparisons, 1 agree): 8 / 16.
    assert metrics["inter_annotator_agreement"]["pairwise_agreement_decisive"] == pytest.approx(0.5)


def test_report_to_none_writes_no_wandb_run_anywhere(tmp_path, monkeypatch):
    from sft.train import main

    for var in ("WANDB_MODE", "WANDB_DIR", "WANDB_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "runs" / "sft"
    main(["--config", str(RECIPES / "sft.yaml"), "--report_to", "none", "--max_steps", "1", "--output_dir", str(out)])
    assert (out / "manifest.json").is_file()
    assert not (tmp_path / "wandb").exists() and not list(tmp_path.rglob("wandb"))


def _file_mappings(path: Path) -> list[tuple[int, int]]:
    """Address ranges of this process's mappings of ``path`` (/proc/self/maps)."""
    ranges = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 6 and Path(fields[5]) == path:
            start, end = (int(x, 16) for x in fields[0].split("-"))
            ranges.append((start, end))
    return ranges


@pytest.mark.skipif(not Path("/proc/self/maps").is_file(), reason="reads the process's mappings from /proc")
def test_trained_weights_are_copied_out_of_the_checkpoint_file_mapping_and_stay_tied(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(tiny_model_dir).save_pretrained(tmp_path / "ckpt")  # tied, safetensors
    weights = (tmp_path / "ckpt" / "model.safetensors").resolve()

    def in_mapping(model) -> int:
        ranges = _file_mappings(weights)
        return sum(any(a <= p.data_ptr() < b for a, b in ranges) for p in model.parameters())

    mapped = load_checked(AutoModelForCausalLM, tmp_path / "ckpt", what="reference", dtype=torch.float32)
    assert in_mapping(mapped) > 0  # transformers trains on the file mapping itself: what the copy is for
    trained = load_checked(AutoModelForCausalLM, tmp_path / "ckpt", what="policy", dtype=torch.float32, trained=True)
    assert in_mapping(trained) == 0
    assert trained.lm_head.weight is trained.model.embed_tokens.weight  # still one tensor
    for (name, a), b in zip(mapped.state_dict().items(), trained.state_dict().values()):
        assert torch.equal(a, b), name
