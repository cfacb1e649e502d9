"""Gate-stage measurements: the judge's preferences and its agreement with humans, and every graded answer, gathered
into one :class:`Measurements` that ``gates.decide.decide`` turns into GateResults."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from judging.agreement import Agreement, judge_agreement
from judging.factory import make_judge
from judging.judges import JudgeConfig, n_unparsed, pair_id, position_consistency
from judging.judges import preferences as judgment_preferences
from data.labels import scores_to_preference
from judging.qualify import qualify_judge
from judging.scoring import load_reward_model, score, verdicts_from_scores
from rlhf.manifest import dumps_strict
from rlhf.serialization import to_jsonable

from .capability import grade_mc
from .consistency import ConsistencyMeasure, measure_consistency
from .citations import prompt_text
from .drift import DriftCounters, drift_counters
from .generation import Suites
from .glm_winrate import DEFAULT_WEIGHTS, GlmPrior, load_glm_weights
from .refusal import RefusalClassifierQuality, classify_refusal, refusal_rates
from .answer_reading import final_answer_letter, question_options
from .sycophancy import SycophancyMeasure, flip_rate, suggested_answer_agreement

WHO = ("baseline", "candidate")


@dataclass(frozen=True)
class Measurements:
    """Everything the gates decide on, for one round (candidate vs baseline).

    Fields:
        preferences: AlpacaEval preferences of the candidate vs the baseline on the win-rate suite, shape (n_winrate,)
            (``data.labels``: 2.0 candidate wins, 1.0 baseline wins, 1.5 draw).
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
        refusal_quality: the refusal classifier's measured agreement with humans (``gates.refusal_eval``; the LLM
            grader's from ``gates.refusal_llm.measure_grader_quality``, NaN when unknown).
        refusal_unparsed: LLM grader only: who -> {"violation", "false_refusal"} grades that did not parse (left
            out of the rates); refusal_info: LLM grader only: its name, identity, agreement source, requests sent.
        glm_prior: priors of the AlpacaEval-style GLM from the published weights (``gates.glm_winrate``).
        judge_info: who judged (``run_judge``'s info: name, backend, position consistency, unparsable answers, the
            agreement's source); None: the round's reward model, described by ``judge_source`` alone.
        answered: per win-rate item, True where both answers are non-empty (the win-rate gates' evidence: an empty
            answer on a side is no comparison); None = not recorded (all answered).
        winrate_prompts: the instruction of each win-rate item (the win-rate intervals cluster items that share
            one); None = not recorded (item-level intervals).
        consistency: both models' constraint compliance on the consistency suite (``gates.consistency``); None = the
            suite was not run.
    """

    preferences: np.ndarray
    len_candidate: np.ndarray
    len_baseline: np.ndarray
    intents: list[str]
    traffic: dict[str, float]
    judge: Agreement | None
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
    judge_info: dict | None = None
    answered: list[bool] | None = None
    refusal_unparsed: dict | None = None
    refusal_info: dict | None = None
    winrate_prompts: list[str] | None = None
    consistency: ConsistencyMeasure | None = None

    @property
    def measured_win_rate(self) -> float:
        """Raw win rate in percent (draws count half): mean(preference - 1) * 100."""
        return float(np.mean(self.preferences - 1.0) * 100)


def judge_preferences(judge: str, suites: Suites, answers: dict[str, dict]) -> np.ndarray:
    """The round's reward model scores both answers to each win-rate prompt; the higher score wins.

    Returns:
        AlpacaEval preferences, shape (n_winrate,) (``data.labels.scores_to_preference``).
    """
    rm, tok = load_reward_model(judge)
    prompts = suites.prompts["winrate"]
    s_base = score(rm, tok, prompts, answers["baseline"]["winrate"]["text"], desc="judging baseline")
    s_cand = score(rm, tok, prompts, answers["candidate"]["winrate"]["text"], desc="judging candidate")
    return scores_to_preference(s_base, s_cand)


def measured_judge_agreement(judge_manifest: dict) -> Agreement | None:
    """The judge's agreement with expert labels, item by item, from the reward-model stage's held-out judgments
    (``outputs.agreement_scores``: JSONL rows with ``score_first``, ``score_second``, ``labels`` and ``cluster``,
    the pair's cluster by shared instruction or response); None when the manifest names no such file. Rows written
    before the cluster key existed give the item-level interval (the record says ``cluster_rule`` ``"item"``)."""
    scores_file = (judge_manifest.get("outputs") or {}).get("agreement_scores")
    if not (scores_file and Path(scores_file).is_file()):
        return None
    with open(scores_file) as f:
        rows = [json.loads(line) for line in f]
    verdicts = verdicts_from_scores([r["score_first"] for r in rows], [r["score_second"] for r in rows])
    clusters = [r["cluster"] for r in rows] if rows and all("cluster" in r for r in rows) else None
    return judge_agreement(verdicts, np.array([r["labels"] for r in rows]), clusters=clusters)


def _grade(answers: dict[str, dict], who: str, suite: str, qs) -> tuple[np.ndarray, list]:
    """``who``'s multiple-choice answers to suite ``suite`` graded against ``qs`` (``grade_mc``)."""
    return grade_mc(answers[who][suite]["text"], [q.correct_answer for q in qs], [q.n_choices for q in qs])


def _final_answers(texts: list[str], questions) -> list[str | None]:
    """The letters the replies to "Are you sure?" commit to, read against each question's options
    (``gates.answer_reading.read_answer``: letters inside sentences, after an apology, or the option's text
    restated; None where a reply commits to none, or to two)."""
    if len(texts) != len(questions):
        raise ValueError(f"{len(texts)} are-you-sure replies for {len(questions)} questions")
    return [final_answer_letter(t, question_options(q.prompt)) for t, q in zip(texts, questions)]


def _sycophancy(suites: Suites, answers: dict[str, dict], graded: dict[str, tuple]) -> dict[str, SycophancyMeasure]:
    """Both sycophancy probes per model: the flip after "Are you sure?" (from its capability answers) and the
    agreement with a suggested wrong answer."""
    questions, suggested = suites.questions, suites.suggested
    correct = [q.correct_answer for q in questions]
    return {
        who: SycophancyMeasure(
            flip=flip_rate(graded[who][1], _final_answers(answers[who]["are_you_sure"]["text"], questions), correct),
            agreement=suggested_answer_agreement(
                _grade(answers, who, "sycophancy", suggested)[1],
                [q.suggested_answer for q in suggested],
                [q.correct_answer for q in suggested],
            ),
        )
        for who in WHO
    }


def _refusal(suites: Suites, answers: dict[str, dict], refusal_classifier: str, refusal_judge: JudgeConfig | None):
    """Both models' refusal rates, the classifier's measured quality, and (LLM grader only) its unparsable grades
    and identity: ``(rates, quality, unparsed or None, info or None)``.

    Raises:
        ValueError: ``refusal_classifier`` "openai" without ``refusal_judge``.
    """
    from .refusal_eval import default_refusal_classifier, measured_quality

    if refusal_classifier == "openai":
        if refusal_judge is None:
            raise ValueError("--refusal_classifier openai needs the grader's endpoint (refusal_judge)")
        return llm_refusal_measurement(refusal_judge, suites.prompts, answers)
    classify = default_refusal_classifier().predict if refusal_classifier == "learned" else (
        lambda texts: [classify_refusal(t) for t in texts])
    refusal = {
        who: refusal_rates(classify(answers[who]["redteam"]["text"]), classify(answers[who]["safe"]["text"]))
        for who in WHO
    }
    return refusal, measured_quality(refusal_classifier), None, None


def measure(
    suites: Suites,
    answers: dict[str, dict],
    *,
    preferences: np.ndarray,
    judge: Agreement | None,
    judge_source: str,
    intents: list[str],
    traffic: dict[str, float],
    previous: DriftCounters | None,
    refusal_classifier: str = "learned",
    judge_info: dict | None = None,
    refusal_judge: JudgeConfig | None = None,
) -> Measurements:
    """Grade every answer (multiple-choice letters, refusals, drift counters) and gather the measurements."""
    questions = suites.questions
    correct = [q.correct_answer for q in questions]
    graded = {who: _grade(answers, who, "capability", questions) for who in WHO}
    sycophancy = _sycophancy(suites, answers, graded)
    refusal, refusal_quality, refusal_unparsed, refusal_info = _refusal(suites, answers, refusal_classifier,
                                                                        refusal_judge)
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
        # No retrieval in this suite: every emitted reference names an id that was not retrieved (C01); references
        # copied from the prompt are not the model's.
        citation_turns=[
            {"response": t, "retrieved_ids": [], "prompt": prompt_text(p)}
            for t, p in zip(answers["candidate"]["winrate"]["text"], suites.prompts["winrate"])
        ],
        refusal_quality=refusal_quality,
        winrate_prompts=[prompt_text(p) for p in suites.prompts["winrate"]],
        glm_prior=GlmPrior.from_weights(load_glm_weights(), source=DEFAULT_WEIGHTS),
        judge_info=judge_info,
        answered=[
            bool(c.strip()) and bool(b.strip())
            for c, b in zip(answers["candidate"]["winrate"]["text"], answers["baseline"]["winrate"]["text"])
        ],
        refusal_unparsed=refusal_unparsed,
        refusal_info=refusal_info,
        consistency=None if suites.consistency is None else measure_consistency(
            suites.consistency, {who: answers[who]["consistency"]["text"] for who in WHO}),
    )


def llm_refusal_measurement(config: JudgeConfig, prompts: dict[str, list], answers: dict[str, dict]):
    """The LLM grader (``gates.refusal_llm``) grades both models' red-team and benign-but-scary answers, and its
    agreement with XSTest's humans is measured on the shared completions (cached per grader identity; the first
    ``config.agreement_n`` per XSTest model, 0: all).

    Returns:
        (who -> ``RefusalRates`` on parsed grades, ``RefusalClassifierQuality``, who -> unparsed counts per axis,
        info dict: grader, identity, agreement source, items and unparsed grades of the agreement run, requests).
    """
    from .refusal_llm import LLMRefusalGrader, grade_answers, measure_grader_quality

    grader = LLMRefusalGrader(config)
    refusal, unparsed = grade_answers(grader, prompts, answers, WHO)
    graded = grader.requests_sent
    q = measure_grader_quality(grader, n_per_model=config.agreement_n)
    info = {"name": grader.name, "identity": grader.identity(), "config": config.to_dict(),
            "agreement_source": q.quality.source, "agreement_cached": q.cached, "agreement_n_items": q.n_items,
            "agreement_n_unparsed": q.n_unparsed, "per_model": q.per_model, "requests_sent_grading": graded,
            "requests_sent_agreement": q.requests_sent, "unparsed": unparsed}
    return refusal, q.quality, unparsed, to_jsonable(info)


@dataclass(frozen=True)
class JudgeRun:
    """What the round's judge measured (``run_judge``).

    Fields:
        preferences: AlpacaEval preferences of the candidate (B) over the baseline (A) per win-rate prompt, shape
            (n_winrate,); NaN where the judge's answer was unparsable.
        agreement: the judge's agreement with expert labels (None: not measured).
        source: where the agreement comes from (for the reason of an unmeasured judge).
        info: JSON-able description for the report, the manifest and the trackers (``Measurements.judge_info``).
        rows: one row per win-rate pair (``judgments.jsonl``).
    """

    preferences: np.ndarray
    agreement: Agreement | None
    source: str
    info: dict
    rows: list[dict]


def shardable_judge(config: JudgeConfig) -> bool:
    """Whether the judge scores locally with a model (``reward_model`` / ``sequence_classifier`` backends), so a
    multi-process gate launch can shard its scoring; API judges are asked once, by rank 0 alone."""
    return config.backend in ("reward_model", "sequence_classifier")


def run_judge(config: JudgeConfig, models: dict[str, Any], suites: Suites, answers: dict[str, dict], *,
              reward_model_dir: str, shard: bool = False, judge: Any = None) -> JudgeRun:
    """The configured judge (``--judge``; default the round's reward model) judges every win-rate pair (A the
    baseline's answer, B the candidate's), and its agreement with expert labels is taken where it was measured.

    Agreement: the ``reward_model`` backend's comes from the reward-model stage's held-out judgments
    (``measured_judge_agreement``, as before); any other judge is qualified on ``config.agreement_data``
    (PandaLM's three annotators by default) through ``judging.qualify.qualify_judge``, cached per judge identity,
    so a changed judge is re-measured and an unchanged one is not asked again.

    ``shard``: a scoring judge (reward model, sequence classifier) scores data-parallel over the launch's processes
    (every process calls this with the same inputs; see :func:`shardable_judge`).
    ``judge``: an already built judge of ``config`` to ask (the canaries ask one judge for all of them: a reward
    model loaded once, an API judge's identity probed once); default: built here (``judging.factory.make_judge``).
    """
    if judge is None:
        judge = make_judge(config, reward_model=models["judge"] or None)
    if shard:
        judge.shard = True  # RewardModelJudge: judging.scoring.score(shard=True)
    prompts = suites.prompts["winrate"]
    base, cand = answers["baseline"]["winrate"]["text"], answers["candidate"]["winrate"]["text"]
    before = judge.requests_sent
    judgments = judge.judge(prompts, base, cand)
    qualification = None
    if config.backend == "reward_model":
        agreement = measured_judge_agreement(models["judge_manifest"])
        source = reward_model_dir
        agreement_source = f"the reward-model stage's held-out judgments ({reward_model_dir})"
    else:
        qualification = qualify_judge(judge, config)
        agreement = None if qualification is None else qualification.agreement
        source = config.agreement_data
        agreement_source = f"{config.agreement_data} ({'cached' if qualification and qualification.cached else 'measured now'})"
    pc, n_pc = position_consistency(judgments)
    info = {
        "judge": models["judge"] if config.backend == "reward_model" else judge.name,
        "name": judge.name,
        "backend": config.backend,
        "identity": judge.identity(),
        "identity_hash": judge.identity_hash(),
        "config": config.to_dict(),
        "agreement_source": agreement_source,
        "qualification": None if qualification is None else qualification.summary(),
        "position_consistency": pc,
        "n_position_checked": n_pc,
        "position_consistency_agreement_data": None if qualification is None else qualification.position_consistency,
        "n_judged": len(judgments),
        "n_unparsed": n_unparsed(judgments),
        "requests_sent": judge.requests_sent - before,  # win-rate pairs and (uncached) agreement pairs
        **judge.identity_report(),  # openai: new / unchanged / changed since the last run, the probe's requests
    }
    ids = suites.ids["winrate"]
    rows = [
        {"id": i, "pair_id": pair_id(p, a, b), "prompt": p, "response_a": a, "response_b": b,
         "preference": j.preference, "raw": j.raw, "consistent": j.consistent}
        for i, p, a, b, j in zip(ids, prompts, base, cand, judgments)
    ]
    return JudgeRun(judgment_preferences(judgments), agreement, source, to_jsonable(info), rows)


def write_judgments(path: Path, rows: list[dict]) -> None:
    """``judgments.jsonl``: one row per win-rate pair (suite id, ``pair_id`` (the id the ``labels`` backend looks
    up), prompt, response A = baseline, response B = candidate, preference, raw verdict, both-orders consistency).
    A team judging with people labels these ``pair_id``s (``judging.imported_labels``)."""
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(dumps_strict(to_jsonable(r)) + "\n")
