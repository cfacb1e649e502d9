"""Consistency gate: is a durable constraint stated early in a long conversation still kept many turns later?

The failure it catches: a constraint the user states once (a language, a length, a format, their name, a forbidden
item; ``gates.constraints.CONSTRAINTS``) is lost by the turn it applies to, because it fell out of the context or sits
in the middle of it, where recall is lowest (recall is U-shaped in position: Liu et al. 2024, "Lost in the Middle",
TACL 12).

The suite (:func:`build_suite`, seeded): each conversation is ``depth`` real exchanges (user turn + assistant turn) of
Anthropic HH-RLHF and MT-Bench conversations (``load_exchanges``), with the constraint's statement and an accepting
reply as the exchange at index ``round(position * (depth - 1))`` (position 0: the first exchange; 0.5: the middle),
then the probe, the request the constraint applies to, as turn ``depth + 1``. For one (depth, item) the filler and
the constraint are the same at every position, so positions compare like with like. A depth whose conversations do
not fit the models' context (rendered prompt plus ``max_new_tokens`` over the smaller context length) is skipped and
reported, never cut: cutting would drop the constraint the probe tests.

Recall = compliant replies / probes (``gates.constraints.check``, programmatic; no judge). Per depth, the candidate
and the baseline answered the same conversations, so the change is paired: Newcombe's paired score interval of
recall_candidate - recall_baseline (``judging.intervals.newcombe_paired_diff``). The rule (:func:`verdict`) tests
every measured depth, so each interval is at confidence ``1 - (1 - confidence) / k`` for k measured depths
(Bonferroni: the chance that any of the k intervals misses its true change is at most ``1 - confidence``).
The positions of one conversation share its filler and constraint, so its probes are not independent: the paired
interval's half-widths are scaled by sqrt(deff), deff the design effect of the mean paired difference with the
conversations as clusters (``judging.intervals.mean_design_effect``: the cluster-robust CR1 variance over the
item-level one, Cameron & Miller 2015; Kish 1965 section 8.2 for the variance inflation), clipped to [-1, 1]; with
no within-conversation correlation deff = 1 and the interval is Newcombe's.
"""

from __future__ import annotations

import gzip
import json
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gates import wording
from gates.constraints import CONSTRAINTS, Constraint, constraints_by_name
from gates.result import Finding, GateResult, Metric, Verdict
import numpy as np

from judging.intervals import DEFAULT_CONFIDENCE, mean_design_effect, newcombe_paired_diff, wilson

GATE_NAME = "consistency_recall"
GATE_VERSION = "1"
DEFAULT_DEPTHS: tuple[int, ...] = (5, 10, 20, 40)
DEFAULT_POSITIONS: tuple[float, ...] = (0.0, 0.5)
#: Longest filler exchange kept, in characters (user + assistant): at about 4 characters per token, 40 exchanges
#: of at most 700 characters are at most ~7,000 tokens, inside SmolLM2's 8,192.
MAX_EXCHANGE_CHARS = 700
#: Probes a depth needs on both sides before its change can decide.
DEFAULT_MIN_ITEMS = 20
#: Allowed drop of recall at a depth, in points.
DEFAULT_MAX_DROP_PP = 5.0


@dataclass(frozen=True)
class Exchange:
    """One real exchange: a user turn and the assistant's reply, from conversation ``source``."""

    user: str
    assistant: str
    source: str


