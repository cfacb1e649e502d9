"""Experiment tracking with W&B, offline by default (DESIGN.md pitfall: decide offline mode up front, never block).

Stages log through the HF Trainer's W&B callback (``report_to=["wandb"]``, replaced by the trainer stage's
``StepWandbCallback``, which logs at the optimizer step); this module fixes the environment before the trainer starts
(mode, project, group (the round id), run name and directory) and opens the run (:func:`init_run`) with the run id
kept in the stage folder and ``resume="allow"``.

A resumed stage keeps its run: online, W&B continues the run of that id; offline (the default), every attempt
writes its own ``wandb/offline-run-<time>-<id>`` folder under the same id, and its ``_step`` continues from the step
the stage resumed from, so ``wandb sync`` of the folders (which syncs the files of one run in order of start time)
gives one run.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

DEFAULT_PROJECT = "rlhf-flywheel"
RUN_ID_FILE = "wandb_run_id"  # in the stage folder: a resumed stage continues the same W&B run
_requested = False  # setup_wandb ran in this process

# W&B records the process's command line (``args``), program, host, git state and code in the run's metadata
# (``wandb-metadata.json`` and the ``.wandb`` file): measured with wandb 0.31, a string on the command line is in the
# offline run file unless ``x_disable_meta`` is set. The stages' command lines carry no secret (rlhf/credentials.py),
# and this keeps W&B from recording them at all. ``WANDB__X`` sets the private setting ``x_X``. The manifests record
# code version, machine and precision instead.
NO_PROCESS_RECORD_SETTINGS = {"x_disable_meta": True, "disable_code": True, "disable_git": True}
NO_PROCESS_RECORD_ENV = {"WANDB__DISABLE_META": "true", "WANDB_DISABLE_CODE": "true", "WANDB_DISABLE_GIT": "true"}
#: Seconds between wandb-core's writes of the run's ``.wandb`` file (``x_transaction_log_flush_interval``, default
#: 15). A killed stage process takes wandb-core with it, and what it had not written is lost: measured here with
#: wandb 0.31, a SIGKILLed process that logged 10 steps over 5 s left 0 of them in its offline file at the default
#: 15 s, 9 of 10 at 1 s and at 0.25 s (the last, logged 0.5 s before the kill at 1 s, within 0.25 s at 0.25 s).
TRANSACTION_LOG_FLUSH_S = 0.25
_run_id: str | None = None
_job_type: str | None = None  # the stage's name (setup_wandb): the run's W&B job_type
_config: dict = {}  # config entries given before the run was opened (add_config), for init_run


def wandb_mode() -> str:
    """``online`` only when the user asked for it (WANDB_MODE=online) or gave a key (WANDB_API_KEY); else ``offline``.

    ``WANDB_MODE=disabled`` is respected. Offline runs can be synced later with ``wandb sync <dir>``.
    """
    explicit = os.environ.get("WANDB_MODE")
    if explicit:
        return explicit
    return "online" if os.environ.get("WANDB_API_KEY") else "offline"


def run_display_name(run_name: str, group: str | None) -> str:
    """The W&B run's name: ``<round_id>/<stage>`` (``run_name`` alone without a round), so runs of different rounds
    are told apart in W&B's run lists, which show names, not groups."""
    return f"{group}/{run_name}" if group else run_name


