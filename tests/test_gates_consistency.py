"""The consistency gate: the suite builder (depths, positions, skipped depths), the constraint checkers on hand-worked
replies, and the rule (a dropped constraint at one depth blocks, equal recall passes, a small noisy drop is
inconclusive)."""

from __future__ import annotations

import pytest

from data.bundle import demo_path
from gates.consistency import (
    ConsistencyMeasure,
    build_suite,
    clustered_paired_diff,
    consistency_gate,
    context_budget,
    load_exchanges,
    measure_consistency,
    statement_turn,
)
from gates.constraints import CONSTRAINTS, check, constraints_by_name, n_words
from judging.intervals import newcombe_paired_diff


@pytest.fixture(scope="module")
def convs():
    return load_exchanges(demo_path("hh_heldout"), demo_path("mt_bench_reference"))


#: One reply per constraint that keeps it (written for these tests).
KEEPS = {
    "language_fr": "Bonjour, votre colis est arrivé chez moi et je vous l'apporterai ce soir.",
    "language_es": "Hola, el grifo de la cocina gotea y me gustaría que alguien lo arreglara esta semana.",
    "max_words_40": "Project two weeks late: the supplier sent the wrong parts; reordered; we finish by end of next month.",
    "all_caps_sign": "CLOSED MONDAY FOR STOCKTAKING. OPEN AGAIN TUESDAY AT 9.",
    "json_purchase": '```json\n{"item": "blue umbrella", "price": 12}\n```',
    "bullets_packing": "Here is your list:\n- tent\n- sleeping bag\n- stove",
    "name_signature": "Dear landlord,\n\nWhen will the heating be repaired?\n\nBest regards,\nOluwaseun",
    "forbidden_peanuts": "1. Apple slices\n2. Cheese crackers\n3. Dried apricots",
}
#: ... and one that breaks it.
BREAKS = {
    "language_fr": "Hello, your package arrived at my place and I will bring it over tonight.",
    "language_es": "Hi, the kitchen tap is leaking; could someone fix it this week?",
    "max_words_40": " ".join(["word"] * 41),
    "all_caps_sign": "CLOSED MONDAY for stocktaking.",
    "json_purchase": "Sure! Here it is: item = umbrella, price = 12",
    "bullets_packing": "Bring a tent, a sleeping bag and a stove.",
    "name_signature": "Dear landlord, when will the heating be repaired? Best regards",
    "forbidden_peanuts": "Trail mix with Peanuts, raisins and chocolate.",
}


def test_every_constraint_has_a_keeping_and_a_breaking_case():
    assert set(KEEPS) == set(BREAKS) == {c.name for c in CONSTRAINTS}
    for c in CONSTRAINTS:
        assert c.check(KEEPS[c.name]), c.name
        assert not c.check(BREAKS[c.name]), c.name


def test_checkers_on_hand_worked_edges():
    # words: tokens with a letter or digit; the "-" of a bullet is none
    assert n_words("- one two\n- three") == 3 and n_words("") == 0
    assert check("max_words", "a " * 40, max_words=40) and not check("max_words", "", max_words=40)
    # all caps needs 8 cased letters and no lower case; digits and punctuation do not count
    assert check("all_caps", "OPEN 9-5 DAILY!") and not check("all_caps", "OK!") and not check("all_caps", "OPEN daily")
    # JSON: an object with the keys, one fence allowed; an array or missing key is not
    assert check("json", '{"item": "x", "price": 1}', keys=["item", "price"])
    assert not check("json", '{"item": "x"}', keys=["item", "price"]) and not check("json", "[1, 2]")
    # bullets: >= 2 bullet lines; one lead-in ending in ":" allowed, trailing prose not
    assert check("bullet_list", "1. tent\n2) stove") and not check("bullet_list", "- tent")
    assert not check("bullet_list", "- tent\n- stove\nHave fun!")
    assert not check("bullet_list", "Pack these\n- tent\n- stove")
    # names are whole words, case as written; forbidden words are whole words, any case
    assert check("use_name", "Thanks, Oluwaseun!", name="Oluwaseun")
    assert not check("use_name", "Thanks, Oluwaseunx", name="Oluwaseun")
    assert not check("forbidden", "PEANUT butter", words=["peanut"]) and check("forbidden", "peanutty", words=["peanut"])
    with pytest.raises(ValueError, match="unknown constraint kind 'rhyme'"):
        check("rhyme", "x")


