"""The rubric: the round's quality axes, each mapped to the gates that measure it (DESIGN.md principle 1: quality has
several axes and they are never averaged).

A rubric file (YAML; the default is the packaged ``gates/rubric.yaml``, ``GateStageConfig.rubric`` names another)
lists axes; each axis has a description, its gates (by the names ``gates.decide.decide`` gives them) with where their
thresholds live, optional two-sided ``directions``, a ``status`` and what it ``trades_against``. Start-up
(``gates.inputs.check_inputs``) refuses a rubric that leaves a gate of ``DECIDE_GATES`` unmapped, names a gate
``decide`` does not produce, or has an axis with no gate that is not declared ``status: not_measured``.

The report groups the gates by axis (:func:`group_by_axis`): an axis's verdict is "block" when any of its gates is
"block" or "inconclusive" (the rule of ``gates.result.release_verdict``, per axis), "pass" when all pass, and
"not_measured" for a declared axis without gates; never an average.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from . import capability, citations, consistency, drift, intent, judge, redteam, refusal, sycophancy, winrate
from .config import DEFAULT_RUBRIC_PATH
from .result import GateResult

#: The packaged default rubric (helpfulness, capability, honesty, safety both ways, consistency, style).
DEFAULT_RUBRIC = Path(DEFAULT_RUBRIC_PATH)

#: Every gate name ``gates.decide.decide`` can return, in its order (tests/test_gates_rubric.py runs decide() on
#: both of its branches and checks this list against what it returns).
DECIDE_GATES: tuple[str, ...] = (judge.GATE_NAME, winrate.GATE_NAME, intent.GATE_NAME, refusal.GATE_NAME,
                                 capability.GATE_NAME, sycophancy.GATE_NAME, drift.GATE_NAME, citations.GATE_NAME)

#: Gates a round runs only when its config turns them on (``gates.consistency.GATE_NAME``: the long-conversation
#: probes, and ``gates.canaries.GATE_NAME``: the canaries, both on by default; ``gates.redteam.GATE_NAME``: red-team
#: rotation, ``redteam_rotate``): a rubric may map them, and an axis whose optional gates did not run is not measured
#: that round.
OPTIONAL_GATES: tuple[str, ...] = (consistency.GATE_NAME, "canaries", redteam.GATE_NAME)


def round_gates(config: Any = None) -> tuple[str, ...]:
    """The gates a round with ``config`` (a ``GateStageConfig``) produces: :data:`DECIDE_GATES`, then the consistency
    gate when it is on, the canaries gate when its canaries are on, and the red-team rotation gate when
    ``redteam_rotate`` is on (None: every gate)."""
    consistency_on = config is None or bool(getattr(config, "consistency", False))
    canaries_on = config is None or (getattr(config, "canaries", False) and getattr(config, "canary_names", ()))
    rotation_on = config is None or getattr(config, "redteam_rotate", False)
    return (DECIDE_GATES + ((consistency.GATE_NAME,) if consistency_on else ())
            + (("canaries",) if canaries_on else ()) + ((redteam.GATE_NAME,) if rotation_on else ()))


STATUSES = ("measured", "not_measured")
AXIS_KEYS = {"description", "gates", "status", "trades_against"}
GATE_KEYS = {"gate", "thresholds", "directions"}
DIRECTION_KEYS = {"metric", "threshold", "description"}


@dataclass(frozen=True)
class Threshold:
    """Where one of a gate's thresholds lives.

    Fields:
        ref: a ``GateStageConfig`` field name, or ``gates.<module>:<NAME>`` (a rule's constant).
        stated: the value the rubric states for a config field ({field: value}); None when it only names the field.
    """

    ref: str
    stated: Any = None

    @property
    def is_config_field(self) -> bool:
        return ":" not in self.ref


@dataclass(frozen=True)
class Direction:
    """One side of a two-sided gate: the metric (a key of the gate's ``metrics``) and its threshold's config field."""

    name: str
    metric: str
    threshold: str | None
    description: str


@dataclass(frozen=True)
class GateRef:
    """A gate on an axis: its name, its thresholds and (two-sided gates) its directions."""

    gate: str
    thresholds: tuple[Threshold, ...] = ()
    directions: tuple[Direction, ...] = ()


@dataclass(frozen=True)
class Axis:
    """One quality axis: its gates (empty only when ``status`` is "not_measured")."""

    name: str
    description: str
    gates: tuple[GateRef, ...]
    status: str
    trades_against: str


@dataclass(frozen=True)
class Rubric:
    """A parsed rubric file: ``source`` (its path) and its axes in file order."""

    source: str
    axes: tuple[Axis, ...] = field(default_factory=tuple)

    def gate_names(self) -> set[str]:
        """Every gate name some axis maps."""
        return {g.gate for a in self.axes for g in a.gates}


def _err(source: str, key: str, reason: str) -> ValueError:
    return ValueError(f"rubric {source}: {key}: {reason}")


def _text(source: str, key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _err(source, key, f"must be non-empty text, got {value!r}")
    return value.strip()


def _unknown_keys(source: str, key: str, d: Mapping, allowed: set[str]) -> None:
    extra = sorted(set(d) - allowed)
    if extra:
        raise _err(source, key, f"unknown key(s) {extra}; allowed: {sorted(allowed)}")


def _threshold(source: str, key: str, item: Any) -> Threshold:
    if isinstance(item, str) and item.strip():
        return Threshold(item.strip())
    if isinstance(item, Mapping) and len(item) == 1:
        (ref, value), = item.items()
        if isinstance(ref, str) and ":" not in ref:
            return Threshold(ref, value)
    raise _err(source, key, f"a threshold is a GateStageConfig field name, gates.<module>:<NAME>, or one "
                            f"{{field: value}}; got {item!r}")


def _gate_ref(source: str, key: str, item: Any) -> GateRef:
    if not isinstance(item, Mapping) or "gate" not in item:
        raise _err(source, key, f"a gate entry is a mapping with a 'gate' key, got {item!r}")
    _unknown_keys(source, key, item, GATE_KEYS)
    name = _text(source, f"{key}.gate", item["gate"])
    raw_th = item.get("thresholds") or []
    if not isinstance(raw_th, list):
        raise _err(source, f"{key}.thresholds", f"must be a list, got {raw_th!r}")
    thresholds = tuple(_threshold(source, f"{key}.thresholds[{i}]", t) for i, t in enumerate(raw_th))
    raw_dir = item.get("directions") or {}
    if not isinstance(raw_dir, Mapping):
        raise _err(source, f"{key}.directions", f"must be a mapping side -> {{metric, threshold}}, got {raw_dir!r}")
    directions = []
    for side, d in raw_dir.items():
        dkey = f"{key}.directions.{side}"
        if not isinstance(d, Mapping) or "metric" not in d:
            raise _err(source, dkey, f"must be a mapping with a 'metric' key, got {d!r}")
        _unknown_keys(source, dkey, d, DIRECTION_KEYS)
        th = d.get("threshold")
        directions.append(Direction(str(side), _text(source, f"{dkey}.metric", d["metric"]),
                                    None if th is None else _text(source, f"{dkey}.threshold", th),
                                    str(d.get("description") or "").strip()))
    return GateRef(name, thresholds, tuple(directions))


def parse_rubric(data: Any, source: str) -> Rubric:
    """A rubric from its parsed YAML (``{version?, axes: {axis: {...}}}``); structural checks only.

    Raises:
        ValueError: one line, ``rubric <source>: <key>: <reason>``: not a mapping, no axes, an unknown key, an axis
            without ``gates``, empty ``gates`` without ``status: not_measured``, gates with ``status: not_measured``,
            a gate listed twice on an axis, missing text.
    """
    if not isinstance(data, Mapping) or not isinstance(data.get("axes"), Mapping) or not data["axes"]:
        raise _err(source, "axes", "the file must be a mapping with a non-empty 'axes' mapping (axis -> {...})")
    _unknown_keys(source, "(top level)", data, {"version", "axes"})
    axes = []
    for name, a in data["axes"].items():
        key = f"axes.{name}"
        if not isinstance(a, Mapping):
            raise _err(source, key, f"must be a mapping, got {a!r}")
        _unknown_keys(source, key, a, AXIS_KEYS)
        if "gates" not in a:
            raise _err(source, f"{key}.gates", "missing: list the axis's gates, or declare `gates: []` with "
                                               "`status: not_measured`")
        raw = a["gates"] if a["gates"] is not None else []
        if not isinstance(raw, list):
            raise _err(source, f"{key}.gates", f"must be a list, got {raw!r}")
        gates = tuple(_gate_ref(source, f"{key}.gates[{i}]", g) for i, g in enumerate(raw))
        status = a.get("status", "measured")
        if status not in STATUSES:
            raise _err(source, f"{key}.status", f"must be one of {list(STATUSES)}, got {status!r}")
        if not gates and status != "not_measured":
            raise _err(source, f"{key}.gates", "axis has no gate: map one, or declare `status: not_measured`")
        if gates and status == "not_measured":
            raise _err(source, f"{key}.status", f"not_measured, but the axis lists gates {[g.gate for g in gates]}")
        seen = [g.gate for g in gates]
        dup = sorted({g for g in seen if seen.count(g) > 1})
        if dup:
            raise _err(source, f"{key}.gates", f"gate(s) {dup} listed more than once")
        axes.append(Axis(str(name), _text(source, f"{key}.description", a.get("description")), gates, status,
                         _text(source, f"{key}.trades_against", a.get("trades_against"))))
    return Rubric(source, tuple(axes))


def load_rubric(path: str | Path = DEFAULT_RUBRIC) -> Rubric:
    """Read and parse a rubric file (structural checks; :func:`check_rubric` checks it against the gates).

    Raises:
        ValueError: no such file, not YAML (with the parser's line), or a structural error (``parse_rubric``).
    """
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"rubric {path}: no such file")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ValueError(f"rubric {path}: not YAML{where}: {problem}") from None
    return parse_rubric(data, str(path))


def resolve_threshold(ref: str, config: Any) -> Any:
    """The value behind a threshold reference: the config's field, or the ``gates.<module>:<NAME>`` constant (a
    dataclass class resolves to its default instance's fields).

    Raises:
        ValueError: an unknown config field, a module outside ``gates``, or a missing constant.
    """
    if ":" not in ref:
        if not any(f.name == ref for f in dataclasses.fields(config)):
            raise ValueError(f"{ref!r} is not a {type(config).__name__} field")
        return getattr(config, ref)
    module, _, name = ref.partition(":")
    if not module.startswith("gates."):
        raise ValueError(f"{ref!r}: only gates.<module>:<NAME> constants can be referenced")
    try:
        value = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        raise ValueError(f"{ref!r}: no such constant") from None
    if isinstance(value, type) and dataclasses.is_dataclass(value):
        return dataclasses.asdict(value())
    return value


def check_rubric(rubric: Rubric, gate_names: Iterable[str] | None = None, config: Any = None) -> None:
    """Check the rubric against the gates the round runs, before anything is generated.

    Args:
        rubric: a parsed rubric.
        gate_names: the gates the round produces (default :func:`round_gates` of ``config``); the rubric may also
            name an optional gate (:data:`OPTIONAL_GATES`) the round does not run.
        config: the round's ``GateStageConfig``; when given, every threshold reference must resolve and every
            stated value must equal the config's.

    Raises:
        ValueError: one line naming the file and the axis key or gate: a gate no axis maps, a gate the rubric
            names that the round does not produce, an unresolvable threshold, a stated value that differs.
    """
    known = list(round_gates(config) if gate_names is None else gate_names)
    for a in rubric.axes:
        for i, g in enumerate(a.gates):
            key = f"axes.{a.name}.gates[{i}]"
            if g.gate not in known and g.gate not in OPTIONAL_GATES:
                raise _err(rubric.source, f"{key}.gate", f"unknown gate {g.gate!r}; the round's gates are {known}")
            if config is None:
                continue
            for j, t in enumerate(g.thresholds):
                try:
                    value = resolve_threshold(t.ref, config)
                except ValueError as err:
                    raise _err(rubric.source, f"{key}.thresholds[{j}]", str(err)) from None
                if t.stated is not None and not _equal(t.stated, value):
                    raise _err(rubric.source, f"{key}.thresholds[{j}]",
                               f"states {t.ref} = {t.stated!r} but the config has {value!r}")
            for d in g.directions:
                if d.threshold is not None:
                    try:
                        resolve_threshold(d.threshold, config)
                    except ValueError as err:
                        raise _err(rubric.source, f"{key}.directions.{d.name}.threshold", str(err)) from None
    unmapped = [n for n in known if n not in rubric.gate_names()]
    if unmapped:
        raise _err(rubric.source, "axes", f"gate(s) {unmapped} are on no axis; map each to an axis")


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(float(a), float(b), rel_tol=0, abs_tol=1e-12)
    return a == b


def axis_verdict(verdicts: Sequence[str], status: str = "measured") -> str:
    """An axis's verdict from its gates' verdicts: "not_measured" (declared, no gate), "block" when any gate is
    "block" or "inconclusive", else "pass". Never an average.

    Raises:
        ValueError: a measured axis with no verdicts (a rubric ``check_rubric`` would have refused).
    """
    if status == "not_measured":
        return "not_measured"
    if not verdicts:
        raise ValueError("a measured axis needs at least one gate verdict")
    return "block" if any(v != "pass" for v in verdicts) else "pass"


def group_by_axis(results: Sequence[GateResult], rubric: Rubric, config: Any = None) -> dict[str, dict[str, Any]]:
    """The round's gates grouped by axis, JSON-ready, in the rubric's order.

    Returns:
        ``{axis: {verdict, status, description, trades_against, gates: [{gate, verdict, thresholds: {ref: value},
        directions: {side: {metric, value, ci_low, ci_high, threshold, threshold_value, description}}}]}}``;
        threshold values are read from ``config`` (None without one).

    Raises:
        ValueError: a result whose gate no axis maps, or an axis gate with no result (the round's gates and the
            rubric disagree; ``check_rubric`` at start-up should have caught it).
    """
    by_name = {r.name: r for r in results}
    unmapped = [r.name for r in results if r.name not in rubric.gate_names()]
    if unmapped:
        raise _err(rubric.source, "axes", f"gate(s) {unmapped} are on no axis; map each to an axis")
    out: dict[str, dict[str, Any]] = {}
    for a in rubric.axes:
        gates = []
        for g in a.gates:
            if g.gate not in by_name:
                if g.gate in OPTIONAL_GATES:  # turned off this round
                    continue
                raise _err(rubric.source, f"axes.{a.name}", f"gate {g.gate!r} has no result in this round")
            r = by_name[g.gate]
            value = (lambda ref: None if config is None else resolve_threshold(ref, config))
            directions = {}
            for d in g.directions:
                m = r.metrics.get(d.metric)
                directions[d.name] = {
                    "metric": d.metric,
                    "value": None if m is None else _finite(m.value),
                    "ci_low": None if m is None else _finite(m.ci_low),
                    "ci_high": None if m is None else _finite(m.ci_high),
                    "unit": None if m is None else m.unit,
                    "threshold": d.threshold,
                    "threshold_value": None if d.threshold is None else value(d.threshold),
                    "description": d.description,
                }
            gates.append({"gate": r.name, "verdict": r.verdict,
                          "thresholds": {t.ref: value(t.ref) for t in g.thresholds}, "directions": directions})
        out[a.name] = {
            "verdict": axis_verdict([g["verdict"] for g in gates], a.status if gates else "not_measured"),
            "status": a.status if gates or not a.gates else "not_measured",
            "description": a.description,
            "trades_against": a.trades_against,
            "gates": gates,
        }
    return out


def _finite(v: float | None) -> float | None:
    """``v`` as a float, None when missing or not finite (strict JSON; the gate's reason says why)."""
    return None if v is None or not math.isfinite(float(v)) else float(v)


def _num(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, Mapping):
        return ", ".join(f"{k} {_num(x)}" for k, x in v.items())
    return str(v)


def axes_markdown(axes: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The report's "Quality axes" section (lines): a summary table, then a section per axis with its verdict, its
    gates' verdicts and thresholds, the two sides of a two-sided gate, and what it trades against; an axis with no
    gate says it is not measured."""
    lines = ["## Quality axes (rubric)", "",
             "Each axis is decided on its own gates: it blocks when any of them blocks or is inconclusive; axes are "
             "never averaged.", "",
             "| axis | verdict | gates |", "|---|---|---|"]
    for name, a in axes.items():
        gates = ", ".join(f"{g['gate']} {g['verdict']}" for g in a["gates"]) or "none (not measured)"
        lines.append(f"| {name} | {a['verdict'].upper().replace('_', ' ')} | {gates} |")
    lines.append("")
    for name, a in axes.items():
        lines += [f"### {name}: {a['verdict'].upper().replace('_', ' ')}", "", a["description"], ""]
        if a["status"] == "not_measured":
            lines += [f"**Not measured**: no gate measures {name} in this round; its verdict does not enter the "
                      "release verdict.", ""]
        else:
            lines += ["| gate | verdict | thresholds |", "|---|---|---|"]
            for g in a["gates"]:
                th = "; ".join(f"{k} = {_num(v)}" for k, v in g["thresholds"].items()) or "-"
                lines.append(f"| {g['gate']} | {g['verdict']} | {th} |")
            lines.append("")
            for g in a["gates"]:
                for side, d in g["directions"].items():
                    ci = "" if d["ci_low"] is None else f" (CI {_num(d['ci_low'])} to {_num(d['ci_high'])})"
                    lines.append(f"- {side} ({g['gate']}): {d['description']}; {d['metric']} = {_num(d['value'])}"
                                 f"{ci} {d['unit'] or ''}, allowed up to {d['threshold']} = "
                                 f"{_num(d['threshold_value'])}")
            if any(g["directions"] for g in a["gates"]):
                lines.append("")
        lines += [f"Trades against: {a['trades_against']}", ""]
    return lines + [""]


def axes_summary(axes: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """Run-summary entries: ``axes/<axis>/verdict``."""
    return {f"axes/{name}/verdict": a["verdict"] for name, a in axes.items()}


def axes_table(axes: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per (axis, gate) for the trackers' and Prefect's tables: axis, axis verdict, gate, gate verdict,
    trades_against; a not-measured axis has one row with gate None."""
    rows = []
    for name, a in axes.items():
        for g in a["gates"] or [None]:
            rows.append({"axis": name, "axis_verdict": a["verdict"], "gate": None if g is None else g["gate"],
                         "gate_verdict": None if g is None else g["verdict"], "trades_against": a["trades_against"]})
    return rows
