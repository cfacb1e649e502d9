"""Gate-stage inputs, checked before any model is loaded: config values, the traffic table, the previous round's
drift counters, the round's PPO unlock decision, and the three checkpoints (baseline, candidate, judge)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from data.bundle import demo_path
from judging.scoring import check_score_head
from rlhf.lineage import content_hash
from rlhf.manifest import read_manifest

from .config import GateStageConfig
from .drift import DriftCounters
from .evidence import check_distinct_models
from .intent import traffic_shares
from .refusal import RefusalThresholds
from .rubric import check_rubric, load_rubric

#: Keys the report needs from the PPO unlock file (``judging.unlock.UnlockDecision.to_dict()``).
PPO_UNLOCK_KEYS = ("unlocked", "rule_verdict", "rm_agreement", "inter_annotator_agreement", "overridden",
                   "override_reason")


def source_path(path: str) -> Path:
    """A data path as a file: ``demo:<name>`` resolves into the demo bundle."""
    return demo_path(path) if path.startswith("demo:") else Path(path)



def resolve_checkpoint(path: str) -> tuple[str, dict]:
    """A stage dir (manifest -> checkpoint) or a checkpoint dir itself; returns (checkpoint, manifest or {}).

    Raises:
        FileNotFoundError: neither, naming the path.
    """
    p = Path(path)
    if (p / "manifest.json").is_file():
        m = read_manifest(p)
        return m["outputs"]["checkpoint"], m
    if (p / "config.json").is_file():
        return str(p), {}
    raise FileNotFoundError(
        f"{path or '(empty)'}: neither a stage directory with manifest.json nor a checkpoint with config.json"
    )


def clear_previous_outputs(out: Path) -> None:
    """Remove an earlier run's reports from ``out``: a failed run must not leave an old verdict looking current.

    Only this stage's own output names are removed; call it on a folder ``rlhf.rundir.check_own_output_dir``
    accepted, after every input was read and checked."""
    out.mkdir(parents=True, exist_ok=True)
    for name in ("manifest.json", "report.json", "report.md", "report.junit.xml", "generations.jsonl",
                 "judgments.jsonl"):
        (out / name).unlink(missing_ok=True)
    shutil.rmtree(out / "plots", ignore_errors=True)


def check_inputs(args: GateStageConfig) -> tuple[dict, DriftCounters | None, RefusalThresholds]:
    """Validate the config before generating anything; returns (traffic shares, previous drift counters, thresholds).

    Raises:
        ValueError: naming the config key and the reason; for the rubric (``gates.rubric.check_rubric``), its file
            and the axis key or gate.
    """
    args.check_values()  # run when the config is built too; again here for a config changed since
    if args.refusal_classifier == "openai":
        args.refusal_judge_config()  # raises naming --refusal_judge, or when no endpoint is configured
    judge = args.judge_config()
    for key in ("labels", "template"):  # files the judge reads later, after the folder is cleared
        path = getattr(judge, key)
        if path and not Path(path).is_file():
            raise ValueError(f"--judge {key} {path}: no such file")
    try:
        traffic = traffic_shares(source_path(args.traffic_data))
    except (ValueError, FileNotFoundError) as err:
        raise ValueError(f"--traffic_data {args.traffic_data}: {err}") from None
    previous = None
    if args.previous_round_dir:
        path = Path(args.previous_round_dir) / "manifest.json"
        counters = json.loads(path.read_text()).get("outputs", {}).get("drift_counters") if path.is_file() else None
        if counters is None:
            raise ValueError(
                f"--previous_round_dir {args.previous_round_dir}: not a gates stage directory "
                "(needs manifest.json with outputs.drift_counters, written by gates.evaluate)"
            )
        previous = DriftCounters(**counters)
    thresholds = RefusalThresholds(args.max_violation_increase_pp, args.max_false_refusal_increase_pp,
                                   min_n=args.refusal_min_n)
    # Every gate on an axis, every axis measured or declared not measured: refused before any model is loaded.
    check_rubric(load_rubric(args.rubric), config=args)
    return traffic, previous, thresholds


def read_ppo_unlock(path: str) -> dict[str, Any] | None:
    """The round's PPO unlock decision from ``path`` (written by the flow), or None when ``path`` is empty.

    Raises:
        ValueError: the file is missing, not JSON, not an object, or lacks a key of ``PPO_UNLOCK_KEYS`` (named).
    """
    if not path:
        return None
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"--ppo_unlock_json {path}: no such file")
    try:
        decision = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"--ppo_unlock_json {path}: not JSON ({err})") from None
    if not isinstance(decision, dict):
        raise ValueError(f"--ppo_unlock_json {path}: expected a JSON object, got {type(decision).__name__}")
    missing = [k for k in PPO_UNLOCK_KEYS if k not in decision]
    if missing:
        raise ValueError(f"--ppo_unlock_json {path}: missing keys {missing} (a judging.unlock.UnlockDecision)")
    return decision


def resolve_models(args: GateStageConfig) -> dict[str, Any]:
    """The baseline, candidate and judge checkpoints and their stage manifests.

    Returns:
        ``{"baseline": path, "candidate": path, "judge": path, "judge_manifest": dict ({} for a bare checkpoint),
        "baseline_manifest": dict, "candidate_manifest": dict}``; with a judge other than the round's reward model
        (``--judge``) and no ``--reward_model_dir``, "judge" is "" (``gates.measure.run_judge`` names the judge then).

    Raises:
        FileNotFoundError: a directory is neither a stage directory nor a checkpoint.
        ValueError: the judge has no trained score head, or the default judge has no --reward_model_dir; the
            candidate is the baseline (same content hash) and ``allow_same_model`` is false
            (``gates.evidence.check_distinct_models``).
    """
    baseline, baseline_manifest = resolve_checkpoint(args.baseline_dir)
    candidate, candidate_manifest = resolve_checkpoint(args.candidate_dir)
    check_distinct_models(content_hash(baseline), content_hash(candidate), allow_same_model=args.allow_same_model)
    manifests = {"baseline_manifest": baseline_manifest, "candidate_manifest": candidate_manifest}
    backend = args.judge_config().backend
    if backend != "reward_model" and not args.reward_model_dir:  # another judge; no reward model in this run
        return {"baseline": baseline, "candidate": candidate, "judge": "", "judge_manifest": {}, **manifests}
    if not args.reward_model_dir:
        raise ValueError("--reward_model_dir: the default judge (judge.backend reward_model) is the round's reward "
                         "model; give its stage directory, or choose another judge with --judge '{\"backend\": ...}'")
    judge, judge_manifest = resolve_checkpoint(args.reward_model_dir)
    check_score_head(judge)
    return {"baseline": baseline, "candidate": candidate, "judge": judge, "judge_manifest": judge_manifest, **manifests}
