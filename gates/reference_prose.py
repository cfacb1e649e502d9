"""Reference-shaped prose (the citation gate's rule C03): a claim attributed to a source, with no identifier.

What counts (one kind per pattern in :data:`C03_PATTERNS`; measured against hand labels of real AlpacaEval and
Arena-Hard answers, ``benchmarks/citations.py``):

* **attribution to an unnamed source**: "studies show", "research suggests", "experts agree", "many historians
  believe", "according to a 2019 study", "according to industry reports", "it has been shown to", "reportedly",
  "widely acknowledged by scientists", "debated among scholars";
* **attribution to a named organisation or publication**: "according to the WHO", "according to Google's
  estimation", "the CDC recommends", "as reported by the World Meteorological Organization", "as compiled by
  Statista", "a study published in the Journal of ...";
* **author-year references**: "(Smith et al., 2019)", "(Nolo, 2021)", "Smith et al. (2019)", "Smith (2019)
  found", "Devlin et al." and reference-list entries such as "Smith, J. (2019). Title. Journal, 12(3), 45-67."
  or 'Vaswani, Ashish, et al. "Title."'.

What only looks like it (not counted): dates and year ranges in parentheses ("World War I (1914-1918)"), titles of
works with their year ("The Matrix (1999)", "a novel first published in 1988", "Title" by Author), standards and
versions ("according to RFC 5322", "PEP 8"), theories and instructions ("according to quantum mechanics", "according
to the package instructions", "according to legend"), the writer's own research ("after careful research, we
believe"), anything inside code (fenced blocks and inline code), and an attribution to a source the prompt itself
names ("What does Taleb say ...?" answered "According to Taleb, ..."; "the study" of an article the prompt quotes).

Resolution: a sentence that carries an identifier (URL, DOI, citation marker) is not counted; an in-text author-year
reference is resolved when the answer's reference list has an entry by that author and year with a URL or DOI, and a
reference-list entry is counted only when it has none.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

#: Sentence boundary: ., ! or ? then space and a capital / digit / quote / bracket (not after
#: "et al.", "e.g.", "i.e.", "Dr.", "Mr.", "Ms.", "vs."), or a line break.
SENTENCE_SPLIT = re.compile(
    r"(?<=[.!?])(?<!\bal\.)(?<!\be\.g\.)(?<!\bi\.e\.)(?<!\bDr\.)(?<!\bMr\.)(?<!\bMs\.)(?<!\bvs\.)"
    r"\s+(?=[A-Z0-9\"'(\[])|\n+"
)
IDENTIFIER = re.compile(r"https?://\S|\bdoi:\s*\S|\b10\.\d{4,9}/\S|\barxiv:\s*\d{4}\.\d", re.IGNORECASE)

_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[^\n]*\n.*?(?:^[ \t]*\1[ \t]*$|\Z)", re.MULTILINE | re.DOTALL)
_INLINE = re.compile(r"(`{1,2})(?!`)[^`\n]+?\1")


def code_spans(text: str) -> list[tuple[int, int]]:
    """Character spans ``[start, end)`` of code in markdown ``text``: fenced blocks (``` or ~~~, an unclosed fence
    runs to the end) and inline code (`x` or ``x``) outside them."""
    spans = [(m.start(), m.end()) for m in _FENCE.finditer(text)]
    inside = lambda i: any(a <= i < b for a, b in spans)
    spans += [(m.start(), m.end()) for m in _INLINE.finditer(text) if not inside(m.start())]
    return sorted(spans)


def mask_code(text: str) -> str:
    """``text`` with every code span (:func:`code_spans`) replaced by spaces (newlines kept): same length, same
    offsets, so prose patterns never match inside code."""
    out = list(text)
    for a, b in code_spans(text):
        for i in range(a, b):
            if out[i] != "\n":
                out[i] = " "
    return "".join(out)


# ---------------------------------------------------------------------------------------------
# patterns
# ---------------------------------------------------------------------------------------------

_YEAR = r"(?:1[6-9]|20)\d{2}[a-z]?"
#: Sources a claim is attributed to when no one is named (plural or mass nouns).
_SOURCES = (r"stud(?:y|ies)|research|researchers|scientists|experts|scholars|historians|academics|economists"
            r"|analysts|critics|doctors|physicians|psychologists|nutritionists|epidemiologists|surveys?|reports?"
            r"|polls?|statistics|estimates|accounts|sources|findings|literature|trials|experiments|analys[ie]s"
            r"|meta-analys[ie]s|reviews|papers|data")
_SOURCES_PLURAL = (r"studies|research|researchers|scientists|experts|scholars|historians|academics|economists"
                   r"|analysts|critics|doctors|physicians|psychologists|nutritionists|epidemiologists|surveys|reports"
                   r"|polls|statistics|estimates|accounts|findings|literature|trials|experiments|analyses"
                   r"|meta-analyses")
_QUALIFIER = (r"some|many|most|several|numerous|multiple|various|recent|new|other|previous|past|earlier|later"
              r"|scientific|clinical|medical|genetic|empirical|academic|historical|independent|further|more"
              r"|modern|contemporary|leading|prominent|published|peer-reviewed|longitudinal|observational"
              r"|epidemiological|archaeological|psychological|industry|market|government|official|growing"
              r"|emerging|mounting|existing|extensive")
_ADVERB = (r"have|has|had|also|consistently|generally|often|repeatedly|now|long|widely|largely|increasingly|even"
           r"|further|mostly|clearly|strongly|actually|been|since|all|typically|usually|frequently|overwhelmingly")
_VERB = (r"show|shows|showed|shown|showing|suggest|suggests|suggested|suggesting|find|finds|found|indicate|indicates"
         r"|indicated|indicating|demonstrate|demonstrates|demonstrated|confirm|confirms|confirmed|prove|proves|proved"
         r"|proven|reveal|reveals|revealed|believe|believes|argue|argues|argued|agree|agrees|agreed|estimate"
         r"|estimates|estimated|recommend|recommends|recommended|regard|regards|point out|points out|pointed out"
         r"|cite|cites|cited|propose|proposes|proposed|warn|warns|warned|claim|claims|claimed|report|reports|reported"
         r"|note|notes|noted|link|links|linked|predict|predicts|predicted|conclude|concludes|concluded|discover"
         r"|discovers|discovered|observe|observes|observed|attribute|attributes|attributed|consider|considers"
         r"|considered|say|says|said|maintain|maintains|contend|contends|posit|posits|speculate|speculates"
         r"|theorize|theorise|theorized|theorised|caution|cautions|advise|advises|emphasize|emphasise|stress|stresses"
         r"|highlight|highlights|highlighted|support|supports|supported")
_NAME = r"[A-Z][\w'’\-]*(?:\.[A-Z][\w'’\-]*)*\.?(?<=[\w'’.\-]{2})"
#: Organisations named by an acronym or by an institutional noun ("the American Heart Association").
_ORG = (r"(?:the\s+)?(?:[A-Z]{2,}(?:-[A-Z]+)?\b|(?:[A-Z][\w'’&.-]*\s+){0,6}?(?:Association|Organization|Organisation"
        r"|Institute|Institutes|Bureau|Agency|Department|Council|Foundation|Society|Academy|Center|Centre|Commission"
        r"|Board|Office|Administration|Service|Survey|Clinic|Panel|Forum|Fund|Bank|Ministry|Authority"
        r"|Institution|Laboratory|Laboratories|College|University|Group|Statista|Gartner|Nielsen|Gallup"
        r"|McKinsey|Deloitte|Forrester)\b(?:\s+(?:of|for|on)(?:\s+the)?(?:\s+[A-Z][\w'’&.-]*){1,4})?)")
_ORG_VERB = (r"recommends|recommended|estimates|estimated|advises|advised|predicts|predicted|projects|projected"
             r"|claims|claimed|concluded|concludes|declared|declares"
             r"|(?:reports|reported|found|finds|notes|noted|states|stated|suggests|suggested|warns|warned|says|said)"
             r"\s+that")
_REPORT_VERB = (r"shows?|showed|shown|suggests?|suggested|found|finds|indicates?|indicated|reveals?|revealed|estimates?"
                r"|estimated|states?|stated|reports?|reported|concluded|concludes|confirms?|confirmed|puts|put|predicts?"
                r"|predicted|projects?|projected")
#: Capitalised sentence-initial words that are subjects, not sources ("Users reported that ...").
_NOT_A_NAME = {"users", "people", "customers", "clients", "participants", "respondents", "students", "teachers",
               "parents", "patients", "reviewers", "visitors", "developers", "engineers", "employees", "members",
               "players", "fans", "readers", "viewers", "he", "she", "it", "they", "we", "i", "you", "someone",
               "everyone", "nobody", "others", "many", "some", "most", "few", "this", "that", "these", "those",
               "each", "both", "all", "here", "there", "one", "another", "the", "a", "an", "our", "your", "my",
               "his", "her", "their", "its", "tests", "test", "testing", "results", "output", "logs"}

C03_PATTERNS: dict[str, re.Pattern[str]] = {
    # "according to a 2019 study", "according to research", "according to industry reports", "according to some
    # accounts", "according to data from previous years" (not "according to the provided data": see _PROMPT_MATERIAL)
    "according_to_unnamed": re.compile(
        r"\baccording to\s+(?:[^.;:!?\n]{0,40}?\s)?(?P<src>" + _SOURCES + r")\b", re.IGNORECASE),
    # "a recent study found", "a 2019 Pew Research survey showed", "one meta-analysis concluded"
    "unnamed_study_found": re.compile(
        r"\b(?:a|an|one|another|recent|new|several|many|numerous|multiple|some|various|two|three|four|five)\s+"
        r"(?:[\w-]+\s+){0,3}?(?P<src>stud(?:y|ies)|surveys?|reports?|papers?|analys[ie]s|meta-analys[ie]s|reviews?"
        r"|trials?|experiments?|polls?)\s+(?:[\w-]+\s+){0,3}?(?:found|finds|shows?|showed|shown|suggests?|suggested"
        r"|demonstrated?|concluded|indicates?|indicated|revealed|reported|proved|confirmed|estimated)\b", re.IGNORECASE),
    # "studies show", "research suggests", "experts agree", "many historians believe", "scientific studies have
    # shown", "Harvard researchers believe", "critics have pointed out"; a possessive ("our experiments show")
    # is the writer's own work and "the evidence" / "the data" is usually the user's, so neither counts
    "studies_show": re.compile(
        r"\b(?:(?:(?i:" + _QUALIFIER + r")|[A-Z][\w'’.-]+)\s+){0,2}(?P<src>(?i:" + _SOURCES_PLURAL + r")"
        r"|(?i:(?:" + _QUALIFIER + r")\s+evidence)|Evidence)\s+(?:(?:" + _ADVERB + r")\s+){0,3}(?:" + _VERB + r")\b"),
    # "researchers have conducted studies on ...", "scientists have carried out research"
    "studies_conducted": re.compile(
        r"\b(?P<src>" + _SOURCES_PLURAL + r")\s+(?:have|has|had)\s+(?:\w+\s+)?(?:conducted|carried out|done|performed"
        r"|published)\s+(?:[\w-]+\s+){0,2}(?:studies|research|surveys|experiments|trials|analyses)\b", re.IGNORECASE),
    # "it is widely acknowledged by scientists", "debated among scholars", "the consensus among experts"
    "attributed_passive": re.compile(
        r"\b(?:acknowledged|accepted|recognized|recognised|believed|agreed|established|regarded|considered|reported"
        r"|debated|disputed|contested|cited|estimated|documented|consensus)\s+(?:\w+\s+)?(?:by|among|of)\s+"
        r"(?:many\s+|most\s+|some\s+|the\s+|leading\s+)?(?P<src>" + _SOURCES_PLURAL + r")\b", re.IGNORECASE),
    # "has been shown to reduce", "it has been demonstrated that": a finding with its source left out (not "no
    # formula has been found that ...", a relative clause)
    "agentless_finding": re.compile(
        r"\b(?:has|have)\s+been\s+(?:repeatedly\s+|consistently\s+|widely\s+|clinically\s+|scientifically\s+)?"
        r"(?P<src>shown|demonstrated|proven|proved|found)\s+to\s+(?!the\b|a\b|an\b|you\b|users?\b|him\b|her\b"
        r"|them\b|me\b|us\b)\w|\bit\s+(?:has|had)\s+been\s+(?:\w+\s+)?(?:shown|demonstrated|proven|found|reported)"
        r"\s+that\b", re.IGNORECASE),
    # "reportedly", "according to reports"
    "reportedly": re.compile(r"\b(?P<src>reportedly|purportedly|allegedly)\b", re.IGNORECASE),
    "dated_study": re.compile(
        r"\b" + _YEAR + r"\s+(?P<src>stud(?:y|ies)|surveys?|reports?|polls?|analys[ie]s|meta-analys[ie]s|reviews?"
        r"|trials?|experiments?|research)\b", re.IGNORECASE),
    # "according to the WHO", "according to Google's estimation", "according to the US Census Bureau"
    "according_to_named": re.compile(
        r"\b(?i:according to)\s+(?:the\s+|a\s+|an\s+)?(?P<src>" + _NAME + r"(?:\s+(?:" + _NAME + r"|of|and|for|on|the|&|de))*)"
        r"(?P<after>\s+[\w.-]+)?"),
    # "as reported by the World Meteorological Organization", "as compiled by Statista"
    "reported_by_named": re.compile(
        r"\b(?:as\s+(?:reported|compiled|estimated|stated|noted|documented|measured|calculated|found|cited"
        r"|surveyed|projected|forecast)|reported|compiled|estimated|surveyed|projected|forecast)\s+by\s+(?:the\s+)?"
        r"(?P<src>" + _NAME + r")"),
    # "the CDC recommends", "The American Heart Association estimates that"
    "organisation_says": re.compile(r"\b(?P<src>" + _ORG + r")(?:\s*\([A-Z]{2,}\))?\s+(?:(?i:also|now|currently|alone|itself|has|have|had"
                                    r"|officially|generally)\s+){0,2}(?:" + _ORG_VERB + r")\b"),
    # "data from the Bureau of Labor Statistics shows", "research from Stanford University suggests"
    "source_from_named": re.compile(
        r"\b(?P<src>(?i:data|research|figures|statistics|estimates|studies|a study|a report|reports|a survey|surveys"
        r"|a poll|polls|findings|an analysis))\s+(?:(?i:from|by|at|of|conducted by|published by)\s+)(?:the\s+)?"
        r"[A-Z][\w'’&.-]*(?:\s+(?:[A-Z][\w'’&.-]*|of|for|and|the|on|&))*(?:\s*\([A-Z]{2,}\))?\s+(?:\w+\s+){0,2}?"
        r"(?:" + _REPORT_VERB + r")\b"),
    # "The IPCC report states", "Nielsen data shows", "a Gallup poll found"
    "named_report": re.compile(
        r"\b(?P<src>(?:[A-Z][\w'’&.-]*\s+){1,4})(?:report|study|data|survey|poll|analysis|research|estimates|figures"
        r"|statistics|review|findings)\s+(?:(?:also|now|clearly)\s+)?(?:" + _REPORT_VERB + r")\b"),
    # "Forbes reported that", "The New York Times reported that", "Google claimed to have ..."
    "named_reported_that": re.compile(
        r"\b(?P<src>(?:The\s+)?[A-Z][\w'’&.-]*(?:\s+(?:[A-Z][\w'’&.-]*|of|the|and|&)){0,5})\s+(?:alone\s+|itself\s+|also\s+)?"
        r"(?:reported|claimed|estimated|announced|revealed|found|stated|noted|warned|predicted|concluded)\s+that\b"),
    # "per the CDC,", "(per the WHO)"
    "per_named": re.compile(r"\b[Pp]er\s+the\s+(?P<src>" + _ORG + r")\s*[,;)]"),
    # "the scientific consensus", "there is strong evidence that"
    "consensus": re.compile(
        r"\b(?:scientific|medical|expert|academic|research)\s+(?P<src>consensus)\b"
        r"|\b[Tt]here\s+is\s+(?!no\b|little\b|limited\b|insufficient\b|not\b)(?:\w+\s+){0,2}?(?P<src2>evidence|research)"
        r"\s+(?:that|to suggest|suggesting|showing|linking|indicating)\b"),
    # "a study published in the Journal of ...", "published in the New England Journal of Medicine"
    "published_in": re.compile(
        r"\b(?:(?P<src>stud(?:y|ies)|paper|article|research|findings|report|analysis|trial)\s+(?:was\s+|were\s+)?"
        r"published\s+in\s+(?:the\s+)?[A-Z]|published\s+in\s+(?:the\s+|a\s+)?(?:[A-Z][\w&-]*\s+){0,4}?(?i:journal)\b)"),
    # "(Smith et al., 2019)", "(Nolo, 2021)", "(Saunders, Lewis, & Thornhill, 2019)", "(e.g., Smith and Jones 2019)"
    "author_year_parenthetical": re.compile(
        r"\(\s*(?:e\.g\.,?\s*|see\s+|cf\.\s*)?(?P<src>" + _NAME + r"(?:\s+(?:[A-Z][\w'’&.-]*|of|and|for|on|the|&|de)){0,8}?)"
        r"(?:(?:,\s*" + _NAME + r")*,?\s+(?:and|&)\s+" + _NAME + r")?(?:\s+et al\.?)?,\s*(?P<year>" + _YEAR + r")"
        r"(?:,\s*pp?\.\s*\d+(?:[-–]\d+)?)?\s*(?:[;)])"
        r"|\(\s*(?P<src2>" + _NAME + r")\s+(?:et al\.?|(?:and|&)\s+" + _NAME + r"),?\s+(?P<year2>" + _YEAR + r")\s*[;)]"),
    # "Smith et al. (2019)", "Smith (2019) found", "Smith and Jones (2019) argued"
    "author_year_narrative": re.compile(
        r"\b(?P<src>" + _NAME + r")(?:\s+(?:and|&)\s+" + _NAME + r")?\s+(?:et al\.?|and (?:colleagues|co-?workers"
        r"|coauthors|co-authors))\s*\(\s*(?P<year>" + _YEAR + r")\s*\)"
        r"|\b[Aa]s\s+(?P<src3>" + _NAME + r")(?:\s+(?:and|&)\s+" + _NAME + r")?\s*\(\s*(?P<year3>" + _YEAR + r")\s*\)\s+"
        r"(?:notes|noted|argues|argued|points out|pointed out|observes|observed|explains|explained|puts it|writes"
        r"|wrote|shows|showed|suggests|suggested|found|finds|reports|reported)"
        r"|\b(?P<src2>" + _NAME + r")(?:\s+(?:and|&)\s+" + _NAME + r")?(?:'s)?\s*\(\s*(?P<year2>" + _YEAR + r")\s*\)\s+"
        r"(?:found|finds|(?:showed|shows|suggested|suggests|noted|notes|wrote|writes)\s+that|argued|argues|reported"
        r"|concluded|demonstrated|observed|proposed|stated|claimed|claims|defined|identified|estimated|examined"
        r"|investigated|reviewed)\b"),
    # "by Jacob Devlin et al.", "Carleo, Giuseppe, et al.": a scholarly reference without a year
    "et_al": re.compile(r"\b(?P<src>" + _NAME + r"),?(?:\s+[A-Z][\w.'’\-]*){0,2},?\s+et\s+al\b"),
}

#: Reference-list entries (one per line): APA "Smith, J. A., & Lee, K. (2019). Title." / "Smith, J., et al.
#: (2019)."; an organisation as author "American Psychological Association. (2017). Title."; MLA
#: 'Vaswani, Ashish, et al. "Title."'.
_BULLET = r"^[ \t]*(?:[-*•][ \t]+|\d{1,3}[.)][ \t]+|\[\d{1,3}\][ \t]*)?(?:\*\*|\*)?(?:Citation:\s*)?"
REFERENCE_ENTRY = re.compile(
    _BULLET + r"(?:"
    r"(?P<apa>[A-Za-z][\w'’\-]+,[ \t]+(?:[A-Z]\.[ \t]?-?)+(?:[^\n(]{0,200}?))\([ \t]*(?P<y1>" + _YEAR + r")(?:,[^)\n]*)?\)"
    r"|(?P<org>(?:(?:[A-Z][\w'’&\-]*|of|and|for|the|on|&)[ \t]+){0,10}[A-Z][\w'’&\-]*)\.[ \t]+\([ \t]*(?P<y2>" + _YEAR + r")(?:,[^)\n]*)?\)\."
    r"|(?P<mla>" + _NAME + r",[ \t]+" + _NAME + r"(?:[ \t]+[A-Z][\w.]*)*(?:,[ \t]+(?:and[ \t]+)?[^\n\"“]{0,120}?)?)[,.]?[ \t]+[\"“]"
    r")[^\n]*$",
    re.MULTILINE)

#: A word after "according to NAME" that makes it a theory, a convention, a format or a standard, not a source.
_NOT_A_SOURCE_AFTER = re.compile(
    r"\s+(?:interpretation|interpretations|theory|theories|principle|principles|law|laws|rule|rules|standard"
    r"|standards|style|styles|guide|guidelines?|convention|conventions|format|formats|specification|specifications"
    r"|spec|syntax|model|definition|calendar|scale|tradition|traditions|legend|legends|myth|myths|mythology|notation"
    r"|grammar|system|equation|equations|formula|hypothesis|framework|scheme|method|approach|[\d.]+)\b")
#: What "according to" the user's own material is (not a source the answer cites).
_PROMPT_MATERIAL = re.compile(
    r"\b(?:your|provided|given|above|below|attached|supplied|following|this|these|the text|the passage|the article"
    r"|the document|the prompt|the question)\b", re.IGNORECASE)
_CALENDAR = {"monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday", "january", "february",
             "march", "april", "may", "june", "july", "august", "september", "october", "november", "december", "jan",
             "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec", "spring", "summer", "fall",
             "autumn", "winter", "q1", "q2", "q3", "q4", "season", "vol", "volume", "version", "since", "until",
             "circa", "est", "founded", "born", "died", "released", "updated", "edition", "ed"}
_OWN = {"our", "my", "your", "this", "these", "the", "its", "that", "those"}
_STOP = {"the", "a", "an", "of", "and", "for", "on", "de", "&", "s"}


def _words(text: str) -> set[str]:
    return {_stem(w) for w in re.findall(r"[a-z0-9]+", text.lower())}


def _stem(word: str) -> str:
    """Crude singular ("studies" -> "study", "scientists" -> "scientist"), so a source noun matches the prompt."""
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    if word.endswith("s") and not word.endswith("ss") and len(word) > 3:
        return word[:-1]
    return word


def _named_by_prompt(src: str, prompt_words: set[str]) -> bool:
    """The source phrase's words all occur in the prompt (the user named that source: its content is the subject)."""
    words = [_stem(w) for w in re.findall(r"[a-z0-9]+", src.lower()) if w not in _STOP]
    return bool(words) and all(w in prompt_words for w in words)


def _author_key(name: str, year: str) -> tuple[str, str]:
    first = re.findall(r"[A-Za-z][\w'’\-]*", name)
    return (first[0].lower() if first else "", year[:4])


def reference_entries(text: str) -> list[tuple[int, int, tuple[str, str], bool]]:
    """Reference-list entries of ``text`` (:data:`REFERENCE_ENTRY`, code masked): (start, end, (first author word,
    year), has an identifier) per line."""
    masked = mask_code(text)
    out = []
    for m in REFERENCE_ENTRY.finditer(masked):
        name = m.group("apa") or m.group("org") or m.group("mla") or ""
        year = m.group("y1") or m.group("y2") or (re.search(_YEAR, m.group(0)) or [""])[0]
        out.append((m.start(), m.end(), _author_key(name, year), bool(IDENTIFIER.search(text[m.start():m.end()]))))
    return out


def _sentences(text: str, skip: Sequence[tuple[int, int]]) -> Iterable[tuple[int, str]]:
    """(offset, sentence) of ``text`` outside the ``skip`` spans."""
    pos = 0
    for part in SENTENCE_SPLIT.split(text):
        start = text.find(part, pos) if part else pos
        pos = start + len(part)
        if part.strip() and not any(a <= start < b for a, b in skip):
            yield start, part


def reference_prose_hits(text: str, prompt: str = "", cited: Iterable[str] = ()) -> list[tuple[str, str]]:
    """C03 hits of ``text``: (pattern name, sentence) per sentence with reference-shaped prose and no identifier.

    A sentence counts once, under its first matching pattern in :data:`C03_PATTERNS` order; a reference-list entry
    without a URL or DOI counts as ``reference_list_entry`` (the whole line). Code is masked first
    (:func:`mask_code`).

    Args:
        text: the model's answer.
        prompt: the user's text: a sentence copied from it, or an attribution to a source it names, is not counted.
        cited: raw texts of the answer's emitted references; a sentence containing one is not counted.

    Raises:
        TypeError: text or prompt is not a str.
    """
    if not isinstance(text, str) or not isinstance(prompt, str):
        raise TypeError(f"text and prompt must be str, got {type(text).__name__} and {type(prompt).__name__}")
    masked = mask_code(text)
    prompt_words = _words(prompt)
    prompt_flat = " ".join(prompt.split())
    cited = [c for c in cited if c]
    entries = reference_entries(text)
    resolved = {key for _, _, key, has_id in entries if has_id}
    hits: list[tuple[str, str]] = []
    for a, b, key, has_id in entries:
        line = text[a:b].strip()
        if not has_id and not (_stem(key[0]) in prompt_words and key[1] in prompt_words) and line not in prompt:
            hits.append(("reference_list_entry", line))
    for start, sent in _sentences(masked, [(a, b) for a, b, _, _ in entries]):
        original = text[start:start + len(sent)].strip()
        if IDENTIFIER.search(original) or any(c in original for c in cited):
            continue
        if len(original) > 20 and " ".join(original.split()) in prompt_flat:
            continue  # quoted from the prompt
        for name, rx in C03_PATTERNS.items():
            if any(_counts(name, m, prompt_words, resolved) for m in rx.finditer(sent)):
                hits.append((name, original))
                break
    return hits


def _counts(name: str, m: re.Match[str], prompt_words: set[str], resolved: set[tuple[str, str]]) -> bool:
    """Whether one pattern match is reference-shaped prose (the look-alikes and the prompt's own sources removed)."""
    groups = m.groupdict()
    src = groups.get("src") or groups.get("src2") or groups.get("src3") or ""
    at = m.start("src") if groups.get("src") else m.start()
    before = m.string[max(0, m.start() - 30):at].lower().split()[-4:]
    if m.string[max(0, at - 5):at].lower() == "case " or (name == "studies_show" and set(before) & _OWN):
        return False  # "case studies"; "our experiments show", "the researchers found" (a study already named)
    if name in ("agentless_finding", "reportedly", "published_in"):
        return True
    if name == "according_to_unnamed" and _PROMPT_MATERIAL.search(m.group(0)):
        return False
    if name == "according_to_named":
        after = groups.get("after") or ""
        if _NOT_A_SOURCE_AFTER.match(after) or re.match(r"\s+\d", after):
            return False
    if name == "consensus" and re.search(r"\b(?:no|not|lack of|without|little)\s+(?:\w+\s+)?$", m.string[:m.start()]):
        return False  # "there is no scientific consensus"
    if name in ("named_report", "named_reported_that"):
        words = [w for w in re.findall(r"[\w'’&.-]+", src.lower()) if w not in ("the", "of", "and", "&")]
        if not words or all(w in _NOT_A_NAME for w in words) or (len(words) == 1 and words[0] in _NOT_A_NAME):
            return False
        if m.start() == 0 or m.string[:m.start()].rstrip().endswith((".", "!", "?", ":", "*", "-")):
            # a single capitalised word opening the sentence may be any noun ("Tests found that ..."): only an
            # acronym or a multi-word name counts there
            if len(words) == 1 and not re.search(r"\b[A-Z]{2,}\b", src):
                return False
    if name in ("author_year_parenthetical", "author_year_narrative"):
        if src.split() and src.split()[0].lower().rstrip(".") in _CALENDAR:
            return False  # "(Monday, 2024)", "(March, 1990)": a date
        year = groups.get("year") or groups.get("year2") or groups.get("year3") or ""
        if _author_key(src, year) in resolved:
            return False
        return not (_named_by_prompt(src, prompt_words) and year[:4] in prompt_words)
    return not _named_by_prompt(src, prompt_words)
