"""PPO stage entry point: parse, load, build the trainer, train, save, write the manifest.

    accelerate launch -m ppo.train --config recipes/<preset>/ppo.yaml [--key value ...]

Configuration layers: dataclass defaults < YAML (``--config``) < CLI ``--key value``. Keys are the fields of
:class:`ppo.config.PPOScriptArguments` and :class:`ppo.config.PPOConfig`; an unknown key in the YAML or on the
command line is an error (``trl.TrlParser``).

Outputs (main process):
    ``output_dir/checkpoint/``   the trained policy (safetensors) and tokenizer, written to a temp dir and renamed
    ``output_dir/manifest.json`` paths, metrics (final and per step), pi_ref / reward-model fingerprints before and
                                 after, the config, library versions; written atomically too.

Tracking hook: :func:`build_callbacks` turns ``report_to`` into callbacks ``callback(step, metrics)``; W&B is
used only when ``report_to`` includes ``wandb`` (offline unless ``WANDB_MODE`` says otherwise, so it never
blocks without network). The pipeline's own tracking (``rlhf/tracking.py``) can replace that function or pass
extra callbacks to :func:`main`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer
from trl import TrlParser

from ppo.config import PPOConfig, PPOScriptArguments
from ppo.trainer import Callback, PPOTrainer, resolve_mixed_precision

logger = logging.getLogger(__name__)

MANIFEST_NAME = "manifest.json"
CHECKPOINT_NAME = "checkpoint"


def parse_args(argv: Sequence[str] | None = None) -> tuple[PPOScriptArguments, PPOConfig]:
    """Strict parse of ``--config file.yaml`` and ``--key value`` overrides (unknown keys are errors)."""
    parser = TrlParser((PPOScriptArguments, PPOConfig))
    script_args, config = parser.parse_args_and_config(args=list(argv) if argv is not None else None)
    return script_args, config


def load_prompts(path: str | os.PathLike[str]) -> list[Any]:
    """Read a JSONL file of ``{"prompt": str | [messages]}`` rows. Errors name the file, line and reason."""
    path = Path(path)
    rows: list[Any] = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict) or "prompt" not in row:
                raise ValueError(f"{path}:{lineno}: expected an object with a 'prompt' field")
            prompt = row["prompt"]
            if not isinstance(prompt, (str, list)):
                raise ValueError(f"{path}:{lineno}: 'prompt' must be a string or a list of messages")
            rows.append(prompt)
    if not rows:
        raise ValueError(f"{path}: no prompts")
    return rows


def _load(cls: Any, path: str, what: str) -> torch.nn.Module:
    """Load a model in fp32 (autocast handles bf16 where the device has it) and refuse an incomplete one."""
    model, info = cls.from_pretrained(path, dtype=torch.float32, output_loading_info=True)
    missing = list(info.get("missing_keys") or [])
    if missing:
        raise ValueError(f"{what} at {path}: weights missing from the checkpoint (would be random): {missing[:5]}")
    empty = [n for n, p in model.named_parameters() if p.numel() == 0]
    if empty:
        raise ValueError(f"{what} at {path}: empty tensors in the checkpoint: {empty[:5]}")
    return model


def load_models(script_args: PPOScriptArguments) -> dict[str, Any]:
    """Tokenizer (from the policy directory), policy, pi_ref, reward and value models, as separate objects."""
    tokenizer = AutoTokenizer.from_pretrained(script_args.policy_path)
    if tokenizer.pad_token_id is None:
        # padding is masked by position everywhere, so pad == eos is safe here
        tokenizer.pad_token = tokenizer.eos_token
        logger.info("tokenizer has no pad token; using eos %r as pad", tokenizer.eos_token)
    policy = _load(AutoModelForCausalLM, script_args.policy_path, "policy")
    ref = _load(AutoModelForCausalLM, script_args.ref_path, "pi_ref")
    reward = _load(AutoModelForSequenceClassification, script_args.reward_model_path, "reward model")
    value_path = script_args.value_model_path or script_args.reward_model_path
    value = _load(AutoModelForSequenceClassification, value_path, "value model")
    for name, m in (("reward model", reward), ("value model", value)):
        if m.config.num_labels != 1:
            raise ValueError(f"{name}: expected a 1-label sequence classifier, got num_labels={m.config.num_labels}")
    return {"tokenizer": tokenizer, "policy": policy, "ref": ref, "reward": reward, "value": value}


class WandbCallback:
    """Logs each step's metrics to W&B. Offline unless WANDB_MODE is set, so a run never waits on the network."""

    def __init__(self, config: PPOConfig, extra_config: dict[str, Any] | None = None):
        self.config = config
        self.extra_config = extra_config or {}
        self.run = None

    def __call__(self, step: int, metrics: dict[str, float]) -> None:
        import wandb

        if self.run is None:
            self.run = wandb.init(
                project=os.environ.get("WANDB_PROJECT", "rlhf-flywheel"),
                name=self.config.run_name,
                job_type="ppo",
                dir=self.config.output_dir,
                mode=os.environ.get("WANDB_MODE", "offline"),
                config={**asdict(self.config), **self.extra_config},
            )
        self.run.log(metrics, step=step)

    def close(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None


def build_callbacks(config: PPOConfig, script_args: PPOScriptArguments) -> list[Callback]:
    """The tracking hook: one callback per entry of ``report_to``."""
    callbacks: list[Callback] = []
    if "wandb" in config.report_to:
        callbacks.append(WandbCallback(config, {"paths": asdict(script_args)}))
    return callbacks


def sha256_file(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=True, default=str), encoding="utf-8")
    os.replace(tmp, path)


