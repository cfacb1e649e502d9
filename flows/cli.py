"""The ``rlhf`` command: a round, or one stage at a time.

rlhf round --preset demo                 # a full round (Prefect flow) on the embedded default
rlhf sft --config recipes/demo/sft.yaml  # one stage, in this process (same as accelerate launch -m sft.train)
rlhf gates --candidate runs/r/dpo --baseline runs/r/sft --reward-model runs/r/reward_model
                                         # exits non-zero when the release is blocked
rlhf judge agreement --judge openai --model M --base-url http://127.0.0.1:8000/v1 -n 200
                                         # a judge's agreement with PandaLM's annotators
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from rlhf.entrypoint import BLOCKED_EXIT_CODE
from rlhf.manifest import dumps_strict
from rlhf.registry import STAGES

app = typer.Typer(
    help="rlhf-flywheel: SFT -> pi_ref -> DPO -> reward model -> gated online RL (PPO, GRPO or RLOO) -> release gates.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    # click's plain output: a usage error is one "Error: ..." line that a log or a CI step shows whole (rich's
    # framed box wraps it to the terminal's width, over several lines)
    rich_markup_mode=None,
)
_PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


@app.command("round")
def round_cmd(
    preset: Annotated[str, typer.Option(help="smoke | demo, or a folder of recipes.")] = "demo",
    round_id: Annotated[Optional[str], typer.Option(help="Round id (default <preset>-<date>).")] = None,
    runs_dir: Annotated[str, typer.Option(help="Where round directories go.")] = "runs",
    base_model: Annotated[
        Optional[str], typer.Option(help="Base model: smollm2-135m, tiny, .gguf, dir or hub id.")
    ] = None,
    set_: Annotated[
        Optional[list[str]], typer.Option("--set", metavar="STAGE.KEY=VALUE", help="Stage override (repeatable).")
    ] = None,
    online_rl: Annotated[
        str, typer.Option(help="ppo | grpo | rloo: the online-RL stage run after DPO when unlocked.")
    ] = "ppo",
    ppo_override: Annotated[
        Optional[str], typer.Option(help="Run the online-RL stage even if locked; the value is the recorded reason.")
    ] = None,
    accelerate_config: Annotated[Optional[str], typer.Option(help="accelerate config file.")] = None,
    force: Annotated[Optional[list[str]], typer.Option(metavar="STAGE",
                                                       help="Rerun this stage even if cached (repeatable).")] = None,
    flywheel_data: Annotated[
        Optional[str], typer.Option(help="Flywheel dataset version dir: its pairs train DPO and the reward model.")
    ] = None,
    launcher: Annotated[
        str, typer.Option(help="local | slurm (each stage an sbatch job; flows/launch/slurm.py).")
    ] = "local",
    slurm: Annotated[
        Optional[str], typer.Option(help='Slurm job as JSON, e.g. \'{"nodes": 2, "partition": "gpu"}\' (SlurmJob).')
    ] = None,
    approval: Annotated[
        str, typer.Option(help="none | required (pause after the gates for a release decision in the Prefect UI).")
    ] = "none",
    approval_timeout: Annotated[
        Optional[int], typer.Option(help="Seconds to wait for the release decision (then rejected).")
    ] = None,
    approval_bypass: Annotated[
        Optional[str], typer.Option(help="Skip a required approval (CI); the value is the recorded reason.")
    ] = None,
) -> None:
    """Run one round as a Prefect flow. Exit code 0: release passes; 3: the gates block it; 1: a stage failed;
    2: a bad argument (said before anything runs); 130: interrupted (Ctrl-C / SIGTERM: the running stage is
    stopped, nothing is left that looks finished)."""
    from rlhf.entrypoint import skip_collection_at_exit
    from rlhf.round_id import check_round_id
    from rlhf.rundir import RoundError

    skip_collection_at_exit()  # torch, TRL and Prefect are imported below: their objects need no last collection

    if round_id is not None:
        try:  # before anything trains (and before Prefect is imported): a bad id is a usage error (exit 2)
            check_round_id(round_id)
        except ValueError as err:
            raise typer.BadParameter(str(err), param_hint="--round-id") from None
    overrides = parse_set(set_ or [])
    from rlhf.credentials import check_args

    try:  # a secret given as a value: refused in one line, before Prefect records any parameter
        for stage, args in overrides.items():
            check_args(args, stage)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--set") from None

    if launcher not in ("local", "slurm"):  # said here: the parameters do not echo their input (it may be a secret)
        raise typer.BadParameter(f"{launcher!r} is not one of 'local', 'slurm'", param_hint="--launcher")
    from flows.stages import prestart_local_stages

    # The warm interpreter the stages fork from imports torch, TRL, ... on the other core while the checks below run
    prestart_local_stages(accelerate_config, launcher)
    from flows.interrupt import INTERRUPTED_EXIT_CODE, install_signal_handlers
    from flows.round import RoundParameters, run_round
    from pydantic import ValidationError
    try:
        slurm_job = {"slurm": json.loads(slurm)} if slurm else {}
        RoundParameters(launcher=launcher, **slurm_job)
    except ValidationError as err:  # a bad field: a usage error (exit 2), named
        raise typer.BadParameter(validation_errors(err)) from None
    except ValueError as err:  # bad JSON
        raise typer.BadParameter(f"not JSON: {err}", param_hint="--slurm") from None
    try:  # a bad field (an unknown stage in --set or --force, ...): a usage error (exit 2), one line
        params = RoundParameters(
            preset=preset,
            round_id=round_id,
            runs_dir=runs_dir,
            base_model=base_model,
            overrides=overrides,
            online_rl=online_rl,
            ppo_override=ppo_override is not None,
            ppo_override_reason=ppo_override,
            accelerate_config=accelerate_config,
            force=force or [],
            flywheel_data=flywheel_data,
            launcher=launcher,
            approval=approval,
            approval_bypass=approval_bypass,
            **({"approval_timeout_s": approval_timeout} if approval_timeout is not None else {}),
            **slurm_job,
        )
    except ValidationError as err:  # each error names its option; pydantic's messages do not repeat the input
        raise typer.BadParameter(validation_errors(err)) from None
    from flows.round import check_recipes, checked_stages
    from flows.stages import StageFailed
    from rlhf.machine import ALLOCATOR_ENV, NATIVE_BF16_ENV, allocator_env, native_bf16

    try:  # every stage resolves its precision through it: a bad value is the environment's, not a recipe's
        native_bf16()
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint=NATIVE_BF16_ENV) from None
    try:  # every stage process starts with it (flows.stages.stage_env)
        allocator_env()
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint=ALLOCATOR_ENV) from None
    try:  # a recipe typo or a mistyped --set key is a usage error (exit 2), said before Prefect starts
        check_recipes(params, checked_stages(params))
    except (ValueError, FileNotFoundError) as err:
        raise typer.BadParameter(str(err), param_hint="--preset/--set") from None
    if accelerate_config and not Path(accelerate_config).is_file():  # found by the first stage otherwise
        raise typer.BadParameter(f"{accelerate_config}: no such accelerate config", param_hint="--accelerate-config")
    if flywheel_data:
        from flows.flywheel import round_overrides

        try:  # the dataset version's manifest, read again by the flow; here a bad one is said before Prefect starts
            round_overrides(flywheel_data)
        except (ValueError, OSError) as err:
            raise typer.BadParameter(str(err), param_hint="--flywheel-data") from None
    if base_model:
        from rlhf.models import check_base_model_spec

        try:  # a missing path or an uncached hub id: said before Prefect starts, not as exit 1 from the first stage
            check_base_model_spec(base_model)
        except (ValueError, FileNotFoundError) as err:
            raise typer.BadParameter(str(err), param_hint="--base-model") from None
    from rlhf.rundir import check_writable_folder

    try:  # a read-only or unwritable runs folder: said before Prefect starts, not as a traceback after it
        if round_id:
            check_writable_folder(Path(runs_dir) / round_id, "round folder")
        else:
            check_writable_folder(runs_dir)
    except RoundError as err:
        raise typer.BadParameter(str(err), param_hint="--runs-dir") from None
    from flows.round import check_judge_endpoints

    try:  # a judge endpoint that does not answer: said now, not when the gates' cache key is computed after training
        check_judge_endpoints(params)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--preset/--set") from None
    check_prefect_api()
    install_signal_handlers()
    try:
        manifest = run_round(params)
    except (StageFailed, RoundError, ValueError, OSError) as err:  # one line with the reason (a full disk, ...)
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1)
    except KeyboardInterrupt as err:
        typer.echo(f"error: round interrupted ({err or 'SIGINT'}); the running stage was stopped", err=True)
        raise typer.Exit(INTERRUPTED_EXIT_CODE)
    typer.echo(dumps_strict({k: manifest.get(k) for k in ("round_id", "verdict", "candidate", "gate_report", "release")},
                           indent=2))
    release = manifest.get("release", manifest["verdict"])  # the release decision (approval) over the gates' verdict
    if release != "pass":
        typer.echo(f"release BLOCKED (exit {BLOCKED_EXIT_CODE}); see {manifest['gate_report']}", err=True)
    raise typer.Exit(0 if release == "pass" else BLOCKED_EXIT_CODE)


def parse_set(items: list[str]) -> dict[str, list[str]]:
    """``--set STAGE.KEY=VALUE`` items as each stage's command-line words: ``{stage: ["--key", value words...]}``
    (:func:`_set_values`), in the order given.

    Raises:
        typer.BadParameter: an item is not ``stage.key=value``, or a list value is malformed.
    """
    overrides: dict[str, list[str]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        stage, dot, name = key.partition(".")
        if not sep or not dot:
            raise typer.BadParameter(f"--set {item!r}: expected stage.key=value, e.g. dpo.beta=0.2")
        overrides.setdefault(stage, []).extend([f"--{name}", *_set_values(value)])
    return overrides


def _set_values(value: str) -> list[str]:
    """The command-line words of one ``--set`` value: a JSON list of numbers or strings (``[5, 10, 20]``, a list
    field such as ``gates.consistency_depths`` or ``grpo.reward_functions``) becomes one word per item, as the
    stage's parser takes a list; anything else (a JSON object such as ``grpo.reward_judge={...}``) is one word."""
    if value.lstrip().startswith("["):
        try:
            items = json.loads(value)
        except ValueError:
            raise typer.BadParameter(f"{value!r}: a value starting with '[' must be a JSON list, e.g. [5, 10]",
                                     param_hint="--set") from None
        if not isinstance(items, list) or not items or any(isinstance(x, (list, dict)) or x is None for x in items):
            raise typer.BadParameter(f"{value!r}: a list value must hold numbers or strings, at least one",
                                     param_hint="--set")
        return [json.dumps(x) if isinstance(x, bool) else str(x) for x in items]
    return [value]


