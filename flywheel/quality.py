"""Weak-signal quality: how often each signal agrees with the expert verdict on the same turn.

Each signal implies a verdict: ``thumbs_down``, ``regenerate``, ``edit``, ``abandon`` -> "bad";
``thumbs_up``, ``copy``, ``continued`` -> "good". Over the turns that carry the signal and have an expert verdict,
agreement = share whose verdict is the implied one, with n and a Wilson score interval
(``judging.intervals.wilson``; Wilson 1927). For thumbs-down this is P(expert bad | thumbs-down), the
seed's 0.55.
"""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from judging.intervals import wilson

from .schema import SIGNALS

__all__ = ["IMPLIED", "expert_verdicts", "signal_quality"]

IMPLIED = {
    "thumbs_down": "bad",
    "regenerate": "bad",
    "edit": "bad",
    "abandon": "bad",
    "thumbs_up": "good",
    "copy": "good",
    "continued": "good",
}


def expert_verdicts(rows: Iterable[dict]) -> pd.DataFrame:
    """Per-turn expert verdict from label rows ``{"conversation_id", "turn_id", "annotator_id", "verdict"}``
    (verdict ``"good"`` / ``"bad"``): the strict majority of the turn's annotators; ties are left out.

    Returns:
        DataFrame with columns ``conversation_id``, ``turn_id``, ``expert_bad`` (bool), ``n_annotators``.

    Raises:
        ValueError: a row without those fields or with another verdict, naming the row (0-based).
    """
    recs = []
    for i, r in enumerate(rows):
        missing = [k for k in ("conversation_id", "turn_id", "annotator_id", "verdict") if k not in r]
        if missing:
            raise ValueError(f"expert labels row {i}: missing field(s) {missing}")
        if r["verdict"] not in ("good", "bad"):
            raise ValueError(f"expert labels row {i} field 'verdict': expected 'good' or 'bad', got {r['verdict']!r}")
        recs.append(
            {"conversation_id": r["conversation_id"], "turn_id": int(r["turn_id"]), "bad": r["verdict"] == "bad"}
        )
    if not recs:
        return pd.DataFrame(columns=["conversation_id", "turn_id", "expert_bad", "n_annotators"])
    df = pd.DataFrame(recs)
    g = df.groupby(["conversation_id", "turn_id"])["bad"].agg(["sum", "count"]).reset_index()
    g = g[g["sum"] * 2 != g["count"]]
    return pd.DataFrame(
        {
            "conversation_id": g["conversation_id"],
            "turn_id": g["turn_id"],
            "expert_bad": g["sum"] * 2 > g["count"],
            "n_annotators": g["count"],
        }
    ).reset_index(drop=True)


def signal_quality(turns: pd.DataFrame, verdicts: pd.DataFrame, *, alpha: float = 0.05) -> list[dict]:
    """One row per signal: ``signal``, ``implies``, ``n`` (turns with the signal and a verdict), ``agree``,
    ``agreement``, ``ci_low``, ``ci_high`` (Wilson, level 1 - alpha), ``n_turns_with_signal``.

    Args:
        turns: per-turn table with ``conversation_id``, ``turn_id`` and one count column per signal.
        verdicts: :func:`expert_verdicts` output.
    """
    merged = turns.merge(verdicts, on=["conversation_id", "turn_id"], how="inner")
    out = []
    for s in SIGNALS:
        has = merged[merged[s] > 0]
        n = len(has)
        agree = int((has["expert_bad"] == (IMPLIED[s] == "bad")).sum()) if n else 0
        lo, hi = wilson(agree, n, 1 - alpha) if n else (None, None)
        out.append(
            {
                "signal": s,
                "implies": IMPLIED[s],
                "n": n,
                "agree": agree,
                "agreement": round(agree / n, 4) if n else None,
                "ci_low": round(float(lo), 4) if n else None,
                "ci_high": round(float(hi), 4) if n else None,
                "n_turns_with_signal": int((turns[s] > 0).sum()),
            }
        )
    return out
