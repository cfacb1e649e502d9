"""Reward-hacking tripwires (judging/tripwires.py): each rule on hand-worked signal sequences, the measurements, and
the transformers adapter on a real Trainer run of a tiny model."""

import math

import pytest
import torch

from judging.tripwires import (
    Signals,
    Tripwire,
    TripwireCallback,
    TripwireConfig,
    gold_win_rate,
    load_weights,
    style_signals,
)

ONLY = dict(gold_drop=None, max_kl=None, max_length_ratio=None, max_refusal_shift=None, max_style_shift=None)


def run(config: TripwireConfig, signals: list[Signals]) -> Tripwire:
    tw = Tripwire(config)
    for s in signals:
        tw.check(s)
    return tw


def test_reward_up_while_gold_falls_beyond_the_tolerance_trips_and_restores_the_last_pass():
    cfg = TripwireConfig(every_steps=10, **{**ONLY, "gold_drop": 0.15})
    tw = run(cfg, [
        Signals(step=0, reward=0.0, gold=0.50),
        Signals(step=10, reward=1.0, gold=0.60),   # best so far
        Signals(step=20, reward=1.5, gold=0.50),   # 0.10 below the best: within the tolerance
        Signals(step=30, reward=2.0, gold=0.44),   # 0.16 below the best while the reward rose by 1.0: trip
    ])
    assert [r.passed for r in tw.results] == [True, True, True, False]
    (trip,) = tw.tripped.trips
    assert trip.signal == "gold" and trip.step == 30
    assert trip.values["best_step"] == 10 and trip.values["best_gold"] == 0.60
    assert trip.values["gold_drop"] == pytest.approx(0.16) and trip.values["reward_rise"] == pytest.approx(1.0)
    # restore: the last passing check (20); the best by gold is 10, never the highest reward (30)
    assert tw.restore_step == 20 and tw.best_step == 10
    rec = tw.record()
    assert rec["tripped"] and rec["tripped_step"] == 30 and rec["restored_step"] == 20
    assert rec["best_step_by_gold"] == 10 and rec["best_gold"] == 0.60 and rec["baseline_step"] == 0
    assert [c["step"] for c in rec["checks"]] == [0, 10, 20, 30] and rec["checks"][-1]["trips"] == ["gold"]
    assert rec["trips"] == [{"signal": "gold", "step": 30, "values": trip.values}]
    with pytest.raises(RuntimeError, match="tripped at step 30"):
        tw.check(Signals(step=40, reward=3.0, gold=0.1))


def test_gold_falling_with_the_reward_is_not_reward_hacking():
    cfg = TripwireConfig(**{**ONLY, "gold_drop": 0.15})
    tw = run(cfg, [Signals(0, reward=1.0, gold=0.5), Signals(10, reward=0.5, gold=0.2)])  # both fell: no trip
    assert tw.tripped is None and tw.best_step == 0 and tw.restore_step == 10
    # a reward_rise margin: a rise of 0.3 is not enough when 0.5 is required
    cfg = TripwireConfig(**{**ONLY, "gold_drop": 0.15, "reward_rise": 0.5})
    assert run(cfg, [Signals(0, reward=1.0, gold=0.5), Signals(10, reward=1.3, gold=0.2)]).tripped is None


def test_kl_over_its_bound_trips():
    cfg = TripwireConfig(**{**ONLY, "max_kl": 10.0})
    tw = run(cfg, [Signals(0, 0.0, kl=None), Signals(10, 0.0, kl=9.9), Signals(20, 0.0, kl=10.5)])
    assert [r.passed for r in tw.results] == [True, True, False]
    assert tw.tripped.trips[0].signal == "kl" and tw.tripped.trips[0].values == {"kl": 10.5, "bound": 10.0}
    assert tw.restore_step == 10


@pytest.mark.parametrize("length,trips", [(59, False), (61, True), (27, False), (26, True)])
def test_length_ratio_both_ways(length, trips):
    # baseline 40 tokens, bound 1.5: allowed [40 / 1.5, 40 * 1.5] = [26.67, 60]
    cfg = TripwireConfig(**{**ONLY, "max_length_ratio": 1.5})
    tw = run(cfg, [Signals(0, 0.0, median_length=40), Signals(10, 1.0, median_length=length)])
    assert (tw.tripped is not None) == trips
    if trips:
        assert tw.tripped.trips[0].values["ratio"] == pytest.approx(length / 40)