#: Round parameters whose command-line option is not ``--`` + the field's name with dashes.
_OPTION_OF_FIELD = {"overrides": "--set", "ppo_override_reason": "--ppo-override",
                    "approval_timeout_s": "--approval-timeout"}


def _option(field: str) -> str:
    return _OPTION_OF_FIELD.get(field, "--" + field.replace("_", "-"))


def validation_errors(err: Any) -> str:
    """A pydantic ``ValidationError`` of ``RoundParameters`` as one line, each error led by the option it concerns
    (``--online-rl: Input should be 'ppo', 'grpo' or 'rloo'``; a nested field after its option: ``--slurm nodes:``).
    An error about several fields (a model validator's) has their names written as options (``--launcher``). The
    input values are not repeated (one may be a secret)."""
    import re

    from flows.round import RoundParameters

    fields = "|".join(sorted(RoundParameters.model_fields, key=len, reverse=True))
    parts = []
    for e in err.errors():
        msg = e["msg"].removeprefix("Value error, ")
        loc = [str(x) for x in e.get("loc", ())]
        if loc:
            msg = f"{' '.join([_option(loc[0]), *loc[1:]])}: {msg}"
        else:  # words that are field names (launcher, online_rl, force, ...) said as the options the user typed
            msg = re.sub(rf"(?<![\w'\"-])({fields})(?![\w'\"-])", lambda m: _option(m.group(1)), msg)
        parts.append(msg)
    return "; ".join(parts)


