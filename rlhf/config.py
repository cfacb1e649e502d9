"""Pipeline arguments mixed into each stage's TRL config, and the LoRA config built from them.

Each stage config is ``@dataclass class XStageConfig(PipelineArguments, TrainerDefaults, TRLConfig)``: TRL's
fields keep their meaning and help; ours are listed here once. Recipes are YAML files parsed strictly by
``trl.TrlParser`` (unknown keys are errors; ``--key value`` on the command line overrides the file).

:class:`CommonArguments` holds the fields every stage has, PPO included (PPO has no TRL config to mix into, so
its script arguments extend this class alone); :class:`PipelineArguments` adds the model, precision and LoRA
fields of the TRL-based stages; :class:`TrainerDefaults` holds the defaults the TRL-based stages change in TRL's
own fields, once for all three (it stands before the TRL config in the bases, so its defaults win).
"""

from __future__ import annotations

import math

import os
from dataclasses import dataclass, field



@dataclass
class CommonArguments:
    """Fields of every stage: the round it belongs to and how it treats bad rows."""

    round_id: str | None = field(default=None, metadata={"help": "Round id; groups W&B runs and names outputs."})
    data_mode: str = field(
        default="strict",
        metadata={
            "help": "strict: stop at the first bad row. lenient: write rejects to a file, stop above max_reject_rate.",
            "choices": ["strict", "lenient"],
        },
    )
    max_reject_rate: float = field(
        default=0.05, metadata={"help": "Lenient mode: largest tolerated share of bad rows."}
    )

    def __post_init__(self):
        if self.data_mode not in ("strict", "lenient"):
            raise ValueError(f"data_mode must be strict or lenient, got {self.data_mode!r}")
        if not 0 <= self.max_reject_rate <= 1:
            raise ValueError(f"max_reject_rate must be a share in [0, 1], got {self.max_reject_rate}")
        from .distributed import prepare_training_args

        prepare_training_args(self)  # before TrainingArguments.__post_init__ creates the process group
        parent = getattr(super(), "__post_init__", None)  # the TRL config's, in a stage config
        if parent is not None:
            parent()


@dataclass
class TrainerLoopDefaults:
    """TRL 1.16 ``TrainingArguments`` fields whose defaults every TRL-based stage changes (SFT, DPO and the reward
    model through :class:`TrainerDefaults`; GRPO and RLOO through ``rlhf.online_rl.OnlineRLDefaults``), and why.

    activation (gradient) checkpointing off: the 135M model fits without it, and on CPU it costs a second forward
    per step (TRL 1.16 defaults it to True; transformers 5 renamed it activation_checkpointing).
    Trainer checkpoints by wall time (``save_minutes``, 30, and at epoch ends; ``save_strategy`` "no" turns off the
    Trainer's every-N-steps saving, which a recipe can set back with ``save_strategy: steps``), 2 kept, so a killed
    stage resumes (rlhf/resume.py); the stage removes them once its own final checkpoint and manifest are written.
    report_to ["wandb"]: offline unless a key is set (rlhf/tracking.py). ``logging_nan_inf_filter`` off:
    transformers replaces a NaN or inf step loss by the mean of the logged ones, which would hide a diverged run
    from the save-time check. bf16 is not here: :class:`PipelineArguments` resolves it per device.
    """

    gradient_checkpointing: bool | None = field(
        default=None, metadata={"help": "Deprecated alias of activation_checkpointing."}
    )
    save_strategy: str = field(
        default="no",
        metadata={"help": "The Trainer's own checkpoints: steps | epoch | no (checkpoints by time, save_minutes, "
                  "happen either way)."},
    )
    save_steps: float = field(default=50, metadata={"help": "save_strategy steps: a Trainer checkpoint every N steps."})
    save_total_limit: int | None = field(
        default=2, metadata={"help": "Trainer checkpoints kept (oldest removed); 2 survive a kill during a save."}
    )
    report_to: list[str] | str | None = field(default_factory=lambda: ["wandb"], metadata={"help": "Trackers."})
    logging_nan_inf_filter: bool = field(
        default=False,
        metadata={"help": "True hides a NaN/inf step loss behind the mean of the logged ones (transformers' "
                  "default); False logs it, so a diverged run is refused at its next save (rlhf/training_health.py)."},
    )


