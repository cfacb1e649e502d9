"""Round and stage folders: safe round ids, the stage-folder marker, the round lock, a stage's failure reason.

Nothing here trains; it keeps a round from deleting, mixing or hiding work:

* Round ids are checked by ``rlhf.round_id.check_round_id`` (one safe folder name, never a path: ``..``,
  ``/abs`` or ``a/b`` would put stage folders outside the runs folder, where a rerun would remove them).
* ``STAGE_MARKER``: the file the flow writes into every stage folder it creates. ``remove_stage_dir`` removes only
  folders that carry it and lie inside the runs folder, so a user's folder at a stage path survives. A stage run
  alone marks the folder it takes (``mark_own_output_dir``) and clears only a folder it may
  (``check_own_output_dir``): empty, marked, or holding its own manifest.
* ``RoundLock``: an OS file lock (``filelock``, which uses ``fcntl.flock`` on POSIX) on ``<round>/.round.lock``,
  held for the whole round and released by the kernel when the process dies. A second round on the same folder
  fails at once with the holder's pid, host and start time (written next to the lock).
* ``install_failure_hook`` / ``read_failure``: a stage writes ``<output_dir>/failure.json`` (exception type and
  message) when it dies on an uncaught exception; the flow reads it, whatever the exception is called.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
import socket
import stat
import sys
from pathlib import Path

STAGE_MARKER = ".rlhf-stage"
LOCK_NAME = ".round.lock"
HOLDER_NAME = ".round.lock.holder.json"
FAILURE_NAME = "failure.json"


class RoundError(RuntimeError):
    """A round cannot start or a folder cannot be touched; the message says which and why."""


def _inside(path: Path, root: Path) -> bool:
    path, root = path.resolve(), root.resolve()
    return path != root and root in path.parents


def check_writable_folder(path: str | os.PathLike, what: str = "runs folder") -> Path:
    """Check that a round can write ``path``: the folder if it exists, else the nearest folder above it that exists
    (where ``mkdir -p`` would start). Nothing is left behind.

    Uses ``os.access(W_OK | X_OK)``, which also says no on a read-only mount (``EROFS``) whatever the mode bits,
    then creates and removes one empty folder there, as ``os.access`` says yes to root on ``/proc`` and the like.

    Returns:
        ``path`` as a Path.

    Raises:
        RoundError: ``path`` (or the folder above it) is a file, or cannot be written; the message names the folder
            and the reason.
    """
    path = Path(path)
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise RoundError(f"{what} {path}: {existing} is a file, not a folder")
    reason = None
    if not os.access(existing, os.W_OK | os.X_OK):
        reason = "is on a read-only file system" if _read_only_mount(existing) else "is not writable by this user"
    else:
        reason = _probe_folder(existing)
    if reason is not None:
        problem = f"{reason}" if existing == path else f"cannot be created: {existing} {reason}"
        raise RoundError(f"{what} {path} {problem}; choose another --runs-dir or fix its permissions")
    return path


def _probe_folder(folder: Path) -> str | None:
    """Create and remove one empty folder in ``folder``: ``os.access`` says yes to root on a pseudo file system
    (``/proc``, ``/sys``) and on some network mounts where ``mkdir`` then fails. Returns the reason, or None."""
    import tempfile

    try:
        probe = tempfile.mkdtemp(prefix=".rlhf-write-check-", dir=folder)
    except OSError as err:
        return f"cannot hold folders ({os.strerror(err.errno) if err.errno else err})"
    try:
        os.rmdir(probe)
    except OSError:  # the folder was made; the round can write there, and the probe's name says what it was
        pass
    return None


def _read_only_mount(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def create_stage_dir(path: str | os.PathLike) -> Path:
    """Create a fresh stage folder and mark it as created by the pipeline (``STAGE_MARKER``)."""
    path = Path(path)
    path.mkdir(parents=True)
    (path / STAGE_MARKER).write_text(
        json.dumps({"created_by": "rlhf-flywheel", "created_at": _now(), "pid": os.getpid()}) + "\n"
    )
    return path


def remove_stage_dir(path: str | os.PathLike, runs_dir: str | os.PathLike | None = None) -> None:
    """Remove a stage folder the pipeline created, refusing anything else.

    Raises:
        RoundError: ``path`` lies outside ``runs_dir`` (when given), or holds no ``STAGE_MARKER`` (a folder the
            pipeline did not create: a user's folder, or one written by an older version); nothing is removed.
    """
    path = Path(path)
    if runs_dir is not None and not _inside(path, Path(runs_dir)):
        raise RoundError(f"refusing to remove {path}: it is not inside the runs folder {runs_dir}")
    if not (path / STAGE_MARKER).is_file():
        raise RoundError(
            f"refusing to remove {path}: it was not created by a pipeline stage (no {STAGE_MARKER} marker). "
            "Move it away or choose another round id / runs folder."
        )
    for p in [path, *path.rglob("*")]:  # frozen checkpoints (pi_ref) are read-only
        if not p.is_symlink():
            p.chmod(p.stat().st_mode | stat.S_IWUSR)
    shutil.rmtree(path)


def check_output_dir(path: str | os.PathLike, stage: str) -> None:
    """Refuse to write stage ``stage``'s outputs into a folder that holds another stage's manifest.

    Raises:
        RoundError: ``<path>/manifest.json`` records a different ``stage``; nothing is touched.
    """
    manifest = Path(path) / "manifest.json"
    if not manifest.is_file():
        return
    try:
        other = json.loads(manifest.read_text()).get("stage")
    except (ValueError, AttributeError):
        other = "<unreadable>"
    if other != stage:
        raise RoundError(
            f"--output_dir {path}: holds the manifest of stage {other!r}, not {stage!r}; "
            "refusing to overwrite another stage's outputs (choose an empty or a gates folder)"
        )


def _marker_stage(path: Path) -> str | None:
    """The stage named in ``path``'s ``STAGE_MARKER`` ("" when the marker names none: one the flow wrote), or None
    when there is no marker."""
    marker = path / STAGE_MARKER
    if not marker.is_file():
        return None
    try:
        return str(json.loads(marker.read_text()).get("stage") or "")
    except (ValueError, AttributeError):
        return "<unreadable>"


def check_own_output_dir(path: str | os.PathLike, stage: str) -> None:
    """Refuse a folder stage ``stage`` must not clear; touches nothing.

    A stage may clear (its own output names only) a folder that does not exist or is empty, that carries a
    ``STAGE_MARKER`` written by the flow or by this stage (:func:`mark_own_output_dir`), or that holds this stage's
    ``manifest.json``. Anything else holds files the pipeline did not write: a user's folder.

    Raises:
        RoundError: one line naming the folder and why: another stage's manifest or marker, a path that is not a
            folder, or foreign files (the first few named) with no marker of this stage.
    """
    check_output_dir(path, stage)
    path = Path(path)
    if not path.exists():
        return
    if not path.is_dir():
        raise RoundError(f"--output_dir {path}: not a folder")
    marked = _marker_stage(path)
    if marked is not None and marked not in ("", stage):
        raise RoundError(f"--output_dir {path}: its {STAGE_MARKER} marker names stage {marked!r}, not {stage!r}; "
                         "refusing to clear it")
    if marked is not None or (path / "manifest.json").is_file():  # check_output_dir: a manifest here is this stage's
        return
    names = sorted(p.name for p in path.iterdir())
    if names:
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        raise RoundError(f"--output_dir {path}: holds files no {stage} run wrote ({shown}) and no {STAGE_MARKER} "
                         f"marker; refusing to clear it (choose an empty folder or one a {stage} run wrote)")


def mark_own_output_dir(path: str | os.PathLike, stage: str) -> Path:
    """Create ``path`` if needed and mark it as stage ``stage``'s (``STAGE_MARKER`` with ``"stage"``), unless a marker
    is already there. Call after :func:`check_own_output_dir`, before the stage writes anything into it."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if not (path / STAGE_MARKER).is_file():
        (path / STAGE_MARKER).write_text(json.dumps(
            {"created_by": "rlhf-flywheel", "stage": stage, "created_at": _now(), "pid": os.getpid()}) + "\n")
    return path


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


class RoundLock:
    """Exclusive lock on a round folder for as long as the round runs (context manager).

    The lock is ``filelock.FileLock`` (``fcntl.flock``): the kernel drops it when the holding process exits or is
    killed, so a crashed round never blocks the next one. Who holds it (pid, host, start time, round id) is written
    to ``.round.lock.holder.json`` so the refusal can name the holder. A folder the lock itself created and the
    round left empty is removed on exit.

    Raises (on enter):
        RoundError: another process holds the lock; the message names it.
    """

    def __init__(self, round_dir: str | os.PathLike, round_id: str | None = None):
        from filelock import FileLock

        self.round_dir = Path(round_dir)
        self.round_id = round_id or self.round_dir.name
        self._lock = FileLock(str(self.round_dir / LOCK_NAME), timeout=0)

    def __enter__(self) -> RoundLock:
        from filelock import Timeout

        self._created = not self.round_dir.exists()
        self.round_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._lock.acquire()
        except Timeout:
            raise RoundError(
                f"round folder {self.round_dir} is in use by another round ({self.holder()}); "
                "wait for it to finish or use another --round-id"
            ) from None
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "started_at": _now(), "round_id": self.round_id}
        (self.round_dir / HOLDER_NAME).write_text(json.dumps(holder) + "\n")
        return self

    def holder(self) -> str:
        try:
            h = json.loads((self.round_dir / HOLDER_NAME).read_text())
            return f"pid {h['pid']} on {h['host']}, started {h['started_at']}"
        except (OSError, ValueError, KeyError):
            return "holder unknown"

    def __exit__(self, *exc) -> None:
        (self.round_dir / HOLDER_NAME).unlink(missing_ok=True)
        # A folder this lock created and the round left empty (it failed before writing anything) goes, so nothing
        # that looks like a round is left; removed while the lock is still held, so no other round is inside it.
        if self._created and {p.name for p in self.round_dir.iterdir()} <= {LOCK_NAME}:
            (self.round_dir / LOCK_NAME).unlink(missing_ok=True)
            self.round_dir.rmdir()
        self._lock.release()


