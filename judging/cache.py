"""On-disk cache of judgments, keyed by content hash, so an unchanged judge is never asked twice.

One JSON file per key under ``<root>/<key[:2]>/<key>.json``, written atomically (temp file + ``os.replace``): a
crashed run leaves complete entries only, and a rerun resumes where it stopped. The key is the sha256 of a
JSON-able description (``rlhf.lineage.json_hash``), e.g. (judge identity, template, prompt, both responses).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from rlhf.lineage import json_hash


class JudgmentCache:
    """A directory of cached JSON values.

    Args:
        root: the cache directory (created on first write).
    """

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    @staticmethod
    def key(description: Any) -> str:
        """sha256 hex of a JSON-able ``description``."""
        return json_hash(description)

    def path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> Any | None:
        """The cached value, or None when absent.

        Raises:
            ValueError: the entry exists but is not JSON (names the file; delete it to re-ask).
        """
        p = self.path(key)
        if not p.is_file():
            return None
        try:
            return json.loads(p.read_text(encoding="utf-8"))["value"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise ValueError(f"{p}: corrupt judgment cache entry ({err}); delete it to judge this item again") from None

    def put(self, key: str, value: Any) -> Path:
        """Write ``value`` (JSON-able) under ``key`` atomically; returns the file."""
        p = self.path(key)
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"key": key, "value": value}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, p)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return p
