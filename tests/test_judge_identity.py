"""A judge is who answers, not what it is called: real OpenAI-compatible servers on loopback
(``tests/policy_judge_server.py``, FastAPI + uvicorn) serving different judges under the SAME served name.

* a judge swapped behind the same endpoint and name is detected (its probe answers differ), sends fresh requests,
  is re-qualified (its agreement is measured again and equals the value its own answer policy implies) and reuses
  none of the first judge's cached judgments;
* two endpoints serving different judges under one name at once do not share cache or agreement;
* the same judge hit twice reuses everything (0 judging requests; only the identity probe is asked);
* a completion's ``system_fingerprint`` alone makes a different judge.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.http_server import wait_for_health
from tests.policy_judge_server import requests_logged, start_policy_server

NAME = "judge"  # the one served name every server here answers to
N_AGREE = 40  # agreement pairs (PandaLM's first 40): 80 requests, well under a second on these servers
PROBE = 8  # probe chat requests per judge build: 4 pairs x 2 orders (plus one GET /v1/models, not a chat request)
WINRATE = (["Name a fruit.", "Say hi.", "Count to three."],
           ["Apple.", "Hi", "1, 2, 3"],
           ["A banana is a fruit.", "Hello there, friend!", "one two three"])


def _config(server, cache):
    from judging.judges import JudgeConfig

    return JudgeConfig.from_dict({"backend": "openai", "model": NAME, "base_url": server["base_url"],
                                  "agreement_n": N_AGREE, "max_concurrency": 4, "cache_dir": str(cache)})


def _gate_run(server, cache):
    """What a gate run does with its judge: build it (the identity is measured), judge the win-rate pairs, qualify.
    Returns (judge, judgments, qualification, chat requests the server answered during the run)."""
    from judging.factory import make_judge
    from judging.qualify import qualify_judge

    before = requests_logged(server)
    cfg = _config(server, cache)
    judge = make_judge(cfg)
    judgments = judge.judge(*WINRATE)
    q = qualify_judge(judge, cfg)
    return judge, judgments, q, requests_logged(server) - before


def _policy_agreement(policy: str, tmp_path):
    """The agreement a judge answering by ``policy`` must measure, worked out from the policy's definition (both
    orders: the longer (shorter) response wins in both, equal lengths give output 1 each time = a tie)."""
    from data.labels import FIRST, SECOND, TIE
    from data.loaders import load_pairs
    from judging.agreement import judge_agreement

    pairs = list(load_pairs("demo:pandalm/testset-v1.jsonl.gz", mode="lenient", max_reject_rate=0.07,
                            rejects_path=tmp_path / "rejects.jsonl"))[:N_AGREE]
    labels = []
    for p in pairs:
        a, b = len(p.chosen), len(p.rejected)
        if a == b:
            labels.append(TIE)
        elif (a > b) == (policy == "longer"):
            labels.append(FIRST)
        else:
            labels.append(SECOND)
    expert = np.array([[lab.preference for lab in p.labels] for p in pairs], dtype=np.int64)
    return judge_agreement(np.array(labels), expert)


def test_a_judge_swapped_behind_the_same_endpoint_and_name_is_a_new_judge(tmp_path):
    cache = tmp_path / "cache"
    with start_policy_server(tmp_path, name=NAME, policy="longer") as first:
        j1, judged1, q1, sent1 = _gate_run(first, cache)
        port = first["base_url"].rsplit(":", 1)[1].split("/")[0]
    assert sent1 == PROBE + 2 * len(WINRATE[0]) + 2 * N_AGREE
    assert j1.identity_report()["identity_check"]["status"] == "new"
    assert j1.requests_sent == 2 * len(WINRATE[0]) + 2 * N_AGREE and j1.identity_report()["probe_requests_sent"] == 9
    assert [j.preference for j in judged1] == [2.0, 2.0, 2.0]  # the longer answer (B) wins every pair
    want_longer = _policy_agreement("longer", tmp_path)
    assert q1.agreement.agreement == want_longer.agreement and q1.agreement.n == want_longer.n and not q1.cached

    # other weights, same port, same served name: only the probe can tell
    with start_policy_server(tmp_path, name=NAME, policy="shorter", port=int(port)) as second:
        assert second["base_url"] == first["base_url"]
        j2, judged2, q2, sent2 = _gate_run(second, cache)
    check = j2.identity_report()["identity_check"]
    assert check["status"] == "changed" and check["changed"] == ["probe"]
    assert check["previous_identity_hash"] == j1.identity_hash() != j2.identity_hash()
    assert j2.identity()["endpoint"] == j1.identity()["endpoint"] and j2.identity()["served"] == j1.identity()["served"]
    # fresh requests: none of the first judge's cached answers is reused, and the agreement is measured again
    assert sent2 == PROBE + 2 * len(WINRATE[0]) + 2 * N_AGREE
    assert [j.preference for j in judged2] == [1.0, 1.0, 1.0]  # this judge prefers the shorter answer (A)
    want_shorter = _policy_agreement("shorter", tmp_path)
    assert not q2.cached and q2.requests_sent == 2 * N_AGREE
    assert q2.agreement.agreement == want_shorter.agreement != q1.agreement.agreement
    assert q2.identity_hash == j2.identity_hash() and q1.identity_hash == j1.identity_hash()

    # and the first judge back on that port is recognised again: everything from the cache
    with start_policy_server(tmp_path, name=NAME, policy="longer", port=int(port)) as back:
        j3, judged3, q3, sent3 = _gate_run(back, cache)
    assert sent3 == PROBE and j3.requests_sent == 0 and q3.cached
    assert j3.identity_hash() == j1.identity_hash() and j3.identity_report()["identity_check"]["status"] == "changed"
    assert [j.preference for j in judged3] == [2.0, 2.0, 2.0]
    assert (q3.agreement.agreement, q3.agreement.n) == (q1.agreement.agreement, q1.agreement.n)


def test_two_endpoints_serving_different_judges_under_one_name_share_nothing(tmp_path):
    cache = tmp_path / "cache"
    with (start_policy_server(tmp_path, name=NAME, policy="longer") as a,
          start_policy_server(tmp_path, name=NAME, policy="first") as b):
        ja, _, qa, sent_a = _gate_run(a, cache)
        jb, judged_b, qb, sent_b = _gate_run(b, cache)
    assert sent_a == sent_b == PROBE + 2 * len(WINRATE[0]) + 2 * N_AGREE
    assert ja.identity()["model"] == jb.identity()["model"] == NAME and ja.identity_hash() != jb.identity_hash()
    assert jb.identity_report()["identity_check"]["status"] == "new"  # another endpoint: its own lineage
    # pure position bias: output 1 wins in both orders, so every item is a tie and every pair inconsistent
    assert [j.preference for j in judged_b] == [1.5, 1.5, 1.5] and all(j.consistent is False for j in judged_b)
    assert not qb.cached and qb.agreement.n_tie == qb.agreement.n and qa.agreement.agreement > 0
    assert qb.agreement.agreement == 0.0


def test_the_same_judge_hit_twice_reuses_its_cache(tmp_path):
    cache = tmp_path / "cache"
    with start_policy_server(tmp_path, name=NAME, policy="longer") as s:
        j1, judged1, q1, sent1 = _gate_run(s, cache)
        j2, judged2, q2, sent2 = _gate_run(s, cache)
    assert sent1 == PROBE + 2 * len(WINRATE[0]) + 2 * N_AGREE
    assert sent2 == PROBE  # only the identity probe; 0 judging requests
    assert j2.requests_sent == 0 and q2.cached and q2.requests_sent == 0
    assert j2.identity_report()["identity_check"] == {"status": "unchanged", "identity_hash": j1.identity_hash(),
                                                      "previous_identity_hash": j1.identity_hash(), "changed": []}
    assert [j.preference for j in judged2] == [j.preference for j in judged1]
    assert (q2.agreement.agreement, q2.agreement.n) == (q1.agreement.agreement, q1.agreement.n)


def test_a_different_system_fingerprint_is_a_different_judge(tmp_path):
    cache = tmp_path / "cache"
    with start_policy_server(tmp_path, name=NAME, policy="longer", fingerprint="fp_aaa") as s:
        port = int(s["base_url"].rsplit(":", 1)[1].split("/")[0])
        j1, _, _, _ = _gate_run(s, cache)
    with start_policy_server(tmp_path, name=NAME, policy="longer", fingerprint="fp_bbb", port=port) as s:
        j2, _, q2, sent2 = _gate_run(s, cache)
    assert j1.identity()["probe"]["system_fingerprints"] == ["fp_aaa"]
    assert j2.identity()["probe"]["answers_sha256"] == j1.identity()["probe"]["answers_sha256"]  # same answers
    assert j2.identity_report()["identity_check"]["changed"] == ["probe"] and not q2.cached
    assert sent2 == PROBE + 2 * len(WINRATE[0]) + 2 * N_AGREE


def test_the_identity_carries_no_credentials_and_no_request_time():
    from judging.identity import public_endpoint, served_model

    assert public_endpoint("https://bob:s3cret@api.example.com:8443/v1/?api-key=s3cret#frag") == \
        "https://api.example.com:8443/v1"
    assert public_endpoint("http://127.0.0.1:8000/v1") == "http://127.0.0.1:8000/v1"
    listing = [{"id": "other", "created": 1}, {"id": NAME, "object": "model", "created": 1733000000,
                                               "owned_by": "vllm", "root": "/models/llama-8b", "parent": None,
                                               "permission": [{"id": "perm-1", "created": 1733000000}],
                                               "revision": "abc123"}]
    assert served_model(listing, NAME) == {"listed": True, "id": NAME, "owned_by": "vllm",
                                           "root": "/models/llama-8b", "revision": "abc123"}
    assert served_model(listing, "missing") == {"listed": False, "n_listed": 2}
    assert served_model(None, NAME) == {"listed": None}


def test_a_rerun_round_recomputes_its_gates_when_the_judge_behind_the_name_changed(tmp_path):
    """The flow's cache key of the gate stage measures the endpoint judge (without recording it as seen): the same
    judge keeps the key (the cached gates are reused), other weights under the same URL and name change it."""
    import json

    from flows.stages import stage_cache_key

    recipe = tmp_path / "gates.yaml"
    recipe.write_text("n_winrate: 2\n")
    with start_policy_server(tmp_path, name=NAME, policy="longer") as s:
        port = int(s["base_url"].rsplit(":", 1)[1].split("/")[0])
        args = ["--judge", json.dumps({"backend": "openai", "model": NAME, "base_url": s["base_url"],
                                       "cache_dir": str(tmp_path / "cache")})]
        key = stage_cache_key("gates", recipe, args, [])
        assert stage_cache_key("gates", recipe, args, []) == key and requests_logged(s) == 2 * PROBE
        j, _, _, _ = _gate_run(s, tmp_path / "cache")
    assert j.identity_report()["identity_check"]["status"] == "new"  # the flow's look recorded nothing
    with start_policy_server(tmp_path, name=NAME, policy="shorter", port=port):
        assert stage_cache_key("gates", recipe, args, []) != key
    # a judge identified by content (the round's reward model) adds nothing: the key is the other stages' form
    assert stage_cache_key("gates", recipe, [], []) == stage_cache_key("gates", recipe, [], [])


def _transformers_serve(model: str, cwd, log):
    """``transformers serve <model>`` started in ``cwd`` on a free loopback port (a relative ``model`` is a folder of
    ``cwd``: two servers in two folders serve different weights under one name); returns (process, base URL) at
    once (:func:`_wait_healthy` waits for it)."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "transformers.cli.transformers", "serve", model, "--host",
                                 "127.0.0.1", "--port", str(port), "--device", "cpu", "--log-level", "info"],
                                cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}/v1"


