"""Reward-hacking tripwires for online RL: stop training when signals the optimised reward does not control say the
policy got worse, and roll back to the last check that passed.

The failure this catches is the field's most common one: the training reward climbs while the model gets worse
(reward saturated while independently measured accuracy collapsed, and best-checkpoint selection on the reward
picked the worst checkpoint; PPO left a model that refuses everything). So every ``every_steps`` training steps the
trainer measures, on a small fixed slice of prompts, signals that do *not* come from the reward being optimised:

    gold           a second scorer's verdict (the round's judge or a second reward model); by default in the form
                   :func:`gold_win_rate`: the share of the slice where the current policy's response scores higher
                   than the initial policy's (ties count 1/2), in [0, 1]; higher is better
    kl             KL(pi || pi_ref) per sequence, in nats (the trainer's own estimate, e.g. PPO's k1 mean)
    median_length  median response length on the slice, in tokens
    refusal_rate   share of the slice's responses :func:`judging.refusal_rules.classify_refusal` labels a full or
                   partial refusal, in [0, 1]; on benign prompts every refusal is a false refusal
    style          the shares of ``judging.drift_rules``: ``bullets``, ``restating`` (openings that restate or
                   flatter the question: "It's great that you ...", "I understand you ..."), ``hedged``; in [0, 1]
    reward         the optimised reward's mean on the same slice (the scorer being optimised), to see it rise

Rules (:meth:`Tripwire.check`), each off when its bound is None; the first check is the baseline and never trips:

    gold    best.gold - gold > gold_drop  and  reward - best.reward > reward_rise
            (``best`` = the passing check with the highest gold so far: reward up while gold fell)
    kl      kl > max_kl
    length  r = median_length / baseline.median_length;  r > max_length_ratio  or  r < 1 / max_length_ratio
    refusal refusal_rate - baseline.refusal_rate > max_refusal_shift   (one-sided: more refusals)
    style   |share - baseline share| > max_style_shift, per share

A check before ``min_step`` never trips (the first steps' estimates are noisy); it passes. On a trip the trainer
stops, restores the weights of :attr:`Tripwire.restore_step` (the last passing check) and records
:meth:`Tripwire.record` in its stage manifest; the round goes on to the gates with the restored policy. The best
checkpoint is chosen by gold (:attr:`Tripwire.best_step`), never by the training reward.

:class:`TripwireCallback` is the same engine for a ``transformers.Trainer`` (TRL's GRPO/RLOO trainers).
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from rlhf.config import tripwire_bound_errors
from rlhf.manifest import atomic_write_text, dumps_strict, records_up_to_step

from judging.drift_rules import has_bullet_list, is_hedged, restates_question
from judging.refusal_rules import classify_refusal, is_refusal

logger = logging.getLogger(__name__)

SIGNALS = ("gold", "kl", "length", "refusal", "style")
STYLE_SHARES = ("bullets", "restating", "hedged")


@dataclass(frozen=True)
class TripwireConfig:
    """When to measure and how far each signal may move (units in the module docstring).

    Fields:
        every_steps: measure every this many training steps (K > 0).
        min_step: checks at a step below this never trip (they pass).
        gold_drop: largest allowed fall of gold below the best passing check's while the reward rose (gold's
            units: win-rate points, 0.15 = 15 points, for :func:`gold_win_rate`); None: rule off.
        reward_rise: the reward must exceed the best check's by more than this (reward units) for the gold rule.
        max_kl: KL(pi || pi_ref) bound, nats per sequence; None: rule off.
        max_length_ratio: bound on median length / baseline median length, both ways (1.5: x1.5 or x1/1.5).
        max_refusal_shift: bound on the rise of the refusal rate over the baseline's (0.10 = 10 points).
        max_style_shift: bound on each style share's move either way from the baseline's; None (default): the
            shares are recorded, not gated.
    """

    every_steps: int = 10
    min_step: int = 0
    gold_drop: float | None = 0.15
    reward_rise: float = 0.0
    max_kl: float | None = 20.0
    max_length_ratio: float | None = 1.5
    max_refusal_shift: float | None = 0.10
    max_style_shift: float | None = None

    def __post_init__(self) -> None:
        errors = [] if self.every_steps > 0 else [f"every_steps must be > 0, got {self.every_steps}"]
        errors += tripwire_bound_errors(
            min_step=self.min_step, gold_drop=self.gold_drop, max_kl=self.max_kl,
            max_length_ratio=self.max_length_ratio, max_refusal_shift=self.max_refusal_shift,
            max_style_shift=self.max_style_shift, reward_rise=self.reward_rise)
        if errors:
            raise ValueError("TripwireConfig: " + "; ".join(errors))


@dataclass(frozen=True)
class Signals:
    """What one check measured at a training step (units in the module docstring; None: not measured)."""

    step: int
    reward: float
    gold: float | None = None
    kl: float | None = None
    median_length: float | None = None
    refusal_rate: float | None = None
    style: Mapping[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "style": dict(self.style)}


@dataclass(frozen=True)
class Trip:
    """One rule that fired: the signal (of :data:`SIGNALS`), the step, and the numbers the rule compared."""

    signal: str
    step: int
    values: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class CheckResult:
    """A check's outcome: ``passed`` is False when at least one rule fired (``trips``)."""

    signals: Signals
    trips: tuple[Trip, ...]
    armed: bool

    @property
    def passed(self) -> bool:
        return not self.trips

    def to_dict(self) -> dict[str, Any]:
        return {**self.signals.to_dict(), "passed": self.passed, "armed": self.armed,
                "trips": [t.signal for t in self.trips]}


