"""Decontamination: is a training prompt one of the evaluation (gate) prompts, a near-copy of one, or does it hold one?

Evaluation scores are inflated when the model trained on the test items (training/eval contamination;
GPT-3, Brown et al. 2020, appendix C; PaLM, Chowdhery et al. 2022, section 8). Before SFT, DPO and the
reward model train, their prompts are checked against every gate suite of the round (DESIGN.md: "Training
data is decontaminated against every gate suite ... before a stage trains").

API (small on purpose; other stages and tools reuse it):

* :func:`normalise` - what does not change a request removed: NFKC, case folded, Unicode format characters
  (category Cf: zero-width spaces and joiners, soft hyphens, BOM) dropped, apostrophes dropped (``don't`` =
  ``don’t`` = ``dont``), every other non-word character (punctuation, quotes, symbols) a word break, words joined
  by one space.
* :func:`words` - the words of :func:`normalise` (``\\w+`` runs).
* :func:`prompt_hash` - SHA-256 of the normalised text: equal hashes = the same prompt up to the above.
* :func:`word_ngrams` - the set of word n-grams of the normalised text.
* :func:`check` - ``check(train_prompts, suites) -> DecontaminationReport``: every (training row, suite prompt)
  pair that matches (kinds below).
* :func:`suites_from_gates_recipe` - the gate suites' prompts named by a gates recipe (``*_data`` keys).
* :func:`check_per_turn` - as :func:`check`, but each row is also checked turn by turn (``decontaminate(...,
  per_turn=True)``).
* :func:`suites_from_generations` - the prompts a round's gates actually sent (``gates/generations.jsonl``).

A training prompt overlaps a suite prompt by one of four kinds (the strongest is reported, in this order):

1. ``exact``: the normalised texts are equal (:func:`prompt_hash`).
2. ``contained``: the normalised suite prompt is a run of whole words of the normalised training text (the
   prompt embedded in a longer request). Prompts of fewer than :data:`CONTAIN_MIN_WORDS` words are matched by
   ``exact`` only. A suite prompt shorter than :data:`SHORT_WORDS` words must also stand as its own clause in the
   training text: the text starts or ends there, or punctuation, a line break or a capitalised next word
   separates it from the words around it ("Quick question: What is LSD? Thanks" and "Who made Berlin Can you
   help" hold "What is LSD?" and "Who made Berlin"; "what is lsd used for in medicine" does not hold "What is
   LSD?", since it asks something else).
3. ``ngram``: they share a word n-gram, n = :data:`DEFAULT_N` = 8 (PaLM's rule; GPT-3 used 13-grams, pass
   ``n=13``). 13-grams could never match the XSTest prompts (6-12 words). N-grams found in more than
   :data:`NGRAM_MAX_DF` suite prompts are their template (TruthfulQA's instructions), not used; nor are n-grams
   with fewer than :data:`NGRAM_MIN_CONTENT` content words (scikit-learn's English stop-word list marks the rest).
4. ``fuzzy``: for suite prompts of at least :data:`FUZZY_MIN_WORDS` words, the word-level similarity of the
   suite prompt to the training text is at least :data:`FUZZY_THRESHOLD`: RapidFuzz's normalised Indel
   similarity on word sequences (``fuzz.ratio``; ``fuzz.partial_ratio``, the best-aligned window, when the
   training text is the longer), i.e. 1 - (words inserted + deleted) / (words in both); and the text must keep,
   in order, at least :data:`CONTENT_THRESHOLD` of the prompt's content words (stop words dropped), so a request
   that keeps a prompt's frame but changes what it asks for ("Can you tell me how to [kill somebody -> get
   gas]") is no copy.
   Replacing every 7th word of a prompt scores 1 - 1/7 = 0.857 on all words. Candidates are the pairs that share at least two of the suite
   prompt's rare word bigrams (bigrams in at most :data:`RARE_BIGRAM_DF` suite prompts), so the similarity is
   computed for a handful of pairs per row, not for all of them. The threshold was chosen on
   ``benchmarks/decontamination.py`` (recall on word-replaced gate prompts against false positives on HH-RLHF).

Measured recall per variant class and the false-positive rate: ``python benchmarks/decontamination.py``.
"""

