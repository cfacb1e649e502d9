"""W&B as researchers read it, from the offline run files (W&B offline, the default), read back with the installed
wandb's own transaction-log reader (``wandb leet inspect --json``, as tests/test_wandb_resume.py does).

A round's stages (SFT, DPO, reward model, gates on the tiny model, through the flow's stage launcher with the
arguments the flow gives them) each write one run: ``job_type`` the stage, named ``<round_id>/<stage>``, grouped
by the round, ``round_id`` and ``stage`` in the config. DPO's and the reward model's configs name the SFT
checkpoint they trained (``model_name_or_path``) and the round's base model, not the ``--model_name_or_path``
default. The gate run's config holds the thresholds, the judge and its agreement, the suites with n and the
compared checkpoints with their hashes; it logs the generations table. Each stage logs its checkpoints as artifacts
by ``file://`` reference with the manifest's content hash as metadata, and the next stage uses the artifact of the
same name and digest, which is W&B's lineage edge.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from flows.stages import run_stage
from rlhf.lineage import content_hash
from rlhf.registry import STAGES

RECIPES = Path(__file__).resolve().parent.parent / "recipes" / "smoke"
ROUND_ID = "wb-r1"
TRAIN = ["--max_train_samples", "4", "--max_steps", "2"]
GATES_SMALL = ["--n_winrate", "4", "--n_safe", "2", "--n_redteam", "2", "--n_capability", "2", "--n_sycophancy", "2",
               "--max_new_tokens", "4", "--mc_max_new_tokens", "4"]


def offline_records(stage_dir: Path) -> list[dict]:
    """Every record of the stage's one offline run, read by wandb's own reader."""
    (run_dir,) = sorted((stage_dir / "wandb").glob("offline-run-*"))
    wandb_cli = shutil.which("wandb")
    assert wandb_cli, "the wandb CLI is installed with the wandb package"
    out = subprocess.run([wandb_cli, "leet", "inspect", "--json", str(run_dir)], capture_output=True, text=True,
                         timeout=120, stdin=subprocess.DEVNULL, check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def run_record(records: list[dict]) -> dict:
    (run,) = [r["run"] for r in records if r.get("type") == "run"]
    return run


def config_of(records: list[dict]) -> dict:
    """The run's config: the one ``wandb.init`` opened it with, then every later update, in order."""
    config = dict(run_record(records)["config"]["update"])
    for r in records:
        if r.get("type") == "config":
            config.update(r["config"].get("update") or {})
    return config


def artifacts(records: list[dict]) -> dict[str, dict]:
    """The run's reference artifacts (not W&B's own table artifacts), by name."""
    out = {}
    for r in records:
        if r.get("type") == "artifact" and r["artifact"]["type"] != "run_table":
            a = r["artifact"]
            out[a["name"]] = {**a, "metadata": json.loads(a.get("metadata") or "{}")}
    return out