def setup_wandb(*, run_name: str, group: str | None, output_dir: str | os.PathLike, project: str | None = None,
                job_type: str | None = None) -> str:
    """Set the W&B environment for one stage run; returns the mode used.

    Args:
        run_name: e.g. ``sft``; the run is named :func:`run_display_name` (``<round_id>/sft``).
        group: the round id, so all stages of a round are one W&B group.
        output_dir: the stage's output directory; runs go to ``<output_dir>/wandb``.
        project: W&B project (default ``$WANDB_PROJECT`` or ``rlhf-flywheel``).
        job_type: the run's W&B ``job_type``: the stage's name (default ``run_name``).
    """
    global _requested, _job_type
    _requested = True
    _job_type = job_type or run_name
    _config.clear()
    _config.update({"round_id": group, "stage": _job_type})  # filterable in W&B (the round's report filters on it)
    mode = wandb_mode()
    os.environ["WANDB_MODE"] = mode
    os.environ.setdefault("WANDB_PROJECT", project or DEFAULT_PROJECT)
    os.environ["WANDB_NAME"] = run_display_name(run_name, group)
    os.environ["WANDB_JOB_TYPE"] = _job_type
    if group:
        os.environ["WANDB_RUN_GROUP"] = group
    wandb_dir = Path(output_dir)
    wandb_dir.mkdir(parents=True, exist_ok=True)
    global _run_id
    _run_id = stage_run_id(wandb_dir)
    os.environ["WANDB_RUN_ID"] = _run_id
    os.environ["WANDB_RESUME"] = "allow"  # the first run creates it, a resumed stage continues it
    os.environ["WANDB_DIR"] = str(wandb_dir.resolve())
    os.environ.setdefault("WANDB_SILENT", "true")
    # The Trainer's callback would otherwise upload checkpoints as artifacts; checkpoints stay on disk.
    os.environ["WANDB_LOG_MODEL"] = "false"
    os.environ.update(NO_PROCESS_RECORD_ENV)
    logger.info(
        "W&B %s: project=%s group=%s run=%s id=%s dir=%s", mode, os.environ["WANDB_PROJECT"], group, run_name, _run_id,
        wandb_dir,
    )
    return mode


def stage_run_id(output_dir: str | os.PathLike) -> str:
    """The W&B run id of the stage in ``output_dir``: read from ``<output_dir>/wandb_run_id``, or made (8 random
    lowercase letters and digits, as W&B makes them) and written there atomically on the stage's first start. The
    flow keeps the folder of a stage it resumes, so the resumed process logs to the same run."""
    import secrets
    import string

    from .manifest import atomic_write_text

    path = Path(output_dir) / RUN_ID_FILE
    if path.is_file() and path.read_text().strip():
        return path.read_text().strip()
    alphabet = string.ascii_lowercase + string.digits
    run_id = "".join(secrets.choice(alphabet) for _ in range(8))
    atomic_write_text(path, run_id + "\n")
    return run_id


def init_run(**kwargs):
    """``wandb.init`` for this process's stage run: the id :func:`setup_wandb` kept in the stage folder with
    ``resume="allow"`` (the first start creates the run; a resumed stage continues it online, and writes a new
    offline folder under the same id offline), project, group, name and directory from its environment, mode
    :func:`wandb_mode`, and the run's file written every :data:`TRANSACTION_LOG_FLUSH_S`, recording no process metadata
    (:data:`NO_PROCESS_RECORD_SETTINGS`). ``kwargs`` go to
    ``wandb.init``; ``job_type`` defaults to the stage's name, and ``config`` is merged over the round id, the stage
    and what :func:`add_config` gathered. Without :func:`setup_wandb` (no kept id) the run gets a new id.
    Returns the run."""
    import wandb

    run_id = _run_id or os.environ.get("WANDB_RUN_ID")
    job_type = _job_type or os.environ.get("WANDB_JOB_TYPE")
    if job_type:
        kwargs.setdefault("job_type", job_type)
    kwargs["config"] = {**_config, **(kwargs.get("config") or {})}
    kwargs.setdefault("settings", wandb.Settings(x_transaction_log_flush_interval=TRANSACTION_LOG_FLUSH_S,
                                                **NO_PROCESS_RECORD_SETTINGS))
    return wandb.init(
        project=os.environ.get("WANDB_PROJECT", DEFAULT_PROJECT),
        group=os.environ.get("WANDB_RUN_GROUP"),
        name=os.environ.get("WANDB_NAME"),
        dir=os.environ.get("WANDB_DIR"),
        mode=wandb_mode(),
        **({"id": run_id, "resume": "allow"} if run_id else {}),
        **kwargs,
    )


