"""DPO stage config: TRL's ``DPOConfig`` plus the pipeline's arguments.

Changed defaults (vs TRL 1.16) and why: activation (gradient) checkpointing off and bf16 resolved per device (see
sft/config.py); max_length 512; save_strategy "steps" (Trainer checkpoints for resume, see sft/config.py);
report_to ["wandb"] (offline unless a key is set). ``beta`` and ``loss_type`` are TRL's own fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import DPOConfig

from rlhf.config import PipelineArguments


@dataclass
class DPOStageConfig(PipelineArguments, DPOConfig):
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
    # TRL 1.16 defaults gradient_checkpointing to True; transformers 5 renamed it activation_checkpointing.
    gradient_checkpointing: bool | None = field(
        default=None, metadata={"help": "Deprecated alias of activation_checkpointing."}
    )
    max_length: int | None = field(default=512, metadata={"help": "Max tokens of prompt + completion."})
    # Resume (issue 11, rlhf/resume.py): Trainer checkpoints every save_steps, the last save_total_limit kept; the
    # stage removes them once its own final checkpoint and manifest are written.
    save_strategy: str = field(default="steps", metadata={"help": "Trainer checkpoints for resume: steps | epoch | no."})
    save_steps: float = field(default=50, metadata={"help": "Save a Trainer checkpoint every N optimizer steps."})
    save_total_limit: int | None = field(
        default=2, metadata={"help": "Trainer checkpoints kept (oldest removed); 2 survive a kill during a save."}
    )
    report_to: list[str] | str | None = field(default_factory=lambda: ["wandb"], metadata={"help": "Trackers."})
