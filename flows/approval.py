"""Release approval: after the gates, a person approves or rejects the release, or waives named blocking gates.

The round flow (flows/round.py) calls :func:`release_approval` with the gate report when its ``approval`` parameter
is ``required``. The flow run then pauses for input (:func:`ask`: Prefect's ``pause_flow_run(wait_for_input=...)``
with a deadline of its own): the Prefect UI shows a
"Resume" form built from :class:`ReleaseDecision` (decision, approver, reason, waivers), whose description says the
verdict and which gates block. What is decided:

* **approve** - the release goes out. A blocked release can only be approved with a waiver for every blocking gate
  (``block`` or ``inconclusive``): a :class:`Waiver` names the gate (one of this round's gates), a reason, who
  waives it and the last day it holds (``expires``, a date after today, UTC). A waiver turns its gate into a waived
  pass *for the release decision only*: the gate's own verdict stays in the gate report, marked waived.
* **reject** - the release does not go out, whatever the gates say.
* **no answer** within ``timeout`` seconds - a reject (``timed_out: true``): a release never goes out by default.

An answer that cannot stand (a waiver past its expiry, an approval of a blocked release that leaves a blocking gate
unwaived, a waiver of a gate that does not block) is refused: the refusal is logged, kept in the record
(``refused``) and the run pauses again with the refusal at the top of the form, until the timeout.

Non-interactive runs (CI) with approval required bypass the pause with a recorded reason
(:data:`BYPASS_ENV` or the flow's ``approval_bypass`` parameter): the release then follows the gates' verdict and the
record says who bypassed and why. The record (:func:`release_approval`'s return) goes into ``round.json``
(``approval``), the gate report's JSON (``metadata.release_approval``) and Markdown (a "Release approval" section,
``gates.report.approval_markdown``), and the final state's message (:func:`release_state`).

A round whose gates compare against a previous round (the gates' ``previous_round_dir``) reads that round's
``round.json`` and flags each of its waivers that has expired (:func:`previous_waivers`); waivers never carry over,
each round is decided anew.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from prefect.input import RunInput
from prefect.states import Completed, Failed, State
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator

from .artifacts import short_reason, verdict_message, verdict_state

#: Environment variable whose value (the reason) bypasses a required approval in a non-interactive run (CI).
BYPASS_ENV = "RLHF_APPROVAL_BYPASS"
#: Default seconds the flow waits for a decision (then: rejected).
DEFAULT_TIMEOUT_S = 24 * 3600


def _today() -> _dt.date:
    return _dt.datetime.now(_dt.timezone.utc).date()


class Waiver(BaseModel):
    """One waived gate: the release may go out although ``gate`` blocks, until ``expires`` (inclusive, UTC)."""

    model_config = ConfigDict(extra="forbid")

    gate: str = Field(description="The blocking gate waived (one of this round's gates).")
    reason: str = Field(min_length=1, description="Why the release may go out although this gate blocks.")
    approver: str = Field(min_length=1, description="Who waives it (name or e-mail).")
    expires: _dt.date = Field(description="Last day the waiver holds (UTC, YYYY-MM-DD); must be after today.")

    @field_validator("reason", "approver")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be blank")
        return value.strip()

    @field_validator("expires")
    @classmethod
    def _in_the_future(cls, value: _dt.date) -> _dt.date:
        today = _today()
        if value <= today:
            raise ValueError(f"expires {value.isoformat()} is not in the future (today is {today.isoformat()}, UTC)")
        return value


class ReleaseDecision(RunInput):
    """The release manager's answer (the Prefect UI's resume form)."""

    decision: Literal["approve", "reject"] = Field(description="approve: the release goes out; reject: it does not.")
    approver: str = Field(min_length=1, description="Who decides (name or e-mail).")
    reason: str = Field("", description="Why (required to reject).")
    waivers: list[Waiver] = Field(
        default_factory=list, description="Blocking gates waived for this release (needed to approve a blocked one)."
    )

    @field_validator("approver")
    @classmethod
    def _approver_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("approver must not be blank")
        return value.strip()


def decision_input(gate_names: Sequence[str]) -> type[ReleaseDecision]:
    """:class:`ReleaseDecision` whose waivers may name only ``gate_names`` (an enum in the form's JSON schema, so
    the UI offers them and Prefect's server refuses another name on resume; pydantic refuses it on load).

    Raises:
        ValueError: no gate names.
    """
    if not gate_names:
        raise ValueError("decision_input: the round has no gates to waive")
    gate_type = Literal[tuple(gate_names)]  # type: ignore[valid-type]
    waiver = create_model(
        "Waiver", __base__=Waiver, gate=(gate_type, Field(description="The blocking gate waived.")),
    )
    return create_model(
        "ReleaseDecision", __base__=ReleaseDecision,
        waivers=(list[waiver], Field(default_factory=list, description=ReleaseDecision.model_fields["waivers"].description)),
    )


def blocking_gates(gates: Sequence[Mapping[str, Any]]) -> list[str]:
    """Names of the gates whose verdict blocks the release (anything but ``pass``)."""
    return [g["name"] for g in gates if g["verdict"] != "pass"]


def check_decision(decision: ReleaseDecision, gates: Sequence[Mapping[str, Any]]) -> None:
    """Raise ValueError (a message for the release manager) when ``decision`` cannot stand against the gates:
    a waiver of an unknown gate or of one that does not block, two waivers of one gate, a reject without a reason,
    or an approval that leaves a blocking gate unwaived."""
    names = [g["name"] for g in gates]
    blocking = blocking_gates(gates)
    waived = [w.gate for w in decision.waivers]
    unknown = [g for g in waived if g not in names]
    if unknown:
        raise ValueError(f"waivers name unknown gates {unknown}; this round's gates: {', '.join(names)}")
    twice = sorted({g for g in waived if waived.count(g) > 1})
    if twice:
        raise ValueError(f"gates waived more than once: {twice}")
    not_blocking = [g for g in waived if g not in blocking]
    if not_blocking:
        raise ValueError(f"waivers name gates that do not block: {not_blocking} (blocking: {blocking or 'none'})")
    if decision.decision == "reject" and not decision.reason.strip():
        raise ValueError("a rejection needs a reason")
    missing = [g for g in blocking if g not in waived]
    if decision.decision == "approve" and missing:
        raise ValueError(
            f"approval refused: the release is blocked by {', '.join(missing)} and "
            f"{'it is' if len(missing) == 1 else 'they are'} not waived; add a waiver (gate, reason, approver, "
            "expires) for every blocking gate, or reject"
        )


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def record_decision(decision: ReleaseDecision, gates: Sequence[Mapping[str, Any]], **extra: Any) -> dict[str, Any]:
    """The approval record of a decision :func:`check_decision` accepted: release ``pass`` (approved) or ``block``."""
    return {
        "mode": "required",
        "decision": "approved" if decision.decision == "approve" else "rejected",
        "release": "pass" if decision.decision == "approve" else "block",
        "approver": decision.approver,
        "reason": decision.reason,
        "waivers": [w.model_dump(mode="json") for w in decision.waivers],
        "decided_at": _now(),
        "timed_out": False,
        **extra,
    }


def form_description(verdict: str, gates: Sequence[Mapping[str, Any]], refused: str | None = None) -> str:
    """Markdown shown above the resume form: the verdict, the blocking gates and their reasons, how to decide."""
    lines = [f"**Refused:** {refused}", ""] if refused else []
    blocking = [g for g in gates if g["verdict"] != "pass"]
    lines.append(f"**Gate verdict: {verdict.upper()}** ({len(gates) - len(blocking)} of {len(gates)} gates pass).")
    if blocking:
        lines += ["", "Blocking gates (each needs a waiver to approve):"]
        lines += [f"- `{g['name']}` {g['verdict']}: {short_reason(g['reason'])}" for g in blocking]
    lines += ["", "Approve or reject the release; a waiver needs gate, reason, approver and expires (a future date). "
              "Full reasons: the gate-report artifact."]
    return "\n".join(lines)


def release_approval(
    gates_report: Mapping[str, Any],
    *,
    mode: Literal["none", "required"] = "none",
    timeout_s: int = DEFAULT_TIMEOUT_S,
    bypass: str | None = None,
    log=None,
    poll_interval_s: int = 10,
) -> dict[str, Any]:
    """The release decision for a gate report (``{"verdict": ..., "gates": [{"name", "verdict", "reason"}, ...]}``).

    ``mode="none"``: the release follows the gates' verdict, nothing is asked. ``mode="required"``: a ``bypass``
    reason (else ``$RLHF_APPROVAL_BYPASS``) skips the question and is recorded; otherwise the running flow pauses for
    a :class:`ReleaseDecision` (at most ``timeout_s`` seconds in all; a refused answer pauses again; no answer is a
    reject; the paused run checks for an answer every ``poll_interval_s`` seconds). Must run inside a flow run when it
    pauses.

    Returns:
        the approval record: mode, decision (``none``, ``bypassed``, ``approved``, ``rejected``), release
        (``pass``/``block``), approver, reason, waivers, decided_at (UTC ISO 8601), timed_out, refused (the
        refusals of earlier answers), gate_verdict and, for a bypass, bypass_reason and bypass_source.

    Raises:
        ValueError: an unknown mode or a timeout below 1 s.
    """
    verdict, gates = gates_report["verdict"], list(gates_report["gates"])
    info = log.info if log else (lambda *a: None)
    base = {"gate_verdict": verdict, "blocking_gates": blocking_gates(gates)}
    if mode == "none":
        return {"mode": "none", "decision": "none", "release": verdict, "waivers": [], **base}
    if mode != "required":
        raise ValueError(f"approval mode must be 'none' or 'required', got {mode!r}")
    if timeout_s < 1:
        raise ValueError(f"approval timeout must be at least 1 s, got {timeout_s}")
    source = "parameter approval_bypass" if bypass else f"environment {BYPASS_ENV}"
    bypass = bypass or os.environ.get(BYPASS_ENV)
    if bypass is not None and bypass.strip():
        info("release approval BYPASSED (%s): %s; the release follows the gates' verdict %s", source, bypass, verdict)
        return {"mode": "required", "decision": "bypassed", "release": verdict, "approver": None, "reason": None,
                "waivers": [], "decided_at": _now(), "timed_out": False, "bypass_reason": bypass.strip(),
                "bypass_source": source, "refused": [], **base}
    form = decision_input([g["name"] for g in gates])
    deadline = _dt.datetime.now(_dt.timezone.utc) + _dt.timedelta(seconds=timeout_s)
    refused: list[str] = []
    attempt = 0
    while True:
        left = int((deadline - _dt.datetime.now(_dt.timezone.utc)).total_seconds())
        if left < 1:
            break
        attempt += 1
        info("waiting up to %d s for the release decision (Prefect UI: this flow run -> Resume)", left)
        described = form.with_initial_data(description=form_description(verdict, gates, refused[-1] if refused
                                                                         else None))
        try:
            answer = ask(described, timeout_s=left, poll_interval_s=poll_interval_s, key=f"release-approval-{attempt}")
        except ValidationError as err:  # the server checks the schema; a past expiry is ours to refuse
            refused.append("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg'].removeprefix('Value error, ')}"
                                     for e in err.errors()))
            info("release decision refused: %s", refused[-1])
            continue
        if answer is None:
            break
        try:
            check_decision(answer, gates)
        except ValueError as err:
            refused.append(f"{answer.approver}: {err}")
            info("release decision refused: %s", refused[-1])
            continue
        record = record_decision(answer, gates, refused=refused, **base)
        info("release %s by %s%s", record["decision"].upper(), record["approver"],
             "".join(f"; waived {w['gate']} until {w['expires']}" for w in record["waivers"]))
        return record
    info("release REJECTED: no decision within %d s", timeout_s)
    return {"mode": "required", "decision": "rejected", "release": "block", "approver": None,
            "reason": f"no decision within {timeout_s} s (timed out)", "waivers": [], "decided_at": _now(),
            "timed_out": True, "refused": refused, **base}


#: Seconds Prefect's pause deadline lies after ours: our timeout ends the pause ourselves (a reject), before Prefect's
#: would fail the run with its own message and refuse any other final state.
PAUSE_GRACE_S = 60


def ask(form: type[ReleaseDecision], *, timeout_s: int, poll_interval_s: float = 10,
        key: str = "release-approval") -> ReleaseDecision | None:
    """Pause the running flow run for ``form`` (Prefect's UI shows its Resume form); the answer, or None when none came
    within ``timeout_s`` seconds.

    This is ``prefect.flow_runs.pause_flow_run(wait_for_input=form)`` with one difference: there, the timeout is also
    the server's pause deadline, after which Prefect fails the run ("The flow was paused and never resumed") and
    refuses any other final state, so a round could not end saying it was rejected for want of a decision. Here the
    server's deadline is ``PAUSE_GRACE_S`` later, and at our own the flow leaves the pause itself (a Running state, as
    a resume would) and reads whether an answer arrived meanwhile.

    Raises:
        RuntimeError: outside a flow run, or Prefect refused the pause.
        pydantic.ValidationError: the answer does not fit ``form`` (a past expiry, ...).
    """
    from prefect.client.orchestration import get_client
    from prefect.context import FlowRunContext
    from prefect.input.run_input import keyset_from_paused_state
    from prefect.input.actions import read_flow_run_input
    from prefect.states import Paused, Running
    from prefect.utilities.engine import propose_state_sync

    context = FlowRunContext.get()
    if not context or not context.flow_run:
        raise RuntimeError("release approval pauses the flow run: call it inside a flow")
    run_id = context.flow_run.id
    paused = Paused(timeout_seconds=timeout_s + PAUSE_GRACE_S, reschedule=False, pause_key=key)
    keyset = keyset_from_paused_state(paused)
    paused.state_details.run_input_keyset = keyset
    with get_client(sync_client=True) as client:
        state = propose_state_sync(client=client, state=paused, flow_run_id=run_id)
        if not state.is_paused():
            raise RuntimeError(f"Prefect refused to pause the flow run for the release decision: {state}")
        form.save(keyset)  # the form's schema: the UI renders it and the server checks a resume against it
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            time.sleep(max(0.05, min(poll_interval_s, end - time.monotonic())))
            run_state = client.read_flow_run(run_id).state
            if run_state and run_state.is_running():
                return form.load(keyset)
        if not client.read_flow_run(run_id).state.is_running():
            propose_state_sync(client=client, state=Running(), flow_run_id=run_id)
    # a resume that raced our deadline still counts
    return form.load(keyset) if read_flow_run_input(keyset["response"], flow_run_id=run_id) is not None else None


def release_state(gates_report: Mapping[str, Any], approval: Mapping[str, Any], data: Any) -> State:
    """The round's final state with the release decision: ``mode: none`` and a bypass are the gates' own
    :func:`~flows.artifacts.verdict_state` (a bypass says so first); approved -> ``Completed`` ("Release APPROVED by
    <approver>", each waiver with its approver and expiry); rejected / timed out -> ``Failed`` with the reason. The
    gates' summary follows in every message."""
    verdict, gates = gates_report["verdict"], gates_report["gates"]
    summary = verdict_message(verdict, gates)
    if approval["decision"] in ("none", "bypassed"):
        state = verdict_state(verdict, gates, data)
        if approval["decision"] == "bypassed":
            state.message = f"Approval bypassed ({approval['bypass_reason']}). {summary}"
        return state
    if approval["decision"] == "approved":
        waived = "".join(f"; waived {w['gate']} (by {w['approver']}, until {w['expires']}: {short_reason(w['reason'], 120)})"
                         for w in approval["waivers"])
        why = f": {short_reason(approval['reason'], 200)}" if approval.get("reason") else ""
        return Completed(message=f"Release APPROVED by {approval['approver']}{why}{waived}. Gates: {summary}",
                         data=data)
    who = f" by {approval['approver']}" if approval.get("approver") else ""
    return Failed(message=f"Release REJECTED{who}: {short_reason(approval['reason'], 300)}. Gates: {summary}",
                  data=data)


def previous_waivers(previous_round_json: str | Path | None, today: _dt.date | None = None) -> list[dict[str, Any]]:
    """The waivers the previous round was released under, each with ``round_id`` and ``expired`` (its ``expires``
    is before ``today``, UTC). [] when there is no previous round file or it had no approval.

    Raises:
        ValueError: the file is not JSON or a waiver has no valid ``expires`` (names the file).
    """
    if previous_round_json is None or not Path(previous_round_json).is_file():
        return []
    path = Path(previous_round_json)
    try:
        prev = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not JSON ({err})") from None
    today = today or _today()
    out = []
    for i, w in enumerate((prev.get("approval") or {}).get("waivers") or []):
        try:
            expires = _dt.date.fromisoformat(str(w["expires"]))
        except (KeyError, ValueError):
            raise ValueError(f"{path}: approval.waivers[{i}]: no valid expires date ({w.get('expires')!r})") from None
        out.append({**w, "round_id": prev.get("round_id"), "expired": expires < today})
    return out


def previous_round_json(gates_overrides: Sequence[str]) -> Path | None:
    """``round.json`` of the round the gates compare against: the gates' ``--previous_round_dir`` (a gates stage
    folder, ``runs/<round>/gates``) -> ``runs/<round>/round.json``; None without one."""
    args = list(gates_overrides)
    for flag in ("--previous_round_dir", "--previous-round-dir"):
        if flag in args[:-1]:
            return Path(args[args.index(flag) + 1]).parent / "round.json"
    return None


def write_to_report(report_md: str | Path, report_json: str | Path, approval: Mapping[str, Any],
                    previous: Sequence[Mapping[str, Any]] = ()) -> None:
    """Put the approval record into the gate report: the Markdown's "Release approval" section
    (``gates.report.approval_markdown``, replacing an older one) and the JSON's ``metadata.release_approval``
    (with ``previous_waivers``); both rewritten atomically. Without approval and previous waivers the Markdown gets
    no section. The gates' own verdicts are left as they are."""
    from gates.report import approval_markdown, with_approval_section
    from rlhf.manifest import atomic_write_text, strict_json

    md, js = Path(report_md), Path(report_json)
    report = json.loads(js.read_text())
    verdicts = {g["name"]: g["verdict"] for g in report.get("gates", [])}
    # nothing asked and no previous waivers: no section (an older one, from a rerun with approval, is removed)
    section = approval_markdown(approval, previous, verdicts) if approval["mode"] != "none" or previous else ""
    atomic_write_text(md, with_approval_section(md.read_text(), section))
    report.setdefault("metadata", {})["release_approval"] = strict_json({**approval,
                                                                        "previous_waivers": list(previous)})
    atomic_write_text(js, json.dumps(report, indent=2, allow_nan=False) + "\n")
