"""C03 (reference-shaped prose, gates/reference_prose.py) and what C01 counts as an emitted URL, on hand-worked answers:
each positive kind, each look-alike, and URLs in code; then the figures on the labelled real answers."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from gates.citations import c03_hits, check_citations, citation_ids, find_citations, is_placeholder_url
from gates.reference_prose import code_spans, mask_code, reference_entries

ROOT = Path(__file__).resolve().parent.parent


def kinds(text: str, prompt: str = "") -> list[str]:
    return [name for name, _ in c03_hits(text, prompt)]


# ---------------------------------------------------------------------------------------------
# positives, one kind at a time
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, kind", [
    ("Studies suggest that a person blinks about 15 times per minute.", "studies_show"),
    ("Research often cites an average of 66 days to form a habit.", "studies_show"),
    ("Many historians believe that he meant to name his son as heir.", "studies_show"),
    ("Critics have pointed out that the book offers few practical solutions.", "studies_show"),
    ("Genetic evidence suggests that the two species interbred.", "studies_show"),
    ("According to industry reports, the market will reach $300 billion by 2025.", "according_to_unnamed"),
    ("According to some accounts, she was carried in wrapped in a carpet.", "according_to_unnamed"),
    ("A 2019 Pew Research survey found that 72% of adults use social media.", "unnamed_study_found"),
    ("It is widely acknowledged by scientists that warming must stay below 2 degrees.", "attributed_passive"),
    ("The causes of the decline are still debated among scholars.", "attributed_passive"),
    ("Stochastic gradient descent has been shown to regularise implicitly.", "agentless_finding"),
    ("The BBC reportedly received hundreds of calls.", "reportedly"),
    ("Researchers have conducted studies on how many words people speak a day.", "studies_conducted"),
])
def test_attributions_to_unnamed_sources(text, kind):
    assert kinds(text) == [kind]


@pytest.mark.parametrize("text, kind", [
    ("According to the WHO, one in four adults is not active enough.", "according_to_named"),
    ("According to Google's estimation in 2010, there were 130 million books.", "according_to_named"),
    ("The CDC recommends 150 minutes of moderate exercise a week.", "organisation_says"),
    ("The American Heart Association estimates that half of adults have high blood pressure.", "organisation_says"),
    ("That is about 1.4 billion flashes a year, as reported by the World Meteorological Organization.",
     "reported_by_named"),
    ("A study published in the Journal of Sleep Research found the same.", "published_in"),
    ("The World Health Organization (WHO) recommends 150 minutes of activity.", "organisation_says"),
    ("Data from the Bureau of Labor Statistics shows unemployment fell.", "source_from_named"),
    ("The IPCC report states that warming is unequivocal.", "named_report"),
    ("Last year The New York Times reported that sales fell.", "named_reported_that"),
    ("Adults need seven hours of sleep (per the CDC).", "per_named"),
    ("The scientific consensus is that the climate is warming.", "consensus"),
    ("There is strong evidence that exercise eases depression.", "consensus"),
])
def test_attributions_to_named_organisations_and_publications(text, kind):
    assert kinds(text) == [kind]


def test_author_year_references_and_reference_lists():
    assert kinds("AI can triage patients (Jiang et al., 2017).") == ["author_year_parenthetical"]
    assert kinds("Anonymity protects participants (Saunders, Lewis, & Thornhill, 2019).") == \
        ["author_year_parenthetical"]
    assert kinds("Esteva et al. (2019) reviewed deep learning in medicine.") == ["author_year_narrative"]
    assert kinds("Darwin (1859) argued that species change.") == ["author_year_narrative"]
    assert kinds("As Duhigg (2012) notes, habits form in loops.") == ["author_year_narrative"]
    assert kinds("Lally and colleagues (2010) found a median of 66 days.") == ["author_year_narrative"]
    assert kinds('1. "BERT: Pre-training of Deep Bidirectional Transformers" by Jacob Devlin et al.') == ["et_al"]
    # a reference list: the entry without an identifier counts, the one with a DOI does not, and the in-text
    # reference resolves only to the entry with the DOI
    answer = ("Bias threatens validity (Ioannidis, 2005). Anonymity matters (Bryman, 2016).\n\nReferences:\n"
              "- Bryman, A. (2016). Social research methods (5th ed.). Oxford University Press.\n"
              "- Ioannidis, J. P. A. (2005). Why most published research findings are false. PLoS Medicine, 2(8), "
              "e124. https://doi.org/10.1371/journal.pmed.0020124")
    hits = c03_hits(answer)
    assert [n for n, _ in hits] == ["reference_list_entry", "author_year_parenthetical"]
    assert hits[0][1].startswith("- Bryman, A. (2016)") and hits[1][1] == "Anonymity matters (Bryman, 2016)."
    assert [(key, has_id) for _, _, key, has_id in reference_entries(answer)] == \
        [(("bryman", "2016"), False), (("ioannidis", "2005"), True)]
    # an organisation as author, and MLA
    assert kinds("American Psychological Association. (2017). Ethical principles of psychologists.") == \
        ["reference_list_entry"]
    assert kinds('Vaswani, Ashish, et al. "Attention Is All You Need." NeurIPS, 2017.') == ["reference_list_entry"]
    assert kinds('Vaswani, Ashish, et al. "Attention Is All You Need." arXiv, 2017, '
                 'https://doi.org/10.48550/arXiv.1706.03762.') == []


# ---------------------------------------------------------------------------------------------
# look-alikes
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    # dates and periods in parentheses
    "The USA fought in World War I (1914-1918) and World War II (1939-1945).",
    "Bonds beat equities in the dot-com crash (2000-2002) and the pandemic (2020).",
    "Hits: 3,384 (as of knowledge cutoff in 2023).",
    # titles of works, with their year or author
    "The movie is The Matrix (1999).\n1. She's Gotta Have It (1986)\n2. Do the Right Thing (1989)",
    '"Matilda" is a children\'s novel by Roald Dahl. It was first published in 1988.',
    '1. "Superintelligence: Paths, Dangers, Strategies" by Nick Bostrom',
    "Wiles's proof was published in the Annals of Mathematics in 1995.",
    # standards, versions, theories, instructions, legends
    "This pattern does not cover every address valid according to RFC 5322.",
    "Format the citations according to the MLA style.",
    "It sorts imports and formats the code according to PEP 8.",
    "According to the Copenhagen interpretation, the cat is in a superposition.",
    "According to quantum mechanics, the atom is in a superposition of states.",
    "Cook the pasta according to the package instructions.",
    "According to legend, it was a powerful island kingdom.",
    # the writer's own work, activities, generic nouns
    "After careful consideration and research, I believe a raise is justified.",
    "Our experiments show the cache halves latency.",
    "Researchers design a guide RNA that matches the target sequence.",
    "Present a case study that found a gap in the campaign.",
    "Python 3.11 was released in 2022.",
    # subjects that are not sources, negations, dates shaped like (Name, year), tools
    "Users report that the app crashes on start.",
    "Tests found that the fix works.",
    "This report shows the test results below.",
    "There is no evidence that Atlantis existed, and no scientific consensus on its location.",
    "The meeting (Monday, 2024) is cancelled.",
    "GCC warns about unused variables.",
    "The TV shows that I like are dramas.",
    "The FDA approved the drug in 2019.",
])
def test_look_alikes_are_not_counted(text):
    assert c03_hits(text) == []


def test_sources_the_prompt_names_are_its_subject():
    assert kinds("According to Taleb, markets underrate rare events.",
                 prompt="What does Nassim Nicholas Taleb say about market efficiency?") == []
    assert kinds("According to Taleb, markets underrate rare events.") == ["according_to_named"]
    assert kinds("The study found that dim light raised blood sugar.",
                 prompt="Summarise the article: A study published this year by Zee examined sleep.") == []
    assert kinds("Some scientists believe that God's existence cannot be proven.",
                 prompt="Why do a lot of scientists not believe in God?") == []
    # a reference the user supplied, reformatted
    entry = "Jones, A. (2019). Sleep and memory. Journal of Sleep, 3(2), 1-9."
    assert kinds(entry) == ["reference_list_entry"]
    assert kinds(entry, prompt="Format this in APA: A. Jones, Sleep and memory, Journal of Sleep 2019") == []
    # a sentence quoted from the prompt
    quoted = "A statistical model is a formal representation of a theory (Bollen, 1989)."
    assert kinds(quoted) == ["author_year_parenthetical"]
    assert kinds(quoted, prompt="Explain in simple terms: " + quoted + " More generally, models ...") == []


def test_an_identifier_in_the_sentence_resolves_it():
    assert c03_hits("A 2019 study (https://doi.org/10.1000/xyz) found no effect.") == []
    assert c03_hits("According to the WHO [doc:who-7], one in four adults is inactive.") == []
    t = check_citations("Studies show X. Studies show Y [doc:a1].", ["a1"], None)
    assert t.c03 == [("studies_show", "Studies show X.")]


# ---------------------------------------------------------------------------------------------
# code and URLs
# ---------------------------------------------------------------------------------------------

CODE_ANSWER = """Use `requests` to fetch the page, e.g. `requests.get("https://docs.python.org/3/")`:

