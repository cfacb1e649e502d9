"""The round flow: SFT -> pi_ref -> DPO -> reward model -> (online RL, if unlocked) -> release gates.

Each task launches its stage as a process (``accelerate launch -m <stage>.train``) and reads the manifest; no
training math lives here. Stages whose inputs are unchanged are reused (flows/stages.py). The gate verdict is
published as Prefect artifacts, and the round manifest ``runs/<round_id>/round.json`` records every stage's
hashes, the PPO unlock numbers and decision, and the verdict.

The PPO unlock is decided here, not in a stage: the reward-model stage only records its measurements (RM and
inter-annotator agreement), :func:`judging.unlock.decide_from_metrics` applies the rule (a pure function), and the
research override is a flow parameter. The decision goes to ``<round_dir>/ppo_unlock.json``, which the online-RL
stage reads (``--ppo_unlock_json``) and the gate report records; the override never reaches the reward-model stage,
so switching it on never retrains the reward model. The online-RL stage is the round's ``online_rl`` parameter:
``ppo`` (ppo/, with a value model), ``grpo`` or ``rloo`` (TRL's trainers, no value model); one decision unlocks
whichever is chosen, and its output becomes the round's candidate.

Run from Python or the CLI (``rlhf round --preset demo``); by default on Prefect's ephemeral local API.
"""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path
from typing import Literal

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.states import State
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from judging.unlock import decide_from_metrics
from rlhf.credentials import check_args
from rlhf.manifest import atomic_write_text, dumps_strict, strict_json
from rlhf.registry import STAGES
from rlhf.round_id import artifact_key, check_round_id
from rlhf.rundir import RoundLock

from .approval import BYPASS_ENV, DEFAULT_TIMEOUT_S, previous_round_json, previous_waivers, release_approval
from .approval import release_state, write_to_report
from .artifacts import add_flow_run_tags, embed_images, error_state, ordered_rows, round_result
from .launch.slurm import SlurmJob, slurm_launcher
from .stages import StageFailed, StageRun, check_stage_config, dump, prestart_local_stages, run_stage, summarize

UNLOCK_FILE = "ppo_unlock.json"
#: The stages a round may run as its online-RL step after DPO (one per round: RoundParameters.online_rl).
ONLINE_RL_STAGES = ("ppo", "grpo", "rloo")
GATE_SUITES_FILE = "gate_suites.yaml"
#: The online-RL tripwire's slice: win-rate prompts of this round's gate suite that the gates do not score.
TRIPWIRE_SLICE_FILE = "tripwire_slice.jsonl"

REPO_ROOT = Path(__file__).resolve().parent.parent


