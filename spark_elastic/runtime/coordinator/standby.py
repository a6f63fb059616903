"""A hot standby: a coordinator that waits to lead a job another coordinator leads.

``spark-elastic job run ... --store postgresql://...`` started while another
coordinator holds the store's lease does not give up: it listens on its
address, answers every request with ``409`` naming the leader (a
container that asks it is sent there, :mod:`..container.client`), says in
the store that it stands by (the leader's status lists it), and tries to
claim the store every :data:`~.leadership.RENEWALS_PER_LEASE`-th of a
lease. Once the leader's lease has run out (it died, or lost its host or
its network) the claim succeeds: a new epoch fences the old leader's
writes, and this coordinator becomes the :class:`~.server.CoordinatorServer`
on the same socket, which waits one store lease plus the margin before it
fails over or moves anything (:mod:`.leadership`).

Runs in the coordinator process, on its own event loop, before the leader's.

May import: :mod:`.stores`, :mod:`.leadership`, :mod:`spark_elastic.errors`,
aiohttp and the standard library.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
from collections.abc import Callable

from aiohttp import web

from spark_elastic.errors import StoreError, StoreOwnedError
from spark_elastic.runtime.coordinator.leadership import RENEWALS_PER_LEASE
from spark_elastic.runtime.coordinator.stores import Store

__all__ = ["Standby", "lead_or_stand_by"]


class Standby:
    """Waits to lead: answers ``409`` naming the leader, and claims the store when it can.

    Parameters
    ----------
    store
        The job's shared store (a lease to wait out).
    url
        This coordinator's URL (containers are sent to the leader's).
    sock
        This coordinator's bound socket; the standby serves on a copy of it,
        so the leader's server takes its queue over without a gap. None for
        one that only claims (:meth:`try_to_lead`), serving nothing.
    """

    def __init__(self, store: Store, url: str, sock: socket.socket | None = None) -> None:
        if store.lease_s is None:
            raise StoreOwnedError(f"--store: {store.location} cannot be shared by a standby")
        self.store = store
        self.url = url
        self._sock = sock
        self.poll_s = store.lease_s / RENEWALS_PER_LEASE
        self.leader: str | None = None
        self.error = ""

    async def _answer(self, request: web.Request) -> web.Response:
        del request
        leader = self.leader
        return web.json_response(
            {
                "error": f"this coordinator ({self.url}) stands by; the job is led by "
                f"{leader or 'a coordinator this one cannot name yet'}"
                + (f" (its store fails: {self.error})" if self.error else ""),
                "leader": leader,
                "standby": self.url,
            },
            status=409,
        )

    def try_to_lead(self) -> bool:
        """Claim the store if the leader's lease has run out; else say this one stands by."""
        try:
            self.store.claim(self.url)
        except StoreOwnedError:
            try:
                owner = self.store.owner()
                self.leader = None if owner is None else str(owner["url"])
                self.store.stand_by(self.url)
            except StoreError as exc:  # gone out of reach since the claim's answer
                self.error = str(exc)
            else:
                self.error = ""
            return False
        except StoreError as exc:  # out of reach for now: try again at the next poll
            self.error = str(exc)
            return False
        with contextlib.suppress(StoreError):
            self.store.leave(self.url)
        return True

    async def wait(self, stop: asyncio.Event) -> bool:
        """Serve 409s until this coordinator leads (True) or ``stop`` is set (False)."""
        if self._sock is None:
            raise ValueError("a standby without a socket serves nothing")
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._answer)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        await web.SockSite(runner, self._sock.dup()).start()
        try:
            while not stop.is_set():
                if self.try_to_lead():
                    return True
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.poll_s)
            with contextlib.suppress(StoreError):
                self.store.leave(self.url)
            return False
        finally:
            await runner.cleanup()

    def run_until_leading(self) -> bool:
        """:meth:`wait` on a loop of its own until this coordinator leads; SIGINT and SIGTERM
        end the wait (False)."""
        loop = asyncio.new_event_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            return loop.run_until_complete(self.wait(stop))
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            loop.close()


def lead_or_stand_by(
    store: Store, url: str, sock: socket.socket, on_standby: Callable[[str | None], None]
) -> str:
    """Claim the store for the coordinator at ``url``, standing by first if another leads.

    Parameters
    ----------
    store
        The job's store, opened.
    url
        This coordinator's URL.
    sock
        Its bound socket.
    on_standby
        Told the leader's URL (None if unknown) once this one stands by.

    Returns
    -------
    str
        ``""`` once it leads; else why it does not, in one line: it was stopped
        while standing by, or the leader it stood by for stopped the job (or
        the job failed): a standby takes a running job over, it does not start
        one again (``job run`` does; the store is released for it).

    Raises
    ------
    StoreOwnedError
        A store only one host can reach (SQLite) is owned by a live coordinator.
    """
    try:
        store.claim(url)
    except StoreOwnedError:
        if store.lease_s is None:
            raise
    else:
        return ""
    standby = Standby(store, url, sock)
    standby.try_to_lead()  # names the leader (or leads already, if its lease just ran out)
    if store.epoch is not None:
        return ""  # the leader's lease had just run out: no standing by
    on_standby(standby.leader)
    if not standby.run_until_leading():
        return "stopped while standing by"
    state = json.loads(store.meta("jobState") or "{}").get("state", "running")
    if state != "running":
        store.release()
        return f"the job is {state}: this standby leaves it so (job run resumes it)"
    return ""
