"""PPO stage: classic RLHF PPO (per-token KL penalty against a frozen pi_ref, GAE, clipped losses) on accelerate.

    ppo.core      pure tensor math (tested against hand-worked numbers)
    ppo.config    PPOConfig (hyper-parameters), PPOScriptArguments (stage directories / paths, prompts)
    ppo.types     Rollout
    ppo.trainer   PPOTrainer
    ppo.train     entry point: ``accelerate launch -m ppo.train --config recipes/<preset>/ppo.yaml --sft_dir ...``;
                  reads the stage manifests, verifies pi_ref's hash, writes the stage manifest (rlhf.manifest.stage_manifest)

Heavy modules (transformers, accelerate) load on first use of ``PPOTrainer``.
"""

from typing import Any

from ppo.config import PPOConfig, PPOScriptArguments

__all__ = ["PPOConfig", "PPOScriptArguments", "PPOTrainer", "Rollout"]


def __getattr__(name: str) -> Any:
    if name == "PPOTrainer":
        from ppo.trainer import PPOTrainer

        return PPOTrainer
    if name == "Rollout":
        from ppo.types import Rollout

        return Rollout
    raise AttributeError(f"module 'ppo' has no attribute {name!r}")
