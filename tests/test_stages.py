"""Stages launched alone on the tiny model: bad data handling, pi_ref freezing, LoRA reward-model reload."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from data.validation import DataValidationError
from rlhf.lineage import content_hash
from rlhf.checkpoint import check_checkpoint

RECIPES = Path(__file__).resolve().parent.parent / "recipes" / "smoke"


def _write_sft(path: Path, n_good: int, bad_rows: dict[int, dict]) -> Path:
    with open(path, "w") as f:
        for i in range(n_good + len(bad_rows)):
            row = bad_rows.get(i) or {"messages": [{"role": "user", "content": f"question {i}"},
                                                    {"role": "assistant", "content": f"answer {i}"}]}
            f.write(json.dumps(row) + "\n")
    return path


BAD = {2: {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": 7}]}}


@pytest.fixture
def sft_args(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    return ["--config", str(RECIPES / "sft.yaml"), "--report_to", "none", "--max_steps", "1"]


def test_sft_strict_mode_stops_at_the_bad_row_and_writes_nothing(tmp_path, sft_args):
    from sft.train import main

    data = _write_sft(tmp_path / "demos.jsonl", 6, BAD)
    out = tmp_path / "sft"
    with pytest.raises(DataValidationError) as exc:
        main(sft_args + ["--train_data", str(data), "--output_dir", str(out)])
    assert exc.value.row == 2 and "content" in exc.value.field and "demos.jsonl" in exc.value.file
    assert not (out / "manifest.json").exists() and not (out / "checkpoint").exists()


def test_sft_lenient_mode_lists_rejects_then_trains_and_freezes_pi_ref(tmp_path, sft_args):
    from sft.train import main

    data = _write_sft(tmp_path / "demos.jsonl", 6, BAD)
    out = tmp_path / "sft"
    main(sft_args + ["--train_data", str(data), "--output_dir", str(out), "--data_mode", "lenient",
                     "--max_reject_rate", "0.2"])
    rejects = [json.loads(line) for line in open(out / "rejects-data.jsonl")]
    assert [r["row"] for r in rejects] == [2]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["metrics"]["n_rows"] == 6 and manifest["metrics"]["n_data_rejected"] == 1
    assert str(out / "rejects-data.jsonl") in [str(Path(p)) for p in manifest["metrics"]["rejects_files"]]
    pi_ref = Path(manifest["outputs"]["pi_ref"])
    assert manifest["outputs"]["pi_ref_hash"] == content_hash(pi_ref)
    assert not os.stat(pi_ref / "model.safetensors").st_mode & stat.S_IWUSR  # frozen: read-only
    check_checkpoint(manifest["outputs"]["checkpoint"])
    assert manifest["inputs"]["train_data_hash"] == content_hash(data)


def test_sft_lenient_mode_stops_above_the_reject_rate(tmp_path, sft_args):
    from sft.train import main

    data = _write_sft(tmp_path / "demos.jsonl", 3, BAD)
    with pytest.raises(DataValidationError, match="max_reject_rate"):
        main(sft_args + ["--train_data", str(data), "--output_dir", str(tmp_path / "sft"), "--data_mode", "lenient",
                         "--max_reject_rate", "0.1"])


@pytest.fixture(scope="module")
def sft_dir(tmp_path_factory):
    from sft.train import main

    out = tmp_path_factory.mktemp("round") / "sft"
    os.environ["WANDB_MODE"] = "disabled"
    main(["--config", str(RECIPES / "sft.yaml"), "--report_to", "none", "--max_steps", "1", "--output_dir", str(out)])
    return out


def test_reward_model_with_lora_saves_its_score_head_and_records_the_unlock_rule(sft_dir, tmp_path):
    from reward_model.train import main

    out = tmp_path / "rm"
    metrics = main(["--config", str(RECIPES / "reward.yaml"), "--report_to", "none", "--output_dir", str(out),
                    "--sft_dir", str(sft_dir), "--use_peft", "true", "--lora_r", "4", "--max_agreement_pairs", "8"])
    assert metrics["reload_max_abs_diff"] < 1e-5  # the reloaded checkpoint reproduces the held-out scores
    unlock = json.loads((out / "manifest.json").read_text())["outputs"]["ppo_unlock"]
    assert unlock["rm_n"] <= 8 and unlock["iaa_statistic"] == "pairwise_agreement_decisive"
    # PandaLM after the 60 unusable rows are listed as rejects (939 pairs, 3 annotators each).
    assert unlock["inter_annotator_agreement"] == pytest.approx(0.9446254, abs=1e-6)
    assert unlock["unlocked"] is False and unlock["rule_verdict"] is False


def test_ppo_override_needs_a_reason_and_is_recorded(sft_dir, tmp_path):
    from reward_model.train import main

    base = ["--config", str(RECIPES / "reward.yaml"), "--report_to", "none", "--sft_dir", str(sft_dir),
            "--max_agreement_pairs", "4", "--max_steps", "1"]
    with pytest.raises(ValueError, match="reason"):
        main(base + ["--output_dir", str(tmp_path / "a"), "--ppo_override", "true"])
    main(base + ["--output_dir", str(tmp_path / "b"), "--ppo_override", "true", "--ppo_override_reason", "ablation"])
    unlock = json.loads((tmp_path / "b" / "manifest.json").read_text())["outputs"]["ppo_unlock"]
    assert unlock["unlocked"] and unlock["overridden"] and unlock["override_reason"] == "ablation"
    # the rule's own verdict is kept next to the override
    assert unlock["rule_verdict"] == (unlock["rm_agreement"] > unlock["inter_annotator_agreement"])


def test_sft_with_lora_merges_adapters_so_pi_ref_is_a_whole_model(tmp_path, sft_args):
    from safetensors import safe_open

    from sft.train import main

    out = tmp_path / "sft"
    main(sft_args + ["--output_dir", str(out), "--use_peft", "true", "--lora_r", "4"])
    pi_ref = json.loads((out / "manifest.json").read_text())["outputs"]["pi_ref"]
    with safe_open(str(Path(pi_ref) / "model.safetensors"), framework="pt") as st:
        keys = list(st.keys())
    assert keys and not any("lora" in k for k in keys)  # a plain model DPO can load as its reference
