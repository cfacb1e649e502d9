"""The agreement follows the judge: any judge's agreement with expert labels, measured on pairs with several
annotators (PandaLM's test set with its three human annotators by default) and cached per judge identity.

``qualify_judge(judge, config)`` judges each agreement pair (response 1 as A, response 2 as B) through the one
judge interface, turns the preferences into labels (``data.labels.preference_to_label``: 1.0 -> first better,
2.0 -> second, 1.5 -> tie, NaN -> unparsed) and measures ``judging.agreement.judge_agreement`` against the
annotators' strict majority (agreement a on decisive expert labels, n, and Wilson's interval on the effective n
of the pairs clustered by shared instruction or response, ``judging.agreement.pair_clusters``: PandaLM's 939 usable
pairs come from 164 instructions, so its pairs are worth far fewer independent ones). The result is cached
under the sha256 of (judge identity, agreement data fingerprint, n), so a judge is measured once and re-measured
whenever its identity (backend, model, template, decoding) or the data changes. The CLI prints it:
``rlhf judge agreement --judge openai --model M --base-url URL -n 200``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from judging.agreement import Agreement, judge_agreement, preference_pair_clusters
from data.labels import preference_to_label
from data.fingerprint import data_fingerprint
from rlhf.serialization import to_jsonable

from .cache import JudgmentCache
from .judges import Judge, JudgeConfig, judge_pairs, n_unparsed, position_consistency, preferences

logger = logging.getLogger(__name__)

#: PandaLM's test set holds 60 of 999 rows that cannot be pairs (empty or non-string responses), see
#: ``data.loaders.load_pairs``; they are counted in ``n_rejected``.
MAX_REJECT_RATE = 0.07

#: Part of the cache key: a measurement stored under an older agreement record's fields is measured again
#: instead of failing to load (2: one ``Agreement`` record for reward models, judges and the gate; 3: its interval
#: is clustered by shared instruction or response and it records n_clusters and n_eff).
AGREEMENT_RECORD_VERSION = 3


@dataclass(frozen=True)
class JudgeQualification:
    """A judge's measured agreement with expert labels.

    Fields:
        judge: the judge's name (``<backend>:<model>``); identity / identity_hash: what was measured.
        data, data_fingerprint: the agreement pairs (source and content hash); n_rejected: rows the loader
            rejected (not pairs), reported.
        ids: the pairs judged; judge_labels: the judge's label per pair (-1 unparsed); expert_labels: the
            annotators' labels per pair (n, n_annotators).
        agreement: ``judging.agreement.Agreement`` (a, Wilson CI, n decisive, ties and unparsed apart).
        position_consistency: share of pairs whose two orders agreed (openai; NaN for other backends);
            n_position_checked: its denominator.
        n_unparsed: pairs whose judge answer could not be parsed.
        requests_sent: HTTP requests this measurement sent (0 when cached or for local judges).
        cached: read from the cache (not stored).
    """

    judge: str
    identity: dict
    identity_hash: str
    data: str
    data_fingerprint: str
    n_rejected: int
    ids: list[str]
    judge_labels: list[int]
    expert_labels: list[list[int]]
    agreement: Agreement
    position_consistency: float
    n_position_checked: int
    n_unparsed: int
    requests_sent: int = 0
    cached: bool = field(default=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        d = to_jsonable(self)
        d.pop("cached", None)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, cached: bool = False) -> "JudgeQualification":
        d = dict(d)
        d["agreement"] = Agreement.from_dict(d["agreement"])
        if d.get("position_consistency") is None:
            d["position_consistency"] = math.nan
        if cached:
            d["requests_sent"] = 0  # this read sent none (the stored value is the original measurement's)
        return cls(**d, cached=cached)

    def summary(self) -> dict[str, Any]:
        """One flat row for reports and tables: judge, a, CI, n, n_eff and clusters, 2a-1, position consistency,
        unparsed."""
        ag = self.agreement
        return {
            "judge": self.judge, "agreement": ag.agreement, "ci_low": ag.ci.low, "ci_high": ag.ci.high,
            "n": ag.n, "n_eff": ag.n_eff, "n_clusters": ag.n_clusters, "cluster_rule": ag.cluster_rule,
            "n_items": ag.n_items, "attenuation": ag.attenuation,
            "position_consistency": self.position_consistency, "n_position_checked": self.n_position_checked,
            "n_unparsed": self.n_unparsed, "three_class_agreement": ag.three_class_accuracy,
            "data": self.data, "cached": self.cached,
        }


def _cache(config: JudgeConfig) -> JudgmentCache:
    return JudgmentCache(config.resolved_cache_dir() / "agreement")


def qualify_judge(judge: Judge, config: JudgeConfig, *, use_cache: bool = True) -> JudgeQualification | None:
    """Measure (or read from the cache) ``judge``'s agreement with the annotators of ``config.agreement_data``.

    Args:
        judge: any backend (``judging.factory.make_judge``).
        config: ``agreement_data`` (PandaLM-format pairs with annotator labels), ``agreement_n`` (first N pairs;
            0: all), ``cache_dir``.
        use_cache: read a cached measurement of this identity (always written).

    Returns:
        The qualification; None for a ``labels`` judge whose file labels none of the agreement pairs (then the
        judge is not measured, and gates relying on it are inconclusive).

    Raises:
        ValueError: the agreement data cannot be read (see ``data.loaders.load_pairs``).
    """
    from data.loaders import load_pairs

    fingerprint = data_fingerprint(config.agreement_data)
    cache = _cache(config)
    key = cache.key({"identity": judge.identity(), "data": fingerprint, "n": config.agreement_n,
                     "record": AGREEMENT_RECORD_VERSION})
    hit = cache.get(key) if use_cache else None
    if hit is not None:
        return JudgeQualification.from_dict(hit, cached=True)

    rejects = config.resolved_cache_dir() / "agreement" / "rejects" / f"{fingerprint[:16]}.jsonl"
    pairs = load_pairs(config.agreement_data, mode="lenient", max_reject_rate=MAX_REJECT_RATE,
                       rejects_path=rejects, source_format=None)
    items = list(pairs)[: config.agreement_n] if config.agreement_n else list(pairs)
    if judge.backend == "labels":
        items = [p for p, ok in zip(items, judge.has([p.id for p in items])) if ok]  # type: ignore[attr-defined]
        if not items:
            logger.warning("judge %s labels none of the agreement pairs of %s: agreement not measured",
                           judge.name, config.agreement_data)
            return None
    before = judge.requests_sent
    judgments = judge_pairs(judge, items)
    labels = preference_to_label(preferences(judgments))
    expert = np.array([[lab.preference for lab in p.labels] for p in items], dtype=np.int64)
    pc, n_pc = position_consistency(judgments)
    q = JudgeQualification(
        judge=judge.name, identity=judge.identity(), identity_hash=judge.identity_hash(), data=config.agreement_data,
        data_fingerprint=fingerprint, n_rejected=len(pairs.rejects), ids=[p.id for p in items],
        judge_labels=[int(x) for x in labels], expert_labels=expert.tolist(),
        agreement=judge_agreement(labels, expert, clusters=preference_pair_clusters(items)),
        position_consistency=pc, n_position_checked=n_pc,
        n_unparsed=n_unparsed(judgments), requests_sent=judge.requests_sent - before,
    )
    cache.put(key, q.to_dict())
    return q


def judge_agreement_report(config: JudgeConfig, *, reward_model: str | None = None) -> JudgeQualification | None:
    """``qualify_judge(make_judge(config), config)``: the CLI's ``rlhf judge agreement``."""
    from .factory import make_judge

    return qualify_judge(make_judge(config, reward_model=reward_model), config)


