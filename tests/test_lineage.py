"""Content hashes, manifests, pi_ref freezing, checkpoint checks, precision, recipes and stage cache keys."""

from __future__ import annotations

import re
import shutil
import stat
from pathlib import Path

import pytest
import torch

from rlhf.checkpoint import check_checkpoint, freeze_dir, verify_hash
from rlhf.lineage import content_hash, json_hash
from rlhf.manifest import read_manifest, write_manifest
from rlhf.precision import resolve_precision

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "recipes"


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
    assert {"8b/full/sft.yaml", "8b/full/dpo.yaml", "8b/full/reward_model.yaml", "8b/lora/sft.yaml", "8b/lora/dpo.yaml",
            "8b/lora/reward_model.yaml"} <= covered


@pytest.mark.parametrize("recipe", STAGE_RECIPES)
def test_every_recipe_parses_strictly(recipe):
    from trl import TrlParser

    from flows.stages import check_stage_config
    from rlhf.registry import stage

    entry = stage(Path(recipe).stem)  # a recipe is named after its stage; the registry says which config(s) parse it
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


def test_the_precision_a_stage_resolves_to_is_in_its_cache_key(tmp_path, monkeypatch):
    """``auto`` trains bf16 where bf16 is native and fp32 elsewhere: a checkpoint trained in one is not reused when
    the detection (forced by RLHF_NATIVE_BF16) says the other; a stage that pins fp32 keeps its key."""
    if torch.cuda.is_available():
        pytest.skip("CPU rule")
    from flows.stages import StageRun, stage_cache_key

    parent = StageRun("sft", "x", {}, "k1", cached=False, seconds=0)
    auto, pinned, gates = tmp_path / "dpo.yaml", tmp_path / "dpo-fp32.yaml", tmp_path / "gates.yaml"
    auto.write_text("beta: 0.1\nprecision: auto\n")
    pinned.write_text("beta: 0.1\nprecision: fp32\n")
    gates.write_text("n_winrate: 4\n")
    keys = {}
    for native in ("0", "1"):
        monkeypatch.setenv("RLHF_NATIVE_BF16", native)
        keys[native] = (stage_cache_key("dpo", auto, [], [parent]), stage_cache_key("dpo", pinned, [], [parent]),
                        stage_cache_key("dpo", auto, ["--precision", "fp32"], [parent]),
                        stage_cache_key("gates", gates, [], [parent]))
    assert keys["0"][0] != keys["1"][0]  # auto: fp32, then bf16
    assert keys["0"][1] == keys["1"][1] and keys["0"][2] == keys["1"][2]  # fp32 either way: pinned, overridden
    # the gates decode in fp32 on any CPU under auto, but where bf16 is native a bf16 copy prefills long prompts
    assert keys["0"][3] != keys["1"][3]
    gates_fp32 = tmp_path / "gates-fp32.yaml"
    gates_fp32.write_text("n_winrate: 4\nprefill_precision: fp32\n")
    pinned_gates = []
    for native in ("0", "1"):
        monkeypatch.setenv("RLHF_NATIVE_BF16", native)
        pinned_gates.append(stage_cache_key("gates", gates_fp32, [], [parent]))
    assert pinned_gates[0] == pinned_gates[1]  # prefill pinned to fp32: all fp32 either way


def _hub_snapshot(cache: Path, repo_type: str, repo_id: str, commit: str) -> None:
    """One repository in a hub cache laid out as huggingface_hub writes it (``<type>s--org--name/refs/main`` naming
    ``snapshots/<commit>/``), pointed at ``commit``."""
    repo = cache / f"{repo_type}s--{repo_id.replace('/', '--')}"
    (repo / "snapshots" / commit).mkdir(parents=True, exist_ok=True)
    (repo / "snapshots" / commit / "config.json").write_text("{}")
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)


