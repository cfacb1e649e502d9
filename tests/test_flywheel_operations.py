"""Operating the ingest: Ctrl-C (a real SIGINT to a real process) stops it between batches, rolls the current file
back and exits 130; a second process writing one DuckDB file waits, then fails with one line naming the holder;
every flywheel command prints one error line and a documented exit code."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flywheel.store import SignalStore
from tests.test_flywheel_store import _jsonl, _rows, db_url, pg_server  # noqa: F401  (fixtures)

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def test_ctrl_c_stops_between_batches_rolls_back_the_file_and_exits_130(db_url, tmp_path):  # noqa: F811
    first = _jsonl(tmp_path / "first.jsonl", _rows(40, prefix="f"))
    big = _jsonl(tmp_path / "big.jsonl", _rows(20_000, prefix="b", n_prompts=500))
    proc = subprocess.Popen(
        [sys.executable, "-m", "flywheel.ingest", "--db", db_url, "--chunk-rows", "200", "--progress", str(first),
         str(big)],
        cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if "big.jsonl: chunk 3 loaded" in line:
            proc.send_signal(signal.SIGINT)  # what a terminal's Ctrl-C sends
            break
    rest = proc.stderr.read()
    out = proc.stdout.read()
    proc.wait(timeout=60)
    assert proc.returncode == 130, (lines, rest)
    errors = [x for x in rest.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and "big.jsonl: interrupted after" in errors[0] and "rolled back" in errors[0], rest
    n_loaded = max(int(x.split("(")[1].split()[0]) for x in (lines + rest.splitlines()) if "big.jsonl: chunk" in x)
    assert n_loaded < 20_000  # it stopped between batches, well before the end of the file
    assert [json.loads(x)["path"] for x in out.splitlines()] == [str(first)]  # the first file stayed committed
    store = SignalStore(db_url)
    c = store.counts()
    assert (c["events"], c["files"]) == (40, 1)  # nothing of big.jsonl
    store.close()


def _holder(db: Path, seconds: float) -> subprocess.Popen:
    code = (
        "import sys, time\n"
        "from flywheel.store import SignalStore\n"
        "s = SignalStore(sys.argv[1])\n"
        "print('ready', flush=True)\n"
        "time.sleep(float(sys.argv[2]))\n"
        "s.close()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(db), str(seconds)], cwd=REPO, env=ENV,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_a_second_duckdb_writer_waits_then_fails_naming_the_holder(tmp_path):
    db = tmp_path / "s.duckdb"
    events = _jsonl(tmp_path / "e.jsonl", _rows(8))
    holder = _holder(db, 30)
    try:
        t0 = time.monotonic()
        got = subprocess.run(
            [sys.executable, "-m", "flywheel.ingest", "--db", str(db), "--lock-timeout", "1.5", str(events)],
            cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120, check=False,
        )
        waited = time.monotonic() - t0
    finally:
        holder.kill()
        holder.wait()
    assert got.returncode == 1
    assert got.stderr.strip().count("\n") == 0, got.stderr  # one line
    assert got.stderr.startswith(f"error: {db}: locked by another process (") and f"PID {holder.pid})" in got.stderr
    assert waited >= 1.5
    # a holder that finishes within the wait: the second writer goes ahead
    holder = _holder(db, 2)
    t0 = time.monotonic()
    got = subprocess.run(
        [sys.executable, "-m", "flywheel.ingest", "--db", str(db), "--lock-timeout", "60", str(events)],
        cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120, check=False,
    )
    holder.wait()
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout.splitlines()[-1])["events"] == 8
    assert time.monotonic() - t0 >= 1.0  # it waited for the holder


@pytest.mark.parametrize(
    "content,where",
    [
        ('{"event_id": "e1", "turn_id": 1}\n', "row 1 field 'conversation_id': missing (field required)"),
        ('{"event_id": [[[[[[[[[[\n', "row 1: not valid JSON"),
    ],
)
def test_flywheel_ingest_command_prints_one_error_line_and_exits_1(tmp_path, content, where):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(_rows(1)[0]) + "\n" + content)
    got = subprocess.run(
        [sys.executable, "-m", "flows.cli", "flywheel", "ingest", "--db", str(tmp_path / "s.duckdb"), str(bad)],
        cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300, check=False,
    )
    assert got.returncode == 1
    assert got.stderr.strip().splitlines() == [got.stderr.strip()] and got.stderr.startswith(f"error: {bad} {where}")
    assert "Traceback" not in got.stderr


def test_flywheel_commands_print_one_error_line(tmp_path):
    from typer.testing import CliRunner

    from flows.flywheel_cli import app

    runner = CliRunner()
    missing = tmp_path / "nowhere"
    got = runner.invoke(app, ["annotate-sim", "--export-dir", str(missing), "--alternatives", "a.jsonl", "--out",
                              str(tmp_path / "o.json")])
    assert got.exit_code == 1 and got.output.strip().count("\n") == 0 and got.output.startswith("error: ")
    got = runner.invoke(app, ["export", "--budget", "-1", "--out-dir", str(tmp_path)])
    assert got.exit_code == 2  # a usage error, as typer reports them for every command
    assert not (tmp_path / "report.json").exists()
