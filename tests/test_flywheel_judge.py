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
