"""The trainer-stage skeleton (rlhf/trainer_stage.py) the SFT, DPO and reward-model stages share: the return
contract and the rank-0-only writes without a launch (tests/test_distributed.py checks them on 2 real processes),
the one set of trainer defaults, and thin stage entry points."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlhf.config import TrainerDefaults
from rlhf.trainer_stage import Trained, TrainerStage, TrainingData

ROOT = Path(__file__).resolve().parents[1]
TRAINER_STAGES = ("sft", "dpo", "reward_model")


def _trained(main_process: bool) -> Trained:
    accelerator = SimpleNamespace(is_main_process=main_process, state=SimpleNamespace(deepspeed_plugin=None))
    trainer = SimpleNamespace(accelerator=accelerator, model=None, state=SimpleNamespace(log_history=[]))
    result = SimpleNamespace(training_loss=0.5, global_step=3)
    return Trained(trainer, result, {"train_loss": 0.5}, {"threads": 1})


def test_a_rank_other_than_0_writes_nothing_and_returns_its_loss_and_steps(tmp_path):
    args = SimpleNamespace(output_dir=str(tmp_path), use_peft=False, process_index=1, report_to=[])

    def publish(model, checkpoint):
        raise AssertionError("publish runs on rank 0 only")

    data = TrainingData("hash", {"checked": False}, n_data_rejected=0, n_rejected=0)
    got = TrainerStage("sft", args).finish(_trained(False), tokenizer=None, data=data, inputs={}, metrics={},
                                           publish=publish)
    assert got == {"train_loss": 0.5, "train_steps": 3, "rank": 1}
    assert list(tmp_path.iterdir()) == []


def test_load_options_and_trainer_kwargs_come_from_the_config(tmp_path):
    args = SimpleNamespace(output_dir=str(tmp_path), data_mode="lenient", max_reject_rate=0.1, max_train_samples=4,
                           use_peft=False)
    stage = TrainerStage("dpo", args)
    assert stage.load_options() == {"mode": "lenient", "max_reject_rate": 0.1,
                                    "rejects_path": tmp_path / "rejects-data.jsonl", "use_first": 4}
    kwargs = stage.trainer_kwargs("tok")
    assert kwargs["args"] is args and kwargs["processing_class"] == "tok" and kwargs["peft_config"] is None
    assert [type(c).__name__ for c in kwargs["callbacks"]] == ["ResumeCallback"]


@pytest.mark.parametrize("stage", TRAINER_STAGES)
def test_the_trainer_defaults_are_declared_once_and_win_over_trl(stage):
    from rlhf.registry import STAGES

    (config,) = STAGES[stage].config_classes()
    assert TrainerDefaults in config.__mro__
    own = vars(config).get("__annotations__", {})
    fields = {f.name: f for f in dataclasses.fields(config)}
    for f in dataclasses.fields(TrainerDefaults):
        assert f.name not in own, f"{config.__name__} declares {f.name} again"
        assert fields[f.name].default == f.default
        if f.default_factory is not dataclasses.MISSING:
            assert fields[f.name].default_factory() == f.default_factory()
    assert (fields["max_length"].default, fields["save_steps"].default, fields["gradient_checkpointing"].default) == (
        512, 50, None)
    # checkpoints by wall time by default, not every N steps
    assert fields["save_strategy"].default == "no" and fields["save_minutes"].default == 30


@pytest.mark.parametrize("stage", TRAINER_STAGES)
def test_each_trainer_stage_main_is_thin(stage):
    """parse, data, trainer, run: at most 60 lines; the shared sequence lives in rlhf/trainer_stage.py."""
    tree = ast.parse((ROOT / stage / "train.py").read_text())
    (main,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
    assert main.end_lineno - main.lineno + 1 <= 60
    calls = {n.func.attr for n in ast.walk(main) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
    assert {"start", "train", "finish"} <= calls
