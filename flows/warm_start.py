"""Start local stage processes from a warm interpreter: one process imports torch, transformers, datasets,
accelerate, TRL, wandb and sklearn's metrics once and forks each stage from there, instead of every stage paying
those imports again.

Why: on a 2-core CPU ``import sft.train`` takes 6-9 s, all of it in those libraries, and a demo round starts four
or five stage processes. A fork of an interpreter that already holds the imports starts the stage at once; the
stage then imports only this project's modules (fresh from disk: nothing of the project is preloaded, so an edit
between stages is seen as it would be by a new process).

What a forked stage keeps of a process started by ``python -m <module>``:

- its own session and process group (``os.setsid``; the flow stops it as it stops any stage, flows/interrupt.py),
  stdout and stderr on the flow's pipe, stdin on ``/dev/null``, the working directory and ``sys.argv`` of the
  command, and the process title of the command (``setproctitle``: ``ps`` and ``/proc/<pid>/cmdline`` name it);
- its exit code: the server reaps the child and reports ``os.waitstatus_to_exitcode`` (a signal gives ``-N``, as
  ``subprocess`` reports it);
- the environment: a request is served only when its environment equals, key for key, the one the server started
  with, each variable the server's imports set (sklearn's ``KMP_*`` defaults, torch's ``TORCHINDUCTOR_CACHE_DIR``)
  either as it started or as they set it (:func:`same_process_env`), because libraries read some variables
  when they are imported (the OpenMP runtime reads ``OMP_NUM_THREADS`` when it is loaded, ``LD_PRELOAD`` picks the
  allocator at exec, huggingface_hub reads ``HF_HUB_OFFLINE``). Any other command, environment or machine starts
  the stage the ordinary way (:func:`spawn` returns None).

Only for the local launch of one process on a machine without a GPU: a CUDA or ROCm driver initialised before a
fork does not survive into the child, and a GPU stage spends minutes where the imports cost seconds.
``RLHF_WARM_START=0`` turns it off.

The server lives as long as the process that started it: it exits when its control socket closes (the flow
process exited, or was killed), and leaves running stages alone, as the flow does when it is killed.
"""

from __future__ import annotations

import atexit
import gc
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

#: sklearn.metrics: the reward model's and the gates' agreement statistics (its ``KMP_*`` defaults, set at import,
#: are among the variables :func:`same_process_env` allows either way).
PRELOAD = ("torch", "transformers", "datasets", "accelerate", "trl", "wandb", "sklearn.metrics", "setproctitle")
# Names that pull in the heavy submodules (transformers loads models and trainers lazily on first access).
PRELOAD_ATTRS = {
    "transformers": ("AutoModelForCausalLM", "AutoModelForSequenceClassification", "AutoTokenizer", "Trainer"),
    "trl": ("SFTTrainer", "DPOTrainer", "RewardTrainer"),
}
READY_TIMEOUT_S = 300.0
_MAX_MESSAGE = 1 << 20


