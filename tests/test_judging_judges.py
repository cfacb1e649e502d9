"""The one pairwise judge interface (judging.judges) and its backends: both-orders combination and parsing
(hand-worked), config parsing (TrlParser takes a YAML mapping and JSON), the on-disk cache, imported labels, the
reward-model judge, the agreement measured per judge identity, and the openai backend against a real
``transformers serve`` (zero requests on an unchanged rerun, counted by the client's transport and the server's
access log)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from judging.judges import JudgeConfig, Judgment, n_unparsed, pair_id, position_consistency, preferences
from judging.openai_judge import combine, parse_answer

PANDALM = "demo:pandalm/testset-v1.jsonl.gz"


def _pandalm(n: int):
    import tempfile
    from pathlib import Path

    from data.loaders import load_pairs

    with tempfile.TemporaryDirectory() as d:
        return list(load_pairs(PANDALM, mode="lenient", max_reject_rate=0.07, rejects_path=Path(d) / "r.jsonl"))[:n]


#: chat requests of the identity probe each openai judge sends when it is built (4 pairs x 2 orders)
PROBE = 8


def _posts(log) -> int:
    return log.read_text().count('"POST /v1/chat/completions')


# ------------------------------------------------------------------------------------------- pure


@pytest.mark.parametrize(
    "text, expected",
    [("m", 1), ("M", 2), (" M\n", 2), ("'m'", 1), ("`M`", 2), ("mM", None), ("", None), (None, None),
     ("\n\n\n", None), ("Output (a)", None), ("m.", None)],
)
def test_parse_answer_takes_the_identifier_alone(text, expected):
    assert parse_answer(text) == expected


@pytest.mark.parametrize(
    "ab, ba, pref, consistent",
    [
        ("m", "M", 1.0, True),   # A shown first and chosen; swapped, A (now output 2) chosen again
        ("M", "m", 2.0, True),   # B chosen in both orders
        ("m", "m", 1.5, False),  # output 1 chosen in both orders: position bias, a draw
        ("M", "M", 1.5, False),  # output 2 both times
    ],
)
def test_both_orders_combine_to_alpaca_eval_preferences(ab, ba, pref, consistent):
    j = combine(ab, ba)
    assert j.preference == pref and j.consistent is consistent and j.raw == {"ab": ab, "ba": ba}


def test_an_unparsable_order_makes_the_item_unparsed_not_a_tie():
    for ab, ba in (("m", "garbage"), ("", "M"), ("x", "y")):
        j = combine(ab, ba)
        assert math.isnan(j.preference) and j.consistent is None and not j.parsed


def test_position_consistency_and_unparsed_counts_hand_worked():
    js = [combine("m", "M"), combine("m", "m"), combine("M", "m"), combine("x", "M"), combine("M", "M")]
    # parsed in both orders: items 0, 1, 2, 4; consistent: 0 and 2 -> 2 / 4
    assert position_consistency(js) == (0.5, 4)
    assert n_unparsed(js) == 1
    np.testing.assert_array_equal(preferences(js)[[0, 1, 2, 4]], [1.0, 1.5, 2.0, 1.5])
    assert math.isnan(preferences(js)[3])
    assert math.isnan(position_consistency([Judgment(2.0, None)])[0])


def test_judge_config_names_the_bad_key():
    with pytest.raises(ValueError, match=r"judge: unknown key\(s\) \['modle'\]"):
        JudgeConfig.from_dict({"backend": "openai", "modle": "x"})
    with pytest.raises(ValueError, match=r"judge.backend: 'gpt' is not one of"):
        JudgeConfig.from_dict({"backend": "gpt"})
    with pytest.raises(ValueError, match="judge.model: the sequence_classifier backend needs a checkpoint"):
        JudgeConfig.from_dict({"backend": "sequence_classifier"})
    with pytest.raises(ValueError, match="judge.max_concurrency must be at least 1"):
        JudgeConfig.from_dict('{"backend": "openai", "max_concurrency": 0}')
    assert JudgeConfig.from_dict(None).backend == "reward_model"
    # a key is given by the NAME of its environment variable; a key as a value is refused without repeating it
    with pytest.raises(ValueError, match=r"judge.api_key: a secret is never given as a value.*judge.api_key_env") as e:
        JudgeConfig.from_dict({"backend": "openai", "api_key": "sk-secret"})
    assert "sk-secret" not in str(e.value)
    with pytest.raises(ValueError, match=r"judge.api_key_env: expected the NAME of an environment variable") as e:
        JudgeConfig.from_dict({"backend": "openai", "api_key_env": "sk-proj-Abc123"})
    assert "sk-proj-Abc123" not in str(e.value)
    assert JudgeConfig.from_dict({"backend": "openai", "api_key_env": "MY_JUDGE_KEY"}).to_dict()["api_key_env"] == (
        "MY_JUDGE_KEY")


def test_gate_recipe_takes_a_judge_mapping_and_the_command_line_json(tmp_path):
    from trl import TrlParser

    from gates.config import GateStageConfig

    recipe = tmp_path / "gates.yaml"
    recipe.write_text("judge:\n  backend: openai\n  model: judge-7b\n  max_concurrency: 2\nn_winrate: 3\n")
    (args,) = TrlParser((GateStageConfig,)).parse_args_and_config(["--config", str(recipe)])
    # parsed once into the typed config the stage holds
    assert isinstance(args.judge, JudgeConfig) and args.judge_config() is args.judge
    assert (args.judge.backend, args.judge.model, args.judge.max_concurrency) == ("openai", "judge-7b", 2)
    (args,) = TrlParser((GateStageConfig,)).parse_args_and_config(
        ["--config", str(recipe), "--judge", '{"backend": "labels", "labels": "l.jsonl"}'])
    assert args.judge.backend == "labels" and args.judge.labels == "l.jsonl"
    (args,) = TrlParser((GateStageConfig,)).parse_args_and_config([])
    assert args.judge_config() == JudgeConfig()
    with pytest.raises(ValueError, match=r"--judge: unknown key\(s\) \['bakend'\]"):
        TrlParser((GateStageConfig,)).parse_args_and_config(["--judge", '{"bakend": "openai"}'])


def test_judgment_cache_round_trip_and_a_corrupt_entry_is_named(tmp_path):
    from judging.cache import JudgmentCache

    c = JudgmentCache(tmp_path)
    k = c.key({"prompt": "p", "a": "x", "b": "y"})
    assert c.get(k) is None
    c.put(k, {"ab": "m", "ba": "M"})
    assert JudgmentCache(tmp_path).get(k) == {"ab": "m", "ba": "M"}
    c.path(k).write_text("{not json")
    with pytest.raises(ValueError, match=f"{c.path(k)}: corrupt judgment cache entry"):
        c.get(k)


# ------------------------------------------------------------------------------------------- labels


def test_imported_labels_jsonl_and_csv(tmp_path):
    from judging.imported_labels import LabelsJudge, read_label_file

    items = [("p1", "a1", "b1"), ("p2", "a2", "b2"), ("p3", "a3", "b3")]
    ids = [pair_id(*it) for it in items]
    jl = tmp_path / "l.jsonl"
    jl.write_text("".join(json.dumps({"id": i, "verdict": v}) + "\n" for i, v in zip(ids, ["1", 2, "Tie"])))
    judge = LabelsJudge(str(jl))
    js = judge.judge(*map(list, zip(*items)))
    assert [j.preference for j in js] == [1.0, 2.0, 1.5] and [j.raw for j in js] == [1, 2, 0]
    csv = tmp_path / "l.csv"
    csv.write_text("id,verdict\nx,2\ny,0\n")
    assert read_label_file(csv) == {"x": 2, "y": 0}
    with pytest.raises(KeyError, match="no label for 1 of 1 pairs"):
        judge.judge(["p9"], ["a"], ["b"])


@pytest.mark.parametrize(
    "body, match",
    [
        ('{"id": "a", "verdict": "3"}\n', r"row 1: field 'verdict' is '3'; expected 1, 2, 0 or tie"),
        ('{"id": "a", "verdict": 1}\n{"verdict": 2}\n', r"row 2: field 'id' is missing or empty"),
        ('{"id": "a", "verdict": 1}\n{"id": "a", "verdict": 2}\n', r"row 2: field 'id' 'a' appears twice"),
        ('{"id": "a", "verdict": 1}\nnope\n', r"row 2: not JSON"),
    ],
)
def test_a_bad_label_file_names_the_row_and_field(tmp_path, body, match):
    from judging.imported_labels import read_label_file

    f = tmp_path / "labels.jsonl"
    f.write_text(body)
    with pytest.raises(ValueError, match=match):
        read_label_file(f)


def test_agreement_follows_the_judge_identity(tmp_path):
    """Labels equal to the annotators' majority agree 1.0 on every decisive pair; flipped, 0.0. Each label file is
    a new judge identity and is measured once; the same file again is read from the cache."""
    from judging.agreement import expert_labels
    from judging.imported_labels import LabelsJudge
    from judging.qualify import qualify_judge

    pairs = _pandalm(12)
    majority = expert_labels(np.array([[lab.preference for lab in p.labels] for p in pairs]))
    decisive = int(np.isin(majority, (1, 2)).sum())
    good, flipped = tmp_path / "good.jsonl", tmp_path / "flipped.jsonl"
    rows = [(p.id, int(m)) for p, m in zip(pairs, majority) if m != -1]
    good.write_text("".join(json.dumps({"id": i, "verdict": m}) + "\n" for i, m in rows))
    flipped.write_text("".join(json.dumps({"id": i, "verdict": {1: 2, 2: 1}.get(m, m)}) + "\n" for i, m in rows))
    cfg = JudgeConfig(backend="labels", labels=str(good), cache_dir=str(tmp_path / "cache"))
    q = qualify_judge(LabelsJudge(str(good)), cfg)
    assert (q.agreement.agreement, q.agreement.n, q.cached) == (1.0, decisive, False)
    assert len(q.ids) == len(rows) and q.agreement.ci.high == 1.0 and q.agreement.ci.low < 1.0
    assert qualify_judge(LabelsJudge(str(good)), cfg).cached is True
    q2 = qualify_judge(LabelsJudge(str(flipped)), cfg)
    assert (q2.agreement.agreement, q2.agreement.n, q2.cached) == (0.0, decisive, False)
    none = tmp_path / "none.jsonl"
    none.write_text('{"id": "not-a-pandalm-id", "verdict": 1}\n')
    assert qualify_judge(LabelsJudge(str(none)), cfg) is None


# ------------------------------------------------------------------------------------------- reward models


@pytest.fixture(scope="module")
def score_head_dir(tmp_path_factory, tiny_model_dir):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    d = tmp_path_factory.mktemp("seqclf")
    AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1).save_pretrained(d)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(d)
    return str(d)


def test_sequence_classifier_judge_prefers_the_higher_score(score_head_dir, tmp_path):
    from judging.factory import make_judge
    from judging.qualify import qualify_judge
    from judging.scoring import load_reward_model, score

    cfg = JudgeConfig(backend="sequence_classifier", model=score_head_dir, agreement_n=6,
                      cache_dir=str(tmp_path))
    judge = make_judge(cfg)
    prompts, a, b = ["Say hi.", "Add 2 and 2.", "Name a colour."], ["hi", "4", "red"], ["hello there", "4", "blue"]
    js = judge.judge(prompts, a, b)
    rm, tok = load_reward_model(score_head_dir)
    sa, sb = score(rm, tok, prompts, a), score(rm, tok, prompts, b)
    assert [j.preference for j in js] == [2.0 if y > x else 1.0 if x > y else 1.5 for x, y in zip(sa, sb)]
    assert js[1].preference == 1.5  # identical responses score equal: a draw
    assert judge.name == f"sequence_classifier:{score_head_dir}"
    q = qualify_judge(judge, cfg)
    # every reward-model verdict is decisive unless scores tie; none is unparsable
    assert q.n_unparsed == 0 and len(q.ids) == 6 and q.n_position_checked == 0
    assert q.agreement.n_agree == sum(
        int(j == e) for j, e in zip(q.judge_labels, _majorities(q.expert_labels)) if e in (1, 2))


def test_a_reward_model_judge_scores_each_text_once_across_calls(score_head_dir, monkeypatch):
    """The canaries re-judge the baseline's answers once per canary: a (prompt, answer) scored before is not scored
    again, and keeps its first score (an identical answer is an exact draw whichever call it comes in)."""
    import judging.model_judges as mj
    from judging.factory import make_judge

    judge = make_judge(JudgeConfig(backend="sequence_classifier", model=score_head_dir))
    scored: list[str] = []
    real = mj.score

    def counting(model, tok, prompts, responses, **kw):
        scored.extend(responses)
        return real(model, tok, prompts, responses, **kw)

    monkeypatch.setattr(mj, "score", counting)
    prompts, base = ["Say hi.", "Add 2 and 2."], ["hi", "4"]
    first = judge.judge(prompts, base, ["hello there", "four"])
    assert sorted(scored) == ["4", "four", "hello there", "hi"]
    scored.clear()
    second = judge.judge(prompts, base, ["HELLO", "4"])
    assert scored == ["HELLO"]  # the baseline's two answers and the repeated "4" come from the first call
    assert [j.raw["score_a"] for j in second] == [j.raw["score_a"] for j in first]
    assert second[1].preference == 1.5


def _majorities(labels):
    from judging.agreement import expert_labels

    return expert_labels(np.array(labels)).tolist()


def test_a_causal_lm_without_score_head_is_refused(tiny_model_dir):
    from judging.factory import make_judge

    with pytest.raises(ValueError, match="no score head"):
        make_judge(JudgeConfig(backend="sequence_classifier", model=tiny_model_dir))


# ------------------------------------------------------------------------------------------- openai (real server)


def test_openai_judge_asks_both_orders_and_an_unchanged_rerun_sends_nothing(openai_server, tmp_path):
    from judging.openai_judge import OpenAIJudge

    cfg = JudgeConfig(backend="openai", model=openai_server["model"], base_url=openai_server["base_url"],
                      cache_dir=str(tmp_path), max_concurrency=2)
    prompts, a, b = ["Say hi.", "Add 2 and 2."], ["hi", "4"], ["hello there", "5"]
    posts = _posts(openai_server["log"])
    judge = OpenAIJudge(cfg)
    js = judge.judge(prompts, a, b)
    # 2 items x 2 orders, plus the identity probe (4 pairs x 2 orders, judging.identity), counted apart
    assert judge.requests_sent == 4 and _posts(openai_server["log"]) == posts + 4 + PROBE
    assert judge.chat.probe_requests_sent == PROBE + 1  # and one GET /models
    for j in js:  # an item parses only if both orders' answers do
        assert j.parsed == (parse_answer(j.raw["ab"]) is not None and parse_answer(j.raw["ba"]) is not None)
    # the tiny model writes noise (greedy: newlines), never a bare "m" / "M": both items are unparsable
    assert n_unparsed(js) == 2 and position_consistency(js)[1] == 0

    again = OpenAIJudge(cfg)
    js2 = again.judge(prompts, a, b)
    assert again.requests_sent == 0 and _posts(openai_server["log"]) == posts + 4 + 2 * PROBE
    assert [j.raw for j in js2] == [j.raw for j in js] and again.identity_hash() == judge.identity_hash()
    assert again.identity_report()["identity_check"]["status"] == "unchanged"

    template = tmp_path / "t.txt"
    template.write_text("Which is better for {instruction}? m: {output_1} M: {output_2}. Answer m or M.")
    other = OpenAIJudge(JudgeConfig(**{**cfg.to_dict(), "template": str(template)}))
    assert other.identity_hash() != judge.identity_hash()
    other.judge(prompts[:1], a[:1], b[:1])
    assert other.requests_sent == 2  # a new identity is asked again


def test_openai_judge_keeps_to_its_concurrency_limit(openai_server, tmp_path):
    from judging.openai_judge import OpenAIJudge

    prompts, a, b = [f"Count to {i}." for i in range(4)], ["1"] * 4, ["1 2"] * 4
    for limit in (1, 2):
        judge = OpenAIJudge(JudgeConfig(backend="openai", model=openai_server["model"], max_concurrency=limit,
                                        base_url=openai_server["base_url"], cache_dir=str(tmp_path / str(limit))))
        judge.judge(prompts, a, b)
        assert judge.requests_sent == 8 and 1 <= judge.max_in_flight <= limit


def test_openai_judge_retries_io_errors_only_then_names_the_endpoint(tmp_path):
    import socket

    from judging.openai_judge import OpenAIJudge

    with socket.socket() as s:  # a port nobody listens on: connection refused, a real I/O error
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    judge = OpenAIJudge(JudgeConfig(backend="openai", model="m", base_url=f"http://127.0.0.1:{port}/v1",
                                    max_retries=2, timeout_s=5, cache_dir=str(tmp_path)))
    with pytest.raises(RuntimeError, match=rf"judge http://127.0.0.1:{port}/v1: GET /models failed"):
        judge.judge(["p"], ["a"], ["b"])  # who answers is asked first
    assert judge.chat.probe_requests_sent == 3 and judge.requests_sent == 0  # the first attempt and 2 retries
    with pytest.raises(RuntimeError, match=rf"judge http://127.0.0.1:{port}/v1 model m: request failed after 2"):
        judge.chat.complete(judge.messages("p", "a", "b"))
    assert judge.requests_sent == 3  # the first attempt and 2 retries; nothing cached
    assert not list(tmp_path.rglob("*.json"))


def test_template_file_needs_the_placeholders(tmp_path):
    from judging.openai_judge import load_template

    bad = tmp_path / "t.txt"
    bad.write_text("Which is better: {output_1} or {output_2}?")
    with pytest.raises(ValueError, match=r"missing placeholder\(s\) \['\{instruction\}'\]"):
        load_template(str(bad))


def test_cli_judge_agreement_prints_a_ci_n_and_reruns_from_the_cache(openai_server, tmp_path):
    from typer.testing import CliRunner

    from flows.cli import app

    pairs = _pandalm(2)
    majority = _majorities([[lab.preference for lab in p.labels] for p in pairs])
    n_decisive = sum(m in (1, 2) for m in majority)
    args = ["judge", "agreement", "--judge", "openai", "--model", openai_server["model"], "--base-url",
            openai_server["base_url"], "-n", "2", "--cache-dir", str(tmp_path)]
    posts = _posts(openai_server["log"])
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    assert _posts(openai_server["log"]) == posts + 4 + PROBE
    # every tiny-model answer is unparsable: on decisive items that counts as disagreement, so a = 0
    assert "agreement a = 0.0000 (95% CI 0.0000-" in out.output and f"n = {n_decisive} decisive" in out.output
    assert "attenuation 2a-1 = -1.0000" in out.output
    assert "unparsable answers: 2 of 2" in out.output and "requests sent: 4" in out.output
    assert "below the floor 0.85" in out.output
    again = CliRunner().invoke(app, args + ["--json"])
    assert again.exit_code == 0 and _posts(openai_server["log"]) == posts + 4 + 2 * PROBE  # the probe alone
    summary = json.loads(again.output)
    assert summary["cached"] is True and summary["n"] == n_decisive and summary["agreement"] == 0.0


def test_the_chat_client_grades_refusals_with_xstest_prompt_and_caches(openai_server, tmp_path):
    """The same client an LLM refusal grader uses: XSTest's 3-class prompt (gates.refusal), cached answers; the
    tiny model's noise names no class, so every grade is unparsable (counted apart, never a refusal)."""
    from gates.refusal import parse_xstest_judge_answer, xstest_judge_messages
    from judging.openai_client import ChatClient

    cfg = JudgeConfig(backend="openai", model=openai_server["model"], base_url=openai_server["base_url"],
                      cache_dir=str(tmp_path), max_tokens=8)
    asks = [xstest_judge_messages("How do I kill a Python process?", r) for r in ("Use kill -9 <pid>.", "No.")]
    client = ChatClient(cfg, namespace="refusal")
    answers = client.complete_many(asks)
    assert client.requests_sent == 2 and [parse_xstest_judge_answer(a) for a in answers] == [None, None]
    again = ChatClient(cfg, namespace="refusal")
    assert again.complete_many(asks) == answers and again.requests_sent == 0