def test_suite_depths_positions_and_reproducibility(convs):
    s = build_suite(convs, depths=(10, 5), positions=(0.0, 0.5), n_per_depth=8, seed=3)
    assert s.depths == (5, 10) and s.skipped == {} and len(s.items) == 2 * 8 * 2
    assert statement_turn(5, 0.5) == 2 and statement_turn(10, 0.5) == 4 and statement_turn(10, 0.0) == 0
    names = {c.name: c for c in CONSTRAINTS}
    for it in s.items:
        c = names[it.constraint]
        msgs = it.messages
        assert len(msgs) == 2 * it.depth + 1 and msgs[-1] == {"role": "user", "content": c.probe}
        assert [m["role"] for m in msgs] == ["user", "assistant"] * it.depth + ["user"]
        assert msgs[2 * it.statement_turn]["content"] == c.statement  # the statement is exchange statement_turn
        assert sum(m["content"] == c.statement for m in msgs) == 1
        assert all(not any(w.lower() in m["content"].lower() for w in c.avoid) for m in msgs[:-1]
                   if m["content"] != c.statement)
    # item j states constraint j mod 8; the two positions of one item share their filler
    d5 = [it for it in s.items if it.depth == 5]
    first, middle = d5[0], d5[1]
    assert first.position == 0.0 and middle.position == 0.5 and first.constraint == middle.constraint == "language_fr"
    filler = lambda it: [m for m in it.messages[:-1] if m["content"] not in (names[it.constraint].statement,
                                                                            names[it.constraint].acknowledgement)]
    assert filler(first) == filler(middle)
    # seeded: the same inputs give the same suite; another seed other filler; adding a depth keeps depth 5's items
    again = build_suite(convs, depths=(5, 10), positions=(0.0, 0.5), n_per_depth=8, seed=3)
    assert [it.messages for it in again.items] == [it.messages for it in s.items]
    other = build_suite(convs, depths=(5,), positions=(0.0,), n_per_depth=8, seed=4)
    assert [it.messages for it in other.items] != [it.messages for it in s.items if it.depth == 5 and it.position == 0]
    more = build_suite(convs, depths=(5, 10, 20), positions=(0.0, 0.5), n_per_depth=8, seed=3)
    assert [it.messages for it in more.items if it.depth == 5] == [it.messages for it in d5]


def test_depths_that_do_not_fit_the_context_are_skipped_and_named(convs, tokenizer):
    from rlhf.generation import chat_prompt

    count = lambda msgs: len(tokenizer(chat_prompt(tokenizer, msgs), add_special_tokens=False)["input_ids"])
    s = build_suite(convs, depths=(2, 5, 40), positions=(0.0, 0.5), n_per_depth=4, count_tokens=count,
                    context_length=1000)
    assert s.depths == (2, 5) and list(s.skipped) == [40]
    assert s.skipped[40].startswith("does not fit the context: the longest conversation is ")
    assert s.skipped[40].endswith("tokens, the budget 1000")
    assert all(it.n_tokens <= 1000 for it in s.items)
    # too few conversations for a depth: skipped with its own reason
    few = build_suite(convs[:1], depths=(2, 40), positions=(0.0,), n_per_depth=1)
    assert few.depths == (2,) and few.skipped[40].startswith("fewer than 39 usable filler exchanges")


def test_context_budget_is_the_models_context_minus_the_reply(tiny_model_dir):
    assert context_budget([tiny_model_dir, tiny_model_dir], 96) == 2048 - 96  # the tiny Llama's 2,048 positions
    assert context_budget([tiny_model_dir], 96, limit=1000) == 904
    with pytest.raises(ValueError, match="leaves no room"):
        context_budget([tiny_model_dir], 4096)


def test_bad_depths_and_positions_are_refused(convs):
    with pytest.raises(ValueError, match="consistency_depths must be distinct integers >= 1"):
        build_suite(convs, depths=(0, 5))
    with pytest.raises(ValueError, match="consistency_positions must be distinct fractions"):
        build_suite(convs, positions=(1.5,))


def replies(suite, keep) -> list[str]:
    """Per item: the keeping reply where ``keep(item, j)`` else the breaking one (j = index within its depth)."""
    out, seen = [], {}
    for it in suite.items:
        j = seen[it.depth] = seen.get(it.depth, -1) + 1
        out.append(KEEPS[it.constraint] if keep(it, j) else BREAKS[it.constraint])
    return out


