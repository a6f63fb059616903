"""Specification: the coordinator's stores, SQLite and PostgreSQL, behave as one interface.

Each spec of the interface runs on both: a SQLite file, and a database of
its own on a real PostgreSQL server the suite starts. The leadership specs
are PostgreSQL's: a lease on the database's clock, an epoch that every
write transaction checks, a claim that waits for a transaction in flight.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from spark_elastic.errors import StoreError, StoreFencedError, StoreOwnedError
from spark_elastic.runtime.coordinator.stores import (
    ContainerRecord,
    SQLiteStore,
    Store,
    open_store,
    refuse_if_owned,
)
from spark_elastic.runtime.protocol import JobModel, ProgressReport, TaskProgress

KINDS = ["sqlite", "postgresql"]


@pytest.fixture
def location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a new store is: a SQLite path, or a new PostgreSQL database's URL."""
    if request.param == "sqlite":
        return str(tmp_path / "coordinator.db")
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def stores(location: str) -> Iterator[Callable[..., Store]]:
    """Open stores at ``location`` (several, like several coordinators); all closed at the end."""
    opened: list[Store] = []

    def make(lease_s: float = 15.0) -> Store:
        opened.append(open_store(location, lease_s))
        return opened[-1]

    yield make
    for store in opened:
        store.close()


def record(container_id: str, generation: int) -> ContainerRecord:
    return ContainerRecord(
        container_id, generation, "launching", None, "", ("t0",), f"/cp/{generation}", (), 1.5,
        None, None,
    )  # fmt: skip


def report(container_id: str, batch: int, read: int) -> ProgressReport:
    task = TaskProgress("t0", {"clicks": {0: batch * 10}}, lag=3)
    return ProgressReport(container_id, 1, batch, read, read, (task,))


@pytest.mark.parametrize("location", KINDS, indirect=True)
def test_a_transaction_writes_everything_or_nothing(stores: Callable[..., Store]) -> None:
    store = stores()
    store.claim("http://a")
    with store.transaction() as db:
        store.add_container(db, record("c1", store.next_generation(db)))
        store.save_model(db, JobModel(1, "clicks", 1, {"clicks": 1}))
        store.add_event(db, "start", detail="job model 1")

    def half_way() -> None:
        with store.transaction() as db:
            store.add_container(db, record("c2", store.next_generation(db)))
            store.update_container(db, "c1", state="running", handle="7")
            store.add_event(db, "launch", "c2")
            raise RuntimeError("half way")

    with pytest.raises(RuntimeError, match="half way"):
        half_way()
    assert [(c.id, c.state, c.handle) for c in store.containers()] == [("c1", "launching", None)]
    assert [e.kind for e in store.events()] == ["start"]
    assert store.model_versions() == [1]
    assert store.meta("next_generation") == "2"


@pytest.mark.parametrize("location", KINDS, indirect=True)
def test_what_a_coordinator_keeps_reads_back_the_same_on_either_store(
    stores: Callable[..., Store],
) -> None:
    store = stores()
    store.claim("http://a")
    model = JobModel(3, "clicks", 2, {"clicks": 2})
    with store.transaction() as db:
        store.save_model(db, JobModel(2, "clicks", 1, {"clicks": 1}))
        store.save_model(db, model)
        store.add_container(db, record("c1", 1))
        store.update_container(db, "c1", state="running", sources=("/cp/0",), ended_at=2.25)
        for kind in ("start", "launch", "register"):
            store.add_event(db, kind, "c1", f"{kind} detail")
    store.save_progress(report("c1", 4, 100))
    store.save_progress(report("c1", 5, 2**40))  # counts beyond 32 bits add up exactly
    assert store.latest_model() == model
    assert store.model(2) == JobModel(2, "clicks", 1, {"clicks": 1})
    assert store.model(9) is None
    (c1,) = store.containers()
    assert (c1.state, c1.sources, c1.ended_at, c1.launched_at) == ("running", ("/cp/0",), 2.25, 1.5)
    assert [e.kind for e in store.events(limit=2)] == ["register", "launch"]
    assert store.throughput() == {"c1": {"batch": 5, "totalRead": 100 + 2**40,
                                         "totalProcessed": 100 + 2**40}}  # fmt: skip
    progress = store.progress()["t0"]
    assert (progress["container"], progress["batch"], progress["lag"]) == ("c1", 5, 3)
    assert progress["offsets"] == {"clicks": {"0": 50}}
    # A second coordinator opening the same store reads the same.
    assert stores().latest_model() == model