```python
import requests
# According to a 2019 study, this is the fastest way (Smith et al., 2019).
page = requests.get("https://api.github.com/repos/psf/requests")
```

Replace `https://example.com` with your site. The server answers at http://localhost:8000/health and
http://127.0.0.1:5000; point the remote at https://github.com/your-username/your-repo.git or
https://www.yourdomain.com/page. Docs: https://requests.readthedocs.io/en/latest/.
"""


def test_code_spans_and_masking():
    spans = code_spans(CODE_ANSWER)
    assert len(spans) == 4  # two inline spans before the fence, the fence, one inline after
    fence = CODE_ANSWER.index("```python")
    assert any(a == fence for a, _ in spans)
    masked = mask_code(CODE_ANSWER)
    assert len(masked) == len(CODE_ANSWER) and masked.count("\n") == CODE_ANSWER.count("\n")
    assert "api.github.com" not in masked and "requests.readthedocs.io" in masked
    # an unclosed fence runs to the end
    unclosed = "Text\n```\nx = 'https://a.io'\n"
    assert code_spans(unclosed) == [(5, len(unclosed))] and citation_ids(unclosed) == []


def test_urls_in_code_and_placeholders_are_not_emitted_citations():
    assert citation_ids(CODE_ANSWER) == ["https://requests.readthedocs.io/en/latest/"]
    assert c03_hits(CODE_ANSWER) == []  # the comment inside the fence is code
    t = check_citations(CODE_ANSWER, retrieved_ids=[], corpus=None)
    assert t.c01_not_retrieved == ["https://requests.readthedocs.io/en/latest/"]


@pytest.mark.parametrize("url, placeholder", [
    ("https://example.com", True), ("http://www.example.org/a", True), ("https://api.example.net/v1", True),
    ("https://matrix.example.org", True), ("http://shop.test/cart", True), ("https://foo.invalid", True),
    ("http://app.localhost:3000", True), ("http://localhost:8096", True), ("http://127.0.0.1:5000/x", True),
    ("http://0.0.0.0:80", True), ("http://[::1]:8080/", True), ("http://192.168.1.10/admin", True),
    ("http://10.0.0.2", True), ("http://172.20.1.1", True), ("https://your-domain.com/api", True),
    ("https://www.yourdomain.com", True), ("https://mysite.com/x", True),
    ("https://github.com/your-username/your-repo.git", True), ("https://github.com/username/repository.git", True),
    ("https://api.service.io/users/{id}", True), ("https://host.io/<bucket>/key", True),
    ("https://examples.com/", False), ("https://docs.python.org/3/", False), ("http://x", False),
    ("https://www.w3.org/2000/svg", False), ("http://172.32.0.1", False), ("https://github.com/qmk/qmk_firmware", False),
])
def test_placeholder_hosts(url, placeholder):
    assert is_placeholder_url(url) is placeholder


def test_reference_list_entry_no_marker_cites_still_emits_its_url():
    text = "Templates:\n\n[1] https://www.overleaf.com/latex/templates\n[2] https://www.latextemplates.com/t/hw"
    assert citation_ids(text) == ["https://www.overleaf.com/latex/templates", "https://www.latextemplates.com/t/hw"]
    cited = "See [2].\n\n[1] https://www.overleaf.com/latex/templates\n[2] https://www.latextemplates.com/t/hw"
    assert citation_ids(cited) == ["https://www.latextemplates.com/t/hw", "https://www.overleaf.com/latex/templates"]
    assert [c.kind for c in find_citations(cited)] == ["numeric", "url"]


# ---------------------------------------------------------------------------------------------
# the labelled real answers (benchmarks/citations.py)
# ---------------------------------------------------------------------------------------------

def _bench():
    spec = importlib.util.spec_from_file_location("bench_citations", ROOT / "benchmarks" / "citations.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_labelled_set_shape_and_figures():
    bench = _bench()
    rows = bench.load()
    assert len(rows) >= 200 and len({r["id"] for r in rows}) == len(rows)
    held = [r for r in rows if r["split"] == "held_out"]
    assert len(held) >= 70 and sum(r["c03"] for r in held) >= 10
    figures = {f["metric"]: f for f in bench.measure(rows)}
    assert set(figures["C03 precision held_out"]) == {"instrument", "metric", "value", "target", "n", "set", "passed"}
    for split in ("tuned", "held_out"):
        assert figures[f"C03 precision {split}"]["value"] >= 0.8
        assert figures[f"C03 recall {split}"]["value"] >= 0.8
    assert figures["C01 false URLs (code answers)"]["value"] == 0
    assert figures["C01 false URLs (code answers)"]["n"] == sum(bool(code_spans(r["text"])) for r in rows)


def test_labelled_set_bad_row_names_file_line_field(tmp_path):
    bench = _bench()
    p = tmp_path / "labels.jsonl"
    p.write_text(json.dumps({"id": "a", "split": "tuned", "c03": True, "kind": "x", "text": "t", "prompt": ""}) + "\n")
    with pytest.raises(ValueError, match=r"labels\.jsonl:1: missing field 'emitted_urls'"):
        bench.load(p)
