"""ppo.train: strict config parsing and an end-to-end run on tiny models saved to tmp_path."""

import hashlib
import json

import pytest
import torch
from safetensors.torch import load_file

from ppo.config import PPOConfig
from ppo.tiny import save_tiny_models
from ppo.train import load_prompts, main, parse_args


def dir_hash(path):
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


@pytest.fixture
def setup(tmp_path):
    paths = save_tiny_models(tmp_path / "models")
    prompts = tmp_path / "prompts.jsonl"
    with prompts.open("w") as f:
        for i in range(4):
            f.write(json.dumps({"prompt": [{"role": "user", "content": f"hello {i}"}]}) + "\n")
            f.write(json.dumps({"prompt": f"raw {i}"}) + "\n")
    config = tmp_path / "ppo.yaml"
    config.write_text(
        f"policy_path: {paths['policy']}\n"
        f"ref_path: {paths['ref']}\n"
        f"reward_model_path: {paths['reward']}\n"
        f"prompts_path: {prompts}\n"
        f"output_dir: {tmp_path / 'out'}\n"
        "num_steps: 2\nbatch_size: 4\nmini_batch_size: 2\nmicro_batch_size: 2\nppo_epochs: 1\n"
        "max_new_tokens: 6\nlearning_rate: 1.0e-3\nmissing_eos_penalty: 1.0\n"
    )
    return {"paths": paths, "prompts": prompts, "config": config, "out": tmp_path / "out"}


def test_main_end_to_end_writes_checkpoint_and_manifest(setup):
    out = setup["out"]
    ref_hash = dir_hash(setup["paths"]["ref"])
    (out / "checkpoint").mkdir(parents=True)
    (out / "checkpoint" / "stale.txt").write_text("from an earlier run")

    manifest = main(["--config", str(setup["config"])])

    checkpoint = out / "checkpoint"
    assert not (checkpoint / "stale.txt").exists(), "the old checkpoint is replaced as a whole"
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == [], "no temp dir left behind"
    weights = load_file(str(checkpoint / "model.safetensors"))
    assert weights and all(t.numel() > 0 for t in weights.values())
    initial = load_file(str(setup["paths"]["policy"] / "model.safetensors"))
    assert any(not torch.equal(weights[k], initial[k]) for k in initial), "the policy was trained"
    assert (checkpoint / "tokenizer.json").exists()
    assert dir_hash(setup["paths"]["ref"]) == ref_hash

    on_disk = json.loads((out / "manifest.json").read_text())
    assert on_disk["stage"] == "ppo" and on_disk["num_steps"] == 2
    assert on_disk["checkpoint"] == str(checkpoint.resolve())
    assert on_disk["frozen_models"]["ref_unchanged"] is True
    assert on_disk["paths"]["value_model_init"] == on_disk["paths"]["reward_model"]
    assert len(on_disk["metrics"]["history"]) == 2
    assert on_disk["metrics"]["final"]["objective/kl_k3"] >= 0
    assert on_disk["config"]["max_new_tokens"] == 6
    assert len(on_disk["inputs"]["prompts_sha256"]) == 64
    assert manifest["checkpoint"] == on_disk["checkpoint"]


def test_cli_overrides_yaml_and_unknown_keys_are_errors(setup, tmp_path):
    script_args, config = parse_args(["--config", str(setup["config"]), "--kl_coef", "0.2", "--report_to", "wandb"])
    assert isinstance(config, PPOConfig) and config.kl_coef == 0.2 and config.num_steps == 2
    assert config.report_to == ["wandb"] and config.learning_rate == 1e-3
    assert script_args.value_model_path is None

    bad = tmp_path / "bad.yaml"
    bad.write_text(setup["config"].read_text() + "kl_coeff: 0.1\n")  # typo
    with pytest.raises(ValueError, match="kl_coeff"):
        parse_args(["--config", str(bad)])
    with pytest.raises(ValueError, match="no_such_key"):
        parse_args(["--config", str(setup["config"]), "--no_such_key", "1"])


def test_config_validation():
    with pytest.raises(ValueError, match="mini_batch_size"):
        PPOConfig(batch_size=6, mini_batch_size=4)
    with pytest.raises(ValueError, match="missing_eos_penalty"):
        PPOConfig(missing_eos_penalty=-1.0)
    with pytest.raises(ValueError, match="report_to"):
        PPOConfig(report_to=["tensorboard"])


def test_load_prompts_names_file_and_line(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "a"}\n{"text": "b"}\n')
    with pytest.raises(ValueError, match=r"p.jsonl:2: .*'prompt'"):
        load_prompts(f)
    f.write_text('{"prompt": "a"}\n{"prompt": 3}\n')
    with pytest.raises(ValueError, match=r"p.jsonl:2"):
        load_prompts(f)


def test_reward_model_without_a_score_head_is_refused(setup):
    # a causal LM directory given as the reward model would load with a randomly initialised score head
    argv = ["--config", str(setup["config"]), "--reward_model_path", str(setup["paths"]["policy"])]
    with pytest.raises(ValueError, match="missing from the checkpoint"):
        main(argv)
