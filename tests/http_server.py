"""Waiting for a test server started on loopback (``transformers serve``, the policy judge) to answer ``/health``."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from pathlib import Path


def wait_for_health(proc: subprocess.Popen, url: str, log: Path, *, timeout_s: float, what: str) -> None:
    """Poll ``<url>/health`` every 0.2 s until it answers 200.

    Args:
        proc: the server process (its exit ends the wait at once).
        url: the server's root, e.g. ``http://127.0.0.1:8000`` (a trailing ``/v1`` is dropped).
        log: the server's output file, quoted in the error.
        timeout_s: seconds to wait.
        what: the server's name in the error.

    Raises:
        RuntimeError: the process exited or ``timeout_s`` passed; the message ends with the log's last 2000 characters.
    """
    health = url.removesuffix("/").removesuffix("/v1") + "/health"
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(health, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}: {Path(log).read_text()[-2000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not healthy after {timeout_s:.0f} s: {Path(log).read_text()[-2000:]}")
        time.sleep(0.2)
