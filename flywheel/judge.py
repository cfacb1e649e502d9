"""Judge score per turn, cached by content hash.

The judge is the round's reward model (the same judge the gates use). A turn's score is the reward of (the turn's
user message, the model's response); it is stored in the store's ``judge_scores`` table under (judge id, prompt
hash, response hash), the judge id being the content hash of the reward-model checkpoint. A turn whose texts were
scored before by the same judge is never scored again, whichever conversation it came from; a different
checkpoint is a different judge.

Scoring is the shared ``judging.scoring`` (the same code the gates and the reward-model stage use).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rlhf.lineage import content_hash

from .store import SignalStore

__all__ = ["Judge", "judge_turns", "reward_model_judge"]

logger = logging.getLogger(__name__)

ScoreFn = Callable[[Sequence[str], Sequence[str]], np.ndarray]


@dataclass
class Judge:
    """A judge: ``id`` (64-char hex, keys the cache) and ``score(prompts, responses) -> float array``."""

    id: str
    score: ScoreFn


def _checkpoint_of(path: str | Path) -> Path:
    """A reward-model stage dir (manifest -> checkpoint) or a checkpoint dir."""
    from rlhf.manifest import read_manifest

    p = Path(path)
    if (p / "manifest.json").is_file():
        return Path(read_manifest(p)["outputs"]["checkpoint"])
    if (p / "config.json").is_file():
        return p
    raise FileNotFoundError(f"{path}: neither a reward-model stage directory with manifest.json nor a checkpoint")


def reward_model_judge(path: str | Path, *, batch_size: int = 8, max_length: int = 512) -> Judge:
    """The reward model at ``path`` (stage dir or checkpoint) as a :class:`Judge`; the model loads on first use."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from judging.scoring import score

    ckpt = _checkpoint_of(path)
    loaded: dict = {}

    def run(prompts: Sequence[str], responses: Sequence[str]) -> np.ndarray:
        if not loaded:
            tok = AutoTokenizer.from_pretrained(ckpt)
            model = AutoModelForSequenceClassification.from_pretrained(ckpt, num_labels=1, dtype=torch.float32)
            model.config.pad_token_id = tok.pad_token_id
            loaded.update(model=model, tok=tok)
        return score(
            loaded["model"],
            loaded["tok"],
            list(prompts),
            list(responses),
            batch_size=batch_size,
            max_length=max_length,
            desc="judging turns",
        )

    return Judge(id=content_hash(ckpt), score=run)


def judge_turns(store: SignalStore, judge: Judge, *, chunk: int = 256) -> dict[str, int]:
    """Score every turn of ``store`` the judge has not scored yet; store the scores.

    Returns:
        ``{"turns": n, "cached": already scored (distinct texts), "scored": newly scored (distinct texts)}``.
    """
    turns = store.turns(judge.id).to_pandas()
    todo = turns[turns["judge_score"].isna()][["prompt_hash", "response_hash"]].drop_duplicates()
    keys = list(todo.itertuples(index=False, name=None))
    n_distinct = len(turns[["prompt_hash", "response_hash"]].drop_duplicates())
    for start in range(0, len(keys), chunk):
        part = keys[start : start + chunk]
        texts = store.texts_for([h for k in part for h in k])
        scores = judge.score([texts[p] for p, _ in part], [texts[r] for _, r in part])
        store.put_scores(judge.id, {k: float(s) for k, s in zip(part, scores)})
    out = {"turns": len(turns), "cached": n_distinct - len(keys), "scored": len(keys)}
    logger.info("judge %s: %s", judge.id[:12], out)
    return out
