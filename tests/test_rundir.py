"""Round ids, the stage-folder marker, the round lock, the gates output folder, and
a stage's failure reason reaching the flow whatever the exception is called."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlhf.round_id import check_round_id
from rlhf.rundir import STAGE_MARKER, RoundError, RoundLock, check_output_dir, check_own_output_dir

REPO = Path(__file__).resolve().parent.parent
RECIPES = REPO / "recipes" / "smoke"


@pytest.mark.parametrize("bad", ["..", ".", "/tmp/x", "a/b", ".hidden", "-rf", "", "x" * 101, "a b", "a\\b"])
def test_unsafe_round_ids_are_refused(bad):
    with pytest.raises(ValueError, match="round id"):
        check_round_id(bad)


@pytest.mark.parametrize("good", ["smoke-20261201", "r1.2_b", "réunion-1", "раунд"])
def test_safe_round_ids_pass(good):
    assert check_round_id(good) == good


def _user_layout(tmp_path: Path) -> tuple[Path, Path]:
    """A user's folder X with X/sft/IMPORTANT.txt and the runs folder X/runs (a stage path a rerun must not delete)."""
    x = tmp_path / "X"
    (x / "sft").mkdir(parents=True)
    important = x / "sft" / "IMPORTANT.txt"
    important.write_text("keep me")
    return x / "runs", important


@pytest.mark.parametrize("round_id", ["..", "/abs-round"])
def test_cli_refuses_a_round_id_that_escapes_the_runs_folder_and_removes_nothing(tmp_path, monkeypatch, round_id):
    from typer.testing import CliRunner

    from flows.cli import app

    runs, important = _user_layout(tmp_path)
    monkeypatch.chdir(tmp_path / "X")
    result = CliRunner().invoke(app, ["round", "--preset", "smoke", "--round-id", round_id, "--runs-dir", str(runs)])
    assert result.exit_code == 2  # a bad parameter, refused before anything runs
    assert "round id" in result.output and round_id in result.output
    assert important.read_text() == "keep me"
    assert not runs.exists()


def test_run_stage_never_removes_a_folder_it_did_not_create(tmp_path):
    from flows.stages import run_stage

    runs = tmp_path / "runs"
    user_dir = runs / "r1" / "sft"
    user_dir.mkdir(parents=True)
    (user_dir / "IMPORTANT.txt").write_text("keep me")
    with pytest.raises(RoundError, match=f"not created by a pipeline stage \\(no {STAGE_MARKER} marker\\)"):
        run_stage("sft", "sft.train", RECIPES / "sft.yaml", user_dir, runs_dir=runs)
    assert (user_dir / "IMPORTANT.txt").read_text() == "keep me"

    # A marked stage folder outside the runs folder is refused too.
    outside = tmp_path / "elsewhere" / "sft"
    outside.mkdir(parents=True)
    (outside / STAGE_MARKER).write_text("{}")
    (outside / "IMPORTANT.txt").write_text("keep me")
    with pytest.raises(RoundError, match="not inside the runs folder"):
        run_stage("sft", "sft.train", RECIPES / "sft.yaml", outside, runs_dir=runs)
    assert (outside / "IMPORTANT.txt").read_text() == "keep me"


HOLDER = """
import sys, time
from rlhf.rundir import RoundLock
lock = RoundLock(sys.argv[1]).__enter__()  # keep a reference: a collected FileLock releases
print("locked", flush=True)
time.sleep(120)
"""


def test_a_second_round_on_the_same_folder_fails_at_once_naming_the_holder(tmp_path):
    round_dir = tmp_path / "runs" / "same"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(round_dir)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RoundError) as err, RoundLock(round_dir):
            pass
        assert f"pid {holder.pid} on " in str(err.value) and "in use by another round" in str(err.value)
        assert "started 20" in str(err.value)
    finally:
        holder.kill()
        holder.wait()
    # The kernel released the lock with the process: the next round gets it, and names itself while it runs.
    with RoundLock(round_dir) as lock:
        assert lock.holder().startswith(f"pid {__import__('os').getpid()} on ")


