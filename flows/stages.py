"""Launch a stage as its own process and read its manifest; skip it when its inputs are unchanged.

This is orchestration only: which command, which directory, whether a cached result still holds. The cache key
is a content hash of everything a stage's result depends on (DESIGN.md principle 8): the stage name, the recipe
file's bytes, the extra arguments, the hashes of the data files the recipe names (``*_data``; a hub dataset by the
commit it resolves to), the base model (content hash, or a hub id's resolved commit), the gate stage's endpoint
judges as measured now (their server-reported identity and probe answers, ``judging.identity``), and of the JSON
inputs the flow passes (``*_json``, e.g. the PPO unlock decision), the parent stages' keys, the version of the
code the stage runs (exactly the modules it imports, ``rlhf.lineage.stage_code_modules``), and how it is launched:
the accelerate config it runs under (content hash) and its world size (:func:`launch_key`), so a result or a
checkpoint made on one process layout is never reused or resumed under another. A matching key next to a finished
manifest means the stage is skipped.

Resume: the key is also written at a stage's start (``ATTEMPT_KEY_FILE``). A rerun that finds an
unfinished folder (no manifest) started with the same key and holding a complete Trainer checkpoint keeps the
folder and launches the stage with ``--resume_from_checkpoint <newest complete checkpoint>`` (rlhf/resume.py: every
file re-hashed against the sha256 recorded at save time; damaged ones are kept aside, never deleted, and the next
older one is used; PPO writes its own checkpoints in the same layout, ``PPOTrainer.save_state``); anything else
(other inputs, ``force``, no checkpoint at all) starts clean as before.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from data.fingerprint import data_fingerprint
from rlhf.config import check_renamed_keys
from rlhf.lineage import code_version, content_hash, json_hash, remembered_hashes, source_key, stage_code_modules
from rlhf.manifest import MANIFEST_NAME, atomic_write_text, dumps_strict, read_manifest
from rlhf.models import hash_memo_path
from rlhf.registry import stage as registry_stage
from rlhf.rundir import FAILURE_NAME, STAGE_MARKER, create_stage_dir, read_failure, remove_stage_dir

from .interrupt import run_process_group
from .stage_log import StageLogRelay

if TYPE_CHECKING:
    from judging.judges import JudgeConfig

CACHE_KEY_FILE = ".cache_key"
ATTEMPT_KEY_FILE = ".attempt_key"  # the key a stage was started with (a rerun resumes only the same inputs)
TIMING_FILE = ".seconds"  # the first (computing) run's wall time, kept so a cached rerun can report it


@dataclass
class StageRun:
    """What a flow task hands to the next one: paths and hashes, never weights."""

    stage: str
    output_dir: str
    manifest: dict
    cache_key: str
    cached: bool
    seconds: float  # wall time of the run that computed the result (a cached rerun keeps the first run's)
    rerun_seconds: float | None = None  # a cached rerun's own time (cache check and reuse); None when computed


#: Base-model presets the pipeline builds itself (``rlhf.models.resolve_base_model``): keyed by name, their build
#: code is part of the stage's code version.
_PRESETS = ("tiny", "smollm2-135m", "default")


def _model_key(value: str) -> str:
    """A base model's identity for the cache: content hash of a local directory or .gguf file, the resolved commit
    of a hub id (``rlhf.lineage.source_key``), the name of a built-in preset.

    Raises:
        rlhf.lineage.UnresolvedRevision: a hub id whose commit cannot be resolved (not cached, hub offline).
    """
    return value if value in _PRESETS else source_key(value, repo_type="model")


def _result_hash(run: StageRun) -> str:
    """What a parent produced: its checkpoint's content hash (a forced rerun that changes it invalidates children)."""
    return run.manifest.get("outputs", {}).get("checkpoint_hash") or run.cache_key


def _endpoint_judge_probes(cfg: dict, overrides: dict[str, str], adjust: Callable[[JudgeConfig], JudgeConfig]
                           | None = None) -> dict[str, tuple[JudgeConfig, Callable[[], str]]]:
    """The gate stage's endpoint judges, by recipe key: the config each is asked through (``adjust``: a change to it,
    e.g. a shorter timeout) and a function that measures its identity hash now (``judging.identity``: the server's
    listing and a fresh probe, not recorded as seen): the ``openai`` pairwise ``judge`` and, with
    ``refusal_classifier: openai``, the LLM refusal grader (``refusal_judge``). Building them sends nothing; calling
    one does.

    Raises:
        ValueError: a malformed judge mapping.
    """
    from judging.judges import JudgeConfig

    def value(key: str):
        return overrides.get(f"--{key}", cfg.get(key))

    adjust = adjust or (lambda c: c)
    judge = JudgeConfig.from_dict(value("judge"), where="judge")
    out: dict[str, tuple[JudgeConfig, Callable[[], str]]] = {}
    if judge.backend == "openai":
        from judging.openai_judge import OpenAIJudge

        asked = adjust(judge)
        out["judge"] = (asked, lambda: OpenAIJudge(asked, record_identity=False).identity_hash())
    if value("refusal_classifier") == "openai":
        from gates.refusal_llm import probe_messages, refusal_grader_config
        from judging.openai_client import ChatClient

        grader = adjust(refusal_grader_config(value("refusal_judge"), judge))
        out["refusal_judge"] = (grader, lambda: json_hash(ChatClient(
            grader, namespace="refusal", probe=probe_messages(), record_identity=False).identity()))
    return out


