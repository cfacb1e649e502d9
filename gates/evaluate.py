"""Gate stage: baseline (SFT) and candidate (DPO or PPO) answer the gate suites, the round's reward model judges,
and every release gate decides on its own numbers (DESIGN.md "Release gates"; never averaged).

Launch alone. The CI command is ``rlhf gates``; what each form returns on a blocked release (tests/test_gates_exit.py):

    rlhf gates --candidate runs/<r>/dpo --baseline runs/<r>/sft --reward-model runs/<r>/reward_model \
        --config recipes/demo/gates.yaml            # CI: 0 pass, 3 blocked (report written), other non-zero: error
    python -m gates.evaluate --config recipes/demo/gates.yaml \
        --baseline_dir runs/<r>/sft --candidate_dir runs/<r>/dpo --reward_model_dir runs/<r>/reward_model
                                                    # the same codes: 0 pass, 3 blocked
    accelerate launch -m gates.evaluate --config ... (same arguments)
                                                    # 0 pass, but 1 for a block AND for a crash
    torchrun --nproc_per_node 2 -m gates.evaluate --config ... (same arguments)
                                                    # data parallel: each process generates and scores a share,
                                                    # rank 0 judges and writes; torchrun also turns 3 into 1

accelerate 1.x cannot pass the 3 on: its launcher (``accelerate/commands/launch.py``, ``simple_launcher``; the
multi-process launchers likewise) turns any non-zero exit of the child into 1, by raising
``CalledProcessError(... returned non-zero exit status 3)`` (a traceback) or, with ``--quiet``, ``sys.exit(1)``
(accelerate #4277). Under ``accelerate launch``, read the verdict from ``manifest.json`` (``outputs.verdict``), as
the round flow does with ``--fail_on_block false``; do not use that form as a CI gate.

Writes ``generations.jsonl``, ``report.json`` / ``report.md`` / ``report.junit.xml``, ``plots/*.png`` and
``manifest.json`` (which also carries this round's drift counters, for the next round's drift gate).
Exit code 0: release passes; ``BLOCKED_EXIT_CODE`` (3): the report is written and the release is blocked
(unless ``--fail_on_block false``: then 0 either way and the verdict is in the manifest).
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from dataclasses import asdict, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


from data.decontamination import seen_in_training
from data.fingerprint import data_fingerprint, local_path
from judging.factory import make_judge
from rlhf.distributed import actual_world_size, init_state, is_main_process
from rlhf.efficiency import summary as efficiency_summary
from rlhf.entrypoint import BLOCKED_EXIT_CODE, setup_stage, setup_tracking
from rlhf.config import parse_stage_config
from rlhf.lineage import content_hash, json_hash
from rlhf.manifest import atomic_write_text, stage_manifest
from rlhf.precision import generation_precision
from rlhf.rundir import check_own_output_dir, install_failure_hook, mark_own_output_dir
from rlhf.tracking import ReferenceArtifact, dataset_artifact, log_summary, producer_artifact
from rlhf.vllm_engine import check_engine

from .canaries import canary_gate, run_canaries
from .config import DATA_FIELDS, GateStageConfig
from .decide import decide
from .generation import answer_suites, generation_efficiency, label_intents, load_suites, truncation_counts, write_generations
from .inputs import check_inputs, clear_previous_outputs, read_ppo_unlock, resolve_models
from .measure import measure, run_judge, shardable_judge, write_judgments
from .render import compared_context, gate_summary, gate_table, judge_row, make_plots, render_report
from .report import contamination_markdown, summary_metrics, write_reports
from .result import GateResult, release_verdict
from .redteam import redteam_markdown, rotation_gate, round_slice
from .rubric import axes_markdown, axes_summary, axes_table, group_by_axis, load_rubric

__all__ = ["GateStageConfig", "main"]

logger = logging.getLogger("gates.evaluate")


def main(argv: list[str] | None = None) -> int:
    started_at, t_start = datetime.now(timezone.utc), time.perf_counter()  # the JUnit report's timestamp and time
    (args,) = parse_stage_config((GateStageConfig,), argv)
    install_failure_hook(args.output_dir)  # the flow reads the reason, whatever the exception
    # Multi-process launch (torchrun / accelerate launch): the world-size contract and collective timeout first;
    # every rank generates and scores a share, rank 0 alone judges, measures and writes (rlhf/distributed.py).
    if actual_world_size() > 1:
        init_state(args.collective_timeout_s)  # the process group, with the timeout (the variable overrides it)
    launch = setup_stage("gates", args, tracking=False)  # logging and the launch check; W&B on rank 0, below
    check_engine(args.engine)
    main_rank = is_main_process()
    out = Path(args.output_dir)
    # Never clear a folder this stage did not write (another stage's, or a user's): refused before anything is read.
    check_own_output_dir(out, "gates")

    # 1. inputs: every input is read and checked before the folder is marked and an earlier run's outputs cleared
    traffic, previous, _ = check_inputs(args)
    ppo_unlock = read_ppo_unlock(args.ppo_unlock_json)
    models = resolve_models(args)
    suites = load_suites(args, models)
    # the red-team suite: a seeded, decontaminated, versioned slice of the pool (redteam_rotate), else redteam_data's
    redteam, redteam_suite = round_slice(args)
    suites = replace(suites, redteam=redteam)
    if main_rank:
        mark_own_output_dir(out, "gates")
        clear_previous_outputs(out)
        setup_tracking("gates", args)

    # 2. generate: both models answer every suite
    t_gen = time.perf_counter()
    answers = {who: answer_suites(models[who], suites.prompts, args, who) for who in ("baseline", "candidate")}
    if not main_rank:  # the other ranks' part ends with their share of the judge's scores; they write nothing
        if shardable_judge(args.judge_config()):
            run_judge(args.judge_config(), models, suites, answers, reward_model_dir=args.reward_model_dir, shard=True)
        return 0
    efficiency = generation_efficiency(answers, time.perf_counter() - t_gen, models["candidate"],
                                       generation_precision(args.generation_precision))
    efficiency["processes"] = launch["world_size"]
    write_generations(out / "generations.jsonl", suites, answers)

    # 3. judge and measure; 4. decide: each gate on its own numbers; one "block" or "inconclusive" blocks the release;
    # then the canaries (gates/canaries.py): one that passes a gate it attacks blocks the release (instrument failure)
    t_judge = time.perf_counter()
    m, models, intent_classifier, judge = judge_and_measure(args, models, suites, answers, traffic, previous)
    efficiency["judging_seconds"] = time.perf_counter() - t_judge  # judge scores, intents, refusal classifier
    results = decide(m, args)
    if args.canaries and args.canary_names:  # constructed must-lose candidates, judged and measured the same way
        canaries = run_canaries(args, {**models, "judge": models["reward_model"]}, suites, answers,
                                intents=m.intents, traffic=traffic, previous=previous, judge=judge)
        efficiency["canary_seconds"] = canaries.seconds
        efficiency["canary_judge_calls"] = canaries.judge_calls
        results.append(canary_gate(canaries))
    if args.redteam_rotate:  # a suite version past its reuse limit blocks (gates/redteam.py)
        results.append(rotation_gate(redteam_suite))
    verdict = release_verdict(results)

    # 5. report and manifest
    report(args, models, suites, m, answers, results, verdict, ppo_unlock=ppo_unlock, previous=previous,
           intent_classifier=intent_classifier, efficiency=efficiency, started_at=started_at, t_start=t_start,
           redteam_suite=redteam_suite)
    logger.info("release verdict: %s (%s)", verdict.upper(), "; ".join(f"{r.name}: {r.verdict}" for r in results))
    return 0 if verdict == "pass" or not args.fail_on_block else BLOCKED_EXIT_CODE


def judge_and_measure(args: GateStageConfig, models: dict[str, Any], suites: Any, answers: dict[str, dict],
                      traffic: dict, previous: Any) -> tuple[Any, dict[str, Any], Any, Any]:
    """Label the win-rate prompts' intents, judge the pairs (``judgments.jsonl`` written) and grade every answer.

    Returns:
        (``gates.measure.Measurements``, the models with ``reward_model`` and the judge's name, the intent
        classifier's description, the judge that judged, for the canaries to ask again).
    """
    out = Path(args.output_dir)
    intents, intent_classifier = label_intents(suites.winrate, models["baseline"], args)
    judge = make_judge(args.judge_config(), reward_model=models["judge"] or None)
    judged = run_judge(args.judge_config(), models, suites, answers, reward_model_dir=args.reward_model_dir,
                       shard=shardable_judge(args.judge_config()), judge=judge)
    write_judgments(out / "judgments.jsonl", judged.rows)
    models = {**models, "reward_model": models["judge"], "judge": judged.info["judge"]}
    m = measure(
        suites, answers, preferences=judged.preferences, judge=judged.agreement, judge_source=judged.source,
        intents=intents, traffic=traffic, previous=previous, refusal_classifier=args.refusal_classifier,
        judge_info=judged.info,
        refusal_judge=args.refusal_judge_config() if args.refusal_classifier == "openai" else None,
    )
    return m, models, intent_classifier, judge


def report(args: GateStageConfig, models: dict[str, Any], suites: Any, m: Any, answers: dict[str, dict],
           results: list[GateResult], verdict: str, *, ppo_unlock: dict | None, previous: Any,
           intent_classifier: Any, efficiency: dict, started_at: datetime | None = None,
           t_start: float | None = None, redteam_suite: dict | None = None) -> Path:
    """Write the plots, ``report.json`` / ``report.md`` / ``report.junit.xml`` (``started_at``, the stage's start,
    and the seconds since ``t_start``, a ``time.perf_counter()``, as its timestamp and time), the W&B summary and,
    last, the manifest; returns the manifest's path."""
    out = Path(args.output_dir)
    drift_label = "baseline (SFT) on the same prompts (no previous round given)"
    if previous is not None:
        drift_label = f"previous round ({args.previous_round_dir})"
    plots = make_plots(m, out / "plots", reference="previous round" if previous is not None else "baseline (SFT)")
    # Per suite: was any of its prompts seen in training? From the training stages' decontamination records.
    seen = seen_in_training(
        {
            (mf.get("stage") or who): (mf.get("outputs") or {}).get("decontamination")
            for who, mf in (("baseline", models["baseline_manifest"]), ("candidate", models["candidate_manifest"]),
                            ("judge", models["judge_manifest"]))
            if mf or who != "judge"  # a judge that is not this round's reward model was not trained here
        },
        suites.prompts,
    )
    metadata = {
        "round_id": args.round_id, "seen_in_training": seen,
        "baseline": models["baseline"], "candidate": models["candidate"],
        "judge": models["judge"], "judge_info": m.judge_info, "drift_previous": drift_label,
        "intent_classifier": intent_classifier,
        "ppo_unlock": ppo_unlock, "plots": {k: str(v) for k, v in plots.items()},
        "prompts_truncated": truncation_counts(answers), "max_prompt_length": args.max_prompt_length,
        "redteam_suite": redteam_suite,
    }
    axes = group_by_axis(results, load_rubric(args.rubric), args)  # the report, W&B and Prefect, by axis
    reports = write_reports(results, out, stem="report", metadata=metadata, started_at=started_at,
                            seconds=None if t_start is None else time.perf_counter() - t_start, axes=axes)
    context = axes_markdown(axes) + compared_context(args, models, m, answers, drift_label=drift_label,
                               intent_classifier=intent_classifier, ppo_unlock=ppo_unlock)
    context += contamination_markdown(seen).splitlines() + ["", ""]
    context += redteam_markdown(redteam_suite)
    title = f"Release gates: {args.round_id or out.name}"
    atomic_write_text(reports["markdown"], render_report(results, verdict, title=title, context=context, plots=plots))
    judge = judge_row(m, results)
    table = gate_table(results, judge)
    hashes = input_hashes(args, models, judge)
    log_summary(
        {"verdict": verdict, **{f"{r.name}/verdict": r.verdict for r in results}, **summary_metrics(results),
         **axes_summary(axes), **efficiency_summary(efficiency),
         **{f"judge/{k}": v for k, v in judge.items() if v is None or isinstance(v, (int, float, str))}},
        table={"gates": table, "axes": axes_table(axes), "judge": [judge],
               **{f"gate_{r.name}": r.table for r in results if r.table}, "generations": generations_table(out)},
        images={k: str(v) for k, v in plots.items()},
        report_to=args.report_to,
        config=wandb_config(args, models, suites, judge, hashes),
        inputs=[*(producer_artifact(models[k], hashes[f"{k}_hash"]) for k in ("baseline", "candidate", "judge")),
                *(dataset_artifact(getattr(args, k), local_path(getattr(args, k)), hashes[f"{k}_hash"])
                  for k in DATA_FIELDS if getattr(args, k))],
        outputs=[ReferenceArtifact("gates-report", "gate-report", str(reports["json"]),
                                   content_hash(reports["json"]),
                                   {"stage": "gates", "round_id": args.round_id, "verdict": verdict})],
    )
    return write_gates_manifest(args, models, ppo_unlock, results, verdict, reports, table, plots,
                                m.drift["candidate"], prompts_truncated=metadata["prompts_truncated"], judge=judge,
                                seen_in_training=seen, efficiency=efficiency, axes=axes,
                                hashes=hashes, redteam_suite=redteam_suite)


def input_hashes(args: GateStageConfig, models: dict[str, Any], judge: dict | None) -> dict[str, str]:
    """Content hashes of the compared checkpoints (``baseline_hash``, ``candidate_hash``), the judge's identity
    (``judge_hash``: its checkpoint's content for a reward model, else backend, model and template) and every
    data file (``<k>_hash`` per ``DATA_FIELDS`` key: ``data.fingerprint.data_fingerprint``)."""
    return {
        **{f"{k}_hash": content_hash(models[k]) for k in ("baseline", "candidate")},
        "judge_hash": content_hash(models["judge"]) if Path(models["judge"]).exists() else (
            (judge or {}).get("identity_hash") or json_hash(models["judge"])),
        **{f"{k}_hash": data_fingerprint(getattr(args, k)) if getattr(args, k) else "" for k in DATA_FIELDS},
    }


def wandb_config(args: GateStageConfig, models: dict[str, Any], suites: Any, judge: dict,
                 hashes: dict[str, str]) -> dict[str, Any]:
    """The gate run's W&B config, so runs are filtered and compared on it: every gate setting (thresholds, ``n_*``,
    judge configs by variable name only: ``args.to_dict()``), the judge's identity and agreement (``judge_row``, under
    ``judge_measured``),
    each suite with its file, hash and the number of items answered, and the compared checkpoints with hashes."""
    sizes = {name: len(prompts) for name, prompts in suites.prompts.items()}
    return {
        **args.to_dict(),
        # beside "judge", the configured judge (args.to_dict()): who judged and how well it agrees with people
        "judge_measured": {k: v for k, v in judge.items() if v is None or isinstance(v, (int, float, str, bool))},
        # every data file with its hash; the suites answered also with n, the items sampled (n_* settings)
        "suites": {k.removesuffix("_data"): {"data": getattr(args, k), "hash": hashes.get(f"{k}_hash"),
                                             **({"n": sizes[k.removesuffix("_data")]}
                                                if k.removesuffix("_data") in sizes else {})}
                   for k in DATA_FIELDS},
        "compared": {who: {"path": str(models[who]), "hash": hashes[f"{who}_hash"]}
                     for who in ("baseline", "candidate")},
        "judge_checkpoint": {"path": str(models["judge"]), "hash": hashes["judge_hash"]},
    }


def judge_verdict(preference: float | None) -> str:
    """The judge's verdict on one pair from its AlpacaEval preference of B (candidate) over A (baseline) in [1, 2]:
    ``candidate`` above 1.5, ``baseline`` below, ``tie`` at 1.5, ``unparsed`` for NaN / missing."""
    if preference is None or (isinstance(preference, float) and math.isnan(preference)):
        return "unparsed"
    return "candidate" if preference > 1.5 else "baseline" if preference < 1.5 else "tie"


def generations_table(out: Path) -> list[dict[str, Any]]:
    """The W&B generations table: one row per ``generations.jsonl`` row (suite, id, prompt, baseline and candidate
    answers), with the judge's verdict, preference and raw answer from ``judgments.jsonl`` on the win-rate rows
    (matched on the suite's item ``id``; other suites are not judged pairwise: empty there)."""
    judged = {}
    judgments = out / "judgments.jsonl"
    if judgments.is_file():
        for line in judgments.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                judged[str(row["id"])] = row
    rows = []
    for line in (out / "generations.jsonl").read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        g = json.loads(line)
        j = judged.get(str(g["id"])) if g["suite"] == "winrate" else None
        rows.append({"suite": g["suite"], "id": g["id"], "prompt": g["prompt"], "baseline": g["baseline"],
                     "candidate": g["candidate"], "judge_verdict": None if j is None else judge_verdict(
                         j.get("preference")), "preference": None if j is None else j.get("preference"),
                     "judge_raw": None if j is None else j.get("raw")})
    return rows


def write_gates_manifest(
    args: GateStageConfig,
    models: dict[str, Any],
    ppo_unlock: dict | None,
    results: list[GateResult],
    verdict: str,
    reports: dict[str, Path],
    table: list[dict],
    plots: dict[str, Path],
    drift_counters: Any,
    *,
    prompts_truncated: dict | None = None,
    judge: dict | None = None,
    seen_in_training: dict | None = None,
    efficiency: dict | None = None,
    axes: dict | None = None,
    hashes: dict[str, str] | None = None,
    redteam_suite: dict | None = None,
) -> Path:
    """The stage manifest: inputs with content hashes, the verdict, report paths, gate tables, the gates grouped by
    rubric axis (``axes``, ``axis_table``), plots, this round's drift counters (the next round's drift reference),
    the over-long prompts per suite and the red-team suite's record (``redteam_suite``: ``gates.redteam``).
    ``hashes``: :func:`input_hashes`'s (computed when not given)."""
    hashes = hashes if hashes is not None else input_hashes(args, models, judge)
    inputs = {
        **{k: models[k] for k in ("baseline", "candidate", "judge")},
        **{f"{k}_hash": hashes[f"{k}_hash"] for k in ("baseline", "candidate")},
        # the judge's identity: its checkpoint's content (reward models) or backend, model and template (others)
        "judge_hash": hashes["judge_hash"],
        "ppo_unlock": ppo_unlock,
        **{k: getattr(args, k) for k in DATA_FIELDS},
        **{f"{k}_hash": hashes[f"{k}_hash"] for k in DATA_FIELDS},
    }
    return stage_manifest(
        "gates",
        args,
        config=args.to_dict(),  # judges' keys appear by variable name only
        inputs=inputs,
        outputs={
            "verdict": verdict,
            "report_json": str(reports["json"]),
            "report_md": str(reports["markdown"]),
            "junit": str(reports["junit"]),
            "gate_table": table,
            "gate_summary": gate_summary(results, judge),
            "judge": judge,
            "gate_tables": {r.name: r.table for r in results},
            "axes": axes or {},
            "axis_table": axes_table(axes or {}),
            "plots": {k: str(v) for k, v in plots.items()},
            "drift_counters": dict(asdict(drift_counters)),
            "prompts_truncated": prompts_truncated or {},
            "seen_in_training": seen_in_training or {},
            # the red-team suite's version, seed, size and decontamination (gates/redteam.py); the next rounds
            # count its reuse from here (via round.json)
            "redteam_suite": redteam_suite or {},
        },
        metrics={
            **{r.name: r.to_dict() for r in results},
            **({"threads": efficiency["threads"], "efficiency": efficiency} if efficiency else {}),
        },
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
