"""Layers (DESIGN.md "Layout"): no stage package imports another stage package; what two stages share lives below
them (rlhf/, data/, judging/). Checked on the source with an AST walk, so lazy imports inside functions count."""

from __future__ import annotations

import ast
from pathlib import Path

from rlhf.registry import STAGES

ROOT = Path(__file__).resolve().parents[1]
#: the stage packages: the registry's, plus the flywheel (a stage that is not launched by the round flow)
STAGE_PACKAGES = frozenset({s.package for s in STAGES.values()} | {"flywheel"})


def _imported_modules(path: Path, package_parts: list[str]) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``path``; relative imports resolved against its package."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package_parts[: len(package_parts) - (node.level - 1)] if node.level > 1 else package_parts
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.append((node.lineno, name))
            if not node.module:  # "from . import x" / "from .. import sft": the names are modules too
                out += [(node.lineno, f"{name}.{alias.name}" if name else alias.name) for alias in node.names]
    return out


def cross_stage_imports(root: Path, stages: frozenset[str]) -> list[str]:
    """``"<file>:<line>: <stage> imports <module>"`` for every import of one stage package from another."""
    found = []
    for stage in sorted(stages):
        for path in sorted((root / stage).rglob("*.py")):
            rel = path.relative_to(root)
            package_parts = list(rel.parent.parts)
            for line, module in _imported_modules(path, package_parts):
                top = module.split(".")[0]
                if top in stages and top != stage:
                    found.append(f"{rel}:{line}: {stage} imports {module}")
    return found


def test_no_stage_package_imports_another():
    assert sorted(STAGE_PACKAGES) == ["dpo", "flywheel", "gates", "ppo", "reward_model", "sft"]
    assert cross_stage_imports(ROOT, STAGE_PACKAGES) == []


def test_the_check_finds_planted_violations(tmp_path):
    for pkg in ("sft", "dpo", "gates", "judging"):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "dpo" / "train.py").write_text(
        "import json\n"
        "from judging.scoring import score\n"  # shared code: allowed
        "from . import config\n"  # own package: allowed
        "from sft.prepare import check\n"  # line 4: a stage imports another stage
        "def f():\n"
        "    import gates.report as r\n"  # line 6: lazy imports count
        "    from .. import sft\n"  # line 7: relative import escaping the package
    )
    (tmp_path / "gates" / "ok.py").write_text("from gates.result import GateResult\nfrom .report import x\n")
    assert cross_stage_imports(tmp_path, frozenset({"sft", "dpo", "gates"})) == [
        "dpo/train.py:4: dpo imports sft.prepare",
        "dpo/train.py:6: dpo imports gates.report",
        "dpo/train.py:7: dpo imports sft",
    ]
