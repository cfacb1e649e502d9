"""The benchmarks build TRL configs that transformers accepts on every device: CPUs with and without native bf16,
and CUDA (the argument building is checked for it here; the configs themselves only where a device has it)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("defaults", [False, True])
@pytest.mark.parametrize("bf16", [False, True])
def test_step_time_precision_fields_for_cpu_and_cuda(bf16, defaults):
    from trl import SFTConfig

    values = _load("step_time").precision_values
    cpu, cuda = values(bf16, False, defaults, cuda=False), values(bf16, False, defaults, cuda=True)
    if defaults:  # TRL's own precision: bf16 on; a CPU must say use_cpu for it
        assert cpu == {"use_cpu": True} and cuda == {}
    else:
        assert cpu["bf16"] == cuda["bf16"] == bf16 and cpu["gradient_checkpointing"] is False
        assert cpu.get("use_cpu", False) == bf16 and "use_cpu" not in cuda
    if not torch.cuda.is_available():  # the CPU configs build on this machine, whatever its bf16 flags
        config = SFTConfig(output_dir="/tmp/unused", report_to=[], **cpu)
        assert config.bf16 == (bf16 or defaults)


def test_online_rl_benchmark_gives_every_method_the_same_budget(tmp_path):
    from transformers import HfArgumentParser

    from rlhf.registry import STAGES

    budget_args = _load("online_rl").budget_args
    given = dict(steps=3, completions=6, samples=3, max_new_tokens=12, prompts=9, prompts_data="demo:x.jsonl")
    per_step = {}
    for method in ("ppo", "grpo", "rloo"):
        argv = [*budget_args(method, **given), "--output_dir", str(tmp_path / method)]
        parsed = HfArgumentParser(STAGES[method].config_classes()).parse_args_into_dataclasses(args=argv)
        values = {k: v for cfg in parsed for k, v in vars(cfg).items()}
        if method == "ppo":
            steps, completions, tokens = values["num_steps"], values["batch_size"], values["max_new_tokens"]
            data, prompts = values["prompts_data"], values["max_prompts"]
        else:  # a step is per_device_train_batch_size completions: / num_generations prompts x num_generations
            steps, completions, tokens = values["max_steps"], values["per_device_train_batch_size"], \
                values["max_completion_length"]
            data, prompts = values["train_data"], values["max_train_samples"]
            assert values["num_generations"] == 3 and values["gradient_accumulation_steps"] == 1
        per_step[method] = (steps, completions, tokens, data, prompts)
    assert set(per_step.values()) == {(3, 6, 12, "demo:x.jsonl", 9)}
    with pytest.raises(ValueError, match="multiple of --samples"):
        budget_args("grpo", **{**given, "completions": 5})


def test_precision_outcome_distances_and_decision_are_hand_worked():
    import numpy as np

    bench = _load("precision_outcome")
    ref = np.array([3.0, 4.0])  # ||ref|| = 5
    assert bench._distance(ref, ref) == 0.0
    assert bench._distance(np.zeros(2), ref) == 1.0  # no update at all is distance 1
    assert bench._distance(np.array([3.0, 1.0]), ref) == pytest.approx(3.0 / 5.0)
    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 2.0]]))
    update, none = bench._update_distance(model, {"weight": torch.zeros(1, 2)}, None)
    assert none is None and torch.equal(update["weight"], torch.tensor([[1.0, 2.0]]))
    _, dist = bench._update_distance(model, {"weight": torch.zeros(1, 2)}, {"weight": torch.tensor([[1.0, 0.0]])})
    assert dist == pytest.approx(2.0)  # ||(1,2) - (1,0)|| / ||(1,0)||
    noise = {"out_dist": 0.6, "update_dist": 1.1, "sign": 0.81}
    assert bench.within_noise({"out_dist": 0.02, "update_dist": 0.08, "sign": 1.0}, noise)
    assert not bench.within_noise({"out_dist": 0.7, "update_dist": 0.08, "sign": 1.0}, noise)
    assert not bench.within_noise({"out_dist": 0.02, "update_dist": 0.08, "sign": 0.75}, noise)


def test_drift_reader_agreement_is_hand_worked(tmp_path):
    bench = _load("drift_counters")
    rows = [{"id": f"r{i}", "split": "heldout_g", "prompt": "Name two fruits.", "answer": answer,
             "labels": {"restates_question": False, "has_bullet_list": bullets, "is_hedged": False}}
            for i, (answer, bullets) in enumerate([("- apple\n- pear", True), ("Apple and pear.", False),
                                                   ("- fig\n- plum", True), ("Kiwi, lime.", False)])]
    second = {"r0": {"restates_question": False, "has_bullet_list": True, "is_hedged": False},
              "r1": {"restates_question": False, "has_bullet_list": True, "is_hedged": False},  # the readers differ
              "r2": {"restates_question": False, "has_bullet_list": True, "is_hedged": False}}
    out = {(r["counter"], r["pair"]): r for r in bench.reader_agreement(rows, second)}
    assert out[("has_bullet_list", "reader 3 vs reader 4")]["alike"] == round(2 / 3, 3)
    assert out[("has_bullet_list", "counter vs reader 3")]["alike"] == 1.0  # the counter reads markers as reader 3
    assert out[("has_bullet_list", "counter vs reader 4")]["kappa"] == 0.0  # reader 4 said yes to all three
    agreed = out[("has_bullet_list", "counter on the 2 rows both readers label alike")]
    assert agreed["n"] == 2 and agreed["precision"] == 1.0 and agreed["recall"] == 1.0
    path = tmp_path / "second.jsonl"
    path.write_text('{"id": "nope", "labels": {}}\n')
    with pytest.raises(ValueError, match="second.jsonl:1: id 'nope' is not a row"):
        bench.load_second_reader(path, rows)


def test_round_time_passes_overrides_and_its_same_gates_set_parses_against_the_demo_recipe(tmp_path):
    """``benchmarks/round_time.py --set`` reaches ``rlhf round`` as ``--set`` pairs, and the overrides that leave out
    the gates added since 6012cb5 are keys the demo gates recipe accepts with those values (a renamed key fails
    here, not 15 minutes into a benchmark)."""
    from flows.cli import parse_set
    from flows.stages import check_stage_config

    bench = _load("round_time")
    cmd = bench.round_command("demo", tmp_path, "r", list(bench.SAME_GATES_AS_6012CB5))
    assert cmd[1:4] == ["-m", "flows.cli", "round"]
    sets = cmd[cmd.index("--round-id") + 2:]
    assert sets[::2] == ["--set"] * 3 and sets[1::2] == list(bench.SAME_GATES_AS_6012CB5)
    assert bench.round_command("demo", tmp_path, "r") == cmd[: cmd.index("--round-id") + 2]
    overrides = parse_set(list(bench.SAME_GATES_AS_6012CB5))  # as `rlhf round --set` reads them
    assert list(overrides) == ["gates"]
    check_stage_config("gates", ROOT / "recipes" / "demo" / "gates.yaml", overrides["gates"])
    with pytest.raises(ValueError, match="unknown key"):
        check_stage_config("gates", ROOT / "recipes" / "demo" / "gates.yaml", ["--consistensy", "false"])
