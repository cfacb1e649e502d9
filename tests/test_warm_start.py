"""Local stages forked from the warm interpreter (flows/warm_start.py) behave as ``python -m <module>`` would:
arguments, working directory, own session, output, exit codes, signals, process title; anything else starts cold."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import time

import pytest

from flows import warm_start
from flows.interrupt import run_process_group
from flows.warm_start import _group_alive

pytestmark = pytest.mark.skipif(not warm_start.enabled(dict(os.environ, RLHF_WARM_START="1")),
                                reason="warm starts need Linux without a GPU")

STAGE = textwrap.dedent("""
    import os, sys, time
    preloaded = "trl" in sys.modules  # imported by the server before this module ran
    ours = sorted(m for m in sys.modules if m.split(".")[0] in ("rlhf", "sft", "dpo", "reward_model", "gates",
                                                                 "data", "judging"))  # never preloaded
    print("argv", sys.argv[1:], "cwd", os.getcwd(), flush=True)
    print("pid", os.getpid(), "pgid", os.getpgid(0), "sid", os.getsid(0), "ppid", os.getppid(), flush=True)
    print("preloaded", preloaded, "omp", os.environ.get("OMP_NUM_THREADS"), flush=True)
    print("title", " ".join(open("/proc/self/cmdline").read().replace("\\0", " ").split()), flush=True)
    print("stdin", repr(sys.stdin.read()), flush=True)
    print("project", ours or "none", flush=True)
    from wandb.sdk.data_types import _private
    print("media", os.path.isdir(_private.MEDIA_TMP.name), _private.MEDIA_TMP.name, flush=True)
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    if what == "raise":
        raise ValueError("p.jsonl row 2 field 'chosen': missing")
    if what == "kill":
        os.kill(os.getpid(), 9)
    if what == "sleep":
        print("sleeping", flush=True)
        time.sleep(120)
    sys.exit(int(what) if what.isdigit() else 0)
