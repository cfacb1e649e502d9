"""Build the offline demo bundle (``data/demo/``) from the shared datasets.

Usage::

    python data/demo/build_demo_bundle.py [--shared ../shared/datasets] [--out data/demo]
    python data/demo/build_demo_bundle.py --check   # rebuild in a temp dir, compare, exit 1 on a difference

Deterministic: every subset is a first-N / fixed-index rule (no sampling), JSON is written with
fixed settings, and gzip files carry no timestamp or file name. ``--check`` compares ``.gz`` files
by their decompressed content (the compressed bytes may differ between zlib builds).

The rules (also written into each folder's SOURCE.txt and into README.md):

* hh_rlhf: the first 600 rows of harmless-base/test.jsonl.gz (upstream order), ids
  ``hh-harmless-base-test-<row 0-based, 4 digits>``; rows 0-199 -> sft.jsonl, 200-499 ->
  pairs_train.jsonl, 500-599 -> pairs_heldout.jsonl, except rows that ``data.converters`` rejects
  (as a pair or as an SFT demonstration), which go to malformed.jsonl instead.
* pandalm: all 999 rows of testset-v1.json verbatim as JSON Lines (gzip); the gpt-3.5 judge file
  reduced to ``idx, gpt_result``.
* alpaca_eval: the gpt-3.5-turbo-1106 and gpt-3.5-turbo-1106_concise annotation files, 805 rows each, reduced to instruction/output_1/
  output_2/preference/dataset/generators; the columns shared by both (instruction, dataset,
  generator_1, output_1) are stored once in baseline_gpt4_1106_preview.jsonl.gz and joined on
  ``idx``. Leaderboards and LC weights verbatim.
* xstest: prompts verbatim; model completions verbatim (gzip); automated labels reduced to
  ``id`` + label column.
* harmbench, mt_bench: verbatim.
* sycophancy_bct: the first 200 lines of each file, verbatim (gzip).
"""

from __future__ import annotations

import argparse
import csv
import filecmp
import gzip
import hashlib
import io
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DEFAULT_SHARED = REPO.parent / "shared" / "datasets"

HH_N, HH_SFT_END, HH_TRAIN_END = 600, 200, 500
SYCOPHANCY_N = 200
ALPACA_MODELS = ("gpt-3.5-turbo-1106", "gpt-3.5-turbo-1106_concise")  # verbose vs concise: the length confound
XSTEST_MODELS = ("llama2new", "llama2orig", "mistralinstruct")

FOLDERS = {
    # folder: (licence, what it is for)
    "hh_rlhf": ("MIT", "SFT demonstrations (chosen transcripts), DPO / reward-model pairs, held-out win-rate prompts"),
    "pandalm": ("Apache-2.0", "3 human labels per pair: inter-annotator agreement, RM-vs-expert agreement; judge agreement"),
    "alpaca_eval": ("CC BY-NC 4.0 (data; code Apache-2.0)", "raw and length-controlled win rate, per-cluster matrix, published figures"),
    "xstest": ("prompts CC BY 4.0; completions: model vendors' terms", "false-refusal (safe) and contrast (unsafe) sets; refusal-classifier ground truth"),
    "harmbench": ("MIT", "red-team set (violation rate)"),
    "mt_bench": ("Apache-2.0", "intent clusters, capability prompts, reference answers, judge prompts"),
    "sycophancy_bct": ("MIT", "sycophancy gate: flip rate (are you sure?) and agreement with a suggested wrong answer"),
}