@pytest.fixture(scope="module")
def suite(convs):
    # 20 conversations per depth x 2 positions = 40 probes per depth
    return build_suite(convs, depths=(5, 10, 20), positions=(0.0, 0.5), n_per_depth=20)


def test_a_candidate_that_drops_the_constraint_at_depth_20_is_blocked(suite):
    base = replies(suite, lambda it, j: True)
    cand = replies(suite, lambda it, j: it.depth != 20)
    r = consistency_gate(measure_consistency(suite, {"candidate": cand, "baseline": base}))
    assert r.verdict == "block"
    codes = {f.values["depth"]: f.code for f in r.findings}
    assert codes == {5: "depth_within", 10: "depth_within", 20: "depth_regressed"}
    ch = r.metrics["recall_change_d20"]
    assert ch.value == -100.0 and ch.n == 40
    # the paired interval at the Bonferroni level 1 - 0.05 / 3: 40 probes kept by the baseline only, in 20
    # conversations whose 2 positions agree: every centred difference is 0, so the design effect is n / G = 2 and
    # the half-widths grow by sqrt(2)
    lo, hi = newcombe_paired_diff(0, 0, 40, 0, confidence=1 - 0.05 / 3)
    assert (ch.ci_low, ch.ci_high) == pytest.approx((-100.0, 100 * (-1 + 2 ** 0.5 * (hi + 1))))
    (d20,) = [f.values for f in r.findings if f.values.get("depth") == 20]
    assert d20["design_effect"] == 2.0 and d20["n_conversations"] == 20
    assert r.metrics["recall_change_worst_depth"] == ch
    assert r.metrics["recall_candidate"].value == pytest.approx(100 * 80 / 120)
    assert "Blocked on evidence" in r.reason and "depth 20: recall 0.0% vs baseline 100.0%" in r.reason
    rows = {(t["model"], t["depth"], t["position"], t["constraint"]): t for t in r.table}
    assert rows[("candidate", "20", "0.5", "all")]["recall_pct"] == 0.0 and rows[("baseline", "20", "all", "all")]["n"] == 40
    # one type per column (the W&B table of the gate refuses a column mixing numbers and text)
    for col in ("model", "depth", "position", "constraint"):
        assert {type(t[col]) for t in r.table} == {str}, col
    import wandb

    from rlhf.tracking import _cell

    cols = list(r.table[0])
    assert len(wandb.Table(columns=cols, data=[[_cell(t.get(c)) for c in cols] for t in r.table]).data) == len(r.table)


def test_equal_recall_passes_and_a_small_noisy_drop_is_inconclusive(suite):
    base = replies(suite, lambda it, j: j % 2 == 0)  # half the probes (the first-turn ones) kept at every depth
    same = consistency_gate(measure_consistency(suite, {"candidate": list(base), "baseline": base}))
    assert same.verdict == "pass" and {f.code for f in same.findings} == {"depth_within"}
    # at depth 10 the candidate loses 4 of the baseline's 20 kept probes (a 10-point drop, beyond the allowed 5),
    # too few to be outside noise: the paired interval still reaches 0
    cand = replies(suite, lambda it, j: j % 2 == 0 and not (it.depth == 10 and j in (0, 2, 4, 6)))
    r = consistency_gate(measure_consistency(suite, {"candidate": cand, "baseline": base}))
    assert r.metrics["recall_change_d10"].value == -10.0 and r.metrics["recall_change_d10"].ci_high > 0
    assert r.verdict == "inconclusive"
    assert [f.code for f in r.findings if f.values.get("depth") == 10] == ["depth_drop_could_be_noise"]
    # the same drop allowed (max_drop_pp 10) passes
    assert consistency_gate(measure_consistency(suite, {"candidate": cand, "baseline": base}),
                            max_drop_pp=10.0).verdict == "pass"


def test_too_few_probes_or_no_depth_is_inconclusive(convs, suite):
    base = replies(suite, lambda it, j: True)
    r = consistency_gate(measure_consistency(suite, {"candidate": base, "baseline": base}), min_items=41)
    assert r.verdict == "inconclusive" and {f.code for f in r.findings} == {"depth_too_little_evidence"}
    empty = build_suite(convs[:1], depths=(40,), positions=(0.0,), n_per_depth=1)
    r = consistency_gate(ConsistencyMeasure(empty, {"candidate": [], "baseline": []}))
    assert r.verdict == "inconclusive" and [f.code for f in r.findings] == ["depths_skipped", "no_depth_measured"]
    assert "depth 40: fewer than 39 usable filler exchanges" in r.reason
    with pytest.raises(ValueError, match="3 candidate replies for 120 probes"):
        measure_consistency(suite, {"candidate": ["a"] * 3, "baseline": base})