def test_the_round_flow_takes_the_lock_before_anything_runs(tmp_path):
    from prefect.testing.utilities import prefect_test_harness

    from flows.round import RoundParameters, run_round

    runs = tmp_path / "runs"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(runs / "same")], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with prefect_test_harness(server_startup_timeout=180):
            with pytest.raises(RoundError, match=f"pid {holder.pid} "):
                run_round(RoundParameters(preset="smoke", round_id="same", runs_dir=str(runs)))
            with pytest.raises(ValueError, match="round id"):
                run_round(RoundParameters(preset="smoke", round_id="..", runs_dir=str(runs)))
    finally:
        holder.kill()
        holder.wait()
    assert not (runs / "same" / "sft").exists()  # nothing ran
    assert sorted(p.name for p in runs.iterdir()) == ["same"]  # and '..' created nothing


def test_gates_refuse_another_stages_folder_and_check_inputs_before_clearing(tmp_path):
    from gates.evaluate import main as gates_main

    sft_like = tmp_path / "sft"
    sft_like.mkdir()
    manifest = json.dumps({"stage": "sft", "outputs": {"checkpoint": "x"}})
    (sft_like / "manifest.json").write_text(manifest)
    args = ["--config", str(RECIPES / "gates.yaml"), "--report_to", "none",
            "--candidate_dir", str(sft_like), "--baseline_dir", str(sft_like), "--reward_model_dir", str(sft_like)]
    with pytest.raises(RoundError, match="holds the manifest of stage 'sft', not 'gates'"):
        gates_main(args + ["--output_dir", str(sft_like)])
    assert (sft_like / "manifest.json").read_text() == manifest

    # A gates folder with an earlier report: bad inputs are found before anything in it is cleared.
    gates_dir = tmp_path / "gates"
    gates_dir.mkdir()
    (gates_dir / "manifest.json").write_text(json.dumps({"stage": "gates"}))
    (gates_dir / "report.md").write_text("old report")
    with pytest.raises(ValueError, match="traffic_data"):
        gates_main(args + ["--output_dir", str(gates_dir), "--traffic_data", str(tmp_path / "missing.csv")])
    assert (gates_dir / "report.md").read_text() == "old report"
    check_output_dir(gates_dir, "gates")  # its own folder is fine


