"""Release approval (flows/approval.py): typed waivers, the decision rules, the record in the report, and the pause
in a real Prefect flow run answered through Prefect's own API (resume_flow_run with run_input) or left to time out."""

from __future__ import annotations

import datetime as dt
import json
import re
import threading
import time

import pytest
from pydantic import ValidationError

from flows.approval import (
    BYPASS_ENV,
    ReleaseDecision,
    Waiver,
    check_decision,
    decision_input,
    previous_round_json,
    previous_waivers,
    release_approval,
    release_state,
    write_to_report,
)
from gates.report import APPROVAL_HEADING, approval_markdown, with_approval_section

TODAY = dt.datetime.now(dt.timezone.utc).date()
LATER = (TODAY + dt.timedelta(days=30)).isoformat()

# a constructed gate report (the JSON's verdict and gates, as gates.report.report_dict writes them)
BLOCKED = {
    "verdict": "block",
    "gates": [
        {"name": "capability", "verdict": "pass", "reason": "Passed."},
        {"name": "judge_agreement", "verdict": "block", "reason": "Blocked on evidence: a = 0.55, CI 0.41-0.69."},
        {"name": "sycophancy", "verdict": "inconclusive", "reason": "Cannot judge: needs at least 20 eligible items."},
    ],
}
PASSED = {"verdict": "pass", "gates": [BLOCKED["gates"][0]]}


def waiver(gate: str, expires: str = LATER, **kw) -> dict:
    return {"gate": gate, "reason": kw.get("reason", "known judge drift, re-qualified next round"),
            "approver": kw.get("approver", "rm@example.org"), "expires": expires}


def test_a_waiver_must_expire_in_the_future():
    assert Waiver(**waiver("sycophancy")).expires == TODAY + dt.timedelta(days=30)
    for day in (TODAY, TODAY - dt.timedelta(days=1)):
        with pytest.raises(ValidationError, match=f"expires {day.isoformat()} is not in the future"):
            Waiver(**waiver("sycophancy", expires=day.isoformat()))
    with pytest.raises(ValidationError, match="must not be blank"):
        Waiver(**waiver("sycophancy", approver="  "))


def test_a_waiver_names_one_of_the_rounds_gates():
    form = decision_input([g["name"] for g in BLOCKED["gates"]])
    ok = form(decision="approve", approver="rm", waivers=[waiver("sycophancy")])
    assert ok.waivers[0].gate == "sycophancy"
    with pytest.raises(ValidationError, match="'capability', 'judge_agreement' or 'sycophancy'"):
        form(decision="approve", approver="rm", waivers=[waiver("safety")])
    # the UI's form (and Prefect's server check on resume) offers exactly these names
    schema = form.model_json_schema()
    assert schema["$defs"]["Waiver"]["properties"]["gate"]["enum"] == ["capability", "judge_agreement", "sycophancy"]
    with pytest.raises(ValidationError):
        form(decision="maybe", approver="rm")
    with pytest.raises(ValidationError):
        form(decision="approve", approver="")


def test_approving_a_blocked_release_needs_a_waiver_for_every_blocking_gate():
    form = decision_input([g["name"] for g in BLOCKED["gates"]])
    with pytest.raises(ValueError, match="blocked by judge_agreement, sycophancy and they are not waived"):
        check_decision(form(decision="approve", approver="rm"), BLOCKED["gates"])
    with pytest.raises(ValueError, match="blocked by sycophancy and it is not waived"):
        check_decision(form(decision="approve", approver="rm", waivers=[waiver("judge_agreement")]), BLOCKED["gates"])
    with pytest.raises(ValueError, match=r"do not block: \['capability'\]"):
        check_decision(form(decision="approve", approver="rm", waivers=[waiver("capability")]), BLOCKED["gates"])
    with pytest.raises(ValueError, match="more than once"):
        check_decision(form(decision="approve", approver="rm", waivers=[waiver("sycophancy")] * 2), BLOCKED["gates"])
    with pytest.raises(ValueError, match="needs a reason"):
        check_decision(form(decision="reject", approver="rm"), BLOCKED["gates"])
    check_decision(form(decision="approve", approver="rm", waivers=[waiver("judge_agreement"), waiver("sycophancy")]),
                   BLOCKED["gates"])  # accepted
    check_decision(ReleaseDecision(decision="approve", approver="rm"), PASSED["gates"])  # nothing blocks


