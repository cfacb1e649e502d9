"""A stage launched through Slurm on a real one-node cluster (tests/slurm_cluster.py: munged, slurmctld, slurmd on
loopback): the flow's stage runner renders the sbatch script, submits it, polls until the job ends, streams the
job's output into stage.log and reads the stage's manifest; a failing job fails the stage with the stage's own
error and exit code; an allocation the cluster cannot give is refused by sbatch, loudly. Skips, saying why, where
the Slurm daemons cannot start (CI installs them: .ci/run)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from flows.launch import slurm
from tests.slurm_cluster import cluster  # noqa: F401 - the module-scoped Slurm cluster fixture

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "recipes" / "smoke"
CPU_CONFIG = str(ROOT / "recipes" / "accelerate_configs" / "cpu.yaml")


@pytest.fixture
def on_cluster(cluster, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", cluster["SLURM_CONF"])
    monkeypatch.setenv("WANDB_MODE", "disabled")  # sbatch exports the submitter's environment to the job
    return cluster


def cpu_job() -> slurm.SlurmJob:
    return slurm.SlurmJob(nodes=1, gpus_per_node=0, processes_per_node=1, cpus_per_task=1, time_limit="00:10:00",
                          poll_s=0.5, python=sys.executable, workdir=str(ROOT))


def test_a_stage_runs_as_a_slurm_job_through_the_flows_stage_runner(on_cluster, tmp_path):
    from flows.stages import run_stage

    out_dir = tmp_path / "runs" / "r1" / "sft"
    lines: list[str] = []
    run = run_stage("sft", "sft.train", SMOKE / "sft.yaml", out_dir, accelerate_config=CPU_CONFIG,
                    extra_args=["--round_id", "r1", "--report_to", "none", "--max_steps", "1"], log=lines.append,
                    launcher=slurm.slurm_launcher(cpu_job(), "sft", "r1"))
    assert run.cached is False and run.manifest["stage"] == "sft"
    assert Path(run.manifest["outputs"]["checkpoint"]).is_dir()
    log = (out_dir / "stage.log").read_text()
    job_id = log.split("submitted Slurm job ", 1)[1].split()[0]
    assert f"rlhf launch: Slurm job {job_id} ended COMPLETED, exit 0" in log
    assert (out_dir / f"slurm-{job_id}.out").read_text() in log  # the job's whole output streamed into stage.log
    assert (out_dir / slurm.EXIT_FILE).read_text().strip() == "0"
    script = (out_dir / slurm.SCRIPT_FILE).read_text()
    assert "export RLHF_EXPECTED_WORLD_SIZE=1\n" in script and "#SBATCH --gpus-per-node" not in script


def test_a_failing_slurm_job_fails_the_stage_with_its_own_error(on_cluster, tmp_path):
    from flows.stages import StageFailed, run_stage

    out_dir = tmp_path / "runs" / "r1" / "sft"
    with pytest.raises(StageFailed, match=r"exit 1\): FileNotFoundError: .*no-such-file\.jsonl") as err:
        run_stage("sft", "sft.train", SMOKE / "sft.yaml", out_dir, accelerate_config=CPU_CONFIG,
                  extra_args=["--round_id", "r1", "--report_to", "none",
                              "--train_data", str(tmp_path / "no-such-file.jsonl")],
                  log=lambda *_: None, launcher=slurm.slurm_launcher(cpu_job(), "sft", "r1"))
    assert err.value.returncode == 1
    log = (out_dir / "stage.log").read_text()
    assert "ended FAILED, exit 1" in log  # from scontrol: this cluster keeps no accounting (sacct is disabled)
    assert not (out_dir / "manifest.json").exists()


def test_a_job_the_cluster_can_never_start_is_cancelled_and_fails_loudly(on_cluster, tmp_path):
    """2 nodes asked of a 1-node partition: sbatch accepts it and it would pend forever (PartitionConfig, then
    PartitionNodeLimit); the launcher cancels it and fails, naming the reason, instead of waiting or training on
    fewer nodes."""
    import subprocess

    job = cpu_job().model_copy(update={"nodes": 2})
    script = tmp_path / slurm.SCRIPT_FILE
    script.write_text(slurm.render_sbatch(job, stage="sft", round_id="r1", module="sft.train",
                                          recipe=SMOKE / "sft.yaml", output_dir=tmp_path, accelerate_config=CPU_CONFIG))
    with pytest.raises(slurm.SlurmError, match=r"can never start \(Partition(NodeLimit|Config)\).*cancelled") as err:
        slurm.run(script, poll_s=0.5)
    job_id = str(err.value).split("Slurm job ", 1)[1].split()[0]
    shown = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True,
                           check=False).stdout
    assert "JobState=CANCELLED" in shown


def test_ctrl_c_of_the_launcher_cancels_the_job(on_cluster, tmp_path):
    """SIGINT (what the flow sends a stage's process group on Ctrl-C) reaches the submit-and-wait process, which
    cancels the job: nothing keeps training on the cluster after the round was stopped."""
    import signal
    import subprocess
    import time

    script = tmp_path / slurm.SCRIPT_FILE
    script.write_text(f"#!/bin/bash\n#SBATCH --output={tmp_path}/slurm-%j.out\necho started\nsleep 120\n")
    proc = subprocess.Popen([sys.executable, "-m", "flows.launch.slurm", "run", str(script), "--poll-s", "0.3"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "RUNNING" in line:
            break
    job_id = lines[0].split("submitted Slurm job ", 1)[1].split()[0]
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    rest = proc.communicate(timeout=30)[0]
    assert proc.returncode == 128 + signal.SIGINT
    assert f"SIGINT: cancelled Slurm job {job_id}" in rest
    shown = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True,
                           check=False).stdout
    assert "JobState=CANCELLED" in shown
