"""The skeleton of a TRL-based training stage (SFT, DPO, the reward model), so that each stage's ``main()`` holds
only what the stage does differently, and reads like TRL's own scripts (``trl/scripts/dpo.py``):

    stage = TrainerStage.start("dpo", DPOStageConfig, argv)     # parse, failure hook, logging, launch, W&B, seed
    rows = load_pairs(stage.args.train_data, **stage.load_options())   # the stage's data, its own loader
    trainer = DPOTrainer(model=..., train_dataset=..., **stage.trainer_kwargs(tokenizer))
    trained = stage.train(trainer, length_of=...)                # resume, train, check finished, efficiency
    return stage.finish(trained, tokenizer, data=TrainingData(...), inputs=..., metrics=...)

:meth:`TrainerStage.finish` gathers the weights on every rank (a collective under ZeRO-3), then only rank 0
saves the checkpoint, runs the stage's ``publish`` step (SFT's frozen pi_ref, the reward model's held-out
agreement), logs the summary, writes the manifest and prunes the Trainer checkpoints. The other ranks write
nothing there.

The return contract of every such stage's ``main()``: rank 0 returns the ``metrics`` it wrote to the manifest;
every other rank returns ``{"train_loss", "train_steps", "rank"}``.

Nothing here imports ``data`` or ``judging`` (they sit above this package): loading, decontaminating and
preparing rows, and the data fingerprints of the manifest's inputs, are the stage's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .checkpoint import gather_full_state_dict, save_checkpoint
from .config import parse_stage_config, peft_config
from .efficiency import count_tokens, group_by_length, summary, train_efficiency
from .entrypoint import setup_stage
from .lineage import content_hash
from .manifest import precision_name, stage_manifest
from .resume import ResumeCallback, check_finished, prune_trainer_checkpoints, resolve_resume, training_record
from .rundir import install_failure_hook
from .tracking import log_summary
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

    @property
    def out(self) -> Path:
        return Path(self.args.output_dir)

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

    def train(self, trainer, length_of: Callable[[dict], int]) -> Trained:
        """Train on length-grouped batches (``length_of(row)``: a tokenized row's length), resuming from the
        checkpoint ``--resume_from_checkpoint`` names (checked: a missing or incomplete one is an error), and
        refuse a run that did not end at ``max_steps``. Every rank calls it."""
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
        log_summary(
            {**{k: v for k, v in metrics.items() if not isinstance(v, dict) and k != "rejects_files"},
             **summary(efficiency), **published.summary},
            table={**(table or {}), **published.table} or None,
            report_to=args.report_to,
        )
        stage_manifest(
            self.name,
            args,
            inputs={"train_data": args.train_data, "train_data_hash": data.fingerprint, **inputs},
            outputs={"checkpoint": str(checkpoint.resolve()), "checkpoint_hash": content_hash(checkpoint),
                     "decontamination": data.decontamination, **published.outputs},
            metrics=metrics,
            extra={"training": trained.training},
        )
        prune_trainer_checkpoints(self.out)  # resume state only; after the manifest, so a kill before it keeps them
        logger.info("%s done: loss %.4f over %d steps, checkpoint %s", self.name, metrics["train_loss"],
                    result.global_step, checkpoint)
        return metrics
