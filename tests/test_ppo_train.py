"""ppo.train: strict config parsing, and main() on SFT / DPO / RM stage directories built from tiny models."""

import json
import os
import shutil
import sys
import types
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ppo.config import PPOConfig, PPOScriptArguments
from data.loaders import load_chat_prompts as load_prompts
from ppo.train import main, parse_args
from rlhf.checkpoint import check_checkpoint, freeze_dir
from data.fingerprint import data_fingerprint
from rlhf.lineage import code_version, content_hash, json_hash
from rlhf.manifest import read_manifest, write_manifest
from rlhf.models import save_tiny_models

PROMPTS = "demo:hh_rlhf/pairs_train.jsonl"


def _stage_dir(root, name, checkpoint_src, **outputs):
    d = root / name
    shutil.copytree(checkpoint_src, d / "checkpoint")
    write_manifest(d, {"stage": name, "outputs": {"checkpoint": str((d / "checkpoint").resolve()),
                                                  "checkpoint_hash": content_hash(d / "checkpoint"), **outputs}})
    return d


@pytest.fixture
def stages(tmp_path):
    """A round's stage directories as the flow leaves them: sft (with a frozen pi_ref), dpo, reward_model."""
    paths = save_tiny_models(tmp_path / "models")
    round_dir = tmp_path / "round"
    sft = round_dir / "sft"
    shutil.copytree(paths["ref"], sft / "pi_ref")
    pi_ref_hash = freeze_dir(sft / "pi_ref")
    _stage_dir(round_dir, "sft", paths["ref"], pi_ref=str((sft / "pi_ref").resolve()), pi_ref_hash=pi_ref_hash)
    dpo = _stage_dir(round_dir, "dpo", paths["policy"])
    rm = _stage_dir(round_dir, "reward_model", paths["reward"])
    unlock = round_dir / "ppo_unlock.json"  # the flow's decision (flows/round.py writes it)
    unlock.write_text(json.dumps({"unlocked": True, "rm_agreement": 0.7, "inter_annotator_agreement": 0.6}))
    recipe = tmp_path / "ppo.yaml"
    recipe.write_text(
        f"prompts_data: {PROMPTS}\nmax_prompts: 8\n"
        "num_steps: 2\nbatch_size: 4\nmini_batch_size: 2\nmicro_batch_size: 2\nppo_epochs: 1\n"
        "max_new_tokens: 6\nlearning_rate: 1.0e-3\nmissing_eos_penalty: 1.0\n"
    )
    out = round_dir / "ppo"
    argv = ["--config", str(recipe), "--output_dir", str(out), "--sft_dir", str(sft), "--policy_dir", str(dpo),
            "--reward_model_dir", str(rm), "--ppo_unlock_json", str(unlock),
            "--round_id", "r1"]  # as flows/round.py launches the stage
    return {"paths": paths, "sft": sft, "dpo": dpo, "rm": rm, "unlock": unlock, "pi_ref": sft / "pi_ref", "pi_ref_hash": pi_ref_hash,
            "recipe": recipe, "out": out, "argv": argv}


@pytest.fixture
def fake_wandb(monkeypatch):
    """A stand-in ``wandb`` module recording what the stage logs (no service process, no network)."""
    for key in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_PROJECT", "WANDB_NAME", "WANDB_RUN_GROUP", "WANDB_DIR",
                "WANDB_SILENT", "WANDB_LOG_MODEL"):
        monkeypatch.setenv(key, "x")  # so that monkeypatch restores whatever setup_wandb writes
        monkeypatch.delenv(key)
    mod = types.ModuleType("wandb")
    mod.run, mod.runs = None, []

    class Artifact:  # what rlhf.tracking.ReferenceArtifact.to_wandb builds: name, type, metadata, references
        def __init__(self, name, type, metadata=None):
            self.name, self.type, self.metadata, self.references = name, type, metadata or {}, []

        def add_reference(self, uri, name=None):
            self.references.append((uri, name))

    class Run:
        settings = types.SimpleNamespace(_offline=True)

        def __init__(self, **kwargs):
            self.init, self.logs, self.summary, self.finished = kwargs, [], {}, False
            self.used, self.logged = [], []

        def _log_artifact(self, artifact, **kwargs):  # offline use_artifact (rlhf.tracking.use_artifacts)
            self.used.append((artifact, kwargs))

        def log_artifact(self, artifact, aliases=None):
            self.logged.append((artifact, aliases))

        def log(self, metrics, step=None):
            self.logs.append((step, dict(metrics)))

        def finish(self):
            self.finished, mod.run = True, None

    def init(**kwargs):
        mod.run = Run(**kwargs, env={k: os.environ.get(k) for k in ("WANDB_NAME", "WANDB_RUN_GROUP", "WANDB_DIR")})
        mod.runs.append(mod.run)
        return mod.run

    mod.init = init
    mod.Artifact = Artifact
    mod.Settings = lambda **kwargs: kwargs  # rlhf.tracking.init_run passes wandb.Settings(...)
    monkeypatch.setitem(sys.modules, "wandb", mod)
    return mod


