"""Agreement statistics for pairwise preference labels.

Everything here is a pure function of label / score arrays, so the PPO unlock rule
(``judging.unlock``) and the judge-agreement gate can be tested against hand-worked
numbers and against the real PandaLM test set (``../shared/datasets/pandalm``).

Label convention: ``data.labels`` (expert labels: ``0`` tie, ``1`` first response better, ``2`` second
response better; ``NO_MAJORITY = -1`` for items where the annotators have no strict majority, ``UNPARSED = -1``
for judge outputs that are not a verdict). A label is *decisive* when it is 1 or 2 (it picks a side).

Which number the PPO unlock rule uses (DESIGN.md principle 2)
--------------------------------------------------------------
A Bradley-Terry reward model always picks a side (its two scores essentially never tie), and
``rm_agreement`` scores it only on items whose expert label is decisive. The human number on
"the same kind of pairs" is therefore ``InterAnnotatorAgreement.pairwise_agreement_decisive``:
how often two annotators pick the same side, counted over (item, annotator pair) comparisons in
which *both* annotators picked a side. The all-labels figure (``pairwise_agreement``) counts
tie-vs-side disagreements that a reward model is never scored on, so it is lower and would make
the bar easier to clear; the leave-one-out "annotator vs majority of the others" figure only
exists on items where the other annotators agree (with 3 annotators: both others), which selects
easy items and inflates it. Both are reported, neither gates.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import typing
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
from sklearn.metrics import cohen_kappa_score
from statsmodels.stats.inter_rater import aggregate_raters, fleiss_kappa

from judging.intervals import (
    ITEM_LEVEL,
    ConfidenceInterval,
    check_clusters,
    cluster_bootstrap,
    cluster_bootstrap_ratio,
    cluster_wilson,
    connected_clusters,
    ratio_design,
)
from data.labels import FIRST, LABELS, NO_MAJORITY, SECOND, TIE, UNPARSED
from judging.scoring import verdicts_from_scores
from rlhf.serialization import to_jsonable

MISSING = -2  # padding of ragged label lists: this annotator did not label this item

DEFAULT_CONFIDENCE = 0.95
DEFAULT_N_RESAMPLES = 2000
DEFAULT_SEED = 0


class _JsonMixin:
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable dict (numpy scalars -> Python, NaN -> None)."""
        return to_jsonable(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Any:
        """Inverse of ``to_dict``: None in a ``float`` field (NaN recorded as JSON null) becomes NaN again,
        nested dataclasses (``ConfidenceInterval``) are rebuilt.

        Raises:
            ValueError: ``data`` is not a dict, or lacks a field or has one the class does not know (names them).
        """
        if not isinstance(data, dict):
            raise ValueError(f"{cls.__name__}.from_dict needs a dict, got {type(data).__name__}")
        hints = typing.get_type_hints(cls)
        fields = dataclasses.fields(cls)  # type: ignore[arg-type]
        names = [f.name for f in fields]
        # a field with a default may be absent: records written before it existed (the cluster fields: such a
        # record's intervals were item-level, which the defaults say)
        required = [f.name for f in fields if f.default is dataclasses.MISSING
                    and f.default_factory is dataclasses.MISSING]  # type: ignore[misc]
        missing, unknown = sorted(set(required) - set(data)), sorted(set(data) - set(names))
        if missing or unknown:
            raise ValueError(f"{cls.__name__}.from_dict: missing fields {missing}, unknown fields {unknown}")
        return cls(**{name: _from_json(hints[name], data[name]) for name in names if name in data})

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), allow_nan=False, **kwargs)


def _from_json(hint: Any, value: Any) -> Any:
    nan = float("nan")
    if isinstance(hint, type) and (issubclass(hint, _JsonMixin) or hint is ConfidenceInterval):
        return hint.from_dict(value)
    if hint is float:
        return nan if value is None else float(value)
    if typing.get_origin(hint) is dict and typing.get_args(hint)[1] is float:
        return {k: nan if v is None else float(v) for k, v in value.items()}
    return value


# --------------------------------------------------------------------------------------------
# Input validation
# --------------------------------------------------------------------------------------------


