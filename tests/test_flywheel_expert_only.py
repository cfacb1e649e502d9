"""Weak signals never become rewards, by construction (DESIGN.md principle 4)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from data.expert import ExpertLabel, ExpertPair, WeakSignalRefused, write_agreement_data, write_training_pairs
from data.loaders import load_pairs
from data.schemas import PreferencePair
from data.validation import DataValidationError
from flywheel.schema import EventRow

EVENT = {
    "event_id": "e1",
    "conversation_id": "c1",
    "turn_id": 0,
    "user_id": "u1",
    "model_version": "round-1",
    "intent": "oasst",
    "signal": "thumbs_down",
    "timestamp": "2026-03-01T12:00:00Z",
    "prompt": "How do I boil an egg?",
    "response": "Put it in boiling water.",
}
PROMPT = [{"role": "user", "content": "How do I boil an egg?"}]


def _pair(labels, id="t1", **kw):
    return ExpertPair(
        id=id,
        prompt=PROMPT,
        response_a="Nine minutes in boiling water.",
        response_b="I can't help.",
        labels=labels,
        **kw,
    )


def test_a_training_pair_cannot_be_built_from_weak_signals():
    with pytest.raises(WeakSignalRefused, match="principle 4"):
        ExpertPair.model_validate(EventRow.model_validate(EVENT))
    with pytest.raises(WeakSignalRefused):
        ExpertPair.model_validate(EVENT)
    with pytest.raises(WeakSignalRefused):  # a thumbs-down dressed up as a label
        _pair([EVENT])
    with pytest.raises(WeakSignalRefused):
        ExpertLabel.model_validate({"annotator_id": "u1", "verdict": 2, "signal": "thumbs_down"})
    with pytest.raises(ValidationError):  # no expert labels at all
        _pair([])
    with pytest.raises(ValidationError):  # a verdict without an annotator id
        _pair([{"verdict": 1}])
    with pytest.raises(ValidationError):  # an annotator id without a verdict
        _pair([{"annotator_id": "ann1"}])
    # The writer of training files takes ExpertPair objects only.
    with pytest.raises(WeakSignalRefused):
        write_training_pairs([EventRow.model_validate(EVENT)], "/nonexistent/never-written.jsonl")
    with pytest.raises(TypeError):
        write_training_pairs([{"prompt": "x", "chosen": "a", "rejected": "b"}], "/nonexistent/never-written.jsonl")


def test_the_stages_pair_loader_refuses_weak_signal_rows(tmp_path):
    row = {"prompt": "How do I boil an egg?", "chosen": "Nine minutes.", "rejected": "No.", "signal": "thumbs_up"}
    with pytest.raises(ValidationError, match="weak signal"):
        PreferencePair.model_validate({**row, "id": "x", "prompt": PROMPT})
    f = tmp_path / "pairs.jsonl"
    f.write_text(json.dumps({k: v for k, v in row.items() if k != "signal"}) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(DataValidationError) as err:
        load_pairs(str(f))  # what dpo.train and reward_model.train call
    assert (err.value.row, err.value.field) == (1, "signal")
    f.write_text(json.dumps({**row, "signal": None, "meta": {"thumbs_down": 3}} | {"signal": None}) + "\n")
    with pytest.raises(DataValidationError):
        load_pairs(str(f))


def test_expert_pairs_become_training_and_agreement_rows(tmp_path):
    labels = [
        {"annotator_id": "ann1", "verdict": 2},
        {"annotator_id": "ann2", "verdict": 2},
        {"annotator_id": "ann3", "verdict": 0},
    ]
    p = _pair(labels, lineage={"labels": "abc"})
    assert p.majority() == 2
    tp = p.to_preference_pair()
    assert (tp.chosen, tp.rejected) == ("I can't help.", "Nine minutes in boiling water.")
    assert [(lab.annotator_id, lab.preference) for lab in tp.labels] == [("ann1", 1), ("ann2", 1), ("ann3", 0)]
    split = _pair([{"annotator_id": "a", "verdict": 1}, {"annotator_id": "b", "verdict": 2}], id="t2")
    assert split.majority() is None and split.to_preference_pair() is None
    path, n, n_none = write_training_pairs([p, split], tmp_path / "pairs.jsonl")
    assert (n, n_none) == (1, 1)
    loaded = load_pairs(str(path))
    assert loaded[0].chosen == "I can't help." and loaded[0].meta["lineage"] == {"labels": "abc"}
    path, n = write_agreement_data(
        [p, split, _pair([{"annotator_id": "solo", "verdict": 1}], id="t3")], tmp_path / "agree.jsonl"
    )
    assert n == 2  # the single-annotator pair is no agreement data
    rows = load_pairs(str(path))
    assert [lab.preference for lab in rows[0].labels] == [2, 2, 0] and rows[0].chosen == p.response_a
