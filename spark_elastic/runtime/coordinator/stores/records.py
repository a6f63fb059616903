"""What a coordinator store holds, as values: a container's row and an event.

May import: the standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LIVE_STATES", "ContainerRecord", "Event"]

LIVE_STATES = ("launching", "warm", "running")
"""States of containers the coordinator considers valid (their heartbeats renew a lease)."""


@dataclass(frozen=True)
class ContainerRecord:
    """One container as stored.

    Attributes
    ----------
    id
        The container id.
    generation
        Its checkpoint generation.
    state
        ``launching`` (started, not registered), ``warm`` (a warm-up that
        registered: ready to take its tasks), ``running``, ``expired`` (lease
        ran out; replaced), ``retired`` (handed its tasks over) or ``stopped``.
    handle
        Its launcher's handle, once launched (opaque: a PID for a local
        process, a pod's UID); for one launched elsewhere, the PID it reported.
    spark_app
        Its Spark application id, once reported.
    tasks
        Its virtual tasks.
    checkpoint
        Its generation's checkpoint.
    sources
        Checkpoints it forks from.
    launched_at, registered_at, ended_at
        Wall-clock times (for people; decisions use the monotonic clock).
    """

    id: str
    generation: int
    state: str
    handle: str | None
    spark_app: str
    tasks: tuple[str, ...]
    checkpoint: str
    sources: tuple[str, ...]
    launched_at: float | None
    registered_at: float | None
    ended_at: float | None

    @property
    def live(self) -> bool:
        """Whether the coordinator considers it valid."""
        return self.state in LIVE_STATES


@dataclass(frozen=True)
class Event:
    """Something the coordinator did, for the status page.

    Attributes
    ----------
    at
        Wall-clock time.
    kind
        ``start``, ``launch``, ``register``, ``expire``, ``failover``,
        ``fence``, ``exit``, ``stop``, ``lead``.
    container
        The container concerned ("" for the job).
    detail
        One line of explanation.
    """

    at: float
    kind: str
    container: str
    detail: str