def enabled(environ: dict[str, str] | None = None) -> bool:
    """Whether stages may start from a warm interpreter here: Linux (``fork``, descriptor passing), no GPU device
    node (``/dev/nvidia*``, ``/dev/kfd``), and ``RLHF_WARM_START`` not set to 0/false/no/off."""
    environ = os.environ if environ is None else environ
    if environ.get("RLHF_WARM_START", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if not sys.platform.startswith("linux") or not hasattr(socket, "send_fds"):
        return False
    dev = Path("/dev")
    return not (any(dev.glob("nvidia*")) or (dev / "kfd").exists())


def direct_command(cmd: list[str]) -> tuple[dict[str, str], list[str]] | None:
    """``(variables, ["-m", module, *args])`` of a command ``env K=V ... <this python> -m module ...`` (the form
    :func:`flows.stages.launch_command` gives a local stage of one process), or None for any other command."""
    if len(cmd) < 4 or cmd[0] != "env":
        return None
    variables, i = {}, 1
    while i < len(cmd) and "=" in cmd[i] and not cmd[i].startswith("-"):
        key, value = cmd[i].split("=", 1)
        variables[key] = value
        i += 1
    if i + 2 >= len(cmd) or cmd[i] != sys.executable or cmd[i + 1] != "-m":
        return None
    return variables, cmd[i + 1:]


class WarmProcess:
    """A stage forked by the server, with the part of :class:`subprocess.Popen` that flows/interrupt.py uses:
    ``pid`` (also its process group), ``stdout`` (text), ``poll()``, ``wait()``, ``returncode``."""

    def __init__(self, pid: int, stdout: io.TextIOBase, status: socket.socket):
        self.pid, self.stdout, self.returncode = pid, stdout, None
        self._done = threading.Event()
        threading.Thread(target=self._await_status, args=(status,), daemon=True, name=f"warm-{pid}").start()

    def _await_status(self, status: socket.socket) -> None:
        try:
            data = status.recv(64)
        except OSError:
            data = b""
        status.close()
        if data:
            self.returncode = int(data.decode())
        else:  # the server died first: the child is not ours to reap; wait until its group is gone, report a failure
            while _group_alive(self.pid):  # flows.interrupt imports this module: no import back
                threading.Event().wait(0.1)
            self.returncode = 1
        self._done.set()

    def poll(self) -> int | None:
        return self.returncode if self._done.is_set() else None

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(f"warm stage {self.pid}", timeout)
        return self.returncode


def same_process_env(env: dict[str, str], start_env: dict[str, str], imported_env: dict[str, str] | None) -> bool:
    """Whether a stage started cold with environment ``env`` would run with the environment a server started with
    ``start_env`` holds after its imports (``imported_env``; None: not known yet): every variable as in
    ``start_env``, except that one the imports set (added or changed) may be as in ``start_env`` or hold the value
    they set. A cold stage's own imports set it the same way (sklearn's ``setdefault`` where it is absent, torch's
    inductor cache folder written either way), so either way the stage ends with ``imported_env``; the flow process
    may or may not have imported those libraries itself. Not covered: a library that reads such a variable while it
    is loaded, before the import that sets it (Intel's OpenMP runtime reads ``KMP_*``; torch's wheels use GNU's)."""
    if env == start_env:
        return True
    if imported_env is None:
        return False
    added = {k: v for k, v in imported_env.items() if start_env.get(k) != v}
    if any(k not in imported_env for k in start_env):  # an import removed a variable: only the exact match is safe
        return env == imported_env
    return all(env.get(k) == start_env.get(k) or (k in added and env.get(k) == added[k])
               for k in {*env, *start_env, *added})


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - a member we cannot signal still exists
        return True
    return True


class WarmServer:
    """The flow's side of one warm interpreter started with environment ``env``.

    Raises (from :meth:`spawn`): nothing; a server that failed to start or died answers None and the stage starts
    the ordinary way.
    """

    def __init__(self, env: dict[str, str]):
        self.env, self.imported_env = dict(env), None
        self._control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "flows.warm_start", str(theirs.fileno())], env=self.env, pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        theirs.close()
        self._lock, self._ready = threading.Lock(), None

    def ready(self) -> bool:
        """Wait (at most READY_TIMEOUT_S) until the server has imported :data:`PRELOAD`; False if it failed."""
        if self._ready is None:
            self._control.settimeout(READY_TIMEOUT_S)
            try:
                message = self._control.recv(_MAX_MESSAGE)
                self.imported_env = json.loads(message[len(b"ready "):]) if message.startswith(b"ready ") else None
                self._ready = self.imported_env is not None
            except (OSError, ValueError):
                self._ready = False
            self._control.settimeout(None)
        return self._ready

    def serves(self, env: dict[str, str]) -> bool:
        """Whether a stage with environment ``env`` may be forked here: ``env`` is the one the server started with,
        or that one with some of what the server's imports set (:func:`same_process_env`: torch sets
        ``TORCHINDUCTOR_CACHE_DIR`` when imported, in the flow's process as in the server's, so a stage environment
        taken after the flow imported torch holds it)."""
        return env == self.env or (self.ready() and same_process_env(env, self.env, self.imported_env))

    def spawn(self, argv: list[str], env: dict[str, str]) -> WarmProcess | None:
        """Fork ``python <argv>`` (``argv`` starts with ``-m module``) with ``env`` from the server, or None when the
        server does not serve that environment (:meth:`serves`) or is not serving."""
        with self._lock:
            if not self.serves(env) or not self.ready():
                return None
            out_r, out_w = os.pipe()
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            request = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": env}).encode()
            try:
                socket.send_fds(self._control, [request], [out_w, theirs.fileno()])
                ours.settimeout(60.0)  # it answers right after the fork; a server that does not is not used
                reply = ours.recv(64)
                ours.settimeout(None)
            except OSError:
                reply = b""
            finally:
                os.close(out_w)
                theirs.close()
            if not reply.startswith(b"pid "):
                os.close(out_r)
                ours.close()
                self._ready = False
                return None
        return WarmProcess(int(reply.split()[1]), open(out_r, encoding=None, buffering=1), ours)

    def close(self) -> None:
        """Let the server go: it exits once the stages it forked have ended and their exit codes are reported."""
        self._control.close()


