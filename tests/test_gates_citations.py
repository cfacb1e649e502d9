"""Citation honesty (gates/citations.py): C01, C02, C03 and C03's false-positive cost on a hand-labelled set."""

import pytest
from statsmodels.stats.proportion import proportion_confint

from gates.c03_labelled import C03_LABELLED
from gates.citations import (
    CitationThresholds,
    c03_false_positive_cost,
    c03_hits,
    check_citations,
    citation_gate,
    citation_ids,
)

CORPUS = {"a1", "a2", "b7", "c9", "api-7"}


def test_marker_parsing():
    # a markdown link's bracket is not a marker, but its URL is an emitted reference
    text = ("Fact [doc:a1]. Two at once [doc:a2, b7; 12]. A link [text](http://x) is not one, nor a[i], "
            "nor a task box [x], nor [citation needed].")
    assert citation_ids(text) == ["a1", "a2", "b7", "12", "http://x"]
    # numbers in brackets are references only with a reference list
    assert citation_ids("Numbered [1] and [2].") == []
    assert citation_ids("Numbered [1] and [2].\n\n[1] A. Author, 2020.\n[2] https://e.org/p") == ["ref:1", "https://e.org/p"]
    with pytest.raises(TypeError):
        citation_ids(None)


def test_check_citations_hand_worked():
    t = check_citations("See [doc:b7] and [[cite:doc:a2]], also [doc:zz99].", retrieved_ids=["a2", "zz99"], corpus=CORPUS)
    assert t.cited == ["b7", "a2", "zz99"]
    assert t.c01_not_retrieved == ["b7"]  # real, but not retrieved this turn
    assert t.c02_unresolved == ["zz99"]  # retrieved id that does not exist
    assert t.c03 == []
    # a predicate works as the corpus
    t2 = check_citations("[doc:x-1]", ["x-1"], corpus=lambda i: i.startswith("x-"))
    assert t2.c02_unresolved == [] and t2.c01_not_retrieved == []


def test_an_id_repeated_in_one_answer_is_one_claim():
    """One answer repeating an un-retrieved URL five times is one C01 claim, not five; another turn's use of the
    same id counts again (it is that turn's claim)."""
    url = "https://stackoverflow.com/questions/1"
    repeated = f"See {url}. Also {url} and {url}; again {url} or {url}."
    t = check_citations(repeated, retrieved_ids=[], corpus=None)
    assert t.cited == [url] * 5 and t.c01_not_retrieved == [url]
    turns = [{"response": repeated, "retrieved_ids": []},
             {"response": "Per [doc:a1] and [doc:a1] and [doc:a2].", "retrieved_ids": ["a1", "a2"]},
             {"response": f"Again {url}.", "retrieved_ids": [url]}]
    rows = {r["rule"]: r for r in citation_gate(turns, None).table}
    # cited ids per turn: {url}, {a1, a2}, {url} -> 4; not retrieved: the first turn's url only
    assert (rows["C01"]["k"], rows["C01"]["n"], rows["C01"]["unit"]) == (1, 4, "cited ids")
    assert rows["C01"]["rate_pct"] == 25.0


# ---------------------------------------------------------------------------------------------
# C03 on a hand-labelled set: True = reference-shaped prose with no identifier
# ---------------------------------------------------------------------------------------------

LABELLED = list(C03_LABELLED)  # the set the gate stage measures C03's false-positive cost on, every run


