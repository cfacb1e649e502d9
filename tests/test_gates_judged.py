"""The gates with a pluggable judge (judging.judges): unparsable judge answers are left out of the win rates and
counted apart, and the judge is named in the judge gate, the gate table and the report's judge row."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from gates.config import GateStageConfig
from gates.decide import decide
from gates.render import gate_table, judge_lines, judge_row
from test_gates_decide import N, healthy

INFO = {"judge": "openai:judge-7b", "name": "openai:judge-7b", "backend": "openai", "identity_hash": "ab" * 32,
        "agreement_source": "demo:pandalm/testset-v1.jsonl.gz (cached)", "qualification": None,
        "position_consistency": 0.75, "n_position_checked": 32, "n_unparsed": 8, "n_judged": N, "requests_sent": 0}


def _with_unparsed() -> object:
    m = healthy()
    prefs = m.preferences.copy()
    prefs[-8:] = np.nan  # the last 8 of the 10 baseline wins could not be parsed
    return replace(m, preferences=prefs, judge_info=INFO)


def test_unparsable_answers_are_left_out_of_the_win_rate_not_counted_as_ties():
    results = {r.name: r for r in decide(_with_unparsed(), GateStageConfig())}
    wr = results["length_controlled_win_rate"]
    # 32 parsed: 30 candidate wins, 2 baseline wins -> 30/32 = 93.75% (as ties they would give (30 + 4) / 40 = 85%)
    assert wr.metrics["raw_win_rate"].value == pytest.approx(93.75)
    judge = results["judge_agreement"]
    assert [f.code for f in judge.findings] == ["judge", "agreement", "at_or_above_floor", "corrected_effect",
                                                "position_consistency", "unparsed_judgments"]
    assert judge.finding("judge").values == {"name": "openai:judge-7b", "backend": "openai"}
    assert judge.finding("agreement").values["agreement"] == 1.0
    assert judge.finding("unparsed_judgments").values == {"n_unparsed": 8, "n_judged": 40}
    assert judge.metrics["position_consistency"].value == 0.75 and judge.metrics["position_consistency"].n == 32
    assert judge.metrics["unparsed_judgments"].value == 8 and judge.metrics["unparsed_judgments"].n == 40
    # the corrected effect uses the parsed win rate: gap 43.75 points, attenuation 1.0
    assert judge.metrics["corrected_gap"].value == pytest.approx(43.75)
    assert judge.table[0]["judge"] == "openai:judge-7b" and judge.table[0]["n_unparsed_winrate"] == 8


def test_no_parsable_answer_makes_the_win_rate_gates_inconclusive():
    m = replace(healthy(), preferences=np.full(N, np.nan), judge_info={**INFO, "n_unparsed": N})
    results = {r.name: r for r in decide(m, GateStageConfig())}
    for name in ("length_controlled_win_rate", "intent_matrix"):
        assert results[name].verdict == "inconclusive"
        assert results[name].finding("no_parsed_judgment").values == {"n_judged": 40, "judge": "openai:judge-7b"}
    assert results["judge_agreement"].verdict == "pass" and "corrected_gap" not in results["judge_agreement"].metrics


def test_the_gate_table_and_the_judge_row_name_the_judge():
    m = _with_unparsed()
    results = decide(m, GateStageConfig())
    row = judge_row(m, results)
    assert (row["judge"], row["backend"], row["agreement"], row["agreement_n"], row["attenuation"]) == (
        "openai:judge-7b", "openai", 1.0, 100, 1.0)
    assert row["position_consistency"] == 0.75 and row["corrected_gap"] == pytest.approx(43.75)
    table = {r["gate"]: r for r in gate_table(results, row)}
    for gate in ("judge_agreement", "length_controlled_win_rate", "intent_matrix"):
        assert table[gate]["judge"] == "openai:judge-7b" and table[gate]["judge_attenuation"] == 1.0
        assert table[gate]["judge_position_consistency"] == 0.75
    assert "judge" not in table["capability"]
    lines = judge_lines({"judge": "openai:judge-7b"}, m)
    assert lines[0].startswith("- judge: `openai:judge-7b` (backend openai, identity abababababababab)")
    assert "a = 1.000 (CI" in lines[1] and "attenuation 2a-1 = 1.000" in lines[1]
    assert "position consistency on the win-rate pairs: 0.750 (n=32)" in lines[1]


def test_without_judge_info_the_judge_gate_is_unchanged():
    from gates.judge import judge_gate

    m = healthy()
    got = decide(m, GateStageConfig())[0]
    assert got == judge_gate(m.judge, m.measured_win_rate, source=m.judge_source, floor=0.85)


def test_the_default_judge_needs_the_reward_model_and_another_judge_does_not(tiny_model_dir):
    from gates.inputs import resolve_models

    with pytest.raises(ValueError, match="--reward_model_dir: the default judge"):
        resolve_models(GateStageConfig(baseline_dir=tiny_model_dir, candidate_dir=tiny_model_dir,
                                       allow_same_model=True))  # the same model on purpose (refused unless allowed)
    models = resolve_models(GateStageConfig(baseline_dir=tiny_model_dir, candidate_dir=tiny_model_dir,
                                            judge={"backend": "labels", "labels": "labels.jsonl"},
                                            allow_same_model=True))
    assert models["judge"] == "" and models["judge_manifest"] == {}