def _endpoint_judges(cfg: dict, overrides: dict[str, str]) -> dict[str, str]:
    """The identity hashes of the gate stage's endpoint judges, measured now (:func:`_endpoint_judge_probes`). A name
    serves other weights today than when the cached result was computed: then the key changes and the gates run
    again. {} for judges identified by content (a reward model, a label file: their content is already in the key
    through the parents or the recipe).

    Raises:
        ValueError: a malformed judge mapping. RuntimeError: the endpoint cannot be reached.
    """
    return {key: probe() for key, (_, probe) in _endpoint_judge_probes(cfg, overrides).items()}


def _given_args(args: list[str]) -> dict[str, str | list[str]]:
    """Command-line words as ``{"--key": value}``: the words after a ``--key`` up to the next one are its value, a
    list when there are several (``--reward_functions reward_model judge``, from a JSON list in ``--set``)."""
    given: dict[str, str | list[str]] = {}
    key = None
    for word in args:
        if word.startswith("--"):
            key = word
            given[key] = []
        elif key is not None:
            given[key].append(word)
    return {k: v[0] if len(v) == 1 else (v or "") for k, v in given.items()}


#: The judge keys of the TRL online-RL stages whose ``openai`` backend is an endpoint the stage will call.
ONLINE_RL_JUDGE_KEYS = ("reward_judge", "tripwire_gold_judge")
#: Seconds each request of the pre-check's identity probe may take (at most one retry), whatever the judge's own
#: ``timeout_s``: listing models and one short completion.
PROBE_TIMEOUT_S = 15.0


def check_endpoint_judges(stage: str, recipe: Path, overrides: list[str], seen: set | None = None) -> int:
    """Ask every OpenAI-compatible endpoint judge ``stage`` will call (its recipe with the user's ``overrides``) who it
    is, once, before any stage runs: the gates' ``judge`` and ``refusal_judge`` as the gate stage's cache key measures
    them (:func:`_endpoint_judges`); an online-RL stage's ``reward_judge`` (with ``judge`` among its
    ``reward_functions``) and ``tripwire_gold_judge`` the same way (listing and probe). ``seen`` (endpoint, model)
    pairs already asked are skipped and the asked ones added, so one endpoint is asked once per round.

    Returns:
        the number of endpoints asked.

    Raises:
        ValueError: an endpoint does not answer, one line naming ``<stage>.<key>``, its ``base_url`` (no credentials;
            the key's value is never shown) and the reason; or a malformed judge mapping.
    """
    from judging.identity import public_endpoint
    from judging.judges import JudgeConfig
    from judging.openai_judge import OpenAIJudge
    from rlhf.credentials import env_secret

    cfg = yaml.safe_load(recipe.read_text()) or {}
    given = _given_args(overrides)
    seen = set() if seen is None else seen

    def short(judge: JudgeConfig) -> JudgeConfig:
        # asking who an endpoint is takes a listing and one short probe: a server that accepts the connection and
        # never answers is said in seconds, not after the judge's own timeout and retries (120 s x 4 by default)
        return dataclasses.replace(judge, timeout_s=min(judge.timeout_s, PROBE_TIMEOUT_S),
                                   max_retries=min(judge.max_retries, 1))

    judges: list[tuple[str, JudgeConfig, Callable[[], object]]] = []
    if stage == "gates":  # asked as the gate stage's cache key asks them, through the shorter timeout
        judges = [(key, asked, probe) for key, (asked, probe) in _endpoint_judge_probes(cfg, given, short).items()]
    else:
        functions = given.get("--reward_functions", cfg.get("reward_functions")) or []
        functions = [functions] if isinstance(functions, str) else functions
        for key in ONLINE_RL_JUDGE_KEYS:
            value = given.get(f"--{key}", cfg.get(key))
            if not value or (key == "reward_judge" and "judge" not in functions):
                continue
            judge = JudgeConfig.from_dict(value, where=f"{stage}.{key}")
            if judge.backend == "openai":
                judges.append((key, judge, lambda judge=short(judge): OpenAIJudge(judge, record_identity=False
                                                                                 ).identity()))
    asked = 0
    for key, judge, probe in judges:
        url = public_endpoint(judge.base_url or os.environ.get("OPENAI_BASE_URL", ""))
        if (url, judge.model) in seen:
            continue
        seen.add((url, judge.model))
        asked += 1
        try:
            probe()
        except ValueError as err:  # a setting the client refuses (no base_url and no OPENAI_BASE_URL): said here
            raise ValueError(f"{stage}.{key}: {err}") from None
        except (RuntimeError, OSError) as err:
            reason = " ".join(str(err).split())
            secret = env_secret(judge.api_key_env)
            if secret:  # never shown, whatever a server or a client library put in its error
                reason = reason.replace(secret, "***")
            raise ValueError(f"{stage}.{key}: the openai judge at base_url {url or '(none)'} (model {judge.model!r}) "
                             f"does not answer ({reason}); start it, or fix {stage}.{key} in the recipe or --set"
                             ) from None
    return asked