def _pad_ragged(labels: Any) -> Any:
    """A list of per-item label lists of different lengths -> (n_items, max_annotators) padded with MISSING."""
    if isinstance(labels, np.ndarray) or not isinstance(labels, (list, tuple)):
        return labels
    rows = [list(r) if isinstance(r, (list, tuple, np.ndarray)) else r for r in labels]
    if not rows or not all(isinstance(r, list) for r in rows) or len({len(r) for r in rows}) == 1:
        return labels
    width = max(len(r) for r in rows)
    return [r + [MISSING] * (width - len(r)) for r in rows]


def _check_labels(labels: Any) -> np.ndarray:
    """Validated (n_items, n_annotators) int64 labels; ragged lists are padded with MISSING (>= 2 real per item)."""
    arr = np.asarray(_pad_ragged(labels))
    if arr.ndim != 2:
        raise ValueError(f"labels must have shape (n_items, n_annotators); got shape {arr.shape}")
    n_items, n_annotators = arr.shape
    if n_items < 1:
        raise ValueError("labels has no items")
    if n_annotators < 2:
        raise ValueError(f"need at least 2 annotators per item; got {n_annotators}")
    if not np.issubdtype(arr.dtype, np.integer):
        if not np.all(np.isfinite(arr.astype(float))) or np.any(arr != np.round(arr)):
            raise ValueError("labels must be integers in {0, 1, 2} (no NaN / missing labels)")
        arr = arr.astype(np.int64)
    bad = ~np.isin(arr, (*LABELS, MISSING))
    if bad.any():
        i, j = np.argwhere(bad)[0]
        raise ValueError(
            f"labels must be in {{0 tie, 1 first better, 2 second better}}; "
            f"item {i}, annotator {j} has {arr[i, j]!r}"
        )
    n_present = (arr != MISSING).sum(axis=1)
    if (n_present < 2).any():
        i = int(np.argmax(n_present < 2))
        raise ValueError(f"need at least 2 annotators per item; item {i} has {int(n_present[i])}")
    return arr.astype(np.int64)


def _check_1d(name: str, values: Any, allowed: tuple[int, ...]) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D (n_items,); got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        as_float = arr.astype(float)
        if not np.all(np.isfinite(as_float)) or np.any(as_float != np.round(as_float)):
            raise ValueError(f"{name} must hold integers in {allowed}")
    arr = arr.astype(np.int64)
    bad = ~np.isin(arr, allowed)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"{name} must hold values in {allowed}; item {i} has {arr[i]!r}")
    return arr


# --------------------------------------------------------------------------------------------
# Expert labels
# --------------------------------------------------------------------------------------------


def expert_labels(labels: Any) -> np.ndarray:
    """Expert label per item: the strict-majority label of the annotators.

    Args:
        labels: int array, shape (n_items, n_annotators), values in {0 tie, 1 first, 2 second}.

    Returns:
        int64 array, shape (n_items,), values in {0, 1, 2} or ``NO_MAJORITY`` (-1).
        A label is the expert label when more than half of the annotators gave it
        (3 annotators: at least 2). A tie (0) is a label like the others, so (0, 0, 1) -> 0.
        Items with no strict majority (3 annotators: a 3-way split 0/1/2) get -1. They are kept in
        the array, never dropped: ``rm_agreement`` / ``judge_agreement`` count them in
        ``n_expert_no_majority`` and ``inter_annotator_agreement`` in ``n_no_majority``.

    Raises:
        ValueError: wrong shape, fewer than 2 annotators, or a value outside {0, 1, 2}.
    """
    return _strict_majority(_check_labels(labels))


def _strict_majority(arr: np.ndarray) -> np.ndarray:
    """``expert_labels`` without the input checks (2-D array of values in {0, 1, 2} assumed)."""
    counts = np.stack([(arr == k).sum(axis=1) for k in LABELS], axis=1)  # (n_items, 3)
    best = counts.argmax(axis=1)
    has_majority = counts.max(axis=1) * 2 > (arr != MISSING).sum(axis=1)  # of the annotators who labelled it
    return np.where(has_majority, np.asarray(LABELS)[best], NO_MAJORITY).astype(np.int64)


# --------------------------------------------------------------------------------------------
# Cluster keys: which pairs are not independent
# --------------------------------------------------------------------------------------------

#: The rule :func:`pair_clusters` applies, recorded in every clustered record's ``cluster_rule``.
CLUSTER_RULE = "instruction or shared response (connected components)"


def _norm_text(text: Any) -> str | None:
    if text is None:
        return None
    if not isinstance(text, str):
        text = json.dumps(text, sort_keys=True, ensure_ascii=False) if isinstance(text, (list, dict)) else str(text)
    return " ".join(text.split())