def format_qualification(q: JudgeQualification | None, *, floor: float = 0.85) -> str:
    """Human-readable lines: the judge, a with its CI and n, 2a-1, position consistency, unparsed, the floor."""
    if q is None:
        return "judge agreement: not measured (no agreement pair has a label)"
    ag = q.agreement
    lines = [
        f"judge: {q.judge}",
        f"identity: {q.identity_hash[:16]} {q.identity}",
        f"agreement data: {q.data} ({len(q.ids)} pairs judged; {q.n_rejected} rows rejected by the loader)",
        f"agreement a = {ag.agreement:.4f} (95% CI {ag.ci.low:.4f}-{ag.ci.high:.4f}; n = {ag.n} decisive expert "
        f"labels, {ag.n_agree} agreed; {ag.n_expert_tie} expert ties and {ag.n_expert_no_majority} without a "
        "majority excluded)",
        (f"interval: item-level (no cluster key), n_eff = n = {ag.n}" if ag.cluster_rule == "item" else
         f"interval on the effective n: n_eff = {ag.n_eff:.1f} of n = {ag.n} (design effect {ag.design_effect:.2f}; "
         f"{ag.n_clusters} clusters by {ag.cluster_rule})"),
        f"attenuation 2a-1 = {ag.attenuation:.4f}",
        f"three-class agreement (ties as a class) = {ag.three_class_accuracy:.4f} (n = {ag.n_three_class})",
        f"unparsable answers: {q.n_unparsed} of {len(q.ids)} (counted apart; on decisive items they count as "
        "disagreement)",
        ("position consistency: not asked in both orders" if q.n_position_checked == 0 else
         f"position consistency = {q.position_consistency:.4f} (n = {q.n_position_checked} pairs with both "
         "orders parsed)"),
    ]
    if math.isnan(ag.agreement):
        verdict = "no decisive expert labels: agreement unknown"
    elif ag.agreement >= floor:
        verdict = f"at or above the floor {floor:.2f}"
    else:
        verdict = f"below the floor {floor:.2f}" + (" (the whole interval is below it)" if ag.ci.high < floor
                                                     else " (the interval still reaches it)")
    lines.append(f"floor: {verdict}")
    lines.append(f"requests sent: {q.requests_sent}" + (" (read from the cache)" if q.cached else ""))
    return "\n".join(lines)

