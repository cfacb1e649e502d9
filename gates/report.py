"""Gate reports: JSON (machine-readable, atomic), Markdown (for people), JUnit XML (for CI).

Every file is written atomically: the content goes to a temporary file in the target directory,
is flushed and fsynced, then ``os.replace``d over the target, so a reader never sees a
half-written report that looks complete (DESIGN.md principle 5: a blocked verdict writes a
machine-readable report).

JUnit XML is built with the standard library's ``xml.etree.ElementTree`` (no extra dependency):
one ``<testcase>`` per gate; a blocked gate gets a ``<failure>``, an inconclusive one a
``<failure type="inconclusive">`` (it blocks the release too).
"""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gates.result import GateResult, release_verdict, to_jsonable
from gates.winrate import WIN_RATE_COLUMNS
from rlhf.manifest import atomic_write_text

REPORT_SCHEMA_VERSION = 1


# --------------------------------------------------------------------------------------------
# JSON
# --------------------------------------------------------------------------------------------


def _checked_verdict(results: Sequence[GateResult], verdict: str | None) -> str:
    computed = release_verdict(results)
    if verdict is not None and verdict != computed:
        raise ValueError(f"verdict {verdict!r} disagrees with release_verdict(results) = {computed!r}")
    return computed


def report_dict(
    results: Sequence[GateResult], *, verdict: str | None = None, metadata: Mapping[str, Any] | None = None,
    axes: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON report as a dict: schema_version, verdict (``release_verdict``), gates, metadata and, when given,
    axes (``gates.rubric.group_by_axis``: ``{axis: {verdict, gates: [...], trades_against, ...}}``).

    Args:
        results: the gates' results.
        verdict: optional; if given it must equal ``release_verdict(results)`` (a caller cannot
            write a verdict the gates did not reach).
        metadata: extra JSON-able context (round id, input hashes, ...).

    Raises:
        ValueError: ``results`` is empty (see ``release_verdict``) or ``verdict`` disagrees.
    """
    results = list(results)
    return {
        "schema_version": REPORT_SCHEMA_VERSION,
        "verdict": _checked_verdict(results, verdict),
        "gates": [r.to_dict() for r in results],
        "metadata": to_jsonable(dict(metadata or {})),
        **({} if axes is None else {"axes": to_jsonable(dict(axes))}),
    }


def write_json_report(
    results: Sequence[GateResult],
    path: str | Path,
    *,
    verdict: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    axes: Mapping[str, Any] | None = None,
) -> Path:
    """Write the JSON report (``report_dict``) atomically; strict JSON, NaN written as null."""
    text = json.dumps(report_dict(results, verdict=verdict, metadata=metadata, axes=axes), indent=2,
                      allow_nan=False)
    return atomic_write_text(path, text + "\n")


# --------------------------------------------------------------------------------------------
# Markdown
# --------------------------------------------------------------------------------------------


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            return "-"
        if v.is_integer() and abs(v) < 1e15:
            return str(int(v))
        return f"{v:.4g}" if abs(v) < 1e6 else f"{v:,.0f}"
    return str(v).replace("|", "\\|").replace("\n", " ")


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """A GitHub-flavoured Markdown table of ``rows``.

    Columns: ``columns`` if given, else the union of the rows' keys in first-seen order; a row
    holding exactly alpaca_eval's win-rate columns is always printed in ``WIN_RATE_COLUMNS`` order.
    """
    rows = [to_jsonable(dict(r)) for r in rows]
    if not rows:
        return "_(no rows)_\n"
    if columns is None:
        cols: list[str] = []
        for r in rows:
            cols += [k for k in r if k not in cols]
        if set(WIN_RATE_COLUMNS) <= set(cols):
            cols = list(WIN_RATE_COLUMNS) + [c for c in cols if c not in WIN_RATE_COLUMNS]
    else:
        cols = list(columns)
    out = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    out += ["| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(out) + "\n"


def render_markdown(
    results: Sequence[GateResult], *, title: str = "Release gates", verdict: str | None = None
) -> str:
    """The human report: release verdict, a summary table, then each gate's reason, metrics
    (value, CI, n, unit, direction) and its own table. Win-rate tables use alpaca_eval's columns
    (``WIN_RATE_COLUMNS``).

    Raises:
        ValueError: empty ``results`` or a ``verdict`` that disagrees with ``release_verdict``.
    """
    results = list(results)
    verdict = _checked_verdict(results, verdict)
    lines = [f"# {title}", "", f"**Release verdict: {verdict.upper()}**", ""]
    lines.append(markdown_table([{"gate": r.name, "version": r.version, "verdict": r.verdict} for r in results]))
    for r in results:
        lines += [f"## {r.name} (v{r.version}): {r.verdict.upper()}", "", r.reason, ""]
        metric_rows = [
            {
                "metric": k,
                "value": m.value,
                "ci_low": m.ci_low,
                "ci_high": m.ci_high,
                "n": m.n,
                "unit": m.unit,
                "direction": m.direction,
            }
            for k, m in r.metrics.items()
        ]
        lines.append(markdown_table(metric_rows, ["metric", "value", "ci_low", "ci_high", "n", "unit", "direction"]))
        if r.table:
            lines.append(markdown_table(r.table))
    return "\n".join(lines)


def write_markdown_report(
    results: Sequence[GateResult], path: str | Path, *, title: str = "Release gates", verdict: str | None = None
) -> Path:
    """Write ``render_markdown`` atomically."""
    return atomic_write_text(path, render_markdown(results, title=title, verdict=verdict))


# --------------------------------------------------------------------------------------------
# JUnit XML
# --------------------------------------------------------------------------------------------


def render_junit_xml(results: Sequence[GateResult], *, suite_name: str = "release-gates",
                     started_at: datetime | None = None, seconds: float | None = None) -> str:
    """JUnit XML: one ``<testsuite>`` with one ``<testcase classname="gates" name=<gate>>`` per gate.

    A "block" gate carries ``<failure type="block" message=reason>``, an "inconclusive" one
    ``<failure type="inconclusive">`` (both block the release). Metrics go in ``<system-out>``
    as JSON.

    ``timestamp`` (the suite's start, ``started_at`` or now, UTC, ISO 8601 to the second without a zone, as the
    JUnit schema's ``xs:dateTime`` pattern for it has) and ``time`` (seconds: ``seconds``, the gate stage's wall
    time, or 0) are on ``<testsuites>`` and ``<testsuite>``; every ``<testcase>`` has ``time="0.000"``: the gates
    decide together on shared measurements, so the stage's time is not split among them. CI reporters that sum or
    parse them then read numbers, not NaN.
    """
    results = list(results)
    n_fail = sum(r.blocks_release for r in results)
    started = (started_at or datetime.now(timezone.utc)).astimezone(timezone.utc).replace(tzinfo=None)
    when = {"timestamp": started.isoformat(timespec="seconds"), "time": f"{max(seconds or 0.0, 0.0):.3f}"}
    suites = ET.Element("testsuites", name=suite_name, tests=str(len(results)), failures=str(n_fail), errors="0",
                        **when)
    suite = ET.SubElement(
        suites, "testsuite", name=suite_name, tests=str(len(results)), failures=str(n_fail), errors="0", skipped="0",
        **when,
    )
    for r in results:
        case = ET.SubElement(suite, "testcase", classname="gates", name=r.name, time="0.000")
        if r.blocks_release:
            fail = ET.SubElement(case, "failure", type=r.verdict, message=r.reason)
            fail.text = r.reason
        out = ET.SubElement(case, "system-out")
        out.text = json.dumps({k: m.to_dict() for k, m in r.metrics.items()}, allow_nan=False)
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def write_junit_xml(results: Sequence[GateResult], path: str | Path, *, suite_name: str = "release-gates",
                    started_at: datetime | None = None, seconds: float | None = None) -> Path:
    """Write ``render_junit_xml`` atomically."""
    return atomic_write_text(path, render_junit_xml(results, suite_name=suite_name, started_at=started_at,
                                                    seconds=seconds))


def write_reports(
    results: Iterable[GateResult],
    out_dir: str | Path,
    *,
    stem: str = "gates",
    metadata: Mapping[str, Any] | None = None,
    started_at: datetime | None = None,
    seconds: float | None = None,
    axes: Mapping[str, Any] | None = None,
) -> dict[str, Path]:
    """Write ``<stem>.md``, ``<stem>.junit.xml`` (``started_at`` and ``seconds`` as in :func:`render_junit_xml`)
    and, last, ``<stem>.json`` (with ``axes`` when given) into ``out_dir``.

    The JSON (the machine-readable verdict) is written last so its presence means all three
    reports are complete.

    Returns:
        {"markdown": path, "junit": path, "json": path}.
    """
    results = list(results)
    out_dir = Path(out_dir)
    md = write_markdown_report(results, out_dir / f"{stem}.md")
    xml = write_junit_xml(results, out_dir / f"{stem}.junit.xml", started_at=started_at, seconds=seconds)
    js = write_json_report(results, out_dir / f"{stem}.json", metadata=metadata, axes=axes)
    return {"markdown": md, "junit": xml, "json": js}


# --------------------------------------------------------------------------------------------
# contamination: per suite, whether any of its prompts was seen in training
# --------------------------------------------------------------------------------------------


def contamination_markdown(seen: Mapping[str, Mapping[str, Any]]) -> str:
    """A report section: one row per gate suite, "seen in training" yes / no / unknown with the why.

    Args:
        seen: ``data.decontamination.seen_in_training``'s output.
    """
    word = {True: "**yes**", False: "no", None: "unknown"}
    rows = [{"suite": s, "seen in training": word[v["seen"]], "why": v["why"]} for s, v in seen.items()]
    return (
        "## Seen in training (decontamination)\n\n"
        "Each training stage checks its prompts against every gate suite (normalised prompt hash and word 8-gram "
        "overlap, `data/decontamination.py`) and records the overlaps in its manifest; this is what they say.\n\n"
        + markdown_table(rows, ["suite", "seen in training", "why"])
        + "\n"
    )


# --------------------------------------------------------------------------------------------
# tracking: every gate metric as a number in the W&B run summary
# --------------------------------------------------------------------------------------------


def summary_metrics(results: Sequence[GateResult], *, prefix: str = "gates") -> dict[str, Any]:
    """Flat run-summary entries: ``<prefix>/<gate>/verdict`` (str) and, per metric, ``<prefix>/<gate>/<metric>``
    (its value as a float), plus ``.../<metric>/ci_low``, ``/ci_high`` and ``/n`` where they exist.

    A value that is not finite (not measurable) is left out rather than logged as NaN; the verdict and the
    report say why.
    """
    out: dict[str, Any] = {}
    for r in results:
        out[f"{prefix}/{r.name}/verdict"] = r.verdict
        for k, m in r.metrics.items():
            base = f"{prefix}/{r.name}/{k}"
            for suffix, v in (("", m.value), ("/ci_low", m.ci_low), ("/ci_high", m.ci_high), ("/n", m.n)):
                if v is not None and math.isfinite(float(v)):
                    out[base + suffix] = float(v) if suffix != "/n" else int(v)
    return out


# --------------------------------------------------------------------------------------------
# release approval: the decision, the waivers, the previous round's waivers
# --------------------------------------------------------------------------------------------

APPROVAL_HEADING = "## Release approval"


def approval_markdown(approval: Mapping[str, Any], previous: Sequence[Mapping[str, Any]] = (),
                      gate_verdicts: Mapping[str, str] | None = None) -> str:
    """The report's "Release approval" section from the flow's approval record (``flows.approval``): the decision,
    who made it and why, one row per gate that blocks (its own verdict kept, "waived" where a waiver covers it) and
    the previous round's waivers (``previous``: ``flows.approval.previous_waivers``), an expired one flagged.
    ``gate_verdicts``: gate -> its own verdict (``block`` / ``inconclusive``), shown as is; "blocks" where not given."""
    decision = approval.get("decision", "none")
    lines = [APPROVAL_HEADING, ""]
    if decision == "none":
        lines.append(f"- not required: the release follows the gates' verdict ({approval.get('release')})")
    elif decision == "bypassed":
        lines.append(f"- **BYPASSED** ({approval.get('bypass_source')}): {approval.get('bypass_reason')}; the release "
                     f"follows the gates' verdict ({approval.get('release')})")
    else:
        who = "" if approval.get("timed_out") else f" by {approval.get('approver')}"
        lines.append(f"- **{decision.upper()}**{who} at {approval.get('decided_at')}"
                     + (f": {approval['reason']}" if approval.get("reason") else ""))
    lines.append(f"- release: **{str(approval.get('release')).upper()}** (gates: {approval.get('gate_verdict')})")
    for r in approval.get("refused") or []:
        lines.append(f"- refused answer: {r}")
    waivers = {w["gate"]: w for w in approval.get("waivers") or []}
    rows = [{"gate": g, "gate verdict": (gate_verdicts or {}).get(g, "blocks"), "release": "waived" if g in waivers else "blocks",
             "waived by": waivers.get(g, {}).get("approver"), "expires": waivers.get(g, {}).get("expires"),
             "waiver reason": waivers.get(g, {}).get("reason")} for g in approval.get("blocking_gates") or []]
    if rows:
        lines += ["", markdown_table(rows, ["gate", "gate verdict", "release", "waived by", "expires", "waiver reason"])]
    if previous:
        lines += ["", "Waivers the previous round was released under (they do not carry over):", ""]
        lines.append(markdown_table(
            [{"round": w.get("round_id"), "gate": w.get("gate"), "waived by": w.get("approver"),
              "expires": w.get("expires"), "status": "**EXPIRED**" if w.get("expired") else "in force",
              "reason": w.get("reason")} for w in previous],
            ["round", "gate", "waived by", "expires", "status", "reason"]))
    return "\n".join(lines).rstrip() + "\n"


def with_approval_section(markdown: str, section: str) -> str:
    """``markdown`` with its "Release approval" section replaced by ``section`` (or added at the end); an empty
    ``section`` removes it. Idempotent: a report rewritten for a rerun of the round never holds an old decision."""
    head, sep, rest = markdown.partition("\n" + APPROVAL_HEADING + "\n")
    if sep:
        nxt = rest.find("\n## ")
        tail = rest[nxt + 1:] if nxt >= 0 else ""
        markdown = head.rstrip("\n") + "\n" + ("\n" + tail if tail else "")
    if not section:
        return markdown
    return markdown.rstrip("\n") + "\n\n" + section
