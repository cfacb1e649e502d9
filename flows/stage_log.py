"""What of a stage process's output reaches the flow log, and at which level.

A stage streams everything to its ``stage.log``; the flow log (Prefect's UI, the terminal) gets the same lines with
two differences, so that the UI's level filter finds a stage's warnings and its log is not mostly progress bars:

- each line keeps its level: the stages log with ``rlhf.entrypoint``'s format (``<date> <time> LEVEL name: ...``),
  Python's warnings print ``file:line: SomeWarning: ...``, and an uncaught error prints ``Traceback ...`` and
  ``SomeError: ...``; anything else is INFO;
- a progress bar (tqdm's ``desc: 42%|####  | 21/50 [00:10<00:14, 2.1it/s]``, one line per refresh once the
  launcher has read ``\\r`` as a line end) is relayed at most once every ``every_s`` seconds per bar, and once
  when it reaches its total;
- when a stage fails, ``accelerate launch`` (1.16) raises ``CalledProcessError`` from ``RuntimeError(<the
  stage's stderr, up to its last 512 KiB>)``, which prints the whole stderr again and then its own traceback: that
  repeat and the launcher's frames are replaced by one line, and its ``CalledProcessError`` line (the exit
  status or signal) is relayed. The stage's own traceback, printed once before, stays.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections import Counter, deque
from collections.abc import Callable

#: Seconds between two relayed refreshes of one progress bar.
PROGRESS_EVERY_S = 10.0
#: Characters of recent output kept to recognise the launcher's repeat (it repeats at most the last 512 KiB).
REPEAT_WINDOW_CHARS = 1 << 20

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
        # the last lines (about REPEAT_WINDOW_CHARS of them, more than the launcher keeps): what its repeat is made of
        self._window: deque[str] = deque()
        self._window_chars = 0
        self._seen: Counter[str] = Counter()
        self._seen_traceback = False  # the stage printed a traceback: a repeat can follow
        self._repeat: str | None = None  # None, "stderr" (inside the repeat), "launcher" (its own frames)
        self._repeated = 0

    def _remember(self, text: str) -> None:
        self._window.append(text)
        self._seen[text] += 1
        self._window_chars += len(text) + 1
        while self._window_chars > REPEAT_WINDOW_CHARS:
            old = self._window.popleft()
            self._window_chars -= len(old) + 1
            self._seen[old] -= 1
            if not self._seen[old]:
                del self._seen[old]

    def _in_launcher_repeat(self, text: str) -> bool:
        """True for a line of accelerate's repeat of the stage's stderr or of its own traceback (not relayed)."""
        if self._repeat is None:
            rest = text[len("RuntimeError: "):].strip() if text.startswith("RuntimeError: ") else ""
            if not (self._seen_traceback and rest and any(seen.endswith(rest) for seen in self._seen)):
                return False
            self._repeat, self._repeated = "stderr", 1
            return True
        if self._repeat == "stderr" and text in self._seen:
            self._repeated += 1
            return True
        if self._repeat == "stderr":  # the first line the stage did not print: the launcher's own traceback
            self.log_at(logging.INFO, f"[{self.stage}] (accelerate repeated {self._repeated} lines of the stage's "
                                      "output and its own traceback: not shown again, they are in stage.log)")
            self._repeat = "launcher"
        if text.startswith("subprocess.CalledProcessError:"):
            self._repeat = None
            return False
        return True

    def __call__(self, line: str) -> None:
        text = line.rstrip()
        if not text.strip():
            return
        if self._in_launcher_repeat(text):
            return
        self._remember(text)
        self._seen_traceback = self._seen_traceback or text.startswith("Traceback (most recent call last):")
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