def _hh_exchanges(path: Path) -> list[list[Exchange]]:
    """The chosen transcripts of an HH-RLHF file (JSONL, optionally gzipped; ``chosen`` = "\\n\\nHuman: ...
    \\n\\nAssistant: ..."), one list of exchanges per row.

    Raises:
        ValueError: a row that is not JSON, has no string ``chosen``, or a transcript that does not alternate
            Human / Assistant, naming the file and row.
    """
    opener = gzip.open if path.suffix == ".gz" else open
    out = []
    with opener(path, "rt", encoding="utf-8") as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as err:
                raise ValueError(f"{path}: row {i}: not JSON ({err})") from None
            chosen = row.get("chosen") if isinstance(row, dict) else None
            if not isinstance(chosen, str):
                raise ValueError(f"{path}: row {i}: field 'chosen': missing or not a string")
            parts = chosen.split("\n\nHuman: ")
            turns = []
            for part in parts[1:]:
                human, sep, assistant = part.partition("\n\nAssistant: ")
                if not sep or "\n\nAssistant: " in assistant:
                    raise ValueError(f"{path}: row {i}: field 'chosen': turns do not alternate Human / Assistant")
                turns.append((human.strip(), assistant.strip()))
            source = str(row.get("id", f"{path.name}:{i}"))
            out.append([Exchange(h, a, source) for h, a in turns if h and a])
    return out


def _mt_bench_exchanges(answers: Path) -> list[list[Exchange]]:
    """MT-Bench's two-turn conversations with GPT-4's reference answers: ``answers`` (``question_id``,
    ``choices[0].turns``) and the questions file beside it, ``mt_bench_question.jsonl`` (``question_id``,
    ``turns``).

    Raises:
        ValueError: a row without the fields, or a question id missing from the questions file (file and row named).
    """
    questions_path = answers.with_name("mt_bench_question.jsonl")
    questions = {}
    for i, line in enumerate(questions_path.read_text(encoding="utf-8").splitlines()):
        if line.strip():
            row = json.loads(line)
            if "question_id" not in row or not isinstance(row.get("turns"), list):
                raise ValueError(f"{questions_path}: row {i}: needs question_id and a list 'turns'")
            questions[row["question_id"]] = row["turns"]
    out = []
    for i, line in enumerate(answers.read_text(encoding="utf-8").splitlines()):
        if not line.strip():
            continue
        row = json.loads(line)
        qid = row.get("question_id")
        if qid not in questions:
            raise ValueError(f"{answers}: row {i}: question_id {qid!r} is not in {questions_path}")
        try:
            replies = row["choices"][0]["turns"]
        except (KeyError, IndexError, TypeError):
            raise ValueError(f"{answers}: row {i}: field 'choices[0].turns' missing") from None
        out.append([Exchange(q.strip(), a.strip(), f"mt_bench:{qid}") for q, a in zip(questions[qid], replies)
                    if q.strip() and a.strip()])
    return out


def load_exchanges(hh_path: str | Path, mt_bench_path: str | Path | None = None) -> list[list[Exchange]]:
    """Real conversations as lists of exchanges: HH-RLHF chosen transcripts, then MT-Bench with GPT-4 reference
    answers (when ``mt_bench_path`` is given), in file order; empty conversations left out."""
    convs = _hh_exchanges(Path(hh_path))
    if mt_bench_path:
        convs += _mt_bench_exchanges(Path(mt_bench_path))
    return [c for c in convs if c]


@dataclass(frozen=True)
class ConsistencyItem:
    """One probe conversation.

    Fields:
        id: ``consistency-d<depth>-p<position>-<item>-<constraint>``.
        depth: exchanges before the probe (the probe is turn depth + 1); position: where the statement sits, as a
            fraction of the way from the first exchange (0) to the last before the probe (1); statement_turn: its
            exchange index (0-based).
        constraint: the constraint's name (``gates.constraints.CONSTRAINTS``); messages: the chat, ending in the probe.
        sources: the conversations the filler came from; n_tokens: the rendered prompt's tokens (None: not counted).
        conversation: ``d<depth>-<item>``, shared by the positions of one conversation (the cluster of the interval).
    """

    id: str
    depth: int
    position: float
    statement_turn: int
    constraint: str
    messages: list[dict[str, str]]
    sources: tuple[str, ...]
    n_tokens: int | None = None
    conversation: str = ""


