"""An operable coordinator, in-process: one per job, stop and resume, a loop that fails.

Fake clock and fake processes (``tests/conftest.py``); a real store. What
the stories look like with real processes is in ``test_operable_cli.py``.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import FAKE_TERMS, InProcess
from spark_elastic.errors import StoreFencedError, StoreOwnedError
from spark_elastic.runtime.coordinator.launchers import LocalLauncher
from spark_elastic.runtime.coordinator.server import CoordinatorServer, bind
from spark_elastic.runtime.coordinator.stores import SQLiteStore
from spark_elastic.runtime.coordinator.supervisor import Supervisor
from spark_elastic.runtime.protocol import Registration


def running(harness: InProcess) -> InProcess:
    """Its containers launched, registered and committed a first batch."""
    harness.supervisor.launch_pending()
    harness.register_all()
    for c in harness.supervisor.model.containers:
        harness.report(c.container_id, batch=1)
    assert sorted(harness.states().values()) == ["running", "running"]
    return harness


def serve_until_it_ends(supervisor: Supervisor) -> CoordinatorServer:
    """The supervisor behind its real HTTP server, on this thread, until serving ends."""
    server = CoordinatorServer(lambda url: supervisor, bind("127.0.0.1", 0))
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(asyncio.wait_for(server.serve(), 30))
    finally:
        loop.close()
    return server


# one coordinator per job


def test_a_second_coordinator_of_a_job_is_refused_naming_the_first_and_changes_nothing(
    in_process: InProcess,
) -> None:
    first = running(in_process).supervisor
    before = (first.store.model_versions(), [e.__dict__ for e in first.store.events()])
    with pytest.raises(StoreOwnedError, match=r"coordinator at http://127.0.0.1:9 \(pid \d+\)"):
        in_process.make(url="http://127.0.0.1:10")
    with pytest.raises(StoreOwnedError, match="one coordinator per job"):
        SQLiteStore.refuse_if_owned(first.store.path)
    assert (first.store.model_versions(), [e.__dict__ for e in first.store.events()]) == before
    # The first goes on untouched: its containers keep their leases.
    in_process.step(20)
    assert sorted(in_process.states().values()) == ["running", "running"]


def test_a_coordinator_whose_store_another_claimed_writes_nothing_more(
    in_process: InProcess,
) -> None:
    first = running(in_process).supervisor
    # The lock cannot be lost on a local disk; the epoch still fences a store that was
    # claimed behind the lock's back (a network file system).
    with sqlite3.connect(first.store.path) as db:
        db.execute("UPDATE meta SET value = '99' WHERE key = 'epoch'")
    with pytest.raises(StoreFencedError, match=r"epoch 99, this one's 1"):
        first.store.event("note", detail="anything")
    assert "note" not in [e.kind for e in first.store.events()]


def test_the_store_is_free_again_once_its_coordinator_stopped(in_process: InProcess) -> None:
    running(in_process)
    in_process.supervisor.stop(timeout_s=0)
    in_process.restart()
    assert in_process.supervisor.store.epoch == 2


# stop and resume


def test_a_stopped_job_is_shown_stopped_and_resumes_each_containers_tasks_from_its_commits(
    in_process: InProcess,
) -> None:
    first = running(in_process).supervisor
    before = {c.container_id: c for c in first.model.containers}
    first.stop(timeout_s=0)
    assert in_process.launcher.running() == []
    assert first.job_state()["state"] == "stopped"
    assert set(in_process.states().values()) == {"stopped"}

    again = in_process.restart()
    again.launch_pending()
    # Same task sets, each from its predecessor's checkpoint, in new generations.
    heirs = {c.tasks: c for c in again.model.containers}
    assert sorted(heirs) == sorted(c.tasks for c in before.values())
    for old in before.values():
        heir = heirs[old.tasks]
        assert heir.generation > old.generation
        assert heir.sources in ((old.checkpoint,), old.sources)
    assert in_process.launcher.running() == sorted(heirs[t].container_id for t in heirs)
    assert again.job_state()["state"] == "running"
    assert "resume" in [e.kind for e in again.store.events()]


def test_a_job_stopped_twice_resumes_twice(in_process: InProcess) -> None:
    running(in_process)
    for _ in range(2):
        in_process.supervisor.stop(timeout_s=0)
        in_process.restart()
        in_process.supervisor.launch_pending()
        in_process.register_all()
        assert sorted(in_process.states()[c] for c in in_process.live()) == ["running"] * 2
    assert len(in_process.launcher.processes) == 6


def test_a_job_stopped_mid_move_resumes_the_move_with_fresh_warm_ups(
    in_process: InProcess,
) -> None:
    in_process.restart(stateful=True)
    running(in_process)
    in_process.supervisor.scale(1)
    in_process.supervisor.launch_pending()
    (warm,) = in_process.supervisor.model.warmups
    in_process.supervisor.register(Registration(warm.container_id, 4242))
    in_process.supervisor.stop(timeout_s=0)

    # Stopped for an hour: the resumed move's warming phase starts when it resumes.
    with sqlite3.connect(in_process.supervisor.store.path) as db:
        (text,) = db.execute("SELECT value FROM meta WHERE key = 'change'").fetchone()
        change = json.loads(text)
        change["phaseSince"] -= 3600
        db.execute("UPDATE meta SET value = ? WHERE key = 'change'", (json.dumps(change),))
    again = in_process.restart(stateful=True)
    assert again.status()["change"]["inPhaseS"] < 60
    (fresh,) = again.model.warmups
    assert fresh.container_id != warm.container_id
    assert fresh.tasks == warm.tasks
    assert fresh.sources == ()
    again.launch_pending()
    assert fresh.container_id in in_process.launcher.running()


# the loop


def test_a_coordinator_whose_loop_raises_exits_1_saying_why_and_stops_its_containers(
    in_process: InProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    running(in_process)
    supervisor = in_process.supervisor

    def broken() -> None:
        raise RuntimeError("the state machine broke")

    supervisor.tick = broken  # type: ignore[method-assign]
    server = serve_until_it_ends(supervisor)
    assert server.exit_code == 1
    assert "RuntimeError: the state machine broke" in capsys.readouterr().err
    assert in_process.launcher.running() == []
    stop = next(e for e in SQLiteStore(supervisor.store.path).events() if e.kind == "stop")
    assert "the coordinator failed (RuntimeError: the state machine broke)" in stop.detail


def test_stop_runs_on_the_loop_while_progress_reports_arrive(in_process: InProcess) -> None:
    # Processes that take a while to stop: the loop keeps taking their reports meanwhile,
    # and every write to the store, the stop's too, is on the loop's thread (the store's
    # one connection is never shared between threads).
    in_process.launcher.exits_on_sigterm = False
    running(in_process)
    supervisor = in_process.supervisor
    store = supervisor.store
    writers: set[int] = set()
    transaction = store.transaction

    def recorded():  # type: ignore[no-untyped-def]
        writers.add(threading.get_ident())
        return transaction()

    store.transaction = recorded  # type: ignore[method-assign]
    server = CoordinatorServer(lambda url: supervisor, bind("127.0.0.1", 0))
    reported: list[int] = []

    async def story() -> None:
        serving = asyncio.ensure_future(server.serve())
        await asyncio.sleep(0.3)
        server.request_stop()
        for batch in range(2, 12):
            for c in supervisor.model.containers:
                in_process.report(c.container_id, batch=batch)
            reported.append(batch)
            await asyncio.sleep(0.05)
        assert not serving.done()
        for process in in_process.launcher.processes.values():
            process.alive = False
        await asyncio.wait_for(serving, 30)

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(story())
    finally:
        loop.close()
    assert writers == {threading.get_ident()}
    assert len(reported) == 10
    assert server.exit_code == 0
    assert {c.state for c in SQLiteStore(store.path).containers()} == {"stopped"}


def test_a_job_stopped_before_its_warm_ups_launched_resumes_the_move_with_fresh_ones(
    in_process: InProcess,
) -> None:
    in_process.restart(stateful=True)
    running(in_process)
    in_process.supervisor.scale(3)
    waiting = {w.container_id for w in in_process.supervisor.model.warmups}
    in_process.supervisor.stop(timeout_s=0)  # before a tick launched them
    assert {in_process.states()[w] for w in waiting} == {"stopped"}

    again = in_process.restart(stateful=True)
    fresh = {w.container_id for w in again.model.warmups}
    assert len(fresh) == len(waiting)
    assert not fresh & waiting
    assert again.change is not None
    assert again.change.phase == "warming up"


def test_an_exited_container_is_reaped_not_left_a_zombie(tmp_path: Path) -> None:
    launcher = LocalLauncher(tmp_path, [sys.executable, "-c", "pass"])
    pid = launcher.launch("c1", {})
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}/stat").exists() and time.monotonic() < deadline:
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            launcher.reap()
        else:
            time.sleep(0.05)  # still running: a short poll, bounded by the deadline
    assert not Path(f"/proc/{pid}/stat").exists()
    assert not launcher.alive(pid, "c1")


def test_a_successor_starts_from_what_its_predecessor_reported_committed_not_from_its_disk(
    in_process: InProcess,
) -> None:
    # No checkpoint of these containers exists on the coordinator's disk: what they
    # committed is known from their progress reports alone.
    sup = in_process.supervisor
    sup.launch_pending()
    in_process.register_all()
    reported, silent = sup.model.containers
    in_process.report(reported.container_id, batch=1)
    assert not Path(reported.checkpoint).exists()
    sup.report_failure(reported.container_id, "Boom")
    sup.report_failure(silent.container_id, "Boom")
    heirs = {c.tasks: c for c in sup.model.containers}
    assert heirs[reported.tasks].sources == (reported.checkpoint,)
    assert heirs[silent.tasks].sources == silent.sources == ()


def test_a_coordinator_failing_as_it_starts_stops_what_it_launched_and_exits_1(
    in_process: InProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    supervisor = in_process.supervisor
    launch = supervisor.launch_pending

    def launch_then_fail() -> None:
        launch()
        raise OSError("no space left on device")

    supervisor.launch_pending = launch_then_fail  # type: ignore[method-assign]
    server = serve_until_it_ends(supervisor)
    assert server.exit_code == 1
    assert "OSError: no space left on device" in capsys.readouterr().err
    assert len(in_process.launcher.processes) == 2
    assert in_process.launcher.running() == []


# a loaded machine: the coordinator's own stalls


def test_time_the_coordinator_could_not_hear_is_charged_to_no_lease(
    in_process: InProcess,
) -> None:
    # Its process stalled past a lease and its margin: the containers' heartbeats are
    # queued, unheard. Judged now, both would fail over though both renewed all along.
    running(in_process)
    supervisor, terms = in_process.supervisor, FAKE_TERMS
    stall = terms.lease_s + terms.margin_s + 1
    in_process.clock.advance(stall)
    supervisor.deaf_for(stall)
    supervisor.tick()
    assert sorted(in_process.states().values()) == ["running", "running"]
    assert supervisor.counters["stalls"] == 1
    # A renewal heard while the loop ran (here: after a stall began, by the server's
    # measure) is not moved later: its lease is a lease, no more.
    in_process.beat_all()
    in_process.clock.advance(0.5)
    supervisor.deaf_for(1.0)
    leases = [c["leaseLeftS"] for c in supervisor.status()["containers"]]
    assert leases == [terms.lease_s - 0.5] * 2
    # A container really gone still fails over, after a lease and its margin of listening.
    in_process.step(terms.lease_s + terms.margin_s + 0.1, beat=False)
    assert "expire" in [e.kind for e in SQLiteStore(supervisor.store.path).events()]


def test_a_tick_that_held_the_loop_is_reported_as_time_nobody_was_heard(
    in_process: InProcess,
) -> None:
    running(in_process)
    supervisor = in_process.supervisor
    server = CoordinatorServer(lambda url: supervisor, bind("127.0.0.1", 0))
    deaf: list[float] = []
    supervisor.deaf_for = deaf.append  # type: ignore[method-assign]
    tick, ticks = supervisor.tick, 0

    def slow_once() -> None:
        nonlocal ticks
        ticks += 1
        tick()
        if ticks == 1:
            time.sleep(1.0)  # holds the loop: no heartbeat is read meanwhile
        if ticks == 3:
            server.request_stop()

    supervisor.tick = slow_once  # type: ignore[method-assign]
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(asyncio.wait_for(server.serve(), 30))
    finally:
        loop.close()
    assert max(deaf, default=0.0) >= 1.0, deaf