def test_hub_models_and_datasets_are_keyed_by_the_commit_they_resolve_to(tmp_path, monkeypatch):
    """A hub id is keyed by the commit huggingface_hub resolves it to from the local cache (offline), never by its
    name: a new push under the same name (refs/main moved) changes every key; an id that cannot be resolved is an
    error naming it, not a name-only key."""
    import huggingface_hub.constants

    from data.fingerprint import data_fingerprint
    from flows.stages import stage_cache_key
    from rlhf.lineage import UnresolvedRevision, hub_key
    from rlhf.models import model_fingerprint

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    old, new = "1" * 40, "2" * 40
    _hub_snapshot(tmp_path / "hub", "model", "org/base", old)
    _hub_snapshot(tmp_path / "hub", "dataset", "org/pairs", old)
    recipe = tmp_path / "sft.yaml"
    recipe.write_text("model_name_or_path: org/base\ntrain_data: org/pairs\n")

    assert hub_key("org/base") == model_fingerprint("org/base") == f"hub:model:org/base@{old}"
    assert data_fingerprint("org/pairs") == f"hub:dataset:org/pairs@{old}"
    key = stage_cache_key("sft", recipe, [], [])
    _hub_snapshot(tmp_path / "hub", "model", "org/base", new)  # same name, new weights
    assert model_fingerprint("org/base") == f"hub:model:org/base@{new}"
    moved = stage_cache_key("sft", recipe, [], [])
    assert moved != key
    _hub_snapshot(tmp_path / "hub", "dataset", "org/pairs", new)  # same name, new data
    assert data_fingerprint("org/pairs") == f"hub:dataset:org/pairs@{new}" and stage_cache_key("sft", recipe, [], []) != moved
    with pytest.raises(UnresolvedRevision, match=r"^model org/absent: cannot resolve which commit"):
        model_fingerprint("org/absent")
    # a local file the flow has not written yet is no hub id
    assert data_fingerprint(str(tmp_path / "gate_suites.yaml")) == f"path:{tmp_path / 'gate_suites.yaml'}"
    recipe.write_text("model_name_or_path: org/absent\n")
    with pytest.raises(UnresolvedRevision, match="org/absent"):
        stage_cache_key("sft", recipe, [], [])


def test_the_launch_layout_is_part_of_the_stage_cache_key(tmp_path):
    """A result or checkpoint made under one accelerate config or world size is never reused under another: the
    config's content and the world size enter the key (same content elsewhere: same key)."""
    from flows.launch.slurm import DEFAULT_ACCELERATE_CONFIG, SlurmJob, slurm_launcher
    from flows.stages import launch_key, stage_cache_key

    recipe = tmp_path / "sft.yaml"
    recipe.write_text("max_steps: 1\n")
    cpu = RECIPES / "accelerate_configs" / "cpu.yaml"
    copy, two, bf16 = tmp_path / "copy.yaml", tmp_path / "two.yaml", tmp_path / "bf16.yaml"
    copy.write_text(cpu.read_text())
    two.write_text(cpu.read_text().replace("num_processes: 1", "num_processes: 2"))
    bf16.write_text(cpu.read_text().replace('mixed_precision: "no"', "mixed_precision: bf16"))

    def key(config, launcher=None):
        return stage_cache_key("sft", recipe, [], [], launch_key(config, launcher))

    assert launch_key(str(cpu)) == {"accelerate_config": content_hash(cpu), "world_size": 1}
    assert launch_key(str(two))["world_size"] == 2 and launch_key(str(bf16))["world_size"] == 1
    assert key(str(cpu)) == key(str(cpu)) == key(str(copy))  # the file's content, not its path
    assert len({key(str(cpu)), key(str(two)), key(str(bf16))}) == 3
    assert launch_key(None)["world_size"] == 1 and stage_cache_key("sft", recipe, [], []) == key(None)

    def slurm(per_node):
        job = SlurmJob(nodes=2, gpus_per_node=0, processes_per_node=per_node, cpus_per_task=1)
        return slurm_launcher(job, "sft", "r")

    # the sbatch script passes --num_processes nodes x per node over the file's, and ZeRO-3 when the round names none
    assert launch_key(None, slurm(1)) == {"accelerate_config": content_hash(DEFAULT_ACCELERATE_CONFIG), "world_size": 2}
    assert launch_key(str(cpu), slurm(4)) == {"accelerate_config": content_hash(cpu), "world_size": 8}
    assert key(None, slurm(1)) == key(None, slurm(1)) != key(None, slurm(2))
    with pytest.raises(FileNotFoundError, match=r"nope.yaml: no such accelerate config"):
        launch_key(str(tmp_path / "nope.yaml"))


