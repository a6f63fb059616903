"""Specification of :class:`InFlight`: the change in flight, kept in the store.

A real store and a clock in seconds; the supervisor is a stand-in
:class:`FlightHost` holding a job model with one warm-up. The supervisor's
use of it (moves, growths, the deadlines and cancel of real changes) is
``test_changes.py``'s, in-process, and the operable story's, end to end.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from spark_elastic.errors import ChangeRefusedError
from spark_elastic.runtime.coordinator.changes import CATCHING_UP, HANDING_OVER, WARMING
from spark_elastic.runtime.coordinator.history import History
from spark_elastic.runtime.coordinator.in_flight import InFlight
from spark_elastic.runtime.coordinator.stores import ContainerRecord, SQLiteStore, Store
from spark_elastic.runtime.protocol import ContainerModel, JobModel


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Host:
    """A supervisor with two old owners and one warm-up; it records what it was asked."""

    model: JobModel
    records: Mapping[str, ContainerRecord] = field(default_factory=dict)
    done: bool = False
    doomed: list[tuple[str, str]] = field(default_factory=list)
    failed_over: list[str] = field(default_factory=list)
    called_off: int = 0

    def next_model(self, db: Any, base: JobModel | None = None, **changes: Any) -> JobModel:
        return replace(base or self.model, version=self.model.version + 1, **changes)

    def nothing_left(self) -> bool:
        return self.done

    def is_live(self, container_id: str) -> bool:
        return True

    def fail_over(self, container_id: str, reason: str) -> None:
        self.failed_over.append(container_id)

    def doom(self, container_id: str, state: str) -> None:
        self.doomed.append((container_id, state))

    def call_off_moves(self) -> None:
        self.called_off += 1


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = SQLiteStore(tmp_path / "coordinator.db")
    store.claim("http://127.0.0.1:9")
    yield store
    store.close()


@pytest.fixture
def host(store: Store) -> Host:
    def container(cid: str, tasks: tuple[str, ...]) -> ContainerModel:
        return ContainerModel(cid, tasks, 1, f"checkpoints/{cid}")

    owners = (container("c1", ("Partition 0",)), container("c2", ("Partition 1",)))
    warm = container("c3", ("Partition 0", "Partition 1"))
    model = JobModel(7, "clicks", 1, {"clicks": 2}, owners, warmups=(warm,))
    with store.transaction() as db:
        for c, state in ((owners[0], "running"), (owners[1], "running"), (warm, "launching")):
            record = ContainerRecord(
                c.container_id, 1, state, None, "", c.tasks, c.checkpoint, (), None, None, None
            )
            store.add_container(db, record)
    return Host(model, {r.id: r for r in store.containers()})


def begun(store: Store, clock: Clock, deadline_s: float = 60.0) -> InFlight:
    flight = InFlight(store, clock, deadline_s, History(store))
    with store.transaction() as db:
        flight.begin(db, "scale", "2 -> 1 containers", {"containers": 1}, WARMING)
    return flight


def test_a_change_is_kept_in_the_store_and_a_new_phase_restarts_its_clock(store: Store) -> None:
    clock = Clock()
    flight = begun(store, clock)
    clock.now += 30
    with store.transaction() as db:
        flight.enter(db, WARMING)  # the same phase: its clock goes on
    assert flight.in_phase_s == 30
    with store.transaction() as db:
        flight.enter(db, CATCHING_UP)
    assert flight.in_phase_s == 0
    assert InFlight(store, clock, 60.0, History(store)).change == flight.change


def test_a_loaded_change_s_phase_clock_counts_from_when_its_phase_began(store: Store) -> None:
    clock = Clock()
    flight = begun(store, clock)
    with store.transaction() as db:  # as if the phase began 40 s ago, on the wall clock
        flight.save(db, replace(flight.change, phase_since=time.time() - 40))  # type: ignore[arg-type]
    loaded = InFlight(store, Clock(), 60.0, History(store))
    assert 39 < loaded.in_phase_s < 45


def test_a_done_change_ends_saying_how_long_it_took(store: Store, host: Host) -> None:
    flight = begun(store, Clock())
    flight.settle(host)
    assert flight.change is not None
    host.done = True
    flight.settle(host)
    assert flight.change is None
    assert InFlight(store, Clock(), 60.0, History(store)).change is None
    assert store.events()[0].kind == "change"
    assert store.events()[0].detail.startswith("2 -> 1 containers: done in ")


def test_at_its_deadline_a_warming_change_is_rolled_back_in_one_transaction(
    store: Store, host: Host
) -> None:
    clock = Clock()
    flight = begun(store, clock, deadline_s=60)
    clock.now += 60
    flight.settle(host)  # at the deadline, not past it
    assert flight.change is not None
    clock.now += 1
    flight.settle(host)
    assert flight.change is None
    assert host.model.warmups == ()
    assert host.model.version == 8
    assert host.doomed == [("c3", "cancelled")]
    assert host.called_off == 1
    assert {r.id: r.state for r in store.containers()}["c3"] == "cancelled"
    (event,) = [e for e in store.events() if e.kind == "deadline"]
    assert event.detail == (
        "2 -> 1 containers rolled back: its warm-ups were not ready within 60 s; "
        "warm-ups c3 stop, the old owners keep their tasks (job model 8)"
    )


def test_past_its_deadline_a_change_with_a_group_moved_goes_on_with_late_warm_ups_anew(
    store: Store, host: Host
) -> None:
    clock = Clock()
    flight = begun(store, clock, deadline_s=60)
    with store.transaction() as db:
        flight.save(db, flight.change.group_moved(time.time()))  # type: ignore[union-attr]
        flight.enter(db, WARMING)
    clock.now += 61
    flight.settle(host)
    assert host.failed_over == ["c3"]  # it is still launching: started again
    assert flight.change is not None
    assert flight.in_phase_s == 0  # a new deadline for them
    assert "a group has moved already, so the change goes on" in store.events()[0].detail


def test_the_operator_cancels_a_change_that_can_still_be_undone_and_only_that(
    store: Store, host: Host
) -> None:
    with pytest.raises(ChangeRefusedError, match="no change is under way"):
        InFlight(store, Clock(), 60.0, History(store)).cancel(host)
    flight = begun(store, Clock())
    with store.transaction() as db:
        flight.enter(db, HANDING_OVER)
    with pytest.raises(ChangeRefusedError, match="the old owners are stopping"):
        flight.cancel(host)
    assert flight.change is not None
    assert host.doomed == []
    with store.transaction() as db:
        flight.enter(db, CATCHING_UP)
    summary = flight.cancel(host)
    assert summary.startswith("2 -> 1 containers rolled back: cancelled by the operator")
    assert flight.change is None
    assert host.doomed == [("c3", "cancelled")]


def test_a_resumed_job_s_change_goes_on_from_warming_up_its_clock_started_anew(
    store: Store,
) -> None:
    clock = Clock()
    flight = begun(store, clock)
    with store.transaction() as db:
        flight.enter(db, CATCHING_UP)
    clock.now += 500  # stopped meanwhile
    restarted = InFlight(store, clock, 60.0, History(store))
    with store.transaction() as db:
        restarted.resume(db)
    assert restarted.change is not None
    assert restarted.change.phase == WARMING  # its old owners and warm-ups are new processes
    assert restarted.in_phase_s == 0
    assert InFlight(store, clock, 60.0, History(store)).change == restarted.change