def test_main_on_stage_dirs_writes_lineage_and_keeps_pi_ref(stages, fake_wandb):
    out = stages["out"]
    (out / "checkpoint").mkdir(parents=True)
    (out / "checkpoint" / "stale.txt").write_text("from an earlier run")

    returned = main(stages["argv"] + ["--report_to", "wandb"])

    # checkpoint: saved by rlhf.checkpoint.save_checkpoint, replaced as a whole, trained, passes the next stage's check
    checkpoint = out / "checkpoint"
    check_checkpoint(checkpoint)
    assert not (checkpoint / "stale.txt").exists()
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == [], "no temp dir left behind"
    weights = load_file(str(checkpoint / "model.safetensors"))
    initial = load_file(str(stages["dpo"] / "checkpoint" / "model.safetensors"))
    assert any(not torch.equal(weights[k], initial[k]) for k in initial), "the policy was trained"
    assert (checkpoint / "tokenizer.json").exists()

    # pi_ref never moved, and its hash is recorded
    assert content_hash(stages["pi_ref"]) == stages["pi_ref_hash"]
    m = read_manifest(out)
    assert m["stage"] == "ppo" and m["round_id"] == "r1"
    inputs = m["inputs"]
    assert inputs["pi_ref"] == str(stages["pi_ref"].resolve()) and inputs["pi_ref_hash"] == stages["pi_ref_hash"]
    assert inputs["policy"] == read_manifest(stages["dpo"])["outputs"]["checkpoint"]
    assert inputs["policy_hash"] == content_hash(stages["dpo"] / "checkpoint")
    assert inputs["reward_model_hash"] == content_hash(stages["rm"] / "checkpoint")
    assert inputs["value_model_init"] == inputs["reward_model"]
    assert inputs["prompts_data"] == PROMPTS and inputs["prompts_data_hash"] == data_fingerprint(PROMPTS)
    assert inputs["ppo_unlock"]["unlocked"] is True
    assert m["config_hash"] == json_hash(m["config"]) and m["config"]["round_id"] == "r1"
    assert m["code_version"] == code_version()
    assert m["outputs"] == {"checkpoint": str(checkpoint.resolve()), "checkpoint_hash": content_hash(checkpoint)}
    from rlhf.precision import resolve_precision

    assert m["precision"] == resolve_precision("auto")  # what this machine (or the forced detection) implies
    # fp32 master weights for all four models, as loaded and as trained, and the autocast a training forward ran under
    dtypes = m["precision_dtypes"]
    assert dtypes["weights_loaded"] == dtypes["weights_trained"]
    assert {w for counts in dtypes["weights_trained"].values() for w in counts} == {"float32"}
    assert set(dtypes["weights_trained"]) == {"policy", "ref_model", "reward_model", "value_model"}
    assert dtypes["autocast_measured"] == dtypes["autocast"] == {"fp32": "off", "bf16": "bfloat16"}[m["precision"]]
    metrics = m["metrics"]
    assert metrics["num_steps"] == 2 and len(metrics["history"]) == 2 and metrics["n_prompts"] == 8
    assert metrics["objective/kl_k3"] >= 0 and metrics["pi_ref_unchanged"] is True
    # tokens/s and MFU as the other stages report them (rlhf.efficiency): 6 N tokens/s over the peak, N = policy +
    # value model, tokens = the real prompt + completion tokens of the update passes (ppo_epochs 1: each once)
    eff = metrics["efficiency"]
    generated = sum(round(h["response/length_mean"] * 4) for h in metrics["history"])  # batch_size 4
    assert eff["generated_tokens"] == generated and eff["tokens"] > generated  # the prompts' tokens too
    assert eff["batched_tokens"] >= eff["tokens"]
    assert eff["padding_share"] == pytest.approx(1 - eff["tokens"] / eff["batched_tokens"])
    assert eff["tokens_per_s"] == pytest.approx(eff["tokens"] / metrics["seconds_train"])
    assert eff["train_seconds"] == metrics["seconds_train"] and eff["threads"] == metrics["threads"]
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    n = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(stages["dpo"] / "checkpoint").parameters())
    n += sum(p.numel() for p in AutoModelForSequenceClassification.from_pretrained(stages["rm"] / "checkpoint")
             .parameters())
    assert eff["mfu"] == pytest.approx(6 * n * eff["tokens_per_s"] / eff["peak_flops"]) and 0 < eff["mfu"] <= 1
    assert 0 < eff["rollout_seconds"] < eff["train_seconds"]
    assert eff["generated_tokens_per_s"] == pytest.approx(generated / eff["rollout_seconds"])
    assert eff["first_step_seconds"] > 0 and eff["steady_step_seconds"] > 0
    assert returned["outputs"] == m["outputs"]

    # W&B: one run, named "ppo", grouped by the round, under output_dir, with every step's metrics and a summary
    (run,) = fake_wandb.runs
    assert run.init["env"] == {"WANDB_NAME": "r1/ppo", "WANDB_RUN_GROUP": "r1", "WANDB_DIR": str(out.resolve())}
    # the run id kept in the stage folder, resumable; the run's file written every quarter second
    assert run.init["id"] == (out / "wandb_run_id").read_text().strip() and run.init["resume"] == "allow"
    # ... and no process metadata (command line, program, git) recorded: rlhf.tracking.NO_PROCESS_RECORD_SETTINGS
    assert run.init["settings"] == {"x_transaction_log_flush_interval": 0.25, "x_disable_meta": True,
                                    "disable_code": True, "disable_git": True}
    assert [step for step, _ in run.logs] == [1, 2] and "objective/score" in run.logs[0][1]
    assert run.summary["num_steps"] == 2 and "history" not in run.summary
    assert run.summary["efficiency/tokens_per_s"] == eff["tokens_per_s"] and run.summary["efficiency/mfu"] == eff["mfu"]
    assert run.finished
    # W&B lineage: the stage used the checkpoints the stages before it logged (named after the producing stage and
    # output, the hash their manifests record as metadata, each file by file:// reference) and logged its own
    used = {a.name: (a.type, a.metadata["content_hash"], kw) for a, kw in run.used}
    assert used == {
        "sft-pi_ref": ("model", stages["pi_ref_hash"], {"is_user_created": True, "use_after_commit": True}),
        "dpo-checkpoint": ("model", content_hash(stages["dpo"] / "checkpoint"),
                           {"is_user_created": True, "use_after_commit": True}),
        "reward_model-checkpoint": ("model", content_hash(stages["rm"] / "checkpoint"),
                                    {"is_user_created": True, "use_after_commit": True}),
        "data-pairs_train.jsonl": ("dataset", data_fingerprint(PROMPTS),
                                   {"is_user_created": True, "use_after_commit": True}),
    }
    ((logged, aliases),) = run.logged
    assert (logged.name, logged.type, aliases) == ("ppo-checkpoint", "model", ["r1"])
    assert logged.metadata["content_hash"] == m["outputs"]["checkpoint_hash"]
    assert logged.references == [(checkpoint.resolve().as_uri(), "checkpoint")]