def test_without_approval_or_with_a_bypass_the_release_follows_the_gates(monkeypatch):
    monkeypatch.delenv(BYPASS_ENV, raising=False)
    none = release_approval(BLOCKED)
    assert none["decision"] == "none" and none["release"] == "block"
    assert none["blocking_gates"] == ["judge_agreement", "sycophancy"]
    state = release_state(BLOCKED, none, {"x": 1})
    assert state.is_failed() and state.message.startswith("Release BLOCKED by 2 of 3 gates")
    monkeypatch.setenv(BYPASS_ENV, "nightly CI, no release")
    ci = release_approval(BLOCKED, mode="required")  # no flow run needed: it never pauses
    assert (ci["decision"], ci["release"], ci["bypass_reason"], ci["bypass_source"]) == (
        "bypassed", "block", "nightly CI, no release", f"environment {BYPASS_ENV}")
    s = release_state(BLOCKED, ci, {})
    assert s.is_failed() and s.message.startswith("Approval bypassed (nightly CI, no release). Release BLOCKED")
    p = release_approval(PASSED, mode="required", bypass="smoke job")
    assert p["bypass_source"] == "parameter approval_bypass" and release_state(PASSED, p, {}).is_completed()
    with pytest.raises(ValueError, match="approval mode"):
        release_approval(BLOCKED, mode="maybe")


def test_the_report_section_marks_waived_gates_and_flags_expired_previous_waivers(tmp_path):
    approval = {"mode": "required", "decision": "approved", "release": "pass", "approver": "rm", "reason": "ship",
                "decided_at": "2026-12-02T05:00:00+00:00", "gate_verdict": "block", "timed_out": False,
                "blocking_gates": ["judge_agreement", "sycophancy"], "refused": ["rm: approval refused: ..."],
                "waivers": [waiver("judge_agreement"), waiver("sycophancy")]}
    prev_file = tmp_path / "r1" / "round.json"
    prev_file.parent.mkdir()
    prev_file.write_text(json.dumps({"round_id": "r1", "approval": {"waivers": [
        waiver("judge_agreement", expires="2026-11-30"), waiver("sycophancy", expires="2026-12-02")]}}))
    assert previous_round_json(["--beta", "1", "--previous_round_dir", str(tmp_path / "r1" / "gates")]) == prev_file
    assert previous_round_json(["--beta", "1"]) is None
    prev = previous_waivers(prev_file, today=dt.date(2026, 12, 1))
    assert [(w["gate"], w["round_id"], w["expired"]) for w in prev] == [("judge_agreement", "r1", True),
                                                                         ("sycophancy", "r1", False)]
    assert previous_waivers(tmp_path / "none.json") == []
    section = approval_markdown(approval, prev)
    assert section.startswith(APPROVAL_HEADING) and "**APPROVED** by rm at 2026-12-02T05:00:00+00:00: ship" in section
    assert f"| judge_agreement | blocks | waived | rm@example.org | {LATER} |" in section
    marked = approval_markdown(approval, prev, {"judge_agreement": "block", "sycophancy": "inconclusive"})
    assert f"| sycophancy | inconclusive | waived | rm@example.org | {LATER} |" in marked
    assert "| r1 | judge_agreement | rm@example.org | 2026-11-30 | **EXPIRED** |" in section
    assert "| r1 | sycophancy | rm@example.org | 2026-12-02 | in force |" in section

    md, js = tmp_path / "gates.md", tmp_path / "gates.json"
    md.write_text("# Release gates\n\n**Release verdict: BLOCK**\n\n## Plots\n\n### drift\n\n![d](plots/d.png)\n")
    js.write_text(json.dumps({"verdict": "block", "gates": BLOCKED["gates"], "metadata": {"round_id": "r2"}}))
    write_to_report(md, js, approval, prev)
    write_to_report(md, js, approval, prev)  # a rerun replaces the section, never stacks it
    text = md.read_text()
    assert "| judge_agreement | block | waived |" in text  # the gate's own verdict, from the JSON report
    assert text.count(APPROVAL_HEADING) == 1 and text.index("## Plots") < text.index(APPROVAL_HEADING)
    back = json.loads(js.read_text())
    assert back["verdict"] == "block" and back["metadata"]["round_id"] == "r2"  # the gates' verdict stays
    assert back["metadata"]["release_approval"]["release"] == "pass"
    assert [w["expired"] for w in back["metadata"]["release_approval"]["previous_waivers"]] == [True, False]
    write_to_report(md, js, {**approval, "mode": "none", "decision": "none"}, [])
    assert APPROVAL_HEADING not in md.read_text() and md.read_text().rstrip().endswith("![d](plots/d.png)")
    assert with_approval_section("# A\n\n## Release approval\n\n- x\n\n## B\n\ny\n", "") == "# A\n\n## B\n\ny\n"


