"""End to end: a gate run (gates.evaluate.main) judged by the ``openai`` backend against a real local
``transformers serve`` (the tiny model), n=2 per suite; the judge is named in the report, the gate table and the
manifest with its identity (what the server lists, how it answered the probe); its agreement with PandaLM's
annotators is measured through the same endpoint; an unchanged rerun sends zero judging requests, only the identity
probe (counted in the server's access log and by the judge's transport)."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytestmark = pytest.mark.e2e


def _posts(log) -> int:
    return log.read_text().count('"POST /v1/chat/completions')


def test_gate_run_with_an_openai_judge_end_to_end(openai_server, tiny_model_dir, tmp_path):
    from data.loaders import load_pairs
    from gates.evaluate import main
    from judging.agreement import expert_labels

    judge = {"backend": "openai", "model": openai_server["model"], "base_url": openai_server["base_url"],
             "agreement_n": 2, "max_concurrency": 2, "cache_dir": str(tmp_path / "cache")}
    small = ["--n_winrate", "2", "--n_safe", "2", "--n_redteam", "2", "--n_capability", "2", "--n_sycophancy", "2",
             "--max_new_tokens", "4", "--mc_max_new_tokens", "4", "--report_to", "none", "--round_id", "e2e",
             "--allow_same_model", "true"]  # baseline and candidate are the tiny model on purpose (refused unless allowed)

    def run(out):
        return main(["--output_dir", str(out), "--baseline_dir", tiny_model_dir, "--candidate_dir", tiny_model_dir,
                     "--judge", json.dumps(judge), *small])

    posts = _posts(openai_server["log"])
    rc = run(tmp_path / "g1")
    sent = _posts(openai_server["log"]) - posts
    # 2 win-rate and 2 agreement pairs in both orders; the identity probe (4 x 2); then the canaries (null, padded,
    # flattering: 2 pairs each, both orders), asked of the same judge: no second identity probe
    assert sent == 2 * 2 + 2 * 2 + 8 + 3 * 2 * 2

    manifest = json.loads((tmp_path / "g1" / "manifest.json").read_text())
    canaries = manifest["metrics"]["canaries"]["metrics"]
    assert canaries["canary_judge_calls"]["value"] == 3 * 2 * 2  # the candidate's judge: probed once, before
    assert canaries["canary_pairs_judged"]["value"] == 6
    gates, row = manifest["metrics"], manifest["outputs"]["judge"]
    assert row["backend"] == "openai" and row["judge"] == f"openai:{openai_server['model']}"
    assert row["requests_sent"] == 8 and row["n_judged"] == 2 and row["probe_requests_sent"] == 9  # + GET /models
    # who answered, as the server reports it and as it answered the probe; no secret in it
    ident = row["identity"]
    assert ident["endpoint"] == openai_server["base_url"] and ident["model"] == openai_server["model"]
    assert ident["served"]["listed"] is True and ident["served"]["id"] == openai_server["model"]
    assert ident["probe"]["n"] == 8 and len(ident["probe"]["answers_sha256"]) == 64
    assert row["identity_status"] == "new" and "EMPTY" not in json.dumps(manifest)
    # the tiny model answers with noise: every judge answer is unparsable, counted apart (not as ties)
    assert row["n_unparsed"] == 2 and row["position_consistency"] is None
    assert gates["judge_agreement"]["metrics"]["unparsed_judgments"]["value"] == 2
    # its agreement with the annotators of the first 2 PandaLM pairs: unparsed on decisive items = disagreement
    pairs = list(load_pairs("demo:pandalm/testset-v1.jsonl.gz", mode="lenient", max_reject_rate=0.07,
                            rejects_path=tmp_path / "r.jsonl"))[:2]
    majority = expert_labels(np.array([[lab.preference for lab in p.labels] for p in pairs]))
    n_decisive = int(np.isin(majority, (1, 2)).sum())
    assert gates["judge_agreement"]["metrics"]["agreement"]["n"] == n_decisive == row["agreement_n"]
    assert row["agreement"] == 0.0 and row["attenuation"] == -1.0
    assert gates["judge_agreement"]["verdict"] == "block"
    for name in ("length_controlled_win_rate", "intent_matrix"):
        assert gates[name]["verdict"] == "inconclusive"
        assert "none of the 2 judge answers" in gates[name]["reason"]
    assert manifest["outputs"]["verdict"] == "block" and rc == 3
    table = {r["gate"]: r for r in manifest["outputs"]["gate_table"]}
    assert table["judge_agreement"]["judge"] == row["judge"] and table["judge_agreement"]["judge_attenuation"] == -1.0
    assert table["length_controlled_win_rate"]["judge_backend"] == "openai"
    report = (tmp_path / "g1" / "report.md").read_text()
    assert f"- judge: `openai:{openai_server['model']}` (backend openai" in report
    assert "unparsable judge answers: 2 of 2" in report and "attenuation 2a-1 = -1.000" in report
    judged = [json.loads(x) for x in (tmp_path / "g1" / "judgments.jsonl").read_text().splitlines()]
    assert len(judged) == 2 and all(j["preference"] is None for j in judged)

    # unchanged judge, same answers: everything comes from the cache
    posts = _posts(openai_server["log"])
    run(tmp_path / "g2")
    again = json.loads((tmp_path / "g2" / "manifest.json").read_text())["outputs"]["judge"]
    assert _posts(openai_server["log"]) == posts + 8 and again["requests_sent"] == 0  # the one probe alone
    again_canaries = json.loads((tmp_path / "g2" / "manifest.json").read_text())["metrics"]["canaries"]["metrics"]
    assert again_canaries["canary_judge_calls"]["value"] == 0  # the canaries' pairs are cached too
    assert again["identity_status"] == "unchanged" and again["identity"] == ident
    assert again["agreement"] == row["agreement"] and again["identity_hash"] == row["identity_hash"]
