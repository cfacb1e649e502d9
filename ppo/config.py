"""Configuration of the PPO stage.

TRL 1.16 ships no PPOConfig, so this is our own dataclass in TRL's style: every field carries its help text
in ``metadata`` (``HfArgumentParser``/``TrlParser`` turn it into ``--help``), defaults < YAML < CLI.

Two dataclasses are parsed together by :mod:`ppo.train`:
    - :class:`PPOScriptArguments`: where the models and prompts are (stage directories or paths);
    - :class:`PPOConfig`: how to train.

Batch arithmetic (per process; multiply by the number of processes for a global figure):
    each step generates ``batch_size`` completions (one per prompt); they are cut into
    ``batch_size / mini_batch_size`` minibatches, each one optimizer step, so a step makes
    ``ppo_epochs * batch_size / mini_batch_size`` optimizer steps. A minibatch is run as
    ``mini_batch_size / micro_batch_size`` forward/backward passes with accumulated gradients; the losses are token
    means over the mini-batch (the micro-batch size changes memory, not the update).
    Example (defaults): 8 prompts, minibatches of 4, 4 epochs -> 8 optimizer steps per PPO step.

Defaults that differ from TRL 0.x's removed PPOConfig, and why:
    - temperature 1.0 (TRL: 0.7): sampling and log-probs use the same temperature either way, 1.0 keeps the
      optimised distribution equal to the model's own;
    - top-k / top-p are not options: they make the sampled distribution differ from the one whose log-probs
      are scored, which biases the KL estimate (it can go negative);
    - vf_coef 0.1, cliprange 0.2, cliprange_value 0.2, gamma 1.0, lam 0.95, kl_coef 0.05: as TRL.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from rlhf.config import CommonArguments, TripwireArguments

if TYPE_CHECKING:
    from judging.tripwires import TripwireConfig

SUPPORTED_REPORT_TO = ("wandb",)


@dataclass
class PPOScriptArguments(CommonArguments):
    """Where the PPO stage reads its inputs (plus every stage's ``round_id``, ``data_mode`` and ``max_reject_rate``,
    from :class:`rlhf.config.CommonArguments`; in lenient mode bad prompt rows go to
    ``<output_dir>/rejects-prompts.jsonl``).

    Each model comes either from a stage directory (what the round flow passes; its ``manifest.json`` is read) or
    from an explicit local path (standalone runs); one of the two is required (checked by
    :meth:`check_complete` when the stage runs), both is an error.
        pi_ref:       ``--sft_dir`` (SFT manifest ``outputs.pi_ref`` + ``outputs.pi_ref_hash``) or ``--ref_path``
        policy:       ``--policy_dir`` (DPO manifest ``outputs.checkpoint``) or ``--policy_path``
        reward model: ``--reward_model_dir`` (RM manifest ``outputs.checkpoint``) or ``--reward_model_path``
        prompts:      ``--prompts_data`` (a data source: ``demo:<file>``, a local file, ``hf:<id>``) or
                      ``--prompts_path`` (a JSONL file of ``{"prompt": str | [messages]}``)
    The unlock decision comes from ``--ppo_unlock_json`` (the flow's decision file) or, with
    ``--reward_model_dir`` alone, from the reward-model stage's recorded measurements (``judging.unlock``).
    """

    sft_dir: str | None = field(
        default=None,
        metadata={"help": "SFT stage output directory: pi_ref and its content hash are read from its manifest."},
    )
    policy_dir: str | None = field(
        default=None,
        metadata={"help": "Stage output directory of the initial policy (normally DPO): its manifest's "
                          "outputs.checkpoint."},
    )
    reward_model_dir: str | None = field(
        default=None,
        metadata={"help": "Reward-model stage output directory: its manifest's outputs.checkpoint."},
    )
    ppo_unlock_json: str | None = field(
        default=None,
        metadata={"help": "The flow's PPO unlock decision (JSON of judging.unlock.UnlockDecision); the stage refuses "
                          "to run when it says locked. Default: decided from --reward_model_dir's measurements."},
    )
    policy_path: str | None = field(
        default=None,
        metadata={"help": "Directory of the initial policy (AutoModelForCausalLM), instead of --policy_dir."},
    )
    ref_path: str | None = field(
        default=None,
        metadata={
            "help": "Directory of pi_ref, instead of --sft_dir. Loaded separately from the policy, never shared "
            "with it. Its content hash is --ref_hash if given, else computed at start."
        },
    )
    ref_hash: str | None = field(
        default=None, metadata={"help": "Expected content hash of --ref_path (rlhf.lineage.content_hash)."}
    )
    reward_model_path: str | None = field(
        default=None,
        metadata={"help": "Directory of the Bradley-Terry reward model (AutoModelForSequenceClassification, 1 label), "
                          "instead of --reward_model_dir."},
    )
    value_model_path: str | None = field(
        default=None,
        metadata={
            "help": "Directory the value model is initialised from (AutoModelForSequenceClassification, 1 label). "
            "Default: the reward model, as in Ouyang et al. 2022 (value function initialised from the RM)."
        },
    )
    prompts_data: str | None = field(
        default=None,
        metadata={
            "help": "Prompt source for data.loaders.load_eval_prompts: 'demo:hh_rlhf/pairs_train.jsonl', a local "
            "file, or 'hf:<id>'. Each prompt is a user message, rendered with the chat template."
        },
    )
    prompts_path: str | None = field(
        default=None,
        metadata={
            "help": "Instead of --prompts_data: JSONL file, one object per line with a 'prompt' field: a user "
            "string, or a list of chat messages ({'role', 'content'})."
        },
    )
    max_prompts: int | None = field(default=None, metadata={"help": "Use the first N prompts of the source."})

    def __post_init__(self) -> None:
        errors = []
        for what, stage_dir, path in self._SOURCES:
            if getattr(self, stage_dir) and getattr(self, path):
                errors.append(f"{what}: give --{stage_dir} or --{path}, not both")
        if self.ref_hash and not self.ref_path:
            errors.append("--ref_hash goes with --ref_path (with --sft_dir the hash comes from the SFT manifest)")
        if self.max_prompts is not None and self.max_prompts <= 0:
            errors.append(f"max_prompts must be > 0, got {self.max_prompts}")
        if errors:
            raise ValueError("PPOScriptArguments: " + "; ".join(errors))
        super().__post_init__()

    _SOURCES = (("pi_ref", "sft_dir", "ref_path"), ("policy", "policy_dir", "policy_path"),
                ("reward model", "reward_model_dir", "reward_model_path"), ("prompts", "prompts_data", "prompts_path"))

    def check_complete(self) -> None:
        """Raise unless every input has a source. Not done at parse time: a recipe holds the hyper-parameters and
        the prompt source, the flow adds the stage directories on the command line."""
        missing = [f"{what} (--{stage_dir} or --{path})" for what, stage_dir, path in self._SOURCES
                   if not getattr(self, stage_dir) and not getattr(self, path)]
        if missing:
            raise ValueError("PPOScriptArguments: missing input(s): " + ", ".join(missing))


@dataclass
class PPOConfig(TripwireArguments):
    """Hyper-parameters of classic RLHF PPO (Ziegler et al. 2019; Ouyang et al. 2022); the reward-hacking tripwire's
    ``tripwire_*`` fields come from :class:`rlhf.config.TripwireArguments`."""

    # ---- run ------------------------------------------------------------------------------------
    output_dir: str = field(
        default="outputs/ppo",
        metadata={"help": "Where the policy checkpoint (output_dir/checkpoint) and manifest.json are written."},
    )
    run_name: str | None = field(default=None, metadata={"help": "W&B run name (default 'ppo'); the group is round_id."})
    seed: int = field(default=42, metadata={"help": "Seed of torch, python and numpy RNGs (sampling included)."})
    num_steps: int = field(
        default=100,
        metadata={"help": "Number of PPO steps. One step = one rollout of batch_size prompts + ppo_epochs of updates."},
    )

    # ---- batch sizes (per process) --------------------------------------------------------------
    batch_size: int = field(default=8, metadata={"help": "Prompts (= completions) per rollout, per process."})
    mini_batch_size: int = field(
        default=4, metadata={"help": "Completions per optimizer step; must divide batch_size."}
    )
    micro_batch_size: int = field(
        default=2,
        metadata={
            "help": "Completions per forward/backward pass (gradients accumulate up to mini_batch_size); also the "
            "chunk size of the rollout's scoring passes. Must divide mini_batch_size."
        },
    )
    ppo_epochs: int = field(default=4, metadata={"help": "Passes over each rollout batch."})

    # ---- optimisation -----------------------------------------------------------------------------
    learning_rate: float = field(default=1e-6, metadata={"help": "AdamW learning rate (policy and value)."})
    adam_epsilon: float = field(default=1e-8, metadata={"help": "AdamW epsilon."})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient-norm clipping per optimizer step."})
    lr_scheduler_type: Literal["constant", "linear", "cosine"] = field(
        default="constant", metadata={"help": "Learning-rate schedule over all optimizer steps."}
    )
    warmup_steps: int = field(default=0, metadata={"help": "Linear warm-up, in optimizer steps."})

    # ---- PPO ------------------------------------------------------------------------------------
    kl_coef: float = field(
        default=0.05, metadata={"help": "Initial coefficient beta of the per-token KL penalty against pi_ref."}
    )
    kl_estimator: Literal["k1", "k3"] = field(
        default="k1",
        metadata={
            "help": "KL estimator inside the reward: 'k1' = log pi - log pi_ref (classic, Ziegler et al. 2019) or "
            "'k3' (non-negative per token). Both are logged whatever this is."
        },
    )
    kl_target: float | None = field(
        default=None,
        metadata={
            "help": "If set, adapt kl_coef towards this per-sequence KL (Ziegler et al. 2019 adaptive controller)."
        },
    )
    kl_horizon: int = field(default=10000, metadata={"help": "Horizon (in samples) of the adaptive KL controller."})
    cliprange: float = field(default=0.2, metadata={"help": "PPO ratio clip epsilon."})
    cliprange_value: float = field(default=0.2, metadata={"help": "Value clip around the rollout's values."})
    vf_coef: float = field(default=0.1, metadata={"help": "Weight of the value loss in the total loss."})
    gamma: float = field(default=1.0, metadata={"help": "Discount factor of GAE."})
    lam: float = field(default=0.95, metadata={"help": "Lambda of GAE."})
    whiten_advantages: bool = field(
        default=True, metadata={"help": "Normalise advantages over the real tokens of each rollout batch."}
    )
    missing_eos_penalty: float | None = field(
        default=None,
        metadata={
            "help": "If set (>= 0), subtracted from the score of a completion with no EOS among its generated "
            "tokens (an EOS in the prompt does not count)."
        },
    )

    # ---- generation ---------------------------------------------------------------------------------
    max_prompt_length: int = field(
        default=512, metadata={"help": "Longest prompt in tokens; a longer prompt is an error naming its row."}
    )
    max_new_tokens: int = field(default=53, metadata={"help": "Most tokens generated per completion."})
    reward_max_length: int = field(
        default=1024,
        metadata={"help": "Longest render of (prompt, completion) the reward model scores (judging.scoring.score "
                          "truncates from the left, so the end where the score is read is always kept)."},
    )
    temperature: float = field(
        default=1.0,
        metadata={"help": "Sampling temperature; the same temperature divides the logits when log-probs are scored."},
    )

    # ---- hardware ---------------------------------------------------------------------------------
    precision: Literal["auto", "fp32", "bf16", "fp16"] = field(
        default="auto",
        metadata={"help": "auto | fp32 | bf16 | fp16, as every stage (rlhf.precision.resolve_precision, logged): "
                          "'auto' = bf16 on CUDA with bf16, fp16 on older CUDA, fp32 on CPU; a bf16/fp16 request the "
                          "device cannot honour falls back to fp32 with a warning.",
                  "choices": ["auto", "fp32", "bf16", "fp16"]},
    )
    gradient_checkpointing: bool = field(
        default=False, metadata={"help": "Gradient checkpointing for the policy and value models."}
    )
    disable_dropout: bool = field(
        default=True,
        metadata={
            "help": "Set every dropout of the policy and value models to 0, so that the first PPO epoch's ratios are "
            "exactly 1 (rollouts are always scored in eval mode)."
        },
    )

    # ---- logging --------------------------------------------------------------------------------
    report_to: list[str] = field(
        default_factory=list,
        metadata={"help": f"Trackers to log to, among {list(SUPPORTED_REPORT_TO)}. Empty: none."},
    )
    logging_steps: int = field(default=1, metadata={"help": "Call the callbacks every this many PPO steps."})

    # ---- reward-hacking tripwire: rlhf.config.TripwireArguments, with PPO's KL bound ------------------
    tripwire_max_kl: float | None = field(
        default=20.0, metadata={"help": "Trip when the mean k1 KL to pi_ref (nats per sequence) of the rollouts since "
                                        "the last check exceeds this (each rollout precedes its step's update). "
                                        "None: off."},
    )

    # ---- resume ---------------------------------------------------------------------------------
    save_steps: int = field(
        default=0,
        metadata={"help": "Write a resume checkpoint (output_dir/checkpoint-<step>: policy + value weights, "
                          "optimizer, scheduler, RNG states, loop state, sha256 completion marker) every this many "
                          "PPO steps (not after the last one); 0: none. One process or DDP only."},
    )
    save_total_limit: int = field(
        default=2, metadata={"help": "Resume checkpoints kept (the newest); older ones are removed once a newer one "
                                     "is marked complete."},
    )
    resume_from_checkpoint: str | None = field(
        default=None,
        metadata={"help": "Continue from a resume checkpoint: its path, or 'last' (the newest complete one in "
                          "output_dir). Checked first (rlhf.resume: files, sha256 marker, shapes); a missing or "
                          "damaged one is an error. The flow passes it when it reruns an unfinished stage."},
    )

    def __post_init__(self) -> None:
        errors: list[str] = []

        def positive(name: str) -> None:
            if getattr(self, name) <= 0:
                errors.append(f"{name} must be > 0, got {getattr(self, name)}")

        for name in (
            "num_steps",
            "batch_size",
            "mini_batch_size",
            "micro_batch_size",
            "ppo_epochs",
            "learning_rate",
            "max_new_tokens",
            "max_prompt_length",
            "reward_max_length",
            "temperature",
            "cliprange",
            "cliprange_value",
            "kl_horizon",
            "logging_steps",
        ):
            positive(name)
        errors += self.tripwire_errors()
        if self.tripwire_n_prompts <= 0:
            errors.append(f"tripwire_n_prompts must be > 0, got {self.tripwire_n_prompts}")
        if self.save_steps < 0:
            errors.append(f"save_steps must be >= 0 (0: no resume checkpoints), got {self.save_steps}")
        if self.save_total_limit < 1:
            errors.append(f"save_total_limit must be >= 1, got {self.save_total_limit}")
        if self.batch_size % self.mini_batch_size:
            errors.append(f"mini_batch_size ({self.mini_batch_size}) must divide batch_size ({self.batch_size})")
        if self.mini_batch_size % self.micro_batch_size:
            errors.append(
                f"micro_batch_size ({self.micro_batch_size}) must divide mini_batch_size ({self.mini_batch_size})"
            )
        if self.kl_coef < 0:
            errors.append(f"kl_coef must be >= 0, got {self.kl_coef}")
        if self.kl_target is not None and self.kl_target <= 0:
            errors.append(f"kl_target must be > 0 when set, got {self.kl_target}")
        if self.vf_coef < 0:
            errors.append(f"vf_coef must be >= 0, got {self.vf_coef}")
        if not 0.0 <= self.gamma <= 1.0:
            errors.append(f"gamma must be in [0, 1], got {self.gamma}")
        if not 0.0 <= self.lam <= 1.0:
            errors.append(f"lam must be in [0, 1], got {self.lam}")
        if self.missing_eos_penalty is not None and self.missing_eos_penalty < 0:
            errors.append(f"missing_eos_penalty must be >= 0 (it is subtracted), got {self.missing_eos_penalty}")
        if self.kl_estimator not in ("k1", "k3"):
            errors.append(f"kl_estimator must be 'k1' or 'k3', got {self.kl_estimator!r}")
        if self.lr_scheduler_type not in ("constant", "linear", "cosine"):
            errors.append(f"lr_scheduler_type must be constant/linear/cosine, got {self.lr_scheduler_type!r}")
        if self.precision not in ("auto", "fp32", "bf16", "fp16"):
            errors.append(f"precision must be auto/fp32/bf16/fp16, got {self.precision!r}")
        if isinstance(self.report_to, str):
            self.report_to = [self.report_to]
        self.report_to = [r for r in self.report_to if r != "none"]
        unknown = [r for r in self.report_to if r not in SUPPORTED_REPORT_TO]
        if unknown:
            errors.append(f"report_to: unsupported tracker(s) {unknown}; supported: {list(SUPPORTED_REPORT_TO)}")
        if errors:
            raise ValueError("PPOConfig: " + "; ".join(errors))

    def tripwire_config(self) -> "TripwireConfig":
        """The tripwire's rules (``judging.tripwires.TripwireConfig``) from the ``tripwire_*`` fields.

        Raises:
            ValueError: the tripwire is off (``tripwire_steps`` 0) or a bound is invalid.
        """
        from judging.tripwires import TripwireConfig

        if not self.tripwire_steps:
            raise ValueError("tripwire_steps is 0: the tripwire is off")
        return TripwireConfig(
            every_steps=self.tripwire_steps, min_step=self.tripwire_min_step, gold_drop=self.tripwire_gold_drop,
            max_kl=self.tripwire_max_kl, max_length_ratio=self.tripwire_max_length_ratio,
            max_refusal_shift=self.tripwire_max_refusal_shift, max_style_shift=self.tripwire_max_style_shift)

    @property
    def optimizer_steps_per_ppo_step(self) -> int:
        return self.ppo_epochs * (self.batch_size // self.mini_batch_size)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