# ------------------------------------------------------------------------------------------------
# the pause in a real Prefect flow run: the same function the round flow calls, on a constructed report
# ------------------------------------------------------------------------------------------------


BOX: dict = {}  # what the flow run in the thread hands back (flow parameters are copied, so not a parameter)


def _run_in_thread(flow_fn, *args):
    """Start ``flow_fn`` in a thread; returns (thread, box): box['id'] is its flow run id once known,
    box['state'] its final state."""
    BOX.clear()
    t = threading.Thread(target=lambda: BOX.update(state=flow_fn(*args, return_state=True)), daemon=True)
    t.start()
    return t, BOX


def _wait_paused(box: dict, previous_key: str | None = None, timeout: float = 120.0) -> str:
    """Wait until the flow run is paused for input with a keyset other than ``previous_key``; its response key."""
    from prefect.client.orchestration import get_client

    end = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while time.monotonic() < end:
            if "id" in box:
                state = client.read_flow_run(box["id"]).state
                keyset = state.state_details.run_input_keyset if state and state.is_paused() else None
                if keyset and keyset["response"] != previous_key:
                    return keyset["response"]
            time.sleep(0.3)
    raise AssertionError(f"the flow run was not paused for input within {timeout} s")


def _resume(run_id, run_input: dict, timeout: float = 60.0) -> None:
    """resume_flow_run, retried while the paused run has not yet saved its form's schema."""
    from prefect.flow_runs import resume_flow_run

    end = time.monotonic() + timeout
    while True:
        try:
            return resume_flow_run(run_id, run_input=run_input)
        except RuntimeError as err:
            if "schema not found" not in str(err) or time.monotonic() > end:
                raise
            time.sleep(0.3)


def test_the_flow_pauses_for_a_decision_refuses_an_unwaived_approval_and_completes_when_approved(monkeypatch):
    from prefect import flow
    from prefect.runtime import flow_run
    from prefect.testing.utilities import prefect_test_harness

    monkeypatch.delenv(BYPASS_ENV, raising=False)

    @flow
    def tiny_release(report: dict):
        box = BOX
        box["id"] = flow_run.get_id()
        approval = release_approval(report, mode="required", timeout_s=300, poll_interval_s=1)
        box["approval"] = approval
        return release_state(report, approval, {"approval": approval})

    with prefect_test_harness(server_startup_timeout=180):
        thread, box = _run_in_thread(tiny_release, BLOCKED)
        first = _wait_paused(box)
        with pytest.raises(RuntimeError, match="Cannot resume"):  # Prefect's server checks the form's gate enum
            _resume(box["id"], {"decision": "approve", "approver": "rm", "waivers": [waiver("safety")]})
        _resume(box["id"], {"decision": "approve", "approver": "rm", "waivers": [waiver("judge_agreement")]})
        second = _wait_paused(box, first)  # refused (sycophancy not waived): asked again
        _resume(box["id"], {"decision": "approve", "approver": "rm", "reason": "judge re-qualified offline",
                            "waivers": [waiver("judge_agreement"), waiver("sycophancy", approver="lead")]})
        thread.join(120)
        assert not thread.is_alive() and second != first
        state, approval = box["state"], box["approval"]
        assert state.is_completed() and state.name == "Completed"
        assert state.message.startswith(
            "Release APPROVED by rm: judge re-qualified offline; waived judge_agreement (by rm@example.org, until "
            f"{LATER}: known judge drift, re-qualified next round); waived sycophancy (by lead, until {LATER}")
        assert "Gates: Release BLOCKED by 2 of 3 gates" in state.message  # the gates' own verdict stays
        assert approval["decision"] == "approved" and approval["release"] == "pass" and approval["gate_verdict"] == "block"
        assert [w["gate"] for w in approval["waivers"]] == ["judge_agreement", "sycophancy"]
        assert len(approval["refused"]) == 1 and "blocked by sycophancy and it is not waived" in approval["refused"][0]


