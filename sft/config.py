"""SFT stage config: TRL's ``SFTConfig`` plus the pipeline's arguments.

Changed defaults (vs TRL 1.16): activation checkpointing off, max_length 512, Trainer checkpoints for resume,
report_to ["wandb"] (``rlhf.config.TrainerDefaults``, shared with DPO and the reward model, says why); bf16
None -> resolved per device by ``precision`` (TRL's bf16=True is emulated, 8-10x slower, on CPUs without it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import SFTConfig

from rlhf.config import PipelineArguments, TrainerDefaults


@dataclass
class SFTStageConfig(PipelineArguments, TrainerDefaults, SFTConfig):
    train_data: str = field(
        default="demo:hh_rlhf/sft.jsonl",
        metadata={"help": "SFT conversations (`messages`): demo:<file>, a local jsonl/json path or a hub dataset id."},
    )
    style_audit_max_opener_share: float = field(
        default=0.25, metadata={"help": "Style audit: largest share of demonstrations allowed to open the same way."}
    )
    style_audit_action: str = field(
        default="warn", metadata={"help": "What a failed style audit does: warn | fail.", "choices": ["warn", "fail"]}
    )
    max_fully_masked_rate: float = field(
        default=0.0,
        metadata={"help": "Largest share of rows allowed to end with no trainable (labelled) token before SFT stops."},
    )