@dataclass(frozen=True)
class ConsistencySuite:
    """The suite: the probe conversations, and the depths skipped with why.

    Fields:
        items: :class:`ConsistencyItem` in (depth, item, position) order.
        depths: the depths measured; positions: the positions used.
        skipped: ``{depth: reason}`` for each depth that did not fit the context (or had too little filler).
        context_length: the token budget a conversation had to fit (None: not checked).
    """

    items: list[ConsistencyItem]
    depths: tuple[int, ...]
    positions: tuple[float, ...]
    skipped: dict[int, str] = field(default_factory=dict)
    context_length: int | None = None


def statement_turn(depth: int, position: float) -> int:
    """The exchange index of the constraint's statement: ``round(position * (depth - 1))`` (0 <= index < depth)."""
    return int(round(position * (depth - 1)))


def _filler(convs: list[list[Exchange]], n: int, rng: random.Random, avoid: Sequence[str]) -> list[Exchange] | None:
    """``n`` filler exchanges: whole conversations in a seeded random order, cut to ``n``; exchanges longer than
    :data:`MAX_EXCHANGE_CHARS` or containing a word of ``avoid`` are left out. None when there are too few."""
    order = list(range(len(convs)))
    rng.shuffle(order)
    low = [w.lower() for w in avoid]
    out: list[Exchange] = []
    for j in order:
        for ex in convs[j]:
            text = (ex.user + " " + ex.assistant).lower()
            if len(ex.user) + len(ex.assistant) > MAX_EXCHANGE_CHARS or any(w in text for w in low):
                continue
            out.append(ex)
            if len(out) == n:
                return out
    return None


def build_suite(
    convs: list[list[Exchange]],
    *,
    depths: Sequence[int] = DEFAULT_DEPTHS,
    positions: Sequence[float] = DEFAULT_POSITIONS,
    n_per_depth: int = 16,
    seed: int = 0,
    constraints: Sequence[Constraint] = CONSTRAINTS,
    count_tokens: Callable[[list[dict[str, str]]], int] | None = None,
    context_length: int | None = None,
) -> ConsistencySuite:
    """The probe conversations: ``n_per_depth`` per depth, each at every position (seeded: same inputs, same suite).

    Item ``j`` of a depth states constraint ``constraints[j % len(constraints)]``; its filler is drawn with
    ``random.Random(f"{seed}-{depth}-{j}")`` (string seeds hash deterministically), so a depth's items do not change
    when another depth is added.

    Args:
        convs: real conversations (:func:`load_exchanges`).
        depths: exchanges before the probe, each >= 1; positions: fractions in [0, 1].
        count_tokens: tokens of a rendered chat prompt (messages -> int); with ``context_length``, a depth any of
            whose conversations is longer than ``context_length`` is skipped whole (its reason names the longest).
        context_length: the prompt budget in tokens (the models' context minus the reply's tokens).

    Returns:
        :class:`ConsistencySuite`.

    Raises:
        ValueError: an empty depth or position list, a depth < 1, a repeated depth, a position outside [0, 1],
            n_per_depth < 1, or no constraint.
    """
    depths, positions = [int(d) for d in depths], [float(p) for p in positions]
    if not depths or not positions or not constraints:
        raise ValueError("consistency: depths, positions and constraints must be non-empty")
    if any(d < 1 for d in depths) or len(set(depths)) != len(depths):
        raise ValueError(f"consistency_depths must be distinct integers >= 1, got {depths}")
    if any(not 0.0 <= p <= 1.0 for p in positions) or len(set(positions)) != len(positions):
        raise ValueError(f"consistency_positions must be distinct fractions in [0, 1], got {positions}")
    if n_per_depth < 1:
        raise ValueError(f"n_consistency must be at least 1, got {n_per_depth}")
    items: list[ConsistencyItem] = []
    measured: list[int] = []
    skipped: dict[int, str] = {}
    for depth in sorted(depths):
        rows: list[ConsistencyItem] = []
        short = None
        for j in range(n_per_depth):
            c = constraints[j % len(constraints)]
            filler = _filler(convs, depth - 1, random.Random(f"{seed}-{depth}-{j}"), c.avoid)
            if filler is None:
                short = f"fewer than {depth - 1} usable filler exchanges for constraint {c.name}"
                break
            for p in positions:
                k = statement_turn(depth, p)
                exchanges = [(e.user, e.assistant) for e in filler[:k]] + [(c.statement, c.acknowledgement)] + [
                    (e.user, e.assistant) for e in filler[k:]]
                messages = [m for u, a in exchanges for m in ({"role": "user", "content": u},
                                                               {"role": "assistant", "content": a})]
                messages.append({"role": "user", "content": c.probe})
                n = count_tokens(messages) if count_tokens is not None else None
                rows.append(ConsistencyItem(
                    id=f"consistency-d{depth}-p{p:g}-{j}-{c.name}", depth=depth, position=p, statement_turn=k,
                    constraint=c.name, messages=messages, sources=tuple(dict.fromkeys(e.source for e in filler)),
                    n_tokens=n, conversation=f"d{depth}-{j}"))
        if short is not None:
            skipped[depth] = short
            continue
        longest = max((r.n_tokens or 0) for r in rows)
        if context_length is not None and count_tokens is not None and longest > context_length:
            skipped[depth] = (f"does not fit the context: the longest conversation is {longest} tokens, the budget "
                              f"{context_length}")
            continue
        measured.append(depth)
        items.extend(rows)
    return ConsistencySuite(items, tuple(measured), tuple(positions), skipped, context_length)


