"""Resume is a contract. SFT and DPO on the tiny model, killed with SIGKILL mid-training and
rerun through the flow's stage launcher (flows.stages.run_stage, what every round task calls), end where an
uninterrupted run ends: same weights, same loss, every step and epoch done, the resumed-from step recorded, the same
W&B run id. An explicit resume from a missing or corrupt checkpoint is a clear error.

The kill is a real SIGKILL of the training process (``RLHF_FAULT_SIGKILL_AFTER_STEP``, rlhf/resume.py): no handler,
no cleanup runs; the launcher sees the child die and the stage fails like one killed by the OOM killer.

Tolerance: on one CPU process in fp32 the resumed run is bit-identical to the uninterrupted one in these runs; the
tests allow 1e-6 (absolute) on every weight and loss, far below one step's change (about 1e-3 at lr 1e-3).
"""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from flows.stages import ATTEMPT_KEY_FILE, StageFailed, resumable_checkpoint, run_stage
from rlhf.registry import STAGES
from rlhf.resume import (
    COMPLETE_MARKER,
    FAULT_ENV,
    REFUSED_MARKER,
    ResumeError,
    check_trainer_checkpoint,
    refused_checkpoints,
    trainer_checkpoints,
)

RECIPES = Path(__file__).resolve().parent.parent / "recipes" / "smoke"
TOL = 1e-6

# SFT: 8 rows, batch 2 -> 4 steps an epoch; 8 steps = 2 epochs; a Trainer checkpoint every 2 steps.
# save_minutes 0: checkpoints by step only, so which ones exist never depends on this machine's speed.
SFT_ARGS = ["--max_train_samples", "8", "--max_steps", "8", "--save_steps", "2", "--save_total_limit", "3",
            "--save_minutes", "0"]
# DPO: 4 pairs, batch 1 -> 4 steps an epoch; 8 steps = 2 epochs; checkpoints at 3 and 6 (6 is mid second epoch).
DPO_ARGS = ["--max_train_samples", "4", "--per_device_train_batch_size", "1", "--max_steps", "8", "--save_steps",
            "3", "--step0_pairs", "0", "--save_minutes", "0"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("WANDB_MODE", "disabled")  # the recipes report to wandb: the run id is still made and recorded
    mp.delenv(FAULT_ENV, raising=False)
    yield tmp_path_factory.mktemp("runs")
    mp.undo()


def _run(stage: str, out: Path, extra: list[str], runs: Path, kill_after: int | None = None):
    lines: list[str] = []
    mp = pytest.MonkeyPatch()
    if kill_after is not None:
        mp.setenv(FAULT_ENV, str(kill_after))
    try:
        return run_stage(stage, STAGES[stage].module, RECIPES / f"{stage}.yaml", out,
                         extra_args=extra, runs_dir=runs, log=lines.append)
    finally:
        mp.undo()


def _killed(stage: str, out: Path, extra: list[str], runs: Path, kill_after: int) -> None:
    with pytest.raises(StageFailed) as err:
        _run(stage, out, extra, runs, kill_after=kill_after)
    assert err.value.returncode != 0 and err.value.cause == "killed by signal 9 (SIGKILL)"
    assert not (out / "manifest.json").exists() and not (out / "checkpoint").exists()
    assert "SIGKILL" in (out / "stage.log").read_text()


def _weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(out / "checkpoint" / "model.safetensors"))


def _max_weight_diff(a: Path, b: Path) -> float:
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    return max(float((wa[k] - wb[k]).abs().max()) for k in wa)


