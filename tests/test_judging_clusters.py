"""Intervals that count clusters, not items: pairs sharing an instruction or a response are not independent.

Hand-worked numbers for the design effect, the item-level case reproduced exactly, and constructed sets where
duplicated items make the item-level interval clear the judge floor (or the PPO unlock's comparison) and the
clustered one does not.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from data.labels import FIRST, SECOND
from gates.judge import items_needed, judge_agreement_gate
from judging.agreement import (
    CLUSTER_RULE,
    Agreement,
    inter_annotator_agreement,
    judge_agreement,
    pair_clusters,
    rm_agreement,
)
from judging.intervals import (
    bootstrap_ratio,
    cluster_bootstrap_ratio,
    cluster_wilson,
    connected_clusters,
    mean_design_effect,
    ratio_design,
    wilson,
)
from judging.unlock import CLEARLY_ABOVE, WITHIN_NOISE, ppo_unlock_decision


def test_connected_clusters_join_items_through_any_shared_value_in_first_appearance_order():
    prompts = ["p1", "p2", "p3", "p4", "p1"]
    first = ["a", "b", "c", "d", "e"]
    second = ["x", "y", "b", "z", "w"]  # item 2's second response is item 1's first: items 1 and 2 are linked
    assert connected_clusters(prompts, first, second).tolist() == [0, 1, 1, 2, 0]
    assert connected_clusters(["u", "v", "w"]).tolist() == [0, 1, 2]  # nothing shared: item i is cluster i
    assert connected_clusters([None, None, "k", "k"]).tolist() == [0, 1, 2, 2]  # None links nothing
    with pytest.raises(ValueError, match="one value per item"):
        connected_clusters(["a", "b"], ["c"])


def test_pair_clusters_link_by_instruction_or_response_after_whitespace_collapse():
    prompts = ["Rewrite: x", "Rewrite:  x", "Sum 2+2", "Name a colour"]
    first = ["r1", "r2", "4", "<nooutput>"]
    second = ["r3", "r4", "<nooutput>", "blue"]
    # 0 and 1 share the instruction (whitespace differs); 2 and 3 share the placeholder answer
    assert pair_clusters(prompts, first, second).tolist() == [0, 0, 1, 1]
    assert pair_clusters(prompts).tolist() == [0, 0, 1, 2]  # by instruction only
    chat = [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "hi "}]]
    assert pair_clusters(chat).tolist() == [0, 0]


def test_ratio_design_hand_worked():
    # clusters of sizes 3, 1, 2 with 3, 0, 1 successes: n = 6, p = 4/6
    # residuals y_g - p m_g = 1, -2/3, -1/3; squares sum 14/9
    # v_c = G/(G-1) * 14/9 / n^2 = 3/2 * 14/9 / 36 = 7/108
    # item-level v_0 = p(1-p)/(n-1) = (2/3)(1/3)/5 = 2/45; deff = (7/108)/(2/45) = 315/216; n_eff = 6 * 216/315
    y = [1, 1, 1, 0, 1, 0]
    keys = ["a", "a", "a", "b", "c", "c"]
    d = ratio_design(y, np.ones(6), keys)
    assert d.n == 6 and d.n_clusters == 3
    assert d.estimate == pytest.approx(4 / 6)
    assert d.variance == pytest.approx(7 / 108)
    assert d.design_effect == pytest.approx(315 / 216)
    assert d.n_eff == pytest.approx(6 * 216 / 315)  # 4.114
    ci, same = cluster_wilson(y, None, keys)
    assert same == d
    assert (ci.low, ci.high) == pytest.approx(wilson(4 / 6 * d.n_eff, d.n_eff))
    assert "3 clusters" in ci.method and "n_eff 4.1" in ci.method


def test_ratio_design_of_trials_per_item_and_the_degenerate_cases():
    # two items with 3 and 1 trials (e.g. annotator comparisons), one cluster each: p = 3/4;
    # residuals 3 - 9/4 = 3/4, 0 - 3/4 = -3/4 -> v_c = 2 * (9/16 + 9/16) / 16 = 9/64;
    # each trial independent: v_0 = (3/4)(1/4)/3 = 1/16 -> deff = 9/4, n_eff = 16/9
    d = ratio_design([3, 0], [3, 1], None)
    assert d.n == 4 and d.n_clusters == 2
    assert d.design_effect == pytest.approx(9 / 4) and d.n_eff == pytest.approx(16 / 9)
    # every item agrees: the variance is 0 whatever the design, so n_eff = the number of clusters
    all_agree = ratio_design(np.ones(200), np.ones(200), np.repeat(np.arange(20), 10))
    assert all_agree.n_eff == pytest.approx(20) and all_agree.design_effect == pytest.approx(10)
    # a negative within-cluster correlation never makes the evidence worth more than its items
    alternating = ratio_design([1, 0, 1, 0, 1, 0], np.ones(6), [0, 0, 1, 1, 2, 2])
    assert alternating.design_effect == 1.0 and alternating.n_eff == 6
    assert ratio_design([], [], None).n == 0
    with pytest.raises(ValueError, match="num <= den"):
        ratio_design([2], [1])


def test_every_item_its_own_cluster_gives_the_item_level_intervals_exactly():
    rng = np.random.default_rng(3)
    y = (rng.random(57) < 0.8).astype(float)
    ci, d = cluster_wilson(y, None, np.arange(57))
    assert d.design_effect == 1.0 and d.n_eff == 57
    assert (ci.low, ci.high) == wilson(y.sum(), 57)
    num, den = rng.integers(0, 4, 40).astype(float), np.full(40, 3.0)
    assert cluster_bootstrap_ratio(num, den, None, 0.95, 500, 0) == bootstrap_ratio(num, den, 0.95, 500, 0)
    e = rng.normal(size=30)
    assert mean_design_effect(e, list(range(30))) == (1.0, 30)

    labels = rng.integers(0, 3, size=(25, 3))
    plain = inter_annotator_agreement(labels, n_resamples=300)
    keyed = inter_annotator_agreement(labels, n_resamples=300, clusters=[f"instr-{i}" for i in range(25)])
    assert keyed.pairwise_agreement_decisive_ci == plain.pairwise_agreement_decisive_ci
    assert keyed.fleiss_kappa_ci == plain.fleiss_kappa_ci
    assert keyed.n_eff_decisive == plain.n_eff_decisive and keyed.n_clusters == 25
    assert plain.cluster_rule == "item" and keyed.cluster_rule == CLUSTER_RULE


def _duplicated_judge_set():
    """20 instructions, each pair repeated 10 times (200 items); the judge picks the experts' side on 19
    instructions' pairs and the other side on the 20th's: item-level 190/200 = 0.95."""
    prompts = [f"instruction {g}" for g in range(20) for _ in range(10)]
    first = [f"answer A to {g}" for g in range(20) for _ in range(10)]
    second = [f"answer B to {g}" for g in range(20) for _ in range(10)]
    expert = np.full(200, FIRST)
    judge = np.where(np.arange(200) < 190, FIRST, SECOND)
    return prompts, first, second, expert, judge


def test_duplicated_items_pass_the_judge_floor_item_level_but_not_clustered():
    prompts, first, second, expert, judge = _duplicated_judge_set()
    item = judge_agreement(judge, expert)
    clustered = judge_agreement(judge, expert, clusters=pair_clusters(prompts, first, second))
    assert item.agreement == clustered.agreement == 0.95
    # item level: Wilson(190, 200) = 0.9104-0.9726, whole interval above the 0.85 floor
    assert item.ci.low == pytest.approx(0.9104, abs=1e-4) and item.cluster_rule == "item" and item.n_eff == 200
    assert judge_agreement_gate(item).verdict == "pass"
    # clustered: one cluster per instruction; residuals 10 - 9.5 = 0.5 (19 times) and -9.5:
    # v_c = 20/19 * (19 * 0.25 + 90.25) / 200^2 = 0.0025, v_0 = 0.95 * 0.05 / 199; deff = 10.47, n_eff = 19.1
    assert clustered.n_clusters == 20 and clustered.cluster_rule == CLUSTER_RULE
    assert clustered.design_effect == pytest.approx(0.0025 / (0.95 * 0.05 / 199))
    assert clustered.n_eff == pytest.approx(200 / clustered.design_effect)
    assert clustered.ci.low < 0.85 < clustered.ci.high  # Wilson(0.95 n_eff, n_eff): 0.758-0.991
    gate = judge_agreement_gate(clustered)
    assert gate.verdict == "inconclusive"
    assert gate.metrics["effective_n"].value == pytest.approx(clustered.n_eff)
    assert gate.table[0]["n_clusters"] == 20
    assert f"effective n {clustered.n_eff:.1f} of 20 clusters" in gate.reason
    need = gate.finding("straddles_floor").values["items_needed"]
    assert need == math.ceil(items_needed(0.95, 0.85) * clustered.design_effect - 1e-9)
    # the record keeps its clusters through JSON
    again = Agreement.from_dict(json.loads(clustered.to_json()))
    assert again.n_eff == pytest.approx(clustered.n_eff) and again.n_clusters == 20


def test_duplicated_items_make_the_ppo_unlock_clear_item_level_but_not_clustered():
    prompts, first, second, expert, _ = _duplicated_judge_set()
    s1 = np.where(np.arange(200) < 190, 1.0, 0.0)  # the RM prefers the experts' side on 19 instructions
    s2 = 1.0 - s1
    keys = pair_clusters(prompts, first, second)
    # annotators on the same 200 pairs: on 7 instructions one of three annotators disagrees
    labels = np.array([[1, 1, 1] if g >= 7 else [1, 1, 2] for g in range(20) for _ in range(10)])
    iaa_item = inter_annotator_agreement(labels, n_resamples=400)
    iaa_cl = inter_annotator_agreement(labels, n_resamples=400, clusters=keys)
    rm_item = rm_agreement(s1, s2, expert)
    rm_cl = rm_agreement(s1, s2, expert, clusters=keys)
    item = ppo_unlock_decision(rm_item, iaa_item)
    clustered = ppo_unlock_decision(rm_cl, iaa_cl)
    assert item.rule_verdict and clustered.rule_verdict  # 0.95 > 0.883 either way: the point estimates agree
    assert item.comparison == CLEARLY_ABOVE
    assert clustered.comparison == WITHIN_NOISE  # 20 instructions cannot show it clearly
    assert clustered.rm_n_clusters == 20 and clustered.iaa_n_clusters == 20
    assert clustered.rm_n_eff < 25 and clustered.iaa_n_eff < iaa_item.n_eff_decisive
    assert "n_eff" in clustered.summary()


def test_a_record_without_cluster_fields_reads_as_item_level():
    d = judge_agreement([1, 1, 2, 1], [1, 1, 1, 1]).to_dict()
    for k in ("cluster_rule", "n_clusters", "design_effect", "n_eff"):
        d.pop(k)
    old = Agreement.from_dict(d)
    assert old.cluster_rule == "item" and old.n_clusters == 4 and old.n_eff == 4.0 and old.design_effect == 1.0
    with pytest.raises(ValueError, match=r"missing fields \['n_agree'\]"):
        Agreement.from_dict({k: v for k, v in d.items() if k != "n_agree"})


def test_items_needed_scales_with_the_design_effect():
    base = items_needed(0.9, 0.85)
    assert items_needed(0.9, 0.85, design_effect=1.0) == base
    assert items_needed(0.9, 0.85, design_effect=2.5) == math.ceil(base * 2.5)
    with pytest.raises(ValueError, match="design_effect"):
        items_needed(0.9, 0.85, design_effect=0.5)


def test_win_rate_interval_clusters_items_sharing_an_instruction():
    from gates.winrate import win_rate_gate

    rng = np.random.default_rng(0)
    prefs = np.where(rng.random(30) < 0.7, 2.0, 1.0)
    lens = np.full(30, 100.0)
    plain = win_rate_gate(prefs, lens, lens)
    own = win_rate_gate(prefs, lens, lens, clusters=[f"q{i}" for i in range(30)])
    assert own.metrics["length_matched_win_rate"] == plain.metrics["length_matched_win_rate"]
    assert own.metrics["effective_n"].value == 30
    # each instruction asked 4 times with the same verdict: 120 items worth about 30
    dup = np.repeat(prefs, 4)
    lens4 = np.full(120, 100.0)
    item = win_rate_gate(dup, lens4, lens4)
    clustered = win_rate_gate(dup, lens4, lens4, clusters=np.repeat(np.arange(30), 4))
    lc_i, lc_c = item.metrics["length_matched_win_rate"], clustered.metrics["length_matched_win_rate"]
    assert lc_i.value == lc_c.value
    # deff = 4 * (30/29) * (119/120) (exact duplicates of 4): the SE grows by its square root
    deff = 4 * 30 / 29 * 119 / 120
    assert clustered.metrics["effective_n"].value == pytest.approx(120 / deff)
    assert (lc_c.ci_high - lc_c.value) == pytest.approx((lc_i.ci_high - lc_i.value) * math.sqrt(deff))
    assert clustered.findings[0].values["n_clusters"] == 30
    # balanced: the same clusters, the same design effect on the bucket-weighted figure
    bal_i = win_rate_gate(dup, lens4, lens4, method="balanced")
    bal_c = win_rate_gate(dup, lens4, lens4, method="balanced", clusters=np.repeat(np.arange(30), 4))
    assert bal_c.metrics["effective_n"].value == pytest.approx(120 / deff)
    assert bal_c.metrics["length_balanced_win_rate"].ci_low < bal_i.metrics["length_balanced_win_rate"].ci_low


def test_demo_held_out_pairs_form_eleven_clusters(tmp_path):
    from data.loaders import load_pairs
    from judging.agreement import preference_pair_clusters

    pairs = load_pairs("demo:pandalm/testset-v1.jsonl.gz", mode="lenient", max_reject_rate=0.07,
                       rejects_path=tmp_path / "rejects.jsonl")
    held_out = pairs[:48]  # recipes/demo/reward_model.yaml: max_agreement_pairs 48
    assert len({p.chosen for p in held_out}) == 30
    assert int(preference_pair_clusters(held_out).max()) + 1 == 11


def test_cli_judge_agreement_json_is_strict_where_it_printed_nan(tmp_path):
    """The labels backend asks in one order only, so position consistency is NaN; ``--json`` printed ``NaN``."""
    from typer.testing import CliRunner

    from flows.cli import app

    labels = tmp_path / "labels.jsonl"
    labels.write_text("".join(json.dumps({"id": f"pandalm-{i}", "verdict": 1}) + "\n" for i in range(40)))
    args = ["judge", "agreement", "--judge", "labels", "--labels", str(labels), "-n", "40",
            "--cache-dir", str(tmp_path / "cache"), "--json"]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output

    def refuse(token):
        raise AssertionError(f"not strict JSON: {token}")

    summary = json.loads(out.output, parse_constant=refuse)
    assert summary["position_consistency"] is None and "position_consistency_null_reason" in summary
    assert summary["n_clusters"] < summary["n"] and summary["n_eff"] < summary["n"]
    assert summary["cluster_rule"] == CLUSTER_RULE
    text = CliRunner().invoke(app, args[:-1])
    assert "interval on the effective n: n_eff = " in text.output
