"""The pairwise label conventions, declared once.

Expert labels (PandaLM's convention; "expert" is the one name for labels given by people: annotators,
the majority of annotators, imported human labels):

* ``TIE = 0``: the two responses are similar in quality;
* ``FIRST = 1``: the first response (``PreferencePair.chosen``) is better;
* ``SECOND = 2``: the second response (``PreferencePair.rejected``) is better.

Two sentinels share the value -1 in label arrays: ``NO_MAJORITY`` (the annotators have no strict majority) and
``UNPARSED`` (a judge output that is not a verdict). A label is *decisive* when it is ``FIRST`` or ``SECOND``.

AlpacaEval preferences (``alpaca_eval/metrics/winrate.py``) compare a candidate against a baseline on a
continuous scale: ``BASELINE_WINS = 1.0``, ``CANDIDATE_WINS = 2.0``, ``DRAW = 1.5``, values in between are
weighted preferences. With the baseline as the first response and the candidate as the second, expert label
``SECOND`` is ``CANDIDATE_WINS``, ``FIRST`` is ``BASELINE_WINS`` and ``TIE`` is ``DRAW``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

TIE = 0
FIRST = 1
SECOND = 2
NO_MAJORITY = -1
UNPARSED = -1
LABELS = (TIE, FIRST, SECOND)
DECISIVE = (FIRST, SECOND)

BASELINE_WINS = 1.0
DRAW = 1.5
CANDIDATE_WINS = 2.0

_LABEL_TO_PREFERENCE = {TIE: DRAW, FIRST: BASELINE_WINS, SECOND: CANDIDATE_WINS}


def label_to_preference(labels: Any) -> np.ndarray:
    """Expert labels (baseline first, candidate second) -> AlpacaEval preferences.

    Args:
        labels: int array-like, shape (n,), values in {0 tie, 1 first better, 2 second better}; -1 (unparsed or
            no majority) becomes NaN (no annotation).

    Returns:
        float64 array, shape (n,): 1.5, 1.0, 2.0 or NaN.

    Raises:
        ValueError: a value outside {-1, 0, 1, 2}.
    """
    arr = np.asarray(labels)
    bad = ~np.isin(arr, (UNPARSED, *LABELS))
    if bad.any():
        raise ValueError(f"labels must be in {{-1, 0, 1, 2}}; item {int(np.argmax(bad))} has {arr.flat[np.argmax(bad)]!r}")
    out = np.full(arr.shape, np.nan, dtype=np.float64)
    for label, pref in _LABEL_TO_PREFERENCE.items():
        out[arr == label] = pref
    return out


def preference_to_label(preferences: Any) -> np.ndarray:
    """AlpacaEval preferences -> expert labels: < 1.5 -> 1 (baseline, the first, better), > 1.5 -> 2, == 1.5 -> 0,
    NaN -> -1 (``UNPARSED``).

    Raises:
        ValueError: a finite value outside [1, 2].
    """
    p = np.asarray(preferences, dtype=float)
    finite = np.isfinite(p)
    if ((p[finite] < BASELINE_WINS) | (p[finite] > CANDIDATE_WINS)).any():
        raise ValueError("AlpacaEval preferences must lie in [1, 2]")
    return np.where(~finite, UNPARSED, np.where(p > DRAW, SECOND, np.where(p < DRAW, FIRST, TIE))).astype(np.int64)


def scores_to_label(score_first: Any, score_second: Any) -> np.ndarray:
    """Two scores per pair -> label: the higher score's side wins, equal scores are a ``TIE``.

    Args:
        score_first, score_second: float arrays of the same shape (any unit; only the sign of the difference is
            used).

    Returns:
        int64 array of that shape, values in {0, 1, 2}.

    Raises:
        ValueError: shapes differ.
    """
    a, b = np.asarray(score_first, dtype=float), np.asarray(score_second, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"score_first {a.shape} and score_second {b.shape} differ in shape")
    return np.where(a > b, FIRST, np.where(b > a, SECOND, TIE)).astype(np.int64)


def scores_to_preference(score_baseline: Any, score_candidate: Any) -> np.ndarray:
    """Judge scores of (baseline, candidate) -> AlpacaEval preferences: 2.0 candidate higher, 1.0 baseline higher,
    1.5 equal. Shape (n,) float64."""
    return label_to_preference(scores_to_label(score_baseline, score_candidate))
