"""Per-intent matrix (gates/intent.py) and the judge's corrected effect size (gates/judge.py additions)."""

import math
from pathlib import Path

import numpy as np
import pytest
from statsmodels.stats.proportion import proportion_confint

from data.loaders import load_alpaca_eval
from gates.intent import (
    intent_matrix_gate,
    intent_win_rates,
    traffic_shares,
    traffic_weighted_win_rate,
)
from gates.judge import corrected_effect_size, judge_agreement_gate_with_effect
from judging.agreement import Agreement, judge_agreement

EXAMPLE = Path(__file__).resolve().parents[1] / "gates" / "traffic_example.csv"


# ---------------------------------------------------------------------------------------------
# traffic-share table
# ---------------------------------------------------------------------------------------------


def test_traffic_example_file_reads_and_sums_to_one():
    t = traffic_shares(EXAMPLE)
    assert list(t) == ["helpful_base", "oasst", "koala", "selfinstruct", "vicuna", "coding"]
    assert math.fsum(t.values()) == pytest.approx(1.0, abs=1e-12)


def test_traffic_yaml_forms(tmp_path):
    (tmp_path / "a.yaml").write_text("chat: 0.7\ncoding: 0.3\n")
    (tmp_path / "b.yml").write_text("shares:\n  chat: 0.7\n  coding: 0.3\n")
    (tmp_path / "c.yaml").write_text("- {intent: chat, share: 0.7}\n- {intent: coding, share: 0.3}\n")
    for f in ("a.yaml", "b.yml", "c.yaml"):
        assert traffic_shares(tmp_path / f) == {"chat": 0.7, "coding": 0.3}


def test_traffic_table_errors_name_the_file_and_the_sum(tmp_path):
    bad = tmp_path / "t.csv"
    bad.write_text("intent,share\nchat,0.6\ncoding,0.3\n")
    with pytest.raises(ValueError) as e:
        traffic_shares(bad)
    assert str(bad) in str(e.value) and "sum to 0.9" in str(e.value)
    # within 1e-6 is accepted, beyond is not
    (tmp_path / "ok.csv").write_text("intent,share\nchat,0.6\ncoding,0.4000005\n")
    assert traffic_shares(tmp_path / "ok.csv")["coding"] == pytest.approx(0.4000005)
    (tmp_path / "off.csv").write_text("intent,share\nchat,0.6\ncoding,0.400002\n")
    with pytest.raises(ValueError, match="1.000002"):
        traffic_shares(tmp_path / "off.csv")
    (tmp_path / "dup.csv").write_text("intent,share\nchat,0.5\nchat,0.5\n")
    with pytest.raises(ValueError, match="more than once"):
        traffic_shares(tmp_path / "dup.csv")
    (tmp_path / "col.csv").write_text("name,share\nchat,1\n")
    with pytest.raises(ValueError, match="missing column 'intent'"):
        traffic_shares(tmp_path / "col.csv")
    (tmp_path / "neg.yaml").write_text("chat: 1.2\ncoding: -0.2\n")
    with pytest.raises(ValueError, match="fraction"):
        traffic_shares(tmp_path / "neg.yaml")
    (tmp_path / "t.json").write_text("{}")
    with pytest.raises(ValueError, match="unknown traffic-share format"):
        traffic_shares(tmp_path / "t.json")
    with pytest.raises(FileNotFoundError):
        traffic_shares(tmp_path / "none.csv")
    with pytest.raises(ValueError, match="traffic mapping.*sum to 0.5"):
        intent_matrix_gate([2.0], ["chat"], {"chat": 0.5})


# ---------------------------------------------------------------------------------------------
# hand-worked matrix
# ---------------------------------------------------------------------------------------------


def _hand_data():
    # chat: 14 wins of 20 (70%); coding: 3 wins of 20 (15%); legal: 5 wins of 10 (50%),
    # "poetry" (not in the traffic table): 1 win of 2. Binary preferences -> exact intervals.
    prefs = [2.0] * 14 + [1.0] * 6 + [2.0] * 3 + [1.0] * 17 + [2.0] * 5 + [1.0] * 5 + [2.0, 1.0]
    intents = ["chat"] * 20 + ["coding"] * 20 + ["legal"] * 10 + ["poetry"] * 2
    return prefs, intents


def test_per_intent_exact_intervals_hand_worked():
    prefs, intents = _hand_data()
    t = intent_win_rates(prefs, intents)
    assert t.loc["chat", "win_rate"] == pytest.approx(70.0) and t.loc["chat", "n"] == 20
    assert t.loc["coding", "win_rate"] == pytest.approx(15.0)
    lo, hi = proportion_confint(3, 20, alpha=0.05, method="beta")
    assert t.loc["coding", "ci_low"] == pytest.approx(100 * lo) and t.loc["coding", "ci_high"] == pytest.approx(100 * hi)
    assert (t["ci_method"] == "exact").all()