def pair_clusters(prompts: Any, first: Any = None, second: Any = None) -> np.ndarray:
    """Cluster id per pair: pairs are in one cluster when linked by a shared instruction or a shared response.

    The rule (``CLUSTER_RULE``): two pairs are linked when they have the same instruction (the whole prompt, the
    conversation up to the replies) or when a response of one is a response of the other (either position);
    clusters are the connected components of that graph. Why both: PandaLM-style sets compare several models on
    one instruction (a judge that misreads the instruction errs on all of its pairs), and a model's answer enters
    every pair it takes part in (an answer the judge misreads is misread in each), so either link makes the
    verdicts dependent. Components are the smallest partition in which no two linked pairs fall in different
    clusters, which is what a cluster-robust variance needs; a coarser partition is still valid (only fewer
    clusters). On PandaLM's 939 usable pairs (164 instructions) five answers recur across instructions (the
    placeholders ``<noinput>`` and ``<nooutput>``, "Offensive", two stock sentences): they join 8 instructions into
    one cluster of 64 pairs and two more pairs of instructions, giving 155 clusters.

    Texts are compared after collapsing whitespace; a prompt given as a list of messages is compared as its
    role/content sequence. ``None`` links nothing.

    Args:
        prompts: shape (n_pairs,): the instruction of each pair (str, or a list of ``{"role", "content"}`` /
            ``data.schemas.Message``).
        first, second: shape (n_pairs,) responses, or None (cluster by instruction only).

    Returns:
        int64 array, shape (n_pairs,), cluster ids in first-appearance order (see
        ``judging.intervals.connected_clusters``).

    Raises:
        ValueError: columns of different lengths.
    """
    def prompt_key(p: Any) -> str | None:
        if isinstance(p, (list, tuple)):
            turns = [(m.role, m.content) if hasattr(m, "role") else (m.get("role"), m.get("content"))
                     if isinstance(m, dict) else (None, m) for m in p]
            return json.dumps([(r, _norm_text(c)) for r, c in turns], ensure_ascii=False)
        return _norm_text(p)

    cols = [[None if k is None else ("instruction", k) for k in map(prompt_key, prompts)]]
    for col in (first, second):
        if col is not None:
            cols.append([None if t is None else ("response", t) for t in map(_norm_text, col)])
    return connected_clusters(*cols)


def preference_pair_clusters(pairs: Any) -> np.ndarray:
    """:func:`pair_clusters` of ``data.schemas.PreferencePair`` rows (prompt, chosen = first, rejected = second)."""
    pairs = list(pairs)
    return pair_clusters([p.prompt for p in pairs], [p.chosen for p in pairs], [p.rejected for p in pairs])