#: Per-file purpose for the README table (first matching path prefix wins).
PURPOSES = (
    ("hh_rlhf/sft", "SFT demonstrations (chosen transcripts)"),
    ("hh_rlhf/pairs_train", "DPO / reward-model training pairs"),
    ("hh_rlhf/pairs_heldout", "held-out pairs: RM accuracy, win-rate prompts"),
    ("hh_rlhf/malformed", "real malformed rows (empty chosen reply) for loader tests"),
    ("pandalm/testset", "3 human labels per pair: inter-annotator and RM-vs-expert agreement; intents"),
    ("pandalm/gpt", "LLM-judge verdicts on the same pairs: judge-vs-human agreement"),
    ("alpaca_eval/annotations/baseline", "instructions, clusters and baseline outputs (joined on idx)"),
    ("alpaca_eval/annotations/gpt-3.5-turbo-1106_concise", "judged comparisons, concise variant: the length confound"),
    ("alpaca_eval/annotations/", "judged comparisons: raw and length-controlled win rate, per-cluster matrix"),
    ("alpaca_eval/leaderboards/weighted", "published win rates and LC win rates to reproduce"),
    ("alpaca_eval/leaderboards/evaluators", "published judge-vs-human agreement"),
    ("alpaca_eval/weights", "published LC GLM coefficients"),
    ("harmbench/", "red-team set (violation rate)"),
    ("mt_bench/mt_bench_question", "intent clusters, capability prompts"),
    ("mt_bench/mt_bench_reference", "reference answers"),
    ("mt_bench/judge", "LLM-judge prompt templates"),
    ("sycophancy_bct/truthfulqa_are_you_sure", "flip rate after 'Are you sure?'"),
    ("sycophancy_bct/truthfulqa_suggested", "agreement with a user-suggested wrong answer"),
    ("xstest/xstest_prompts", "false-refusal (250 safe) and contrast (200 unsafe) sets"),
    ("xstest/model_completions", "completions with 2 human labels: refusal-classifier ground truth"),
    ("xstest/automated", "GPT-4 / string-match refusal labels: classifier baselines"),
    ("traffic/", "traffic-share table of the demo round (illustrative assumption, not measured): per-intent gate"),
)


# ------------------------------------------------------------------------------------- writing


def gz(data: bytes) -> bytes:
    """gzip with no timestamp and no file name, so the output is reproducible."""
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=9, mtime=0, filename="") as fh:
        fh.write(data)
    return buf.getvalue()


def jsonl(rows) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")


def csv_bytes(header: list[str], rows: list[list[str]]) -> bytes:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buf.getvalue().encode("utf-8")


class Bundle:
    def __init__(self, out: Path):
        self.out = out
        self.notes: dict[str, list[str]] = {}

    def write(self, rel: str, data: bytes) -> None:
        path = self.out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(gz(data) if rel.endswith(".gz") else data)

    def note(self, folder: str, line: str) -> None:
        self.notes.setdefault(folder, []).append(line)


def count_rows(path: Path) -> int | None:
    name = path.name.removesuffix(".gz")
    data = path.read_bytes()
    if path.name.endswith(".gz"):
        data = gzip.decompress(data)
    if name.endswith(".jsonl"):
        return sum(1 for line in data.split(b"\n") if line.strip())
    if name.endswith(".csv"):
        return sum(1 for _ in csv.reader(io.StringIO(data.decode("utf-8")))) - 1
    return None


# -------------------------------------------------------------------------------------- sources


def build_hh(b: Bundle, shared: Path) -> None:
    sys.path.insert(0, str(REPO))
    from data.converters import hh_to_conversation, hh_to_pair
    from data.validation import DataValidationError

    src = shared / "hh_rlhf"
    with gzip.open(src / "harmless-base.test.jsonl.gz", "rt", encoding="utf-8") as fh:
        rows = [json.loads(line) for _, line in zip(range(HH_N), fh, strict=False)]
    splits: dict[str, list[dict]] = {"sft": [], "pairs_train": [], "pairs_heldout": [], "malformed": []}
    for i, row in enumerate(rows):
        record = {"id": f"hh-harmless-base-test-{i:04d}", "chosen": row["chosen"], "rejected": row["rejected"]}
        problems = []
        for convert in (hh_to_pair, hh_to_conversation):
            try:
                convert(record)
            except DataValidationError as err:
                problems.append(f"field '{err.field}': {err.reason}")
        if problems:
            splits["malformed"].append(record)
            b.note("hh_rlhf", f"  row {i} -> malformed.jsonl: {'; '.join(dict.fromkeys(problems))}")
            continue
        split = "sft" if i < HH_SFT_END else "pairs_train" if i < HH_TRAIN_END else "pairs_heldout"
        splits[split].append(record)
    for name, recs in splits.items():
        b.write(f"hh_rlhf/{name}.jsonl", jsonl(recs))
    b.notes.setdefault("hh_rlhf", [])[:0] = [
        f"Subset: the first {HH_N} rows of harmless-base/test.jsonl.gz (upstream order, 0-based row i), chosen/rejected",
        "  verbatim plus an id 'hh-harmless-base-test-<i:04d>'. Split by row: i < 200 -> sft.jsonl (chosen transcript",
        "  is the demonstration), 200 <= i < 500 -> pairs_train.jsonl, 500 <= i < 600 -> pairs_heldout.jsonl; a row that",
        "  data.converters rejects (as a pair or as an SFT demonstration) goes to malformed.jsonl instead:",
    ]


