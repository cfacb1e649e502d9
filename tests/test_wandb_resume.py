"""A stage killed after a checkpoint and resumed logs one W&B run whose ``_step`` continues (W&B offline, the default).

The SFT stage on the tiny model runs through the flow's stage launcher (flows.stages.run_stage), is SIGKILLed at the
start of step 6 (``RLHF_FAULT_SIGKILL_AFTER_STEP=5``: step 5 logged, newest checkpoint at step 4) and rerun, which
resumes from checkpoint-4. The offline run files are read back with the installed wandb's own reader
(``wandb leet inspect --json``, one JSON record per line of the ``.wandb`` transaction log).

Expected, worked by hand: two offline folders (one per process), both under the run id kept in
``<stage>/wandb_run_id``; the killed attempt's history holds ``_step`` 1..4 (every step up to its last checkpoint is
written before training goes on) and step 5 only if wandb-core wrote it before the kill (logged just before it: lost
in the runs here); the resumed attempt's holds 5..6 (it re-trains step 5 from checkpoint-4); each record's ``_step``
is its ``train/global_step``; together 1..6 with no gap and no restart at 0.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from flows.stages import StageFailed, run_stage
from rlhf.registry import STAGES
from rlhf.resume import FAULT_ENV

RECIPES = Path(__file__).resolve().parent.parent / "recipes" / "smoke"
# 8 rows, batch 2, 6 steps; a checkpoint every 2 steps (by step only: independent of this machine's speed)
SFT_ARGS = ["--max_train_samples", "8", "--max_steps", "6", "--save_steps", "2", "--save_total_limit", "3",
            "--save_minutes", "0"]


def offline_history(run_dir: Path) -> tuple[str, list[dict]]:
    """The run id and the history rows (``_step``, metrics) of one ``offline-run-*`` folder, read by wandb's own
    transaction-log reader."""
    wandb_cli = shutil.which("wandb")
    assert wandb_cli, "the wandb CLI is installed with the wandb package"
    out = subprocess.run([wandb_cli, "leet", "inspect", "--json", str(run_dir)], capture_output=True, text=True,
                         timeout=120, stdin=subprocess.DEVNULL, check=True).stdout
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    run_ids = {r["run"]["run_id"] for r in records if r.get("type") == "run"}
    assert len(run_ids) == 1, (run_dir, run_ids)
    history = [r["history"]["item"] for r in records if r.get("type") == "history"]
    return run_ids.pop(), history


def _run(out: Path, runs: Path, kill_after: int | None = None):
    mp = pytest.MonkeyPatch()
    mp.setenv("WANDB_MODE", "offline")
    mp.delenv("WANDB_API_KEY", raising=False)
    if kill_after is None:
        mp.delenv(FAULT_ENV, raising=False)
    else:
        mp.setenv(FAULT_ENV, str(kill_after))
    try:
        return run_stage("sft", STAGES["sft"].module, RECIPES / f"{STAGES['sft'].name}.yaml", out,
                         extra_args=SFT_ARGS, runs_dir=runs, log=lambda line: None)
    finally:
        mp.undo()


@pytest.fixture
def flow_process_wandb_service(monkeypatch):
    """A wandb-core service started in this (the flow's) process, its address in ``WANDB_SERVICE``, as an in-process
    W&B run (the gates' table) leaves it. Stages must not join it: a killed stage's run would stay registered in it
    and the resumed attempt be refused ("run ID ... is in use")."""
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    wandb.setup()
    assert os.environ.get("WANDB_SERVICE"), "wandb.setup() publishes its service's address"
    yield
    wandb.teardown()


def test_a_resumed_stage_logs_one_offline_run_whose_step_continues(tmp_path, flow_process_wandb_service):
    runs, out = tmp_path, tmp_path / "sft"
    with pytest.raises(StageFailed):
        _run(out, runs, kill_after=5)
    run_id = (out / "wandb_run_id").read_text().strip()
    first_dirs = sorted((out / "wandb").glob("offline-run-*"))
    assert len(first_dirs) == 1
    _, killed = offline_history(first_dirs[0])
    assert killed, "the killed attempt's records reached its offline file"

    manifest = _run(out, runs).manifest
    assert manifest["training"]["resumed_from_step"] == 4 and manifest["training"]["wandb_run_id"] == run_id

    dirs = sorted((out / "wandb").glob("offline-run-*"))  # the timestamp in the name sorts them by start
    assert len(dirs) == 2 and dirs[0] == first_dirs[0]
    histories = []
    for d in dirs:
        rid, history = offline_history(d)
        assert rid == run_id and d.name.endswith(f"-{run_id}")  # one run: the id kept in the stage folder
        histories.append(history)
    killed, resumed = ([row for row in h if "train/loss" in row] for h in histories)
    for row in killed + resumed:
        assert row["_step"] == row["train/global_step"]  # W&B's step is the optimizer step
    killed_steps = [r["_step"] for r in killed]
    assert killed_steps in ([1, 2, 3, 4], [1, 2, 3, 4, 5])  # every step up to checkpoint-4 survived the kill
    assert [r["_step"] for r in resumed] == [5, 6]  # continues from checkpoint-4, never back at 0
    assert sorted({r["_step"] for r in killed + resumed}) == list(range(1, 7))
    if killed_steps[-1] == 5:  # step 5 in both files: the same loss (resume is bit-identical in fp32 here)
        assert resumed[0]["train/loss"] == pytest.approx(killed[-1]["train/loss"], abs=1e-6)
    # every record of the resumed file, the final summary's too, is at or after the step it resumed from
    assert min(row["_step"] for row in histories[1]) >= 5