# --------------------------------------------------------------------------------------------
# Inter-annotator agreement
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InterAnnotatorAgreement(_JsonMixin):
    """Agreement among annotators on the same items. All rates are fractions in [0, 1].

    Fields:
        n_items, n_annotators: shape of the label matrix.
        tie_share: fraction of all individual labels that are ties (0).
        n_no_majority: items with no strict-majority label (3 annotators: 3-way splits).
        pairwise_agreement: P(two annotators give the same label), ties included as a label;
            pooled over all n_items x C(n_annotators, 2) comparisons (with every annotator labelling
            every item this equals the mean of the per-pair rates).
        pairwise_agreement_ci: bootstrap CI (items resampled) of ``pairwise_agreement``.
        pairwise_agreement_decisive: P(same side | both annotators picked a side), pooled over the
            (item, annotator pair) comparisons in which both labels are 1 or 2. **This is the number
            the PPO unlock rule compares the reward model against** (see the module docstring).
        pairwise_agreement_decisive_ci: bootstrap CI of it.
        n_decisive_comparisons: denominator of ``pairwise_agreement_decisive``.
        per_pair_agreement / per_pair_agreement_decisive / per_pair_cohen_kappa:
            {"a1-a2": value, ...} per annotator pair (annotators numbered from 1). Cohen's kappa is
            ``sklearn.metrics.cohen_kappa_score`` on the 3-class labels.
        loo_majority_agreement: leave-one-out "annotator vs majority of the others": for each
            annotator i and item, the reference is the strict-majority label of the other
            annotators; pooled P(annotator i == reference) over (item, i) where a reference exists
            (3 annotators: only where the other two agree, so it is biased upward).
        loo_majority_agreement_decisive: the same restricted to reference and annotator both decisive.
        n_loo_comparisons / n_loo_comparisons_decisive: their denominators.
        fleiss_kappa: Fleiss' kappa, ``statsmodels.stats.inter_rater.fleiss_kappa`` on the
            ``aggregate_raters`` count table (Fleiss 1971, Psychol. Bull. 76(5):378-382).
        fleiss_kappa_ci: bootstrap CI of it.
        cluster_rule: how items were grouped into clusters (``CLUSTER_RULE``, or ``"item"``: no cluster key was
            given, every item is its own cluster and the CIs are item-level).
        n_clusters: clusters among the items.
        design_effect_decisive: design effect of ``pairwise_agreement_decisive`` (its cluster-robust variance over
            the variance had every decisive comparison been independent; ``judging.intervals.ratio_design``).
        n_eff_decisive: n_decisive_comparisons / design_effect_decisive, the independent comparisons the evidence
            is worth.

    CIs: percentile bootstrap over clusters (``scipy.stats.bootstrap``, fixed seed; whole clusters resampled,
    ``judging.intervals.cluster_bootstrap``), since the cluster is the unit that was sampled and the comparisons
    within one item, or on items sharing an instruction or a response, are not independent. With no cluster key
    every item is a cluster: the item bootstrap.
    """

    n_items: int
    n_annotators: int
    tie_share: float
    n_no_majority: int
    pairwise_agreement: float
    pairwise_agreement_ci: ConfidenceInterval
    pairwise_agreement_decisive: float
    pairwise_agreement_decisive_ci: ConfidenceInterval
    n_decisive_comparisons: int
    per_pair_agreement: dict[str, float]
    per_pair_agreement_decisive: dict[str, float]
    per_pair_cohen_kappa: dict[str, float]
    loo_majority_agreement: float
    n_loo_comparisons: int
    loo_majority_agreement_decisive: float
    n_loo_comparisons_decisive: int
    fleiss_kappa: float
    fleiss_kappa_ci: ConfidenceInterval
    cluster_rule: str = ITEM_LEVEL
    n_clusters: int | None = None
    design_effect_decisive: float = 1.0
    n_eff_decisive: float | None = None

    def __post_init__(self) -> None:
        # a record written before the cluster fields: item-level, every item its own cluster
        if self.n_clusters is None:
            object.__setattr__(self, "n_clusters", int(self.n_items))
        if self.n_eff_decisive is None:
            object.__setattr__(self, "n_eff_decisive", float(self.n_decisive_comparisons))


def _ratio(num: float, den: float) -> float:
    return float(num) / float(den) if den else float("nan")


def _fleiss(labels: np.ndarray) -> float:
    table, _ = aggregate_raters(labels, n_cat=len(LABELS))
    with np.errstate(invalid="ignore", divide="ignore"):
        return float(fleiss_kappa(table, method="fleiss"))


