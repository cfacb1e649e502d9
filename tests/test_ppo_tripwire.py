"""PPO with the reward-hacking tripwire on tiny models: a deliberately hackable reward trips the gold rule, training
stops, and the policy saved is the one of the last check before the hack; ppo.train records it in the manifest."""

import json

import pytest
import torch
from safetensors.torch import load_file

from char_tokenizer import build_tiny_tokenizer
from ppo.config import PPOConfig
from ppo.trainer import TRIPWIRE_SNAPSHOT, PPOTrainer, decode_completions
from rlhf.models import build_tiny_models

PROMPTS = [f"say {i}" for i in range(8)]


class ExclamationRewardPPO(PPOTrainer):
    """PPO whose reward pays for exclamation marks: a reward model's blind spot the policy can hack (every
    completion becomes '!!!!!!!!'), as a length- or refusal-loving reward model's would be."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.weights_at_check: dict[int, dict[str, torch.Tensor]] = {}

    def score_completions(self, prompts, completion_ids, completion_mask):
        texts = decode_completions(self.tokenizer, completion_ids, completion_mask)
        return torch.tensor([float(t.count("!")) for t in texts], device=completion_ids.device)

    def tripwire_check(self):
        # the weights each check judged, before a trip could load others back
        self.weights_at_check[self.global_step] = {k: v.detach().clone() for k, v in self.policy.state_dict().items()}
        return super().tripwire_check()


def penalise_exclamations(prompts, responses):
    """The independent gold scorer: it dislikes what the hackable reward pays for."""
    return [-float(r.count("!")) for r in responses]


def config(tmp_path, **overrides) -> PPOConfig:
    kwargs = dict(num_steps=8, batch_size=8, mini_batch_size=4, micro_batch_size=4, ppo_epochs=2, max_new_tokens=8,
                  learning_rate=3e-3, kl_coef=0.0, output_dir=str(tmp_path), seed=0, tripwire_steps=1,
                  tripwire_n_prompts=8)
    kwargs.update(overrides)
    return PPOConfig(**kwargs)


def test_a_hacked_reward_trips_the_gold_rule_and_the_policy_before_the_hack_is_restored(tmp_path):
    tok = build_tiny_tokenizer()
    m = build_tiny_models(tok, seed=0)
    trainer = ExclamationRewardPPO(config(tmp_path), m["policy"], m["ref"], m["reward"], m["value"], tok, PROMPTS,
                                   gold_scorer=penalise_exclamations)
    history = trainer.train()
    rec = trainer.tripwire_record()
    assert rec["tripped"], rec["checks"]
    trip_step, restored = rec["tripped_step"], rec["restored_step"]
    checks = {c["step"]: c for c in rec["checks"]}
    # the trip: reward up, gold down by more than 0.15 against the best check, at the first check where that holds
    (trip,) = [t for t in rec["trips"] if t["signal"] == "gold"]
    assert trip["step"] == trip_step and trip["values"]["gold_drop"] > 0.15 and trip["values"]["reward_rise"] > 0
    assert checks[trip_step]["reward"] > checks[0]["reward"] and checks[trip_step]["gold"] < 0.5 - 0.15
    assert all(c["passed"] for s, c in checks.items() if s < trip_step)
    assert sorted(checks) == list(range(trip_step + 1)) and restored == trip_step - 1 and rec["baseline_step"] == 0
    # training stopped at the trip, before num_steps
    assert trip_step < 8 and len(history) == trip_step == trainer.global_step
    assert history[-1]["tripwire/passed"] == 0.0 and history[-1]["tripwire/gold"] == checks[trip_step]["gold"]
    # the policy in memory, and the one saved, is the last passing check's; not the hacked one, not the start
    now = trainer.policy.state_dict()
    assert all(torch.equal(now[k], trainer.weights_at_check[restored][k]) for k in now)
    assert any(not torch.equal(now[k], trainer.weights_at_check[trip_step][k]) for k in now)
    assert any(not torch.equal(now[k], trainer.weights_at_check[0][k]) for k in now) or restored == 0
    saved = load_file(str(trainer.save_policy(tmp_path / "checkpoint") / "model.safetensors"))
    assert all(torch.equal(saved[k], now[k]) for k in saved)
    assert json.loads((tmp_path / TRIPWIRE_SNAPSHOT / "step.json").read_text()) == {"step": restored}
    # the best checkpoint is chosen by gold, never by the training reward (which peaks at the trip)
    best = rec["best_step_by_gold"]
    assert best < trip_step and checks[best]["gold"] == max(c["gold"] for c in checks.values() if c["passed"])


def test_without_a_hack_nothing_trips_and_no_gold_scorer_means_no_gold_rule(tmp_path):
    tok = build_tiny_tokenizer()
    m = build_tiny_models(tok, seed=0)
    trainer = PPOTrainer(config(tmp_path, num_steps=2, learning_rate=1e-6), m["policy"], m["ref"], m["reward"],
                         m["value"], tok, PROMPTS)
    trainer.train()
    rec = trainer.tripwire_record()
    assert not rec["tripped"] and rec["trips"] == [] and [c["step"] for c in rec["checks"]] == [0, 1, 2]
    assert rec["gold_scorer"] is False and all(c["gold"] is None for c in rec["checks"])
    assert rec["checks"][0]["kl"] is None and rec["checks"][1]["kl"] is not None and rec["best_step_by_gold"] is None
    assert json.loads((tmp_path / TRIPWIRE_SNAPSHOT / "step.json").read_text()) == {"step": 2}


def test_a_run_shorter_than_tripwire_steps_makes_no_check(tmp_path):
    tok = build_tiny_tokenizer()
    m = build_tiny_models(tok, seed=0)
    trainer = PPOTrainer(config(tmp_path, num_steps=1, tripwire_steps=10), m["policy"], m["ref"], m["reward"],
                         m["value"], tok, PROMPTS)
    trainer.train()
    assert trainer.tripwire is None and trainer.tripwire_record() is None
    assert not (tmp_path / TRIPWIRE_SNAPSHOT).exists()


def test_tripwire_config_fields_are_validated():
    with pytest.raises(ValueError, match="tripwire_steps must be >= 0"):
        PPOConfig(tripwire_steps=-1)
    with pytest.raises(ValueError, match="max_length_ratio"):
        PPOConfig(tripwire_max_length_ratio=0.5)
    with pytest.raises(ValueError, match="tripwire_max_length_ratio must be >= 1"):  # refused even when off
        PPOConfig(tripwire_steps=0, tripwire_max_length_ratio=0.5)


def test_a_resumed_run_replays_the_checks_and_ends_as_the_uninterrupted_one(tmp_path):
    tok = build_tiny_tokenizer()

    def trainer(out, **overrides):
        m = build_tiny_models(tok, seed=0)
        return ExclamationRewardPPO(config(out, num_steps=4, save_steps=2, save_total_limit=3, **overrides),
                                    m["policy"], m["ref"], m["reward"], m["value"], tok, PROMPTS,
                                    gold_scorer=penalise_exclamations)

    whole = trainer(tmp_path / "whole", tripwire_gold_drop=None)  # no trip: every check is made
    whole.train()
    resumed = trainer(tmp_path / "resumed", tripwire_gold_drop=None)
    assert resumed.load_state(tmp_path / "whole" / "checkpoint-2") == 2
    assert [r.signals.step for r in resumed.tripwire.results] == [0, 1, 2]  # replayed from ppo_state.json
    resumed.train()
    assert resumed.tripwire_record() == whole.tripwire_record()
    assert [c["step"] for c in whole.tripwire_record()["checks"]] == [0, 1, 2, 3, 4]
