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


def wandb_mode() -> str:
    """``online`` only when the user asked for it (WANDB_MODE=online) or gave a key (WANDB_API_KEY); else ``offline``.

    ``WANDB_MODE=disabled`` is respected. Offline runs can be synced later with ``wandb sync <dir>``.
    """
    explicit = os.environ.get("WANDB_MODE")
    if explicit:
        return explicit
    return "online" if os.environ.get("WANDB_API_KEY") else "offline"


def setup_wandb(*, run_name: str, group: str | None, output_dir: str | os.PathLike, project: str | None = None) -> str:
    """Set the W&B environment for one stage run; returns the mode used.

    Args:
        run_name: e.g. ``sft``; shown as the run's name.
        group: the round id, so all stages of a round are one W&B group.
        output_dir: the stage's output directory; runs go to ``<output_dir>/wandb``.
        project: W&B project (default ``$WANDB_PROJECT`` or ``rlhf-flywheel``).
    """
    global _requested
    _requested = True
    mode = wandb_mode()
    os.environ["WANDB_MODE"] = mode
    os.environ.setdefault("WANDB_PROJECT", project or DEFAULT_PROJECT)
    os.environ["WANDB_NAME"] = run_name
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
    ``wandb.init`` (``job_type``, ``config``). Without :func:`setup_wandb` (no kept id) the run gets a new id.
    Returns the run."""
    import wandb

    run_id = _run_id or os.environ.get("WANDB_RUN_ID")
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


def wandb_run_id() -> str | None:
    """The W&B run id :func:`setup_wandb` chose in this process (None when W&B was not set up)."""
    return _run_id


def log_summary(
    metrics: dict,
    *,
    table: dict[str, list[dict]] | None = None,
    images: dict[str, str] | None = None,
    report_to: list[str] | str | None = None,
) -> None:
    """Log final metrics, optional tables (name -> rows) and images (name -> PNG path) to W&B, then finish.

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
    run = wandb.run or init_run()
    for k, v in metrics.items():
        run.summary[k] = v
    for name, rows in (table or {}).items():
        if rows:
            cols = table_columns(rows)
            run.log({name: wandb.Table(columns=cols, data=[[_cell(r.get(c)) for c in cols] for r in rows])})
    for name, path in (images or {}).items():
        run.log({name: wandb.Image(path)})
    run.finish()


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