def _manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def _assert_same_run(resumed: Path, reference: Path, resumed_from_step: int, epochs: float) -> None:
    got, want = _manifest(resumed)["training"], _manifest(reference)["training"]
    print(f"{resumed.name}: resumed from step {got['resumed_from_step']}; loss {got['train_loss']:.8f} vs "
          f"{want['train_loss']:.8f} uninterrupted; max |weight diff| {_max_weight_diff(resumed, reference):.3g}")
    assert want["resumed_from"] is None and want["resumed_from_step"] is None
    assert got["resumed_from_step"] == resumed_from_step
    assert got["resumed_from"] == str((resumed / f"checkpoint-{resumed_from_step}").resolve())
    assert _manifest(resumed)["config"]["resume_from_checkpoint"] == got["resumed_from"]  # the config says it too
    assert got["steps_this_run"] == want["global_step"] - resumed_from_step
    # every step and epoch done (the public report: an epoch-boundary resume skipped the next epoch, exit 0)
    assert got["global_step"] == want["global_step"] == got["max_steps"] == 8
    assert got["epoch"] == pytest.approx(epochs) and want["epoch"] == pytest.approx(epochs)
    assert abs(got["train_loss"] - want["train_loss"]) <= TOL
    assert abs(got["final_logged_loss"] - want["final_logged_loss"]) <= TOL
    assert _max_weight_diff(resumed, reference) <= TOL
    # the loss over every step is what the manifest reports, not the Trainer's mean over the resumed part only
    assert _manifest(resumed)["metrics"]["train_loss"] == got["train_loss"]
    assert abs(got["train_loss_this_run"] - got["train_loss"]) > 1e-4
    # the same W&B run: the id made at the first start is the one the resumed run used
    assert got["wandb_run_id"] == (resumed / "wandb_run_id").read_text().strip()
    assert len(got["wandb_run_id"]) == 8 and got["wandb_run_id"] != want["wandb_run_id"]
    assert trainer_checkpoints(resumed) == []  # resume state removed once the stage finished


@pytest.fixture(scope="module")
def sft_reference(runs):
    out = runs / "sft-ref"
    _run("sft", out, SFT_ARGS, runs)
    return out


def test_sft_killed_just_after_an_epoch_boundary_resumes_and_trains_the_next_epoch(runs, sft_reference):
    out = runs / "sft-epoch"
    _killed("sft", out, SFT_ARGS, runs, kill_after=4)  # epoch 1 done and saved at step 4; killed as epoch 2 starts
    assert [p.name for p in trainer_checkpoints(out)] == ["checkpoint-4", "checkpoint-2"]
    run_id = (out / "wandb_run_id").read_text().strip()
    # a save killed half-way: a newer folder with a zero-byte weight file and no completion marker is skipped
    partial = out / "checkpoint-6"
    shutil.copytree(out / "checkpoint-4", partial)
    (partial / COMPLETE_MARKER).unlink()
    (partial / "model.safetensors").write_bytes(b"")
    rerun = _run("sft", out, SFT_ARGS, runs)
    assert not rerun.cached
    _assert_same_run(out, sft_reference, resumed_from_step=4, epochs=2.0)
    assert rerun.manifest["training"]["steps_this_run"] == 4 and rerun.manifest["training"]["wandb_run_id"] == run_id
    assert "resumed from" in (out / "stage.log").read_text()  # one log, both attempts
    again = _run("sft", out, SFT_ARGS, runs)  # finished: a rerun with the same inputs is cached, as before
    assert again.cached and again.manifest["outputs"]["checkpoint_hash"] == rerun.manifest["outputs"]["checkpoint_hash"]


@pytest.fixture(scope="module")
def dpo_reference(runs, sft_reference):
    out = runs / "dpo-ref"
    _run("dpo", out, ["--sft_dir", str(sft_reference), *DPO_ARGS], runs)
    return out


def test_dpo_killed_mid_second_epoch_resumes_to_the_same_weights_and_loss(runs, sft_reference, dpo_reference):
    out = runs / "dpo-mid"
    args = ["--sft_dir", str(sft_reference), *DPO_ARGS]
    _killed("dpo", out, args, runs, kill_after=7)  # newest checkpoint: step 6, two steps into the second epoch
    assert [p.name for p in trainer_checkpoints(out)] == ["checkpoint-6", "checkpoint-3"]
    run_id = (out / "wandb_run_id").read_text().strip()
    _run("dpo", out, args, runs)
    _assert_same_run(out, dpo_reference, resumed_from_step=6, epochs=2.0)
    assert _manifest(out)["training"]["wandb_run_id"] == run_id
    # pi_ref was checked before and after the resumed training: still the SFT stage's frozen copy
    assert _manifest(out)["inputs"]["pi_ref_hash"] == _manifest(sft_reference)["outputs"]["pi_ref_hash"]


