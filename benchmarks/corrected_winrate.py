"""The judge-corrected win rate (``gates.winrate_corrected``) on simulated judges: coverage and decision rate.

Each trial draws what a round measures when a judge of agreement ``a`` compares a candidate whose true win rate is
``p`` against a baseline on ``n`` prompts:
  * the win-rate items: each item's true winner is the candidate with probability p; the judge names the true winner
    with probability a, whichever side it is (the symmetric model the correction assumes), so the judged wins are
    Binomial(n, a p + (1 - a)(1 - p)); the measured win rate w and its SE are alpaca_eval's (mean and sem, ddof 1);
  * the judge's qualification: ``n_labels`` decisive expert labels, of which Binomial(n_labels, a) agree with it;
    the measured agreement is their share (item-level, design effect 1);
  * corrected mode: ``corrected_win_rate(w, se, n, a_hat, n_labels)`` (Fieller interval carrying both errors);
    a trial whose a_hat <= HARD_MIN_AGREEMENT makes no decision;
  * floor mode: the judge-agreement gate (``gates.judge.verdict`` on the ``Agreement`` record built from the labels,
    Wilson interval vs the 0.85 floor); a win rate can decide only when that gate passes.

Printed per setting: the share of trials whose measured agreement is at or below the hard minimum (no decision, no
interval), the coverage of the corrected interval over the other trials (share whose interval holds the true win
rate; target 95%), the delta-method interval's coverage for comparison (not used by the gate), mean interval width,
the corrected decision rate against 50% (pass = interval above, block = below), and floor mode's decision rate.
The settings are the issue's: a = 0.71 (the best published judges on AlpacaEval's cross-annotated pairs), a true
4-point gap (p = 0.54), n = 805 (AlpacaEval's prompts) and n = 5,000, with 500 expert labels; plus 100 labels and
a = 0.65 to show the interval widening with the judge's own uncertainty, and a true win rate of 50% (no gap: the
decision rate is then the false-decision rate, target 5%). Then the README's worked example: the same figures at
their expected values (no simulation).

Run: ``PYTHONPATH=. python benchmarks/corrected_winrate.py [--trials 4000] [--seed 0]`` (about 20 s on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import math

import numpy as np
from scipy import stats

from gates.judge import DEFAULT_FLOOR, verdict
from gates.winrate_corrected import HARD_MIN_AGREEMENT, corrected_win_rate
from judging.agreement import judge_agreement

#: (a, true win rate in percent, n win-rate items, n expert labels)
SETTINGS = (
    (0.71, 54.0, 805, 500),
    (0.71, 54.0, 5000, 500),
    (0.71, 54.0, 5000, 100),
    (0.65, 54.0, 5000, 500),
    (0.71, 50.0, 5000, 500),
)
TARGET_COVERAGE = 0.95


def _floor_decides(k_agree: int, n_labels: int, cache: dict) -> bool:
    """Whether floor mode lets a win rate decide: the judge-agreement gate passes on this many agreeing labels."""
    if k_agree not in cache:
        labels = np.ones(n_labels, dtype=int)
        judged = np.r_[np.ones(k_agree, dtype=int), np.full(n_labels - k_agree, 2)]
        cache[k_agree] = verdict(judge_agreement(judged, labels), DEFAULT_FLOOR)[0] == "pass"
    return cache[k_agree]


def simulate(a: float, true_wr: float, n: int, n_labels: int, trials: int, rng: np.random.Generator) -> dict:
    """One setting's figures over ``trials`` simulated rounds (see the module docstring)."""
    p = true_wr / 100
    wins = rng.binomial(n, a * p + (1 - a) * (1 - p), size=trials)
    agree = rng.binomial(n_labels, a, size=trials)
    z = float(stats.norm.ppf(0.975))
    covered = covered_delta = decided = passed = blocked = floor_decided = 0
    widths, floor_cache = [], {}
    for k, k_a in zip(wins, agree):
        w = 100 * k / n
        se = 100 * math.sqrt((k / n) * (1 - k / n) / (n - 1))
        a_hat = k_a / n_labels
        floor_decided += _floor_decides(int(k_a), n_labels, floor_cache) and a_hat > HARD_MIN_AGREEMENT
        if a_hat <= HARD_MIN_AGREEMENT:
            continue  # no decision and no interval: counted apart (``below_hard_min``), not in the coverage
        cw = corrected_win_rate(w, se, n, a_hat, n_labels)
        covered += cw.ci_low <= true_wr <= cw.ci_high
        widths.append(cw.ci_high - cw.ci_low)
        passed += cw.side == "above"
        blocked += cw.side == "below"
        f, g = 2 * a_hat - 1, w - 50
        half = z * math.sqrt(se ** 2 / f ** 2 + g ** 2 * 4 * a_hat * (1 - a_hat) / n_labels / f ** 4)
        covered_delta += abs(cw.corrected - true_wr) <= half
    decided = passed + blocked
    computed = len(widths)
    return {"a": a, "true_win_rate": true_wr, "n": n, "n_labels": n_labels, "trials": trials,
            "below_hard_min": (trials - computed) / trials,
            "coverage": covered / computed if computed else math.nan,
            "coverage_delta": covered_delta / computed if computed else math.nan,
            "mean_width": float(np.mean(widths)) if widths else math.nan,
            "decided": decided / trials, "passed": passed / trials, "blocked": blocked / trials,
            "floor_decided": floor_decided / trials}


