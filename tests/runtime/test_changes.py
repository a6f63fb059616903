"""Changes as objects: phases, deadlines with stated outcomes, cancel; crash loops; numbers.

In-process (``tests/conftest.py``): a real store, a fake clock, fake processes.
"""

from __future__ import annotations

import pytest

from conftest import FAKE_TERMS, InProcess
from spark_elastic.errors import ChangeRefusedError
from spark_elastic.runtime.coordinator.changes import (
    BACKOFF_MAX_S,
    Change,
    StartFailures,
    backoff_s,
    deadline_outcome,
    refuse_cancel,
)
from spark_elastic.runtime.coordinator.supervisor import input_lag
from spark_elastic.runtime.lease import RESTART_TOLERANCE_S, gives_up
from spark_elastic.runtime.protocol import FailureReport, Registration


def running(harness: InProcess, stateful: bool = False, **options: object) -> InProcess:
    if stateful or options:
        harness.restart(stateful=stateful, **options)
    harness.supervisor.launch_pending()
    harness.register_all()
    for c in harness.supervisor.model.containers:
        harness.report(c.container_id, batch=1)
    return harness


def warm_ups(harness: InProcess) -> list[str]:
    return [w.container_id for w in harness.supervisor.model.warmups]


def until_handing_over(harness: InProcess) -> None:
    """The change's warm-ups start and are ready; time passes until it hands over (or 10 s)."""
    sup = harness.supervisor
    sup.launch_pending()
    harness.register_all()
    for _ in range(10):
        harness.step(1)
        if sup.change is not None and sup.change.phase == "handing over":
            break


def events(harness: InProcess, kind: str) -> list[str]:
    return [e.detail for e in harness.supervisor.store.events(500) if e.kind == kind]


# the change object, pure


def test_a_change_names_its_phase_and_group() -> None:
    change = Change(
        "factor", "elasticity factor 2 -> 4", {"elasticityFactor": 4}, "warming up", 0, 0, 2
    )
    assert change.describe() == "elasticity factor 2 -> 4: warming up, group 1 of 2"
    moved = change.at("handing over", 5).group_moved(9)
    assert moved.describe() == "elasticity factor 2 -> 4: warming up, group 2 of 2"
    assert Change.from_json(moved.to_json()) == moved


@pytest.mark.parametrize(
    ("kind", "phase", "moved", "refused"),
    [
        ("scale", "warming up", 0, None),
        ("factor", "catching up", 0, None),
        ("scale", "handing over", 0, "the old owners are stopping"),
        ("factor", "warming up", 1, "1 group(s) already handed over"),
        ("growth", "draining", 0, "a partition growth cannot be rolled back"),
    ],
)
def test_a_change_can_be_cancelled_only_while_it_can_be_rolled_back(
    kind: str, phase: str, moved: int, refused: str | None
) -> None:
    change = Change(kind, "x", {}, phase, 0, 0, 2, moved)
    reason = refuse_cancel(change)
    assert reason is None if refused is None else refused in (reason or "")
    outcome = deadline_outcome(change, 601, 600)
    if phase == "warming up":
        assert outcome == ("roll back" if refused is None else "go on")
    else:
        assert outcome is None
    assert deadline_outcome(change, 599, 600) is None


def test_relaunches_back_off_exponentially_up_to_a_minute() -> None:
    assert [backoff_s(n) for n in range(8)] == [0, 1, 2, 4, 8, 16, 32, 60]
    assert backoff_s(30) == BACKOFF_MAX_S


def test_failures_at_start_count_in_a_row_per_cause() -> None:
    tally = StartFailures().after("boom").after("boom")
    assert tally == StartFailures(2, "boom")
    assert tally.after("other") == StartFailures(1, "other")


