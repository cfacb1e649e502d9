"""Shared fixtures: the tiny model (2 layers, SmolLM2 tokenizer) built once per machine and cached; a throwaway
Prefect home for the whole session.

Prefect: before anything imports prefect, PREFECT_HOME and PREFECT_API_DATABASE_CONNECTION_URL point at a temporary
directory and PREFECT_API_URL is unset, so no test run, flow run or artifact reaches the user's ~/.prefect database
or a server their profile names. The directory is removed at the end of the session.

Precision: ``RLHF_NATIVE_BF16=0`` unless set (see below).
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# The suite's numbers (golden files, tolerances, bit-identical reruns) are fp32's, so by default it runs as on a CPU
# without native bf16, on every CPU; the bf16 path is run on every machine too, by the tests that force the detection
# to 1 (tests/test_precision_bf16.py, test_machine_efficiency.py, test_lineage.py). Stage subprocesses inherit it.
# RLHF_NATIVE_BF16= (empty) runs the suite on this machine's own detection instead.
os.environ.setdefault("RLHF_NATIVE_BF16", "0")

TEST_PREFECT_HOME = tempfile.mkdtemp(prefix="rlhf-tests-prefect-")
os.environ["PREFECT_HOME"] = TEST_PREFECT_HOME
os.environ["PREFECT_API_DATABASE_CONNECTION_URL"] = f"sqlite+aiosqlite:///{TEST_PREFECT_HOME}/prefect.db"
os.environ.pop("PREFECT_API_URL", None)
os.environ.pop("PREFECT_PROFILES_PATH", None)
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")  # busy shared CPUs start slowly


@pytest.fixture(scope="session", autouse=True)
def temporary_prefect_home():
    """The session's Prefect home (see module docstring); removed when the session ends."""
    yield TEST_PREFECT_HOME
    shutil.rmtree(TEST_PREFECT_HOME, ignore_errors=True)


@pytest.fixture(scope="session")
def tiny_model_dir() -> str:
    from rlhf.models import resolve_base_model

    return resolve_base_model("tiny")


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def openai_server(tiny_model_dir, tmp_path_factory):
    """A real OpenAI-compatible endpoint: ``transformers serve`` on a free loopback port, serving the tiny model
    (preloaded with the positional FORCE_MODEL argument, on CPU). Yields ``{"base_url", "model", "log"}``; the log
    holds uvicorn's access lines (one ``POST /v1/chat/completions`` per request). Stopped at the end."""
    import socket
    import subprocess
    import sys
    from pathlib import Path

    from tests.http_server import wait_for_health

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = Path(tmp_path_factory.mktemp("serve")) / "serve.log"
    cmd = [sys.executable, "-m", "transformers.cli.transformers", "serve", tiny_model_dir, "--host", "127.0.0.1",
           "--port", str(port), "--device", "cpu", "--log-level", "info"]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for_health(proc, f"http://127.0.0.1:{port}", log, timeout_s=120, what="transformers serve")
        yield {"base_url": f"http://127.0.0.1:{port}/v1", "model": tiny_model_dir, "log": log}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
