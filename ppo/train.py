"""PPO stage entry point: resolve the round's inputs, verify pi_ref, train, save, write the manifest.

    accelerate launch -m ppo.train --config recipes/<preset>/ppo.yaml --output_dir <round>/ppo \\
        --sft_dir <round>/sft --policy_dir <round>/dpo --reward_model_dir <round>/reward_model --round_id <id>

Configuration layers: dataclass defaults < YAML (``--config``) < CLI ``--key value``. Keys are the fields of
:class:`ppo.config.PPOScriptArguments` and :class:`ppo.config.PPOConfig`; an unknown key in the YAML or on the
command line is an error (``trl.TrlParser``).

Inputs come from the stage directories' manifests (``rlhf.manifest.read_manifest``): pi_ref and its content hash
from SFT's ``outputs.pi_ref`` / ``outputs.pi_ref_hash``, the initial policy from DPO's ``outputs.checkpoint``,
the reward model from the RM stage's ``outputs.checkpoint``. The PPO unlock decision must say unlocked: the flow's
(``--ppo_unlock_json``, which carries a recorded override), or else the rule applied to the RM stage's recorded
measurements (``judging.unlock.decide_from_metrics``).
Explicit paths (``--ref_path``, ``--policy_path``, ``--reward_model_path``) serve standalone runs.
pi_ref's content hash is verified (``rlhf.checkpoint.verify_hash``) before anything is loaded and after training.

Outputs (main process):
    ``output_dir/checkpoint/``   the trained policy and tokenizer (``rlhf.checkpoint.save_checkpoint``: temp dir,
                                 empty-tensor check, rename)
    ``output_dir/manifest.json`` lineage as every stage writes it (stage, round_id, inputs with their hashes,
                                 config_hash, code_version, precision, outputs.checkpoint + checkpoint_hash,
                                 metrics with the per-step history and ``efficiency`` (tokens/s, MFU:
                                 ``PPOTrainer.efficiency``), ``training`` (resumed_from, resumed_from_step, ...));
                                 written last, atomically
    ``output_dir/checkpoint-<step>/`` resume checkpoints every ``save_steps`` (``PPOTrainer.save_state``), removed
                                 once the manifest is written
    manifest ``tripwire``        the reward-hacking tripwire (``judging.tripwires``, ``PPOTrainer.tripwire_check``):
                                 every check's signals, the trips (signal, step, values), the restored step and the
                                 best step by gold; None when off or the run makes no check. After a trip the saved
                                 checkpoint is the policy of the last passing check. The gold scorer is
                                 ``--tripwire_gold_model_path`` (a second reward model), the slice
                                 ``--tripwire_prompts_data`` (default: the first training prompts)

Resume: ``--resume_from_checkpoint <path | last>`` (the flow passes the newest complete checkpoint when it reruns
a killed stage with the same inputs, ``flows.stages.run_stage``) is checked by ``rlhf.resume.resolve_resume``
(files, sha256 completion marker, shapes, world size) and restored by ``PPOTrainer.load_state``.

Tracking: with ``report_to: [wandb]``, ``rlhf.tracking.setup_wandb`` (offline unless configured, run "ppo",
group = round_id, under output_dir) and one W&B run that gets every step's metrics, then the summary
(``rlhf.tracking.log_summary``).
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from accelerate import InitProcessGroupKwargs
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
)

from data.fingerprint import data_fingerprint, local_path
from data.loaders import load_chat_prompts
from judging.unlock import require_unlocked
from ppo.config import PPOConfig, PPOScriptArguments
from ppo.trainer import TRIPWIRE_SNAPSHOT, Callback, PPOTrainer
from rlhf.checkpoint import verify_hash, written_hash
from rlhf.config import parse_stage_config
from rlhf.distributed import init_state
from rlhf.efficiency import summary as efficiency_summary
from rlhf.entrypoint import setup_stage, setup_tracking
from rlhf.lineage import content_hash
from rlhf.manifest import MANIFEST_NAME, read_manifest, stage_manifest
from rlhf.precision import (
    AutocastProbe,
    accelerate_mixed_precision,
    check_precision,
    precision_record,
    stage_accelerator,
    weight_dtypes,
)
from rlhf.resume import prune_trainer_checkpoints, refused_checkpoints, resolve_resume
from rlhf.rundir import install_failure_hook
from rlhf.tracking import ReferenceArtifact, dataset_artifact, init_run, log_summary, producer_artifact, wandb_run_id

logger = logging.getLogger("ppo.train")

CHECKPOINT_NAME = "checkpoint"


def parse_args(argv: Sequence[str] | None = None) -> tuple[PPOScriptArguments, PPOConfig]:
    """Strict parse of ``--config file.yaml`` and ``--key value`` overrides (unknown keys are errors)."""
    script_args, config = parse_stage_config((PPOScriptArguments, PPOConfig), list(argv) if argv is not None else None)
    return script_args, config


# ---- inputs -----------------------------------------------------------------------------------------


def _stage_output(stage_dir: str, key: str, what: str) -> tuple[dict[str, Any], str]:
    """``outputs[key]`` of the manifest in ``stage_dir``, with the manifest. Errors name the directory."""
    manifest = read_manifest(stage_dir)
    value = manifest.get("outputs", {}).get(key)
    if not value:
        raise ValueError(f"{Path(stage_dir) / MANIFEST_NAME}: no outputs.{key} ({what})")
    return manifest, value


def _checked_hash(path: str, manifest: dict[str, Any] | None, what: str) -> str:
    """Content hash of a parent checkpoint; equal to the one its stage recorded, if it recorded one."""
    actual = content_hash(path)
    recorded = (manifest or {}).get("outputs", {}).get("checkpoint_hash")
    if recorded and recorded != actual:
        raise RuntimeError(f"{what} at {path} changed since its stage finished: manifest says {recorded}, "
                           f"found {actual}")
    return actual


def resolve_inputs(script_args: PPOScriptArguments) -> dict[str, Any]:
    """Paths and hashes of pi_ref, the initial policy, the reward model and the value model's start.

    Returns:
        ``{"pi_ref", "pi_ref_hash", "policy", "policy_hash", "reward_model", "reward_model_hash",
        "value_model_init", "value_model_init_hash", "ppo_unlock", "*_manifest"}``; manifest entries are the
        stage directories read (None for explicit paths).

    Raises:
        FileNotFoundError: a stage directory has no manifest (the stage did not finish).
        ValueError: a manifest lacks the needed output.
        RuntimeError: the unlock decision says PPO is locked, or a parent checkpoint changed since its stage.
    """
    script_args.check_complete()
    out: dict[str, Any] = {}
    if script_args.sft_dir:
        sft = read_manifest(script_args.sft_dir)
        outputs = sft.get("outputs", {})
        if not outputs.get("pi_ref") or not outputs.get("pi_ref_hash"):
            raise ValueError(f"{Path(script_args.sft_dir) / MANIFEST_NAME}: no outputs.pi_ref / outputs.pi_ref_hash")
        out.update(pi_ref=outputs["pi_ref"], pi_ref_hash=outputs["pi_ref_hash"],
                   sft_manifest=str(Path(script_args.sft_dir).resolve()))
    else:
        ref = str(Path(script_args.ref_path).resolve())
        expected = script_args.ref_hash
        if not expected:
            expected = content_hash(ref)
            logger.warning("pi_ref %s given by path without --ref_hash: its hash %s is taken now, not checked "
                           "against the SFT stage's record", ref, expected[:16])
        out.update(pi_ref=ref, pi_ref_hash=expected, sft_manifest=None)

    if script_args.policy_dir:
        manifest, policy = _stage_output(script_args.policy_dir, "checkpoint", "the initial policy")
        out.update(policy=policy, policy_hash=_checked_hash(policy, manifest, "the initial policy"),
                   policy_manifest=str(Path(script_args.policy_dir).resolve()))
    else:
        policy = str(Path(script_args.policy_path).resolve())
        out.update(policy=policy, policy_hash=content_hash(policy), policy_manifest=None)

    if script_args.reward_model_dir:
        manifest, rm = _stage_output(script_args.reward_model_dir, "checkpoint", "the reward model")
        unlock = require_unlocked(script_args.ppo_unlock_json, manifest.get("metrics", {}), stage="ppo",
                                  rm_manifest=str(Path(script_args.reward_model_dir) / MANIFEST_NAME))
        out.update(reward_model=rm, reward_model_hash=_checked_hash(rm, manifest, "the reward model"),
                   reward_model_manifest=str(Path(script_args.reward_model_dir).resolve()), ppo_unlock=unlock)
    else:
        rm = str(Path(script_args.reward_model_path).resolve())
        out.update(reward_model=rm, reward_model_hash=content_hash(rm), reward_model_manifest=None, ppo_unlock=None)

    if script_args.value_model_path:
        value = str(Path(script_args.value_model_path).resolve())
        out.update(value_model_init=value, value_model_init_hash=content_hash(value))
    else:
        out.update(value_model_init=out["reward_model"], value_model_init_hash=out["reward_model_hash"])
    return out


def load_prompt_source(script_args: PPOScriptArguments, output_dir: Path) -> tuple[list[Any], str, int]:
    """The training prompts, their source string (for ``data_fingerprint``) and the number of rejected rows.

    ``--prompts_data`` goes through ``data.loaders.load_eval_prompts`` (user strings; strict or lenient with
    rejects written to ``output_dir/rejects-prompts.jsonl``); ``--prompts_path`` through :func:`data.loaders.load_chat_prompts`.
    """
    if script_args.prompts_data:
        from data.loaders import load_eval_prompts

        rows = load_eval_prompts(script_args.prompts_data, mode=script_args.data_mode,
                                 max_reject_rate=script_args.max_reject_rate,
                                 rejects_path=output_dir / "rejects-prompts.jsonl", limit=script_args.max_prompts)
        return [r.prompt for r in rows], script_args.prompts_data, len(rows.rejects)
    prompts = load_chat_prompts(script_args.prompts_path)
    if script_args.max_prompts:
        prompts = prompts[: script_args.max_prompts]
    return prompts, script_args.prompts_path, 0


# ---- models -----------------------------------------------------------------------------------------


def _load(cls: Any, path: str, what: str, trained: bool = False) -> torch.nn.Module:
    """Load a model in fp32 (autocast handles bf16 where the device has it) and refuse an incomplete one (weight
    files checked against the config first: rlhf.weights.check_weight_files); a ``trained`` one is copied out of the
    checkpoint's file mapping (rlhf.weights.into_process_memory)."""
    from rlhf.weights import IncompleteCheckpoint, check_weight_files, into_process_memory

    if os.path.isdir(path):
        try:
            check_weight_files(cls, path, what=what)
        except IncompleteCheckpoint as err:  # PPO's loader reports ValueError, as before
            raise ValueError(f"{what} at {path}: weights missing from the checkpoint or unusable: {err}") from None
    model, info = cls.from_pretrained(path, dtype=torch.float32, output_loading_info=True)
    missing = list(info.get("missing_keys") or [])
    if missing:
        raise ValueError(f"{what} at {path}: weights missing from the checkpoint (would be random): {missing[:5]}")
    empty = [n for n, p in model.named_parameters() if p.numel() == 0]
    if empty:
        raise ValueError(f"{what} at {path}: empty tensors in the checkpoint: {empty[:5]}")
    return into_process_memory(model) if trained else model