class Tripwire:
    """The rules of the module docstring over a sequence of checks.

    Feed one :class:`Signals` per check with :meth:`check`, in step order; the first is the baseline. After a trip
    the tripwire is spent: a further check raises (the trainer must stop and restore :attr:`restore_step`).
    """

    def __init__(self, config: TripwireConfig):
        self.config = config
        self.results: list[CheckResult] = []
        self.baseline: Signals | None = None
        self.last_passed: Signals | None = None
        self.best: Signals | None = None

    # ---- state ----------------------------------------------------------------------------------

    @property
    def tripped(self) -> CheckResult | None:
        """The check that tripped, or None."""
        return next((r for r in self.results if not r.passed), None)

    @property
    def restore_step(self) -> int | None:
        """Step of the last passing check (what to restore after a trip); None before any check."""
        return None if self.last_passed is None else self.last_passed.step

    @property
    def best_step(self) -> int | None:
        """Step of the passing check with the highest gold (the earliest among equals); None without gold."""
        return None if self.best is None else self.best.step

    def due(self, step: int) -> bool:
        """True when ``step`` (1-based, after that many training steps; 0 = before training) is a check step."""
        return step % self.config.every_steps == 0

    # ---- rules ----------------------------------------------------------------------------------

    def rules(self, s: Signals) -> list[Trip]:
        """The rules that ``s`` breaks against the baseline and the best check so far (none for the baseline)."""
        cfg, base, best = self.config, self.baseline, self.best
        trips: list[Trip] = []
        if base is None:
            return trips
        if cfg.gold_drop is not None and s.gold is not None and best is not None and best.gold is not None:
            drop, rise = best.gold - s.gold, s.reward - best.reward
            if drop > cfg.gold_drop and rise > cfg.reward_rise:
                trips.append(Trip("gold", s.step, {
                    "gold": s.gold, "best_gold": best.gold, "best_step": best.step, "gold_drop": drop,
                    "bound": cfg.gold_drop, "reward": s.reward, "best_reward": best.reward, "reward_rise": rise}))
        if cfg.max_kl is not None and s.kl is not None and s.kl > cfg.max_kl:
            trips.append(Trip("kl", s.step, {"kl": s.kl, "bound": cfg.max_kl}))
        if cfg.max_length_ratio is not None and s.median_length is not None and base.median_length is not None:
            b, c = base.median_length, s.median_length
            ratio = c / b if b > 0 else (math.inf if c > 0 else 1.0)
            if ratio > cfg.max_length_ratio or ratio < 1.0 / cfg.max_length_ratio:
                trips.append(Trip("length", s.step, {"median_length": c, "baseline_median_length": b,
                                                     "ratio": ratio, "bound": cfg.max_length_ratio}))
        if cfg.max_refusal_shift is not None and s.refusal_rate is not None and base.refusal_rate is not None:
            shift = s.refusal_rate - base.refusal_rate
            if shift > cfg.max_refusal_shift:
                trips.append(Trip("refusal", s.step, {"refusal_rate": s.refusal_rate,
                                                      "baseline_refusal_rate": base.refusal_rate, "shift": shift,
                                                      "bound": cfg.max_refusal_shift}))
        if cfg.max_style_shift is not None:
            moved = {k: s.style[k] - base.style[k] for k in base.style if k in s.style
                     and abs(s.style[k] - base.style[k]) > cfg.max_style_shift}
            if moved:
                trips.append(Trip("style", s.step, {"shifts": moved, "bound": cfg.max_style_shift}))
        return trips

    def check(self, s: Signals) -> CheckResult:
        """Apply the rules to one check and update the state (baseline, last passing, best by gold).

        Raises:
            RuntimeError: the tripwire already tripped, or ``s.step`` is not after the previous check's.
        """
        if self.tripped is not None:
            raise RuntimeError(f"tripwire tripped at step {self.tripped.signals.step}: stop and restore step "
                               f"{self.restore_step}, do not keep checking")
        if self.results and s.step <= self.results[-1].signals.step:
            raise RuntimeError(f"check at step {s.step} is not after the previous one "
                               f"({self.results[-1].signals.step})")
        armed = s.step >= self.config.min_step
        trips = tuple(self.rules(s)) if armed else ()
        result = CheckResult(s, trips, armed)
        self.results.append(result)
        if self.baseline is None:
            self.baseline = s
        if result.passed:
            self.last_passed = s
            if s.gold is not None and (self.best is None or s.gold > self.best.gold):
                self.best = s
        else:
            logger.warning("tripwire at step %d: %s; restore step %s", s.step,
                           "; ".join(f"{t.signal} {t.values}" for t in trips), self.restore_step)
        return result

    def replay(self, checks: Sequence[Mapping[str, Any]]) -> None:
        """Rebuild the state from recorded checks (``record()["checks"]``): a resumed run continues as the killed
        one would have."""
        for c in checks:
            self.check(Signals(step=int(c["step"]), reward=float(c["reward"]), gold=c.get("gold"), kl=c.get("kl"),
                               median_length=c.get("median_length"), refusal_rate=c.get("refusal_rate"),
                               style=dict(c.get("style") or {})))

    def record(self) -> dict[str, Any]:
        """The manifest entry: config, every check (signals, passed, the signals that fired), the trips with their
        values, and the steps that matter (baseline, tripped, restored, best by gold)."""
        tripped = self.tripped
        return {
            "config": asdict(self.config),
            "checks": [r.to_dict() for r in self.results],
            "trips": [t.to_dict() for r in self.results for t in r.trips],
            "tripped": tripped is not None,
            "tripped_step": None if tripped is None else tripped.signals.step,
            "restored_step": None if tripped is None else self.restore_step,
            "baseline_step": None if self.baseline is None else self.baseline.step,
            "best_step_by_gold": self.best_step,
            "best_gold": None if self.best is None else self.best.gold,
        }