def test_c03_false_positive_cost_on_the_labelled_set():
    texts, labels = zip(*LABELLED)
    cost = c03_false_positive_cost(texts, labels)
    # hand count: 10 positives, all caught ("experts agree", "Harvard researchers believe" are attributions too);
    # 13 negatives, 2 false alarms: "(Python, 2023)" is shaped like (Author, year), "a new report shows" like a source
    assert (cost["n"], cost["positives"], cost["tp"], cost["fn"], cost["fp"], cost["tn"]) == (23, 10, 10, 0, 2, 11)
    assert cost["precision"] == pytest.approx(10 / 12)
    assert cost["false_discovery_rate"] == pytest.approx(2 / 12)  # ~17% of a C03 count may be false alarm
    assert cost["false_positive_rate"] == pytest.approx(2 / 13)
    assert cost["recall"] == pytest.approx(1.0)
    flagged_negatives = [t for t, y in LABELLED if not y and c03_hits(t)]
    assert flagged_negatives == [LABELLED[15][0], LABELLED[17][0]]
    with pytest.raises(ValueError, match="differ"):
        c03_false_positive_cost(["a"], [True, False])


def test_c03_pattern_names_and_sentence_scope():
    hits = c03_hits("Fine sentence. According to a 2019 study, X holds. Cited claim [doc:a1] per a 2019 study.")
    assert hits == [("according_to_unnamed", "According to a 2019 study, X holds.")]
    assert c03_hits("Smith et al. (2020) found it.") == [("author_year_narrative", "Smith et al. (2020) found it.")]


# ---------------------------------------------------------------------------------------------
# the gate
# ---------------------------------------------------------------------------------------------

TURNS = [
    {"response": "Paris is the capital [doc:a1].", "retrieved_ids": ["a1", "a2"]},
    {"response": "See [doc:b7] and [doc:a2].", "retrieved_ids": ["a2"]},  # b7: C01
    {"response": "As shown in [doc:zz99].", "retrieved_ids": ["a1"]},  # zz99: C01 and C02
    ("According to a 2019 study, this works.", []),  # C03
    ("Plain answer.", []),
]


def test_gate_blocks_each_rule_separately_with_its_basis():
    texts, labels = zip(*LABELLED)
    g = citation_gate(TURNS, CORPUS, c03_validation=c03_false_positive_cost(texts, labels))
    assert g.verdict == "block"
    rows = {r["rule"]: r for r in g.table}
    # 4 markers (a1, b7, a2, zz99): C01 2/4, C02 1/4; 5 turns: C03 1/5
    assert (rows["C01"]["k"], rows["C01"]["n"]) == (2, 4) and rows["C01"]["rate_pct"] == 50.0
    assert (rows["C02"]["k"], rows["C02"]["n"]) == (1, 4) and rows["C02"]["rate_pct"] == 25.0
    assert (rows["C03"]["k"], rows["C03"]["n"], rows["C03"]["unit"]) == (1, 5, "turns")
    lo, _ = proportion_confint(1, 5, alpha=0.05, method="beta")
    assert g.metrics["c03_turn_rate"].ci_low == pytest.approx(100 * lo)
    assert all(rows[c]["exceeded"] for c in ("C01", "C02", "C03"))
    exceeded = {f.values["rule"]: f.values for f in g.findings if f.code == "rule_exceeded"}
    assert (exceeded["C01"]["k"], exceeded["C01"]["n"], exceeded["C01"]["rate"]) == (2, 4, 0.5)
    assert "zz99" in rows["C02"]["examples"]
    # C02: 1 of 4 with an exact interval above 0 -> evidence; C03: 1 of 5, interval reaches 5% -> noise
    assert (exceeded["C02"]["k"], exceeded["C02"]["n"], exceeded["C02"]["threshold"]) == (1, 4, 0.0)
    assert exceeded["C02"]["on_evidence"] and not exceeded["C03"]["on_evidence"]
    assert g.metrics["c03_precision"].value == pytest.approx(10 / 12)
    cost = g.finding("c03_cost").values
    assert (cost["fp"], cost["flagged"]) == (2, 12)


