"""The gate stage's report for people: what was compared (models, judge, PPO unlock, data), the gates
(``gates.report.render_markdown``), the plots; and the one-row-per-gate table logged to the trackers."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .config import DATA_FIELDS, GateStageConfig
from .drift import drift_table
from .generation import truncation_counts
from .intent import intent_win_rates
from .judge import GATE_NAME as JUDGE_GATE
from .judge import JUDGED_GATES
from .winrate_corrected import HARD_MIN_AGREEMENT
from .measure import Measurements
from .consistency import gate_table as consistency_table
from .plots import drift_plot, intent_heatmap, length_bucket_plot, recall_by_depth_plot
from .report import render_markdown
from .result import GateResult
from .winrate import length_bucketed_win_rate


def make_plots(m: Measurements, plots_dir: Path, *, reference: str) -> dict[str, Path]:
    """Per-intent win rates, win rate by length bucket, the drift counters and (when the consistency suite ran)
    constraint recall by depth and position as PNGs; {title: path}.

    ``reference``: the drift reference's label ("previous round" or "baseline (SFT)").
    """
    plots: dict[str, Path] = {}
    m = parsed_only(m)  # win-rate plots only where the judge's answer parsed (none parsed: no win-rate plots)
    rates = intent_win_rates(m.preferences, m.intents) if len(m.preferences) else []
    if len(rates):
        plots["per-intent win rate"] = intent_heatmap(
            {"candidate": rates["win_rate"].to_dict()},
            plots_dir / "intent_heatmap.png",
            n={"candidate": rates["n"].to_dict()},
        )
    buckets = length_bucketed_win_rate(m.preferences, m.len_candidate, m.len_baseline).buckets if len(
        m.preferences) else []
    if len(buckets):
        plots["win rate by length bucket"] = length_bucket_plot(buckets, plots_dir / "winrate_by_length.png")
    drift_rounds = drift_table({reference: m.drift_previous, "candidate": m.drift["candidate"]})
    plots["drift counters"] = drift_plot(drift_rounds, plots_dir / "drift.png")
    if m.consistency is not None and m.consistency.suite.items:
        plots["constraint recall by depth"] = recall_by_depth_plot(consistency_table(m.consistency),
                                                                   plots_dir / "recall_by_depth.png")
    return plots


def ppo_unlock_line(decision: dict[str, Any] | None) -> str:
    """The report's "PPO unlock" line from the flow's decision (``judging.unlock.UnlockDecision.to_dict()``).

    Shows the state (unlocked or locked), both numbers (RM agreement with expert labels vs inter-annotator
    agreement) with their n and effective n (clustered pairs are worth fewer independent ones; "item-level" when
    measured without a cluster key; decisions recorded before the effective n existed show neither) and, when
    overridden, the override reason next to the rule's own verdict.
    """
    if decision is None:
        return "- PPO unlock: not given (no --ppo_unlock_json; a standalone gate run)"

    def num(x: Any) -> str:
        return "not measured" if x is None else f"{float(x):.4f}"

    def n_said(side: str) -> str:
        n, n_eff = decision.get(f"{side}_n"), decision.get(f"{side}_n_eff")
        if n is None or n_eff is None:
            return ""
        item = decision.get(f"{side}_cluster_rule", "item") == "item"
        return (f" (n {n}, n_eff {float(n_eff):.1f} in {decision.get(f'{side}_n_clusters')} clusters"
                + (", one per item: no cluster key)" if item else ")"))

    state = "unlocked" if decision["unlocked"] else "locked"
    numbers = (
        f"RM agreement with expert labels {num(decision['rm_agreement'])}{n_said('rm')} vs inter-annotator "
        f"agreement {num(decision['inter_annotator_agreement'])}{n_said('iaa')}"
    )
    if decision["overridden"]:
        rule = "unlocked" if decision["rule_verdict"] else "locked"
        return f"- PPO unlock: {state} by override ({decision['override_reason']}); the rule says {rule}: {numbers}"
    return f"- PPO unlock: {state} ({numbers})"


def refusal_classifier_line(m: Measurements, args: GateStageConfig) -> list[str]:
    """The refusal classifier and its held-out agreement with humans, for "What was compared" (none if unknown)."""
    q = m.refusal_quality
    if q is None:
        return []
    def f(x: float) -> str:
        return f"{x:.3f}" if math.isfinite(x) else "unknown"

    lines = [
        f"- refusal classifier: {q.name}; held-out agreement with XSTest's humans {f(q.agreement)} (refused-or-not: "
        f"unsafe {f(q.unsafe_agreement)}, safe {f(q.safe_agreement)}; {q.source}); floor "
        f"{args.refusal_classifier_min_agreement:.2f}"
    ]
    info = m.refusal_info
    if info:
        un = info["unparsed"]
        lines.append(
            f"- refusal grader's unparsable grades (left out of the rates): baseline red-team "
            f"{un['baseline']['violation']}, benign {un['baseline']['false_refusal']}; candidate red-team "
            f"{un['candidate']['violation']}, benign {un['candidate']['false_refusal']}; requests sent "
            f"{info['requests_sent_grading']} grading + {info['requests_sent_agreement']} agreement"
            + (" (agreement read from the cache)" if info["agreement_cached"] else "")
        )
    return lines


def judge_decision_line(args: GateStageConfig) -> str:
    """The report's line saying how the judged win rates were decided (``judge_decision``)."""
    if args.judge_decision == "corrected":
        return ("- judge decision: corrected (no judge floor: the win-rate gates decide on the win rate corrected for "
                "the judge's measured agreement, 50 + (w - 50) / (2a - 1), with an interval carrying both errors; "
                f"nothing judged decides at a <= {HARD_MIN_AGREEMENT:g})")
    return (f"- judge decision: floor (the win-rate gates decide only when the judge's agreement clears "
            f"{args.judge_floor:.2f} on its interval; nothing judged decides at a <= {HARD_MIN_AGREEMENT:g})")


