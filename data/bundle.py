"""The offline demo bundle shipped inside the package (``data/demo/``).

The bundle is a small, documented subset of ``../shared/datasets`` (see ``data/demo/README.md``;
rebuilt by ``data/demo/build_demo_bundle.py``), so the default run needs neither network nor
``../shared``. Files are addressed by their path relative to ``data/demo/``
(``"xstest/xstest_prompts.csv"``) or by a short alias (``"xstest"``); loaders accept both as
``"demo:<name>"``.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["DEMO_ROOT", "DEMO_ALIASES", "demo_path", "list_demo_files"]

#: Folder of the bundle inside the installed package.
DEMO_ROOT = Path(__file__).resolve().parent / "demo"

#: Short names -> paths relative to :data:`DEMO_ROOT`.
DEMO_ALIASES: dict[str, str] = {
    "hh_sft": "hh_rlhf/sft.jsonl",
    "hh_pairs": "hh_rlhf/pairs_train.jsonl",
    "hh_heldout": "hh_rlhf/pairs_heldout.jsonl",
    "hh_malformed": "hh_rlhf/malformed.jsonl",
    "pandalm": "pandalm/testset-v1.jsonl.gz",
    "pandalm_judge_gpt35": "pandalm/gpt-3.5-turbo-testset-v1.jsonl",
    "xstest": "xstest/xstest_prompts.csv",
    "harmbench": "harmbench/harmbench_behaviors_text_val.csv",
    "advbench": "harmbench/advbench_behaviors.csv",
    "mt_bench": "mt_bench/mt_bench_question.jsonl",
    "mt_bench_reference": "mt_bench/mt_bench_reference_answer_gpt-4.jsonl",
    "sycophancy_are_you_sure": "sycophancy_bct/truthfulqa_are_you_sure.jsonl.gz",
    "sycophancy_suggested_answer": "sycophancy_bct/truthfulqa_suggested_answer.jsonl.gz",
    "alpaca_eval_baseline": "alpaca_eval/annotations/baseline_gpt4_1106_preview.jsonl.gz",
    "alpaca_eval_gpt-3.5-turbo-1106": "alpaca_eval/annotations/gpt-3.5-turbo-1106.jsonl.gz",
    "alpaca_eval_gpt-3.5-turbo-1106_concise": "alpaca_eval/annotations/gpt-3.5-turbo-1106_concise.jsonl.gz",
    "alpaca_eval_leaderboard": "alpaca_eval/leaderboards/weighted_alpaca_eval_gpt4_turbo_leaderboard.csv",
}

_NOT_DATA = {"README.md", "build_demo_bundle.py"}


def list_demo_files() -> list[str]:
    """Every file of the bundle, as sorted POSIX paths relative to :data:`DEMO_ROOT`
    (LICENSE/SOURCE files included; the README and build script excluded)."""
    if not DEMO_ROOT.is_dir():
        return []
    return sorted(
        p.relative_to(DEMO_ROOT).as_posix()
        for p in DEMO_ROOT.rglob("*")
        if p.is_file() and p.name not in _NOT_DATA and "__pycache__" not in p.parts
    )


def demo_path(name: str) -> Path:
    """Resolve a demo file by alias or relative path.

    Args:
        name: an alias of :data:`DEMO_ALIASES` or a path relative to ``data/demo/``; an optional
            ``"demo:"`` prefix is ignored, and ``".gz"`` is tried when the plain name is absent.

    Returns:
        Absolute path of an existing file or folder inside the bundle.

    Raises:
        FileNotFoundError: unknown name (the message lists aliases and files), or a path
            outside the bundle.
    """
    key = name.removeprefix("demo:").strip()
    rel = DEMO_ALIASES.get(key, key)
    root = DEMO_ROOT.resolve()
    for candidate in (rel, f"{rel}.gz"):
        path = (root / candidate).resolve()
        if path.is_relative_to(root) and path != root and path.exists():
            return path
    raise FileNotFoundError(
        f"no demo file {name!r} in {DEMO_ROOT}. Aliases: {', '.join(sorted(DEMO_ALIASES))}. "
        f"Files: {', '.join(list_demo_files()) or '(bundle missing)'}"
    )