def context_budget(model_paths: Sequence[str], max_new_tokens: int, limit: int = 0) -> int:
    """Tokens a probe conversation may take: the smaller context length of the models minus ``max_new_tokens``.

    A model's context length is its config's ``max_position_embeddings`` (else ``n_positions``), capped by its
    tokenizer's ``model_max_length`` when that is set (transformers uses ~1e30 for "unset"); ``limit`` > 0 caps it
    further (a team's serving context).

    Raises:
        ValueError: no context length found, or a budget < 1.
    """
    from transformers import AutoConfig, AutoTokenizer

    lengths = []
    for path in model_paths:
        cfg = AutoConfig.from_pretrained(path)
        n = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
        if n is None:
            raise ValueError(f"{path}: the config names no context length (max_position_embeddings)")
        tok_max = AutoTokenizer.from_pretrained(path).model_max_length
        lengths.append(min(int(n), int(tok_max)) if tok_max and tok_max < 1e9 else int(n))
    ctx = min(lengths + ([limit] if limit > 0 else []))
    budget = ctx - max_new_tokens
    if budget < 1:
        raise ValueError(f"consistency: context length {ctx} leaves no room for max_new_tokens={max_new_tokens}")
    return budget


@dataclass(frozen=True)
class ConsistencyMeasure:
    """Both models' compliance on the suite.

    Fields:
        suite: the suite answered; compliant: ``{"candidate", "baseline"}`` -> one bool per item, in suite order.
    """

    suite: ConsistencySuite
    compliant: dict[str, list[bool]]


def measure_consistency(suite: ConsistencySuite, replies: dict[str, Sequence[str]]) -> ConsistencyMeasure:
    """Check each model's replies (``{"candidate": [...], "baseline": [...]}``, suite order) against the items'
    constraints.

    Raises:
        ValueError: a side whose reply count differs from the suite's items.
    """
    by_name = constraints_by_name()
    out = {}
    for who, texts in replies.items():
        if len(texts) != len(suite.items):
            raise ValueError(f"consistency: {len(texts)} {who} replies for {len(suite.items)} probes")
        out[who] = [by_name[it.constraint].check(t) for it, t in zip(suite.items, texts)]
    return ConsistencyMeasure(suite, out)


@dataclass(frozen=True)
class Recall:
    """k compliant of n probes, with its Wilson interval (fractions)."""

    k: int
    n: int
    ci_low: float
    ci_high: float

    @property
    def recall(self) -> float:
        """k / n (NaN when n == 0)."""
        return self.k / self.n if self.n else math.nan

    @classmethod
    def of(cls, flags: Sequence[bool], confidence: float) -> "Recall":
        k, n = int(sum(flags)), len(flags)
        lo, hi = wilson(k, n, confidence) if n else (math.nan, math.nan)
        return cls(k, n, float(lo), float(hi))


