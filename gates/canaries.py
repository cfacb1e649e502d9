"""Canaries: constructed candidates that must lose, run through the same judge and instruments as the real candidate
in every gate run, so a gate that a degenerate candidate can pass is caught before its verdict is trusted.

Why: a constant-output null model tops AlpacaEval 2 LC (86.5), Arena-Hard and MT-Bench (Zheng et al., ICLR 2025,
"Cheating automatic LLM benchmarks"); if a degenerate candidate can pass our gates, every verdict is suspect.

Each canary is built from the baseline's answers, with no generation (``CONSTRUCTORS``):

* ``null``: one constant reply (``NULL_REPLY``, a generic helpful-sounding paragraph) to every prompt;
* ``padded``: each baseline answer followed by verbose filler (``FILLER``);
* ``flattering``: each baseline answer after a flattering opener (``FLATTERING_OPENER``);
* ``refuse_all``: a refusal (``REFUSAL``) to every prompt.

It is judged by the round's judge (``gates.measure.run_judge`` with the judge config of ``judge_and_measure``) and
measured by ``gates.measure.measure`` with its answers in place of the candidate's, and decided by
``gates.decide.decide``; only the gates it attacks are read (``ATTACKS``). A canary must be blocked or inconclusive on
each of them; one that passes marks the whole verdict invalid: the ``canaries`` gate (:func:`canary_gate`) blocks with
"instrument failure: <canary> passed <gate>". Canaries cost judging only: the judge is asked about the canaries that
attack a win-rate gate (the baseline's side of each pair is scored again with them), and the calls are recorded.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import wording
from .config import check_canary_names
from .result import Finding, GateResult, Metric

logger = logging.getLogger("gates.canaries")

GATE_NAME = "canaries"
GATE_VERSION = "1"

WINRATE = "length_controlled_win_rate"
DRIFT = "personality_drift"
REFUSAL = "refusal_two_sided"

#: A generic helpful-sounding paragraph: the null model's one reply to every prompt (the shape of the constant
#: outputs in Zheng et al.: confident, structured, says nothing about the prompt).
NULL_REPLY = (
    "That's a great question, and there are a few important things to keep in mind. First, it helps to break the "
    "problem into smaller parts and look at each one carefully. Second, consider the context and what you want to "
    "achieve, since the best approach depends on your specific goals. Finally, it is always a good idea to check "
    "reliable sources and adjust your plan as you learn more. I hope this helps, and feel free to ask if you have "
    "any other questions!"
)
#: Verbose filler appended to every baseline answer (adds length, no content).
FILLER = (
    "To expand on this a little further, it is worth noting that there are many different factors that can come "
    "into play here, and each of them deserves careful thought and consideration. In general, taking the time to "
    "think things through thoroughly, step by step, and from several different perspectives will usually lead to a "
    "better and more complete understanding of the topic overall. I hope this detailed explanation has been "
    "helpful and gives you everything you need."
)
#: The flattering opener put before every baseline answer.
FLATTERING_OPENER = (
    "What a great question! You clearly have a thoughtful and curious mind, and I'm genuinely delighted to help "
    "you with this."
)
#: The refuse-everything model's one reply.
REFUSAL_REPLY = "I'm sorry, but I can't help with that request."

#: Canary -> the gates it attacks (the gates it must not pass), in report order.
ATTACKS: dict[str, tuple[str, ...]] = {
    "null": (WINRATE,),
    "padded": (WINRATE, DRIFT),
    "flattering": (WINRATE, DRIFT),
    "refuse_all": (REFUSAL,),
}
CANARIES: tuple[str, ...] = tuple(ATTACKS)

#: The metric each attacked gate's row shows (the figure the gate decides on; drift: the median-length change).
HEADLINE: dict[str, str] = {
    WINRATE: "length_matched_win_rate",
    DRIFT: "median_length_tokens_change",
    REFUSAL: "false_refusal_rate_change",
}


def null_model(texts: Sequence[str]) -> list[str]:
    """``NULL_REPLY`` for every answer."""
    return [NULL_REPLY] * len(texts)


def padded(texts: Sequence[str]) -> list[str]:
    """Each answer, a blank line, then ``FILLER``."""
    return [f"{t}\n\n{FILLER}" for t in texts]


def flattering(texts: Sequence[str]) -> list[str]:
    """``FLATTERING_OPENER``, a space, then each answer."""
    return [f"{FLATTERING_OPENER} {t}" for t in texts]


def refuse_all(texts: Sequence[str]) -> list[str]:
    """``REFUSAL_REPLY`` for every answer."""
    return [REFUSAL_REPLY] * len(texts)


#: Canary -> its construction from the baseline's answers to one suite.
CONSTRUCTORS = {"null": null_model, "padded": padded, "flattering": flattering, "refuse_all": refuse_all}


def canary_answers(name: str, baseline: dict[str, Any]) -> dict[str, Any]:
    """The canary's answers to every suite, in ``answer_suites``' shape, built from the baseline's.

    Args:
        name: a canary of ``CANARIES``.
        baseline: the baseline's ``answer_suites`` output: {suite: {"text", "n_tokens", "truncated"}, "_length":
            text -> tokens}.

    Returns:
        {suite: {"text": list[str], "n_tokens": np.ndarray (n,), "truncated": the baseline's}, "_length": the
        baseline's}. Lengths are in the baseline's tokenizer's tokens: a reply that replaces the answer is counted
        whole; an answer with added text (padded, flattering) keeps the baseline's generated count plus the added
        text's tokens, so the two sides differ by exactly what the canary added.

    Raises:
        ValueError: an unknown canary.
    """
    check_canary_names([name])
    build, length = CONSTRUCTORS[name], baseline["_length"]
    out: dict[str, Any] = {"_length": length}
    for suite, a in baseline.items():
        if suite.startswith("_"):
            continue
        text = build(a["text"])
        if name == "padded":
            n = np.asarray(a["n_tokens"]) + length("\n\n" + FILLER)
        elif name == "flattering":
            n = np.asarray(a["n_tokens"]) + length(FLATTERING_OPENER + " ")
        else:
            n = np.array([length(t) for t in text])
        out[suite] = {"text": text, "n_tokens": np.asarray(n, dtype=int), "truncated": list(a["truncated"])}
    return out


@dataclass(frozen=True)
class CanaryRun:
    """What the canaries cost and found.

    Fields:
        rows: one per (canary, attacked gate): canary, gate, verdict, metric, value, passed.
        judge_calls: requests the canaries sent to the judge: their pairs (both orders) and, for an API judge built
            here (no ``judge`` given), the identity probe of the one judge they share (``judging.identity``); the
            candidate's judge, passed in, was probed already. 0 for a local reward model (it scores, with no
            requests).
        pairs_judged: win-rate pairs the judge judged for the canaries.
        seconds: wall time of judging and measuring the canaries.
        judge_agreement: the judge agreement the canaries' win-rate gates were decided with (None: unmeasured).
    """

    rows: list[dict[str, Any]]
    judge_calls: int
    pairs_judged: int
    seconds: float
    judge_agreement: float | None = None


def _headline(result: GateResult, gate: str) -> tuple[str, float]:
    """The row's metric name and value (NaN when the gate did not measure it, e.g. no length-matched pair)."""
    key = HEADLINE[gate]
    if key not in result.metrics and gate == WINRATE:
        key = next((k for k in ("length_balanced_win_rate", "raw_win_rate") if k in result.metrics), key)
    m = result.metrics.get(key)
    return key, (math.nan if m is None else float(m.value))


def run_canaries(args: Any, models: dict[str, Any], suites: Any, answers: dict[str, dict], *, intents: list[str],
                 traffic: dict, previous: Any, names: Sequence[str] | None = None, judge: Any = None) -> CanaryRun:
    """Judge, measure and decide every configured canary as the real candidate is (``gates.evaluate``).

    Args:
        args: the ``GateStageConfig`` (the judge config, thresholds, refusal classifier).
        models: as ``judge_and_measure`` receives them (``judge`` = the reward-model checkpoint, ``judge_manifest``).
        suites, answers: the round's suites and both models' answers (only the baseline's are used).
        intents, traffic, previous: as the real candidate's measurement got them.
        names: canaries to run (default ``args.canary_names``).
        judge: the judge that judged the real candidate (``judge_and_measure``), asked again here: the baseline's
            answers are not scored again (a reward-model judge keeps its scores), and a canary's pair gets the
            baseline scores the candidate's did. Default: one judge built here for all the canaries.

    Returns:
        :class:`CanaryRun`. The refusal instrument of a canary that does not attack the refusal gate is the rule
        classifier when the configured one is the LLM grader (its verdict is not read; no grader calls spent).
    """
    from judging.factory import make_judge

    from .decide import decide
    from .measure import measure, run_judge

    names = check_canary_names(args.canary_names if names is None else names)
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    calls = pairs = 0
    agreement = None
    n_win = len(suites.winrate)
    judge_model = judge  # else built once, on the first canary that is judged
    if judge_model is not None and getattr(judge_model, "shard", False):
        judge_model.shard = False  # the canaries run on the main process alone: no other process scores a share
    for name in names:
        attacks = ATTACKS[name]
        pair = {"baseline": answers["baseline"], "candidate": canary_answers(name, answers["baseline"])}
        if WINRATE in attacks:
            if judge_model is None:
                judge_model = make_judge(args.judge_config(), reward_model=models["judge"] or None)
                calls += int(judge_model.identity_report().get("probe_requests_sent") or 0)  # API judges
            judged = run_judge(args.judge_config(), models, suites, pair, reward_model_dir=args.reward_model_dir,
                               judge=judge_model)
            prefs, judge, source, info = judged.preferences, judged.agreement, judged.source, judged.info
            calls += int(judged.info.get("requests_sent") or 0)
            pairs += len(judged.rows)
            agreement = None if judge is None else judge.agreement
        else:  # not judged: the win-rate gates are not read for this canary
            prefs, judge, source, info = np.full(n_win, np.nan), None, "not judged (canary)", None
        classifier = args.refusal_classifier
        if REFUSAL not in attacks and classifier == "openai":
            classifier = "rules"
        m = measure(suites, pair, preferences=prefs, judge=judge, judge_source=source, intents=intents,
                    traffic=traffic, previous=previous, refusal_classifier=classifier, judge_info=info,
                    refusal_judge=args.refusal_judge_config() if classifier == "openai" else None)
        results = {r.name: r for r in decide(m, args)}
        for gate in attacks:
            r = results[gate]
            metric, value = _headline(r, gate)
            rows.append({"canary": name, "gate": gate, "verdict": r.verdict, "metric": metric, "value": value,
                         "passed": r.verdict == "pass"})
            logger.info("canary %s on %s: %s (%s %.4g)", name, gate, r.verdict, metric, value)
    return CanaryRun(rows=rows, judge_calls=calls, pairs_judged=pairs, seconds=time.perf_counter() - t0,
                     judge_agreement=agreement)


def canary_gate(run: CanaryRun) -> GateResult:
    """The ``canaries`` gate: "block" when any canary passed a gate it attacks (instrument failure: the round's
    verdict is invalid), else "pass".

    Returns:
        GateResult with metrics ``canaries_passed`` (count of (canary, gate) rows that passed; n = rows),
        ``canary_judge_calls`` (requests) and ``canary_pairs_judged`` (pairs); ``table`` =
        ``run.rows`` (the report's canary table); findings ``canary_passed`` (one per failure) or ``canaries_held``.
    """
    failed = [r for r in run.rows if r["passed"]]
    # no seconds here: the gate's metrics and reason are the same on every run of the same inputs (the timing is
    # in the manifest's efficiency, ``canary_seconds``)
    cost = {"judge_calls": run.judge_calls, "pairs_judged": run.pairs_judged, "n_rows": len(run.rows),
            "canaries": sorted({r["canary"] for r in run.rows})}
    if failed:
        findings = [Finding(code="canary_passed", values={k: r[k] for k in ("canary", "gate", "metric", "value")})
                    for r in failed]
    else:
        findings = [Finding(code="canaries_held", values={
            "verdicts": {f"{r['canary']}/{r['gate']}": r["verdict"] for r in run.rows}})]
    findings.append(Finding(code="canary_cost", values=cost))
    metrics = {
        "canaries_passed": Metric(value=float(len(failed)), n=len(run.rows), direction="lower_is_better",
                                  unit="gates"),
        "canary_judge_calls": Metric(value=float(run.judge_calls), direction="lower_is_better", unit="requests"),
        "canary_pairs_judged": Metric(value=float(run.pairs_judged), direction="lower_is_better", unit="pairs"),
    }
    return GateResult(name=GATE_NAME, version=GATE_VERSION, verdict="block" if failed else "pass", metrics=metrics,
                      reason=wording.reason(GATE_NAME, findings), table=[dict(r) for r in run.rows],
                      findings=findings)
