"""Disagreement selection over a :class:`~flywheel.store.SignalStore`: fetch what :func:`flywheel.select.select_turns`
needs, run it, then fetch the other columns of the turns it picked.

At millions of turns the turns table is most of the memory and time of selection, so the pure function gets only
its columns (the turn response's key: user, conversation, turn, response hash; intent, normalised-prompt hash,
judge score, the three signal counts it reads), unordered (its result does not depend on row order: candidates are
sorted on disagreement and the key); the prompt hash, model version and other signal counts are joined for the
selected turns only.
"""

from __future__ import annotations

from collections.abc import Mapping

from .select import Selection, SelectionConfig, select_turns
from .store import TURN_COLUMNS, SignalStore

__all__ = ["SELECT_COLUMNS", "SELECT_KEY", "select_from_store"]

#: What identifies a turn response here (the prompt follows from it: one prompt per user, conversation and turn).
SELECT_KEY = ["user_id", "conversation_id", "turn_id", "response_hash"]
#: The ``turns`` columns :func:`select_turns` reads (``judge_score`` comes with the judge), with the key.
SELECT_COLUMNS = [*SELECT_KEY, "intent", "prompt_norm_hash", "thumbs_up", "thumbs_down", "regenerate"]


def select_from_store(
    store: SignalStore, traffic: Mapping[str, float], config: SelectionConfig | None = None, *, judge: str | None = None
) -> Selection:
    """:func:`select_turns` over every turn in ``store`` with ``judge``'s cached scores (``None``: no turn is
    scored, so nothing is selected). ``Selection.selected`` carries every ``turns`` column plus ``judge_score``,
    ``q``, ``kind``, ``disagreement``, ``stratum``, in selection order; the counts are those of :func:`select_turns`
    on the full table (same numbers: it reads only these columns).

    Raises:
        ValueError: as :func:`select_turns`.
    """
    turns = store.turns_frame(judge, SELECT_COLUMNS, ordered=False)
    if judge is None:
        turns["judge_score"] = float("nan")
    sel = select_turns(turns, traffic, config)
    del turns
    picked = sel.selected
    extra = [c for c in TURN_COLUMNS if c not in picked.columns]
    details = store.turn_details({c: picked[c].tolist() for c in SELECT_KEY})
    details = details.select([*SELECT_KEY, *extra]).to_pandas()
    merged = picked.merge(details, on=SELECT_KEY, how="left", sort=False, validate="one_to_one")
    sel.selected = merged[[*TURN_COLUMNS, *[c for c in picked.columns if c not in TURN_COLUMNS]]]
    return sel
