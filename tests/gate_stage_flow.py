"""The round flow's gate stage alone, as the round runs it: a Prefect flow that calls ``flows.round.stage_task`` (the
round's task: its parameters, its logged command line, ``accelerate launch -m gates.evaluate``), with baseline,
candidate and reward-model folders given instead of trained.

python tests/gate_stage_flow.py '{"params": {...RoundParameters...}, "round_dir": DIR, "dirs": {...}}'
Prints the gate manifest's verdict. Used by tests/test_secrets_e2e.py (no secret on this command line).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from prefect import flow

from flows.round import RoundParameters, stage_task


@flow(name="gate-stage")
def gate_stage(params: RoundParameters, round_dir: str, dirs: dict[str, str]) -> str:
    run = stage_task("gates", params, Path(round_dir), dirs, [])
    return run.manifest["outputs"]["verdict"]


if __name__ == "__main__":
    given = json.loads(sys.argv[1])
    print(gate_stage(RoundParameters(**given["params"]), given["round_dir"], given["dirs"]))
