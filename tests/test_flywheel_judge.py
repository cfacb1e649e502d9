"""Judge scores per turn with a real (tiny) reward model, cached by content hash."""

from __future__ import annotations

import json

import numpy as np
import pytest

from flywheel.judge import Judge, judge_turns, reward_model_judge
from flywheel.store import SignalStore


@pytest.fixture(scope="module")
def tiny_rm(tiny_model_dir, tmp_path_factory):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("rm")
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1)
    model.config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _events(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _row(i, conv, turn, prompt, response, signal="thumbs_up"):
    return {
        "event_id": f"e{i}",
        "conversation_id": conv,
        "turn_id": turn,
        "user_id": "u",
        "model_version": "r1",
        "signal": signal,
        "timestamp": "2026-03-01T00:00:00Z",
        "prompt": prompt,
        "response": response,
    }


def test_scores_are_cached_by_content_hash(tiny_rm, tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from judging.scoring import score

    store = SignalStore(tmp_path / "s.duckdb")
    store.ingest(
        _events(
            tmp_path / "a.jsonl",
            [
                _row(0, "c0", 0, "How do I boil an egg?", "Boil it for nine minutes."),
                _row(1, "c0", 0, "How do I boil an egg?", "Boil it for nine minutes.", "copy"),
                _row(
                    2, "c1", 0, "How do I boil an egg?", "Boil it for nine minutes."
                ),  # same texts, other conversation
                _row(3, "c1", 1, "And a duck egg?", "About twelve minutes."),
            ],
        )
    )
    calls = []
    inner = reward_model_judge(tiny_rm)
    judge = Judge(inner.id, lambda p, r: calls.append(len(p)) or inner.score(p, r))
    assert judge_turns(store, judge) == {"turns": 3, "cached": 0, "scored": 2}
    assert calls == [2]  # two distinct (prompt, response) pairs, one batch
    turns = store.turns(judge.id).to_pandas().set_index(["conversation_id", "turn_id"])
    # The stored score is the reward model's own score of that (prompt, response).
    tok = AutoTokenizer.from_pretrained(tiny_rm)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_rm, num_labels=1)
    model.config.pad_token_id = tok.pad_token_id
    direct = score(model, tok, ["How do I boil an egg?"], ["Boil it for nine minutes."])
    assert turns.loc[("c0", 0), "judge_score"] == pytest.approx(direct[0], abs=1e-5)
    assert turns.loc[("c0", 0), "judge_score"] == turns.loc[("c1", 0), "judge_score"]
    # New events on already-scored texts cost nothing; a new text is scored alone.
    store.ingest(
        _events(
            tmp_path / "b.jsonl",
            [_row(4, "c2", 0, "And a duck egg?", "About twelve minutes."), _row(5, "c3", 0, "Hi", "Hello!")],
        )
    )
    assert judge_turns(store, judge) == {"turns": 5, "cached": 2, "scored": 1}
    assert calls == [2, 1]
    # Another judge (another checkpoint hash) has its own cache.
    other = Judge("f" * 64, lambda p, r: np.zeros(len(p)))
    assert judge_turns(store, other)["scored"] == 3
    store.close()


def test_default_judge_is_the_gates_reward_model_backend(tiny_rm, tmp_path):
    """reward_model_judge is gates_judge with the gates' default config: same id, same scores."""
    from flywheel.judge import gates_judge

    a = reward_model_judge(tiny_rm)
    b = gates_judge({"backend": "reward_model"}, reward_model=tiny_rm)
    assert a.id == b.id and len(a.id) == 64
    np.testing.assert_allclose(a.score(["Hi"], ["Hello!"]), b.score(["Hi"], ["Hello!"]), atol=1e-6)
    assert gates_judge({"backend": "reward_model", "max_length": 64}, reward_model=tiny_rm).id != a.id


def test_pairwise_labels_backend_scores_turns_against_the_reference(tmp_path):
    """A non-reward-model backend of judging.judges (labels: imported expert verdicts) through the same interface:
    each turn is the pair (reference, response); the score is the preference of the response (2 better, 1 worse,
    1.5 tie); a turn the judge cannot answer for is an error from the backend, never a silent score."""
    from flywheel.judge import DEFAULT_REFERENCE, gates_judge
    from judging.judges import pair_id

    turns = [("How do I boil an egg?", "Boil it for nine minutes."), ("Hi", "Go away."), ("Yo", "Hey.")]
    verdicts = [2, 1, "tie"]
    labels = tmp_path / "labels.jsonl"
    labels.write_text(
        "".join(json.dumps({"id": pair_id(p, DEFAULT_REFERENCE, r), "verdict": v}) + "\n" for (p, r), v in zip(turns, verdicts))
    )
    judge = gates_judge({"backend": "labels", "labels": str(labels)})
    store = SignalStore(tmp_path / "s.duckdb")
    store.ingest(_events(tmp_path / "a.jsonl", [_row(i, f"c{i}", 0, p, r) for i, (p, r) in enumerate(turns)]))
    assert judge_turns(store, judge) == {"turns": 3, "cached": 0, "scored": 3}
    got = store.turns(judge.id).to_pandas().set_index("conversation_id")["judge_score"].to_dict()
    assert got == {"c0": 2.0, "c1": 1.0, "c2": 1.5}
    assert judge_turns(store, judge)["cached"] == 3
    store.ingest(_events(tmp_path / "b.jsonl", [_row(9, "c9", 0, "Unlabelled?", "Yes.")]))
    with pytest.raises(KeyError, match="no label"):
        judge_turns(store, judge)
    store.close()