def inter_annotator_agreement(
    labels: Any,
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    n_resamples: int = DEFAULT_N_RESAMPLES,
    seed: int = DEFAULT_SEED,
    clusters: Any = None,
    cluster_rule: str | None = None,
) -> InterAnnotatorAgreement:
    """Agreement among annotators who labelled the same pairs.

    Args:
        labels: int array, shape (n_items, n_annotators), values in {0 tie, 1 first, 2 second}; or a list of
            per-item label lists of different lengths (2 annotators on some items, 3 on others). Then every
            pooled rate counts the comparisons that exist, per-pair figures use the items both labelled, and
            Fleiss' kappa (constant raters per item) is NaN.
        confidence: CI level (two-sided), default 0.95.
        n_resamples, seed: bootstrap settings (clusters resampled with replacement, fixed seed, so the
            CIs are reproducible).
        clusters: shape (n_items,) cluster keys (e.g. :func:`pair_clusters`); None: every item its own cluster
            (the CIs are then item-level and ``cluster_rule`` is ``"item"``).
        cluster_rule: the rule that made ``clusters`` (recorded; default ``CLUSTER_RULE`` when clusters are given).

    Returns:
        ``InterAnnotatorAgreement`` (see its docstring for every field's definition).

    Raises:
        ValueError: wrong shape, fewer than 2 annotators, or a value outside {0, 1, 2}.
    """
    arr = _check_labels(labels)
    n_items, n_annotators = arr.shape
    groups = check_clusters(clusters, n_items)
    rule = ITEM_LEVEL if clusters is None else (cluster_rule or CLUSTER_RULE)
    pairs = list(itertools.combinations(range(n_annotators), 2))
    present = arr != MISSING  # all True unless ragged lists were padded
    decisive = (arr == FIRST) | (arr == SECOND)
    n_pairs = np.zeros(n_items)

    # per item: number of agreeing pairs, of decisive pairs, of agreeing decisive pairs
    agree_all = np.zeros(n_items)
    comp_dec = np.zeros(n_items)
    agree_dec = np.zeros(n_items)
    per_pair, per_pair_dec, per_pair_kappa = {}, {}, {}
    for i, j in pairs:
        valid = present[:, i] & present[:, j]
        same = (arr[:, i] == arr[:, j]) & valid
        both = decisive[:, i] & decisive[:, j]
        agree_all += same
        n_pairs += valid
        comp_dec += both
        agree_dec += same & both
        key = f"a{i + 1}-a{j + 1}"
        per_pair[key] = _ratio(same.sum(), valid.sum())
        per_pair_dec[key] = _ratio((same & both).sum(), both.sum())
        with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
            warnings.simplefilter("ignore")  # undefined kappa (one shared label) -> NaN
            per_pair_kappa[key] = (
                float(cohen_kappa_score(arr[valid, i], arr[valid, j], labels=list(LABELS)))
                if valid.any()
                else float("nan")
            )

    # leave-one-out: annotator i vs the strict majority of the others
    loo_agree = np.zeros(n_items)
    loo_comp = np.zeros(n_items)
    loo_agree_dec = np.zeros(n_items)
    loo_comp_dec = np.zeros(n_items)
    for i in range(n_annotators):
        others = np.delete(arr, i, axis=1)
        # strict majority of the others who labelled the item (one other: its label; none: no reference)
        ref = np.where((others != MISSING).any(axis=1), _strict_majority(others), NO_MAJORITY)
        has_ref = (ref != NO_MAJORITY) & present[:, i]
        same = arr[:, i] == ref
        loo_comp += has_ref
        loo_agree += has_ref & same
        dec = has_ref & (ref != TIE) & decisive[:, i]
        loo_comp_dec += dec
        loo_agree_dec += dec & same

    kw = dict(confidence=confidence, n_resamples=n_resamples, seed=seed)
    ragged = not present.all()
    kappa = float("nan") if ragged else _fleiss(arr)  # Fleiss' kappa needs the same number of raters per item
    if n_items >= 2 and np.isfinite(kappa):
        kappa_ci = cluster_bootstrap(groups, lambda idx: _fleiss(arr[idx]), n_items, **kw)
    else:
        kappa_ci = ConfidenceInterval(
            float("nan"), float("nan"), confidence, "undefined (items have different numbers of annotators)"
            if ragged else "undefined"
        )

    design = ratio_design(agree_dec, comp_dec, groups)
    return InterAnnotatorAgreement(
        n_items=n_items,
        n_annotators=n_annotators,
        tie_share=float((arr == TIE).sum() / present.sum()),
        n_no_majority=int((_strict_majority(arr) == NO_MAJORITY).sum()),
        pairwise_agreement=_ratio(agree_all.sum(), n_pairs.sum()),
        pairwise_agreement_ci=cluster_bootstrap_ratio(agree_all, n_pairs, groups, **kw),
        pairwise_agreement_decisive=_ratio(agree_dec.sum(), comp_dec.sum()),
        pairwise_agreement_decisive_ci=cluster_bootstrap_ratio(agree_dec, comp_dec, groups, **kw),
        n_decisive_comparisons=int(comp_dec.sum()),
        per_pair_agreement=per_pair,
        per_pair_agreement_decisive=per_pair_dec,
        per_pair_cohen_kappa=per_pair_kappa,
        loo_majority_agreement=_ratio(loo_agree.sum(), loo_comp.sum()),
        n_loo_comparisons=int(loo_comp.sum()),
        loo_majority_agreement_decisive=_ratio(loo_agree_dec.sum(), loo_comp_dec.sum()),
        n_loo_comparisons_decisive=int(loo_comp_dec.sum()),
        fleiss_kappa=kappa,
        fleiss_kappa_ci=kappa_ci,
        cluster_rule=rule,
        n_clusters=int(groups.max()) + 1,
        design_effect_decisive=float(design.design_effect) if design.n else 1.0,
        n_eff_decisive=float(design.n_eff),
    )


