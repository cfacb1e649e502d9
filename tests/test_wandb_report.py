"""The round's W&B Report (flows/wandb_report.py): its specification, built with wandb-workspaces from a small
constructed round manifest, holds the verdict, a section and panels per gate, the stage runs and the artifacts;
offline it is written to ``<round>/wandb_report.json`` and read back by the report model; publishing needs W&B
online; the gate stage's generations table joins the judge's verdict to each win-rate pair."""

from __future__ import annotations

import json

import pytest

ROUND = {
    "round_id": "r7",
    "preset": "smoke",
    "candidate": "dpo",
    "verdict": "block",
    "ppo_unlock": {"unlocked": False},
    "stages": {
        "sft": {"output_dir": "/x/r7/sft", "outputs": {"checkpoint": "/x/r7/sft/checkpoint", "checkpoint_hash": "a1",
                                                        "pi_ref": "/x/r7/sft/pi_ref", "pi_ref_hash": "a2"}},
        "dpo": {"output_dir": "/x/r7/dpo", "outputs": {"checkpoint": "/x/r7/dpo/checkpoint", "checkpoint_hash": "b1"}},
        "reward_model": {"output_dir": "/x/r7/reward_model",
                         "outputs": {"checkpoint": "/x/r7/reward_model/checkpoint", "checkpoint_hash": "c1"}},
        "gates": {"output_dir": "/x/r7/gates", "outputs": {
            "verdict": "block",
            "gate_table": [
                {"gate": "judge_agreement", "verdict": "pass", "reason": "agreement 0.9 | above the floor",
                 "agreement": 0.9},
                {"gate": "capability", "verdict": "block", "reason": "accuracy fell 12 points",
                 "candidate_accuracy": 40.0, "baseline_accuracy": 52.0},
            ],
            "gate_tables": {"capability": [{"n": 10, "change_pp": -12.0}], "judge_agreement": []},
        }},
    },
}


def _spec(manifest=ROUND, **kwargs) -> dict:
    from flows.wandb_report import build_report, report_spec

    return json.loads(report_spec(build_report(manifest, entity="", project="proj", **kwargs)))


def _panels(block) -> list[dict]:
    return block["metadata"]["panelBankSectionConfig"]["panels"]


def _filters(block) -> list[list[tuple]]:
    return [[(f["key"]["section"], f["key"]["name"], f["op"], f["value"]) for f in rs["filters"]["filters"]]
            for rs in block["metadata"]["runSets"]]