def _write_sft(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_reject_rate_failure_reaches_the_flow_by_name(tmp_path):
    """The stage writes failure.json; the flow's error names RejectRateExceeded (not CalledProcessError)."""
    from flows.stages import StageFailed, run_stage

    good = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    bad = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": 7}]}
    data = _write_sft(tmp_path / "demos.jsonl", [good, bad, {**good}, bad])
    runs = tmp_path / "runs"
    with pytest.raises(StageFailed) as err:
        run_stage("sft", "sft.train", RECIPES / "sft.yaml", runs / "r" / "sft", runs_dir=runs, log=lambda _: None,
                  extra_args=["--train_data", str(data), "--data_mode", "lenient", "--max_reject_rate", "0.1",
                              "--report_to", "none"])
    msg = str(err.value)
    assert msg.startswith("stage sft failed (exit 1): RejectRateExceeded: ")
    assert "2 of 4 rows rejected" in msg and "max_reject_rate" in msg and "CalledProcessError" not in msg
    assert "rows are numbered from 0" in msg
    failure = json.loads((runs / "r" / "sft" / "failure.json").read_text())
    assert failure["type"] == "RejectRateExceeded"
    assert not (runs / "r" / "sft" / "manifest.json").exists()


def _files(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_gates_refuse_a_users_folder_and_clear_their_own_only_after_reading_every_input(tmp_path, tiny_model_dir):
    """`rlhf gates --output-dir <a folder of yours>` leaves it as it is, whatever the inputs; a folder the gate stage
    marked keeps its earlier report when an input read late (a suite file) is bad."""
    from gates.evaluate import main as gates_main

    user = tmp_path / "mine"
    (user / "plots").mkdir(parents=True)
    planted = {"report.md": "my notes", "generations.jsonl": '{"mine": 1}\n', "plots/figure.png": "png",
               "thesis.txt": "draft"}
    for name, text in planted.items():
        (user / name).write_text(text)
    labels = tmp_path / "labels.jsonl"
    labels.write_text("")
    good = ["--config", str(RECIPES / "gates.yaml"), "--report_to", "none", "--baseline_dir", tiny_model_dir,
            "--candidate_dir", tiny_model_dir, "--allow_same_model", "true",
            "--judge", json.dumps({"backend": "labels", "labels": str(labels)})]
    refusal = (r"^--output_dir .*mine: holds files no gates run wrote \(generations.jsonl, plots, report.md and 1 "
               r"more\) and no \.rlhf-stage marker; refusing to clear it")
    for bad in (["--traffic_data", str(tmp_path / "missing.csv")], ["--winrate_data", str(tmp_path / "no.jsonl")], []):
        with pytest.raises(RoundError, match=refusal) as err:
            gates_main([*good, "--output_dir", str(user), *bad])
        assert "\n" not in str(err.value)  # one line
        assert _files(user) == planted and sorted(p.name for p in user.iterdir()) == [
            "generations.jsonl", "plots", "report.md", "thesis.txt"]  # untouched, and no marker written

    # The CLI says it in one line (exit code 2) and leaves the folder as it is.
    from typer.testing import CliRunner

    from flows.cli import app

    res = CliRunner().invoke(app, ["gates", "--candidate", tiny_model_dir, "--baseline", tiny_model_dir,
                                   "--config", str(RECIPES / "gates.yaml"), "--output-dir", str(user),
                                   "--report_to", "none", "--allow_same_model", "true"])
    assert res.exit_code == 2 and res.output.strip().startswith("error: --output_dir ")
    assert len(res.output.strip().splitlines()) == 1 and "refusing to clear it" in res.output
    assert _files(user) == planted

    # A folder another stage's marker names is refused too; an empty one, or one a gate run marked, is accepted.
    other = tmp_path / "other"
    other.mkdir()
    (other / STAGE_MARKER).write_text(json.dumps({"stage": "sft"}))
    with pytest.raises(RoundError, match="marker names stage 'sft', not 'gates'"):
        check_own_output_dir(other, "gates")
    (tmp_path / "empty").mkdir()
    check_own_output_dir(tmp_path / "empty", "gates")
    check_own_output_dir(tmp_path / "not-yet", "gates")

    # The gate stage's own folder with an earlier report: inputs read after the old clearing point (the suites) are
    # checked before anything is cleared, so a bad suite file leaves the earlier report in place.
    own = tmp_path / "own"
    own.mkdir()
    earlier = {STAGE_MARKER: json.dumps({"stage": "gates"}), "manifest.json": json.dumps({"stage": "gates"}),
               "report.md": "earlier report", "generations.jsonl": "{}\n"}
    for name, text in earlier.items():
        (own / name).write_text(text)
    with pytest.raises((FileNotFoundError, ValueError), match="no.jsonl"):
        gates_main([*good, "--output_dir", str(own), "--winrate_data", str(tmp_path / "no.jsonl")])
    assert _files(own) == earlier
    with pytest.raises(ValueError, match="--judge labels .*absent.jsonl: no such file"):
        gates_main([*good[:-1], json.dumps({"backend": "labels", "labels": str(tmp_path / "absent.jsonl")}),
                    "--output_dir", str(own)])
    assert _files(own) == earlier


def test_a_round_that_left_nothing_leaves_no_folder_and_one_that_wrote_keeps_it(tmp_path):
    empty, used, existing = tmp_path / "empty", tmp_path / "used", tmp_path / "existing"
    with pytest.raises(ValueError), RoundLock(empty):
        raise ValueError("a recipe failed its check")
    assert not empty.exists()  # the lock made the folder and nothing else was written: gone
    with RoundLock(used):
        (used / "sft").mkdir()
    assert (used / "sft").is_dir()
    existing.mkdir()
    with RoundLock(existing):
        pass
    assert existing.is_dir()  # not created by the lock: kept, empty or not