_server: WarmServer | None = None
_server_lock = threading.Lock()


@atexit.register
def _let_go(timeout_s: float = 5.0) -> None:
    """At exit, let the server go and reap it: its exit then carries its stages' resource use into this process's
    ``RUSAGE_CHILDREN`` (the peak RSS a round reports), and no orphan is left. A server whose stages still run (an
    interrupted flow that stopped waiting) is not waited for beyond ``timeout_s``."""
    if _server is not None:
        _server.close()
        try:
            _server._proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass


def prestart(env: dict[str, str]) -> None:
    """Start the warm interpreter for stages with environment ``env`` now, so its imports overlap the caller's
    work (a round's config checks); no-op where :func:`enabled` is False or a server runs already (the first
    :func:`spawn` it does not serve replaces it; waiting here for its imports to compare would undo the overlap)."""
    global _server
    if enabled(env):
        with _server_lock:
            if _server is None:
                _server = WarmServer(env)


def _server_for(env: dict[str, str]) -> WarmServer | None:
    global _server
    if not enabled(env):
        return None
    with _server_lock:
        if _server is None or not _server.serves(env):
            if _server is not None:
                _server.close()
            _server = WarmServer(env)
        return _server


def spawn(cmd: list[str], env: dict[str, str]) -> WarmProcess | None:
    """The stage of ``cmd`` forked from the warm interpreter (started here, with the command's environment, if none
    runs with it), or None: ``cmd`` is not a direct local stage (:func:`direct_command`), warm starts are off here
    (:func:`enabled`), or the server failed."""
    parsed = direct_command(cmd)
    if parsed is None:
        return None
    variables, argv = parsed
    full_env = {**env, **variables}
    server = _server_for(full_env)
    return server.spawn(argv, full_env) if server is not None else None


# ----------------------------------------------------------------------------------------------------- server side


def _preload() -> None:
    import importlib

    for name in PRELOAD:
        try:
            module = importlib.import_module(name)
            for attr in PRELOAD_ATTRS.get(name, ()):
                getattr(module, attr)
        except Exception:  # noqa: BLE001 - a library that fails to import here fails in the stage, said there
            continue