@dataclass(frozen=True)
class DepthChange:
    """One depth's paired comparison: the 2x2 table (both, candidate only, baseline only, neither compliant), the
    change in points and its Newcombe paired interval (fractions) at the Bonferroni-adjusted ``confidence``, widened
    by sqrt(``design_effect``) for the ``n_conversations`` clusters (:func:`clustered_paired_diff`)."""

    depth: int
    both: int
    candidate_only: int
    baseline_only: int
    neither: int
    delta_pp: float
    ci: tuple[float, float]
    confidence: float
    design_effect: float = 1.0
    n_conversations: int = 0

    @property
    def n(self) -> int:
        return self.both + self.candidate_only + self.baseline_only + self.neither


def _select(m: ConsistencyMeasure, who: str, **where: Any) -> list[bool]:
    return [f for it, f in zip(m.suite.items, m.compliant[who]) if all(getattr(it, k) == v for k, v in where.items())]


def clustered_paired_diff(candidate: Sequence[bool], baseline: Sequence[bool], clusters: Sequence[Any],
                          confidence: float) -> tuple[tuple[int, int, int, int], tuple[float, float], float, int]:
    """The paired change candidate - baseline of 0/1 outcomes on the same probes, with clustered probes.

    Newcombe's paired interval (``judging.intervals.newcombe_paired_diff``) of the 2x2 table, its half-widths scaled
    by sqrt(deff) around the difference d and clipped to [-1, 1], deff = ``mean_design_effect`` of the centred
    paired differences (c_i - b_i - d) with ``clusters`` (1 when every probe is its own cluster).

    Returns:
        ((both, candidate_only, baseline_only, neither), (low, high) as fractions, deff, n_clusters); NaN bounds
        when there is no probe.
    """
    c, b = np.asarray(candidate, dtype=bool), np.asarray(baseline, dtype=bool)
    cells = (int((c & b).sum()), int((c & ~b).sum()), int((~c & b).sum()), int((~c & ~b).sum()))
    lo, hi = newcombe_paired_diff(*cells, confidence=confidence)
    if not len(c):
        return cells, (lo, hi), math.nan, 0
    diff = c.astype(float) - b.astype(float)
    d = float(diff.mean())
    deff, n_clusters = mean_design_effect(diff - d, list(clusters))
    r = math.sqrt(deff)
    return cells, (max(-1.0, d - r * (d - lo)), min(1.0, d + r * (hi - d))), float(deff), n_clusters


def depth_changes(m: ConsistencyMeasure, confidence: float = DEFAULT_CONFIDENCE) -> list[DepthChange]:
    """Per measured depth, the paired change candidate - baseline with its interval at ``1 - (1 - confidence) / k``
    (k = measured depths; Bonferroni), clustered by conversation (:func:`clustered_paired_diff`)."""
    k = max(1, len(m.suite.depths))
    level = 1 - (1 - confidence) / k
    out = []
    for d in m.suite.depths:
        keep = [i for i, it in enumerate(m.suite.items) if it.depth == d]
        cells, ci, deff, g = clustered_paired_diff(
            [m.compliant["candidate"][i] for i in keep], [m.compliant["baseline"][i] for i in keep],
            [m.suite.items[i].conversation for i in keep], level)
        n = len(keep)
        delta = 100 * (cells[1] - cells[2]) / n if n else math.nan
        out.append(DepthChange(d, *cells, delta_pp=delta, ci=ci, confidence=level, design_effect=deff,
                               n_conversations=g))
    return out


