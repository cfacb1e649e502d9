"""What every release gate returns, and how gate verdicts combine into a release verdict.

A gate is a pure function from generations + judgments to a :class:`GateResult`. The result keeps
each quality axis as its own :class:`Metric` (DESIGN.md principle 1: axes are never averaged) and
says in ``reason`` whether a block rests on evidence (the interval excludes the bar) or could be
noise (only the point estimate crosses it).

``release_verdict`` combines gates: one "block" or one "inconclusive" blocks the release
(DESIGN.md principle 5 and the judge-agreement row of "Release gates"); nothing is averaged.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from rlhf.serialization import to_jsonable  # noqa: F401  (re-exported: gates.report uses it)

Verdict = Literal["pass", "block", "inconclusive"]
ReleaseVerdict = Literal["pass", "block"]
Direction = Literal["higher_is_better", "lower_is_better"]

VERDICTS: tuple[str, ...] = ("pass", "block", "inconclusive")


class Metric(BaseModel):
    """One measured quantity of a gate.

    Fields:
        value: the point estimate, in ``unit``; NaN when it could not be measured (e.g. n == 0).
        ci_low, ci_high: bounds of its confidence interval in the same unit (``None`` when the
            quantity has no sampling error, e.g. a configured constant or a hand-given rate).
        n: number of items behind the estimate (``None`` for derived quantities).
        direction: "higher_is_better" or "lower_is_better".
        unit: e.g. "percent", "fraction", "points", "turns/day".

    Raises:
        pydantic.ValidationError: ci_low > ci_high, n < 0, or an unknown direction.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    value: float
    ci_low: float | None = None
    ci_high: float | None = None
    n: int | None = None
    direction: Direction
    unit: str

    @field_validator("n")
    @classmethod
    def _n_non_negative(cls, v: int | None) -> int | None:
        if v is not None and v < 0:
            raise ValueError(f"n must be >= 0, got {v}")
        return v

    @model_validator(mode="after")
    def _ci_ordered(self) -> "Metric":
        lo, hi = self.ci_low, self.ci_high
        if lo is not None and hi is not None and math.isfinite(lo) and math.isfinite(hi) and lo > hi:
            raise ValueError(f"ci_low {lo} > ci_high {hi}")
        return self

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (NaN -> None). A value that is not finite is null with a ``null_reason`` (strict JSON
        has no NaN; a reader must not take null for zero)."""
        d = to_jsonable(self.model_dump())
        if not math.isfinite(self.value):
            d["null_reason"] = (f"not measurable on n = {self.n} items" if self.n == 0 else
                                "not measurable: undefined for these inputs (the gate's reason says why)")
        return d


class Finding(BaseModel):
    """One fact a gate's rule established, as numbers: what its reason's sentences are rendered from
    (``gates.wording``). Tests assert findings, not wording.

    Fields:
        code: what was found, e.g. ``"below_bar"``, ``"too_little_evidence"``, ``"judge_cannot_decide"``.
        values: the numbers (and names) behind it.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    code: str
    values: dict[str, Any] = {}


class GateResult(BaseModel):
    """The outcome of one release gate.

    Fields:
        name: gate name, e.g. "refusal_two_sided".
        version: version of the gate's rule (bump when the rule or its defaults change).
        verdict: "pass", "block" or "inconclusive" (the gate could not decide, e.g. judge
            agreement below its floor or no items; ``release_verdict`` treats it as a block).
        metrics: name -> :class:`Metric`; each axis separately, never an average.
        reason: one or more sentences; for a block it says whether the block rests on evidence
            (interval beyond the threshold) or could be noise (only the point estimate is).
        table: rows (dicts with the same keys) for the report, e.g. alpaca_eval's win-rate row.
        findings: what the rule found, as numbers (:class:`Finding`); ``reason`` is rendered from them by
            ``gates.wording`` for the gates built that way. Not part of ``to_dict`` (the report's fields stay).

    Raises:
        pydantic.ValidationError: verdict not in ``VERDICTS``, empty name, or a table row that is
            not a dict.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    version: str
    verdict: Verdict
    metrics: dict[str, Metric]
    reason: str
    table: list[dict[str, Any]] = []
    findings: list[Finding] = []

    def finding(self, code: str) -> Finding | None:
        """The first finding with this code, or None."""
        return next((f for f in self.findings if f.code == code), None)

    @field_validator("name")
    @classmethod
    def _name_non_empty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("gate name must be non-empty")
        return v

    @property
    def blocks_release(self) -> bool:
        """True when this gate's verdict blocks a release ("block" or "inconclusive")."""
        return self.verdict != "pass"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: plain types only, NaN/inf -> None, numpy scalars -> Python numbers."""
        return {
            "name": self.name,
            "version": self.version,
            "verdict": self.verdict,
            "metrics": {k: m.to_dict() for k, m in self.metrics.items()},
            "reason": self.reason,
            "table": to_jsonable(self.table),
        }


def release_verdict(results: Iterable[GateResult]) -> ReleaseVerdict:
    """Combine gate verdicts into the release verdict.

    "block" if any gate is "block" or "inconclusive", else "pass". Verdicts are never averaged or
    traded off against each other (DESIGN.md principles 1 and 5; an inconclusive judge-agreement
    gate blocks the release per the "Release gates" table).

    Args:
        results: the round's ``GateResult`` objects.

    Returns:
        "pass" or "block".

    Raises:
        ValueError: ``results`` is empty (a release with no gates run is a configuration error,
            not a pass).
        TypeError: an element is not a ``GateResult``.
    """
    results = list(results)
    if not results:
        raise ValueError("release_verdict needs at least one GateResult; no gates were run")
    for r in results:
        if not isinstance(r, GateResult):
            raise TypeError(f"expected GateResult, got {type(r).__name__}")
    return "block" if any(r.blocks_release for r in results) else "pass"