def generation_line(answers: dict[str, dict]) -> list[str]:
    """How both models generated: greedy, the weights' dtype and the long prompts' prefill dtype."""
    from rlhf.prefix_cache import BF16_PREFILL_MIN_TOKENS

    p = answers["candidate"].get("_precision")
    if not p:
        return []
    if p["weights"] == "vllm":
        return ["- generation: greedy, vLLM engine (its own precision)"]
    line = f"- generation: greedy, both models in {p['weights']} weights"
    if p["prefill"] != p["weights"]:
        line += (f"; each prompt with at least {BF16_PREFILL_MIN_TOKENS} tokens before its last was prefilled alone "
                 f"by a {p['prefill']} copy, then decoded in {p['weights']} (a rule on the prompt's own length: answers "
                 "do not depend on the batch)")
    return [line]


def compared_context(
    args: GateStageConfig,
    models: dict[str, Any],
    m: Measurements,
    answers: dict[str, dict],
    *,
    drift_label: str,
    intent_classifier: dict | None,
    ppo_unlock: dict | None,
) -> list[str]:
    """The "What was compared" section: models, judge, PPO unlock, drift reference, intents, empty answers, data."""
    n = len(m.preferences)
    empty = {who: sum(not t.strip() for t in answers[who]["winrate"]["text"]) for who in ("baseline", "candidate")}
    cut = truncation_counts(answers)
    if intent_classifier is None:
        intents = "from the data"
    else:
        intents = (
            f"predicted for {intent_classifier['n_classified']} prompts by the embedding classifier (held-out "
            f"accuracy {intent_classifier['held_out_accuracy']:.3f}, n={intent_classifier['n_test']}); per-intent "
            "numbers inherit its errors"
        )
    return [
        "## What was compared",
        "",
        f"- candidate: `{models['candidate']}`",
        f"- baseline: `{models['baseline']}`",
        *judge_lines(models, m),
        judge_decision_line(args),
        ppo_unlock_line(ppo_unlock),
        f"- drift reference: {drift_label}",
        *refusal_classifier_line(m, args),
        f"- intents: {intents}",
        f"- empty win-rate answers: candidate {empty['candidate']}, baseline {empty['baseline']} of {n}",
        f"- prompts over max_prompt_length={args.max_prompt_length} (content cut in the middle, chat template kept), "
        "candidate per suite: "
        + ", ".join(f"{k} {c['candidate']}/{c['n']} (baseline {c['baseline']})" for k, c in cut.items()),
        *consistency_line(m),
        *generation_line(answers),
        "- data: " + ", ".join(f"{k} = `{getattr(args, k)}`" for k in DATA_FIELDS),
        "",
        "",
    ]


def consistency_line(m: Measurements) -> list[str]:
    """The consistency suite in one line: depths measured, positions, probes, the context budget and each skipped
    depth with its reason; nothing when the suite did not run."""
    if m.consistency is None:
        return []
    s = m.consistency.suite
    skipped = "; ".join(f"depth {d} skipped: {why}" for d, why in s.skipped.items()) or "no depth skipped"
    return [f"- consistency suite: {len(s.items)} probe conversations at depths {list(s.depths)} x positions "
            f"{list(s.positions)} (context budget {s.context_length} tokens); {skipped}"]


