"""The reward-hacking tripwire in the GRPO / RLOO stages (judging.online_tripwire through rlhf.online_rl): a forced
trip stops training and the policy saved is the last passing check's; a run without a trip records every check,
the gold check against a second reward model; configs that cannot check are refused or make no check; and a
deliberately hackable reward (it pays for '!') trips GRPO's gold rule, as in tests/test_ppo_tripwire.py."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback

from rlhf.lineage import content_hash
from rlhf.manifest import read_manifest
from test_grpo_rloo import _argv, _perturb, stages  # noqa: F401  (the fixture)

FAST = ["--tripwire_steps", "1", "--tripwire_n_prompts", "2", "--tripwire_max_new_tokens", "4"]


class WeightsAtStepEnd(TrainerCallback):
    """The policy's weights at the end of each step (what that step's checkpoint saves), before a trip's restore."""

    def __init__(self):
        self.weights: dict[int, dict[str, torch.Tensor]] = {}

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.weights[state.global_step] = {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_a_trip_stops_grpo_and_the_saved_policy_is_the_last_passing_checks(stages):  # noqa: F811
    from grpo.train import main

    recorder = WeightsAtStepEnd()
    # max_kl 0 trips at the first check that sees a logged KL: step 2 reads step 1's (> 0: DPO != pi_ref); step 1's
    # check sees no log yet (the Trainer logs after the step's callbacks), passes, and is checkpointed
    metrics = main(_argv(stages, "grpo", "--max_steps", "4", *FAST, "--tripwire_max_kl", "0"), callbacks=[recorder])
    out = stages["round"] / "grpo"
    m = read_manifest(out)
    rec = m["tripwire"]
    assert rec["tripped"] and rec["tripped_step"] == 2 and rec["restored_step"] == 1 and rec["baseline_step"] == 0
    assert [(c["step"], c["passed"]) for c in rec["checks"]] == [(0, True), (1, True), (2, False)]
    assert rec["checks"][0]["kl"] is None and rec["checks"][1]["kl"] is None
    (trip,) = rec["trips"]
    assert trip["signal"] == "kl" and trip["values"]["bound"] == 0.0
    assert trip["values"]["kl"] == pytest.approx(metrics["history"][0]["kl"]) and trip["values"]["kl"] > 0
    assert rec["restored_from"] == str(out / "checkpoint-1")
    assert rec["gold_scorer"] is False and rec["n_prompts"] == 2 and rec["config"]["every_steps"] == 1
    # training stopped at the trip (2 of 4 steps), and the stage still finished: the stop was the tripwire's
    assert metrics["train_steps"] == 2 and m["training"]["global_step"] == 2
    assert [h["step"] for h in metrics["history"]] == [1, 2]
    # the saved policy is step 1's (the last passing check), not the one that tripped
    saved = load_file(str(out / "checkpoint" / "model.safetensors"))
    assert all(torch.equal(saved[k], recorder.weights[1][k]) for k in saved)
    assert any(not torch.equal(saved[k], recorder.weights[2][k]) for k in saved)
    assert m["outputs"]["checkpoint_hash"] == content_hash(out / "checkpoint")
    for c in rec["checks"]:  # counters on 2 greedy replies of at most 4 tokens
        assert 1 <= c["median_length"] <= 4 and c["refusal_rate"] in (0.0, 0.5, 1.0)
        assert set(c["style"]) == {"bullets", "restating", "hedged"}
    assert not (out / "tripwire-baseline").exists() and not list(out.glob("checkpoint-*"))


def test_rloo_without_a_trip_records_every_check_with_the_gold_model(stages):  # noqa: F811
    from rloo.train import main

    gold = stages["round"] / "gold_rm"
    shutil.copytree(stages["rm"] / "checkpoint", gold)
    _perturb(gold, seed=7)  # a second reward model: another scorer than the optimised one
    metrics = main(_argv(stages, "rloo", *FAST, "--tripwire_gold_model_path", str(gold), "--tripwire_max_kl",
                         "null", "--tripwire_max_length_ratio", "null", "--tripwire_max_refusal_shift", "null"))
    m = read_manifest(stages["round"] / "rloo")
    rec = m["tripwire"]
    assert not rec["tripped"] and rec["trips"] == [] and rec["restored_from"] is None
    assert [c["step"] for c in rec["checks"]] == [0, 1, 2] and all(c["passed"] for c in rec["checks"])
    # gold: win rate over the first check's (the initial policy's) gold scores; against itself exactly 1/2
    assert rec["checks"][0]["gold"] == 0.5 and all(c["gold"] in (0.0, 0.25, 0.5, 0.75, 1.0) for c in rec["checks"])
    assert rec["gold_scorer"] is True and rec["gold_model_hash"] == content_hash(gold)
    assert rec["best_step_by_gold"] in (0, 1, 2)
    # kl: the latest TRL logged before the check (step 2 reads step 1's)
    assert [c["kl"] for c in rec["checks"]][:2] == [None, None]
    assert rec["checks"][2]["kl"] == pytest.approx(metrics["history"][0]["kl"])
    assert all(isinstance(c["reward"], float) for c in rec["checks"])
    assert metrics["train_steps"] == 2


def test_the_gold_model_must_not_be_the_optimised_one(stages):  # noqa: F811
    from grpo.train import main

    with pytest.raises(ValueError, match="is the optimised reward model"):
        main(_argv(stages, "grpo", *FAST, "--tripwire_gold_model_path", str(stages["rm"] / "checkpoint")))
    assert not (stages["round"] / "grpo" / "manifest.json").exists()


def test_tripwire_fields_from_config(tmp_path):
    from grpo.config import GRPOStageConfig
    from judging.online_tripwire import tripwire_callback, tripwire_config
    from rlhf.config import parse_stage_config
    from test_grpo_rloo import RECIPES

    def parse(*extra):
        (args,) = parse_stage_config((GRPOStageConfig,), ["--config", str(RECIPES / "grpo.yaml"), "--output_dir",
                                                          str(tmp_path), *extra])
        return args

    # the smoke recipe's 2 steps are fewer than the default 10: no check, no callback (and no manifest entry)
    assert tripwire_callback(parse(), ["p"], "h") is None
    assert tripwire_callback(parse("--tripwire_steps", "0", "--max_steps", "20"), ["p"], "h") is None
    cb = tripwire_callback(parse("--tripwire_steps", "2", "--tripwire_n_prompts", "3"), ["a", "b", "c", "d"], "h")
    assert cb.config.every_steps == 2 and cb.measure.prompts == ["a", "b", "c"] and cb.measure.gold_scorer is None
    cfg = tripwire_config(parse("--tripwire_steps", "5", "--tripwire_max_kl", "0.5", "--tripwire_gold_drop", "null"))
    assert (cfg.every_steps, cfg.max_kl, cfg.gold_drop, cfg.max_length_ratio) == (5, 0.5, None, 1.5)
    with pytest.raises(ValueError, match="max_length_ratio must be >= 1"):
        tripwire_config(parse("--tripwire_steps", "1", "--tripwire_max_length_ratio", "0.5"))
    with pytest.raises(ValueError, match="tripwire_n_prompts must be > 0"):
        parse("--tripwire_n_prompts", "0")
    with pytest.raises(ValueError, match=r"tripwire_steps must be >= 0 \(0: off\), got -1"):
        parse("--tripwire_steps", "-1")


def exclamations(completions, **kwargs):
    """A hackable reward (a reward model's blind spot): it pays for exclamation marks."""
    return [float(c[-1]["content"].count("!")) for c in completions]


def penalise_exclamations(prompts, responses):
    """The independent gold scorer: it dislikes what the hackable reward pays for."""
    return [-float(r.count("!")) for r in responses]


def test_a_hacked_reward_trips_grpos_gold_rule_and_the_policy_before_the_hack_is_restored(tmp_path):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from char_tokenizer import build_tiny_tokenizer
    from judging.online_tripwire import OnlineRLTripwire, SliceMeasure
    from judging.tripwires import TripwireConfig
    from rlhf.models import build_tiny_models
    from rlhf.online_rl import pi_ref_trainer

    tok = build_tiny_tokenizer()
    models = build_tiny_models(tok, seed=0)
    models["ref"].save_pretrained(tmp_path / "pi_ref")
    prompts = [f"say {i}" for i in range(4)]
    args = GRPOConfig(output_dir=str(tmp_path / "out"), beta=0.001, num_generations=8, per_device_train_batch_size=16,
                      max_completion_length=8, max_steps=12, learning_rate=1e-3, seed=0, report_to="none",
                      use_cpu=True, bf16=False, save_strategy="no", logging_steps=1, disable_dropout=True)
    rules = TripwireConfig(every_steps=1, max_kl=None, max_length_ratio=None, max_refusal_shift=None)
    tripwire = OnlineRLTripwire(rules, SliceMeasure(prompts, max_new_tokens=8, gold_scorer=penalise_exclamations),
                                record={})
    recorder = WeightsAtStepEnd()
    trainer = pi_ref_trainer(GRPOTrainer)(
        pi_ref=str(tmp_path / "pi_ref"), model=models["policy"], reward_funcs=[exclamations], args=args,
        train_dataset=Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in prompts * 8]),
        processing_class=tok, callbacks=[tripwire, recorder])
    tripwire.bind(trainer)
    trainer.train()
    rec = tripwire.manifest_record()
    assert rec["tripped"], rec["checks"]
    trip_step, restored = rec["tripped_step"], rec["restored_step"]
    checks = {c["step"]: c for c in rec["checks"]}
    (trip,) = [t for t in rec["trips"] if t["signal"] == "gold"]
    # the optimised reward (its mean on the slice's greedy replies) rose while gold fell more than 0.15; the
    # checks before passed (gold at its baseline 0.5: no '!' in the greedy replies yet)
    assert trip["values"]["gold_drop"] > 0.15 and trip["values"]["reward_rise"] > 0
    assert checks[trip_step]["reward"] > checks[0]["reward"] and checks[trip_step]["gold"] < 0.5 - 0.15
    assert sorted(checks) == list(range(trip_step + 1)) and restored == trip_step - 1
    assert trainer.state.global_step == trip_step < 12 and tripwire.stopped_training
    now = trainer.model.state_dict()
    # the policy in memory (what the stage saves) is the last passing check's checkpoint, not the hacked one
    assert restored > 0 and rec["restored_from"] == str(tmp_path / "out" / f"checkpoint-{restored}")
    assert all(torch.equal(now[k], recorder.weights[restored][k]) for k in now)
    assert any(not torch.equal(now[k], recorder.weights[trip_step][k]) for k in now)
    assert all(checks[s]["passed"] for s in range(trip_step)) and rec["best_step_by_gold"] < trip_step
