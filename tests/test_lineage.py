"""Content hashes, manifests, pi_ref freezing, checkpoint checks, precision, recipes and stage cache keys."""

from __future__ import annotations

import re
import stat
from pathlib import Path

import pytest
import torch

from rlhf.checkpoint import check_checkpoint, freeze_dir, verify_hash
from rlhf.lineage import content_hash, json_hash
from rlhf.manifest import read_manifest, write_manifest
from rlhf.precision import resolve_precision

RECIPES = Path(__file__).resolve().parent.parent / "recipes"


def test_content_hash_follows_content_not_path(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        (d / "w.bin").write_bytes(b"123")
    assert content_hash(a) == content_hash(b)
    (b / "w.bin").write_bytes(b"124")
    assert content_hash(a) != content_hash(b)
    (a / "manifest.json").write_text("{}")  # the manifest describes the content; it is not part of it
    assert content_hash(a) == content_hash(tmp_path / "a")
    assert json_hash({"x": 1, "y": 2}) == json_hash({"y": 2, "x": 1})


def test_manifest_is_written_atomically_and_missing_one_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="did not finish"):
        read_manifest(tmp_path)
    write_manifest(tmp_path, {"stage": "sft"})
    assert read_manifest(tmp_path)["stage"] == "sft"
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]  # no temp files left behind


def test_frozen_pi_ref_is_read_only_and_a_change_is_caught(tmp_path):
    d = tmp_path / "pi_ref"
    d.mkdir()
    (d / "model.safetensors").write_bytes(b"weights")
    h = freeze_dir(d)
    assert not (d / "model.safetensors").stat().st_mode & stat.S_IWUSR
    verify_hash(d, h, when="before training")
    (d / "model.safetensors").chmod(0o644)
    (d / "model.safetensors").write_bytes(b"moved")
    with pytest.raises(RuntimeError, match="changed after training"):
        verify_hash(d, h, when="after training")


def test_empty_tensor_checkpoint_is_refused(tmp_path):
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(0, 4)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(RuntimeError, match="tensor w is empty"):
        check_checkpoint(tmp_path)
    with pytest.raises(RuntimeError, match="no .safetensors"):
        check_checkpoint(tmp_path / "nothing")


@pytest.mark.parametrize("native", ["0", "1"])
def test_precision_follows_the_bf16_detection_both_ways_and_bad_values_are_refused(native, monkeypatch):
    # Both paths on every machine: the detection is forced, whatever this CPU's flags are.
    if torch.cuda.is_available():
        pytest.skip("CPU rule")
    monkeypatch.setenv("RLHF_NATIVE_BF16", native)
    if native == "0":  # bf16 would be emulated: fp32 whatever is asked
        assert resolve_precision("auto") == "fp32" and resolve_precision("bf16") == "fp32"
    else:
        assert resolve_precision("auto", "sft") == "bf16" and resolve_precision("bf16", "dpo") == "bf16"
    assert resolve_precision("fp32", "sft") == "fp32"
    with pytest.raises(ValueError):
        resolve_precision("int8")
    monkeypatch.setenv("RLHF_NATIVE_BF16", "yes")
    with pytest.raises(ValueError, match="RLHF_NATIVE_BF16 must be 0 or 1"):
        resolve_precision("auto")


# Stage recipes, in every preset folder, nested ones too (recipes/8b/full/): accelerate_configs/ are accelerate's
# files (parsed below), and flywheel/simulator.yaml is the traffic simulator's parameters, parsed strictly by
# flywheel.simulate.load_simulator_config (tests/test_flywheel_simulate.py).
ACCELERATE_CONFIGS = sorted(p.name for p in (RECIPES / "accelerate_configs").glob("*.yaml"))
STAGE_RECIPES = sorted(p.relative_to(RECIPES).as_posix() for p in RECIPES.rglob("*.yaml")
                       if p.relative_to(RECIPES).parts[0] not in ("accelerate_configs", "flywheel"))


def test_every_recipe_file_has_a_strict_parser():
    """No YAML file under recipes/ escapes the strict parses: stage recipes, accelerate configs, the simulator."""
    every = {p.relative_to(RECIPES).as_posix() for p in RECIPES.rglob("*.y*ml")}
    covered = {*STAGE_RECIPES, *(f"accelerate_configs/{n}" for n in ACCELERATE_CONFIGS), "flywheel/simulator.yaml"}
    assert every == covered
    assert {"8b/full/sft.yaml", "8b/full/dpo.yaml", "8b/full/reward.yaml", "8b/lora/sft.yaml", "8b/lora/dpo.yaml",
            "8b/lora/reward.yaml"} <= covered


@pytest.mark.parametrize("recipe", STAGE_RECIPES)
def test_every_recipe_parses_strictly(recipe):
    from trl import TrlParser

    from flows.stages import check_stage_config
    from rlhf.registry import by_recipe

    entry = by_recipe(Path(recipe).stem)  # the registry says which config(s) parse this file
    parsed = TrlParser(entry.config_classes()).parse_args_and_config(
        ["--config", str(RECIPES / recipe), "--output_dir", "/tmp/x"]
    )
    (args,) = [a for a in parsed if hasattr(a, "output_dir")]
    assert args.output_dir == "/tmp/x"
    check_stage_config(entry.name, RECIPES / recipe, [])  # the round's own pre-flight check passes too