_failure_path: Path | None = None


def install_failure_hook(output_dir: str | os.PathLike) -> None:
    """On an uncaught exception, write ``<output_dir>/failure.json`` (``{"type", "message"}``) before exiting.

    Call at the start of a stage's ``main()``; the flow reads the file with ``read_failure``. Written only into a
    folder that carries ``STAGE_MARKER`` (one the flow created). KeyboardInterrupt
    is recorded too (``type`` ``KeyboardInterrupt``), so an interrupted stage says so. Installed once per process;
    a later call only moves the target folder.
    """
    global _failure_path
    first = _failure_path is None
    _failure_path = Path(output_dir) / FAILURE_NAME
    if not first:
        return
    previous = sys.excepthook

    def hook(kind, value, tb):
        try:  # only into a folder the flow created for this stage: never into a user's or another stage's folder
            if (_failure_path.parent / STAGE_MARKER).is_file():
                _failure_path.write_text(json.dumps({"type": kind.__name__, "message": str(value)}) + "\n")
        except OSError:
            pass
        previous(kind, value, tb)

    sys.excepthook = hook


def read_failure(output_dir: str | os.PathLike) -> str | None:
    """``"<Type>: <message>"`` from a stage's ``failure.json``, or None when it wrote none."""
    try:
        f = json.loads((Path(output_dir) / FAILURE_NAME).read_text())
        return f"{f['type']}: {f['message']}"
    except (OSError, ValueError, KeyError, TypeError):
        return None