@pytest.mark.parametrize(
    ("lease_s", "remaining_s", "gives"),
    [
        (4.0, -29.0, False),  # a 30 s coordinator restart with a 4 s lease: keeps trying
        (4.0, -RESTART_TOLERANCE_S - 1, True),
        (60.0, -59.0, False),  # a long lease: a lease's length past its end
        (60.0, -61.0, True),
    ],
)
def test_a_container_waits_out_a_coordinator_restart_of_30_s_whatever_its_lease(
    lease_s: float, remaining_s: float, gives: bool
) -> None:
    assert gives_up(7, 6, remaining_s, lease_s) is gives
    assert not gives_up(6, 6, -1000.0, lease_s)  # within Samza's retries, never


def test_a_failure_report_is_one_line_of_bounded_size() -> None:
    assert FailureReport.from_json({"containerId": "c1", "error": "Boom: x"}).error == "Boom: x"
    with pytest.raises(ValueError, match=r"failure\.error: expected 1 to 1000 characters"):
        FailureReport.from_json({"containerId": "c1", "error": "x" * 1001})


# lag and leases as shown


def test_lag_counts_each_record_once_and_unknown_is_unknown() -> None:
    parts = {
        "t0": frozenset({"clicks/0"}),
        "t1": frozenset({"clicks/0"}),
        "t2": frozenset({"clicks/1"}),
    }
    # Two buckets of partition 0 each report its whole backlog: it counts once, the slowest.
    assert input_lag({"t0": 100, "t1": 120, "t2": 5}, parts) == 125
    assert input_lag({"t0": 100, "t1": -1, "t2": 5}, parts) is None


def test_the_status_shows_input_lag_once_and_no_lease_before_registration(
    in_process: InProcess,
) -> None:
    sup = in_process.supervisor
    sup.launch_pending()
    status = sup.status()
    assert status["inputLag"] is None
    assert {c["leaseLeftS"] for c in status["containers"]} == {None}
    assert {c["startupLeftS"] for c in status["containers"]} == {60.0}
    in_process.register_all()
    for c in sup.model.containers:
        in_process.report(c.container_id, batch=1, lag=1000)
    # 2 partitions x 2 buckets, each task reporting its partition's 1,000: 2,000 in all.
    assert sup.status()["inputLag"] == 2000
    in_process.clock.advance(FAKE_TERMS.lease_s + 1)
    assert min(c["leaseLeftS"] for c in sup.status()["containers"]) == 0.0


# start-up bound


def test_the_start_up_bound_counts_from_launch_whatever_the_container_heartbeats(
    in_process: InProcess,
) -> None:
    sup = in_process.supervisor
    sup.launch_pending()
    first = sorted(in_process.launcher.running())
    for _ in range(59):
        in_process.step(1)  # heartbeats, never a registration
    assert in_process.live() == first
    in_process.step(2)
    assert not set(in_process.live()) & set(first)
    assert any(
        "did not register within 60 s of its launch" in d for d in events(in_process, "expire")
    )


# a move's deadline and cancel


def test_a_move_whose_warm_up_never_registers_is_rolled_back_at_its_deadline(
    in_process: InProcess,
) -> None:
    running(in_process, stateful=True, warm_up_deadline_s=120)
    sup = in_process.supervisor
    owners = in_process.live()
    sup.scale(1)
    (warm,) = warm_ups(in_process)
    assert sup.status()["change"]["description"] == "2 -> 1 containers: warming up"
    for _ in range(120):
        in_process.step(1)  # the warm-up heartbeats but is never ready
    assert warm_ups(in_process) == [warm]
    in_process.step(2)
    assert warm_ups(in_process) == []
    assert sup.change is None
    assert in_process.live() == owners  # the old owners keep their tasks, never stopped
    assert all(in_process.launcher.alive(in_process.launcher.handle_of(o), o) for o in owners)
    assert in_process.states()[warm] == "cancelled"
    (rolled,) = events(in_process, "deadline")
    assert "2 -> 1 containers rolled back: its warm-ups were not ready within 120 s" in rolled
    sup.scale(1)  # the job takes a change again


