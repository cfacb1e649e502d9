"""A judged win rate corrected for the judge's measured error, with an interval that carries both sampling errors.

Model (``gates.judge``): a judge that picks the truly better side of a pair with probability ``a``, whichever side
that is (symmetric misclassification), measures ``w = a p + (1 - a)(1 - p)`` for a true win rate ``p``, so
``w - 1/2 = (2a - 1)(p - 1/2)``. Inverted, in percent::

    w* = 50 + (w - 50) / (2a - 1)

This is the Rogan-Gladen estimator (Rogan & Gladen 1978, Am. J. Epidemiol. 107:71-76; ``p = (q + Sp - 1) /
(Se + Sp - 1)``) with sensitivity = specificity = a; ``gates.refusal_stats.corrected_rate`` uses the same estimator
with two error rates for the refusal rates.

Interval. The corrected gap ``w* - 50 = g / f`` is a ratio of two independent estimates: ``g = w - 50`` from the
win-rate items (standard error ``se_w``, the gate's cluster-robust SE of the deciding figure) and ``f = 2a - 1``
from the expert labels the judge was measured on (standard error ``2 sqrt(a (1 - a) / n_eff)``, Wald's on the
effective n of the clustered labels, ``judging.agreement.Agreement.n_eff``). Its interval is Fieller's
(``judging.intervals.fieller_ratio``): the corrected gaps rho for which ``(g - rho f) / sqrt(se_w^2 + rho^2
se_f^2)`` is within +/- z. To first order its half-width is the delta method's ``z sqrt(se_w^2 / f^2 + g^2 se_f^2 /
f^4)`` (Greenland 1988, Stat. Med. 7:745-757: the variance of a misclassification-corrected estimate carries the
variance of the measured error rates); Fieller's keeps its coverage when f is uncertain (benchmarks/
corrected_winrate.py measures it).

Decision at a bar ``b`` (percent, on the corrected scale; rho0 = b - 50): decisive exactly when the interval is
bounded (f shown > 0) and excludes b, i.e. ``(g - rho0 f)^2 > z^2 (se_w^2 + rho0^2 se_f^2)``. At the usual bar of 50
(rho0 = 0) the agreement's uncertainty drops out of that test: under the model the corrected win rate is 50 exactly
when the measured one is, for any a > 1/2; what a weak judge costs is power, the measured gap being shrunk by f.

Items needed (at the current w, se_w and a): with the per-item variance ``s^2 = se_w^2 n`` (n items in the figure,
the design effect included), the test above is decisive once ``n > z^2 s^2 / ((g - rho0 f)^2 - z^2 rho0^2 se_f^2)``;
no n decides it when that denominator is <= 0 (the agreement's uncertainty alone keeps the bar inside; more expert
labels are needed) or when f is not shown > 0. Labels needed (at the current win-rate items): the smallest number of
expert labels with f shown > 0 (``n_eff > 4 z^2 a (1 - a) / f^2``) and, for rho0 != 0, ``n_eff > 4 z^2 rho0^2 a (1 -
a) / ((g - rho0 f)^2 - z^2 se_w^2)``, times the labels' design effect.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

from scipy import stats

from judging.intervals import DEFAULT_CONFIDENCE, fieller_ratio

#: At or below this agreement no judged gate decides, in either decision mode: f = 2a - 1 <= 0.2 shrinks a gap
#: five-fold or more (25x the items), and a few points of error in a swing the correction by a large factor.
HARD_MIN_AGREEMENT = 0.6

#: The judge-decision modes (``GateStageConfig.judge_decision``): ``floor`` (a judge must clear ``judge_floor`` on
#: its interval before any win rate decides) and ``corrected`` (the win rates decide on the corrected effect).
JUDGE_DECISIONS: tuple[str, ...] = ("floor", "corrected")

Side = Literal["above", "below", "straddles", "unbounded"]


def corrected_win_rate_point(measured: float, a: float) -> float:
    """``50 + (measured - 50) / (2a - 1)``, percent, not clipped.

    Raises:
        ValueError: a not in (0.5, 1] (at or below 0.5 the judge carries no information).
    """
    a = float(a)
    if not (0.5 < a <= 1.0):
        raise ValueError(f"agreement a must be in (0.5, 1] to correct a win rate, got {a}")
    return 50.0 + (float(measured) - 50.0) / (2.0 * a - 1.0)


@dataclass(frozen=True)
class CorrectedWinRate:
    """A measured win rate, the judge's agreement, the corrected win rate and its interval, and what would decide it.

    Fields (percent unless said):
        measured, measured_se: the judged figure and its SE; n: items in it.
        agreement: a (fraction); agreement_se: sqrt(a (1 - a) / n_labels_eff); n_labels_eff: the labels' effective n;
            labels_design_effect: their design effect (>= 1).
        attenuation: 2a - 1. corrected: w* (not clipped; may leave [0, 100] when the measured gap is larger than the
            judge could produce). ci_low, ci_high: Fieller's interval, clipped to [0, 100]; [0, 100] when unbounded.
        bar, confidence: the threshold (corrected scale) and the level.
        side: "above" (ci_low > bar), "below" (ci_high < bar), "straddles", or "unbounded" (f not shown > 0).
        items_needed: items (same design) at which the interval would exclude the bar at the current w and a;
            None when no number of items does. labels_needed: expert labels (same design) at which it would, at the
            current items; None when no number of labels does.
    """

    measured: float
    measured_se: float
    n: int
    agreement: float
    agreement_se: float
    n_labels_eff: float
    labels_design_effect: float
    attenuation: float
    corrected: float
    ci_low: float
    ci_high: float
    bar: float
    confidence: float
    side: Side
    items_needed: int | None
    labels_needed: int | None

    @property
    def decisive(self) -> bool:
        return self.side in ("above", "below")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def corrected_win_rate(
    measured: float,
    measured_se: float,
    n: int,
    a: float,
    n_labels_eff: float,
    *,
    bar: float = 50.0,
    confidence: float = DEFAULT_CONFIDENCE,
    labels_design_effect: float = 1.0,
) -> CorrectedWinRate:
    """The corrected win rate, its Fieller interval and the n that would decide it (formulas: module docstring).

    Args:
        measured: the judged win rate, percent. measured_se: its SE, percent (cluster-robust where items cluster).
        n: items behind ``measured`` (for ``items_needed``).
        a: the judge's agreement with decisive expert labels, fraction in (0.5, 1].
        n_labels_eff: effective number of those labels (``Agreement.n_eff``), > 0.
        bar: percent, the threshold on the corrected scale. confidence: two-sided level.
        labels_design_effect: the labels' design effect (``Agreement.design_effect``), to turn effective labels
            needed into labels.

    Raises:
        ValueError: a not in (0.5, 1], non-finite measured / SE, a negative SE, n < 1, n_labels_eff <= 0, or a
            design effect < 1.
    """
    point = corrected_win_rate_point(measured, a)
    if not (math.isfinite(measured_se) and measured_se >= 0):
        raise ValueError(f"measured_se must be a finite number >= 0, got {measured_se}")
    if n < 1 or not (n_labels_eff > 0):
        raise ValueError(f"need n >= 1 items and n_labels_eff > 0 labels, got n={n}, n_labels_eff={n_labels_eff}")
    if not labels_design_effect >= 1.0:
        raise ValueError(f"labels_design_effect must be >= 1, got {labels_design_effect}")
    z2 = float(stats.norm.ppf(0.5 + confidence / 2)) ** 2
    a = float(a)
    f = 2.0 * a - 1.0
    g = float(measured) - 50.0
    se_a = math.sqrt(a * (1.0 - a) / n_labels_eff)
    se_f = 2.0 * se_a
    lo, hi = fieller_ratio(g, measured_se, f, se_f, confidence)
    bounded = math.isfinite(lo) and math.isfinite(hi)
    lo, hi = (max(0.0, 50.0 + lo), min(100.0, 50.0 + hi)) if bounded else (0.0, 100.0)
    rho0 = float(bar) - 50.0
    if not bounded:
        side: Side = "unbounded"
    elif lo > bar:
        side = "above"
    elif hi < bar:
        side = "below"
    else:
        side = "straddles"
    # items: the pivot at rho0 exceeds z once n > z^2 s^2 / ((g - rho0 f)^2 - z^2 rho0^2 se_f^2)
    items = None
    denom = (g - rho0 * f) ** 2 - z2 * rho0 ** 2 * se_f ** 2
    if bounded and denom > 0:
        items = max(1, math.floor(z2 * measured_se ** 2 * n / denom) + 1)
    # labels: f shown > 0 and, for rho0 != 0, the pivot exceeding z, at the current items
    labels = None
    var_a_unit = 4.0 * a * (1.0 - a)  # se_f^2 times the effective labels
    spare = (g - rho0 * f) ** 2 - z2 * measured_se ** 2
    if spare > 0 and f > 0:
        need = z2 * var_a_unit / (f * f)
        if rho0 != 0:
            need = max(need, z2 * rho0 ** 2 * var_a_unit / spare)
        labels = max(1, math.floor(need * labels_design_effect) + 1)
    return CorrectedWinRate(
        measured=float(measured), measured_se=float(measured_se), n=int(n), agreement=a, agreement_se=se_a,
        n_labels_eff=float(n_labels_eff), labels_design_effect=float(labels_design_effect), attenuation=f,
        corrected=point, ci_low=lo, ci_high=hi, bar=float(bar), confidence=float(confidence), side=side,
        items_needed=items, labels_needed=labels,
    )