def test_report_spec_has_verdict_gates_panels_stage_runs_and_artifacts():
    import wandb_workspaces.reports.v2 as wr

    from flows.wandb_report import build_report, load_report, report_spec

    spec = _spec()
    assert spec["displayName"] == "Round r7: BLOCK"
    assert spec["project"] == {"name": "proj", "entityName": ""}
    blocks = spec["spec"]["blocks"]
    text = (lambda b: "".join(c.get("text", "") for c in b["children"]))
    headings = [(b["level"], text(b)) for b in blocks if b["type"] == "heading"]
    assert headings == [(1, "Round r7: BLOCK"), (2, "Verdict by gate"), (2, "Gates"),
                        (3, "judge_agreement: pass"), (3, "capability: block"),
                        (2, "Generations"), (2, "Stage runs"), (2, "Artifacts")]
    # verdict by gate: a markdown table, one row per gate in the gate table's order (a | in a reason escaped)
    (table,) = [b for b in blocks if b["type"] == "markdown-block"]
    assert table["content"].splitlines() == [
        "| gate | verdict | reason |", "|---|---|---|",
        "| judge_agreement | pass | agreement 0.9 \\| above the floor |",
        "| capability | block | accuracy fell 12 points |"]
    grids = [b for b in blocks if b["type"] == "panel-grid"]  # verdict, 2 gates, generations, stage runs
    gates_run = [("config", "round_id", "=", "r7"), ("config", "stage", "=", "gates")]
    assert [_filters(g) for g in grids] == [[gates_run]] * 4 + [[[("config", "round_id", "=", "r7")]]]
    assert [[p["viewType"] for p in _panels(g)] for g in grids] == [
        ["Weave", "Weave"], ["Scalar Chart"], ["Scalar Chart", "Scalar Chart", "Weave"], ["Weave"],
        ["Run History Line Plot", "Run Comparer"]]
    # per-gate scalar panels chart the gate run's summary keys gates/<gate>/<metric> (gates.report.summary_metrics)
    assert [p["config"]["metrics"] for g in grids for p in _panels(g) if p["viewType"] == "Scalar Chart"] == [
        ["gates/judge_agreement/agreement"], ["gates/capability/candidate_accuracy"],
        ["gates/capability/baseline_accuracy"]]
    line = _panels(grids[4])[0]["config"]
    assert line["xAxis"] == "train/global_step" and line["metrics"] == ["train/loss"]
    lists = [[text(li["children"][0]) for li in b["children"]] for b in blocks if b["type"] == "list"]
    assert lists == [["r7/sft", "r7/dpo", "r7/reward_model", "r7/gates"],  # the stage runs' names
                     ["sft-checkpoint:r7", "sft-pi_ref:r7", "dpo-checkpoint:r7", "reward_model-checkpoint:r7",
                      "gates-report:r7"]]  # the artifacts, with the round's alias

    # the same specification read back by wandb-workspaces: the tables the panels show, the artifacts' lineage
    report = build_report(ROUND, entity="", project="proj")
    import tempfile
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        f.write(report_spec(report))
        f.flush()
        back = load_report(f.name)
    tables = [p.table_name for b in back.blocks if isinstance(b, wr.PanelGrid) for p in b.panels
              if isinstance(p, wr.WeavePanelSummaryTable)]
    assert tables == ["gates", "judge", "gate_capability", "generations"]  # judge_agreement's table is empty
    assert [(b.artifact, b.tab, b.project) for b in back.blocks if isinstance(b, wr.WeaveBlockArtifact)] == [
        (n, "lineage", "proj") for n in ("sft-checkpoint", "sft-pi_ref", "dpo-checkpoint", "reward_model-checkpoint",
                                         "gates-report")]


def test_metric_names_come_from_the_gate_manifest_when_given():
    from flows.wandb_report import gate_metrics

    gates_manifest = {"metrics": {"capability": {"verdict": "block", "metrics": {"accuracy_change": {}, "n": {}}},
                                  "threads": 2, "efficiency": {"threads": 2}}}
    names = gate_metrics(gates_manifest)
    assert names == {"capability": ["accuracy_change", "n"]}
    spec = _spec(gate_metric_names=names)
    metrics = [p["config"]["metrics"] for b in spec["spec"]["blocks"] if b["type"] == "panel-grid"
               for p in _panels(b) if p["viewType"] == "Scalar Chart"]
    assert metrics == [["gates/capability/accuracy_change"], ["gates/capability/n"]]


