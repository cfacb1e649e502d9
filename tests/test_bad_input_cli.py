"""Bad input at the command line, as a new user meets it: a runs folder the round cannot write, a ``max_steps`` that
transformers would read as "train three epochs", and a bad data row given to a stage run by hand. Each is one
``error``/``Invalid value`` message naming the folder, field or row, with the documented exit code, no traceback,
and nothing left behind."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import flows.round  # noqa: F401 - Prefect sets up its log handlers on import: here, not inside a CliRunner whose
#                    streams close after the call (a later test's Prefect log line would then write to a closed file)
from rlhf.rundir import RoundError, check_writable_folder

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "recipes" / "smoke"


def _env(tmp_path: Path) -> dict[str, str]:
    """The caller's environment minus Prefect's and W&B's settings (a server another test started is not ours)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "WANDB_")) and k != "DO_NOT_TRACK"}
    env.update(PREFECT_HOME=str(tmp_path / "prefect"), WANDB_MODE="disabled", PYTHONPATH=str(ROOT))
    return env


def _flat(output: str) -> str:
    """Typer's error box as one line: box characters dropped, wrapped lines joined."""
    return " ".join(re.sub("[│╭╮╰╯─]", " ", output).split())


def test_check_writable_folder_names_the_file_in_the_way_and_creates_nothing(tmp_path):
    in_the_way = tmp_path / "results.txt"
    in_the_way.write_text("a user's file")
    with pytest.raises(RoundError, match=r"results\.txt is a file, not a folder"):
        check_writable_folder(in_the_way / "runs")
    fresh = tmp_path / "a" / "b" / "runs"
    assert check_writable_folder(fresh) == fresh
    assert not (tmp_path / "a").exists()  # checked where mkdir -p would start; nothing created
    assert in_the_way.read_text() == "a user's file"


def test_round_refuses_a_runs_folder_under_a_file_before_prefect_starts(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from flows.cli import app

    in_the_way = tmp_path / "runs"
    in_the_way.write_text("not a folder")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["round", "--preset", "smoke", "--runs-dir", str(in_the_way), "--round-id", "r1"])
    assert result.exit_code == 2, result.output
    assert "--runs-dir" in _flat(result.output) and "is a file, not a folder" in _flat(result.output)
    assert "Traceback" not in result.output and "temporary server" not in result.output
    assert in_the_way.read_text() == "not a folder"


def _read_only_bind(folder: Path, command: list[str]) -> list[str]:
    """``command`` run in a private mount namespace where ``folder`` is a read-only bind mount of itself (a user
    namespace maps the caller to root there, so it works without privileges where user namespaces are allowed)."""
    quoted = " ".join(f"'{c}'" for c in command)
    return ["unshare", "-rm", "sh", "-c",
            f"mount --bind '{folder}' '{folder}' && mount -o remount,bind,ro '{folder}' && exec {quoted}"]


