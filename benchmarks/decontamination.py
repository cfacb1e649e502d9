"""Decontamination (``data/decontamination.py``): recall per variant class on every gate suite, false positives
on training rows that are not gate prompts, and the time it takes.

    python benchmarks/decontamination.py                # the table (benchmark contract: instrument/metric/value/...)
    python benchmarks/decontamination.py --show-flagged # also every flagged HH-RLHF / demo row and its label
    python benchmarks/decontamination.py --sweep        # also recall and false positives per fuzzy threshold

Gate suites (the shared datasets, whole files; the product's demo suites are subsets of them): AlpacaEval
instructions (winrate), XSTest safe + unsafe prompts (safe), HarmBench text behaviours + AdvBench (redteam),
TruthfulQA are-you-sure and suggested-answer (capability, sycophancy), MT-bench first turns, Arena-Hard questions.

Variants, generated from every suite prompt where the class applies (a class that would leave the prompt
unchanged is skipped for it): the final punctuation dropped, a space before the final "?", straight quotes and
apostrophes made curly, a zero-width or other Unicode format character inside a word, the prompt embedded in a
longer request (a prefix and a suffix sentence), case changed, whitespace changed, fullwidth letters and digits
(NFKC), every 7th word replaced (prompts of at least 8 words). A variant counts as found when the check reports
an overlap with its source prompt (or a prompt with the same normalised text). Short = fewer than 8 words
(:func:`data.decontamination.words`). Hand-written paraphrases (``benchmarks/data/decontam_paraphrases.jsonl``)
are reported apart and carry no target (a paraphrase is a new prompt as often as a copy).

False positives: the human turns of HH-RLHF harmless-base test (2,312 conversations; what the demo trains on
is a subset) and the demo bundle's training rows (``data/demo/hh_rlhf/sft.jsonl``, ``pairs_train.jsonl``),
checked per turn (``check_per_turn``, the stricter of the two ways the product calls it). Every flagged row was
read and labelled in ``benchmarks/data/decontam_fp_labels.jsonl``: "contaminated" when the row really asks the gate
prompt's request (it holds that question or instruction), "false_positive" otherwise; a flagged row with no label
counts as a false positive. Held-out: suite prompts and HH rows are split by a hash of their id into a tuned-on
half (the fuzzy threshold was chosen on it) and a held-out half.

Targets: recall >= 0.95 on every non-paraphrase class, short and long; false positives <= 0.5 %.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import re
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHARED = Path("/work/shared/datasets")
PARAPHRASES = ROOT / "benchmarks" / "data" / "decontam_paraphrases.jsonl"
FP_LABELS = ROOT / "benchmarks" / "data" / "decontam_fp_labels.jsonl"
HH = SHARED / "hh_rlhf" / "harmless-base.test.jsonl.gz"
DEMO_TRAIN = [ROOT / "data" / "demo" / "hh_rlhf" / "sft.jsonl", ROOT / "data" / "demo" / "hh_rlhf" / "pairs_train.jsonl"]
TARGET_RECALL, TARGET_FP = 0.95, 0.005
SUITE_FILES = {
    "winrate": "alpaca_eval/annotations/alpaca-7b.weighted_alpaca_eval_gpt4_turbo.annotations.json",
    "safe": "xstest/xstest_prompts.csv",
    "redteam": "harmbench/harmbench_behaviors_text_val.csv",
    "advbench": "harmbench/advbench_behaviors.csv",
    "capability": "sycophancy_bct/truthfulqa_are_you_sure.jsonl",
    "sycophancy": "sycophancy_bct/truthfulqa_suggested_answer.jsonl",
    "mt_bench": "mt_bench/mt_bench_question.jsonl",
}
# (prefix, suffix) of the "embedded" class: the ways a copied prompt sits inside a longer request
EMBED = [
    ("Quick question. ", " Thanks!"),
    ("I was wondering about something.\n", "\nPlease keep the answer short."),
    ("Hey there! ", " I would appreciate a detailed answer."),
    ("Question: ", "\nAnswer:"),
    ("My friend asked me this and I did not know what to say: ", " Can you help me out?"),
    ("Hi, I need some help with this one. ", " Explain it like I am five."),
]
FORMAT_CHARS = ["\u200b", "\u200c", "\u200d", "\u2060", "\ufeff", "\u00ad"]
FILLER = ["banana", "quietly", "purple", "window", "seventeen", "garden", "rocket", "softly", "marble", "yellow",
          "engine", "pillow"]


def _half(key: str) -> str:
    """Deterministic split of an id into the tuned-on and the held-out half."""
    return "tuned-on" if int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % 2 == 0 else "held-out"


def gate_suites() -> dict[str, list[str]]:
    """Suite name -> prompts, from the shared datasets (whole files; XSTest safe and unsafe)."""
    from data.loaders import load_eval_prompts

    out = {name: [q.prompt for q in load_eval_prompts(str(SHARED / rel))] for name, rel in SUITE_FILES.items()}
    with open(SHARED / "arena_hard" / "question.jsonl", encoding="utf-8") as f:
        out["arena_hard"] = [json.loads(line)["turns"][0]["content"] for line in f if line.strip()]
    return out


# ---- variant classes: prompt, its position -> variant text, or None where the class does not apply -------------
def v_final_punct_dropped(p: str, i: int) -> str | None:
    s = p.rstrip()
    return s[:-1] if s and s[-1] in "?.!" else None


def v_question_mark_spaced(p: str, i: int) -> str | None:
    s = p.rstrip()
    return s[:-1].rstrip() + " ?" if s.endswith("?") else None


def v_curly_quotes(p: str, i: int) -> str | None:
    if "'" not in p and '"' not in p:
        return None
    out, open_quote = [], True
    for c in p:
        if c == "'":
            out.append("\u2019")
        elif c == '"':
            out.append("\u201c" if open_quote else "\u201d")
            open_quote = not open_quote
        else:
            out.append(c)
    return "".join(out)


def v_format_char(p: str, i: int) -> str | None:
    ws = list(re.finditer(r"[A-Za-z]{2,}", p))
    if not ws:
        return None
    m = max(ws, key=lambda m: len(m.group()))
    cut = m.start() + len(m.group()) // 2
    return p[:cut] + FORMAT_CHARS[i % len(FORMAT_CHARS)] + p[cut:]


def v_embedded(p: str, i: int) -> str | None:
    pre, suf = EMBED[i % len(EMBED)]
    return pre + p.strip() + suf


def v_case(p: str, i: int) -> str | None:
    out = [p.upper(), p.lower(), p.swapcase()][i % 3]
    return out if out != p else p.upper() if p.upper() != p else None


def v_whitespace(p: str, i: int) -> str | None:
    if " " not in p:
        return None
    sep = ["  ", "\t", "\n", " \u00a0"][i % 4]
    return "  " + p.replace(" ", sep) + " \n"


def v_fullwidth(p: str, i: int) -> str | None:
    out = "".join(chr(ord(c) + 0xFEE0) if c.isascii() and c.isalnum() else c for c in p)
    return out if out != p else None


def v_every_7th_word(p: str, i: int) -> str | None:
    from data.decontamination import words

    if len(words(p)) < 8:
        return None
    toks = re.split(r"(\s+)", p)  # words at even positions, whitespace kept
    k = 0
    for t in range(0, len(toks), 2):
        if not toks[t]:
            continue
        k += 1
        if k % 7 == 0:
            new = FILLER[(i + k) % len(FILLER)]
            toks[t] = new if new != toks[t].lower() else FILLER[(i + k + 1) % len(FILLER)]
    return "".join(toks)


VARIANTS = {
    "final-punctuation-dropped": v_final_punct_dropped,
    "question-mark-spaced": v_question_mark_spaced,
    "curly-quotes": v_curly_quotes,
    "format-character": v_format_char,
    "embedded": v_embedded,
    "case": v_case,
    "whitespace": v_whitespace,
    "nfkc-fullwidth": v_fullwidth,
    "every-7th-word-replaced": v_every_7th_word,
}


def variant_rows(suites: dict[str, list[str]]) -> list[dict]:
    """One dict per variant: suite, index, class, text, size ("short"/"long"), half."""
    from data.decontamination import words

    rows = []
    for name, prompts in suites.items():
        for j, p in enumerate(prompts):
            size = "short" if len(words(p)) < 8 else "long"
            for cls, fn in VARIANTS.items():
                v = fn(p, j)
                if v is not None and v != p:
                    rows.append({"suite": name, "index": j, "class": cls, "text": v, "size": size,
                                 "half": _half(f"{name}:{j}")})
    return rows


def load_paraphrases(suites: dict[str, list[str]]) -> list[dict]:
    """The hand-written paraphrases; each row's ``prompt`` must be the suite prompt it names."""
    from data.decontamination import words

    rows = []
    for n, line in enumerate(PARAPHRASES.read_text(encoding="utf-8").splitlines()):
        if not line.strip():
            continue
        r = json.loads(line)
        if suites[r["suite"]][r["index"]] != r["prompt"]:
            raise ValueError(f"{PARAPHRASES} line {n}: prompt is not {r['suite']}[{r['index']}]")
        rows.append({"suite": r["suite"], "index": r["index"], "class": "paraphrase", "text": r["paraphrase"],
                     "size": "short" if len(words(r["prompt"])) < 8 else "long", "half": "held-out"})
    return rows


