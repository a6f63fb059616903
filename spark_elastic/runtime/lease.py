"""Lease arithmetic shared by the coordinator and its containers.

The guarantee: **a container writes output and commits only while it holds a
lease, and the coordinator hands its tasks to another container only after
that lease has expired by the coordinator's clock plus a margin.** So two
containers never write one task's output at once, and a zombie (a container
paused by ``SIGSTOP``, a GC pause, or a partition from the coordinator)
writes nothing after its lease ends.

Why it holds, and what it assumes:

- Both sides count on monotonic clocks, never wall clocks, so clock *offsets*
  between machines do not matter; only clock *rates* do.
- The container starts counting its lease when it **sends** the request that
  renews it; the coordinator starts counting when it **receives** the request,
  which is later. So the container's lease ends first, given equal rates.
- Rates may differ by at most ``max_drift`` (a fraction; 0.001 is 1,000 ppm,
  far beyond real quartz drift of about 50 ppm). The container shortens its
  view of the lease by that fraction.
- A write that starts inside the lease may run past it. The container starts
  one only if at least ``write_budget`` of the lease remains, and the
  coordinator's margin is at least that budget, so a write begun in time
  finishes before the coordinator can reassign.

With the defaults (lease 10 s, budget 3 s, margin 5 s), a container that
stops renewing writes nothing after ``lease`` has passed since its last
renewal was sent, and its tasks move at ``lease + margin`` after the
coordinator last heard from it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from spark_elastic.errors import ArgumentError, FencedError

__all__ = ["RESTART_TOLERANCE_S", "ContainerLease", "LeaseTerms", "gives_up"]

Clock = Callable[[], float]

RESTART_TOLERANCE_S = 30.0
"""How long past its lease's end a container keeps trying to reach its coordinator, at
least: a coordinator restart this long stops no container, whatever the lease (no write
starts meanwhile: the lease is what fences, not this)."""


def gives_up(failures: int, retries: int, remaining_s: float, lease_s: float) -> bool:
    """Whether a container stops after failed heartbeats (Samza's retries, then patience).

    Parameters
    ----------
    failures
        Failed heartbeats in a row.
    retries
        How many it tolerates (Samza's ``retry.count``).
    remaining_s
        Its lease left, negative once over.
    lease_s
        The lease's length.

    Returns
    -------
    bool
        True once past its retries **and** its lease has been over for a
        lease's length or :data:`RESTART_TOLERANCE_S`, whichever is longer.
    """
    return failures > retries and remaining_s < -max(lease_s, RESTART_TOLERANCE_S)


@dataclass(frozen=True)
class LeaseTerms:
    """How long leases last and how both sides leave room for drift and slow writes.

    Attributes
    ----------
    lease_s
        A lease's length from the renewal that grants it.
    margin_s
        Extra time the coordinator waits after a lease expires (by its
        clock) before it reassigns the container's tasks. At least
        ``write_budget_s``.
    write_budget_s
        Lease time that must remain for a container to start a write.
    max_drift
        Largest clock-rate difference assumed between the two sides, as a
        fraction.
    """

    lease_s: float = 10.0
    margin_s: float = 5.0
    write_budget_s: float = 3.0
    max_drift: float = 0.001

    def __post_init__(self) -> None:
        if not self.lease_s > 0:
            raise ArgumentError.invalid("lease_s", "a positive number of seconds", self.lease_s)
        if not 0 <= self.write_budget_s < self.lease_s:
            raise ArgumentError.invalid(
                "write_budget_s",
                f"at least 0 and below lease_s ({self.lease_s})",
                self.write_budget_s,
            )
        if not self.margin_s >= self.write_budget_s:
            raise ArgumentError.invalid(
                "margin_s",
                f"at least write_budget_s ({self.write_budget_s}), so a write begun in time ends "
                "before the tasks move",
                self.margin_s,
            )
        if not 0 <= self.max_drift < 0.1:
            raise ArgumentError.invalid("max_drift", "a fraction in [0, 0.1)", self.max_drift)

    def coordinator_expiry(self, renewed_at: float) -> float:
        """When, by the coordinator's clock, a lease renewed at ``renewed_at`` has expired.

        Parameters
        ----------
        renewed_at
            The coordinator's monotonic time when it received the renewal.

        Returns
        -------
        float
            The monotonic time after which the lease is over.
        """
        return renewed_at + self.lease_s

    def reassignable_at(self, renewed_at: float) -> float:
        """When the coordinator may give the container's tasks to another.

        Parameters
        ----------
        renewed_at
            The coordinator's monotonic time of the last renewal it received.

        Returns
        -------
        float
            Lease expiry plus the margin.
        """
        return self.coordinator_expiry(renewed_at) + self.margin_s


class ContainerLease:
    """The container's view of its lease: renewed by heartbeats, checked before every write.

    Thread-safe: the heartbeat thread renews it while the query's
    ``foreachBatch`` (on the container's driver) checks it.

    Parameters
    ----------
    terms
        The lease terms (the container uses ``max_drift`` and ``write_budget_s``).
    clock
        A monotonic clock in seconds (``time.monotonic``; tests pass their own).
    """

    def __init__(self, terms: LeaseTerms, clock: Clock = time.monotonic) -> None:
        self._terms = terms
        self._clock = clock
        self._lock = threading.Condition()
        self._valid_until = float("-inf")
        self._revoked = False

    def renew(self, sent_at: float, lease_ms: int) -> None:
        """Extend the lease after a reply granted ``lease_ms`` to a request sent at ``sent_at``.

        Parameters
        ----------
        sent_at
            This clock's time when the renewing request was sent.
        lease_ms
            The lease the coordinator granted.
        """
        until = sent_at + (lease_ms / 1000.0) * (1.0 - self._terms.max_drift)
        with self._lock:
            if not self._revoked:
                self._valid_until = max(self._valid_until, until)
            self._lock.notify_all()

    def revoke(self) -> None:
        """End the lease now and for good (the coordinator said ``alive: false``)."""
        with self._lock:
            self._revoked = True
            self._valid_until = float("-inf")
            self._lock.notify_all()

    @property
    def revoked(self) -> bool:
        """Whether the coordinator declared this container dead."""
        return self._revoked

    def remaining(self) -> float:
        """Seconds of lease left (negative once expired).

        Returns
        -------
        float
            Time until the container's view of the lease ends.
        """
        with self._lock:
            return self._valid_until - self._clock()

    def await_write(self, what: str, timeout_s: float) -> None:
        """Wait until a write may start, up to ``timeout_s``; then as :meth:`check_write`.

        A container that lost touch with its coordinator for a moment (a
        coordinator restart) pauses its writes instead of failing: if the
        coordinator comes back and renews the lease, the write goes ahead;
        it renews only a container it has not replaced, so that is safe.

        Parameters
        ----------
        what
            What is about to be written, for the message.
        timeout_s
            The longest wait, in this clock's seconds.
        """
        deadline = self._clock() + timeout_s
        with self._lock:
            while not self._revoked:
                now = self._clock()
                if self._valid_until - now >= self._terms.write_budget_s or now >= deadline:
                    break
                self._lock.wait(min(deadline - now, 0.1))
        self.check_write(what)

    def check_write(self, what: str = "write") -> None:
        """Raise :class:`FencedError` unless a write may start now.

        A write may start while at least ``write_budget_s`` of the lease
        remains.

        Parameters
        ----------
        what
            What is about to be written, for the message.
        """
        left = self.remaining()
        if self._revoked:
            raise FencedError(
                f"{what} refused: the coordinator no longer considers this container valid"
            )
        if left < self._terms.write_budget_s:
            raise FencedError(
                f"{what} refused: {max(left, 0.0):.3f} s of lease left, a write needs "
                f"{self._terms.write_budget_s:.3f} s (lease expired or about to)"
            )