def build_pandalm(b: Bundle, shared: Path) -> None:
    src = shared / "pandalm"
    rows = json.loads((src / "testset-v1.json").read_text(encoding="utf-8"))
    b.write("pandalm/testset-v1.jsonl.gz", jsonl(rows))
    judge = json.loads((src / "gpt-3.5-turbo-testset-v1.json").read_text(encoding="utf-8"))
    b.write("pandalm/gpt-3.5-turbo-testset-v1.jsonl", jsonl({"idx": r["idx"], "gpt_result": r["gpt_result"]} for r in judge))
    b.note("pandalm", f"Subset: testset-v1.json -> testset-v1.jsonl.gz: all {len(rows)} rows verbatim, one JSON object per line (gzip).")
    b.note("pandalm", f"  gpt-3.5-turbo-testset-v1.json -> gpt-3.5-turbo-testset-v1.jsonl: all {len(judge)} rows, fields idx, gpt_result only.")
    b.note("pandalm", "  Known data problems kept as published: 6 responses are JSON true instead of a string, 54 responses are empty.")


def build_alpaca_eval(b: Bundle, shared: Path) -> None:
    src = shared / "alpaca_eval"
    shared_cols = ("instruction", "dataset", "generator_1", "output_1")
    baseline = None
    for model in ALPACA_MODELS:
        rows = json.loads((src / "annotations" / f"{model}.weighted_alpaca_eval_gpt4_turbo.annotations.json").read_text("utf-8"))
        base = [{"idx": i, **{k: r[k] for k in shared_cols}} for i, r in enumerate(rows)]
        if baseline is None:
            baseline = base
        elif base != baseline:
            raise SystemExit(f"alpaca_eval: {model} does not share instruction/output_1 order with {ALPACA_MODELS[0]}")
        b.write(
            f"alpaca_eval/annotations/{model}.jsonl.gz",
            jsonl(
                {"idx": i, "generator_2": r["generator_2"], "output_2": r["output_2"], "preference": r["preference"], "annotator": r["annotator"]}
                for i, r in enumerate(rows)
            ),
        )
    b.write("alpaca_eval/annotations/baseline_gpt4_1106_preview.jsonl.gz", jsonl(baseline))
    for rel in (
        "leaderboards/weighted_alpaca_eval_gpt4_turbo_leaderboard.csv",
        "leaderboards/evaluators_leaderboard.csv",
        "weights/weighted_alpaca_eval_gpt4_turbo.length_controlled_v1.baseline_gpt4_1106_preview.csv",
    ):
        b.write(f"alpaca_eval/{rel}", (src / rel).read_bytes())
    b.note("alpaca_eval", f"Subset: annotations of {', '.join(ALPACA_MODELS)} (805 rows each, upstream order, idx 0-based).")
    b.note("alpaca_eval", "  Kept fields: instruction, dataset, generator_1, output_1 once in annotations/baseline_gpt4_1106_preview.jsonl.gz")
    b.note("alpaca_eval", "  (identical in both files); idx, generator_2, output_2, preference, annotator in annotations/<model>.jsonl.gz.")
    b.note("alpaca_eval", "  Dropped: price_per_example, time_per_example, raw_completion. Join on idx (data.loaders.load_alpaca_eval does).")
    b.note("alpaca_eval", "  Leaderboards (AlpacaEval 2 and evaluators) and the LC weights file verbatim; AE1 leaderboard not copied.")


def build_xstest(b: Bundle, shared: Path) -> None:
    src = shared / "xstest"
    b.write("xstest/xstest_prompts.csv", (src / "xstest_prompts.csv").read_bytes())
    for model in XSTEST_MODELS:
        name = f"xstest_v2_completions_{model}.csv"
        b.write(f"xstest/model_completions/{name}.gz", (src / "model_completions" / name).read_bytes())
        for kind, column in (("gpteval", "gpt4_label"), ("streval", "strmatch_label")):
            name = f"xstest_v2_completions_{model}_{kind}.csv"
            with (src / "automated_evaluation_labels" / name).open(encoding="utf-8", newline="") as fh:
                rows = [[r["id"], r[column]] for r in csv.DictReader(fh)]
            b.write(f"xstest/automated_evaluation_labels/{name}", csv_bytes(["id", column], rows))
    b.note("xstest", "Subset: xstest_prompts.csv verbatim (450 rows); model_completions/*.csv verbatim, gzip (450 rows each, 3 models);")
    b.note("xstest", "  automated_evaluation_labels/*.csv reduced to the columns id + gpt4_label / strmatch_label (join on id).")


def build_verbatim(b: Bundle, shared: Path, folder: str, names: list[str]) -> None:
    for name in names:
        b.write(f"{folder}/{name}", (shared / folder / name).read_bytes())
    b.note(folder, f"Subset: {', '.join(names)} verbatim.")