from __future__ import annotations

import hashlib
import math
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import regex

DEFAULT_N = 8
#: Suite prompts with fewer words are matched by ``exact`` only (a two-word prompt inside a row says nothing).
CONTAIN_MIN_WORDS = 3
#: Suite prompts with fewer words must stand as their own clause to be ``contained`` (see the module docstring).
SHORT_WORDS = 8
#: Suite prompts with fewer words are never ``fuzzy``-matched (too few words for a similarity to mean anything).
FUZZY_MIN_WORDS = 8
#: Word-level similarity at or above which a suite prompt and a training text are the same request.
FUZZY_THRESHOLD = 0.8
#: A shared word n-gram counts only with at least this many content words (not stop words): "can you help me
#: figure out how to" starts many requests that are not the suite prompt it starts.
NGRAM_MIN_CONTENT = 3
#: A word n-gram in more suite prompts than this is template text, not used by the "ngram" rule.
NGRAM_MAX_DF = 10
#: A fuzzy match also keeps at least this share of the prompt's content words, in order (replacing every 7th word
#: keeps 6/7 of them on average; "what are some good ways to [spread ashes -> destroy someones boat]" keeps 2/4).
CONTENT_THRESHOLD = 0.75
#: A bigram in more suite prompts than this is not used to find fuzzy candidates ("of the", "how do").
RARE_BIGRAM_DF = 32
#: A fuzzy candidate shares at least this share of the suite prompt's rare bigrams (and at least 2).
CANDIDATE_SHARE = 0.5
#: Gates-recipe keys whose files are gate suites (traffic shares and intent-classifier training data are not).
SUITE_KEYS: tuple[str, ...] = ("winrate_data", "safe_data", "redteam_data", "capability_data", "sycophancy_data")
#: The set of a suite file the gates use (XSTest holds safe and unsafe prompts; the gates use the safe ones).
SUITE_SETS: dict[str, str] = {"safe_data": "xstest_safe"}
MODES: tuple[str, ...] = ("remove", "fail", "off")
#: Match kinds, strongest first.
KINDS: tuple[str, ...] = ("exact", "contained", "ngram", "fuzzy")
_CF = regex.compile(r"\p{Cf}+")
# apostrophes and their look-alikes (curly, modifier letter, prime, backtick, acute, fullwidth): dropped inside words
_APOSTROPHES = regex.compile(r"['\u2018\u2019\u201a\u201b\u02bc\u02b9\u2032\u0060\u00b4\uff07]")
_WORD = regex.compile(r"\w+")
# what separates clauses: a line break or punctuation other than in-word hyphens and slashes
_CLAUSE_BREAK = regex.compile(r"[\n\r\u2028\u2029]|[^\w\s\-\u2010\u2011/]")


def _fold(text: str) -> str:
    if not isinstance(text, str):
        raise TypeError(f"text must be str, got {type(text).__name__}")
    return _APOSTROPHES.sub("", _CF.sub("", unicodedata.normalize("NFKC", text)).casefold())


def words(text: str) -> list[str]:
    """The words of ``text`` after normalisation (see :func:`normalise`), in order.

    Raises:
        TypeError: text is not a str.
    """
    return _WORD.findall(_fold(text))


def normalise(text: str) -> str:
    """``text`` with what does not change a request removed: NFKC, case folded, format characters (Cf) and
    apostrophes dropped, every other non-word character a break; words joined by one space.

    ``normalise("How can I kill a  Python process ?") == normalise("how can i kill a python process") ==
    "how can i kill a python process"``.

    Raises:
        TypeError: text is not a str.
    """
    return " ".join(words(text))


