"""Run a stage module and record what this process writes under one folder (used by tests/test_distributed.py).

    python -m torch.distributed.run ... tests/rank_writes.py sft.train --output_dir OUT ...

With ``RLHF_TEST_WATCH_DIR=OUT`` and ``RLHF_TEST_WRITES=PREFIX``, every file opened for writing, created folder,
rename target, removal and mode change under ``OUT`` (Python's audit events: ``open`` with a write flag,
``os.mkdir``, ``os.rename`` (``os.replace`` too), ``os.remove``, ``os.rmdir``, ``shutil.rmtree``, ``os.chmod``) is
written, relative to ``OUT``, one a line, to ``PREFIX<RANK>.txt`` when the process exits. Writes done outside
Python (safetensors' Rust writer) are not seen, but a checkpoint save also writes ``config.json`` and the tokenizer
files, and its temporary folder is created with ``os.mkdir``.
"""

from __future__ import annotations

import atexit
import os
import runpy
import sys
from pathlib import Path

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
PATH_EVENTS = {"os.mkdir": 0, "os.remove": 0, "os.rmdir": 0, "shutil.rmtree": 0, "os.chmod": 0, "os.rename": 1}


def main() -> None:
    watch = os.path.abspath(os.environ["RLHF_TEST_WATCH_DIR"])
    record = f"{os.environ['RLHF_TEST_WRITES']}{os.environ.get('RANK', '0')}.txt"
    touched: set[str] = set()

    def note(path) -> None:
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if not isinstance(path, (str, os.PathLike)):
            return  # a file descriptor
        full = os.path.abspath(os.fspath(path))
        if full == watch or full.startswith(watch + os.sep):
            touched.add(os.path.relpath(full, watch))

    def hook(event: str, args: tuple) -> None:
        if event == "open" and len(args) >= 3 and isinstance(args[2], int) and args[2] & WRITE_FLAGS:
            note(args[0])
        elif event in PATH_EVENTS and len(args) > PATH_EVENTS[event]:
            note(args[PATH_EVENTS[event]])

    def dump() -> None:
        with open(record, "w") as f:  # outside the watched folder: not recorded
            f.write("".join(f"{p}\n" for p in sorted(touched)))

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the stage modules of this tree
    sys.addaudithook(hook)
    atexit.register(dump)
    module, sys.argv = sys.argv[1], [sys.argv[1], *sys.argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