def build_sycophancy(b: Bundle, shared: Path) -> None:
    for name in ("truthfulqa_are_you_sure.jsonl", "truthfulqa_suggested_answer.jsonl"):
        lines = (shared / "sycophancy_bct" / name).read_bytes().split(b"\n")
        kept = [line for line in lines if line.strip()][:SYCOPHANCY_N]
        b.write(f"sycophancy_bct/{name}.gz", b"\n".join(kept) + b"\n")
    b.note("sycophancy_bct", f"Subset: the first {SYCOPHANCY_N} lines of truthfulqa_are_you_sure.jsonl and of truthfulqa_suggested_answer.jsonl,")
    b.note("sycophancy_bct", "  verbatim (gzip). In the suggested-answer subset 165 of 200 rows suggest a wrong letter.")


# -------------------------------------------------------------------------------------- docs


def write_docs(b: Bundle, shared: Path) -> None:
    for folder in FOLDERS:
        b.write(f"{folder}/LICENSE.txt", (shared / folder / "LICENSE.txt").read_bytes())
        upstream = (shared / folder / "SOURCE.txt").read_text(encoding="utf-8").rstrip("\n")
        lines = [upstream, "", "--- demo bundle (data/demo/build_demo_bundle.py) ---", *b.notes.get(folder, [])]
        b.write(f"{folder}/SOURCE.txt", ("\n".join(lines) + "\n").encode("utf-8"))

    files = sorted(p for p in b.out.rglob("*") if p.is_file() and p.name not in ("README.md", "MANIFEST.json", Path(__file__).name))
    manifest = {}
    table = ["| file | rows | bytes | source | licence | what it is for |", "|---|---:|---:|---|---|---|"]
    total = 0
    for path in files:
        rel = path.relative_to(b.out).as_posix()
        if "__pycache__" in rel:
            continue
        data = path.read_bytes()
        content = gzip.decompress(data) if rel.endswith(".gz") else data
        rows = count_rows(path)
        total += len(data)
        manifest[rel] = {"bytes": len(data), "rows": rows, "content_sha256": hashlib.sha256(content).hexdigest()}
        if path.name in ("LICENSE.txt", "SOURCE.txt"):
            continue
        folder = rel.split("/")[0]
        licence, purpose = FOLDERS.get(folder, ("written for this project", ""))
        purpose = next((text for prefix, text in PURPOSES if rel.startswith(prefix)), purpose)
        source = f"{folder} (see `{folder}/SOURCE.txt`)" if folder in FOLDERS else "`build_demo_bundle.py`"
        table.append(f"| `{rel}` | {rows if rows is not None else '-'} | {len(data):,} | {source} | {licence} | {purpose} |")
    b.write("MANIFEST.json", (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode("utf-8"))
    readme = README_TEMPLATE.format(table="\n".join(table), total=total, n_files=len(manifest))
    b.write("README.md", readme.encode("utf-8"))


README_TEMPLATE = """# Demo bundle

A small, documented subset of `../shared/datasets` (real public data) shipped inside the package,
so that the default run and the tests need neither the network nor `../shared`. Generated by
`build_demo_bundle.py` (deterministic; `python data/demo/build_demo_bundle.py --check` verifies that
the committed files are what the script produces). Each source folder keeps its upstream
`LICENSE.txt` and a `SOURCE.txt` (the upstream one, plus the exact subset rule at its end).
`MANIFEST.json` lists every file with its size, row count and content SHA-256.

Total: {n_files} files, {total:,} bytes.

{table}

Row counts: JSON Lines = non-empty lines, CSV = data rows (header excluded), gzip files counted
after decompression. Row numbers everywhere in `data/` are 0-based.

## Loading

```python
from data.bundle import demo_path
from data.loaders import load_sft, load_pairs, load_eval_prompts, load_alpaca_eval, load_judge_labels

load_sft("demo:hh_sft")                 # 199 Conversations (chosen transcripts)
load_pairs("demo:hh_pairs")             # 300 PreferencePairs;  "demo:hh_heldout": 99
load_pairs("demo:hh_malformed", mode="lenient", max_reject_rate=1.0)   # 2 real malformed rows, both rejected
load_pairs("demo:pandalm", mode="lenient", max_reject_rate=0.07)       # 939 pairs + 60 rejects (see below)
load_judge_labels("demo:pandalm_judge_gpt35")                          # {{"pandalm-<idx>": 0|1|2|None}}
load_eval_prompts("demo:xstest")        # 250 xstest_safe + 200 xstest_unsafe
load_eval_prompts("demo:harmbench"); load_eval_prompts("demo:advbench"); load_eval_prompts("demo:mt_bench")
load_eval_prompts("demo:sycophancy_are_you_sure"); load_eval_prompts("demo:hh_heldout", "winrate_heldout")
load_alpaca_eval("demo:alpaca_eval_gpt-3.5-turbo-1106")               # 805 judged comparisons
pandas.read_csv(demo_path("xstest/model_completions/xstest_v2_completions_llama2new.csv.gz"))
```

## Known bad rows (kept on purpose: they are the pitfalls the loaders must catch)

* `hh_rlhf/malformed.jsonl`: rows 86 and 516 of the upstream file have an empty final *chosen*
  reply (the chosen transcript is a character prefix of the rejected one).
* `pandalm/testset-v1.jsonl.gz`: 60 of 999 rows cannot be preference pairs -- 54 have an empty
  response, 6 have the JSON value `true` instead of a response string. Their three human labels
  are still there (`read_records`) for agreement statistics over all 999 rows; as pairs they are
  rejects (6.0 %, above the default 5 % threshold, hence `max_reject_rate=0.07` above).
* PandaLM judge file: 25 verdicts are `"garbage"` (unparsed), mapped to `None`.

Not in the bundle (use `../shared/datasets` or the original sources): the rest of HH-RLHF
harmless-base test, the alpaca-7b AlpacaEval annotations (kept out for size), the AlpacaEval 1.0 leaderboard and the `raw_completion` / price / time
fields, the other sycophancy rows, Vicuna-bench, Arena-Hard.
"""


# ---------------------------------------------------------------------------------------- main


TRAFFIC_CSV = """intent,share
helpful_base,0.30
oasst,0.25
koala,0.20
vicuna,0.15
selfinstruct,0.10
"""


def build_traffic(b: Bundle) -> None:
    """The demo round's traffic-share table (an input of the round, DESIGN.md principle 7). Not a dataset: an
    illustrative assumption over AlpacaEval's five clusters, written here so the bundle stays reproducible."""
    b.write("traffic/alpaca_eval_clusters.csv", TRAFFIC_CSV.encode("utf-8"))


def build(shared: Path, out: Path) -> None:
    b = Bundle(out)
    build_hh(b, shared)
    build_pandalm(b, shared)
    build_alpaca_eval(b, shared)
    build_xstest(b, shared)
    build_verbatim(b, shared, "harmbench", ["harmbench_behaviors_text_val.csv", "advbench_behaviors.csv"])
    build_verbatim(b, shared, "mt_bench", ["mt_bench_question.jsonl", "mt_bench_reference_answer_gpt-4.jsonl", "judge_prompts.jsonl"])
    build_sycophancy(b, shared)
    build_traffic(b)
    write_docs(b, shared)


def _content(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if path.name.endswith(".gz") else data


def check(shared: Path, out: Path) -> list[str]:
    """Rebuild into a temp dir; return the differences with ``out`` (empty list: identical)."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp)
        build(shared, fresh)
        ignore = {Path(__file__).name}
        want = {p.relative_to(fresh).as_posix() for p in fresh.rglob("*") if p.is_file()}
        have = {
            p.relative_to(out).as_posix()
            for p in out.rglob("*")
            if p.is_file() and p.name not in ignore and "__pycache__" not in p.parts
        }
        diffs = [f"missing: {f}" for f in sorted(want - have)] + [f"extra: {f}" for f in sorted(have - want)]
        for rel in sorted(want & have):
            same = filecmp.cmp(fresh / rel, out / rel, shallow=False) or _content(fresh / rel) == _content(out / rel)
            if not same:
                diffs.append(f"differs: {rel}")
        return diffs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shared", type=Path, default=DEFAULT_SHARED, help="the shared datasets folder")
    parser.add_argument("--out", type=Path, default=HERE, help="output folder (default: this folder)")
    parser.add_argument("--check", action="store_true", help="rebuild in a temp dir and compare with --out")
    args = parser.parse_args(argv)
    if not args.shared.is_dir():
        parser.error(f"shared datasets folder not found: {args.shared}")
    if args.check:
        diffs = check(args.shared, args.out)
        for line in diffs:
            print(line)
        print("demo bundle: " + ("up to date" if not diffs else f"{len(diffs)} difference(s)"))
        return 1 if diffs else 0
    build(args.shared, args.out)
    total = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    print(f"demo bundle written to {args.out} ({total:,} bytes including the build script)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
