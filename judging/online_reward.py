"""A pairwise judge as an online-RL reward (``reward_functions: [judge]`` in the ``grpo`` / ``rloo`` recipes).

Any judging backend (``judging.judges.BACKENDS``: the round's reward model, another sequence classifier, an
OpenAI-compatible endpoint, imported labels) judges each sampled completion against the prompt's **reference answer**
(the training row's ``reference``: a pair file's chosen reply, an AlpacaEval baseline output, an MT-Bench reference),
the reference shown as response A and the completion as response B, as the win-rate gates show baseline and
candidate. The reward is the AlpacaEval preference of B over A minus 1.5:

    reward = preference - 1.5     in [-0.5, 0.5]: +0.5 the completion wins, 0 a draw, -0.5 the reference wins

(an OpenAI-compatible judge asks both orders and averages them, so a judge that contradicts itself gives 0). An
unparsed verdict is no reward: None, which TRL turns into NaN and leaves out of the weighted sum (``nansum``), so a
judge that fails to answer never reads as a draw.

The judge's cache (``JudgeConfig.cache_dir``) makes a repeated (prompt, reference, completion) free, and its key is
never in the config: ``api_key_env`` names the variable (rlhf/credentials.py refuses a key given as a value).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .judges import Judge, JudgeConfig

#: The name a recipe gives this reward in ``reward_functions`` (rlhf.online_rl.REWARD_FUNCTIONS).
NAME = "judge"
#: The preference of a draw (data.labels: 1 first better, 2 second better).
DRAW = 1.5


def _text(x: Any) -> str:
    """A completion as TRL passes it: a string, or a conversation's messages (the assistant's content)."""
    if isinstance(x, str):
        return x
    return "".join(m.get("content", "") for m in x if isinstance(m, dict))


class JudgeReward:
    """TRL reward function ``(prompts, completions, reference, **kwargs) -> one float (or None) per completion``.

    Args:
        judge: the pairwise judge (``judging.factory.make_judge``).

    Attributes:
        n_judged, n_unparsed: completions judged and verdicts that did not parse, over the run (this process).

    Raises (when called):
        ValueError: no ``reference`` column, or a completion whose reference is missing or empty (names the row of
            the batch and the prompt's start).
    """

    __name__ = NAME  # TRL names a function reward by its __name__ (logs: rewards/judge/mean)

    def __init__(self, judge: Judge):
        self.judge = judge
        self.n_judged = 0
        self.n_unparsed = 0

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], reference: Sequence[Any] | None = None,
                 **_: Any) -> list[float | None]:
        if reference is None:
            raise ValueError("the judge reward needs each prompt's reference answer (a 'reference' column); the "
                             "stage passes it from the training rows")
        for i, (p, r) in enumerate(zip(prompts, reference)):
            if not isinstance(r, str) or not r.strip():
                raise ValueError(f"judge reward: completion {i} (prompt {_text(p)[:60]!r}) has no reference answer")
        judgments = self.judge.judge(list(prompts), list(reference), [_text(c) for c in completions])
        rewards = [None if math.isnan(j.preference) else j.preference - DRAW for j in judgments]
        self.n_judged += len(rewards)
        self.n_unparsed += sum(r is None for r in rewards)
        return rewards

    def record(self) -> dict[str, Any]:
        """What the manifest records of the judge: its identity (no secrets), how its identity was checked, the
        completions judged, the unparsed verdicts and the HTTP requests sent (0 for local backends)."""
        return {"identity": self.judge.identity(), "identity_report": self.judge.identity_report(),
                "n_judged": self.n_judged, "n_unparsed": self.n_unparsed,
                "requests_sent": int(getattr(self.judge, "requests_sent", 0))}


def judge_reward(config: JudgeConfig | dict | str | None, *, reward_model: str) -> JudgeReward:
    """The judge reward for a stage: ``config`` (a recipe mapping or its JSON; None: the round's reward model as a
    pairwise judge) built by ``judging.factory.make_judge``.

    Args:
        reward_model: the round's reward-model checkpoint (the ``reward_model`` backend's model).

    Raises:
        ValueError: a bad config (names ``--reward_judge`` and the key), a key given as a value.
    """
    from .factory import make_judge

    return JudgeReward(make_judge(JudgeConfig.from_dict(config, where="--reward_judge"), reward_model=reward_model))


def _has_reference(row: Any) -> bool:
    return isinstance(row.reference, str) and bool(row.reference.strip())


def check_references(rows: Sequence[Any], label: str) -> list[str]:
    """Every row's ``reference`` (``data.schemas.EvalPrompt``), for the judge reward.

    Raises:
        ValueError: rows without a reference answer: how many, the first ids, and the file ``label``.
    """
    missing = [r.id for r in rows if not _has_reference(r)]
    if missing:
        raise ValueError(f"{label}: {len(missing)} of {len(rows)} prompts have no reference answer (first: "
                         f"{', '.join(missing[:5])}); the judge reward compares each completion with its prompt's "
                         "reference: give a file whose rows have one (a pair file's chosen reply, 'reference', "
                         "'output') or drop 'judge' from reward_functions")
    return [r.reference for r in rows]


def check_reference_file(source: str, *, mode: str = "strict", max_reject_rate: float | None = None,
                         limit: int | None = None) -> int:
    """Read a training prompt file as the online-RL stage does (``data.loaders.load_eval_prompts``, the stage's
    ``data_mode``, ``max_reject_rate`` and ``max_train_samples``) and check that every prompt has the reference answer
    the judge reward compares with, without loading any model (a round checks it before anything trains).

    Returns:
        the number of prompts read.

    Raises:
        ValueError: prompts without a reference: how many of how many, the first one's row number in the file (0 is
            the first data row) and the field, naming ``source``. data.validation.DataValidationError, OSError: the
            file cannot be read as prompts.
    """
    import tempfile
    from pathlib import Path

    from data.loaders import DEFAULT_MAX_REJECT_RATE, load_eval_prompts

    with tempfile.TemporaryDirectory(prefix="rlhf-reference-check-") as tmp:
        rows = load_eval_prompts(source, mode=mode, limit=limit, rejects_path=Path(tmp) / "rejects.jsonl",
                                 max_reject_rate=DEFAULT_MAX_REJECT_RATE if max_reject_rate is None else max_reject_rate)
    # the file's row of each kept prompt: rows are read in order, the rejected ones (lenient mode) left out
    rejected = {r.row for r in rows.rejects}
    file_rows = [i for i in range(rows.n_read) if i not in rejected]
    missing = [file_rows[i] if i < len(file_rows) else i for i, r in enumerate(rows) if not _has_reference(r)]
    if missing:
        raise ValueError(f"{rows.source}: row {missing[0]} field 'reference': missing or empty, and {len(missing)} of "
                         f"{len(rows)} prompts have none; the judge reward (reward_functions: judge) compares each "
                         "completion with its prompt's reference: give rows that have one ('reference', a pair's "
                         "chosen reply, an AlpacaEval 'output') or drop 'judge' from reward_functions")
    return len(rows)