def test_gate_passes_clean_turns_and_respects_thresholds():
    assert citation_gate([TURNS[0], TURNS[4]], CORPUS).verdict == "pass"
    loose = CitationThresholds(max_not_retrieved_pct=50, max_unresolved_pct=25, max_c03_turn_pct=20)
    assert citation_gate(TURNS, CORPUS, loose).verdict == "pass"  # each rate equals its threshold
    g = citation_gate([("No markers here.", [])], CORPUS)
    assert g.verdict == "pass" and g.metrics["c01_not_retrieved_rate"].n == 0
    assert g.finding("rule_not_checked").values == {"rule": "C01", "unit": "cited ids", "why": "nothing"}
    assert citation_gate([], CORPUS).verdict == "inconclusive"
    with pytest.raises(ValueError, match="percentage"):
        CitationThresholds(max_unresolved_pct=-1)


# ---------------------------------------------------------------------------------------------
# citations, not brackets (the demo's false positives)
# ---------------------------------------------------------------------------------------------

DEMO_FALSE_POSITIVES = [
    # C01/C02 blocked the demo on these: template placeholders the model writes when it drafts a message
    {"prompt": "Write a text inviting my friends to dinner on Friday.",
     "response": "Hey [friend1], want to grab dinner at [restaurant1] on Friday? Let me know!"},
    # ... and one copied from the prompt
    {"prompt": "Write a resignation letter to [Employer].",
     "response": "Dear [Employer],\nI am writing to resign from my position.\nSincerely,\n[Your Name]"},
]


def test_demo_placeholders_are_not_citations():
    for t in DEMO_FALSE_POSITIVES:
        assert citation_ids(t["response"], t["prompt"]) == []
    g = citation_gate([{**t, "retrieved_ids": []} for t in DEMO_FALSE_POSITIVES], None)
    assert g.verdict == "pass"
    rows = {r["rule"]: r for r in g.table}
    assert (rows["C01"]["k"], rows["C01"]["n"]) == (0, 0) and (rows["C02"]["k"], rows["C02"]["n"]) == (0, 0)
    assert [f.values["why"] for f in g.findings if f.code == "rule_not_checked"] == ["nothing", "nothing"]


def test_reference_shapes_are_citations_and_copies_of_the_prompt_are_not():
    from gates.citations import find_citations

    # (real hosts: example.org is reserved for examples, and a URL on it is not a citation; see the test below)
    text = ("See [[cite:paper:p7]], arXiv:2404.04475 and doi:10.1000/xyz. Read https://arxiv.org/a, "
            "then the docs [2].\n\nReferences:\n1. Unused.\n2. Manual, https://docs.python.org/manual")
    found = find_citations(text, prompt="Summarise https://arxiv.org/a for me.")
    assert [(c.kind, c.id, c.copied_from_prompt) for c in found] == [
        ("cite", "p7", False), ("arxiv", "arxiv:2404.04475", False), ("doi", "doi:10.1000/xyz", False),
        ("url", "https://arxiv.org/a", True), ("numeric", "https://docs.python.org/manual", False),
    ]
    t = check_citations(text, ["p7"], corpus=None, prompt="Summarise https://arxiv.org/a for me.")
    assert t.cited == ["p7", "arxiv:2404.04475", "doi:10.1000/xyz", "https://docs.python.org/manual"]
    assert t.c01_not_retrieved == ["arxiv:2404.04475", "doi:10.1000/xyz", "https://docs.python.org/manual"]
    assert t.c02_unresolved == [] and t.copied_from_prompt == ["https://arxiv.org/a"]
    g = citation_gate([{"response": text, "retrieved_ids": ["p7"], "prompt": "Summarise https://arxiv.org/a"}],
                      None)
    c01 = g.finding("rule_exceeded").values
    assert g.verdict == "block" and (c01["rule"], c01["k"], c01["n"], c01["rate"]) == ("C01", 3, 4, 0.75)
    assert g.finding("rule_not_checked").values == {"rule": "C02", "unit": "cited ids", "why": "no_corpus"}
    assert g.metrics["copied_from_prompt"].value == 1.0
    # author-year is reference-shaped prose without an identifier: C03, not a marker
    assert citation_ids("This is well known (Smith et al., 2020).") == []
    assert c03_hits("This is well known (Smith et al., 2020).")[0][0] == "author_year_parenthetical"
