"""The corrected judge-decision mode (gates.winrate_corrected, ``judge_decision: corrected``): the win rate corrected
for the judge's attenuation, Fieller's interval carrying both sampling errors, the n that would decide it, and the
gates deciding on it where the 0.85 floor cannot. Expected values are worked by hand in the comments
(z = 1.959964, z^2 = 3.841459)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from gates.config import GateStageConfig
from gates.decide import decide
from gates.intent import intent_matrix_gate
from gates.judge import judge_agreement_gate, judge_decides
from gates.render import judge_decision_line
from gates.winrate import win_rate_gate
from gates.winrate_corrected import HARD_MIN_AGREEMENT, corrected_win_rate, corrected_win_rate_point
from judging.agreement import judge_agreement
from judging.intervals import fieller_ratio
from test_gates_decide import healthy


def _agreement(k: int, n: int):
    """A judge that agrees with k of n decisive expert labels (item-level)."""
    return judge_agreement(np.r_[np.ones(k, dtype=int), np.full(n - k, 2)], np.ones(n, dtype=int))


def _round(wins: int, n: int, agreement):
    """The healthy round with n equal-length win-rate items, ``wins`` of them won by the candidate."""
    prefs = np.r_[np.full(wins, 2.0), np.full(n - wins, 1.0)]
    return replace(healthy(), preferences=prefs, len_candidate=np.full(n, 50), len_baseline=np.full(n, 50),
                   intents=["advice"] * n, judge=agreement)


def test_corrected_point_inverts_the_attenuation():
    # a = 0.71: 2a-1 = 0.42; a measured 51.68% = 50 + 4 * 0.42 is a true 54%
    assert corrected_win_rate_point(51.68, 0.71) == pytest.approx(54.0)
    assert corrected_win_rate_point(52.8, 0.85) == pytest.approx(54.0)  # DESIGN.md seed: 2.8 / 0.7 = 4 points
    assert corrected_win_rate_point(45.8, 0.71) == pytest.approx(40.0)  # -4.2 / 0.42 = -10 points
    assert corrected_win_rate_point(53.0, 1.0) == 53.0
    for bad in (0.5, 0.3, 1.2):
        with pytest.raises(ValueError, match="agreement a"):
            corrected_win_rate_point(52.0, bad)


def test_fieller_interval_hand_worked():
    # se_den = 0: (num -/+ z se_num) / den = 2 -/+ 1.959964
    assert fieller_ratio(2.0, 1.0, 1.0, 0.0) == pytest.approx((0.040036, 3.959964), abs=1e-6)
    # se_den = 0.1: A = 1 - z^2 0.01 = 0.961585; sqrt(z^2 (4 * 0.01 + 1 * A)) = 1.961516; (2 -/+ 1.961516) / A
    assert fieller_ratio(2.0, 1.0, 1.0, 0.1) == pytest.approx((0.040020, 4.119777), abs=1e-6)
    # a denominator not shown non-zero (0.1 with SE 0.1): no bounded interval
    assert fieller_ratio(2.0, 1.0, 0.1, 0.1) == (-math.inf, math.inf)
    assert all(math.isnan(x) for x in fieller_ratio(math.nan, 1.0, 1.0, 0.1))
    with pytest.raises(ValueError, match="standard errors"):
        fieller_ratio(2.0, -1.0, 1.0, 0.1)


def test_interval_widens_with_fewer_expert_labels():
    # w = 51.68%, SE 1.0 point on 1000 items, a = 0.71. With a known exactly (10^9 labels) the interval is
    # 50 + (1.68 -/+ 1.959964) / 0.42 = 49.3334 to 58.6666 (width 9.3332).
    known = corrected_win_rate(51.68, 1.0, 1000, 0.71, 1e9)
    assert (known.ci_low, known.ci_high) == pytest.approx((49.333419, 58.666581), abs=1e-4)
    widths = [known.ci_high - known.ci_low]
    for labels in (1000, 500, 100, 30):
        r = corrected_win_rate(51.68, 1.0, 1000, 0.71, labels)
        assert r.agreement_se == pytest.approx(math.sqrt(0.71 * 0.29 / labels))
        assert r.ci_low <= 54.0 <= r.ci_high
        widths.append(r.ci_high - r.ci_low)
    assert widths == sorted(widths) and widths[-1] > widths[0] + 2  # 30 labels: more than 2 points wider
    assert widths[1:4] == pytest.approx([9.480978, 9.634239, 11.099107], abs=1e-5)
    # 10 labels: f = 0.42 is not shown > 0 (A = 0.1764 - z^2 * 4 * 0.2059 / 10 < 0): no bounded interval, no n decides
    r = corrected_win_rate(51.68, 1.0, 1000, 0.71, 10)
    assert r.side == "unbounded" and (r.ci_low, r.ci_high) == (0.0, 100.0) and r.items_needed is None
    assert r.labels_needed is None  # at SE 1.0 the measured gap 1.68 < z * 1.0: labels alone cannot decide it
    # at SE 0.5 (1.68^2 > z^2 0.25) the labels are what is short: f shown > 0 needs n > z^2 4 (0.71)(0.29) / 0.42^2
    # = 17.94 -> 18 labels
    assert corrected_win_rate(51.68, 0.5, 1000, 0.71, 10).labels_needed == 18
    assert corrected_win_rate(51.68, 0.5, 1000, 0.71, 18).side == "above"


def test_items_needed_formula():
    # bar 50 (rho0 = 0): n > z^2 s^2 / g^2 with s^2 = 1.0^2 * 1000, g = 1.68: 3841.459 / 2.8224 = 1361.06 -> 1362
    r = corrected_win_rate(51.68, 1.0, 1000, 0.71, 500)
    assert r.side == "straddles" and r.items_needed == 1362 and r.labels_needed is None
    # the same per-item variance at 1362 items decides, at 1361 it does not
    at = lambda n: corrected_win_rate(51.68, math.sqrt(1000 / n), n, 0.71, 500).side  # noqa: E731
    assert (at(1361), at(1362)) == ("straddles", "above")
    # bar 51 (rho0 = 1): n > z^2 s^2 / ((g - f)^2 - z^2 se_f^2), se_f^2 = 4 * 0.71 * 0.29 / 500 = 0.0016472:
    # 3841.459 / (1.5876 - 0.0063277) = 2429.35 -> 2430
    assert corrected_win_rate(51.68, 1.0, 1000, 0.71, 500, bar=51).items_needed == 2430
    # bar 53 (rho0 = 3), SE 0.1, 100 labels (se_f^2 = 0.008236): (g - 3 f)^2 = 0.1764 < z^2 * 9 * 0.008236 = 0.2847,
    # so the agreement's uncertainty alone keeps 53 inside: no number of items decides it. Labels needed:
    # n > z^2 * 9 * 4 * 0.71 * 0.29 / (0.1764 - z^2 * 0.1^2) = 206.36 -> 207, and 207 labels do decide it
    r = corrected_win_rate(51.68, 0.1, 1000, 0.71, 100, bar=53)
    assert (r.side, r.items_needed, r.labels_needed) == ("straddles", None, 207)
    assert corrected_win_rate(51.68, 0.1, 1000, 0.71, 206, bar=53).side == "straddles"
    assert corrected_win_rate(51.68, 0.1, 1000, 0.71, 207, bar=53).side == "above"


def test_corrected_mode_decides_where_the_floor_cannot():
    # a = 0.71 on 500 labels: Wilson 0.669-0.748, wholly below 0.85
    judge = _agreement(355, 500)
    # 1100 of 2000 won: w = 55%, SE sqrt(0.55 * 0.45 / 1999) = 1.112708 points
    m = _round(1100, 2000, judge)
    floor = {r.name: r for r in decide(m, GateStageConfig())}
    assert floor["judge_agreement"].verdict == "block"
    assert floor["length_controlled_win_rate"].verdict == "inconclusive"
    assert floor["intent_matrix"].verdict == "inconclusive"
    assert floor["judge_agreement"].table[0]["judge_decision"] == "floor"

    got = {r.name: r for r in decide(m, GateStageConfig(judge_decision="corrected"))}
    j = got["judge_agreement"]
    assert j.verdict == "pass" and j.finding("usable").values["interval_above_hard_min"] is True
    assert j.table[0]["judge_decision"] == "corrected" and j.reason.startswith("Decision mode: corrected")
    wr = got["length_controlled_win_rate"]
    # corrected 50 + 5 / 0.42 = 61.9048; Fieller: 56.5654-68.1300
    assert wr.verdict == "pass" and wr.findings[0].code == "judge_decision"
    c = wr.metrics["corrected_win_rate"]
    assert (c.value, c.ci_low, c.ci_high, c.n) == pytest.approx((61.904762, 56.565408, 68.129964, 2000), abs=1e-4)
    assert wr.finding("corrected_win_rate").values["measured_se"] == pytest.approx(1.1127080)
    assert "Decision mode: corrected" in wr.reason and "Passed on evidence" in wr.reason
    assert got["intent_matrix"].verdict == "pass" and got["intent_matrix"].findings[0].code == "judge_decision"

    # 900 of 2000: corrected 38.0952, interval 31.8700-43.4346: blocked on evidence
    lost = {r.name: r for r in decide(_round(900, 2000, judge), GateStageConfig(judge_decision="corrected"))}
    assert lost["length_controlled_win_rate"].verdict == "block"
    assert lost["length_controlled_win_rate"].metrics["corrected_win_rate"].ci_high == pytest.approx(43.434592,
                                                                                                     abs=1e-4)
    assert lost["length_controlled_win_rate"].finding("corrected_below_bar") is not None
    assert lost["intent_matrix"].verdict == "block"


def test_corrected_mode_reports_the_items_that_would_decide():
    # 1020 of 2000: w = 51%, SE 1.118090; n > z^2 (1.118090^2 * 2000) / 1^2 = 9604.6 -> 9605 items
    got = {r.name: r for r in decide(_round(1020, 2000, _agreement(355, 500)),
                                     GateStageConfig(judge_decision="corrected"))}
    wr = got["length_controlled_win_rate"]
    assert wr.verdict == "inconclusive"
    assert wr.finding("corrected_straddles_bar").values["items_needed"] == 9605
    assert wr.metrics["items_needed"].value == 9605 and "about 9605 items" in wr.reason


def test_no_decision_at_or_below_the_hard_minimum_in_either_mode():
    assert HARD_MIN_AGREEMENT == 0.6
    # a = 0.60 on 500: Wilson 0.556-0.642. With a floor of 0.55 the floor-mode judge gate passes, but the hard
    # minimum still keeps the win rates from deciding; in corrected mode the judge gate is inconclusive.
    weak = _round(1100, 2000, _agreement(300, 500))
    floor = {r.name: r for r in decide(weak, GateStageConfig(judge_floor=0.55))}
    assert floor["judge_agreement"].verdict == "pass"
    for mode, got in (("floor", floor), ("corrected", {r.name: r for r in decide(
            weak, GateStageConfig(judge_decision="corrected"))})):
        for name in ("length_controlled_win_rate", "intent_matrix"):
            f = got[name].findings[0]
            assert got[name].verdict == "inconclusive" and f.code == "judge_cannot_decide", (mode, name)
            assert f.values["hard_min"] == 0.6 and "hard minimum 0.6" in got[name].reason
    corrected_judge = judge_agreement_gate(_agreement(300, 500), decision="corrected")
    assert corrected_judge.verdict == "inconclusive" and corrected_judge.finding("at_or_below_hard_minimum")
    # a = 0.55 on 2000: Wilson 0.528-0.572, wholly at or below 0.6: the corrected-mode judge gate blocks
    assert judge_agreement_gate(_agreement(1100, 2000), decision="corrected").verdict == "block"


def test_judge_decides_keeps_floor_mode_values_and_checks_the_mode():
    wr = win_rate_gate(np.r_[np.full(30, 2.0), np.full(10, 1.0)], np.full(40, 50), np.full(40, 50))
    judge = judge_agreement_gate(_agreement(71, 100))
    (out,) = judge_decides([wr], judge, 0.71)
    assert out.findings[0].values == {"judge_verdict": "block", "agreement": 0.71, "floor": 0.85}
    with pytest.raises(ValueError, match="judge_decision"):
        judge_decides([wr], judge, 0.71, decision="lenient")
    with pytest.raises(ValueError, match="judge_decision"):
        GateStageConfig(judge_decision="lenient")
    # a win rate decided on its point estimate (floor mode's rule) cannot pass through as a corrected decision
    usable = judge_agreement_gate(_agreement(355, 500), decision="corrected")
    with pytest.raises(ValueError, match="not decided in corrected mode"):
        judge_decides([wr], usable, 0.71, decision="corrected")


def test_intent_matrix_in_corrected_mode_needs_the_bar_at_50():
    prefs = np.r_[np.full(30, 2.0), np.full(10, 1.0)]
    g = intent_matrix_gate(prefs, ["advice"] * 40, {"advice": 1.0}, bar=55.0, judge_decision="corrected")
    assert g.verdict == "inconclusive" and g.finding("corrected_bar_not_50").values == {"bar": 55.0}
    assert intent_matrix_gate(prefs, ["advice"] * 40, {"advice": 1.0}, judge_decision="corrected").verdict == "pass"


def test_the_report_names_the_decision_mode():
    assert judge_decision_line(GateStageConfig()).startswith(
        "- judge decision: floor (the win-rate gates decide only when the judge's agreement clears 0.85")
    assert judge_decision_line(GateStageConfig(judge_decision="corrected")).startswith(
        "- judge decision: corrected (no judge floor")


def test_benchmark_covers_and_gives_the_worked_example(capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "corrected_winrate.py"
    spec = importlib.util.spec_from_file_location("bench_corrected_winrate", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = bench.main(["--trials", "400"])
    for r in rows:  # 400 trials: the Monte Carlo SE of a 95% coverage is 1.1 points
        assert 0.91 <= r["coverage"] <= 0.99, r
        assert r["floor_decided"] == 0.0  # a = 0.71 or 0.65 never clears 0.85 on its interval
    assert rows[-1]["true_win_rate"] == 50.0 and rows[-1]["decided"] <= 0.1  # false decisions, ~5%
    assert rows[1]["decided"] > rows[0]["decided"]  # 5,000 prompts decide more often than 805
    small, large = bench.worked_example()
    # w = 50 + 4 * 0.42 = 51.68; SE sqrt(0.5168 * 0.4832 / 804) = 1.7624 points at 805 prompts, 0.7068 at 5,000
    assert small["observed_gap"] == pytest.approx(1.68) and small["corrected_gap"] == pytest.approx(4.0)
    assert (small["side"], large["side"]) == ("straddles", "above")
    # 3.841459 * (1.7624^2 * 805) / 1.68^2 = 3403.04 -> 3404
    assert small["items_needed"] == 3404
    assert "| 5,000 | +1.68 points | +4.00 points | 50.7-57.6% (6.9 points) | yes: pass |" in capsys.readouterr().out