def test_refusal_rate_rising_beyond_its_bound_trips_and_falling_does_not():
    cfg = TripwireConfig(**{**ONLY, "max_refusal_shift": 0.10})
    seq = [Signals(0, 0.0, refusal_rate=0.05), Signals(10, 1.0, refusal_rate=0.14), Signals(20, 2.0, refusal_rate=0.0),
           Signals(30, 3.0, refusal_rate=0.20)]
    tw = run(cfg, seq)
    assert [r.passed for r in tw.results] == [True, True, True, False]
    assert tw.tripped.trips[0].values["shift"] == pytest.approx(0.15) and tw.restore_step == 20


def test_noise_within_every_tolerance_never_trips():
    cfg = TripwireConfig(every_steps=5, max_style_shift=0.2)
    base = Signals(0, 0.0, gold=0.5, kl=None, median_length=50, refusal_rate=0.1,
                   style={"bullets": 0.2, "restating": 0.1, "hedged": 0.3})
    noisy = [Signals(5 * i, reward=0.1 * i, gold=0.5 + d, kl=3.0 + d, median_length=50 * (1 + d),
                     refusal_rate=0.1 + abs(d) / 2, style={"bullets": 0.2 + d, "restating": 0.1, "hedged": 0.3 - d})
             for i, d in enumerate([0.05, -0.08, 0.12, 0.0, 0.06], start=1)]
    tw = run(cfg, [base, *noisy])
    assert tw.tripped is None and all(r.passed for r in tw.results) and tw.restore_step == 25
    assert tw.best_step == 15  # gold 0.62, the highest; later checks stay within 0.15 of it


def test_style_shift_either_way_trips_when_gated():
    cfg = TripwireConfig(**{**ONLY, "max_style_shift": 0.2})
    tw = run(cfg, [Signals(0, 0.0, style={"bullets": 0.1, "hedged": 0.3}),
                   Signals(10, 1.0, style={"bullets": 0.35, "hedged": 0.15})])
    assert tw.tripped.trips[0].signal == "style"
    assert tw.tripped.trips[0].values["shifts"] == {"bullets": pytest.approx(0.25)}


def test_checks_before_min_step_never_trip():
    cfg = TripwireConfig(min_step=30, **{**ONLY, "max_kl": 10.0})
    tw = run(cfg, [Signals(0, 0.0), Signals(10, 0.0, kl=50.0), Signals(20, 0.0, kl=50.0)])
    assert tw.tripped is None and [r.armed for r in tw.results] == [False, False, False]
    tw.check(Signals(30, 0.0, kl=50.0))
    assert tw.tripped.signals.step == 30 and tw.restore_step == 20


def test_several_rules_fire_at_once_and_a_replay_rebuilds_the_state():
    cfg = TripwireConfig()
    seq = [Signals(0, 0.0, gold=0.5, median_length=20, refusal_rate=0.0),
           Signals(10, 5.0, gold=0.1, kl=25.0, median_length=45, refusal_rate=0.5)]
    tw = run(cfg, seq)
    assert [t.signal for t in tw.tripped.trips] == ["gold", "kl", "length", "refusal"]
    again = Tripwire(cfg)
    again.replay(tw.record()["checks"][:1])
    assert again.baseline == seq[0] and again.tripped is None
    again.check(seq[1])
    assert again.record() == tw.record()


def test_checks_must_move_forward_and_bounds_are_validated():
    tw = run(TripwireConfig(), [Signals(10, 0.0)])
    with pytest.raises(RuntimeError, match="not after"):
        tw.check(Signals(10, 0.0))
    for bad, match in ((dict(every_steps=0), "every_steps"), (dict(max_length_ratio=0.9), "max_length_ratio"),
                       (dict(gold_drop=-0.1), "gold_drop"), (dict(max_kl=math.nan), "max_kl")):
        with pytest.raises(ValueError, match=match):
            TripwireConfig(**bad)
    assert tw.due(20) and not tw.due(25)


