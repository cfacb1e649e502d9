"""A real Label Studio server for the annotation round-trip test: ``label-studio start`` on a free loopback port with
a fresh data directory (SQLite), one admin user with a known legacy API token, stopped afterwards.

Label Studio is a Django application with its own pinned dependencies, so it lives in its own virtual environment
(``.ci/run`` installs it: ``$LABEL_STUDIO_BIN``, default ``~/.cache/rlhf-flywheel/label-studio/bin/label-studio``),
not in the project's. Where it is not installed or does not answer ``/health`` within ``$LABEL_STUDIO_START_S``
seconds (default 900: the first start runs the database migrations, minutes on a loaded 2-core machine),
:func:`start_label_studio` raises ``LabelStudioUnavailable`` with the reason and the test skips with it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

TOKEN = "rlhf-flywheel-test-token"


class LabelStudioUnavailable(RuntimeError):
    pass


def label_studio_bin(install_wait_s: float = 1800) -> Path:
    """The ``label-studio`` executable; waits while ``$LABEL_STUDIO_INSTALLING`` exists (``.ci/run`` installs it in
    the background and removes that file when done, installed or not)."""
    pending = os.environ.get("LABEL_STUDIO_INSTALLING")
    deadline = time.monotonic() + install_wait_s
    while pending and Path(pending).exists():
        if time.monotonic() > deadline:
            raise LabelStudioUnavailable(f"label-studio still installing after {install_wait_s:.0f} s ({pending})")
        time.sleep(5)
    env = os.environ.get("LABEL_STUDIO_BIN")
    candidates = [Path(env)] if env else []
    candidates.append(Path.home() / ".cache" / "rlhf-flywheel" / "label-studio" / "bin" / "label-studio")
    found = shutil.which("label-studio")
    if found:
        candidates.append(Path(found))
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    raise LabelStudioUnavailable(
        "label-studio is not installed (looked at $LABEL_STUDIO_BIN, ~/.cache/rlhf-flywheel/label-studio/bin, PATH); "
        ".ci/run installs it: python -m venv ~/.cache/rlhf-flywheel/label-studio && .../bin/pip install label-studio"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def start_label_studio():
    """Yield ``(base_url, token)`` of a fresh server; ``Authorization: Token <token>`` authenticates as the admin."""
    exe = label_studio_bin()
    tmp = Path(tempfile.mkdtemp(prefix="rlhf-label-studio-"))
    port = _free_port()
    log = open(tmp / "server.log", "wb")  # noqa: SIM115 - closed in the finally below, after the server stops
    env = {
        **os.environ,
        "LABEL_STUDIO_BASE_DATA_DIR": str(tmp / "data"),
        "COLLECT_ANALYTICS": "false",
        "SENTRY_DSN": "",
        "FRONTEND_SENTRY_DSN": "",
    }
    cmd = [
        str(exe), "start", "--no-browser", "--internal-host", "127.0.0.1", "-p", str(port),
        "--data-dir", str(tmp / "data"), "--username", "admin@example.com", "--password", "rlhf-flywheel-pw",
        "--user-token", TOKEN, "--enable-legacy-api-token",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    limit = float(os.environ.get("LABEL_STUDIO_START_S", "900"))
    t0 = time.monotonic()
    try:
        while True:
            if proc.poll() is not None:
                raise LabelStudioUnavailable(
                    f"label-studio exited with {proc.returncode}: {(tmp / 'server.log').read_text()[-600:]}"
                )
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() - t0 > limit:
                raise LabelStudioUnavailable(
                    f"label-studio did not answer /health within {limit:.0f} s (LABEL_STUDIO_START_S); log tail: "
                    f"{(tmp / 'server.log').read_text()[-400:]}"
                )
            time.sleep(2)
        print(f"label-studio up at {url} after {time.monotonic() - t0:.0f} s")
        yield url, TOKEN
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)