@dataclass(frozen=True)
class ConsistencyThresholds:
    """The rule's thresholds: ``max_drop_pp`` (allowed recall drop at a depth, points, >= 0) and ``min_items``
    (probes a depth needs, >= 1).

    Raises:
        ValueError: a negative drop or min_items < 1.
    """

    max_drop_pp: float = DEFAULT_MAX_DROP_PP
    min_items: int = DEFAULT_MIN_ITEMS

    def __post_init__(self) -> None:
        if self.max_drop_pp < 0:
            raise ValueError(f"consistency_max_drop_pp must be >= 0, got {self.max_drop_pp}")
        if self.min_items < 1:
            raise ValueError(f"consistency_min_items must be >= 1, got {self.min_items}")


#: Finding codes that block, and those that leave the gate undecided.
BLOCKING = ("depth_regressed",)
UNDECIDED = ("no_depth_measured", "depth_too_little_evidence", "depth_drop_could_be_noise")


def verdict(m: ConsistencyMeasure, th: ConsistencyThresholds,
            confidence: float = DEFAULT_CONFIDENCE) -> tuple[Verdict, list[Finding]]:
    """The consistency rule, per measured depth (positions and constraints pooled; paired over the same probes):
      1. fewer than ``min_items`` probes -> ``depth_too_little_evidence`` (undecided);
      2. a drop larger than ``max_drop_pp`` whose Bonferroni-adjusted paired interval lies wholly below 0 ->
         ``depth_regressed``: "block";
      3. a drop larger than ``max_drop_pp`` whose interval reaches 0 -> ``depth_drop_could_be_noise`` (undecided);
      4. otherwise ``depth_within``.
    Any block -> "block"; else any undecided depth, or no depth measured (every depth skipped) -> "inconclusive";
    else "pass". Skipped depths are reported (``depths_skipped``) and neither block nor pass.
    """
    findings: list[Finding] = []
    if m.suite.skipped:
        findings.append(Finding(code="depths_skipped", values={
            "skipped": {str(d): r for d, r in m.suite.skipped.items()}, "context_length": m.suite.context_length}))
    if not m.suite.depths:
        findings.append(Finding(code="no_depth_measured", values={"n_skipped": len(m.suite.skipped)}))
    for ch in depth_changes(m, confidence):
        lo, hi = ch.ci
        values = {"depth": ch.depth, "n": ch.n, "n_conversations": ch.n_conversations,
                  "design_effect": ch.design_effect, "delta_pp": ch.delta_pp, "ci_low_pp": 100 * lo,
                  "ci_high_pp": 100 * hi, "confidence": ch.confidence, "allowed_pp": th.max_drop_pp,
                  "candidate_recall": 100 * (ch.both + ch.candidate_only) / ch.n if ch.n else math.nan,
                  "baseline_recall": 100 * (ch.both + ch.baseline_only) / ch.n if ch.n else math.nan}
        if ch.n < th.min_items:
            code = "depth_too_little_evidence"
            values["min_items"] = th.min_items
        elif ch.delta_pp < -th.max_drop_pp:
            code = "depth_regressed" if hi < 0 else "depth_drop_could_be_noise"
        else:
            code = "depth_within"
        findings.append(Finding(code=code, values=values))
    codes = {f.code for f in findings}
    if codes & set(BLOCKING):
        return "block", findings
    return ("inconclusive" if codes & set(UNDECIDED) else "pass"), findings


def _pct(r: Recall) -> dict[str, Any]:
    return {"k": r.k, "n": r.n, "recall_pct": 100 * r.recall if r.n else None,
            "ci_low_pct": 100 * r.ci_low if r.n else None, "ci_high_pct": 100 * r.ci_high if r.n else None}