def test_a_stage_is_reused_only_under_the_launch_layout_it_ran_with(tmp_path):
    """Through the flow's stage runner: the same config (even as another file) reuses the result; another world
    size recomputes it, and the attempt it starts carries the new key (so no checkpoint of the old one resumes)."""
    import sys

    from flows.stages import ATTEMPT_KEY_FILE, launch_key, run_stage, stage_cache_key

    recipe = tmp_path / "sft.yaml"
    recipe.write_text("max_steps: 1\n")
    cpu = RECIPES / "accelerate_configs" / "cpu.yaml"
    copy, two = tmp_path / "copy.yaml", tmp_path / "two.yaml"
    copy.write_text(cpu.read_text())
    two.write_text(cpu.read_text().replace("num_processes: 1", "num_processes: 2"))
    launched = []

    def launcher(module, recipe, output_dir, extra_args, accelerate_config):  # a stage that only writes its manifest
        launched.append(accelerate_config)
        manifest = Path(output_dir) / "manifest.json"
        return [sys.executable, "-c", f"import json; json.dump({{'stage': 'sft'}}, open({str(manifest)!r}, 'w'))"]

    runs, out = tmp_path / "runs", tmp_path / "runs" / "sft"

    def run(config):
        return run_stage("sft", "sft.train", recipe, out, accelerate_config=str(config), runs_dir=runs,
                         launcher=launcher, log=lambda *_: None)

    assert not run(cpu).cached
    assert run(copy).cached and launched == [str(cpu)]
    again = run(two)
    assert not again.cached and launched == [str(cpu), str(two)]
    want = stage_cache_key("sft", recipe, [], [], launch_key(str(two)))
    assert again.cache_key == want == (out / ATTEMPT_KEY_FILE).read_text().strip()
    assert not run(cpu).cached  # and back: recomputed again, nothing of the 2-process run passes for it


def _copy_packages(dest: Path) -> None:
    """The project's package folders, .py files only (what the code version reads), under ``dest``."""
    from rlhf.registry import PROJECT_PACKAGES

    def not_code(folder: str, names: list[str]) -> list[str]:
        return [n for n in names if n == "__pycache__" or (Path(folder, n).is_file() and not n.endswith(".py"))]

    for pkg in PROJECT_PACKAGES:
        shutil.copytree(ROOT / pkg, dest / pkg, ignore=not_code)


def test_a_code_change_recomputes_only_the_stages_that_run_that_code(tmp_path):
    """For every stage, in both directions: a change in a module the stage imports (directly, transitively or
    inside a function) changes its code version, a change in any other module does not. Run on a copy of the
    source; each change is a comment, which leaves the code sets as they are."""
    from rlhf.lineage import code_packages, code_version, project_modules, stage_code_modules
    from rlhf.registry import STAGES

    _copy_packages(tmp_path)
    sets = {name: set(stage_code_modules(name, tmp_path)) for name in STAGES}
    assert sets == {name: set(stage_code_modules(name)) for name in STAGES}  # the copy reads as the tree does

    def keys() -> dict[str, str]:
        return {name: code_version(sets[name], tmp_path) for name in STAGES}

    files = project_modules(tmp_path)
    # each stage's entry and config modules, every judging module (the judge backends among them), the modules
    # that moved between layers, and code no stage runs (the flows, the flywheel)
    probes = sorted({
        *(s.module for s in STAGES.values()), *(c.split(":")[0] for s in STAGES.values() for c in s.configs),
        *(m for m in files if m.startswith("judging.")), "data.labels", "data.fingerprint", "data.validation",
        "rlhf.lineage", "rlhf.entrypoint", "rlhf.registry", "flows.stages", "flows.round", "flywheel.store",
    })  # fmt: skip
    before = keys()
    for module in probes:
        original = files[module].read_bytes()
        files[module].write_bytes(original + b"\n# changed\n")
        changed = {name for name, key in keys().items() if key != before[name]}
        files[module].write_bytes(original)
        assert changed == {name for name in STAGES if module in sets[name]}, module
    for name in STAGES:  # both directions were exercised for every stage
        assert any(m in sets[name] for m in probes) and any(m not in sets[name] for m in probes), name
    # a judge backend is code the gate stage runs (judging.factory builds it), and GRPO / RLOO (their judge reward
    # and gold judge); the reward model judges its held-out pairs through the judge interface and its own
    # RewardModelJudge, and PPO never builds a judge backend
    assert [n for n in STAGES if "judging.openai_judge" in sets[n]] == ["grpo", "rloo", "gates"]
    assert "judging" not in code_packages("sft") and "judging" not in code_packages("dpo")
    assert code_packages("sft") == ("data", "rlhf", "sft")