class RoundParameters(BaseModel):
    """Parameters of one round (Prefect renders this as the run form). They are stored in Prefect's database and
    the stage command lines built from them are logged, so they never hold a secret: a judge's key comes from the
    environment variable its ``api_key_env`` names (refused as a value, rlhf/credentials.py)."""

    # a refused value is not echoed in the validation error (it may be the secret)
    model_config = ConfigDict(hide_input_in_errors=True)

    # one string field, not Literal | str: Prefect's form renders a union as two tabs, both labelled "str"
    preset: str = Field(
        "demo", description="Recipe folder under recipes/ (smoke, demo, 8b/full, ...) or a folder of yours.",
        examples=["smoke", "demo", "8b/full"],
    )
    # no angle brackets in descriptions: the run form renders them as HTML and swallows "<round_id>"
    round_id: str | None = Field(
        None, description="Names the round folder runs/ROUND_ID; default: PRESET-YYYYMMDD (UTC date)."
    )
    runs_dir: str = Field("runs", description="Where round directories go.")
    base_model: str | None = Field(None, description="Override the preset's base model (id, dir or .gguf).")
    overrides: dict[str, list[str]] = Field(
        default_factory=dict, description='Extra CLI args per stage, e.g. {"dpo": ["--beta", "0.2"]}.'
    )
    online_rl: Literal["ppo", "grpo", "rloo"] = Field(
        "ppo", description="The online-RL stage run when the unlock rule (or the override) says so: ppo (value model, "
        "GAE), grpo (group-relative advantages) or rloo (leave-one-out baseline); its output is the candidate."
    )
    ppo_override: bool = Field(
        False, description="Research only: run the online-RL stage even when the unlock rule says no."
    )
    ppo_override_reason: str | None = Field(
        None, description="Required with ppo_override; recorded in round.json, ppo_unlock.json and the gate report."
    )
    accelerate_config: str | None = Field(None, description="accelerate config file (default: one local process).")
    launcher: Literal["local", "slurm"] = Field(
        "local", description="local: accelerate launch on this host. slurm: each stage is an sbatch job (below)."
    )
    slurm: SlurmJob = Field(default_factory=SlurmJob, description="Slurm resources (launcher slurm only).")
    force: list[str] = Field(default_factory=list, description="Stages to rerun even if their inputs are unchanged.")
    flywheel_data: str | None = Field(
        None, description="A flywheel dataset version (runs/flywheel/datasets/v-...): the DPO and reward-model data."
    )
    approval: Literal["none", "required"] = Field(
        "none", description="required: after the gates the run pauses for a release decision (approve, reject, "
        "waive blocking gates) in the Prefect UI's Resume form; none: the release follows the gates (flows/approval.py)."
    )
    approval_timeout_s: int = Field(
        DEFAULT_TIMEOUT_S, ge=1, description="Seconds to wait for the release decision; no decision = rejected."
    )
    approval_bypass: str | None = Field(
        None, description="Non-interactive runs (CI): skip a required approval; the value is the recorded reason "
        f"(or set {BYPASS_ENV})."
    )

    @field_validator("preset")
    @classmethod
    def _preset_exists(cls, value: str) -> str:
        """A preset is a folder under ``recipes/`` or a folder of yours; anything else is refused when the parameters
        are made (a usage error), before Prefect starts and before a round folder exists."""
        if not (Path(value).is_dir() or (REPO_ROOT / "recipes" / value).is_dir()):
            root = REPO_ROOT / "recipes"
            known = sorted(str(p.parent.relative_to(root)) for p in root.rglob(f"{STAGES['gates'].name}.yaml"))
            raise ValueError(f"preset {value!r}: no such preset ({', '.join(known)}) and no such folder of recipes")
        return value

    @field_validator("round_id")
    @classmethod
    def _safe_round_id(cls, value: str | None) -> str | None:
        """Checked when the parameters are made, before anything trains (rlhf/round_id.py)."""
        return None if value is None else check_round_id(value)

    @field_validator("overrides")
    @classmethod
    def _no_secret_values(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        """An override that carries a secret (``--set gates.judge='{"api_key": ...}'``, ``--set sft.hub_token=...``,
        a URL with a password) is refused before the flow run (and its parameters) exist; so is an unknown stage."""
        for stage, args in value.items():
            _known_stage(stage)
            check_args(args, stage)
        return value

    @field_validator("force")
    @classmethod
    def _force_known_stages(cls, value: list[str]) -> list[str]:
        """``force`` names stages; one that is no stage would be ignored silently."""
        return [_known_stage(stage) for stage in value]

    @model_validator(mode="after")
    def _online_rl_settings_for_the_chosen_stage(self) -> "RoundParameters":
        """Overrides or ``force`` for an online-RL stage the round does not run would be ignored silently: refuse."""
        for where, stages in (("overrides", set(self.overrides)), ("force", set(self.force))):
            unused = sorted(stages & set(ONLINE_RL_STAGES) - {self.online_rl})
            if unused:
                # the field names are written as the CLI's options in its one-line error (flows.cli.validation_errors)
                raise ValueError(f"{where} for {', '.join(unused)}, but online_rl is {self.online_rl!r}: they would "
                                 f"be ignored (a round runs one online-RL stage, here {self.online_rl}); to run "
                                 f"{unused[0]} instead give online_rl {unused[0]} (ppo_override runs it even while "
                                 "locked), or drop them")
        return self

    @model_validator(mode="after")
    def _slurm_only_with_the_slurm_launcher(self) -> "RoundParameters":
        """Slurm settings with ``launcher: local`` would be ignored silently: refuse them (defaults are fine)."""
        if self.launcher != "slurm" and "slurm" in self.model_fields_set and self.slurm != SlurmJob():
            raise ValueError(
                f"slurm settings given ({self.slurm.model_dump(exclude_defaults=True)}) but launcher is "
                f"{self.launcher!r}: they would be ignored; set launcher to 'slurm' or drop them"
            )
        return self


# stage names the pipeline used before (a recipe, --set or --force with one gets the new name in its error)
RENAMED_STAGES = {"reward": "reward_model", "reward-model": "reward_model"}


def _known_stage(stage: str) -> str:
    """``stage`` if it is a stage of the pipeline; else ValueError naming the stages (and the new name of a renamed
    one). The field it concerns is said by pydantic's error location (the CLI writes it as the option)."""
    if stage not in STAGES:
        import difflib

        close = difflib.get_close_matches(stage, list(STAGES), n=1)  # a typo: "grpoo", "sfft"
        hint = (f" (renamed {RENAMED_STAGES[stage]})" if stage in RENAMED_STAGES
                else f" (did you mean {close[0]!r}?)" if close else "")
        raise ValueError(f"unknown stage {stage!r}{hint}; stages: {', '.join(STAGES)}")
    return stage


def default_round_id(preset: str) -> str:
    """``<preset name>-<UTC date>`` (a preset given as a folder contributes its last part)."""
    return check_round_id(f"{Path(preset).name}-{_dt.datetime.now(_dt.timezone.utc):%Y%m%d}")


#: Recipe file names from before each recipe was named after its stage (a preset folder of yours may still have one).
OLD_RECIPE_NAMES = {"reward_model": "reward.yaml"}


def preset_folder(preset: str) -> Path:
    """The folder of recipes ``--preset`` names: a folder of yours that holds a stage's recipe
    (``<stage>.yaml``, or a file's old name), else the built-in ``recipes/<preset>``. A folder without one (a runs
    or work folder named ``demo`` or ``smoke`` in the current directory) does not hide the built-in preset."""
    p, builtin = Path(preset), REPO_ROOT / "recipes" / preset
    names = [f"{entry.name}.yaml" for entry in STAGES.values()] + list(OLD_RECIPE_NAMES.values())
    mine = p.is_dir() and (any((p / name).is_file() for name in names) or not builtin.is_dir())
    return p if mine else builtin


def _recipe(params: RoundParameters, stage: str) -> Path:
    """``recipes/<preset>/<stage>.yaml``, or the same file in a folder of yours (:func:`preset_folder`).

    Raises:
        FileNotFoundError: only the file's old name is there (``reward.yaml``, now ``reward_model.yaml``).
    """
    folder = preset_folder(params.preset)
    recipe = folder / f"{STAGES[stage].name}.yaml"
    old = OLD_RECIPE_NAMES.get(stage)
    if old and not recipe.is_file() and (folder / old).is_file():
        raise FileNotFoundError(f"{folder / old}: rename it {recipe.name} (recipe files are named after their stage)")
    return recipe


def stage_args(stage: str, params: RoundParameters, round_dir: Path, dirs: dict[str, str]) -> list[str]:
    """The command-line arguments the flow gives ``stage`` (before the user's overrides), from the output folders
    of the stages before it (``dirs``: stage name -> folder; ``candidate`` -> the candidate's folder).

    The reward-model stage gets no override: the unlock decision is the flow's (see the module docstring).
    """
    base = ["--model_name_or_path", params.base_model] if params.base_model else []
    unlock = ["--ppo_unlock_json", str(round_dir / UNLOCK_FILE)]
    # the training stages check their data against this round's gate suites (gate_suites_file)
    decon = ["--decontaminate_against", str((round_dir / GATE_SUITES_FILE).resolve())]
    # every online-RL stage: policy from DPO, KL to SFT's pi_ref, the round's reward model, the unlock decision
    online_rl = lambda: ["--sft_dir", dirs["sft"], "--policy_dir", dirs["dpo"], "--reward_model_dir",  # noqa: E731
                         dirs["reward_model"], *unlock, *tripwire_slice_args(params, round_dir, stage)]  # fmt: skip
    return {
        "sft": lambda: [*base, *decon],
        "dpo": lambda: ["--sft_dir", dirs["sft"], *decon],
        "reward_model": lambda: ["--sft_dir", dirs["sft"], *decon],
        "ppo": online_rl,
        # TRL's trainers read their prompts through the data loaders, so they are checked like the other rows
        "grpo": lambda: [*online_rl(), *decon, *round_gold_judge(params, "grpo")],
        "rloo": lambda: [*online_rl(), *decon, *round_gold_judge(params, "rloo")],
        # the runs folder: earlier rounds' round.json record the red-team versions they used (gates/redteam.py)
        "gates": lambda: ["--baseline_dir", dirs["sft"], "--candidate_dir", dirs["candidate"], "--reward_model_dir",
                          dirs["reward_model"], "--fail_on_block", "false", *unlock,
                          "--redteam_runs_dir", str(Path(params.runs_dir).resolve())],  # fmt: skip
    }[stage]()


#: The gate judge backends that can be an online-RL stage's gold check: they judge new answers and are not the
#: optimised reward model (``reward_model`` is; ``labels`` only knows the pairs of its file).
GOLD_JUDGE_BACKENDS = ("openai", "sequence_classifier")


def _effective_config(params: RoundParameters, stage: str) -> dict:
    """A stage's recipe with the user's overrides for it (values as given: strings from ``--set``)."""
    import yaml

    extra = params.overrides.get(stage, [])
    given = {k.removeprefix("--"): v for k, v in zip(extra[::2], extra[1::2])}
    return {**(yaml.safe_load(_recipe(params, stage).read_text()) or {}), **given}


def _tripwire_checks(cfg: dict) -> bool:
    """Whether an online-RL stage of this config makes tripwire checks: ``tripwire_steps`` not 0 and a step budget
    (``max_steps`` for TRL's, ``num_steps`` for PPO) of at least that many steps when one is set."""
    from rlhf.config import TripwireArguments

    steps = int(cfg.get("tripwire_steps", TripwireArguments.tripwire_steps))
    budget = int(cfg.get("max_steps", cfg.get("num_steps", 0)) or 0)
    return steps > 0 and not 0 < budget < steps


def round_gold_judge(params: RoundParameters, stage: str) -> list[str]:
    """``["--tripwire_gold_judge", <JSON>]``: the gates' judge as a TRL online-RL stage's gold check, when it is one
    of :data:`GOLD_JUDGE_BACKENDS`, that stage makes tripwire checks and its recipe and overrides name no gold check
    of their own (``tripwire_gold_judge``, ``tripwire_gold_model_path``); else []. The round trains no second reward
    model, so the round's own judge is the independent scorer it has (the default ``reward_model`` judge is the
    optimised reward model and gives no gold check).

    Raises:
        ValueError: the gates' judge is not a mapping (``rlhf.credentials.parse_mapping``) or holds a secret.
    """
    from rlhf.credentials import check_mapping, parse_mapping

    rl = _effective_config(params, stage)
    if rl.get("tripwire_gold_judge") or rl.get("tripwire_gold_model_path") or not _tripwire_checks(rl):
        return []
    judge = parse_mapping(_effective_config(params, "gates").get("judge"), where="gates.judge")
    if judge.get("backend") not in GOLD_JUDGE_BACKENDS:
        return []
    check_mapping(judge, "gates.judge")
    return ["--tripwire_gold_judge", json.dumps(judge, sort_keys=True)]


def tripwire_slice_file(params: RoundParameters, round_dir: Path) -> Path | None:
    """``<round_dir>/tripwire_slice.jsonl``: the prompts the round's online-RL tripwire answers at each check, when
    that stage makes checks and names no ``tripwire_prompts_data`` of its own; else None (and no file).

    They are a slice of the gates' win-rate suite (``winrate_data``) that the gates do not score
    (``gates.suites.held_back`` of the ``n_winrate`` the gates take): held out from training by decontamination,
    benign (a refusal is a false one), and disjoint from the prompts the release decision reads, so selecting
    the checkpoint on them does not select on the gate. ``tripwire_n_prompts`` of them; with the judge reward,
    only prompts that have a reference answer. Written atomically as native eval rows (``data.schemas.EvalPrompt``).

    Raises:
        data.validation.DataValidationError, OSError: the win-rate suite cannot be read.
    """
    from data.loaders import load_eval_prompts
    from gates.config import GateStageConfig
    from gates.suites import held_back
    from rlhf.config import TripwireArguments

    stage = params.online_rl
    rl = _effective_config(params, stage)
    path = round_dir / TRIPWIRE_SLICE_FILE
    if rl.get("tripwire_prompts_data") or not _tripwire_checks(rl):
        path.unlink(missing_ok=True)
        return None
    gates = _effective_config(params, "gates")
    rows = list(load_eval_prompts(gates.get("winrate_data", GateStageConfig.winrate_data)))
    n_measured = int(gates.get("n_winrate", GateStageConfig.n_winrate))
    reward_functions = rl.get("reward_functions") or []
    if isinstance(reward_functions, str):
        reward_functions = [reward_functions]
    # the judge reward compares each answer with its prompt's reference: then only prompts that have one
    needs_reference = "judge" in reward_functions
    slice_ = held_back(rows, n_measured, int(rl.get("tripwire_n_prompts", TripwireArguments.tripwire_n_prompts)),
                       keep=lambda r: bool(r.reference) or not needs_reference)
    if not slice_:
        path.unlink(missing_ok=True)
        return None
    atomic_write_text(path, "".join(dumps_strict(r.model_dump(exclude_none=True)) + "\n" for r in slice_))
    return path.resolve()


def tripwire_slice_args(params: RoundParameters, round_dir: Path, stage: str) -> list[str]:
    """``["--tripwire_prompts_data", <the slice file>]`` for the round's online-RL stage when the flow wrote one
    (:func:`tripwire_slice_file`), else []."""
    path = round_dir / TRIPWIRE_SLICE_FILE
    if stage != params.online_rl or not path.is_file():
        return []
    return ["--tripwire_prompts_data", str(path.resolve())]


def decide_unlock(params: RoundParameters, rm: StageRun, round_dir: Path) -> dict:
    """The PPO unlock decision from the reward-model stage's recorded measurements (``judging.unlock``), with the
    flow's override; written to ``<round_dir>/ppo_unlock.json`` (atomically) and returned as a dict.

    Raises:
        ValueError: the reward-model manifest lacks the measurements, or an override without a reason.
    """
    decision = decide_from_metrics(
        rm.manifest.get("metrics", {}),
        override=params.ppo_override,
        override_reason=params.ppo_override_reason,
    )
    unlock = decision.to_dict()
    atomic_write_text(round_dir / UNLOCK_FILE, dump(unlock))
    return unlock


# Retries: none on a task that trains (a retry would train again from scratch, or twice at once); publishing
# artifacts is I/O to the Prefect API and is retried (tests/test_launch.py checks every task's setting).
@task(cache_policy=NO_CACHE, task_run_name="{stage}", retries=0)
def stage_task(
    stage: str, params: RoundParameters, round_dir: Path, dirs: dict[str, str], parents: list[StageRun]
) -> StageRun:
    logger = get_run_logger()
    args = [*stage_args(stage, params, round_dir, dirs), "--round_id", round_dir.name, *params.overrides.get(stage, [])]
    return run_stage(
        stage,
        STAGES[stage].module,
        _recipe(params, stage),
        round_dir / stage,
        extra_args=args,
        parents=parents,
        accelerate_config=params.accelerate_config,
        force=stage in params.force,
        log=logger.info,
        log_at=logger.log,
        runs_dir=params.runs_dir,
        launcher=slurm_launcher(params.slurm, stage, round_dir.name) if params.launcher == "slurm" else None,
    )


def gate_suites_file(params: RoundParameters, round_dir: Path) -> Path:
    """``<round_dir>/gate_suites.yaml``: the gate suites this round's gates will use (the gates recipe's ``*_data``
    keys with the user's gates overrides applied), for the training stages' decontamination."""
    import yaml

    from data.decontamination import SUITE_KEYS

    cfg = yaml.safe_load(_recipe(params, "gates").read_text()) or {}
    extra = params.overrides.get("gates", [])
    given = {k.removeprefix("--"): v for k, v in zip(extra[::2], extra[1::2])}
    suites = {k: given.get(k, cfg.get(k)) for k in SUITE_KEYS if given.get(k, cfg.get(k))}
    path = round_dir / GATE_SUITES_FILE
    atomic_write_text(path, yaml.safe_dump(suites, sort_keys=True))
    return path.resolve()


def checked_stages(params: RoundParameters) -> list[str]:
    """The stages whose recipes are checked before a round starts: all but the online-RL ones, of which only the
    round's own (``online_rl``) may run; it is checked when the override makes it run for sure, or when an override
    names it (a mistyped ``--set grpo.key`` is said now, not when the unlock rule lets the stage start, or never).
    Overrides for another online-RL stage are refused by :class:`RoundParameters`."""
    return [name for name in STAGES
            if name not in ONLINE_RL_STAGES or name in params.overrides
            or (name == params.online_rl and params.ppo_override)]


def check_judge_endpoints(params: RoundParameters) -> int:
    """Ask each OpenAI-compatible endpoint judge the round will call who it is, once, before anything trains
    (:func:`flows.stages.check_endpoint_judges`): the gates' judges (measured again when the gate stage's cache key
    is computed, after SFT, DPO and the reward model trained), and the round's online-RL stage's ``reward_judge`` and
    ``tripwire_gold_judge`` (its own, or the gates' judge :func:`round_gold_judge` passes it: the same endpoint,
    asked once). Returns the number of endpoints asked.

    Raises:
        ValueError: an endpoint does not answer (one line: the recipe key, its base_url, the reason) or a judge
            mapping is malformed.
    """
    from .stages import check_endpoint_judges

    seen: set = set()
    asked = check_endpoint_judges("gates", _recipe(params, "gates"), params.overrides.get("gates", []), seen)
    stage = params.online_rl
    # PPO is rewarded by the round's reward model alone (its gold check is a reward model); a missing recipe of a
    # stage that may never run is said when it starts, as before
    if stage != "ppo" and _recipe(params, stage).is_file():
        extra = [*round_gold_judge(params, stage), *params.overrides.get(stage, [])]
        asked += check_endpoint_judges(stage, _recipe(params, stage), extra, seen)
    return asked


def online_rl_stage(params: RoundParameters, unlock: dict) -> str | None:
    """The online-RL stage this round runs after DPO: ``params.online_rl`` when the unlock decision says unlocked
    (the rule, or the recorded override), else None (the DPO policy stays the candidate)."""
    return params.online_rl if unlock["unlocked"] else None


def check_recipes(params: RoundParameters, stages: list[str]) -> None:
    """Every stage's recipe and overrides parse, and named data files exist, before anything trains.

    Raises:
        FileNotFoundError: a stage's recipe is missing; ValueError: a recipe or override key is unknown or renamed,
            a value does not parse, a named data file is missing (the message names the stage, file and key).
    """
    for stage in stages:
        recipe = _recipe(params, stage)
        if not recipe.is_file():
            raise FileNotFoundError(f"{recipe}: no such recipe for stage {stage} (preset {params.preset!r})")
        check_stage_config(stage, recipe, params.overrides.get(stage, []))


@task(cache_policy=NO_CACHE, task_run_name="check-recipes", retries=0)
def check_recipes_task(params: RoundParameters, stages: list[str]) -> None:
    """:func:`check_recipes` as the round's first task (a deployment's run checks its recipes on its worker)."""
    check_recipes(params, stages)


def flow_run_name() -> str:
    """The flow run's name: the round id (the default one, ``<preset>-<UTC date>``, when none is given), so a round
    is found by its id in Prefect's run lists."""
    from prefect.runtime import flow_run

    params = flow_run.parameters.get("params") or {}
    if isinstance(params, RoundParameters):
        params = params.model_dump()
    try:
        return params.get("round_id") or default_round_id(params.get("preset") or "demo")
    except ValueError:  # an id the flow will refuse: the run still needs a name to say so under
        return "rlhf-round"


@flow(name="rlhf-round", flow_run_name=flow_run_name, log_prints=True)
def rlhf_round(params: RoundParameters = RoundParameters()) -> State:
    """One round; its final state carries the round manifest (also written to ``<runs_dir>/<round_id>/round.json``):
    use :func:`run_round` to get it back, or ``rlhf_round(params, return_state=True)``.

    The flow run is named after the round id and tagged ``preset:<preset>``, ``launcher:<launcher>`` and, at the
    end, ``verdict:pass`` / ``verdict:block``, or ``error:<stage>`` (``error:input`` before any stage). It ends
    ``Completed`` (the release passes) or ``Failed`` (the gates block it), with the verdict's reasons as the state
    message, or ``Crashed`` with the error when the round broke (flows/artifacts.py says why these three). With
    ``approval: required`` the release decision decides instead (flows/approval.py): approved -> ``Completed``
    (who approved, the waivers), rejected or timed out -> ``Failed``; tag ``approval:<decision>``.
    """
    logger = get_run_logger()
    folder = preset_folder(params.preset)
    preset = folder.name if folder == Path(params.preset) else params.preset
    add_flow_run_tags(f"preset:{preset}", f"launcher:{params.launcher}", log=logger)
    try:
        manifest, gates_report = _locked_round(params)
    except Exception as err:  # noqa: BLE001 - every error ends the run Crashed, never as if it were a verdict
        add_flow_run_tags(f"error:{err.stage}" if isinstance(err, StageFailed) else "error:input", log=logger)
        logger.error("round broke: %s", err)
        return error_state(err)
    approval = manifest["approval"]
    add_flow_run_tags(f"verdict:{manifest['verdict']}", *([f"approval:{approval['decision']}"]
                                                          if params.approval == "required" else []), log=logger)
    return release_state(gates_report, approval, manifest)


def run_round(params: RoundParameters) -> dict:
    """Run :func:`rlhf_round` and return the round manifest, whatever the verdict.

    Raises:
        the round's own error when it broke: ValueError (an unsafe round id, a bad parameter), FileNotFoundError
        (a recipe), rlhf.rundir.RoundError (another round holds the folder), flows.stages.StageFailed (a stage).
    """
    return round_result(rlhf_round(params, return_state=True))


def _locked_round(params: RoundParameters) -> tuple[dict, dict]:
    """Checks, the lock, the round; returns (the round manifest, the gate report's JSON)."""
    if params.flywheel_data:  # the flywheel's expert pairs become this round's DPO / reward-model data
        from .flywheel import round_overrides

        merged = {k: list(v) for k, v in params.overrides.items()}
        for stage, args in round_overrides(params.flywheel_data).items():
            merged[stage] = [*args, *merged.get(stage, [])]  # explicit --set overrides still win (they come last)
        params = params.model_copy(update={"overrides": merged})
        get_run_logger().info("flywheel data %s: overrides %s", params.flywheel_data, merged)
    round_id = check_round_id(params.round_id) if params.round_id else default_round_id(params.preset)
    round_dir = Path(params.runs_dir) / round_id
    # Parameters and recipes are checked before the round's folder exists: a typo leaves nothing behind.
    unknown = set(params.overrides) - set(STAGES)
    if unknown:
        raise ValueError(f"overrides for unknown stage(s) {sorted(unknown)}; stages: {', '.join(STAGES)}")
    if params.ppo_override and not (params.ppo_override_reason or "").strip():
        raise ValueError("ppo_override needs a ppo_override_reason (who/why); it is recorded with the decision")
    if params.ppo_override_reason and not params.ppo_override:
        raise ValueError("ppo_override_reason given without ppo_override; set ppo_override to run PPO anyway")
    # the stages' warm interpreter imports beside the recipe checks (started already where the CLI runs the round)
    prestart_local_stages(params.accelerate_config, params.launcher)
    # the online-RL stage's recipe is checked up front only when the override makes it run for sure
    check_recipes_task(params, checked_stages(params))
    # One round per folder: the lock is held until this process exits (a second round fails at once, naming us).
    with RoundLock(round_dir, round_id):
        return _round(params, round_id, round_dir)


def _round(params: RoundParameters, round_id: str, round_dir: Path) -> dict:
    logger = get_run_logger()
    # round.json is written last, and the W&B report specification after it: while a round runs (or after it
    # failed) there is none that could pass for it.
    (round_dir / "round.json").unlink(missing_ok=True)
    from .wandb_report import SPEC_FILE

    (round_dir / SPEC_FILE).unlink(missing_ok=True)
    (round_dir / UNLOCK_FILE).unlink(missing_ok=True)  # this round's decision, never a stale one
    # the waivers the previous round (the gates' drift reference) was released under: an expired one is flagged
    previous = previous_waivers(previous_round_json(params.overrides.get("gates", [])))
    for w in previous:
        if w["expired"]:
            logger.warning("waiver of gate %s (round %s, by %s) EXPIRED on %s", w["gate"], w["round_id"],
                           w["approver"], w["expires"])

    # Training data is checked against every gate suite of this round before a stage trains: a gate scored on
    # prompts a model trained on measures memory, not the model.
    gate_suites_file(params, round_dir)
    # the online-RL tripwire watches win-rate prompts the gates do not score (held out from training as above)
    tripwire_slice_file(params, round_dir)
    dirs: dict[str, str] = {}
    sft = stage_task("sft", params, round_dir, dirs, [])
    dirs["sft"] = sft.output_dir
    dpo = stage_task("dpo", params, round_dir, dirs, [sft])
    dirs["dpo"] = dpo.output_dir
    rm = stage_task("reward_model", params, round_dir, dirs, [sft])
    dirs["reward_model"] = rm.output_dir
    unlock = decide_unlock(params, rm, round_dir)
    logger.info(
        "online-RL (%s) unlock: %s (RM agreement %s vs inter-annotator %s%s)",
        params.online_rl,
        unlock["unlocked"],
        unlock["rm_agreement"],
        unlock["inter_annotator_agreement"],
        f"; OVERRIDE: {unlock['override_reason']}" if unlock["overridden"] else "",
    )

    runs = [sft, dpo, rm]
    candidate = dpo
    online = online_rl_stage(params, unlock)
    if online is not None:
        rl = stage_task(online, params, round_dir, dirs, [sft, dpo, rm])
        runs.append(rl)
        candidate = rl
    dirs["candidate"] = candidate.output_dir
    gates = stage_task("gates", params, round_dir, dirs, [sft, candidate, rm])
    runs.append(gates)

    verdict = gates.manifest["outputs"]["verdict"]
    manifest = {
        "round_id": round_id,
        "preset": params.preset,
        "candidate": candidate.stage,
        "online_rl": params.online_rl,
        "verdict": verdict,
        "ppo_unlock": unlock,
        "ppo_unlock_json": str(round_dir / UNLOCK_FILE),
        "ppo_override_reason": unlock["override_reason"],
        "stages": {
            r.stage: {
                "output_dir": r.output_dir,
                "cache_key": r.cache_key,
                "cached": r.cached,
                "seconds": r.seconds,
                "rerun_seconds": r.rerun_seconds,
                "outputs": r.manifest.get("outputs", {}),
            }
            for r in runs
        },
        "gate_report": gates.manifest["outputs"].get("report_md"),
        # which red-team suite version measured this round (seed, size, removed by decontamination); the next
        # rounds count its reuse from here
        "redteam_suite": gates.manifest["outputs"].get("redteam_suite"),
    }
    # the artifacts first: the release manager reads the gate report in the UI while the run waits for a decision
    publish_task(round_id, runs, gates, unlock, verdict)
    outputs = gates.manifest["outputs"]
    gates_report = json.loads(Path(outputs["report_json"]).read_text())
    approval = release_approval(gates_report, mode=params.approval, timeout_s=params.approval_timeout_s,
                                bypass=params.approval_bypass, log=logger)
    manifest["approval"] = {**approval, "previous_waivers": previous}
    manifest["release"] = approval["release"]
    write_to_report(outputs["report_md"], outputs["report_json"], approval, previous)
    manifest = strict_json(manifest)  # what is returned is what round.json holds: strict JSON
    atomic_write_text(round_dir / "round.json", dump(manifest))
    if params.approval == "required" or previous:
        publish_approval_task(round_id, gates, manifest["approval"])
    logger.info("round %s: verdict %s, release %s (report %s)", round_id, verdict.upper(),
                manifest["release"].upper(), manifest["gate_report"])
    wandb_report_task(round_dir, manifest, runs)
    return manifest, gates_report


def publish_gate_report(round_id: str, gates: StageRun, description: str) -> None:
    """The gate report as the round's markdown artifact (``gate-report-<key>``), its plots embedded; published
    again once an approval has added its section."""
    report = Path(gates.manifest["outputs"]["report_md"])
    create_markdown_artifact(key=artifact_key("gate-report", round_id),
                             markdown=embed_images(report.read_text(), report.parent), description=description)


@task(cache_policy=NO_CACHE, task_run_name="publish-approval", retries=3, retry_delay_seconds=5)
def publish_approval_task(round_id: str, gates: StageRun, approval: dict) -> None:
    """The gate-report artifact again (now with its "Release approval" section) and the approval as a table."""
    publish_gate_report(round_id, gates,
                        f"Release verdict of round {round_id}: {approval['gate_verdict']}, release {approval['release']}")
    create_table_artifact(
        key=artifact_key("release-approval", round_id),
        table=[{"decision": approval["decision"], "release": approval["release"], "approver": approval.get("approver"),
                "reason": approval.get("reason") or approval.get("bypass_reason"), "gate_verdict": approval["gate_verdict"],
                "waivers": "; ".join(f"{w['gate']} by {w['approver']} until {w['expires']}: {w['reason']}"
                                     for w in approval["waivers"]) or None,
                "expired_previous_waivers": "; ".join(f"{w['gate']} ({w['round_id']}, {w['expires']})"
                                                      for w in approval["previous_waivers"] if w["expired"]) or None}],
        description=f"Release approval, round {round_id}",
    )


@task(cache_policy=NO_CACHE, task_run_name="wandb-report", retries=3, retry_delay_seconds=5)
def wandb_report_task(round_dir: Path, manifest: dict, runs: list[StageRun]) -> Path | None:
    """The round's W&B Report (flows/wandb_report.py) when the gate stage logged to W&B: saved online, its
    specification written to ``<round_dir>/wandb_report.json`` either way. Returns the specification's path."""
    from flows.wandb_report import write_round_report

    if not any((Path(r.output_dir) / "wandb").is_dir() for r in runs if r.stage == "gates"):
        return None  # --report_to none (or W&B disabled): no runs to report on
    return write_round_report(round_dir, manifest)


@task(cache_policy=NO_CACHE, task_run_name="publish", retries=3, retry_delay_seconds=5)
def publish_task(round_id: str, runs: list[StageRun], gates: StageRun, unlock: dict, verdict: str) -> None:
    """Prefect artifacts: the verdict report, the gate table (its judged gates' rows name the judge), the judge,
    the stage table."""
    publish_gate_report(round_id, gates, f"Release verdict of round {round_id}: {verdict}")
    create_table_artifact(
        key=artifact_key("gates", round_id),
        table=ordered_rows(gates.manifest["outputs"].get("gate_summary") or gates.manifest["outputs"]["gate_table"]),
        description=f"Gates of round {round_id}",
    )
    axis_rows = gates.manifest["outputs"].get("axis_table")
    if axis_rows:  # the gates grouped by the rubric's quality axes, each axis's verdict
        create_table_artifact(key=artifact_key("axes", round_id), table=ordered_rows(axis_rows, ("axis",)),
                              description=f"Quality axes of round {round_id}")
    for gate, rows in (gates.manifest["outputs"].get("gate_tables") or {}).items():
        if rows:
            create_table_artifact(
                key=artifact_key(f"gate-{gate.replace('_', '-')}", round_id),
                table=ordered_rows(rows),
                description=f"{gate} table, round {round_id}",
            )
    judge = gates.manifest["outputs"].get("judge")
    if judge:  # which judge decided the win-rate gates, its agreement, 2a-1, position consistency, corrected gap
        create_table_artifact(key=artifact_key("judge", round_id), table=[judge],
                              description=f"The judge of round {round_id}")
    create_table_artifact(
        key=artifact_key("stages", round_id), table=ordered_rows(summarize(runs), ("stage",)),
        description=f"Stages of round {round_id}",
    )
    create_table_artifact(
        key=artifact_key("ppo-unlock", round_id),
        table=[
            {
                k: unlock.get(k)
                for k in (
                    "unlocked",
                    "rule_verdict",
                    "rm_agreement",
                    "rm_n",
                    "rm_n_eff",
                    "inter_annotator_agreement",
                    "iaa_n",
                    "iaa_n_eff",
                    "margin",
                    "comparison",
                    "overridden",
                    "override_reason",
                )
            }
        ],
        description=f"PPO unlock decision, round {round_id}",
    )