def _wait_healthy(proc, base_url: str, log, timeout_s: float = 300) -> None:
    wait_for_health(proc, base_url, log, timeout_s=timeout_s, what="transformers serve")


def _untied_tiny_model(path) -> str:
    """A second tiny model: the tiny Llama with its own (untied, seed 1) output layer. Two tiny models that differ
    only in their seed are no use here: with embeddings tied, both answer every prompt with eight newlines (their
    last hidden state points back at the prompt's last token), so by their answers they are the same judge."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    from rlhf.models import tiny_config, tokenizer_dir

    tok = AutoTokenizer.from_pretrained(tokenizer_dir())
    torch.manual_seed(1)
    LlamaForCausalLM(tiny_config(tok, tie_word_embeddings=False)).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.mark.e2e
def test_two_transformers_serve_endpoints_with_different_tiny_models_under_one_name(tmp_path):
    """Real models: ``transformers serve judge`` in two folders whose ``judge`` is a different tiny model. Both
    report the same served id; the probe answers differ, so the second is a new judge: its judgments and its
    agreement are asked afresh, nothing of the first is reused."""
    import os

    from judging.factory import make_judge
    from judging.judges import JudgeConfig
    from judging.qualify import qualify_judge
    from rlhf.models import build_tiny_model

    cache = tmp_path / "cache"
    models = [str(build_tiny_model(seed=0)), _untied_tiny_model(tmp_path / "untied")]
    procs, servers = [], []
    try:
        for i, model in enumerate(models):
            home = tmp_path / f"server{i}"
            home.mkdir()
            os.symlink(model, home / NAME)
            log = home / "serve.log"
            proc, url = _transformers_serve(NAME, home, log)
            procs.append(proc)
            servers.append({"base_url": url, "log": log, "proc": proc})
        for s in servers:
            _wait_healthy(s["proc"], s["base_url"], s["log"])
        runs = []
        for s in servers:
            cfg = JudgeConfig.from_dict({"backend": "openai", "model": NAME, "base_url": s["base_url"],
                                         "agreement_n": 2, "max_concurrency": 2, "cache_dir": str(cache)})
            posts = s["log"].read_text().count('"POST /v1/chat/completions')
            judge = make_judge(cfg)
            judged = judge.judge(*WINRATE)
            q = qualify_judge(judge, cfg)
            runs.append((judge, judged, q, s["log"].read_text().count('"POST /v1/chat/completions') - posts))
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=30)
    (j0, judged0, q0, sent0), (j1, judged1, q1, sent1) = runs
    assert j0.identity()["served"] == j1.identity()["served"] and j0.identity()["served"]["id"] == NAME
    assert j0.identity()["probe"]["answers_sha256"] != j1.identity()["probe"]["answers_sha256"]
    assert j0.identity_hash() != j1.identity_hash()
    assert sent0 == sent1 == PROBE + 2 * len(WINRATE[0]) + 2 * 2  # the second judge was asked everything afresh
    assert j1.requests_sent == 2 * len(WINRATE[0]) + 2 * 2 and not q1.cached and q1.requests_sent == 4
    assert [j.raw for j in judged0] != [j.raw for j in judged1]  # other weights, other answers