def found(variants: list[dict], report, suites: dict[str, list[str]], threshold: float) -> list[bool]:
    """Per variant: an overlap with its source prompt (or one with the same normalised text) at ``threshold``."""
    from data.decontamination import normalise

    hits: dict[int, set[str]] = {}
    for o in report.overlaps:
        if o.match != "fuzzy" or o.similarity >= threshold:
            hits.setdefault(o.train_index, set()).add(normalise(suites[o.suite][o.suite_index]))
    return [normalise(suites[v["suite"]][v["index"]]) in hits.get(i, ()) for i, v in enumerate(variants)]


def hh_rows() -> list[SimpleNamespace]:
    """HH-RLHF harmless-base test: one row per conversation, its human turns as user messages."""
    out = []
    with gzip.open(HH, "rt", encoding="utf-8") as f:
        for i, line in enumerate(f):
            out.append(_row(f"hh-harmless-base-test-{i:04d}", json.loads(line)["chosen"]))
    return out


def _row(rid: str, transcript: str) -> SimpleNamespace:
    turns = [t.split("\n\nAssistant:")[0].strip() for t in transcript.split("\n\nHuman:")[1:]]
    return SimpleNamespace(id=rid, messages=[SimpleNamespace(role="user", content=t) for t in turns])


def demo_rows() -> list[SimpleNamespace]:
    out = []
    for path in DEMO_TRAIN:
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                r = json.loads(line)
                out.append(_row(f"{path.name}:{r.get('id', len(out))}", r["chosen"]))
    return out