def check_prefect_api(timeout_s: float = 10.0) -> None:
    """With a Prefect API configured (``PREFECT_API_URL``, from the environment or the profile), check that it
    answers before the round starts; without one, Prefect starts a temporary local server and there is nothing to
    check.

    Raises:
        typer.Exit(2): the API does not answer (connection refused, DNS, timeout), with one line saying so and how to
            fix it. An HTTP error status (e.g. 401 from a cloud workspace) is an answer: Prefect reports it itself.
    """
    from urllib.parse import urlsplit, urlunsplit

    import httpx
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        return
    parts = urlsplit(url)
    shown = urlunsplit(parts._replace(netloc=(parts.hostname or "") + (f":{parts.port}" if parts.port else "")))  # no userinfo
    try:
        httpx.get(url.rstrip("/") + "/health", timeout=timeout_s)
    except httpx.TransportError as err:
        typer.echo(f"error: the Prefect API at {shown} does not answer ({type(err).__name__}); start it "
                   "(`prefect server start`) or unset PREFECT_API_URL to run on a temporary local server", err=True)
        raise typer.Exit(2) from None


def _stage_help(name: str) -> str:
    """Our own fields of a stage config (TRL's hundreds are accepted too; `python -m <module> --help` lists all)."""
    import dataclasses

    entry = STAGES[name]
    lines = [
        f"Usage: rlhf {name} --config recipes/<preset>/{name}.yaml --output_dir DIR [--key value ...]",
        "",
        "Pipeline fields (plus every field of TRL's config, where the stage has one):",
    ]
    for config in entry.config_classes():
        trl_base = next((c for c in config.__mro__ if c.__module__.startswith("trl.")), None)
        trl_fields = {f.name: f.default for f in dataclasses.fields(trl_base)} if trl_base else {}
        for f in dataclasses.fields(config):
            if f.name not in trl_fields or f.default != trl_fields[f.name]:
                lines.append(f"  --{f.name:<28} {f.metadata.get('help', '')}")
    lines.append(f"\nAll arguments: python -m {entry.module} --help")
    return "\n".join(lines)