def test_an_explicit_resume_from_a_missing_or_corrupt_checkpoint_is_an_error(runs, tmp_path, tiny_model_dir):
    from types import SimpleNamespace

    from transformers import AutoModelForCausalLM

    from rlhf.resume import resolve_resume
    from sft.train import main

    out = runs / "sft-corrupt"
    _killed("sft", out, SFT_ARGS, runs, kill_after=3)
    good = out / "checkpoint-2"
    assert check_trainer_checkpoint(good) == 2
    base = ["--config", str(RECIPES / "sft.yaml"), "--report_to", "none", *SFT_ARGS]
    with pytest.raises(ResumeError, match="no such checkpoint folder"):  # through the stage: refused before training
        main([*base, "--output_dir", str(tmp_path / "a"), "--resume_from_checkpoint", str(tmp_path / "nope")])
    assert not (tmp_path / "a" / "manifest.json").exists()

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)  # the model the stage trains: its shapes are checked

    def resume(value, output_dir=tmp_path / "empty"):
        return resolve_resume(SimpleNamespace(resume_from_checkpoint=str(value), output_dir=str(output_dir)), model)

    with pytest.raises(ResumeError, match="no complete Trainer checkpoint"):
        resume("last")
    assert resume("last", out) == str(good.resolve())
    # a checkpoint at or past the steps asked for: resuming would train past them (the review: step 2 with
    # --max_steps 1 exited 0 at step 3)
    for max_steps in (1, 2):
        with pytest.raises(ResumeError, match=rf"at step 2, at or past --max_steps {max_steps}"):
            resolve_resume(SimpleNamespace(resume_from_checkpoint=str(good), output_dir=str(out), max_steps=max_steps),
                           model)
    assert resolve_resume(SimpleNamespace(resume_from_checkpoint=str(good), output_dir=str(out), max_steps=3),
                          model) == str(good.resolve())

    def corrupt(name: str, how) -> Path:
        bad = tmp_path / name / "checkpoint-2"
        shutil.copytree(good, bad)
        how(bad)
        return bad

    def truncate(f: Path) -> None:
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])

    def reshape(d: Path) -> None:
        from safetensors.torch import save_file

        w = load_file(str(d / "model.safetensors"))
        w["model.norm.weight"] = torch.zeros(3)
        save_file(w, str(d / "model.safetensors"), metadata={"format": "pt"})

    def drop(d: Path) -> None:
        from safetensors.torch import save_file

        w = load_file(str(d / "model.safetensors"))
        del w["model.layers.1.mlp.down_proj.weight"]
        save_file(w, str(d / "model.safetensors"), metadata={"format": "pt"})

    cases = {
        r"optimizer\.pt: truncated or corrupt": lambda d: truncate(d / "optimizer.pt"),
        r"scheduler\.pt: missing": lambda d: (d / "scheduler.pt").unlink(),
        r"model\.safetensors: zero-byte weight file": lambda d: (d / "model.safetensors").write_bytes(b""),
        r"model\.safetensors: unreadable weight file": lambda d: truncate(d / "model.safetensors"),
        r"trainer_state\.json: unreadable trainer state": lambda d: (d / "trainer_state.json").write_text("{"),
        # parses, but transformers' TrainerState.load_from_json refuses an unknown field
        r"trainer_state\.json: unreadable trainer state \(TypeError": lambda d: _edit_state(d, extra_field=1),
        # parses and loads, but a resume would iterate a dict as its log
        r"trainer_state\.json: malformed trainer state: log_history is not a list": lambda d: _edit_state(
            d, log_history={"loss": 1.0}),
        r"no rng_state\.pth": lambda d: (d / "rng_state.pth").unlink(),
        r"tensor model\.norm\.weight saved with shape \[3\], the model has \[64\]": reshape,
        r"1 tensor\(s\) of the model missing from the checkpoint: model\.layers\.1\.mlp\.down_proj\.weight": drop,
    }
    for i, (message, how) in enumerate(cases.items()):
        bad = corrupt(f"c{i}", how)
        with pytest.raises(ResumeError, match=message) as err:
            resume(bad)
        assert str(bad) in str(err.value)
        if how not in (reshape, drop):  # file-level damage: a rerun through the flow skips such a checkpoint too
            with pytest.raises(ResumeError):
                check_trainer_checkpoint(bad)

    # other inputs than the killed run's: its checkpoints are not resumed, the stage starts over
    run = _run("sft", out, [*SFT_ARGS, "--learning_rate", "5e-4"], runs)
    assert run.manifest["training"]["resumed_from"] is None and run.manifest["training"]["global_step"] == 8