#: The README's worked example: a = 0.71 on 500 decisive expert labels, a true 4-point gap, n = 805 and 5,000.
EXAMPLE = (0.71, 54.0, (805, 5000), 500)


def worked_example(a: float = EXAMPLE[0], true_wr: float = EXAMPLE[1], ns: tuple[int, ...] = EXAMPLE[2],
                   n_labels: int = EXAMPLE[3]) -> list[dict]:
    """The corrected figures at their expected values: the measured win rate 50 + (true - 50)(2a - 1), its SE
    alpaca_eval's at that rate, the agreement exactly a (no simulation)."""
    w = 50 + (true_wr - 50) * (2 * a - 1)
    rows = []
    for n in ns:
        se = 100 * math.sqrt((w / 100) * (1 - w / 100) / (n - 1))
        cw = corrected_win_rate(w, se, n, a, n_labels)
        rows.append({"n": n, "observed_gap": w - 50, "corrected_gap": cw.corrected - 50, "ci_low": cw.ci_low,
                     "ci_high": cw.ci_high, "side": cw.side, "items_needed": cw.items_needed})
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    rows = [simulate(*s, args.trials, rng) for s in SETTINGS]
    print(f"judge-corrected win rate: {args.trials} simulated rounds per setting; target coverage "
          f"{100 * TARGET_COVERAGE:.0f}% (Monte Carlo SE {100 * math.sqrt(0.95 * 0.05 / args.trials):.1f} points)")
    print("| a | true win rate | n | expert labels | a_hat <= 0.6 (no decision) | coverage (Fieller) "
          "| coverage (delta, not used) | mean width | corrected: decided (pass / block) | floor mode: decided |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['a']:.2f} | {r['true_win_rate']:.1f}% | {r['n']} | {r['n_labels']} "
              f"| {100 * r['below_hard_min']:.1f}% | {100 * r['coverage']:.1f}% "
              f"| {100 * r['coverage_delta']:.1f}% | {r['mean_width']:.1f} points | {100 * r['decided']:.1f}% "
              f"({100 * r['passed']:.1f}% / {100 * r['blocked']:.1f}%) | {100 * r['floor_decided']:.1f}% |")
    a, true_wr, _, n_labels = EXAMPLE
    print(f"\nworked example at expected values: a = {a} on {n_labels} expert labels, true win rate {true_wr:g}%")
    print("| prompts n | observed gap | corrected gap | 95% interval (width) | decisive at 50%? | prompts needed |")
    print("|---|---|---|---|---|---|")
    for e in worked_example():
        decisive = {"above": "yes: pass", "below": "yes: block"}.get(e["side"], "no: contains 50%")
        print(f"| {e['n']:,} | {e['observed_gap']:+.2f} points | {e['corrected_gap']:+.2f} points | "
              f"{e['ci_low']:.1f}-{e['ci_high']:.1f}% ({e['ci_high'] - e['ci_low']:.1f} points) | {decisive} | "
              f"about {e['items_needed']:,} |")
    return rows


if __name__ == "__main__":
    main()