def test_round_on_a_read_only_runs_folder_is_one_line_and_exit_2(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    probe = subprocess.run(_read_only_bind(ro, ["touch", str(ro / "x")]), capture_output=True, text=True)
    if "Read-only file system" not in probe.stderr:  # no unshare / no user namespaces here: nothing to test with
        pytest.skip(f"cannot make a read-only mount here: {probe.stderr.strip()[:200]}")
    cmd = [sys.executable, "-m", "flows.cli", "round", "--preset", "smoke", "--round-id", "r1",
           "--runs-dir", str(ro / "runs")]
    proc = subprocess.run(_read_only_bind(ro, cmd), capture_output=True, text=True, cwd=ROOT, env=_env(tmp_path),
                          timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output[-3000:]
    assert "read-only file system" in _flat(output) and "--runs-dir" in _flat(output)
    assert "Traceback" not in output and "OSError" not in output
    assert "temporary server" not in output  # refused before Prefect started
    assert list(ro.iterdir()) == []


@pytest.mark.parametrize("max_steps", ["0", "-5"])
def test_a_max_steps_transformers_would_read_as_epochs_is_refused(max_steps):
    from sft.config import SFTStageConfig

    from rlhf.config import parse_stage_config

    with pytest.raises(ValueError, match=rf"max_steps must be .* > 0, or -1 .*got {max_steps}$"):
        parse_stage_config((SFTStageConfig,), ["--config", str(SMOKE / "sft.yaml"), "--output_dir", "unused",
                                               "--max_steps", max_steps])


def test_max_steps_minus_one_still_means_train_the_epochs():
    from sft.config import SFTStageConfig

    from rlhf.config import parse_stage_config

    (args,) = parse_stage_config((SFTStageConfig,), ["--config", str(SMOKE / "sft.yaml"), "--output_dir", "unused",
                                                     "--max_steps", "-1", "--num_train_epochs", "2"])
    assert (args.max_steps, args.num_train_epochs) == (-1, 2)


def test_round_refuses_max_steps_zero_before_anything_runs(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from flows.cli import app

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["round", "--preset", "smoke", "--runs-dir", str(tmp_path / "runs"),
                                      "--round-id", "r1", "--set", "dpo.max_steps=0"])
    assert result.exit_code == 2, result.output
    assert "dpo" in result.output and "max_steps must be a number of optimizer steps > 0" in _flat(result.output)
    assert not (tmp_path / "runs").exists()


def test_stage_by_hand_says_a_bad_row_in_one_line(tmp_path, tiny_model_dir):
    """`rlhf sft` on a file whose row 2 has a number where the transcript goes: exit 1, one ``error:`` line with
    file, row, field and reason, no traceback, no checkpoint."""
    lines = (ROOT / "data" / "demo" / "hh_rlhf" / "sft.jsonl").read_text().splitlines()[:4]
    rows = [json.loads(line) for line in lines]
    rows[2] = {"id": "bad", "chosen": 123}
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "sft"
    env = _env(tmp_path)
    env.update(RLHF_CACHE=str(tmp_path / "cache"), HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, "-m", "flows.cli", "sft", "--config", str(SMOKE / "sft.yaml"), "--output_dir", str(out),
         "--model_name_or_path", tiny_model_dir, "--train_data", str(data), "--report_to", "none"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300,
    )
    assert proc.returncode == 1, (proc.stdout + proc.stderr)[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: DataValidationError: {data} row 2 field 'chosen': must be a string, got int 123"]
    assert "Traceback" not in proc.stderr and "╭" not in proc.stderr
    assert not (out / "checkpoint").exists() and not (out / "manifest.json").exists()
    shutil.rmtree(out, ignore_errors=True)


def test_round_refuses_a_gate_value_out_of_range_before_anything_trains(tmp_path, monkeypatch):
    """`--set gates.n_winrate=0` used to be found by the gate stage, after SFT, DPO and the reward model trained."""
    from typer.testing import CliRunner

    from flows.cli import app

    monkeypatch.chdir(tmp_path)
    for override, message in (("gates.n_winrate=0", "--n_winrate must be at least 1, got 0"),
                              ("gates.judge_floor=0.2", "--judge_floor must be in [0.5, 1], got 0.2"),
                              # a JSON list reaches the stage's parser as a list (it used to be found by the gate
                              # stage after SFT, DPO and the reward model trained)
                              ("gates.consistency_depths=[0, 5]",
                               "--consistency_depths must be distinct integers >= 1, got [0, 5]"),
                              ("gates.consistency_depths=[5, x", "a value starting with '[' must be a JSON list")):
        result = CliRunner().invoke(app, ["round", "--preset", "smoke", "--runs-dir", str(tmp_path / "runs"),
                                          "--round-id", "r1", "--set", override])
        assert result.exit_code == 2, result.output
        assert message in _flat(result.output)
        assert not (tmp_path / "runs").exists()


def _event(i: int) -> dict:
    return {"event_id": f"e{i}", "conversation_id": f"c{i}", "turn_id": 0, "user_id": f"u{i}", "model_version": "r1",
            "intent": "helpful_base", "signal": "thumbs_down", "timestamp": 1764000000 + i,
            "prompt": f"question {i}", "response": f"answer {i}"}


def test_flywheel_ingest_refuses_an_events_file_given_as_the_store(tmp_path):
    """`--db events.jsonl`: DuckDB opened the JSONL file as an in-memory database, so the ingest reported 3 rows
    inserted and kept none. Now: exit 1, one line naming the file, the file unchanged; a real store still works."""
    from typer.testing import CliRunner

    from flows.cli import app
    from flywheel.store import SignalStore

    events = tmp_path / "events.jsonl"
    events.write_text("".join(json.dumps(_event(i)) + "\n" for i in range(3)))
    before = events.read_bytes()
    result = CliRunner().invoke(app, ["flywheel", "ingest", "--db", str(events), str(events)])
    assert result.exit_code == 1, result.output
    assert f"error: {events}: not a DuckDB database file" in result.output
    assert '"inserted"' not in result.output
    assert events.read_bytes() == before
    store = tmp_path / "signals.duckdb"
    for _ in range(2):  # created, then reopened: a DuckDB file passes the check
        result = CliRunner().invoke(app, ["flywheel", "ingest", "--db", str(store), str(events)])
        assert result.exit_code == 0, result.output
    opened = SignalStore(store)
    try:
        with opened.engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT count(*) FROM events").scalar() == 3
    finally:
        opened.close()


@pytest.mark.parametrize("name, value, message", [
    ("RLHF_NATIVE_BF16", "maybe", "RLHF_NATIVE_BF16 must be 0 or 1 (or unset to detect), got 'maybe'"),
    ("RLHF_ALLOCATOR", "jemallocc",
     "RLHF_ALLOCATOR must be one of auto, tcmalloc, glibc-tuned, system (or unset for auto), got 'jemallocc'"),
], ids=["native-bf16", "allocator"])
def test_a_bad_machine_setting_is_named_as_the_environment_s(tmp_path, monkeypatch, name, value, message):
    from typer.testing import CliRunner

    from flows.cli import app

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(name, value)
    result = CliRunner().invoke(app, ["round", "--preset", "smoke", "--runs-dir", str(tmp_path / "runs"),
                                      "--round-id", "r1"])
    assert result.exit_code == 2, result.output
    flat = _flat(result.output)
    assert message in flat
    assert "--preset" not in flat.split("Usage")[-1] and "recipes/smoke" not in flat  # not a recipe's error
    assert not (tmp_path / "runs").exists()  # said before anything was made


@pytest.mark.parametrize("args, field, message", [
    (["--accelerate-config", "no-such.yaml"], "--accelerate-config", "no-such.yaml: no such accelerate config"),
    (["--flywheel-data", "no-such-version"], "--flywheel-data",
     "no-such-version: not a flywheel dataset version (no manifest.json)"),
    (["--base-model", "./no-such-model"], "--base-model", "./no-such-model: no such model directory or GGUF file"),
    (["--base-model", "no-such.gguf"], "--base-model", "no-such.gguf: no such GGUF file"),
    (["--base-model", "not a model!"], "--base-model", "'not a model!' is not a base model"),
    (["--online-rl", "dpo"], "--online-rl", "--online-rl: Input should be 'ppo', 'grpo' or 'rloo'"),
    (["--launcher", "slurm", "--slurm", '{"nodez": 2}'], "--slurm", "--slurm nodez: Extra inputs are not permitted"),
    (["--launcher", "slurm", "--slurm", '{"nodes": 2'], "--slurm", "not JSON"),
    (["--slurm", '{"nodes": 2}'], "--launcher", "--slurm settings given ({'nodes': 2}) but --launcher is 'local'"),
    (["--force", "sfft"], "--force", "--force: unknown stage 'sfft' (did you mean 'sft'?); stages: sft,"),
    (["--set", "sfx.learning_rate=1"], "--set", "--set: unknown stage 'sfx' (did you mean 'sft'?); stages: sft,"),
    (["--force", "grpoo"], "--force", "--force: unknown stage 'grpoo' (did you mean 'grpo'?); stages: sft,"),
], ids=["accelerate-config", "flywheel-data", "base-model-path", "base-model-gguf", "base-model-id", "online-rl",
        "slurm-field", "slurm-json", "slurm-without-launcher", "force-stage", "set-stage", "force-stage-typo"])
def test_round_names_the_bad_option_before_prefect_starts(tmp_path, monkeypatch, args, field, message):
    from typer.testing import CliRunner

    from flows.cli import app

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["round", "--preset", "smoke", "--runs-dir", str(tmp_path / "runs"),
                                      "--round-id", "r1", *args])
    assert result.exit_code == 2, result.output
    flat = _flat(result.output)
    assert message in flat and field in flat
    # one line that says it whole (a CI log shows it as written), and no internal field name before the option
    assert [ln for ln in result.output.splitlines() if message in ln], result.output
    assert "force: force:" not in flat and "overrides" not in flat and "online_rl" not in flat
    assert "temporary server" not in result.output
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("content, message", [
    ("", "empty.jsonl: no rows"),
    ('{"messages": \n', "row 0: invalid JSON"),
    ('[1, 2]\n["a"]\n', "row 0: not an object (a JSON array); each row must be a JSON object of named fields"),
    ('"text"\n', "row 0: not an object (a JSON string)"),
], ids=["empty", "malformed", "array-rows", "string-row"])
def test_a_training_file_the_stage_cannot_read_is_said_before_prefect_starts(tmp_path, monkeypatch, content, message):
    """`--set sft.train_data=FILE` with an empty, malformed or not-rows file was found by the SFT stage after its
    model loaded (exit 1, three tracebacks); now exit 2 naming the stage, key, file and row, nothing created."""
    from typer.testing import CliRunner

    from flows.cli import app

    data = tmp_path / "empty.jsonl"
    data.write_text(content)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["round", "--preset", "smoke", "--runs-dir", str(tmp_path / "runs"),
                                      "--round-id", "r1", "--set", f"sft.train_data={data}"])
    assert result.exit_code == 2, result.output
    line = next(ln for ln in result.output.splitlines() if ln.startswith("Error"))
    assert "sft.train_data" in line and str(data) in line and message in line, result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "runs").exists() and data.read_text() == content