def tripwire_inputs(config: PPOConfig, reward_model_hash: str, device: Any = "cpu") -> dict[str, Any]:
    """The tripwire's slice and gold scorer from the config: ``{"prompts": list | None (None: the first training
    prompts), "gold_scorer": GoldScorer | None, "record": what the manifest says of them}``.

    The gold scorer is the second reward model of ``--tripwire_gold_model_path``, scored as the reward-model stage
    scores (``judging.scoring.score``) on ``device``, frozen; it is refused when it is the optimised reward model
    (same content hash). ``record`` also goes to the manifest's inputs (lineage: the gold model's and the slice's
    hashes).
    """
    from judging.gold_scorer import load_gold_scorer

    out: dict[str, Any] = {"prompts": None, "gold_scorer": None,
                           "record": {"prompts_data": config.tripwire_prompts_data, "prompts_data_hash": None,
                                      "gold_model": None, "gold_model_hash": None}}
    if not config.tripwire_steps or config.num_steps < config.tripwire_steps:
        return out
    if config.tripwire_prompts_data:
        from data.loaders import load_eval_prompts

        rows = load_eval_prompts(config.tripwire_prompts_data, limit=config.tripwire_n_prompts)
        out["prompts"] = [r.prompt for r in rows]
        out["record"]["prompts_data_hash"] = data_fingerprint(config.tripwire_prompts_data)
    out["gold_scorer"], gold_record = load_gold_scorer(
        config.tripwire_gold_model_path, reward_model_hash, device=device, batch_size=config.micro_batch_size,
        max_length=config.reward_max_length)
    out["record"].update(gold_record)
    return out


