"""Resume under DeepSpeed: SFT on the tiny model under ZeRO-2 (one process, DeepSpeed's CPU accelerator, gloo),
killed with SIGKILL after a checkpoint and rerun through the flow's stage launcher, ends where an uninterrupted
ZeRO-2 run ends.

Under DeepSpeed transformers writes no ``optimizer.pt``: the checkpoint holds ``latest`` and ``global_step<N>/``
(``mp_rank_00_model_states.pt``, ``zero_pp_rank_0_mp_rank_00_optim_states.pt``); the test asserts that layout on
the real checkpoint, that the completion marker records it with every file's sha256, and that the rerun resumed
from it (before, every such checkpoint was refused, deleted, and training restarted at step 0).

Tolerance: 1e-6 (absolute) on the loss over every step, the last logged loss and every weight, as in
tests/test_resume.py. On one CPU process in fp32 the DeepSpeed engine restores its fp32 optimizer partition and the
Trainer's scheduler and RNG state exactly, so the resumed run repeats the same arithmetic; one step changes the
weights by about 1e-3 (lr 1e-3), three orders above the bound, so a resume from the wrong step or a lost optimizer
state fails it.
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from flows.stages import StageFailed, run_stage
from rlhf.registry import STAGES
from rlhf.resume import COMPLETE_MARKER, FAULT_ENV, ResumeError, check_trainer_checkpoint, trainer_checkpoints

RECIPES = Path(__file__).resolve().parent.parent / "recipes" / "smoke"
TOL = 1e-6
# 8 rows, batch 2: 4 steps (one epoch); a checkpoint every 2 steps; killed at the start of step 4
ARGS = ["--max_train_samples", "8", "--max_steps", "4", "--save_steps", "2", "--save_total_limit", "2",
        "--save_minutes", "0"]
ZERO2_CPU = """\
compute_environment: LOCAL_MACHINE
distributed_type: DEEPSPEED
deepspeed_config:
  zero_stage: 2
  offload_optimizer_device: none
  offload_param_device: none
  gradient_accumulation_steps: 1
  gradient_clipping: 1.0