@pytest.mark.parametrize("key, content, message", [
    ("sft.train_data", '{"foo": 1}\n', "cannot recognise a sft format from fields ['foo']"),
    ("sft.train_data", '{"chosen": 5, "rejected": "b"}\n', "row 0 field 'chosen': must be a string, got int 5"),
    ("dpo.train_data", '{"foo": 1}\n', "cannot recognise a pairs format from fields ['foo']"),
    ("reward_model.train_data", None, "a folder with no data files"),
    ("gates.winrate_data", '{"foo": 1}\n', "cannot recognise a eval format from fields ['foo']"),
], ids=["sft-fields", "sft-types", "dpo-fields", "rm-empty-folder", "gates-fields"])
def test_a_data_file_the_stage_cannot_load_is_said_before_prefect_starts(tmp_path, monkeypatch, key, content,
                                                                          message):
    """Rows of no known format, a field of the wrong type, a folder without data files, or a gate suite the gate
    stage cannot read: refused with the stage's own loader before anything trains (the gate suite used to be found
    by SFT's decontamination step and blamed on SFT), exit 2, the option's stage and key named."""
    from typer.testing import CliRunner

    from flows.cli import app

    data = tmp_path / ("rows.jsonl" if content is not None else "folder")
    if content is None:
        data.mkdir()
    else:
        data.write_text(content)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["round", "--preset", "smoke", "--runs-dir", str(tmp_path / "runs"),
                                      "--round-id", "r1", "--set", f"{key}={data}"])
    assert result.exit_code == 2, result.output
    line = next(ln for ln in result.output.splitlines() if ln.startswith("Error"))
    assert key in line and str(data) in line and message in line, result.output
    assert "Traceback" not in result.output and not (tmp_path / "runs").exists()
    assert not list(tmp_path.glob("rejects*")) and not (tmp_path / "runs" / "rejects").exists()


