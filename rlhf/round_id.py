"""Round ids: which ones are safe folder names, and the ASCII artifact keys derived from them.

A round id names ``<runs_dir>/<round_id>`` and is shown everywhere (W&B group, Prefect artifacts). Any id that is a
safe folder name is accepted, non-ASCII letters included (``rüde-1``, ``東京``); only the Prefect artifact key is
made ASCII, because Prefect allows lowercase ASCII letters, digits and dashes there (``prefect.types.names.
ArtifactKey``; PR #8860), while ``str.isalnum()`` also keeps ü, é, ß and CJK (Prefect #18475).
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

MAX_ROUND_ID_LENGTH = 64
#: Characters of the ASCII slug kept in an artifact key before the hash (the key stays short and readable).
MAX_SLUG_LENGTH = 40
_SAFE = re.compile(r"[^\W_][\w.\-]*")  # \w is Unicode-aware: letters and digits of any script, and "_"


def check_round_id(round_id: str) -> str:
    """``round_id`` if it is a safe folder name, else ValueError saying why.

    Safe: 1 to :data:`MAX_ROUND_ID_LENGTH` characters; letters or digits of any script, ``-``, ``_`` and ``.``
    only; starting with a letter or digit (so never ``.``, ``..``, a hidden folder, an option-looking ``-x``, a
    path with ``/`` or ``\\``, or a name with spaces or control characters).

    Raises:
        ValueError: naming the id and the rule it breaks.
    """
    if not isinstance(round_id, str) or not round_id:
        raise ValueError(f"round id must be a non-empty string, got {round_id!r}")
    if len(round_id) > MAX_ROUND_ID_LENGTH:
        raise ValueError(f"round id {round_id!r} is {len(round_id)} characters; at most {MAX_ROUND_ID_LENGTH}")
    if not _SAFE.fullmatch(round_id):
        bad = sorted({c for c in round_id if not (c.isalnum() or c in "-_.")})
        why = f"characters {bad} are not allowed" if bad else "it must start with a letter or digit"
        raise ValueError(
            f"round id {round_id!r} is not a safe folder name: {why} (letters or digits of any script, '-', '_' "
            "and '.', starting with a letter or digit)"
        )
    return round_id


def ascii_slug(text: str, max_length: int = MAX_SLUG_LENGTH) -> str:
    """Lowercase ASCII letters, digits and single dashes: accents folded (``rüde`` -> ``rude``), the rest a dash."""
    folded = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii").lower()
    return re.sub(r"[^a-z0-9]+", "-", folded).strip("-")[:max_length].rstrip("-")


def artifact_key(prefix: str, round_id: str) -> str:
    """A Prefect artifact key for ``prefix`` and a round: ``<prefix>-<ascii slug>-<8 hex of sha256(round id)>``.

    The hash keeps ids distinct that fold to the same slug (``rüde-1`` / ``rude-1``, ``a_b`` / ``a-b``) or to none
    (``東京`` -> ``<prefix>-<hash>``); the slug is cut to :data:`MAX_SLUG_LENGTH` characters.

    Raises:
        ValueError: ``prefix`` is not itself lowercase ASCII letters, digits and dashes.
    """
    if not re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", prefix):
        raise ValueError(f"artifact key prefix {prefix!r} must be lowercase ASCII letters, digits and dashes")
    digest = hashlib.sha256(unicodedata.normalize("NFC", round_id).encode("utf-8")).hexdigest()[:8]
    slug = ascii_slug(round_id)
    return f"{prefix}-{slug}-{digest}" if slug else f"{prefix}-{digest}"
