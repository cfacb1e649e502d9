"""A real OpenAI-compatible HTTP server (FastAPI + uvicorn on loopback) whose "model" is a deterministic answer
policy, for the swapped-judge tests: two of them can serve different judges under the same served name.

Routes: ``GET /health``; ``GET /v1/models`` (the served name, ``created`` = now, as vLLM stamps it);
``POST /v1/chat/completions``: reads the two outputs out of the AlpacaEval-style pairwise template
(``judging.openai_judge.TEMPLATE``: ``"output": \"\"\"...\"\"\"``) and answers ``m`` (output 1) or ``M`` (output 2):

* ``longer``: the longer output (ties: output 1); ``shorter``: the shorter one (ties: output 1);
* ``first``: always output 1 (a judge with pure position bias).

Every chat request appends one line to ``--log`` (the test counts requests at the server, not in the client).
``--fingerprint`` sets ``system_fingerprint`` on every completion (default: none, as transformers serve sends).

Run: ``python tests/policy_judge_server.py --port P --name judge --policy longer --log L``;
:func:`start_policy_server` starts one and yields its base URL.
"""

from __future__ import annotations

import argparse
import re
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

# at module level: FastAPI resolves the (string, postponed) annotation ``Request`` in the module's globals
from fastapi import FastAPI, HTTPException, Request

OUTPUT = re.compile(r'"output": """(.*?)"""', re.DOTALL)


def answer(policy: str, user_message: str) -> str:
    """``m`` or ``M`` for one filled pairwise template under ``policy`` (module docstring); ``?`` when the message
    does not hold two outputs (unparsable for the judge, as a confused model's answer would be)."""
    outs = OUTPUT.findall(user_message)
    if len(outs) != 2:
        return "?"
    first, second = (len(o) for o in outs)
    if policy == "first":
        return "m"
    if policy == "longer":
        return "m" if first >= second else "M"
    if policy == "shorter":
        return "m" if first <= second else "M"
    raise ValueError(f"unknown policy {policy!r}")


def make_app(name: str, policy: str, log: Path, fingerprint: str | None):
    app = FastAPI()

    @app.get("/health")
    def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    def models():
        return {"object": "list", "data": [{"id": name, "object": "model", "created": int(time.time()),
                                            "owned_by": "tests"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        with open(log, "a", encoding="utf-8") as f:
            f.write("POST /v1/chat/completions\n")
        if body.get("model") != name:
            raise HTTPException(404, f"model {body.get('model')!r} is not served here")
        user = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
        text = answer(policy, user)
        return {
            "id": f"chatcmpl-{time.monotonic_ns()}", "object": "chat.completion", "created": int(time.time()),
            "model": name, "system_fingerprint": fingerprint,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": len(user.split()), "completion_tokens": 1,
                      "total_tokens": len(user.split()) + 1},
        }

    return app


@contextmanager
def start_policy_server(tmp: Path, *, name: str, policy: str, fingerprint: str | None = None, port: int = 0,
                        timeout_s: float = 60):
    """Start the server on ``port`` (0: a free loopback port) in a subprocess; yields ``{"base_url", "log"}``;
    stops it after. Requests are logged per server start.

    Raises:
        RuntimeError: the server exited or did not answer ``/health`` within ``timeout_s`` (its output attached).
    """
    if not port:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    stamp = time.monotonic_ns()
    log, out = tmp / f"requests-{port}-{stamp}.log", tmp / f"server-{port}-{stamp}.out"
    log.touch()
    cmd = [sys.executable, __file__, "--port", str(port), "--name", name, "--policy", policy, "--log", str(log)]
    if fingerprint:
        cmd += ["--fingerprint", fingerprint]
    with open(out, "w") as o:
        proc = subprocess.Popen(cmd, stdout=o, stderr=subprocess.STDOUT)
    try:
        from tests.http_server import wait_for_health

        wait_for_health(proc, f"http://127.0.0.1:{port}", out, timeout_s=timeout_s, what="policy judge server")
        yield {"base_url": f"http://127.0.0.1:{port}/v1", "log": log}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def requests_logged(server: dict) -> int:
    """Chat requests the server has answered so far."""
    return len(server["log"].read_text().splitlines())


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--policy", required=True, choices=("longer", "shorter", "first"))
    ap.add_argument("--log", type=Path, required=True)
    ap.add_argument("--fingerprint", default=None)
    a = ap.parse_args()
    import uvicorn

    uvicorn.run(make_app(a.name, a.policy, a.log, a.fingerprint), host="127.0.0.1", port=a.port, log_level="warning")
