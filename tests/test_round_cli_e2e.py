"""End to end through the CLI, as a user runs it: `rlhf round --preset smoke` with a
non-ASCII round id, on Prefect's temporary server with a private PREFECT_HOME. A healthy round prints no ERROR
line, no traceback and no "Failed to send telemetry"; it ends with exit 0 (pass) or 3 (block), never 1, and its
artifacts are published under ASCII keys."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parent.parent


def test_smoke_round_cli_is_quiet_and_publishes_a_non_ascii_round(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "WANDB_")) and k != "DO_NOT_TRACK"}
    env["PREFECT_HOME"] = str(tmp_path / "prefect")
    proc = subprocess.run(
        [sys.executable, "-m", "flows.cli", "round", "--preset", "smoke", "--runs-dir", str(tmp_path / "runs"),
         "--round-id", "rüde-1"],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=1500,
    )
    output = proc.stdout + proc.stderr
    (tmp_path / "round.log").write_text(output)
    round_json = tmp_path / "runs" / "rüde-1" / "round.json"
    assert round_json.is_file(), output[-4000:]
    verdict = json.loads(round_json.read_text())["verdict"]
    assert proc.returncode == {"pass": 0, "block": 3}[verdict], output[-4000:]
    for needle in ("ERROR", "Traceback", "Failed to send telemetry"):
        lines = [ln for ln in output.splitlines() if needle in ln]
        assert not lines, f"{needle!r} in a healthy round's output: {lines[:5]}"
    # the artifacts are in the temporary server's database (PREFECT_HOME/prefect.db), under ASCII keys
    import sqlite3

    from rlhf.round_id import artifact_key

    with sqlite3.connect(tmp_path / "prefect" / "prefect.db") as db:
        keys = {k for (k,) in db.execute("select key from artifact")}
    expected = {artifact_key(p, "rüde-1") for p in ("gate-report", "gates", "stages", "ppo-unlock", "gate-capability")}
    assert expected <= keys and all(k.isascii() for k in keys), sorted(keys)
    assert artifact_key("gate-report", "rüde-1").startswith("gate-report-rude-1-")