def add_config(values: dict) -> None:
    """Add ``values`` to the stage run's W&B config: to the open run now (changed values allowed: the Trainer's
    callback logged its arguments first), and to the config :func:`init_run` opens a later run with."""
    _config.update(values)
    try:
        import wandb
    except ImportError:  # pragma: no cover - wandb is a dependency
        return
    if wandb.run is not None:
        wandb.run.config.update(values, allow_val_change=True)


def wandb_run_id() -> str | None:
    """The W&B run id :func:`setup_wandb` chose in this process (None when W&B was not set up)."""
    return _run_id


def log_summary(
    metrics: dict,
    *,
    table: dict[str, list[dict]] | None = None,
    images: dict[str, str] | None = None,
    report_to: list[str] | str | None = None,
    config: dict | None = None,
    inputs: list[ReferenceArtifact] | None = None,
    outputs: list[ReferenceArtifact] | None = None,
) -> None:
    """Log final metrics, optional tables (name -> rows) and images (name -> PNG path) to W&B, then finish.

    ``config`` is added to the run's config (:func:`add_config`); ``inputs`` are recorded as used by the run and
    ``outputs`` as logged by it (:func:`use_artifacts`, :func:`log_artifacts`), so W&B's lineage graph links the
    stages of a round.

    Does nothing unless W&B was asked for: ``report_to`` (the stage's ``--report_to``) names ``wandb``, or, when
    ``report_to`` is not given, ``setup_wandb`` ran in this process. So ``--report_to none`` writes no W&B run,
    neither in the stage folder nor in ``./wandb``.
    """
    wanted = _requested if report_to is None else "wandb" in ([report_to] if isinstance(report_to, str) else report_to)
    if not wanted:
        return
    try:
        import wandb
    except ImportError:  # pragma: no cover - wandb is a dependency
        return
    if os.environ.get("WANDB_MODE") == "disabled":
        return
    if config:
        add_config(config)
    run = wandb.run or init_run()
    for k, v in metrics.items():
        run.summary[k] = v
    for name, rows in (table or {}).items():
        if rows:
            cols = table_columns(rows)
            run.log({name: wandb.Table(columns=cols, data=[[_cell(r.get(c)) for c in cols] for r in rows])})
    for name, path in (images or {}).items():
        run.log({name: wandb.Image(path)})
    use_artifacts(run, inputs or [])
    log_artifacts(run, outputs or [])
    run.finish()


# ---- artifacts: datasets and checkpoints by reference -----------------------------------------------------------
# W&B's lineage graph links runs through artifacts: a stage logs what it wrote (its checkpoint) and uses what it
# read (its data, the stage before it's checkpoint). Files stay where they are: an artifact holds a ``file://``
# reference per file (W&B records each file's MD5 and size, not the bytes), and the content hash the manifests
# record is in the artifact's metadata. The next stage builds the same artifact from the path and hash its
# manifest inputs name (same name, type and files, so the same digest): W&B resolves it to the version the earlier
# stage logged.

_ARTIFACT_NAME_BAD = __import__("re").compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class ReferenceArtifact:
    """A file or folder logged to W&B by reference.

    Attributes:
        name: the artifact's name (:func:`artifact_name`), e.g. ``sft-checkpoint``; versions across rounds.
        type: W&B artifact type: ``model``, ``dataset`` or ``gate-report``.
        path: the local file or folder (referenced as ``file://<absolute path>``).
        content_hash: the manifest's hash of it (``rlhf.lineage.content_hash`` or a data fingerprint).
        metadata: more metadata (the producing stage, the round id).
    """

    name: str
    type: str
    path: str
    content_hash: str
    metadata: dict = field(default_factory=dict)

    def uri(self) -> str:
        return Path(self.path).resolve().as_uri()

    def to_wandb(self):
        """The ``wandb.Artifact``, its reference added (W&B checksums the files: they must exist)."""
        import wandb

        art = wandb.Artifact(self.name, type=self.type, metadata={"content_hash": self.content_hash,
                                                                   "path": str(Path(self.path).resolve()),
                                                                   **self.metadata})
        art.add_reference(self.uri(), name=Path(self.path).name)
        return art


