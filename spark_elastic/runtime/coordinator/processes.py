"""The one place the coordinator starts, watches, stops and kills container processes.

:class:`Processes` wraps a :class:`.launchers.Launcher` (its handles are
opaque strings: a PID for local processes) with the coordinator's two ways of ending
a container: *stop* (SIGTERM: it finishes its micro-batch in flight, stops
its query and exits) and *kill* (SIGKILL of everything the container
started, for one that no longer holds a lease, or what is left of one that
exited). A *doomed* container (rolled back, failed, stopped with its job) is
asked to stop now and killed a lease later unless it is gone by then;
:meth:`Processes.reap`, called each tick, carries that out.

The supervisor (:mod:`.supervisor`) decides who stops and when; nothing else
signals a process. Runs in the coordinator's event loop, one call at a time.

May import: :mod:`.launchers` and the standard library.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from spark_elastic.runtime.coordinator.launchers import Launcher

__all__ = ["Processes"]


@dataclass
class Processes:
    """Container processes through a launcher: launch, stop, kill, and kill later.

    Attributes
    ----------
    launcher
        Starts and signals the processes (local ones by default).
    clock
        The coordinator's monotonic clock, in seconds.
    grace_s
        How long a doomed container has to stop before it is killed: a lease.
    """

    launcher: Launcher
    clock: Callable[[], float]
    grace_s: float
    _doomed: dict[str, tuple[str, float]] = field(default_factory=dict)
    """Container id -> (handle, when it is killed if it has not exited)."""

    def launch(self, container_id: str, env: Mapping[str, str]) -> str:
        """Start a container; returns the launcher's handle for it."""
        return self.launcher.launch(container_id, env)

    def alive(self, handle: str | None, container_id: str) -> bool:
        """Whether the container's process runs (False without a handle: never launched)."""
        return handle is not None and self.launcher.alive(handle, container_id)

    def why(self, handle: str | None) -> str | None:
        """What the launcher's platform says of a container that is not running (a pod's
        ``ErrImagePull``), if its launcher can say (:meth:`Launcher.why`-like, optional)."""
        why = getattr(self.launcher, "why", None)
        return why(handle) if why is not None and handle is not None else None

    def drain_failures(self) -> list[str]:
        """What the launcher's platform refused out of the coordinator's sight since the
        last call (a pod's deletion, a watch), if its launcher keeps such failures."""
        drain = getattr(self.launcher, "drain_failures", None)
        return list(drain()) if drain is not None else []

    def stop(self, handle: str | None, container_id: str) -> None:
        """Ask it to stop at a batch boundary (SIGTERM to its main process)."""
        if handle is not None:
            self.launcher.terminate(handle, container_id)

    def kill(self, handle: str | None, container_id: str) -> None:
        """SIGKILL everything it started: it holds no lease any more, or it has exited."""
        if handle is not None:
            self.launcher.kill(handle, container_id, signal.SIGKILL)

    def doom(self, handle: str | None, container_id: str) -> None:
        """Ask it to stop now and kill it :attr:`grace_s` later unless it exited by then."""
        if handle is not None:
            self.stop(handle, container_id)
            self._doomed[container_id] = (handle, self.clock() + self.grace_s)

    def reap(self) -> None:
        """Each tick: collect exited processes, and kill the doomed whose time is up.

        A doomed container whose main process exited is killed too (what is
        left of its process group, a JVM on its way out) and forgotten; one
        past its grace is killed each tick until it is seen gone.
        """
        self.launcher.reap()
        for container_id, (handle, at) in list(self._doomed.items()):
            if not self.launcher.alive(handle, container_id):
                self.kill(handle, container_id)
                del self._doomed[container_id]
            elif self.clock() > at:
                self.kill(handle, container_id)