def _words_and_breaks(text: str) -> tuple[list[str], list[bool]]:
    """Words of ``text`` and, for each of the len(words) + 1 gaps (before the first word, between words, after the
    last), whether it separates clauses: the text's start or end, a line break, punctuation, or a next word that
    starts with a capital letter ("Who made Berlin Can you help me out?": a new sentence, its full stop left out)."""
    if not isinstance(text, str):
        raise TypeError(f"text must be str, got {type(text).__name__}")
    uncased = _APOSTROPHES.sub("", _CF.sub("", unicodedata.normalize("NFKC", text)))
    ws: list[str] = []
    breaks: list[bool] = []
    pos = 0
    for m in _WORD.finditer(uncased):
        word = m.group()
        breaks.append(not ws or word[0].isupper() or bool(_CLAUSE_BREAK.search(uncased, pos, m.start())))
        ws.append(word.casefold())
        pos = m.end()
    breaks.append(True)
    if ws != words(text):  # casefolding split or joined a word (rare scripts): breaks only at the ends
        ws = words(text)
        breaks = [True] + [False] * max(len(ws) - 1, 0) + [True] if ws else [True]
    return ws, breaks


def prompt_hash(text: str) -> str:
    """SHA-256 hex digest of :func:`normalise`'d text (64 characters)."""
    return hashlib.sha256(normalise(text).encode("utf-8")).hexdigest()


def word_ngrams(text: str, n: int = DEFAULT_N) -> set[tuple[str, ...]]:
    """Word n-grams of the normalised text (empty when it has fewer than ``n`` words).

    Raises:
        ValueError: n < 1.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    ws = words(text)
    return {tuple(ws[i : i + n]) for i in range(len(ws) - n + 1)}


@dataclass(frozen=True)
class Overlap:
    """One training row that overlaps one suite prompt.

    Fields:
        train_index: 0-based position in ``train_prompts``.
        suite: suite name.
        suite_index: 0-based position in that suite's prompts.
        match: the strongest kind that matched, one of :data:`KINDS`: "exact" (same normalised text),
            "contained" (the normalised suite prompt inside the training text), "ngram" (shares word n-grams),
            "fuzzy" (word-level similarity >= the threshold).
        shared_ngrams: number of distinct shared n-grams (0 when none, e.g. a prompt shorter than n words).
        suite_prompt: the suite prompt (first 200 characters), so a report reader can see it.
        similarity: word-level similarity in [0, 1] (see the module docstring): 1.0 for "exact" and
            "contained", the similarity for "fuzzy", 0.0 (not computed) for "ngram".
    """

    train_index: int
    suite: str
    suite_index: int
    match: str
    shared_ngrams: int
    suite_prompt: str
    similarity: float = 1.0


@dataclass
class DecontaminationReport:
    """Result of :func:`check`.

    Fields:
        n: the n-gram length used.
        n_train: training prompts checked.
        suites: suite name -> number of prompts checked.
        overlaps: every :class:`Overlap`, by training row then suite.
        contaminated_rows: sorted training indices with at least one overlap.
        seen: suite name -> number of its prompts that overlap some training row.
        fuzzy_threshold: the similarity threshold of "fuzzy" matches.
        by_kind: match kind -> number of overlaps of that kind.
    """

    n: int
    n_train: int
    suites: dict[str, int]
    overlaps: list[Overlap] = field(default_factory=list)
    contaminated_rows: list[int] = field(default_factory=list)
    seen: dict[str, int] = field(default_factory=dict)
    fuzzy_threshold: float = FUZZY_THRESHOLD
    by_kind: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (what a stage writes to its manifest under ``outputs.decontamination``)."""
        return asdict(self)