def test_meaningful_cluster_below_50_on_evidence_blocks():
    prefs, intents = _hand_data()
    traffic = {"chat": 0.60, "coding": 0.30, "legal": 0.07, "search": 0.03}
    g = intent_matrix_gate(prefs, intents, traffic)
    assert g.verdict == "block"
    blocked = g.finding("below_bar_on_evidence").values
    assert (blocked["intent"], blocked["share"], blocked["win_rate"]) == ("coding", 0.3, 15.0) and blocked["meaningful"]
    assert blocked["ci_high"] < 50
    # weighted over the covered 0.97: (0.6*70 + 0.3*15 + 0.07*50) / 0.97
    assert g.metrics["traffic_weighted_win_rate"].value == pytest.approx((42 + 4.5 + 3.5) / 0.97)
    assert g.metrics["traffic_share_covered"].value == pytest.approx(0.97)
    # the prompt-count average is shown only as "not used": (14 + 3 + 5 + 1) / 52
    assert g.metrics["win_rate_by_prompt_count_not_used"].value == pytest.approx(100 * 23 / 52)
    rows = {r["intent"]: r for r in g.table}
    assert rows["poetry"]["status"].startswith("not in traffic table") and rows["poetry"]["n"] == 2
    assert rows["search"]["status"] == "no data" and rows["search"]["n"] == 0
    # never silently dropped
    assert g.finding("not_in_traffic_table").values == {"intent": "poetry", "share": 0.0, "n": 2, "meaningful": False}
    assert g.finding("no_data").values == {"intent": "search", "share": 0.03, "n": 0, "meaningful": False}
    assert rows["legal"]["status"] == "ok"
    assert g.metrics["win_rate[coding]"].n == 20


def test_small_share_or_noise_does_not_block():
    prefs, intents = _hand_data()
    # coding only 3% of traffic: reported below the bar on evidence, but not blocking
    g = intent_matrix_gate(prefs, intents, {"chat": 0.90, "coding": 0.03, "legal": 0.07})
    assert g.verdict == "pass"
    small = g.finding("below_bar_on_evidence").values
    assert (small["intent"], small["meaningful"]) == ("coding", False)
    assert g.finding("summary").values["min_share"] == 0.05
    # a cluster at 40% with n = 10 whose interval reaches 50: could be noise, no block
    p = [2.0] * 4 + [1.0] * 6 + [2.0] * 10
    g2 = intent_matrix_gate(p, ["a"] * 10 + ["b"] * 10, {"a": 0.5, "b": 0.5})
    assert g2.verdict == "pass" and g2.finding("below_bar_noise").values["intent"] == "a"
    assert g2.finding("below_bar_noise").values["ci_high"] >= 50


def test_meaningful_traffic_intent_without_data_is_inconclusive():
    prefs, intents = _hand_data()
    g = intent_matrix_gate(prefs, intents, {"chat": 0.80, "legal": 0.10, "search": 0.10})
    assert g.verdict == "inconclusive"
    assert g.finding("no_data").values == {"intent": "search", "share": 0.1, "n": 0, "meaningful": True}
    # too few items in a meaningful cluster: also untested
    g2 = intent_matrix_gate(prefs, intents, {"chat": 0.5, "poetry": 0.5})
    assert g2.verdict == "inconclusive"
    assert g2.finding("too_few_items").values == {"intent": "poetry", "share": 0.5, "n": 2, "meaningful": True,
                                                  "min_items": 10}


def test_judge_below_floor_makes_the_matrix_inconclusive():
    prefs, intents = _hand_data()
    from gates.judge import judge_agreement_gate, judge_decides

    g = intent_matrix_gate(prefs, intents, {"chat": 0.6, "coding": 0.3, "legal": 0.1})
    judge = judge_agreement_gate(judge_agreement([1] * 800 + [2] * 200, [1] * 1000))  # CI 0.775-0.823: block
    (g,) = judge_decides([g], judge, 0.80)
    assert g.verdict == "inconclusive" and g.findings[0].values == {"judge_verdict": "block", "agreement": 0.8,
                                                                    "floor": 0.85}
    assert g.metrics["judge_agreement"].value == 0.8


def test_weighted_preferences_use_a_seeded_bootstrap():
    p = [1.75, 1.25, 1.5, 2.0, 1.0] * 4
    t1 = intent_win_rates(p, ["x"] * 20)
    t2 = intent_win_rates(p, ["x"] * 20)
    assert t1.loc["x", "ci_method"] == "bootstrap" and t1.loc["x", "win_rate"] == pytest.approx(50.0)
    assert t1.loc["x", "ci_low"] == t2.loc["x", "ci_low"] < 50 < t1.loc["x", "ci_high"]
    with pytest.raises(ValueError, match="exact"):
        intent_win_rates(p, ["x"] * 20, ci_method="exact")
    with pytest.raises(ValueError, match="differ in length"):
        intent_win_rates([2.0], ["a", "b"])


