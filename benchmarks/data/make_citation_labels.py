"""How the answers in ``citation_labels.jsonl`` were chosen (the labels themselves were written by hand, by reading).

    python benchmarks/data/make_citation_labels.py           # re-draw the selection, check it against the file
    python benchmarks/data/make_citation_labels.py --list    # also print id, split and stratum of each answer

Pool: every model answer in the shared datasets: AlpacaEval 2 annotations (``output_2`` of each of the three models;
``output_1``, the gpt4_1106_preview baseline, once, from the alpaca-7b file) and Arena-Hard's two model-answer files:
4,220 answers. Strata, drawn in this order without repeats (seeded): answers matching "et al", "according to",
"study", "(19xx"/"(20xx", "experts/researchers/scientists", "journal / published in", "survey / statistic", URLs in
prose, URLs in code, and 50 at random; then, so that positives are well represented, every remaining answer caught
by three wider attribution nets (``_NETS``). Held-out: 72 of the first 254 at random, then 3 in 10 of each net's
answers. Each answer was then read and labelled (``c03``, ``kind``, ``reason``, ``emitted_urls``) before C03 was
rebuilt; the held-out answers were not looked at while tuning.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATASETS = Path(os.environ.get("RLHF_SHARED_DATASETS", "/work/shared/datasets"))
OUT = ROOT / "benchmarks" / "data" / "citation_labels.jsonl"

_STRATA = [("etal", r"et al", 24), ("according", r"according to", 40), ("study", r"\bstud(y|ies)\b", 40),
           ("year_paren", r"\((19|20)\d\d", 30), ("experts", r"\b(experts|researchers|scientists)\b", 15),
           ("journal", r"\bjournal\b|published in", 10), ("survey", r"\bsurvey|\bstatistic", 10),
           ("http_prose", r"https?://", 20), ("http_code", r"```[\s\S]*https?://|`[^`\n]*https?://", 20),
           ("random", r"", 50)]
_NETS = [
    ("attribution_net", 2121, re.compile(
        r"\b(studies|research|surveys?|reports?|data|statistics|evidence|experts|scientists|researchers|doctors"
        r"|economists|analysts|critics)\b[^.\n]{0,40}\b(show|shows|shown|suggests?|found|finds|indicates?|estimates?"
        r"|recommends?|say|says|agree|believe|revealed|confirm)|according to (a|an|the|some|recent|several|many|data"
        r"|estimates|experts|researchers|scientists|statistics)? ?[A-Z(]|\bet al\b|\([A-Z][a-z]+(,| et al\.?,?| and"
        r" [A-Z][a-z]+,) (19|20)\d\d\)|published in|Journal of|\b(WHO|CDC|NIH|FDA|UN|OECD|IMF|World Bank|Pew|Gallup"
        r"|Harvard|Stanford)\b[^.\n]{0,30}(report|found|estimat|recommend|stud|survey|say|state)", re.I)),
    ("source_net", 2122, re.compile(
        r"\bstud(y|ies) (by|from|conducted|published|at)\b|\b(data|figures|statistics|estimates) (from|by|of) (the )?"
        r"[A-Z]|\b(as reported|reported by|as stated|as noted by|cited by|per the|according to) (by )?(the )?[A-Z]"
        r"|\b(University of|Institute of|Harvard|Stanford|MIT|Mayo Clinic|World Health|Centers for Disease|Pew|Gallup"
        r"|Nielsen|Statista|McKinsey|Deloitte|Gartner|Forrester)\b|\b(it is|it's|has been) estimated\b|\bestimates "
        r"suggest\b|\bestimated by\b|\b(experts|doctors|nutritionists|scientists|researchers|psychologists|economists"
        r"|health professionals|dentists|dermatologists) (say|recommend|agree|believe|suggest|warn|advise|estimate)"
        r"|\bresearch (has|shows|suggests|indicates|found|finds|demonstrates)|\b(survey|poll|report|study|studies"
        r"|analysis|meta-analysis)\b[^.\n]{0,60}\b(found|showed|shows|revealed|suggests|indicated|reported)\b"
        r"|\b[A-Z][a-z]+(?: and [A-Z][a-z]+)? \((19|20)\d\d\)|\b[A-Z][a-z]+, [A-Z]\.|\bin (his|her|their) (book"
        r"|paper|study)|\bIn (his|her|their) (\d{4} )?(book|paper|study)")),
    ("authority_net", 2123, re.compile(
        r"\b(scholars|historians|academics|analysts|observers|economists|physicians|nutritionists|psychologists"
        r"|health experts|medical experts|many experts|some experts)\b|\b(has|have) been shown\b|\bclinical trials?\b"
        r"|\breportedly\b|\bit has been (found|shown|reported)\b|\b(a|one|another|recent|new) (survey|poll|report"
        r"|analysis|review|paper)\b|\bstudies\b|\bresearch (has|have|shows?|suggests?|indicates?)|\bevidence "
        r"(suggests|shows|indicates)\b|\baccording to (some|many|most|several|recent|a|an|the [A-Z])", re.I)),
]


def pool(datasets: Path = DATASETS) -> list[dict]:
    """Every answer: id, source (path under the datasets folder), ref (row or question id), model, prompt, text."""
    rows = []
    for f in sorted(glob.glob(str(datasets / "alpaca_eval" / "annotations" / "*.json"))):
        rel = os.path.relpath(f, datasets)
        for i, r in enumerate(json.loads(Path(f).read_text())):
            rows.append({"id": f"{rel}#{i}:output_2", "source": rel, "ref": f"row {i} output_2",
                         "model": r["generator_2"], "prompt": r["instruction"], "text": r["output_2"]})
            if "alpaca-7b" in f:  # output_1 is the same baseline answer in every file
                rows.append({"id": f"{rel}#{i}:output_1", "source": rel, "ref": f"row {i} output_1",
                             "model": r["generator_1"], "prompt": r["instruction"], "text": r["output_1"]})
    questions = {}
    for line in (datasets / "arena_hard" / "question.jsonl").read_text().splitlines():
        q = json.loads(line)
        questions[q["question_id"]] = q["turns"][0]["content"]
    for f in sorted(glob.glob(str(datasets / "arena_hard" / "model_answer" / "*.jsonl"))):
        rel = os.path.relpath(f, datasets)
        for line in Path(f).read_text().splitlines():
            a = json.loads(line)
            rows.append({"id": f"{rel}#{a['question_id']}", "source": rel, "ref": f"question_id {a['question_id']}",
                         "model": a["model_id"], "prompt": questions[a["question_id"]],
                         "text": a["choices"][0]["turns"][0]["content"]})
    return rows


def select(rows: list[dict]) -> list[dict]:
    """The drawn answers, in file order, each with ``stratum`` and ``split``."""
    rng = random.Random(21)
    chosen: dict[str, dict] = {}
    for name, pat, k in _STRATA:
        cand = [r for r in rows if r["id"] not in chosen and (not pat or re.search(pat, r["text"], re.I))]
        if name == "http_prose":
            cand = [r for r in cand if "```" not in r["text"]]
        rng.shuffle(cand)
        for r in cand[:k]:
            chosen[r["id"]] = {**r, "stratum": name}
    sel = list(chosen.values())
    ids = [r["id"] for r in sel]
    rng.shuffle(ids)
    held = set(ids[:72])
    for r in sel:
        r["split"] = "held_out" if r["id"] in held else "tuned"
    for name, seed, net in _NETS:
        taken = {r["id"] for r in sel}
        new = [r for r in rows if r["id"] not in taken and net.search(r["text"])]
        random.Random(seed).shuffle(new)
        sel += [{**r, "stratum": name, "split": "held_out" if i % 10 < 3 else "tuned"} for i, r in enumerate(new)]
    return sel


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args(argv)
    sel = select(pool())
    labelled = [json.loads(line) for line in OUT.read_text(encoding="utf-8").splitlines()]
    drawn = [(r["id"], r["split"], r["stratum"]) for r in sel]
    stored = [(r["id"], r["split"], r["stratum"]) for r in labelled]
    if args.list:
        for d in drawn:
            print(*d, sep="\t")
    print(f"{len(drawn)} drawn, {len(stored)} in {OUT.name}: {'same' if drawn == stored else 'DIFFERENT'}")
    return 0 if drawn == stored else 1


if __name__ == "__main__":
    sys.exit(main())