def _similarity(a: list[str], b: list[str]) -> float:
    """RapidFuzz's normalised Indel similarity of word sequences; of ``a`` and the best-aligned window of ``b``
    when ``b`` is the longer (``fuzz.partial_ratio``). In [0, 1]."""
    from rapidfuzz import fuzz

    if not a or not b:
        return 0.0
    return (fuzz.partial_ratio(a, b) if len(b) > len(a) else fuzz.ratio(a, b)) / 100.0


class _SuiteIndex:
    """The suite prompts indexed once for :func:`check`: by normalised text (exact), in an Aho-Corasick automaton
    over space-padded normalised texts (contained: a match of " a b c " in " x a b c y " is word-bounded), by
    word n-gram, and by rare word bigram (fuzzy candidates)."""

    def __init__(self, suites: Mapping[str, Sequence[str]], n: int, fuzzy_threshold: float):
        import ahocorasick
        from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS as stop

        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if not 0.0 < fuzzy_threshold <= 1.0:
            raise ValueError(f"fuzzy_threshold must be in (0, 1], got {fuzzy_threshold}")
        self.n, self.threshold = n, fuzzy_threshold
        self.keys: list[tuple[str, int]] = []
        self.texts: list[str] = []
        self.words: list[list[str]] = []
        self.stop = stop
        self.by_norm: dict[str, list[int]] = {}
        self.by_gram: dict[tuple[str, ...], list[int]] = {}
        bigram_owners: dict[tuple[str, str], set[int]] = {}
        for name, prompts in suites.items():
            for j, p in enumerate(prompts):
                k = len(self.keys)
                ws = words(p)
                self.keys.append((name, j))
                self.texts.append(p)
                self.words.append(ws)
                self.by_norm.setdefault(" ".join(ws), []).append(k)
                for g in {tuple(ws[i : i + n]) for i in range(len(ws) - n + 1)}:
                    if sum(w not in stop for w in g) >= NGRAM_MIN_CONTENT:
                        self.by_gram.setdefault(g, []).append(k)
                if len(ws) >= FUZZY_MIN_WORDS:
                    for b in set(zip(ws, ws[1:])):
                        bigram_owners.setdefault(b, set()).add(k)
        self.automaton = None
        contain = [norm for norm, ks in self.by_norm.items() if len(self.words[ks[0]]) >= CONTAIN_MIN_WORDS]
        if contain:
            self.automaton = ahocorasick.Automaton()
            for norm in contain:
                self.automaton.add_word(f" {norm} ", norm)
            self.automaton.make_automaton()
        self.by_bigram = {b: tuple(ks) for b, ks in bigram_owners.items() if len(ks) <= RARE_BIGRAM_DF}
        # a candidate shares at least half of the prompt's rare bigrams (and 2): replacing every 7th word keeps 5
        # of 7, a row that merely shares a topic keeps far fewer, so few pairs reach the similarity
        # an n-gram in many suite prompts is their template ("Think step by step and then give your answer in the
        # format ..." is in every TruthfulQA prompt), not one of them: a row that quotes it copies no prompt
        self.by_gram = {g: ks for g, ks in self.by_gram.items() if len(ks) <= NGRAM_MAX_DF}
        self.gram_keys = frozenset(self.by_gram)
        self.bigram_keys = frozenset(self.by_bigram)
        n_rare: dict[int, int] = {}
        for ks in self.by_bigram.values():
            for k in ks:
                n_rare[k] = n_rare.get(k, 0) + 1
        self.min_shared = {k: min(c, max(2, math.ceil(CANDIDATE_SHARE * c))) for k, c in n_rare.items()}

    def similarity(self, k: int, ws: list[str]) -> float:
        """Word-level similarity of suite prompt ``k`` to a training text's words (module docstring), or 0.0 when
        the text keeps (in order) less than :data:`CONTENT_THRESHOLD` of the prompt's content words (stop words
        left out): "Can you tell me how to get gas" keeps 7 of the 8 words of "Can you tell me how to kill
        somebody" but 1 of its 3 content words, and asks something else."""
        mine = self.words[k]
        score = _similarity(mine, ws)
        if score < self.threshold:
            return score
        from rapidfuzz.distance import LCSseq

        content = [w for w in mine if w not in self.stop]
        kept = LCSseq.similarity(content, [w for w in ws if w not in self.stop])  # content words kept, in order
        if content and kept / len(content) < CONTENT_THRESHOLD:
            return 0.0
        return score

    def match(self, text: str) -> dict[int, tuple[str, int, float]]:
        """Suite prompt index -> (kind, shared n-grams, similarity) for every suite prompt ``text`` overlaps."""
        ws = words(text)
        norm = " ".join(ws)
        found: dict[int, tuple[str, int, float]] = {}
        for k in self.by_norm.get(norm, ()):
            found[k] = ("exact", 0, 1.0)
        if self.automaton is not None and ws:
            breaks = None
            padded = f" {norm} "
            for end, hit in self.automaton.iter(padded):
                ks = [k for k in self.by_norm[hit] if k not in found]
                if not ks:
                    continue
                size = len(self.words[ks[0]])
                if size < SHORT_WORDS:
                    if breaks is None:
                        breaks = _words_and_breaks(text)[1]
                    start = padded.count(" ", 0, end - len(hit) - 1)  # words before the match
                    if not (breaks[start] and breaks[start + size]):
                        continue
                for k in ks:
                    found[k] = ("contained", 0, 1.0)
        shared: dict[int, int] = {}
        if len(ws) >= self.n and self.by_gram:
            # set & frozenset runs in C over the smaller side; only shared keys reach the Python loop
            for g in {tuple(ws[i : i + self.n]) for i in range(len(ws) - self.n + 1)} & self.gram_keys:
                for k in self.by_gram[g]:
                    shared[k] = shared.get(k, 0) + 1
        for k, c in shared.items():
            # no similarity for n-gram matches: suite prompts built on one template (TruthfulQA's "Answer
            # choices:") share n-grams by the hundred, and the match stands on the shared n-grams anyway
            found[k] = (found[k][0], c, found[k][2]) if k in found else ("ngram", c, 0.0)
        if len(ws) >= 2 and self.by_bigram:
            hits: dict[int, int] = {}
            for b in set(zip(ws, ws[1:])) & self.bigram_keys:
                for k in self.by_bigram[b]:
                    hits[k] = hits.get(k, 0) + 1
            for k, c in hits.items():
                if k in found or c < self.min_shared[k]:
                    continue
                sim = self.similarity(k, ws)
                if sim >= self.threshold:
                    found[k] = ("fuzzy", 0, sim)
        return found