# ---- measurements ---------------------------------------------------------------------------------


def gold_win_rate(scores: Sequence[float], reference_scores: Sequence[float]) -> float:
    """Share of items where ``scores[i] > reference_scores[i]``, a tie counting 1/2 (AlpacaEval's win rate with
    draws as half a win). Shapes (n,), (n,) -> a float in [0, 1]; the reference against itself gives 0.5.

    Raises:
        ValueError: lengths differ, no items, or a non-finite score.
    """
    if len(scores) != len(reference_scores):
        raise ValueError(f"scores ({len(scores)}) and reference_scores ({len(reference_scores)}) differ in length")
    if not scores:
        raise ValueError("no scores")
    total = 0.0
    for i, (a, b) in enumerate(zip(scores, reference_scores)):
        if not (math.isfinite(a) and math.isfinite(b)):
            raise ValueError(f"item {i}: non-finite score ({a}, {b})")
        total += 1.0 if a > b else 0.5 if a == b else 0.0
    return total / len(scores)


def style_signals(prompts: Sequence[str], responses: Sequence[str], lengths: Sequence[int]) -> dict[str, Any]:
    """The programmatic counters of one check: ``median_length`` (tokens, from ``lengths``), ``refusal_rate``
    (share labelled a full or partial refusal, :func:`judging.refusal_rules.classify_refusal`) and ``style``
    (shares of ``bullets``, ``restating``, ``hedged``: ``judging.drift_rules``). Shapes (n,) each.

    Raises:
        ValueError: lengths of the inputs differ or are empty.
    """
    n = len(responses)
    if not n or len(prompts) != n or len(lengths) != n:
        raise ValueError(f"style_signals: {len(prompts)} prompts, {n} responses, {len(lengths)} lengths")
    return {
        "median_length": float(statistics.median(lengths)),
        "refusal_rate": sum(is_refusal(classify_refusal(r)) for r in responses) / n,
        "style": {
            "bullets": sum(has_bullet_list(r) for r in responses) / n,
            "restating": sum(restates_question(r, p) for r, p in zip(responses, prompts)) / n,
            "hedged": sum(is_hedged(r, p) for r, p in zip(responses, prompts)) / n,
        },
    }


# ---- transformers adapter -------------------------------------------------------------------------


