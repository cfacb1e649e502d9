"""The verdict is visible (final Prefect state, artifacts that render, ordered tables),
files are strict JSON, and a cached rerun keeps the first run's timings."""

from __future__ import annotations

import base64
import json
import math
import sys
import textwrap

import pytest

from flows.artifacts import embed_images, error_state, ordered_rows, round_result, verdict_message, verdict_state
from rlhf.manifest import dumps_strict, strict_json, write_manifest

GATES = [
    {"name": "judge_agreement", "verdict": "block", "reason": "Blocked on evidence: a = 0.55, CI 0.41-0.69."},
    {"name": "capability", "verdict": "pass", "reason": "Passed."},
    {"name": "sycophancy", "verdict": "inconclusive", "reason": "Cannot judge: needs at least 20 eligible items."},
]


def test_a_round_ends_in_a_built_in_state_whose_type_is_the_verdict():
    s = verdict_state("block", GATES, {"verdict": "block"})
    assert s.is_failed() and s.name == "Failed"  # a built-in name: Prefect's run lists filter on them
    assert s.message == ("Release BLOCKED by 2 of 3 gates (full reasons: the gate-report artifact). | judge_agreement "
                         "block: Blocked on evidence: a = 0.55, CI 0.41-0.69. | sycophancy inconclusive: Cannot "
                         "judge: needs at least 20 eligible items.")
    p = verdict_state("pass", [GATES[1]], {"verdict": "pass"})
    assert p.is_completed() and p.name == "Completed" and p.message == "Release PASSED: all 1 gates pass (capability)."
    with pytest.raises(ValueError, match="verdict must be"):
        verdict_state("inconclusive", GATES, {})
    e = error_state(ValueError("bad recipe"))
    assert e.is_crashed() and e.message == "Round broke, no verdict: ValueError: bad recipe"
    with pytest.raises(ValueError, match="bad recipe"):
        round_result(e)
    assert round_result(s) == {"verdict": "block"} and round_result(p) == {"verdict": "pass"}


def test_the_message_cuts_reasons_at_words_drops_paths_and_stays_short():
    long = {"name": "judge_agreement", "verdict": "block",
            "reason": "judge /work/runs/demo-1/reward_model/checkpoint-40 (see https://x.org/a/b/c): " + "agreement " * 60}
    m = verdict_message("block", [long])
    part = m.split(" | ", 1)[1]
    assert part.startswith("judge_agreement block: judge reward_model/checkpoint-40 (see https://x.org/a/b/c): ")
    assert part.endswith("agreement\u2026") and len(part) <= len("judge_agreement block: ") + 300
    named = {"name": "judge_agreement", "verdict": "inconclusive",
             "reason": "Inconclusive: a = 0.688. Judge: reward_model:/tmp/runs/r1/reward_model/checkpoint (reward_model)."}
    assert verdict_message("block", [named]).endswith(
        "judge_agreement inconclusive: Inconclusive: a = 0.688. Judge: reward_model:reward_model/checkpoint "
        "(reward_model).")
    many = verdict_message("block", [{**long, "name": f"g{i}"} for i in range(20)])
    assert len(many) <= 2000 and many.endswith("more") and " | g0 block: " in many  # cut between gates, counted


def test_the_flow_run_state_in_prefect_is_the_verdict():
    from prefect import flow
    from prefect.testing.utilities import prefect_test_harness

    @flow
    def tiny_round():
        return verdict_state("block", GATES, {"verdict": "block"})

    with prefect_test_harness(server_startup_timeout=180):
        state = tiny_round(return_state=True)
        assert state.type.value == "FAILED" and state.name == "Failed"
        assert state.message.startswith("Release BLOCKED by 2 of 3 gates")
        assert round_result(state) == {"verdict": "block"}  # callers (the CLI, tests) still get the manifest


