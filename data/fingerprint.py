"""The content fingerprint of a data source, the data part of every cache key and manifest (DESIGN.md principle 8).

It lives in the data layer because it resolves the data layer's source names (``demo:<name>``, :mod:`data.bundle`);
the hashing itself is plumbing below it (:func:`rlhf.lineage.content_hash`).
"""

from __future__ import annotations

from pathlib import Path

from data.bundle import demo_path
from rlhf.lineage import content_hash

__all__ = ["data_fingerprint"]


def data_fingerprint(source: str) -> str:
    """Content hash of a data source: ``demo:<name>`` (bundled file), a local path, or ``hub:<id>``.

    Returns:
        The 64-char content hash of the file or folder; ``"hub:<source>"`` when ``source`` is no local path (a hub
        id is its own identity: its content is not on this machine).

    Raises:
        FileNotFoundError: an unknown ``demo:`` name.
    """
    if source.startswith("demo:"):
        return content_hash(demo_path(source.removeprefix("demo:")))
    p = Path(source).expanduser()
    return content_hash(p) if p.exists() else f"hub:{source}"
