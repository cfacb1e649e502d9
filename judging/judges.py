"""One pairwise judge interface for the gates, the reward model's agreement measurement and the flywheel.

``judge.judge(prompts, responses_a, responses_b)`` -> one :class:`Judgment` per item: a preference in AlpacaEval's
convention (``data.labels``: 1.0 response A better, 2.0 response B better, 1.5 draw, values in between are
weighted preferences; NaN when the judge's answer could not be parsed) plus the raw verdict. In the gates, A is
the baseline and B the candidate, so 2.0 means the candidate wins.

Backends (``JudgeConfig.backend``, the gates recipe's ``judge: {backend: ..., ...}``):

* ``reward_model``: the round's reward model (the default; the gates pass its checkpoint);
* ``sequence_classifier``: any reward-model checkpoint with a score head (``model``: local path or hub id);
* ``openai``: any OpenAI-compatible chat endpoint (``judging.openai_judge``: both orders asked, cached on disk);
* ``labels``: imported human or expert labels (``judging.imported_labels``: a JSONL/CSV of ids -> verdicts).

This module is the interface the backends implement; ``judging.factory.make_judge`` builds the backend a config
names (the backends import this module, never the reverse).

A judge's *identity* (what answers, not what it is called) names it in reports and keys its cached judgments and its
cached agreement with expert labels (``judging.qualify``): the content hash (local path) or resolved hub revision
of a reward model or label file; for an endpoint, what the server reports and how it answers a fixed probe
(``judging.identity``).
"""

from __future__ import annotations

import math
import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from rlhf.credentials import check_env_name, check_mapping, parse_mapping
from rlhf.lineage import json_hash

BACKENDS = ("reward_model", "sequence_classifier", "openai", "labels")
DEFAULT_AGREEMENT_DATA = "demo:pandalm/testset-v1.jsonl.gz"


@dataclass(frozen=True)
class Judgment:
    """One pairwise judgment.

    Fields:
        preference: AlpacaEval preference of B over A in [1, 2] (1.0 A better, 2.0 B better, 1.5 draw); NaN when
            the judge's answer was unparsable (counted apart, never a tie).
        raw: the raw verdict: the two scores (reward models), the judge's answer text in each order (openai), or the
            imported label (labels).
        consistent: openai backend: whether both orders picked the same response (None when not asked or when an
            order's answer was unparsable).
    """

    preference: float
    raw: Any
    consistent: bool | None = None

    @property
    def parsed(self) -> bool:
        return not math.isnan(self.preference)


def preferences(judgments: Sequence[Judgment]) -> np.ndarray:
    """The preferences of ``judgments``, float64 shape (n,), NaN where unparsable."""
    return np.array([j.preference for j in judgments], dtype=np.float64)


def n_unparsed(judgments: Sequence[Judgment]) -> int:
    """How many judgments could not be parsed (NaN preference)."""
    return sum(not j.parsed for j in judgments)


def position_consistency(judgments: Sequence[Judgment]) -> tuple[float, int]:
    """Share of items, among those asked in both orders with both answers parsed, whose two orders picked the same
    response; and that denominator. (NaN, 0) when no item was asked in both orders (non-openai backends)."""
    checked = [j.consistent for j in judgments if j.consistent is not None]
    return (float(np.mean(checked)) if checked else math.nan), len(checked)


def pair_id(prompt: Any, response_a: str, response_b: str) -> str:
    """Content id of a pair (sha256 of the prompt and both responses, in order), the id the ``labels`` backend
    looks up when no ids are given (the gates write these ids to ``pairs_to_judge.jsonl``)."""
    return json_hash({"prompt": prompt, "a": response_a, "b": response_b})


def prompt_text(prompt: Any) -> str:
    """A prompt as one instruction string: a user string as is; chat messages joined (a single user turn is its
    content; several turns are written ``role: content``, blank-line separated)."""
    if isinstance(prompt, str):
        return prompt
    msgs = [m if isinstance(m, dict) else m.model_dump() for m in prompt]
    if len(msgs) == 1:
        return str(msgs[0]["content"])
    return "\n\n".join(f"{m['role']}: {m['content']}" for m in msgs)


