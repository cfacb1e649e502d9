"""Disagreement selection: which turns experts should label (a pure function, no I/O).

A turn is worth an expert's time when its weak signals and the judge disagree. The judge's score is turned into a
quality ``q`` in [0, 1] by its percentile rank among the turns being selected from (``q = (rank - 0.5) / n``,
ties averaged), so the rules below do not depend on the judge's scale. Each rule that fires gives a strength:

=============================  ============================================  ==================
kind                           fires when                                    strength
=============================  ============================================  ==================
``thumbs_down_judged_good``    a thumbs-down and ``q >= good``               ``q``
``regenerate_judged_excellent`` a regenerate and ``q >= excellent``          ``q``
``thumbs_up_judged_poor``      a thumbs-up and ``q <= poor``                 ``1 - q``
=============================  ============================================  ==================

A turn's disagreement score is the largest strength among the rules that fire (its ``kind`` is that rule's); a turn
no rule fires on is not a candidate. Turns without a judge score are not candidates either (reported).

Budget: ``budget`` turns (an integer >= 0), default ``ceil(budget_fraction * n_turns)`` (0.5%; a fraction in
[0, 1]); the selection never holds more than the budget (budget 0 selects nothing). Each intent with candidates
first gets ``floor`` turns (so small intents are seen); when the floors do not all fit in the budget, they are
given by traffic share, largest first (ties: intent name), until the budget is spent, and the intents left without
one are listed in ``Selection.floors_not_met``. The rest of the budget is split by the traffic table's shares
(largest remainder); turns whose intent is unknown or not in the table share what the table
leaves unassigned (``1 - sum(shares)``, as intent ``"other"``). Within an intent, the strongest candidates are taken
first (ties: conversation id, turn id, user id, response hash). Candidates are deduplicated by normalised prompt first (the strongest turn
of each prompt stays). Budget an intent cannot use (too few candidates) goes to the strongest remaining candidates
of any intent.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy.stats import rankdata

__all__ = ["KINDS", "OTHER", "Selection", "SelectionConfig", "judge_quality", "select_turns"]

KINDS = ("thumbs_down_judged_good", "regenerate_judged_excellent", "thumbs_up_judged_poor")
OTHER = "other"


@dataclass(frozen=True)
class SelectionConfig:
    """Thresholds and budget of :func:`select_turns` (see the module docstring).

    Raises:
        ValueError: ``budget`` or ``floor`` not an integer >= 0 (a fraction, a negative number, a bool),
            ``budget_fraction`` not a number in [0, 1], a threshold outside [0, 1].
    """

    budget_fraction: float = 0.005
    budget: int | None = None
    floor: int = 1
    good: float = 0.7
    excellent: float = 0.9
    poor: float = 0.3

    def __post_init__(self):
        def whole(name, v):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise ValueError(f"selection {name} must be a whole number of turns >= 0, got {v!r}")

        if self.budget is not None:
            whole("budget", self.budget)
        whole("floor", self.floor)
        for name in ("budget_fraction", "good", "excellent", "poor"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float, np.floating)) or not 0.0 <= float(v) <= 1.0:
                raise ValueError(f"selection {name} must be a number in [0, 1], got {v!r}")


@dataclass
class Selection:
    """The selected turns and the report.

    Attributes:
        selected: rows of the input (same columns) plus ``q``, ``kind``, ``disagreement``, ``stratum``; in selection
            order (strongest first within each intent, intents in traffic order).
        by_kind: ``{kind: {"candidates": n, "selected": n}}`` for every kind in :data:`KINDS`.
        by_intent: ``{intent: {"share", "quota", "candidates", "selected"}}``.
        n_turns, n_scored, n_candidates, n_duplicates, budget: totals.
        floors_not_met: intents with candidates that got no floor turn because the budget could not hold every
            floor (largest traffic shares are served first).
    """

    selected: pd.DataFrame
    by_kind: dict[str, dict[str, int]]
    by_intent: dict[str, dict[str, float | int]]
    n_turns: int
    n_scored: int
    n_candidates: int
    n_duplicates: int
    budget: int
    config: SelectionConfig = field(default_factory=SelectionConfig)
    floors_not_met: list[str] = field(default_factory=list)

    def table(self) -> list[dict]:
        """The report as rows (for a Prefect table artifact): one per intent, then one per kind."""
        rows = [{"group": "intent", "name": k, **v} for k, v in self.by_intent.items()]
        rows += [{"group": "kind", "name": k, **v} for k, v in self.by_kind.items()]
        return rows


def judge_quality(scores: np.ndarray) -> np.ndarray:
    """Percentile rank of each score in [0, 1]: ``(rank - 0.5) / n`` with average ranks for ties.

    ``[1.0, 3.0, 2.0, 2.0] -> [0.125, 0.875, 0.5, 0.5]``.
    """
    scores = np.asarray(scores, dtype=np.float64)
    if scores.size == 0:
        return scores
    return (rankdata(scores, method="average") - 0.5) / scores.size


def _strengths(df: pd.DataFrame, cfg: SelectionConfig) -> pd.DataFrame:
    q = df["q"].to_numpy()
    rules = {
        "thumbs_down_judged_good": ((df["thumbs_down"].to_numpy() > 0) & (q >= cfg.good), q),
        "regenerate_judged_excellent": ((df["regenerate"].to_numpy() > 0) & (q >= cfg.excellent), q),
        "thumbs_up_judged_poor": ((df["thumbs_up"].to_numpy() > 0) & (q <= cfg.poor), 1.0 - q),
    }
    return pd.DataFrame({k: np.where(fires, s, -np.inf) for k, (fires, s) in rules.items()}, index=df.index)


def _quotas(shares: Mapping[str, float], available: Mapping[str, int], budget: int, floor: int) -> dict[str, int]:
    """Each intent with candidates first gets ``floor`` turns (fewer if it has fewer); what is left of the budget
    is split by share (largest remainder). No quota exceeds what is available, and the quotas never sum above the
    budget: when the floors do not all fit, they are given by share, largest first (ties: name), until the budget
    is spent."""
    base = {}
    left = budget
    for k in sorted(shares, key=lambda k: (-shares[k], k)):
        base[k] = min(floor, available.get(k, 0), left)
        left -= base[k]
    rest = left
    raw = {k: rest * s for k, s in shares.items()}
    extra = {k: math.floor(v) for k, v in raw.items()}
    for k in sorted(raw, key=lambda k: (-(raw[k] - extra[k]), k))[: rest - sum(extra.values())]:
        extra[k] += 1
    return {k: min(base[k] + extra[k], available.get(k, 0)) for k in shares}


def select_turns(turns: pd.DataFrame, traffic: Mapping[str, float], config: SelectionConfig | None = None) -> Selection:
    """Pick the turns experts should label.

    Args:
        turns: one row per turn with columns ``conversation_id``, ``turn_id``, ``intent`` (str or None),
            ``prompt_norm_hash``, ``judge_score`` (float, NaN/None when unscored) and signal counts
            ``thumbs_up``, ``thumbs_down``, ``regenerate`` (other columns are carried along).
        traffic: ``{intent: share}`` from the traffic table (shares in [0, 1], sum <= 1 + 1e-6).
        config: thresholds and budget.

    Returns:
        :class:`Selection`.

    Raises:
        ValueError: a required column is missing, or the shares are negative or sum above 1.
    """
    cfg = config or SelectionConfig()
    need = {
        "conversation_id",
        "turn_id",
        "intent",
        "prompt_norm_hash",
        "judge_score",
        "thumbs_up",
        "thumbs_down",
        "regenerate",
    }
    missing = sorted(need - set(turns.columns))
    if missing:
        raise ValueError(f"turns table lacks column(s) {missing}")
    if any(s < 0 for s in traffic.values()) or sum(traffic.values()) > 1 + 1e-6:
        raise ValueError(f"traffic shares must be >= 0 and sum to <= 1, got {dict(traffic)}")
    shares = dict(traffic)
    rest = 1.0 - sum(shares.values())
    if rest > 1e-9:
        shares[OTHER] = rest

    n_turns = len(turns)
    budget = cfg.budget if cfg.budget is not None else math.ceil(cfg.budget_fraction * n_turns)
    df = turns.copy(deep=False)  # the caller's frame is not modified (copy-on-write); millions of turns not copied
    df["judge_score"] = pd.to_numeric(df["judge_score"], errors="coerce")
    has_score = df["judge_score"].notna().to_numpy()
    scored = df if has_score.all() else df[has_score]  # no copy of millions of rows when every turn is scored
    scored["q"] = judge_quality(scored["judge_score"].to_numpy())
    strength = _strengths(scored, cfg)
    scored["disagreement"] = strength.max(axis=1)
    scored["kind"] = strength.idxmax(axis=1)
    cand = scored[np.isfinite(scored["disagreement"])].copy()
    known = cand["intent"].isin(list(traffic))  # NaN/None and intents outside the table are "other"
    cand["stratum"] = cand["intent"].where(known, OTHER)
    by_kind = {k: {"candidates": int((cand["kind"] == k).sum()), "selected": 0} for k in KINDS}
    n_candidates = len(cand)

    ties = ["conversation_id", "turn_id", *[c for c in ("user_id", "response_hash") if c in cand.columns]]
    cand = cand.sort_values(["disagreement", *ties], ascending=[False] + [True] * len(ties), kind="stable")
    deduped = cand.drop_duplicates("prompt_norm_hash", keep="first")
    n_dup = n_candidates - len(deduped)
    available = deduped["stratum"].value_counts().to_dict()
    if OTHER in available and OTHER not in shares:
        shares[OTHER] = 0.0  # unknown intents still get the floor
    quota = _quotas(shares, available, budget, cfg.floor)
    picked = []
    for stratum in shares:
        picked.append(deduped[deduped["stratum"] == stratum].head(quota.get(stratum, 0)))
    chosen = pd.concat(picked) if picked else deduped.head(0)
    spare = budget - len(chosen)
    if spare > 0:  # budget an intent could not use goes to the strongest remaining candidates
        chosen = pd.concat([chosen, deduped.drop(chosen.index).head(spare)])
    assert len(chosen) <= budget, (len(chosen), budget)  # the quotas sum to at most the budget
    floors_not_met = sorted(s for s in shares if available.get(s, 0) and cfg.floor and not quota.get(s, 0))
    for k in KINDS:
        by_kind[k]["selected"] = int((chosen["kind"] == k).sum())
    by_intent = {
        s: {
            "share": round(float(shares[s]), 6),
            "quota": int(quota.get(s, 0)),
            "candidates": int(available.get(s, 0)),
            "selected": int((chosen["stratum"] == s).sum()),
        }
        for s in shares
    }
    return Selection(
        selected=chosen.reset_index(drop=True),
        by_kind=by_kind,
        by_intent=by_intent,
        n_turns=n_turns,
        n_scored=len(scored),
        n_candidates=n_candidates,
        n_duplicates=n_dup,
        budget=budget,
        config=cfg,
        floors_not_met=floors_not_met,
    )


def load_traffic(path) -> dict[str, float]:
    """``{intent: share}`` from a traffic table CSV (columns ``intent,share``).

    Raises:
        ValueError: missing columns, a non-numeric or negative share, or a duplicate intent, naming the file and row.
    """
    table = pd.read_csv(path)
    for col in ("intent", "share"):
        if col not in table.columns:
            raise ValueError(f"{path}: traffic table has no column {col!r} (columns: {list(table.columns)})")
    out: dict[str, float] = {}
    for i, (intent, share) in enumerate(zip(table["intent"], table["share"])):
        try:
            v = float(share)
        except (TypeError, ValueError):
            raise ValueError(f"{path} row {i} field 'share': not a number ({share!r})") from None
        if not v >= 0 or str(intent) in out:
            raise ValueError(f"{path} row {i}: share must be >= 0 and intents unique (got {intent!r}, {share!r})")
        out[str(intent)] = v
    return out