def test_a_lenient_stage_keeps_its_reject_rate_in_the_early_check(tmp_path):
    """The early check applies the stage's own policy: lenient mode accepts a bad row within max_reject_rate (the
    stage then writes it to its rejects file) and refuses a file over it; strict refuses the first."""
    from data.loaders import check_data_file
    from data.validation import DataValidationError, RejectRateExceeded

    rows = [json.dumps({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})] * 9
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(rows + ["[1]"]) + "\n")
    assert check_data_file(data, kind="sft", mode="lenient", max_reject_rate=0.1) == 10
    with pytest.raises(RejectRateExceeded):
        check_data_file(data, kind="sft", mode="lenient", max_reject_rate=0.05)
    with pytest.raises(DataValidationError, match=r"row 9: not an object \(a JSON array\)"):
        check_data_file(data, kind="sft", mode="strict")
    assert check_data_file(data) == 10  # no kind: only a file with no usable row fails
    assert not list(tmp_path.glob("**/*rejects*"))  # the lenient check's rejects went to a removed temporary folder


def test_a_runs_folder_on_a_pseudo_file_system_is_refused(tmp_path):
    """As root, os.access says /proc is writable; mkdir there fails. The check probes, and leaves nothing."""
    if not Path("/proc/self").exists():
        pytest.skip("no /proc on this system")
    with pytest.raises(RoundError, match=r"/proc/rlhf-runs cannot be created: /proc (cannot hold folders|is not writable)"):
        check_writable_folder("/proc/rlhf-runs")
    assert check_writable_folder(tmp_path / "runs") == tmp_path / "runs"
    assert list(tmp_path.iterdir()) == []  # the probe folder was removed