@pytest.fixture(scope="module")
def round_dir(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("WANDB_MODE", "offline")
    mp.delenv("WANDB_API_KEY", raising=False)
    runs = tmp_path_factory.mktemp("runs")
    rd = runs / ROUND_ID

    def stage(name, *args, parents=()):
        return run_stage(name, STAGES[name].module, RECIPES / f"{STAGES[name].name}.yaml", rd / name,
                         extra_args=[*args, "--round_id", ROUND_ID], parents=list(parents), runs_dir=runs,
                         log=lambda line: None)

    try:
        sft = stage("sft", "--model_name_or_path", "tiny", *TRAIN)
        dpo = stage("dpo", "--sft_dir", str(rd / "sft"), *TRAIN, parents=[sft])
        rm = stage("reward_model", "--sft_dir", str(rd / "sft"), *TRAIN, parents=[sft])
        stage("gates", "--baseline_dir", str(rd / "sft"), "--candidate_dir", str(rd / "dpo"), "--reward_model_dir",
              str(rd / "reward_model"), "--fail_on_block", "false", *GATES_SMALL, parents=[sft, dpo, rm])
    finally:
        mp.undo()
    return rd


def manifest(round_dir: Path, stage: str) -> dict:
    return json.loads((round_dir / stage / "manifest.json").read_text())


@pytest.mark.parametrize("stage", ["sft", "dpo", "reward_model", "gates"])
def test_each_stage_run_has_job_type_round_name_group_and_round_in_config(round_dir, stage):
    records = offline_records(round_dir / stage)
    run = run_record(records)
    assert run["job_type"] == stage
    assert run["display_name"] == f"{ROUND_ID}/{stage}"
    assert run["run_group"] == ROUND_ID
    assert run["run_id"] == (round_dir / stage / "wandb_run_id").read_text().strip()
    config = config_of(records)
    assert (config["round_id"], config["stage"]) == (ROUND_ID, stage)


def test_dpo_and_reward_model_configs_name_the_model_the_round_trained(round_dir):
    sft = manifest(round_dir, "sft")
    assert sft["inputs"]["base_model"] == "tiny"
    dpo = config_of(offline_records(round_dir / "dpo"))
    # DPO trains the SFT stage's frozen pi_ref; the default smollm2-135m named nothing this round trained
    assert dpo["model_name_or_path"] == sft["outputs"]["pi_ref"] == dpo["_name_or_path"]
    assert dpo["base_model"] == "tiny" and dpo["pi_ref_hash"] == sft["outputs"]["pi_ref_hash"]
    rm = config_of(offline_records(round_dir / "reward_model"))
    assert rm["model_name_or_path"] == sft["outputs"]["checkpoint"] == rm["_name_or_path"]
    assert rm["base_model"] == "tiny" and rm["start_checkpoint_hash"] == sft["outputs"]["checkpoint_hash"]
    # the manifests say the same
    assert manifest(round_dir, "dpo")["config"]["model_name_or_path"] == sft["outputs"]["pi_ref"]
    assert manifest(round_dir, "reward_model")["inputs"]["start_checkpoint_hash"] == sft["outputs"]["checkpoint_hash"]


def test_gate_run_config_holds_thresholds_judge_suites_and_compared_checkpoints(round_dir):
    gates = manifest(round_dir, "gates")
    config = config_of(offline_records(round_dir / "gates"))
    for key in ("judge_floor", "max_flip_rate", "max_false_refusal_increase_pp", "max_violation_increase_pp",
                "lc_bar", "n_winrate", "refusal_classifier"):
        assert config[key] == gates["config"][key], key
    assert config["n_winrate"] == 4
    judge = gates["outputs"]["judge"]
    measured = config["judge_measured"]
    assert measured["judge"] == judge["judge"] and measured["backend"] == "reward_model"
    assert measured["agreement"] == judge["agreement"] and measured["agreement_n"] == judge["agreement_n"] > 0
    assert measured["identity_hash"] == judge["identity_hash"]
    # suites: the data file, its fingerprint (the manifest's) and the number of items answered
    suites = config["suites"]
    assert {k: suites[k]["n"] for k in ("winrate", "safe", "redteam", "capability", "sycophancy")} == {
        "winrate": 4, "safe": 2, "redteam": 2, "capability": 2, "sycophancy": 2}
    for k in ("winrate", "safe", "capability"):
        assert suites[k]["data"] == gates["inputs"][f"{k}_data"]
        assert suites[k]["hash"] == gates["inputs"][f"{k}_data_hash"]
    compared = config["compared"]
    assert compared["baseline"] == {"path": gates["inputs"]["baseline"], "hash": gates["inputs"]["baseline_hash"]}
    assert compared["candidate"] == {"path": gates["inputs"]["candidate"],
                                     "hash": gates["inputs"]["candidate_hash"]}
    assert compared["baseline"]["path"] == manifest(round_dir, "sft")["outputs"]["checkpoint"]
    assert compared["candidate"]["hash"] == manifest(round_dir, "dpo")["outputs"]["checkpoint_hash"]
    assert config["judge_checkpoint"]["hash"] == gates["inputs"]["judge_hash"]


def test_gate_run_logs_the_generations_table(round_dir):
    (run_dir,) = (round_dir / "gates" / "wandb").glob("offline-run-*")
    (table,) = run_dir.rglob("generations_*.table.json")
    logged = json.loads(table.read_text())
    assert logged["columns"][:6] == ["suite", "id", "prompt", "baseline", "candidate", "judge_verdict"]
    rows = [dict(zip(logged["columns"], row)) for row in logged["data"]]
    written = [json.loads(line) for line in (round_dir / "gates" / "generations.jsonl").read_text().splitlines()]
    assert [(r["suite"], r["id"], r["baseline"], r["candidate"]) for r in rows] == [
        (w["suite"], w["id"], w["baseline"], w["candidate"]) for w in written]
    judged = {j["id"]: j for j in map(json.loads, (round_dir / "gates" / "judgments.jsonl").read_text().splitlines())}
    winrate = [r for r in rows if r["suite"] == "winrate"]
    assert len(winrate) == 4 == len(judged)
    for r in winrate:
        p = judged[r["id"]]["preference"]
        assert r["preference"] == p
        assert r["judge_verdict"] == ("candidate" if p > 1.5 else "baseline" if p < 1.5 else "tie")
    assert all(r["judge_verdict"] is None for r in rows if r["suite"] != "winrate")


def test_checkpoints_are_reference_artifacts_with_hashes_used_by_the_next_stage(round_dir):
    sft_m, dpo_m, rm_m = (manifest(round_dir, s) for s in ("sft", "dpo", "reward_model"))
    sft, dpo, rm, gates = (artifacts(offline_records(round_dir / s)) for s in ("sft", "dpo", "reward_model", "gates"))

    # SFT logs its checkpoint and pi_ref: every file by file:// reference, the manifest's hash as metadata
    for key in ("checkpoint", "pi_ref"):
        a = sft[f"sft-{key}"]
        path = Path(sft_m["outputs"][key])
        assert a["type"] == "model" and not a.get("use_after_commit")
        assert a["metadata"]["content_hash"] == sft_m["outputs"][f"{key}_hash"] == content_hash(path)
        assert ROUND_ID in a["aliases"]
        files = sorted(p for p in path.rglob("*") if p.is_file())
        assert sorted(e["ref"] for e in a["manifest"]["contents"]) == sorted(p.resolve().as_uri() for p in files)
    # its training data, used
    data = sft["data-sft.jsonl"]
    assert data["type"] == "dataset" and data["use_after_commit"]
    assert data["metadata"]["content_hash"] == sft_m["inputs"]["train_data_hash"]

    # the next stages use the artifact SFT logged: the same name and digest (W&B's lineage edge)
    assert dpo["sft-pi_ref"]["use_after_commit"] and dpo["sft-pi_ref"]["digest"] == sft["sft-pi_ref"]["digest"]
    assert rm["sft-checkpoint"]["use_after_commit"]
    assert rm["sft-checkpoint"]["digest"] == sft["sft-checkpoint"]["digest"]
    assert dpo["dpo-checkpoint"]["metadata"]["content_hash"] == dpo_m["outputs"]["checkpoint_hash"]
    # the gate run uses the compared checkpoints and the judge, and logs the gate report
    for name, logged in (("sft-checkpoint", sft), ("dpo-checkpoint", dpo), ("reward_model-checkpoint", rm)):
        assert gates[name]["use_after_commit"] and gates[name]["digest"] == logged[name]["digest"], name
    assert rm["reward_model-checkpoint"]["metadata"]["content_hash"] == rm_m["outputs"]["checkpoint_hash"]
    report = gates["gates-report"]
    assert report["type"] == "gate-report" and ROUND_ID in report["aliases"]
    assert report["metadata"]["verdict"] == manifest(round_dir, "gates")["outputs"]["verdict"]
    assert any(n.startswith("data-") and a["use_after_commit"] for n, a in gates.items())


def test_the_round_report_spec_names_this_rounds_runs_gates_and_artifacts(round_dir, monkeypatch):
    """The report built from these stage folders (a round manifest as flows/round.py writes it)."""
    from flows.wandb_report import load_report, write_round_report

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    stages = {s: {"output_dir": str(round_dir / s), "outputs": manifest(round_dir, s)["outputs"]}
              for s in ("sft", "dpo", "reward_model", "gates")}
    round_manifest = {"round_id": ROUND_ID, "preset": "smoke", "candidate": "dpo",
                      "verdict": stages["gates"]["outputs"]["verdict"], "stages": stages}
    report = load_report(write_round_report(round_dir, round_manifest))
    import wandb_workspaces.reports.v2 as wr

    gates = [r["gate"] for r in stages["gates"]["outputs"]["gate_table"]]
    headings = [b.text for b in report.blocks if isinstance(b, wr.H3)]
    assert [h.split(":")[0] for h in headings] == gates
    gm = manifest(round_dir, "gates")["metrics"]
    scalar = [getattr(p.metric, "name", p.metric)  # a Metric read back from the specification
              for b in report.blocks if isinstance(b, wr.PanelGrid) for p in b.panels if isinstance(p, wr.ScalarChart)]
    assert scalar == [f"gates/{g}/{k}" for g in gates for k in gm[g]["metrics"]]
    assert [b.artifact for b in report.blocks if isinstance(b, wr.WeaveBlockArtifact)] == [
        "sft-checkpoint", "sft-pi_ref", "dpo-checkpoint", "reward_model-checkpoint", "gates-report"]
