"""Containers as local processes: :class:`LocalLauncher`, the default launcher.

Each container runs as a process of the coordinator's host in its own
session, and a PID is trusted only while ``/proc`` says it is still that
container's.

May import: :mod:`spark_elastic.runtime.protocol` and the standard library.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from spark_elastic.runtime.protocol import CONTAINER_ID_ENV

__all__ = ["LocalLauncher", "of_container", "pid_of"]


@dataclass
class LocalLauncher:
    """Containers as local processes: ``python -m spark_elastic container run``.

    Each container runs in its own session (so a coordinator that dies does
    not take its containers down), with its output in
    ``<log_dir>/<container_id>.log``. A PID is trusted only while
    ``/proc/<pid>/environ`` still names the container, so a reused PID is
    never signalled.

    Attributes
    ----------
    log_dir
        Where container logs go.
    command
        The container command (default: this interpreter running
        ``spark_elastic container run``).
    env
        Extra environment for every container.
    """

    log_dir: Path
    command: Sequence[str] = (sys.executable, "-m", "spark_elastic", "container", "run")
    env: Mapping[str, str] = field(default_factory=dict)
    launched: dict[int, str] = field(default_factory=dict, repr=False)
    """PID -> container id of every process this launcher started."""
    _children: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)

    def launch(self, container_id: str, env: Mapping[str, str]) -> str:
        """Start a container; return its PID, as a string (its handle)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with (self.log_dir / f"{container_id}.log").open("ab") as log:
            process = subprocess.Popen(
                list(self.command),
                env={**os.environ, **self.env, **env},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._children[process.pid] = process
        self.launched[process.pid] = container_id
        return str(process.pid)

    def alive(self, handle: str | int, container_id: str) -> bool:
        """Whether ``pid`` is still that container's process (zombies count as dead).

        A process this launcher started is its child: its PID cannot be reused
        before it is reaped, so its exit status says it all. /proc would not:
        between fork and exec it shows the launcher's own environment, and a
        container just launched looked as if it had exited.
        """
        pid = pid_of(handle)
        if pid is None:
            return False
        child = self._children.get(pid)
        if child is not None and self.launched.get(pid) == container_id:
            return child.poll() is None
        return of_container(pid, container_id) is not None

    def terminate(self, handle: str | int, container_id: str) -> None:
        """SIGTERM to the container's main process only, if ``pid`` is still that container.

        Not to its process group: its Spark driver (a JVM in the group) would
        abandon the micro-batch in flight, which the container finishes first.
        """
        pid = pid_of(handle)
        if pid is not None and self.alive(pid, container_id):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)

    def kill(self, handle: str | int, container_id: str, sig: int) -> None:
        """Signal the container's process group while any process of it is that container's.

        Its main process leads the group (its own session); what it started,
        its JVM included, inherits the container's id in its environment. So
        the group is signalled after its leader exited too (what is left of
        it), and never once its id could name someone else's group.
        """
        pid = pid_of(handle)
        if pid is None:
            return
        if self.alive(pid, container_id) or _groupof_container(pid, container_id):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)

    def reap(self) -> None:
        """Wait for every child that exited, so none stays a zombie until the coordinator exits.

        A reaped child is forgotten here: from then on ``alive`` asks /proc,
        which checks the container's id, so a reused PID is never taken for it.
        """
        for pid, child in list(self._children.items()):
            if child.poll() is not None:
                del self._children[pid]


def pid_of(handle: str | int) -> int | None:
    """A local process's PID from its handle; None for a handle another launcher made."""
    text = str(handle)
    return int(text) if text.isascii() and text.isdigit() else None


def of_container(pid: int, container_id: str) -> int | None:
    """``pid``'s process group when it is a live (not zombie) process of that container."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    if fields[0] == "Z" or f"{CONTAINER_ID_ENV}={container_id}".encode() not in environ.split(
        b"\0"
    ):
        return None
    return int(fields[2])


def _groupof_container(group: int, container_id: str) -> bool:
    """Whether a live process of that container is in process group ``group``."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and of_container(int(entry.name), container_id) == group:
            return True
    return False
