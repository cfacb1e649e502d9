"""Disagreement selection on hand-worked examples."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from data.bundle import demo_path
from flywheel.select import SelectionConfig, judge_quality, load_traffic, select_turns


def _turn(conv, score, *, up=0, down=0, regen=0, intent="a", prompt=None):
    return {
        "conversation_id": conv,
        "turn_id": 0,
        "intent": intent,
        "prompt_norm_hash": prompt or f"p-{conv}",
        "judge_score": score,
        "thumbs_up": up,
        "thumbs_down": down,
        "regenerate": regen,
    }


def test_judge_quality_is_percentile_rank():
    assert judge_quality(np.array([1.0, 3.0, 2.0, 2.0])).tolist() == [0.125, 0.875, 0.5, 0.5]


def test_hand_worked_selection():
    # Scores 1..10 -> q = 0.05, 0.15, ..., 0.95 (q = (rank - 0.5) / 10).
    turns = pd.DataFrame(
        [
            _turn("c01", 1.0),
            _turn("c02", 2.0, up=1, intent="a"),  # q .15, thumbs-up on a poor turn: strength .85
            _turn("c03", 3.0, up=1, intent="b", prompt="same"),  # q .25: strength .75
            _turn("c04", 4.0),
            _turn("c05", 5.0),
            _turn("c06", 6.0, down=1),  # q .55: not "good" (< .7), no rule fires
            _turn("c07", 7.0, up=1),  # q .65: not poor
            _turn("c08", 8.0, down=1, intent="b", prompt="same"),  # q .75: thumbs-down on good: .75, same prompt as c03
            _turn("c09", 9.0, regen=1),  # q .85: not excellent (< .9)
            _turn("c10", 10.0, regen=1, intent="a"),  # q .95: regenerate on excellent: .95
            _turn("c11", None, down=5),  # never scored: not a candidate
        ]
    )
    sel = select_turns(turns, {"a": 0.6, "b": 0.4}, SelectionConfig(budget=2))
    # Candidates c10 (.95), c02 (.85), c03 (.75), c08 (.75); c03 and c08 share a prompt and tie at .75: the
    # tie-break (conversation id) keeps c03. Quotas: floors a=1, b=1 use the budget of 2.
    assert sel.selected["conversation_id"].tolist() == ["c10", "c03"]
    assert sel.selected["kind"].tolist() == ["regenerate_judged_excellent", "thumbs_up_judged_poor"]
    assert sel.selected["disagreement"].round(6).tolist() == [0.95, 0.75]
    assert (sel.n_turns, sel.n_scored, sel.n_candidates, sel.n_duplicates, sel.budget) == (11, 10, 4, 1, 2)
    assert sel.by_kind == {
        "thumbs_down_judged_good": {"candidates": 1, "selected": 0},
        "regenerate_judged_excellent": {"candidates": 1, "selected": 1},
        "thumbs_up_judged_poor": {"candidates": 2, "selected": 1},
    }
    assert sel.by_intent == {
        "a": {"share": 0.6, "quota": 1, "candidates": 2, "selected": 1},
        "b": {"share": 0.4, "quota": 1, "candidates": 1, "selected": 1},
    }
    # A budget of 3: floors 1+1, the remaining 1 goes by share (a .6 > b .4) -> a=2, b=1.
    sel = select_turns(turns, {"a": 0.6, "b": 0.4}, SelectionConfig(budget=3))
    assert sel.selected["conversation_id"].tolist() == ["c10", "c02", "c03"]


def test_floor_shows_small_intents_and_unused_budget_moves():
    big = [_turn(f"b{i}", 10.0 + i, down=1, intent="big") for i in range(6)]
    small = [_turn("s0", 20.0, down=1, intent="small")]
    filler = [_turn(f"f{i}", float(i)) for i in range(10)]
    turns = pd.DataFrame(big + small + filler)
    # Shares .99 / .01, budget 3: floors big 1, small 1; the remaining 1 goes to big (by share) -> 2 + 1.
    sel = select_turns(turns, {"big": 0.99, "small": 0.01}, SelectionConfig(budget=3))
    assert sel.by_intent["big"]["selected"] == 2 and sel.by_intent["small"]["selected"] == 1
    # Without the floor the small intent is not seen.
    sel = select_turns(turns, {"big": 0.99, "small": 0.01}, SelectionConfig(budget=3, floor=0))
    assert sel.by_intent["small"]["selected"] == 0 and len(sel.selected) == 3
    # An intent with fewer candidates than its quota: its spare budget goes to the strongest others.
    sel = select_turns(turns, {"big": 0.2, "small": 0.8}, SelectionConfig(budget=4))
    assert (sel.by_intent["small"]["selected"], sel.by_intent["big"]["selected"]) == (1, 3)


def test_default_budget_is_half_a_percent_and_unknown_intents_are_other():
    rng = np.random.default_rng(0)
    turns = pd.DataFrame(
        [
            _turn(f"c{i:04d}", float(rng.normal()), down=int(rng.random() < 0.3), intent=None if i % 7 == 0 else "a")
            for i in range(1000)
        ]
    )
    sel = select_turns(turns, {"a": 1.0})
    assert sel.budget == math.ceil(0.005 * 1000) == 5
    assert len(sel.selected) == 5
    assert "other" in sel.by_intent and sel.by_intent["other"]["selected"] == 1  # floor for the unknown intents
    assert (sel.selected["disagreement"] >= 0.7).all()  # only thumbs-down on turns judged good (q >= .7)


def test_bad_inputs():
    with pytest.raises(ValueError, match="lacks column"):
        select_turns(pd.DataFrame([{"conversation_id": "x"}]), {"a": 1.0})
    with pytest.raises(ValueError, match="sum to <= 1"):
        select_turns(pd.DataFrame([_turn("c", 1.0)]), {"a": 0.8, "b": 0.8})


def test_traffic_table_of_the_demo():
    shares = load_traffic(demo_path("traffic/alpaca_eval_clusters.csv"))
    assert shares == {"helpful_base": 0.30, "oasst": 0.25, "koala": 0.20, "vicuna": 0.15, "selfinstruct": 0.10}