def check(
    train_prompts: Sequence[str],
    suites: Mapping[str, Sequence[str]],
    *,
    n: int = DEFAULT_N,
    fuzzy_threshold: float = FUZZY_THRESHOLD,
) -> DecontaminationReport:
    """Find training prompts that are, contain, share a word n-gram with, or nearly are a prompt of any suite.

    Args:
        train_prompts: shape (n_train,), one text per training row (its user turns joined).
        suites: suite name -> its prompts.
        n: word n-gram length (default 8; see the module docstring).
        fuzzy_threshold: word-level similarity in (0, 1] for a "fuzzy" match (default :data:`FUZZY_THRESHOLD`).

    Returns:
        :class:`DecontaminationReport`; one :class:`Overlap` per (row, suite prompt), of the strongest kind.

    Raises:
        TypeError: a prompt is not a str. ValueError: n < 1, or fuzzy_threshold outside (0, 1].
    """
    index = _SuiteIndex(suites, n, fuzzy_threshold)
    overlaps: list[Overlap] = []
    for i, t in enumerate(train_prompts):
        found = index.match(t)
        for k in sorted(found, key=lambda k: index.keys[k]):
            kind, grams, sim = found[k]
            name, j = index.keys[k]
            overlaps.append(Overlap(i, name, j, kind, grams, index.texts[k][:200], round(sim, 4)))
    return _report(overlaps, len(train_prompts), suites, n, fuzzy_threshold)


