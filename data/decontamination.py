"""Decontamination: is a training prompt one of the evaluation (gate) prompts, or does it share a long run of words?

Evaluation scores are inflated when the model trained on the test items (training/eval contamination;
GPT-3, Brown et al. 2020, appendix C; PaLM, Chowdhery et al. 2022, section 8). Before SFT, DPO and the
reward model train, their prompts are checked against every gate suite of the round (DESIGN.md: "Training
data is decontaminated against every gate suite ... before a stage trains").

API (small on purpose; other stages and tools reuse it):

* :func:`normalise` - NFKC, lower case, whitespace collapsed to one space, stripped.
* :func:`prompt_hash` - SHA-256 of the normalised text: equal hashes = the same prompt up to case and spacing.
* :func:`word_ngrams` - the set of word n-grams of the normalised text (words = ``\\w+`` runs).
* :func:`check` - ``check(train_prompts, suites) -> DecontaminationReport``: every (training row, suite prompt)
  pair that matches by hash or shares a word n-gram.
* :func:`suites_from_gates_recipe` - the gate suites' prompts named by a gates recipe (``*_data`` keys).
* :func:`check_per_turn` - as :func:`check`, but each row is also checked turn by turn (``decontaminate(...,
  per_turn=True)``): a suite prompt that is one user turn of a multi-turn row is found even though the joined
  turns differ from it.
* :func:`suites_from_generations` - the prompts a round's gates actually sent (``gates/generations.jsonl``).

A training prompt overlaps a suite prompt when (a) their normalised texts are equal (``prompt_hash``), or
(b) they share at least one word n-gram, n = :data:`DEFAULT_N` = 8. GPT-3 used 13-grams and PaLM 8-grams;
we use 8 because the gate prompts are short (XSTest prompts have 6-12 words: a 13-gram could never match
them, and prompts shorter than n words are matched by (a) only). Pass ``n=13`` for GPT-3's rule.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_N = 8
#: Gates-recipe keys whose files are gate suites (traffic shares and intent-classifier training data are not).
SUITE_KEYS: tuple[str, ...] = ("winrate_data", "safe_data", "redteam_data", "capability_data", "sycophancy_data")
#: The set of a suite file the gates use (XSTest holds safe and unsafe prompts; the gates use the safe ones).
SUITE_SETS: dict[str, str] = {"safe_data": "xstest_safe"}
MODES: tuple[str, ...] = ("remove", "fail", "off")
_WS = re.compile(r"\s+")
_WORD = re.compile(r"\w+")


def normalise(text: str) -> str:
    """NFKC-normalised, lower-cased, whitespace runs collapsed to one space, stripped.

    Raises:
        TypeError: text is not a str.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be str, got {type(text).__name__}")
    return _WS.sub(" ", unicodedata.normalize("NFKC", text).lower()).strip()


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
    words = _WORD.findall(normalise(text))
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


@dataclass(frozen=True)
class Overlap:
    """One training row that overlaps one suite prompt.

    Fields:
        train_index: 0-based position in ``train_prompts``.
        suite: suite name.
        suite_index: 0-based position in that suite's prompts.
        match: "exact" (same normalised text) or "ngram" (shares word n-grams).
        shared_ngrams: number of distinct shared n-grams (0 for an exact match of a prompt shorter than n words).
        suite_prompt: the suite prompt (first 200 characters), so a report reader can see it.
    """

    train_index: int
    suite: str
    suite_index: int
    match: str
    shared_ngrams: int
    suite_prompt: str


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
    """

    n: int
    n_train: int
    suites: dict[str, int]
    overlaps: list[Overlap] = field(default_factory=list)
    contaminated_rows: list[int] = field(default_factory=list)
    seen: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (what a stage writes to its manifest under ``outputs.decontamination``)."""
        return asdict(self)


