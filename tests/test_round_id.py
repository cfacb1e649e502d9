"""Round ids and artifact keys (Prefect PR #8860 key rule, Prefect #18475)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import TypeAdapter
from prefect.client.schemas.actions import ArtifactCreate
from prefect.types.names import ArtifactKey

from rlhf.round_id import MAX_SLUG_LENGTH, artifact_key, ascii_slug, check_round_id

TOO_LONG_FOR_A_KEY = "round-" + "x" * 50 + "-final"  # 62 characters: a safe folder name, longer than a key slug


def prefect_accepts(key: str) -> str:
    """Prefect's own validation of an artifact key (the type its client and server schemas use)."""
    TypeAdapter(ArtifactKey).validate_python(key)
    return ArtifactCreate(key=key, type="markdown", data="x").key


def test_the_old_key_breaks_prefects_rule():
    old = "".join(c if c.isalnum() else "-" for c in "rüde-1".lower())  # flows/round.py before the fix
    with pytest.raises(ValueError, match="lowercase letters, numbers, and dashes"):
        prefect_accepts(f"gate-report-{old}")


@pytest.mark.parametrize("round_id", ["rüde-1", "東京", "a_b", TOO_LONG_FOR_A_KEY])
def test_round_ids_give_valid_keys(round_id):
    assert check_round_id(round_id) == round_id
    key = artifact_key("gate-report", round_id)
    assert prefect_accepts(key) == key
    assert key.isascii() and len(key) <= len("gate-report-") + MAX_SLUG_LENGTH + 9


def test_keys_are_distinct_and_stable():
    ids = ["rüde-1", "rude-1", "東京", "大阪", "a_b", "a-b", TOO_LONG_FOR_A_KEY, TOO_LONG_FOR_A_KEY[:-1] + "X"]
    keys = [artifact_key("gates", r) for r in ids]
    assert len(set(keys)) == len(ids)
    assert keys[0] == artifact_key("gates", "rüde-1")
    assert keys[0].startswith("gates-rude-1-") and keys[2].startswith("gates-") and len(keys[2]) == len("gates-") + 8
    assert ascii_slug("Straße Été") == "strae-ete"  # ß has no ASCII decomposition; the hash keeps it distinct
    with pytest.raises(ValueError, match="prefix"):
        artifact_key("Gate_Report", "x")


@pytest.mark.parametrize("bad", ["..", ".", ".hidden", "a/b", "../x", "/abs", "a b", "-x", "x" * 65, "", "a\\b"])
def test_unsafe_round_ids_are_refused(bad):
    with pytest.raises(ValueError, match="round id"):
        check_round_id(bad)


def test_round_parameters_check_the_id_before_anything_runs():
    from flows.round import RoundParameters, default_round_id

    assert RoundParameters(round_id="rüde-1").round_id == "rüde-1"
    with pytest.raises(ValueError, match="not a safe folder name"):
        RoundParameters(round_id="../x")
    assert default_round_id("/some/folder/my-recipes").startswith("my-recipes-")


def test_cli_refuses_a_bad_round_id_before_training(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "flows.cli", "round", "--preset", "smoke", "--round-id", "a/b",
         "--runs-dir", str(tmp_path / "runs")],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "not a safe folder name" in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_cli_refuses_an_unknown_preset_before_anything_exists(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "flows.cli", "round", "--preset", "smok", "--runs-dir", str(tmp_path / "runs")],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "no such preset" in proc.stderr and "smoke" in proc.stderr  # the presets there are, named
    assert not (tmp_path / "runs").exists()


def test_cli_refuses_a_mistyped_override_key_before_anything_exists(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "flows.cli", "round", "--preset", "smoke", "--set", "sft.learnin_rate=1e-4",
         "--runs-dir", str(tmp_path / "runs")],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "unknown key(s) 'learnin_rate'" in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_cli_says_in_one_line_when_the_configured_prefect_api_does_not_answer(tmp_path):
    import os
    import socket

    with socket.socket() as s:  # a loopback port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PREFECT_API_URL": f"http://user:secret@127.0.0.1:{port}/api"}
    proc = subprocess.run(
        [sys.executable, "-m", "flows.cli", "round", "--preset", "smoke", "--runs-dir", str(tmp_path / "runs")],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == [f"error: the Prefect API at http://127.0.0.1:{port}/api does not answer (ConnectError); start it "
                     "(`prefect server start`) or unset PREFECT_API_URL to run on a temporary local server"]
    assert "secret" not in proc.stderr and not (tmp_path / "runs").exists()
