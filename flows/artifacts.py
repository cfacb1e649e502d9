"""What the round flow shows where people look: the final Prefect state, its tags, and artifacts that render.

* :func:`verdict_state` - the round's final state says the verdict in Prefect's own state names, because the UI's
  run lists (the Runs page, a deployment's Runs tab, the dashboard's counts) filter on built-in state names and
  hide a state with a name of its own (PrefectHQ/prefect#12006, #16402, #22665): a passing round is
  ``Completed`` (green), a blocked one ``Failed`` (red: the release failed its gates, and the dashboard counts it),
  each with the verdict's summary as its message and the round manifest as its data.
* :func:`error_state` - a round that broke (a stage failed, an input was refused) ends ``Crashed``: a third look
  in every list, so a broken stage is never mistaken for a verdict; its message is the one-line error.
* :func:`add_flow_run_tags` - tags on the running flow run (``preset:``, ``launcher:``, then ``verdict:pass`` /
  ``verdict:block`` or ``error:<stage>``), which the run lists show beside the run's name (the round id) and
  the UI's tag filter selects on.
* :func:`embed_images` - the gate report links its plots by relative path (``plots/x.png``), which the Prefect
  UI cannot resolve; the artifact gets them as base64 ``data:image/png`` URIs, which Prefect's markdown
  artifact renderer displays (the artifact is stored in the Prefect database, so the images travel with it).
* :func:`ordered_rows` - Prefect's table artifact takes its columns from the first row's keys, in order
  (the UI reads ``Object.keys(rows[0])``); manifests are written with sorted keys, so rows read back from one
  come alphabetical. This rebuilds each row with gate, verdict, reason first, then the columns that identify a
  row (text), then numbers, then columns empty everywhere, every row carrying the union of the keys, so no column
  is lost because the first row lacked it.
"""

from __future__ import annotations

import base64
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from prefect.states import Completed, Crashed, Failed, State

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
    """Rows with the same keys in the same order: ``first`` (those present), then the columns that say what a row
    is (any text value), then the numbers, then the columns empty in every row; first-seen order within each."""
    rows = [dict(r) for r in rows]
    rest: list[str] = []
    for r in rows:
        rest += [k for k in r if k not in first and k not in rest]

    def kind(column: str) -> int:
        values = [r.get(column) for r in rows if r.get(column) is not None]
        if not values:
            return 2
        return 0 if any(isinstance(v, str) for v in values) else 1

    rest.sort(key=kind)  # stable: first-seen order within each kind
    cols = [c for c in first if any(c in r for r in rows)] + rest
    return [{c: r.get(c) for c in cols} for r in rows]


#: Characters of each blocking gate's reason in the state message; the full reasons are in the gate report.
REASON_CHARS = 300
_URL = re.compile(r"\S+://\S+")
# /a/b/c, ./a/b, ~/a/b, and an absolute path after "name:" (a judge named "reward_model:/runs/r1/...")
_PATH = re.compile(r"(?:(?<=\w:)(?=/)|(?<![\w:/.@+-]))(?:/|\.{1,2}/|~/)?(?:[\w.@+-]+/)*([\w.@+-]+/[\w.@+-]+)")


def short_reason(reason: str, limit: int = REASON_CHARS) -> str:
    """``reason`` for one line of the state message: file paths shortened to their last two parts (a reason that
    starts with a checkpoint's path reads as ``reward_model/checkpoint-40``, not a folder's full path), URLs kept, cut at a word boundary before ``limit``
    characters with an ellipsis."""
    text, parts, last = " ".join(reason.split()), [], 0
    for url in _URL.finditer(text):  # paths shortened outside URLs only
        parts += [_PATH.sub(r"\1", text[last:url.start()]), url.group(0)]
        last = url.end()
    text = "".join(parts) + _PATH.sub(r"\1", text[last:])
    if len(text) <= limit:
        return text
    cut = text[: limit - 1].rsplit(" ", 1)[0].rstrip(" ,;:")
    return cut + "…"


def verdict_message(verdict: str, gates: Sequence[Mapping[str, Any]]) -> str:
    """The final state's message: which gates block and why (each reason shortened by :func:`short_reason`), or that
    all pass; at most ``MAX_MESSAGE`` characters, cut between gates."""
    if verdict == "pass":
        return f"Release PASSED: all {len(gates)} gates pass ({', '.join(g['name'] for g in gates)})."
    blocking = [g for g in gates if g["verdict"] != "pass"]
    msg = f"Release BLOCKED by {len(blocking)} of {len(gates)} gates (full reasons: the gate-report artifact)."
    for i, g in enumerate(blocking):
        part = f" | {g['name']} {g['verdict']}: {short_reason(g['reason'])}"
        more = f" | and {len(blocking) - i} more"
        if len(msg) + len(part) + (len(more) if i < len(blocking) - 1 else 0) > MAX_MESSAGE:
            return msg + more
        msg += part
    return msg


def verdict_state(verdict: str, gates: Sequence[Mapping[str, Any]], data: Any) -> State:
    """The round's final state: ``Completed`` for "pass", ``Failed`` for "block", with
    ``message=verdict_message(...)`` and ``data=data`` (the round manifest; :func:`round_result` gives it back).

    Raises:
        ValueError: verdict not "pass" or "block".
    """
    if verdict not in ("pass", "block"):
        raise ValueError(f"verdict must be 'pass' or 'block', got {verdict!r}")
    make = Completed if verdict == "pass" else Failed
    return make(message=verdict_message(verdict, gates), data=data)


def error_state(err: Exception) -> State:
    """The final state of a round that broke: ``Crashed`` with the error's one line as message and the exception
    as data (so ``state.result()`` raises it again)."""
    return Crashed(message=f"Round broke, no verdict: {type(err).__name__}: {err}", data=err)


def round_result(state: State) -> dict:
    """The round manifest from the flow's final state (:func:`verdict_state`'s data, pass or block).

    Raises:
        the round's own error for an :func:`error_state` (or any other failed state).
    """
    data = state.result(raise_on_failure=False)
    if isinstance(data, BaseException):
        raise data
    if not isinstance(data, dict):
        state.result()  # a state this module did not make: Prefect's own error
        raise TypeError(f"round ended in {state.name} without a manifest: {state.message}")
    return data


def add_flow_run_tags(*tags: str, log: logging.Logger | logging.LoggerAdapter | None = None) -> None:
    """Add ``tags`` to the running flow run (no-op outside one). A Prefect API that cannot be reached is a warning on
    ``log``, not an error: tags help people find a round, the round's result does not depend on them."""
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run

    run_id = flow_run.get_id()
    if not run_id:
        return
    try:
        with get_client(sync_client=True) as client:
            current = client.read_flow_run(run_id).tags
            client.update_flow_run(run_id, tags=sorted(set(current) | set(tags)))
    except Exception as err:  # noqa: BLE001 - any API failure: the round goes on
        (log or logging.getLogger(__name__)).warning("could not tag the flow run %s: %s", run_id, err)
