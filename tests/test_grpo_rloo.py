"""grpo.train / rloo.train (TRL's GRPOTrainer / RLOOTrainer through rlhf.online_rl): a few steps on tiny SFT / DPO /
reward-model stage directories, the reference model being pi_ref (not the DPO policy TRL would load), the unlock
decision honoured, and the round flow's choice of online-RL stage."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from rlhf.checkpoint import freeze_dir
from rlhf.lineage import content_hash
from rlhf.manifest import read_manifest, write_manifest
from rlhf.models import save_tiny_models

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "recipes" / "smoke"


def _stage_dir(root: Path, name: str, checkpoint_src: Path, **outputs) -> Path:
    d = root / name
    shutil.copytree(checkpoint_src, d / "checkpoint")
    write_manifest(d, {"stage": name, "outputs": {"checkpoint": str((d / "checkpoint").resolve()),
                                                  "checkpoint_hash": content_hash(d / "checkpoint"), **outputs}})
    return d


def _perturb(model_dir: Path, seed: int = 1) -> None:
    """Add seeded noise to every weight, so the DPO policy differs from pi_ref (as after real DPO steps)."""
    path = model_dir / "model.safetensors"
    weights = load_file(str(path))
    g = torch.Generator().manual_seed(seed)
    save_file({k: v + 0.02 * torch.randn(v.shape, generator=g) for k, v in weights.items()}, str(path),
              metadata={"format": "pt"})


@pytest.fixture
def stages(tmp_path):
    """A round's stage directories as the flow leaves them: sft (frozen pi_ref), dpo (pi_ref + noise), reward_model,
    and an unlocked decision file."""
    paths = save_tiny_models(tmp_path / "models")
    _perturb(paths["policy"])
    round_dir = tmp_path / "round"
    sft = round_dir / "sft"
    shutil.copytree(paths["ref"], sft / "pi_ref")
    pi_ref_hash = freeze_dir(sft / "pi_ref")
    _stage_dir(round_dir, "sft", paths["ref"], pi_ref=str((sft / "pi_ref").resolve()), pi_ref_hash=pi_ref_hash)
    dpo = _stage_dir(round_dir, "dpo", paths["policy"])
    rm = _stage_dir(round_dir, "reward_model", paths["reward"])
    unlock = round_dir / "ppo_unlock.json"
    unlock.write_text(json.dumps({"unlocked": True, "rm_agreement": 0.7, "inter_annotator_agreement": 0.6}))
    return {"paths": paths, "round": round_dir, "sft": sft, "dpo": dpo, "rm": rm, "unlock": unlock,
            "pi_ref": sft / "pi_ref", "pi_ref_hash": pi_ref_hash}


def _argv(stages, name: str, *extra: str) -> list[str]:
    return ["--config", str(RECIPES / f"{name}.yaml"), "--output_dir", str(stages["round"] / name),
            "--sft_dir", str(stages["sft"]), "--policy_dir", str(stages["dpo"]),
            "--reward_model_dir", str(stages["rm"]), "--ppo_unlock_json", str(stages["unlock"]),
            "--round_id", "r1", "--report_to", "none", *extra]


def _check_run(stages, name: str, metrics: dict) -> dict:
    """What every online-RL run must leave: a trained checkpoint, pi_ref unmoved and recorded, per-step history."""
    out = stages["round"] / name
    m = read_manifest(out)
    assert m["stage"] == name and m["round_id"] == "r1" and m["metrics"] == metrics
    assert content_hash(stages["pi_ref"]) == stages["pi_ref_hash"]
    assert m["inputs"]["pi_ref"] == str(stages["pi_ref"].resolve())
    assert m["inputs"]["pi_ref_hash"] == stages["pi_ref_hash"]
    assert m["inputs"]["policy_hash"] == content_hash(stages["dpo"] / "checkpoint")
    assert m["inputs"]["reward_model_hash"] == content_hash(stages["rm"] / "checkpoint")
    assert m["inputs"]["ppo_unlock"]["unlocked"] is True
    assert m["outputs"]["checkpoint_hash"] == content_hash(out / "checkpoint")
    trained = load_file(str(out / "checkpoint" / "model.safetensors"))
    start = load_file(str(stages["dpo"] / "checkpoint" / "model.safetensors"))
    assert any(not torch.equal(trained[k], start[k]) for k in start), "the policy was trained"
    # the reference the trainer held was compared with pi_ref's files, every tensor
    assert metrics["reference"] == str(stages["pi_ref"].resolve())
    assert metrics["reference_tensors"] == len(load_file(str(stages["pi_ref"] / "model.safetensors")))
    history = metrics["history"]
    assert [h["step"] for h in history] == [1, 2] and metrics["train_steps"] == 2
    for h in history:
        assert {"reward", "reward_std", "kl", "loss", "num_tokens", "completions/mean_length"} <= set(h)
        assert len(h["completions"]) == 2  # the whole rollout: 1 prompt x num_generations 2
        assert all(c["completion"] and "reward_model" in c["rewards"] for c in h["completions"])
    # tokens/s: TRL's count of rollout tokens (prompt + completion, attention-masked), once per iteration
    eff = metrics["efficiency"]
    assert eff["rollout_tokens"] == history[-1]["num_tokens"] > 0 and eff["tokens"] == eff["rollout_tokens"]
    assert eff["tokens_per_s"] > 0 and eff["mfu"] is not None and 0 < eff["mfu"] < 1
    assert not list(out.glob("checkpoint-*")), "resume checkpoints pruned once the manifest is written"
    return m


def test_grpo_trains_the_dpo_policy_against_pi_ref(stages):
    from grpo.train import main

    metrics = main(_argv(stages, "grpo"))
    _check_run(stages, "grpo", metrics)
    first = metrics["history"][0]
    # step 1 samples from the DPO policy before any update: its KL to pi_ref is > 0 because DPO != pi_ref. Had TRL
    # built its default reference (from the policy's own path, the DPO checkpoint) it would be exactly 0.
    assert first["kl"] > 1e-4
    for h in metrics["history"]:  # the step's mean reward is the mean of its completions' reward-model scores
        scores = [c["rewards"]["reward_model"] for c in h["completions"]]
        assert h["reward"] == pytest.approx(sum(scores) / len(scores), abs=1e-6)
        assert h["rewards/reward_model/mean"] == pytest.approx(h["reward"], abs=1e-6)
        # GRPO's advantage: reward minus the group mean, over the group's std (scale_rewards "group"); 2 a group
        adv = [c["advantage"] for c in h["completions"]]
        assert adv[0] == pytest.approx(-adv[1], abs=1e-5) and (scores[0] > scores[1]) == (adv[0] > 0)
    assert metrics["reward_functions"] == ["reward_model"] and metrics["beta"] == 0.04


def test_rloo_with_weighted_reward_functions(stages):
    from rloo.train import main

    metrics = main(_argv(stages, "rloo", "--reward_functions", "reward_model", "repetition_penalty",
                         "--reward_weights", "1.0", "0.5"))
    _check_run(stages, "rloo", metrics)
    assert metrics["reward_functions"] == ["reward_model", "repetition_penalty"]
    assert metrics["reward_weights"] == [1.0, 0.5]
    for h in metrics["history"]:
        # TRL sums weight x reward per completion; the mean is linear, so the step's reward is the weighted sum of
        # each function's mean
        assert h["reward"] == pytest.approx(h["rewards/reward_model/mean"] + 0.5 * h["rewards/repetition_penalty/mean"],
                                            abs=1e-5)
        assert all(-1.0 <= c["rewards"]["repetition_penalty"] <= 0.0 for c in h["completions"])
        # RLOO's advantage with 2 completions: each one's reward minus the other's (the leave-one-out baseline)
        r = [c["rewards"]["reward_model"] + 0.5 * c["rewards"]["repetition_penalty"] for c in h["completions"]]
        assert (r[0] > r[1]) == (h["completions"][0]["advantage"] > 0)
    assert metrics["history"][0]["kl"] != 0.0  # DPO != pi_ref: the reference is not the policy's start


def test_a_judge_backend_rewards_each_completion_against_its_reference(stages, tmp_path):
    """``reward_functions: [judge]`` with an OpenAI-compatible judge on loopback (a real HTTP server whose "model"
    prefers the longer output): each completion's reward is the judge's verdict against the prompt's reference
    answer, both orders asked: +0.5 when the completion wins both, -0.5 when the reference does, 0 when the two
    orders disagree. The reward is the length the judge pays for: the deliberately hackable case."""
    from grpo.train import main
    from judging.openai_judge import TEMPLATE, combine, fill
    from tests.policy_judge_server import answer, start_policy_server

    prompts = tmp_path / "prompts.jsonl"
    refs = ["A short one.", "x", "A reference answer that is longer than eight tokens of the tiny model, surely.",
            "Two words."]
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"Question {i}?", "reference": r}) + "\n"
                               for i, r in enumerate(refs)))
    with start_policy_server(tmp_path, name="judge", policy="longer") as server:
        judge = json.dumps({"backend": "openai", "base_url": server["base_url"], "model": "judge",
                            "cache_dir": str(tmp_path / "judgments")})
        metrics = main(_argv(stages, "grpo", "--train_data", str(prompts), "--reward_functions", "judge",
                             "--reward_judge", judge, "--tripwire_steps", "1", "--tripwire_n_prompts", "2"))
        requests = server["log"].read_text().count("POST /v1/chat/completions")
    n = 0
    for h in metrics["history"]:
        assert h["rewards/judge/mean"] == pytest.approx(h["reward"], abs=1e-6)
        for c in h["completions"]:
            # the manifest keeps the chat-rendered prompt; the judge is shown the user's question
            (question, ref), = [(f"Question {i}?", r) for i, r in enumerate(refs) if f"Question {i}?" in c["prompt"]]
            # the verdict the server gives for (reference, completion) in each order, as the judge asks
            verdict = combine(answer("longer", fill(TEMPLATE, question, ref, c["completion"])),
                              answer("longer", fill(TEMPLATE, question, c["completion"], ref)))
            assert c["rewards"]["judge"] == pytest.approx(verdict.preference - 1.5)
            if len(c["completion"]) > len(ref) and '"""' not in c["completion"]:
                assert c["rewards"]["judge"] == 0.5  # the judge pays for length
            n += 1
    assert n == 4  # 2 steps x 1 prompt x 2 generations
    record = metrics["reward_records"]["judge"]
    # the tripwire's checks (steps 0, 1, 2) score their 2-prompt slice with the same judge, reference included
    checks = read_manifest(stages["round"] / "grpo")["tripwire"]["checks"]
    assert [c["step"] for c in checks] == [0, 1, 2]
    assert all(c["reward"] in (-0.5, -0.25, 0.0, 0.25, 0.5) for c in checks)  # mean of 2 verdicts in {-0.5, 0, 0.5}
    assert record["n_judged"] == 4 + 3 * 2 and record["n_unparsed"] == 0
    assert record["identity"]["backend"] == "openai" and record["identity"]["model"] == "judge"
    # both orders per completion: the 4 rollout completions are distinct (8 requests); a slice answer the greedy
    # policy repeats at a later check comes from the judge's cache (4 to 12 requests)
    assert 8 + 4 <= record["requests_sent"] <= 8 + 12
    # every request counted at the server: the judging ones and the identity probe's chat requests (its other
    # request is the GET of the model listing)
    assert record["requests_sent"] + record["identity_report"]["probe_requests_sent"] - 1 == requests
    assert "api_key" not in json.dumps(record)
    assert metrics["reward_functions"] == ["judge"]


