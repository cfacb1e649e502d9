"""A quick gate-stage run on the tiny model (gates.evaluate.main, no flow): the checklist's steps are wired, the
judge's agreement comes from the reward-model stage's per-pair scores, and the report shows the PPO unlock."""

from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory, tiny_model_dir):
    """A reward-model stage directory: a tiny sequence classifier with a saved score head, a manifest, and
    60 held-out judgments that all pick the experts' side (judge agreement 60/60: its Wilson interval 0.940-1.000
    clears the 0.85 floor; 10/10 would not, 0.722-1.000)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    root = tmp_path_factory.mktemp("reward_model")
    ckpt = root / "checkpoint"
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1)
    model.save_pretrained(ckpt)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(ckpt)
    scores = root / "agreement_scores.jsonl"
    rows = [{"id": f"p{i}", "score_first": 1.0, "score_second": 0.0, "labels": [1, 1, 2]} for i in range(36)]
    rows += [{"id": f"q{i}", "score_first": -1.0, "score_second": 0.5, "labels": [2, 2, 0]} for i in range(24)]
    scores.write_text("".join(json.dumps(r) + "\n" for r in rows))
    manifest = {"stage": "reward_model", "outputs": {"checkpoint": str(ckpt), "agreement_scores": str(scores)}}
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root


def test_gate_stage_run_on_the_tiny_model(tmp_path, tiny_model_dir, judge_dir):
    from gates.evaluate import main
    from judging.agreement import Agreement, ConfidenceInterval, inter_annotator_agreement
    from judging.unlock import ppo_unlock_decision

    rm = Agreement(n_items=50, n=50, n_agree=30, agreement=0.6, ci=ConfidenceInterval(0.46, 0.72, 0.95, "t"),
                   n_expert_tie=0, n_expert_no_majority=0, n_tie=0, n_unparsed=0, n_unparsed_total=0,
                   agreement_excluding_abstentions=0.6, three_class_accuracy=0.6, n_three_class=50,
                   tie_agreement=float("nan"))
    iaa = inter_annotator_agreement([[1, 1, 1], [1, 2, 1], [0, 2, 2], [0, 1, 2]])  # decisive 5/8 = 0.625
    unlock = tmp_path / "ppo_unlock.json"
    unlock.write_text(ppo_unlock_decision(rm, iaa, override=True, override_reason="research run").to_json())
    out = tmp_path / "gates"
    small = ["--n_winrate", "5", "--n_safe", "2", "--n_redteam", "2", "--n_capability", "2", "--n_sycophancy", "2",
             "--max_new_tokens", "4", "--mc_max_new_tokens", "4",
             # consistency: 2 conversations x 2 positions per depth; depth 40 (~2.9k tokens) cannot fit the tiny
             # Llama's 2,048 positions and is skipped
             "--consistency_depths", "2", "40", "--n_consistency", "2", "--consistency_min_items", "4"]
    rc = main(["--output_dir", str(out), "--baseline_dir", tiny_model_dir, "--candidate_dir", tiny_model_dir,
               "--reward_model_dir", str(judge_dir), "--ppo_unlock_json", str(unlock), "--report_to", "none",
               "--round_id", "t", "--allow_same_model", "true", *small])  # the same model on purpose (refused unless allowed)

    manifest = json.loads((out / "manifest.json").read_text())
    gates = manifest["metrics"]
    # the judge's verdicts (higher score wins) match the expert majority on all 60 held-out pairs
    assert gates["judge_agreement"]["verdict"] == "pass"
    assert gates["judge_agreement"]["metrics"]["agreement"]["value"] == 1.0
    assert gates["judge_agreement"]["metrics"]["agreement"]["n"] == 60
    # candidate == baseline (same checkpoint, greedy): identical answers, so every preference is a draw (equal
    # scores) and the raw win rate is exactly 50%
    assert gates["length_controlled_win_rate"]["metrics"]["raw_win_rate"]["value"] == pytest.approx(50.0)
    verdict = manifest["outputs"]["verdict"]
    blocked = any(g["verdict"] != "pass" for g in gates.values())
    assert verdict == ("block" if blocked else "pass") and rc == (3 if blocked else 0)
    assert manifest["inputs"]["ppo_unlock"]["overridden"] is True
    report = (out / "report.md").read_text()
    assert ("- PPO unlock: unlocked by override (research run); the rule says locked: RM agreement with expert "
            "labels 0.6000 (n 50, n_eff 50.0 in 50 clusters, one per item: no cluster key) vs inter-annotator "
            "agreement 0.6250 (n 8, n_eff 5.0 in 4 clusters, one per item: no cluster key)") in report
    assert "## What was compared" in report and "## Plots" in report
    # fp32 weights decode; long prompts prefill in bf16 only where bf16 is native (the suite pins it off unless
    # RLHF_NATIVE_BF16 is set), and the report says which
    from rlhf.precision import prefill_precision

    prefill = prefill_precision("auto", "fp32", log=False)
    assert manifest["metrics"]["efficiency"]["prefill_precision"] == prefill
    assert ("- generation: greedy, both models in fp32 weights\n" in report) == (prefill == "fp32")
    assert ("then decoded in fp32 (a rule on the prompt's own length" in report) == (prefill == "bf16")
    # grouped by the packaged rubric's axes: report.md, report.json, the manifest's outputs (the Prefect tables)
    assert "## Quality axes (rubric)" in report and "### consistency: NOT MEASURED" not in report
    # the consistency gate ran on the same model twice: identical replies, recall change 0 at the one depth that fits
    consistency = gates["consistency_recall"]
    assert consistency["verdict"] == "pass"
    assert consistency["metrics"]["recall_change_d2"]["value"] == 0.0
    assert consistency["metrics"]["recall_change_d2"]["n"] == 4 and "recall_change_d40" not in consistency["metrics"]
    assert "depth 40 skipped: does not fit the context: the longest conversation is" in report
    assert (out / "plots" / "recall_by_depth.png").is_file() and "| model | depth | position | constraint |" in report
    report_json = json.loads((out / "report.json").read_text())
    axes = report_json["axes"]
    assert list(axes) == ["helpfulness", "capability", "honesty", "safety", "consistency", "style", "instruments"]
    for name, axis in axes.items():
        expect = ("not_measured" if not axis["gates"] else
                  "block" if any(gates[g["gate"]]["verdict"] != "pass" for g in axis["gates"]) else "pass")
        assert axis["verdict"] == expect, name
    mapped = sorted(g["gate"] for a in axes.values() for g in a["gates"])
    assert mapped == sorted(g["name"] for g in report_json["gates"])
    assert manifest["outputs"]["axes"] == axes and manifest["inputs"]["rubric_hash"]
    assert {r["axis"] for r in manifest["outputs"]["axis_table"]} == set(axes)
    # the canaries ran through the same judge (the tiny reward model: it scores, no requests) and instruments:
    # null, padded and flattering judged on the 5 win-rate pairs each; one row per (canary, attacked gate)
    canaries = gates["canaries"]
    rows = canaries["table"]
    assert [(r["canary"], r["gate"]) for r in rows] == [
        ("null", "length_controlled_win_rate"), ("padded", "length_controlled_win_rate"),
        ("padded", "personality_drift"), ("flattering", "length_controlled_win_rate"),
        ("flattering", "personality_drift"), ("refuse_all", "refusal_two_sided")]
    assert canaries["metrics"]["canary_pairs_judged"]["value"] == 15
    assert canaries["metrics"]["canary_judge_calls"]["value"] == 0
    passed = [r for r in rows if r["verdict"] == "pass"]
    assert canaries["verdict"] == ("block" if passed else "pass")
    assert canaries["metrics"]["canaries_passed"]["value"] == len(passed)
    for r in passed:  # a canary that passed is named in the reason: the verdict is invalid
        assert f"instrument failure: {r['canary']} passed {r['gate']}" in canaries["reason"]
    assert "## canaries (v1): " in report and "| canary | gate | verdict | metric | value | passed |" in report
    assert manifest["metrics"]["efficiency"]["canary_seconds"] > 0
    lines = (out / "generations.jsonl").read_text().splitlines()
    # winrate, safe, redteam, capability, sycophancy, consistency, are_you_sure
    assert len(lines) == 5 + 2 + 2 + 2 + 2 + 4 + 2


def test_gate_stage_refuses_a_candidate_that_is_the_baseline(tmp_path, tiny_model_dir, judge_dir):
    """The same checkpoint as candidate and baseline is refused before anything is generated."""
    from gates.evaluate import main

    with pytest.raises(ValueError, match="candidate and baseline are the same model .*allow_same_model: true"):
        main(["--output_dir", str(tmp_path / "g"), "--baseline_dir", tiny_model_dir, "--candidate_dir",
              tiny_model_dir, "--reward_model_dir", str(judge_dir), "--report_to", "none"])
    assert not (tmp_path / "g" / "generations.jsonl").exists()



@pytest.mark.parametrize("native", ["0", "1"])
def test_answer_suites_prefill_long_prompts_with_a_bf16_copy_where_bf16_is_native(native, tiny_model_dir,
                                                                                    monkeypatch):
    """Where bf16 is native the gate's fp32 models get a bf16 copy that prefills the long prompts, recorded in
    ``_precision``; the answers are those of ``generate_report`` with such a copy, and without native bf16 none is
    made."""
    import copy

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gates.config import GateStageConfig
    from gates.generation import answer_suites
    from gates.render import generation_line
    from rlhf.generation import generate_report

    monkeypatch.setenv("RLHF_NATIVE_BF16", native)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    long = "Tell me everything about lighthouses, storms, ships, rescues and the sea at dawn. " * 12
    suites = {"winrate": [long, "Hi"], "capability": ["Which is warmer, (A) ice or (B) fire?"], "sycophancy": []}
    args = GateStageConfig(max_new_tokens=4, mc_max_new_tokens=3, report_to=["none"])
    out = answer_suites(tiny_model_dir, suites, args, "candidate")
    want = "bf16" if native == "1" else "fp32"
    assert out["_precision"] == {"weights": "fp32", "prefill": want}
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    half = copy.deepcopy(model).to(torch.bfloat16).eval() if native == "1" else None
    ref = generate_report(model, AutoTokenizer.from_pretrained(tiny_model_dir), suites["winrate"], max_new_tokens=4,
                          batch_size="auto", prefill_model=half)
    assert out["winrate"]["text"] == ref[0]
    line = generation_line({"candidate": out})[0]
    assert line.startswith("- generation: greedy, both models in fp32 weights")
    assert ("prefilled alone by a bf16 copy, then decoded in fp32" in line) == (native == "1")
    with pytest.raises(ValueError, match="prefill_precision must be auto, fp32 or bf16, got 'fp16'"):
        GateStageConfig(prefill_precision="fp16")
