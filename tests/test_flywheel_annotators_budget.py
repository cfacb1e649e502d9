"""Annotators keyed on the Label Studio user id in every export form, no e-mail stored; selection budgets exact."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pandas as pd
import pytest

from flywheel.annotation import (
    AnnotationImportError,
    build_tasks,
    read_label_studio_labels,
    simulate_annotations,
    write_dataset_version,
)
from flywheel.select import SelectionConfig, select_turns

EMAIL = "jane.doe@example.com"
TURNS = [
    {"user_id": "u1", "conversation_id": f"c{i}", "turn_id": 0, "response_hash": f"r{i}", "intent": "oasst",
     "kind": "thumbs_up_judged_poor", "disagreement": 0.9}
    for i in range(4)
]


@pytest.fixture
def tasks():
    export = build_tasks(
        TURNS,
        lambda t: [{"turn_id": 0, "prompt": f"Question {t['conversation_id']}?", "response": "A."}],
        lambda t: ["A.", f"B for {t['conversation_id']}."],
        scrub=lambda s: (s, Counter()),
    )
    return export.tasks


def _labels(tmp_path, tasks, forms):
    """A Label Studio export: every task labelled 'right' by three annotations whose ``completed_by`` are
    ``forms`` (one per annotation)."""
    ls = simulate_annotations(tasks, truth=lambda d: 2, n_annotators=len(forms), noise=0.0, p_unlabelled=0.0)
    for task in ls:
        for ann, form in zip(task["annotations"], forms):
            ann["completed_by"] = form
    path = tmp_path / "ls.json"
    path.write_text(json.dumps(ls))
    return path


def test_one_user_in_three_export_forms_is_one_annotator_and_no_email_is_stored(tmp_path, tasks):
    path = _labels(tmp_path, tasks, [7, "7", {"id": 7, "email": EMAIL, "first_name": "Jane"}])
    got = read_label_studio_labels(path, tasks)
    assert [[lab.annotator_id for lab in p.labels] for p in got.pairs] == [["ls-user-7"]] * 4
    assert len(got.repeated_annotations) == 8  # the same verdict twice more per task: kept once, listed
    m = write_dataset_version(got.pairs, got.unlabelled, tmp_path / "ds", lineage={"x": "y"}, heldout_fraction=0.0,
                              repeated_annotations=got.repeated_annotations)
    assert m["annotators"] == {"ls-user-7": 4}
    for f in (tmp_path / "ds").rglob("*"):
        if f.is_file():
            text = f.read_text()
            assert EMAIL not in text and "Jane" not in text, f


def test_one_user_in_two_forms_with_two_verdicts_is_a_conflict(tmp_path, tasks):
    path = _labels(tmp_path, tasks, [{"id": 7, "email": EMAIL}, "7"])
    raw = json.loads(path.read_text())
    raw[0]["annotations"][1]["result"][0]["value"]["selected"] = "left"
    path.write_text(json.dumps(raw))
    with pytest.raises(AnnotationImportError) as err:
        read_label_studio_labels(path, tasks)
    assert "annotator 'ls-user-7' labelled this task twice with different verdicts" in str(err.value)


@pytest.mark.parametrize(
    "form,reason",
    [
        ({"email": EMAIL}, "user object without 'id'"),
        (EMAIL, "not a Label Studio user id (a str"),
        ("annotator-seven", "not a Label Studio user id (a str"),
        (-3, "not a Label Studio user id (a int"),
        (7.0, "not a Label Studio user id (a float"),
        ({"id": None, "email": EMAIL}, "user object with an empty 'id'"),
    ],
)
def test_annotator_without_a_user_id_is_refused_without_repeating_it(tmp_path, tasks, form, reason):
    path = _labels(tmp_path, tasks, [form])
    with pytest.raises(AnnotationImportError) as err:
        read_label_studio_labels(path, tasks)
    assert "task 0 annotation 0 field 'completed_by'" in str(err.value) and reason in str(err.value)
    assert EMAIL not in str(err.value)


# ---- budgets ---------------------------------------------------------------------------------------------------------
def _turns(n_intents=5, per_intent=4):
    """Every turn of every intent a candidate (thumbs-down, judged good): 60 unsignalled, low-scored turns put
    them all at q >= 0.7."""
    rows = [{"conversation_id": f"f{j}", "turn_id": 0, "intent": None, "prompt_norm_hash": f"f{j}",
             "judge_score": -100.0 + j, "thumbs_up": 0, "thumbs_down": 0, "regenerate": 0} for j in range(60)]
    for k in range(n_intents):
        for j in range(per_intent):
            rows.append({"conversation_id": f"c{k}-{j}", "turn_id": 0, "intent": f"i{k}", "prompt_norm_hash": f"p{k}{j}",
                         "judge_score": float(k * per_intent + j), "thumbs_up": 0, "thumbs_down": 1, "regenerate": 0})
    return pd.DataFrame(rows)


TRAFFIC = {"i0": 0.1, "i1": 0.3, "i2": 0.2, "i3": 0.25, "i4": 0.15}


def test_budget_zero_selects_nothing_and_floors_never_exceed_the_budget():
    turns = _turns()
    assert len(select_turns(turns, TRAFFIC, SelectionConfig(budget=0)).selected) == 0
    assert len(select_turns(turns, TRAFFIC, SelectionConfig(budget_fraction=0.0)).selected) == 0
    # a budget of 2 with 5 intents holding candidates: 2 floors, given by share (i1 .3, then i3 .25)
    sel = select_turns(turns, TRAFFIC, SelectionConfig(budget=2, floor=1))
    assert len(sel.selected) == 2 and set(sel.selected["intent"]) == {"i1", "i3"}
    assert sel.floors_not_met == ["i0", "i2", "i4"]
    # floor 3 x 5 intents = 15 > budget 7: i1 3, i3 3, i2 1
    sel = select_turns(turns, TRAFFIC, SelectionConfig(budget=7, floor=3))
    assert sel.selected["intent"].value_counts().to_dict() == {"i1": 3, "i3": 3, "i2": 1}


def test_selection_never_exceeds_its_budget_over_random_configs():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 6))
        turns = _turns(n_intents=n, per_intent=int(rng.integers(1, 6)))
        shares = rng.dirichlet(np.ones(n)) * rng.uniform(0.5, 1.0)
        traffic = {f"i{k}": float(s) for k, s in enumerate(shares)}
        budget = int(rng.integers(0, 12))
        sel = select_turns(turns, traffic, SelectionConfig(budget=budget, floor=int(rng.integers(0, 4))))
        assert len(sel.selected) <= budget
        assert sum(v["quota"] for v in sel.by_intent.values()) <= budget


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"budget": -1}, "budget"),
        ({"budget": 2.5}, "budget"),
        ({"budget": True}, "budget"),
        ({"floor": -1}, "floor"),
        ({"floor": 0.5}, "floor"),
        ({"budget_fraction": -0.1}, "budget_fraction"),
        ({"budget_fraction": 1.5}, "budget_fraction"),
        ({"budget_fraction": float("nan")}, "budget_fraction"),
        ({"good": 2.0}, "good"),
    ],
)
def test_bad_budget_floor_or_fraction_is_refused(kwargs, field):
    with pytest.raises(ValueError, match=f"selection {field} must be"):
        SelectionConfig(**kwargs)


def test_flow_parameters_refuse_bad_budgets():
    from pydantic import ValidationError

    from flows.flywheel import FlywheelParameters

    for kwargs in ({"budget": -1}, {"budget": 2.5}, {"floor": -2}, {"budget_fraction": 2.0}):
        with pytest.raises(ValidationError):
            FlywheelParameters(**kwargs)
    assert FlywheelParameters(budget=0).budget == 0