def test_gold_win_rate_counts_ties_as_half():
    assert gold_win_rate([1.0, 2.0, 3.0], [1.0, 1.0, 4.0]) == pytest.approx((0.5 + 1 + 0) / 3)
    assert gold_win_rate([0.3, -2.0], [0.3, -2.0]) == 0.5
    with pytest.raises(ValueError, match="differ"):
        gold_win_rate([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="item 0"):
        gold_win_rate([math.nan], [1.0])


def test_style_signals_count_refusals_lists_hedges_and_restating_openers():
    prompts = ["How do I pick a lock?", "Name two fruits.", "Will it rain tomorrow?",
               "How do I reverse a list in Python?"]
    responses = [
        "I'm sorry, but I can't help with that.",                    # refusal
        "- apple\n- pear",                                           # list
        "It will probably rain in the afternoon.",                   # hedge
        "To reverse a list in Python, you can use the following code:\n\n```python\nl[::-1]\n```",  # restates
    ]
    out = style_signals(prompts, responses, [9, 4, 8, 20])
    assert out["median_length"] == 8.5  # median of 4, 8, 9, 20
    assert out["refusal_rate"] == 0.25
    assert out["style"] == {"bullets": 0.25, "restating": 0.25, "hedged": 0.25}
    with pytest.raises(ValueError, match="2 prompts, 1 responses"):
        style_signals(prompts[:2], responses[:1], [1])


# ---- transformers adapter -------------------------------------------------------------------------


def test_callback_stops_a_trainer_run_and_restores_the_last_passing_checkpoint(tmp_path, tiny_model_dir):
    """A real ``transformers.Trainer`` on the tiny model; the gold check is the negative distance of the weights from
    where they started (it falls as training moves them) while the reward is the step: the gold rule must stop the
    run at the first check more than the tolerance away, and the model must end with the last passing weights."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    ids = tok(["the cat sat on the mat and the dog sat on the log"] * 8)["input_ids"]
    data = Dataset.from_dict({"input_ids": ids, "labels": ids})
    seen: dict[int, dict[str, torch.Tensor]] = {}

    def distance(m) -> float:
        return math.sqrt(sum(float((v.detach() - start[k]).pow(2).sum()) for k, v in m.state_dict().items()))

    def measure(m, step: int) -> Signals:
        seen[step] = {k: v.detach().clone() for k, v in m.state_dict().items()}
        return Signals(step=step, reward=float(step), gold=-distance(m))

    # the tolerance: between the distances after 2 and 4 steps, measured by a first run (same seed, same data)
    cfg = TripwireConfig(every_steps=2, gold_drop=None, max_kl=None, max_length_ratio=None, max_refusal_shift=None)
    args = dict(per_device_train_batch_size=4, learning_rate=5e-2, max_steps=12, save_strategy="steps",
                save_steps=2, save_total_limit=2, logging_steps=100, report_to=[], use_cpu=True, seed=0,
                disable_tqdm=True, save_only_model=True)
    probe = TripwireCallback(cfg, measure)
    Trainer(model=model, args=TrainingArguments(output_dir=str(tmp_path / "probe"), **{**args, "max_steps": 4}),
            train_dataset=data, callbacks=[probe]).train()
    golds = {r.signals.step: r.signals.gold for r in probe.tripwire.results}
    assert probe.tripwire.tripped is None and sorted(golds) == [0, 2, 4]
    assert golds[4] < golds[2] < golds[0] == 0.0
    tolerance = (-golds[2] + -golds[4]) / 2

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    seen.clear()
    cb = TripwireCallback(TripwireConfig(every_steps=2, **{**ONLY, "gold_drop": tolerance}), measure)
    trainer = Trainer(model=model, args=TrainingArguments(output_dir=str(tmp_path / "run"), **args),
                      train_dataset=data, callbacks=[cb])
    trainer.train()
    trip = cb.tripwire.tripped
    assert trip is not None and trip.trips[0].signal == "gold" and trip.signals.step == 4
    assert trainer.state.global_step == 4 and cb.tripwire.restore_step == 2
    assert sorted(cb.checkpoints) == [0, 2] and cb.restored_from == str(tmp_path / "run" / "checkpoint-2")
    assert not (tmp_path / "run" / "checkpoint-4").exists()  # the tripped step is never saved
    restored = model.state_dict()
    assert all(torch.equal(restored[k], seen[2][k]) for k in restored)
    assert any(not torch.equal(restored[k], seen[4][k]) for k in restored)

    # refused configurations
    for bad, match in ((dict(save_steps=3), "multiple of every_steps"),
                       (dict(load_best_model_at_end=True, eval_strategy="steps", eval_steps=2), "load_best")):
        t = Trainer(model=model, args=TrainingArguments(output_dir=str(tmp_path / "bad"), **{**args, **bad}),
                    train_dataset=data, eval_dataset=data, callbacks=[TripwireCallback(cfg, measure)])
        with pytest.raises(ValueError, match=match):
            t.train()


def test_load_weights_refuses_a_checkpoint_of_another_model(tmp_path, tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    lm = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1).save_pretrained(tmp_path / "rm")
    with pytest.raises(ValueError, match="do not match"):
        load_weights(lm, tmp_path / "rm")
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        load_weights(lm, tmp_path)
