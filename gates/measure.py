"""Gate-stage measurements: the judge's preferences and its agreement with humans, and every graded answer, gathered
into one :class:`Measurements` that ``gates.decide.decide`` turns into GateResults."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from judging.labels import scores_to_preference
from judging.scoring import load_reward_model, score, verdicts_from_scores

from .capability import grade_mc
from .drift import DriftCounters, drift_counters
from .generation import Suites
from .judge import JudgeExpertAgreement, judge_expert_agreement
from .glm_winrate import DEFAULT_WEIGHTS, GlmPrior, load_glm_weights
from .refusal import RefusalClassifierQuality, classify_refusal, refusal_rates
from .sycophancy import SycophancyMeasure, flip_rate, suggested_answer_agreement

WHO = ("baseline", "candidate")


@dataclass(frozen=True)
class Measurements:
    """Everything the gates decide on, for one round (candidate vs baseline).

    Fields:
        preferences: AlpacaEval preferences of the candidate vs the baseline on the win-rate suite, shape (n_winrate,)
            (``judging.labels``: 2.0 candidate wins, 1.0 baseline wins, 1.5 draw).
        len_candidate, len_baseline: answer lengths in tokens, shape (n_winrate,).
        intents: intent of each win-rate prompt; traffic: the traffic-share table {intent: share}.
        judge: the judge's agreement with expert labels (None: not measured); judge_source: where it was looked for.
        refusal: {"candidate", "baseline"} -> ``refusal_rates`` of the red-team and benign-but-scary suites.
        capability: {"candidate", "baseline"} -> bool array (n_questions,), answer correct.
        unparsed: {"candidate", "baseline"} -> answers that could not be read as a letter.
        capability_letters: {"candidate", "baseline"} -> the letter read from each answer (None: unparsed), and
            capability_key: the right letters, shape (n_questions,); the capability gate compares the items both
            sides parsed (``gates.capability.capability_gate_on_parsed``).
        sycophancy: {"candidate", "baseline"} -> ``SycophancyMeasure``.
        drift: {"candidate", "baseline"} -> ``DriftCounters`` of the win-rate answers; drift_previous: the reference
            (the previous round's counters, else the baseline's).
        citation_turns: the candidate's win-rate answers as citation-gate turns (no retrieval in this suite).
        refusal_quality: the refusal classifier's measured agreement with humans (``gates.refusal_eval``).
        glm_prior: priors of the AlpacaEval-style GLM from the published weights (``gates.glm_winrate``).
    """

    preferences: np.ndarray
    len_candidate: np.ndarray
    len_baseline: np.ndarray
    intents: list[str]
    traffic: dict[str, float]
    judge: JudgeExpertAgreement | None
    judge_source: str
    refusal: dict[str, Any]
    capability: dict[str, np.ndarray]
    unparsed: dict[str, int]
    capability_letters: dict[str, list]
    capability_key: list[str]
    sycophancy: dict[str, SycophancyMeasure]
    drift: dict[str, DriftCounters]
    drift_previous: DriftCounters
    citation_turns: list[dict]
    refusal_quality: RefusalClassifierQuality | None = None
    glm_prior: GlmPrior | None = None

    @property
    def measured_win_rate(self) -> float:
        """Raw win rate in percent (draws count half): mean(preference - 1) * 100."""
        return float(np.mean(self.preferences - 1.0) * 100)


def judge_preferences(judge: str, suites: Suites, answers: dict[str, dict]) -> np.ndarray:
    """The round's reward model scores both answers to each win-rate prompt; the higher score wins.

    Returns:
        AlpacaEval preferences, shape (n_winrate,) (``judging.labels.scores_to_preference``).
    """
    rm, tok = load_reward_model(judge)
    prompts = suites.prompts["winrate"]
    s_base = score(rm, tok, prompts, answers["baseline"]["winrate"]["text"], desc="judging baseline")
    s_cand = score(rm, tok, prompts, answers["candidate"]["winrate"]["text"], desc="judging candidate")
    return scores_to_preference(s_base, s_cand)


def measured_judge_agreement(judge_manifest: dict) -> JudgeExpertAgreement | None:
    """The judge's agreement with expert labels, item by item, from the reward-model stage's held-out judgments
    (``outputs.agreement_scores``: JSONL rows with ``score_first``, ``score_second``, ``labels``); None when the
    manifest names no such file."""
    scores_file = (judge_manifest.get("outputs") or {}).get("agreement_scores")
    if not (scores_file and Path(scores_file).is_file()):
        return None
    with open(scores_file) as f:
        rows = [json.loads(line) for line in f]
    verdicts = verdicts_from_scores([r["score_first"] for r in rows], [r["score_second"] for r in rows])
    return judge_expert_agreement(verdicts, np.array([r["labels"] for r in rows]))


def measure(
    suites: Suites,
    answers: dict[str, dict],
    *,
    preferences: np.ndarray,
    judge: JudgeExpertAgreement | None,
    judge_source: str,
    intents: list[str],
    traffic: dict[str, float],
    previous: DriftCounters | None,
    refusal_classifier: str = "learned",
) -> Measurements:
    """Grade every answer (multiple-choice letters, refusals, drift counters) and gather the measurements."""
    questions, suggested = suites.questions, suites.suggested
    correct = [q.correct_answer for q in questions]

    def mc(who: str, suite: str, qs) -> tuple[np.ndarray, list]:
        return grade_mc(answers[who][suite]["text"], [q.correct_answer for q in qs], [q.n_choices for q in qs])

    graded = {who: mc(who, "capability", questions) for who in WHO}
    sycophancy = {
        who: SycophancyMeasure(
            flip=flip_rate(graded[who][1], mc(who, "are_you_sure", questions)[1], correct),
            agreement=suggested_answer_agreement(
                mc(who, "sycophancy", suggested)[1],
                [q.suggested_answer for q in suggested],
                [q.correct_answer for q in suggested],
            ),
        )
        for who in WHO
    }
    from .refusal_eval import default_refusal_classifier, measured_quality

    classify = default_refusal_classifier().predict if refusal_classifier == "learned" else (
        lambda texts: [classify_refusal(t) for t in texts])
    refusal = {
        who: refusal_rates(classify(answers[who]["redteam"]["text"]), classify(answers[who]["safe"]["text"]))
        for who in WHO
    }
    win_prompts = [p.prompt for p in suites.winrate]
    drift = {
        who: drift_counters(answers[who]["winrate"]["text"], win_prompts, tokenizer_len=answers[who]["_length"])
        for who in WHO
    }
    return Measurements(
        preferences=np.asarray(preferences, dtype=float),
        len_candidate=answers["candidate"]["winrate"]["n_tokens"],
        len_baseline=answers["baseline"]["winrate"]["n_tokens"],
        intents=intents,
        traffic=traffic,
        judge=judge,
        judge_source=judge_source,
        refusal=refusal,
        capability={who: graded[who][0] for who in WHO},
        unparsed={who: sum(x is None for x in graded[who][1]) for who in ("candidate", "baseline")},
        capability_letters={who: list(graded[who][1]) for who in WHO},
        capability_key=correct,
        sycophancy=sycophancy,
        drift=drift,
        drift_previous=previous if previous is not None else drift["baseline"],
        # No retrieval in this suite: every structured citation marker names an id that was not retrieved (C01).
        citation_turns=[{"response": t, "retrieved_ids": []} for t in answers["candidate"]["winrate"]["text"]],
        refusal_quality=measured_quality(refusal_classifier),
        glm_prior=GlmPrior.from_weights(load_glm_weights(), source=DEFAULT_WEIGHTS),
    )
