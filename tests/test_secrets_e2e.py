"""Secrets by reference, end to end: a marker API key and a marker database password are planted in the places the
pipeline accepts them (the environment variables that ``api_key_env`` and ``--db-password-env`` name), the round's
gate stage runs through the round flow's own task against a real OpenAI-compatible judge (``transformers serve`` on
loopback, behind a proxy that records the key each request carried), and the flywheel's ``ingest`` and ``export``
commands run against a real PostgreSQL that demands the password. Then every file written (stage folders, logs, the
W&B offline run, Prefect's database, judgment caches, the Slurm script and Kubernetes manifests the launchers would
submit, the commands' own output) is searched for both markers: zero hits, while the judge got the key on every
request and the database accepted the password. A secret given where a name goes is refused in one line that does
not repeat it."""

from __future__ import annotations

import http.server
import json
import os
import re
import secrets
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.pg_server import PostgresUnavailable, start_postgres

ROOT = Path(__file__).resolve().parent.parent
JUDGE_ENV = "RLHF_E2E_JUDGE_KEY"
PG_ENV = "RLHF_E2E_PG_PASSWORD"


class KeyRecordingProxy:
    """A loopback HTTP proxy in front of the judge's server; ``authorization`` lists each request's header."""

    def __init__(self, upstream: str):
        seen: list[str | None] = []
        self.authorization = seen

        class Handler(http.server.BaseHTTPRequestHandler):
            def forward(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                seen.append(self.headers.get("Authorization"))
                req = urllib.request.Request(upstream + self.path, data=body, method=self.command,
                                             headers={"Content-Type": self.headers.get("Content-Type") or "text/plain"})
                try:
                    with urllib.request.urlopen(req, timeout=300) as r:
                        status, data, ctype = r.status, r.read(), r.headers.get("Content-Type")
                except urllib.error.HTTPError as err:
                    status, data, ctype = err.code, err.read(), err.headers.get("Content-Type")
                self.send_response(status)
                self.send_header("Content-Type", ctype or "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = forward

            def log_message(self, *args):  # quiet
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self.server.server_port}/v1"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def files_containing(roots: list[Path], markers: list[str], *, since: float | None = None) -> list[str]:
    """Every regular file under ``roots`` (modified at or after ``since``, when given) whose bytes hold a marker."""
    needles = [m.encode() for m in markers]
    hits = []
    for root in roots:
        for p in [root] if root.is_file() else root.rglob("*"):
            if p.is_file() and not p.is_symlink() and (since is None or p.stat().st_mtime >= since):
                data = p.read_bytes()
                hits += [f"{p}: {m.decode()}" for m in needles if m in data]
    return hits


def _env(tmp: Path, judge_key: str, pg_password: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "WANDB_")) and k != "DO_NOT_TRACK"}
    env.update({
        "PREFECT_HOME": str(tmp / "prefect"),  # Prefect's database (parameters, logs, artifacts) lands here
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
        "WANDB_MODE": "offline", "WANDB_CACHE_DIR": str(tmp / "wandb-home" / "cache"),
        "WANDB_CONFIG_DIR": str(tmp / "wandb-home" / "config"), "WANDB_DATA_DIR": str(tmp / "wandb-home" / "data"),
        JUDGE_ENV: judge_key, PG_ENV: pg_password,
    })
    return env


