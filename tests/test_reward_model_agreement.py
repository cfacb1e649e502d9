"""Agreement statistics and the PPO unlock rule (judging/agreement.py, judging/unlock.py).

Small cases are worked by hand in the comments; the PandaLM block checks the real test set.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from judging.agreement import (
    NO_MAJORITY,
    UNPARSED,
    Agreement,
    ConfidenceInterval,
    expert_labels,
    inter_annotator_agreement,
    judge_agreement,
    rm_agreement,
)
from judging.scoring import parse_judge_verdict
from judging.unlock import (
    CLEARLY_ABOVE,
    CLEARLY_BELOW,
    NOT_MEASURED,
    WITHIN_NOISE,
    UnlockDecision,
    decide_from_metrics,
    ppo_unlock_decision,
)

# 4 items x 3 annotators (0 tie, 1 first better, 2 second better)
HAND = np.array(
    [
        [1, 1, 1],  # unanimous
        [1, 2, 1],  # 2-1 majority for 1
        [0, 2, 2],  # tie vs side; majority 2
        [0, 1, 2],  # 3-way split: no majority
    ]
)


# ------------------------------------------------------------------------------------------
# expert_labels
# ------------------------------------------------------------------------------------------


def test_expert_labels_majority_and_three_way_split_reported():
    np.testing.assert_array_equal(expert_labels(HAND), [1, 1, 2, NO_MAJORITY])
    # a tie is a label like the others: two ties outvote one side
    np.testing.assert_array_equal(expert_labels([[0, 0, 1], [2, 0, 0]]), [0, 0])
    # 4 annotators, 2-2 split -> no strict majority; 3-1 -> majority
    np.testing.assert_array_equal(expert_labels([[1, 1, 2, 2], [2, 2, 2, 1]]), [NO_MAJORITY, 2])


@pytest.mark.parametrize(
    "bad",
    [np.array([1, 2, 0]), np.array([[1], [2]]), np.array([[1, 3, 1]]), np.array([[1.0, np.nan, 1.0]])],
)
def test_expert_labels_rejects_bad_input(bad):
    with pytest.raises(ValueError):
        expert_labels(bad)


# ------------------------------------------------------------------------------------------
# inter_annotator_agreement on HAND
# ------------------------------------------------------------------------------------------
# Pairs per item (a1-a2, a1-a3, a2-a3):
#   item0 (1,1,1): agree 3/3; all 3 pairs decisive, 3 agree
#   item1 (1,2,1): agree 1/3 (a1-a3); all 3 decisive, 1 agrees
#   item2 (0,2,2): agree 1/3 (a2-a3); decisive only a2-a3, which agrees
#   item3 (0,1,2): agree 0/3;         decisive only a2-a3, which disagrees
# pairwise_agreement          = (3+1+1+0) / 12      = 5/12
# pairwise_agreement_decisive = (3+1+1+0) / (3+3+1+1) = 5/8
# per pair (all labels): a1-a2 1/4, a1-a3 2/4, a2-a3 2/4 (mean 5/12)
# per pair (decisive):   a1-a2 1/2 (items 0,1), a1-a3 2/2 (items 0,1), a2-a3 2/4 (items 0..3)
# tie share: 2 ties among 12 labels = 1/6
# leave-one-out, reference = majority of the other two (exists only when they agree):
#   a1 vs (a2,a3): item0 ref 1 ok, item2 ref 2 vs 0 wrong            -> 1/2
#   a2 vs (a1,a3): item0 ref 1 ok, item1 ref 1 vs 2 wrong            -> 1/2
#   a3 vs (a1,a2): item0 ref 1 ok                                    -> 1/1   => 3/5
#   decisive (ref and annotator both pick a side): a1 1/1 (item2 dropped), a2 1/2, a3 1/1 => 3/4
# Fleiss: counts [n0,n1,n2] = [0,3,0],[0,2,1],[1,0,2],[1,1,1]; P_i = (sum n^2 - 3)/6
#   = 1, 1/3, 1/3, 0 -> P_bar = 5/12; p_j = [2,6,4]/12 -> P_e = 1/36+1/4+1/9 = 7/18
#   kappa = (5/12 - 7/18) / (1 - 7/18) = (1/36)/(22/36) = 1/22
# Cohen a1-a2: a1=[1,1,0,0], a2=[1,2,2,1]; p_o = 1/4, p_e = (2/4)(2/4) = 1/4 -> kappa 0


def test_inter_annotator_agreement_hand_worked():
    r = inter_annotator_agreement(HAND)
    assert (r.n_items, r.n_annotators) == (4, 3)
    assert r.pairwise_agreement == pytest.approx(5 / 12)
    assert r.pairwise_agreement_decisive == pytest.approx(5 / 8)
    assert r.n_decisive_comparisons == 8
    assert r.per_pair_agreement == pytest.approx({"a1-a2": 0.25, "a1-a3": 0.5, "a2-a3": 0.5})
    assert r.per_pair_agreement_decisive == pytest.approx({"a1-a2": 0.5, "a1-a3": 1.0, "a2-a3": 0.5})
    assert r.per_pair_cohen_kappa["a1-a2"] == pytest.approx(0.0)
    assert r.tie_share == pytest.approx(1 / 6)
    assert r.n_no_majority == 1
    assert r.loo_majority_agreement == pytest.approx(3 / 5)
    assert r.n_loo_comparisons == 5
    assert r.loo_majority_agreement_decisive == pytest.approx(3 / 4)
    assert r.n_loo_comparisons_decisive == 4
    assert r.fleiss_kappa == pytest.approx(1 / 22)
    for ci in (r.pairwise_agreement_ci, r.pairwise_agreement_decisive_ci, r.fleiss_kappa_ci):
        assert ci.level == 0.95
        assert ci.low <= ci.high


def test_inter_annotator_agreement_perfect_and_all_ties():
    perfect = inter_annotator_agreement([[1, 1, 1], [2, 2, 2], [1, 1, 1]])
    assert perfect.pairwise_agreement == 1.0 and perfect.pairwise_agreement_decisive == 1.0
    assert perfect.pairwise_agreement_decisive_ci.low == 1.0
    assert perfect.fleiss_kappa == pytest.approx(1.0)
    ties = inter_annotator_agreement([[0, 0, 0], [0, 0, 0]])
    assert ties.pairwise_agreement == 1.0
    assert ties.tie_share == 1.0
    # no decisive comparison at all: undefined, not 0 or 1
    assert math.isnan(ties.pairwise_agreement_decisive) and ties.n_decisive_comparisons == 0
    json.dumps(ties.to_dict(), allow_nan=False)  # NaN is written as null


def test_inter_annotator_agreement_bootstrap_is_seeded():
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 3, size=(60, 3))
    a = inter_annotator_agreement(labels, seed=7)
    b = inter_annotator_agreement(labels, seed=7)
    assert a.pairwise_agreement_decisive_ci == b.pairwise_agreement_decisive_ci
    assert a.pairwise_agreement_ci.low <= a.pairwise_agreement <= a.pairwise_agreement_ci.high


# ------------------------------------------------------------------------------------------
# rm_agreement
# ------------------------------------------------------------------------------------------


def _wilson_by_hand(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def test_rm_agreement_hand_worked():
    # item: expert, RM preference (first > second?)
    #   0: 1, 2.0>1.0 -> 1  agree
    #   1: 2, 1.0>0.0 -> 1  disagree
    #   2: 0 (expert tie)       -> excluded, n_expert_tie
    #   3: -1 (no majority)     -> excluded, n_expert_no_majority
    #   4: 1, 3.0==3.0 -> tie   -> in n, not an agreement, n_tie
    #   5: 2, 0.5<0.7 -> 2  agree
    # n = 4, n_agree = 2 -> 0.5; excluding the RM tie 2/3. Wilson(2, 4): 0.5 +- 0.349961
    expert = np.array([1, 2, 0, NO_MAJORITY, 1, 2])
    r = rm_agreement([2.0, 1.0, 5.0, 5.0, 3.0, 0.5], [1.0, 0.0, 1.0, 1.0, 3.0, 0.7], expert)
    assert (r.n_items, r.n, r.n_agree) == (6, 4, 2)
    assert r.agreement == pytest.approx(0.5)
    assert (r.n_expert_tie, r.n_expert_no_majority, r.n_tie) == (1, 1, 1)
    assert r.agreement_excluding_abstentions == pytest.approx(2 / 3)
    lo, hi = _wilson_by_hand(2, 4)
    assert (r.ci.low, r.ci.high) == pytest.approx((lo, hi))
    assert (lo, hi) == pytest.approx((0.150039, 0.849961), abs=1e-6)


def test_rm_agreement_expert_ties_never_count_as_wins():
    # every pair is an expert tie: whatever the RM does, nothing is scored
    r = rm_agreement([1.0, 0.0], [0.0, 1.0], [0, 0])
    assert r.n == 0 and r.n_agree == 0 and r.n_expert_tie == 2
    assert math.isnan(r.agreement)
    # adding expert-tie items never changes the agreement on the decisive ones
    base = rm_agreement([1.0, 0.0], [0.0, 1.0], [1, 1])
    more = rm_agreement([1.0, 0.0, 9.0, 0.0], [0.0, 1.0, 0.0, 9.0], [1, 1, 0, 0])
    assert (base.n, base.n_agree) == (more.n, more.n_agree) == (2, 1)


def test_rm_agreement_constant_scores_do_not_agree():
    r = rm_agreement([0.3, 0.3, 0.3], [0.3, 0.3, 0.3], [1, 2, 1])
    assert (r.n, r.n_agree, r.n_tie) == (3, 0, 3)
    assert r.agreement == 0.0
    assert math.isnan(r.agreement_excluding_abstentions)


def test_rm_agreement_accepts_raw_annotator_matrix():
    r = rm_agreement([1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0], HAND)  # expert [1, 1, 2, -1]
    assert (r.n, r.n_agree, r.n_expert_no_majority) == (3, 3, 1)


@pytest.mark.parametrize(
    "args",
    [
        ([1.0, np.nan], [0.0, 1.0], [1, 2]),
        ([1.0, 2.0], [0.0], [1, 2]),
        ([1.0, 2.0], [0.0, 1.0], [1, 3]),
    ],
)
def test_rm_agreement_rejects_bad_input(args):
    with pytest.raises(ValueError):
        rm_agreement(*args)


# ------------------------------------------------------------------------------------------
# judge_agreement
# ------------------------------------------------------------------------------------------


def test_parse_judge_verdict():
    assert [parse_judge_verdict(x) for x in ["1", "2", "Tie", "0", " tie ", 1, "garbage", None]] == [
        1, 2, 0, 0, 0, 1, UNPARSED, UNPARSED,
    ]


def test_judge_agreement_hand_worked():
    # item: judge vs expert
    #   0: 1 vs 1 agree | 1: tie vs 2 (judge tie, not agree) | 2: 2 vs 2 agree
    #   3: unparsed vs 1 (not agree) | 4: 2 vs expert tie (excluded) | 5: 1 vs no majority (excluded)
    # n = 4, n_agree = 2 -> 0.5; without the judge's tie and unparsed: 2/2
    # three-class accuracy over the 5 items with a majority: items 0, 2 -> 2/5
    judge = [1, 0, 2, UNPARSED, 2, 1]
    expert = [1, 2, 2, 1, 0, NO_MAJORITY]
    r = judge_agreement(judge, expert)
    assert (r.n, r.n_agree) == (4, 2)
    assert r.agreement == pytest.approx(0.5)
    assert (r.n_tie, r.n_unparsed, r.n_unparsed_total) == (1, 1, 1)
    assert (r.n_expert_tie, r.n_expert_no_majority) == (1, 1)
    assert r.agreement_excluding_abstentions == pytest.approx(1.0)
    assert r.three_class_accuracy == pytest.approx(2 / 5) and r.n_three_class == 5
    with pytest.raises(ValueError):
        judge_agreement([1, 2], [1])


# ------------------------------------------------------------------------------------------
# ppo_unlock_decision
# ------------------------------------------------------------------------------------------

IAA_HAND = inter_annotator_agreement(HAND)  # decisive pairwise agreement 5/8 = 0.625


def _iaa(value: float, low: float, high: float):
    ci = ConfidenceInterval(low, high, 0.95, "test")
    return replace(IAA_HAND, pairwise_agreement_decisive=value, pairwise_agreement_decisive_ci=ci)


def _rm(agreement: float, low: float, high: float, n: int = 500) -> Agreement:
    return Agreement(
        n_items=n, n=n, n_agree=round(agreement * n), agreement=agreement,
        ci=ConfidenceInterval(low, high, 0.95, "test"),
        n_expert_tie=0, n_expert_no_majority=0, n_tie=0, n_unparsed=0, n_unparsed_total=0,
        agreement_excluding_abstentions=agreement, three_class_accuracy=agreement, n_three_class=n,
        tie_agreement=0.0,  # NaN would be the honest value without expert ties, but NaN != NaN in a comparison
    )


def test_unlock_when_rm_clearly_above():
    d = ppo_unlock_decision(_rm(0.96, 0.95, 0.97), _iaa(0.90, 0.88, 0.92))
    assert d.unlocked and d.rule_verdict and not d.overridden
    assert d.margin == pytest.approx(0.06)
    assert d.comparison == CLEARLY_ABOVE and d.statistically_clear
    assert d.rm_agreement == 0.96 and d.inter_annotator_agreement == 0.90
    assert "unlocked iff RM agreement with expert labels on held-out pairs > inter-annotator" in d.rule


def test_locked_when_rm_below():
    d = ppo_unlock_decision(_rm(0.80, 0.76, 0.84), _iaa(0.90, 0.88, 0.92))
    assert not d.unlocked and not d.rule_verdict
    assert d.margin == pytest.approx(-0.10)
    assert d.comparison == CLEARLY_BELOW and d.statistically_clear


def test_unlock_on_point_estimate_is_flagged_as_not_clear():
    d = ppo_unlock_decision(_rm(0.91, 0.85, 0.95), _iaa(0.90, 0.88, 0.92))
    assert d.unlocked and d.comparison == WITHIN_NOISE and not d.statistically_clear


def test_equal_agreement_stays_locked():
    assert not ppo_unlock_decision(_rm(0.90, 0.85, 0.95), _iaa(0.90, 0.88, 0.92)).unlocked


def test_rule_uses_decisive_pairwise_agreement_from_real_iaa():
    # IAA_HAND: all-labels 5/12 = 0.417, decisive 5/8 = 0.625. An RM at 0.5 beats the first but
    # not the second, so it must stay locked.
    d = ppo_unlock_decision(_rm(0.5, 0.45, 0.55), IAA_HAND)
    assert d.inter_annotator_agreement == pytest.approx(0.625)
    assert d.iaa_statistic == "pairwise_agreement_decisive" and d.iaa_n == 8
    assert not d.unlocked


def test_override_requires_reason():
    rm, iaa = _rm(0.80, 0.76, 0.84), _iaa(0.90, 0.88, 0.92)
    with pytest.raises(ValueError):
        ppo_unlock_decision(rm, iaa, override=True)
    with pytest.raises(ValueError):
        ppo_unlock_decision(rm, iaa, override=True, override_reason="   ")
    with pytest.raises(ValueError):
        ppo_unlock_decision(rm, iaa, override=False, override_reason="why not")


def test_override_is_recorded_and_changes_only_unlocked():
    rm, iaa = _rm(0.80, 0.76, 0.84), _iaa(0.90, 0.88, 0.92)
    plain = ppo_unlock_decision(rm, iaa)
    forced = ppo_unlock_decision(rm, iaa, override=True, override_reason="ablation: PPO on a weak RM")
    assert forced.unlocked and forced.overridden
    assert forced.override_reason == "ablation: PPO on a weak RM"
    assert forced.rule_verdict is False  # the rule's own verdict is kept
    a, b = plain.to_dict(), forced.to_dict()
    for k in ("unlocked", "overridden", "override_reason"):
        a.pop(k), b.pop(k)
    assert a == b  # every recorded number and the verdict are unchanged
    assert "OVERRIDE" in forced.summary()


def test_decision_is_json_serialisable():
    d = ppo_unlock_decision(_rm(0.96, 0.95, 0.97), _iaa(0.90, 0.88, 0.92))
    back = json.loads(d.to_json())
    assert back["unlocked"] is True and back["rule_verdict"] is True
    assert back["rm_ci"] == {"low": 0.95, "high": 0.97, "level": 0.95, "method": "test"}
    assert set(back) >= {
        "unlocked", "rm_agreement", "inter_annotator_agreement", "margin", "rule",
        "overridden", "override_reason", "statistically_clear", "rule_verdict",
    }


def test_unmeasured_rm_is_locked():
    r = rm_agreement([1.0], [0.0], [0])  # only an expert tie: n = 0, agreement NaN
    d = ppo_unlock_decision(r, IAA_HAND)
    assert not d.unlocked and d.comparison == NOT_MEASURED and d.margin is None
    assert json.loads(d.to_json())["rm_agreement"] is None


def _manifest_metrics(rm: Agreement, iaa) -> dict:
    """The reward-model manifest's metrics as read back from JSON (NaN recorded as null)."""
    return json.loads(json.dumps({"rm_agreement": rm.to_dict(), "inter_annotator_agreement": iaa.to_dict(),
                                  "train_loss": 0.5}))


