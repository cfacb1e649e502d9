"""Judge score per turn from the gates' judge, cached by content hash.

The judge is the one the gates use: ``judging.factory.make_judge`` with the gates recipe's ``judge:`` mapping
(:class:`judging.judges.JudgeConfig`; backends ``reward_model`` (default: the round's reward model),
``sequence_classifier``, ``openai``, ``labels``). That interface is pairwise, so a turn is judged as the pair
(A = a fixed reference reply, B = the turn's response) for the turn's user message:

* reward-model backends (``reward_model``, ``sequence_classifier``): the score is the model's reward of the response
  (``Judgment.raw["score_b"]``, the same ``judging.scoring.score`` the gates and the reward-model stage use);
* ``openai`` / ``labels``: the score is the judge's preference of the response over the reference, in [1, 2]
  (AlpacaEval convention: 2.0 the response is better); an unparsable answer is NaN (the turn stays unscored and
  the selection reports it).

Selection turns scores into percentile ranks, so the scale does not matter. Scores are stored in the store's
``judge_scores`` table under (judge id, prompt hash, response hash); the judge id hashes the judge's identity
(backend, model and its content hash, template, decoding, ...), the reference and the scoring mode, so a turn whose
texts were scored before by the same judge is never scored again, whichever conversation it came from; another
checkpoint or another judge config is another cache.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlhf.lineage import json_hash

from .store import SignalStore

__all__ = ["DEFAULT_REFERENCE", "Judge", "gates_judge", "judge_turns", "reward_model_judge"]

logger = logging.getLogger(__name__)

ScoreFn = Callable[[Sequence[str], Sequence[str]], np.ndarray]

#: The reply each turn's response is compared with by pairwise (LLM, labels) judges: a bare refusal, so "better
#: than the reference" means "of some use to the user".
DEFAULT_REFERENCE = "I'm sorry, but I can't help with that."
_POINTWISE = ("reward_model", "sequence_classifier")


@dataclass
class Judge:
    """A per-turn judge: ``id`` (64-char hex, keys the cache) and ``score(prompts, responses) -> float array``."""

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


def gates_judge(
    config: Any = None, *, reward_model: str | Path | None = None, reference: str = DEFAULT_REFERENCE
) -> Judge:
    """The gates' judge as a per-turn :class:`Judge` (see the module docstring for the score).

    Args:
        config: a :class:`judging.judges.JudgeConfig`, its mapping or JSON text (the gates recipe's ``judge:``);
            None: the default (``reward_model`` backend).
        reward_model: the round's reward model (stage dir or checkpoint), needed by the ``reward_model`` backend.
        reference: the reply A each response is compared with.

    Raises:
        ValueError: a bad judge config, or the backend's required settings missing (``judging.judges``).
        FileNotFoundError: ``reward_model`` is neither a stage dir nor a checkpoint.
    """
    from judging.factory import make_judge
    from judging.judges import JudgeConfig

    cfg = JudgeConfig.from_dict(config, where="flywheel judge")
    ckpt = str(_checkpoint_of(reward_model)) if reward_model else None
    judge = make_judge(cfg, reward_model=ckpt)
    pointwise = cfg.backend in _POINTWISE
    ident = {"judge": judge.identity(), "reference": reference, "score": "reward" if pointwise else "preference"}

    def run(prompts: Sequence[str], responses: Sequence[str]) -> np.ndarray:
        judgments = judge.judge(list(prompts), [reference] * len(responses), list(responses))
        if pointwise:
            return np.array([j.raw["score_b"] for j in judgments], dtype=np.float64)
        return np.array([j.preference for j in judgments], dtype=np.float64)

    return Judge(id=json_hash(ident), score=run)


def reward_model_judge(path: str | Path, *, batch_size: int = 8, max_length: int = 512) -> Judge:
    """The gates' default judge, the reward model at ``path`` (stage dir or checkpoint): :func:`gates_judge` with
    ``{"backend": "reward_model"}``."""
    return gates_judge({"backend": "reward_model", "batch_size": batch_size, "max_length": max_length}, reward_model=path)


def judge_turns(store: SignalStore, judge: Judge, *, chunk: int = 256) -> dict[str, int]:
    """Score every turn of ``store`` the judge has not scored yet; store the scores.

    Returns:
        ``{"turns": n, "cached": already scored (distinct texts), "scored": newly scored (distinct texts)}``, plus
        ``"unparsed"`` (distinct texts the judge gave no usable answer for, left unscored) when there are any.
    """
    turns = store.turns_frame(judge.id)
    todo = turns[turns["judge_score"].isna()][["prompt_hash", "response_hash"]].drop_duplicates()
    keys = list(todo.itertuples(index=False, name=None))
    n_distinct = len(turns[["prompt_hash", "response_hash"]].drop_duplicates())
    unparsed = 0
    for start in range(0, len(keys), chunk):
        part = keys[start : start + chunk]
        texts = store.texts_for([h for k in part for h in k])
        scores = np.asarray(judge.score([texts[p] for p, _ in part], [texts[r] for _, r in part]), dtype=np.float64)
        # NaN (an unparsable pairwise answer) is not stored: the turn stays unscored (the selection reports it) and
        # is asked again next time
        unparsed += int(np.isnan(scores).sum())
        store.put_scores(judge.id, {k: float(s) for k, s in zip(part, scores) if not np.isnan(s)})
    out = {"turns": len(turns), "cached": n_distinct - len(keys), "scored": len(keys) - unparsed}
    if unparsed:
        out["unparsed"] = unparsed
    logger.info("judge %s: %s", judge.id[:12], out)
    return out