def _run(cmd: list[str], env: dict, log: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    log.write_text(proc.stdout + proc.stderr)  # searched with everything else
    return proc


@pytest.mark.e2e
def test_marker_secrets_reach_the_judge_and_the_database_and_no_file_written(openai_server, tiny_model_dir, tmp_path):
    from flows.launch.kubernetes import KubernetesJob, render_manifests
    from flows.launch.slurm import SlurmJob, render_sbatch
    from flows.round import RoundParameters, _recipe, stage_args
    from flywheel.simulate import load_simulator_config, simulate
    from rlhf.models import cache_root

    t0 = time.time() - 1
    judge_key, pg_password = "sk-" + secrets.token_hex(16), "pw" + secrets.token_hex(16)
    markers = [judge_key, pg_password]
    env = _env(tmp_path, judge_key, pg_password)
    proxy = KeyRecordingProxy(openai_server["base_url"].removesuffix("/v1"))
    judge = {"backend": "openai", "model": openai_server["model"], "base_url": proxy.base_url,
             "api_key_env": JUDGE_ENV, "agreement_n": 2, "max_concurrency": 2, "cache_dir": str(tmp_path / "judgments")}
    try:
        # (a) the round's gate stage, through the round flow's task, judged by the openai backend
        small = ["--n_winrate", "2", "--n_safe", "2", "--n_redteam", "2", "--n_capability", "2", "--n_sycophancy", "2",
                 "--max_new_tokens", "4", "--mc_max_new_tokens", "4", "--allow_same_model", "true"]
        overrides = {"gates": ["--judge", json.dumps(judge), "--reward_model_dir", "", "--ppo_unlock_json", "",
                               *small]}
        params = RoundParameters(preset="smoke", round_id="secrets-1", runs_dir=str(tmp_path / "runs"),
                                 overrides=overrides)
        round_dir = tmp_path / "runs" / "secrets-1"
        round_dir.mkdir(parents=True)
        dirs = {"sft": tiny_model_dir, "candidate": tiny_model_dir, "reward_model": tiny_model_dir}
        given = {"params": params.model_dump(), "round_dir": str(round_dir), "dirs": dirs}
        gate = _run([sys.executable, "-m", "tests.gate_stage_flow", json.dumps(given)], env, tmp_path / "gate.log")
        assert gate.returncode == 0, gate.stdout[-3000:] + gate.stderr[-3000:]
        n_gate_requests = len(proxy.authorization)
        manifest = json.loads((round_dir / "gates" / "manifest.json").read_text())
        assert manifest["outputs"]["judge"]["requests_sent"] == 2 * 2 + 2 * 2  # 2 win-rate, 2 agreement pairs, both orders
        # plus the judge's identity probe (the listing and 4 pairs in both orders: judging/identity.py), asked by the
        # stage and, where the flow computes the gate stage's cache key first, by the flow too
        probes = manifest["outputs"]["judge"]["probe_requests_sent"]
        # and the canaries, asked of the candidate's judge (gates/canaries.py): their pairs, with the same key, and
        # no probe of their own
        canary = manifest["metrics"]["canaries"]["metrics"]["canary_judge_calls"]["value"]
        assert canary == 3 * 2 * 2, canary
        assert probes == 9 and n_gate_requests in (8 + probes + canary, 8 + 2 * probes + canary), n_gate_requests
        assert manifest["config"]["judge"]["api_key_env"] == JUDGE_ENV  # the name is recorded, never the key
        wandb_runs = list((round_dir / "gates").rglob("offline-run-*/*.wandb"))
        assert len(wandb_runs) == 1  # the W&B offline run is among the files searched

        # what the launchers would write for the same stage: the Slurm script and the Kubernetes manifests
        args = [*stage_args("gates", params, round_dir, dirs), "--round_id", "secrets-1", *overrides["gates"]]
        sbatch = render_sbatch(SlurmJob(gpus_per_node=0, processes_per_node=1), stage="gates", round_id="secrets-1",
                               module="gates.evaluate", recipe=_recipe(params, "gates"),
                               output_dir=round_dir / "gates", extra_args=args)
        (tmp_path / "job.sbatch").write_text(sbatch)
        assert JUDGE_ENV in sbatch  # the judge's config is in the script, by name
        k8s = render_manifests(KubernetesJob(image="rlhf:1", pvc="runs", secret_env={JUDGE_ENV: "judge-credentials"}),
                               stage="gates", round_id="secrets-1", preset="smoke", extra_args=args)
        (tmp_path / "k8s.yaml").write_text(yaml.safe_dump_all(k8s))
        pod_env = k8s[1]["spec"]["template"]["spec"]["containers"][0]["env"]
        assert {"name": JUDGE_ENV, "valueFrom": {"secretKeyRef": {"name": "judge-credentials", "key": JUDGE_ENV}}} \
            in pod_env

        # (b) the flywheel commands against a PostgreSQL server that demands the password over TCP
        try:
            server = start_postgres(password=pg_password)
            url = server.__enter__()
        except PostgresUnavailable as err:
            pytest.skip(f"PostgreSQL server cannot be started: {err}")
        try:
            import sqlalchemy as sa

            with pytest.raises(sa.exc.OperationalError, match="password"):  # the URL alone does not get in
                with sa.create_engine(url).connect():
                    pass
            sim = tmp_path / "sim"
            simulate(load_simulator_config("recipes/flywheel/simulator.yaml", n_conversations=12, pii_rate=0.3), sim)
            cli = [sys.executable, "-m", "flows.cli", "flywheel"]
            ingest = _run([*cli, "ingest", "--db", url, "--db-password-env", PG_ENV, str(sim / "events.jsonl")], env,
                          tmp_path / "ingest.log")
            assert ingest.returncode == 0, ingest.stderr[-3000:]
            counts = json.loads(ingest.stdout.strip().splitlines()[-1])
            n_events = len((sim / "events.jsonl").read_text().splitlines())
            assert counts["events"] == n_events > 0
            export = _run([*cli, "export", "--out-dir", str(tmp_path / "fw"), "--db", url, "--db-password-env",
                           PG_ENV, "--events", str(sim / "events.jsonl"), "--judge", json.dumps(judge),
                           "--budget", "4", "--alternatives", str(sim / "alternatives.jsonl")],
                          env, tmp_path / "export.log")
            assert export.returncode == 0, export.stdout[-3000:] + export.stderr[-3000:]
            report = json.loads((tmp_path / "fw" / "report.json").read_text())
            assert report["db"] == url and report["ingested"][0]["skipped_file"]  # ingested once, by `ingest`
            assert report["judge"]["judge_config"]["api_key_env"] == JUDGE_ENV
            assert len(proxy.authorization) > n_gate_requests  # the flywheel's judge asked the server too
        finally:
            server.__exit__(None, None, None)
    finally:
        proxy.close()

    # every request carried the planted key, read from the variable the config names
    assert set(proxy.authorization) == {f"Bearer {judge_key}"}
    # Prefect recorded the runs (parameters, logs) in its database under PREFECT_HOME: it is searched too
    with sqlite3.connect(tmp_path / "prefect" / "prefect.db") as db:
        flows = {name for (name,) in db.execute("select name from flow")}
        params_text = " ".join(p for (p,) in db.execute("select parameters from flow_run"))
        n_logs = db.execute("select count(*) from log").fetchone()[0]
    assert {"gate-stage", "flywheel"} <= flows and JUDGE_ENV in params_text and n_logs > 0
    # the search finds a marker where one is written (so zero hits below means none was written)
    (tmp_path / "control.bin").write_bytes(b"\0" + judge_key.encode() + b"\0")
    assert files_containing([tmp_path / "control.bin"], markers) == [f"{tmp_path / 'control.bin'}: {judge_key}"]
    (tmp_path / "control.bin").unlink()

    hits = files_containing([tmp_path], markers)
    hits += files_containing([cache_root()], markers, since=t0) if cache_root().is_dir() else []
    assert hits == []


def test_a_secret_given_as_a_value_is_refused_in_one_line_that_does_not_repeat_it(tmp_path):
    from typer.testing import CliRunner

    from flows.cli import app
    from flows.stages import check_stage_config

    marker = "sk-" + secrets.token_hex(16)
    runner = CliRunner()
    cases = [
        (["round", "--preset", "smoke", "--runs-dir", str(tmp_path / "runs"), "--set",
          f'gates.judge={{"backend": "openai", "api_key": "{marker}"}}'], "gates.judge.api_key_env"),
        (["round", "--preset", "smoke", "--runs-dir", str(tmp_path / "runs"), "--set", f"sft.hub_token={marker}"],
         "sft.hub_token"),
        (["round", "--preset", "smoke", "--runs-dir", str(tmp_path / "runs"), "--launcher", "slurm", "--slurm",
          json.dumps({"gpus_per_node": 0, "processes_per_node": 1, "setup": [f"export OPENAI_API_KEY={marker}"]})],
         "never written into job.sbatch"),
        (["flywheel", "export", "--out-dir", str(tmp_path / "fw"), "--db",
          f"postgresql+psycopg://postgres:{marker}@127.0.0.1:1/db"], "db_password_env"),
        (["flywheel", "export", "--out-dir", str(tmp_path / "fw"), "--judge",
          json.dumps({"backend": "openai", "api_key": marker})], "judge.api_key_env"),
        (["flywheel", "export", "--out-dir", str(tmp_path / "fw"), "--db-password-env", marker], "NAME of an"),
        (["flywheel", "ingest", "--db", f"postgresql+psycopg://postgres:{marker}@127.0.0.1:1/db",
          str(tmp_path / "events.jsonl")], "--db-password-env"),
    ]
    for argv, named in cases:
        result = runner.invoke(app, argv)
        assert result.exit_code == 2, (argv, result.output)
        flat = re.sub(r"[\s│╭╮╰╯─]+", "", result.output)  # the message as typer's box wraps it, unwrapped
        assert named.replace(" ", "") in flat, (argv, result.output)
        assert marker not in flat
    assert not (tmp_path / "runs").exists() and not (tmp_path / "fw").exists()  # refused before anything started

    # a recipe holding a key: refused when the round checks its recipes, before any stage runs
    recipe = tmp_path / "gates.yaml"
    recipe.write_text(yaml.safe_dump({"judge": {"backend": "openai", "api_key": marker}}))
    with pytest.raises(ValueError, match="gates.*api_key_env") as err:
        check_stage_config("gates", recipe, [])
    assert marker not in str(err.value) and "\n" not in str(err.value)


def test_database_urls_are_recorded_with_the_password_hidden():
    from rlhf.credentials import check_url, redact_url, url_password, url_with_env_password

    url = "postgresql+psycopg://fly:s3cr%40t@db.example:5432/signals"
    assert url_password(url) == "s3cr@t" and redact_url(url) == "postgresql+psycopg://fly:***@db.example:5432/signals"
    assert redact_url("runs/fw/signals.duckdb") == "runs/fw/signals.duckdb"
    assert check_url("postgresql+psycopg://fly@db.example/signals", "db", "x") == "postgresql+psycopg://fly@db.example/signals"
    with pytest.raises(ValueError, match="holds a password") as err:
        check_url(url, "db", "db_password_env")
    assert "s3cr" not in str(err.value)
    os.environ[PG_ENV] = "from-env"
    try:
        built = url_with_env_password("postgresql+psycopg://fly@db.example/signals", PG_ENV)
        assert built.password == "from-env" and "from-env" not in str(built)  # SQLAlchemy's str() hides it too
    finally:
        del os.environ[PG_ENV]
    with pytest.raises(ValueError, match=f"{PG_ENV}: that environment variable is not set"):
        url_with_env_password("postgresql+psycopg://fly@db.example/signals", PG_ENV)


@pytest.mark.parametrize("value", [
    '{backend: openai, model: m, api_key: MARKER}',  # YAML, which --set also takes
    '{"backend": "openai", "api_key_env": "sk-MARKERabc"}',  # the key itself where its variable's name goes
    '{backend: openai, api_key_env: openai_key_MARKER}',  # not a variable's name (lower case)
    '{"backend": "openai", "base_url": "http://user:MARKER@127.0.0.1:8000/v1"}',  # a password in the judge's URL
    "postgresql+psycopg://fly@127.0.0.1/db?password=MARKER",  # in the query: the driver takes it as the password
    "host=127.0.0.1 password=MARKER dbname=signals",  # a libpq keyword string
])
def test_every_form_of_a_secret_value_is_refused_before_the_flow_run_exists(value):
    """The pre-flight check (``RoundParameters``, the flywheel's parameters) refuses each form in one line without
    the value; the same settings by name pass."""
    from flows.round import RoundParameters
    from rlhf.credentials import SecretValueError, check_value

    with pytest.raises(SecretValueError) as err:
        check_value(value, "gates.judge")
    assert "MARKER" not in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ValueError) as err:
        RoundParameters(preset="smoke", overrides={"gates": ["--judge", value]})
    assert "MARKER" not in str(err.value)
    for fine in ('{backend: openai, api_key_env: OPENAI_API_KEY, base_url: "http://127.0.0.1:8000/v1"}',
                 "postgresql+psycopg://fly@127.0.0.1/db?sslmode=require", "runs/fw/signals.duckdb"):
        check_value(fine, "gates.judge")


def test_an_unknown_or_renamed_stage_in_force_or_set_is_a_usage_error_before_the_flow(tmp_path):
    """``--force reward`` would be ignored silently: refused in one line naming the new name, exit 2, nothing made."""
    from typer.testing import CliRunner

    from flows.cli import app

    for argv in (["--force", "reward"], ["--set", "reward.max_steps=1"]):
        result = CliRunner().invoke(app, ["round", "--preset", "smoke", "--runs-dir", str(tmp_path / "runs"), *argv])
        assert result.exit_code == 2, result.output
        assert "renamed reward_model" in re.sub(r"[\s│╭╮╰╯─]+", " ", result.output), result.output
    assert not (tmp_path / "runs").exists()