@dataclass
class TrainerDefaults(TrainerLoopDefaults):
    """:class:`TrainerLoopDefaults` and ``max_length`` 512 (prompt + completion), for SFT, DPO and the reward model
    (the online-RL configs have no ``max_length``)."""

    max_length: int | None = field(default=512, metadata={"help": "Max tokens per example (prompt + completion)."})


def tripwire_bound_errors(prefix: str = "", *, min_step: int, gold_drop: float | None, max_kl: float | None,
                          max_length_ratio: float | None, max_refusal_shift: float | None,
                          max_style_shift: float | None, reward_rise: float = 0.0) -> list[str]:
    """What is wrong with a tripwire's bounds (``judging.tripwires.TripwireConfig``'s rules, for its fields and for
    :class:`TripwireArguments`' ``tripwire_*`` ones, named ``prefix + name``); [] when nothing is. The check
    interval is each caller's (0 turns a stage's tripwire off; a TripwireConfig needs one > 0).
    """
    errors = []
    if min_step < 0:
        errors.append(f"{prefix}min_step must be >= 0, got {min_step}")
    for name, v in (("gold_drop", gold_drop), ("max_kl", max_kl), ("max_refusal_shift", max_refusal_shift),
                    ("max_style_shift", max_style_shift)):
        if v is not None and not (math.isfinite(v) and v >= 0):
            errors.append(f"{prefix}{name} must be >= 0 or None, got {v}")
    if max_length_ratio is not None and not (math.isfinite(max_length_ratio) and max_length_ratio >= 1):
        errors.append(f"{prefix}max_length_ratio must be >= 1 or None, got {max_length_ratio}")
    if not math.isfinite(reward_rise):
        errors.append(f"{prefix}reward_rise must be finite, got {reward_rise}")
    return errors


@dataclass
class TripwireArguments:
    """The reward-hacking tripwire's fields (``judging.tripwires``), the same names and meaning in every online-RL
    stage: PPO (``ppo.config.PPOConfig``) and the TRL-based GRPO and RLOO (``rlhf.online_rl.OnlineRLArguments``).

    ``tripwire_max_kl`` is None (off) here: its unit differs by stage (PPO's k1 KL is nats per sequence, TRL logs
    nats per completion token), so each stage sets its own bound.
    """

    tripwire_steps: int = field(
        default=10,
        metadata={"help": "Every this many steps, check signals the reward does not control (gold check, KL, "
                          "median length, refusal rate on a fixed slice; judging.tripwires) and on a trip stop and "
                          "restore the policy of the last passing check. 0: off. A run of fewer steps than this "
                          "makes no check."},
    )
    tripwire_min_step: int = field(default=0, metadata={"help": "Checks before this step never trip."})
    tripwire_prompts_data: str | None = field(
        default=None,
        metadata={"help": "The fixed slice the tripwire generates on (a data source, as the training prompts; "
                          "benign prompts, so a refusal is a false one). Default: the first tripwire_n_prompts "
                          "training prompts (in training too: held out only with this set)."},
    )
    tripwire_n_prompts: int = field(default=32, metadata={"help": "Prompts of the tripwire's slice."})
    tripwire_gold_model_path: str | None = field(
        default=None,
        metadata={"help": "Second reward model (a 1-label sequence classifier, not the optimised one) that scores "
                          "the gold check: win rate of the policy's greedy responses over the initial policy's. "
                          "None: no gold rule (KL, length and refusal rules only; recorded)."},
    )
    tripwire_gold_drop: float | None = field(
        default=0.15,
        metadata={"help": "Trip when gold falls more than this (win-rate points) below the best check while the "
                          "reward rose. None: off."},
    )
    tripwire_max_kl: float | None = field(
        default=None, metadata={"help": "Trip when the KL to pi_ref exceeds this (the stage's unit). None: off."}
    )
    tripwire_max_length_ratio: float | None = field(
        default=1.5, metadata={"help": "Trip when the slice's median response length over the initial policy's "
                                       "leaves [1/r, r]. None: off."},
    )
    tripwire_max_refusal_shift: float | None = field(
        default=0.10, metadata={"help": "Trip when the slice's refusal rate rises more than this (share) over the "
                                        "initial policy's. None: off."},
    )
    tripwire_max_style_shift: float | None = field(
        default=None, metadata={"help": "Trip when a style share (bullets, restating, hedged) moves more than this "
                                        "either way. None: recorded only."},
    )

    def tripwire_errors(self) -> list[str]:
        """What is wrong with the ``tripwire_*`` bounds (:func:`tripwire_bound_errors`), named as options."""
        steps = [] if self.tripwire_steps >= 0 else [f"tripwire_steps must be >= 0 (0: off), got {self.tripwire_steps}"]
        gold = self.tripwire_gold_model_path
        if gold and not os.path.exists(os.path.expanduser(gold)):
            steps.append(f"tripwire_gold_model_path {gold}: no such folder (a reward-model checkpoint on this "
                         "machine)")
        return steps + tripwire_bound_errors(
            "tripwire_", min_step=self.tripwire_min_step,
            gold_drop=self.tripwire_gold_drop, max_kl=self.tripwire_max_kl,
            max_length_ratio=self.tripwire_max_length_ratio, max_refusal_shift=self.tripwire_max_refusal_shift,
            max_style_shift=self.tripwire_max_style_shift)


