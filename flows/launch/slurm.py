"""Launch a stage on Slurm: render an sbatch script, submit it with ``sbatch``, poll ``sacct`` / ``squeue`` until
the job ends, and exit with the job's exit code.

The round flow uses this through :func:`slurm_launcher`: its stage task (flows/round.py ``stage_task``) runs
``python -m flows.launch.slurm run <script>`` in place of the local ``accelerate launch``, so the cache key, the
stage folder, ``stage.log`` (the job's output is tailed into it), the manifest check and Ctrl-C (``scancel``) work
as for a local stage. The flow host must be a Slurm submit host (``sbatch`` on PATH) that shares the file system
of the compute nodes (the repository, the runs folder and the Python environment).

What the script does on the allocation (templates/stage.sbatch.j2): refuses to start when Slurm gave fewer nodes
than asked; takes the main process address from the first host of ``scontrol show hostnames
$SLURM_JOB_NODELIST``; runs one ``srun`` task a node, each ``accelerate launch --machine_rank $SLURM_NODEID
--num_machines N --num_processes N*G``; exports ``RLHF_EXPECTED_WORLD_SIZE=N*G`` and
``RLHF_COLLECTIVE_TIMEOUT_S``; writes srun's exit code to ``<output_dir>/.slurm_exit`` (read when the cluster keeps
no accounting).

Why not the ``prefect-slurm`` worker (on PyPI, 0.1.7): it talks to ``slurmrestd`` and runs a whole flow run as one
job ("tasks are not new Slurm jobs"); a stage here needs its own multi-node allocation with srun, so the flow
stays on the submit host and each stage is a job.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rlhf.credentials import is_secret_key

TEMPLATES = Path(__file__).resolve().parent / "templates"
EXIT_FILE = ".slurm_exit"
SCRIPT_FILE = "job.sbatch"
DEFAULT_ACCELERATE_CONFIG = Path(__file__).resolve().parents[2] / "recipes" / "accelerate_configs" / "zero3.yaml"
# Slurm job states that are not final (squeue's and sacct's long names)
ACTIVE_STATES = frozenset(
    [
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "SUSPENDED",
        "REQUEUED",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "RESIZING",
        "SIGNALING",
        "STAGE_OUT",
        "RESV_DEL_HOLD",
        "STOPPED",
    ]
)

# Pending reasons no amount of waiting resolves (the request exceeds what the partition/account allows): the job
# is cancelled and the stage fails, instead of the flow waiting forever on a job that cannot start.
NEVER_STARTS = frozenset(
    [
        "PartitionNodeLimit",
        "PartitionTimeLimit",
        "PartitionConfig",
        "BadConstraints",
        "InvalidAccount",
        "InvalidQOS",
        "DependencyNeverSatisfied",
        "QOSMaxNodePerJobLimit",
        "QOSMaxGRESPerJob",
        "QOSMaxCpuPerJobLimit",
        "AssocMaxNodesPerJobLimit",
        "AssocMaxGRESPerJob",
        "AssocMaxCpuPerJobLimit",
    ]
)


class SlurmError(RuntimeError):
    """Slurm could not be reached or refused the job (the message names the command and what it said)."""


class SlurmJob(BaseModel):
    """Resources and environment of a stage's Slurm job (a section of the round's parameter form)."""

    # a misspelt field is an error, not a default; a refused value is not echoed (it may be a secret)
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    nodes: int = Field(1, ge=1, description="Nodes (accelerate machines).")
    gpus_per_node: int = Field(8, ge=0, description="GPUs a node (0: a CPU job).")
    processes_per_node: int | None = Field(None, ge=1, description="Processes a node (default: one a GPU).")
    cpus_per_task: int = Field(64, ge=1, description="CPU cores for each node's launcher (shared by its processes).")
    time_limit: str = Field("24:00:00", description="sbatch --time (HH:MM:SS or D-HH:MM:SS).")
    partition: str | None = Field(None, description="sbatch --partition (default: the cluster's).")
    account: str | None = Field(None, description="sbatch --account.")
    port: int = Field(29500, ge=1024, le=65535, description="Main process port on the first node.")
    collective_timeout_s: int = Field(
        1800, ge=1, description="Timeout of every collective (RLHF_COLLECTIVE_TIMEOUT_S)."
    )
    python: str | None = Field(None, description="Python on the compute nodes (default: the flow's, shared FS).")
    workdir: str | None = Field(None, description="Repository root on the compute nodes (default: the flow's cwd).")
    setup: list[str] = Field(default_factory=list, description='Shell lines run first, e.g. "module load cuda".')
    extra_sbatch: list[str] = Field(default_factory=list, description='More #SBATCH options, e.g. "--exclusive".')
    poll_s: float = Field(30.0, gt=0, description="Seconds between sacct/squeue polls.")

    @field_validator("time_limit")
    @classmethod
    def _slurm_time(cls, value: str) -> str:
        """sbatch's --time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S (or UNLIMITED / INFINITE)."""
        if value.upper() in ("UNLIMITED", "INFINITE") or re.fullmatch(
            r"\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2}", value
        ):
            return value
        raise ValueError(f"time_limit {value!r} is not a Slurm time (M, M:S, H:M:S, D-H, D-H:M or D-H:M:S)")

    @field_validator("partition", "account", "python", "workdir")
    @classmethod
    def _one_line(cls, value: str | None) -> str | None:
        """Values that go into ``#SBATCH`` lines or commands: a newline would end the header there."""
        if value is not None and (not value.strip() or any(c in value for c in "\n\r\0")):
            raise ValueError(f"{value!r}: must be one non-empty line")
        return value

    @field_validator("setup", "extra_sbatch")
    @classmethod
    def _lines(cls, value: list[str]) -> list[str]:
        bad = [v for v in value if any(c in v for c in "\n\r\0")]
        if bad:
            raise ValueError(f"each entry must be one line (one list item a line), got {bad[0]!r}")
        for i, line in enumerate(value):
            # the lines are written into job.sbatch: a secret assigned there (export OPENAI_API_KEY=sk-...) would be
            # on disk in clear; sbatch passes the submitting environment to the job instead (--export=ALL)
            for name in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=(?!\s|$)", line):
                if is_secret_key(name):
                    raise ValueError(
                        f"entry {i} assigns {name}: a secret is never written into job.sbatch; set {name} in the "
                        f"environment the flow runs in (sbatch exports it to the job)"
                    )
        return value

    @model_validator(mode="after")
    def _processes(self) -> SlurmJob:
        if self.gpus_per_node == 0 and self.processes_per_node is None:
            raise ValueError("a CPU job (gpus_per_node 0) needs processes_per_node")
        return self

    @property
    def per_node(self) -> int:
        """Processes a node: ``processes_per_node``, else one a GPU."""
        return self.processes_per_node or self.gpus_per_node

    @property
    def world_size(self) -> int:
        return self.nodes * self.per_node