def test_an_uncached_hub_id_with_the_hub_off_is_said_before_prefect_starts(tmp_path, monkeypatch):
    """HF_HUB_OFFLINE and a hub id the local cache (an empty one here) does not hold: exit 2 naming the option, the
    id and the way out, instead of exit 1 from the first stage after Prefect started."""
    from huggingface_hub import constants
    from typer.testing import CliRunner

    from flows.cli import app

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    result = CliRunner().invoke(app, ["round", "--preset", "smoke", "--runs-dir", str(tmp_path / "runs"),
                                      "--round-id", "r1", "--base-model", "some-org/some-model"])
    assert result.exit_code == 2, result.output
    flat = _flat(result.output)
    assert "--base-model" in flat and "some-org/some-model: not in the local Hugging Face cache" in flat
    assert "temporary server" not in result.output and not (tmp_path / "runs").exists()


def test_a_json_list_in_set_becomes_one_word_per_item():
    from flows.cli import _set_values

    assert _set_values("[5, 10, 20]") == ["5", "10", "20"]
    assert _set_values('["reward_model", "judge"]') == ["reward_model", "judge"]
    assert _set_values("[true]") == ["true"]
    assert _set_values('{"backend": "openai"}') == ['{"backend": "openai"}']  # a mapping stays one value
    assert _set_values("0.2") == ["0.2"]


