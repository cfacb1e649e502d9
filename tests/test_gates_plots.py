"""Report plots (gates/plots.py): each writes a valid PNG and refuses empty input."""

import numpy as np
import pandas as pd
import pytest
from matplotlib import image as mpimg

from gates.drift import DriftCounters, drift_table
from gates.intent import intent_win_rates
from gates.plots import drift_plot, intent_heatmap, length_bucket_plot
from gates.winrate import length_bucketed_win_rate

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _valid_png(path):
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 1000
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 50 and img.shape[1] > 50


def test_intent_heatmap(tmp_path):
    p1, i1 = [2.0] * 14 + [1.0] * 6 + [2.0] * 3 + [1.0] * 17, ["chat"] * 20 + ["coding"] * 20
    t = intent_win_rates(p1, i1)
    wr = pd.DataFrame({"candidate_a": t["win_rate"], "candidate_b": [55.0, np.nan]}, index=t.index)
    n = pd.DataFrame({"candidate_a": t["n"], "candidate_b": [30, 0]}, index=t.index)
    out = intent_heatmap(wr, tmp_path / "sub" / "heat.png", n=n)
    assert out == tmp_path / "sub" / "heat.png"
    _valid_png(out)
    _valid_png(intent_heatmap({"m": {"x": 40.0, "y": 60.0}}, tmp_path / "heat2.png"))
    with pytest.raises(ValueError, match="at least one intent"):
        intent_heatmap(pd.DataFrame(), tmp_path / "empty.png")
    with pytest.raises(ValueError, match="PNG"):
        intent_heatmap(wr, tmp_path / "heat.jpg")


def test_length_bucket_plot(tmp_path):
    rng = np.random.default_rng(0)
    prefs = rng.choice([1.0, 2.0], size=60)
    lc = rng.integers(50, 300, size=60)
    lb = rng.integers(50, 300, size=60)
    res = length_bucketed_win_rate(prefs, lc, lb)
    _valid_png(length_bucket_plot(res, tmp_path / "buckets.png"))
    _valid_png(length_bucket_plot(res.buckets, tmp_path / "buckets2.png"))
    with pytest.raises(ValueError, match="non-empty"):
        length_bucket_plot(pd.DataFrame(), tmp_path / "e.png")
    empty = res.buckets.assign(n_total=0)
    with pytest.raises(ValueError, match="empty"):
        length_bucket_plot(empty, tmp_path / "e2.png")
    with pytest.raises(ValueError, match="lacks columns"):
        length_bucket_plot(pd.DataFrame({"bucket": [0]}), tmp_path / "e3.png")


def test_drift_plot(tmp_path):
    t = drift_table({
        "round 0": DriftCounters.from_figures(180, 8, 22, 14),
        "round 1": DriftCounters.from_figures(260, 31, 44, 29),
        "round 2": DriftCounters.from_figures(340, 52, 67, 41),
    })
    _valid_png(drift_plot(t, tmp_path / "drift.png"))
    with pytest.raises(ValueError, match="non-empty"):
        drift_plot(t.iloc[0:0], tmp_path / "e.png")
    with pytest.raises(ValueError, match="lacks columns"):
        drift_plot(t.drop(columns=["hedged_pct"]), tmp_path / "e2.png")


# ---------------------------------------------------------------------------------------------
# no empty bucket drawn as a value, every error bar the real interval, clipped drift band
# ---------------------------------------------------------------------------------------------


def test_bucket_bars_leave_empty_buckets_blank_and_use_wilson_intervals(tmp_path):
    from gates.plots import bucket_bars

    # 6 wins of 6, all in the matched bucket; the other four buckets are empty
    res = length_bucketed_win_rate([2.0] * 6, [100] * 6, [100] * 6)
    bars = bucket_bars(res.buckets).set_index("bucket")
    assert bars.loc[0, "n"] == 6 and bars.loc[0, "height"] == 100.0
    # Wilson 95% for 6/6: (1 + z^2/12 - z sqrt(z^2/144)) / (1 + z^2/6) = 0.6097
    assert bars.loc[0, "ci_low"] == pytest.approx(60.97, abs=0.01) and bars.loc[0, "ci_high"] == 100.0
    assert bars.loc[0, "err_below"] == pytest.approx(39.03, abs=0.01) and bars.loc[0, "err_above"] == 0.0
    for b in (-2, -1, 1, 2):
        assert bars.loc[b, "n"] == 0 and np.isnan(bars.loc[b, "height"]) and np.isnan(bars.loc[b, "err_below"])
    _valid_png(length_bucket_plot(res, tmp_path / "one_bucket.png"))


def test_drift_band_is_clipped_and_the_title_says_what_is_compared(tmp_path):
    from gates.plots import drift_band

    assert drift_band("restating_pct", 4.0, 10.0) == (0.0, 14.0)  # not -6
    assert drift_band("bullets_pct", 95.0, 10.0) == (85.0, 100.0)
    assert drift_band("median_length_tokens", 200.0, 0.25) == (150.0, 250.0)
    t = drift_table({"baseline (SFT)": DriftCounters.from_figures(40, 2, 0, 3),
                     "candidate": DriftCounters.from_figures(44, 3, 1, 2)})
    _valid_png(drift_plot(t, tmp_path / "drift.png"))
    from gates.plots import drift_title

    assert drift_title(list(t.index)) == "Personality drift: baseline (SFT) vs candidate"


def test_a_bucket_won_or_lost_every_time_plots(tmp_path):
    """0 of 3 and 10 of 10 (a demo round's length buckets): the Wilson bound lands a hair past the point in floating
    point (lower 4.9e-15 above 0%); the error bars must still be >= 0 or matplotlib refuses to draw the gate report."""
    from gates.plots import bucket_bars

    df = pd.DataFrame([
        {"bucket": -1, "ratio_low": 0.0, "ratio_high": 0.8, "win_rate": 0.0, "standard_error": 0.0, "n_total": 3},
        {"bucket": 0, "ratio_low": 0.8, "ratio_high": 1.25, "win_rate": 100.0, "standard_error": 0.0, "n_total": 10},
        {"bucket": 1, "ratio_low": 1.25, "ratio_high": np.inf, "win_rate": 50.0, "standard_error": 0.1, "n_total": 8},
    ])
    bars = bucket_bars(df)
    assert (bars["err_below"] >= 0).all() and (bars["err_above"] >= 0).all()
    assert bars["ci_low"][0] == 0.0 and bars["ci_high"][1] == 100.0
    assert bars["err_above"][0] == pytest.approx(56.1497, abs=1e-3)  # Wilson 95% upper bound of 0/3
    out = length_bucket_plot(df, tmp_path / "b.png")
    assert mpimg.imread(out).shape[0] > 100


def test_a_win_rate_that_is_not_a_percentage_is_refused():
    from gates.plots import bucket_bars

    row = {"bucket": 2, "ratio_low": 1.25, "ratio_high": np.inf, "standard_error": 0.0, "n_total": 6}
    with pytest.raises(ValueError, match="length bucket 2: win rate 101.0 is not a percentage"):
        bucket_bars(pd.DataFrame([{**row, "win_rate": 101.0}]))
    bars = bucket_bars(pd.DataFrame([{**row, "win_rate": 100.00000000001}]))  # rounding: clipped, not refused
    assert bars["height"][0] == 100.0 and bars["ci_high"][0] == 100.0