def test_a_pairwise_judge_as_the_tripwires_gold_check(stages, tmp_path):
    """``tripwire_gold_judge``: a judge other than the optimised reward model (here an OpenAI-compatible server on
    loopback that prefers the shorter answer) scores the gold check as the win rate of the slice's current greedy
    answers over the first check's: 0.5 at the first check (the answers are their own baseline, nothing asked)."""
    from grpo.train import main
    from tests.policy_judge_server import start_policy_server

    with start_policy_server(tmp_path, name="gold", policy="shorter") as server:
        gold = json.dumps({"backend": "openai", "base_url": server["base_url"], "model": "gold",
                           "cache_dir": str(tmp_path / "judgments")})
        # a large step so the greedy answers move and the judge has something to judge
        main(_argv(stages, "grpo", "--tripwire_steps", "1", "--tripwire_n_prompts", "2", "--learning_rate", "0.05",
                   "--tripwire_max_kl", "1000", "--tripwire_max_length_ratio", "100", "--tripwire_max_refusal_shift",
                   "1", "--tripwire_gold_drop", "1", "--tripwire_gold_judge", gold))
        requests = server["log"].read_text().count("POST /v1/chat/completions")
    record = read_manifest(stages["round"] / "grpo")["tripwire"]
    # the answers moved: the later checks asked the judge (both orders per changed answer); the server counted
    # those and the identity probe's 8 chat requests
    assert 0 < record["gold_judge"]["requests_sent"] <= 2 * 2 * 2
    assert record["gold_judge"]["requests_sent"] + 8 == requests
    checks = record["checks"]
    assert [c["step"] for c in checks] == [0, 1, 2] and checks[0]["gold"] == 0.5
    assert all(c["gold"] in (0.0, 0.25, 0.5, 0.75, 1.0) for c in checks)  # 2 prompts, draws 1/2
    assert record["gold_scorer"] is True and record["gold_judge"]["identity"]["model"] == "gold"
    assert "api_key" not in json.dumps(record)


