"""Style audit of a demonstration set: what the SFT model will learn to sound like.

Preference optimisation and SFT copy surface habits (DESIGN.md "personality drift"): if a quarter of the
demonstrations open with "Sure! Here's", the model will too. The audit counts openers (first three words of the
final assistant reply, lower-cased, punctuation stripped) and formats, and flags an opener whose share exceeds
the configured maximum.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from dataclasses import asdict, dataclass

logger = logging.getLogger(__name__)

_BULLET = re.compile(r"^\s*([-*\u2022]|\d+[.)])\s+", re.M)
_WORD = re.compile(r"[a-z0-9']+")


@dataclass
class StyleAudit:
    n: int
    top_openers: list[tuple[str, int, float]]  # (opener, count, share)
    format_shares: dict[str, float]  # share of replies with bullets / headers / code / question-restating
    max_opener_share: float
    passed: bool
    message: str

    def to_dict(self) -> dict:
        return asdict(self)


def opener(text: str, n_words: int = 3) -> str:
    """First ``n_words`` words, lower-cased, without punctuation ('' for an empty reply)."""
    return " ".join(_WORD.findall(text.lower())[:n_words])


def audit_style(replies: list[str], *, max_opener_share: float = 0.25, top_k: int = 10) -> StyleAudit:
    """Audit final assistant replies.

    Args:
        replies: one string per demonstration.
        max_opener_share: fail when the most common opener covers more than this share (0-1).

    Returns:
        A ``StyleAudit``; ``passed`` is False when one opener dominates.

    Raises:
        ValueError: ``replies`` is empty.
    """
    if not replies:
        raise ValueError("style audit needs at least one demonstration")
    n = len(replies)
    counts = Counter(opener(r) for r in replies)
    top = [(o, c, c / n) for o, c in counts.most_common(top_k)]
    formats = {
        "bullets": sum(bool(_BULLET.search(r)) for r in replies) / n,
        "headers": sum(bool(re.search(r"^\s*#{1,6}\s", r, re.M)) for r in replies) / n,
        "code": sum("```" in r for r in replies) / n,
        "empty": sum(not r.strip() for r in replies) / n,
    }
    worst_opener, worst_count, worst_share = top[0]
    passed = worst_share <= max_opener_share
    message = (
        f"most common opener {worst_opener!r} covers {worst_share:.1%} of {n} demonstrations "
        f"({'within' if passed else 'above'} the {max_opener_share:.0%} limit)"
    )
    return StyleAudit(n, top, formats, max_opener_share, passed, message)


def audit_demonstrations(rows: list[dict], *, max_opener_share: float, action: str) -> StyleAudit:
    """:func:`audit_style` of the final replies of prepared SFT rows (``completion[0]["content"]``), logged.

    Raises:
        SystemExit: the audit failed and ``action`` is ``fail`` (``warn``: a warning only).
    """
    audit = audit_style([r["completion"][0]["content"] for r in rows], max_opener_share=max_opener_share)
    (logger.warning if not audit.passed else logger.info)("style audit: %s", audit.message)
    if not audit.passed and action == "fail":
        raise SystemExit(f"style audit failed: {audit.message}")
    return audit