def test_decide_from_metrics_equals_the_rule_on_the_dataclasses():
    # the flow decides from the manifest: the same decision as on the live dataclasses, override included
    rm, iaa = _rm(0.80, 0.76, 0.84), _iaa(0.90, 0.88, 0.92)
    metrics = _manifest_metrics(rm, iaa)
    assert decide_from_metrics(metrics) == ppo_unlock_decision(rm, iaa)
    forced = decide_from_metrics(metrics, override=True, override_reason="ablation")
    assert forced.unlocked and forced.rule_verdict is False and forced.override_reason == "ablation"
    assert Agreement.from_dict(metrics["rm_agreement"]) == rm
    # 0.625 decisive IAA on the hand matrix survives the JSON round trip; an RM at 0.7 beats it
    d = decide_from_metrics(_manifest_metrics(_rm(0.7, 0.6, 0.8), IAA_HAND))
    assert d.inter_annotator_agreement == pytest.approx(0.625) and d.iaa_n == 8 and d.unlocked
    back = UnlockDecision.from_dict(json.loads(d.to_json()))
    assert back == d


def test_decide_from_metrics_restores_nan_and_names_missing_keys():
    unmeasured = rm_agreement([1.0], [0.0], [0])  # agreement NaN, recorded as null
    d = decide_from_metrics(_manifest_metrics(unmeasured, IAA_HAND))
    assert math.isnan(d.rm_agreement) and not d.unlocked and d.comparison == NOT_MEASURED
    with pytest.raises(ValueError, match="inter_annotator_agreement"):
        decide_from_metrics({"rm_agreement": unmeasured.to_dict()})
    with pytest.raises(ValueError, match="missing fields \\['n_agree'\\]"):
        bad = unmeasured.to_dict()
        del bad["n_agree"]
        Agreement.from_dict(bad)