@pytest.mark.parametrize(("extra", "message"), [
    (["--tripwire_gold_judge", '{"backend": "reward_model"}'], "is the optimised reward model"),
    (["--tripwire_gold_judge", '{"backend": "openai"}', "--tripwire_gold_model_path", "x"],
     "tripwire_gold_judge and tripwire_gold_model_path both set"),
])
def test_a_gold_judge_that_is_the_optimised_reward_is_refused(stages, extra, message):
    from grpo.train import main

    with pytest.raises(ValueError, match=message):
        main(_argv(stages, "grpo", "--tripwire_steps", "1", *extra))
    assert not (stages["round"] / "grpo" / "checkpoint").exists()


def test_the_judge_reward_defaults_to_the_rounds_reward_model(stages):
    """Without ``reward_judge`` the judge is the round's reward model as a pairwise judge: the completion wins when
    it scores above its prompt's reference answer (the pair file's chosen reply)."""
    from rloo.train import main

    metrics = main(_argv(stages, "rloo", "--reward_functions", "judge", "--tripwire_steps", "0"))
    record = metrics["reward_records"]["judge"]
    assert record["identity"]["backend"] == "reward_model"
    assert record["identity"]["content_hash"] == content_hash(stages["rm"] / "checkpoint")
    assert record["requests_sent"] == 0 and record["n_judged"] == 4 and record["n_unparsed"] == 0
    rewards = [c["rewards"]["judge"] for h in metrics["history"] for c in h["completions"]]
    assert len(rewards) == 4 and set(rewards) <= {-0.5, 0.0, 0.5}


