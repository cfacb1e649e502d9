"""The reward-hacking tripwire (:mod:`judging.tripwires`) for the online-RL stages on TRL (``grpo``, ``rloo``): the
measurements of a check for a Hugging Face policy inside TRL's ``GRPOTrainer`` / ``RLOOTrainer``, and the
callback the stages add (:func:`tripwire_callback`).

One check (:class:`SliceMeasure`), on a fixed slice of prompts (``--tripwire_prompts_data``, default the first
``--tripwire_n_prompts`` training prompts), each rendered with the chat template as TRL renders them:

    responses      greedy (no sampling: the same weights give the same responses), at most
                   ``--tripwire_max_new_tokens`` tokens, the policy in eval mode
    reward         the mean on the slice of the reward TRL optimises: its reward functions' weighted sum
                   (``reward_weights``), computed by the trainer's own ``_calculate_rewards`` so a check scores
                   exactly as a rollout is scored
    gold           :func:`judging.tripwires.gold_win_rate` of the gold model's scores (``--tripwire_gold_model_path``,
                   a second reward model, refused when it is the optimised one) over its scores at the first check of
                   the run (on a fresh run: the initial policy, the DPO candidate); or, with
                   ``--tripwire_gold_judge`` (a pairwise judge, e.g. the gates' OpenAI-compatible one), that judge's
                   win rate of the current answers over the first check's (:func:`judged_win_rate`); None without
                   either
    kl             the latest ``kl`` in ``trainer.state.log_history`` (TRL's per-token KL to pi_ref of the last
                   logged step; the Trainer logs after the step's callbacks, so a check at step N reads step N-1's);
                   None before the first log
    median_length, refusal_rate, style
                   :func:`judging.tripwires.style_signals`; lengths in completion tokens up to and including EOS

A resumed run replays the killed attempt's checks up to the step it resumed from (``tripwire-checks.jsonl``, with
the gold model's scores at the first check: :meth:`SliceMeasure.state`), so it keeps that attempt's baseline.
"""

from __future__ import annotations

import logging
import math
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .gold_scorer import load_gold_scorer
from .tripwires import Signals, TripwireCallback, TripwireConfig, gold_win_rate, style_signals

logger = logging.getLogger(__name__)

#: Tokens of prompt + response the gold model reads (the demo's prompts and replies fit well inside it).
GOLD_MAX_LENGTH = 1024


def tripwire_config(args: Any) -> TripwireConfig:
    """The rules (:class:`TripwireConfig`) from an online-RL config's ``tripwire_*`` fields (ppo's names).

    Raises:
        ValueError: the tripwire is off (``tripwire_steps`` 0), or a bound is invalid.
    """
    if not args.tripwire_steps:
        raise ValueError("tripwire_steps is 0: the tripwire is off")
    return TripwireConfig(
        every_steps=args.tripwire_steps, min_step=args.tripwire_min_step, gold_drop=args.tripwire_gold_drop,
        max_kl=args.tripwire_max_kl, max_length_ratio=args.tripwire_max_length_ratio,
        max_refusal_shift=args.tripwire_max_refusal_shift, max_style_shift=args.tripwire_max_style_shift)


