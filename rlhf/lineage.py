"""Lineage (DESIGN.md principle 8): content hashes, and the code each stage runs. (Data sources are fingerprinted by
``data.fingerprint``, one layer up.)

Caches are keyed on content, never on a path: a file that changed under the same name gets a new hash. A stage's
code version covers the packages it really imports (read from the source, followed transitively), so a change
in shared code recomputes every stage that runs it and no other.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
from pathlib import Path
from typing import Any

_CHUNK = 1 << 20  # 1 MiB reads keep memory flat on multi-GB checkpoints


def file_hash(path: str | os.PathLike) -> str:
    """sha256 hex digest of one file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def content_hash(path: str | os.PathLike, *, exclude: tuple[str, ...] = ("manifest.json",)) -> str:
    """sha256 of a file, or of a directory tree (relative paths + bytes, sorted).

    Args:
        path: a file or a directory.
        exclude: file names skipped anywhere in a directory (the manifest describes the content, it is not part of it).

    Returns:
        64-char hex digest. Two trees hash equal iff they hold the same relative paths with the same bytes.

    Raises:
        FileNotFoundError: ``path`` does not exist.
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"cannot hash {p}: no such file or directory")
    if p.is_file():
        return file_hash(p)
    h = hashlib.sha256()
    for f in sorted(q for q in p.rglob("*") if q.is_file() and q.name not in exclude and "__pycache__" not in q.parts):
        h.update(f.relative_to(p).as_posix().encode())
        h.update(b"\0")
        h.update(file_hash(f).encode())
    return h.hexdigest()


def json_hash(obj: Any) -> str:
    """sha256 of a JSON-serialisable object in canonical form (sorted keys)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


ROOT = Path(__file__).resolve().parent.parent  # the repository: one folder per package


def project_packages(root: str | os.PathLike = ROOT) -> tuple[str, ...]:
    """The repository's own top-level packages (folders holding .py files, namespace packages included; not the
    tests), sorted."""
    root = Path(root)
    return tuple(
        sorted(
            d.name
            for d in root.iterdir()
            if d.is_dir() and not d.name.startswith((".", "_")) and d.name != "tests" and any(d.glob("*.py"))
        )
    )


def imported_packages(package: str, root: str | os.PathLike = ROOT) -> set[str]:
    """Project packages that ``package``'s own .py files import directly (module level or inside a function).

    Read from the source with :mod:`ast` (nothing is imported): ``import a.b``, ``from a.b import c`` and
    relative imports (which stay inside ``package``). The result excludes ``package`` itself.
    """
    root = Path(root)
    own = set(project_packages(root))
    found: set[str] = set()
    for f in sorted((root / package).rglob("*.py")):
        if "__pycache__" in f.parts:
            continue
        tree = ast.parse(f.read_text(encoding="utf-8"), filename=str(f))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            found.update(top for top in (n.split(".")[0] for n in names) if top in own)
    found.discard(package)
    return found


def code_packages(package: str, root: str | os.PathLike = ROOT) -> tuple[str, ...]:
    """``package`` and every project package it imports, transitively (e.g. gates -> judging -> rlhf -> data).

    This is the code a stage runs, so it is what its cache key follows (:func:`code_version`): a change in any of
    these packages recomputes the stage, a change elsewhere does not. Sorted, ``package`` included.
    """
    seen, todo = {package}, [package]
    while todo:
        for dep in imported_packages(todo.pop(), root):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return tuple(sorted(seen))


def code_version(packages: tuple[str, ...] | None = None, root: str | os.PathLike = ROOT) -> str:
    """Hash of the pipeline's own source: the .py files of ``packages`` (default: every project package).

    A change to the code a stage runs changes its value, so a cached result computed by older code is not reused.
    """
    root = Path(root)
    packages = project_packages(root) if packages is None else packages
    h = hashlib.sha256()
    for pkg in packages:
        d = root / pkg
        for f in sorted(q for q in d.rglob("*.py") if "__pycache__" not in q.parts):
            h.update(f.relative_to(root).as_posix().encode())
            h.update(file_hash(f).encode())
    return h.hexdigest()
