"""Decontaminate imported pairs against every gate suite (a stopgap).

Rebase note: the shared implementation is being written as ``data/decontamination.py`` (normalised prompt hash and
n-gram overlap, DESIGN.md "Training data is decontaminated against every gate suite"); at merge, :func:`decontaminate`
must call it instead of the local normalised-prompt-hash check below.

A pair is contaminated when the normalised text (:func:`flywheel.store.normalise_prompt`) of any user turn of its
prompt equals the normalised text of a prompt of a gate suite. Contaminated pairs are removed and counted per suite.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import yaml

from data.expert import ExpertPair

from .store import normalise_prompt, text_hash

__all__ = ["decontaminate", "gate_suites_from_generations", "gate_suites_from_recipe"]


def _key(text: str) -> str:
    return text_hash(normalise_prompt(text))


def decontaminate(pairs: Sequence[ExpertPair], suites: Mapping[str, Iterable[str]]) -> tuple[list[ExpertPair], dict]:
    """Remove pairs whose prompt overlaps a gate suite.

    Args:
        pairs: imported expert pairs.
        suites: ``{suite name: prompts}`` (every gate suite of the round).

    Returns:
        ``(kept, report)``; report: ``{"n_in", "n_removed", "n_kept", "per_suite": {suite: n_overlapping},
        "removed": [pair ids], "method": ...}``.
    """
    index: dict[str, set[str]] = {}
    for name, prompts in suites.items():
        for p in prompts:
            index.setdefault(_key(p), set()).add(name)
    per_suite = {name: 0 for name in suites}
    kept, removed = [], []
    for pair in pairs:
        hits = set()
        for m in pair.prompt:
            if m.role == "user":
                hits |= index.get(_key(m.content), set())
        if hits:
            removed.append(pair.id)
            for name in hits:
                per_suite[name] += 1
        else:
            kept.append(pair)
    report = {
        "method": "normalised prompt hash (local stopgap; switches to data/decontamination.py)",
        "n_in": len(pairs),
        "n_removed": len(removed),
        "n_kept": len(kept),
        "per_suite": per_suite,
        "removed": removed,
    }
    return kept, report


def gate_suites_from_recipe(recipe: str | Path) -> dict[str, list[str]]:
    """Every prompt of every suite file a gate recipe names (its ``*_data`` keys but the traffic table)."""
    from data.loaders import load_eval_prompts

    cfg = yaml.safe_load(Path(recipe).read_text()) or {}
    out = {}
    for key, source in sorted(cfg.items()):
        if key.endswith("_data") and key != "traffic_data" and isinstance(source, str):
            rows = load_eval_prompts(source, mode="lenient", max_reject_rate=1.0)
            out[key.removesuffix("_data")] = [r.prompt for r in rows]
    return out


def gate_suites_from_generations(path: str | Path) -> dict[str, list[str]]:
    """The prompts a round's gates actually sent (``runs/<r>/gates/generations.jsonl``), per suite."""
    out: dict[str, list[str]] = {}
    for line in Path(path).read_text().splitlines():
        row = json.loads(line)
        prompt = row.get("prompt")
        if isinstance(prompt, list):
            texts = [m.get("content", "") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        else:
            texts = [str(prompt)]
        out.setdefault(row["suite"], []).extend(texts)
    return out
