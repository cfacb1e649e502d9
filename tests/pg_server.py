"""A real PostgreSQL server for tests: ``initdb`` + ``pg_ctl`` from /usr/lib/postgresql/*/bin in a temporary
directory, on a free loopback port, stopped afterwards. Where it cannot be started (no binaries, no
permission), :func:`start_postgres` raises ``PostgresUnavailable`` with the reason, and the fixture skips with it.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path


class PostgresUnavailable(RuntimeError):
    pass


def _bin_dir() -> Path:
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(Path(d).parent.name))
    if not dirs or not Path(dirs[-1], "initdb").exists():
        raise PostgresUnavailable("no initdb under /usr/lib/postgresql/*/bin (apt-get install -y postgresql)")
    return Path(dirs[-1])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_user() -> list[str]:
    """initdb refuses root: run the server as the 'postgres' system user the Debian package creates."""
    if os.geteuid() != 0:
        return []
    if shutil.which("runuser") is None:
        raise PostgresUnavailable("running as root and no runuser to switch to the postgres user")
    try:
        import pwd

        pwd.getpwnam("postgres")
    except KeyError:
        raise PostgresUnavailable("running as root and there is no 'postgres' user") from None
    return ["runuser", "-u", "postgres", "--"]


@contextmanager
def start_postgres(settings: dict[str, str] | None = None, *, password: str | None = None):
    """Yield a SQLAlchemy URL (``postgresql+psycopg://postgres@127.0.0.1:<port>/postgres``) of a fresh server;
    ``settings``: extra server settings (``{"shared_buffers": "512MB"}``). With ``password``, the superuser has
    that password and connections over TCP must give it (scram-sha-256); the URL never holds it."""
    bin_dir = _bin_dir()
    prefix = _as_user()
    tmp = Path(tempfile.mkdtemp(prefix="rlhf-pg-"))
    data, log = tmp / "data", tmp / "server.log"
    if prefix:
        shutil.chown(tmp, "postgres")
    tmp.chmod(0o700)
    port = _free_port()
    try:
        auth = ["--auth=trust"]
        if password is not None:
            pwfile = tmp / "pwfile"
            pwfile.write_text(password + "\n")
            if prefix:
                shutil.chown(pwfile, "postgres")
            auth = ["--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={pwfile}"]
        r = subprocess.run(
            [*prefix, str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", *auth, "-E", "UTF8"],
            capture_output=True,
            check=False,
            text=True,
        )
        if password is not None:
            pwfile.unlink()
        if r.returncode != 0:
            raise PostgresUnavailable(f"initdb failed: {r.stderr.strip()[-400:]}")
        opts = f"-c listen_addresses=127.0.0.1 -p {port} -k {tmp} -c fsync=off"
        opts += "".join(f" -c {k}={v}" for k, v in (settings or {}).items())
        r = subprocess.run(
            [*prefix, str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", opts, "-w", "-t", "60", "start"],
            capture_output=True,
            check=False,
            text=True,
        )
        if r.returncode != 0:
            tail = log.read_text()[-400:] if log.exists() else ""
            raise PostgresUnavailable(f"pg_ctl start failed: {r.stderr.strip()[-300:]} {tail}")
        url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
        import sqlalchemy as sa

        deadline = time.time() + 30
        while True:
            try:
                eng = sa.create_engine(url, connect_args={} if password is None else {"password": password})
                with eng.connect() as c:
                    c.exec_driver_sql("select 1")
                eng.dispose()
                break
            except Exception as err:  # noqa: BLE001
                if time.time() > deadline:
                    raise PostgresUnavailable(f"server did not accept connections: {err}") from None
                time.sleep(0.3)
        yield url
    finally:
        if (data / "postmaster.pid").exists():
            subprocess.run(
                [*prefix, str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
                capture_output=True,
                check=False,
            )
        shutil.rmtree(tmp, ignore_errors=True)
