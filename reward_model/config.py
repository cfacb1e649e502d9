"""Reward-model stage config: TRL's ``RewardConfig`` plus the pipeline's arguments and the held-out agreement data.

The PPO unlock override is a flow parameter (``judging.unlock``), not a field here, so it never changes this
stage's cache key.

Changed defaults (vs TRL 1.16): ``rlhf.config.TrainerDefaults`` (shared with SFT and DPO, with the reasons);
bf16 resolved per device.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import RewardConfig

from rlhf.config import PipelineArguments, TrainerDefaults


@dataclass
class RewardStageConfig(PipelineArguments, TrainerDefaults, RewardConfig):
    sft_dir: str = field(
        default="", metadata={"help": "SFT stage output dir; the reward model starts from its checkpoint."}
    )
    train_data: str = field(
        default="demo:hh_rlhf/pairs_train.jsonl", metadata={"help": "Preference pairs to train on."}
    )
    agreement_data: str = field(
        default="demo:pandalm/testset-v1.jsonl.gz",
        metadata={
            "help": "Held-out pairs with several annotators' labels (PandaLM format): the RM's agreement with "
            "the expert (majority) label and the inter-annotator agreement are measured on them."
        },
    )
    agreement_data_mode: str = field(
        default="lenient",
        metadata={
            "help": "Validation mode of the held-out pairs. PandaLM has 60 of 999 rows with an empty or "
            "non-string response; lenient mode lists them in rejects-agreement.jsonl and counts them.",
            "choices": ["strict", "lenient"],
        },
    )
    agreement_max_reject_rate: float = field(
        default=0.10, metadata={"help": "Largest tolerated share of bad held-out rows."}
    )
    max_agreement_pairs: int | None = field(
        default=None,
        metadata={"help": "RM agreement on the first N held-out pairs (inter-annotator agreement uses all)."},
    )
    scoring_batch_size: str = field(
        default="auto",
        metadata={"help": "Batch size when scoring held-out pairs: an int, or auto (batches of at most 128 on CPU "
                  "unless memory says otherwise, rlhf.machine.auto_batch_size, split where padding costs more than a "
                  "forward pass, rlhf.batching.plan_batches)."},
    )