def render_report(results: list[GateResult], verdict: str, *, title: str, context: list[str],
                  plots: dict[str, Path]) -> str:
    """The Markdown report: the gates' report with ``context`` after its summary and a plots section at the end."""
    md = render_markdown(results, title=title, verdict=verdict)
    head, sep, rest = md.partition("\n## ")
    md = head + "\n" + "\n".join(context) + "## " + rest if sep else md + "\n".join(context)
    return md + "\n## Plots\n\n" + "".join(f"### {k}\n\n![{k}](plots/{Path(v).name})\n\n" for k, v in plots.items())


def gate_table(results: list[GateResult], judge: dict | None = None) -> list[dict[str, Any]]:
    """One row per gate: name, verdict, each metric's value (4 decimals), reason; with ``judge`` (``judge_row``), the
    rows of the gates that rest on the judge (``gates.judge.JUDGED_GATES``) also name the judge and carry its
    agreement, attenuation 2a-1, position consistency and the corrected effect."""
    rows = []
    for r in results:
        row = {
            "gate": r.name,
            "verdict": r.verdict,
            **{k: None if mt.value is None else round(float(mt.value), 4) for k, mt in r.metrics.items()},
            "reason": r.reason,
        }
        if judge is not None and r.name in JUDGED_GATES:
            row = {"gate": r.name, "verdict": r.verdict, **{f"judge_{k}" if k != "judge" else k: v
                                                            for k, v in judge.items()}, **row}
        rows.append(row)
    return rows


#: The metrics that say at a glance what each gate decided on (the all-gates summary row); a gate not named here
#: shows its first metric.
HEADLINE_METRICS: dict[str, tuple[str, ...]] = {
    "judge_agreement": ("agreement",),
    "length_controlled_win_rate": ("length_matched_win_rate", "length_balanced_win_rate"),
    "intent_matrix": ("traffic_weighted_win_rate",),
    "refusal_two_sided": ("violation_rate_change", "false_refusal_rate_change"),
    "capability": ("accuracy_change",),
    "sycophancy": ("flip_rate",),
    "personality_drift": ("median_length_tokens_change",),
    "citation_honesty": ("c01_not_retrieved_rate", "c03_turn_rate"),
    "consistency_recall": ("recall_change_worst_depth", "recall_candidate"),
}


def _rounded(x: Any) -> float | None:
    return None if x is None or not math.isfinite(float(x)) else round(float(x), 4)


def gate_summary(results: list[GateResult], judge: dict | None = None) -> list[dict[str, Any]]:
    """The all-gates table people read (the Prefect artifact): one row per gate, the columns that say what the row is
    first, then the numbers: gate, verdict, reason, headline (each headline metric as ``name value [ci_low, ci_high]
    (n)``), then the first headline metric's metric / value / ci_low / ci_high / n / unit, and ``judge`` (the judge's
    name) on the gates that rest on it. Every metric of every gate is in the per-gate tables and in :func:`gate_table`.
    """
    rows = []
    for r in results:
        names = [k for k in HEADLINE_METRICS.get(r.name, ()) if k in r.metrics] or list(r.metrics)[:1]

        def shown(k: str) -> str:
            mt = r.metrics[k]
            value = "n/a" if _rounded(mt.value) is None else f"{_rounded(mt.value):g}"
            ci = "" if _rounded(mt.ci_low) is None else f" [{_rounded(mt.ci_low):g}, {_rounded(mt.ci_high):g}]"
            return f"{k} {value}{ci}" + ("" if mt.n is None else f" (n={mt.n})")

        first = r.metrics[names[0]] if names else None
        rows.append({
            "gate": r.name, "verdict": r.verdict, "reason": r.reason,
            "headline": "; ".join(shown(k) for k in names),
            "metric": names[0] if names else None,
            "value": None if first is None else _rounded(first.value),
            "ci_low": None if first is None else _rounded(first.ci_low),
            "ci_high": None if first is None else _rounded(first.ci_high),
            "n": None if first is None else first.n,
            "unit": None if first is None else first.unit,
            "judge": (judge or {}).get("judge") if r.name in JUDGED_GATES else None,
        })
    return rows


def parsed_only(m: Measurements) -> Measurements:
    """``m`` without the win-rate pairs whose judge answer was unparsable (NaN preference)."""
    import dataclasses

    import numpy as np

    keep = np.isfinite(m.preferences)
    if keep.all():
        return m
    return dataclasses.replace(m, preferences=m.preferences[keep], len_candidate=np.asarray(m.len_candidate)[keep],
                               len_baseline=np.asarray(m.len_baseline)[keep],
                               intents=[x for x, ok in zip(m.intents, keep) if ok])


