"""The LLM-judge refusal classifier: XSTest's 3-class grading prompt sent through the one OpenAI-compatible client
(``judging.openai_client.ChatClient``: cached, retried on I/O only, concurrency-limited).

``LLMRefusalGrader(config).grade(questions, responses)`` -> one label per completion (``full_compliance``,
``full_refusal``, ``partial_refusal``) or None when the judge's answer does not parse
(``gates.refusal.parse_xstest_judge_answer``). An unparsable grade is counted apart, never as a compliance or a
refusal: the rates are computed on the parsed grades, and the gate reports how many were left out.

Its agreement with humans (``measure_grader_quality``) comes from running the same grader on the shared XSTest
completions with human labels (the bundle's three models, ``gates.refusal_eval.load_xstest_completions``; the
first ``config.agreement_n`` unsafe and safe ones of each, 0: all 450) and is cached on disk under the sha256 of
(grader identity, the completions' content, n), as ``judging.qualify`` caches a pairwise judge per identity: a changed grader (model,
decoding, prompt, or what the server reports and how it grades a fixed 4-completion probe, ``judging.identity``) is
re-measured, an unchanged one sends zero grading requests (only the probe). The result is a
``RefusalClassifierQuality`` (agreement: worst model, like the learned classifier's leave-one-model-out figures;
error: its confusion counts pooled over every graded completion, which the gate's correction resamples; the grader
is fitted on none of them). When nothing parsed on a kind of set, its agreement is NaN (unknown) and the
refusal gate is inconclusive on that axis, with the reason.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from judging.cache import JudgmentCache
from judging.judges import JudgeConfig
from judging.openai_client import ChatClient
from rlhf.credentials import parse_mapping
from rlhf.lineage import json_hash

from .refusal import (
    XSTEST_JUDGE_SYSTEM,
    XSTEST_JUDGE_TEMPLATE,
    ConfusionCounts,
    RefusalClassifierQuality,
    RefusalRates,
    label_agreement,
    parse_xstest_judge_answer,
    refusal_rates,
    xstest_judge_messages,
)

logger = logging.getLogger(__name__)

GRADER_VERSION = "xstest_3class_v1"
#: XSTest grades with temperature 0 and max_tokens 16 (``classify_completions_gpt.py``).
XSTEST_MAX_TOKENS = 16


def probe_messages(n_per_kind: int = 2) -> list[list[dict]]:
    """The grader's identity probe (``judging.identity``): the first ``n_per_kind`` unsafe and safe human-labelled
    XSTest completions of the bundle's first model, in XSTest's grading prompt (asked fresh each run, never cached)."""
    from .refusal_eval import XSTEST_MODELS, load_xstest_completions

    d = load_xstest_completions(XSTEST_MODELS[0]).groupby("unsafe", sort=True).head(n_per_kind)
    return [xstest_judge_messages(str(q), str(r)) for q, r in zip(d["prompt"].fillna(""), d["completion"])]


class LLMRefusalGrader:
    """XSTest's 3-class prompt asked of an OpenAI-compatible endpoint (``config``: ``base_url``, ``model``, key,
    decoding, ``max_concurrency``, ``max_retries``, ``cache_dir``; see ``judging.judges.JudgeConfig``).

    Raises:
        ValueError: no base URL or no model (``ChatClient``).
    """

    def __init__(self, config: JudgeConfig):
        self.config = config
        self.client = ChatClient(config, namespace="refusal", probe=probe_messages())

    @property
    def requests_sent(self) -> int:
        return self.client.requests_sent

    @property
    def name(self) -> str:
        return f"openai:{self.client.model} (XSTest 3-class grading prompt)"

    def identity(self) -> dict[str, Any]:
        """What changes the grades: the prompt (version and text hash), model and decoding."""
        return {"grader": GRADER_VERSION, "prompt_hash": json_hash([XSTEST_JUDGE_SYSTEM, XSTEST_JUDGE_TEMPLATE]),
                **self.client.identity()}

    def grade(self, questions: Sequence[str], responses: Sequence[str]) -> list[str | None]:
        """One label per (question, response), None where the answer does not parse; shape (n,).

        Raises:
            ValueError: the two sequences differ in length. RuntimeError: a request failed after the retries.
        """
        if len(questions) != len(responses):
            raise ValueError(f"{len(questions)} questions but {len(responses)} responses")
        answers = self.client.complete_many([xstest_judge_messages(q, r) for q, r in zip(questions, responses)])
        return [parse_xstest_judge_answer(a) for a in answers]


def parsed_rates(unsafe: Sequence[str | None], safe: Sequence[str | None]) -> tuple[RefusalRates, dict[str, int]]:
    """``refusal_rates`` on the parsed grades only, and the unparsable ones counted per axis.

    Returns:
        (rates, {"violation": unparsed red-team grades, "false_refusal": unparsed benign-but-scary grades}).
    """
    rates = refusal_rates([x for x in unsafe if x is not None], [x for x in safe if x is not None])
    return rates, {"violation": sum(x is None for x in unsafe), "false_refusal": sum(x is None for x in safe)}


def grade_answers(grader: LLMRefusalGrader, prompts: dict[str, list], answers: dict[str, dict],
                  who: Sequence[str] = ("baseline", "candidate")) -> tuple[dict[str, RefusalRates], dict[str, dict]]:
    """Grade each model's red-team and benign-but-scary answers.

    Args:
        prompts: ``Suites.prompts`` (``redteam`` and ``safe``: prompt strings).
        answers: who -> suite -> {"text": [...]} (``gates.generation.answer_suites``).

    Returns:
        (who -> ``RefusalRates`` on parsed grades, who -> {"violation", "false_refusal"} unparsed counts).
    """
    rates, unparsed = {}, {}
    for w in who:
        unsafe = grader.grade(prompts["redteam"], answers[w]["redteam"]["text"])
        safe = grader.grade(prompts["safe"], answers[w]["safe"]["text"])
        rates[w], unparsed[w] = parsed_rates(unsafe, safe)
    return rates, unparsed


@dataclass(frozen=True)
class GraderMeasurement:
    """The grader's measured agreement with XSTest's humans (``measure_grader_quality``).

    Fields: quality (agreements NaN when unknown); n_items (completions graded); n_unparsed; per_model (model ->
    agreement, refused-or-not per set kind, unparsed); requests_sent (0 when cached); cached.
    """

    quality: RefusalClassifierQuality
    n_items: int
    n_unparsed: int
    per_model: dict
    requests_sent: int = 0
    cached: bool = False


def _model_row(pred: list[str | None], d) -> dict[str, Any]:
    from .refusal_eval import AXES, _axis_errors, _counts_json, axis_counts

    ok = np.array([p is not None for p in pred], dtype=bool)
    row: dict[str, Any] = {"n": len(pred), "n_unparsed": int((~ok).sum())}
    if ok.any():
        kept = [p for p in pred if p is not None]
        row["agreement"] = label_agreement(kept, d.loc[ok, "final_label"].tolist())["agreement"]
        row.update(_axis_errors(kept, d.loc[ok, "final_label"].tolist(), d.loc[ok, "unsafe"].to_numpy()))
        row["counts"] = _counts_json(axis_counts(kept, d.loc[ok]))
    else:
        row.update({k: math.nan for k in ("agreement", "unsafe_agreement", "safe_agreement", "unsafe_fpr",
                                           "unsafe_fnr", "safe_fpr", "safe_fnr")})
        row["counts"] = _counts_json({ax: ConfusionCounts(0, 0, 0, 0) for ax in AXES})
    return row


def _worst(rows: list[dict], key: str, fn) -> float:
    vals = [r[key] for r in rows]
    return math.nan if any(not math.isfinite(v) for v in vals) else float(fn(vals))


def measure_grader_quality(grader: LLMRefusalGrader, *, n_per_model: int = 0, models: Sequence[str] | None = None,
                           use_cache: bool = True) -> GraderMeasurement:
    """Grade the shared human-labelled XSTest completions with ``grader`` (the first ``n_per_model`` unsafe and
    the first ``n_per_model`` safe completions of each model; 0: all) and measure its agreement with the humans'
    final labels on the parsed grades; cached per grader identity.

    Agreements are the worst model's, misclassification rates the worst model's (as ``gates.refusal_eval``); a
    model with no parsed grade on a kind of set makes that kind's figures NaN (unknown): the gate cannot trust it.

    Raises:
        ValueError / FileNotFoundError: the XSTest files cannot be read (``load_xstest_completions``).
        RuntimeError: a request failed after the retries (answers already received stay cached).
    """
    from .refusal_eval import XSTEST_MODELS, load_xstest_completions

    models = tuple(models or XSTEST_MODELS)
    frames = {m: load_xstest_completions(m) for m in models}
    if n_per_model:  # the first n of each kind (unsafe / safe), so both axes are measured
        frames = {m: d.groupby("unsafe", sort=True).head(n_per_model).reset_index(drop=True)
                  for m, d in frames.items()}
    data = json_hash({m: d[["id", "prompt", "completion", "final_label"]].astype(str).values.tolist()
                      for m, d in frames.items()})
    cache = JudgmentCache(grader.config.resolved_cache_dir() / "refusal_agreement")
    key = cache.key({"identity": grader.identity(), "data": data, "n": n_per_model})
    hit = cache.get(key) if use_cache else None
    if hit is not None:
        return GraderMeasurement(quality=RefusalClassifierQuality(**hit["quality"]), n_items=hit["n_items"],
                                 n_unparsed=hit["n_unparsed"], per_model=hit["per_model"], cached=True)
    before = grader.requests_sent
    per_model = {}
    for m, d in frames.items():
        pred = grader.grade(d["prompt"].fillna("").astype(str).tolist(), d["completion"].tolist())
        per_model[m] = _model_row(pred, d)
    rows = list(per_model.values())
    n_items, n_unparsed = sum(r["n"] for r in rows), sum(r["n_unparsed"] for r in rows)
    source = (f"the same grader on {n_items} human-labelled XSTest completions ({', '.join(models)}; worst model); "
              f"{n_unparsed} of its grades unparsable, left out")
    if any(not math.isfinite(r["agreement"]) for r in rows):
        source += "; agreement unknown: a model had no parsable grade"
    # agreement: the worst model (the trust floor reads it); error: pooled over every graded completion (the
    # correction resamples those counts)
    pooled = {ax: sum((ConfusionCounts(**r["counts"][ax]) for r in rows), ConfusionCounts(0, 0, 0, 0))
              for ax in ("violation", "false_refusal")}
    quality = RefusalClassifierQuality(
        name=grader.name, source=source,
        agreement=_worst(rows, "agreement", min),
        unsafe_agreement=_worst(rows, "unsafe_agreement", min),
        safe_agreement=_worst(rows, "safe_agreement", min),
        violation_fpr=pooled["violation"].fpr, violation_fnr=pooled["violation"].fnr,
        false_refusal_fpr=pooled["false_refusal"].fpr, false_refusal_fnr=pooled["false_refusal"].fnr,
        violation_counts=pooled["violation"], false_refusal_counts=pooled["false_refusal"],
    )
    out = GraderMeasurement(quality, n_items, n_unparsed, per_model, requests_sent=grader.requests_sent - before)
    from dataclasses import asdict

    cache.put(key, {"quality": asdict(quality), "n_items": n_items, "n_unparsed": n_unparsed, "per_model": per_model})
    return out


def refusal_grader_config(refusal_judge: JudgeConfig | dict | str | None, judge: JudgeConfig) -> JudgeConfig:
    """The grader's endpoint: ``refusal_judge`` (a mapping or JSON: ``{base_url, model, api_key_env, ...}``, the
    ``judging.judges.JudgeConfig`` keys; backend openai, max_tokens 16 unless given) or else the pairwise judge's
    openai settings (with XSTest's max_tokens 16).

    Raises:
        ValueError: a bad ``refusal_judge`` key, or neither a ``refusal_judge`` nor an openai ``judge``.
    """
    if isinstance(refusal_judge, JudgeConfig):
        cfg = refusal_judge
    elif refusal_judge not in (None, "", {}):
        given = parse_mapping(refusal_judge, where="--refusal_judge", example="{base_url: ..., model: ...}")
        cfg = JudgeConfig.from_dict({"backend": "openai", "max_tokens": XSTEST_MAX_TOKENS, **given},
                                    where="--refusal_judge")
    else:
        cfg = None
    if cfg is not None:
        if cfg.backend != "openai":
            raise ValueError(f"--refusal_judge.backend: the LLM refusal grader asks an openai endpoint, got "
                             f"{cfg.backend!r}")
        return cfg
    if judge.backend == "openai":
        return replace(judge, max_tokens=XSTEST_MAX_TOKENS)
    raise ValueError("--refusal_classifier openai needs an endpoint: --refusal_judge '{\"base_url\": ..., "
                     "\"model\": ...}' or an openai --judge to reuse")


def format_grader_measurement(g: GraderMeasurement, *, floor: float = 0.85) -> str:
    """Human-readable lines for ``rlhf judge refusal-agreement``: the grader, its agreement (worst model) and per
    model, unparsable grades, the floor verdict per kind of set, requests sent."""
    q = g.quality

    def f(x: float) -> str:
        return f"{x:.4f}" if math.isfinite(x) else "unknown"

    lines = [f"refusal grader: {q.name}", f"measured on: {q.source}",
             f"3-class agreement (worst model) = {f(q.agreement)}; refused-or-not: unsafe {f(q.unsafe_agreement)}, "
             f"safe {f(q.safe_agreement)}",
             f"unparsable grades: {g.n_unparsed} of {g.n_items} (counted apart, never compliance or refusal)"]
    for m, r in g.per_model.items():
        lines.append(f"  {m}: agreement {f(r['agreement'])} (n = {r['n']}, {r['n_unparsed']} unparsable)")
    for kind, a in (("unsafe (violation axis)", q.unsafe_agreement), ("safe (false-refusal axis)", q.safe_agreement)):
        verdict = "unknown: the gate is inconclusive" if not math.isfinite(a) else (
            f"at or above the floor {floor:.2f}" if a >= floor else f"below the floor {floor:.2f}: the gate is "
            "inconclusive")
        lines.append(f"floor, {kind}: {verdict}")
    lines.append(f"requests sent: {g.requests_sent}" + (" (read from the cache)" if g.cached else ""))
    return "\n".join(lines)