def _edit_state(ckpt: Path, **fields) -> None:
    f = ckpt / "trainer_state.json"
    f.write_text(json.dumps({**json.loads(f.read_text()), **fields}))


def _flip_4kib(f: Path) -> None:
    """Bit-flip 4 KiB in the middle of ``f`` (tensor data); the zip directory at its end stays intact."""
    data = bytearray(f.read_bytes())
    mid = len(data) // 2
    data[mid:mid + 4096] = bytes(b ^ 0xFF for b in data[mid:mid + 4096])
    f.write_bytes(bytes(data))
    assert zipfile.is_zipfile(f)  # what the old check looked at: it passed


def test_damaged_checkpoints_are_refused_kept_aside_and_the_next_older_one_resumed(runs, sft_reference):
    """4 KiB flipped inside the newest checkpoint's optimizer.pt, a trainer_state.json that parses and loads but is
    malformed in the next one: both refused with the reason (their sha256 / the field), kept as
    refused-checkpoint-<step>, and the rerun resumes from the oldest, ending where the uninterrupted run ends."""
    out = runs / "sft-damaged"
    _killed("sft", out, SFT_ARGS, runs, kill_after=7)
    assert [p.name for p in trainer_checkpoints(out)] == ["checkpoint-6", "checkpoint-4", "checkpoint-2"]

    # a copy with every checkpoint damaged: nothing to resume, yet the folder is kept with them set aside
    every = runs / "sft-damaged-every"
    shutil.copytree(out, every)
    for p in trainer_checkpoints(every):
        _flip_4kib(p / "optimizer.pt")
    assert resumable_checkpoint(every, (every / ATTEMPT_KEY_FILE).read_text().strip()) == (None, True)
    assert trainer_checkpoints(every) == []
    assert sorted(r["step"] for r in refused_checkpoints(every)) == [2, 4, 6]
    assert all("optimizer.pt: sha256" in r["reason"] and r["marked_complete"] for r in refused_checkpoints(every))

    _flip_4kib(out / "checkpoint-6" / "optimizer.pt")
    _edit_state(out / "checkpoint-4", global_step="4")  # the old check took int("4"); the Trainer compares ints
    rerun = _run("sft", out, SFT_ARGS, runs)
    _assert_same_run(out, sft_reference, resumed_from_step=2, epochs=2.0)
    refused = {r["step"]: r for r in rerun.manifest["training"]["refused_checkpoints"]}
    assert sorted(refused) == [4, 6]
    assert "checkpoint-6/optimizer.pt: sha256" in refused[6]["reason"]
    assert "checkpoint-4/trainer_state.json: malformed trainer state: global_step is '4'" in refused[4]["reason"]
    for step in (4, 6):  # kept, marker and all, with the reason next to it
        kept = out / f"refused-checkpoint-{step}"
        assert refused[step]["kept_at"] == str(kept) and (kept / COMPLETE_MARKER).is_file()
        assert json.loads((kept / REFUSED_MARKER).read_text())["reason"] == refused[step]["reason"]
    assert "refused checkpoint-6: " in (out / "stage.log").read_text()  # the reason is logged too


def test_a_nan_loss_refuses_the_save_naming_the_step(tmp_path, monkeypatch):
    """The model's output is NaN during step 2 (``RLHF_FAULT_NAN_AT_STEP``, as a forward overflow would make it): the
    NaN loss is logged (transformers would have hidden it behind the mean of the earlier ones) and the save due at
    step 2 is refused before anything is written; the stage fails naming the step."""
    from rlhf.resume import NAN_FAULT_ENV
    from rlhf.training_health import TrainingDiverged
    from sft.train import main

    monkeypatch.setenv(NAN_FAULT_ENV, "2")
    out = tmp_path / "nan"
    with pytest.raises(TrainingDiverged, match=r"refusing to save the checkpoint at step 2: the training loss is nan"):
        main(["--config", str(RECIPES / "sft.yaml"), "--report_to", "none", "--output_dir", str(out),
              "--max_train_samples", "8", "--max_steps", "4", "--save_steps", "2", "--save_minutes", "0"])
    assert trainer_checkpoints(out) == [] and not (out / "checkpoint").exists()
    assert not (out / "manifest.json").exists()


