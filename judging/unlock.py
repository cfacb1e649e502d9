"""The PPO unlock rule (DESIGN.md principle 2, "DPO first").

Pure functions: the flow calls ``decide_from_metrics`` on the reward-model stage's recorded measurements
(manifest ``metrics["rm_agreement"]`` and ``metrics["inter_annotator_agreement"]``), so the override is a flow
parameter and never part of the reward-model stage's inputs.

PPO stays locked until the reward model agrees with expert labels on held-out pairs more often
than annotators agree with each other on the same kind of pairs. The flow records both numbers
and the decision every round. A research override exists; it is explicit, needs a reason, and is
recorded next to (never instead of) the rule's own verdict.

The two numbers compared (see ``judging.agreement``):

* RM side: ``rm_agreement(...).agreement`` -- share of held-out pairs with a decisive expert
  label (majority of the annotators picked a side) on which the RM scores the expert's side higher.
* Human side: ``InterAnnotatorAgreement.pairwise_agreement_decisive`` -- share of
  (item, annotator pair) comparisons, among those where both annotators picked a side, in which
  they picked the same side. Ties are out of both numbers, so both answer "given that a side is
  picked, how often is it the same side?".

Both intervals are clustered: held-out pairs that share an instruction or a response are not independent
(``judging.agreement.pair_clusters``), so the RM's Wilson interval is taken on its effective n and the annotators'
bootstrap resamples clusters; the decision records each side's n_eff and cluster count. A record measured without
a cluster key says ``"item"`` as its cluster rule (item-level interval).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from judging.agreement import (
    Agreement,
    ConfidenceInterval,
    InterAnnotatorAgreement,
    _JsonMixin,
)

RULE_TEXT = (
    "unlocked iff RM agreement with expert labels on held-out pairs > inter-annotator agreement "
    "on the same kind of pairs (RewardModelAgreement.agreement on decisive expert labels > "
    "InterAnnotatorAgreement.pairwise_agreement_decisive; ties excluded from both)"
)
IAA_STATISTIC = "pairwise_agreement_decisive"

# values of UnlockDecision.comparison
CLEARLY_ABOVE = "rm_clearly_above"  # RM CI entirely above the IAA CI
CLEARLY_BELOW = "rm_clearly_below"  # RM CI entirely below the IAA CI
WITHIN_NOISE = "within_noise"  # the CIs overlap: the verdict rests on point estimates
NOT_MEASURED = "not_measured"  # one of the numbers is undefined (no decisive pairs)


@dataclass(frozen=True)
class UnlockDecision(_JsonMixin):
    """The PPO unlock decision for one round, as recorded by the flow.

    Fields:
        unlocked: whether PPO runs this round: ``rule_verdict``, or True when ``overridden``.
        rule_verdict: the rule's own verdict (``rm_agreement > inter_annotator_agreement``);
            an override never changes it.
        rm_agreement, rm_ci, rm_n: RM agreement with expert labels (fraction in [0, 1]), its
            Wilson CI, and its number of decisive held-out pairs.
        inter_annotator_agreement, iaa_ci, iaa_n: ``pairwise_agreement_decisive``, its bootstrap
            CI, and its number of decisive (item, annotator pair) comparisons.
        rm_n_eff, rm_n_clusters: the independent pairs the RM's decisive pairs are worth (``Agreement.n_eff``) and
            their clusters; rm_cluster_rule: how they were clustered (``"item"``: item-level interval).
        iaa_n_eff, iaa_n_clusters: the same for the annotators' decisive comparisons
            (``InterAnnotatorAgreement.n_eff_decisive``, ``n_clusters``); iaa_cluster_rule likewise.
        iaa_statistic: name of the InterAnnotatorAgreement field used.
        margin: rm_agreement - inter_annotator_agreement (None when either is undefined).
        comparison: CLEARLY_ABOVE / CLEARLY_BELOW / WITHIN_NOISE / NOT_MEASURED.
        statistically_clear: True iff the two CIs do not overlap (a conservative check, not a
            formal test); when False the verdict rests on point estimates.
        rule: the rule, in words.
        overridden, override_reason: the research override and why it was used.
    """

    unlocked: bool
    rule_verdict: bool
    rm_agreement: float
    rm_ci: ConfidenceInterval
    rm_n: int
    inter_annotator_agreement: float
    iaa_ci: ConfidenceInterval
    iaa_n: int
    iaa_statistic: str
    margin: float | None
    comparison: str
    statistically_clear: bool
    rule: str
    overridden: bool
    override_reason: str | None
    rm_n_eff: float | None = None
    rm_n_clusters: int | None = None
    rm_cluster_rule: str = "item"
    iaa_n_eff: float | None = None
    iaa_n_clusters: int | None = None
    iaa_cluster_rule: str = "item"

    def summary(self) -> str:
        """One line for logs and the Prefect UI (each side's n and effective n)."""
        state = "UNLOCKED" if self.unlocked else "LOCKED"
        extra = f" (OVERRIDE: {self.override_reason}; rule says {self.rule_verdict})" if self.overridden else ""

        def n_said(n: int, n_eff: float | None, clusters: int | None) -> str:
            if n_eff is None:
                return f"n {n}"
            return f"n {n}, n_eff {n_eff:.1f}" + ("" if clusters is None else f" in {clusters} clusters")

        return (
            f"PPO {state}{extra}: RM {self.rm_agreement:.4f} ({n_said(self.rm_n, self.rm_n_eff, self.rm_n_clusters)})"
            f" vs IAA {self.inter_annotator_agreement:.4f} "
            f"({n_said(self.iaa_n, self.iaa_n_eff, self.iaa_n_clusters)}), "
            f"margin {self.margin if self.margin is None else f'{self.margin:+.4f}'}, {self.comparison}"
        )


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def ppo_unlock_decision(
    rm: Agreement,
    iaa: InterAnnotatorAgreement,
    override: bool = False,
    override_reason: str | None = None,
) -> UnlockDecision:
    """Apply the PPO unlock rule.

    Args:
        rm: the reward model's agreement with expert labels on held-out pairs (``rm_agreement``).
        iaa: inter-annotator agreement on the same kind of pairs (``inter_annotator_agreement``).
        override: force ``unlocked=True`` for research. Recorded; changes no number and not
            ``rule_verdict``.
        override_reason: required (non-blank) when ``override`` is True.

    Returns:
        ``UnlockDecision``. When either agreement is undefined (no decisive pairs), the rule's
        verdict is False (locked) and ``comparison`` is NOT_MEASURED.

    Raises:
        ValueError: ``override`` without a non-blank reason, or a reason without ``override``.
    """
    reason = override_reason.strip() if isinstance(override_reason, str) else override_reason
    if override and not reason:
        raise ValueError("a PPO unlock override needs an override_reason (who/why), none given")
    if not override and reason:
        raise ValueError("override_reason given but override=False; pass override=True to override")

    rm_value = float(rm.agreement)
    iaa_value = float(getattr(iaa, IAA_STATISTIC))
    iaa_ci: ConfidenceInterval = iaa.pairwise_agreement_decisive_ci
    measured = _finite(rm_value) and _finite(iaa_value)

    if measured:
        rule_verdict = rm_value > iaa_value
        margin: float | None = rm_value - iaa_value
        if _finite(rm.ci.low) and _finite(iaa_ci.high) and rm.ci.low > iaa_ci.high:
            comparison = CLEARLY_ABOVE
        elif _finite(rm.ci.high) and _finite(iaa_ci.low) and rm.ci.high < iaa_ci.low:
            comparison = CLEARLY_BELOW
        else:
            comparison = WITHIN_NOISE
    else:
        rule_verdict, margin, comparison = False, None, NOT_MEASURED

    return UnlockDecision(
        unlocked=bool(rule_verdict or override),
        rule_verdict=bool(rule_verdict),
        rm_agreement=rm_value,
        rm_ci=rm.ci,
        rm_n=int(rm.n),
        inter_annotator_agreement=iaa_value,
        iaa_ci=iaa_ci,
        iaa_n=int(iaa.n_decisive_comparisons),
        iaa_statistic=IAA_STATISTIC,
        margin=margin,
        comparison=comparison,
        statistically_clear=comparison in (CLEARLY_ABOVE, CLEARLY_BELOW),
        rule=RULE_TEXT,
        overridden=bool(override),
        override_reason=reason if override else None,
        rm_n_eff=float(rm.n_eff),
        rm_n_clusters=int(rm.n_clusters),
        rm_cluster_rule=rm.cluster_rule,
        iaa_n_eff=float(iaa.n_eff_decisive),
        iaa_n_clusters=int(iaa.n_clusters),
        iaa_cluster_rule=iaa.cluster_rule,
    )


def decide_from_metrics(
    rm_metrics: dict[str, Any],
    override: bool = False,
    override_reason: str | None = None,
) -> UnlockDecision:
    """``ppo_unlock_decision`` on the measurements a reward-model stage recorded.

    Args:
        rm_metrics: the reward-model manifest's ``metrics``; its ``"rm_agreement"`` and
            ``"inter_annotator_agreement"`` entries are ``Agreement.to_dict()`` and
            ``InterAnnotatorAgreement.to_dict()`` (NaN recorded as None).
        override, override_reason: as ``ppo_unlock_decision``.

    Returns:
        ``UnlockDecision``, equal to ``ppo_unlock_decision`` on the original dataclasses.

    Raises:
        ValueError: a measurement is missing or malformed (names the key), or the override rules of
            ``ppo_unlock_decision``.
    """
    missing = [k for k in ("rm_agreement", "inter_annotator_agreement") if not isinstance(rm_metrics.get(k), dict)]
    if missing:
        raise ValueError(
            f"reward-model metrics lack {missing} (have {sorted(rm_metrics)}); the PPO unlock needs both measurements"
        )
    rm = Agreement.from_dict(rm_metrics["rm_agreement"])
    iaa = InterAnnotatorAgreement.from_dict(rm_metrics["inter_annotator_agreement"])
    return ppo_unlock_decision(rm, iaa, override=override, override_reason=override_reason)


def require_unlocked(
    decision_file: str | None, rm_metrics: dict[str, Any], *, stage: str, rm_manifest: str
) -> dict[str, Any]:
    """The unlock decision an online-RL stage (GRPO, RLOO) runs under, as a dict; refuses a locked one.

    The decision is the flow's file (``decision_file``, ``ppo_unlock.json``: it carries a recorded override) if
    given, else the rule applied to the reward-model stage's recorded measurements (no override: that is the
    flow's to give), as the PPO stage reads it.

    Raises:
        FileNotFoundError: ``decision_file`` is given and missing.
        ValueError: the file is not a decision (no boolean ``unlocked``), or ``rm_metrics`` lack the measurements.
        RuntimeError: the decision says locked, naming the file (or ``rm_manifest``), both agreements and the way
            to override.
    """
    import json
    from pathlib import Path

    if decision_file:
        path = Path(decision_file)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no PPO unlock decision file")
        unlock = json.loads(path.read_text())
        if not isinstance(unlock, dict) or not isinstance(unlock.get("unlocked"), bool):
            raise ValueError(f"{path}: not a PPO unlock decision (needs a boolean 'unlocked')")
    else:
        unlock = decide_from_metrics(rm_metrics).to_dict()
    if not unlock["unlocked"]:
        raise RuntimeError(
            f"{decision_file or rm_manifest}: online RL ({stage}) is locked (RM agreement "
            f"{unlock.get('rm_agreement')} is not above inter-annotator agreement "
            f"{unlock.get('inter_annotator_agreement')}); run the round with an explicit, recorded override "
            "(rlhf round --ppo-override REASON) to run it anyway")
    return unlock