class SliceMeasure:
    """``measure(model, step) -> Signals`` for :class:`TripwireCallback` (what it measures: the module docstring).

    Args:
        prompts: the slice's user prompts, shape (n,).
        max_new_tokens: most tokens of a greedy response.
        batch_size: prompts generated (and gold-scored) at once.
        gold_scorer: ``(prompts as chat messages, responses) -> one score per response``, higher is better (ppo's
            ``GoldScorer``; never the optimised reward), or None (no gold rule).
        references: each prompt's reference answer (the ``reference`` column the judge reward reads), or None.

    :meth:`bind` gives it the trainer (tokenizer, reward functions, log history) once the trainer is built.
    """

    def __init__(self, prompts: list[str], *, max_new_tokens: int, batch_size: int = 8,
                 gold_scorer: Callable[[list, list[str]], Sequence[float]] | None = None,
                 references: list[str] | None = None, gold_judge: Any = None):
        if gold_scorer is not None and gold_judge is not None:
            raise ValueError("tripwire slice: a gold scorer or a gold judge, not both")
        if not prompts:
            raise ValueError("tripwire slice: no prompts")
        if references is not None and len(references) != len(prompts):
            raise ValueError(f"tripwire slice: {len(references)} reference answers for {len(prompts)} prompts")
        self.prompts = list(prompts)
        self.references = references
        self.gold_judge = gold_judge
        self.gold_texts: list[str] | None = None
        self.messages = [[{"role": "user", "content": p}] for p in self.prompts]
        self.max_new_tokens = max_new_tokens
        self.batch_size = batch_size
        self.gold_scorer = gold_scorer
        self.gold_reference: list[float] | None = None
        self.trainer: Any = None

    def bind(self, trainer: Any) -> None:
        self.trainer = trainer

    def state(self) -> dict[str, Any]:
        """What a resumed run needs to measure as the killed one did: the gold scores of the first check."""
        return {"gold_reference": self.gold_reference, "gold_texts": self.gold_texts}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state` (a resumed run)."""
        ref = state.get("gold_reference")
        self.gold_reference = None if ref is None else [float(x) for x in ref]
        texts = state.get("gold_texts")
        self.gold_texts = None if texts is None else [str(x) for x in texts]

    def generate(self, model: Any) -> tuple[list[str], list[int], list[list[int]]]:
        """Greedy responses of ``model`` to the slice: (texts, lengths in tokens incl. EOS, token ids)."""
        import torch

        tok = self.trainer.processing_class
        device = next(model.parameters()).device
        eos = {tok.eos_token_id, *([model.generation_config.eos_token_id]
                                   if isinstance(model.generation_config.eos_token_id, int)
                                   else (model.generation_config.eos_token_id or []))} - {None}
        texts: list[str] = []
        lengths: list[int] = []
        ids_out: list[list[int]] = []
        was_training = model.training
        model.eval()
        try:
            for start in range(0, len(self.messages), self.batch_size):
                rendered = [tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False)
                            for m in self.messages[start : start + self.batch_size]]
                enc = tok(rendered, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
                enc = {k: v.to(device) for k, v in enc.items()}
                with torch.no_grad():
                    out = model.generate(**enc, do_sample=False, max_new_tokens=self.max_new_tokens,
                                         pad_token_id=tok.pad_token_id)
                for row in out[:, enc["input_ids"].shape[1] :].tolist():
                    n = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
                    ids_out.append(row[:n])
                    lengths.append(n)
                    texts.append(tok.decode(row[:n], skip_special_tokens=True))
        finally:
            model.train(was_training)
        return texts, lengths, ids_out

    def reward(self, texts: list[str], ids: list[list[int]]) -> float:
        """Mean over the slice of the trainer's weighted reward (TRL's ``_calculate_rewards`` and
        ``reward_weights``, NaN rewards skipped per function as TRL's ``nansum``)."""
        t = self.trainer
        completions = [[{"role": "assistant", "content": x}] for x in texts]
        inputs = [{"prompt": m, **({"reference": self.references[i]} if self.references is not None else {})}
                  for i, m in enumerate(self.messages)]  # the columns a rollout's reward functions get
        per_func = t._calculate_rewards(inputs, self.messages, completions, ids)
        total = (per_func * t.reward_weights.to(per_func.device).unsqueeze(0)).nansum(dim=1)
        return float(total.mean().item())

    def kl(self) -> float | None:
        logged = [h["kl"] for h in self.trainer.state.log_history if "kl" in h]
        return float(logged[-1]) if logged else None

    def __call__(self, model: Any, step: int) -> Signals:
        if self.trainer is None:
            raise RuntimeError("SliceMeasure: bind(trainer) first")
        texts, lengths, ids = self.generate(model)
        gold = None
        if self.gold_scorer is not None:
            scores = [float(x) for x in self.gold_scorer(self.messages, texts)]
            if len(scores) != len(texts):
                raise ValueError(f"gold scorer returned {len(scores)} scores for {len(texts)} responses")
            if self.gold_reference is None:
                self.gold_reference = scores
            gold = gold_win_rate(scores, self.gold_reference)
        elif self.gold_judge is not None:
            if self.gold_texts is None:
                self.gold_texts = list(texts)
            gold = judged_win_rate(self.gold_judge, self.messages, self.gold_texts, texts)
        return Signals(step=step, reward=self.reward(texts, ids), gold=gold, kl=self.kl(),
                       **style_signals(self.prompts, texts, lengths))


def judged_win_rate(judge: Any, prompts: Sequence[Any], baseline: Sequence[str], current: Sequence[str]) -> float | None:
    """Win rate of ``current`` answers over ``baseline`` ones by a pairwise judge (``judging.judges.Judge``: the
    baseline shown as A), a draw counting 1/2, as :func:`gold_win_rate`; an answer identical to its baseline is a
    draw without asking. Unparsed verdicts are left out; None (no gold this check, logged) when more than half of
    the judged items are unparsed.

    Shapes: (n,) each. Returns a float in [0, 1] or None.
    """
    todo = [i for i, (b, c) in enumerate(zip(baseline, current)) if b != c]
    wins = {i: 0.5 for i in range(len(current)) if i not in set(todo)}
    if todo:
        judgments = judge.judge([prompts[i] for i in todo], [baseline[i] for i in todo], [current[i] for i in todo])
        for i, j in zip(todo, judgments):
            if not math.isnan(j.preference):
                wins[i] = j.preference - 1.0  # 1 A better -> 0, 1.5 draw -> 0.5, 2 B better -> 1
        unparsed = len(current) - len(wins)
        if unparsed * 2 > len(todo):
            logger.warning("tripwire gold judge: %d of %d verdicts unparsed: no gold at this check", unparsed,
                           len(todo))
            return None
    return sum(wins.values()) / len(wins)


class OnlineRLTripwire(TripwireCallback):
    """:class:`TripwireCallback` with a :class:`SliceMeasure`, and what ``rlhf.online_rl.run_online_rl`` asks of a
    callback that takes part in the stage: :meth:`bind` (called with the trainer once it is built),
    ``manifest_section`` / :meth:`manifest_record` (recorded in the stage manifest under that key) and
    :attr:`stopped_training` (an early end on purpose)."""

    manifest_section = "tripwire"

    def __init__(self, config: TripwireConfig, measure: SliceMeasure, record: dict[str, Any]):
        super().__init__(config, measure)
        self.inputs_record = record

    def bind(self, trainer: Any) -> None:
        self.measure.bind(trainer)

    @property
    def stopped_training(self) -> bool:
        """True after a trip (training stopped before ``max_steps``, the last passing check's policy restored)."""
        return self.tripwire.tripped is not None

    def manifest_record(self) -> dict[str, Any]:
        """``Tripwire.record()`` plus the slice's size, whether a gold model was used, its and the slice's
        provenance, and the checkpoint folder the final policy was restored from (None: not restored)."""
        judge = self.measure.gold_judge
        return {**self.tripwire.record(), "n_prompts": len(self.measure.prompts),
                "gold_scorer": self.measure.gold_scorer is not None or judge is not None, **self.inputs_record,
                "gold_judge": None if judge is None else {
                    "identity": judge.identity(), "requests_sent": int(getattr(judge, "requests_sent", 0))},
                "restored_from": self.restored_from}

    def remove_snapshots(self) -> None:
        """Remove the baseline weights folder (after the manifest: the saved checkpoint holds what it had)."""
        for folder in set(self.checkpoints.values()):
            if Path(folder).name == "tripwire-baseline":
                shutil.rmtree(folder, ignore_errors=True)


def load_gold_judge(config: Any, reward_model_hash: str):
    """The tripwire's gold judge from its config (``--tripwire_gold_judge``, a ``JudgeConfig`` mapping).

    Raises:
        ValueError: a bad config (names the key); the ``reward_model`` backend (the optimised reward model) or a
            sequence classifier whose content hash is the optimised reward model's: the gold check must come from
            another scorer.
    """
    from .factory import make_judge
    from .judges import JudgeConfig

    cfg = JudgeConfig.from_dict(config, where="--tripwire_gold_judge")
    if cfg.backend == "reward_model":
        raise ValueError("--tripwire_gold_judge backend reward_model is the optimised reward model: the gold check "
                         "must come from another scorer (openai, sequence_classifier with another model, labels)")
    judge = make_judge(cfg)
    if judge.identity().get("content_hash") == reward_model_hash:
        raise ValueError(f"--tripwire_gold_judge model {cfg.model} is the optimised reward model: the gold check "
                         "must come from another scorer")
    return judge


def tripwire_callback(args: Any, train_prompts: list[str], reward_model_hash: str,
                      train_references: list[str] | None = None) -> OnlineRLTripwire | None:
    """The stage's tripwire from its config, or None when off (``tripwire_steps`` 0, or ``max_steps`` > 0 and
    below ``tripwire_steps``: no check would be made).

    ``train_references``: the training prompts' reference answers when a reward reads them (the judge reward); the
    slice then carries its prompts' references too (from ``--tripwire_prompts_data``'s rows when given, which must
    then have one each).

    The gold model (``--tripwire_gold_model_path``) is loaded here, frozen, in fp32, on the accelerator's device;
    it is refused when its content hash is the optimised reward model's.

    Raises:
        ValueError: a bound is invalid; the gold model is the optimised reward model.
    """
    if not args.tripwire_steps or 0 < args.max_steps < args.tripwire_steps:
        return None
    config = tripwire_config(args)
    record: dict[str, Any] = {"prompts_data": args.tripwire_prompts_data, "prompts_data_hash": None,
                              "gold_model": None, "gold_model_hash": None}
    if args.tripwire_prompts_data:
        from data.fingerprint import data_fingerprint
        from data.loaders import load_eval_prompts

        rows = list(load_eval_prompts(args.tripwire_prompts_data, limit=args.tripwire_n_prompts))
        prompts = [r.prompt for r in rows]
        record["prompts_data_hash"] = data_fingerprint(args.tripwire_prompts_data)
        if train_references is not None:
            from .online_reward import check_references

            references = check_references(rows, args.tripwire_prompts_data)
    else:
        prompts = list(train_prompts)[: args.tripwire_n_prompts]
        references = None if train_references is None else list(train_references)[: args.tripwire_n_prompts]
    if train_references is None:
        references = None
    gold_scorer, gold_record = load_gold_scorer(args.tripwire_gold_model_path, reward_model_hash,
                                                device=args.device, batch_size=args.per_device_train_batch_size,
                                                max_length=GOLD_MAX_LENGTH)
    record.update(gold_record)
    gold_judge = None
    if getattr(args, "tripwire_gold_judge", None) is not None:
        gold_judge = load_gold_judge(args.tripwire_gold_judge, reward_model_hash)
    measure = SliceMeasure(prompts, max_new_tokens=args.tripwire_max_new_tokens,
                           batch_size=args.per_device_train_batch_size, gold_scorer=gold_scorer,
                           references=references, gold_judge=gold_judge)
    return OnlineRLTripwire(config, measure, record)
