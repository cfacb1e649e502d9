"""RLOO stage config: TRL's ``RLOOConfig`` plus the online-RL arguments (``rlhf.online_rl.OnlineRLArguments``).

Changed defaults (vs TRL 1.16): ``rlhf.online_rl.OnlineRLDefaults`` (shared with GRPO, with the reasons). TRL's
``beta`` 0.05 (the KL coefficient to pi_ref, folded into the reward as in Ahmadian et al. 2024) and
``num_generations`` 2 (the smallest leave-one-out group) are kept. bf16 resolved per device.
"""

from __future__ import annotations

from dataclasses import dataclass

from trl import RLOOConfig

from rlhf.online_rl import OnlineRLArguments, OnlineRLDefaults


@dataclass
class RLOOStageConfig(OnlineRLArguments, OnlineRLDefaults, RLOOConfig):
    pass
