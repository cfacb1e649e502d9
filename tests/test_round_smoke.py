"""End to end: the smoke round (tiny model, same code path as demo) through the Prefect flow.

Checks what a user gets: checkpoints, manifests with hashes, a frozen pi_ref, offline W&B runs, the PPO unlock
numbers and a gate report with real numbers; a rerun reuses every stage; a changed input recomputes.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module", autouse=True)
def prefect_db():
    """A throwaway Prefect API + database, so tests never lock or litter the user's ~/.prefect."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness():
        yield


@pytest.fixture(scope="module")
def smoke_round(tmp_path_factory, prefect_db):
    from flows.round import RoundParameters, rlhf_round

    runs = tmp_path_factory.mktemp("runs")
    params = RoundParameters(preset="smoke", round_id="smoke-test", runs_dir=str(runs))
    first = rlhf_round(params)
    return params, runs / "smoke-test", first


def test_round_writes_checkpoints_manifests_and_a_verdict(smoke_round):
    _, round_dir, manifest = smoke_round
    assert json.loads((round_dir / "round.json").read_text()) == json.loads(json.dumps(manifest, default=str))
    for stage in ("sft", "dpo", "reward_model", "gates"):
        stage_manifest = json.loads((round_dir / stage / "manifest.json").read_text())
        assert len(stage_manifest["code_version"]) == 64
        assert stage_manifest["config_hash"]
    sft = json.loads((round_dir / "sft" / "manifest.json").read_text())
    assert len(sft["outputs"]["pi_ref_hash"]) == 64 and len(sft["inputs"]["train_data_hash"]) == 64
    assert (round_dir / "sft" / "pi_ref" / "model.safetensors").is_file()
    dpo = json.loads((round_dir / "dpo" / "manifest.json").read_text())
    assert dpo["inputs"]["pi_ref_hash"] == sft["outputs"]["pi_ref_hash"]
    assert abs(dpo["metrics"]["step0_loss_max_dev"]) < 1e-3 and dpo["metrics"]["step0_margin_max_abs"] < 1e-3
    assert manifest["verdict"] in ("pass", "block")


def test_ppo_unlock_decision_is_recorded_with_both_numbers(smoke_round):
    _, _, manifest = smoke_round
    unlock = manifest["ppo_unlock"]
    assert 0 <= unlock["rm_agreement"] <= 1
    assert unlock["inter_annotator_agreement"] == pytest.approx(0.947328, abs=1e-4)  # PandaLM, both picked a side
    assert unlock["unlocked"] == (unlock["rm_agreement"] > unlock["inter_annotator_agreement"])
    assert manifest["candidate"] == ("ppo" if unlock["unlocked"] else "dpo")


def test_gate_report_has_real_numbers_and_offline_wandb_runs(smoke_round):
    _, round_dir, manifest = smoke_round
    report = json.loads((round_dir / "gates" / "report.json").read_text())
    text = json.dumps(report)
    for metric in ("raw_win_rate", "length_controlled_win_rate", "violation_rate", "false_refusal_rate"):
        assert metric in text
    md = Path(manifest["gate_report"]).read_text()
    assert "win_rate" in md and "n_total" in md
    assert (round_dir / "gates" / "report.junit.xml").is_file()
    for stage in ("sft", "dpo", "reward_model", "gates"):
        runs = list((round_dir / stage / "wandb").glob("offline-run-*"))
        assert runs, f"no offline W&B run for {stage}"


def test_rerun_reuses_every_stage_and_a_changed_input_recomputes(smoke_round):
    from flows.round import rlhf_round

    params, round_dir, _ = smoke_round
    again = rlhf_round(params)
    assert all(s["cached"] for s in again["stages"].values())
    changed = rlhf_round(params.model_copy(update={"overrides": {"dpo": ["--beta", "0.2"]}}))
    cached = {name: s["cached"] for name, s in changed["stages"].items()}
    assert cached["sft"] and cached["reward_model"]
    assert not cached["dpo"] and not cached["gates"]
    dpo = json.loads((round_dir / "dpo" / "manifest.json").read_text())
    assert math.isclose(dpo["metrics"]["beta"], 0.2)