def test_the_stage_cache_key_follows_the_stage_code_version(tmp_path, monkeypatch):
    import flows.stages
    from rlhf.lineage import stage_code_modules

    seen = []
    monkeypatch.setattr(flows.stages, "code_version", lambda modules: seen.append(tuple(modules)) or "v1")
    recipe = tmp_path / "sft.yaml"
    recipe.write_text("beta: 0.1\n")
    key = flows.stages.stage_cache_key("sft", recipe, [], [])
    assert seen == [stage_code_modules("sft")]
    monkeypatch.setattr(flows.stages, "code_version", lambda modules: "v2")
    assert flows.stages.stage_cache_key("sft", recipe, [], []) != key


def _write_tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        f = root / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)


def test_code_dependencies_follow_real_imports_transitively(tmp_path):
    """stage_a.train -> stage_a.helpers, and shared_b.util (a lazy import inside a function) -> shared_c.core;
    the modules beside them and unrelated_d are imported by nobody."""
    from rlhf.lineage import Import, code_modules, code_version, module_imports, project_modules

    _write_tree(tmp_path, {
        "stage_a/__init__.py": "",
        "stage_a/train.py": "import os\nfrom . import helpers\n\ndef main():\n    from shared_b.util import f\n",
        "stage_a/helpers.py": "import numpy\nfrom stage_a import train\n",  # a circle is followed once
        "stage_a/unused.py": "import unrelated_d\n",  # in the stage's package, but its entry never imports it
        "shared_b/__init__.py": "",
        "shared_b/util.py": "import shared_c.core as core\n\ndef f():\n    return core.X\n",
        "shared_b/other.py": "Z = 0\n",
        "shared_c/core.py": "X = 1\n",  # a namespace package (no __init__.py) still counts
        "unrelated_d/__init__.py": "Y = 2\n",
        "tests/test_x.py": "import stage_a\n",  # not a package of the product
    })  # fmt: skip
    packages = ("shared_b", "shared_c", "stage_a", "unrelated_d")
    modules = project_modules(tmp_path, packages)
    assert "tests.test_x" not in modules and "shared_c" not in modules  # no file of its own
    assert module_imports("stage_a.train", modules["stage_a.train"], modules) == [
        Import(2, "stage_a.helpers", False),  # os is not the project's; stage_a itself is already imported
        Import(5, "shared_b", True),
        Import(5, "shared_b.util", True),
    ]

    def deps() -> tuple[str, ...]:
        return code_modules(["stage_a.train"], tmp_path, packages)

    assert deps() == ("shared_b", "shared_b.util", "shared_c.core", "stage_a", "stage_a.helpers", "stage_a.train")
    before = code_version(deps(), tmp_path, packages)
    for unrelated in ("unrelated_d/__init__.py", "shared_b/other.py", "stage_a/unused.py", "tests/test_x.py"):
        (tmp_path / unrelated).write_text("CHANGED = 1\n")
        assert code_version(deps(), tmp_path, packages) == before, unrelated  # reused
    (tmp_path / "shared_c" / "core.py").write_text("X = 2\n")  # two imports away
    assert code_version(deps(), tmp_path, packages) != before  # recomputed
    with pytest.raises(ValueError, match="'stage_z.train' is not a module"):
        code_modules(["stage_z.train"], tmp_path, packages)


@pytest.mark.parametrize("name", ["sft", "dpo", "reward_model", "ppo", "gates"])
def test_each_stage_code_set_covers_what_importing_it_loads(name):
    """The static code set against Python itself: every project module that importing the stage's entry and config
    modules loads is in the stage's code set (imports inside functions come on top of these). A stage whose code
    set missed a module it runs would reuse a result computed by older code."""
    import json
    import subprocess
    import sys

    from rlhf.lineage import project_modules, stage_code_modules
    from rlhf.registry import STAGES

    entry = STAGES[name]
    imports = "; ".join(f"import {m}" for m in (entry.module, *(c.split(":")[0] for c in entry.configs)))
    code = f"import json, sys; {imports}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    loaded = set(json.loads(out.splitlines()[-1])) & set(project_modules())
    code_set = set(stage_code_modules(name))
    assert entry.module in loaded and loaded <= code_set, sorted(loaded - code_set)


