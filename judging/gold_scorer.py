"""The tripwire's gold scorer: a second reward model (never the optimised one) that every online-RL stage (PPO,
GRPO, RLOO) loads the same way. Kept apart from ``judging.online_tripwire`` so PPO, which has its own tripwire
loop, runs (and its cache key covers) this code only, not the TRL callback and the judge backends it can build.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def load_gold_scorer(
    path: str | None, reward_model_hash: str, *, device: Any, batch_size: int, max_length: int
) -> tuple[Callable[[list, list[str]], list[float]] | None, dict[str, str | None]]:
    """The tripwire's gold scorer: the reward model at ``path`` (a second one, not the optimised one), frozen, in
    eval mode on ``device``, scoring as the reward-model stage scores (``judging.scoring.score``); every online-RL
    stage (PPO, GRPO, RLOO) loads its gold model here.

    Returns:
        ``(scorer, record)``: ``scorer(prompts, responses) -> one float per response`` (None without ``path``: a
        warning says only the KL, length and refusal rules are active) and the lineage record
        ``{"gold_model": resolved path | None, "gold_model_hash": content hash | None}``.

    Raises:
        ValueError: ``path``'s content hash is ``reward_model_hash`` (the gold check must come from another scorer).
    """
    if not path:
        logger.warning("tripwire without --tripwire_gold_model_path: no gold check (KL, length, refusal rules only)")
        return None, {"gold_model": None, "gold_model_hash": None}
    from rlhf.lineage import content_hash

    from .scoring import load_reward_model, score

    gold_hash = content_hash(path)
    if gold_hash == reward_model_hash:
        raise ValueError(f"--tripwire_gold_model_path {path} is the optimised reward model: the gold check "
                         "must come from another scorer")
    model, tok = load_reward_model(path)
    model.requires_grad_(False)
    model.to(device).eval()

    def gold_scorer(prompts: list, responses: list[str]) -> list[float]:
        return list(score(model, tok, prompts, responses, batch_size=batch_size, max_length=max_length, desc="gold"))

    return gold_scorer, {"gold_model": str(Path(path).resolve()), "gold_model_hash": gold_hash}