def job_name(round_id: str, stage: str) -> str:
    """``rlhf-<round>-<stage>``, restricted to characters every Slurm tool prints unquoted."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", f"rlhf-{round_id}-{stage}")


def _environment() -> Environment:
    env = Environment(loader=FileSystemLoader(TEMPLATES), undefined=StrictUndefined, keep_trailing_newline=True)
    env.filters["q"] = lambda v: shlex.quote(str(v))
    env.filters["qjoin"] = lambda v: shlex.join(str(x) for x in v)
    return env


def render_sbatch(
    job: SlurmJob,
    *,
    stage: str,
    round_id: str,
    module: str,
    recipe: str | Path,
    output_dir: str | Path,
    extra_args: list[str] = (),
    accelerate_config: str | Path | None = None,
) -> str:
    """The sbatch script (text) that runs ``accelerate launch -m <module> --config <recipe> --output_dir <dir>
    <extra_args>`` on ``job.nodes`` x ``job.per_node`` processes. Paths are written as given: pass absolute
    ones (compute nodes start in ``job.workdir``). ``accelerate_config`` defaults to the ZeRO-3 config."""
    output_dir = Path(output_dir)
    return (
        _environment()
        .get_template("stage.sbatch.j2")
        .render(
            stage=stage,
            round_id=round_id,
            job_name=job_name(round_id, stage),
            nodes=job.nodes,
            gpus_per_node=job.gpus_per_node,
            per_node=job.per_node,
            world_size=job.world_size,
            cpus_per_task=job.cpus_per_task,
            time_limit=job.time_limit,
            partition=job.partition,
            account=job.account,
            extra_sbatch=job.extra_sbatch,
            setup=job.setup,
            port=job.port,
            collective_timeout_s=job.collective_timeout_s,
            python=job.python or sys.executable,
            workdir=job.workdir or os.getcwd(),
            accelerate_config=accelerate_config or DEFAULT_ACCELERATE_CONFIG,
            module=module,
            stage_args=["--config", str(recipe), "--output_dir", str(output_dir), *extra_args],
            log_path=output_dir / "slurm-%j.out",
            exit_file=output_dir / EXIT_FILE,
        )
    )


def slurm_launcher(job: SlurmJob, stage: str, round_id: str):
    """A ``launcher`` for :func:`flows.stages.run_stage`: writes ``<output_dir>/job.sbatch`` and returns the local
    command that submits it and waits (``python -m flows.launch.slurm run ...``)."""

    def launch(module: str, recipe: Path, output_dir: Path, extra_args: list[str], accelerate_config: str | None):
        output_dir = Path(output_dir).resolve()
        script = output_dir / SCRIPT_FILE
        (output_dir / EXIT_FILE).unlink(missing_ok=True)  # a kept folder (resume): no earlier job's exit code
        script.write_text(
            render_sbatch(
                job,
                stage=stage,
                round_id=round_id,
                module=module,
                recipe=Path(recipe).resolve(),
                output_dir=output_dir,
                extra_args=extra_args,
                accelerate_config=Path(accelerate_config).resolve() if accelerate_config else None,
            )
        )
        return [sys.executable, "-m", "flows.launch.slurm", "run", str(script), "--poll-s", str(job.poll_s)]

    # What the job runs under, for the stage's cache key (flows.stages.launch_key): the sbatch script passes
    # --num_processes world_size over the config file's, and uses the ZeRO-3 config when the round names none.
    launch.world_size = job.world_size
    launch.default_accelerate_config = DEFAULT_ACCELERATE_CONFIG
    return launch


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise SlurmError(
            f"{name} not found on PATH: the flow must run on a Slurm submit host (a login node with sbatch, "
            "squeue and sacct), or run the round with launcher=local"
        )
    return path


def submit(script: str | Path) -> str:
    """Submit ``script`` with ``sbatch --parsable``; return the job id.

    Raises:
        SlurmError: ``sbatch`` is not on PATH, or it refused the script (its stderr is in the message).
    """
    sbatch = _tool("sbatch")
    proc = subprocess.run([sbatch, "--parsable", str(script)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SlurmError(f"sbatch {script} failed (exit {proc.returncode}): {proc.stderr.strip() or proc.stdout}")
    return proc.stdout.strip().split(";")[0]  # "<id>[;<cluster>]"


@dataclass(frozen=True)
class JobState:
    """A job's state as Slurm reports it; ``exit_code`` is None while unknown."""

    state: str
    exit_code: int | None
    source: str  # sacct | squeue | scontrol | gone
    reason: str = ""  # squeue's reason of a pending job (e.g. PartitionNodeLimit)

    @property
    def never_starts(self) -> bool:
        return self.state == "PENDING" and self.reason in NEVER_STARTS

    @property
    def done(self) -> bool:
        return self.state not in ACTIVE_STATES