def test_tampered_pi_ref_stops_the_stage_before_training(stages, monkeypatch):
    import ppo.train

    weights = stages["pi_ref"] / "model.safetensors"
    weights.chmod(0o644)
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01  # one bit of one weight, after the SFT stage recorded the hash
    weights.write_bytes(bytes(data))
    loaded = []
    monkeypatch.setattr(ppo.train, "load_models", lambda *a, **k: loaded.append(1))
    with pytest.raises(RuntimeError, match="changed before training"):
        main(stages["argv"])
    assert not loaded, "nothing was loaded, let alone trained"
    assert not (stages["out"] / "manifest.json").exists() and not (stages["out"] / "checkpoint").exists()


def test_a_launch_of_another_world_size_than_expected_is_refused_before_anything_loads(stages, monkeypatch):
    from rlhf.distributed import WorldSizeMismatch

    monkeypatch.setenv("RLHF_EXPECTED_WORLD_SIZE", "2")  # this is a 1-process start
    with pytest.raises(WorldSizeMismatch, match=r"expected world size 2 \(RLHF_EXPECTED_WORLD_SIZE\) but this launch "
                                                r"has 1 process"):
        main(stages["argv"])
    assert not (Path(stages["argv"][stages["argv"].index("--output_dir") + 1]) / "manifest.json").exists()
    monkeypatch.setenv("RLHF_EXPECTED_WORLD_SIZE", "1")
    monkeypatch.setenv("RLHF_COLLECTIVE_TIMEOUT_S", "abc")
    with pytest.raises(ValueError, match="RLHF_COLLECTIVE_TIMEOUT_S='abc' is not a number of seconds"):
        main(stages["argv"])


