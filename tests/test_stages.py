"""Stages launched alone on the tiny model: bad data handling, pi_ref freezing, LoRA reward-model reload."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from data.validation import DataValidationError
from rlhf.checkpoint import check_checkpoint
from rlhf.lineage import content_hash

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
    with pytest.MonkeyPatch.context() as mp:  # not os.environ: it would leak into later tests
        mp.setenv("WANDB_MODE", "disabled")
        main(["--config", str(RECIPES / "sft.yaml"), "--report_to", "none", "--max_steps", "1", "--output_dir", str(out)])
    return out


def test_reward_model_with_lora_saves_its_score_head_and_records_the_unlock_rule(sft_dir, tmp_path):
    from judging.unlock import decide_from_metrics
    from reward_model.train import main

    out = tmp_path / "rm"
    metrics = main(["--config", str(RECIPES / "reward_model.yaml"), "--report_to", "none", "--output_dir", str(out),
                    "--sft_dir", str(sft_dir), "--use_peft", "true", "--lora_r", "4", "--max_agreement_pairs", "8"])
    assert metrics["reload_max_abs_diff"] < 1e-5  # the reloaded checkpoint reproduces the held-out scores
    # the stage records the two measurements; the rule (applied by the flow) reads them from the manifest
    unlock = decide_from_metrics(json.loads((out / "manifest.json").read_text())["metrics"]).to_dict()
    assert unlock["rm_n"] <= 8 and unlock["iaa_statistic"] == "pairwise_agreement_decisive"
    # PandaLM after the 60 unusable rows are listed as rejects (939 pairs, 3 annotators each).
    assert unlock["inter_annotator_agreement"] == pytest.approx(0.9446254, abs=1e-6)
    assert unlock["unlocked"] is False and unlock["rule_verdict"] is False


def test_ppo_override_needs_a_reason_and_is_recorded(sft_dir, tmp_path):
    from judging.unlock import decide_from_metrics
    from reward_model.train import main

    base = ["--config", str(RECIPES / "reward_model.yaml"), "--report_to", "none", "--sft_dir", str(sft_dir),
            "--max_agreement_pairs", "4", "--max_steps", "1"]
    main(base + ["--output_dir", str(tmp_path / "b")])
    measured = json.loads((tmp_path / "b" / "manifest.json").read_text())["metrics"]
    with pytest.raises(ValueError, match="reason"):
        decide_from_metrics(measured, override=True)
    unlock = decide_from_metrics(measured, override=True, override_reason="ablation").to_dict()
    assert unlock["unlocked"] and unlock["overridden"] and unlock["override_reason"] == "ablation"
    # the rule's own verdict is kept next to the override
    assert unlock["rule_verdict"] == (unlock["rm_agreement"] > unlock["inter_annotator_agreement"])


def _flow_keys(tmp_path, params):
    """The cache keys the flow gives the reward-model and gate stages for ``params`` (recipes of the smoke preset;
    the PPO unlock decision written as the flow writes it)."""
    from flows.round import UNLOCK_FILE, _recipe, stage_args
    from flows.stages import StageRun, stage_cache_key
    from judging.agreement import inter_annotator_agreement, rm_agreement
    from judging.unlock import decide_from_metrics

    round_dir = tmp_path / "round"
    round_dir.mkdir(exist_ok=True)
    rm_metrics = {"rm_agreement": rm_agreement([1.0, 0.0], [0.0, 1.0], [1, 2]).to_dict(),
                  "inter_annotator_agreement": inter_annotator_agreement([[1, 1], [2, 1]], n_resamples=100).to_dict()}
    decision = decide_from_metrics(rm_metrics, override=params.ppo_override, override_reason=params.ppo_override_reason)
    (round_dir / UNLOCK_FILE).write_text(json.dumps(decision.to_dict()))
    dirs = {"sft": "s", "dpo": "d", "reward_model": "r", "candidate": "d"}
    sft = StageRun("sft", "s", {"outputs": {"checkpoint_hash": "h"}}, "k", False, 0)
    keys = {}
    for stage in ("reward_model", "gates"):
        args = [*stage_args(stage, params, round_dir, dirs), "--round_id", round_dir.name]
        keys[stage] = stage_cache_key(stage, _recipe(params, stage), args, [sft])
    return keys, decision


def test_the_ppo_override_never_changes_the_reward_model_key_but_reaches_the_gates(tmp_path):
    from flows.round import RoundParameters

    plain = RoundParameters(preset="smoke")
    keys, decision = _flow_keys(tmp_path, plain)
    assert decision.rule_verdict is True and not decision.overridden  # RM 1.0 > IAA 0.5
    override = plain.model_copy(update={"ppo_override": True, "ppo_override_reason": "ablation"})
    keys_override, decision_override = _flow_keys(tmp_path, override)
    assert decision_override.overridden and decision_override.override_reason == "ablation"
    assert keys_override["reward_model"] == keys["reward_model"]  # the RM is not retrained for an override
    assert keys_override["gates"] != keys["gates"]  # the gate report records the decision, so it is recomputed


def test_sft_with_lora_merges_adapters_so_pi_ref_is_a_whole_model(tmp_path, sft_args):
    from safetensors import safe_open

    from sft.train import main

    out = tmp_path / "sft"
    main(sft_args + ["--output_dir", str(out), "--use_peft", "true", "--lora_r", "4"])
    pi_ref = json.loads((out / "manifest.json").read_text())["outputs"]["pi_ref"]
    with safe_open(str(Path(pi_ref) / "model.safetensors"), framework="pt") as st:
        keys = list(st.keys())
    assert keys and not any("lora" in k for k in keys)  # a plain model DPO can load as its reference