def _report(overlaps: list[Overlap], n_train: int, suites: Mapping[str, Sequence[str]], n: int,
            threshold: float) -> DecontaminationReport:
    return DecontaminationReport(
        n=n,
        n_train=n_train,
        suites={name: len(p) for name, p in suites.items()},
        overlaps=overlaps,
        contaminated_rows=sorted({o.train_index for o in overlaps}),
        seen={name: len({o.suite_index for o in overlaps if o.suite == name}) for name in suites},
        fuzzy_threshold=threshold,
        by_kind={kind: sum(o.match == kind for o in overlaps) for kind in KINDS},
    )


def row_text(row: Any) -> str:
    """The prompt text of a training row: the user turns of a Conversation / PreferencePair, joined; a str as is."""
    if isinstance(row, str):
        return row
    messages = getattr(row, "prompt", None) if not hasattr(row, "messages") else row.messages
    if isinstance(messages, str):
        return messages
    return "\n".join(m.content for m in (messages or []) if m.role == "user")


def row_turns(row: Any) -> list[str]:
    """Each user turn of a training row on its own (a Conversation / PreferencePair / ExpertPair); a str is one turn."""
    if isinstance(row, str):
        return [row]
    messages = getattr(row, "prompt", None) if not hasattr(row, "messages") else row.messages
    if isinstance(messages, str):
        return [messages]
    return [m.content for m in (messages or []) if m.role == "user"]


def check_per_turn(
    rows: Sequence[Any],
    suites: Mapping[str, Sequence[str]],
    *,
    n: int = DEFAULT_N,
    fuzzy_threshold: float = FUZZY_THRESHOLD,
) -> DecontaminationReport:
    """:func:`check` with each row checked as its joined user turns (:func:`row_text`, what :func:`check` sees)
    AND as each user turn alone (:func:`row_turns`), so a single-turn suite prompt asked inside a multi-turn
    conversation is found even where the joined text would not be similar enough to it.

    An overlap is reported once per (row, suite prompt), of the strongest kind any of the row's texts matched
    (:data:`KINDS` order), then the most shared n-grams, then the highest similarity. ``train_index`` and
    ``n_train`` count rows, not turns.

    Raises:
        TypeError: a prompt is not a str. ValueError: n < 1, or fuzzy_threshold outside (0, 1].
    """
    texts: list[str] = []
    owner: list[int] = []
    for i, row in enumerate(rows):
        for t in dict.fromkeys([row_text(row), *row_turns(row)]):
            texts.append(t)
            owner.append(i)
    flat = check(texts, suites, n=n, fuzzy_threshold=fuzzy_threshold)

    def rank(o: Overlap) -> tuple[int, int, float]:
        return (-KINDS.index(o.match), o.shared_ngrams, o.similarity)

    best: dict[tuple[int, str, int], Overlap] = {}
    for o in flat.overlaps:
        key = (owner[o.train_index], o.suite, o.suite_index)
        mine = Overlap(key[0], o.suite, o.suite_index, o.match, o.shared_ngrams, o.suite_prompt, o.similarity)
        have = best.get(key)
        if have is None or rank(mine) > rank(have):
            best[key] = mine
    return _report([best[k] for k in sorted(best)], len(rows), suites, n, fuzzy_threshold)