def test_the_judge_reward_refuses_prompts_without_a_reference(stages, tmp_path):
    """A prompt file without reference answers cannot be judged against them: refused before any model loads,
    naming the file and the first ids."""
    from grpo.train import main

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"Question {i}?"}) + "\n" for i in range(3)))
    with pytest.raises(ValueError, match=rf"{prompts}: 3 of 3 prompts have no reference answer \(first: p0, p1, p2\)"):
        main(_argv(stages, "grpo", "--train_data", str(prompts), "--reward_functions", "judge"))
    assert not (stages["round"] / "grpo" / "checkpoint").exists()


def test_the_reference_is_pi_ref_not_the_policy_trl_would_load(stages):
    """TRL 1.16 loads its reference from the policy's own path (here the DPO checkpoint); the stage's trainer loads
    pi_ref instead, and check_reference tells the two apart."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from rlhf.online_rl import check_reference, pi_ref_trainer

    dpo, pi_ref = stages["dpo"] / "checkpoint", stages["pi_ref"]
    tok = AutoTokenizer.from_pretrained(dpo)
    args = GRPOConfig(output_dir=str(stages["round"] / "t"), beta=0.04, num_generations=2,
                      per_device_train_batch_size=2, max_completion_length=4, report_to="none", use_cpu=True,
                      bf16=False)
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": "hi"}]}] * 2)

    def build(cls, **kw):
        policy = AutoModelForCausalLM.from_pretrained(dpo, dtype=torch.float32)
        rm = AutoModelForSequenceClassification.from_pretrained(stages["rm"] / "checkpoint", dtype=torch.float32)
        return policy, cls(model=policy, reward_funcs=rm, args=args, train_dataset=data, processing_class=tok,
                           reward_processing_classes=tok, **kw)

    policy, trainer = build(pi_ref_trainer(GRPOTrainer), pi_ref=str(pi_ref), reward_names=["reward_model"])
    assert policy.config._name_or_path == str(dpo), "the policy's own name is back after construction"
    assert trainer.reward_func_names == ["reward_model"]
    assert check_reference(trainer, str(pi_ref))["reference_tensors"] > 0
    ref = dict(trainer.ref_model.state_dict())
    files = load_file(str(pi_ref / "model.safetensors"))
    assert all(torch.equal(ref[k], v) for k, v in files.items())
    with pytest.raises(RuntimeError, match=r"the reference model is not pi_ref .*differs"):
        check_reference(trainer, str(dpo))

    _, plain = build(GRPOTrainer)  # TRL's own: the reference is the DPO policy, which check_reference refuses
    with pytest.raises(RuntimeError, match="the reference model is not pi_ref"):
        check_reference(plain, str(pi_ref))


def test_a_locked_decision_refuses_to_run(stages):
    from grpo.train import main

    stages["unlock"].write_text(json.dumps({"unlocked": False, "rm_agreement": 0.55,
                                            "inter_annotator_agreement": 0.6}))
    with pytest.raises(RuntimeError, match=r"ppo_unlock.json: online RL \(grpo\) is locked \(RM agreement 0.55 is "
                                           r"not above inter-annotator agreement 0.6\).*--ppo-override"):
        main(_argv(stages, "grpo"))
    assert not (stages["round"] / "grpo" / "manifest.json").exists()
    assert not (stages["round"] / "grpo" / "checkpoint").exists()
    stages["unlock"].write_text(json.dumps({"locked": True}))
    with pytest.raises(ValueError, match="not a PPO unlock decision"):
        main(_argv(stages, "grpo"))


@pytest.mark.parametrize(("extra", "message"), [
    (["--beta", "0"], "beta 0.0: must be > 0"),
    (["--use_peft", "true"], "use_peft: with LoRA TRL's reference is the adapter-disabled policy"),
    (["--sync_ref_model", "true"], "sync_ref_model: .*pi_ref never moves"),
    (["--reward_functions", "length"], r"reward_functions \['length'\]: unknown \['length'\]"),
    (["--reward_judge", '{"backend": "openai"}'], r"reward_judge is set but reward_functions \['reward_model'\] "
                                                   r"has no 'judge': it would be ignored"),
    (["--reward_functions", "judge", "--reward_judge", '{"backend": "openai", "api_key": "sk-live-123"}'],
     r"--reward_judge.*api_key"),
    (["--reward_functions", "judge", "--reward_judge", "[1, 2]"], r"--reward_judge: expected a mapping"),
    (["--reward_functions", "reward_model", "soft_overlong", "--reward_weights", "1.0"],
     "reward_weights .*one weight per reward function"),
])
def test_configs_that_would_not_take_the_kl_to_pi_ref_are_refused(extra, message, tmp_path):
    from grpo.config import GRPOStageConfig
    from rlhf.config import parse_stage_config

    with pytest.raises(ValueError, match=message):
        parse_stage_config((GRPOStageConfig,), ["--config", str(RECIPES / "grpo.yaml"), "--output_dir",
                                                str(tmp_path), *extra])


def test_the_round_runs_the_chosen_online_rl_stage_when_unlocked(tmp_path):
    from flows.round import RoundParameters, checked_stages, online_rl_stage, stage_args

    dirs = {"sft": "S", "dpo": "D", "reward_model": "R"}
    for name in ("ppo", "grpo", "rloo"):
        params = RoundParameters(preset="smoke", online_rl=name)
        assert online_rl_stage(params, {"unlocked": True}) == name
        assert online_rl_stage(params, {"unlocked": False}) is None
        decon = [] if name == "ppo" else ["--decontaminate_against", str((tmp_path / "gate_suites.yaml").resolve())]
        assert stage_args(name, params, tmp_path, dirs) == [
            "--sft_dir", "S", "--policy_dir", "D", "--reward_model_dir", "R",
            "--ppo_unlock_json", str(tmp_path / "ppo_unlock.json"), *decon]
        # recipes checked up front: the chosen stage's only, and only when the override makes it run for sure
        assert not {"ppo", "grpo", "rloo"} & set(checked_stages(params))
        forced = params.model_copy(update={"ppo_override": True, "ppo_override_reason": "test"})
        assert {"ppo", "grpo", "rloo"} & set(checked_stages(forced)) == {name}
        # and when a --set names it: a mistyped key is said now, even if the unlock rule would never start it
        named = params.model_copy(update={"overrides": {name: ["--beta", "0.1"]}})
        assert {"ppo", "grpo", "rloo"} & set(checked_stages(named)) == {name}
    assert RoundParameters().online_rl == "ppo"
    with pytest.raises(ValueError, match="online_rl"):
        RoundParameters(online_rl="a2c")
    with pytest.raises(ValueError, match=r"overrides for grpo, but online_rl is 'ppo': they would be ignored"):
        RoundParameters(overrides={"grpo": ["--beta", "0.1"]})
    with pytest.raises(ValueError, match=r"force for ppo, but online_rl is 'rloo'"):
        RoundParameters(online_rl="rloo", force=["ppo"])


def test_the_round_gives_its_judge_to_the_trl_stages_as_their_gold_check(tmp_path):
    """The gates' judge, when it is an independent one (openai, sequence_classifier), is the TRL stages' tripwire
    gold check; not the default reward_model judge (the optimised model), not over the stage's own gold settings,
    not to PPO (its gold check is a reward model), not when the tripwire is off."""
    from flows.round import RoundParameters, stage_args

    dirs = {"sft": "S", "dpo": "D", "reward_model": "R"}
    judge = {"backend": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m", "api_key_env": "MY_KEY"}
    gates = ["--judge", json.dumps(judge)]
    checks = ["--tripwire_steps", "1"]  # the smoke recipes' 2 steps make no check at the default 10

    def args_of(name, gates_args, stage_args_=()):
        over = {"gates": gates_args, name: [*checks, *stage_args_]}
        return stage_args(name, RoundParameters(preset="smoke", online_rl=name, overrides=over), tmp_path, dirs)

    for name in ("grpo", "rloo"):
        args = args_of(name, gates)
        assert json.loads(args[args.index("--tripwire_gold_judge") + 1]) == judge
        assert "--tripwire_gold_judge" not in args_of(name, [])  # the default reward_model judge
        assert "--tripwire_gold_judge" not in stage_args(  # no check in the smoke recipe's 2 steps
            name, RoundParameters(preset="smoke", online_rl=name, overrides={"gates": gates}), tmp_path, dirs)
        for own in (["--tripwire_gold_model_path", "G"], ["--tripwire_gold_judge", '{"backend": "openai"}'],
                    ["--tripwire_steps", "0"]):
            assert args_of(name, gates, own).count("--tripwire_gold_judge") == 0  # the flow adds none
    classifier = ["--judge", json.dumps({"backend": "sequence_classifier", "model": "some/classifier"})]
    args = args_of("grpo", classifier)
    assert json.loads(args[args.index("--tripwire_gold_judge") + 1])["model"] == "some/classifier"
    labels = ["--judge", json.dumps({"backend": "labels", "model": "labels.jsonl"})]
    assert "--tripwire_gold_judge" not in args_of("grpo", labels)
    assert "--tripwire_gold_judge" not in args_of("ppo", gates)


def test_the_tripwire_watches_win_rate_prompts_the_gates_do_not_score(tmp_path):
    """The round's tripwire slice: tripwire_n_prompts win-rate prompts of the gate suite, none of the n_winrate the
    gates score (gates.suites.held_back), passed to the round's online-RL stage; none when the stage names its own
    slice or makes no check; with the judge reward, only prompts with a reference."""
    from data.loaders import load_eval_prompts
    from flows.round import RoundParameters, stage_args, tripwire_slice_file
    from gates.suites import stratified

    dirs = {"sft": "S", "dpo": "D", "reward_model": "R"}
    winrate = "demo:alpaca_eval/annotations/baseline_gpt4_1106_preview.jsonl.gz"  # the smoke gates' suite
    scored = {r.prompt for r in stratified(list(load_eval_prompts(winrate)), 10)}  # smoke: n_winrate 10
    for name in ("ppo", "grpo", "rloo"):
        steps = ["--num_steps", "2"] if name == "ppo" else ["--max_steps", "2"]
        params = RoundParameters(preset="smoke", online_rl=name, overrides={
            name: [*steps, "--tripwire_steps", "1", "--tripwire_n_prompts", "12"]})
        path = tripwire_slice_file(params, tmp_path)
        rows = list(load_eval_prompts(str(path)))
        assert len(rows) == 12 and not {r.prompt for r in rows} & scored
        assert len({r.intent for r in rows}) == 5  # stratified: every intent cluster of the suite
        args = stage_args(name, params, tmp_path, dirs)
        assert args[args.index("--tripwire_prompts_data") + 1] == str(path)
        other = "rloo" if name != "rloo" else "grpo"
        assert "--tripwire_prompts_data" not in stage_args(other, params, tmp_path, dirs)
        # the stage's own slice, or no check in its budget: no file, no argument
        for own in (["--tripwire_prompts_data", "demo:hh_rlhf/pairs_heldout.jsonl"], ["--tripwire_steps", "0"],
                    [*steps, "--tripwire_steps", "3"]):
            params = RoundParameters(preset="smoke", online_rl=name, overrides={name: own})
            assert tripwire_slice_file(params, tmp_path) is None and not (tmp_path / "tripwire_slice.jsonl").exists()
            assert "--tripwire_prompts_data" not in stage_args(name, params, tmp_path, dirs)
    params = RoundParameters(preset="smoke", online_rl="grpo", overrides={
        "grpo": ["--max_steps", "2", "--tripwire_steps", "1", "--reward_functions", "judge"]})
    rows = list(load_eval_prompts(str(tripwire_slice_file(params, tmp_path))))
    assert len(rows) == 32 and all(r.reference for r in rows) and not {r.prompt for r in rows} & scored


def test_every_preset_has_online_rl_recipes_that_parse():
    from flows.round import RoundParameters, check_recipes

    for preset in ("smoke", "demo", "8b/full", "8b/lora"):
        check_recipes(RoundParameters(preset=preset), ["grpo", "rloo"])
    for v in ("full", "lora"):  # the 8B ones sample with vLLM on the training GPUs
        for name in ("grpo", "rloo"):
            text = (ROOT / "recipes" / "8b" / v / f"{name}.yaml").read_text()
            assert "use_vllm: true" in text and "vllm_mode: colocate" in text


def test_the_cli_passes_online_rl_to_the_round():
    from typer.testing import CliRunner

    from flows.cli import app

    result = CliRunner().invoke(app, ["round", "--preset", "smoke", "--online-rl", "a2c"])
    assert result.exit_code == 2 and "'ppo', 'grpo' or 'rloo'" in " ".join(result.output.split())
    result = CliRunner().invoke(app, ["round", "--preset", "smoke", "--online-rl", "grpo", "--set", "rloo.beta=0.1"])
    assert result.exit_code == 2 and "--online-rl is 'grpo'" in " ".join(result.output.replace("│", " ").split())


def test_the_flow_launches_the_chosen_stage_and_a_killed_one_resumes(stages, tmp_path, monkeypatch):
    """As the round's stage task does: ``accelerate launch -m grpo.train`` in its own process, the smoke recipe and
    the flow's arguments (flows.round.stage_args). Killed (SIGKILL) after step 1, the rerun resumes from
    checkpoint-1, and the manifest's history keeps the killed attempt's step 1 (and the tripwire its checks); a
    third call is cached; the result is the uninterrupted run's."""
    from flows.round import RoundParameters, gate_suites_file, stage_args
    from flows.stages import StageFailed, run_stage
    from rlhf.registry import STAGES
    from rlhf.resume import FAULT_ENV

    params = RoundParameters(preset="smoke", online_rl="grpo")
    dirs = {k: str(stages[k if k != "reward_model" else "rm"]) for k in ("sft", "dpo", "reward_model")}
    suites = gate_suites_file(params, stages["round"])  # the smoke gates' suites, which the prompts are checked against
    args = [*stage_args("grpo", params, stages["round"], dirs), "--round_id", "r1", "--report_to", "none",
            "--tripwire_steps", "1", "--tripwire_n_prompts", "2", "--tripwire_max_new_tokens", "8"]
    assert args[args.index("--decontaminate_against") + 1] == str(suites)
    out = stages["round"] / "grpo"
    lines: list[str] = []

    def run():
        return run_stage("grpo", STAGES["grpo"].module, RECIPES / "grpo.yaml", out, extra_args=args,
                         runs_dir=tmp_path, log=lines.append)

    monkeypatch.setenv(FAULT_ENV, "1")
    with pytest.raises(StageFailed) as err:
        run()
    assert err.value.cause == "killed by signal 9 (SIGKILL)"
    assert not (out / "manifest.json").exists() and (out / "checkpoint-1").is_dir()
    killed_step1 = json.loads((out / "history.jsonl").read_text().splitlines()[0])
    monkeypatch.delenv(FAULT_ENV)
    rerun = run()
    assert not rerun.cached and rerun.manifest["stage"] == "grpo"
    training = rerun.manifest["training"]
    assert training["resumed_from_step"] == 1 and training["global_step"] == 2 and training["steps_this_run"] == 1
    assert rerun.manifest["outputs"]["checkpoint"] == str((out / "checkpoint").resolve())
    history = rerun.manifest["metrics"]["history"]
    assert [h["step"] for h in history] == [1, 2] and history[0] == killed_step1
    assert [json.loads(x) for x in (out / "history.jsonl").read_text().splitlines()] == history
    assert rerun.manifest["inputs"]["pi_ref_hash"] == stages["pi_ref_hash"] == content_hash(stages["pi_ref"])
    decon = rerun.manifest["outputs"]["decontamination"]
    assert decon["checked"] is True and decon["against"] == str(suites) and decon["n_train"] == 4
    again = run()
    assert again.cached and again.cache_key == rerun.cache_key
    # the resumed run ends where an uninterrupted one does: the same completions sampled at step 2 (TRL restores
    # the RNG state of checkpoint-1) and the same weights
    whole = tmp_path / "uninterrupted"
    whole_run = run_stage("grpo", STAGES["grpo"].module, RECIPES / "grpo.yaml", whole,
                          extra_args=[*args[: args.index("--output_dir")], *args[args.index("--output_dir") + 2:]]
                          if "--output_dir" in args else args, runs_dir=tmp_path, log=lines.append)
    whole_history = whole_run.manifest["metrics"]["history"]
    assert [h["completions"] for h in whole_history] == [h["completions"] for h in history]
    resumed_w = load_file(str(out / "checkpoint" / "model.safetensors"))
    whole_w = load_file(str(whole / "checkpoint" / "model.safetensors"))
    assert max(float((resumed_w[k] - whole_w[k]).abs().max()) for k in whole_w) <= 1e-6
    # the tripwire replayed the killed attempt's checks (steps 0 and 1: its baseline) and made step 2's: the same
    # record as the uninterrupted run's, not a new baseline at step 1
    resumed_checks = rerun.manifest["tripwire"]["checks"]
    assert [c["step"] for c in resumed_checks] == [0, 1, 2] and rerun.manifest["tripwire"]["baseline_step"] == 0
    assert resumed_checks == whole_run.manifest["tripwire"]["checks"]
    assert [json.loads(x)["step"] for x in (out / "tripwire-checks.jsonl").read_text().splitlines()] == [0, 1, 2]
