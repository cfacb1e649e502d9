"""A non-editable install runs a round: the wheel carries every file the product reads at run time.

The wheel is built from this checkout (``pip wheel``) and installed into a fresh virtual environment, where the
smoke round runs from an unrelated folder. The environment sees this machine's site-packages (torch, TRL and the
rest are not installed again, which would take minutes and a network), but not this checkout: the editable
install's import hooks are removed in the environment's ``sitecustomize`` (every process it starts, stage processes
included, imports the wheel's copy or nothing), and the test checks that the modules come from the environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Run by the environment's Python at start-up: the editable install's finder and path hook (setuptools names both
# ``__editable__...``) would otherwise resolve any module the wheel lacks from this checkout.
HIDE_CHECKOUT = """\
import sys
sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in type(f).__module__]
sys.path_hooks[:] = [h for h in sys.path_hooks if "__editable__" not in getattr(h, "__module__", "")]
sys.path[:] = [p for p in sys.path if "__editable__" not in p]
sys.path_importer_cache.clear()
"""


@pytest.fixture(scope="module")
def wheel_env(tmp_path_factory):
    base = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(base / "dist"), str(ROOT)], check=True, capture_output=True, timeout=600)
    (wheel,) = (base / "dist").glob("rlhf_flywheel-*.whl")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    (Path(site) / "sitecustomize.py").write_text(HIDE_CHECKOUT)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(wheel)],
                   check=True, capture_output=True, timeout=600)
    elsewhere = base / "elsewhere"
    elsewhere.mkdir()
    return venv, Path(site), elsewhere


def test_the_installed_modules_and_data_files_are_the_wheels(wheel_env):
    venv, site, elsewhere = wheel_env
    probe = ("import json, flows, gates, judging, recipes, data, sft.train;"
             "from flows.round import REPO_ROOT;"
             "print(json.dumps([flows.__file__, sft.train.__file__, list(recipes.__path__), str(REPO_ROOT)]))")
    out = subprocess.run([str(venv / "bin" / "python"), "-c", probe], cwd=elsewhere, check=True,
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""}).stdout
    flows_file, sft_file, recipe_paths, root = json.loads(out.splitlines()[-1])
    assert flows_file.startswith(str(site)) and sft_file.startswith(str(site))
    assert recipe_paths == [str(site / "recipes")] and root == str(site)
    for name in ("recipes/smoke/sft.yaml", "recipes/demo/gates.yaml", "recipes/accelerate_configs/cpu.yaml",
                 "gates/refusal_classifier_lomo.json", "judging/probe_pairs.json",
                 "flows/launch/templates/stage.sbatch.j2", "flows/automations/blocked_round.yaml"):
        assert (site / name).is_file(), f"{name} is not in the wheel"


def test_a_wheel_install_runs_the_smoke_round_from_an_unrelated_folder(wheel_env):
    venv, site, elsewhere = wheel_env
    env = {**os.environ, "PYTHONPATH": "", "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([str(venv / "bin" / "rlhf"), "round", "--preset", "smoke", "--round-id", "from-wheel",
                           "--runs-dir", "runs"], cwd=elsewhere, env=env, capture_output=True, text=True,
                          timeout=1800)
    assert proc.returncode in (0, 3), proc.stderr[-3000:]  # a verdict, pass or block: the round ran to the end
    manifest = json.loads((elsewhere / "runs" / "from-wheel" / "round.json").read_text())
    assert manifest["verdict"] == ("pass" if proc.returncode == 0 else "block")
    assert set(manifest["stages"]) >= {"sft", "dpo", "reward_model", "gates"}
    assert (elsewhere / "runs" / "from-wheel" / "gates" / "report.json").is_file()
    sft_log = (elsewhere / "runs" / "from-wheel" / "sft" / "stage.log").read_text()
    assert str(ROOT) not in sft_log.replace(str(elsewhere), "")  # nothing was read from this checkout
