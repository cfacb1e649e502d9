"""The round flow: SFT -> pi_ref -> DPO -> reward model -> (PPO, if unlocked) -> release gates.

Each task launches its stage as a process (``accelerate launch -m <stage>.train``) and reads the manifest; no
training math lives here. Stages whose inputs are unchanged are reused (flows/stages.py). The gate verdict is
published as Prefect artifacts, and the round manifest ``runs/<round_id>/round.json`` records every stage's
hashes, the PPO unlock numbers and decision, and the verdict.

Run from Python or the CLI (``rlhf round --preset demo``); by default on Prefect's ephemeral local API.
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Literal

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel, Field

from rlhf.manifest import atomic_write_text

from .stages import StageRun, check_stage_config, dump, run_stage, summarize

REPO_ROOT = Path(__file__).resolve().parent.parent


class RoundParameters(BaseModel):
    """Parameters of one round (Prefect renders this as the run form)."""

    preset: Literal["smoke", "demo"] | str = Field("demo", description="Recipe folder under recipes/: smoke or demo.")
    round_id: str | None = Field(None, description="Names runs/<round_id>; default: <preset>-<UTC date>.")
    runs_dir: str = Field("runs", description="Where round directories go.")
    base_model: str | None = Field(None, description="Override the preset's base model (id, dir or .gguf).")
    overrides: dict[str, list[str]] = Field(
        default_factory=dict, description='Extra CLI args per stage, e.g. {"dpo": ["--beta", "0.2"]}.'
    )
    ppo_override: bool = Field(False, description="Research only: run PPO even when the unlock rule says no.")
    ppo_override_reason: str | None = Field(None, description="Required with ppo_override; recorded in the manifest.")
    accelerate_config: str | None = Field(None, description="accelerate config file (default: one local process).")
    force: list[str] = Field(default_factory=list, description="Stages to rerun even if their inputs are unchanged.")


def _recipe(params: RoundParameters, stage: str) -> Path:
    """``recipes/<preset>/<stage>.yaml`` (the reward-model stage's recipe is ``reward.yaml``), or a folder of yours."""
    p = Path(params.preset)
    folder = p if p.is_dir() else REPO_ROOT / "recipes" / params.preset
    return folder / f"{'reward' if stage == 'reward_model' else stage}.yaml"


@task(cache_policy=NO_CACHE, task_run_name="{stage}")
def stage_task(
    stage: str, module: str, params: RoundParameters, round_dir: Path, extra: list[str], parents: list[StageRun]
) -> StageRun:
    logger = get_run_logger()
    args = [*extra, "--round_id", round_dir.name, *params.overrides.get(stage, [])]
    return run_stage(
        stage,
        module,
        _recipe(params, stage),
        round_dir / stage,
        extra_args=args,
        parents=parents,
        accelerate_config=params.accelerate_config,
        force=stage in params.force,
        log=logger.info,
    )


@task(cache_policy=NO_CACHE, task_run_name="check-recipes")
def check_recipes_task(params: RoundParameters, stages: list[str]) -> None:
    """Every stage's recipe and overrides parse, and named data files exist, before anything trains."""
    for stage in stages:
        recipe = _recipe(params, stage)
        if not recipe.is_file():
            raise FileNotFoundError(f"{recipe}: no such recipe for stage {stage} (preset {params.preset!r})")
        check_stage_config(stage, recipe, params.overrides.get(stage, []))


@flow(name="rlhf-round", log_prints=True)
def rlhf_round(params: RoundParameters = RoundParameters()) -> dict:
    """One round; returns the round manifest (also written to ``<runs_dir>/<round_id>/round.json``)."""
    logger = get_run_logger()
    round_id = params.round_id or f"{params.preset}-{_dt.datetime.now(_dt.timezone.utc):%Y%m%d}"
    round_dir = Path(params.runs_dir) / round_id
    round_dir.mkdir(parents=True, exist_ok=True)
    # round.json is written last: while a round runs (or after it failed) there is none that could pass for it.
    (round_dir / "round.json").unlink(missing_ok=True)
    base = ["--model_name_or_path", params.base_model] if params.base_model else []
    unknown = set(params.overrides) - {"sft", "dpo", "reward_model", "ppo", "gates"}
    if unknown:
        raise ValueError(
            f"overrides for unknown stage(s) {sorted(unknown)}; stages: sft, dpo, reward_model, ppo, gates"
        )
    check_recipes_task(params, ["sft", "dpo", "reward_model", "gates"] + (["ppo"] if params.ppo_override else []))

    sft = stage_task("sft", "sft.train", params, round_dir, base, [])
    dpo = stage_task("dpo", "dpo.train", params, round_dir, ["--sft_dir", sft.output_dir], [sft])
    rm_args = ["--sft_dir", sft.output_dir]
    if params.ppo_override:
        rm_args += ["--ppo_override", "true", "--ppo_override_reason", params.ppo_override_reason or ""]
    rm = stage_task("reward_model", "reward_model.train", params, round_dir, rm_args, [sft])
    unlock = rm.manifest["outputs"]["ppo_unlock"]
    logger.info(
        "PPO unlock: %s (RM agreement %.4f vs inter-annotator %.4f)",
        unlock["unlocked"],
        unlock["rm_agreement"],
        unlock["inter_annotator_agreement"],
    )

    runs = [sft, dpo, rm]
    candidate = dpo
    if unlock["unlocked"]:
        ppo = stage_task(
            "ppo",
            "ppo.train",
            params,
            round_dir,
            ["--sft_dir", sft.output_dir, "--policy_dir", dpo.output_dir, "--reward_model_dir", rm.output_dir],
            [sft, dpo, rm],
        )
        runs.append(ppo)
        candidate = ppo
    gates = stage_task(
        "gates",
        "gates.evaluate",
        params,
        round_dir,
        [
            "--baseline_dir",
            sft.output_dir,
            "--candidate_dir",
            candidate.output_dir,
            "--reward_model_dir",
            rm.output_dir,
            "--fail_on_block",
            "false",
        ],
        [sft, candidate, rm],
    )
    runs.append(gates)

    verdict = gates.manifest["outputs"]["verdict"]
    manifest = {
        "round_id": round_id,
        "preset": params.preset,
        "candidate": candidate.stage,
        "verdict": verdict,
        "ppo_unlock": unlock,
        "stages": {
            r.stage: {
                "output_dir": r.output_dir,
                "cache_key": r.cache_key,
                "cached": r.cached,
                "seconds": r.seconds,
                "outputs": r.manifest.get("outputs", {}),
            }
            for r in runs
        },
        "gate_report": gates.manifest["outputs"].get("report_md"),
    }
    atomic_write_text(round_dir / "round.json", dump(manifest))
    _publish(round_id, runs, gates, unlock, verdict)
    logger.info("round %s: verdict %s (report %s)", round_id, verdict.upper(), manifest["gate_report"])
    return manifest


def _publish(round_id: str, runs: list[StageRun], gates: StageRun, unlock: dict, verdict: str) -> None:
    """Prefect artifacts: the verdict report, the gate table, the stage table."""
    key = "".join(c if c.isalnum() else "-" for c in round_id.lower())
    report = Path(gates.manifest["outputs"]["report_md"])
    create_markdown_artifact(
        key=f"gate-report-{key}",
        markdown=report.read_text(),
        description=f"Release verdict of round {round_id}: {verdict}",
    )
    create_table_artifact(
        key=f"gates-{key}", table=gates.manifest["outputs"]["gate_table"], description=f"Gates of round {round_id}"
    )
    for gate, rows in (gates.manifest["outputs"].get("gate_tables") or {}).items():
        if rows:
            create_table_artifact(
                key=f"gate-{gate.replace('_', '-')}-{key}", table=rows, description=f"{gate} table, round {round_id}"
            )
    create_table_artifact(key=f"stages-{key}", table=summarize(runs), description=f"Stages of round {round_id}")
    create_table_artifact(
        key=f"ppo-unlock-{key}",
        table=[
            {
                k: unlock.get(k)
                for k in (
                    "unlocked",
                    "rule_verdict",
                    "rm_agreement",
                    "rm_n",
                    "inter_annotator_agreement",
                    "iaa_n",
                    "margin",
                    "comparison",
                    "overridden",
                    "override_reason",
                )
            }
        ],
        description=f"PPO unlock decision, round {round_id}",
    )
