"""The judge a ``JudgeConfig`` names: the one place that knows every backend.

Kept apart from the interface (``judging.judges``) so the backends import the interface and the interface imports
no backend: ``judges`` <- ``model_judges`` / ``openai_judge`` / ``imported_labels`` <- ``factory``.
"""

from __future__ import annotations

from .judges import Judge, JudgeConfig


def make_judge(config: JudgeConfig, *, reward_model: str | None = None) -> Judge:
    """The judge ``config`` names.

    Args:
        config: the judge config (``JudgeConfig.from_dict``).
        reward_model: the round's reward-model checkpoint (the ``reward_model`` backend's model).

    Raises:
        ValueError: the backend's required settings are missing (named).
    """
    if config.backend in ("reward_model", "sequence_classifier"):
        from .model_judges import RewardModelJudge

        path = reward_model if config.backend == "reward_model" else config.model
        if not path:
            raise ValueError("judge.backend reward_model needs the round's reward model (--reward_model_dir)")
        return RewardModelJudge.from_checkpoint(path, backend=config.backend, batch_size=config.batch_size,
                                                max_length=config.max_length)
    if config.backend == "openai":
        from .openai_judge import OpenAIJudge

        return OpenAIJudge(config)
    from .imported_labels import LabelsJudge

    return LabelsJudge(config.labels)