def parse_sacct(text: str) -> JobState | None:
    """The allocation's row of ``sacct -X -n -P -o State,ExitCode`` (e.g. ``CANCELLED by 1000|0:15``); None when
    sacct has no row yet. ExitCode is ``<code>:<signal>``: a signal maps to 128 + signal, as shells report it; a
    final state other than COMPLETED is never 0."""
    rows = [ln for ln in text.splitlines() if ln.strip()]
    if not rows:
        return None
    state, _, exit_code = rows[0].partition("|")
    state = state.split()[0].rstrip("+")
    code, _, sig = exit_code.strip().partition(":")
    value = int(code or 0) or (128 + int(sig) if sig and int(sig) else 0)
    if state not in ACTIVE_STATES and state != "COMPLETED" and value == 0:
        value = 1
    return JobState(state, value if state not in ACTIVE_STATES else None, "sacct")


def parse_scontrol(text: str) -> JobState | None:
    """``JobState`` and ``ExitCode`` of ``scontrol show job -o <id>`` (Slurm keeps a finished job there for
    MinJobAge, 300 s by default); None when it does not know the job."""
    state = re.search(r"\bJobState=(\S+)", text)
    code = re.search(r"\bExitCode=(\d+):(\d+)", text)
    if state is None:
        return None
    parsed = parse_sacct(f"{state.group(1)}|{code.group(1)}:{code.group(2)}" if code else f"{state.group(1)}|0:0")
    return replace(parsed, source="scontrol")


