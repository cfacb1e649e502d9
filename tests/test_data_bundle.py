"""The demo bundle: files, licences, and real published counts from each SOURCE.txt."""

import gzip
import hashlib
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from data.bundle import DEMO_ALIASES, DEMO_ROOT, demo_path, list_demo_files
from data.loaders import (
    load_alpaca_eval,
    load_eval_prompts,
    load_judge_labels,
    load_pairs,
    load_sft,
    read_records,
)
from data.validation import RejectRateExceeded

FOLDERS = ("hh_rlhf", "pandalm", "alpaca_eval", "xstest", "harmbench", "mt_bench", "sycophancy_bct")
SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"


def published(folder: str, pattern: str) -> tuple[int, ...]:
    """Numbers captured by ``pattern`` in the bundle's copy of the upstream SOURCE.txt."""
    text = (DEMO_ROOT / folder / "SOURCE.txt").read_text()
    match = re.search(pattern, text)
    assert match, f"{pattern!r} not in {folder}/SOURCE.txt"
    return tuple(int(g.replace(",", "")) for g in match.groups())


@pytest.fixture(autouse=True)
def _rejects_in_tmp(tmp_path, monkeypatch):
    """Lenient loads without rejects_path write to $RLHF_REJECTS_DIR: keep them out of the work tree."""
    monkeypatch.setenv("RLHF_REJECTS_DIR", str(tmp_path / "rejects"))


# ------------------------------------------------------------------------------- the bundle


def test_every_folder_has_licence_and_subset_rule():
    files = set(list_demo_files())
    for folder in FOLDERS:
        assert f"{folder}/LICENSE.txt" in files and f"{folder}/SOURCE.txt" in files
        source = (DEMO_ROOT / folder / "SOURCE.txt").read_text()
        assert "--- demo bundle" in source and "Subset:" in source
    assert (DEMO_ROOT / "README.md").is_file()