@dataclass
class PipelineArguments(CommonArguments):
    """Fields every TRL-based stage adds to its TRL config (on top of :class:`CommonArguments`)."""

    model_name_or_path: str = field(
        default="smollm2-135m",
        metadata={"help": "Base/parent checkpoint: smollm2-135m, tiny, a .gguf file, a local dir or a hub id."},
    )
    precision: str = field(
        default="auto",
        metadata={
            "help": "auto | fp32 | bf16 | fp16. auto: bf16 only where the device has it (logged).",
            "choices": ["auto", "fp32", "bf16", "fp16"],
        },
    )
    max_train_samples: int | None = field(
        default=None, metadata={"help": "Use the first N valid training rows (every row is still validated)."}
    )
    special_tokens_in_text: str = field(
        default="refuse",
        metadata={
            "help": "Chat special tokens (<|im_end|>, <|im_start|>, ...) inside message text: refuse (a bad row) "
            "or escape (a zero-width space breaks the token).",
            "choices": ["refuse", "escape"],
        },
    )
    decontaminate: str = field(
        default="remove",
        metadata={
            "help": "Training rows that overlap a gate suite (data/decontamination.py): remove them, fail, or off "
            "(train on them, still reported in the manifest).",
            "choices": ["remove", "fail", "off"],
        },
    )
    decontaminate_against: str = field(
        default="",
        metadata={"help": "Gates recipe whose suites (*_data keys) training data is checked against; the round "
                  "flow passes the round's. Empty: not checked (the manifest says so)."},
    )
    save_minutes: float = field(
        default=30.0,
        metadata={"help": "Also save a Trainer checkpoint (for resume) every N minutes of training and at each epoch "
                  "end (rlhf/resume.py); 0: only by save_strategy / save_steps."},
    )
    use_peft: bool = field(default=False, metadata={"help": "Train LoRA adapters (peft) instead of all weights."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha."})
    lora_dropout: float = field(default=0.05, metadata={"help": "LoRA dropout."})
    lora_target_modules: list[str] | None = field(
        default=None, metadata={"help": "LoRA target modules (default: all linear layers)."}
    )

    def __post_init__(self):
        if self.save_minutes < 0:
            raise ValueError(f"save_minutes must be >= 0, got {self.save_minutes}")
        # transformers reads any max_steps <= 0 as "train num_train_epochs" (default 3): -5 or 0 would train three
        # epochs instead of refusing; -1 (its default) is that setting said on purpose.
        if self.max_steps == 0 or self.max_steps < -1:
            raise ValueError(f"max_steps must be a number of optimizer steps > 0, or -1 to train num_train_epochs, "
                             f"got {self.max_steps}")
        # Resolve precision before TrainingArguments validates it: TRL's default bf16=True raises on a CPU
        # without bf16, and is emulated (8-10x slower) on one that only fakes it.
        from .precision import resolve_precision
        from .registry import STAGES

        path = f"{type(self).__module__}:{type(self).__name__}"
        stage = next((name for name, s in STAGES.items() if path in s.configs), None)
        chosen = resolve_precision(self.precision, stage)
        self.bf16, self.fp16 = chosen == "bf16", chosen == "fp16"
        if self.bf16 and not _cuda():  # native CPU bf16 (avx512_bf16 / AMX): transformers needs use_cpu for it
            self.use_cpu = True
        super().__post_init__()


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def peft_config(args: PipelineArguments, task_type: str = "CAUSAL_LM", modules_to_save: list[str] | None = None):
    """A ``peft.LoraConfig`` from the stage arguments, or None when ``use_peft`` is off."""
    if not args.use_peft:
        return None
    from peft import LoraConfig

    return LoraConfig(
        r=args.lora_r,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        target_modules=args.lora_target_modules or "all-linear",
        task_type=task_type,
        modules_to_save=modules_to_save,
    )


#: Keys renamed since recipes were first written: old name -> new name. An old key is an error naming the new one
#: (never accepted beside it), so a recipe cannot keep a setting under a name that no longer does anything.
RENAMED_KEYS: dict[str, str] = {"max_prompt_tokens": "max_prompt_length"}


def check_renamed_keys(keys, where: str) -> None:
    """Refuse a renamed key (:data:`RENAMED_KEYS`) among ``keys`` (recipe keys or ``--key`` names).

    Raises:
        ValueError: ``<where>: max_prompt_tokens was renamed max_prompt_length`` for the first old key found.
    """
    for key in keys:
        name = str(key).removeprefix("--").split("=", 1)[0]
        if name in RENAMED_KEYS:
            raise ValueError(f"{where}: {name} was renamed {RENAMED_KEYS[name]}")


def _given_keys(argv: list[str]) -> tuple[str | None, list[str], list[str]]:
    """The ``--config`` file of ``argv`` (None without one), the keys that file sets, and the ``--key`` names."""
    import yaml

    i = argv.index("--config") if "--config" in argv else -1
    config = argv[i + 1] if 0 <= i < len(argv) - 1 else None
    file_keys = []
    if config is not None and os.path.isfile(config):
        with open(config) as f:
            cfg = yaml.safe_load(f) or {}
        file_keys = list(cfg) if isinstance(cfg, dict) else []
    return config, file_keys, [a for a in argv if a.startswith("--")]


def parse_stage_config(config_classes: tuple[type, ...], argv: list[str] | None = None) -> tuple:
    """``TrlParser(config_classes).parse_args_and_config(argv)`` (``argv`` None: ``sys.argv[1:]``), with an
    unknown key in the ``--config`` YAML reported as a ValueError that names the file (TRL's own message does not).

    Raises:
        ValueError: ``<recipe path>: Unknown arguments from config file: [...]``; ``<recipe path> (or ``command
            line``): <old key> was renamed <new key>`` (:data:`RENAMED_KEYS`); or TRL's other errors unchanged.
    """
    import sys

    from trl import TrlParser

    args = list(sys.argv[1:] if argv is None else argv)
    config, file_keys, cli_keys = _given_keys(args)
    check_renamed_keys(file_keys, str(config))
    check_renamed_keys(cli_keys, "command line")
    try:
        return TrlParser(config_classes).parse_args_and_config(argv)
    except ValueError as err:
        if config is None or "config file" not in str(err):
            raise
        raise ValueError(f"{config}: {err}") from None

