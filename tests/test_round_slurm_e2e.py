"""End to end: the smoke round through the Prefect flow with ``launcher: slurm`` on a real one-node Slurm cluster
(tests/slurm_cluster.py): every stage is an sbatch job, and the round ends with its verdict and manifest as a local
round does. Skips, saying why, where the Slurm daemons cannot start.

Opt-in (``RLHF_SLURM_E2E=1``): about 5 minutes on 2 cores, and CI already runs a stage as a real Slurm job, a failing
job, an impossible job and a cancelled job (tests/test_launch_slurm.py) and the same round locally
(tests/test_round_smoke.py); this one is for a change to the launcher's flow wiring."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.slurm_cluster import cluster  # noqa: F401 - the module-scoped Slurm cluster fixture

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.environ.get("RLHF_SLURM_E2E") != "1",
                       reason="opt-in: RLHF_SLURM_E2E=1 runs the whole smoke round as Slurm jobs (~5 min)"),
]
ROOT = Path(__file__).resolve().parent.parent


def test_smoke_round_with_every_stage_a_slurm_job(cluster, tmp_path, monkeypatch):
    from prefect.testing.utilities import prefect_test_harness

    from flows.round import RoundParameters, run_round

    monkeypatch.setenv("SLURM_CONF", cluster["SLURM_CONF"])
    monkeypatch.setenv("WANDB_MODE", "disabled")
    params = RoundParameters(
        preset="smoke", round_id="slurm-smoke", runs_dir=str(tmp_path / "runs"),
        accelerate_config=str(ROOT / "recipes" / "accelerate_configs" / "cpu.yaml"), launcher="slurm",
        slurm={"nodes": 1, "gpus_per_node": 0, "processes_per_node": 1, "cpus_per_task": 2, "poll_s": 1,
               "time_limit": "00:20:00", "python": sys.executable, "workdir": str(ROOT)},
    )
    with prefect_test_harness(server_startup_timeout=180):
        manifest = run_round(params)
    round_dir = tmp_path / "runs" / "slurm-smoke"
    assert json.loads((round_dir / "round.json").read_text())["verdict"] == manifest["verdict"]
    report = json.loads(Path(manifest["gate_report"]).with_suffix(".json").read_text())
    assert report["verdict"] == manifest["verdict"]
    for stage in manifest["stages"]:
        stage_dir = round_dir / stage
        assert (stage_dir / "job.sbatch").is_file() and (stage_dir / ".slurm_exit").read_text().strip() == "0"
        assert "ended COMPLETED, exit 0" in (stage_dir / "stage.log").read_text()
        assert json.loads((stage_dir / "manifest.json").read_text())["stage"] == stage
