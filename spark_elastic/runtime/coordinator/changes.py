"""A change to a running job as an object: its phase, the phase's deadline, and what then.

A *change* is a growth (SEP-5), a container-count change (a stateless
handover or a stateful move through warm-ups) or an elasticity-factor change
(a move, group by group). One is in flight at a time. Its phases::

    growth:  draining ------------------------> handing over --> done
    move:    warming up --> catching up --> handing over --+--> done
                 ^    |           |                        |
                 |    +-----------+--> rolled back         |
                 +------------- next group ----------------+
    stateless scale:                           handing over --> done

Each phase has a deadline with a stated outcome: a move still *warming up*
at its deadline is rolled back (its warm-ups stop, the old owners keep their
tasks) unless a group already moved, when it goes on; *catching up* goes on
after the catch-up time (the old owners stop anyway, as before); *handing
over* and *draining* go on (leases bound a handover; a drain keeps each key's
order and cannot be cut short). An operator may cancel a change that can be
rolled back: a move before any of its groups handed over.

Pure: frozen dataclasses and functions of them; the supervisor keeps the
current change in its store (``meta.change``) and asks in here.

May import: :mod:`spark_elastic.errors` and the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

__all__ = [
    "BACKOFF_MAX_S",
    "Change",
    "StartFailures",
    "backoff_s",
    "deadline_outcome",
    "refuse_cancel",
]

WARMING, CATCHING_UP, HANDING_OVER, DRAINING = (
    "warming up",
    "catching up",
    "handing over",
    "draining",
)
PHASES = (WARMING, CATCHING_UP, HANDING_OVER, DRAINING)
KINDS = ("growth", "scale", "factor")
BACKOFF_MAX_S = 60.0


@dataclass(frozen=True)
class Change:
    """The change in flight.

    Attributes
    ----------
    kind
        ``growth``, ``scale`` or ``factor``.
    summary
        What it does, in words (``"2 -> 3 containers"``, ``"factor 4 -> 8"``).
    target
        Where it goes: ``{"containers": N}``, ``{"elasticityFactor": F}`` or
        ``{"partitions": {...}}``.
    phase
        One of ``warming up``, ``catching up``, ``handing over``, ``draining``.
    phase_since
        When the phase began, in wall-clock seconds (shown; deadlines use the
        coordinator's monotonic clock, re-based on a restart).
    started_at
        When the change began (wall clock).
    groups
        How many groups move one after another (1 for a growth or a scale
        without warm-ups).
    moved
        Groups that have handed over.
    """

    kind: str
    summary: str
    target: dict[str, Any]
    phase: str
    phase_since: float
    started_at: float
    groups: int = 1
    moved: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS or self.phase not in PHASES:
            raise ValueError(f"change: kind {self.kind!r} or phase {self.phase!r} unknown")

    def at(self, phase: str, now: float) -> Change:
        """The same change in ``phase`` from ``now`` (unchanged if already there).

        Parameters
        ----------
        phase
            The new phase.
        now
            Wall-clock seconds.

        Returns
        -------
        Change
            The change in its new phase.
        """
        return self if phase == self.phase else replace(self, phase=phase, phase_since=now)

    def group_moved(self, now: float) -> Change:
        """One more group handed over; the next one (if any) starts warming up.

        Parameters
        ----------
        now
            Wall-clock seconds.

        Returns
        -------
        Change
            The change, a group further.
        """
        return replace(self, moved=self.moved + 1, phase=WARMING, phase_since=now)

    def describe(self) -> str:
        """``factor 4 -> 8: warming up, group 1 of 2``."""
        group = f", group {min(self.moved + 1, self.groups)} of {self.groups}"
        return f"{self.summary}: {self.phase}" + (group if self.groups > 1 else "")

    def to_json(self) -> dict[str, Any]:
        """The stored (and shown) form."""
        return {
            "kind": self.kind,
            "summary": self.summary,
            "target": self.target,
            "phase": self.phase,
            "phaseSince": self.phase_since,
            "startedAt": self.started_at,
            "groups": self.groups,
            "moved": self.moved,
            "description": self.describe(),
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Change:
        """Read back :meth:`to_json`.

        Parameters
        ----------
        doc
            What :meth:`to_json` gave.

        Returns
        -------
        Change
            The change.
        """
        return cls(
            doc["kind"],
            doc["summary"],
            dict(doc["target"]),
            doc["phase"],
            float(doc["phaseSince"]),
            float(doc["startedAt"]),
            int(doc["groups"]),
            int(doc["moved"]),
        )


def can_roll_back(change: Change) -> bool:
    """Whether the job can still go back to where it was: a move none of whose groups
    handed over, and none handing over now (its old owners still run)."""
    return change.kind != "growth" and change.moved == 0 and change.phase in (WARMING, CATCHING_UP)


def refuse_cancel(change: Change | None) -> str | None:
    """Why a cancel is refused now, or None when the change can be rolled back.

    Parameters
    ----------
    change
        The change in flight, if any.

    Returns
    -------
    str or None
        The reason, in one line.
    """
    if change is None:
        return "no change is under way: nothing to cancel"
    if change.kind == "growth":
        return (
            f"{change.describe()}: a partition growth cannot be rolled back (the topic has "
            "grown); it completes once the old partitions drained"
        )
    if change.moved:
        return (
            f"{change.describe()}: {change.moved} group(s) already handed over, so it can no "
            "longer be rolled back; it completes"
        )
    if change.phase == HANDING_OVER:
        return (
            f"{change.describe()}: the old owners are stopping, so it can no longer be rolled "
            "back; it completes within their lease"
        )
    return None


def deadline_outcome(change: Change, elapsed_s: float, warm_up_deadline_s: float) -> str | None:
    """What the warming phase's deadline says now: ``"roll back"``, ``"go on"`` or None.

    Only the warming phase has a deadline of its own here: catching up
    ends at the catch-up time (the owners stop anyway), handing over within
    the old owners' lease and margin, and a drain when the old partitions
    drained.

    Parameters
    ----------
    change
        The change in flight.
    elapsed_s
        How long it has been in its phase.
    warm_up_deadline_s
        How long its warm-ups may take to be ready.

    Returns
    -------
    str or None
        None before the deadline (or in a phase without one); ``"roll back"``
        when the change can still be undone; ``"go on"`` (warm-ups that are
        not ready start again) otherwise.
    """
    if change.phase != WARMING or elapsed_s <= warm_up_deadline_s:
        return None
    return "roll back" if can_roll_back(change) else "go on"


@dataclass(frozen=True)
class StartFailures:
    """Failures of a task set's containers before their first committed batch.

    Attributes
    ----------
    count
        Failures in a row with the same cause.
    cause
        That cause (the exception's first line, or what the coordinator saw).
    """

    count: int = 0
    cause: str = ""

    def after(self, cause: str) -> StartFailures:
        """One more failure at start: counted on if of the same cause, else from one.

        Parameters
        ----------
        cause
            Why this one failed.

        Returns
        -------
        StartFailures
            The new tally.
        """
        return StartFailures(self.count + 1 if cause == self.cause else 1, cause)


def backoff_s(failures: int) -> float:
    """How long a successor waits before it launches: 0 after no failure at start, then
    1, 2, 4... seconds, at most :data:`BACKOFF_MAX_S`.

    Parameters
    ----------
    failures
        Failures at start in a row.

    Returns
    -------
    float
        Seconds.
    """
    return 0.0 if failures <= 0 else min(BACKOFF_MAX_S, 2.0 ** (failures - 1))