def test_locked_ppo_and_a_moved_parent_checkpoint_are_refused(stages):
    unlock = json.loads(stages["unlock"].read_text())
    stages["unlock"].write_text(json.dumps({**unlock, "unlocked": False}))
    with pytest.raises(RuntimeError, match=r"online RL \(ppo\) is locked"):
        main(stages["argv"])

    stages["unlock"].write_text(json.dumps(unlock))
    (stages["dpo"] / "checkpoint" / "extra.txt").write_text("not what the DPO stage wrote")
    with pytest.raises(RuntimeError, match="changed since its stage finished"):
        main(stages["argv"])


def test_without_the_flow_s_decision_the_rule_reads_the_reward_model_measurements(stages):
    """Standalone (no --ppo_unlock_json): judging.unlock decides from the RM stage's recorded measurements, with no
    override. RM agrees with the expert on 3 of 4 pairs (0.75); annotators agree on every pair (1.0): locked."""
    from judging.agreement import inter_annotator_agreement, rm_agreement
    from judging.unlock import decide_from_metrics

    expert = [1, 2, 1, 2]
    rm = rm_agreement([1.0, 0.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0], expert)  # prefers the first side on pair 3
    iaa = inter_annotator_agreement([[1, 1, 1], [2, 2, 2], [1, 1, 1], [2, 2, 2]], n_resamples=200)
    manifest = read_manifest(stages["rm"])
    manifest["metrics"] = {"rm_agreement": rm.to_dict(), "inter_annotator_agreement": iaa.to_dict()}
    write_manifest(stages["rm"], manifest)
    decision = decide_from_metrics(read_manifest(stages["rm"])["metrics"]).to_dict()
    assert decision["rm_agreement"] == 0.75 and decision["inter_annotator_agreement"] == 1.0
    assert decision["unlocked"] is False and decision["overridden"] is False
    with pytest.raises(RuntimeError, match=r"online RL \(ppo\) is locked"):
        main([a for a in stages["argv"] if a not in ("--ppo_unlock_json", str(stages["unlock"]))])


def test_cli_overrides_yaml_and_unknown_keys_are_errors(stages, tmp_path):
    script_args, config = parse_args(stages["argv"] + ["--kl_coef", "0.2", "--report_to", "wandb"])
    assert isinstance(config, PPOConfig) and config.kl_coef == 0.2 and config.num_steps == 2
    assert config.report_to == ["wandb"] and config.learning_rate == 1e-3
    assert script_args.sft_dir == str(stages["sft"]) and script_args.round_id == "r1"
    assert script_args.value_model_path is None

    bad = tmp_path / "bad.yaml"
    bad.write_text(stages["recipe"].read_text() + "kl_coeff: 0.1\n")  # typo
    with pytest.raises(ValueError, match="kl_coeff"):
        parse_args(["--config", str(bad)])
    with pytest.raises(ValueError, match="no_such_key"):
        parse_args(["--config", str(stages["recipe"]), "--no_such_key", "1"])


