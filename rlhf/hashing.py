"""Content hashes for lineage and caching (DESIGN.md principle 8).

Caches are keyed on content, never on a path: a file that changed under the same name gets a new hash.
"""

from __future__ import annotations

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


PACKAGES = ("rlhf", "data", "sft", "dpo", "reward_model", "ppo", "gates")

# The packages whose code a stage runs (its own, the shared plumbing, and what it imports from other stages).
# A change in any of them recomputes the stage; a change elsewhere does not.
STAGE_PACKAGES = {
    "sft": ("rlhf", "data", "sft"),
    "dpo": ("rlhf", "data", "dpo"),
    "reward_model": ("rlhf", "data", "dpo", "reward_model"),  # dpo.prepare checks the pairs
    "ppo": ("rlhf", "data", "reward_model", "ppo"),  # reward_model.scoring scores rollouts
    "gates": ("rlhf", "data", "reward_model", "gates"),  # the reward model is the judge
}


def code_version(packages: tuple[str, ...] = PACKAGES) -> str:
    """Hash of the pipeline's own source: the .py files of ``packages`` (default: all of them).

    A change to the code a stage runs changes its value, so a cached result computed by older code is not reused.
    """
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for pkg in packages:
        d = root / pkg
        for f in sorted(d.rglob("*.py")):
            h.update(f.relative_to(root).as_posix().encode())
            h.update(file_hash(f).encode())
    return h.hexdigest()
