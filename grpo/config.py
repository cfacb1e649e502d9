"""GRPO stage config: TRL's ``GRPOConfig`` plus the online-RL arguments (``rlhf.online_rl.OnlineRLArguments``).

Changed defaults (vs TRL 1.16): ``rlhf.online_rl.OnlineRLDefaults`` (shared with RLOO, with the reasons), and
``beta`` 0.04 (TRL: 0.0, which builds no reference model; 0.04 is DeepSeekMath's, Shao et al. 2024, section 4.2):
the KL term to pi_ref is what keeps the policy near the SFT model. bf16 resolved per device.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import GRPOConfig

from rlhf.online_rl import OnlineRLArguments, OnlineRLDefaults


@dataclass
class GRPOStageConfig(OnlineRLArguments, OnlineRLDefaults, GRPOConfig):
    beta: float = field(default=0.04, metadata={"help": "KL coefficient to pi_ref (must be > 0 here)."})
