"""What of a stage process's output reaches the flow log, and at which level.

A stage streams everything to its ``stage.log``; the flow log (Prefect's UI, the terminal) gets the same lines with
two differences, so that the UI's level filter finds a stage's warnings and its log is not mostly progress bars:

- each line keeps its level: the stages log with ``rlhf.entrypoint``'s format (``<date> <time> LEVEL name: ...``),
  Python's warnings print ``file:line: SomeWarning: ...``, and an uncaught error prints ``Traceback ...`` and
  ``SomeError: ...``; anything else is INFO;
- a progress bar (tqdm's ``desc: 42%|####  | 21/50 [00:10<00:14, 2.1it/s]``, one line per refresh once the
  launcher has read ``\\r`` as a line end) is relayed at most once every ``every_s`` seconds per bar, and once
  when it reaches its total.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable

#: Seconds between two relayed refreshes of one progress bar.
PROGRESS_EVERY_S = 10.0

_LOGGING_LINE = re.compile(r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d[,.\d]* (DEBUG|INFO|WARNING|ERROR|CRITICAL) ")
_PY_WARNING = re.compile(r":\d+: \w*Warning: ")
_ERROR_LINE = re.compile(r"^(Traceback \(most recent call last\):|[A-Za-z_][\w.]*(Error|Exception|Interrupt): )")
_TQDM = re.compile(r"(\d+)%\|[^|]*\|\s*(\d+)/(\d+)")  # percentage, bar, n/total


def line_level(text: str) -> int:
    """The logging level a stage's output line was written at (see the module docstring); INFO when unknown."""
    if m := _LOGGING_LINE.match(text):
        return logging.getLevelName(m.group(1))
    if _ERROR_LINE.match(text):
        return logging.ERROR
    if _PY_WARNING.search(text):
        return logging.WARNING
    return logging.INFO


def is_progress_line(text: str) -> bool:
    """True for a progress-bar refresh (tqdm's bar, or its rate suffix ``it/s]`` / ``s/it]``)."""
    return bool(_TQDM.search(text)) or "it/s]" in text or "s/it]" in text


class StageLogRelay:
    """Callable on each line of a stage's output; relays it to ``log_at(level, message)`` as the module docstring
    says, each message prefixed ``[<stage>] ``.

    ``clock`` (seconds, monotonic) is there for tests. A bar is told apart from another by the text before its
    percentage (its description) and its total.
    """

    def __init__(self, stage: str, log_at: Callable[[int, str], None], *, every_s: float = PROGRESS_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stage, self.log_at, self.every_s, self.clock = stage, log_at, every_s, clock
        self._last: dict[tuple[str, str], float] = {}  # bar -> when its last refresh was relayed
        self._finished: set[tuple[str, str]] = set()  # bars whose 100% line was relayed

    def __call__(self, line: str) -> None:
        text = line.rstrip()
        if not text.strip():
            return
        if is_progress_line(text):
            if not self._relay_progress(text):
                return
            level = logging.INFO
        else:
            level = line_level(text)
        self.log_at(level, f"[{self.stage}] {text}")

    def _relay_progress(self, text: str) -> bool:
        bar = _TQDM.search(text)
        key = (text[: bar.start()].strip(), bar.group(3)) if bar else ("", "")
        if bar is not None and bar.group(2) == bar.group(3):  # at its total: once
            if key in self._finished:
                return False
            self._finished.add(key)
            return True
        self._finished.discard(key)  # the same bar started again (a new epoch, a new evaluation)
        now = self.clock()
        if now - self._last.get(key, -math.inf) < self.every_s:
            return False
        self._last[key] = now
        return True