def test_an_operator_cancels_a_move_and_the_old_owners_keep_running(in_process: InProcess) -> None:
    running(in_process, stateful=True)
    sup = in_process.supervisor
    owners = in_process.live()
    sup.scale(3)
    sup.launch_pending()
    in_process.register_all()  # warm-ups ready
    assert sup.status()["change"]["cancellable"]
    summary = sup.cancel_change()
    assert "rolled back: cancelled by the operator" in summary
    assert in_process.live() == owners
    assert warm_ups(in_process) == []
    for warm in (p for p in in_process.launcher.processes.values() if p.container_id not in owners):
        assert warm.terminated
    with pytest.raises(ChangeRefusedError, match="no change is under way"):
        sup.cancel_change()


def test_a_move_past_its_point_of_no_return_cannot_be_cancelled(in_process: InProcess) -> None:
    running(in_process, stateful=True, catch_up_s=5)
    sup = in_process.supervisor
    sup.scale(1)
    until_handing_over(in_process)
    assert sup.change is not None
    assert sup.change.phase == "handing over"
    with pytest.raises(ChangeRefusedError, match="can no longer be rolled back"):
        sup.cancel_change()
    for _ in range(5):
        in_process.step(1)
        in_process.register_all()
        for c in sup.model.containers:
            in_process.report(c.container_id, batch=2)
    assert sup.change is None
    assert events(in_process, "change")[0].startswith("2 -> 1 containers: done in")


@pytest.mark.parametrize("stateful", [False, True], ids=["stateless", "stateful"])
def test_a_moves_old_owners_stop_once_their_warm_ups_have_caught_up(
    in_process: InProcess, stateful: bool
) -> None:
    # A stateless job's warm-ups follow no state: nothing to catch up with, so its old
    # owners stop at the next tick. A stateful job's wait for their warm-ups to say they
    # caught up, or for the catch-up bound.
    running(in_process, stateful=stateful, catch_up_s=30)
    sup = in_process.supervisor
    sup.change_factor(4)
    sup.launch_pending()
    in_process.register_all()  # warm-ups ready
    seconds = 0
    while sup.change is not None and sup.change.phase != "handing over" and seconds < 60:
        in_process.step(1)
        seconds += 1
    assert sup.change is not None
    assert sup.change.phase == "handing over"
    assert (seconds > 30) if stateful else (seconds < 5)


def test_another_change_is_refused_naming_the_one_in_flight(in_process: InProcess) -> None:
    running(in_process, stateful=True)
    in_process.supervisor.scale(3)
    with pytest.raises(ChangeRefusedError, match=r"2 -> 3 containers: warming up.*--cancel"):
        in_process.supervisor.change_factor(4)


# crash loops


def test_a_crash_loop_backs_off_and_fails_the_job_saying_why(in_process: InProcess) -> None:
    # Spark refuses the job's query at start, every time: each container registers, fails
    # before its first commit, and says why.
    sup = in_process.supervisor
    cause = "AnalysisException: Append output mode not supported for streaming aggregations"
    sup.launch_pending()
    in_process.register_all()
    tasks = sup.model.containers[0].tasks
    failures = 0
    while sup.job_state()["state"] == "running":
        owner = next(c.container_id for c in sup.model.containers if c.tasks == tasks)
        sup.report_failure(owner, cause)
        in_process.launcher.exit(owner)
        failures += 1
        while sup.job_state()["state"] == "running" and not any(
            c.tasks == tasks and c.container_id in in_process.launcher.running()
            for c in sup.model.containers
        ):
            in_process.step(0.5)
        in_process.register_all()
    assert failures == 5
    state = sup.job_state()
    assert state["state"] == "failed"
    assert state["why"] == f"5 containers in a row failed before their first commit: {cause}"
    assert in_process.launcher.running() == []  # every container stopped (SIGTERM)
    status = sup.status()
    assert status["jobState"]["state"] == "failed"
    assert any(c["cause"] == cause for c in status["containers"])
    assert any(cause in d for d in events(in_process, "fail"))
    with pytest.raises(ChangeRefusedError, match="the job is failed"):
        sup.scale(1)
    # Fixed, `job run` again resumes it.
    again = in_process.restart()
    assert again.job_state()["state"] == "running"
    again.launch_pending()
    assert len(in_process.launcher.running()) == 2