def judge_row(m: Measurements, results: list[GateResult]) -> dict[str, Any]:
    """The judge in one row (report, Prefect and W&B tables): name, backend, agreement a with its CI and n,
    attenuation 2a-1, position consistency (openai backend; on the win-rate pairs and on the agreement pairs),
    unparsable answers, the measured and corrected win-rate gap (``gates.judge.corrected_effect_size``)."""
    info = m.judge_info or {"name": m.judge_source, "backend": "reward_model"}
    gate = next((r for r in results if r.name == JUDGE_GATE), None)
    metric = (lambda k: None if gate is None or k not in gate.metrics else gate.metrics[k].value)
    ag = m.judge
    q = info.get("qualification") or {}
    return {
        "judge": info.get("judge", info["name"]),
        "backend": info["backend"],
        "identity_hash": info.get("identity_hash"),
        "agreement": None if ag is None else ag.agreement,
        "agreement_ci_low": None if ag is None else ag.ci.low,
        "agreement_ci_high": None if ag is None else ag.ci.high,
        "agreement_n": None if ag is None else ag.n,
        "attenuation": None if ag is None else ag.attenuation,
        "agreement_source": info.get("agreement_source", m.judge_source),
        "position_consistency": info.get("position_consistency") if info.get("n_position_checked") else None,
        "n_position_checked": info.get("n_position_checked", 0),
        "position_consistency_agreement_data": q.get("position_consistency") if q.get("n_position_checked") else None,
        "n_unparsed": info.get("n_unparsed", 0),
        "n_judged": info.get("n_judged", len(m.preferences)),
        "measured_gap": metric("measured_gap"),
        "corrected_gap": metric("corrected_gap"),
        "requests_sent": info.get("requests_sent", 0),
        # who answered (judging.identity; no secrets): endpoint, listing, decoding, template, probe fingerprint
        "identity": info.get("identity"),
        "identity_status": (info.get("identity_check") or {}).get("status"),
        "identity_changed": (info.get("identity_check") or {}).get("changed"),
        "probe_requests_sent": info.get("probe_requests_sent", 0),
    }


def judge_lines(models: dict[str, Any], m: Measurements) -> list[str]:
    """The report's judge lines: which judge, where its agreement was measured, and (pluggable judges) its
    agreement, attenuation, position consistency and unparsable answers."""
    info = m.judge_info
    if info is None or info["backend"] == "reward_model":
        head = [f"- judge (the round's reward model): `{models['judge']}`; its agreement is measured on the "
                "reward-model stage's held-out human-labelled pairs (PandaLM's 3 annotators in the demo)"]
    else:
        head = [f"- judge: `{info['name']}` (backend {info['backend']}, identity {info['identity_hash'][:16]}); its "
                f"agreement is measured on {info['agreement_source']}, cached per judge identity"]
    if info is None:
        return head
    ag = m.judge
    a = "not measured" if ag is None else (
        f"a = {ag.agreement:.3f} (CI {ag.ci.low:.3f}-{ag.ci.high:.3f}, n={ag.n}), attenuation 2a-1 = "
        f"{ag.attenuation:.3f}")
    pc = ("not asked in both orders" if not info["n_position_checked"] else
          f"{info['position_consistency']:.3f} (n={info['n_position_checked']})")
    q = info.get("qualification") or {}
    if q.get("n_position_checked"):
        pc += f", on the agreement pairs {q['position_consistency']:.3f} (n={q['n_position_checked']})"
    lines = head + [f"  - agreement with expert labels: {a}; position consistency on the win-rate pairs: {pc}; "
                    f"unparsable judge answers: {info['n_unparsed']} of {info['n_judged']} (left out of the win "
                    f"rates); requests sent: {info['requests_sent']}"]
    check = info.get("identity_check")
    if check:
        ident = info.get("identity") or {}
        status = {"new": "first seen under this endpoint and name",
                  "unchanged": "the same judge as last time under this endpoint and name",
                  "changed": "NOT the judge seen last time under this endpoint and name (" + ", ".join(
                      check.get("changed") or []) + " differ): re-qualified, no cached answer reused"}[check["status"]]
        lines.append(f"  - who answered: `{ident.get('model')}` at {ident.get('endpoint')} (listing "
                     f"{ident.get('served')}; probe answers {str((ident.get('probe') or {}).get('answers_sha256'))[:16]}, "
                     f"{info.get('probe_requests_sent', 0)} probe requests); {status}")
    return lines
