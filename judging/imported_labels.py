"""Imported human or expert labels as a judge (``labels`` backend), for teams that judge with people.

The file is JSONL (one object per line) or CSV (a header row), with the fields ``id`` and ``verdict``:

* ``id``: the pair's id: ``judging.judges.pair_id(prompt, response_a, response_b)`` (the gates write every pair
  they need judged, with its id, to ``pairs_to_judge.jsonl``), or the id the caller passes (e.g. the PandaLM pair
  ids ``pandalm-<idx>`` of the agreement data);
* ``verdict``: ``1`` (response A better), ``2`` (response B better), ``0`` or ``tie`` (PandaLM's convention,
  parsed by ``judging.scoring.parse_judge_verdict``).

A row without either field, a verdict that is not one of these, or an id given twice is an error naming the file,
the row and the field. A pair the gates ask about that has no label is an error naming its id (never skipped).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from data.labels import FIRST, SECOND, TIE, UNPARSED, label_to_preference
from judging.scoring import parse_judge_verdict

from .judges import Judge, Judgment, check_lengths, pair_id


def read_label_file(path: str | Path) -> dict[str, int]:
    """``{id: label}`` (0 tie, 1 A better, 2 B better) from a JSONL or CSV file.

    Raises:
        FileNotFoundError: no such file. ValueError: a bad row (names file, row (1-based; CSV counts the header as
        row 1) and field).
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"judge.labels {path}: no such file")
    with open(p, encoding="utf-8", newline="") as f:
        if p.suffix.lower() == ".csv":
            rows = [(i + 2, r) for i, r in enumerate(csv.DictReader(f))]
        else:
            rows = []
            for i, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    rows.append((i, json.loads(line)))
                except json.JSONDecodeError as err:
                    raise ValueError(f"{path}: row {i}: not JSON ({err})") from None
    out: dict[str, int] = {}
    for row, rec in rows:
        if not isinstance(rec, dict):
            raise ValueError(f"{path}: row {row}: expected an object with id and verdict")
        for fld in ("id", "verdict"):
            if rec.get(fld) in (None, ""):
                raise ValueError(f"{path}: row {row}: field {fld!r} is missing or empty")
        label = parse_judge_verdict(rec["verdict"])
        if label == UNPARSED:
            raise ValueError(f"{path}: row {row}: field 'verdict' is {rec['verdict']!r}; expected 1, 2, 0 or tie")
        key = str(rec["id"])
        if key in out:
            raise ValueError(f"{path}: row {row}: field 'id' {key!r} appears twice")
        out[key] = label
    return out


class LabelsJudge(Judge):
    """Imported labels as a judge: looks each pair's id up in the label file.

    Args:
        path: the label file (``read_label_file``).
    """

    backend = "labels"

    def __init__(self, path: str):
        from rlhf.lineage import file_hash

        self.path = str(path)
        self.labels = read_label_file(path)
        self._hash = file_hash(path)

    def identity(self) -> dict[str, Any]:
        return {"backend": "labels", "model": self.path, "content_hash": self._hash}

    def has(self, ids) -> list[bool]:
        """Which of ``ids`` have a label."""
        return [str(i) in self.labels for i in ids]

    def judge(self, prompts, responses_a, responses_b, ids=None) -> list[Judgment]:
        """The imported label of each pair (raw = the label: 0, 1 or 2).

        Raises:
            KeyError: a pair has no label (names its id and the file).
        """
        check_lengths(prompts, responses_a, responses_b, ids)
        if ids is None:
            ids = [pair_id(p, a, b) for p, a, b in zip(prompts, responses_a, responses_b)]
        missing = [i for i in ids if str(i) not in self.labels]
        if missing:
            raise KeyError(f"judge.labels {self.path}: no label for {len(missing)} of {len(ids)} pairs, "
                           f"e.g. id {missing[0]!r}")
        labels = [self.labels[str(i)] for i in ids]
        assert set(labels) <= {TIE, FIRST, SECOND}
        return [Judgment(float(p), lab) for p, lab in zip(label_to_preference(labels), labels)]
