"""The gate stage's report for people: what was compared (models, judge, PPO unlock, data), the gates
(``gates.report.render_markdown``), the plots; and the one-row-per-gate table logged to the trackers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .config import DATA_FIELDS, GateStageConfig
from .drift import drift_table
from .generation import truncation_counts
from .intent import intent_win_rates
from .measure import Measurements
from .plots import drift_plot, intent_heatmap, length_bucket_plot
from .report import render_markdown
from .result import GateResult
from .winrate import length_bucketed_win_rate


def make_plots(m: Measurements, plots_dir: Path, *, reference: str) -> dict[str, Path]:
    """Per-intent win rates, win rate by length bucket and the drift counters as PNGs; {title: path}.

    ``reference``: the drift reference's label ("previous round" or "baseline (SFT)").
    """
    plots: dict[str, Path] = {}
    rates = intent_win_rates(m.preferences, m.intents)
    if len(rates):
        plots["per-intent win rate"] = intent_heatmap(
            {"candidate": rates["win_rate"].to_dict()},
            plots_dir / "intent_heatmap.png",
            n={"candidate": rates["n"].to_dict()},
        )
    buckets = length_bucketed_win_rate(m.preferences, m.len_candidate, m.len_baseline).buckets
    if len(buckets):
        plots["win rate by length bucket"] = length_bucket_plot(buckets, plots_dir / "winrate_by_length.png")
    drift_rounds = drift_table({reference: m.drift_previous, "candidate": m.drift["candidate"]})
    plots["drift counters"] = drift_plot(drift_rounds, plots_dir / "drift.png")
    return plots


def ppo_unlock_line(decision: dict[str, Any] | None) -> str:
    """The report's "PPO unlock" line from the flow's decision (``judging.unlock.UnlockDecision.to_dict()``).

    Shows the state (unlocked or locked), both numbers (RM agreement with expert labels vs inter-annotator
    agreement) and, when overridden, the override reason next to the rule's own verdict.
    """
    if decision is None:
        return "- PPO unlock: not given (no --ppo_unlock_json; a standalone gate run)"

    def num(x: Any) -> str:
        return "not measured" if x is None else f"{float(x):.4f}"

    state = "unlocked" if decision["unlocked"] else "locked"
    numbers = (
        f"RM agreement with expert labels {num(decision['rm_agreement'])} vs inter-annotator agreement "
        f"{num(decision['inter_annotator_agreement'])}"
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
    return [
        f"- refusal classifier: {q.name}; held-out agreement with XSTest's humans {q.agreement:.3f} (refused-or-not: "
        f"unsafe {q.unsafe_agreement:.3f}, safe {q.safe_agreement:.3f}; {q.source}); floor "
        f"{args.refusal_classifier_min_agreement:.2f}"
    ]


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
        f"- judge (the round's reward model): `{models['judge']}`; its agreement is measured on the reward-model "
        "stage's held-out human-labelled pairs (PandaLM's 3 annotators in the demo)",
        ppo_unlock_line(ppo_unlock),
        f"- drift reference: {drift_label}",
        *refusal_classifier_line(m, args),
        f"- intents: {intents}",
        f"- empty win-rate answers: candidate {empty['candidate']}, baseline {empty['baseline']} of {n}",
        f"- prompts over max_prompt_tokens={args.max_prompt_tokens} (content cut in the middle, chat template kept), "
        "candidate per suite: "
        + ", ".join(f"{k} {c['candidate']}/{c['n']} (baseline {c['baseline']})" for k, c in cut.items()),
        "- data: " + ", ".join(f"{k} = `{getattr(args, k)}`" for k in DATA_FIELDS),
        "",
        "",
    ]


def render_report(results: list[GateResult], verdict: str, *, title: str, context: list[str],
                  plots: dict[str, Path]) -> str:
    """The Markdown report: the gates' report with ``context`` after its summary and a plots section at the end."""
    md = render_markdown(results, title=title, verdict=verdict)
    head, sep, rest = md.partition("\n## ")
    md = head + "\n" + "\n".join(context) + "## " + rest if sep else md + "\n".join(context)
    return md + "\n## Plots\n\n" + "".join(f"### {k}\n\n![{k}](plots/{Path(v).name})\n\n" for k, v in plots.items())


def gate_table(results: list[GateResult]) -> list[dict[str, Any]]:
    """One row per gate: name, verdict, each metric's value (4 decimals), reason."""
    return [
        {
            "gate": r.name,
            "verdict": r.verdict,
            **{k: None if mt.value is None else round(float(mt.value), 4) for k, mt in r.metrics.items()},
            "reason": r.reason,
        }
        for r in results
    ]