def test_a_model_folder_that_cannot_be_a_base_model_is_said_before_prefect_starts(tmp_path, monkeypatch):
    """A folder with a config.json that does not load (sizes that do not fit), or one without weights or a
    tokenizer, passed the old check and failed in SFT after Prefect started (exit 1, the traceback twice); now
    exit 2 naming the file and the reason, nothing created."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from typer.testing import CliRunner

    from flows.cli import app

    monkeypatch.chdir(tmp_path)
    bad = tmp_path / "bad-config"
    bad.mkdir()
    (bad / "config.json").write_text('{"model_type": "llama", "hidden_size": 8}')
    small = dict(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                 num_key_value_heads=2)
    no_weights = tmp_path / "no-weights"
    LlamaConfig(**small).save_pretrained(no_weights)
    no_tokenizer = tmp_path / "no-tokenizer"
    LlamaForCausalLM(LlamaConfig(**small)).save_pretrained(no_tokenizer)
    cases = [(bad, f"{bad / 'config.json'}: does not load as a model config"),
             (no_weights, f"{no_weights}: no weights (model.safetensors or pytorch_model.bin"),
             (no_tokenizer, f"{no_tokenizer}: no tokenizer")]
    for folder, message in cases:
        result = CliRunner().invoke(app, ["round", "--preset", "smoke", "--runs-dir", str(tmp_path / "runs"),
                                          "--round-id", "r1", "--base-model", str(folder)])
        assert result.exit_code == 2, result.output
        flat = _flat(result.output)
        assert "--base-model" in flat and message in flat, flat
        assert "temporary server" not in result.output and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("sets, message", [
    (['grpo.reward_functions=["judge"]', 'grpo.reward_judge={"backend": "opneai"}'],
     "grpo.reward_judge.backend: 'opneai' is not one of"),
    (['grpo.reward_functions=["judge"]', 'grpo.reward_judge={"backend": "openai", "colour": "x"}'],
     "grpo.reward_judge: unknown key(s) ['colour']"),
    (['grpo.reward_judge={"backend": "openai", "headers": {"Authorization": "Bearer sk-test0000000000000001"}}'],
     "grpo.reward_judge.headers: a secret is never given as a value"),
    (['grpo.tripwire_gold_judge={"backend": "reward_model"}'], "backend reward_model is the optimised reward model"),
    (["grpo.tripwire_gold_model_path=/no/such/rm"], "tripwire_gold_model_path /no/such/rm: no such folder"),
    (["grpo.tripwire_max_kl=-1"], "tripwire_max_kl must be >= 0 or None, got -1.0"),
], ids=["judge-backend", "judge-key", "judge-header-secret", "gold-judge-rm", "gold-path", "tripwire-bound"])
def test_online_rl_judges_and_tripwire_bounds_are_checked_before_prefect_starts(tmp_path, monkeypatch, sets, message):
    """These passed the early check and failed in the stage after SFT, DPO and the reward model trained (the
    smoke recipe's 2 steps make no tripwire check, so some were never checked at all), and a secret in a judge's
    headers reached the stage log and Prefect's database; now exit 2 before anything runs, the secret not shown."""
    from typer.testing import CliRunner

    from flows.cli import app

    monkeypatch.chdir(tmp_path)
    args = ["round", "--preset", "smoke", "--runs-dir", str(tmp_path / "runs"), "--round-id", "r1",
            "--online-rl", "grpo", "--ppo-override", "test"]
    for s in sets:
        args += ["--set", s]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert message in _flat(result.output) and "sk-test" not in result.output
    assert not (tmp_path / "runs").exists()


def _dead_port() -> int:
    """A loopback port nothing listens on once the socket is closed."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _openai_judge(base_url: str) -> str:
    return json.dumps({"backend": "openai", "base_url": base_url, "model": "judge", "api_key_env": "TEST_JUDGE_KEY",
                       "agreement_n": 0})


@pytest.mark.parametrize("key, extra", [
    ("gates.judge", []),
    ("grpo.reward_judge", ["--online-rl", "grpo", "--set", 'grpo.reward_functions=["reward_model", "judge"]']),
], ids=["gates-judge", "grpo-reward-judge"])
def test_a_judge_endpoint_that_does_not_answer_is_said_before_prefect_starts(tmp_path, monkeypatch, key, extra):
    """A dead gates judge was found by the gate stage's cache key, after SFT, DPO and the reward model trained, as
    four tracebacks; now exit 2 in one line naming the recipe key and its base_url, the key's value never shown."""
    from typer.testing import CliRunner

    from flows.cli import app

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TEST_JUDGE_KEY", "sk-test-judge-key-value-0001")
    url = f"http://127.0.0.1:{_dead_port()}/v1"
    result = CliRunner().invoke(app, ["round", "--preset", "smoke", "--runs-dir", str(tmp_path / "runs"),
                                      "--round-id", "r1", *extra, "--set", f"{key}={_openai_judge(url)}"])
    assert result.exit_code == 2, result.output
    line = next(ln for ln in result.output.splitlines() if ln.startswith("Error"))
    assert f"{key}: the openai judge at base_url {url} (model 'judge') does not answer" in line, result.output
    assert "Connection error" in line
    assert "sk-test-judge" not in result.output and "Traceback" not in result.output
    assert "temporary server" not in result.output and not (tmp_path / "runs").exists()


def test_a_judge_endpoint_that_never_answers_is_said_in_seconds(monkeypatch):
    """A server that accepts the connection and never answers held the pre-check for the judge's own timeout and
    retries (120 s x 4 by default: 497 s measured); the identity probe now waits PROBE_TIMEOUT_S, one retry."""
    import socket
    import threading
    import time

    from flows.stages import PROBE_TIMEOUT_S, check_endpoint_judges

    held, server = [], socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    stop = threading.Event()

    def accept():  # take every connection and say nothing
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    threading.Thread(target=accept, daemon=True).start()
    monkeypatch.setenv("TEST_JUDGE_KEY", "sk-test-judge-key-value-0003")
    url = f"http://127.0.0.1:{server.getsockname()[1]}/v1"
    t0 = time.monotonic()
    try:
        with pytest.raises(ValueError, match=r"gates.judge: the openai judge at base_url .* does not answer") as err:
            check_endpoint_judges("gates", SMOKE / "gates.yaml", ["--judge", _openai_judge(url)])
    finally:
        stop.set()
        for conn in held:
            conn.close()
        server.close()
    elapsed = time.monotonic() - t0
    assert "timed out" in str(err.value).lower() and "sk-test-judge" not in str(err.value)
    assert elapsed < 2 * PROBE_TIMEOUT_S + 20, elapsed  # two tries of one request, not 4 x 120 s


def test_a_live_judge_endpoint_is_asked_once_and_the_round_goes_on(tmp_path):
    """The same check with a real OpenAI-compatible server on loopback: it passes, the gates' judge and GRPO's
    reward judge on that endpoint are asked once between them (one probe: 8 chat requests), and the round goes on
    to its next check (here a Prefect API that does not answer, so nothing trains)."""
    from tests.policy_judge_server import requests_logged, start_policy_server

    with start_policy_server(tmp_path, name="judge", policy="longer") as server:
        judge = _openai_judge(server["base_url"])
        env = {**_env(tmp_path), "PREFECT_API_URL": f"http://127.0.0.1:{_dead_port()}/api",
               "TEST_JUDGE_KEY": "sk-test-judge-key-value-0002"}
        proc = subprocess.run(
            [sys.executable, "-m", "flows.cli", "round", "--preset", "smoke", "--runs-dir", str(tmp_path / "runs"),
             "--round-id", "r1", "--online-rl", "grpo", "--set", f"gates.judge={judge}",
             "--set", 'grpo.reward_functions=["reward_model", "judge"]', "--set", f"grpo.reward_judge={judge}"],
            capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
        asked = requests_logged(server)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "the Prefect API at" in proc.stderr and "does not answer" in proc.stderr  # the check after the judges
    assert "openai judge" not in proc.stderr and "sk-test-judge" not in proc.stderr
    assert asked == 8  # one identity probe (4 pairs x 2 orders) for the one endpoint both keys name
    assert not (tmp_path / "runs").exists()


def test_prompts_without_a_reference_for_the_judge_reward_are_said_before_prefect_starts(tmp_path, monkeypatch):
    """GRPO's judge reward on prompt rows without a ``reference`` failed inside the stage, after SFT, DPO and the
    reward model trained; now exit 2 naming the file, the first such row, the field, and how many lack it."""
    from typer.testing import CliRunner

    from flows.cli import app

    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in [
        {"prompt": "Say hi.", "reference": "Hi!"}, {"prompt": "Name a fruit."},
        {"prompt": "Count to three.", "reference": "1, 2, 3"}, {"prompt": "Name a colour.", "reference": " "}]))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["round", "--preset", "smoke", "--runs-dir", str(tmp_path / "runs"),
                                      "--round-id", "r1", "--online-rl", "grpo", "--set", f"grpo.train_data={data}",
                                      "--set", 'grpo.reward_functions=["judge"]'])
    assert result.exit_code == 2, result.output
    line = next(ln for ln in result.output.splitlines() if ln.startswith("Error"))
    assert f"grpo.train_data: {data}: row 1 field 'reference': missing or empty, and 2 of 4 prompts have none" in line
    assert "Traceback" not in result.output and not (tmp_path / "runs").exists()
    # the same file with the reward model alone is fine: the reference is needed by the judge reward only
    from flows.stages import check_stage_config

    check_stage_config("grpo", SMOKE / "grpo.yaml", ["--train_data", str(data)])


