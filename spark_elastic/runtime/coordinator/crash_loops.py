"""Crash loops: containers that fail before their first commit, carried to their successors.

A container that fails before it commits a batch *failed at start*: a job
Spark refuses, a missing jar, a bad setting fail the same way again. Its
successor inherits the tally (:class:`.changes.StartFailures`: failures in a
row of one cause), launches only after a backoff (:func:`.changes.backoff_s`:
1, 2, 4... s), and the supervisor (:mod:`.supervisor`) fails the job once
one cause reaches its limit (Flink's restart strategies end a loop the same
way, with a stated cause). A commit ends a loop. :class:`CrashLoops` keeps
that bookkeeping and the causes containers reported, which the status shows.

May import: :mod:`.changes` and the standard library.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from spark_elastic.runtime.coordinator.changes import StartFailures, backoff_s

__all__ = ["CrashLoops"]


@dataclass
class CrashLoops:
    """Failures at start, backoffs and reported causes, by container id.

    Attributes
    ----------
    committed
        Containers that committed a batch (past their start; a restarted
        coordinator reads them from its store).
    """

    committed: set[str] = field(default_factory=set)
    _tallies: dict[str, StartFailures] = field(default_factory=dict)
    _not_before: dict[str, float] = field(default_factory=dict)
    _causes: dict[str, str] = field(default_factory=dict)

    def past_start(self, committed: Iterable[str]) -> None:
        """``committed`` containers are known to have committed (a restarted coordinator's
        store says so)."""
        self.committed.update(committed)

    def reported(self, container_id: str, cause: str) -> None:
        """A container said why it failed (the exception's first line)."""
        self._causes[container_id] = cause

    def commit(self, container_id: str) -> None:
        """It committed a batch: whatever loop it was in has ended."""
        self.committed.add(container_id)
        self._tallies.pop(container_id, None)

    def at_start(self, container_id: str) -> bool:
        """Whether it has not committed a batch (a failure now is a failure at start)."""
        return container_id not in self.committed

    def failed_at_start(self, container_id: str, seen: str) -> StartFailures:
        """The tally once ``container_id`` failed at start; ``seen`` is the coordinator's
        account of it, used when the container reported no cause of its own."""
        cause = self._causes.get(container_id) or seen
        return self._tallies.pop(container_id, StartFailures()).after(cause)

    def inherit(self, successor: str, tally: StartFailures, now: float) -> None:
        """``successor`` carries ``tally`` on and launches only after its backoff from ``now``."""
        self._tallies[successor] = tally
        self._not_before[successor] = now + backoff_s(tally.count)

    def may_launch(self, container_id: str, now: float) -> bool:
        """Whether its backoff (if any) is over."""
        return self._not_before.get(container_id, 0.0) <= now

    def causes(self) -> dict[str, str]:
        """What each container reported as its cause of failure."""
        return dict(self._causes)

    def tallies(self) -> dict[str, StartFailures]:
        """Each container's failures at start carried so far (none once it committed)."""
        return dict(self._tallies)
