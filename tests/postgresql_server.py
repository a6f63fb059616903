"""A real PostgreSQL server for the specs: Debian's ``postgresql`` package, started by the suite.

:func:`running_postgresql` makes a fresh cluster (``initdb``) in a temp
directory, starts ``postgres`` on a free loopback port with password
authentication, and stops it by PID at the end (SIGINT: PostgreSQL's fast
shutdown, which ends the clients' sessions; SIGKILL after a deadline). The
server refuses to run as root, so under root it runs as the ``postgres``
user the package creates. Durability is off (``fsync=off``): the specs test
the coordinator's transactions, not the disk.

Also a command line, for trying a coordinator on it by hand::

    .venv/bin/python tests/postgresql_server.py
"""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from kafka_jvm import free_port

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
PASSWORD = "spark-elastic"
USER = "postgres"


class PostgreSQLServerError(RuntimeError):
    """The PostgreSQL server could not be started (missing, or it did not answer)."""


def binaries() -> Path:
    """Where Debian's ``postgresql`` package keeps ``initdb`` and ``postgres``."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"))
    if found:
        return found[-1].parent
    on_path = shutil.which("postgres")
    if on_path is None:
        raise PostgreSQLServerError(
            "no PostgreSQL server: install Debian's postgresql package (apt-get install postgresql)"
        )
    return Path(on_path).resolve().parent


@dataclass(frozen=True)
class PostgreSQLServer:
    """A running server: its port and how to reach a database on it."""

    port: int
    pid: int
    directory: Path
    host: str = "127.0.0.1"

    def url(self, database: str = "postgres", password: str = PASSWORD) -> str:
        """A libpq URL of ``database`` on this server."""
        return f"postgresql://{USER}:{password}@{self.host}:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """Create an empty database (one per spec) and return its URL."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as db:
            db.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


def _as_server_user() -> tuple[int, int] | None:
    """The uid and gid to run the server as: ``postgres`` under root, else ourselves."""
    if os.geteuid() != 0:
        return None
    user = pwd.getpwnam(USER)
    return user.pw_uid, user.pw_gid


def _child(ids: tuple[int, int] | None) -> None:
    """In the child before exec: drop root, then die with the parent (Linux). The death
    signal is set after the uid changes, which clears it."""
    if ids is not None:
        os.setgid(ids[1])
        os.setuid(ids[0])
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGINT)  # PR_SET_PDEATHSIG


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
    process.wait()


def _answers(port: int, host: str = "127.0.0.1") -> bool:
    import psycopg

    try:
        psycopg.connect(
            f"postgresql://{USER}:{PASSWORD}@{host}:{port}/postgres", connect_timeout=2
        ).close()
    except psycopg.OperationalError:
        return False
    return True


@contextmanager
def running_postgresql(
    timeout_s: float = START_TIMEOUT_S, host: str = "127.0.0.1", clients: str | None = None
) -> Iterator[PostgreSQLServer]:
    """A fresh PostgreSQL cluster on a free port of ``host`` (loopback by default), stopped
    (and removed) at the end; hosts of the network ``clients`` (a bridge's) may log in too."""
    bin_dir = binaries()
    ids = _as_server_user()
    with tempfile.TemporaryDirectory(prefix="spark-elastic-postgresql-") as tmp:
        root = Path(tmp)
        if ids is not None:
            os.chown(root, *ids)
        password = root / "password"
        password.write_text(PASSWORD)
        data, log = root / "data", root / "server.log"
        if ids is not None:
            os.chown(password, *ids)
        init = subprocess.run(
            [
                str(bin_dir / "initdb"),
                *("-D", str(data), "-U", USER, "--auth=scram-sha-256"),
                *(f"--pwfile={password}", "-E", "UTF8", "--no-sync"),
            ],
            capture_output=True,
            text=True,
            preexec_fn=lambda: _child(ids),
            timeout=timeout_s,
        )
        if init.returncode != 0:
            raise PostgreSQLServerError(f"initdb failed: {init.stderr.strip()[-300:]}")
        if clients is not None:
            with (data / "pg_hba.conf").open("a") as hba:
                hba.write(f"host all all {clients} scram-sha-256\n")
        port = free_port(host)
        began = time.monotonic()
        with log.open("ab") as out:
            process = subprocess.Popen(
                [
                    str(bin_dir / "postgres"),
                    *("-D", str(data), "-p", str(port), "-k", str(root)),
                    *("-c", f"listen_addresses={host}", "-c", "fsync=off"),
                    *("-c", "synchronous_commit=off", "-c", "full_page_writes=off"),
                    *("-c", "max_connections=200"),
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=lambda: _child(ids),
            )
        try:
            while process.poll() is None and time.monotonic() < began + timeout_s:
                if _answers(port, host):
                    yield PostgreSQLServer(port, process.pid, root, host)
                    return
                time.sleep(0.1)
            state = "did not answer" if process.poll() is None else f"exited {process.returncode}"
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
            raise PostgreSQLServerError(
                f"no PostgreSQL on {host}:{port} within {timeout_s:.0f} s: {state} ({tail[0]})"
            )
        finally:
            _stop(process)


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    with running_postgresql() as server:
        print(f"PostgreSQL at {server.url()} (pid {server.pid}); Ctrl-C stops it", flush=True)
        with suppress(KeyboardInterrupt):
            signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main())
