"""A W&B Report per round, built with ``wandb-workspaces`` (``wandb_workspaces.reports.v2``) from the round manifest.

The report holds, top to bottom: the release verdict; the release approval when one was asked for (decision,
approver, reason, waivers with their expiry, expired waivers of earlier rounds); the verdict by gate (a table of gate, verdict and reason,
and the gate run's ``gates`` table); one section per gate (its verdict and reason, a scalar panel per metric the
gate run logged as ``gates/<gate>/<metric>``, and its ``gate_<gate>`` table); the generations table (prompt,
baseline and candidate answers, judge verdict); the stage runs of the round (a run set filtered on
``config.round_id``, with the training-loss curves and a run comparer of their configs); and the round's artifacts
(checkpoints and the gate report, with their lineage). Run sets filter on the config key ``round_id`` that every
stage run carries (``rlhf.tracking.setup_wandb``).

W&B online (``rlhf.tracking.wandb_mode``): the report is saved to the project and its URL written to
``<round_dir>/wandb_report.url``. Offline (the default) it cannot be: its specification, the report model's own
serialisation (``Report._to_model().model_dump_json(by_alias=True)``, what ``Report.save`` sends), is written to
``<round_dir>/wandb_report.json``; ``rlhf wandb-report publish <round_dir>`` saves it later, once the offline runs
are synced (``wandb sync <round_dir>/*/wandb/offline-run-*``) and ``WANDB_API_KEY`` is set (never written to a
file here).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

SPEC_FILE = "wandb_report.json"
URL_FILE = "wandb_report.url"
#: the stages whose checkpoints (``outputs.<key>`` with ``<key>_hash``) are W&B artifacts (rlhf/trainer_stage.py)
CHECKPOINT_KEYS = ("checkpoint", "pi_ref")
#: identifying columns of the gate table, not metrics (the per-gate panels chart the others)
_NOT_METRICS = ("gate", "verdict", "reason")


def gate_metrics(gates_manifest: dict) -> dict[str, list[str]]:
    """Per gate, the names of the metrics it measured (the gate stage manifest's ``metrics.<gate>.metrics``), in
    the order recorded; the gate run logs each as ``gates/<gate>/<metric>`` (``gates.report.summary_metrics``)."""
    return {name: list((entry.get("metrics") or {}))
            for name, entry in (gates_manifest.get("metrics") or {}).items()
            if isinstance(entry, dict) and "verdict" in entry}


def round_artifacts(round_manifest: dict) -> list[str]:
    """The W&B artifact names a round logged: ``<stage>-<key>`` for each checkpoint a stage recorded with its hash,
    and ``gates-report``."""
    names = []
    for stage, entry in (round_manifest.get("stages") or {}).items():
        outputs = entry.get("outputs") or {}
        names += [f"{stage}-{k}" for k in CHECKPOINT_KEYS if outputs.get(k) and outputs.get(f"{k}_hash")]
    if "gates" in (round_manifest.get("stages") or {}):
        names.append("gates-report")
    return names


def build_report(round_manifest: dict, *, gate_metric_names: dict[str, list[str]] | None = None,
                 entity: str = "", project: str | None = None):
    """The round's ``wandb_workspaces.reports.v2.Report``.

    Args:
        round_manifest: ``round.json``'s content: ``round_id``, ``verdict``, ``preset``, ``candidate``, ``stages``
            (``stages.gates.outputs`` with ``gate_table`` rows of gate, verdict, reason and ``gate_tables``).
        gate_metric_names: :func:`gate_metrics` of the gate stage manifest (None: per gate, the numeric columns of
            its ``gate_table`` row).
        entity: W&B entity ("" offline: filled in when published).
        project: W&B project (default ``$WANDB_PROJECT`` or ``rlhf-flywheel``).

    Raises:
        KeyError: the manifest has no ``round_id`` or no gates stage.
    """
    import wandb_workspaces.reports.v2 as wr

    from rlhf.tracking import DEFAULT_PROJECT, run_display_name

    project = project or os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT
    round_id = round_manifest["round_id"]
    gates = round_manifest["stages"]["gates"]["outputs"]
    rows = gates.get("gate_table") or []
    verdict = str(round_manifest.get("verdict", gates.get("verdict", ""))).upper()
    if gate_metric_names is None:
        gate_metric_names = {r["gate"]: [k for k, v in r.items() if k not in _NOT_METRICS
                                         and isinstance(v, (int, float)) and not isinstance(v, bool)]
                             for r in rows}

    def runset(name: str, stage: str | None = None):
        query = f"Config('round_id') == '{round_id}'" + (f" and Config('stage') == '{stage}'" if stage else "")
        return wr.Runset(entity=entity, project=project, name=name, filters=query)

    def cell(value: Any) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    gate_lines = ["| gate | verdict | reason |", "|---|---|---|"]
    gate_lines += [f"| {cell(r.get('gate'))} | {cell(r.get('verdict'))} | {cell(r.get('reason', ''))} |" for r in rows]
    blocks: list = [
        wr.H1(f"Round {round_id}: {verdict}"),
        wr.P(f"Preset {round_manifest.get('preset')}; candidate {round_manifest.get('candidate')}; "
             f"PPO unlocked: {(round_manifest.get('ppo_unlock') or {}).get('unlocked')}. "
             f"Every gate decides on its own numbers; one block or inconclusive blocks the release."),
        *_approval_blocks(wr, round_manifest.get("approval"), cell),
        wr.H2("Verdict by gate"),
        wr.MarkdownBlock("\n".join(gate_lines)),
        wr.PanelGrid(runsets=[runset("gates run", "gates")],
                     panels=[wr.WeavePanelSummaryTable(table_name="gates"),
                             wr.WeavePanelSummaryTable(table_name="judge")]),
        wr.H2("Gates"),
    ]
    for r in rows:
        gate = r.get("gate")
        metrics = gate_metric_names.get(gate, [])
        panels = [wr.ScalarChart(title=f"{gate}: {k}", metric=f"gates/{gate}/{k}") for k in metrics]
        if (gates.get("gate_tables") or {}).get(gate):
            panels.append(wr.WeavePanelSummaryTable(table_name=f"gate_{gate}"))
        blocks += [wr.H3(f"{gate}: {r.get('verdict')}"), wr.P(str(r.get("reason", "")))]
        if panels:
            blocks.append(wr.PanelGrid(runsets=[runset(f"{gate}", "gates")], panels=panels))
    blocks += [
        wr.H2("Generations"),
        wr.P("Prompt, baseline answer, candidate answer and the judge's verdict (win-rate suite)."),
        wr.PanelGrid(runsets=[runset("gates run", "gates")],
                     panels=[wr.WeavePanelSummaryTable(table_name="generations")]),
        wr.H2("Stage runs"),
        wr.UnorderedList([run_display_name(stage, round_id) for stage in round_manifest.get("stages") or {}]),
        wr.PanelGrid(runsets=[runset(f"round {round_id}")],
                     panels=[wr.LinePlot(title="training loss", x="train/global_step", y=["train/loss"]),
                             wr.RunComparer(diff_only="split")]),
        wr.H2("Artifacts"),
        wr.UnorderedList([f"{name}:{round_id}" for name in round_artifacts(round_manifest)]),
    ]
    blocks += [wr.WeaveBlockArtifact(entity=entity, project=project, artifact=name, tab="lineage")
               for name in round_artifacts(round_manifest)]
    return wr.Report(project=project, entity=entity, title=f"Round {round_id}: {verdict}",
                     description=f"Release gates, stage runs and artifacts of round {round_id}", blocks=blocks)


def _approval_blocks(wr, approval: dict | None, cell) -> list:
    """The "Release approval" section: the decision, who made it and why, each waiver (gate, approver, expiry,
    reason) and earlier rounds' waivers that have expired; nothing when the round asked for no approval and
    carried no earlier waiver (``approval`` as :func:`flows.approval.release_approval` returns it, plus
    ``previous_waivers``)."""
    previous = (approval or {}).get("previous_waivers") or []
    if not approval or (approval.get("mode") == "none" and not previous):
        return []
    who = approval.get("approver") or "nobody"
    why = approval.get("reason") or approval.get("bypass_reason") or ""
    lines = [f"Decision **{approval.get('decision')}** by {who}; release **{str(approval.get('release')).upper()}** "
             f"(gates: {approval.get('gate_verdict')})" + (f"; reason: {why}" if why else "")
             + ("; timed out: no decision counts as rejected" if approval.get("timed_out") else "") + "."]
    waivers = approval.get("waivers") or []
    if waivers:
        lines += ["", "| waived gate | approver | expires | reason |", "|---|---|---|---|"]
        lines += [f"| {cell(w.get('gate'))} | {cell(w.get('approver'))} | {cell(w.get('expires'))} | "
                  f"{cell(w.get('reason'))} |" for w in waivers]
    expired = [w for w in previous if w.get("expired")]
    if expired:
        lines += ["", "Expired waivers of earlier rounds: " + "; ".join(
            f"{cell(w.get('gate'))} (round {cell(w.get('round_id'))}, expired {cell(w.get('expires'))})"
            for w in expired)]
    return [wr.H2("Release approval"), wr.MarkdownBlock("\n".join(lines))]


def report_spec(report) -> str:
    """The report's specification: its model as ``Report.save`` serialises it (JSON, aliases, no nulls)."""
    return report._to_model().model_dump_json(by_alias=True, exclude_none=True, indent=2)


def load_report(spec_path: str | os.PathLike):
    """The ``Report`` of a specification file written by :func:`write_round_report`.

    Raises:
        FileNotFoundError; pydantic.ValidationError: not a report specification (names the field).
    """
    import wandb_workspaces.reports.v2 as wr
    from wandb_workspaces.reports.v2 import internal

    return wr.Report._from_model(internal.ReportViewspec.model_validate_json(Path(spec_path).read_text()))


def _gate_metrics_of(round_manifest: dict) -> dict[str, list[str]] | None:
    """:func:`gate_metrics` of the round's gate stage manifest (None when it is not there)."""
    path = Path(round_manifest["stages"]["gates"]["output_dir"]) / "manifest.json"
    return gate_metrics(json.loads(path.read_text())) if path.is_file() else None


def write_round_report(round_dir: str | os.PathLike, round_manifest: dict | None = None) -> Path:
    """Build the round's report; save it when W&B is online (URL in ``wandb_report.url``), and write its
    specification to ``<round_dir>/wandb_report.json`` either way. Returns the specification's path.

    ``round_manifest``: ``round.json``'s content (default: read from ``round_dir``)."""
    from rlhf.manifest import atomic_write_text
    from rlhf.tracking import wandb_mode

    round_dir = Path(round_dir)
    if round_manifest is None:
        round_manifest = json.loads((round_dir / "round.json").read_text())
    mode = wandb_mode()
    online = mode == "online"
    entity = _entity() if online else os.environ.get("WANDB_ENTITY", "")
    report = build_report(round_manifest, gate_metric_names=_gate_metrics_of(round_manifest), entity=entity)
    if online:
        report.save()
        atomic_write_text(round_dir / URL_FILE, report.url + "\n")
        logger.info("W&B report saved: %s", report.url)
    path = round_dir / SPEC_FILE
    atomic_write_text(path, report_spec(report) + "\n")
    if not online:
        logger.info("W&B %s: report specification %s (publish: rlhf wandb-report publish %s)", mode, path, round_dir)
    return path


def _entity() -> str:
    """``$WANDB_ENTITY``, else the API key's default entity (online only)."""
    if os.environ.get("WANDB_ENTITY"):
        return os.environ["WANDB_ENTITY"]
    import wandb

    return wandb.Api().default_entity or ""


def publish(round_dir: str | os.PathLike) -> str:
    """Save the report specification of ``round_dir`` (``wandb_report.json``) to W&B; returns its URL (also written
    to ``wandb_report.url``). The entity, empty in a specification written offline, is ``$WANDB_ENTITY`` or the API
    key's default one.

    Raises:
        FileNotFoundError: no specification in ``round_dir``. RuntimeError: W&B is not online (no
        ``WANDB_API_KEY``, or ``WANDB_MODE`` offline/disabled).
    """
    from rlhf.manifest import atomic_write_text
    from rlhf.tracking import wandb_mode

    round_dir = Path(round_dir)
    spec = round_dir / SPEC_FILE
    if not spec.is_file():
        raise FileNotFoundError(f"{spec}: no W&B report specification (written by the round's publish step)")
    if wandb_mode() != "online":
        raise RuntimeError("W&B is not online: set WANDB_API_KEY (and not WANDB_MODE=offline) to publish the report")
    report = load_report(spec)
    if not report.entity:
        entity = _entity()
        report.entity = entity
        for block in report.blocks:
            for rs in getattr(block, "runsets", None) or []:
                rs.entity = rs.entity or entity
            if hasattr(block, "artifact") and hasattr(block, "entity") and not block.entity:
                block.entity = entity
    report.save()
    atomic_write_text(round_dir / URL_FILE, report.url + "\n")
    return report.url
