"""Reward-model judges: the round's reward model (``reward_model`` backend) or any checkpoint with a score head
(``sequence_classifier``). Both responses are scored (``judging.scoring.score``); the higher score wins, equal
scores are a draw (``data.labels.scores_to_preference``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from data.labels import scores_to_preference
from judging.scoring import check_score_head, load_reward_model, score

from .judges import Judge, Judgment, check_lengths

#: Scores a judge keeps across calls (about 1 KB each with its key) before it starts again.
_MAX_KEPT_SCORES = 100_000


class RewardModelJudge(Judge):
    """A Bradley-Terry reward model as a pairwise judge.

    Args:
        model, tokenizer: a loaded ``AutoModelForSequenceClassification`` (num_labels=1) and its tokenizer.
        path: where it was loaded from (its identity with its content: a local directory's content hash, a hub
            id's resolved commit, ``rlhf.lineage.source_key``).
        backend: ``reward_model`` or ``sequence_classifier`` (reported only).
        batch_size, max_length: scoring batch and token cap (``judging.scoring.score``).
        planned: batches of at most ``batch_size`` split by padding cost (``judging.scoring.score(planned=True)``).

    Attribute ``shard`` (default False): score data-parallel over the processes of a multi-process launch
    (``judging.scoring.score(shard=True)``); the gate stage sets it, every process then judges the same pairs.
    """

    shard: bool = False

    def __init__(self, model, tokenizer, *, path: str, backend: str = "reward_model", batch_size: int = 8,
                 max_length: int = 512, content: str | None = None, planned: bool = False):
        self.model, self.tokenizer, self.path = model, tokenizer, str(path)
        self.backend, self.batch_size, self.max_length = backend, batch_size, max_length
        self.planned = planned
        self._content = content
        self._scored: dict[str, float] = {}  # (prompt, response) key -> score, across calls

    @classmethod
    def from_checkpoint(cls, path: str, *, backend: str = "reward_model", batch_size: int = 8,
                        max_length: int = 512) -> "RewardModelJudge":
        """Load ``path`` (a local checkpoint directory or a hub id).

        Raises:
            ValueError: a local checkpoint without a trained score head (``check_score_head``).
        """
        if Path(path).is_dir():
            check_score_head(path)
        model, tok = load_reward_model(path)
        return cls(model, tok, path=path, backend=backend, batch_size=batch_size, max_length=max_length)

    def identity(self) -> dict[str, Any]:
        if self._content is None:
            from rlhf.lineage import source_key

            self._content = source_key(self.path, repo_type="model")  # a hub id: the commit it resolves to
        return {"backend": self.backend, "model": self.path, "content_hash": self._content,
                "max_length": self.max_length}

    def scores(self, prompts: Sequence[Any], responses_a: Sequence[str], responses_b: Sequence[str]):
        """(scores of A, scores of B), two float64 arrays of shape (n,)."""
        # Both sides in one call: one length sort over all 2n texts, full and evenly padded batches.
        # Each distinct (prompt, response) is scored once: two identical answers get the SAME score, an
        # exact draw, instead of two values that differ in the last float32 bits with their place in a padded batch
        # (which decided such draws by rounding, and differently on 1 and 2 processes). Scores are kept across
        # calls, for the same reason and because the canaries re-judge the baseline's answers once per canary.
        n = len(responses_a)
        pairs = list(zip(list(prompts) * 2, list(responses_a) + list(responses_b)))
        keys = [json.dumps(p, sort_keys=True, default=str) + "\x00" + r for p, r in pairs]
        first: dict[str, int] = {}
        for i, k in enumerate(keys):
            if k not in self._scored:
                first.setdefault(k, i)
        unique = list(first.values())
        if unique:
            s = score(self.model, self.tokenizer, [pairs[i][0] for i in unique], [pairs[i][1] for i in unique],
                      batch_size=self.batch_size, max_length=self.max_length, desc="judging", shard=self.shard,
                      planned=self.planned)
            if len(self._scored) > _MAX_KEPT_SCORES:  # a long online-RL run judges new rollouts every step
                self._scored.clear()
            self._scored.update({k: float(s[j]) for j, k in enumerate(first)})
        both = np.array([self._scored[k] for k in keys], dtype=np.float64)
        return both[:n], both[n:]

    def judge(self, prompts, responses_a, responses_b, ids=None) -> list[Judgment]:
        """Score both responses; raw = {"score_a", "score_b"}; preference 2.0 when B scores higher, 1.0 when A
        does, 1.5 when equal."""
        check_lengths(prompts, responses_a, responses_b, ids)
        a, b = self.scores(prompts, responses_a, responses_b)
        prefs = scores_to_preference(a, b)
        return [Judgment(float(p), {"score_a": float(x), "score_b": float(y)}) for p, x, y in zip(prefs, a, b)]


def judgment_scores(judgments: Sequence[Judgment]) -> tuple[np.ndarray, np.ndarray]:
    """The (A, B) scores a reward-model judge recorded in ``Judgment.raw``; two float64 arrays (n,)."""
    return (np.array([j.raw["score_a"] for j in judgments], dtype=np.float64),
            np.array([j.raw["score_b"] for j in judgments], dtype=np.float64))
