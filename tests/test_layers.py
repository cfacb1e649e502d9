"""Layers (DESIGN.md "Layout"): every package imports only its own modules and the layers below its own.

The layers are ``rlhf.registry.LAYERS``: flows on top, the stages side by side (a stage never imports another stage:
what two stages share lives below them), then the shared packages one per layer, judging > data > rlhf. Checked on
the source with :func:`rlhf.lineage.module_imports`, so imports inside functions count as much as file-level ones.
The README's Layout drawing is checked against the same list, and the list against the imports.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Sequence
from fnmatch import fnmatch
from pathlib import Path

import networkx as nx

from rlhf.lineage import import_graph, project_modules
from rlhf.registry import LAYERS, PROJECT_PACKAGES, STAGES

ROOT = Path(__file__).resolve().parents[1]
SHARED = ("judging", "data", "rlhf")  # top to bottom


def layer_violations(root: Path, layers: Sequence[Sequence[str]]) -> list[str]:
    """``"<file>:<line>: <package> imports <module> (<where>)"`` for every import of a package in a layer above the
    importer's (upward) or of another package in the same layer (sideways); ``<where>`` is ``file level`` or
    ``in a function``. ``layers`` are listed top to bottom."""
    rank = {pkg: i for i, layer in enumerate(layers) for pkg in layer}
    files = project_modules(root, rank)
    found = []
    for module, imports in import_graph(root, rank).items():
        pkg = module.split(".")[0]
        for imp in imports:
            dep = imp.module.split(".")[0]
            if dep != pkg and rank[dep] <= rank[pkg]:
                where = "in a function" if imp.in_function else "file level"
                rel = files[module].relative_to(root).as_posix()
                found.append(f"{rel}:{imp.line}: {pkg} imports {imp.module} ({where})")
    return found


def package_edges(root: Path, packages: Sequence[str]) -> set[tuple[str, str]]:
    """(importer, imported) top-level package pairs, imports inside functions included."""
    return {
        (m.split(".")[0], i.module.split(".")[0])
        for m, imports in import_graph(root, packages).items()
        for i in imports
        if m.split(".")[0] != i.module.split(".")[0]
    }


def test_layers_name_every_package_once():
    """The layer list is the project's package list: what pyproject.toml installs, the registry's stages."""
    listed = [p for layer in LAYERS for p in layer]
    assert len(listed) == len(set(listed))
    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    folders = {d.name for d in ROOT.iterdir() if (d / "__init__.py").is_file()}
    assert set(PROJECT_PACKAGES) == {f for f in folders if any(fnmatch(f, pattern) for pattern in include)}
    assert set(LAYERS[1]) == {s.package for s in STAGES.values()} | {"flywheel"}
    assert LAYERS[0] == ("flows",) and tuple(p for (p,) in LAYERS[2:]) == SHARED


def test_no_package_imports_a_layer_above_or_beside_its_own():
    assert layer_violations(ROOT, LAYERS) == []


def test_the_shared_order_is_the_only_one_the_imports_allow():
    """Each shared package imports the one below it, so the order is read from the code, not chosen."""
    edges = package_edges(ROOT, PROJECT_PACKAGES)
    assert {("judging", "data"), ("data", "rlhf")} <= edges
    assert nx.is_directed_acyclic_graph(nx.DiGraph(edges))  # no package circle anywhere


def test_no_file_circle_anywhere():
    """No two modules import each other, directly or round a loop, at file level or inside functions."""
    graph = nx.DiGraph()
    for module, imports in import_graph(ROOT, PROJECT_PACKAGES).items():
        graph.add_node(module)
        graph.add_edges_from((module, i.module) for i in imports)
    assert [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1] == []


def test_the_check_finds_planted_violations(tmp_path):
    files = {
        "top/__init__.py": "",
        "top/cli.py": "from low.base import x\nimport mid.core\n",  # downward: allowed
        "stage_a/__init__.py": "",
        "stage_a/train.py": (
            "import json\n"
            "from mid.core import score\n"  # shared code: allowed
            "from . import config\n"  # own package: allowed
            "from stage_b.prepare import check\n"  # line 4: a stage imports another stage
            "def f():\n"
            "    import top.cli as c\n"  # line 6: upward, lazily inside a function
            "    from .. import stage_b\n"  # line 7: a relative import escaping the package
        ),
        "stage_a/config.py": "",
        "stage_b/__init__.py": "",
        "stage_b/prepare.py": "from stage_b.util import y\nfrom .util import z\n",  # own package: allowed
        "stage_b/util.py": "",
        "mid/__init__.py": "",
        "mid/core.py": "from low import base\n",  # downward: allowed
        "low/__init__.py": "",
        "low/base.py": "import os\n\ndef g():\n    from mid.core import score\n",  # line 4: upward, in a function
        "low/io.py": "from mid import core\n",  # line 1: upward at file level
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    layers = (("top",), ("stage_a", "stage_b"), ("mid",), ("low",))
    assert layer_violations(tmp_path, layers) == [
        "low/base.py:4: low imports mid (in a function)",
        "low/base.py:4: low imports mid.core (in a function)",
        "low/io.py:1: low imports mid (file level)",
        "low/io.py:1: low imports mid.core (file level)",
        "stage_a/train.py:4: stage_a imports stage_b (file level)",
        "stage_a/train.py:4: stage_a imports stage_b.prepare (file level)",
        "stage_a/train.py:6: stage_a imports top (in a function)",
        "stage_a/train.py:6: stage_a imports top.cli (in a function)",
        "stage_a/train.py:7: stage_a imports stage_b (in a function)",
    ]
    assert not nx.is_directed_acyclic_graph(nx.DiGraph(package_edges(tmp_path, [p for (p, *_) in layers])))


def readme_layers(readme: str) -> list[list[str]]:
    """The packages the README's Layout drawing lists, one list per line that starts with ``name/``, top to bottom."""
    section = readme.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    drawing = section.split("```", 2)[1]
    rows = []
    for line in drawing.splitlines():
        lead = re.match(r"((?:[a-z_]+/\s+)+)", line)
        if lead:
            rows.append(re.findall(r"([a-z_]+)/", lead.group(1)))
    return rows


def test_the_readme_draws_the_layers_in_code_order():
    assert readme_layers((ROOT / "README.md").read_text(encoding="utf-8")) == [list(layer) for layer in LAYERS]


def test_the_drawing_check_reads_a_drawing():
    readme = ("x\n## Layout\n\ntext\n```\nflows/   a\n   |\n   v\nsft/  dpo/   b\n          c/ d\ndata/  e\n```\n"
              "## Next\n")
    assert readme_layers(readme) == [["flows"], ["sft", "dpo"], ["data"]]
