"""GateResult / Metric / release_verdict (gates/result.py)."""

import json
import math

import numpy as np
import pytest
from pydantic import ValidationError

from gates.result import GateResult, Metric, release_verdict


def _gate(name: str, verdict: str, value: float = 1.0) -> GateResult:
    return GateResult(
        name=name,
        version="1",
        verdict=verdict,
        metrics={"m": Metric(value=value, ci_low=value - 0.5, ci_high=value + 0.5, n=10,
                             direction="higher_is_better", unit="percent")},
        reason=f"{verdict} for the test",
        table=[{"a": np.int64(3), "b": np.float64(0.25), "c": float("nan")}],
    )


def test_release_verdict_blocks_on_any_block_or_inconclusive_and_never_averages():
    assert release_verdict([_gate("a", "pass"), _gate("b", "pass")]) == "pass"
    # five strong passes do not outvote one block
    many = [_gate(f"p{i}", "pass", value=99.0) for i in range(5)]
    assert release_verdict(many + [_gate("x", "block", value=49.9)]) == "block"
    assert release_verdict(many + [_gate("j", "inconclusive")]) == "block"


def test_release_verdict_rejects_empty_and_foreign_objects():
    with pytest.raises(ValueError, match="at least one"):
        release_verdict([])
    with pytest.raises(TypeError):
        release_verdict([{"verdict": "pass"}])


def test_verdict_and_metric_validation():
    with pytest.raises(ValidationError):
        _gate("a", "maybe")
    with pytest.raises(ValidationError):
        Metric(value=1.0, ci_low=2.0, ci_high=1.0, direction="higher_is_better", unit="x")
    with pytest.raises(ValidationError):
        Metric(value=1.0, n=-1, direction="higher_is_better", unit="x")
    with pytest.raises(ValidationError):
        Metric(value=1.0, direction="up", unit="x")
    with pytest.raises(ValidationError):
        _gate(" ", "pass")


def test_gate_result_is_frozen():
    g = _gate("a", "pass")
    with pytest.raises(ValidationError):
        g.verdict = "block"


def test_to_dict_is_strict_json_with_plain_types():
    g = GateResult(
        name="g", version="2", verdict="block",
        metrics={"m": Metric(value=float("nan"), n=0, direction="lower_is_better", unit="percent")},
        reason="no data", table=[{"a": np.int64(3), "b": np.float64(0.25), "c": float("nan")}],
    )
    d = g.to_dict()
    text = json.dumps(d, allow_nan=False)  # raises if a NaN survived
    back = json.loads(text)
    assert back["metrics"]["m"] == {"value": None, "ci_low": None, "ci_high": None, "n": 0,
                                    "direction": "lower_is_better", "unit": "percent",
                                    "null_reason": "not measurable on n = 0 items"}  # null with a reason
    assert back["table"] == [{"a": 3, "b": 0.25, "c": None}]
    assert type(d["table"][0]["a"]) is int and type(d["table"][0]["b"]) is float
    assert back["verdict"] == "block" and back["name"] == "g" and back["version"] == "2"
    assert not math.isnan(_gate("a", "pass").to_dict()["metrics"]["m"]["value"])