def check_accelerate_config(path: Path):
    """Parse an accelerate config the way ``accelerate launch`` does: accelerate's loader refuses unknown top-level
    keys; the ``deepspeed_config`` mapping becomes launch arguments, so each of its keys must be one."""
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.commands.launch import launch_command_parser

    config = ClusterConfig.from_yaml_file(path)
    known = {a.dest for a in launch_command_parser()._actions}
    unknown = sorted(set(config.deepspeed_config or {}) - known)
    if unknown:
        raise ValueError(f"{path}: unknown deepspeed_config key(s) {unknown}")
    return config


@pytest.mark.parametrize("name", ACCELERATE_CONFIGS)
def test_every_accelerate_config_parses_strictly(name):
    config = check_accelerate_config(RECIPES / "accelerate_configs" / name)
    assert config.num_processes % config.num_machines == 0  # the same number of processes on every node
    if name.startswith("zero3"):
        assert config.deepspeed_config["zero_stage"] == 3 and config.mixed_precision == "bf16"
        assert config.deepspeed_config["zero3_save_16bit_model"] is True  # a save gathers full weights


def test_unknown_accelerate_config_key_is_an_error(tmp_path):
    text = (RECIPES / "accelerate_configs" / "zero3_1node.yaml").read_text()
    bad = tmp_path / "top.yaml"
    bad.write_text(text + "num_gpus: 8\n")
    with pytest.raises(ValueError, match="num_gpus"):
        check_accelerate_config(bad)
    nested = tmp_path / "nested.yaml"
    nested.write_text(text.replace("zero_stage: 3", "zero_stage: 3\n  zero3_save_16bit: true"))
    with pytest.raises(ValueError, match="zero3_save_16bit"):
        check_accelerate_config(nested)


def test_unknown_recipe_key_is_an_error(tmp_path):
    from trl import TrlParser

    from dpo.config import DPOStageConfig

    bad = tmp_path / "dpo.yaml"
    bad.write_text("beta: 0.1\nbetta: 0.2\n")
    with pytest.raises(ValueError, match="betta"):
        TrlParser((DPOStageConfig,)).parse_args_and_config(["--config", str(bad), "--output_dir", "/tmp/x"])
    # a stage launched alone names the recipe file (TRL's own message does not)
    from rlhf.config import parse_stage_config

    with pytest.raises(ValueError, match=rf"^{re.escape(str(bad))}: Unknown arguments from config file: "
                                         r"\['--betta', '0.2'\]"):
        parse_stage_config((DPOStageConfig,), ["--config", str(bad), "--output_dir", "/tmp/x"])


def test_stage_cache_key_changes_with_any_input(tmp_path):
    from flows.stages import StageRun, stage_cache_key

    data = tmp_path / "pairs.jsonl"
    data.write_text('{"a": 1}\n')
    recipe = tmp_path / "dpo.yaml"
    recipe.write_text(f"train_data: {data}\nbeta: 0.1\n")
    parent = StageRun("sft", "x", {}, "k1", cached=False, seconds=0)
    key = stage_cache_key("dpo", recipe, [], [parent])
    assert key == stage_cache_key("dpo", recipe, [], [parent])
    assert key != stage_cache_key("dpo", recipe, ["--beta", "0.2"], [parent])  # config override
    assert key != stage_cache_key("dpo", recipe, [], [StageRun("sft", "x", {}, "k2", False, 0)])  # parent changed
    data.write_text('{"a": 2}\n')  # same path, new content
    assert key != stage_cache_key("dpo", recipe, [], [parent])


def test_a_code_change_recomputes_only_the_stages_that_run_that_code():
    from rlhf.registry import STAGES

    packages = {name: s.code_packages for name, s in STAGES.items()}
    assert "gates" not in packages["sft"] and "gates" not in packages["dpo"]
    assert all({"rlhf", "data"} <= set(v) for v in packages.values())
    assert "judging" in packages["gates"] and "judging" in packages["reward_model"]  # both import judging
    assert all(name in pkgs for name, pkgs in packages.items())


def _write_tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        f = root / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)