def test_successors_of_a_container_failing_at_start_wait_1_2_4_s(in_process: InProcess) -> None:
    sup = in_process.supervisor
    sup.launch_pending()
    in_process.register_all()
    victim = sup.model.containers[0].tasks
    waits = []
    for _ in range(3):
        owner = next(c.container_id for c in sup.model.containers if c.tasks == victim)
        sup.report_failure(owner, "Boom: at start")
        heir = next(c.container_id for c in sup.model.containers if c.tasks == victim)
        start = in_process.clock.now
        while heir not in in_process.launcher.running():
            in_process.step(0.25)
        waits.append(in_process.clock.now - start)
        in_process.register_all()
    assert waits == [1.0, 2.0, 4.0]


def test_a_commit_ends_a_crash_loop(in_process: InProcess) -> None:
    sup = in_process.supervisor
    sup.launch_pending()
    in_process.register_all()
    tasks = sup.model.containers[0].tasks
    for _ in range(4):
        owner = next(c.container_id for c in sup.model.containers if c.tasks == tasks)
        sup.report_failure(owner, "Boom")
        while not any(
            c.tasks == tasks and c.container_id in in_process.launcher.running()
            for c in sup.model.containers
        ):
            in_process.step(1)
        in_process.register_all()
    owner = next(c.container_id for c in sup.model.containers if c.tasks == tasks)
    in_process.report(owner, batch=1)  # it committed: the loop is over
    sup.report_failure(owner, "Boom")
    assert sup.job_state()["state"] == "running"
    heir = next(c.container_id for c in sup.model.containers if c.tasks == tasks)
    in_process.step(0.1)
    assert heir in in_process.launcher.running()  # no backoff after a commit


def test_a_warm_up_that_keeps_failing_rolls_its_move_back(in_process: InProcess) -> None:
    running(in_process, stateful=True)
    sup = in_process.supervisor
    owners = in_process.live()
    sup.scale(3)
    for _ in range(5):
        sup.launch_pending()
        ws = [w for w in warm_ups(in_process) if w in in_process.launcher.running()]
        if not ws:
            in_process.step(1)
            continue
        sup.report_failure(ws[0], "OSError: no space left on device")
        in_process.step(0.5)
        while warm_ups(in_process) and not any(
            w in in_process.launcher.running()
            for w in warm_ups(in_process)
            if in_process.states()[w] == "launching"
        ):
            in_process.step(1)
    for _ in range(70):
        if sup.change is None:
            break
        ws = [w for w in warm_ups(in_process) if w in in_process.launcher.running()]
        if ws:
            sup.report_failure(ws[0], "OSError: no space left on device")
        in_process.step(1)
    assert sup.change is None
    assert warm_ups(in_process) == []
    assert in_process.live() == owners
    assert sup.job_state()["state"] == "running"
    (rolled,) = events(in_process, "rollback")
    assert "5 warm-ups in a row failed before they were ready: OSError" in rolled


def test_a_registered_container_reporting_failure_gives_its_cause_in_the_event(
    in_process: InProcess,
) -> None:
    running(in_process)
    sup = in_process.supervisor
    victim = in_process.live()[0]
    reply = sup.report_failure(victim, "Py4JJavaError: the driver died")
    assert not reply.alive
    (expire,) = events(in_process, "expire")
    assert expire.startswith("it failed: Py4JJavaError: the driver died")
    assert sup.heartbeat(victim).alive is False
    assert sup.register(Registration(victim, 1)).alive is False


def test_a_container_that_committed_before_a_restart_is_past_its_start(
    in_process: InProcess,
) -> None:
    running(in_process)
    again = in_process.restart()
    victim = in_process.live()[0]
    before = set(in_process.launcher.running())
    again.report_failure(victim, "Boom: long after its start")
    (expire,) = events(in_process, "expire")
    assert "at start" not in expire
    (heir,) = set(in_process.live()) - before
    in_process.step(0.1)
    assert heir in in_process.launcher.running()  # launched at once: no backoff


