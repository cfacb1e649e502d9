"""What the round flow shows where people look: the final Prefect state, and artifacts that render.

* :func:`verdict_state` - the round's final state says the verdict: ``Completed(name="Blocked")`` with the
  blocking gates and their reasons as the state message, or ``Completed(name="Passed")`` with a one-line
  summary. Both are COMPLETED-type states (the round ran to the end; "Failed" stays reserved for a stage that
  broke), so calling the flow still returns the round manifest; the UI shows the name and the message.
* :func:`embed_images` - the gate report links its plots by relative path (``plots/x.png``), which the Prefect
  UI cannot resolve; the artifact gets them as base64 ``data:image/png`` URIs, which Prefect's markdown
  artifact renderer displays (the artifact is stored in the Prefect database, so the images travel with it).
* :func:`ordered_rows` - Prefect's table artifact takes its columns from the first row's keys, in order
  (the UI reads ``Object.keys(rows[0])``); manifests are written with sorted keys, so rows read back from one
  come alphabetical. This rebuilds each row with gate, verdict, reason first and every row carrying the union
  of the keys, so no column is lost because the first row lacked it.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from prefect.states import Completed, State

_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+\.png)\)")
FIRST_COLUMNS = ("gate", "verdict", "reason")
MAX_MESSAGE = 2000


def embed_images(markdown: str, base_dir: str | Path) -> str:
    """Replace ``![alt](relative.png)`` links whose file exists under ``base_dir`` by base64 data URIs.

    Absolute URLs and missing files are left as they are. Returns the new markdown.
    """
    base = Path(base_dir)

    def repl(m: re.Match) -> str:
        target = m.group(2)
        if re.match(r"^[a-z]+:", target):
            return m.group(0)
        path = Path(target) if Path(target).is_absolute() else base / target
        if not path.is_file():
            return m.group(0)
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        return f"![{m.group(1)}](data:image/png;base64,{data})"

    return _IMAGE.sub(repl, markdown)


def ordered_rows(rows: Iterable[Mapping[str, Any]], first: Sequence[str] = FIRST_COLUMNS) -> list[dict[str, Any]]:
    """Rows with the same keys in the same order: ``first`` (those present), then the rest in first-seen order."""
    rows = [dict(r) for r in rows]
    rest: list[str] = []
    for r in rows:
        rest += [k for k in r if k not in first and k not in rest]
    cols = [c for c in first if any(c in r for r in rows)] + rest
    return [{c: r.get(c) for c in cols} for r in rows]


def verdict_message(verdict: str, gates: Sequence[Mapping[str, Any]]) -> str:
    """The final state's message: which gates block and why (first sentence-ish of each reason), or that all pass."""
    if verdict == "pass":
        return f"Release PASSED: all {len(gates)} gates pass ({', '.join(g['name'] for g in gates)})."
    blocking = [g for g in gates if g["verdict"] != "pass"]
    parts = [f"{g['name']} {g['verdict']}: {g['reason'][:220].rstrip()}" for g in blocking]
    msg = f"Release BLOCKED by {len(blocking)} of {len(gates)} gates. " + " | ".join(parts)
    return msg if len(msg) <= MAX_MESSAGE else msg[: MAX_MESSAGE - 3] + "..."


def verdict_state(verdict: str, gates: Sequence[Mapping[str, Any]], data: Any) -> State:
    """The round's final state: ``Completed(name="Blocked" | "Passed", message=verdict_message(...), data=data)``.

    Raises:
        ValueError: verdict not "pass" or "block".
    """
    if verdict not in ("pass", "block"):
        raise ValueError(f"verdict must be 'pass' or 'block', got {verdict!r}")
    return Completed(name="Passed" if verdict == "pass" else "Blocked", message=verdict_message(verdict, gates),
                     data=data)
