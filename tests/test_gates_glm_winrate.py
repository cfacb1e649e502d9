"""AlpacaEval's row (gates/winrate.py, gates/glm_winrate.py): discrete win rate, LC standard error, and the
offline length_controlled_v1 GLM against the published leaderboard."""

import json
import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.special import expit

from data.loaders import load_alpaca_eval
from gates.glm_winrate import (
    DEFAULT_WEIGHTS,
    GlmPrior,
    glm_v1_win_rate,
    instruction_difficulty_from_models,
    load_glm_weights,
    published_lc_comparison,
    std_tanh_delta_len,
)
from gates.winrate import (
    BUCKETED_COLUMNS,
    WIN_RATE_COLUMNS,
    glm_length_controlled_win_rate,
    per_item_lengths,
    win_rate,
    win_rate_gate,
)

SHARED = Path(os.environ.get("RLHF_SHARED_DATASETS", Path(__file__).resolve().parents[2] / "shared" / "datasets"))
ALPACA = SHARED / "alpaca_eval"
needs_alpaca = pytest.mark.skipif(not ALPACA.is_dir(), reason=f"AlpacaEval files not found at {ALPACA}")
MODELS = ("alpaca-7b", "gpt-3.5-turbo-1106", "gpt-3.5-turbo-1106_concise")
LEADERBOARD = "demo:alpaca_eval/leaderboards/weighted_alpaca_eval_gpt4_turbo_leaderboard.csv"


def leaderboard() -> pd.DataFrame:
    from data.bundle import demo_path

    return pd.read_csv(demo_path(LEADERBOARD), index_col=0)


# ---------------------------------------------------------------------------------------------
# the row's columns
# ---------------------------------------------------------------------------------------------


def test_columns_are_alpaca_eval_leaderboard_columns_in_order():
    published = [c for c in leaderboard().columns if c not in ("mode", "avg_length")]
    assert list(WIN_RATE_COLUMNS) == published


def test_discrete_win_rate_hand_worked():
    # weighted: (1 + 0 + 0.5 + 0.7 + 0.2) / 5 = 48%; discrete (ZeroOneScoringRule): 1.7 -> win, 1.2 -> loss,
    # 1.5 stays a draw: (2 wins + 1 draw / 2) / 5 = 50%
    row = win_rate([2, 1, 1.5, 1.7, 1.2]).iloc[0]
    assert row["win_rate"] == pytest.approx(48.0, abs=1e-12)
    assert row["discrete_win_rate"] == pytest.approx(50.0, abs=1e-12)
    assert (row["n_wins"], row["n_wins_base"], row["n_draws"]) == (2, 2, 1)
    assert math.isnan(row["lc_standard_error"])


@pytest.mark.parametrize("model", ("gpt-3.5-turbo-1106", "gpt-3.5-turbo-1106_concise"))
def test_published_discrete_win_rate_reproduced_from_the_bundle(model):
    rows = load_alpaca_eval(f"demo:alpaca_eval/annotations/{model}.jsonl.gz")
    ours = win_rate([r.preference for r in rows]).iloc[0]
    pub = leaderboard().loc[model]
    assert ours["discrete_win_rate"] == pytest.approx(pub["discrete_win_rate"], abs=1e-9)
    assert ours["win_rate"] == pytest.approx(pub["win_rate"], abs=1e-9)


