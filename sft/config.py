"""SFT stage config: TRL's ``SFTConfig`` plus the pipeline's arguments.

Changed defaults (vs TRL 1.16) and why:
    activation (gradient) checkpointing off: the 135M model fits without it; on CPU it costs a second forward per step.
    bf16 None -> resolved per device by ``precision`` (TRL's bf16=True is emulated, 8-10x slower, on these CPUs).
    report_to ["wandb"]: offline unless a key is set (rlhf/tracking.py).
    max_length 512; save_strategy "steps" every 50 steps, 2 kept (resume, rlhf/resume.py; the final checkpoint is
    still the stage's own atomic save).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import SFTConfig

from rlhf.config import PipelineArguments


@dataclass
class SFTStageConfig(PipelineArguments, SFTConfig):
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
    # TRL 1.16 defaults gradient_checkpointing to True; transformers 5 renamed it activation_checkpointing.
    gradient_checkpointing: bool | None = field(
        default=None, metadata={"help": "Deprecated alias of activation_checkpointing."}
    )
    max_length: int | None = field(default=512, metadata={"help": "Max tokens per example (prompt + completion)."})
    # Resume (issue 11, rlhf/resume.py): Trainer checkpoints every save_steps, the last save_total_limit kept; the
    # stage removes them once its own final checkpoint and manifest are written.
    save_strategy: str = field(default="steps", metadata={"help": "Trainer checkpoints for resume: steps | epoch | no."})
    save_steps: float = field(default=50, metadata={"help": "Save a Trainer checkpoint every N optimizer steps."})
    save_total_limit: int | None = field(
        default=2, metadata={"help": "Trainer checkpoints kept (oldest removed); 2 survive a kill during a save."}
    )
    report_to: list[str] | str | None = field(default_factory=lambda: ["wandb"], metadata={"help": "Trackers."})
