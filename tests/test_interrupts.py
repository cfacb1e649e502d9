"""Ctrl-C on ``rlhf round`` stops the stage's whole process group and exits 130; a killed
launcher leaves no trainer running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from flows.interrupt import INTERRUPTED_EXIT_CODE, run_process_group

REPO = Path(__file__).resolve().parent.parent


def _alive(pid: int) -> bool:
    try:
        import psutil

        return psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except ImportError:  # pragma: no cover - psutil ships with the dev environment
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        except OSError:
            return False
        return state != "Z"
    except Exception:  # NoSuchProcess between the two calls
        return False


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if text in (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    found.append(int(d.name))
            except OSError:
                continue
    return [p for p in found if _alive(p)]


def test_a_killed_launcher_leaves_no_child_running(tmp_path):
    """The launcher (like accelerate launch) starts a child; SIGKILL on the launcher alone stops the child too."""
    child_pid_file = tmp_path / "child.pid"
    launcher = textwrap.dedent(f"""
        import os, subprocess, sys
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        open({str(child_pid_file)!r}, "w").write(str(child.pid))
        print("launched", os.getpid(), flush=True)
        child.wait()
    """)
    lines: list[str] = []

    def on_line(line: str) -> None:
        lines.append(line)
        if line.startswith("launched"):
            os.kill(int(line.split()[1]), signal.SIGKILL)  # the launcher only, as a user's `kill -9` would

    t0 = time.monotonic()
    rc = run_process_group([sys.executable, "-c", launcher], env=dict(os.environ), on_line=on_line)
    assert rc == -signal.SIGKILL and len(lines) == 1
    assert time.monotonic() - t0 < 30
    child = int(child_pid_file.read_text())
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child)


def test_ctrl_c_on_a_round_stops_the_stage_and_exits_130(tmp_path):
    runs = tmp_path / "runs"
    sft_dir = runs / "intr" / "sft"
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "WANDB_MODE": "disabled",
           "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "300"}
    stale = runs / "intr" / "wandb_report.json"  # an earlier run's W&B report: gone once this round starts
    stale.parent.mkdir(parents=True)
    stale.write_text('{"verdict": "pass"}')
    log = open(tmp_path / "round.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "round", "--preset", "smoke", "--round-id", "intr", "--runs-dir", str(runs),
         "--set", "sft.max_steps=100000", "--set", "sft.report_to=none"],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and proc.poll() is None:  # wait until SFT is training (it logs a loss)
            stage_log = sft_dir / "stage.log"
            if stage_log.is_file() and "'loss'" in stage_log.read_text(errors="replace"):
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"SFT never started training: {(tmp_path / 'round.log').read_text()[-3000:]}")
        assert _processes_mentioning(str(sft_dir)), "no stage process found while SFT trains"
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=60)
        elapsed = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    out = (tmp_path / "round.log").read_text()
    assert rc == INTERRUPTED_EXIT_CODE, out[-3000:]
    # The stop escalates SIGINT -> (10 s) SIGTERM -> (3 s) SIGKILL -> (3 s), then the flow tears down: at most ~16 s
    # plus teardown, which took 22 s on a 2-core machine at load 7. Uninterrupted, 100000 steps take hours.
    assert elapsed < 45, f"took {elapsed:.1f}s to stop"
    assert "round interrupted" in out
    assert not (sft_dir / "manifest.json").exists() and not (runs / "intr" / "round.json").exists()
    assert not stale.exists()
    time.sleep(1)
    assert _processes_mentioning(str(sft_dir)) == []  # neither the launcher nor the trainer runs on


# A trainer whose last words are a progress bar, then SIGKILL (what the OOM killer or `kill -9` does to it).
KILLED_TRAINER = ('import os, signal\nprint(" 10%|#         | 1/10 [00:00<00:01,  9.00it/s]", flush=True)\n'
                  "os.kill(os.getpid(), signal.SIGKILL)\n")


@pytest.mark.parametrize("how", ["launcher", "local", "accelerate", "torchrun"])
def test_a_stage_killed_by_a_signal_says_which(tmp_path, monkeypatch, how):
    """Through the flow's stage runner (flows.stages.run_stage): the failure names the signal, not the last log
    line. launcher: the launched process itself is killed (return code -9); local: the flow's own launch of one
    process (started directly, so also -9); accelerate: the trainer under ``accelerate launch`` (the launcher exits
    1 and reports the child's death); torchrun: two processes under torch elastic (the root cause is the killed
    rank; the other is stopped with SIGTERM)."""
    from flows.stages import StageFailed, launch_command, run_stage

    (tmp_path / "killed_trainer.py").write_text(KILLED_TRAINER)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    recipe = tmp_path / "sft.yaml"
    recipe.write_text("max_steps: 1\n")

    def launcher(module, recipe, output_dir, extra_args, accelerate_config):
        if how == "launcher":
            return [sys.executable, "-m", module]
        if how == "torchrun":
            return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", module]
        cmd = launch_command(module, recipe, output_dir, extra_args, accelerate_config)  # the local launch
        if how == "accelerate":  # the same stage under accelerate's launcher, as with an accelerate config
            cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1",
                   "--mixed_precision", "no", "--dynamo_backend", "no", *cmd[cmd.index(sys.executable) + 1:]]
        return cmd

    out = tmp_path / "runs" / "sft"
    with pytest.raises(StageFailed) as err:
        run_stage("sft", "killed_trainer", recipe, out, runs_dir=tmp_path / "runs", launcher=launcher,
                  log=lambda *_: None)
    assert err.value.cause == "killed by signal 9 (SIGKILL)"
    assert err.value.returncode == (-signal.SIGKILL if how in ("launcher", "local") else 1)
    assert str(err.value).startswith("stage sft failed (exit ") and "killed by signal 9 (SIGKILL)" in str(err.value)
    assert "1/10 [00:00<00:01" in (out / "stage.log").read_text()  # the progress bar was there, and is not the reason


def test_a_stage_that_failed_on_its_own_is_not_reported_as_killed():
    from flows.stages import killed_by

    assert killed_by(1, ["ValueError: p.jsonl row 2 field 'chosen': missing\n"]) is None
    # torch elastic: the root cause exited 1 by itself; the SIGTERM of the rank stopped after it is not the reason
    table = ["Failures:\n", "[1]:\n", "  exitcode  : -15 (pid: 2)  (SIGTERM)\n", "Root Cause (first observed failure):\n",
             "[0]:\n", "  exitcode  : 1 (pid: 1)\n"]
    assert killed_by(1, table) is None
    assert killed_by(-signal.SIGTERM, []) == "killed by signal 15 (SIGTERM)"