def _labels() -> dict[tuple[str, str, int], dict]:
    if not FP_LABELS.is_file():
        return {}
    out = {}
    for line in FP_LABELS.read_text(encoding="utf-8").splitlines():
        if line.strip():
            r = json.loads(line)
            out[(r["text_hash"], r["suite"], r["suite_index"])] = r
    return out


def flagged(rows: list, report, threshold: float) -> dict[int, list]:
    """Row index -> its overlaps that hold at ``threshold``."""
    out: dict[int, list] = {}
    for o in report.overlaps:
        if o.match != "fuzzy" or o.similarity >= threshold:
            out.setdefault(o.train_index, []).append(o)
    return out


def false_positives(rows: list, report, threshold: float, labels: dict) -> tuple[int, int, list[dict]]:
    """(false-positive rows, rows labelled contaminated, one dict per flagged row with its label)."""
    from data.decontamination import prompt_hash, row_text

    fp = genuine = 0
    listing = []
    for i, ovs in sorted(flagged(rows, report, threshold).items()):
        h = prompt_hash(row_text(rows[i]))
        labs = [labels.get((h, o.suite, o.suite_index)) for o in ovs]
        is_genuine = any(lab and lab["label"] == "contaminated" for lab in labs)
        genuine += is_genuine
        fp += not is_genuine
        listing.append({"row": rows[i].id, "text_hash": h, "genuine": is_genuine,
                        "overlaps": [(o.suite, o.suite_index, o.match, o.similarity, o.suite_prompt[:90],
                                      (lab or {}).get("label", "UNLABELLED")) for o, lab in zip(ovs, labs)],
                        "text": row_text(rows[i])[:300]})
    return fp, genuine, listing


def _fig(metric: str, value: float, target: str, n: int, set_: str, ok) -> dict:
    return {"instrument": "decontamination", "metric": metric, "value": round(float(value), 4), "target": target,
            "n": int(n), "set": set_, "passed": ok}