@dataclass(frozen=True)
class JudgeConfig:
    """Which judge, and how it is asked (the gates recipe's ``judge:`` mapping; every key optional).

    Fields:
        backend: one of ``BACKENDS``.
        model: sequence_classifier: checkpoint path or hub id; openai: model name (default ``$OPENAI_MODEL``);
            reward_model: filled in by the gates with the round's reward-model checkpoint.
        base_url: openai: endpoint (default ``$OPENAI_BASE_URL``), e.g. ``http://127.0.0.1:8000/v1``.
        api_key_env: openai: NAME of the environment variable holding the key (default ``OPENAI_API_KEY``); the key
            is read from it by the HTTP client only, so configs, command lines, flow parameters, logs, W&B and
            reports hold the name, never the key. A key given as a value (``api_key: ...``) is refused
            (``rlhf.credentials``).
        template: openai: path of a pairwise template file replacing the built-in AlpacaEval-style one
            (``judging.openai_judge``: placeholders ``{instruction}``, ``{output_1}``, ``{output_2}``).
        system_prompt: openai: replaces the built-in system message (None: built-in).
        max_tokens, temperature: openai decoding (part of the identity).
        max_concurrency: openai: requests in flight at once.
        max_retries: openai: retries of a request on I/O errors (connection, timeout, 408/409/429/5xx), with
            exponential backoff; an answer that does not parse is never retried.
        timeout_s: openai: seconds per request.
        cache_dir: where judgments and agreements are cached (default ``$RLHF_CACHE/judgments``).
        labels: labels backend: the JSONL/CSV file of ids -> verdicts.
        batch_size, max_length: reward-model backends: scoring batch and token cap.
        agreement_data: pairs with several annotators' labels (PandaLM format) the judge is qualified on.
        agreement_n: judge only the first N agreement pairs (0: all).
    """

    backend: str = "reward_model"
    model: str = ""
    base_url: str = ""
    api_key_env: str = "OPENAI_API_KEY"
    template: str = ""
    system_prompt: str | None = None
    max_tokens: int = 8
    temperature: float = 0.0
    max_concurrency: int = 4
    max_retries: int = 3
    timeout_s: float = 120.0
    cache_dir: str = ""
    labels: str = ""
    batch_size: int = 8
    max_length: int = 512
    agreement_data: str = DEFAULT_AGREEMENT_DATA
    agreement_n: int = 0

    @classmethod
    def from_dict(cls, data: "dict[str, Any] | str | JudgeConfig | None", *, where: str = "judge") -> "JudgeConfig":
        """Build from a mapping (or its JSON text, ``parse_mapping``; None or {} -> the defaults); a JudgeConfig is
        checked and returned as it is.

        Raises:
            ValueError: not a mapping, an unknown key, a bad backend or a bad number (names ``where`` and the key).
        """
        if isinstance(data, JudgeConfig):
            data.check(where)
            return data
        data = parse_mapping(data, where=where)
        check_mapping(data, where)  # a key given as a value: refused, never stored (rlhf/credentials.py)
        known = {f.name for f in fields(cls) if not f.name.startswith("_")}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; known keys: {sorted(known)}")
        cfg = cls(**data)
        cfg.check(where)
        return cfg

    def check(self, where: str = "judge") -> None:
        """Raises ValueError naming ``where.<key>`` for a bad backend or number."""
        if self.backend not in BACKENDS:
            raise ValueError(f"{where}.backend: {self.backend!r} is not one of {BACKENDS}")
        for key in ("max_tokens", "max_concurrency", "batch_size", "max_length"):
            if int(getattr(self, key)) < 1:
                raise ValueError(f"{where}.{key} must be at least 1, got {getattr(self, key)}")
        for key in ("max_retries", "agreement_n"):
            if int(getattr(self, key)) < 0:
                raise ValueError(f"{where}.{key} must be >= 0, got {getattr(self, key)}")
        check_env_name(self.api_key_env, f"{where}.api_key_env")
        if not float(self.timeout_s) > 0:
            raise ValueError(f"{where}.timeout_s must be > 0, got {self.timeout_s}")
        if self.backend == "sequence_classifier" and not self.model:
            raise ValueError(f"{where}.model: the sequence_classifier backend needs a checkpoint (local path or hub id)")
        if self.backend == "labels" and not self.labels:
            raise ValueError(f"{where}.labels: the labels backend needs a JSONL/CSV file of ids -> verdicts")

    def to_dict(self) -> dict[str, Any]:
        """The config as a plain dict (safe for manifests and reports: it holds the key's variable name only)."""
        return {k: v for k, v in asdict(self).items() if not k.startswith("_")}

    def resolved_cache_dir(self) -> Path:
        from rlhf.models import cache_root

        return Path(self.cache_dir) if self.cache_dir else cache_root() / "judgments"