@pytest.mark.parametrize("location", KINDS, indirect=True)
def test_a_second_coordinator_is_refused_while_the_first_owns_the_store(
    stores: Callable[..., Store], location: str
) -> None:
    first = stores()
    first.claim("http://first:8470")
    with pytest.raises(StoreOwnedError, match=r"^--store: .*http://first:8470") as refused:
        refuse_if_owned(location)
    assert "\n" not in str(refused.value)
    second = stores()
    with pytest.raises(StoreOwnedError, match="http://first:8470"):
        second.claim("http://second:8470")
    assert first.meta("epoch") == "1"  # the refusal changed nothing
    # Released (its process ended, or it stopped cleanly), the store is the next one's at once.
    first.release()
    refuse_if_owned(location)
    assert second.claim("http://second:8470") == 2


@pytest.mark.parametrize("location", ["postgresql"], indirect=True)
def test_a_leader_whose_lease_ran_out_is_deposed_and_writes_nothing_more(
    stores: Callable[..., Store],
) -> None:
    old = stores(lease_s=0.5)
    old.claim("http://old")
    assert 0 < old.held_for() <= 0.5
    new = stores(lease_s=30)
    with pytest.raises(StoreOwnedError, match=r"lease runs \d\.\d s more"):
        new.claim("http://new")
    time.sleep(0.6)  # the old leader stopped renewing (paused, partitioned, dead)
    assert old.held_for() == 0  # it knows, by its own clock, that it may no longer lead
    assert new.claim("http://new") == 2
    with pytest.raises(StoreFencedError, match="epoch 2, this one's 1"), old.transaction() as db:
        old.add_event(db, "launch", "c9")
    with pytest.raises(StoreFencedError):
        old.renew()
    assert [e.container for e in new.events()] == []
    owner = new.owner() or {}
    assert (owner["url"], owner["epoch"], owner["live"]) == ("http://new", 2, True)


@pytest.mark.parametrize("location", ["postgresql"], indirect=True)
def test_a_claim_waits_for_the_old_leaders_transaction_in_flight_and_fences_the_next(
    stores: Callable[..., Store],
) -> None:
    old = stores(lease_s=0.3)
    old.claim("http://old")
    new = stores()
    time.sleep(0.4)
    claimed: list[int] = []
    with old.transaction() as db:  # began while it still held the epoch
        claiming = threading.Thread(target=lambda: claimed.append(new.claim("http://new")))
        claiming.start()
        claiming.join(0.5)
        assert claiming.is_alive(), "the claim did not wait for the transaction in flight"
        old.add_event(db, "launch", "c1", "committed before the claim")
    claiming.join(10)
    assert claimed == [2]
    with pytest.raises(StoreFencedError), old.transaction() as db:
        old.add_event(db, "launch", "c2", "after the claim: never written")
    assert [e.detail for e in new.events()] == ["committed before the claim"]


@pytest.mark.parametrize("location", ["postgresql"], indirect=True)
def test_a_renewing_leader_keeps_the_store(stores: Callable[..., Store]) -> None:
    leader = stores(lease_s=0.5)
    leader.claim("http://leader")
    standby = stores()
    for _ in range(4):
        time.sleep(0.2)
        leader.renew()
        with pytest.raises(StoreOwnedError):
            standby.claim("http://standby")
    assert leader.held_for() > 0.2
    leader.event("stop")  # still its own


def test_a_postgresql_store_that_cannot_be_used_is_one_line_naming_it_without_its_password(
    postgresql: object, pg_url: str
) -> None:
    from postgresql_server import PASSWORD, PostgreSQLServer

    assert isinstance(postgresql, PostgreSQLServer)
    wrong = postgresql.url(pg_url.rsplit("/", 1)[1], password="not-the-password")
    with pytest.raises(StoreError) as refused:
        open_store(wrong)
    message = str(refused.value)
    assert message.startswith("--store: expected a PostgreSQL database this coordinator can use")
    assert "password authentication failed" in message
    assert "not-the-password" not in message
    assert PASSWORD not in message
    assert "postgres:***@127.0.0.1" in message
    assert "\n" not in message

    from kafka_jvm import free_port

    with pytest.raises(StoreError, match=r"^--store: .*127\.0\.0\.1:\d+/x \(.*refused"):
        open_store(f"postgresql://u:p@127.0.0.1:{free_port()}/x")
    with pytest.raises(StoreError, match='database "missing" does not exist'):
        open_store(postgresql.url("missing"))


def test_a_sqlite_store_is_the_default_for_a_path(tmp_path: Path) -> None:
    store = open_store(tmp_path / "db" / "coordinator.db")
    try:
        assert isinstance(store, SQLiteStore)
        assert store.lease_s is None
        assert store.held_for() == float("inf")
        store.renew()  # held until released: nothing to renew
    finally:
        store.close()