def _tokenizer(path: str) -> Any:
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:
        # padding is masked by position everywhere, so pad == eos is safe here
        tokenizer.pad_token = tokenizer.eos_token
        logger.info("tokenizer of %s has no pad token; using eos %r as pad", path, tokenizer.eos_token)
    return tokenizer


def load_models(inputs: dict[str, Any]) -> dict[str, Any]:
    """Tokenizers (policy's; reward model's own), policy, pi_ref, reward and value models, as separate objects."""
    tokenizer = _tokenizer(inputs["policy"])
    reward_tokenizer = _tokenizer(inputs["reward_model"])
    policy = _load(AutoModelForCausalLM, inputs["policy"], "policy", trained=True)
    ref = _load(AutoModelForCausalLM, inputs["pi_ref"], "pi_ref")
    reward = _load(AutoModelForSequenceClassification, inputs["reward_model"], "reward model")
    value = _load(AutoModelForSequenceClassification, inputs["value_model_init"], "value model", trained=True)
    for name, m in (("reward model", reward), ("value model", value)):
        if m.config.num_labels != 1:
            raise ValueError(f"{name}: expected a 1-label sequence classifier, got num_labels={m.config.num_labels}")
    # as judging.scoring.load_reward_model: transformers' pooling finds the last non-pad token with this id
    reward.config.pad_token_id = reward_tokenizer.pad_token_id
    value.config.pad_token_id = tokenizer.pad_token_id
    return {"tokenizer": tokenizer, "reward_tokenizer": reward_tokenizer, "policy": policy, "ref": ref,
            "reward": reward, "value": value}