# --------------------------------------------------------------------------------------------
# Model / judge agreement with expert labels
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Agreement(_JsonMixin):
    """Agreement of an instrument's pairwise verdicts with expert labels: the one record for a reward model
    (``rm_agreement``), an automated judge (``judge_agreement``), the PPO unlock rule and the judge-agreement gate.

    Fields:
        n_items: pairs compared.
        n: pairs with a decisive expert label (1 or 2): the denominator of ``agreement``.
        n_agree: of those, pairs where the instrument picked the experts' side.
        agreement: n_agree / n (NaN when n == 0); the judge-agreement gate's ``a``. Ties and unparsed outputs
            on these pairs stay in ``n`` and count as not agreeing (an abstention is not a correct preference,
            and a constant-score reward model must not score well).
        ci: Wilson score interval of ``agreement`` (``judging.intervals.wilson``).
        n_expert_tie: pairs the experts called a tie. Excluded (an instrument that always picks a side can
            neither win nor lose them); never counted as agreements.
        n_expert_no_majority: pairs with no expert majority (``NO_MAJORITY``). Excluded, reported.
        n_tie: decisive-expert pairs the instrument called a tie (a reward model: two exactly equal scores).
        n_unparsed: decisive-expert pairs whose output was not a verdict (0 for a reward model).
        n_unparsed_total: unparsed outputs over all pairs.
        agreement_excluding_abstentions: n_agree / (n - n_tie - n_unparsed).
        three_class_accuracy: P(instrument == expert) with ties as a class, over pairs with an expert
            majority (unparsed = wrong); the "accuracy" PandaLM's paper reports for judges.
        n_three_class: its denominator.
        tie_agreement: share of expert-tie pairs the instrument also called a tie (NaN if none).
        cluster_rule: how pairs were grouped (``CLUSTER_RULE``), or ``"item"``: no cluster key was available,
            every pair is its own cluster and ``ci`` is the item-level Wilson interval.
        n_clusters: clusters among the ``n`` decisive pairs.
        design_effect: the cluster-robust variance of ``agreement`` over the item-level one (>= 1;
            ``judging.intervals.ratio_design``).
        n_eff: n / design_effect: the independent pairs the evidence is worth. ``ci`` is Wilson's interval on
            n_eff (``judging.intervals.cluster_wilson``); the judge floor and the PPO unlock decide on it.
    """

    n_items: int
    n: int
    n_agree: int
    agreement: float
    ci: ConfidenceInterval
    n_expert_tie: int
    n_expert_no_majority: int
    n_tie: int
    n_unparsed: int
    n_unparsed_total: int
    agreement_excluding_abstentions: float
    three_class_accuracy: float
    n_three_class: int
    tie_agreement: float
    cluster_rule: str = ITEM_LEVEL
    n_clusters: int | None = None
    design_effect: float = 1.0
    n_eff: float | None = None

    def __post_init__(self) -> None:
        # a record written before the cluster fields: item-level, every pair its own cluster
        if self.n_clusters is None:
            object.__setattr__(self, "n_clusters", int(self.n))
        if self.n_eff is None:
            object.__setattr__(self, "n_eff", float(self.n))

    @property
    def attenuation(self) -> float:
        """2a - 1: the factor by which a judge with this agreement shrinks every win-rate gap (NaN if unmeasured)."""
        return 2 * self.agreement - 1


# Former names of the one record (a reward model's and a judge's agreement were separate classes).
RewardModelAgreement = Agreement
JudgeAgreement = Agreement


def _expert_1d(expert: Any) -> np.ndarray:
    arr = np.asarray(_pad_ragged(expert))
    if arr.ndim == 2:
        return expert_labels(arr)
    return _check_1d("expert", arr, (NO_MAJORITY, TIE, FIRST, SECOND))


