"""Predecessors on their way out: retired containers their successors wait for.

A container *retires* when its tasks go to successors at a batch boundary
(a handover, a move's old owner, a growth's drained owner): it gets SIGTERM
and one more lease to finish its micro-batch in flight, renewed by its
heartbeats until then, so that its last records are published by it and not
replayed. Its successors start only once it may no longer write: it said its
query stopped, its process is gone, or its lease and margin ran out (then it
is killed). :class:`Retiring` keeps that bookkeeping, one :class:`Retiree`
per container, on the coordinator's monotonic clock; the supervisor
(:mod:`.supervisor`) decides who retires and kills through :mod:`.processes`.

May import: the standard library only.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = ["Retiree", "Retiring"]


@dataclass
class Retiree:
    """One retired container.

    Attributes
    ----------
    renewed_at
        When its lease was last renewed (the coordinator's clock).
    finishing_until
        Until when its heartbeats still renew its lease: one lease from its
        retirement (or from a restarted coordinator's start), for the
        micro-batch it has in flight.
    stopped
        It said its query stopped: it writes nothing any more, though its
        process may still be on its way out.
    """

    renewed_at: float
    finishing_until: float
    stopped: bool = False


@dataclass
class Retiring:
    """Retired containers that may still run, by id.

    Attributes
    ----------
    lease_s
        A lease: how long a retired container has to finish its batch.
    """

    lease_s: float
    _by_id: dict[str, Retiree] = field(default_factory=dict)

    def retire(self, container_id: str, renewed_at: float, now: float) -> None:
        """``container_id`` retires now; its lease was last renewed at ``renewed_at``."""
        self._by_id[container_id] = Retiree(renewed_at, now + self.lease_s)

    def heard(self, container_id: str, now: float) -> bool:
        """A heartbeat from it: True (its lease renewed) while it is finishing its batch."""
        retiree = self._by_id.get(container_id)
        if retiree is None or now >= retiree.finishing_until:
            return False
        retiree.renewed_at = now
        return True

    def said_stopped(self, container_id: str) -> None:
        """It said its query stopped (``stopped=true`` on a heartbeat)."""
        if container_id in self._by_id:
            self._by_id[container_id].stopped = True

    def may_write(self) -> list[str]:
        """Those that have not said their query stopped (nor been forgotten as gone)."""
        return [c for c, retiree in self._by_id.items() if not retiree.stopped]

    def renewed_at(self, container_id: str) -> float:
        """When its lease was last renewed."""
        return self._by_id[container_id].renewed_at

    def serving(self, now: float) -> None:
        """The coordinator listens from ``now``: no lease is older, and each has a batch's time."""
        for retiree in self._by_id.values():
            retiree.renewed_at = max(retiree.renewed_at, now)
            retiree.finishing_until = now + self.lease_s

    def deaf_for(self, began: float, seconds: float) -> None:
        """The coordinator heard no one from ``began`` for ``seconds``: none of it counts."""
        for retiree in self._by_id.values():
            if retiree.renewed_at <= began:
                retiree.renewed_at += seconds
            retiree.finishing_until += seconds

    def forget(self, container_id: str) -> None:
        """It is gone (its process seen exited)."""
        self._by_id.pop(container_id, None)

    def clear(self) -> None:
        """Every one is gone (the job stopped)."""
        self._by_id.clear()

    def __contains__(self, container_id: object) -> bool:
        return container_id in self._by_id

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._by_id))

    def __len__(self) -> int:
        return len(self._by_id)
