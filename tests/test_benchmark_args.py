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