def test_config_validation():
    with pytest.raises(ValueError, match="mini_batch_size"):
        PPOConfig(batch_size=6, mini_batch_size=4)
    with pytest.raises(ValueError, match="missing_eos_penalty"):
        PPOConfig(missing_eos_penalty=-1.0)
    with pytest.raises(ValueError, match="report_to"):
        PPOConfig(report_to=["tensorboard"])
    with pytest.raises(ValueError, match="not both"):
        PPOScriptArguments(sft_dir="a", ref_path="b")
    with pytest.raises(ValueError, match=r"missing input\(s\): pi_ref .*reward model"):
        PPOScriptArguments(policy_dir="d", prompts_data=PROMPTS).check_complete()


def test_load_prompts_names_file_and_line(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "a"}\n{"text": "b"}\n')
    with pytest.raises(ValueError, match=r"p.jsonl:2: .*'prompt'"):
        load_prompts(f)
    f.write_text('{"prompt": "a"}\n{"prompt": 3}\n')
    with pytest.raises(ValueError, match=r"p.jsonl:2"):
        load_prompts(f)


def test_reward_model_without_a_score_head_is_refused_with_explicit_paths(stages, tmp_path):
    # standalone mode (paths instead of stage dirs); a causal LM given as the reward model would load with a
    # randomly initialised score head
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"hello {i}"}) + "\n" for i in range(4)))
    paths = stages["paths"]
    argv = ["--config", str(tmp_path / "explicit.yaml"), "--output_dir", str(tmp_path / "out"),
            "--ref_path", str(stages["pi_ref"]), "--ref_hash", stages["pi_ref_hash"],
            "--policy_path", str(paths["policy"]), "--reward_model_path", str(paths["policy"]),
            "--prompts_path", str(prompts)]
    (tmp_path / "explicit.yaml").write_text("num_steps: 1\nbatch_size: 4\n")
    with pytest.raises(ValueError, match="missing from the checkpoint"):
        main(argv)


# Resume: 12 prompts, batch 4 -> 3 batches an epoch; 4 steps; a resume checkpoint after every step but the last, the
# newest 2 kept. Killed when step 3 is done: the resumed run skips the whole first epoch's batches and draws step 4
# from the second epoch's shuffle. The adaptive KL controller (kl_target) and 2 PPO epochs make the loop state more
# than the weights.
RESUME_ARGS = ["--max_prompts", "12", "--num_steps", "4", "--save_steps", "1", "--save_total_limit", "2",
               "--ppo_epochs", "2", "--kl_target", "0.01", "--kl_horizon", "100", "--report_to", "none"]
TIME_KEYS = ("time/rollout_s", "time/step_s")


def _flow_args(stages):
    argv = stages["argv"]
    skip = {argv.index("--config"), argv.index("--config") + 1, argv.index("--output_dir"),
            argv.index("--output_dir") + 1}
    return [a for i, a in enumerate(argv) if i not in skip] + RESUME_ARGS