def _run_stage_main(main, args: list[str]):
    """``main(args)`` of a stage run by hand, its bad input said in one line as ``rlhf round`` and ``rlhf gates``
    say it (the traceback stays in the stage's own log handlers, not on the terminal).

    Raises:
        typer.Exit(2): a folder the stage may not clear, or a secret given as a value (rlhf.credentials).
        typer.Exit(1): a bad data row (data.validation.DataValidationError: file, row, field, reason), a bad value
            (ValueError) or a missing or unreadable file (OSError).
    """
    from data.validation import DataValidationError
    from rlhf.credentials import SecretValueError
    from rlhf.rundir import RoundError

    try:
        return main(args)
    except (RoundError, SecretValueError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    except (DataValidationError, ValueError, OSError) as err:
        typer.echo(f"error: {type(err).__name__}: {err}", err=True)
        raise typer.Exit(1) from None


def _stage(name: str):
    module = STAGES[name].module

    def run(ctx: typer.Context) -> None:
        import importlib

        if {"-h", "--help"} & set(ctx.args):
            typer.echo(_stage_help(name))
            return
        _run_stage_main(importlib.import_module(module).main, ctx.args)

    run.__doc__ = f"Run the stage {module} in this process; arguments go to its parser (--config FILE, --key value)."
    return run


for _name, _entry in STAGES.items():
    if _name != "gates":  # `rlhf gates` has its own options (below): candidate, baseline, judge
        app.command(_name, context_settings=_PASSTHROUGH)(_stage(_name))


@app.command("gates", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def gates_cmd(
    ctx: typer.Context,
    candidate: Annotated[str, typer.Option(help="Candidate stage dir (with manifest) or checkpoint dir.")],
    baseline: Annotated[str, typer.Option(help="Baseline stage dir (with manifest) or checkpoint dir.")],
    reward_model: Annotated[
        Optional[str],
        typer.Option(help="Reward-model stage dir or checkpoint (the default judge; optional with --judge '{...}').")
    ] = None,
    config: Annotated[str, typer.Option(help="Gate recipe.")] = str(
        Path(__file__).resolve().parent.parent / "recipes" / "demo" / "gates.yaml"
    ),
    output_dir: Annotated[str, typer.Option(help="Where the report goes.")] = "runs/gates",
) -> None:
    """Run the release gates; exit code 3 when the release is blocked (CI fails), 0 when it passes."""
    import importlib

    from data.validation import DataValidationError
    from rlhf.credentials import SecretValueError
    from rlhf.rundir import RoundError

    gates_main = importlib.import_module(STAGES["gates"].module).main
    try:
        code = gates_main(
            [
                "--config",
                config,
                "--candidate_dir",
                candidate,
                "--baseline_dir",
                baseline,
                *(["--reward_model_dir", reward_model] if reward_model else []),
                "--output_dir",
                output_dir,
                *ctx.args,
            ]
        )
    except (RoundError, SecretValueError) as err:  # a folder it may not clear, a secret given as a value: refused
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    except (DataValidationError, ValueError, FileNotFoundError) as err:  # a bad or missing input: one line
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from None
    raise typer.Exit(code)


judge_app = typer.Typer(help="Pairwise judges: qualify one against expert labels before trusting it.",
                        no_args_is_help=True, rich_markup_mode=None)
app.add_typer(judge_app, name="judge")


@judge_app.command("agreement")
def judge_agreement_cmd(
    judge: Annotated[str, typer.Option(help="Backend: reward_model | sequence_classifier | openai | labels.")],
    model: Annotated[Optional[str], typer.Option(help="Checkpoint (reward models) or model name (openai).")] = None,
    base_url: Annotated[Optional[str], typer.Option(help="openai: endpoint (default $OPENAI_BASE_URL).")] = None,
    api_key_env: Annotated[
        str, typer.Option(help="openai: NAME of the environment variable holding the key (never the key).")
    ] = "OPENAI_API_KEY",
    labels: Annotated[Optional[str], typer.Option(help="labels: JSONL/CSV file of ids -> verdicts.")] = None,
    template: Annotated[Optional[str], typer.Option(help="openai: pairwise template file.")] = None,
    n: Annotated[int, typer.Option("-n", "--n", help="Judge the first N agreement pairs (0: all).")] = 0,
    data: Annotated[Optional[str], typer.Option(help="Agreement pairs (PandaLM format).")] = None,
    cache_dir: Annotated[Optional[str], typer.Option(help="Judgment cache (default $RLHF_CACHE/judgments).")] = None,
    max_concurrency: Annotated[int, typer.Option(help="openai: requests in flight.")] = 4,
    floor: Annotated[float, typer.Option(help="The agreement floor the gates apply.")] = 0.85,
    as_json: Annotated[bool, typer.Option("--json", help="Print the measurement as JSON.")] = False,
) -> None:
    """Print a judge's agreement with PandaLM's three human annotators (a, CI, n, 2a-1, position consistency);
    measured once per judge identity and cached."""
    from judging.judges import JudgeConfig
    from judging.qualify import format_qualification, judge_agreement_report

    settings = {"backend": judge, "agreement_n": n, "max_concurrency": max_concurrency, "api_key_env": api_key_env}
    for key, value in (("model", model), ("base_url", base_url), ("labels", labels), ("template", template),
                       ("agreement_data", data), ("cache_dir", cache_dir)):
        if value:
            settings[key] = value
    reward_model = None
    if judge == "reward_model":
        if not model:
            raise typer.BadParameter("--judge reward_model needs --model <reward-model stage dir or checkpoint>")
        from gates.inputs import resolve_checkpoint

        reward_model = resolve_checkpoint(model)[0]
    try:
        config = JudgeConfig.from_dict(settings, where="--judge")
        q = judge_agreement_report(config, reward_model=reward_model)
    except (ValueError, FileNotFoundError, KeyError, RuntimeError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1)
    typer.echo(dumps_strict(q.summary() if q else None, indent=2) if as_json else format_qualification(q, floor=floor))


@judge_app.command("refusal-agreement")
def judge_refusal_agreement_cmd(
    model: Annotated[Optional[str], typer.Option(help="Model name (default $OPENAI_MODEL).")] = None,
    base_url: Annotated[Optional[str], typer.Option(help="Endpoint (default $OPENAI_BASE_URL).")] = None,
    n: Annotated[int, typer.Option("-n", "--n", help="Grade the first N unsafe and N safe XSTest completions of "
                                   "each model (0: all).")] = 0,
    cache_dir: Annotated[Optional[str], typer.Option(help="Judgment cache (default $RLHF_CACHE/judgments).")] = None,
    max_concurrency: Annotated[int, typer.Option(help="Requests in flight.")] = 4,
    floor: Annotated[float, typer.Option(help="The refusal gate's floor (refusal_classifier_min_agreement).")] = 0.85,
    as_json: Annotated[bool, typer.Option("--json", help="Print the measurement as JSON.")] = False,
) -> None:
    """Print an LLM refusal grader's agreement (XSTest's 3-class prompt) with XSTest's human labels on the shared
    completions; measured once per grader identity and cached (gates.refusal_llm)."""
    from dataclasses import asdict

    from gates.refusal_llm import LLMRefusalGrader, format_grader_measurement, measure_grader_quality, \
        refusal_grader_config
    from judging.judges import JudgeConfig

    settings = {"max_concurrency": max_concurrency}
    for key, value in (("model", model), ("base_url", base_url), ("cache_dir", cache_dir)):
        if value:
            settings[key] = value
    try:
        config = refusal_grader_config(settings, JudgeConfig())
        g = measure_grader_quality(LLMRefusalGrader(config), n_per_model=n)
    except (ValueError, FileNotFoundError, RuntimeError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1)
    if as_json:
        from rlhf.serialization import to_jsonable

        typer.echo(dumps_strict(to_jsonable({**asdict(g)}), indent=2))
    else:
        typer.echo(format_grader_measurement(g, floor=floor))


_wandb_report_app = typer.Typer(help="The round's W&B Report (flows/wandb_report.py).", no_args_is_help=True,
                                rich_markup_mode=None)
app.add_typer(_wandb_report_app, name="wandb-report")


@_wandb_report_app.command("publish")
def wandb_report_publish(
    round_dir: Annotated[str, typer.Argument(help="The round's folder, runs/<round_id> (holds wandb_report.json).")],
) -> None:
    """Save the report specification a round wrote offline to W&B (sync its runs first: wandb sync
    runs/<round_id>/*/wandb/offline-run-*). Needs WANDB_API_KEY in the environment. Prints the report's URL."""
    from flows.wandb_report import publish

    try:
        typer.echo(publish(round_dir))
    except (FileNotFoundError, RuntimeError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2)


@_wandb_report_app.command("build")
def wandb_report_build(
    round_dir: Annotated[str, typer.Argument(help="The round's folder, runs/<round_id> (holds round.json).")],
) -> None:
    """(Re)build the round's report from round.json: saved when W&B is online, its specification written to
    runs/<round_id>/wandb_report.json either way. Prints the specification's path."""
    from flows.wandb_report import write_round_report

    try:
        typer.echo(str(write_round_report(round_dir)))
    except (FileNotFoundError, KeyError) as err:
        typer.echo(f"error: {round_dir}: not a finished round ({err})", err=True)
        raise typer.Exit(2)


from flows.flywheel_cli import app as _flywheel_app  # noqa: E402

app.add_typer(_flywheel_app, name="flywheel")

if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