def gate_table(m: ConsistencyMeasure, confidence: float = DEFAULT_CONFIDENCE) -> list[dict[str, Any]]:
    """Rows ``{model, depth, position, constraint, k, n, recall_pct, ci_low_pct, ci_high_pct}`` (Wilson at
    ``confidence``), baseline first: per (depth, position) with constraint "all", per depth with position "all",
    and per constraint with depth and position "all". Depth and position are strings ("20", "0.5", "all") so each
    column has one type (the trackers' tables refuse a column mixing numbers and text)."""
    rows = []
    names = list(dict.fromkeys(it.constraint for it in m.suite.items))
    for who in ("baseline", "candidate"):
        if who not in m.compliant:
            continue
        for d in m.suite.depths:
            for p in m.suite.positions:
                rows.append({"model": who, "depth": str(d), "position": f"{p:g}", "constraint": "all",
                             **_pct(Recall.of(_select(m, who, depth=d, position=p), confidence))})
            rows.append({"model": who, "depth": str(d), "position": "all", "constraint": "all",
                         **_pct(Recall.of(_select(m, who, depth=d), confidence))})
        for c in names:
            rows.append({"model": who, "depth": "all", "position": "all", "constraint": c,
                         **_pct(Recall.of(_select(m, who, constraint=c), confidence))})
    return rows


def gate_metrics(m: ConsistencyMeasure, changes: list[DepthChange],
                 confidence: float = DEFAULT_CONFIDENCE) -> dict[str, Metric]:
    """``recall_candidate`` / ``recall_baseline`` (percent over every probe, Wilson CI), per depth
    ``recall_candidate_d<depth>`` / ``recall_baseline_d<depth>`` and ``recall_change_d<depth>`` (points, paired
    Newcombe CI at the adjusted level), and ``recall_change_worst_depth`` (the most negative per-depth change, its
    interval and n)."""
    out: dict[str, Metric] = {}

    def rate(flags: list[bool]) -> Metric:
        r = Recall.of(flags, confidence)
        nan = not r.n
        return Metric(value=math.nan if nan else 100 * r.recall, ci_low=math.nan if nan else 100 * r.ci_low,
                      ci_high=math.nan if nan else 100 * r.ci_high, n=r.n, direction="higher_is_better",
                      unit="percent")

    for who in ("candidate", "baseline"):
        out[f"recall_{who}"] = rate(list(m.compliant[who]))
    for ch in changes:
        for who in ("candidate", "baseline"):
            out[f"recall_{who}_d{ch.depth}"] = rate(_select(m, who, depth=ch.depth))
        out[f"recall_change_d{ch.depth}"] = Metric(value=ch.delta_pp, ci_low=100 * ch.ci[0], ci_high=100 * ch.ci[1],
                                                   n=ch.n, direction="higher_is_better", unit="points")
    finite = [ch for ch in changes if math.isfinite(ch.delta_pp)]
    if finite:
        worst = min(finite, key=lambda ch: ch.delta_pp)
        out["recall_change_worst_depth"] = out[f"recall_change_d{worst.depth}"]
    return out


def consistency_gate(
    m: ConsistencyMeasure,
    *,
    max_drop_pp: float = DEFAULT_MAX_DROP_PP,
    min_items: int = DEFAULT_MIN_ITEMS,
    confidence: float = DEFAULT_CONFIDENCE,
) -> GateResult:
    """Block when constraint recall drops significantly at any depth (:func:`verdict`; Bonferroni over depths).

    Args:
        m: both models' compliance (:func:`measure_consistency`).
        max_drop_pp: allowed drop at a depth (points); min_items: probes a depth needs.
        confidence: family-wise level over the depths (each depth's interval is at ``1 - (1 - confidence) / k``).

    Returns:
        GateResult with :func:`gate_metrics`, :func:`gate_table` and the findings of :func:`verdict`.

    Raises:
        ValueError: a negative drop or min_items < 1; a measure without both models.
    """
    if set(m.compliant) != {"candidate", "baseline"}:
        raise ValueError(f"consistency: needs candidate and baseline compliance, got {sorted(m.compliant)}")
    th = ConsistencyThresholds(max_drop_pp, min_items)
    v, findings = verdict(m, th, confidence)
    return GateResult(name=GATE_NAME, version=GATE_VERSION, verdict=v,
                      metrics=gate_metrics(m, depth_changes(m, confidence), confidence),
                      reason=wording.reason(GATE_NAME, findings), table=gate_table(m, confidence), findings=findings)
