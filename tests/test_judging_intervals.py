"""The one home of confidence intervals: hand-worked values and the library each method comes from."""

import math

import numpy as np
import pytest
from statsmodels.stats.proportion import confint_proportions_2indep, proportion_confint

from judging.intervals import (
    Rate,
    bootstrap_means,
    bootstrap_ratio,
    exact,
    newcombe_diff,
    newcombe_paired_diff,
    normal,
    percentile,
    wilson,
)


def _wilson_by_hand(k: float, n: float, z: float = 1.959963984540054) -> tuple[float, float]:
    p = k / n
    den = 1 + z * z / n
    mid = p + z * z / (2 * n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (mid - half) / den, (mid + half) / den


def test_wilson_matches_the_formula_also_at_a_fractional_n():
    for k, n in ((8, 10), (0.875 * 784, 784), (1.75, 3.5)):
        assert wilson(k, n) == pytest.approx(_wilson_by_hand(k, n), abs=1e-12)
    lo, hi = wilson(0, 3)
    assert lo == pytest.approx(0.0, abs=1e-12) and hi == pytest.approx(0.5614970317550455)
    assert all(math.isnan(b) for b in wilson(0, 0))
    with pytest.raises(ValueError, match="0 <= k <= n"):
        wilson(4, 3)
    with pytest.raises(ValueError, match="confidence"):
        wilson(1, 3, confidence=1.0)


def test_exact_is_clopper_pearson_and_rate_carries_it():
    assert exact(0, 10)[0] == 0.0 and exact(0, 10)[1] == pytest.approx(1 - 0.025 ** (1 / 10))  # 0.3085
    assert exact(3, 10) == pytest.approx(proportion_confint(3, 10, alpha=0.05, method="beta"))
    r = Rate.from_counts(30, 100)
    assert (r.k, r.n, r.rate) == (30, 100, 0.3) and (r.ci_low, r.ci_high) == exact(30, 100)
    assert math.isnan(Rate.from_counts(0, 0).rate)
    with pytest.raises(ValueError):
        Rate.from_counts(5, 3)


def test_newcombe_intervals():
    # independent samples: statsmodels' "newcomb"; Newcombe (1998) example 56/70 - 48/80 = 0.2, CI 0.0524-0.3339
    lo, hi = newcombe_diff(56, 70, 48, 80)
    assert (lo, hi) == pytest.approx(confint_proportions_2indep(56, 70, 48, 80, method="newcomb", compare="diff"))
    assert (lo, hi) == pytest.approx((0.0524, 0.3339), abs=1e-4)
    assert all(math.isnan(b) for b in newcombe_diff(1, 0, 1, 2))
    # paired (same items): the difference (12 + 9 - 12 - 2) / 44 lies inside, and swapping the two sides mirrors it
    lo, hi = newcombe_paired_diff(12, 9, 2, 21)
    assert lo < 7 / 44 < hi
    assert newcombe_paired_diff(12, 2, 9, 21) == pytest.approx((-hi, -lo))
    # no discordant pairs: the difference is 0 and its interval contains it
    lo0, hi0 = newcombe_paired_diff(10, 0, 0, 0)
    assert lo0 <= 0.0 <= hi0
    with pytest.raises(ValueError, match="non-negative"):
        newcombe_paired_diff(-1, 0, 0, 0)


def test_normal_and_bootstrap():
    assert normal(50.0, 1.0, low=0.0, high=100.0) == pytest.approx((48.04, 51.96), abs=1e-2)
    assert normal(99.5, 1.0, low=0.0, high=100.0)[1] == 100.0
    assert all(math.isnan(b) for b in normal(math.nan, 1.0))
    assert percentile(np.arange(101.0), 0.9) == pytest.approx((5.0, 95.0))
    assert percentile([np.nan, np.inf, 1.0]) == (1.0, 1.0)
    rng = np.random.default_rng(0)
    means = bootstrap_means(np.array([0.0, 1.0]), 1000, rng)
    assert set(np.unique(means)) <= {0.0, 0.5, 1.0}
    ci = bootstrap_ratio(np.array([1.0, 1.0, 0.0, 1.0]), np.ones(4), 0.95, 500, 0)
    assert 0.0 <= ci.low <= 0.75 <= ci.high <= 1.0 and "percentile bootstrap" in ci.method