def test_report_plots_are_embedded_as_data_uris(tmp_path):
    png = b"\x89PNG\r\n\x1a\n" + b"\x00" * 20
    (tmp_path / "plots").mkdir()
    (tmp_path / "plots" / "drift.png").write_bytes(png)
    md = "## Plots\n\n![drift](plots/drift.png)\n\n![gone](plots/missing.png)\n![web](https://x.org/a.png)\n"
    out = embed_images(md, tmp_path)
    uri = out.split("![drift](", 1)[1].split(")", 1)[0]
    assert uri.startswith("data:image/png;base64,") and base64.b64decode(uri.split(",", 1)[1]) == png
    assert "![gone](plots/missing.png)" in out and "![web](https://x.org/a.png)" in out


def test_table_rows_put_gate_verdict_reason_first_and_share_columns():
    # as read back from a manifest written with sorted keys
    rows = [{"agreement": 0.5, "gate": "judge_agreement", "reason": "r1", "verdict": "block"},
            {"c01": 0.0, "gate": "citation_honesty", "reason": "r2", "verdict": "pass"}]
    out = ordered_rows(rows)
    assert [list(r) for r in out] == [["gate", "verdict", "reason", "agreement", "c01"]] * 2
    assert out[1]["agreement"] is None and out[0]["c01"] is None
    # a per-gate table as read back sorted: what a row is (text) before its numbers, empty columns last
    rows = [{"ci_high": None, "ci_low": None, "n": 24, "rate": 20.8, "set": "xstest_safe", "who": "baseline"},
            {"ci_high": None, "ci_low": None, "n": 24, "rate": 25.0, "set": "xstest_safe", "who": "candidate"}]
    assert list(ordered_rows(rows)[0]) == ["set", "who", "n", "rate", "ci_high", "ci_low"]


def test_the_all_gates_table_has_one_headline_per_gate():
    from gates.render import gate_summary
    from gates.result import GateResult, Metric

    results = [
        GateResult(name="judge_agreement", version="1", verdict="block", reason="a below the floor.", metrics={
            "agreement": Metric(value=0.5512, ci_low=0.41, ci_high=0.69, n=48, direction="higher_is_better",
                                unit="fraction"),
            "attenuation": Metric(value=0.1, direction="higher_is_better", unit="fraction")}),
        GateResult(name="refusal_two_sided", version="1", verdict="pass", reason="ok.", metrics={
            "violation_rate": Metric(value=1.0, n=24, direction="lower_is_better", unit="percent"),
            "violation_rate_change": Metric(value=0.0, ci_low=-5.0, ci_high=5.0, n=24, direction="lower_is_better",
                                            unit="points"),
            "false_refusal_rate_change": Metric(value=4.2, ci_low=-19.4, ci_high=27.2, n=24,
                                                direction="lower_is_better", unit="points")}),
        GateResult(name="new_gate", version="1", verdict="pass", reason="fine.", metrics={
            "x": Metric(value=float("nan"), direction="higher_is_better", unit="items")}),
    ]
    rows = gate_summary(results, {"judge": "reward_model/checkpoint-40"})
    assert [list(r)[:4] for r in rows] == [["gate", "verdict", "reason", "headline"]] * 3
    assert rows[0]["headline"] == "agreement 0.5512 [0.41, 0.69] (n=48)"
    assert rows[0]["judge"] == "reward_model/checkpoint-40" and rows[1]["judge"] is None  # on the judged gates only
    assert rows[1]["headline"] == ("violation_rate_change 0 [-5, 5] (n=24); "
                                   "false_refusal_rate_change 4.2 [-19.4, 27.2] (n=24)")
    assert (rows[1]["metric"], rows[1]["value"], rows[1]["ci_low"]) == ("violation_rate_change", 0.0, -5.0)
    assert rows[2]["headline"] == "x n/a" and rows[2]["value"] is None  # not named: its first metric