def test_gate_row_carries_discrete_win_rate_and_lc_standard_error():
    # DESIGN.md seed set (tests/test_gates_winrate.py): 133 wins, 2 draws, 115 losses; matched subset 63/1/61
    prefs = [2.0] * 63 + [1.5] + [1.0] * 61 + [2.0] * 70 + [1.5] + [1.0] * 54
    len_b, len_a = [210] * 125 + [340] * 125, [210] * 250
    g = win_rate_gate(prefs, len_b, len_a)
    row = g.table[0]
    assert list(row) == [*WIN_RATE_COLUMNS, *BUCKETED_COLUMNS["matched"]]
    assert row["discrete_win_rate"] == pytest.approx(53.6, abs=1e-9)  # no weighted preferences: = win_rate
    matched = pd.Series([1.0] * 63 + [0.5] + [0.0] * 61)
    assert row["length_matched_winrate"] == pytest.approx(matched.mean() * 100, abs=1e-9)
    assert row["length_matched_standard_error"] == pytest.approx(matched.sem() * 100, abs=1e-9)
    # alpaca_eval's LC columns hold only the GLM's figure: none without a GLM
    assert math.isnan(row["length_controlled_winrate"]) and math.isnan(row["lc_standard_error"])
    assert "length_controlled_winrate" not in g.metrics and "length_matched_win_rate" in g.metrics
    prior = GlmPrior.from_weights(load_glm_weights())
    g2 = win_rate_gate(prefs, len_b, len_a, glm_prior=prior)
    assert g2.verdict == g.verdict  # the GLM is shown, it does not decide
    glm = glm_v1_win_rate(prefs, len_b, len_a, prior=prior)
    assert g2.metrics["length_controlled_winrate"].value == pytest.approx(glm.length_controlled_winrate)
    assert g2.table[0]["length_controlled_winrate"] == pytest.approx(glm.length_controlled_winrate)
    assert g2.table[0]["lc_standard_error"] == 0.0  # no difficulty term: every prediction equal (alpaca_eval's sem)
    assert g2.table[0]["length_matched_winrate"] == row["length_matched_winrate"]
    assert abs(glm.length_controlled_winrate - row["length_matched_winrate"]) > 0.1  # two different figures
    assert g2.finding("win_rate").values["length_controlled_winrate"] == pytest.approx(glm.length_controlled_winrate)
    assert g.finding("win_rate").values["length_controlled_winrate"] is None


# ---------------------------------------------------------------------------------------------
# the GLM
# ---------------------------------------------------------------------------------------------


def test_unpenalised_minimal_glm_equals_the_sklearn_fit():
    rows = load_alpaca_eval("demo:alpaca_eval/annotations/gpt-3.5-turbo-1106.jsonl.gz")
    p = [r.preference for r in rows]
    lc, lb = per_item_lengths([r.output_2 for r in rows]), per_item_lengths([r.output_1 for r in rows])
    ours = glm_v1_win_rate(p, lc, lb)
    ref = glm_length_controlled_win_rate(p, lc, lb)  # sklearn LogisticRegression, C = inf
    assert ours.length_controlled_winrate == pytest.approx(ref.length_controlled_winrate, abs=1e-4)
    assert ours.phi == pytest.approx(float(ref.buckets.loc[0, "phi_tanh_std_delta_len"]), abs=1e-4)
    assert ours.lc_standard_error == 0.0  # alpaca_eval's sem of identical predictions


def test_prior_pulls_the_length_coefficient_and_a_tight_prior_fixes_it():
    rows = load_alpaca_eval("demo:alpaca_eval/annotations/gpt-3.5-turbo-1106.jsonl.gz")[:50]
    p = [r.preference for r in rows]
    lc, lb = per_item_lengths([r.output_2 for r in rows]), per_item_lengths([r.output_1 for r in rows])
    free = glm_v1_win_rate(p, lc, lb)
    prior = GlmPrior.from_weights(load_glm_weights())
    assert prior.n_models == 199  # 200 rows minus the baseline's own all-zero row
    assert prior.length_mean == pytest.approx(-1.5102, abs=1e-4)
    shrunk = glm_v1_win_rate(p, lc, lb, prior=prior)
    lo, hi = sorted((free.phi, prior.length_mean))
    assert lo < shrunk.phi < hi
    tight = GlmPrior(prior.length_mean, 1e-6, prior.difficulty_mean, 1e-6, 1)
    assert glm_v1_win_rate(p, lc, lb, prior=tight).phi == pytest.approx(prior.length_mean, abs=1e-4)


def test_lc_standard_error_is_the_sem_of_the_predicted_preferences():
    rng = np.random.default_rng(0)
    n = 40
    d = rng.normal(size=n)
    lc, lb = rng.integers(100, 900, n).astype(float), rng.integers(100, 900, n).astype(float)
    p = 1 + expit(0.3 + 0.8 * d - 1.2 * std_tanh_delta_len(lc, lb))
    g = glm_v1_win_rate(p, lc, lb, instruction_difficulty=d)
    pred = expit(g.theta + g.psi * d)
    assert g.length_controlled_winrate == pytest.approx(pred.mean() * 100, abs=1e-9)
    assert g.lc_standard_error == pytest.approx(pred.std(ddof=1) / math.sqrt(n) * 100, abs=1e-9)
    # noiseless soft labels from the model itself: the MLE recovers its coefficients
    assert (g.theta, g.phi, g.psi) == pytest.approx((0.3, -1.2, 0.8), abs=1e-3)


