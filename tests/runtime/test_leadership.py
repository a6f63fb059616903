"""Specification: a coordinator leads only while it holds its store, and says so.

In-process coordinators (their state machine, a fake clock, fake processes)
on a real PostgreSQL store: nested leases (a container lease never outlasts
its coordinator's hold on the store), a store out of reach (its role may no
longer log in: a real refusal by the server), and a standby that takes the
store over once the leader's lease is out and waits one store lease plus
the margin before it fails over anything.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from postgresql_server import PostgreSQLServer
from standins import Clock

from conftest import FAKE_TASKS, FAKE_TERMS, FakeLauncher
from spark_elastic.errors import StoreFencedError, StoreOwnedError
from spark_elastic.runtime.coordinator.status import coordinator_line
from spark_elastic.runtime.coordinator.stores.postgresql import PostgreSQLStore
from spark_elastic.runtime.coordinator.supervisor import JobShape, Supervisor
from spark_elastic.runtime.lease import LeaseTerms
from spark_elastic.runtime.protocol import Registration

STORE_LEASE_S = 20.0


@pytest.fixture
def job_role(postgresql: PostgreSQLServer, pg_url: str) -> Iterator[tuple[str, str]]:
    """A login role of the spec's own owning the spec's database: ``(role, its URL)``."""
    database = pg_url.rsplit("/", 1)[1]
    role = f"coordinator_{database}"
    with psycopg.connect(postgresql.url(), autocommit=True) as db:
        db.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'pw'")
        db.execute(f'ALTER DATABASE "{database}" OWNER TO {role}')
    return role, f"postgresql://{role}:pw@127.0.0.1:{postgresql.port}/{database}"


def as_admin(postgresql: PostgreSQLServer, *statements: str) -> None:
    with psycopg.connect(postgresql.url(), autocommit=True) as db:
        for statement in statements:
            db.execute(statement)


@pytest.fixture
def coordinators(tmp_path: Path, job_role: tuple[str, str]) -> Iterator[Callable[..., Supervisor]]:
    """``make(url, clock, launcher, lease_s=...)``: a coordinator of a two-container job on
    the spec's PostgreSQL store; every store closed at the end."""
    made: list[Supervisor] = []

    def make(
        url: str,
        clock: Clock,
        launcher: FakeLauncher,
        lease_s: float = STORE_LEASE_S,
        terms: LeaseTerms = FAKE_TERMS,
    ) -> Any:
        job = JobShape("clicks", "jobs.py:job", 2, {"clicks": 2}, FAKE_TASKS, str(tmp_path / "cp"))
        store = PostgreSQLStore(job_role[1], lease_s, clock=clock)
        try:
            made.append(Supervisor(job, store, launcher, url, 2, terms, startup_s=60, clock=clock))
        except BaseException:
            store.close()
            raise
        return made[-1]

    yield make
    for supervisor in made:
        supervisor.store.close()


def start(supervisor: Supervisor, launcher: FakeLauncher) -> list[str]:
    """Launch and register the job's containers; their ids."""
    supervisor.launch_pending()
    for number, process in enumerate(launcher.processes.values(), 50_000):
        supervisor.register(Registration(process.container_id, number))
    return sorted(c.container_id for c in supervisor.model.containers)


def test_container_leases_end_a_margin_before_the_coordinators_hold_on_its_store(
    coordinators: Callable[..., Supervisor], postgresql: PostgreSQLServer, job_role: tuple[str, str]
) -> None:
    clock, launcher = Clock(), FakeLauncher()
    leader = coordinators("http://leader:8470", clock, launcher)
    c1, c2 = start(leader, launcher)
    assert leader.heartbeat(c1).lease_ms == 10_000  # the store is held 20 s: whole leases

    # The store stops answering this coordinator (its role may no longer log in, its
    # session is ended): renewals fail, the hold runs down, and so do the leases it grants.
    role = job_role[0]
    as_admin(
        postgresql,
        f"ALTER ROLE {role} NOLOGIN",
        f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'",
    )
    clock.advance(8)
    leader.tick()
    assert leader.heartbeat(c1).lease_ms == 7_000  # 20 - 8 - 5 (margin)
    status = leader.status()["coordinator"]
    assert "not permitted to log in" in status["storeError"]
    assert "its store fails" in coordinator_line(status)

    # Past its hold minus the margin it grants nothing and fails nothing over, even a
    # container that went silent: a standby may take the job over now.
    clock.advance(8)
    leader.heartbeat(c1)
    leader.tick()
    assert leader.heartbeat(c1).lease_ms == 0
    clock.advance(30)
    leader.tick()
    assert sorted(c.container_id for c in leader.model.containers) == [c1, c2]

    # The store answers again before anyone else claimed it: at its next renewal (a tenth
    # of the store lease after its last try), the leader renews and goes on.
    as_admin(postgresql, f"ALTER ROLE {role} LOGIN")
    clock.advance(STORE_LEASE_S / 10)
    leader.heartbeat(c1)
    leader.heartbeat(c2)
    leader.tick()
    assert leader.heartbeat(c1).lease_ms == 10_000
    assert leader.status()["coordinator"]["storeError"] == ""


def test_a_standby_takes_over_once_the_leaders_lease_is_out_and_waits_before_it_fails_over(
    coordinators: Callable[..., Supervisor],
) -> None:
    # Short leases (the store's on the database's clock, which the specs cannot stop).
    terms = LeaseTerms(lease_s=0.4, margin_s=0.2, write_budget_s=0.1)
    launcher = FakeLauncher()
    old_clock, new_clock = Clock(), Clock()
    old = coordinators("http://old:8470", old_clock, launcher, lease_s=1.0, terms=terms)
    c1, c2 = start(old, launcher)
    assert old.heartbeat(c1).lease_ms == 400
    with pytest.raises(StoreOwnedError, match=r"led by the coordinator at http://old:8470"):
        coordinators("http://new:8470", new_clock, launcher, lease_s=1.0, terms=terms)

    time.sleep(1.1)  # the old leader stops renewing (it is paused, cut off, or dead)
    new = coordinators("http://new:8470", new_clock, launcher, lease_s=1.0, terms=terms)
    coordinator = new.status()["coordinator"]
    assert (coordinator["url"], coordinator["epoch"]) == ("http://new:8470", 2)
    assert coordinator["waitsS"] == 1.2  # one store lease plus the margin

    # c2 went silent with the old leader. The new one renews its own lease, but fails
    # nothing over until it has waited; then it does.
    for _ in range(5):
        new_clock.advance(0.2)
        new.heartbeat(c1)
        new.tick()
    assert sorted(c.container_id for c in new.model.containers) == [c1, c2]
    for _ in range(5):
        new_clock.advance(0.2)
        new.heartbeat(c1)
        new.tick()
    assert c2 not in {c.container_id for c in new.model.containers}
    assert new.store.meta("epoch") == "2"

    # The deposed leader writes nothing more: its first write or renewal stops it.
    old_clock.advance(1)
    with pytest.raises(StoreFencedError):
        old.tick()