# ---- tracking ---------------------------------------------------------------------------------------


class WandbCallback:
    """Logs each step's metrics to the stage's W&B run (environment set by ``rlhf.tracking.setup_wandb``).

    The run stays open after training so that ``rlhf.tracking.log_summary`` writes the summary to it and
    finishes it; :meth:`close` finishes it if that did not happen (an error).
    """

    def __init__(self, config: dict[str, Any]):
        self.config = config
        self.run = None

    def __call__(self, step: int, metrics: dict[str, float]) -> None:
        import wandb

        if self.run is None:
            self.run = wandb.run or init_run(job_type="ppo", config=self.config)
        self.run.log(metrics, step=step)

    def close(self) -> None:
        import wandb

        if self.run is not None and wandb.run is self.run:  # log_summary finishes it on success
            self.run.finish()
        self.run = None


def _close(callbacks: Sequence[Callback]) -> None:
    for cb in callbacks:
        close = getattr(cb, "close", None)
        if callable(close):
            close()


def _versions() -> dict[str, str]:
    import accelerate
    import transformers
    import trl

    return {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__,
            "accelerate": accelerate.__version__}


# ---- main -------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None, callbacks: Sequence[Callback] | None = None) -> dict[str, Any]:
    """Run the PPO stage; returns the manifest (also written to ``output_dir/manifest.json``).

    Raises:
        RuntimeError: pi_ref's content hash differs from the SFT record (before training: nothing is loaded) or
            moved during training; PPO is locked by the reward-model stage; a parent checkpoint changed.
    """
    script_args, config = parse_args(argv)
    install_failure_hook(config.output_dir)  # the flow reads the reason, whatever the exception
    # logging, RLHF_EXPECTED_WORLD_SIZE and RLHF_COLLECTIVE_TIMEOUT_S, before anything loads; W&B once inputs check
    launch = setup_stage("ppo", config, tracking=False)
    started = time.time()
    output_dir = Path(config.output_dir)
    inputs = resolve_inputs(script_args)
    verify_hash(inputs["pi_ref"], inputs["pi_ref_hash"], when="before training")

    if launch["world_size"] > 1:
        # the process group first (gloo on CPU, NCCL on GPU): without cpu=True accelerate's Accelerator sees one
        # process on a multi-CPU launch, and every rank would train alone, with its own token counts
        init_state(launch["collective_timeout_s"])
    accelerator = stage_accelerator(
        accelerate_mixed_precision(config.precision),
        kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=launch["collective_timeout_s"]))],
    )
    if accelerator.is_main_process:
        output_dir.mkdir(parents=True, exist_ok=True)
    run_config = {**asdict(script_args), **asdict(config)}
    use_wandb = "wandb" in config.report_to
    setup_tracking("ppo", config, round_id=script_args.round_id)

    prompts, prompts_source, n_rejected = load_prompt_source(script_args, output_dir)
    models = load_models(inputs)
    tripwire = tripwire_inputs(config, inputs["reward_model_hash"], accelerator.device)
    all_callbacks = ([WandbCallback(run_config)] if use_wandb else []) + list(callbacks or [])
    try:
        trainer = PPOTrainer(
            config=config,
            policy=models["policy"],
            ref_model=models["ref"],
            reward_model=models["reward"],
            value_model=models["value"],
            tokenizer=models["tokenizer"],
            reward_tokenizer=models["reward_tokenizer"],
            prompts=prompts,
            accelerator=accelerator,
            callbacks=all_callbacks,
            tripwire_prompts=tripwire["prompts"],
            gold_scorer=tripwire["gold_scorer"],
        )
        precision = {"no": "fp32"}.get(trainer.mixed_precision, trainer.mixed_precision)
        # fp32 master weights for all four models (bf16/fp16 are autocast), and the autocast the accelerator applies
        weighed = {"policy": models["policy"], "ref_model": models["ref"], "reward_model": models["reward"],
                   "value_model": models["value"]}
        check_precision("ppo", precision, weighed, trainer.mixed_precision)
        loaded = {what: weight_dtypes(m) for what, m in weighed.items()}
        probe = AutocastProbe(models["policy"])  # the autocast of the first training-mode forward of the policy
        # --resume_from_checkpoint (a path, or 'last'; the flow passes the newest complete one when it reruns an
        # unfinished stage): checked (files, sha256 marker, shapes, world size, step < num_steps), then restored
        resume_args = SimpleNamespace(resume_from_checkpoint=config.resume_from_checkpoint,
                                      output_dir=config.output_dir, max_steps=config.num_steps,
                                      world_size=accelerator.num_processes)
        resumed_from = resolve_resume(resume_args, accelerator.unwrap_model(trainer.model))
        if resumed_from is not None:
            config.resume_from_checkpoint = run_config["resume_from_checkpoint"] = resumed_from
            trainer.load_state(resumed_from)
        train_started = time.time()
        history = trainer.train()  # raises if pi_ref or the reward model moved in memory
        train_seconds = time.time() - train_started
        verify_hash(inputs["pi_ref"], inputs["pi_ref_hash"], when="after training")
        checkpoint = trainer.save_policy(output_dir / CHECKPOINT_NAME)
    except BaseException:
        _close(all_callbacks)
        raise

    precision_dtypes = precision_record("ppo", precision, loaded, weighed, probe)
    efficiency = trainer.efficiency(train_seconds, precision)
    final = history[-1] if history else {}
    metrics: dict[str, Any] = {
        **final,
        "num_steps": len(history),
        "n_prompts": len(prompts),
        "n_prompts_rejected": n_rejected,
        "seconds_train": train_seconds,  # this run's (a resumed run: the steps after the checkpoint)
        "seconds_per_step": train_seconds / max(trainer.global_step - (trainer.resumed_from_step or 0), 1),
        "seconds_total": time.time() - started,
        "num_processes": accelerator.num_processes,
        "threads": torch.get_num_threads(),  # shows the flow's --num_cpu_threads_per_process reached the stage
        "efficiency": efficiency,
        "pi_ref_unchanged": True,  # verify_hash raised otherwise
        "tripwire_tripped": bool(trainer.tripwire and trainer.tripwire.tripped),
        "history": history,
    }
    inputs = {**inputs, "prompts_data": prompts_source, "prompts_data_hash": data_fingerprint(prompts_source),
              **{f"tripwire_{k}": v for k, v in tripwire["record"].items() if v is not None}}
    outputs: dict[str, Any] = {"checkpoint": str(checkpoint.resolve()), "checkpoint_hash": None}
    manifest: dict[str, Any] = {"outputs": outputs}
    tripwire_record = trainer.tripwire_record()
    if tripwire_record is not None:
        tripwire_record.update(tripwire["record"])
    if accelerator.is_main_process:
        outputs["checkpoint_hash"] = written_hash(checkpoint)
        training = {
            "resumed_from": trainer.resumed_from,
            "resumed_from_step": trainer.resumed_from_step,
            "steps_this_run": trainer.global_step - (trainer.resumed_from_step or 0),
            "global_step": trainer.global_step,
            "max_steps": config.num_steps,
            "save_steps": config.save_steps,
            "save_total_limit": config.save_total_limit,
            "wandb_run_id": wandb_run_id(),
            # resume checkpoints that failed their checks and were kept aside (rlhf.resume.set_aside), with why
            "refused_checkpoints": refused_checkpoints(output_dir),
        }
        path = stage_manifest("ppo", SimpleNamespace(**run_config), inputs=inputs, outputs=outputs, metrics=metrics,
                              precision=precision,
                              extra={"versions": _versions(), "precision_dtypes": precision_dtypes,
                                     "training": training, "tripwire": tripwire_record})
        prune_trainer_checkpoints(output_dir)  # resume state only; after the manifest, so a kill before it keeps them
        shutil.rmtree(output_dir / TRIPWIRE_SNAPSHOT, ignore_errors=True)  # the saved checkpoint holds what it had
        manifest = read_manifest(output_dir)
        logger.info("PPO done: %d steps, checkpoint %s, manifest %s", len(history), checkpoint, path)
        if use_wandb:  # lineage: the checkpoints and prompts read, the policy written (W&B artifacts by reference)
            read = [producer_artifact(inputs[k], inputs.get(f"{k}_hash"))
                    for k in ("pi_ref", "policy", "reward_model", "value_model_init")
                    if isinstance(inputs.get(k), str) and inputs[k]]
            read.append(dataset_artifact(prompts_source, local_path(prompts_source), inputs["prompts_data_hash"]))
            written = [ReferenceArtifact("ppo-checkpoint", "model", outputs["checkpoint"], outputs["checkpoint_hash"],
                                         {"stage": "ppo", "round_id": script_args.round_id})]
            log_summary({**{k: v for k, v in metrics.items() if not isinstance(v, (dict, list))},
                         **efficiency_summary(efficiency)}, report_to=config.report_to, inputs=read, outputs=written)
    _close(all_callbacks)
    accelerator.wait_for_everyone()
    return manifest


if __name__ == "__main__":
    main(sys.argv[1:])
