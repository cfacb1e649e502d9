"""Run a stage command in its own process group and stop all of it on an interrupt.

Why a process group: ``accelerate launch`` starts the trainer as a child. Killing only the launcher leaves the
trainer training on, and a terminal's Ctrl-C reaches every process of the foreground group (the Prefect server
included). So each stage starts in a new session (``start_new_session=True``): the terminal's SIGINT reaches only
the flow process, which forwards it to the stage's whole group, waits ``grace_s``, then sends SIGTERM and finally
SIGKILL. When the launcher exits for any reason, whatever is left in its group (an orphaned trainer) is killed.

``install_signal_handlers`` (the ``rlhf`` CLI calls it) turns SIGTERM into the same path as Ctrl-C and arms a
watchdog: the process exits 130 at most ``watchdog_s`` seconds after the first signal, even if Prefect keeps
retrying a server that the terminal's Ctrl-C killed.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable

INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT, what shells report for Ctrl-C
_last_signal = signal.SIGINT


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - a member we cannot signal still exists
        return True
    return True


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_group(proc: subprocess.Popen, sig: int = signal.SIGINT, grace_s: float = 10.0) -> None:
    """Send ``sig`` to the group led by ``proc``; escalate to SIGTERM, then SIGKILL, until no member is left."""
    pgid = proc.pid
    try:
        for s, wait in ((sig, grace_s), (signal.SIGTERM, 3.0), (signal.SIGKILL, 3.0)):
            _signal_group(pgid, s)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                proc.poll()  # reap the launcher, so a zombie does not keep the group "alive"
                if not _group_alive(pgid):
                    return
                time.sleep(0.05)
    except KeyboardInterrupt:  # a second Ctrl-C: no more patience
        _signal_group(pgid, signal.SIGKILL)
        proc.poll()
        raise


def run_process_group(cmd: list[str], *, env: dict, on_line: Callable[[str], None], grace_s: float = 10.0) -> int:
    """Run ``cmd`` in a new session, feed each output line to ``on_line``, return the launcher's exit code.

    A local stage of one process (``env K=V ... python -m module ...``) is forked from the warm interpreter where
    that is possible (flows/warm_start.py), in a new session all the same; any other command is started as given.

    Raises:
        KeyboardInterrupt / SystemExit: re-raised after the whole group was stopped (see module docstring).
    """
    from .warm_start import spawn

    proc = spawn(cmd, env) or subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, bufsize=1, start_new_session=True
    )

    def reap_orphans() -> None:  # the launcher is gone: nothing of its group may run on (or hold the pipe open)
        proc.wait()
        if _group_alive(proc.pid):
            stop_group(proc, signal.SIGTERM, grace_s=5.0)

    watcher = threading.Thread(target=reap_orphans, daemon=True, name="stage-reaper")
    watcher.start()
    # Lines are read by a thread and handed over through a queue: the main thread then never blocks in a read()
    # that a signal delivered to another thread would not interrupt, so Ctrl-C is acted on within 0.2 s.
    lines: queue.Queue = queue.Queue()

    def pump() -> None:
        try:
            for line in proc.stdout:
                lines.put(line)
        finally:
            lines.put(None)

    reader = threading.Thread(target=pump, daemon=True, name="stage-output")
    reader.start()
    try:
        while True:
            try:
                line = lines.get(timeout=0.2)
            except queue.Empty:
                continue
            if line is None:
                break
            on_line(line)
        while proc.poll() is None:
            time.sleep(0.05)
        return proc.returncode
    except BaseException:
        stop_group(proc, _last_signal, grace_s)
        raise
    finally:
        reader.join(timeout=5)
        proc.stdout.close()


def install_signal_handlers(watchdog_s: float = 15.0) -> None:
    """SIGINT and SIGTERM raise KeyboardInterrupt in the main thread; the process exits 130 within ``watchdog_s``."""

    def handler(signum, frame):
        global _last_signal
        _last_signal = signal.Signals(signum)
        if not handler.fired:
            handler.fired = True
            timer = threading.Timer(watchdog_s, lambda: os._exit(INTERRUPTED_EXIT_CODE))
            timer.daemon = True
            timer.start()
        raise KeyboardInterrupt(f"interrupted by {_last_signal.name}")

    handler.fired = False
    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
