"""Who answers: the identity of a judge behind an OpenAI-compatible endpoint, measured at the start of every run.

A served model's *name* says nothing about who answers: two endpoints can serve different weights under one name,
and one endpoint can swap its weights between two runs. So an ``openai`` judge's identity is resolved from the
server itself each time a judge is built (every gate run, every ``rlhf judge agreement``), and it keys the judge's
cached answers (``judging.openai_client``) and its cached agreement with expert labels (``judging.qualify``):

* ``endpoint``: the base URL without credentials, query or fragment (:func:`public_endpoint`);
* ``model``: the name the requests carry, and ``served``: what ``GET /models`` reports for it (id, owner, and any
  ``root``/``parent``/revision/fingerprint/hash field the server adds; never ``created``, which vLLM stamps with the
  request time);
* the decoding settings (``max_tokens``, ``temperature``) and the prompt template's sha256 (the caller adds them);
* ``probe``: the answers to a fixed probe set, asked fresh (never from a cache) at temperature 0: the four PandaLM
  pairs of ``probe_pairs.json`` (from the bundled ``demo:pandalm/testset-v1.jsonl.gz``; two in which the shorter
  response is better, two in which the longer one is), each in both orders, filled into the judge's own template.
  Recorded: the sha256 of the probe messages, the sha256 of the answers (stripped text, in order), and the distinct
  ``model`` and ``system_fingerprint`` values the completions reported (e.g. the dated snapshot a hosted alias
  resolved to).

Two judges with the same identity answered the probe identically, under the same reported model and fingerprint;
any difference in the answers, the listing, the endpoint, the template or the decoding is a different judge:
its agreement is measured again and none of the other judge's cached answers is reused. What the probe cannot
see: two models that answer all eight probe prompts identically and report the same listing are one judge here.

:func:`check_identity` compares the identity with the last one seen for the same (endpoint, model name) and says
whether the judge is new, unchanged or changed (and in which fields), so a swap is reported, not only re-measured.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from rlhf.lineage import json_hash

from .cache import JudgmentCache

logger = logging.getLogger(__name__)

PROBE_PAIRS_FILE = Path(__file__).with_name("probe_pairs.json")

#: ``GET /models`` fields kept in the identity: the id and owner, where the weights came from (vLLM's ``root`` and
#: ``parent``), and any field naming a revision, fingerprint or hash. ``created`` and ``permission`` are left out:
#: vLLM fills them with the time of the request.
_SERVED_FIELDS = ("id", "owned_by", "root", "parent")
_REVISION_FIELD = re.compile(r"revision|fingerprint|sha|hash|digest|checksum|version|commit", re.IGNORECASE)


def public_endpoint(base_url: str) -> str:
    """``base_url`` without user, password, query or fragment (a key passed in the URL never reaches a record).

    >>> public_endpoint("https://user:secret@api.example.com:8443/v1/?api-key=s3cret#x")
    'https://api.example.com:8443/v1'
    """
    parts = urlsplit(base_url.strip())
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path.rstrip("/"), "", ""))


def load_probe_pairs(path: str | Path = PROBE_PAIRS_FILE) -> list[dict[str, str]]:
    """The fixed probe pairs: ``[{"prompt", "response_a", "response_b", "source", "row", ...}]`` (4 pairs).

    Raises:
        ValueError: a pair without a string ``prompt``, ``response_a`` or ``response_b`` (names the file and pair).
    """
    pairs = json.loads(Path(path).read_text(encoding="utf-8"))
    for i, p in enumerate(pairs):
        for key in ("prompt", "response_a", "response_b"):
            if not isinstance(p.get(key), str):
                raise ValueError(f"{path}: pair {i}: field {key!r} is missing or not a string")
    return pairs


def served_model(models: list[dict[str, Any]] | None, model: str) -> dict[str, Any]:
    """What the server's ``GET /models`` listing says about ``model``.

    Args:
        models: the listing's entries as dicts (None: the server has no ``/models`` route).
        model: the model name the requests carry.

    Returns:
        ``{"listed": True, "id", "owned_by", ...}`` with the fields of ``_SERVED_FIELDS`` and any revision-like
        field (:data:`_REVISION_FIELD`); ``{"listed": False, "n_listed": k}`` when the listing lacks the model (a
        server that loads models on request); ``{"listed": None}`` when there is no listing.
    """
    if models is None:
        return {"listed": None}
    entry = next((m for m in models if m.get("id") == model), None)
    if entry is None:
        return {"listed": False, "n_listed": len(models)}
    kept = {k: entry[k] for k in _SERVED_FIELDS if entry.get(k) is not None}
    kept |= {k: v for k, v in entry.items() if _REVISION_FIELD.search(k) and v not in (None, "")}
    return {"listed": True, **kept}


def probe_record(messages: list[list[dict]], answers: list[str], response_models: list[str | None],
                 fingerprints: list[str | None]) -> dict[str, Any]:
    """The probe part of an identity (module docstring): hashes of what was asked and of what came back, and the
    distinct reported models and system fingerprints (sorted; empty values dropped).

    Args:
        messages: the probe's message lists, shape (n,); answers: the answer texts, shape (n,); response_models,
            fingerprints: each completion's ``model`` and ``system_fingerprint`` (None when absent), shape (n,).
    """
    return {
        "n": len(messages),
        "messages_sha256": json_hash(messages),
        "answers_sha256": json_hash([a.strip() for a in answers]),
        "response_models": sorted({m for m in response_models if m}),
        "system_fingerprints": sorted({f for f in fingerprints if f}),
    }


def _lineage_key(identity: dict[str, Any]) -> dict[str, Any]:
    return {"backend": identity.get("backend"), "endpoint": identity.get("endpoint"), "model": identity.get("model")}


def check_identity(cache_dir: str | Path, identity: dict[str, Any]) -> dict[str, Any]:
    """Compare ``identity`` with the last identity seen for the same (backend, endpoint, model name), and record it.

    Stored under ``<cache_dir>/identities`` (one atomic JSON file per (backend, endpoint, model name)).

    Returns:
        ``{"status": "new" | "unchanged" | "changed", "identity_hash", "previous_identity_hash" (None when new),
        "changed": [top-level fields that differ, e.g. "probe"]}``. A change is logged as a warning.
    """
    cache = JudgmentCache(Path(cache_dir) / "identities")
    key = cache.key(_lineage_key(identity))
    now = json_hash(identity)
    before = cache.get(key)
    if before is None:
        status, previous, changed = "new", None, []
    else:
        previous = before["identity_hash"]
        old = before["identity"]
        changed = sorted(k for k in set(old) | set(identity) if old.get(k) != identity.get(k))
        status = "unchanged" if previous == now else "changed"
    if status == "changed":
        logger.warning("judge %s at %s is not the judge seen last time under that name (%s differ): its agreement "
                       "is measured again and no cached answer of the other judge is reused",
                       identity.get("model"), identity.get("endpoint"), ", ".join(changed))
    if status != "unchanged":
        cache.put(key, {"identity_hash": now, "identity": identity})
    return {"status": status, "identity_hash": now, "previous_identity_hash": previous, "changed": changed}