def job_state(job_id: str, exit_file: Path | None = None) -> JobState:
    """Ask ``sacct`` (final states and exit codes, where the cluster keeps accounting), else ``squeue`` (queued or
    running), else ``scontrol show job`` (a recently finished job); a job none of them knows has left the queue
    long ago: its exit code is the one the script wrote to ``exit_file`` (1 when there is none).

    Raises:
        SlurmError: squeue is not on PATH.
    """
    if shutil.which("sacct"):
        out = subprocess.run(
            ["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "State,ExitCode"],
            capture_output=True,
            text=True,
            check=False,
        )
        state = parse_sacct(out.stdout) if out.returncode == 0 else None  # "accounting storage is disabled": rc 1
        if state is not None:
            return state
    out = subprocess.run(
        [_tool("squeue"), "-h", "-j", job_id, "-o", "%T|%r"], capture_output=True, text=True, check=False
    )
    if out.returncode == 0 and out.stdout.strip():
        state, _, reason = out.stdout.strip().splitlines()[0].partition("|")
        return JobState(state, None, "squeue", reason)
    if shutil.which("scontrol"):
        out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=False)
        state = parse_scontrol(out.stdout) if out.returncode == 0 else None
        if state is not None:
            return state
    code = None
    if exit_file is not None and exit_file.is_file():
        code = int(exit_file.read_text().strip() or 1)
    return JobState("COMPLETED" if code == 0 else "GONE", 1 if code is None else code, "gone")


class _Tail:
    """New lines of a growing file (the job's output), printed as they arrive."""

    def __init__(self, path: Path):
        self.path, self.pos = path, 0

    def pump(self) -> None:
        if not self.path.is_file():
            return
        with open(self.path, errors="replace") as f:
            f.seek(self.pos)
            chunk = f.read()
            self.pos = f.tell()
        if chunk:
            sys.stdout.write(chunk)
            sys.stdout.flush()


def run(script: Path, poll_s: float = 30.0, max_poll_failures: int = 10) -> int:
    """Submit ``script``, stream its output, wait for the job; return its exit code. SIGINT/SIGTERM cancel the job
    (``scancel``); so does a pending reason that never resolves (:data:`NEVER_STARTS`, then SlurmError). A failed
    poll (sacct/squeue hiccup) is retried up to ``max_poll_failures`` times in a row: polling
    is I/O; the job itself is never resubmitted."""
    script = Path(script).resolve()
    out_dir = script.parent
    job_id = submit(script)
    print(f"rlhf launch: submitted Slurm job {job_id} ({script})", flush=True)

    def cancel(signum, frame):
        subprocess.run(["scancel", job_id], capture_output=True, check=False)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # return only once the job has really ended (CANCELLED)
            try:
                if job_state(job_id, out_dir / EXIT_FILE).done:
                    break
            except (OSError, subprocess.SubprocessError, SlurmError):
                break
            time.sleep(0.5)
        print(f"rlhf launch: {signal.Signals(signum).name}: cancelled Slurm job {job_id}", flush=True)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGINT, cancel)
    signal.signal(signal.SIGTERM, cancel)
    tail, failures, last = _Tail(out_dir / f"slurm-{job_id}.out"), 0, None
    while True:
        try:
            state = job_state(job_id, out_dir / EXIT_FILE)
            failures = 0
        except (OSError, subprocess.SubprocessError) as err:
            failures += 1
            if failures > max_poll_failures:
                raise SlurmError(f"cannot poll Slurm job {job_id}: {err}") from err
            state = None
        tail.pump()
        if state is not None and state.state != last:
            why = f", {state.reason}" if state.reason and state.reason != "None" else ""
            print(f"rlhf launch: Slurm job {job_id} {state.state} ({state.source}{why})", flush=True)
            last = state.state
        if state is not None and state.never_starts:
            subprocess.run(["scancel", job_id], capture_output=True, check=False)
            raise SlurmError(
                f"Slurm job {job_id} can never start ({state.reason}): it asks for more than the "
                f"partition or account allows (see {script}); cancelled"
            )
        if state is not None and state.done:
            break
        time.sleep(poll_s)
    tail.pump()
    print(f"rlhf launch: Slurm job {job_id} ended {state.state}, exit {state.exit_code}", flush=True)
    return int(state.exit_code or 0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m flows.launch.slurm", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="submit an sbatch script, stream its output, exit with the job's exit code")
    r.add_argument("script", type=Path)
    r.add_argument("--poll-s", type=float, default=30.0)
    args = ap.parse_args(argv)
    try:
        return run(args.script, args.poll_s)
    except SlurmError as err:
        print(f"SlurmError: {err}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