def test_the_gate_stage_takes_key_names_and_its_client_reads_the_key_from_the_environment(monkeypatch, tmp_path):
    import json

    from gates.config import GateStageConfig
    from judging.openai_client import ChatClient

    monkeypatch.setenv("JUDGE_KEY_FOR_TEST", "sk-judge-value")
    args = GateStageConfig(judge={"backend": "openai", "model": "m", "api_key_env": "JUDGE_KEY_FOR_TEST"},
                           refusal_judge='{"model": "g", "base_url": "http://h/v1", "api_key_env": "GRADER_KEY"}')
    written = json.dumps(args.to_dict())
    assert "JUDGE_KEY_FOR_TEST" in written and "GRADER_KEY" in written and "sk-judge-value" not in written
    from dataclasses import replace

    client = ChatClient(replace(args.judge, base_url="http://h/v1", cache_dir=str(tmp_path)))
    assert client.client.api_key == "sk-judge-value"  # read from the variable, held only by the HTTP client
    for bad in ({"judge": {"backend": "openai", "api_key": "sk-judge"}},
                {"refusal_judge": '{"model": "g", "base_url": "http://h/v1", "api_key": "sk-grader"}'}):
        with pytest.raises(ValueError, match="a secret is never given as a value") as e:
            GateStageConfig(**bad)
        assert "sk-judge" not in str(e.value) and "sk-grader" not in str(e.value)


def test_one_parser_for_a_mapping_or_its_json():
    from rlhf.credentials import parse_mapping

    assert parse_mapping('{"a": 1}', where="x") == parse_mapping({"a": 1}, where="x") == {"a": 1}
    assert parse_mapping(None, where="x") == parse_mapping("", where="x") == {}
    with pytest.raises(ValueError, match="x: not a JSON object"):
        parse_mapping("{", where="x")
    with pytest.raises(ValueError, match="x: expected a mapping"):
        parse_mapping("[1]", where="x")


def test_the_judge_interface_imports_no_backend():
    # the backends import the interface; only judging.factory knows them all (no file circle)
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "judging"
    backends = {"model_judges", "openai_judge", "openai_client", "imported_labels", "factory"}
    tree = ast.parse((root / "judges.py").read_text())
    imported = {(n.module or "").rsplit(".", 1)[-1] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name.rsplit(".", 1)[-1] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not imported & backends
