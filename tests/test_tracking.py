"""rlhf/tracking.py: the W&B gates table shows every gate's metrics."""

from __future__ import annotations

import json


def test_table_columns_are_the_union_of_all_rows_with_gate_verdict_reason_first():
    from rlhf.tracking import table_columns

    rows = [{"gate": "judge_agreement", "verdict": "pass", "agreement": 0.9, "reason": "ok"},
            {"gate": "capability", "verdict": "block", "candidate_accuracy": 40.0, "reason": "worse"},
            {"reason": "r", "gate": "sycophancy", "verdict": "pass", "flip_rate": 2.0, "agreement": 0.1}]
    assert table_columns(rows) == ["gate", "verdict", "reason", "agreement", "candidate_accuracy", "flip_rate"]
    assert table_columns([{"k": 1}, {"n": 2}]) == ["k", "n"]


def test_offline_wandb_table_holds_every_gates_metrics(tmp_path, monkeypatch):
    """A real offline W&B run: the table file it writes has the second gate's metric column and value."""
    from rlhf.tracking import log_summary, setup_wandb

    for key in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_RUN_GROUP"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    setup_wandb(run_name="gates", group=None, output_dir=tmp_path)
    rows = [{"gate": "judge_agreement", "verdict": "pass", "agreement": 0.9, "reason": "ok"},
            {"gate": "capability", "verdict": "block", "candidate_accuracy": 40.0, "reason": "worse"}]
    log_summary({"verdict": "block"}, table={"gates": rows})
    run_dirs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(run_dirs) == 1
    files = list(run_dirs[0].rglob("gates_*.table.json"))
    assert len(files) == 1, sorted(p.name for p in run_dirs[0].rglob("*"))
    logged = json.loads(files[0].read_text())
    assert logged["columns"] == ["gate", "verdict", "reason", "agreement", "candidate_accuracy"]
    assert logged["data"] == [["judge_agreement", "pass", "ok", 0.9, None],
                              ["capability", "block", "worse", None, 40.0]]
