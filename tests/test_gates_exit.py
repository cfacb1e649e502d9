"""Exit codes of the documented gate launch forms on a blocked release (CI must fail on a block; accelerate
launch turns a child's exit code into 1: accelerate #4277 / PR #4305).

Smallest blocked setup: the tiny model is baseline and candidate, the judge is the tiny model with a (saved, untrained)
score head and no measured agreement with humans, so the judge-agreement gate is inconclusive and the release
blocks; 2 items per suite, 2 new tokens.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--n_winrate", "2", "--n_safe", "2", "--n_redteam", "2", "--n_capability", "2", "--n_sycophancy", "2",
         "--capability_min_parsed", "1", "--intent_min_items", "1", "--max_new_tokens", "2",
         "--mc_max_new_tokens", "2", "--max_prompt_length", "96", "--report_to", "none",
         "--allow_same_model", "true"]  # baseline and candidate are the tiny model on purpose (refused unless allowed)


@pytest.fixture(scope="module")
def judge_dir(tiny_model_dir, tmp_path_factory) -> str:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    out = tmp_path_factory.mktemp("judge")
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(out)
    return str(out)


def _verdict(out: Path) -> str:
    return json.loads((out / "manifest.json").read_text())["outputs"]["verdict"]


def test_rlhf_gates_exits_3_and_accelerate_launch_exits_1_on_a_block(tiny_model_dir, judge_dir, tmp_path):
    recipe = str(ROOT / "recipes" / "smoke" / "gates.yaml")
    # the CI command
    cli = subprocess.run(
        [sys.executable, "-m", "flows.cli", "gates", "--candidate", tiny_model_dir, "--baseline", tiny_model_dir,
         "--reward-model", judge_dir, "--config", recipe, "--output-dir", str(tmp_path / "cli"), *SMALL],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
    )
    assert _verdict(tmp_path / "cli") == "block", cli.stderr[-3000:]
    assert cli.returncode == 3, cli.stderr[-3000:]
    # over-long prompts are counted per suite in the manifest and the report (budget 96 tokens here)
    from transformers import AutoTokenizer

    from rlhf.generation import chat_prompt

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    rows = [json.loads(line) for line in (tmp_path / "cli" / "generations.jsonl").read_text().splitlines()]
    counts = json.loads((tmp_path / "cli" / "manifest.json").read_text())["outputs"]["prompts_truncated"]
    for suite in ("winrate", "safe", "redteam", "capability", "sycophancy"):
        long = sum(len(tok(chat_prompt(tok, r["prompt"]), add_special_tokens=False)["input_ids"]) > 96
                   for r in rows if r["suite"] == suite)
        assert counts[suite] == {"n": 2, "baseline": long, "candidate": long}, (suite, counts)
    assert counts["capability"]["candidate"] == 2  # TruthfulQA questions with their options: all over 96 tokens
    report = json.loads((tmp_path / "cli" / "report.json").read_text())
    assert report["metadata"]["prompts_truncated"] == counts
    # the accelerate form, exactly as the module docstring and the README describe it: a block becomes 1
    launch = subprocess.run(
        [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1",
         "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "gates.evaluate", "--config", recipe,
         "--candidate_dir", tiny_model_dir, "--baseline_dir", tiny_model_dir, "--reward_model_dir", judge_dir,
         "--output_dir", str(tmp_path / "acc"), *SMALL],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
    )
    assert _verdict(tmp_path / "acc") == "block", launch.stderr[-3000:]
    assert launch.returncode == 1, launch.stderr[-3000:]
    assert "returned non-zero exit status 3" in launch.stderr  # the child did exit 3; accelerate made it 1