def test_ppo_killed_after_a_checkpoint_resumes_to_the_uninterrupted_result(stages, tmp_path, monkeypatch):
    """A real SIGKILL of the PPO stage after its step-3 checkpoint, rerun through the flow's launcher
    (flows.stages.run_stage, which finds the complete checkpoint and passes --resume_from_checkpoint): the run ends
    with the weights and every step's metrics of an uninterrupted run (fp32 on one CPU process: 1e-6, far below
    one step's change at lr 1e-3), and the manifest records the step it resumed from."""
    from flows.stages import StageFailed, run_stage
    from rlhf.resume import COMPLETE_MARKER, FAULT_ENV, ResumeError, trainer_checkpoints

    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.delenv(FAULT_ENV, raising=False)
    runs = tmp_path / "runs"
    args = _flow_args(stages)

    def run(out, kill_after=None):
        with monkeypatch.context() as mp:
            if kill_after is not None:
                mp.setenv(FAULT_ENV, str(kill_after))
            return run_stage("ppo", "ppo.train", stages["recipe"], out, extra_args=args, runs_dir=runs,
                             log=lambda _line: None)

    reference = runs / "ppo-ref"
    run(reference)
    out = runs / "ppo-killed"
    with pytest.raises(StageFailed) as err:
        run(out, kill_after=3)
    assert err.value.cause == "killed by signal 9 (SIGKILL)"
    assert not (out / "manifest.json").exists() and not (out / "checkpoint").exists()
    assert [p.name for p in trainer_checkpoints(out)] == ["checkpoint-3", "checkpoint-2"]  # save_total_limit 2
    assert all((p / COMPLETE_MARKER).is_file() for p in trainer_checkpoints(out))
    state = json.loads((out / "checkpoint-3" / "ppo_state.json").read_text())
    assert (state["global_step"], state["data_epoch"], state["data_batches"]) == (3, 0, 3)
    assert len(state["history"]) == 3

    # an explicit resume from a checkpoint altered after its save is refused, naming the file
    damaged = tmp_path / "damaged" / "checkpoint-2"
    shutil.copytree(out / "checkpoint-2", damaged)
    data = bytearray((damaged / "optimizer.pt").read_bytes())
    data[len(data) // 2] ^= 0x01
    (damaged / "optimizer.pt").write_bytes(bytes(data))
    with pytest.raises(ResumeError, match=r"optimizer.pt: sha256"):
        main(["--config", str(stages["recipe"]), "--output_dir", str(tmp_path / "damaged-run"), *args,
              "--resume_from_checkpoint", str(damaged)])

    rerun = run(out)
    assert not rerun.cached
    got, want = rerun.manifest, read_manifest(reference)
    assert want["training"]["resumed_from"] is None and want["training"]["resumed_from_step"] is None
    assert got["training"]["resumed_from_step"] == 3
    assert got["training"]["resumed_from"] == str((out / "checkpoint-3").resolve())
    assert got["config"]["resume_from_checkpoint"] == got["training"]["resumed_from"]
    assert got["training"]["steps_this_run"] == 1 and got["training"]["global_step"] == 4
    assert "resumed from" in (out / "stage.log").read_text()

    w_got = load_file(str(out / "checkpoint" / "model.safetensors"))
    w_want = load_file(str(reference / "checkpoint" / "model.safetensors"))
    assert w_got.keys() == w_want.keys()
    diff = max(float((w_got[k] - w_want[k]).abs().max()) for k in w_want)
    initial = load_file(str(stages["dpo"] / "checkpoint" / "model.safetensors"))
    moved = max(float((w_want[k] - initial[k]).abs().max()) for k in initial)
    print(f"PPO resumed from step 3: max |weight diff| vs uninterrupted {diff:.3g} (training moved them {moved:.3g})")
    assert diff <= 1e-6 and moved > 1e-3
    h_got, h_want = got["metrics"]["history"], want["metrics"]["history"]
    assert len(h_got) == len(h_want) == 4
    for a, b in zip(h_got, h_want):
        for key in b:
            if key not in TIME_KEYS:
                assert abs(a[key] - b[key]) <= 1e-6, (b["step"], key, a[key], b[key])
    assert h_want[-1]["objective/kl_coef"] != h_want[0]["objective/kl_coef"], "the adaptive KL coefficient moved"
    assert trainer_checkpoints(out) == [] and trainer_checkpoints(reference) == []  # resume state removed at the end


def test_ppo_on_two_cpu_processes_is_one_data_parallel_run(stages):
    """torchrun with 2 CPU processes: the stage makes the process group (gloo) before its Accelerator, so accelerate
    sees 2 processes (DDP) and not 2 separate single-process runs, which would each train alone and normalise the
    loss by their own tokens only. Rank 0 alone writes the manifest."""
    _torchrun_ppo(stages, "--batch_size", "2", "--num_steps", "1")
    m = read_manifest(stages["out"])
    assert m["metrics"]["num_processes"] == 2 and m["metrics"]["efficiency"]["tokens"] > 0


def _torchrun_ppo(stages, *args: str) -> None:
    """The stage under torchrun with 2 CPU processes (fp32, no tracker)."""
    import socket
    import subprocess

    root = Path(__file__).resolve().parents[1]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    env.pop("RLHF_EXPECTED_WORLD_SIZE", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(port), "-m", "ppo.train", *stages["argv"], *args, "--precision", "fp32",
           "--report_to", "none"]
    done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_a_tripwire_trip_on_two_processes_stops_both_and_restores_the_policy(stages):
    """DDP: both processes apply the rules to rank 0's numbers, stop at the same step and load the same weights
    back (a process that went on alone would hang the other in its next collective)."""
    _torchrun_ppo(stages, "--batch_size", "2", "--num_steps", "4", "--tripwire_steps", "1", "--tripwire_n_prompts",
                  "2", "--tripwire_max_kl", "0.0", "--learning_rate", "3e-2")
    m = read_manifest(stages["out"])
    tw = m["tripwire"]
    # k1 on 2 x 2 completions is noisy (it can be negative): the trip is at the first check whose KL is above 0
    kls = [c["kl"] for c in tw["checks"]]
    first_positive = next(i for i, kl in enumerate(kls) if kl is not None and kl > 0.0)
    assert tw["tripped"] and tw["tripped_step"] == first_positive < 4 and tw["restored_step"] == first_positive - 1
    assert m["metrics"]["num_steps"] == first_positive and m["metrics"]["num_processes"] == 2
    assert [t["signal"] for t in tw["trips"]] == ["kl"]


def test_main_records_the_tripwire_and_saves_the_restored_policy(stages, tmp_path):
    """The tripwire through the stage: a second reward model as the gold scorer, a held-out slice, and a KL bound of
    0 nats that large updates break (step 2's rollout is the first sampled after an update: step 1's KL is that of
    pi_ref against itself, 0): the trip, its step and values go to the manifest, and the checkpoint saved is the
    policy of the last passing check."""
    gold = save_tiny_models(tmp_path / "gold", seed=1)["reward"]  # another reward model than the optimised one
    argv = stages["argv"] + ["--tripwire_steps", "1", "--tripwire_gold_model_path", str(gold), "--tripwire_n_prompts",
                             "4", "--tripwire_prompts_data", "demo:hh_rlhf/pairs_heldout.jsonl",
                             "--tripwire_max_kl", "0.0", "--learning_rate", "3e-2", "--num_steps", "4"]
    m = main(argv)
    tw = m["tripwire"]
    assert tw["gold_model"] == str(gold.resolve()) and tw["gold_model_hash"] == content_hash(gold)
    assert tw["prompts_data"] == "demo:hh_rlhf/pairs_heldout.jsonl" and tw["n_prompts"] == 4 and tw["gold_scorer"]
    assert tw["prompts_data_hash"] == data_fingerprint("demo:hh_rlhf/pairs_heldout.jsonl")
    assert m["inputs"]["tripwire_gold_model_hash"] == content_hash(gold)  # lineage: the gold scorer is an input
    assert m["inputs"]["tripwire_prompts_data_hash"] == tw["prompts_data_hash"]
    first = tw["checks"][0]
    assert first["step"] == 0 and first["gold"] == 0.5 and first["passed"]  # the initial policy against itself
    assert tw["checks"][1]["kl"] == 0.0 and tw["checks"][1]["passed"]
    # k1 on 4 completions is noisy (it can be negative): the trip is at the first check whose KL is above 0
    trip = next(c for c in tw["checks"] if c["kl"] is not None and c["kl"] > 0.0)["step"]
    assert tw["tripped"] and tw["tripped_step"] == trip and tw["restored_step"] == trip - 1 >= 1
    assert tw["trips"] == [{"signal": "kl", "step": trip, "values": {"kl": tw["checks"][trip]["kl"], "bound": 0.0}}]
    assert m["metrics"]["tripwire_tripped"] is True and m["metrics"]["num_steps"] == trip
    # the saved policy is the restored one, of a step >= 1: trained, so not the initial one; the snapshot is gone
    saved = load_file(str(stages["out"] / "checkpoint" / "model.safetensors"))
    initial = load_file(str(stages["dpo"] / "checkpoint" / "model.safetensors"))
    assert saved.keys() == initial.keys() and any(not torch.equal(saved[k], initial[k]) for k in initial)
    assert m["outputs"]["checkpoint_hash"] == content_hash(stages["out"] / "checkpoint")
    assert not (stages["out"] / "tripwire-last-pass").exists()

    # the optimised reward model is no gold scorer
    with pytest.raises(ValueError, match="is the optimised reward model"):
        main(stages["argv"] + ["--tripwire_steps", "1", "--tripwire_gold_model_path",
                               str(stages["rm"] / "checkpoint")])