def test_code_versions_are_read_from_an_installed_copy(tmp_path):
    """A wheel install has no checkout: the packages sit in site-packages among others. The code versions come from
    the installed files, read only inside the project's own package folders."""
    import json
    import os
    import subprocess
    import sys

    from rlhf.lineage import code_version, stage_code_modules
    from rlhf.registry import STAGES

    site = tmp_path / "site-packages"
    _copy_packages(site)
    _write_tree(site, {"other_pkg/__init__.py": "import rlhf\n", "other_pkg/big.py": "X = 1\n"})
    code = ("import json; from rlhf.lineage import ROOT, code_version, stage_code_modules; from rlhf.registry import "
            "STAGES; print(json.dumps([str(ROOT), {n: code_version(stage_code_modules(n)) for n in STAGES}]))")
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         check=True).stdout
    root, versions = json.loads(out.splitlines()[-1])
    assert Path(root) == site
    assert versions == {n: code_version(stage_code_modules(n)) for n in STAGES}  # same files, same versions


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


def test_a_renamed_key_is_an_error_naming_its_new_name(tmp_path):
    """The prompt-length limit has one name, TRL's (``max_prompt_length``); the old one is refused, never accepted
    beside it, in a recipe, on a stage's command line and in the round's overrides."""
    from flows.stages import check_stage_config
    from gates.config import GateStageConfig
    from rlhf.config import parse_stage_config

    good = RECIPES / "smoke" / "gates.yaml"
    old = tmp_path / "gates.yaml"
    old.write_text(good.read_text() + "max_prompt_tokens: 256\n")
    (args,) = parse_stage_config((GateStageConfig,), ["--config", str(good), "--output_dir", str(tmp_path / "o"),
                                                      "--max_prompt_length", "256"])
    assert args.max_prompt_length == 256
    with pytest.raises(ValueError, match=rf"^{re.escape(str(old))}: max_prompt_tokens was renamed max_prompt_length$"):
        parse_stage_config((GateStageConfig,), ["--config", str(old), "--output_dir", str(tmp_path / "o")])
    with pytest.raises(ValueError, match=r"^command line: max_prompt_tokens was renamed max_prompt_length$"):
        parse_stage_config((GateStageConfig,), ["--config", str(good), "--max_prompt_tokens", "9"])
    with pytest.raises(ValueError, match=r"^gates \(.*gates.yaml\): max_prompt_tokens was renamed max_prompt_length$"):
        check_stage_config("gates", old, [])
    with pytest.raises(ValueError, match=r"^gates overrides: max_prompt_tokens was renamed max_prompt_length$"):
        check_stage_config("gates", good, ["--max_prompt_tokens", "9"])


def test_recipes_are_named_after_their_stage(tmp_path):
    """One name per stage: registry key = package = output folder = recipe file stem = CLI command."""
    from typer.main import get_command

    from flows.cli import app
    from flows.round import RoundParameters, _recipe
    from rlhf.registry import STAGES

    commands = set(get_command(app).commands)
    for name, entry in STAGES.items():
        assert entry.package == name and entry.module.split(".")[0] == name
        assert name in commands
        for preset in ("smoke", "demo", "8b/full", "8b/lora"):
            recipe = _recipe(RoundParameters(preset=preset), name)
            assert recipe == RECIPES / preset / f"{name}.yaml" and recipe.is_file()
    assert (RECIPES / "demo" / "reward_model.yaml").is_file() and not (RECIPES / "demo" / "reward.yaml").exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "reward.yaml").write_text((RECIPES / "demo" / "reward_model.yaml").read_text())
    with pytest.raises(FileNotFoundError, match=r"mine/reward.yaml: rename it reward_model.yaml"):
        _recipe(RoundParameters(preset=str(mine)), "reward_model")


def test_a_folder_without_recipes_does_not_hide_the_built_in_preset(tmp_path, monkeypatch):
    """``--preset demo`` run where the current directory has a folder ``demo`` (runs, notes): the built-in recipes;
    a folder ``demo`` that holds recipes is the user's own."""
    from flows.round import RoundParameters, _recipe

    monkeypatch.chdir(tmp_path)
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "notes.txt").write_text("not a recipe")
    (tmp_path / "demo" / ".pre-commit-config.yaml").write_text("repos: []")  # a YAML file, not a stage's recipe
    assert _recipe(RoundParameters(preset="demo"), "sft") == RECIPES / "demo" / "sft.yaml"
    (tmp_path / "demo" / "sft.yaml").write_text((RECIPES / "demo" / "sft.yaml").read_text())
    assert _recipe(RoundParameters(preset="demo"), "sft").resolve() == tmp_path / "demo" / "sft.yaml"
    (tmp_path / "mine").mkdir()  # no built-in preset of that name: the folder, and its missing recipe is named
    assert _recipe(RoundParameters(preset="mine"), "sft") == Path("mine") / "sft.yaml"
