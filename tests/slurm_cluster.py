"""A real one-node Slurm cluster for tests: ``munged``, ``slurmctld`` and ``slurmd`` (Debian's slurm-wlm packages)
in a temporary directory on loopback ports, stopped afterwards. No accounting daemon, as on many small clusters:
``sacct`` answers "accounting storage is disabled", so the launcher's squeue / scontrol / exit-file path is the one
exercised. Where it cannot start (no binaries, a daemon that dies), :func:`start_slurm` raises
``SlurmUnavailable`` with the reason, and the fixture skips with it.

    apt-get install -y slurmctld slurmd slurm-client munge
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "srun")


class SlurmUnavailable(RuntimeError):
    pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _conf(tmp: Path, cpus: int) -> str:
    return f"""ClusterName=rlhftest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={tmp}/munge.sock
CredType=cred/munge
StateSaveLocation={tmp}/state
SlurmdSpoolDir={tmp}/spool
SlurmctldPidFile={tmp}/slurmctld.pid
SlurmdPidFile={tmp}/slurmd.pid
SlurmctldLogFile={tmp}/slurmctld.log
SlurmdLogFile={tmp}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
NodeName=localhost NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""


@contextmanager
def start_slurm(cpus: int | None = None):
    """Yield the environment (``SLURM_CONF`` set) in which sbatch/squeue/scontrol talk to a fresh cluster."""
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        raise SlurmUnavailable(f"no {', '.join(missing)} (apt-get install -y slurmctld slurmd slurm-client munge)")
    if os.geteuid() != 0:
        raise SlurmUnavailable("slurmd must run as root to start jobs")
    tmp = Path(tempfile.mkdtemp(prefix="rlhf-slurm-"))
    (tmp / "state").mkdir()
    (tmp / "spool").mkdir()
    key = tmp / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    conf = tmp / "slurm.conf"
    conf.write_text(_conf(tmp, cpus or os.cpu_count() or 1))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    procs: list[subprocess.Popen] = []

    def spawn(*cmd: str) -> None:
        log = open(tmp / f"{Path(cmd[0]).name}.out", "w")  # noqa: SIM115 - the daemon writes to it until stopped
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True))

    try:
        spawn(
            "munged",
            "-F",
            "-f",
            f"--socket={tmp}/munge.sock",
            f"--key-file={key}",
            f"--log-file={tmp}/munged.log",
            f"--pid-file={tmp}/munged.pid",
            f"--seed-file={tmp}/munged.seed",
        )
        _wait(lambda: (tmp / "munge.sock").exists(), procs, tmp, "munged socket")
        spawn("slurmctld", "-D", "-f", str(conf))
        spawn("slurmd", "-D", "-N", "localhost", "-f", str(conf))

        def idle() -> bool:
            out = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True, check=False)
            return out.returncode == 0 and out.stdout.strip() == "idle"

        _wait(idle, procs, tmp, "node idle")
        yield env
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def _wait(ready, procs: list[subprocess.Popen], tmp: Path, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        dead = [p for p in procs if p.poll() is not None]
        if dead:
            logs = " | ".join(f.read_text()[-300:] for f in tmp.glob("*.out"))
            raise SlurmUnavailable(f"{dead[0].args[0]} exited ({dead[0].returncode}) before {what}: {logs}")
        if ready():
            return
        time.sleep(0.3)
    raise SlurmUnavailable(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def cluster():
    """A one-node cluster for a test module (the environment of :func:`start_slurm`); skips, saying why, where
    the daemons cannot start."""
    cm = start_slurm()
    try:
        env = cm.__enter__()
    except SlurmUnavailable as err:
        pytest.skip(f"no Slurm cluster: {err}")
    yield env
    cm.__exit__(None, None, None)