def _versions() -> dict[str, str]:
    import accelerate
    import transformers
    import trl

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
        "accelerate": accelerate.__version__,
    }


def main(argv: Sequence[str] | None = None, callbacks: Sequence[Callback] | None = None) -> dict[str, Any]:
    """Run the PPO stage; returns the manifest (also written to ``output_dir/manifest.json``)."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    script_args, config = parse_args(argv)
    started = time.time()
    accelerator = Accelerator(mixed_precision=resolve_mixed_precision(config.mixed_precision))
    output_dir = Path(config.output_dir)
    if accelerator.is_main_process:
        output_dir.mkdir(parents=True, exist_ok=True)

    prompts = load_prompts(script_args.prompts_path)
    models = load_models(script_args)
    all_callbacks = build_callbacks(config, script_args) + list(callbacks or [])
    trainer = PPOTrainer(
        config=config,
        policy=models["policy"],
        ref_model=models["ref"],
        reward_model=models["reward"],
        value_model=models["value"],
        tokenizer=models["tokenizer"],
        prompts=prompts,
        accelerator=accelerator,
        callbacks=all_callbacks,
    )
    train_started = time.time()
    try:
        history = trainer.train()  # raises if pi_ref or the reward model moved
    finally:
        for cb in all_callbacks:
            close = getattr(cb, "close", None)
            if callable(close):
                close()
    train_seconds = time.time() - train_started
    checkpoint = trainer.save_policy(output_dir / CHECKPOINT_NAME)

    manifest: dict[str, Any] = {
        "stage": "ppo",
        "status": "completed",
        "checkpoint": str(checkpoint.resolve()),
        "paths": {
            "policy": str(Path(script_args.policy_path).resolve()),
            "ref": str(Path(script_args.ref_path).resolve()),
            "reward_model": str(Path(script_args.reward_model_path).resolve()),
            "value_model_init": str(Path(script_args.value_model_path or script_args.reward_model_path).resolve()),
            "prompts": str(Path(script_args.prompts_path).resolve()),
            "output_dir": str(output_dir.resolve()),
        },
        "inputs": {"prompts_sha256": sha256_file(script_args.prompts_path), "num_prompts": len(prompts)},
        "frozen_models": {
            "ref_fingerprint": trainer.ref_fingerprint,
            "ref_unchanged": True,  # verify_frozen() raised otherwise
            "reward_model_fingerprint": trainer.reward_fingerprint,
            "reward_model_unchanged": True,
        },
        "metrics": {"final": history[-1] if history else {}, "history": history},
        "num_steps": len(history),
        "seconds_train": train_seconds,
        "seconds_per_step": train_seconds / max(len(history), 1),
        "seconds_total": time.time() - started,
        "mixed_precision": trainer.mixed_precision,
        "num_processes": accelerator.num_processes,
        "config": asdict(config),
        "versions": _versions(),
    }
    if accelerator.is_main_process:
        write_json_atomic(output_dir / MANIFEST_NAME, manifest)
        logger.info("PPO done: checkpoint %s, manifest %s", checkpoint, output_dir / MANIFEST_NAME)
    accelerator.wait_for_everyone()
    return manifest


if __name__ == "__main__":
    main()