def artifact_name(*parts: str) -> str:
    """A W&B artifact name from ``parts`` joined by ``-``: characters other than letters, digits, ``.``, ``_``
    and ``-`` become ``-`` (W&B refuses them)."""
    return _ARTIFACT_NAME_BAD.sub("-", "-".join(p for p in parts if p)).strip("-")[:128]


def producer_artifact(path: str | os.PathLike, content_hash: str | None, type: str = "model"):
    """The artifact a stage logged for ``path``, found from the manifest of the stage folder that holds it
    (``<stage folder>/<output>`` with ``outputs.<key> == path``): named ``<stage>-<key>``. A path no stage manifest
    names (a user's checkpoint, a hub id) is named after its folder. None for a path that does not exist here or
    without a hash."""
    import json

    from .manifest import MANIFEST_NAME

    p = Path(path)
    if not content_hash or not str(path) or not p.exists():  # Path("") is the working directory
        return None
    manifest = p.resolve().parent / MANIFEST_NAME
    if manifest.is_file():
        try:
            m = json.loads(manifest.read_text())
        except ValueError:
            m = {}
        for key, value in (m.get("outputs") or {}).items():
            if isinstance(value, str) and value and Path(value).resolve() == p.resolve() and m.get("stage"):
                return ReferenceArtifact(artifact_name(m["stage"], key), type, str(p), content_hash,
                                         {"stage": m["stage"], "round_id": m.get("round_id")})
    return ReferenceArtifact(artifact_name(type, p.name), type, str(p), content_hash)


def dataset_artifact(source: str, path: str | os.PathLike | None, fingerprint: str):
    """The artifact of a data source (``demo:<name>``, a local path): ``path`` is its local file (None, or absent:
    a hub dataset, logged as no artifact). Named ``data-<file name>``."""
    if path is None or not Path(path).exists() or not fingerprint:
        return None
    return ReferenceArtifact(artifact_name("data", Path(path).name), "dataset", str(path), fingerprint,
                             {"source": source})


def use_artifacts(run, artifacts: list[ReferenceArtifact | None]) -> None:
    """Record ``artifacts`` as inputs of ``run``. Online: ``run.use_artifact`` of the built artifact (W&B logs it if
    no run did, else resolves it to the version of the same digest). Offline ``use_artifact`` is refused by wandb
    (it may query the server); the transaction log gets the record ``use_artifact`` itself sends for an artifact it
    builds (``_log_artifact(..., use_after_commit=True)``, wandb 0.31 ``wandb_run.py``), which ``wandb sync``
    replays as a use of the run."""
    seen = set()
    for a in artifacts:
        if a is None or (a.name, a.path) in seen:  # one file named by two settings (two suites) is one input
            continue
        seen.add((a.name, a.path))
        art = a.to_wandb()
        if run.settings._offline:
            run._log_artifact(art, is_user_created=True, use_after_commit=True)
        else:
            run.use_artifact(art)


def log_artifacts(run, artifacts: list[ReferenceArtifact | None]) -> None:
    """Log ``artifacts`` as outputs of ``run``, aliased with the round id (``round_id`` in its metadata)."""
    for a in artifacts:
        if a is not None:
            round_id = a.metadata.get("round_id")
            run.log_artifact(a.to_wandb(), aliases=[round_id] if round_id else None)


LEADING_COLUMNS = ("gate", "verdict", "reason")


def table_columns(rows: list[dict]) -> list[str]:
    """Columns of a table over the union of ALL rows' keys (rows of different gates carry different metrics).

    Order: ``gate``, ``verdict``, ``reason`` first (those present), then every other key in order of first
    appearance. A row without a key gets an empty cell there.
    """
    seen: dict[str, None] = {}
    for row in rows:
        seen.update(dict.fromkeys(row))
    return [c for c in LEADING_COLUMNS if c in seen] + [c for c in seen if c not in LEADING_COLUMNS]


def _cell(value):
    """W&B tables take scalars; nested values (lists, dicts) are shown as JSON text."""
    import json

    return value if value is None or isinstance(value, (str, int, float, bool)) else json.dumps(value, default=str)