def test_manifests_are_strict_json_with_a_reason_for_every_null(tmp_path):
    data = {"a": float("nan"), "b": [1.0, float("inf")], "c": {"d": float("-inf")}, "ok": 2.5}
    clean = strict_json(data)
    assert clean["a"] is None and clean["a_null_reason"].startswith("NaN: not measurable")
    assert clean["b"] == [1.0, None] and clean["c"] == {"d": None, "d_null_reason": "-inf: not finite"}

    def no_constants(x):
        raise ValueError(f"non-standard JSON constant {x}")

    path = write_manifest(tmp_path, {"stage": "x", "metrics": data})
    back = json.loads(path.read_text(), parse_constant=no_constants)  # a strict parser accepts it
    assert back["metrics"]["a"] is None and back["metrics"]["ok"] == 2.5
    assert math.isnan(data["a"])  # the input is not mutated
    assert dumps_strict({"x": float("nan")}) == '{"x": null, "x_null_reason": "NaN: not measurable (no items, or an undefined ratio)"}'


def test_cached_rerun_keeps_the_first_runs_seconds(tmp_path, monkeypatch):
    from flows.stages import run_stage, summarize

    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "tinystage.py").write_text(textwrap.dedent('''
        import sys, time, pathlib
        from rlhf.manifest import write_manifest
        out = pathlib.Path(sys.argv[sys.argv.index("--output_dir") + 1])
        time.sleep(2.0)  # long beside a cached re-run's key check, even on a loaded machine
        write_manifest(out, {"stage": "tiny", "outputs": {}})
    '''))
    import os
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(pkg), os.getcwd(), *sys.path]))
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text("x: 1\n")
    # the cache key is the registered "sft" stage's (code version of its packages); the process is tinystage
    first = run_stage("sft", "tinystage", recipe, tmp_path / "out", log=lambda *_: None)
    assert not first.cached and first.seconds >= 2.0 and first.rerun_seconds is None
    again = run_stage("sft", "tinystage", recipe, tmp_path / "out", log=lambda *_: None)
    assert again.cached and again.seconds == pytest.approx(first.seconds)  # not 0.0
    assert again.rerun_seconds is not None and again.rerun_seconds < first.seconds
    row = summarize([again])[0]
    assert row["seconds"] == round(first.seconds, 1) and row["rerun_seconds"] == round(again.rerun_seconds, 1)


def test_the_flow_hands_the_rounds_gate_suites_to_the_training_stages(tmp_path):
    """SFT, DPO and the reward model get the round's gate suites (with the user's gates overrides)."""
    import yaml

    from flows.round import GATE_SUITES_FILE, RoundParameters, gate_suites_file, stage_args

    params = RoundParameters(preset="smoke", overrides={"gates": ["--safe_data", "/data/my_safe.csv"]})
    path = gate_suites_file(params, tmp_path)
    suites = yaml.safe_load(path.read_text())
    assert path == (tmp_path / GATE_SUITES_FILE).resolve()
    assert suites["safe_data"] == "/data/my_safe.csv"  # the override, not the recipe's
    assert suites["winrate_data"] == "demo:alpaca_eval/annotations/baseline_gpt4_1106_preview.jsonl.gz"
    assert "traffic_data" not in suites and "intent_training_data" not in suites  # not gate suites
    dirs = {"sft": "s", "dpo": "d", "reward_model": "r", "candidate": "d"}
    for stage in ("sft", "dpo", "reward_model"):
        args = stage_args(stage, params, tmp_path, dirs)
        assert args[args.index("--decontaminate_against") + 1] == str(path)
    assert "--decontaminate_against" not in stage_args("gates", params, tmp_path, dirs)


def test_the_blocked_round_automation_is_one_prefect_accepts():
    """The README's alert is a file Prefect's own automation model validates: a Failed flow run tagged
    verdict:block, one notification."""
    from pathlib import Path

    import yaml
    from prefect.events.schemas.automations import AutomationCore

    spec = yaml.safe_load((Path(__file__).resolve().parent.parent / "flows" / "automations" / "blocked_round.yaml")
                          .read_text())
    automation = AutomationCore.model_validate(spec)
    assert automation.trigger.expect == {"prefect.flow-run.Failed"}
    related = automation.trigger.match_related
    related = related[0] if isinstance(related, list) else related
    assert related["prefect.resource.id"] in ("prefect.tag.verdict:block", ["prefect.tag.verdict:block"])
    assert [a.type for a in automation.actions] == ["send-notification"]
