"""How the coordinator starts and stops containers: the :class:`Launcher` protocol.

The supervisor (:mod:`..supervisor`, through :mod:`..processes`) calls a
launcher and nothing else to start, watch and stop containers.

May import: :mod:`spark_elastic.errors` and the standard library.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from spark_elastic.errors import SparkElasticError

__all__ = ["LaunchError", "Launcher"]


class LaunchError(SparkElasticError):
    """A container could not be started: its platform refused or was out of reach (one line).

    The coordinator records it as the container's event and tries again a
    little later; any other exception from :meth:`Launcher.launch` ends the
    coordinator.
    """


class Launcher(Protocol):
    """Starts and stops containers (local processes by default).

    The handle that :meth:`launch` returns is an opaque string: a PID for a
    local process, a pod's UID, a namespace's name. The coordinator never
    interprets it: it stores the handle with the container (and shows it on
    the status page) and only passes it back, with the container's id, to
    :meth:`alive`, :meth:`terminate` and :meth:`kill`; after a coordinator
    restart, or on a standby that took over, to a new launcher. The only
    signal it asks for is SIGKILL.

    A launcher for another platform implements the same five calls. On
    Kubernetes, say: :meth:`launch` creates a pod (labelled with the
    container id, the environment given as its env) and returns its UID;
    :meth:`alive` says whether that pod, labelled with that container id, is
    pending or running; :meth:`terminate` deletes the pod with a grace
    period (the kubelet sends SIGTERM to the container's main process, which
    finishes its micro-batch in flight) longer than a lease, since the
    coordinator kills on its own schedule; :meth:`kill` deletes it at once
    (grace period 0); :meth:`reap` removes pods that completed. Each call
    resolves the container from its id and the handle, so a new launcher
    answers for containers an earlier one created, and a handle that no
    longer names that container's is never acted on.

    A launcher may also offer two optional calls, which the coordinator uses
    when present (:class:`~..processes.Processes`): ``why(handle)``, what
    its platform says of a container that is not running (a pod's
    ``ErrImagePull``), added to a failover's reason; and
    ``drain_failures()``, what it failed to do out of the coordinator's
    sight (a deletion, a watch), each made an event.
    """

    def launch(self, container_id: str, env: Mapping[str, str]) -> str:
        """Start a container; return its handle."""
        ...

    def alive(self, handle: str, container_id: str) -> bool:
        """Whether ``handle`` still names that container, running."""
        ...

    def terminate(self, handle: str, container_id: str) -> None:
        """Ask the container's main process to stop (SIGTERM, only if it is still that
        container): it finishes its micro-batch in flight, stops its query and exits."""
        ...

    def kill(self, handle: str, container_id: str, sig: int) -> None:
        """Signal every process the container started (only processes of that container),
        even once its main process has exited."""
        ...

    def reap(self) -> None:
        """Collect the exit status of containers that exited (no zombies); called each tick."""
        ...