class Judge(ABC):
    """A pairwise judge. Subclasses set ``backend`` and implement ``identity`` and ``judge``."""

    backend: str = ""

    #: HTTP requests this judge sent (openai backend; 0 for local backends).
    requests_sent: int = 0

    @abstractmethod
    def identity(self) -> dict[str, Any]:
        """What makes two judges the same judge: backend, model, template and decoding (a JSON-able dict)."""

    @abstractmethod
    def judge(
        self, prompts: Sequence[Any], responses_a: Sequence[str], responses_b: Sequence[str],
        ids: Sequence[str] | None = None,
    ) -> list[Judgment]:
        """Judge each (prompt, response A, response B), batched.

        Args:
            prompts: user strings or chat messages, shape (n,).
            responses_a, responses_b: the two responses of each item, shape (n,).
            ids: optional item ids (the labels backend looks them up; default ``pair_id`` of each item).

        Returns:
            n Judgments, in input order.

        Raises:
            ValueError: the three sequences differ in length.
        """

    def identity_report(self) -> dict[str, Any]:
        """How the identity was established this run, for reports (JSON-able, no secrets): the ``openai`` backend
        gives ``identity_check`` (``judging.identity.check_identity``: new, unchanged or changed since the last run
        under this endpoint and name), ``probe_requests_sent`` and ``probe_answers``; local backends, whose identity
        is a content hash, give {}."""
        return {}

    @property
    def name(self) -> str:
        """Short label for reports: ``<backend>:<model>``."""
        return f"{self.backend}:{self.identity().get('model', '')}"

    def identity_hash(self) -> str:
        return json_hash(self.identity())


def check_lengths(prompts: Sequence, responses_a: Sequence, responses_b: Sequence, ids: Sequence | None) -> None:
    """Raises ValueError when the judge's inputs differ in length."""
    n = {len(prompts), len(responses_a), len(responses_b)} | ({len(ids)} if ids is not None else set())
    if len(n) != 1:
        raise ValueError(
            f"judge inputs differ in length: {len(prompts)} prompts, {len(responses_a)} responses A, "
            f"{len(responses_b)} responses B" + ("" if ids is None else f", {len(ids)} ids")
        )


def judge_pairs(judge: Judge, pairs: Sequence[Any]) -> list[Judgment]:
    """Judge ``data.schemas.PreferencePair``-like pairs: prompt messages, ``chosen`` as A (the first response),
    ``rejected`` as B; ids are the pairs' ids. Returns one Judgment per pair (B over A: 2.0 means the second
    response is better, expert label ``SECOND``)."""
    prompts = [[m if isinstance(m, dict) else m.model_dump() for m in p.prompt] for p in pairs]
    return judge.judge(prompts, [p.chosen for p in pairs], [p.rejected for p in pairs], ids=[p.id for p in pairs])


def env_default(value: str, env: str) -> str:
    """``value`` if set, else ``$env`` (empty when unset)."""
    return value or os.environ.get(env, "")