""")


@pytest.fixture(scope="module")
def stage_env(tmp_path_factory):
    folder = tmp_path_factory.mktemp("warm")
    (folder / "warm_probe_stage.py").write_text(STAGE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")])),
               PYTHONUNBUFFERED="1", RLHF_WARM_START="1")
    return env


def _cmd(*args: str) -> list[str]:
    return ["env", "OMP_NUM_THREADS=1", sys.executable, "-m", "warm_probe_stage", *args]


def _run(env, *args):
    lines: list[str] = []
    rc = run_process_group(_cmd(*args), env=env, on_line=lines.append)
    said = {line.split()[0]: line.split(None, 1)[1].strip() for line in lines if len(line.split()) > 1}
    return rc, said, "".join(lines)


def test_a_forked_stage_is_the_command_it_replaces(stage_env, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, said, _ = _run(stage_env, "--config", "a b.yaml")
    assert rc == 0
    assert said["preloaded"] == "True omp 1"  # forked (trl already there), with the command's variable
    assert said["argv"] == f"['--config', 'a b.yaml'] cwd {tmp_path}"
    pid, pgid, sid, ppid = (int(v) for v in said["pid"].split()[0::2])  # "<pid> pgid <g> sid <s> ppid <p>"
    assert pid == pgid == sid  # its own session and group, as start_new_session gives a cold stage
    assert ppid == warm_start._server._proc.pid and ppid != os.getpid()
    assert said["title"] == f"{sys.executable} -m warm_probe_stage --config a b.yaml"
    assert said["stdin"] == "''"
    assert said["project"] == "none"  # the project's modules come fresh from disk in each stage


def test_exit_codes_errors_and_signals_come_back_as_a_cold_stage_gives_them(stage_env):
    assert _run(stage_env, "3")[0] == 3
    rc, _, out = _run(stage_env, "raise")
    assert rc == 1 and out.rstrip().splitlines()[-1] == "ValueError: p.jsonl row 2 field 'chosen': missing"
    assert _run(stage_env, "kill")[0] == -signal.SIGKILL


def test_an_interrupt_stops_the_forked_stage(stage_env):
    pids: list[int] = []

    def on_line(line: str) -> None:
        if line.startswith("pid "):
            pids.append(int(line.split()[1]))
        if line.startswith("sleeping"):
            raise KeyboardInterrupt

    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_process_group(_cmd("sleep"), env=stage_env, on_line=on_line, grace_s=5)
    assert time.monotonic() - t0 < 30
    assert pids and not _group_alive(pids[0])  # the stage and all of its group


def test_any_other_command_environment_or_setting_starts_cold(stage_env):
    assert warm_start.direct_command([sys.executable, "-m", "warm_probe_stage"]) is None  # a launcher's own form
    assert warm_start.direct_command(["env", "A=1", "/other/python", "-m", "x"]) is None
    assert warm_start.direct_command(["env", "A=1", sys.executable, "-c", "pass"]) is None
    assert warm_start.direct_command(["env", "A=1", "B=x=y", sys.executable, "-m", "m", "--k", "v"]) == (
        {"A": "1", "B": "x=y"}, ["-m", "m", "--k", "v"])
    _run(stage_env)  # a server with this environment runs
    server = warm_start._server
    other = {**stage_env, "OMP_NUM_THREADS": "1", "HF_HOME": "/elsewhere"}  # read by huggingface_hub at import
    assert server.spawn(["-m", "warm_probe_stage"], other) is None
    assert not warm_start.enabled({**stage_env, "RLHF_WARM_START": "0"})
    rc, said, _ = _run({**stage_env, "RLHF_WARM_START": "off"})
    assert rc == 0 and said["preloaded"].startswith("False")  # started the ordinary way
    assert warm_start._server is server


def test_a_server_let_go_reports_its_running_stage_then_exits(stage_env):
    env = {**stage_env, "OMP_NUM_THREADS": "1"}
    server = warm_start.WarmServer(env)
    proc = server.spawn(["-m", "warm_probe_stage", "sleep"], env)
    assert proc is not None
    assert proc.stdout.readline().startswith("argv")
    server.close()  # replaced, or its owner is done: the stage it forked runs on and its end is still reported
    assert server._proc.poll() is None
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=10) == -signal.SIGTERM
    assert server._proc.wait(timeout=10) == 0
    proc.stdout.close()


def test_a_server_abandoned_while_importing_exits_at_once(stage_env):
    server = warm_start.WarmServer({**stage_env, "OMP_NUM_THREADS": "1"})
    server._control.close()  # its owner is gone (a round refused at its config checks)
    assert server._proc.wait(timeout=3) == 0


def test_what_the_servers_imports_made_outlives_each_stage(stage_env):
    """wandb makes its media folder when imported: a stage that exits must not delete it under the next one."""
    first, second = _run(stage_env)[1]["media"], _run(stage_env)[1]["media"]
    assert first == second and first.startswith("True ")


def test_a_stage_environment_is_served_with_or_without_what_the_servers_imports_set():
    start = {"A": "1", "OMP_NUM_THREADS": "2"}
    imported = {**start, "KMP_DUPLICATE_LIB_OK": "True", "TORCHINDUCTOR_CACHE_DIR": "/tmp/ind"}
    same = warm_start.same_process_env
    assert same(start, start, None) and same(start, start, imported) and same(imported, start, imported)
    assert same({**start, "KMP_DUPLICATE_LIB_OK": "True"}, start, imported)  # the flow imported sklearn, not torch
    assert same({**start, "TORCHINDUCTOR_CACHE_DIR": "/tmp/ind"}, start, imported)
    assert not same({**start, "KMP_DUPLICATE_LIB_OK": "False"}, start, imported)  # not what a cold stage ends with
    assert not same({**start, "OMP_NUM_THREADS": "1"}, start, imported)
    assert not same({**start, "HF_HOME": "/x"}, start, imported) and not same({"A": "1"}, start, imported)
    assert not same(imported, start, None)  # what the imports set is not known before they ran
    removed = {"OMP_NUM_THREADS": "2", "KMP_DUPLICATE_LIB_OK": "True"}  # an import removed A: only itself matches
    assert same(removed, start, removed) and not same({**start, "KMP_DUPLICATE_LIB_OK": "True"}, start, removed)


def test_a_server_started_before_the_flow_imported_sklearn_serves_its_stages(stage_env):
    """The round starts the server first thing; the flow's imports then set sklearn's KMP_* defaults, which the
    server's own import of sklearn set the same way: its stages are forked, not started cold."""
    env = {k: v for k, v in stage_env.items() if not k.startswith("KMP_")}
    env["OMP_NUM_THREADS"] = "1"
    server = warm_start.WarmServer(env)
    try:
        assert server.ready() and server.imported_env["KMP_DUPLICATE_LIB_OK"] == "True"
        proc = server.spawn(["-m", "warm_probe_stage"], {**env, "KMP_DUPLICATE_LIB_OK": "True"})
        assert proc is not None
        out = proc.stdout.read()
        assert proc.wait(timeout=30) == 0 and "preloaded True" in out
        assert server.spawn(["-m", "warm_probe_stage"], {**env, "KMP_DUPLICATE_LIB_OK": "False"}) is None
        server.serves = lambda env: True  # the server's own check refuses it too
        assert server.spawn(["-m", "warm_probe_stage"], {**env, "KMP_DUPLICATE_LIB_OK": "False"}) is None
        proc.stdout.close()
    finally:
        server.close()
        server._proc.wait(timeout=10)