machine_rank: 0
num_machines: 1
num_processes: 1
mixed_precision: "no"
use_cpu: true
main_process_port: {port}
rdzv_backend: static
same_network: true
"""


@pytest.fixture(scope="module")
def zero2(tmp_path_factory):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = tmp_path_factory.mktemp("zero2")
    cfg = root / "zero2_cpu.yaml"
    cfg.write_text(ZERO2_CPU.format(port=port))
    mp = pytest.MonkeyPatch()
    mp.setenv("WANDB_MODE", "disabled")
    mp.setenv("DS_ACCELERATOR", "cpu")  # DeepSpeed's CPU accelerator (gloo without oneCCL)
    mp.delenv(FAULT_ENV, raising=False)
    yield root, str(cfg)
    mp.undo()


def _run(out: Path, root: Path, cfg: str, kill_after: int | None = None):
    mp = pytest.MonkeyPatch()
    if kill_after is not None:
        mp.setenv(FAULT_ENV, str(kill_after))
    try:
        return run_stage("sft", STAGES["sft"].module, RECIPES / "sft.yaml", out, extra_args=ARGS, runs_dir=root,
                         accelerate_config=cfg, log=lambda _line: None)
    finally:
        mp.undo()


def test_zero2_stage_killed_after_a_checkpoint_resumes_to_the_uninterrupted_loss(zero2):
    root, cfg = zero2
    ref = _run(root / "ref", root, cfg)
    assert ref.manifest["training"]["resumed_from"] is None

    out = root / "killed"
    with pytest.raises(StageFailed):
        _run(out, root, cfg, kill_after=3)
    assert "SIGKILL" in (out / "stage.log").read_text()
    ckpt = out / "checkpoint-2"
    assert trainer_checkpoints(out) == [ckpt]
    # the layout transformers writes under DeepSpeed: no optimizer.pt; latest + global_step2/ shards
    assert not (ckpt / "optimizer.pt").exists()
    assert (ckpt / "latest").read_text().strip() == "global_step2"
    shards = sorted(p.name for p in (ckpt / "global_step2").iterdir())
    assert shards == ["mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"]
    marker = json.loads((ckpt / COMPLETE_MARKER).read_text())
    assert marker["layout"] == "deepspeed" and marker["world_size"] == 1
    assert {"latest", "global_step2/zero_pp_rank_0_mp_rank_00_optim_states.pt", "trainer_state.json",
            "rng_state.pth"} <= set(marker["files"])
    assert check_trainer_checkpoint(ckpt) == 2

    # 4 KiB flipped inside a copy's optimizer shard (zip directory intact): refused, naming the shard and sha256
    import shutil

    bad = root / "bad" / "checkpoint-2"
    shutil.copytree(ckpt, bad)
    shard = bad / "global_step2" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    data = bytearray(shard.read_bytes())
    mid = len(data) // 2
    data[mid:mid + 4096] = bytes(b ^ 0xFF for b in data[mid:mid + 4096])
    shard.write_bytes(bytes(data))
    assert zipfile.is_zipfile(shard)
    with pytest.raises(ResumeError, match=r"zero_pp_rank_0_mp_rank_00_optim_states\.pt: sha256"):
        check_trainer_checkpoint(bad)
    # a checkpoint saved by one process is refused by a run of two (per-process shards)
    with pytest.raises(ResumeError, match="saved by 1 process"):
        check_trainer_checkpoint(ckpt, world_size=2)

    resumed = _run(out, root, cfg)
    got, want = resumed.manifest["training"], ref.manifest["training"]
    wa = load_file(str(out / "checkpoint" / "model.safetensors"))
    wb = load_file(str(root / "ref" / "checkpoint" / "model.safetensors"))
    diff = max(float((wa[k] - wb[k]).abs().max()) for k in wb)
    print(f"ZeRO-2 resumed from step {got['resumed_from_step']}: loss {got['train_loss']:.8f} vs "
          f"{want['train_loss']:.8f} uninterrupted; max |weight diff| {diff:.3g}")
    assert got["resumed_from"] == str(ckpt.resolve()) and got["resumed_from_step"] == 2
    assert got["steps_this_run"] == 2 and got["global_step"] == want["global_step"] == 4
    assert got["refused_checkpoints"] == []
    assert abs(got["train_loss"] - want["train_loss"]) <= TOL
    assert abs(got["final_logged_loss"] - want["final_logged_loss"]) <= TOL
    assert wa.keys() == wb.keys() and diff <= TOL
    assert torch.isfinite(torch.tensor(got["train_loss"]))
    assert os.environ.get(FAULT_ENV) is None


def test_fsdp_layouts_with_the_names_transformers_and_accelerate_write(tmp_path):
    """FSDP is not run here (no GPU): the layout check is tested on folders named by the libraries' own constants
    (transformers.trainer.FSDP_MODEL_NAME, accelerate's OPTIMIZER_NAME), full and sharded, each file a real
    torch.save archive, so a renamed file in either library fails this test."""
    from accelerate.utils.constants import OPTIMIZER_NAME
    from transformers.trainer import FSDP_MODEL_NAME, SCHEDULER_NAME

    from rlhf.checkpoint_integrity import CheckpointDamaged, check_layout, detect_layout

    def save(f: Path) -> None:
        f.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"x": torch.ones(2)}, f)

    full = tmp_path / "full"
    for name in (f"{FSDP_MODEL_NAME}.bin", f"{OPTIMIZER_NAME}.bin", SCHEDULER_NAME, "rng_state_0.pth"):
        save(full / name)
    sharded = tmp_path / "sharded"
    for d in (f"{FSDP_MODEL_NAME}_0", f"{OPTIMIZER_NAME}_0"):  # torch.distributed.checkpoint folders
        (sharded / d).mkdir(parents=True)
        (sharded / d / ".metadata").write_bytes(b"m")
        (sharded / d / "__0_0.distcp").write_bytes(b"d")
    for name in (SCHEDULER_NAME, "rng_state_0.pth", "rng_state_1.pth"):
        save(sharded / name)
    for folder in (full, sharded):
        assert detect_layout(folder) == "fsdp"
        check_layout(folder, "fsdp")
    (sharded / f"{OPTIMIZER_NAME}_0" / ".metadata").unlink()
    with pytest.raises(CheckpointDamaged, match=r"optimizer_0: sharded .* without \.metadata"):
        check_layout(sharded, "fsdp")
    (full / f"{OPTIMIZER_NAME}.bin").unlink()
    with pytest.raises(CheckpointDamaged, match=r"no FSDP optimizer state"):
        check_layout(full, "fsdp")
