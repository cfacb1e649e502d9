"""The shared part of the online-RL stages on TRL (``grpo``: ``GRPOTrainer``, Shao et al. 2024; ``rloo``:
``RLOOTrainer``, Ahmadian et al. 2024), the alternatives to ``ppo/`` a round picks with ``online_rl``.

What each stage's ``train.py`` does (it owns its data and the unlock rule, which sit above this package):

    stage = TrainerStage.start("grpo", GRPOStageConfig, argv)        # parse, failure hook, logging, W&B, seed
    inputs = resolve_inputs(stage.args)                              # manifests of sft / policy / RM, hashes
    inputs["ppo_unlock"] = judging.unlock.require_unlocked(...)      # refuses a locked round
    rows = data.loaders.load_eval_prompts(stage.args.train_data, ...)
    return run_online_rl(stage, GRPOTrainer, inputs, prompts, data)  # train, verify pi_ref, checkpoint, manifest

The policy starts from the DPO candidate (``--policy_dir``); the KL term is taken against pi_ref, the SFT stage's
frozen copy (``--sft_dir``), whose content hash is verified before anything loads and after training (DESIGN.md
principle 3). TRL 1.16 builds its reference model inside the trainer, from ``model.config._name_or_path`` (the
policy's own path, i.e. the DPO checkpoint); :func:`pi_ref_trainer` makes that path pi_ref's while the trainer is
built, so TRL loads the reference from pi_ref, and :func:`check_reference` compares the reference's weights with
pi_ref's files. With LoRA TRL uses no reference model at all (the adapter-disabled policy, i.e. DPO's weights), and
with ``beta`` 0 none is built, so both are refused, as is ``sync_ref_model`` (it moves the reference).

Rewards: ``reward_functions`` names them (:data:`REWARD_FUNCTIONS`), TRL's ``reward_weights`` weighs them (TRL sums
``weight * reward`` per completion before the group advantage). ``reward_model`` is the round's Bradley-Terry
reward model (a sequence classifier), scored by TRL on the chat-templated prompt + completion.

Per step (each ``logging_steps``; the recipes log every step) the manifest's ``metrics.history`` holds the mean
reward and its standard deviation, each reward function's mean, the KL to pi_ref, completion lengths, entropy and
loss, and the first ``manifest_completions`` completions with their rewards; W&B gets the same numbers at the
trainer's step (:class:`rlhf.trainer_stage.StepWandbCallback`) and the completions as a summary table. Each entry
is also appended to ``<output_dir>/history.jsonl`` as it is logged, so a stage killed and resumed from
``checkpoint-N`` keeps the killed attempt's entries up to step N (:func:`resumed_history`).

Reward-hacking tripwire: the ``tripwire_*`` fields (ppo's names and meaning; KL bound per token, TRL's unit) are
read by ``judging.online_tripwire``, which builds the callback the stages pass in ``callbacks``; a trip stops
training before ``max_steps`` (accepted here, any other early end is refused), the last passing check's weights are
loaded back before the save, and the record is the manifest's ``tripwire`` (this package only sees the callback's
``bind`` / ``manifest_section`` / ``manifest_record`` / ``stopped_training``: judging sits above it).

Efficiency (:func:`rollout_efficiency`) follows ``ppo/``: tokens = prompt + completion tokens of the rollouts
(TRL's ``num_input_tokens_seen``, attention-masked) times ``num_iterations`` (each rollout is trained on that many
times), N = the policy's parameters, ``MFU = 6 N tokens/s / peak`` over the whole loop, rollouts included;
sampling and the reference and reward forwards are not counted, so MFU understates what the hardware did.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .checkpoint import verify_hash
from .config import PipelineArguments, TrainerLoopDefaults, TripwireArguments
from .lineage import content_hash
from .manifest import MANIFEST_NAME, dumps_strict, precision_name, read_manifest, records_up_to_step

if TYPE_CHECKING:
    from .trainer_stage import TrainerStage, TrainingData

logger = logging.getLogger(__name__)

#: The reward functions a recipe may name in ``reward_functions``: name -> what it scores.
REWARD_FUNCTIONS: dict[str, str] = {
    "reward_model": "the round's reward model (--reward_model_dir): its score of prompt + completion",
    "repetition_penalty": "TRL's get_repetition_penalty_reward (3-gram, max penalty -1): repeated completion tokens",
    "soft_overlong": "TRL's get_soft_overlong_punishment (DAPO eq. 13), max_completion_length with a cache of 1/4",
    "judge": "a pairwise judge (--reward_judge, any judging backend; default the round's reward model) of the "
             "completion against the prompt's reference answer: +0.5 win, 0 draw, -0.5 loss (judging/online_reward.py)",
}

#: The per-step history file in the stage's output folder (one JSON object a logged step; rank 0 writes it).
HISTORY_FILE = "history.jsonl"

#: Step metrics TRL logs that go into ``metrics.history`` (per-reward means, ``rewards/<name>/mean``, too).
STEP_KEYS = ("loss", "reward", "reward_std", "frac_reward_zero_std", "kl", "entropy", "num_tokens",
             "completions/mean_length", "completions/clipped_ratio", "completions/mean_terminated_length",
             "clip_ratio/region_mean", "learning_rate", "grad_norm")


@dataclass
class OnlineRLDefaults(TrainerLoopDefaults):
    """TRL 1.16 fields (of ``GRPOConfig`` and ``RLOOConfig``) whose defaults the online-RL stages change, and why:
    those of ``rlhf.config.TrainerLoopDefaults`` (activation checkpointing off, W&B, NaN/inf logged, Trainer
    checkpoints by time) and the three below.

    ``logging_steps`` 1: the manifest's per-step history is one entry per logged step.
    ``disable_dropout`` on: with dropout the policy's log-probabilities differ from the sampling ones and from
    pi_ref's by noise, so the ratio and the KL term measure dropout (TRL's default is off).
    ``max_completion_length`` 256 (TRL 512): the reply lengths the demo gates read.
    """

    logging_steps: float = field(default=1, metadata={"help": "Log (and record in the manifest) every N steps."})
    disable_dropout: bool = field(
        default=True, metadata={"help": "Dropout off in policy and pi_ref (the ratio and the KL measure the policy)."}
    )
    max_completion_length: int | None = field(default=256, metadata={"help": "Most tokens sampled per completion."})


@dataclass
class OnlineRLArguments(PipelineArguments, TripwireArguments):
    """Fields of the online-RL stages beside TRL's (``beta``, ``num_generations``, ``reward_weights``, ``use_vllm``,
    ... keep TRL's meaning). ``train_data`` is the prompt source (``data.loaders.load_eval_prompts``: a pair file's
    prompts, a prompt file, ``hf:<id>``), each prompt a user turn rendered with the chat template by TRL."""

    sft_dir: str = field(default="", metadata={"help": "SFT stage directory: pi_ref and its hash (the KL reference)."})
    policy_dir: str = field(
        default="", metadata={"help": "Stage directory of the initial policy (the DPO candidate): outputs.checkpoint."}
    )
    reward_model_dir: str = field(
        default="", metadata={"help": "Reward-model stage directory: outputs.checkpoint (the reward_model function)."}
    )
    ppo_unlock_json: str = field(
        default="",
        metadata={"help": "The flow's unlock decision (ppo_unlock.json); a locked one is refused. Default: decided "
                  "from --reward_model_dir's measurements."},
    )
    train_data: str = field(
        default="demo:hh_rlhf/pairs_train.jsonl",
        metadata={"help": "Prompts: demo:<file>, a local file or hf:<id> (a pair file gives its prompts)."},
    )
    reward_functions: list[str] = field(
        default_factory=lambda: ["reward_model"],
        metadata={"help": f"Reward functions, summed with reward_weights: {', '.join(REWARD_FUNCTIONS)}."},
    )
    # A mapping in the recipe or JSON on the command line (HfArgumentParser reads the union as str), parsed and
    # checked by judging.judges.JudgeConfig where the stage builds the judge; a key given as a value is refused here.
    reward_judge: dict | str | None = field(
        default=None,
        metadata={"help": "The judge of the 'judge' reward (judging.judges.JudgeConfig: {backend: reward_model | "
                  "sequence_classifier | openai | labels, model, base_url, api_key_env, ...}); the key comes from "
                  "the environment variable api_key_env names. Default: the round's reward model."},
    )
    manifest_completions: int = field(
        default=4, metadata={"help": "Completions (with their rewards) kept per logged step in the manifest."}
    )
    tripwire_gold_judge: dict | str | None = field(
        default=None,
        metadata={"help": "A pairwise judge as the tripwire's gold check (judging.judges.JudgeConfig, as "
                  "reward_judge; not the optimised reward model): win rate of the slice's current answers over "
                  "the first check's. Instead of tripwire_gold_model_path."},
    )

    # ---- reward-hacking tripwire: rlhf.config.TripwireArguments (ppo's names and meaning), and these two ------
    tripwire_max_new_tokens: int = field(
        default=32, metadata={"help": "Most tokens of each greedy response on the slice."}
    )
    tripwire_max_kl: float | None = field(
        # TRL logs KL per token (PPO's bound, 20, is per sequence; ~1 nat a token over the demo's ~20-token replies)
        default=1.0, metadata={"help": "Trip when the latest KL to pi_ref TRL logged (its 'kl', nats per "
                                       "completion token) exceeds this. None: off."},
    )

    def __post_init__(self):
        unknown = [n for n in self.reward_functions if n not in REWARD_FUNCTIONS]
        if unknown or not self.reward_functions:
            raise ValueError(f"reward_functions {self.reward_functions}: unknown {unknown}; known: "
                             f"{', '.join(REWARD_FUNCTIONS)}")
        if len(set(self.reward_functions)) != len(self.reward_functions):
            raise ValueError(f"reward_functions {self.reward_functions}: a function named twice")
        self.reward_judge = _judge_mapping(self.reward_judge, "--reward_judge")
        if self.reward_judge is not None and "judge" not in self.reward_functions:
            raise ValueError(f"reward_judge is set but reward_functions {self.reward_functions} has no 'judge': "
                             "it would be ignored; add 'judge' or drop reward_judge")
        self.tripwire_gold_judge = _judge_mapping(self.tripwire_gold_judge, "--tripwire_gold_judge")
        if (self.tripwire_gold_judge or {}).get("backend") == "reward_model":
            raise ValueError("--tripwire_gold_judge backend reward_model is the optimised reward model: the gold "
                             "check must come from another scorer (openai, sequence_classifier with another model)")
        if self.tripwire_gold_judge is not None and self.tripwire_gold_model_path:
            raise ValueError("tripwire_gold_judge and tripwire_gold_model_path both set: the gold check has one "
                             "scorer; drop one")
        weights = getattr(self, "reward_weights", None)
        if weights is not None and len(weights) != len(self.reward_functions):
            raise ValueError(f"reward_weights {weights}: one weight per reward function {self.reward_functions}")
        if not getattr(self, "beta", 0.0) > 0:
            raise ValueError(f"beta {getattr(self, 'beta', None)}: must be > 0 (without the KL term TRL builds no "
                             "reference model, and the policy is free to leave pi_ref)")
        if self.use_peft:
            raise ValueError("use_peft: with LoRA TRL's reference is the adapter-disabled policy (the DPO "
                             "checkpoint), not pi_ref; train all weights (use_peft false)")
        if getattr(self, "sync_ref_model", False):
            raise ValueError("sync_ref_model: it copies the policy into the reference; pi_ref never moves")
        for name in ("tripwire_n_prompts", "tripwire_max_new_tokens"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if errors := self.tripwire_errors():
            raise ValueError("; ".join(errors))
        super().__post_init__()


def _judge_mapping(value: Any, where: str) -> dict | None:
    """A judge setting given as a recipe mapping or JSON text, as a dict (None when not given), its secrets refused
    (rlhf/credentials.py: a key given as a value is never stored or logged). The judge itself is built by the stage
    (``judging.judges.JudgeConfig`` checks the keys there: judging sits above this package).

    Raises:
        ValueError: text that is not JSON, not a mapping, or a secret value (names ``where``).
    """
    from .credentials import check_mapping, parse_mapping

    mapping = parse_mapping(value, where=where)
    if not mapping:
        return None
    check_mapping(mapping, where)
    return mapping


# ---- inputs -----------------------------------------------------------------------------------------


def _checkpoint_of(stage_dir: str, what: str) -> tuple[dict[str, Any], str, str]:
    """(manifest, ``outputs.checkpoint``, its content hash) of a finished stage, the hash checked against the one
    the stage recorded.

    Raises:
        FileNotFoundError: no manifest (the stage did not finish); ValueError: no ``outputs.checkpoint``;
        RuntimeError: the checkpoint changed since its stage finished.
    """
    manifest = read_manifest(stage_dir)
    path = (manifest.get("outputs") or {}).get("checkpoint")
    if not path:
        raise ValueError(f"{Path(stage_dir) / MANIFEST_NAME}: no outputs.checkpoint ({what})")
    actual = content_hash(path)
    recorded = manifest["outputs"].get("checkpoint_hash")
    if recorded and recorded != actual:
        raise RuntimeError(f"{what} at {path} changed since its stage finished: manifest says {recorded}, "
                           f"found {actual}")
    return manifest, path, actual


def resolve_inputs(args: OnlineRLArguments) -> dict[str, Any]:
    """pi_ref (SFT manifest), the initial policy and the reward model (their stages' checkpoints), with hashes;
    pi_ref's hash is verified here, before anything loads.

    Returns:
        ``{"pi_ref", "pi_ref_hash", "sft_manifest", "policy", "policy_hash", "policy_manifest", "reward_model",
        "reward_model_hash", "reward_model_manifest"}`` and, not for the manifest, ``"_rm_metrics"`` (the
        reward-model stage's measurements, for the unlock rule).

    Raises:
        SystemExit: a stage directory is not given; as :func:`_checkpoint_of`; RuntimeError: pi_ref moved.
    """
    missing = [f"--{k}" for k in ("sft_dir", "policy_dir", "reward_model_dir") if not getattr(args, k)]
    if missing:
        raise SystemExit(f"online RL needs {', '.join(missing)} (the SFT, DPO and reward-model stage directories)")
    sft = read_manifest(args.sft_dir)
    outputs = sft.get("outputs") or {}
    if not outputs.get("pi_ref") or not outputs.get("pi_ref_hash"):
        raise ValueError(f"{Path(args.sft_dir) / MANIFEST_NAME}: no outputs.pi_ref / outputs.pi_ref_hash")
    verify_hash(outputs["pi_ref"], outputs["pi_ref_hash"], when="before training")
    _, policy, policy_hash = _checkpoint_of(args.policy_dir, "the initial policy")
    rm_manifest, rm, rm_hash = _checkpoint_of(args.reward_model_dir, "the reward model")
    return {
        "pi_ref": outputs["pi_ref"], "pi_ref_hash": outputs["pi_ref_hash"],
        "sft_manifest": str(Path(args.sft_dir).resolve()),
        "policy": policy, "policy_hash": policy_hash, "policy_manifest": str(Path(args.policy_dir).resolve()),
        "reward_model": rm, "reward_model_hash": rm_hash,
        "reward_model_manifest": str(Path(args.reward_model_dir).resolve()),
        "_rm_metrics": rm_manifest.get("metrics") or {},
    }


# ---- trainer ----------------------------------------------------------------------------------------


def pi_ref_trainer(trainer_class: type) -> type:
    """A subclass of TRL's ``GRPOTrainer`` / ``RLOOTrainer`` whose reference model is pi_ref and which records
    every logged step (:attr:`history`).

    ``trainer_class(pi_ref=path, model=policy, ...)``: TRL 1.16 loads its reference with
    ``create_model_from_path(model.config._name_or_path, dtype=model.dtype, ...)`` in ``__init__``; the name is
    pi_ref's path for the length of ``__init__`` and the policy's again after. (With ``use_vllm`` the colocated
    engine is also started from that path; TRL loads the policy's weights into it before the first rollout.)
    """

    class PiRefTrainer(trainer_class):
        def __init__(self, *args, pi_ref: str, reward_names: list[str] | None = None, manifest_completions: int = 4,
                     **kwargs):
            model = kwargs["model"]
            name = model.config._name_or_path
            model.config._name_or_path = str(pi_ref)
            try:
                super().__init__(*args, **kwargs)
            finally:
                model.config._name_or_path = name
            if self.ref_model is None:  # beta 0 or LoRA, refused by OnlineRLArguments; a TRL change would land here
                raise RuntimeError(f"{trainer_class.__name__} built no reference model: the KL term would not be "
                                   "taken against pi_ref")
            if reward_names is not None:  # TRL names a reward model after its folder ("checkpoint"); ours by role
                if len(reward_names) != len(self.reward_func_names):
                    raise ValueError(f"reward_names {reward_names}: one per reward function ({self.reward_func_names})")
                self.reward_func_names = list(reward_names)
            self.pi_ref_path = str(pi_ref)
            self.manifest_completions = manifest_completions
            self.history: list[dict[str, Any]] = []
            self.history_path: Path | None = None  # set by run_online_rl: each entry appended as it is logged

        def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
            super().log(logs, start_time)  # TRL adds its step means (reward, kl, ...) to ``logs`` in place
            if "reward" in logs and self.model.training:
                entry = step_record(self.state.global_step, logs, self._logs, self.manifest_completions)
                self.history.append(entry)
                if self.history_path is not None and self.accelerator.is_main_process:
                    with self.history_path.open("a") as f:
                        f.write(dumps_strict(entry) + "\n")

    PiRefTrainer.__name__ = PiRefTrainer.__qualname__ = f"PiRef{trainer_class.__name__}"
    return PiRefTrainer


def _text(x: Any) -> str:
    """A prompt or completion as TRL keeps it (a string, or chat messages) as text: the last message's content."""
    if isinstance(x, list) and x and isinstance(x[-1], dict):
        return str(x[-1].get("content", ""))
    return str(x)


def resumed_history(path: Path, resumed_step: int | None) -> list[dict[str, Any]]:
    """The history entries a run resumed from ``checkpoint-<resumed_step>`` keeps from the killed attempt (steps up
    to ``resumed_step``; later ones were logged after that checkpoint and are trained again), and the file rewritten
    to hold just those. A fresh run (``resumed_step`` None) starts an empty file.

    Raises:
        ValueError: a line of the file is not JSON, naming the file and line.
    """
    kept = [] if resumed_step is None else records_up_to_step(path, resumed_step)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(dumps_strict(e) + "\n" for e in kept))
    return kept


def step_record(step: int, logs: dict[str, Any], rollouts: dict[str, Any], n_completions: int) -> dict[str, Any]:
    """One entry of ``metrics.history``: the step, TRL's step metrics (:data:`STEP_KEYS` and ``rewards/*``) and the
    first ``n_completions`` completions of the latest rollout with their rewards and advantage.

    Args:
        rollouts: TRL's ``trainer._logs`` (``prompt``, ``completion``, ``rewards`` name -> values, ``advantages``;
            the latest generation batch, gathered from every process).
    """
    out: dict[str, Any] = {"step": step}
    out.update({k: logs[k] for k in STEP_KEYS if k in logs})
    out.update({k: v for k, v in logs.items() if k.startswith("rewards/")})
    prompts, completions = list(rollouts["prompt"]), list(rollouts["completion"])
    rewards = {name: list(v) for name, v in rollouts["rewards"].items()}
    advantages = list(rollouts["advantages"])
    out["completions"] = [
        {"prompt": _text(prompts[i]), "completion": _text(completions[i]),
         "rewards": {name: float(v[i]) for name, v in rewards.items() if i < len(v)},
         **({"advantage": float(advantages[i])} if i < len(advantages) else {})}
        for i in range(min(n_completions, len(completions)))
    ]
    return out


def check_reference(trainer, pi_ref: str) -> dict[str, Any]:
    """Compare the trainer's reference model with pi_ref's weight files, tensor by tensor (exact, after casting the
    file's tensor to the dtype the reference holds, as loading does). Files are read one tensor at a time; under
    ZeRO-3 each sharded parameter is gathered alone (``deepspeed.zero.GatheredParameters``), so no rank holds a whole
    extra copy.

    Returns:
        ``{"reference": pi_ref, "reference_tensors": n}``, the number of tensors compared.

    Raises:
        RuntimeError: a tensor of pi_ref's files is missing from the reference or differs, naming it (the
            reference is not pi_ref: KL would be taken to another model).
    """
    import contextlib

    import torch
    from safetensors import safe_open

    ref = trainer.accelerator.unwrap_model(trainer.ref_model)
    held = {**dict(ref.named_parameters(remove_duplicate=False)), **dict(ref.named_buffers(remove_duplicate=False))}
    files = sorted(Path(pi_ref).glob("*.safetensors"))
    if not files:
        raise RuntimeError(f"{pi_ref}: no .safetensors weights to check the reference model against")
    n = 0
    for f in files:
        with safe_open(str(f), framework="pt") as weights:
            for name in weights.keys():
                mine = held.get(name)
                gather = contextlib.nullcontext()
                if mine is not None and hasattr(mine, "ds_id"):  # a ZeRO-3 shard: gather this one parameter
                    import deepspeed

                    gather = deepspeed.zero.GatheredParameters([mine], modifier_rank=None)
                with gather:
                    tensor = weights.get_tensor(name)
                    same = (mine is not None and mine.shape == tensor.shape
                            and torch.equal(mine.detach().cpu(), tensor.to(mine.dtype)))
                if not same:
                    raise RuntimeError(f"the reference model is not pi_ref ({pi_ref}): tensor {name} "
                                       f"{'missing' if mine is None else 'differs'}")
                n += 1
    return {"reference": str(pi_ref), "reference_tensors": n}


def reward_functions(args: OnlineRLArguments, reward_model, reward_tokenizer,
                     given: dict[str, Any] | None = None) -> tuple[list, list]:
    """``(reward_funcs, reward_processing_classes)`` for TRL, in ``args.reward_functions`` order; ``given``: reward
    functions built by the stage (name -> TRL reward function), e.g. the judge reward (``judging.online_reward``,
    which sits above this package).

    Raises:
        ValueError: a named function that must be given (``judge``) is not.
    """
    from trl.rewards import get_repetition_penalty_reward, get_soft_overlong_punishment

    funcs, tokenizers = [], []
    for name in args.reward_functions:
        if name in (given or {}):
            funcs.append(given[name])
            tokenizers.append(None)
        elif name == "judge":
            raise ValueError("reward function 'judge' is built by the stage (judging.online_reward); none was given")
        elif name == "reward_model":
            funcs.append(reward_model)
            tokenizers.append(reward_tokenizer)
        elif name == "repetition_penalty":
            funcs.append(get_repetition_penalty_reward(ngram_size=3, max_penalty=-1.0))
            tokenizers.append(None)
        else:  # soft_overlong
            funcs.append(get_soft_overlong_punishment(args.max_completion_length,
                                                      max(1, args.max_completion_length // 4)))
            tokenizers.append(None)
    return funcs, tokenizers


def rollout_efficiency(trainer, result, timer, dtype: str) -> dict[str, Any]:
    """Tokens/s and MFU of an online-RL run (see the module docstring for what is counted).

    Returns:
        :func:`rlhf.efficiency.efficiency`'s dict plus ``rollout_tokens`` (prompt + completion tokens sampled),
        ``num_iterations``, ``train_seconds`` and the step timer's ``first_step_seconds`` /
        ``steady_step_seconds``.
    """
    from .efficiency import efficiency, n_parameters

    seconds = float(result.metrics.get("train_runtime", 0.0))
    rollout_tokens = int(trainer.state.num_input_tokens_seen or 0)
    iterations = int(getattr(trainer.args, "num_iterations", 1) or 1)
    model = trainer.accelerator.unwrap_model(trainer.model)
    out = efficiency(n_parameters(model), rollout_tokens * iterations, seconds, dtype)
    out.update(rollout_tokens=rollout_tokens, num_iterations=iterations, train_seconds=seconds, **timer.summary())
    logger.info("efficiency: %.0f tokens/s, MFU %.2f%% (%s), %d rollout tokens", out["tokens_per_s"],
                100 * (out["mfu"] or 0), out["peak_source"], rollout_tokens)
    return out


def run_online_rl(
    stage: TrainerStage,
    trainer_class: type,
    inputs: dict[str, Any],
    prompts: list[str],
    data: TrainingData,
    callbacks: list | None = None,
    references: list[str] | None = None,
    rewards: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Load the policy (the DPO candidate), the reward model and the tokenizers, train ``trainer_class`` (TRL's
    ``GRPOTrainer`` or ``RLOOTrainer``) with pi_ref as its reference, verify pi_ref's hash after training, and save
    and record as every TRL-based stage does (:meth:`TrainerStage.finish`).

    Args:
        inputs: :func:`resolve_inputs` plus ``ppo_unlock`` (the decision dict the stage runs under).
        prompts: user prompts (each becomes a one-turn conversation TRL renders with the chat template).
        data: the prompts' record (fingerprint, rejects, decontamination).
        callbacks: ``transformers.TrainerCallback`` instances added to the trainer (beside the stage's own resume,
            timing and W&B callbacks), e.g. reward-hacking tripwires. One with a ``bind(trainer)`` method is given
            the trainer once it is built; one with ``manifest_section`` (a str) and ``manifest_record()`` has that
            record written in the manifest under that key after training; one whose ``stopped_training`` is True
            after training ended the run before ``max_steps`` on purpose (else that is refused).
        references: each prompt's reference answer, shape (len(prompts),): the dataset's ``reference`` column, which
            TRL passes to every reward function (the judge reward reads it); None: no such column.
        rewards: reward functions the stage built (:func:`reward_functions`' ``given``); one with ``record()`` has
            it written in the manifest under ``metrics.reward_records.<name>``.

    Returns:
        The manifest's ``metrics`` on rank 0 (as :meth:`TrainerStage.finish`).

    Raises:
        RuntimeError: pi_ref moved during training, or the reference model is not pi_ref.
    """
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    from .efficiency import StepTimer
    from .resume import CHECKPOINT_RE, ResumeCallback, check_finished, resolve_resume, training_record
    from .trainer_stage import Trained
    from .tracking import add_config
    from .weights import load_checked

    args = stage.args
    args.model_name_or_path = inputs["policy"]  # what the W&B config and the manifest name as the trained model
    add_config({"pi_ref_hash": inputs["pi_ref_hash"], "policy_hash": inputs["policy_hash"]})
    tokenizer = AutoTokenizer.from_pretrained(inputs["policy"])
    reward_tokenizer = AutoTokenizer.from_pretrained(inputs["reward_model"])
    for tok in (tokenizer, reward_tokenizer):
        if tok.pad_token_id is None:  # padding is masked by position in TRL's losses, so pad == eos is safe
            tok.pad_token = tok.eos_token
    policy = load_checked(AutoModelForCausalLM, inputs["policy"], what="online-RL policy (DPO candidate)",
                          dtype=stage.weights_dtype, trained=True)
    reward_model = load_checked(AutoModelForSequenceClassification, inputs["reward_model"], what="reward model",
                                dtype=stage.weights_dtype)
    if reward_model.config.num_labels != 1:
        raise ValueError(f"{inputs['reward_model']}: expected a 1-label sequence classifier, got num_labels="
                         f"{reward_model.config.num_labels}")
    # as judging.scoring.load_reward_model: transformers' pooling finds the last non-pad token with this id
    reward_model.config.pad_token_id = reward_tokenizer.pad_token_id
    funcs, reward_tokenizers = reward_functions(args, reward_model, reward_tokenizer, rewards)
    if references is not None and len(references) != len(prompts):
        raise ValueError(f"{len(references)} reference answers for {len(prompts)} prompts")
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": p}],
                                  **({"reference": references[i]} if references is not None else {})}
                                 for i, p in enumerate(prompts)])
    timer = StepTimer()
    trainer = stage.attach(pi_ref_trainer(trainer_class)(
        pi_ref=inputs["pi_ref"],
        reward_names=list(args.reward_functions),
        manifest_completions=args.manifest_completions,
        model=policy,
        reward_funcs=funcs,
        reward_processing_classes=reward_tokenizers,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        # the stage's own callbacks first, then the caller's (tripwires, ...)
        callbacks=[ResumeCallback(), timer, *(callbacks or [])],
    ))
    reference = check_reference(trainer, inputs["pi_ref"])
    for cb in callbacks or []:
        if hasattr(cb, "bind"):
            cb.bind(trainer)

    resumed_from = resolve_resume(args, trainer.model)
    if trainer.accelerator.is_main_process:
        match = CHECKPOINT_RE.match(Path(resumed_from).name) if resumed_from else None
        resumed_step = int(match.group(1)) if match else None
        trainer.history = resumed_history(stage.out / HISTORY_FILE, resumed_step)
        trainer.history_path = stage.out / HISTORY_FILE
    result = trainer.train(resume_from_checkpoint=resumed_from)
    # a callback that stopped training on purpose (a tripwire's trip) ends the run before max_steps; any other
    # early end is refused
    if not any(getattr(cb, "stopped_training", False) for cb in callbacks or []):
        check_finished(trainer, resumed_from)
    verify_hash(inputs["pi_ref"], inputs["pi_ref_hash"], when="after training")
    trained = Trained(trainer, result, training_record(trainer, resumed_from, result),
                      rollout_efficiency(trainer, result, timer, precision_name(args)))
    history = trainer.history
    last = history[-1] if history else {}
    table = [{"step": h["step"], **{k: v for k, v in c.items() if k != "rewards"}, **c["rewards"]}
             for h in history for c in h["completions"]]
    return stage.finish(
        trained,
        tokenizer,
        data=data,
        inputs={k: v for k, v in inputs.items() if not k.startswith("_")},
        metrics={
            "n_prompts": len(prompts),
            "reward_functions": list(args.reward_functions),
            "reward_weights": list(args.reward_weights) if args.reward_weights else [1.0] * len(funcs),
            "beta": args.beta,
            "num_generations": args.num_generations,
            "pi_ref_unchanged": True,  # verify_hash raised otherwise
            **({"reward_records": records} if (records := {n: f.record() for n, f in (rewards or {}).items()
                                                           if hasattr(f, "record")}) else {}),
            **reference,
            **{f"last_{k}": v for k, v in last.items() if k not in ("step", "completions")},
            "history": history,
        },
        table={"completions": table} if table else None,
        extra={cb.manifest_section: cb.manifest_record() for cb in callbacks or []
               if hasattr(cb, "manifest_section")},
    )
