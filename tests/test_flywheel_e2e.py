"""End to end: the two-round flywheel on the smoke preset.

Round 1 -> simulated production on its candidate (its gate generations) -> judge (round 1's reward model) ->
selection -> scrubbed Label Studio export -> simulated expert annotation (held labels + inter-annotator noise) ->
import -> decontamination against round 1's gate prompts -> dataset version -> round 2 trains DPO and the reward
model on it -> the drift gate compares round 2 with round 1.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module", autouse=True)
def prefect_db():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


def test_two_round_flywheel(tmp_path):
    from flows.flywheel import FlywheelParameters, ImportParameters, flywheel, flywheel_import
    from flows.round import RoundParameters, run_round
    from flywheel.annotation import simulate_annotations
    from flywheel.simulate import held_truth, load_simulator_config, simulate

    runs = tmp_path / "runs"
    run_round(RoundParameters(preset="smoke", round_id="fw-r1", runs_dir=str(runs)))
    r1_dir = runs / "fw-r1"
    gens = r1_dir / "gates" / "generations.jsonl"

    sim = tmp_path / "sim"
    rates = simulate(
        load_simulator_config(
            "recipes/flywheel/simulator.yaml", n_conversations=400, generations=str(gens), model_version="fw-r1"
        ),
        sim,
    )
    # Production answers come from round 1's candidate where it said something (the tiny smoke model often
    # generates nothing; those prompts keep the bundled answers).
    said = [json.loads(x) for x in gens.read_text().splitlines()]
    said = [r for r in said if r["suite"] == "winrate" and r["candidate"].strip()]
    assert (rates["responses_from_candidate"] > 0) == bool(said)
    fw = tmp_path / "fw"
    report = flywheel(
        FlywheelParameters(
            out_dir=str(fw),
            events=[str(sim / "events.jsonl")],
            reward_model_dir=str(r1_dir / "reward_model"),
            budget=40,
            alternatives=str(sim / "alternatives.jsonl"),
            expert_labels=str(sim / "expert_labels.jsonl"),
            judge_max_length=256,
        )
    )
    sel = report["selection"]  # the budget, unless fewer distinct-prompt disagreements exist
    assert sel["n_selected"] == min(40, sel["n_candidates"] - sel["n_duplicates"]) > 0
    tasks = json.loads((fw / "export" / "tasks.json").read_text())
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps(simulate_annotations(tasks, held_truth(sim / "alternatives.jsonl"), noise=0.15)))
    version = flywheel_import(
        ImportParameters(
            export_dir=str(fw / "export"),
            labels=str(labels),
            out_dir=str(tmp_path / "datasets"),
            gate_generations=str(gens),
        )
    )
    assert version["n_pairs"] >= 4

    r2 = run_round(
        RoundParameters(
            preset="smoke",
            round_id="fw-r2",
            runs_dir=str(runs),
            flywheel_data=version["dir"],
            # AlpacaEval answers run to ~600 tokens: the DPO and reward stages refuse pairs that do not fit (they
            # never truncate silently), so round 2 lifts the smoke preset's cap of 256.
            overrides={
                "gates": ["--previous_round_dir", str(r1_dir / "gates")],
                # the simulated traffic is drawn from AlpacaEval's instructions, the file round 2's win-rate suite
                # comes from: every pair is a gate prompt (or contains one), so decontamination would remove them
                # all. Round 2 trains on them with decontamination off, which still reports each overlap (below).
                "reward_model": ["--max_train_samples", str(version["n_pairs"]), "--max_length", "2048",
                                 "--decontaminate", "off"],
                "dpo": ["--max_train_samples", str(version["n_pairs"]), "--max_length", "2048",
                        "--decontaminate", "off"],
            },
        )
    )
    r2_dir = runs / "fw-r2"
    dpo = json.loads((r2_dir / "dpo" / "manifest.json").read_text())
    rm = json.loads((r2_dir / "reward_model" / "manifest.json").read_text())
    assert dpo["inputs"]["train_data"] == version["pairs"] == rm["inputs"]["train_data"]
    assert dpo["inputs"]["train_data_hash"] == version["pairs_hash"]
    for manifest in (dpo, rm):  # the overlap with the gate suites is found and reported, though kept
        record = manifest["outputs"]["decontamination"]
        assert record["mode"] == "off" and record["kept_overlapping"] > 0 and record["removed"] == 0, record
    gates = json.loads((r2_dir / "gates" / "manifest.json").read_text())
    drift = gates["outputs"]["gate_tables"]["personality_drift"]
    r1_counters = json.loads((r1_dir / "gates" / "manifest.json").read_text())["outputs"]["drift_counters"]
    assert {row["counter"] for row in drift} >= {"median_length_tokens"}
    row = next(x for x in drift if x["counter"] == "median_length_tokens")
    assert row["previous"] == r1_counters["median_length_tokens"]  # round 2 is compared with round 1
    # the verdict its gates imply: block when any gate blocks or is inconclusive (never averaged), else pass
    per_gate = {g["name"]: g["verdict"] for g in json.loads((r2_dir / "gates" / "report.json").read_text())["gates"]}
    assert per_gate and set(per_gate.values()) <= {"pass", "block", "inconclusive"}
    implied = "pass" if set(per_gate.values()) == {"pass"} else "block"
    assert r2["verdict"] == implied == gates["outputs"]["verdict"], per_gate
    assert Path(r2["gate_report"]).is_file()