# a growth during a change: never held hostage


def grown(harness: InProcess) -> str:
    """The inputs grew 2 -> 4 partitions (the new ones hold 5 and 7 records) while the old
    ones end at 1: what the partition monitor saw."""
    return harness.supervisor.observe_partitions(
        {"clicks": 4}, {"clicks": {0: 1, 1: 1, 2: 5, 3: 7}}
    )


def test_a_growth_during_a_move_that_can_be_undone_goes_first_then_the_move_is_asked_again(
    in_process: InProcess,
) -> None:
    running(in_process, stateful=True)
    sup = in_process.supervisor
    owners = in_process.live()
    sup.scale(3)
    assert sup.change is not None
    assert sup.change.phase == "warming up"
    assert grown(in_process) == "growth"
    # The move is rolled back at once and the growth drains the old partitions meanwhile.
    assert sup.change is not None
    assert sup.change.kind == "growth"
    assert warm_ups(in_process) == []
    assert in_process.live() == owners
    rolled = events(in_process, "partitions")
    assert any(
        "2 -> 3 containers rolled back: the inputs grew to {'clicks': 4}; the growth goes "
        "first, then the change is asked again" in e
        for e in rolled
    )
    # Seen again while it drains, the growth is the one under way, counted once.
    assert grown(in_process) == "growing"
    assert sup.counters["partition_growths"] == 1
    # The new partitions' records count as lag though no task reads them yet.
    status = sup.status()
    assert status["partitionMonitor"]["unread"] == {"clicks": {"2": 5, "3": 7}}
    assert status["inputLag"] == 12
    with pytest.raises(
        ChangeRefusedError, match=r"a change is under way \(partitions .*: draining\)"
    ):
        sup.scale(3)
    # A coordinator restarted now resumes the growth and still asks for the move after it.
    sup = in_process.restart(stateful=True)
    sup.launch_pending()
    in_process.register_all()
    # Drained: every container hands over to a successor reading the new partitions.
    for c in sup.model.containers:
        in_process.report(c.container_id, batch=1)
    for _ in range(10):
        in_process.step(1)
        in_process.register_all()
        if sup.model.partitions == {"clicks": 4} and sup.change and sup.change.kind == "scale":
            break
        for c in sup.model.containers:
            in_process.report(c.container_id, batch=1)
    assert sup.model.partitions == {"clicks": 4}
    assert sup.status()["partitionMonitor"]["unread"] == {}
    # Then the move is asked again, on the grown job.
    assert sup.change is not None
    assert (sup.change.kind, sup.change.target) == ("scale", {"containers": 3})
    assert any(
        "the change rolled back for the growth: " in e for e in events(in_process, "partitions")
    )


def test_a_growth_during_a_move_past_its_point_of_no_return_starts_once_the_move_ends(
    in_process: InProcess,
) -> None:
    running(in_process, stateful=True, catch_up_s=5)
    sup = in_process.supervisor
    sup.scale(1)
    until_handing_over(in_process)
    assert sup.change is not None
    assert sup.change.phase == "handing over"
    assert grown(in_process) == "waits"
    assert sup.change.kind == "scale"
    monitor = sup.status()["partitionMonitor"]
    assert monitor["growthWaiting"]["counts"] == {"clicks": 4}
    assert monitor["unread"] == {"clicks": {"2": 5, "3": 7}}
    assert any("seen during 2 -> 1 containers" in e for e in events(in_process, "partitions"))
    for _ in range(10):
        in_process.step(1)
        in_process.register_all()
        for c in sup.model.containers:
            in_process.report(c.container_id, batch=2)
        if sup.change is not None and sup.change.kind == "growth":
            break
    # The move ended and the growth began in the next tick: nothing came in between.
    assert events(in_process, "change")[0].startswith("2 -> 1 containers: done in")
    assert sup.change is not None
    assert sup.change.kind == "growth"
    assert sup.status()["partitionMonitor"]["growthWaiting"] is None
