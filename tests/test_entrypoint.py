"""rlhf.entrypoint.skip_collection_at_exit: what a process still does at exit, and what it leaves to the OS."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import atexit, gc, os, sys
    gc.set_threshold(0)  # no automatic collection may free the cycle before exit (the shutdown's still runs)
    from rlhf.entrypoint import skip_collection_at_exit

    if sys.argv[1] == "skip":
        skip_collection_at_exit()
        skip_collection_at_exit()  # idempotent: one handler
    print("handlers", atexit._ncallbacks(), flush=True)

    class Noted:
        def __init__(self, name):
            self.name = name

        def __del__(self, write=os.write, fd=sys.stdout.fileno()):  # the modules may be torn down by then
            write(fd, b"finalized " + self.name.encode() + b"\\n")

    held = Noted("global")
    cycle = Noted("cycle")
    cycle.me = cycle
    del cycle  # only a collection frees it
    atexit.register(lambda: print("handler ran", flush=True))  # registered later: runs before the freeze
    sys.stdout.write("unflushed at exit ")
    """
)


def _run(mode: str) -> str:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=60, check=True)
    return out.stdout


def test_exit_without_final_collection_keeps_handlers_flushes_and_refcount_finalizers():
    plain, skipped = _run("plain"), _run("skip")
    n_plain = int(plain.split()[1])
    assert int(skipped.split()[1]) == n_plain + 1  # registered once, though called twice
    for out in (plain, skipped):  # atexit's handlers, and the streams flushed
        assert "handler ran" in out and "unflushed at exit" in out
    # the difference: the interpreter's last collections, which alone free objects held in a cycle (and those
    # __main__'s globals hold)
    assert "finalized cycle" in plain and "finalized global" in plain
    assert "finalized cycle" not in skipped