@pytest.mark.parametrize("args, message", [
    (["--online-rl", "grpo", "--set", "grpo.num_generationz=2"],
     "grpo (" + str(SMOKE / "grpo.yaml") + "): unknown key(s) 'num_generationz' (did you mean 'num_generations'"),
    (["--set", "grpo.num_generationz=2"],
     "--set for grpo, but --online-rl is 'ppo': they would be ignored (a round runs one online-RL stage, here "
     "ppo); to run grpo instead give --online-rl grpo (--ppo-override runs it even while locked), or drop them"),
    (["--online-rl", "rloo", "--force", "grpo"], "--force for grpo, but --online-rl is 'rloo'"),
], ids=["typo-in-the-rounds-stage", "set-for-another-stage", "force-for-another-stage"])
def test_a_set_for_an_online_rl_stage_is_checked_whether_or_not_it_is_sure_to_run(tmp_path, monkeypatch, args,
                                                                                 message):
    """``--set grpo.key`` was checked only with ``--ppo-override`` (the stage sure to run); a typo then reached
    the stage after training, or was never noticed when the unlock rule kept it locked. Now every stage a --set
    names is checked, and one for a stage the round does not run says which one it runs and how to pick another."""
    from typer.testing import CliRunner

    from flows.cli import app

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["round", "--preset", "smoke", "--runs-dir", str(tmp_path / "runs"),
                                      "--round-id", "r1", *args])
    assert result.exit_code == 2, result.output
    assert [ln for ln in result.output.splitlines() if message in ln], result.output
    assert "Traceback" not in result.output and not (tmp_path / "runs").exists()


