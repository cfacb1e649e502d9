"""Reports (gates/report.py): atomic JSON, Markdown with alpaca_eval columns, JUnit XML."""

import json
import os
import xml.etree.ElementTree as ET
from datetime import datetime, timedelta, timezone

import pytest

import gates.report as report
from gates.judge import judge_agreement_gate
from gates.refusal import RefusalRates, two_sided_refusal_gate
from gates.winrate import WIN_RATE_COLUMNS, win_rate_gate
from judging.agreement import judge_agreement
from judging.intervals import Rate


def results():
    lens = [100] * 250
    wr = win_rate_gate([2.0] * 134 + [1.0] * 116, lens, lens)  # 53.6%: pass
    a = RefusalRates(Rate.from_counts(21, 1000), Rate.from_counts(34, 1000))
    b = RefusalRates(Rate.from_counts(9, 1000), Rate.from_counts(112, 1000))
    ref = two_sided_refusal_gate(b, a)  # block
    jg = judge_agreement_gate(judge_agreement([1, 2], [0, 0]))  # inconclusive (NaN metrics)
    return [wr, ref, jg]


def test_json_report_atomic_and_strict(tmp_path):
    path = report.write_json_report(results(), tmp_path / "out" / "gates.json", metadata={"round": 3})
    d = json.loads(path.read_text())  # strict JSON: NaN became null
    assert d["verdict"] == "block" and d["schema_version"] == 1 and d["metadata"] == {"round": 3}
    assert [g["verdict"] for g in d["gates"]] == ["pass", "block", "inconclusive"]
    assert d["gates"][2]["metrics"]["agreement"]["value"] is None
    assert os.listdir(tmp_path / "out") == ["gates.json"]  # no temp file left


def test_failed_write_leaves_previous_report_intact(tmp_path, monkeypatch):
    path = tmp_path / "gates.json"
    path.write_text('{"verdict": "pass", "previous": true}')

    def boom(src, dst):
        raise OSError("disk full")

    import rlhf.manifest

    monkeypatch.setattr(rlhf.manifest.os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        report.write_json_report(results(), path)
    assert json.loads(path.read_text()) == {"verdict": "pass", "previous": True}
    assert os.listdir(tmp_path) == ["gates.json"]


def test_markdown_has_ci_n_and_alpaca_columns(tmp_path):
    md = report.write_markdown_report(results(), tmp_path / "gates.md").read_text()
    assert "**Release verdict: BLOCK**" in md
    assert "| " + " | ".join(WIN_RATE_COLUMNS) + " |" in md
    assert "| metric | value | ci_low | ci_high | n | unit | direction |" in md
    assert "| length_matched_win_rate | 53.6 |" in md
    assert "## refusal_two_sided (v1): BLOCK" in md
    assert "naive_average_not_used" in md


def test_junit_one_testcase_per_gate_failure_when_blocked(tmp_path):
    paths = report.write_reports(results(), tmp_path, stem="round3")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["round3.json", "round3.junit.xml", "round3.md"]
    root = ET.parse(paths["junit"]).getroot()
    suite = root.find("testsuite")
    assert suite.get("tests") == "3" and suite.get("failures") == "2"
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert set(cases) == {"length_controlled_win_rate", "refusal_two_sided", "judge_agreement"}
    assert cases["length_controlled_win_rate"].find("failure") is None
    assert cases["refusal_two_sided"].find("failure").get("type") == "block"
    assert cases["judge_agreement"].find("failure").get("type") == "inconclusive"
    json.loads(cases["refusal_two_sided"].find("system-out").text)


def test_junit_carries_timestamp_and_time_that_reporters_can_read(tmp_path):
    """The schema's timestamp (xs:dateTime, no zone) and time (seconds) on the suite; every case has a time."""
    started = datetime(2026, 12, 2, 6, 30, 5, 123456, tzinfo=timezone(timedelta(hours=2)))
    paths = report.write_reports(results(), tmp_path, stem="r", started_at=started, seconds=12.3456)
    root = ET.parse(paths["junit"]).getroot()
    for element in (root, root.find("testsuite")):
        assert element.get("timestamp") == "2026-12-02T04:30:05"  # UTC, to the second
        assert element.get("time") == "12.346"
    assert [c.get("time") for c in root.iter("testcase")] == ["0.000"] * 3
    now = ET.fromstring(report.render_junit_xml(results()).split("\n", 1)[1]).get("timestamp")
    assert abs((datetime.fromisoformat(now) - datetime.now(timezone.utc).replace(tzinfo=None)).total_seconds()) < 60


def test_empty_results_are_an_error(tmp_path):
    with pytest.raises(ValueError):
        report.write_json_report([], tmp_path / "x.json")
    assert not (tmp_path / "x.json").exists()


def test_caller_cannot_write_a_verdict_the_gates_did_not_reach(tmp_path):
    with pytest.raises(ValueError, match="disagrees"):
        report.write_json_report(results(), tmp_path / "r.json", verdict="pass")
    assert not (tmp_path / "r.json").exists()
    p = report.write_json_report(results(), tmp_path / "r.json", verdict="block")
    assert json.loads(p.read_text())["verdict"] == "block"
    md = report.write_markdown_report(results(), tmp_path / "r.md", verdict="block", title="Round 7").read_text()
    assert md.startswith("# Round 7")