def test_loss_and_weight_bounds_by_hand():
    """The bounds of rlhf.training_health on hand-worked values: max(10 x first logged loss, 1.0); |w| <= 1e4."""
    from rlhf.training_health import TrainingDiverged, check_loss, weights_problem

    log = [{"loss": 2.0, "step": 1}, {"loss": 1.5, "step": 2}]
    check_loss(19.99, 3, log)  # under 10 x 2.0
    with pytest.raises(TrainingDiverged, match=r"step 3: the training loss 20\.5 exceeds 20 \(max\(10 x the first"):
        check_loss(20.5, 3, log)
    with pytest.raises(TrainingDiverged, match="step 7: the training loss is inf"):
        check_loss(float("inf"), 7, log)
    check_loss(0.9, 3, [{"loss": 0.05}])  # the floor: 10 x 0.05 = 0.5 < 1.0
    with pytest.raises(TrainingDiverged, match="exceeds 1 "):
        check_loss(1.1, 3, [{"loss": 0.05}])
    check_loss(None, 1, [])  # nothing logged yet
    ok = torch.ones(3)
    assert weights_problem([("a", ok), ("b", torch.tensor([-9999.0]))]) is None
    assert weights_problem([("a", ok), ("b", torch.tensor([0.0, -2e4]))]) == \
        "weight b has an entry of magnitude 20000 > 10000"
    assert weights_problem([("a", torch.tensor([1.0, float("nan")]))]) == "weight a has non-finite entries"


def test_length_grouped_order_is_a_function_of_seed_and_epoch_only():
    from rlhf.efficiency import EpochSeededLengthGroupedSampler

    lengths = [3, 9, 1, 7, 5, 2, 8, 4, 6, 10, 12, 11]
    s = EpochSeededLengthGroupedSampler(2, lengths=lengths, seed=42)
    s.set_epoch(1)
    first = list(s)
    torch.rand(1000)  # what drew from the global RNG before (dropout, other samplers) does not matter
    assert list(s) == first and sorted(first) == list(range(len(lengths)))
    s.set_epoch(0)
    assert list(s) != first  # each epoch its own shuffle
    other = EpochSeededLengthGroupedSampler(2, lengths=lengths, seed=42)
    other.set_epoch(1)
    assert list(other) == first  # a fresh process (a resumed run) draws the same order


def test_checkpoints_by_time_every_save_minutes_and_at_epoch_ends_never_at_the_last_step(monkeypatch):
    """The wall-time rule of ResumeCallback on a fake clock: due after ``save_minutes``, the clock restarts at each
    save, an epoch end saves only a minute or more after the last save, the last step never (the stage saves it)."""
    from types import SimpleNamespace

    from transformers import TrainerControl, TrainerState

    import rlhf.resume as resume

    now = [1000.0]
    monkeypatch.setattr(resume.time, "monotonic", lambda: now[0])
    cb = resume.ResumeCallback()
    args, state = SimpleNamespace(save_minutes=30, output_dir="/nonexistent"), TrainerState(max_steps=100)
    cb.on_train_begin(args, state, TrainerControl())

    def step_end(at_minutes: float, step: int = 10) -> bool:
        now[0], state.global_step = 1000.0 + 60 * at_minutes, step
        return cb.on_step_end(args, state, TrainerControl()).should_save

    assert not step_end(29.9) and step_end(30.0)
    cb.on_save(args, state, TrainerControl())  # the clock restarts at the save
    assert not step_end(59.0) and step_end(60.0)
    assert not step_end(600, step=100)  # the last step: the stage saves the model itself
    cb.on_save(args, state, TrainerControl())
    now[0] += 59
    assert not cb.on_epoch_end(args, state, TrainerControl()).should_save  # a short epoch: no extra save
    now[0] += 1
    state.global_step = 50
    assert cb.on_epoch_end(args, state, TrainerControl()).should_save
    args.save_minutes = 0  # off: only the Trainer's own save_strategy
    assert not step_end(10_000) and not cb.on_epoch_end(args, state, TrainerControl()).should_save