def test_a_cache_key_that_cannot_be_computed_fails_the_stage_in_one_line_and_sets_its_old_report_aside(tmp_path):
    """In the flow, the gate stage's cache key asks its endpoint judge who it is; a dead one raised RuntimeError
    out of the task (tracebacks, no ``stage gates failed`` line), and the previous run's report stayed in
    ``gates/`` as if it were this round's. Now: StageFailed in one line, no process started, and the folder the
    pipeline created keeps no report, manifest or cache key of the earlier run (failure.json says why); files the
    manifest does not name stay."""
    from flows.stages import CACHE_KEY_FILE, StageFailed, run_stage
    from rlhf.rundir import create_stage_dir, read_failure

    runs = tmp_path / "runs"
    out = create_stage_dir(runs / "r1" / "gates")
    (out / "plots").mkdir()
    reports = {"report_json": out / "report.json", "report_md": out / "report.md",
               "junit": out / "report.junit.xml"}
    for path in [*reports.values(), out / "plots" / "drift.png", out / "generations.jsonl", out / "stage.log"]:
        path.write_text("earlier run")
    outside = tmp_path / "report.json"  # named by the manifest but outside the stage's folder: never touched
    outside.write_text("a user's file")
    (out / "manifest.json").write_text(json.dumps({"stage": "gates", "outputs": {
        **{k: str(v) for k, v in reports.items()}, "verdict": "pass",
        "plots": {"drift": str(out / "plots" / "drift.png"), "elsewhere": str(outside)}}}))
    (out / CACHE_KEY_FILE).write_text("an earlier key")
    url = f"http://127.0.0.1:{_dead_port()}/v1"
    with pytest.raises(StageFailed) as err:
        run_stage("gates", "gates.evaluate", SMOKE / "gates.yaml", out, runs_dir=runs, log=lambda _: None,
                  extra_args=["--judge", json.dumps({"backend": "openai", "base_url": url, "model": "judge",
                                                     "max_retries": 0})])
    msg = str(err.value)
    assert msg == (f"stage gates failed: its cache key could not be computed: RuntimeError: judge {url}: "
                   "GET /models failed: Connection error."), msg
    assert err.value.stage == "gates" and "\n" not in msg
    # the earlier run's answers go with its reports (they would pass for this run's); its log stays
    assert sorted(p.name for p in out.iterdir()) == [".rlhf-stage", "failure.json", "stage.log"]
    assert read_failure(out).startswith("StageFailed: its cache key could not be computed")
    assert outside.read_text() == "a user's file"
