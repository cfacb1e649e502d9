"""Reward-model stage: a Bradley-Terry reward model (TRL RewardTrainer) and its agreement with expert labels.

Launch alone:
    accelerate launch -m reward_model.train --config recipes/demo/reward_model.yaml --sft_dir runs/<round>/sft

The stage records its measurements only: the RM's agreement with the expert (majority) label on held-out pairs
(``metrics.rm_agreement``) and the inter-annotator agreement on the same pairs
(``metrics.inter_annotator_agreement``). The flow decides the PPO unlock from them (``judging.unlock``,
DESIGN.md principle 2: DPO first), so the research override never reaches this stage or its cache key.
With LoRA the score head is trained and saved (``modules_to_save=["score"]``); after saving, the checkpoint is
reloaded and must reproduce the held-out scores (the "random head after reload" pitfall).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

from datasets import Dataset
from trl import RewardTrainer

from data.decontamination import decontaminate_stage_rows
from data.fingerprint import data_fingerprint, local_path
from data.loaders import load_pairs
from data.pairs import prepare_pairs
from data.schemas import pair_to_trl
from data.validation import handle_rejects
from judging.agreement import expert_labels, inter_annotator_agreement, preference_pair_clusters, rm_agreement
from judging.judges import judge_pairs
from judging.model_judges import RewardModelJudge, judgment_scores
from judging.scoring import check_reload_scores, load_reward_model
from rlhf.machine import auto_batch_size
from rlhf.manifest import read_manifest
from rlhf.tracking import add_config, dataset_artifact
from rlhf.precision import keep_in_fp32
from rlhf.trainer_stage import Published, TrainerStage, TrainingData

from .config import RewardStageConfig

logger = logging.getLogger("reward_model.train")


def held_out_agreement(model, tokenizer, checkpoint: Path, held_out, scored, args) -> Published:
    """The saved reward model's agreement with the expert (majority) label on the held-out pairs ``scored``, and
    the inter-annotator agreement on all of ``held_out``; the reloaded checkpoint must reproduce the live scores.

    Scored once (``scoring_batch_size: auto``: padding-aware batches, ``judging.scoring.score(planned=True)``); the
    reload check re-scores only its 8 pairs, and the gates reuse these scores (``agreement_scores.jsonl``, per pair:
    the judge's agreement with the humans item by item) instead of scoring again. The reward model judges through
    the one judge interface (``judging.judges``), as the gates' judge does.
    """
    max_len = args.max_length or 512
    batch = auto_batch_size(args.scoring_batch_size, model.config, max_len)
    planned = str(args.scoring_batch_size) == "auto"  # auto: padding-aware batches of at most `batch`
    t_score = time.perf_counter()
    rm_judge = RewardModelJudge(model, tokenizer, path=str(checkpoint), batch_size=batch, max_length=max_len,
                                planned=planned)
    first, second = judgment_scores(judge_pairs(rm_judge, scored))
    reload_dev = check_reload_scores(str(checkpoint), tokenizer, first, second, scored, batch, max_len,
                                     planned=planned)
    judging_seconds = time.perf_counter() - t_score  # held-out scoring + the reload check

    labels = [[lab.preference for lab in p.labels] for p in held_out]  # ragged: annotators per pair may differ
    # pairs sharing an instruction or a response are one cluster: the intervals count clusters, not pairs
    iaa = inter_annotator_agreement(labels, clusters=preference_pair_clusters(held_out))
    clusters = preference_pair_clusters(scored)
    rm = rm_agreement(first, second, expert_labels(labels[: len(scored)]), clusters=clusters)
    scores = Path(args.output_dir) / "agreement_scores.jsonl"
    with open(scores, "w") as f:
        for p, s1, s2, c in zip(scored, first, second, clusters):
            row = {"id": p.id, "score_first": float(s1), "score_second": float(s2),
                   "labels": [lab.preference for lab in p.labels], "cluster": int(c)}
            f.write(json.dumps(row) + "\n")
    logger.info(
        "RM agreement with expert labels %.4f (n %d, n_eff %.1f in %d clusters) vs inter-annotator agreement %.4f "
        "(n %d, n_eff %.1f in %d clusters); the flow decides PPO",
        rm.agreement, rm.n, rm.n_eff, rm.n_clusters, iaa.pairwise_agreement_decisive, iaa.n_decisive_comparisons,
        iaa.n_eff_decisive, iaa.n_clusters,
    )
    return Published(
        outputs={"agreement_scores": str(scores.resolve())},
        metrics={"reload_max_abs_diff": reload_dev, "scoring_batch_size": batch, "rm_agreement": rm.to_dict(),
                 "inter_annotator_agreement": iaa.to_dict()},
        efficiency={"judging_seconds": judging_seconds},
        summary={"rm_agreement": rm.agreement, "inter_annotator_agreement": iaa.pairwise_agreement_decisive},
    )


def main(argv: list[str] | None = None) -> dict:
    stage = TrainerStage.start("reward_model", RewardStageConfig, argv)
    args = stage.args
    sft = read_manifest(args.sft_dir) if args.sft_dir else None
    start = sft["outputs"]["checkpoint"] if sft else args.model_name_or_path
    start_hash = sft["outputs"].get("checkpoint_hash") if sft else None
    # With --sft_dir the model trained is the SFT checkpoint, not the --model_name_or_path default (the flow gives
    # that only to SFT): the config the W&B callback logs (args.to_dict()) and the manifest name it.
    args.model_name_or_path = start
    add_config({"base_model": (sft.get("inputs") or {}).get("base_model") if sft else start,
                "start_checkpoint_hash": start_hash})

    pairs = load_pairs(args.train_data, **stage.load_options())
    decontamination = decontaminate_stage_rows(
        pairs, args.decontaminate_against, args.decontaminate, label=args.train_data, log=logger.info
    )
    held_out = load_pairs(  # checked before training: a pair without 2+ annotator labels cannot measure agreement
        args.agreement_data, mode=args.agreement_data_mode, max_reject_rate=args.agreement_max_reject_rate,
        rejects_path=stage.out / "rejects-agreement.jsonl", min_labels=2,
    )
    scored = held_out[: args.max_agreement_pairs] if args.max_agreement_pairs else held_out
    model, tokenizer = load_reward_model(start, new_head=True, dtype=stage.weights_dtype, trained=True)
    keep_in_fp32(model.score)  # scores in fp32 under bf16 autocast too: they decide ties and agreement
    prepared = prepare_pairs(pairs, tokenizer, args.max_length, file=args.train_data, require_fit=True,
                             special_tokens=args.special_tokens_in_text)
    handle_rejects(prepared.rejects, len(pairs), args, "truncation")

    trainer = stage.attach(RewardTrainer(  # attach: fp32 master weights checked, W&B at the trainer's step
        model=model,
        train_dataset=Dataset.from_list([pair_to_trl(p) for p in prepared.pairs]),
        **stage.trainer_kwargs(tokenizer, task_type="SEQ_CLS", modules_to_save=["score"]),
    ))
    if len(trainer.train_dataset) != len(prepared.pairs):  # TRL filters over-long pairs without naming them
        raise RuntimeError(f"RewardTrainer kept {len(trainer.train_dataset)} of {len(prepared.pairs)} checked pairs")

    trained = stage.train(trainer, length_of=lambda row: len(row["chosen_ids"]) + len(row["rejected_ids"]))
    agreement_hash = data_fingerprint(args.agreement_data)
    return stage.finish(
        trained,
        tokenizer,
        data=TrainingData(data_fingerprint(args.train_data), decontamination,
                          n_data_rejected=len(pairs.rejects), n_rejected=len(prepared.rejects),
                          path=local_path(args.train_data)),
        inputs={
            "start_checkpoint": start,
            **({"start_checkpoint_hash": start_hash} if start_hash else {}),
            "agreement_data": args.agreement_data,
            "agreement_data_hash": agreement_hash,
        },
        metrics={
            "n_pairs": len(prepared.pairs),
            "n_held_out": len(held_out),
            "n_held_out_rejected": len(held_out.rejects),
            "n_scored": len(scored),
        },
        # the held-out agreement, on rank 0 after the save: the RM's and the annotators' (the flow decides PPO)
        used=[dataset_artifact(args.agreement_data, local_path(args.agreement_data),
                               agreement_hash)],
        publish=lambda model, checkpoint: held_out_agreement(model, tokenizer, checkpoint, held_out, scored, args),
    )


if __name__ == "__main__":
    main(sys.argv[1:])