def check(train_prompts: Sequence[str], suites: Mapping[str, Sequence[str]], *, n: int = DEFAULT_N) -> DecontaminationReport:
    """Find training prompts that are, or share a word n-gram with, a prompt of any suite.

    Args:
        train_prompts: shape (n_train,), one text per training row (its user turns joined).
        suites: suite name -> its prompts.
        n: word n-gram length (default 8; see the module docstring).

    Returns:
        :class:`DecontaminationReport`.

    Raises:
        TypeError: a prompt is not a str. ValueError: n < 1.
    """
    by_hash: dict[str, list[tuple[str, int]]] = {}
    by_gram: dict[tuple[str, ...], list[tuple[str, int]]] = {}
    texts: dict[tuple[str, int], str] = {}
    for name, prompts in suites.items():
        for j, p in enumerate(prompts):
            by_hash.setdefault(prompt_hash(p), []).append((name, j))
            for g in word_ngrams(p, n):
                by_gram.setdefault(g, []).append((name, j))
            texts[(name, j)] = p
    overlaps: list[Overlap] = []
    for i, t in enumerate(train_prompts):
        exact = set(by_hash.get(prompt_hash(t), ()))
        shared: dict[tuple[str, int], int] = {}
        for g in word_ngrams(t, n):
            for key in by_gram.get(g, ()):
                shared[key] = shared.get(key, 0) + 1
        for key in sorted(exact | set(shared)):
            overlaps.append(
                Overlap(i, key[0], key[1], "exact" if key in exact else "ngram", shared.get(key, 0), texts[key][:200])
            )
    seen = {name: len({o.suite_index for o in overlaps if o.suite == name}) for name in suites}
    return DecontaminationReport(
        n=n,
        n_train=len(train_prompts),
        suites={name: len(p) for name, p in suites.items()},
        overlaps=overlaps,
        contaminated_rows=sorted({o.train_index for o in overlaps}),
        seen=seen,
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


def check_per_turn(rows: Sequence[Any], suites: Mapping[str, Sequence[str]], *, n: int = DEFAULT_N) -> DecontaminationReport:
    """:func:`check` with each row checked as its joined user turns (:func:`row_text`, what :func:`check` sees)
    AND as each user turn alone (:func:`row_turns`), so a single-turn suite prompt asked inside a multi-turn
    conversation is found by its hash, which the joined text would miss.

    An overlap is reported once per (row, suite prompt): "exact" when any of the row's texts is the same
    normalised text, else "ngram" with the largest number of n-grams one text shares. ``train_index`` and
    ``n_train`` count rows, not turns.

    Raises:
        TypeError: a prompt is not a str. ValueError: n < 1.
    """
    texts: list[str] = []
    owner: list[int] = []
    for i, row in enumerate(rows):
        for t in dict.fromkeys([row_text(row), *row_turns(row)]):
            texts.append(t)
            owner.append(i)
    flat = check(texts, suites, n=n)
    best: dict[tuple[int, str, int], Overlap] = {}
    for o in flat.overlaps:
        key = (owner[o.train_index], o.suite, o.suite_index)
        mine = Overlap(key[0], o.suite, o.suite_index, o.match, o.shared_ngrams, o.suite_prompt)
        have = best.get(key)
        rank = (mine.match == "exact", mine.shared_ngrams)
        if have is None or rank > (have.match == "exact", have.shared_ngrams):
            best[key] = mine
    overlaps = [best[k] for k in sorted(best)]
    return DecontaminationReport(
        n=n,
        n_train=len(rows),
        suites=flat.suites,
        overlaps=overlaps,
        contaminated_rows=sorted({o.train_index for o in overlaps}),
        seen={name: len({o.suite_index for o in overlaps if o.suite == name}) for name in suites},
    )


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
) -> tuple[list, dict[str, Any]]:
    """Check ``rows`` against ``suites`` and apply ``mode``; returns (rows to train on, manifest record).

    ``per_turn=True`` checks each row with :func:`check_per_turn` (joined user turns and each user turn alone);
    the record then has ``"per_turn": True``. The default checks the joined user turns (:func:`check`).

    mode "remove": overlapping rows are dropped (listed in the record); "fail": raise if any overlaps;
    "off": nothing removed, overlaps still reported (nothing trains on contaminated data unseen).

    The record: ``mode``, ``n``, ``n_train``, ``suites`` (prompts per suite), ``seen`` (suite prompts that
    overlap a training row, per suite), ``removed`` (training rows dropped), ``kept_overlapping`` (rows that
    overlap and were trained on: non-zero only with "off") and ``overlaps`` (each with the row id).

    Raises:
        ValueError: unknown mode, or mode "fail" and an overlap, naming the rows and suites.
    """
    if mode not in MODES:
        raise ValueError(f"decontaminate must be one of {MODES}, got {mode!r}")
    report = check_per_turn(rows, suites, n=n) if per_turn else check([row_text(r) for r in rows], suites, n=n)
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
        "n_train": report.n_train,
        "suites": report.suites,
        "seen": report.seen,
        "removed": 0 if mode == "off" else len(bad),
        "kept_overlapping": len(bad) if mode == "off" else 0,
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
