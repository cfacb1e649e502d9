"""Multi-process launches on CPU (torchrun, gloo), real processes, the tiny model.

- The world-size contract: ``RLHF_EXPECTED_WORLD_SIZE`` differing from the launch fails loudly, naming both sizes and
  the launcher variables; ``RLHF_COLLECTIVE_TIMEOUT_S`` reaches the process group.
- The gate stage on 2 processes (prompts and reward-model scoring sharded, rank 0 gathers, judges, writes) gives a
  byte-identical ``generations.jsonl`` and the same report numbers as on 1 process.
- SFT and DPO on 2 processes (DDP, per-device batch halved: the same global batch) end at the 1-process losses and
  weights within the stated tolerance; the loss curves are printed (``pytest -s`` shows them).
- In SFT, DPO and the reward model on 2 processes, rank 0 alone writes the checkpoint and the manifest (what each
  process writes is recorded by tests/rank_writes.py).
- ``engine: vllm`` where vllm cannot run is a clear error before anything is generated.

Each launch is a real ``python -m torch.distributed.run --nproc_per_node N`` of the stage module from this tree.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "recipes" / "smoke"

# Tolerances (stated): 2-process DDP sums gradients in another order than one process, so the runs differ by float32
# rounding, which Adam's normalised update magnifies where a gradient is near zero. Measured on SFT (2 steps, lr 1e-3):
# losses 5e-7 apart, weights 1.3e-5 apart = 0.9% of the largest weight update (1.5e-3). These bounds are fp32's, so
# the runs are pinned to fp32 (``--precision fp32``): under bf16 autocast, which ``auto`` picks on a CPU with native
# bf16, the two reduction orders round differently at bf16's 8 mantissa bits and the weights drift past the bound.
LOSS_TOL = 1e-4
WEIGHT_SHARE = 0.05


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RLHF_EXPECTED_WORLD_SIZE", "RLHF_COLLECTIVE_TIMEOUT_S")}
    env.update(WANDB_MODE="disabled", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", **extra)
    return env


def launch(module: str, args: list[str], nproc: int, log: Path, **env) -> int:
    """Run ``module`` on ``nproc`` processes (torchrun; one process: plain ``python -m``), output to ``log``.

    On several processes each one records what it writes under ``--output_dir`` (tests/rank_writes.py), read back
    with :func:`written`."""
    cmd = [sys.executable, "-m", module, *args]
    if nproc > 1:
        target = ["-m", module]
        if "--output_dir" in args:
            target = [str(ROOT / "tests" / "rank_writes.py"), module]
            env.update(RLHF_TEST_WATCH_DIR=args[args.index("--output_dir") + 1], RLHF_TEST_WRITES=f"{log}.rank")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
               "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), *target, *args]
    with open(log, "w") as f:
        return subprocess.run(cmd, check=False, cwd=ROOT, env=_env(**env), stdout=f, stderr=subprocess.STDOUT,
                              timeout=600).returncode


def written(log: Path, rank: int) -> set[str]:
    """What process ``rank`` of a :func:`launch` logged to ``log`` wrote under its output folder (relative paths)."""
    return set(Path(f"{log}.rank{rank}.txt").read_text().splitlines())


#: a stage's own outputs (with their temporary siblings: ``.checkpoint.<random>``, ``.manifest.json.<random>.tmp``)
FINAL_OUTPUTS = ("checkpoint", "pi_ref", "manifest.json", "agreement_scores.jsonl")


def final_outputs(paths: set[str]) -> set[str]:
    """The stage outputs among ``paths`` (the first part of each path, a temporary sibling named by its target)."""
    found = set()
    for p in paths:
        top = Path(p).parts[0] if Path(p).parts else ""  # "": the output folder itself
        found |= {o for o in FINAL_OUTPUTS if top == o or top.startswith(f".{o}.")}
    return found


def assert_rank_0_alone_writes(log: Path, outputs: set[str]) -> None:
    """Rank 0 wrote the stage's ``outputs``; rank 1 wrote none of the stage's outputs (at most its share of the
    Trainer's resume state)."""
    rank0, rank1 = written(log, 0), written(log, 1)
    print(f"\nrank 1 wrote under the output folder: {sorted(rank1)}")
    assert final_outputs(rank0) == outputs, sorted(rank0)
    assert final_outputs(rank1) == set(), sorted(rank1)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- the contract (no launch needed)

def test_world_size_check_names_expected_actual_and_launcher_variables():
    from rlhf.distributed import WorldSizeMismatch, check_world_size, collective_timeout_s

    assert check_world_size({"WORLD_SIZE": "4", "RLHF_EXPECTED_WORLD_SIZE": "4"}) == 4
    assert check_world_size({}) == 1  # nothing expected, nothing launched
    with pytest.raises(WorldSizeMismatch, match=r"expected world size 8 \(RLHF_EXPECTED_WORLD_SIZE\) but this launch "
                       r"has 1 process \(started without a launcher.*seen: SLURM_NTASKS=8, SLURM_NNODES=1$"):
        check_world_size({"RLHF_EXPECTED_WORLD_SIZE": "8", "SLURM_NTASKS": "8", "SLURM_NNODES": "1"})
    with pytest.raises(WorldSizeMismatch, match="seen: none of WORLD_SIZE, SLURM_NTASKS"):
        check_world_size({"RLHF_EXPECTED_WORLD_SIZE": "2"})
    with pytest.raises(ValueError, match="RLHF_EXPECTED_WORLD_SIZE='two' is not an integer"):
        check_world_size({"RLHF_EXPECTED_WORLD_SIZE": "two"})
    assert collective_timeout_s(env={}) == 1800 and collective_timeout_s(60, env={}) == 60
    assert collective_timeout_s(60, env={"RLHF_COLLECTIVE_TIMEOUT_S": "7.5"}) == 7.5  # the variable wins
    for bad in ("0", "0.5", "-3", "nan", "inf"):  # ddp_timeout is whole seconds: 0.5 would become 0 (no timeout)
        with pytest.raises(ValueError, match=r"RLHF_COLLECTIVE_TIMEOUT_S or config"):
            collective_timeout_s(env={"RLHF_COLLECTIVE_TIMEOUT_S": bad})


def test_stage_config_takes_the_collective_timeout_before_the_process_group_exists(monkeypatch):
    from trl import TrlParser

    from sft.config import SFTStageConfig

    monkeypatch.setenv("RLHF_COLLECTIVE_TIMEOUT_S", "77")
    (args,) = TrlParser((SFTStageConfig,)).parse_args_and_config(["--output_dir", "/tmp/x", "--report_to", "none"])
    assert args.ddp_timeout == 77
    monkeypatch.setenv("RLHF_COLLECTIVE_TIMEOUT_S", "7.5")  # whole seconds, rounded up, never down to 0
    (args,) = TrlParser((SFTStageConfig,)).parse_args_and_config(["--output_dir", "/tmp/x", "--report_to", "none"])
    assert args.ddp_timeout == 8


def test_vllm_engine_where_it_cannot_run_is_a_clear_error(tmp_path, tiny_model_dir):
    """vllm is not installed here and there is no GPU: the vLLM path itself is NOT run by any test."""
    from gates.evaluate import main
    from rlhf.vllm_engine import EngineUnavailable, check_engine

    with pytest.raises(EngineUnavailable, match=r"engine: vllm was requested but cannot run here: the vllm package "
                       r"is not installed \(pip install vllm\); no CUDA GPU is visible"):
        check_engine("vllm")
    with pytest.raises(ValueError, match="engine must be one of transformers, vllm, got 'sglang'"):
        check_engine("sglang")
    check_engine("transformers")
    out = tmp_path / "g"
    with pytest.raises(EngineUnavailable, match="engine: vllm was requested"):
        main(["--config", str(SMOKE / "gates.yaml"), "--output_dir", str(out), "--baseline_dir", tiny_model_dir,
              "--candidate_dir", tiny_model_dir, "--allow_same_model", "true", "--report_to", "none",
              "--engine", "vllm"])
    assert not (out / "generations.jsonl").exists()


# ---------------------------------------------------------------- real 2-process launches

def test_expected_world_size_differing_from_the_launch_fails_loudly(tmp_path):
    """torchrun starts 2 processes, the launch asked for 3: the stage stops before training, naming both."""
    log = tmp_path / "log.txt"
    rc = launch("sft.train", ["--config", str(SMOKE / "sft.yaml"), "--output_dir", str(tmp_path / "sft"),
                              "--report_to", "none"], 2, log, RLHF_EXPECTED_WORLD_SIZE="3")
    text = log.read_text()
    assert rc != 0
    assert ("WorldSizeMismatch: expected world size 3 (RLHF_EXPECTED_WORLD_SIZE) but this launch has 2 processes; "
            "launcher variables seen: WORLD_SIZE=2, LOCAL_WORLD_SIZE=2") in text
    assert "'loss'" not in text and not (tmp_path / "sft" / "manifest.json").exists()  # nothing trained


@pytest.fixture(scope="module")
def gate_models(tmp_path_factory, tiny_model_dir):
    """Baseline and candidate: the tiny model with seeded noise added (seeds 1, 2), so answers and scores differ;
    judge: a reward-model stage dir around a seeded tiny sequence classifier (with held-out scores for agreement)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    root = tmp_path_factory.mktemp("dist_gate_models")
    torch.manual_seed(3)
    ckpt = root / "rm" / "checkpoint"
    AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1).save_pretrained(ckpt)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(ckpt)
    scores = root / "rm" / "agreement_scores.jsonl"
    scores.write_text("".join(json.dumps({"id": f"p{i}", "score_first": 1.0, "score_second": 0.0,
                                          "labels": [1, 1, 2]}) + "\n" for i in range(60)))
    (root / "rm" / "manifest.json").write_text(json.dumps(
        {"stage": "reward_model", "outputs": {"checkpoint": str(ckpt), "agreement_scores": str(scores)}}))
    policies = {}
    for who, seed in (("baseline", 1), ("candidate", 2)):  # noisy copies of the tiny model: prompt-dependent text
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        model.save_pretrained(root / who)
        AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(root / who)
        policies[who] = str(root / who)
    return {**policies, "judge": str(root / "rm")}


def _report_numbers(out: Path) -> dict:
    """Every gate's verdict and metrics from the manifest (timings and thread counts left out)."""
    m = json.loads((out / "manifest.json").read_text())
    return {"verdict": m["outputs"]["verdict"], "gate_table": m["outputs"]["gate_table"],
            "gates": {k: v for k, v in m["metrics"].items() if k not in ("threads", "efficiency")}}


def test_gate_stage_on_two_processes_matches_one(tmp_path, gate_models):
    args = ["--config", str(SMOKE / "gates.yaml"), "--baseline_dir", gate_models["baseline"],
            "--candidate_dir", gate_models["candidate"], "--reward_model_dir", gate_models["judge"],
            "--report_to", "none", "--fail_on_block", "false", "--round_id", "dist",
            # 7 items a suite: odd, so the two shares differ in size (4 + 3 after the length sort)
            "--n_winrate", "7", "--n_safe", "7", "--n_redteam", "7", "--n_capability", "7", "--n_sycophancy", "7"]
    one, two = tmp_path / "one", tmp_path / "two"
    assert launch("gates.evaluate", [*args, "--output_dir", str(one)], 1, tmp_path / "one.log") == 0
    rc = launch("gates.evaluate", [*args, "--output_dir", str(two)], 2, tmp_path / "two.log",
                RLHF_EXPECTED_WORLD_SIZE="2", RLHF_COLLECTIVE_TIMEOUT_S="300")
    log = (tmp_path / "two.log").read_text()
    assert rc == 0, log[-3000:]
    # the launch really had 2 processes, with the timeout in its process group
    for rank in (0, 1):
        assert f"launch: 2 processes (rank {rank}), collective timeout 300 s (process group: 300 s)" in log

    gen1, gen2 = (one / "generations.jsonl").read_bytes(), (two / "generations.jsonl").read_bytes()
    rows = [json.loads(line) for line in gen1.splitlines()]
    # 6 suites of 7, and the smoke recipe's consistency probes: depths 2 and 5 x 4 conversations x 2 positions
    assert gen1 == gen2 and sum(r["suite"] != "consistency" for r in rows) == 6 * 7
    assert sum(r["suite"] == "consistency" for r in rows) == 16
    assert sum(r["baseline"] != r["candidate"] for r in rows) > 0  # two different models really answered
    # the reward model's scores, sharded and gathered in order: the same per pair (float32 rounding at most)
    j1 = [json.loads(line) for line in (one / "judgments.jsonl").read_text().splitlines()]
    j2 = [json.loads(line) for line in (two / "judgments.jsonl").read_text().splitlines()]
    assert [r["id"] for r in j1] == [r["id"] for r in j2] and len(j1) == 7
    assert [r["preference"] for r in j1] == [r["preference"] for r in j2]
    for a, b in zip(j1, j2):
        assert b["raw"]["score_a"] == pytest.approx(a["raw"]["score_a"], abs=1e-6)
        assert b["raw"]["score_b"] == pytest.approx(a["raw"]["score_b"], abs=1e-6)
    assert len({r["raw"]["score_a"] for r in j1} | {r["raw"]["score_b"] for r in j1}) > 2  # scores really vary
    assert _report_numbers(one) == _report_numbers(two)
    assert json.loads((two / "manifest.json").read_text())["metrics"]["efficiency"]["processes"] == 2
    # one writer: the same files as the one-process run, nothing else
    assert sorted(p.name for p in two.iterdir()) == sorted(p.name for p in one.iterdir())


def _weights(ckpt: Path) -> dict:
    from safetensors.torch import load_file

    out = {}
    for f in sorted(ckpt.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def _compare_training(stage: str, one: Path, two: Path, start: Path) -> None:
    """Losses within LOSS_TOL; weights within WEIGHT_SHARE of the largest weight update of the run (``start``: the
    weights both began from). A wrong global batch (each rank stepping alone, or on the same rows) moves the weights
    apart by about a whole update, 20x the bound."""
    m1 = json.loads((one / "manifest.json").read_text())["metrics"]
    m2 = json.loads((two / "manifest.json").read_text())["metrics"]
    print(f"\n{stage} loss curve, 1 process : {m1['loss_curve']}")
    print(f"{stage} loss curve, 2 processes: {m2['loss_curve']}")
    assert (m1["processes"], m2["processes"]) == (1, 2)
    assert m1["train_steps"] == m2["train_steps"] == 2
    assert len(m1["loss_curve"]) == len(m2["loss_curve"]) == 2
    for a, b in zip(m1["loss_curve"], m2["loss_curve"]):
        assert abs(a - b) <= LOSS_TOL, (a, b)
    assert abs(m1["train_loss"] - m2["train_loss"]) <= LOSS_TOL
    w0, w1, w2 = _weights(start), _weights(one / "checkpoint"), _weights(two / "checkpoint")
    assert w1.keys() == w2.keys() and w1
    diff = max(float((w1[k].float() - w2[k].float()).abs().max()) for k in w1)
    moved = max(float((w1[k].float() - w0[k].float()).abs().max()) for k in w1 if k in w0)
    print(f"{stage} max |weight difference| 1 vs 2 processes: {diff:.2e}; largest weight update: {moved:.2e} "
          f"(bound {WEIGHT_SHARE:.0%} of it)")
    assert moved > 1e-4  # the runs trained
    assert diff <= WEIGHT_SHARE * moved


def _train(stage: str, extra: list[str], out: Path, n: int) -> None:
    """One run of ``stage`` on ``n`` processes, global batch 2 (the smoke recipes' per-device batch is 2)."""
    log = out.with_suffix(".log")
    rc = launch(f"{stage}.train", ["--config", str(SMOKE / f"{stage}.yaml"), "--output_dir", str(out),
                                   "--report_to", "none", "--per_device_train_batch_size", str(2 // n),
                                   "--precision", "fp32", *extra],
                n, log, RLHF_EXPECTED_WORLD_SIZE=str(n))
    assert rc == 0, log.read_text()[-3000:]


@pytest.fixture(scope="module")
def sft_runs(tmp_path_factory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("dist_sft")
    for n in (1, 2):
        _train("sft", [], root / f"sft{n}", n)
    return {n: root / f"sft{n}" for n in (1, 2)}


def test_sft_on_two_processes_matches_one(sft_runs, tiny_model_dir):
    """Same global batch: 1 process x 2 rows vs 2 processes x 1 row (DDP over gloo)."""
    _compare_training("SFT", sft_runs[1], sft_runs[2], Path(tiny_model_dir))


def test_dpo_on_two_processes_matches_one(tmp_path, sft_runs):
    """Both from the 1-process SFT's pi_ref; 1 process x 2 pairs vs 2 processes x 1 pair."""
    for n in (1, 2):
        _train("dpo", ["--sft_dir", str(sft_runs[1])], tmp_path / f"dpo{n}", n)
    pi_ref = json.loads((sft_runs[1] / "manifest.json").read_text())["outputs"]["pi_ref"]
    _compare_training("DPO", tmp_path / "dpo1", tmp_path / "dpo2", Path(pi_ref))


def test_only_rank_0_writes_the_checkpoint_and_manifest(tmp_path, sft_runs):
    """Every trainer stage on 2 processes: the checkpoint (SFT: and pi_ref; the reward model: and its held-out
    scores) and the manifest come from rank 0 alone. SFT's run is the fixture's; DPO's and the reward model's here."""
    assert_rank_0_alone_writes(sft_runs[2].with_suffix(".log"), {"checkpoint", "pi_ref", "manifest.json"})
    _train("dpo", ["--sft_dir", str(sft_runs[1]), "--max_steps", "1"], tmp_path / "dpo", 2)
    assert_rank_0_alone_writes(tmp_path / "dpo.log", {"checkpoint", "manifest.json"})
    out, log = tmp_path / "rm", tmp_path / "rm.log"
    rc = launch("reward_model.train", ["--config", str(SMOKE / "reward_model.yaml"), "--output_dir", str(out),
                                       "--report_to", "none", "--per_device_train_batch_size", "1", "--max_steps", "1",
                                       "--sft_dir", str(sft_runs[1]), "--max_agreement_pairs", "4"],
                2, log, RLHF_EXPECTED_WORLD_SIZE="2")
    assert rc == 0, log.read_text()[-3000:]
    assert_rank_0_alone_writes(log, {"checkpoint", "manifest.json", "agreement_scores.jsonl"})
    assert json.loads((out / "manifest.json").read_text())["metrics"]["processes"] == 2
