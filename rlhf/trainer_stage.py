"""The skeleton of a TRL-based training stage (SFT, DPO, the reward model), so that each stage's ``main()`` holds
only what the stage does differently, and reads like TRL's own scripts (``trl/scripts/dpo.py``):

    stage = TrainerStage.start("dpo", DPOStageConfig, argv)     # parse, failure hook, logging, launch, W&B, seed
    rows = load_pairs(stage.args.train_data, **stage.load_options())   # the stage's data, its own loader
    model = load_checked(AutoModelForCausalLM, path, what=..., dtype=stage.weights_dtype)  # fp32 master weights
    trainer = stage.attach(DPOTrainer(model=model, train_dataset=..., **stage.trainer_kwargs(tokenizer)))
    trained = stage.train(trainer, length_of=...)                # resume, train, check finished, efficiency
    return stage.finish(trained, tokenizer, data=TrainingData(...), inputs=..., metrics=...)

:meth:`TrainerStage.finish` gathers the weights on every rank (a collective under ZeRO-3), then only rank 0
saves the checkpoint, runs the stage's ``publish`` step (SFT's frozen pi_ref, the reward model's held-out
agreement), logs the summary, writes the manifest and prunes the Trainer checkpoints. The other ranks write
nothing there.

:meth:`TrainerStage.attach` makes the trainer train and log as the manifest will say: it refuses models whose
weights are not the fp32 master weights the resolved precision implies, or an accelerator whose autocast differs
(``rlhf.precision.check_precision``), measures the autocast of the first training forward, and logs to W&B at the
trainer's global step (:class:`StepWandbCallback`), so a resumed stage's history continues at the step it resumed
from.

The return contract of every such stage's ``main()``: rank 0 returns the ``metrics`` it wrote to the manifest;
every other rank returns ``{"train_loss", "train_steps", "rank"}``.

Nothing here imports ``data`` or ``judging`` (they sit above this package): loading, decontaminating and
preparing rows, and the data fingerprints of the manifest's inputs, are the stage's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers.integrations import WandbCallback
from transformers.integrations.integration_utils import rewrite_logs

from .checkpoint import gather_full_state_dict, save_checkpoint, written_hash
from .config import parse_stage_config, peft_config
from .efficiency import count_tokens, group_by_length, summary, train_efficiency
from .entrypoint import setup_stage
from .manifest import precision_name, stage_manifest
from .precision import AutocastProbe, check_precision, precision_record, weight_dtypes, weights_dtype
from .resume import ResumeCallback, check_finished, prune_trainer_checkpoints, resolve_resume, training_record
from .rundir import install_failure_hook
from .tracking import (TRANSACTION_LOG_FLUSH_S, ReferenceArtifact, artifact_name, dataset_artifact, init_run,
                       log_summary, producer_artifact)
from .training_health import check_loss, check_weights

logger = logging.getLogger(__name__)


def check_healthy(state, weights: dict[str, Any]) -> None:
    """Refuse to save the stage's model when the last logged loss or any weight is non-finite or exploded (the
    bounds of :mod:`rlhf.training_health`), naming the step.

    Raises:
        rlhf.training_health.TrainingDiverged
    """
    losses = [e["loss"] for e in state.log_history if "loss" in e]
    check_loss(losses[-1] if losses else None, state.global_step, state.log_history, what="trained model")
    check_weights(((k, v.detach()) for k, v in weights.items() if v.numel()), state.global_step,
                  what="trained model", collective=False)


@dataclass
class Trained:
    """What :meth:`TrainerStage.train` leaves for :meth:`TrainerStage.finish`."""

    trainer: Any
    result: Any  # transformers' TrainOutput
    training: dict[str, Any]  # rlhf.resume.training_record: how the run went (resume, steps, loss over every step)
    efficiency: dict[str, Any]  # rlhf.efficiency.train_efficiency


@dataclass
class TrainingData:
    """What every stage records about its training rows (``args.train_data``): the manifest's
    ``inputs.train_data_hash`` and ``outputs.decontamination``, ``metrics.n_data_rejected`` and ``n_rejected``."""

    fingerprint: str  # of args.train_data (data.fingerprint.data_fingerprint: the stage computes it)
    decontamination: dict[str, Any]  # data.decontamination.decontaminate_stage_rows's record
    n_data_rejected: int  # schema rejects (lenient mode), listed in rejects-data.jsonl
    n_rejected: int  # the stage's own rejects (tokenization, truncation), listed in rejects-<what>.jsonl
    path: str | None = None  # args.train_data's local file (data.fingerprint.local_path), its W&B artifact; None: hub


@dataclass
class Published:
    """What a stage's ``publish`` step adds once the checkpoint is saved (rank 0 only): manifest ``outputs`` and
    ``metrics``, entries merged into ``metrics.efficiency``, and W&B summary values and tables."""

    outputs: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    efficiency: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    table: dict[str, list[dict]] = field(default_factory=dict)


@dataclass
class TrainerStage:
    """One run of a TRL-based stage: its name (the registry's), its parsed config and its output folder."""

    name: str
    args: Any
    # set by attach(): the models' weight dtypes as loaded, and the probe measuring the training forward's autocast
    loaded_dtypes: dict[str, dict[str, int]] | None = field(default=None, init=False, repr=False)
    autocast_probe: AutocastProbe | None = field(default=None, init=False, repr=False)

    @property
    def out(self) -> Path:
        return Path(self.args.output_dir)

    @property
    def weights_dtype(self):
        """The dtype every model of the stage is loaded in (``rlhf.precision.weights_dtype``: fp32 master weights,
        whatever the precision; bf16/fp16 are autocast). Pass it to ``from_pretrained`` / ``load_checked``."""
        return weights_dtype(precision_name(self.args))

    @classmethod
    def start(cls, name: str, config_class: type, argv: list[str] | None = None) -> TrainerStage:
        """Parse the config strictly (``--config`` YAML < ``--key value``), install the failure hook, then logging,
        the launch check and W&B (``rlhf.entrypoint.setup_stage``), and seed everything before any module is built
        (a new score head or LoRA adapter is seeded too)."""
        from transformers import set_seed

        (args,) = parse_stage_config((config_class,), argv)
        install_failure_hook(args.output_dir)  # the flow reads the reason, whatever the exception
        setup_stage(name, args)
        set_seed(args.seed)
        return cls(name, args)

    def load_options(self) -> dict[str, Any]:
        """Keyword arguments of the training-data loaders (``data.loaders.load_sft`` / ``load_pairs``): validation
        mode and reject rate, the rejects file, the first ``max_train_samples`` valid rows."""
        args = self.args
        return {"mode": args.data_mode, "max_reject_rate": args.max_reject_rate,
                "rejects_path": self.out / "rejects-data.jsonl", "use_first": args.max_train_samples}

    def trainer_kwargs(self, tokenizer, **peft: Any) -> dict[str, Any]:
        """What every stage passes its TRL trainer: the config, the tokenizer, LoRA from the config (``peft``:
        ``rlhf.config.peft_config``'s ``task_type`` / ``modules_to_save``) and the callback that marks complete
        Trainer checkpoints (``rlhf.resume``)."""
        return {"args": self.args, "processing_class": tokenizer, "peft_config": peft_config(self.args, **peft),
                "callbacks": [ResumeCallback()]}

    def attach(self, trainer):
        """Check and instrument a just-built TRL trainer; call before anything runs it (DPO's step-0 evaluation).

        Refuses (``rlhf.precision.PrecisionMismatch``, one line) a ``model`` or ``ref_model`` holding weights in
        another dtype than :attr:`weights_dtype`, or an accelerator whose mixed precision is not the resolved
        precision; records the loaded dtypes for the manifest; hooks an ``AutocastProbe`` on the model; replaces
        transformers' W&B callback with :class:`StepWandbCallback`. Idempotent; :meth:`train` calls it if the stage
        did not. Returns ``trainer``.
        """
        if self.loaded_dtypes is not None:
            return trainer
        models = _trained_models(trainer)
        check_precision(self.name, precision_name(self.args), models, str(trainer.accelerator.mixed_precision))
        self.loaded_dtypes = {what: weight_dtypes(m) for what, m in models.items()}
        self.autocast_probe = AutocastProbe(trainer.model)
        use_step_wandb_callback(trainer)
        return trainer

    def train(self, trainer, length_of: Callable[[dict], int]) -> Trained:
        """Train on length-grouped batches (``length_of(row)``: a tokenized row's length), resuming from the
        checkpoint ``--resume_from_checkpoint`` names (checked: a missing or incomplete one is an error), and
        refuse a run that did not end at ``max_steps``. Every rank calls it."""
        self.attach(trainer)
        group_by_length(trainer, length_of)
        tokens = count_tokens(trainer)  # only the training batches from here on
        resumed_from = resolve_resume(self.args, trainer.model)
        result = trainer.train(resume_from_checkpoint=resumed_from)
        check_finished(trainer, resumed_from)
        training = training_record(trainer, resumed_from, result)
        efficiency = train_efficiency(trainer, result, tokens, precision_name(self.args))
        return Trained(trainer, result, training, efficiency)

    def finish(
        self,
        trained: Trained,
        tokenizer,
        *,
        data: TrainingData,
        inputs: dict[str, Any],
        metrics: dict[str, Any],
        publish: Callable[[Any, Path], Published] | None = None,
        table: dict[str, list[dict]] | None = None,
        used: list[ReferenceArtifact | None] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Save and record the trained model; every rank calls it, rank 0 alone writes.

        Args:
            data: the training rows' record (``train_data`` and its fingerprint, decontamination, reject counts).
            inputs: the stage's other manifest inputs (paths with their content hashes or data fingerprints).
            metrics: the stage's own metrics (row counts, ...); train loss and steps, efficiency, threads,
                processes and the loss curve are added here, and ``rejects_files`` (every ``rejects-*.jsonl``).
            publish: ``publish(model, checkpoint) -> Published``, run on rank 0 after the save (the saved model,
                LoRA adapters merged).
            table: W&B tables (name -> rows).
            used: more W&B artifacts the stage read (beside the training data and every input ``<k>`` with a
                ``<k>_hash`` that is a local path, :func:`rlhf.tracking.producer_artifact`).
            extra: more top-level manifest sections (e.g. ``tripwire``).

        Returns:
            Rank 0: the manifest's ``metrics``. Other ranks: ``{"train_loss", "train_steps", "rank"}``.
        """
        trainer, result, args = trained.trainer, trained.result, self.args
        full_weights = None if args.use_peft else gather_full_state_dict(trainer)  # ZeRO-3: a collective, every rank
        if not trainer.accelerator.is_main_process:  # multi-process (DDP): rank 0 alone saves and writes the manifest
            logger.info("%s: rank %d done; rank 0 writes the checkpoint and manifest", self.name, args.process_index)
            return {"train_loss": result.training_loss, "train_steps": result.global_step, "rank": args.process_index}

        # LoRA: merge the adapters, so the checkpoint (and SFT's pi_ref) is a whole model
        # accelerate leaves its autocast wrapper on the model's forward; what is saved and scored after training
        # (a reward model's held-out scores) runs without it, in fp32, as every later reader of the checkpoint.
        model = trainer.accelerator.unwrap_model(trainer.model, keep_fp32_wrapper=False)
        # the dtypes the trained state holds and the autocast it trained under, checked against the precision
        precision_dtypes = precision_record(self.name, precision_name(args), self.loaded_dtypes or {},
                                            {**_trained_models(trainer), "model": model}, self.autocast_probe)
        model = model.merge_and_unload() if args.use_peft else model
        check_healthy(trainer.state, full_weights or dict(model.named_parameters()))
        checkpoint = save_checkpoint(model, tokenizer, self.out / "checkpoint", state_dict=full_weights)
        published = publish(model, checkpoint) if publish is not None else Published()
        efficiency = {**trained.efficiency, **published.efficiency}
        metrics = {
            "train_loss": trained.training["train_loss"],  # over every step, a resumed run included
            "train_steps": result.global_step,
            "n_data_rejected": data.n_data_rejected,
            "n_rejected": data.n_rejected,
            **metrics,
            **published.metrics,
            "threads": efficiency["threads"],
            "efficiency": efficiency,
            "processes": trainer.args.world_size,
            "loss_curve": [h["loss"] for h in trainer.state.log_history if "loss" in h],  # per logging step
            "rejects_files": sorted(str(p) for p in self.out.glob("rejects-*.jsonl")),
        }
        outputs = {"checkpoint": str(checkpoint.resolve()), "checkpoint_hash": written_hash(checkpoint),
                   "decontamination": data.decontamination, **published.outputs}
        # W&B lineage: the data and parent checkpoints read, the checkpoints written (by reference, with hashes)
        round_id = getattr(args, "round_id", None)
        written = [ReferenceArtifact(artifact_name(self.name, k), "model", outputs[k], outputs[f"{k}_hash"],
                                     {"stage": self.name, "round_id": round_id})
                   for k in ("checkpoint", "pi_ref") if outputs.get(k) and outputs.get(f"{k}_hash")]
        read = [dataset_artifact(args.train_data, data.path, data.fingerprint),
                *(producer_artifact(v, inputs.get(f"{k}_hash")) for k, v in inputs.items()
                  if isinstance(v, str) and v and f"{k}_hash" in inputs and not k.endswith("_data")),
                *(used or [])]
        log_summary(
            {**{k: v for k, v in metrics.items() if not isinstance(v, dict) and k != "rejects_files"},
             **summary(efficiency), **published.summary},
            table={**(table or {}), **published.table} or None,
            report_to=args.report_to,
            inputs=read,
            outputs=written,
        )
        stage_manifest(
            self.name,
            args,
            inputs={"train_data": args.train_data, "train_data_hash": data.fingerprint, **inputs},
            outputs=outputs,
            metrics=metrics,
            extra={"training": trained.training, "precision_dtypes": precision_dtypes, **(extra or {})},
        )
        prune_trainer_checkpoints(self.out)  # resume state only; after the manifest, so a kill before it keeps them
        logger.info("%s done: loss %.4f over %d steps, checkpoint %s", self.name, metrics["train_loss"],
                    result.global_step, checkpoint)
        return metrics


def _trained_models(trainer) -> dict[str, Any]:
    """The models a TRL trainer holds whose precision the manifest vouches for: ``model`` and, for DPO,
    ``ref_model`` (its log-probabilities enter every loss)."""
    ref = getattr(trainer, "ref_model", None)
    return {"model": trainer.model, **({"ref_model": ref} if ref is not None else {})}


def use_step_wandb_callback(trainer) -> bool:
    """Replace transformers' ``WandbCallback`` (added by ``report_to: [wandb]``) on ``trainer`` with
    :class:`StepWandbCallback`; returns whether there was one (no W&B asked: nothing changes)."""
    found = [cb for cb in trainer.callback_handler.callbacks if type(cb) is WandbCallback]
    for cb in found:
        trainer.remove_callback(cb)
    if found:
        trainer.add_callback(StepWandbCallback())
    return bool(found)


class StepWandbCallback(WandbCallback):
    """transformers' W&B callback, with the run opened by ``rlhf.tracking.init_run`` (the id kept in the stage
    folder, ``resume="allow"``) and every record logged at ``step=state.global_step``.

    transformers' own callback logs without a step, so W&B counts ``_step`` from 0 in every process: a resumed
    stage's offline run started at 0 again, and its records did not line up with the killed attempt's. Here
    ``_step`` is the optimizer step, so a stage resumed from ``checkpoint-N`` logs from step N+1 on, online and
    offline. Online, W&B continues the kept run and drops records at steps it already holds (steps must increase),
    so the killed attempt's steps after its last checkpoint stay as that attempt logged them.

    At each checkpoint save it commits the save's step (a row logged with ``step=`` stays in the client until a later
    step is logged, so a kill right after the next step's record lost the checkpoint's own step) and waits until two
    of wandb-core's write periods (``rlhf.tracking.TRANSACTION_LOG_FLUSH_S``) have passed since (a save usually takes
    longer, so it rarely waits): the steps a checkpoint covers are in the run's file before training goes on, and a
    kill after the save loses none of them. Records logged later at a step already committed (the end-of-training
    figures, at the last checkpoint's step) go to the run's summary: W&B would drop them as going back in steps.
    """

    _SINGLE_VALUE_SCALARS = ("train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss",
                             "total_flos")

    _last_log = 0.0  # time.monotonic() of the last record logged
    _committed_step = -1  # the newest step whose row was committed at a checkpoint save

    def setup(self, args, state, model, **kwargs):
        if self._wandb is not None and state.is_world_process_zero and self._wandb.run is None:
            init_run()
        super().setup(args, state, model, **kwargs)

    def on_save(self, args, state, control, **kwargs):
        super().on_save(args, state, control, **kwargs)
        if self._initialized and state.is_world_process_zero:
            if state.global_step > self._committed_step:
                self._wandb.log({"train/global_step": state.global_step}, step=state.global_step, commit=True)
                self._committed_step = state.global_step
                self._last_log = time.monotonic()
            wait = 2 * TRANSACTION_LOG_FLUSH_S - (time.monotonic() - self._last_log)  # two flushes: one full period
            if wait > 0:
                time.sleep(wait)

    def on_log(self, args, state, control, model=None, logs=None, **kwargs):
        # transformers' WandbCallback.on_log (integration_utils), with the step given
        if self._wandb is None:
            return
        if not self._initialized:
            self.setup(args, state, model)
        if state.is_world_process_zero:
            for k, v in logs.items():
                if k in self._SINGLE_VALUE_SCALARS:
                    self._wandb.run.summary[k] = v
            series = rewrite_logs({k: v for k, v in logs.items() if k not in self._SINGLE_VALUE_SCALARS})
            if state.global_step <= self._committed_step:
                self._wandb.run.summary.update(series)
                return
            self._wandb.log({**series, "train/global_step": state.global_step}, step=state.global_step)
            self._last_log = time.monotonic()