def test_offline_round_writes_the_spec_and_publish_needs_wandb_online(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from flows.cli import app
    from flows.wandb_report import SPEC_FILE, load_report, publish, write_round_report

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_ENTITY", raising=False)
    (tmp_path / "round.json").write_text(json.dumps(ROUND))
    path = write_round_report(tmp_path)
    assert path == tmp_path / SPEC_FILE
    report = load_report(path)  # the report model reads its own specification back
    assert report.title == "Round r7: BLOCK" and report.project == "rlhf-flywheel" and report.entity == ""
    assert [type(b).__name__ for b in report.blocks][:5] == ["H1", "P", "H2", "MarkdownBlock", "PanelGrid"]
    assert not (tmp_path / "wandb_report.url").exists()
    with pytest.raises(RuntimeError, match="WANDB_API_KEY"):
        publish(tmp_path)
    result = CliRunner().invoke(app, ["wandb-report", "publish", str(tmp_path)])
    assert result.exit_code == 2 and "WANDB_API_KEY" in result.output
    result = CliRunner().invoke(app, ["wandb-report", "publish", str(tmp_path / "absent")])
    assert result.exit_code == 2 and "no W&B report specification" in result.output
    assert "api_key" not in path.read_text().lower()


def test_generations_table_joins_the_judges_verdict_on_winrate_rows(tmp_path):
    from gates.evaluate import generations_table, judge_verdict

    gen = [{"suite": "winrate", "id": "w0", "prompt": "p0", "baseline": "b0", "candidate": "c0"},
           {"suite": "winrate", "id": "w1", "prompt": "p1", "baseline": "b1", "candidate": "c1"},
           {"suite": "winrate", "id": "w2", "prompt": "p2", "baseline": "b2", "candidate": "c2"},
           {"suite": "safe", "id": "w0", "prompt": "s", "baseline": "sb", "candidate": "sc"}]
    judged = [{"id": "w0", "preference": 2.0, "raw": "B"}, {"id": "w1", "preference": 1.0, "raw": "A"},
              {"id": "w2", "preference": None, "raw": "??"}]
    (tmp_path / "generations.jsonl").write_text("".join(json.dumps(r) + "\n" for r in gen))
    (tmp_path / "judgments.jsonl").write_text("".join(json.dumps(r) + "\n" for r in judged))
    rows = generations_table(tmp_path)
    assert [(r["suite"], r["id"], r["prompt"], r["baseline"], r["candidate"], r["judge_verdict"], r["judge_raw"])
            for r in rows] == [("winrate", "w0", "p0", "b0", "c0", "candidate", "B"),
                               ("winrate", "w1", "p1", "b1", "c1", "baseline", "A"),
                               ("winrate", "w2", "p2", "b2", "c2", "unparsed", "??"),
                               ("safe", "w0", "s", "sb", "sc", None, None)]  # same id, other suite: not judged
    assert judge_verdict(1.5) == "tie" and judge_verdict(float("nan")) == "unparsed"


def test_the_release_approval_is_in_the_report_with_its_waivers_and_expired_waivers():
    approval = {"mode": "required", "decision": "approved", "release": "pass", "gate_verdict": "block",
                "approver": "rm@example.org", "reason": "capability drop is a known eval artefact", "timed_out": False,
                "waivers": [{"gate": "capability", "approver": "rm@example.org", "expires": "2027-01-31",
                             "reason": "eval artefact | tracked"}],
                "previous_waivers": [{"gate": "drift", "round_id": "r6", "expires": "2026-11-01", "expired": True},
                                     {"gate": "refusal", "round_id": "r6", "expires": "2027-02-01", "expired": False}]}
    blocks = _spec({**ROUND, "approval": approval})["spec"]["blocks"]
    text = (lambda b: "".join(c.get("text", "") for c in b["children"]))
    headings = [text(b) for b in blocks if b["type"] == "heading"]
    assert headings[:3] == ["Round r7: BLOCK", "Release approval", "Verdict by gate"]
    approval_md = [b for b in blocks if b["type"] == "markdown-block"][0]["content"].splitlines()
    assert approval_md[0] == ("Decision **approved** by rm@example.org; release **PASS** (gates: block); "
                              "reason: capability drop is a known eval artefact.")
    assert approval_md[2:5] == ["| waived gate | approver | expires | reason |", "|---|---|---|---|",
                                "| capability | rm@example.org | 2027-01-31 | eval artefact \\| tracked |"]
    assert approval_md[-1] == "Expired waivers of earlier rounds: drift (round r6, expired 2026-11-01)"
    # no approval asked and no earlier waiver: no section (the report of an ordinary round is unchanged)
    plain = _spec({**ROUND, "approval": {"mode": "none", "decision": "none", "release": "block", "waivers": [],
                                         "previous_waivers": []}})["spec"]["blocks"]
    assert "Release approval" not in [text(b) for b in plain if b["type"] == "heading"]
