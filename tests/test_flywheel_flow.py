"""The flywheel flows end to end on simulated traffic, a tiny reward model as judge, and simulated annotators."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from data.loaders import load_pairs


@pytest.fixture(scope="module", autouse=True)
def prefect_db():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):  # a loaded 2-core machine starts it slowly
        yield


@pytest.fixture(scope="module")
def tiny_rm(tiny_model_dir, tmp_path_factory):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("rm")
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1)
    model.config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def test_flywheel_export_import_and_round_overrides(tiny_rm, tmp_path):
    from flows.flywheel import FlywheelParameters, ImportParameters, flywheel, flywheel_import, round_overrides
    from flywheel.annotation import simulate_annotations
    from flywheel.simulate import held_truth, load_simulator_config, simulate

    sim = tmp_path / "sim"
    rates = simulate(load_simulator_config("recipes/flywheel/simulator.yaml", n_conversations=150, pii_rate=0.3), sim)
    out = tmp_path / "fw"
    report = flywheel(
        FlywheelParameters(
            out_dir=str(out),
            events=[str(sim / "events.jsonl")],
            reward_model_dir=str(tiny_rm),
            budget=12,
            alternatives=str(sim / "alternatives.jsonl"),
            expert_labels=str(sim / "expert_labels.jsonl"),
            judge_max_length=128,
        )
    )
    sel = report["selection"]
    # Turns on which no signal fired leave no event, so the store sees only turns with at least one.
    events = [json.loads(x) for x in (sim / "events.jsonl").read_text().splitlines()]
    n_turns_with_events = len({(e["conversation_id"], e["turn_id"]) for e in events})
    assert sel["n_turns"] == sel["n_scored"] == n_turns_with_events <= rates["turns"]
    assert sel["n_selected"] == 12 == sum(v["selected"] for v in sel["by_intent"].values())
    assert sum(v["selected"] for v in sel["by_kind"].values()) == 12
    assert {q["signal"] for q in report["signal_quality"]} >= {"thumbs_down", "thumbs_up"}
    assert report["export"]["tasks"] == 12 - len(report["export"]["skipped"])  # k=2: one task per turn
    assert json.loads((out / "report.json").read_text())["selection"]["selection_hash"] == sel["selection_hash"]
    # A rerun re-ingests nothing and re-judges nothing (content hashes).
    again = flywheel(
        FlywheelParameters(
            out_dir=str(out),
            events=[str(sim / "events.jsonl")],
            reward_model_dir=str(tiny_rm),
            budget=12,
            alternatives=str(sim / "alternatives.jsonl"),
            judge_max_length=128,
        )
    )
    assert again["ingested"][0]["skipped_file"] and again["judge"]["scored"] == 0
    assert again["selection"]["selection_hash"] == sel["selection_hash"]

    tasks = json.loads((out / "export" / "tasks.json").read_text())
    labels = tmp_path / "ls_export.json"
    labels.write_text(
        json.dumps(
            simulate_annotations(tasks, held_truth(sim / "alternatives.jsonl"), noise=0.15, p_unlabelled=0.1, seed=1)
        )
    )
    gens = tmp_path / "generations.jsonl"  # a gate suite that contains the first exported prompt
    first_prompt = tasks[0]["data"]["messages"][-1]["content"]
    gens.write_text(
        json.dumps({"suite": "winrate", "id": "x", "prompt": first_prompt, "baseline": "a", "candidate": "b"}) + "\n"
    )
    m = flywheel_import(
        ImportParameters(
            export_dir=str(out / "export"),
            labels=str(labels),
            out_dir=str(tmp_path / "datasets"),
            gate_generations=str(gens),
        )
    )
    assert m["decontamination"]["n_removed"] >= 1 and m["decontamination"]["per_suite"]["winrate"] >= 1
    assert m["n_labelled_tasks"] + m["n_unlabelled_tasks"] + m["decontamination"]["n_removed"] == len(tasks)
    assert set(m["lineage"]) == {"selection", "export", "labels"}
    pairs = load_pairs(m["pairs"])
    assert len(pairs) == m["n_pairs"] and all(len(p.labels) >= 1 for p in pairs)
    assert all(p.meta["lineage"] == m["lineage"] for p in pairs)
    over = round_overrides(m["dir"], min_agreement_rows=1)
    assert over["dpo"] == ["--train_data", m["pairs"]] and over["reward_model"][:2] == ["--train_data", m["pairs"]]
    assert Path(m["pairs"]).is_file()
