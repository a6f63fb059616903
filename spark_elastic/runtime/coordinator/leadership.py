"""Leading a job: nested leases under the store's own, and a new leader's wait.

A coordinator leads its job as long as it holds its store
(:meth:`~.stores.Store.claim`; a SQLite store until the process exits, a
PostgreSQL store for a lease it renews). :class:`Leadership` keeps that
hold and derives from it what the coordinator may do:

- **Renew** the store's lease every :data:`RENEWALS_PER_LEASE`-th of it, on
  the ticks; a store out of reach is retried at the next tick while the
  lease runs down.
- **Nested leases**: a container's lease is granted only up to the end of
  the coordinator's own hold minus the margin (:meth:`Leadership.grant`),
  so every lease a deposed leader granted has ended before a standby can
  claim the store.
- **A new leader waits** one store lease plus the margin before it fails
  over or moves anything (:meth:`Leadership.may_act`): a container the
  last leader could still see alive is not replaced under it.

Pure bookkeeping over a store and a clock; runs on the coordinator's
event-loop thread.

May import: :mod:`.stores`, :mod:`spark_elastic.errors` and the standard library.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from spark_elastic.errors import StoreError, StoreFencedError
from spark_elastic.runtime.coordinator.stores import Store

__all__ = ["RENEWALS_PER_LEASE", "Leadership", "LeadershipView"]

RENEWALS_PER_LEASE = 10
"""How many times a store lease is renewed within its length: a renewal or two lost to
a slow store costs a fifth of the lease, not all of it."""


@dataclass(frozen=True)
class LeadershipView:
    """What the status shows of the leadership.

    Attributes
    ----------
    url
        This coordinator's URL.
    store
        Where its store is (a path, or a URL without its password).
    since
        When it began to lead (wall-clock seconds).
    epoch
        The store's epoch this coordinator claimed.
    held_for_s
        Seconds it surely still leads (None: until it exits).
    waits_s
        Seconds left before it may fail over or move anything (0: it may).
    store_error
        Why the store last failed this coordinator (a renewal, a read), or "";
        cleared by the next renewal that succeeds.
    """

    url: str
    store: str
    since: float
    epoch: int | None
    held_for_s: float | None
    waits_s: float
    store_error: str


class Leadership:
    """A coordinator's hold on its store, and what it may grant and do because of it.

    Parameters
    ----------
    store
        The claimed store.
    url
        This coordinator's URL.
    clock
        Monotonic clock.
    margin_s
        The lease margin: granted leases end this long before the store's hold,
        and a new leader waits it beyond one store lease.
    took_over
        Whether another coordinator led this store before (a failover or a
        restart): this one then waits before it acts.
    """

    def __init__(
        self,
        store: Store,
        url: str,
        clock: Callable[[], float],
        margin_s: float,
        took_over: bool,
    ) -> None:
        self.store = store
        self.url = url
        self.since = time.time()
        self._clock = clock
        self.margin_s = margin_s
        self._tried_at = clock()
        self.store_error = ""
        lease = store.lease_s
        self._acts_from = clock() + lease + margin_s if took_over and lease is not None else 0.0

    def renew_if_due(self) -> None:
        """Renew the store's lease when a :data:`RENEWALS_PER_LEASE`-th of it has passed since
        the last try, successful or not: a store out of reach is tried again at that pace,
        not at every tick (each try may wait for its connection's timeout).

        Raises
        ------
        StoreFencedError
            Another coordinator has claimed the store: this one must stop.
        """
        lease = self.store.lease_s
        now = self._clock()
        if lease is None or now < self._tried_at + lease / RENEWALS_PER_LEASE:
            return
        self._tried_at = now
        try:
            self.store.renew()
        except StoreFencedError:
            raise
        except StoreError as exc:
            # Out of reach for now: the hold runs down, and with it what may be granted.
            self.store_error = str(exc)
            return
        self.store_error = ""

    def store_failed(self, error: StoreError) -> None:
        """The store failed a call: shown (and nothing decided) until a renewal succeeds."""
        self.store_error = str(error)

    def grant(self, lease_s: float) -> float:
        """The container lease to grant now: ``lease_s``, cut to end ``margin_s`` before this
        coordinator's own hold on the store does (0 once that is not surely held)."""
        return max(0.0, min(lease_s, self.store.held_for() - self.margin_s))

    def may_act(self) -> bool:
        """Whether this coordinator may fail over or move: it surely leads past the margin,
        and a new leader has waited one store lease plus the margin."""
        return self._clock() >= self._acts_from and self.store.held_for() > self.margin_s

    def view(self) -> LeadershipView:
        """The leadership as the status shows it."""
        held = self.store.held_for()
        return LeadershipView(
            self.url,
            self.store.location,
            self.since,
            self.store.epoch,
            None if self.store.lease_s is None else round(held, 1),
            round(max(0.0, self._acts_from - self._clock()), 1),
            self.store_error,
        )