def test_code_dependencies_follow_real_imports_transitively(tmp_path):
    """stage_a -> shared_b (a lazy import inside a function) -> shared_c; unrelated_d is imported by nobody."""
    from rlhf.lineage import code_packages, code_version, imported_packages

    _write_tree(tmp_path, {
        "stage_a/__init__.py": "",
        "stage_a/train.py": "import os\nfrom . import helpers\n\ndef main():\n    from shared_b.util import f\n",
        "stage_a/helpers.py": "import numpy\n",
        "shared_b/__init__.py": "",
        "shared_b/util.py": "import shared_c.core as core\n\ndef f():\n    return core.X\n",
        "shared_c/core.py": "X = 1\n",  # a namespace package (no __init__.py) still counts
        "unrelated_d/__init__.py": "Y = 2\n",
        "tests/test_x.py": "import stage_a\n",  # tests are not a package of the product
    })  # fmt: skip
    assert imported_packages("stage_a", tmp_path) == {"shared_b"}  # os, numpy and relative imports are not deps
    deps = code_packages("stage_a", tmp_path)
    assert deps == ("shared_b", "shared_c", "stage_a")
    before = code_version(deps, tmp_path)
    (tmp_path / "unrelated_d" / "__init__.py").write_text("Y = 3\n")
    assert code_version(code_packages("stage_a", tmp_path), tmp_path) == before  # an unrelated change: reused
    (tmp_path / "shared_c" / "core.py").write_text("X = 2\n")  # two imports away
    assert code_version(code_packages("stage_a", tmp_path), tmp_path) != before  # recomputed


@pytest.mark.parametrize("name", ["reward_model", "gates"])  # the stages that reach shared code indirectly
def test_each_stage_code_set_covers_what_importing_it_loads(name):
    """The lineage bug of issue 6: gates ran dpo's code (via reward_model) but their key did not follow it. Now the
    set is read from the source; this checks it against Python itself: every project package that importing the
    stage's module loads is in the stage's code set (lazy imports inside functions come on top of these)."""
    import json
    import subprocess
    import sys

    from rlhf.lineage import ROOT, project_packages
    from rlhf.registry import STAGES

    entry = STAGES[name]
    code = (f"import json, sys; import {entry.module}; "
            f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    loaded = set(json.loads(out.splitlines()[-1])) & set(project_packages())
    assert entry.package in loaded and loaded <= set(entry.code_packages), sorted(loaded - set(entry.code_packages))


def test_cache_key_follows_base_model_content_and_parent_results(tmp_path):
    from flows.stages import StageRun, stage_cache_key

    model = tmp_path / "base"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"v1")
    recipe = tmp_path / "sft.yaml"
    recipe.write_text(f"model_name_or_path: {model}\n")
    key = stage_cache_key("sft", recipe, [], [])
    (model / "model.safetensors").write_bytes(b"v2")  # retrained in place, same path
    assert stage_cache_key("sft", recipe, [], []) != key
    a = StageRun("dpo", "x", {"outputs": {"checkpoint_hash": "h1"}}, "k", False, 0)
    b = StageRun("dpo", "x", {"outputs": {"checkpoint_hash": "h2"}}, "k", False, 0)  # forced rerun, new weights
    assert stage_cache_key("gates", recipe, [], [a]) != stage_cache_key("gates", recipe, [], [b])


def test_a_damaged_cached_output_is_not_reused(tmp_path):
    from flows.stages import outputs_intact

    ckpt = tmp_path / "checkpoint"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(b"w")
    manifest = {"outputs": {"checkpoint": str(ckpt), "checkpoint_hash": content_hash(ckpt)}}
    assert outputs_intact(tmp_path, manifest) is None
    (ckpt / "model.safetensors").write_bytes(b"x")
    assert "changed" in outputs_intact(tmp_path, manifest)
    (ckpt / "model.safetensors").unlink()
    ckpt.rmdir()
    assert "missing" in outputs_intact(tmp_path, manifest)


def test_a_failed_stage_reports_its_own_error_line():
    from flows.stages import root_cause

    log = ["Traceback (most recent call last):\n", "data.validation.DataValidationError: p.jsonl row 2 field "
           "'chosen': missing (field required)\n", "Traceback (most recent call last):\n",
           "subprocess.CalledProcessError: Command '[...]' returned non-zero exit status 1.\n"]
    assert root_cause(log) == "data.validation.DataValidationError: p.jsonl row 2 field 'chosen': missing (field required)"


def test_recipes_and_overrides_are_checked_before_anything_trains():
    from flows.stages import check_stage_config

    dpo = RECIPES / "demo" / "dpo.yaml"
    check_stage_config("dpo", dpo, ["--beta", "0.2"])
    with pytest.raises(ValueError, match=r"unknown key\(s\) 'betta' \(did you mean 'beta'"):
        check_stage_config("dpo", dpo, ["--betta", "0.1"])
    with pytest.raises(ValueError, match="invalid float value: 'abc'"):
        check_stage_config("dpo", dpo, ["--beta", "abc"])
    with pytest.raises(FileNotFoundError, match="dpo.train_data = /nope.jsonl: no such file"):
        check_stage_config("dpo", dpo, ["--train_data", "/nope.jsonl"])


def test_shared_code_never_imports_a_stage_or_the_flows():
    """The bottom layer (rlhf, judging, data) stands alone: rlhf/registry.py names the stages as strings only."""
    from rlhf.lineage import imported_packages
    from rlhf.registry import STAGES

    above = {s.package for s in STAGES.values()} | {"flows", "flywheel"}
    for shared in ("rlhf", "judging", "data"):
        assert not imported_packages(shared) & above, (shared, sorted(imported_packages(shared) & above))
