"""The content fingerprint of a data source, the data part of every cache key and manifest (DESIGN.md principle 8).

It lives in the data layer because it resolves the data layer's source names (``demo:<name>``, :mod:`data.bundle`);
the hashing itself is plumbing below it (:func:`rlhf.lineage.content_hash`).
"""

from __future__ import annotations

from pathlib import Path

from data.bundle import demo_path
from rlhf.lineage import content_hash, source_key

__all__ = ["data_fingerprint"]


def data_fingerprint(source: str) -> str:
    """Content hash of a data source: ``demo:<name>`` (bundled file), a local path, or ``hub:<id>``.

    Returns:
        The 64-char content hash of the file or folder; for a hub dataset id (no local path),
        ``"hub:dataset:<id>@<commit>"``, the commit it resolves to (``rlhf.lineage.hub_revision``: the local hub
        cache offline), never the name alone.

    Raises:
        FileNotFoundError: an unknown ``demo:`` name. rlhf.lineage.UnresolvedRevision: a hub id whose commit cannot
        be resolved (not cached, hub offline).
    """
    if source.startswith("demo:"):
        return content_hash(demo_path(source.removeprefix("demo:")))
    p = Path(source).expanduser()
    return content_hash(p) if p.exists() else source_key(source, repo_type="dataset")


def local_path(source: str) -> Path | None:
    """The local file or folder of a data source (``demo:<name>`` resolved in the bundle, an existing path), or
    None for a hub dataset (nothing here to reference)."""
    if source.startswith("demo:"):
        return demo_path(source.removeprefix("demo:"))
    p = Path(source).expanduser()
    return p if p.exists() else None