class TripwireCallback(TrainerCallback):
    """The tripwire for a ``transformers.Trainer`` (TRL's ``GRPOTrainer``, ``RLOOTrainer``, ...).

    Args:
        config: the rules and K (``config.every_steps``).
        measure: ``measure(model, step) -> Signals`` for the current model (the trainer's, unwrapped): generate
            on the fixed slice, score with the optimised reward and the gold scorer (:func:`gold_win_rate`),
            :func:`style_signals`, and the trainer's KL. Called on every process (it may use collectives); the
            rules are applied to what it returns on each.

    Behaviour:
        on_train_begin   refuses ``load_best_model_at_end`` (best is chosen by gold here) and a ``save_steps`` that
                         is not a multiple of K (every checkpoint must be a checked one); measures the baseline
                         at the starting step and writes the starting weights to ``<output_dir>/tripwire-baseline``
                         (restored if the first check trips). A run resumed from ``checkpoint-N`` instead replays
                         the killed attempt's checks up to step N from ``<output_dir>/tripwire-checks.jsonl`` (and
                         the measure's own state, e.g. the gold reference scores), so it keeps that attempt's
                         baseline and best check and decides as an uninterrupted run would; without the file (a
                         run that wrote none) it starts a new baseline at N, as before, and says so.
        every check      is appended to ``tripwire-checks.jsonl`` (rank 0) as it is made.
        on_step_end      every K steps: a passing check asks the Trainer to save (``control.should_save``), so the
                         last passing check always has a checkpoint; a trip sets ``should_training_stop`` and
                         cancels that step's save and evaluation.
        on_save          records ``<output_dir>/checkpoint-<step>`` as that check's checkpoint, and points
                         ``state.best_model_checkpoint`` at the best one by gold (the Trainer's checkpoint rotation
                         keeps it).
        on_train_end     after a trip, loads the last passing checkpoint's weights into the model
                         (:func:`load_weights`), so what the stage saves next is the restored policy.

    Attributes after training: ``tripwire`` (the :class:`Tripwire`, ``record()`` for the manifest),
    ``checkpoints`` (step -> folder), ``restored_from`` (folder or None).
    One process or DDP (each process holds whole weights); ZeRO-3 / FSDP are not supported.
    """

    #: The checks made so far, one JSON object a line (rank 0 writes it; a resumed run replays it).
    CHECKS_FILE = "tripwire-checks.jsonl"

    def __init__(self, config: TripwireConfig, measure: Callable[[Any, int], Signals]):
        self.config = config
        self.measure = measure
        self.tripwire = Tripwire(config)
        self.checkpoints: dict[int, str] = {}
        self.restored_from: str | None = None
        self.replayed_steps: list[int] = []
        self._checks_path: Path | None = None

    def _signals(self, model: Any, step: int) -> Signals:
        s = self.measure(model, step)
        if not isinstance(s, Signals) or s.step != step:
            raise TypeError(f"measure(model, {step}) must return Signals for step {step}, got {s!r}")
        return s

    def _check(self, model: Any, step: int) -> CheckResult:
        """Measure, apply the rules, and append the check (with the measure's state) to the checks file."""
        result = self.tripwire.check(self._signals(model, step))
        if self._checks_path is not None:
            entry = {**result.to_dict(), "measure_state": getattr(self.measure, "state", lambda: None)()}
            with open(self._checks_path, "a", encoding="utf-8") as f:
                f.write(dumps_strict(entry) + "\n")
        return result

    def _replay(self, args: Any, step: int) -> bool:
        """Replay the recorded checks up to ``step`` (a resumed run); True when the check at ``step`` was among them.

        The checks file is rewritten to hold just those (later checks were made after checkpoint-``step`` and are
        made again). Checkpoints: the baseline folder for the first check, ``checkpoint-<s>`` for a later passing
        one when it is still on disk.

        Raises:
            ValueError: a line of the file is not JSON (names the file and line).
        """
        path = Path(args.output_dir) / self.CHECKS_FILE
        kept = records_up_to_step(path, step, missing_step=math.inf)
        if self._checks_path is not None:  # atomic: another process may be reading it
            atomic_write_text(self._checks_path, "".join(dumps_strict(e) + "\n" for e in kept))
        if not kept:
            logger.warning("tripwire: resumed at step %d with no recorded checks (%s): a new baseline at step %d",
                           step, path, step)
            return False
        self.tripwire.replay(kept)
        self.replayed_steps = [int(e["step"]) for e in kept]
        state = kept[-1].get("measure_state")
        if state is not None and hasattr(self.measure, "load_state"):
            self.measure.load_state(state)
        baseline = Path(args.output_dir) / "tripwire-baseline"
        if baseline.is_dir():
            self.checkpoints[self.replayed_steps[0]] = str(baseline)
        for e in kept[1:]:
            folder = Path(args.output_dir) / f"checkpoint-{e['step']}"
            if e.get("passed") and folder.is_dir():
                self.checkpoints[int(e["step"])] = str(folder)
        logger.info("tripwire: resumed at step %d, replayed the checks of steps %s", step, self.replayed_steps)
        return self.replayed_steps[-1] == step

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if args.load_best_model_at_end:
            raise ValueError("TripwireCallback: set load_best_model_at_end=False; the tripwire picks the best "
                             "checkpoint by its gold check, never by the training reward")
        strategy = str(getattr(args.save_strategy, "value", args.save_strategy))
        if strategy == "steps" and args.save_steps % self.config.every_steps:
            raise ValueError(f"TripwireCallback: save_steps ({args.save_steps}) must be a multiple of every_steps "
                             f"({self.config.every_steps}): every checkpoint must be a checked one")
        if strategy not in ("steps", "no"):
            raise ValueError(f"TripwireCallback: save_strategy must be 'steps' or 'no', got {strategy!r}")
        if state.is_world_process_zero:
            self._checks_path = Path(args.output_dir) / self.CHECKS_FILE
            self._checks_path.parent.mkdir(parents=True, exist_ok=True)
        if state.global_step > 0 and self._replay(args, state.global_step):
            return control  # resumed at a check step: that check was made before the kill
        if state.global_step == 0 and self._checks_path is not None:
            atomic_write_text(self._checks_path, "")  # a fresh run: no earlier attempt's checks
        if self.tripwire.baseline is None:
            folder = Path(args.output_dir) / "tripwire-baseline"
            if state.is_world_process_zero:
                model.save_pretrained(folder)
            self.checkpoints[state.global_step] = str(folder)
        self._check(model, state.global_step)
        return control

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if not self.tripwire.due(state.global_step) or self.tripwire.tripped is not None:
            return control
        result = self._check(model, state.global_step)
        if result.passed:
            control.should_save = True
        else:
            control.should_training_stop = True
            control.should_save = False
            control.should_evaluate = False
        return control

    def on_save(self, args, state, control, **kwargs):
        step = state.global_step
        last = self.tripwire.results[-1] if self.tripwire.results else None
        if last is not None and last.signals.step == step and last.passed:
            self.checkpoints[step] = str(Path(args.output_dir) / f"checkpoint-{step}")
            best = self.tripwire.best_step
            if best is not None and best in self.checkpoints and best != self.tripwire.baseline.step:
                state.best_model_checkpoint = self.checkpoints[best]
        return control

    def on_train_end(self, args, state, control, model=None, **kwargs):
        if self.tripwire.tripped is None:
            return control
        step = self.tripwire.restore_step
        folder = self.checkpoints.get(step)
        if folder is None:
            raise RuntimeError(f"tripwire: no checkpoint of the last passing check (step {step}); checkpoints: "
                               f"{sorted(self.checkpoints)}")
        load_weights(model, folder)
        self.restored_from = folder
        logger.warning("tripwire: restored the weights of step %d from %s", step, folder)
        return control