def _serve(control: socket.socket, start_env: dict[str, str], imported_env: dict[str, str]) -> dict | None:
    """Serve fork requests until the control socket closes (returns None: exit), or, in a forked child, return the
    request the child is to run. A request whose environment a cold stage would not end with, from ``start_env``
    (the server's own before its imports) and ``imported_env`` (what those imports left), is refused
    (:func:`same_process_env`)."""
    import selectors

    children: dict[int, socket.socket] = {}
    selector = selectors.DefaultSelector()
    selector.register(control, selectors.EVENT_READ)
    serving = True
    while serving or children:
        if not serving:
            time.sleep(0.1)  # nothing to read any more: a pause between reaps
        elif selector.select(timeout=0.1):
            try:
                data, fds, _, _ = socket.recv_fds(control, _MAX_MESSAGE, 2)
            except OSError:
                data, fds = b"", []
            if not data:  # the owner let go: report the running stages' exit codes, then exit
                serving = False
                continue
            out_fd, status_fd = fds
            status = socket.socket(fileno=status_fd)
            request = json.loads(data)
            if not same_process_env(request["env"], start_env, imported_env):
                status.sendall(b"refused")
                status.close()
                os.close(out_fd)
                continue
            pid = os.fork()
            if pid == 0:
                selector.close()
                for held in (control, status, *children.values()):
                    held.close()
                _become_session(out_fd)
                return request
            os.close(out_fd)
            status.sendall(f"pid {pid}".encode())
            children[pid] = status
        while children:
            try:
                pid, wait_status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            status = children.pop(pid, None)
            if status is not None:
                try:
                    status.sendall(str(os.waitstatus_to_exitcode(wait_status)).encode())
                except OSError:  # the flow is gone: nobody to tell
                    pass
                status.close()
    return None


def _become_session(out_fd: int) -> None:
    """In the forked child: a new session (as ``start_new_session``), stdin on /dev/null, stdout and stderr on
    ``out_fd`` (the flow's pipe)."""
    os.setsid()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out_fd, 1)
    os.dup2(out_fd, 2)
    os.close(null)
    os.close(out_fd)


def _leave_the_servers_resources() -> None:
    """In the forked child: what the server's imports created for the life of a process stays the server's.

    ``weakref.finalize`` objects made before the fork would run again at each stage's exit: wandb makes its media
    folder at import (``tempfile.TemporaryDirectory("wandb-media")``, its cleanup also registered with atexit), and
    the first stage to exit deleted it under every later one (the gates stage's table upload failed with
    FileNotFoundError). The child detaches them and leaves them to the server, which runs them once at its own exit;
    what the stage itself creates is finalized as usual.
    """
    import tempfile
    import weakref

    for finalizer in list(getattr(weakref.finalize, "_registry", {})):
        made = finalizer.detach()  # not run at exit, nor when the object is collected as the interpreter shuts down
        if made is not None and isinstance(made[0], tempfile.TemporaryDirectory):
            atexit.unregister(made[0].cleanup)  # wandb also registers its media folder's cleanup at exit


def _run(request: dict) -> None:
    """In the forked child: become ``python <argv>`` in ``cwd`` and run the module as ``__main__``."""
    import runpy

    _leave_the_servers_resources()
    os.chdir(request["cwd"])
    argv = request["argv"]
    module, args = argv[1], argv[2:]
    sys.path[0] = os.getcwd()
    try:
        from setproctitle import setproctitle

        setproctitle(" ".join([sys.executable, *argv]))
    except ImportError:  # pragma: no cover - a dependency of the package
        pass
    sys.argv = [module, *args]  # runpy puts the module's file first
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def main() -> None:
    control = socket.socket(fileno=int(sys.argv[1]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the flow stops the server by closing the socket
    start_env = dict(os.environ)
    # Imports take seconds: an owner that is gone by then (a round refused at its config checks) is not waited for.
    importing = threading.Event()
    importing.set()

    def exit_if_abandoned() -> None:
        import select

        while importing.is_set():
            if select.select([control], [], [], 0.1)[0] and not control.recv(1, socket.MSG_PEEK):
                os._exit(0)

    watcher = threading.Thread(target=exit_if_abandoned, daemon=True)
    watcher.start()
    _preload()
    # The server's exit and every forked stage's skip the last collections, as rlhf.entrypoint's
    # skip_collection_at_exit arranges for a cold stage: registered here, not imported, since the project's own
    # modules are never preloaded.
    atexit.register(gc.freeze)
    importing.clear()
    watcher.join()  # the fork below copies this thread only: no other may hold a lock then
    imported_env = dict(os.environ)
    try:
        control.sendall(b"ready " + json.dumps(imported_env).encode())
    except OSError:
        return
    request = _serve(control, start_env, imported_env)
    if request is None:
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _run(request)


if __name__ == "__main__":
    main()
