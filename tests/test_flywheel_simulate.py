"""Traffic simulator and weak-signal quality report."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from flywheel.quality import expert_verdicts, signal_quality
from flywheel.simulate import is_refusal, load_simulator_config, simulate
from flywheel.store import SignalStore

RECIPE = "recipes/flywheel/simulator.yaml"


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    out = tmp_path_factory.mktemp("sim")
    rates = simulate(load_simulator_config(RECIPE, n_conversations=3000, seed=7), out)
    return out, rates


def test_realised_rates_follow_the_parameters(sim):
    out, r = sim
    assert r["conversations"] == 3000 and r["turns"] > 3000 * 1.3  # multi-turn: mean 1/(1-.35) ~ 1.5 capped at 4
    for intent, share in {
        "helpful_base": 0.30,
        "oasst": 0.25,
        "koala": 0.20,
        "vicuna": 0.15,
        "selfinstruct": 0.10,
    }.items():
        assert abs(r["intent_share"][intent] - share) < 0.03, (intent, r["intent_share"])
    assert abs(r["signal_rate"]["thumbs_down"] - 0.12) < 0.02
    assert r["thumbs_down_rate_refusal"] > 2 * r["thumbs_down_rate_other"]  # refusals draw thumbs-down
    assert r["signal_rate"]["continued"] == pytest.approx(1 - 3000 / r["turns"], abs=1e-3)
    assert json.loads((out / "simulation.json").read_text())["realised"] == r


def test_thumbs_down_agrees_with_experts_near_the_configured_055(sim):
    out, r = sim
    store = SignalStore(out / "signals.duckdb")
    store.ingest(out / "events.jsonl")  # the simulated events pass the store's schema
    turns = store.turns().to_pandas()
    verdicts = expert_verdicts(json.loads(line) for line in (out / "expert_labels.jsonl").read_text().splitlines())
    rows = {q["signal"]: q for q in signal_quality(turns, verdicts)}
    td = rows["thumbs_down"]
    assert td["n"] > 300
    assert td["ci_low"] <= 0.55 <= td["ci_high"]  # the Wilson interval covers the configured precision
    assert abs(td["agreement"] - 0.55) < 0.06
    assert td["agreement"] == r["thumbs_down_precision"]  # store path and simulator agree
    assert rows["thumbs_up"]["agreement"] > 0.6  # thumbs-up: P(good | up) = .12*.5/(.12*.5+.04*.5) = .75
    store.close()


def test_wilson_interval_hand_worked():
    turns = pd.DataFrame(
        {
            "conversation_id": ["a", "b", "c", "d"],
            "turn_id": [0] * 4,
            "thumbs_down": [1, 1, 1, 0],
            **{s: [0] * 4 for s in ("thumbs_up", "regenerate", "edit", "copy", "abandon", "continued")},
        }
    )
    verdicts = expert_verdicts(
        [
            {"conversation_id": "a", "turn_id": 0, "annotator_id": "x", "verdict": "bad"},
            {"conversation_id": "b", "turn_id": 0, "annotator_id": "x", "verdict": "good"},
            {"conversation_id": "c", "turn_id": 0, "annotator_id": "x", "verdict": "bad"},
            {"conversation_id": "c", "turn_id": 0, "annotator_id": "y", "verdict": "good"},  # a tie: no verdict
        ]
    )
    td = signal_quality(turns, verdicts)[1]
    # 1 of 2: Wilson 95% for 1/2 = 0.5 -/+ 1.96*sqrt(.25/2 + 1.96^2/16)/(1+1.96^2/2) -> [0.0945, 0.9055]
    assert (td["signal"], td["n"], td["agree"], td["agreement"]) == ("thumbs_down", 2, 1, 0.5)
    assert (td["ci_low"], td["ci_high"]) == (0.0945, 0.9055)


def test_config_errors_and_refusal_detector(tmp_path):
    bad = tmp_path / "sim.yaml"
    bad.write_text("thumbs_down_precison: 0.5\n")
    with pytest.raises(ValueError, match="unknown simulator key"):
        load_simulator_config(bad)
    with pytest.raises(ValueError, match="thumbs_down_rate must be in"):
        load_simulator_config(RECIPE, thumbs_down_rate=1.5)
    assert is_refusal("I'm sorry, but I can't help with that.") and not is_refusal("Sure! Here is a poem.")


def test_candidate_generations_answer_their_prompts(tmp_path):
    gens = tmp_path / "generations.jsonl"
    rows = [
        {"suite": "winrate", "id": "alpaca_eval-0", "prompt": "p", "baseline": "b", "candidate": "CANDIDATE ANSWER"},
        {"suite": "winrate", "id": "alpaca_eval-1", "prompt": "p", "baseline": "b", "candidate": "  "},  # empty
        {"suite": "safe", "id": "alpaca_eval-2", "prompt": "p", "baseline": "b", "candidate": "not a winrate row"},
    ]
    gens.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # helpful_base only (alpaca_eval-0 and -1 are helpful_base prompts), so both items are drawn often
    traffic = tmp_path / "traffic.csv"
    traffic.write_text("intent,share\nhelpful_base,1.0\n")
    out = tmp_path / "sim"
    r = simulate(
        load_simulator_config(
            RECIPE, n_conversations=400, generations=str(gens), traffic_data=str(traffic), model_version="r1"
        ),
        out,
    )
    events = [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]
    alts = [json.loads(x) for x in (out / "alternatives.jsonl").read_text().splitlines()]
    by_item = {(a["conversation_id"], a["turn_id"]): a for a in alts}
    cand_turns = {(a["conversation_id"], a["turn_id"]) for a in alts if a["responses"][0] == "CANDIDATE ANSWER"}
    assert r["responses_from_candidate"] == len(cand_turns) > 0
    assert all(by_item[k]["item_id"] == "alpaca_eval-0" for k in cand_turns)
    assert not any(e["response"].strip() == "" for e in events)
    assert all(by_item[k]["expert_bad"][0] in (True, False) for k in cand_turns)  # simulated verdict
