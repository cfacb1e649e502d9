"""DPO stage config: TRL's ``DPOConfig`` plus the pipeline's arguments.

Changed defaults (vs TRL 1.16): ``rlhf.config.TrainerDefaults`` (shared with SFT and the reward model, with the
reasons); bf16 resolved per device. ``beta`` and ``loss_type`` are TRL's own fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import DPOConfig

from rlhf.config import PipelineArguments, TrainerDefaults


@dataclass
class DPOStageConfig(PipelineArguments, TrainerDefaults, DPOConfig):
    sft_dir: str = field(
        default="", metadata={"help": "Output directory of the SFT stage (its manifest names pi_ref and its hash)."}
    )
    train_data: str = field(
        default="demo:hh_rlhf/pairs_train.jsonl",
        metadata={"help": "Preference pairs (prompt/chosen/rejected): demo:<file>, a local path or a hub id."},
    )
    step0_pairs: int = field(
        default=4,
        metadata={"help": "Pairs checked before training: loss must be ln 2 and margins 0 (policy = pi_ref)."},
    )
    step0_tolerance: float = field(default=1e-3, metadata={"help": "Tolerance of the step-0 check (nats)."})