def accelerate_default_config() -> Path:
    """The file ``accelerate launch`` reads when given no ``--config_file`` (path rule of
    ``accelerate/commands/config/config_args.py``: ``$HF_HOME``, else ``$XDG_CACHE_HOME/huggingface``, else
    ``~/.cache/huggingface``, then ``accelerate/default_config.yaml``)."""
    home = os.environ.get("HF_HOME", os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface"))
    return Path(home).expanduser() / "accelerate" / "default_config.yaml"


def launch_key(accelerate_config: str | os.PathLike | None, launcher=None) -> dict:
    """How a stage's processes are laid out, for its cache key: ``{"accelerate_config": sha256 of the config file
    accelerate reads (None when it reads none), "world_size": processes in all}``.

    The file is ``accelerate_config``, else the launcher's ``default_accelerate_config`` (the Slurm launcher's
    ZeRO-3 one), else accelerate's own default file where one exists (the local launch then puts its one-process
    flags over it). World size: the launcher's ``world_size`` (Slurm: nodes x processes a node, passed over the
    file's), else the local launch's: the file's ``num_processes`` (accelerate's total over all machines), 1
    without a file.

    Raises:
        FileNotFoundError: ``accelerate_config`` names no file.
    """
    explicit = accelerate_config or getattr(launcher, "default_accelerate_config", None)
    if explicit and not Path(explicit).is_file():
        raise FileNotFoundError(f"{explicit}: no such accelerate config")
    config = Path(explicit) if explicit else accelerate_default_config()
    world = getattr(launcher, "world_size", None)
    if world is None:
        cfg = (yaml.safe_load(config.read_text()) or {}) if explicit else {}
        world = max(1, int(cfg.get("num_processes", 1)))
    return {"accelerate_config": content_hash(config) if config.is_file() else None, "world_size": int(world)}


def stage_cache_key(
    stage: str, recipe: Path, extra_args: list[str], parents: list[StageRun], launch: dict | None = None
) -> str:
    """Content hash of a stage's inputs (see module docstring); ``launch`` is :func:`launch_key`'s (default: one
    local process without an accelerate config file).

    Raises:
        rlhf.lineage.UnresolvedRevision: a hub model or dataset whose commit cannot be resolved. RuntimeError: the
        gate stage's endpoint judge cannot be reached (its identity is measured, :func:`_endpoint_judges`).
    """
    cfg = yaml.safe_load(recipe.read_text()) or {}
    overrides = _given_args(extra_args)  # a list value (several words) does not shift the keys after it
    data, model = {}, None
    for key in {*cfg, *(k.removeprefix("--") for k in overrides)}:
        value = overrides.get(f"--{key}", cfg.get(key))
        if (key.endswith("_data") or key == "decontaminate_against") and isinstance(value, str):
            data[key] = data_fingerprint(value)
        elif key.endswith("_json") and isinstance(value, str) and value and Path(value).is_file():
            data[key] = content_hash(value)  # e.g. the flow's PPO unlock decision: its content, not its path
        elif key == "model_name_or_path" and isinstance(value, str):
            model = _model_key(value)
    judges = _endpoint_judges(cfg, overrides) if stage == "gates" else {}
    precision = stage_precision(stage, cfg, overrides)
    return json_hash(
        {
            "stage": stage,
            "recipe": content_hash(recipe),
            "args": extra_args,
            "data": data,
            "model": model,
            "parents": {p.stage: [p.cache_key, _result_hash(p)] for p in parents},
            "code": code_version(stage_code_modules(stage)),
            **({"judges": judges} if judges else {}),  # only the gates with endpoint judges: other keys unchanged
            "launch": launch if launch is not None else launch_key(None),
            # what the precision resolves to on this machine: "auto" trains bf16 where bf16 is native, fp32 elsewhere
            # (RLHF_NATIVE_BF16 forces it), so a checkpoint trained in one is not reused for the other
            **({"precision": precision} if precision else {}),
        }
    )


#: The recipe key that picks each stage's precision (``rlhf.precision``); the gates pick their generation's.
PRECISION_KEYS = {"sft": "precision", "dpo": "precision", "reward_model": "precision", "ppo": "precision",
                  "grpo": "precision", "rloo": "precision", "gates": "generation_precision"}


def stage_precision(stage: str, cfg: dict, overrides: dict) -> str | None:
    """The precision ``stage`` will train (or the gates generate) in on this machine, from its recipe ``cfg`` and
    command-line ``overrides`` (``{"--key": value}``): ``resolve_precision`` of the requested value (default
    ``auto``), not logged. None for a stage without one, or a value the stage itself will refuse."""
    from rlhf.precision import generation_precision, prefill_precision, resolve_precision

    key = PRECISION_KEYS.get(stage)
    if key is None:
        return None
    requested = overrides.get(f"--{key}", cfg.get(key, "auto"))
    try:
        if stage == "gates":  # the weights' dtype, and the long prompts' prefill dtype where it differs
            weights = generation_precision(str(requested), log=False)
            prefill = prefill_precision(str(overrides.get("--prefill_precision", cfg.get("prefill_precision", "auto"))),
                                        weights, log=False)
            return weights if prefill == weights else f"{weights}, prefill {prefill}"
        return resolve_precision(str(requested), stage, log=False)
    except ValueError:  # an unknown value: the stage's own config check names it
        return None


def outputs_intact(output_dir: Path, manifest: dict) -> str | None:
    """None when every output the manifest names is still there with its recorded hash; else what changed."""
    outputs = manifest.get("outputs", {})
    for path_key, hash_key in (("checkpoint", "checkpoint_hash"), ("pi_ref", "pi_ref_hash")):
        path, recorded = outputs.get(path_key), outputs.get(hash_key)
        if path and recorded:
            if not Path(path).exists():
                return f"{path} is missing"
            if content_hash(path) != recorded:
                return f"{path} changed since it was written"
    for key in ("report_json", "report_md", "junit"):
        if outputs.get(key) and not Path(outputs[key]).is_file():
            return f"{outputs[key]} is missing"
    return None


def processes_per_node(accelerate_config: str | None) -> int:
    """Processes accelerate starts on each node: the config's ``num_processes / num_machines`` (1 without one)."""
    if not accelerate_config:
        return 1
    cfg = yaml.safe_load(Path(accelerate_config).read_text()) or {}
    return max(1, int(cfg.get("num_processes", 1)) // max(1, int(cfg.get("num_machines", 1))))


def launch_command(
    module: str, recipe: Path, output_dir: Path, extra_args: list[str], accelerate_config: str | None
) -> list[str]:
    """``accelerate launch [--config_file F] --num_cpu_threads_per_process T -m <module> --config <recipe>
    --output_dir <dir> ...``, or, for one process and no accelerate config, the same stage started directly:
    ``env <what accelerate's launcher would set> python -m <module> ...`` (:func:`simple_launch_env`).

    T = physical cores of this node (within its CPU affinity) // processes on the node (rlhf.machine): without it
    accelerate sets ``OMP_NUM_THREADS=1`` and a stage runs on one core of two (measured on a 2-core CPU: the DPO
    stage took 93-96 s that way vs 58.5-59.5 s with T = 2). Started directly, a stage saves the launcher process,
    whose own imports took 2.1-2.5 s a stage (2 cores), and its exit code reaches the flow unchanged (accelerate's
    launcher turns every non-zero code into 1).
    """
    launch = accelerate_launch_args(accelerate_config)
    stage = ["-m", module, "--config", str(recipe), "--output_dir", str(output_dir), *extra_args]
    env = None if accelerate_config else simple_launch_env(launch)
    if env is None:
        return [sys.executable, "-m", "accelerate.commands.launch", *launch, *stage]
    return ["env", *(f"{key}={value}" for key, value in sorted(env.items())), sys.executable, *stage]


def accelerate_launch_args(accelerate_config: str | None) -> list[str]:
    """The ``accelerate launch`` options of a local stage (:func:`launch_command`): the config file, or one process
    without one; and ``--num_cpu_threads_per_process`` (rlhf.machine.threads_per_process)."""
    from rlhf.machine import threads_per_process

    launch = (
        ["--config_file", accelerate_config]
        if accelerate_config
        else ["--num_processes", "1", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    )
    return launch + ["--num_cpu_threads_per_process", str(threads_per_process(processes_per_node(accelerate_config)))]


def prestart_local_stages(accelerate_config: str | None, launcher: str = "local") -> None:
    """Start the warm interpreter that local stages of one process fork from (flows/warm_start.py) now, with the
    environment such a stage gets (:func:`stage_env` and :func:`simple_launch_env`), so that its imports overlap
    the caller's own work; nothing for Slurm, an accelerate config, or a machine where warm starts are off."""
    from . import warm_start

    if launcher != "local" or accelerate_config or not warm_start.enabled():
        return
    try:
        env = stage_env()
    except ValueError:  # a refused RLHF_ALLOCATOR: the stage says so (run_stage), not this head start
        return
    variables = simple_launch_env(accelerate_launch_args(None))
    if variables is not None:
        warm_start.prestart({**env, **variables})


def simple_launch_env(launch_args: list[str]) -> dict[str, str] | None:
    """The variables ``accelerate launch <launch_args>`` would set or change for its one child process (accelerate's
    own ``_validate_launch_command`` and ``prepare_simple_launcher_cmd_env``, so a default accelerate config on the
    machine counts as it does for ``accelerate launch``), or None where it would not use its simple launcher (a
    default config asking for DeepSpeed, FSDP, several GPUs, a TPU or SageMaker) or ``env`` is missing."""
    import shutil

    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import ComputeEnvironment
    from accelerate.utils.launch import prepare_simple_launcher_cmd_env

    if shutil.which("env") is None:
        return None
    args, defaults, _ = _validate_launch_command(launch_command_parser().parse_args([*launch_args, "-m", "stage"]))
    if (any(getattr(args, flag, False) for flag in ("use_deepspeed", "use_fsdp", "use_megatron_lm", "multi_gpu", "tpu"))
            or (defaults is not None and defaults.compute_environment == ComputeEnvironment.AMAZON_SAGEMAKER)):
        return None
    _, env = prepare_simple_launcher_cmd_env(args)
    return {key: value for key, value in env.items() if os.environ.get(key) != value}


def stage_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a stage process starts with: ``environ`` (default ``os.environ``) without ``WANDB_SERVICE``,
    with unbuffered output, tokenizers' own threads off, and the memory allocator of
    :func:`rlhf.machine.allocator_env` (tcmalloc where installed, else glibc kept from returning freed blocks).

    Each stage process starts its own wandb-core, which dies with it: a service the flow process started (its
    address in WANDB_SERVICE) would outlive a killed stage and keep its run id registered, so the resumed attempt
    would be refused with "run ID ... is in use" (wandb's own agent drops it from its children's environment too).

    Raises:
        ValueError: ``RLHF_ALLOCATOR`` names no allocator, or one this machine lacks.
    """
    from rlhf.machine import allocator_env

    environ = dict(os.environ if environ is None else environ)
    env = {key: value for key, value in environ.items() if key != "WANDB_SERVICE"}
    return env | {"PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"} | allocator_env(environ)


def run_stage(
    stage: str,
    module: str,
    recipe: str | Path,
    output_dir: str | Path,
    *,
    extra_args: list[str] = (),
    parents: list[StageRun] = (),
    accelerate_config: str | None = None,
    force: bool = False,
    log=print,
    runs_dir: str | Path | None = None,
    launcher=None,
    log_at=None,
) -> StageRun:
    """Run one stage unless a finished run with the same cache key is already in ``output_dir``.

    The stage's stdout/stderr stream to ``<output_dir>/stage.log`` and, through
    :class:`flows.stage_log.StageLogRelay` (each line at its own level, progress bars at most every few seconds),
    to ``log_at(level, message)`` (e.g. a Prefect run logger's ``log``), or to ``log`` without it. The stage runs in its own
    process group (flows/interrupt.py): an interrupt stops all of it, and nothing of it outlives the launcher.
    A stale ``output_dir`` is removed only if a stage created it (marker file) inside ``runs_dir`` (when given).
    ``launcher`` (same arguments as :func:`launch_command`, called once ``output_dir`` exists) gives the command
    instead of the local ``accelerate launch``, e.g. :func:`flows.launch.slurm.slurm_launcher`'s submit-and-wait;
    its ``world_size`` and ``default_accelerate_config`` attributes, where it has them, enter the cache key
    (:func:`launch_key`).

    Raises:
        rlhf.rundir.RoundError: ``output_dir`` exists but was not created by a stage, or lies outside ``runs_dir``.
        StageFailed: the process failed (non-zero exit) or wrote no manifest; the message leads with the stage's
            recorded failure, else the signal that killed it (:func:`killed_by`), else its own error line. Also,
            with no process started, when ``RLHF_ALLOCATOR`` is refused (:func:`stage_env`; nothing touched) or the
            cache key cannot be computed (a dead endpoint judge, a hub id that does not resolve): one line, and in
            the second case an earlier run's reports in ``output_dir`` are set aside (:func:`set_aside_finished`),
            so the folder does not pass for this run's result.
    """
    recipe, output_dir = Path(recipe), Path(output_dir)
    if not recipe.is_file():
        raise FileNotFoundError(f"{recipe}: no such recipe for stage {stage}")
    try:  # a bad machine setting is refused before the stage's folder is touched
        env = stage_env()
    except ValueError as err:
        raise StageFailed(stage, None, f"the environment's setting is refused: {err}", None) from None
    t_check = time.perf_counter()
    memo = remembered_hashes(hash_memo_path())  # an unchanged multi-GB model, dataset or output is not read again
    try:
        with memo:
            key = stage_cache_key(stage, recipe, list(extra_args), list(parents),
                                  launch_key(accelerate_config, launcher))
    except Exception as err:  # noqa: BLE001 - a dead judge, an unresolvable hub id, ...: this stage failed, said once
        cause = f"its cache key could not be computed: {type(err).__name__}: {' '.join(str(err).split())}"
        set_aside_finished(output_dir, cause)
        raise StageFailed(stage, None, cause, None) from None
    key_file = output_dir / CACHE_KEY_FILE
    if (
        not force
        and any(f.is_file() and f.read_text().strip() == key for f in (key_file, output_dir / ATTEMPT_KEY_FILE))
        and (output_dir / MANIFEST_NAME).is_file()
    ):  # the attempt key counts too: the stage finished (manifest last) but the flow died before writing .cache_key
        manifest = read_manifest(output_dir)
        with memo:
            damage = outputs_intact(output_dir, manifest)
        if damage is None:
            log(f"[{stage}] inputs unchanged (key {key[:12]}): reusing {output_dir}")
            return StageRun(stage, str(output_dir), manifest, key, cached=True, seconds=first_run_seconds(output_dir),
                            rerun_seconds=time.perf_counter() - t_check)
        log(f"[{stage}] inputs unchanged but {damage}: recomputing")
    refusals: list[str] = []  # why checkpoints were refused: to the flow log and the stage log
    resume, keep = (None, False) if force else resumable_checkpoint(output_dir, key, log=refusals.append)
    for line in refusals:
        log(f"[{stage}] {line}")
    if resume is not None:  # unfinished, same inputs, a complete Trainer checkpoint: continue from it
        (output_dir / FAILURE_NAME).unlink(missing_ok=True)
        log(f"[{stage}] unfinished run with the same inputs: resuming from {resume}")
    elif keep:  # same inputs, but every checkpoint was refused: start over in the folder, keeping them aside
        (output_dir / FAILURE_NAME).unlink(missing_ok=True)
        log(f"[{stage}] unfinished run with the same inputs, no checkpoint passed its checks: starting over "
            "(refused checkpoints kept as refused-checkpoint-<step>)")
    else:
        if output_dir.exists():  # stale or unfinished: start clean, so nothing old can pass for new
            remove_stage_dir(output_dir, runs_dir)
        create_stage_dir(output_dir)
        atomic_write_text(output_dir / ATTEMPT_KEY_FILE, key)
    launch_args = list(extra_args)
    if resume is not None and "--resume_from_checkpoint" not in launch_args:
        launch_args += ["--resume_from_checkpoint", str(resume)]
    cmd = (launcher or launch_command)(module, recipe, output_dir, launch_args, accelerate_config)
    log(f"[{stage}] $ {' '.join(cmd)}")
    t0 = time.perf_counter()
    tail: list[str] = []
    relay = StageLogRelay(stage, log_at or (lambda level, message: log(message)))
    with open(output_dir / "stage.log", "a" if keep else "w", buffering=1) as logf:
        if keep:
            logf.write(f"\n===== resumed from {resume} =====\n" if resume else "\n===== started over =====\n")
            logf.writelines(f"{line}\n" for line in refusals)

        def on_line(line: str) -> None:
            nonlocal tail
            logf.write(line)
            relay(line)
            tail = (tail + [line])[-40:]

        rc = run_process_group(cmd, env=env, on_line=on_line)
    seconds = time.perf_counter() - t0
    if rc != 0 or not (output_dir / MANIFEST_NAME).is_file():
        cause = read_failure(output_dir) or killed_by(rc, tail) or root_cause(tail)
        raise StageFailed(stage, rc, cause, output_dir / "stage.log")
    atomic_write_text(key_file, key)
    atomic_write_text(output_dir / TIMING_FILE, f"{seconds}\n")
    log(f"[{stage}] done in {seconds:.0f}s")
    return StageRun(stage, str(output_dir), read_manifest(output_dir), key, cached=False, seconds=seconds)


def resumable_checkpoint(output_dir: Path, key: str, log=lambda _line: None) -> tuple[Path | None, bool]:
    """The Trainer checkpoint a rerun of ``output_dir`` resumes from (or None), and whether to keep the folder.

    Only a folder the pipeline created (``STAGE_MARKER``), unfinished (no manifest), started with this cache key
    (``ATTEMPT_KEY_FILE``) is considered. Its newest checkpoint that passes every check (files of its layout,
    trainer state, sha256 of every file: :func:`rlhf.resume.select_checkpoint`) is resumed from; newer ones that
    fail are set aside as ``refused-checkpoint-<step>`` with the reason (:func:`rlhf.resume.set_aside`), and the
    stage's manifest lists them. A folder holding a set-aside checkpoint is kept even when nothing is resumable (the
    stage starts over in it), so a checkpoint the pipeline marked complete is never deleted by a rerun.
    ``log`` gets one line per refused checkpoint: its name, the reason, where it is kept.
    """
    from rlhf.resume import refused_checkpoints, select_checkpoint, set_aside

    output_dir = Path(output_dir)
    attempt = output_dir / ATTEMPT_KEY_FILE
    if (
        not (output_dir / STAGE_MARKER).is_file()
        or (output_dir / MANIFEST_NAME).is_file()
        or not attempt.is_file()
        or attempt.read_text().strip() != key
    ):
        return None, False
    found, refused = select_checkpoint(output_dir)
    for rec in set_aside(refused):
        log(f"refused {Path(rec['checkpoint']).name}: {rec['reason']} (kept as {Path(rec['kept_at']).name})")
    return found, found is not None or bool(refused_checkpoints(output_dir))


def first_run_seconds(output_dir: Path) -> float | None:
    """The recorded wall time of the run that computed ``output_dir`` (None if it was never recorded)."""
    p = Path(output_dir) / TIMING_FILE
    try:
        return float(p.read_text())
    except (OSError, ValueError):
        return None


class StageFailed(RuntimeError):
    """A stage failed; the message leads with the stage's own error line, then where the log is.

    ``returncode`` and ``log_path`` are None when the stage failed in the flow before its process started (its
    cache key could not be computed): then the message is the one line ``stage <name> failed: <cause>``."""

    def __init__(self, stage: str, returncode: int | None, cause: str, log_path: Path | None):
        self.stage, self.returncode, self.cause, self.log_path = stage, returncode, cause, log_path
        note = " (rows are numbered from 0: row 0 is the first data row)" if " row " in cause else ""
        exit_ = f" (exit {returncode})" if returncode is not None else ""
        log = f"\nfull log: {log_path}" if log_path is not None else ""
        super().__init__(f"stage {stage} failed{exit_}: {cause}{note}{log}")


#: The outputs a stage's manifest may name as its reports: files that make a folder look like a finished result.
REPORT_OUTPUT_KEYS = ("report_json", "report_md", "junit")
#: What a reporting stage (the gates) writes beside its reports under fixed names (``gates.evaluate``): the answers
#: and the judge's verdicts, which would otherwise pass for the failed run's.
REPORT_RESULT_FILES = ("generations.jsonl", "judgments.jsonl")


def set_aside_finished(output_dir: str | Path, cause: str) -> list[str]:
    """Leave a failed stage's folder looking failed, not finished: in a folder the pipeline created
    (``STAGE_MARKER``) that holds an earlier run's manifest naming reports (the gate stage's ``report.json``,
    ``report.md``, ``report.junit.xml``), remove those reports, the plots the manifest names, the manifest and the
    cache key file, and write ``failure.json`` with ``cause`` (what ``read_failure`` gives back); the answers and
    verdicts written beside the reports (:data:`REPORT_RESULT_FILES`) go too. Only those files inside
    ``output_dir`` are removed; checkpoints, logs and a user's files stay. A folder without
    the marker or without such a manifest is left as it is.

    Returns:
        the names removed (relative to ``output_dir``).
    """
    import json
    import shutil

    out = Path(output_dir)
    if not (out / STAGE_MARKER).is_file() or not (out / MANIFEST_NAME).is_file():
        return []
    try:
        outputs = read_manifest(out).get("outputs") or {}
    except (OSError, ValueError):
        return []
    named = [outputs.get(k) for k in REPORT_OUTPUT_KEYS if isinstance(outputs.get(k), str)]
    if not named:  # a training stage's manifest: its checkpoint is a cache entry of its own inputs, kept
        return []
    plots = outputs.get("plots") if isinstance(outputs.get("plots"), dict) else {}
    named += [v for v in plots.values() if isinstance(v, str)]
    named += [str(out / name) for name in REPORT_RESULT_FILES]
    removed = []
    root = out.resolve()
    for name in named:  # as the stage wrote them: absolute, or relative to the flow's working folder
        path = Path(name).resolve()
        if path.is_relative_to(root) and path.is_file():  # never a file outside the stage's folder
            path.unlink()
            removed.append(str(path.relative_to(root)))
    plots_dir = out / "plots"
    if plots and plots_dir.is_dir() and not any(plots_dir.iterdir()):
        shutil.rmtree(plots_dir)
    for name in (MANIFEST_NAME, CACHE_KEY_FILE):
        if (out / name).is_file():
            (out / name).unlink()
            removed.append(name)
    atomic_write_text(out / FAILURE_NAME, json.dumps({"type": "StageFailed", "message": cause}) + "\n")
    return removed


def killed_by(returncode: int, lines: list[str]) -> str | None:
    """``"killed by signal 9 (SIGKILL)"`` when a signal ended the stage, else None.

    A signal shows in one of three places: the launcher's own return code, negative when a signal killed it
    (``subprocess`` on POSIX); or, when the trainer under ``accelerate launch`` was killed, the launcher exits 1
    after reporting the child's negative return code, as Python's ``CalledProcessError`` text (one process:
    ``... died with <Signals.SIGKILL: 9>.``) or as torch elastic's failure table (several processes: the first
    ``exitcode : -9`` after ``Root Cause``, so a rank the agent stopped after another failed is not taken for it).
    """
    import re
    import signal

    number = -returncode if returncode < 0 else None
    text = "".join(lines)
    if number is None and (m := re.findall(r"died with <Signals\.\w+: (\d+)>", text)):
        number = int(m[-1])
    if number is None and "Root Cause" in text:
        m = re.search(r"exitcode\s*:\s*(-?\d+)", text[text.rindex("Root Cause"):])
        number = -int(m.group(1)) if m and int(m.group(1)) < 0 else None
    if number is None:
        return None
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = "unknown signal"
    return f"killed by signal {number} ({name})"


def root_cause(lines: list[str]) -> str:
    """The stage's own exception line (``SomeError: ...``), not the launcher's wrapper around it."""
    text = "".join(lines)
    candidates = [
        ln.strip()
        for ln in text.splitlines()
        if ln[:1].isalpha()
        and ("Error" in ln.split(":", 1)[0] or "Exception" in ln.split(":", 1)[0])
        and "CalledProcessError" not in ln
    ]
    return candidates[-1] if candidates else (text.strip().splitlines() or ["no output"])[-1]


def summarize(runs: list[StageRun]) -> list[dict]:
    """One row per stage for the round manifest and the Prefect table artifact."""
    return [
        {
            "stage": r.stage,
            "cached": r.cached,
            "seconds": None if r.seconds is None else round(r.seconds, 1),
            "rerun_seconds": None if r.rerun_seconds is None else round(r.rerun_seconds, 1),
            "output_dir": r.output_dir,
            "cache_key": r.cache_key[:16],
            "checkpoint_hash": (r.manifest.get("outputs", {}).get("checkpoint_hash") or "")[:16],
        }
        for r in runs
    ]


def dump(obj) -> str:
    """Strict JSON (no NaN/Infinity: null plus a ``<key>_null_reason``), sorted keys, for round.json."""
    return dumps_strict(obj, indent=2, sort_keys=True, default=str) + "\n"


#: The loader each stage reads a data key with (``data.loaders.check_data_file``'s ``kind``): checked row by row
#: before a round starts. Other ``*_data`` keys (traffic tables, label files, ...) get the file-level check only.
DATA_KINDS = {
    ("sft", "train_data"): "sft",
    ("dpo", "train_data"): "pairs",
    ("reward_model", "train_data"): "pairs",
    ("grpo", "train_data"): "eval",
    ("rloo", "train_data"): "eval",
    **{("gates", key): "eval" for key in ("winrate_data", "safe_data", "redteam_data", "capability_data",
                                          "sycophancy_data")},
}


def check_stage_config(stage: str, recipe: Path, overrides: list[str]) -> None:
    """Parse a stage's recipe plus the user's overrides the way the stage will, before any stage runs.

    Raises:
        ValueError: a renamed key (naming its new name, ``rlhf.config.RENAMED_KEYS``), an unknown key (with the
            closest known keys) or a value the config rejects, naming the stage and the recipe; FileNotFoundError: a local data file the recipe or an override names is missing.
    """
    import contextlib
    import dataclasses
    import difflib
    import io

    from trl import TrlParser

    argv = ["--config", str(recipe), "--output_dir", "/tmp/rlhf-config-check", *overrides]
    config_classes = registry_stage(stage).config_classes()
    known = {f.name for c in config_classes for f in dataclasses.fields(c)}
    cfg = yaml.safe_load(recipe.read_text()) or {}
    check_renamed_keys(cfg, f"{stage} ({recipe})")
    check_renamed_keys(overrides[::2], f"{stage} overrides")
    given = [*cfg, *(a[2:] for a in overrides[::2] if a.startswith("--"))]
    unknown = [k for k in given if k not in known]
    if unknown:
        hints = {k: difflib.get_close_matches(k, known, n=2) for k in unknown}
        raise ValueError(
            f"{stage} ({recipe}): unknown key(s) "
            + ", ".join(
                f"{k!r}" + (f" (did you mean {' or '.join(map(repr, h))}?)" if h else "") for k, h in hints.items()
            )
        )
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):  # argparse prints its whole usage before the one useful line
            parsed = TrlParser(config_classes).parse_args_and_config(argv)
    except (ValueError, SystemExit) as err:
        lines = [ln for ln in stderr.getvalue().splitlines() if "error:" in ln]
        reason = lines[-1].split("error:", 1)[1].strip() if lines else str(err)
        raise ValueError(f"{stage} ({recipe}): {reason}") from None
    for key in ("reward_judge", "tripwire_gold_judge"):  # a judge's keys and backend: now, not after training
        value = next((getattr(a, key) for a in parsed if hasattr(a, key)), None)
        if value:
            from judging.judges import JudgeConfig

            judge = JudgeConfig.from_dict(value, where=f"{stage}.{key}")
            model = judge.model or ""
            if judge.backend == "sequence_classifier" and model.startswith(("/", ".", "~")) \
                    and not Path(model).expanduser().exists():
                raise FileNotFoundError(f"{stage}.{key}.model = {model}: no such model folder")
    for key in known:
        value = next((getattr(a, key) for a in parsed if hasattr(a, key)), None)
        if key.endswith("_data") and isinstance(value, str) and not value.startswith("demo:"):
            p = Path(value).expanduser()
            if (value.startswith(("/", ".", "~")) or p.suffix) and not p.exists():
                raise FileNotFoundError(f"{stage}.{key} = {value}: no such file")
            if p.is_file() or p.is_dir():  # a bad file: said now, not by a stage after models loaded and trained
                from data.loaders import check_data_file
                from data.validation import DataValidationError

                mode = next((getattr(a, "data_mode") for a in parsed if hasattr(a, "data_mode")), None)
                rate = next((getattr(a, "max_reject_rate") for a in parsed if hasattr(a, "max_reject_rate")), None)
                policy = {"mode": mode, "max_reject_rate": rate} if key == "train_data" and mode and rate is not None \
                    else {}
                try:
                    check_data_file(p, kind=DATA_KINDS.get((stage, key)), **policy)
                except (DataValidationError, OSError) as err:  # OSError: a folder without data files, ...
                    raise ValueError(f"{stage}.{key}: {err}") from None
    def setting(name: str):
        return next((getattr(a, name) for a in parsed if hasattr(a, name)), None)

    train = setting("train_data")
    if ("judge" in (setting("reward_functions") or []) and isinstance(train, str)
            and (train.startswith("demo:") or Path(train).expanduser().exists())):
        # the judge reward compares each completion with its prompt's reference: a prompt without one fails the
        # stage only after SFT, DPO and the reward model trained (a hub dataset is read by the stage alone)
        from data.validation import DataValidationError
        from judging.online_reward import check_reference_file

        try:
            check_reference_file(train if train.startswith("demo:") else str(Path(train).expanduser()),
                                 mode=setting("data_mode") or "strict", max_reject_rate=setting("max_reject_rate"),
                                 limit=setting("max_train_samples"))
        except (DataValidationError, OSError, ValueError) as err:
            raise ValueError(f"{stage}.train_data: {err}") from None