# ---------------------------------------------------------------------------------------------
# real AlpacaEval annotations, intent = the `dataset` field
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def alpaca():
    rows = load_alpaca_eval("demo:alpaca_eval_gpt-3.5-turbo-1106")
    return [r.preference for r in rows], [r.dataset for r in rows]


def test_alpaca_eval_clusters_recombine_to_the_published_win_rate(alpaca):
    prefs, intents = alpaca
    t = intent_win_rates(prefs, intents)
    assert dict(t["n"]) == {"helpful_base": 129, "koala": 156, "oasst": 188, "selfinstruct": 252, "vicuna": 80}
    # weighting the clusters by their prompt counts gives back alpaca_eval's published 9.177965 (to 1e-4)
    assert (t["n"] * t["win_rate"]).sum() / t["n"].sum() == pytest.approx(9.177964561962735, abs=1e-4)
    assert (t["ci_method"] == "bootstrap").all()  # weighted preferences


def test_alpaca_eval_matrix_with_a_hand_made_traffic_table(alpaca):
    prefs, intents = alpaca
    traffic = traffic_shares(EXAMPLE)
    g = intent_matrix_gate(prefs, intents, traffic)
    t = intent_win_rates(prefs, intents)
    expected = sum(traffic[i] * t.loc[i, "win_rate"] for i in t.index) / 0.96  # coding has no data
    assert g.metrics["traffic_weighted_win_rate"].value == pytest.approx(expected, rel=1e-12)
    assert g.metrics["traffic_share_covered"].value == pytest.approx(0.96)
    # gpt-3.5-turbo-1106 loses every cluster to gpt4_1106_preview on evidence
    assert g.verdict == "block"
    for intent in ("helpful_base", "oasst", "koala", "selfinstruct", "vicuna"):
        assert g.metrics[f"win_rate[{intent}]"].ci_high < 50
    assert g.finding("no_data").values["intent"] == "coding"  # the traffic intent without data is reported
    w, lo, hi, cov = traffic_weighted_win_rate(prefs, intents, traffic)
    assert lo < w < hi and cov == pytest.approx(0.96)


# ---------------------------------------------------------------------------------------------
# judge: attenuation 2a-1 and the corrected effect size (gates/judge.py additions)
# ---------------------------------------------------------------------------------------------


def test_seed_figure_corrected_effect():
    # a = 0.85 shrinks a true 4-point gap to 2.8 measured; correcting 52.8% gives back 4.0 points
    e = corrected_effect_size(52.8, 0.85)
    assert e.attenuation == pytest.approx(0.7)
    assert e.measured_gap == pytest.approx(2.8) and e.corrected_gap == pytest.approx(4.0)
    assert e.corrected_win_rate == pytest.approx(54.0)
    assert math.isnan(corrected_effect_size(55.0, 0.5).corrected_gap)
    with pytest.raises(ValueError):
        corrected_effect_size(55.0, 1.2)


def test_judge_gate_with_effect_shows_attenuation_and_corrected_gap():
    # 20 decisive items, judge agrees on 17: a = 0.85 sits on the floor; its Wilson interval 0.640-0.948
    # contains it, so the gate is inconclusive (decided on the interval, never the point estimate)
    human = np.array([1] * 10 + [2] * 10)
    judge = human.copy()
    judge[:3] = 2
    ag = judge_agreement(judge, human)
    assert isinstance(ag, Agreement) and ag.agreement == pytest.approx(0.85)
    g = judge_agreement_gate_with_effect(ag, 52.8)
    assert g.verdict == "inconclusive" and g.finding("straddles_floor").values["items_needed"] is None
    assert g.metrics["attenuation"].value == pytest.approx(0.7)
    assert g.metrics["corrected_gap"].value == pytest.approx(4.0)
    effect = g.finding("corrected_effect").values
    assert effect["corrected_gap"] == pytest.approx(4.0) and effect["corrected_win_rate"] == pytest.approx(54.0)
    judge[:4] = 2  # a = 0.80, CI 0.584-0.919 still reaches 0.85 -> inconclusive, with the n that would decide
    g2 = judge_agreement_gate_with_effect(judge_agreement(judge, human), 52.8)
    assert g2.verdict == "inconclusive" and g2.finding("straddles_floor").values["items_needed"] > 20
    assert g2.metrics["corrected_gap"].value == pytest.approx(2.8 / 0.6)
