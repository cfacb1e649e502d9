"""Content hashes, manifests, pi_ref freezing, checkpoint checks, precision, recipes and stage cache keys."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import torch

from rlhf.hashing import content_hash, json_hash
from rlhf.manifest import read_manifest, write_manifest
from rlhf.precision import resolve_precision
from rlhf.stage import check_checkpoint, freeze_dir, verify_hash

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


def test_precision_on_cpu_is_fp32_and_bad_values_are_refused():
    if torch.cuda.is_available():
        pytest.skip("CPU rule")
    assert resolve_precision("auto") == "fp32"
    assert resolve_precision("bf16") == "fp32"
    with pytest.raises(ValueError):
        resolve_precision("int8")


@pytest.mark.parametrize("recipe", sorted(p.relative_to(RECIPES).as_posix() for p in RECIPES.glob("*/*.yaml")
                                          if p.parent.name != "accelerate_configs"))
def test_every_recipe_parses_strictly(recipe):
    from trl import TrlParser

    stage = Path(recipe).stem
    if stage == "ppo":
        from ppo.train import parse_args

        parse_args(["--config", str(RECIPES / recipe), "--output_dir", "/tmp/x"])
        return
    config = {"sft": "sft.config:SFTStageConfig", "dpo": "dpo.config:DPOStageConfig",
              "reward": "reward_model.config:RewardStageConfig", "gates": "gates.evaluate:GateStageConfig"}[stage]
    module, cls = config.split(":")
    C = getattr(__import__(module, fromlist=[cls]), cls)
    (args,) = TrlParser((C,)).parse_args_and_config(["--config", str(RECIPES / recipe), "--output_dir", "/tmp/x"])
    assert args.output_dir == "/tmp/x"


def test_unknown_recipe_key_is_an_error(tmp_path):
    from trl import TrlParser

    from dpo.config import DPOStageConfig

    bad = tmp_path / "dpo.yaml"
    bad.write_text("beta: 0.1\nbetta: 0.2\n")
    with pytest.raises(ValueError, match="betta"):
        TrlParser((DPOStageConfig,)).parse_args_and_config(["--config", str(bad), "--output_dir", "/tmp/x"])


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
    from rlhf.hashing import STAGE_PACKAGES

    assert "gates" not in STAGE_PACKAGES["sft"] and "gates" not in STAGE_PACKAGES["dpo"]
    assert all({"rlhf", "data"} <= set(v) for v in STAGE_PACKAGES.values())
    assert "dpo" in STAGE_PACKAGES["reward_model"]  # it imports dpo.prepare


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