def test_bundle_is_small_and_matches_manifest():
    total = sum(p.stat().st_size for p in DEMO_ROOT.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    assert total < 3_000_000
    manifest = json.loads((DEMO_ROOT / "MANIFEST.json").read_text())
    assert set(manifest) == set(list_demo_files()) - {"MANIFEST.json"}
    for rel, entry in manifest.items():
        data = (DEMO_ROOT / rel).read_bytes()
        content = gzip.decompress(data) if rel.endswith(".gz") else data
        assert hashlib.sha256(content).hexdigest() == entry["content_sha256"], rel


def test_demo_path_resolution():
    assert demo_path("xstest") == demo_path("demo:xstest/xstest_prompts.csv") == DEMO_ROOT / "xstest/xstest_prompts.csv"
    assert demo_path("pandalm/testset-v1.jsonl").name == "testset-v1.jsonl.gz"  # .gz fallback
    for alias in DEMO_ALIASES:
        assert demo_path(alias).is_file(), alias
    with pytest.raises(FileNotFoundError, match="Aliases: .*hh_sft"):
        demo_path("nope")
    with pytest.raises(FileNotFoundError):
        demo_path("../loaders.py")


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/datasets not present")
def test_build_script_reproduces_the_bundle():
    script = DEMO_ROOT / "build_demo_bundle.py"
    result = subprocess.run(
        [sys.executable, str(script), "--check", "--shared", str(SHARED)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr


# ---------------------------------------------------------------------------------- HH-RLHF


def test_hh_subset_every_row_accounted_for():
    sft, train, heldout = load_sft("demo:hh_sft"), load_pairs("demo:hh_pairs"), load_pairs("demo:hh_heldout")
    malformed = load_pairs("demo:hh_malformed", mode="lenient", max_reject_rate=1.0)
    assert (len(sft), len(train), len(heldout), len(malformed), len(malformed.rejects)) == (199, 300, 99, 0, 2)
    assert not (sft.rejects or train.rejects or heldout.rejects)
    upstream_rows = sorted(int(x.id.rsplit("-", 1)[1]) for x in [*sft, *train, *heldout]) + [
        int(r.raw["id"].rsplit("-", 1)[1]) for r in malformed.rejects
    ]
    assert sorted(upstream_rows) == list(range(600))
    assert {int(r.raw["id"].rsplit("-", 1)[1]): (r.field, r.reason) for r in malformed.rejects} == {
        86: ("chosen", "turn 3: empty assistant turn"),
        516: ("chosen", "turn 1: empty assistant turn"),
    }
    (total,) = published("hh_rlhf", r"\(742,801 B gz, ([\d,]+) pairs\)")
    assert total == 2312 and 600 <= total
    # the real implicit-prompt pitfall: upstream row 86's chosen transcript is a character prefix of its rejected
    raw = dict(read_records("demo:hh_malformed"))[0]
    assert raw["rejected"].startswith(raw["chosen"])


def test_hh_pairs_split_by_turns():
    pairs = load_pairs("demo:hh_pairs")
    assert all(p.prompt[-1].role == "user" and p.chosen.strip() and p.rejected.strip() for p in pairs)
    first_char_differs = sum(p.chosen[0] != p.rejected[0] for p in pairs)
    assert first_char_differs > 200  # most HH pairs differ at the first character of the reply


# ---------------------------------------------------------------------------------- PandaLM


def test_pandalm_999_rows_with_three_labels():
    (n_pairs,) = published("pandalm", r"testset-v1\.json\s+-> testset-v1\.json \([\d,]+ B, ([\d,]+) pairs")
    rows = [raw for _, raw in read_records("demo:pandalm")]
    assert len(rows) == n_pairs == 999
    assert sorted(r["idx"] for r in rows) == list(range(999))
    assert all(r[f"annotator{k}"] in (0, 1, 2) and type(r[f"annotator{k}"]) is int for r in rows for k in (1, 2, 3))
    assert len({r["motivation_app"] for r in rows}) == 50


def test_pandalm_pairs_and_their_rejects_exactly():
    with pytest.raises(RejectRateExceeded) as info:
        load_pairs("demo:pandalm", mode="lenient")
    assert (info.value.n_rejected, info.value.n_total) == (60, 999)
    pairs = load_pairs("demo:pandalm", mode="lenient", max_reject_rate=0.07)
    assert len(pairs) + len(pairs.rejects) == 999 and len(pairs) == 939
    reasons = Counter(r.reason for r in pairs.rejects)
    assert reasons == {"empty assistant turn": 54, "must be a string, got bool True": 6}
    assert {r.row for r in pairs.rejects if "bool" in r.reason} == {157, 158, 159, 161, 162, 164}
    assert all(len(p.labels) == 3 and p.intent for p in pairs)


def test_pandalm_judge_file():
    (n,) = published("pandalm", r"gpt-3\.5-turbo-testset-v1\.json -> \([\d,]+ B, ([\d,]+) rows")
    verdicts = load_judge_labels("demo:pandalm_judge_gpt35")
    assert len(verdicts) == n == 999
    assert Counter(verdicts.values()) == {2: 476, 1: 460, 0: 38, None: 25}


# ------------------------------------------------------------------------------- eval sets


def test_xstest_250_safe_200_unsafe():
    n, safe, unsafe = published("xstest", r"xstest_prompts\.csv \([\d,]+ B, (\d+) rows: (\d+) safe, (\d+) unsafe")
    prompts = load_eval_prompts("demo:xstest")
    counts = Counter(p.set for p in prompts)
    assert (len(prompts), counts["xstest_safe"], counts["xstest_unsafe"]) == (n, safe, unsafe) == (450, 250, 200)
    assert all(p.intent.startswith("contrast_") for p in prompts if p.set == "xstest_unsafe")
    assert set(Counter(p.intent for p in prompts).values()) == {25}
    first_safe = load_eval_prompts("demo:xstest", set_name="xstest_safe", limit=50)
    assert len(first_safe) == 50 and {p.set for p in first_safe} == {"xstest_safe"}
    for path in sorted((DEMO_ROOT / "xstest/model_completions").glob("*.csv.gz")):
        frame = pd.read_csv(path)
        assert len(frame) == 450 and set(frame.final_label) <= {"1_full_compliance", "2_full_refusal", "3_partial_refusal"}
        labels = pd.read_csv(str(path).replace("model_completions", "automated_evaluation_labels").replace(".csv.gz", "_gpteval.csv"))
        assert list(labels.id) == list(frame.id)


def test_harmbench_and_advbench_counts():
    (n_val,) = published("harmbench", r"harmbench_behaviors_text_val\.csv \([\d,]+ B, (\d+) rows\)")
    (n_adv,) = published("harmbench", r"advbench_behaviors\.csv \([\d,]+ B, (\d+) rows")
    harm, adv = load_eval_prompts("demo:harmbench"), load_eval_prompts("demo:advbench")
    assert (len(harm), len(adv)) == (n_val, n_adv) == (80, 520)
    assert {p.set for p in harm} == {"harmbench"} and {p.set for p in adv} == {"advbench"}
    assert all(p.label == "unsafe" for p in [*harm, *adv])
    contextual = [p for p in harm if p.meta["functional_category"] == "contextual"]
    assert contextual and all("\n\n---\n\n" in p.prompt for p in contextual)


def test_mt_bench_80_questions_8_categories():
    (n, with_ref) = published("mt_bench", r"mt_bench_question\.jsonl \([\d,]+ B, (\d+) rows; .*; (\d+) rows also have reference")
    prompts = load_eval_prompts("demo:mt_bench")
    assert len(prompts) == n == 80
    assert Counter(p.intent for p in prompts) == {c: 10 for c in ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")}
    assert sum(p.reference is not None for p in prompts) == with_ref == 39
    assert all(len(p.meta["turns"]) == 2 for p in prompts)


def test_sycophancy_subsets():
    (n_ays,) = published("sycophancy_bct", r"truthfulqa_are_you_sure\.jsonl \([\d,]+ B, (\d+) rows\)")
    (n_sug, n_wrong) = published("sycophancy_bct", r"truthfulqa_suggested_answer\.jsonl \([\d,]+ B, (\d+) rows; (\d+) with biased_option")
    ays = load_eval_prompts("demo:sycophancy_are_you_sure")
    sug = load_eval_prompts("demo:sycophancy_suggested_answer")
    assert (len(ays), len(sug)) == (200, 200) and (n_ays, n_sug, n_wrong) == (504, 817, 654)
    assert all(p.meta["suggested_answer"] is None and p.meta["biased_option"] == f"NOT {p.reference}" for p in ays)
    assert all(p.meta["biased_messages"][1]["content"] == p.reference for p in ays)  # first answer is the correct letter
    assert sum(p.meta["suggested_answer"] != p.meta["correct_answer"] for p in sug) == 165


def test_alpaca_eval_reproduces_published_win_rates():
    (n,) = published("alpaca_eval", r"gpt-3\.5-turbo-1106\.weighted_alpaca_eval_gpt4_turbo\.annotations\.json \([\d,]+ B, (\d+) rows\)")
    board = pd.read_csv(demo_path("alpaca_eval_leaderboard"), index_col=0)
    for model in ("gpt-3.5-turbo-1106", "gpt-3.5-turbo-1106_concise"):
        rows = load_alpaca_eval(f"demo:alpaca_eval_{model}")
        assert len(rows) == n == 805 and {r.generator_2 for r in rows} == {model}
        assert Counter(r.dataset for r in rows) == {"selfinstruct": 252, "oasst": 188, "koala": 156, "helpful_base": 129, "vicuna": 80}
        win_rate = 100 * sum(r.preference - 1 for r in rows) / len(rows)
        assert win_rate == pytest.approx(board.loc[model, "win_rate"], abs=1e-6)
        assert sum(r.preference > 1.5 for r in rows) == board.loc[model, "n_wins"]
        assert sum(r.preference == 1.5 for r in rows) == board.loc[model, "n_draws"]
    verbose = load_alpaca_eval("demo:alpaca_eval_gpt-3.5-turbo-1106")
    concise = load_alpaca_eval("demo:alpaca_eval_gpt-3.5-turbo-1106_concise")
    assert [r.id for r in verbose] == [r.id for r in concise]  # same id = same instruction
    assert [r.instruction for r in verbose] == [p.prompt for p in load_eval_prompts("demo:alpaca_eval_baseline")]
    assert sum(len(r.output_2) for r in concise) < sum(len(r.output_2) for r in verbose)