def test_constraints_by_name_and_the_recall_plot(tmp_path, suite):
    from gates.plots import recall_by_depth_plot

    assert list(constraints_by_name()) == [c.name for c in CONSTRAINTS]
    base = replies(suite, lambda it, j: True)
    r = consistency_gate(measure_consistency(suite, {"candidate": base, "baseline": base}))
    path = recall_by_depth_plot(r.table, tmp_path / "recall.png")
    assert path.stat().st_size > 1000
    with pytest.raises(ValueError, match="at least one row"):
        recall_by_depth_plot([], tmp_path / "empty.png")


def test_the_gate_is_on_the_consistency_axis_when_on_and_the_axis_is_not_measured_when_off(suite):
    from gates.config import GateStageConfig
    from gates.rubric import DEFAULT_RUBRIC, check_rubric, group_by_axis, load_rubric, round_gates
    from gates.result import GateResult

    rubric = load_rubric(DEFAULT_RUBRIC)
    on, off = GateStageConfig(), GateStageConfig(consistency=False)
    assert "consistency_recall" in round_gates(on) and "consistency_recall" not in round_gates(off)
    check_rubric(rubric, config=on)
    check_rubric(rubric, config=off)
    base = replies(suite, lambda it, j: True)
    r = consistency_gate(measure_consistency(suite, {"candidate": base, "baseline": base}))
    others = [GateResult(name=n, version="1", verdict="pass", reason="x", metrics={}) for n in round_gates(off)
              if n != "canaries"]
    axes = group_by_axis([*others, r], rubric, on)
    assert axes["consistency"]["verdict"] == "pass"
    assert axes["consistency"]["gates"][0]["thresholds"]["consistency_depths"] == [5, 10, 20, 40]
    assert group_by_axis(others, rubric, off)["consistency"]["verdict"] == "not_measured"


def test_the_paired_interval_widens_by_the_design_effect_of_shared_conversations():
    # 20 conversations x 2 positions; the candidate loses both positions of conversations 0-5 (d = -12/40)
    cand = [g >= 6 for g in range(20) for _ in range(2)]
    base = [True] * 40
    pairs = [g for g in range(20) for _ in range(2)]
    cells, (lo, hi), deff, g = clustered_paired_diff(cand, base, pairs, 0.95)
    assert cells == (28, 0, 12, 0) and g == 20
    # duplicated clusters: CR1 / item-level variance = [G/(G-1) * 4 S] / [2G/(2G-1) * 2 S] = (2G-1)/(G-1) = 39/19
    assert deff == pytest.approx(39 / 19)
    nlo, nhi = newcombe_paired_diff(28, 0, 12, 0, confidence=0.95)
    r = (39 / 19) ** 0.5
    assert (lo, hi) == pytest.approx((-0.3 - r * (-0.3 - nlo), -0.3 + r * (nhi + 0.3)))
    # every probe its own conversation: exactly Newcombe's
    cells, ci, deff, g = clustered_paired_diff(cand, base, list(range(40)), 0.95)
    assert deff == 1.0 and g == 40 and ci == (nlo, nhi)


def test_bad_consistency_settings_are_refused_at_start_up():
    from gates.config import GateStageConfig
    from gates.inputs import check_inputs

    with pytest.raises(ValueError, match="--n_consistency must be at least 1, got 0"):
        check_inputs(GateStageConfig(n_consistency=0))
    with pytest.raises(ValueError, match="--consistency_max_drop_pp is an allowed drop in points and must be >= 0, got -1.0"):
        check_inputs(GateStageConfig(consistency_max_drop_pp=-1.0))


def test_the_checker_benchmark_meets_its_target_on_the_labelled_set():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import constraint_checkers

    rows = {r["metric"]: r for r in constraint_checkers.measure()}
    assert {"instrument", "metric", "value", "target", "passed", "n", "set"} <= set(rows["pooled recall"])
    # 93 hand-labelled replies: 38 compliant, 55 violating, every kind's figures at or above 0.95
    assert rows["pooled recall"]["n"] == 38 and rows["pooled specificity"]["n"] == 55
    assert all(r["passed"] for r in rows.values())