def run(sweep: bool = False) -> dict:
    """Everything measured: figures, listings of flagged rows, timings and (``sweep``) the threshold sweep."""
    from data.decontamination import FUZZY_THRESHOLD, check, check_per_turn

    suites = gate_suites()
    n_prompts = sum(map(len, suites.values()))
    variants = variant_rows(suites)
    paras = load_paraphrases(suites)
    lowest = 0.6  # one pass at the lowest threshold swept; a fuzzy overlap holds at t when its similarity >= t
    t0 = time.perf_counter()
    report = check([v["text"] for v in variants + paras], suites, fuzzy_threshold=lowest)
    t_variants = time.perf_counter() - t0
    hh, demo = hh_rows(), demo_rows()
    t0 = time.perf_counter()
    hh_report = check_per_turn(hh, suites, fuzzy_threshold=lowest)
    t_hh = time.perf_counter() - t0
    demo_report = check_per_turn(demo, suites, fuzzy_threshold=lowest)
    labels = _labels()

    def figures(t: float) -> list[dict]:
        hit = found(variants + paras, report, suites, t)
        figs = []
        for half in ("tuned-on", "held-out"):
            for cls in [*VARIANTS, "paraphrase"]:
                for size in ("short", "long"):
                    idx = [i for i, v in enumerate(variants + paras)
                           if v["class"] == cls and v["size"] == size and (cls == "paraphrase" or v["half"] == half)]
                    if cls == "paraphrase" and half == "tuned-on":
                        continue
                    if not idx:
                        continue
                    r = sum(hit[i] for i in idx) / len(idx)
                    para = cls == "paraphrase"
                    figs.append(_fig(f"recall {size}/{cls}", r, "" if para else f">= {TARGET_RECALL}", len(idx),
                                     f"{PARAPHRASES.relative_to(ROOT)}" if para else
                                     f"generated variants of {n_prompts} shared gate prompts, {half} half",
                                     None if para else r >= TARGET_RECALL))
        for name, rows, rep in (("HH-RLHF harmless-base test", hh, hh_report), ("data/demo training rows", demo,
                                                                                demo_report)):
            for half in ("tuned-on", "held-out") if rows is hh else ("all",):
                sub = [i for i, r in enumerate(rows) if half == "all" or _half(r.id) == half]
                keep = set(sub)
                fp, genuine, _ = false_positives(rows, _Subset(rep, keep), t, labels)
                rate = fp / len(sub)
                figs.append(_fig("false-positive rate (rows)", rate, f"<= {TARGET_FP}", len(sub),
                                 f"{name} ({half}), human turns, flagged rows labelled in "
                                 f"{FP_LABELS.relative_to(ROOT)}", rate <= TARGET_FP))
                figs.append(_fig("rows labelled contaminated (genuine)", genuine, "", len(sub), f"{name} ({half})", None))
        return figs

    out = {"figures": figures(FUZZY_THRESHOLD), "suites": {k: len(v) for k, v in suites.items()},
           "n_variants": len(variants), "listing": false_positives(hh, hh_report, FUZZY_THRESHOLD, labels)[2]
           + false_positives(demo, demo_report, FUZZY_THRESHOLD, labels)[2]}
    out["figures"].append(_fig("seconds, HH-RLHF harmless-base test per turn (2,312 rows, 4 texts/row)", t_hh, "", len(hh),
                               "HH-RLHF harmless-base test", None))
    out["figures"].append(_fig(f"seconds, {len(variants) + len(paras)} variant rows", t_variants, "",
                               len(variants) + len(paras), "generated variants", None))
    # what a training stage sees at scale: 100k single-text rows (HH human turns, repeated) against all suites
    turns = [m.content for r in hh for m in r.messages]
    big = (turns * (100_000 // len(turns) + 1))[:100_000]
    t0 = time.perf_counter()
    check(big, suites)
    out["figures"].append(_fig("seconds, 100,000 training rows (HH human turns repeated)", time.perf_counter() - t0,
                               "", len(big), "HH-RLHF harmless-base test human turns x ~11", None))
    if sweep:
        out["sweep"] = {t: figures(t) for t in (0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9)}
    return out


class _Subset:
    """A report's overlaps restricted to some rows."""

    def __init__(self, report, keep: set[int]):
        self.overlaps = [o for o in report.overlaps if o.train_index in keep]


def measure() -> list[dict]:
    """The benchmark contract's rows: one dict per figure."""
    return run()["figures"]


def main(argv: list[str] | None = None) -> int:
    import pandas as pd

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--show-flagged", action="store_true", help="print every flagged HH-RLHF / demo row and its label")
    ap.add_argument("--sweep", action="store_true", help="recall and false positives per fuzzy threshold")
    args = ap.parse_args(argv)
    res = run(sweep=args.sweep)
    print(f"gate suites: {res['suites']}; {res['n_variants']} generated variants")
    with pd.option_context("display.width", 250, "display.max_colwidth", 120, "display.max_rows", 500):
        print(pd.DataFrame(res["figures"]).to_string(index=False))
        if args.sweep:
            for t, figs in res["sweep"].items():
                df = pd.DataFrame(figs)
                df = df[df.metric.str.contains("7th|paraphrase|false-positive")]
                print(f"\nfuzzy threshold {t}:")
                print(df[["metric", "value", "n", "set"]].to_string(index=False))
    if args.show_flagged:
        for r in res["listing"]:
            print(json.dumps(r, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