def test_a_past_expiry_is_refused_and_no_decision_before_the_timeout_is_a_reject(monkeypatch):
    from prefect import flow
    from prefect.runtime import flow_run
    from prefect.testing.utilities import prefect_test_harness

    monkeypatch.delenv(BYPASS_ENV, raising=False)

    @flow
    def tiny_release(report: dict):
        box = BOX
        box["id"] = flow_run.get_id()
        approval = release_approval(report, mode="required", timeout_s=8, poll_interval_s=1)
        box["approval"] = approval
        return release_state(report, approval, {"approval": approval})

    with prefect_test_harness(server_startup_timeout=180):
        thread, box = _run_in_thread(tiny_release, PASSED)
        _wait_paused(box)
        # a date the server's schema accepts but that is in the past: refused by the flow, which asks again
        before = dt.datetime.now(dt.timezone.utc).date()  # the refusal names the day it was checked on
        _resume(box["id"], {"decision": "approve", "approver": "rm", "waivers": [waiver("capability", "2020-01-01")]})
        thread.join(120)
        assert not thread.is_alive()
        state, approval = box["state"], box["approval"]
        assert state.is_failed() and state.name == "Failed"
        assert state.message.startswith("Release REJECTED: no decision within 8 s (timed out). Gates: Release PASSED")
        assert approval["timed_out"] and approval["release"] == "block" and approval["approver"] is None
        days = {before, dt.datetime.now(dt.timezone.utc).date()}  # two where the check ran across midnight UTC
        assert approval["refused"] in [["waivers.0.expires: expires 2020-01-01 is not in the future (today is "
                                        f"{day.isoformat()}, UTC)"] for day in days]


def test_the_round_runs_without_approval_unless_asked():
    from flows.round import RoundParameters

    p = RoundParameters(preset="smoke")
    assert (p.approval, p.approval_bypass, p.approval_timeout_s) == ("none", None, 24 * 3600)
    assert RoundParameters(preset="smoke", approval="required", approval_bypass="ci").approval == "required"
    with pytest.raises(ValidationError):
        RoundParameters(preset="smoke", approval="sometimes")
    with pytest.raises(ValidationError):
        RoundParameters(preset="smoke", approval_timeout_s=0)


@pytest.mark.parametrize(("args", "named"), [
    (["--approval", "sometimes"], "'none' or 'required'"),
    (["--approval", "required", "--approval-timeout", "0"], "greater than or equal to 1"),
])
def test_the_cli_refuses_a_bad_approval_setting_before_anything_runs(args, named, tmp_path):
    from typer.testing import CliRunner

    from flows.cli import app

    result = CliRunner().invoke(app, ["round", "--preset", "smoke", "--runs-dir", str(tmp_path), *args])
    assert result.exit_code == 2, result.output
    flat = " ".join(re.sub("[│╭╮╰╯─]", " ", result.output).split())  # Typer's error box, wrapped lines joined
    assert named in flat and "--approval" in flat
    assert not any(tmp_path.iterdir())