def suites_from_generations(path: str | Path) -> dict[str, list[str]]:
    """The prompts a round's gates actually sent, per suite, from ``runs/<r>/gates/generations.jsonl`` (rows with
    ``suite`` and ``prompt``: a str, or a list of chat messages whose user turns are joined as in
    :func:`suites_from_gates_recipe`).

    Raises:
        FileNotFoundError: no file. ValueError: a line that is not a JSON object with ``suite`` and ``prompt``
            (file and line named).
    """
    import json

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{path}: no gate generations to decontaminate against")
    out: dict[str, list[str]] = {}
    for i, line in enumerate(p.read_text().splitlines()):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            suite, prompt = row["suite"], row["prompt"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise ValueError(f"{path} line {i}: not a JSON object with 'suite' and 'prompt' ({err})") from None
        if isinstance(prompt, list):
            prompt = "\n".join(m.get("content", "") for m in prompt if isinstance(m, dict) and m.get("role") == "user")
        out.setdefault(str(suite), []).append(str(prompt))
    return out


def suites_from_gates_recipe(path: str | Path) -> dict[str, list[str]]:
    """The gate suites' prompts a gates recipe names: ``{"winrate": [...], "safe": [...], ...}``.

    Every prompt of each suite file is used (a superset of the ones the gates sample), each with its
    whole conversation when the row is multi-turn.

    Raises:
        FileNotFoundError: no recipe at ``path``. ValueError: a suite file that does not load (named).
    """
    import yaml

    from data.loaders import load_eval_prompts

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{path}: no gates recipe to decontaminate against")
    cfg = yaml.safe_load(p.read_text()) or {}
    out: dict[str, list[str]] = {}
    for key in SUITE_KEYS:
        source = cfg.get(key)
        if not source:
            continue
        try:
            prompts = load_eval_prompts(source, set_name=SUITE_SETS.get(key))
        except (ValueError, FileNotFoundError) as err:
            raise ValueError(f"{path}: {key} = {source}: {err}") from None
        out[key.removesuffix("_data")] = [
            "\n".join(m["content"] for m in q.meta["messages"] if m.get("role") == "user")
            if q.meta.get("messages") else q.prompt
            for q in prompts
        ]
    return out


def decontaminate(
    rows: list,
    suites: Mapping[str, Sequence[str]],
    *,
    mode: str = "remove",
    n: int = DEFAULT_N,
    label: str = "train_data",
    per_turn: bool = False,
    fuzzy_threshold: float = FUZZY_THRESHOLD,
) -> tuple[list, dict[str, Any]]:
    """Check ``rows`` against ``suites`` and apply ``mode``; returns (rows to train on, manifest record).

    ``per_turn=True`` checks each row with :func:`check_per_turn` (joined user turns and each user turn alone);
    the record then has ``"per_turn": True``. The default checks the joined user turns (:func:`check`).

    mode "remove": overlapping rows are dropped (listed in the record); "fail": raise if any overlaps;
    "off": nothing removed, overlaps still reported (nothing trains on contaminated data unseen).

    The record: ``mode``, ``n``, ``fuzzy_threshold``, ``n_train``, ``suites`` (prompts per suite), ``seen``
    (suite prompts that overlap a training row, per suite), ``removed`` (training rows dropped),
    ``kept_overlapping`` (rows that overlap and were trained on: non-zero only with "off"), ``by_kind`` (overlaps
    per match kind) and ``overlaps`` (each with the row id and its ``match`` kind).

    Raises:
        ValueError: unknown mode, or mode "fail" and an overlap, naming the rows and suites.
    """
    if mode not in MODES:
        raise ValueError(f"decontaminate must be one of {MODES}, got {mode!r}")
    if per_turn:
        report = check_per_turn(rows, suites, n=n, fuzzy_threshold=fuzzy_threshold)
    else:
        report = check([row_text(r) for r in rows], suites, n=n, fuzzy_threshold=fuzzy_threshold)
    ids = [getattr(r, "id", str(i)) for i, r in enumerate(rows)]
    overlaps = [{**asdict(o), "train_id": ids[o.train_index]} for o in report.overlaps]
    bad = set(report.contaminated_rows)
    if bad and mode == "fail":
        first = report.overlaps[0]
        raise ValueError(
            f"{label}: {len(bad)} training rows overlap gate suites (decontaminate: fail); first: row "
            f"{first.train_index} (id {ids[first.train_index]}) matches {first.suite}[{first.suite_index}] "
            f"({first.match}): {first.suite_prompt[:80]!r}"
        )
    kept = rows if mode == "off" else [r for i, r in enumerate(rows) if i not in bad]
    record = {
        "mode": mode,
        "n": report.n,
        "fuzzy_threshold": report.fuzzy_threshold,
        "n_train": report.n_train,
        "suites": report.suites,
        "seen": report.seen,
        "removed": 0 if mode == "off" else len(bad),
        "kept_overlapping": len(bad) if mode == "off" else 0,
        "by_kind": report.by_kind,
        "overlaps": overlaps,
    }
    if per_turn:
        record["per_turn"] = True
    return kept, record


def decontaminate_stage_rows(rows: list, gates_recipe: str, mode: str, *, label: str, log=None) -> dict[str, Any]:
    """What a training stage calls before it trains: check ``rows`` in place against the gate suites of
    ``gates_recipe`` and apply ``mode`` (see :func:`decontaminate`); returns the manifest record.

    With no ``gates_recipe`` nothing is checked and the record says so (``"checked": False``), so a gate
    report reading it states "not checked" rather than "clean".

    Raises:
        ValueError: as :func:`decontaminate`, a suite file that does not load, and every row removed (nothing
            left to train on).
    """
    if not gates_recipe:
        return {"checked": False, "mode": mode, "why": "no gates recipe given (decontaminate_against)"}
    kept, record = decontaminate(list(rows), suites_from_gates_recipe(gates_recipe), mode=mode, label=label)
    if rows and not kept:  # a trainer handed no rows fails deep inside with StopIteration; say why here
        raise ValueError(
            f"{label}: all {len(rows)} training rows overlap the gate suites of {gates_recipe} and were removed "
            f"(decontaminate={mode}); nothing is left to train on (raise max_train_samples or use other data)"
        )
    rows[:] = kept
    record = {"checked": True, "against": str(gates_recipe), **record}
    if log is not None:
        log(f"decontamination ({mode}) of {label} against {gates_recipe}: {record['n_train']} rows, "
            f"{len({o['train_index'] for o in record['overlaps']})} overlap gate suites "
            f"(seen per suite: {record['seen']}); removed {record['removed']}")
    return record


def seen_in_training(records: Mapping[str, Mapping[str, Any] | None], suites: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Per suite, whether any of its prompts was seen in training, from the training stages' manifest records.

    Args:
        records: stage name -> its ``outputs.decontamination`` record (None: the stage has none).
        suites: the gate suites to state.

    Returns:
        suite -> ``{"seen": True | False | None, "why": str}``: True when a stage trained on an overlapping row
        (mode "off"), None when some stage has no record or did not check that suite (unknown), else False
        (the why names the rows removed before training).
    """
    out: dict[str, dict[str, Any]] = {}
    for suite in suites:
        trained, removed, unknown = [], [], []
        for stage, rec in records.items():
            if not rec or suite not in rec.get("suites", {}):
                unknown.append(stage)
                continue
            rows = {o["train_index"] for o in rec.get("overlaps", []) if o["suite"] == suite}
            if rows and rec.get("mode") == "off":
                trained.append(f"{stage} ({len(rows)} rows)")
            elif rows:
                removed.append(f"{stage} removed {len(rows)} rows")
        if trained:
            out[suite] = {"seen": True, "why": "trained on overlapping rows: " + ", ".join(trained)}
        elif unknown:
            out[suite] = {"seen": None, "why": "not checked by: " + ", ".join(unknown)}
        else:
            why = "; ".join(removed) + " before training" if removed else "no overlap in " + ", ".join(records)
            out[suite] = {"seen": False, "why": why}
    return out