def test_instruction_difficulty_is_the_map_of_the_fixed_published_models():
    w = pd.DataFrame(
        {"np.tanh(std_delta_len)": [0.0, -1.0], "instruction_difficulty": [1.0, 2.0],
         "not_gamed_baseline.astype(float)": [0.0, 0.5]}, index=["a", "b"],
    )
    # one model, psi = 1, no offset, y = 0.5: the likelihood and the prior both peak at d = 0
    d = instruction_difficulty_from_models({"a": ([1.5, 1.5], [10, 20], [10, 20])}, w)
    np.testing.assert_allclose(d, 0.0, atol=1e-12)
    # two models: the gradient of the MAP objective is zero at the answer
    ann = {"a": ([1.9, 1.2, 1.6], [100, 300, 200], [200, 100, 250]), "b": ([1.7, 1.1, 1.5], [50, 400, 90], [60, 80, 300])}
    s = 3.0
    d = instruction_difficulty_from_models(ann, w, prior_sd=s)
    grad = d / s**2
    for m, (p, l_m, l_b) in ann.items():
        off = w.loc[m, "not_gamed_baseline.astype(float)"] + w.loc[m, "np.tanh(std_delta_len)"] * std_tanh_delta_len(l_m, l_b)
        psi = w.loc[m, "instruction_difficulty"]
        grad = grad + psi * (expit(off + psi * d) - (np.asarray(p) - 1))
    np.testing.assert_allclose(grad, 0.0, atol=1e-9)
    with pytest.raises(ValueError, match="no published GLM weights"):
        instruction_difficulty_from_models({"zzz": ([1.5], [1], [1])}, w)


def test_weights_file_checked(tmp_path):
    assert len(load_glm_weights(DEFAULT_WEIGHTS)) == 200
    bad = tmp_path / "w.csv"
    bad.write_text(",np.tanh(std_delta_len),instruction_difficulty\nm,1,2\n")
    with pytest.raises(ValueError, match="not_gamed_baseline"):
        load_glm_weights(bad)
    bad.write_text(",np.tanh(std_delta_len),instruction_difficulty,not_gamed_baseline.astype(float)\nm,1,x,3\n")
    with pytest.raises(ValueError, match="row 0 .*instruction_difficulty"):
        load_glm_weights(bad)


# ---------------------------------------------------------------------------------------------
# published LC of the three shared models
# ---------------------------------------------------------------------------------------------

LC_TOLERANCE = 1.0  # LC points; measured here: +0.19, +0.13, -0.50 (README, "AlpacaEval row")


@needs_alpaca
def test_offline_length_controlled_v1_lands_near_the_published_lc():
    ann = {m: json.loads((ALPACA / "annotations" / f"{m}.weighted_alpaca_eval_gpt4_turbo.annotations.json").read_text())
           for m in MODELS}
    lb = pd.read_csv(ALPACA / "leaderboards" / "weighted_alpaca_eval_gpt4_turbo_leaderboard.csv", index_col=0)
    t = published_lc_comparison(ann, load_glm_weights(), lb)
    print("\n" + t.round(3).to_string())
    for m in MODELS:
        r = t.loc[m]
        assert r["win_rate"] == pytest.approx(r["published_win_rate"], abs=1e-9)
        assert r["discrete_win_rate"] == pytest.approx(r["published_discrete_win_rate"], abs=1e-9)
        assert abs(r["lc_error"]) <= LC_TOLERANCE, m
        # the minimal GLM (no difficulty term) is far off: the difficulty term matters
        assert r["lc_minimal"] - r["published_lc"] > 4
        assert 0 < r["lc_standard_error"] < 1
    assert t.loc["gpt-3.5-turbo-1106", "length_controlled_winrate"] == pytest.approx(19.4326, abs=1e-3)