def _agreement(pred: np.ndarray, ex: np.ndarray, confidence: float, clusters: Any = None,
               cluster_rule: str | None = None) -> Agreement:
    """The record from validated 1-D verdicts (-1 unparsed, 0, 1, 2) and expert labels (-1 no majority, 0, 1, 2);
    ``clusters`` (shape (n_items,) keys, None: item-level) make the interval cluster-aware."""
    groups = check_clusters(clusters, ex.size)
    dec = (ex == FIRST) | (ex == SECOND)
    n, n_agree = int(dec.sum()), int((dec & (pred == ex)).sum())
    ci, design = cluster_wilson((pred[dec] == ex[dec]).astype(float), None, groups[dec], confidence)
    n_tie, n_unparsed = int((dec & (pred == TIE)).sum()), int((dec & (pred == UNPARSED)).sum())
    has_majority = ex != NO_MAJORITY
    n3 = int(has_majority.sum())
    ties = ex == TIE
    return Agreement(
        n_items=int(ex.size),
        n=n,
        n_agree=n_agree,
        agreement=_ratio(n_agree, n),
        ci=ci,
        n_expert_tie=int(ties.sum()),
        n_expert_no_majority=int((ex == NO_MAJORITY).sum()),
        n_tie=n_tie,
        n_unparsed=n_unparsed,
        n_unparsed_total=int((pred == UNPARSED).sum()),
        agreement_excluding_abstentions=_ratio(n_agree, n - n_tie - n_unparsed),
        three_class_accuracy=_ratio((has_majority & (pred == ex)).sum(), n3),
        n_three_class=n3,
        tie_agreement=_ratio((ties & (pred == TIE)).sum(), ties.sum()),
        cluster_rule=ITEM_LEVEL if clusters is None else (cluster_rule or CLUSTER_RULE),
        n_clusters=int(design.n_clusters),
        design_effect=float(design.design_effect) if n else 1.0,
        n_eff=float(design.n_eff),
    )


def rm_agreement(
    score_first: Any,
    score_second: Any,
    expert: Any,
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    clusters: Any = None,
    cluster_rule: str | None = None,
) -> Agreement:
    """Agreement of a reward model with expert labels.

    The RM prefers the first response when ``score_first > score_second``, the second when
    ``score_second > score_first``; equal scores are an RM tie (``n_tie``).

    Args:
        score_first, score_second: float arrays, shape (n_items,): RM scores (any units: only the
            sign of the difference is used) of response 1 and response 2 of each pair.
        expert: shape (n_items,) expert labels from ``expert_labels`` (values -1, 0, 1, 2), or the
            raw (n_items, n_annotators) label matrix, from which the majority is taken.
        confidence: level of the Wilson interval.
        clusters: shape (n_items,) cluster keys (:func:`pair_clusters` of the held-out pairs); None: every pair is
            its own cluster (item-level interval, ``cluster_rule`` ``"item"``). cluster_rule: recorded with them.

    Returns:
        :class:`Agreement`; see its docstring for how ties are counted.

    Raises:
        ValueError: shapes differ, non-finite scores, or expert values outside {-1, 0, 1, 2}.
    """
    sf = np.asarray(score_first, dtype=float)
    ss = np.asarray(score_second, dtype=float)
    ex = _expert_1d(expert)
    if sf.ndim != 1 or sf.shape != ss.shape or sf.shape != ex.shape:
        raise ValueError(
            f"score_first {sf.shape}, score_second {ss.shape} and expert {ex.shape} "
            "must all have shape (n_items,)"
        )
    if not (np.all(np.isfinite(sf)) and np.all(np.isfinite(ss))):
        raise ValueError("reward-model scores must be finite (found NaN or inf)")
    return _agreement(verdicts_from_scores(sf, ss), ex, confidence, clusters, cluster_rule)


def judge_agreement(
    judge_labels: Any,
    expert: Any,
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    clusters: Any = None,
    cluster_rule: str | None = None,
) -> Agreement:
    """Agreement of a judge's verdicts with the expert labels.

    Args:
        judge_labels: int array, shape (n_items,), values in {0 tie, 1, 2, UNPARSED=-1}
            (``parse_judge_verdict`` maps PandaLM's gpt_result strings to these).
        expert: shape (n_items,) expert labels (-1, 0, 1, 2) or the raw
            (n_items, n_annotators) label matrix, reduced with ``expert_labels``.
        confidence: level of the Wilson interval.
        clusters, cluster_rule: as :func:`rm_agreement`.

    Returns:
        :class:`Agreement`.

    Raises:
        ValueError: shapes differ or values out of range.
    """
    judge = _check_1d("judge_labels", judge_labels, (UNPARSED, TIE, FIRST, SECOND))
    ex = _expert_1d(expert)
    if judge.shape != ex.shape:
        raise ValueError(f"judge_labels {judge.shape} and expert {ex.shape} differ in length")
    return _agreement(judge, ex, confidence, clusters, cluster_rule)