def load_weights(model: Any, folder: str | Path) -> None:
    """Load the ``*.safetensors`` weights of a ``save_pretrained`` folder into ``model`` in place.

    Tied parameters (an ``lm_head`` tied to the embeddings, not saved) may be missing; any other missing or
    unexpected key is an error.

    Raises:
        FileNotFoundError: no safetensors file in ``folder``.
        ValueError: the keys do not match the model's.
    """
    from safetensors.torch import load_file

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder}: no *.safetensors weights to restore")
    state: dict[str, Any] = {}
    for f in files:
        state.update(load_file(str(f)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = set()
    for group in _tied_groups(model):
        if group & set(state):
            tied |= group
    missing = [k for k in missing if k not in tied]
    if missing or unexpected:
        raise ValueError(f"{folder}: weights do not match the model (missing {missing[:5]}, unexpected "
                         f"{list(unexpected)[:5]})")


def _tied_groups(model: Any) -> list[set[str]]:
    """Names of parameters that share storage, grouped (e.g. embeddings and a tied lm_head)."""
    by_ptr: dict[int, set[str]] = {}
    for name, p in model.state_dict(keep_vars=True).items():
        by_ptr.setdefault(p.data_ptr(), set()).add(name)
    return [g for g in by_ptr.values() if len(g) > 1]