# ------------------------------------------------------------------------------------------
# Real data: PandaLM test set (../shared/datasets/pandalm, commit 3871806 of WeOpenML/PandaLM)
# ------------------------------------------------------------------------------------------

PANDALM = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "pandalm"
needs_pandalm = pytest.mark.skipif(
    not (PANDALM / "testset-v1.json").exists(), reason=f"PandaLM files not at {PANDALM}"
)


# The raw PandaLM files, read here (the product reads them through data.converters).


def load_pandalm_annotations(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Read PandaLM ``testset-v1.json``.

    Returns:
        (idx, labels): idx int array (n_items,); labels int array (n_items, 3) from
        annotator1..annotator3 (0 tie, 1 first better, 2 second better).

    Raises:
        ValueError: a row lacks an annotator field (names the row and field).
    """
    rows = json.loads(Path(path).read_text(encoding="utf-8"))
    idx, labels = [], []
    for r, row in enumerate(rows):
        for f in ("idx", "annotator1", "annotator2", "annotator3"):
            if f not in row:
                raise ValueError(f"{path}: row {r} has no field {f!r}")
        idx.append(int(row["idx"]))
        labels.append([int(row["annotator1"]), int(row["annotator2"]), int(row["annotator3"])])
    return np.asarray(idx, dtype=np.int64), np.asarray(labels, dtype=np.int64)


def load_pandalm_judge(
    path: str | Path, field: str = "gpt_result"
) -> tuple[np.ndarray, np.ndarray]:
    """Read a PandaLM judge file (e.g. ``gpt-3.5-turbo-testset-v1.json``).

    Returns:
        (idx, judge_labels): idx int array (n_items,); labels via ``parse_judge_verdict``.
    """
    rows = json.loads(Path(path).read_text(encoding="utf-8"))
    for r, row in enumerate(rows):
        for f in ("idx", field):
            if f not in row:
                raise ValueError(f"{path}: row {r} has no field {f!r}")
    idx = np.asarray([int(row["idx"]) for row in rows], dtype=np.int64)
    labels = np.asarray([parse_judge_verdict(row[field]) for row in rows], dtype=np.int64)
    return idx, labels


def align_by_idx(
    idx_a: np.ndarray, values_a: np.ndarray, idx_b: np.ndarray, values_b: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Align two per-item arrays on their ``idx`` keys (inner join, sorted by idx).

    Raises:
        ValueError: duplicate idx in either input, or the idx sets differ (names the missing ones).
    """
    for name, ix in (("a", idx_a), ("b", idx_b)):
        if len(np.unique(ix)) != len(ix):
            raise ValueError(f"duplicate idx in input {name}")
    sa, sb = set(idx_a.tolist()), set(idx_b.tolist())
    if sa != sb:
        raise ValueError(
            f"idx sets differ: only in a {sorted(sa - sb)[:10]}, only in b {sorted(sb - sa)[:10]}"
        )
    oa, ob = np.argsort(idx_a), np.argsort(idx_b)
    return idx_a[oa], np.asarray(values_a)[oa], np.asarray(values_b)[ob]


@pytest.fixture(scope="module")
def pandalm():
    idx, labels = load_pandalm_annotations(PANDALM / "testset-v1.json")
    jidx, judge = load_pandalm_judge(PANDALM / "gpt-3.5-turbo-testset-v1.json")
    _, labels, judge = align_by_idx(idx, labels, jidx, judge)
    return labels, judge


@pytest.fixture(scope="module")
def pandalm_iaa(pandalm):
    return inter_annotator_agreement(pandalm[0])  # ~3 s: the Fleiss-kappa bootstrap


@needs_pandalm
def test_pandalm_inter_annotator_agreement(pandalm, pandalm_iaa):
    # Measured with inter_annotator_agreement(labels) on the 999 x 3 matrix annotator1..3:
    #   all labels:  2757 agreeing of 999*3 = 2997 pair comparisons -> 0.919920
    #   decisive:    2482 agreeing of 2620 comparisons where both picked a side -> 0.947328
    #   leave-one-out vs majority of the other two: 2637/2757 = 0.956475 (decisive 2382/2451)
    #   ties: 326 of 2997 labels -> 0.108775; Fleiss' kappa (statsmodels) 0.864175
    # Cross-check with PandaLM's README (github.com/WeOpenML/PandaLM, "Test data"): Cohen's kappa
    # per annotator pair 0.85 / 0.88 / 0.86 and majority-label counts 0:105, 1:422, 2:472;
    # both reproduced below. Caveat from that README: items with large annotator divergence were
    # filtered out (2.5K -> 1K), so these agreements are inflated by selection.
    labels, _ = pandalm
    r = pandalm_iaa
    assert (r.n_items, r.n_annotators, r.n_no_majority) == (999, 3, 0)
    assert r.pairwise_agreement == pytest.approx(0.919920, abs=1e-4)
    assert r.pairwise_agreement_decisive == pytest.approx(0.947328, abs=1e-4)
    assert r.n_decisive_comparisons == 2620
    assert r.loo_majority_agreement == pytest.approx(0.956474, abs=1e-4)
    assert r.loo_majority_agreement_decisive == pytest.approx(0.971848, abs=1e-4)
    assert r.tie_share == pytest.approx(0.108775, abs=1e-4)
    assert r.fleiss_kappa == pytest.approx(0.864175, abs=1e-4)
    assert r.per_pair_cohen_kappa == pytest.approx(
        {"a1-a2": 0.852023, "a1-a3": 0.878944, "a2-a3": 0.861661}, abs=1e-4
    )
    assert [round(v, 2) for v in r.per_pair_cohen_kappa.values()] == [0.85, 0.88, 0.86]
    assert np.bincount(expert_labels(labels)).tolist() == [105, 422, 472]
    # bootstrap CIs (seeded): contain the point and are a few points wide
    ci = r.pairwise_agreement_decisive_ci
    assert ci.low < r.pairwise_agreement_decisive < ci.high and 0.01 < ci.high - ci.low < 0.05
    assert r.fleiss_kappa_ci.low < r.fleiss_kappa < r.fleiss_kappa_ci.high


@needs_pandalm
def test_pandalm_gpt35_judge_agreement(pandalm):
    # Measured with judge_agreement(gpt-3.5 verdicts, annotator matrix): 894 pairs with a decisive
    # majority label; the judge picks the same side on 692 -> 0.774049 (Wilson 0.745496-0.800257);
    # on those pairs it said Tie 33 times and gave an unparsed answer 12 times (25 unparsed in all);
    # 692 / (894 - 45) = 0.815077. Three-class accuracy vs the majority (ties a class): 0.697698.
    # The judge is below the 0.85 judge-agreement floor of DESIGN.md.
    labels, judge = pandalm
    r = judge_agreement(judge, labels)
    assert (r.n_items, r.n, r.n_agree) == (999, 894, 692)
    assert r.agreement == pytest.approx(0.774049, abs=1e-4)
    assert (r.ci.low, r.ci.high) == pytest.approx((0.745496, 0.800257), abs=1e-4)
    assert (r.n_expert_tie, r.n_tie, r.n_unparsed, r.n_unparsed_total) == (105, 33, 12, 25)
    assert r.agreement_excluding_abstentions == pytest.approx(0.815077, abs=1e-4)
    assert r.three_class_accuracy == pytest.approx(0.697698, abs=1e-4)


@needs_pandalm
def test_pandalm_unlock_decisions(pandalm, pandalm_iaa):
    labels, judge = pandalm
    iaa = pandalm_iaa
    expert = expert_labels(labels)
    # gpt-3.5's verdicts used as a reward model (side picked = higher score; tie/unparsed = equal
    # scores): 0.7740 vs human 0.9473 -> locked, clearly below.
    sf = (judge == 1).astype(float)
    ss = (judge == 2).astype(float)
    weak = ppo_unlock_decision(rm_agreement(sf, ss, expert), iaa)
    assert not weak.unlocked and weak.comparison == CLEARLY_BELOW
    assert weak.margin == pytest.approx(0.774049 - 0.947328, abs=1e-4)
    # an RM that reproduces the expert side everywhere: 1.0 > 0.9473 -> unlocked
    oracle = ppo_unlock_decision(
        rm_agreement((expert == 1).astype(float), (expert == 2).astype(float), expert), iaa
    )
    assert oracle.unlocked and oracle.rm_agreement == 1.0 and oracle.rm_n == 894
