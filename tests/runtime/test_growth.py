"""SEP-5 on a running job: the coordinator follows input partition growth, in key order.

The rules are pure functions (judged, drained, planned); the coordinator is
checked over real HTTP with stand-in container processes and a real
embedded log that grows.
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from standins import TASKS, TERMS, Clock, Coordinator, call, crash, wait_until

from spark_elastic import EmbeddedLog, LogInput
from spark_elastic.cli.job import _InputWatch
from spark_elastic.errors import ProtocolError
from spark_elastic.runtime.coordinator.supervisor import JobShape
from spark_elastic.runtime.growth import drained, grown_plan, judge_counts
from spark_elastic.runtime.protocol import JobModel


@pytest.mark.parametrize(
    ("seen", "verdict", "reason"),
    [
        ({"clicks": 4}, "same", ""),
        ({"clicks": 8}, "growth", ""),
        ({"clicks": 16}, "growth", ""),
        ({"clicks": 6}, "refused", "not a multiple of the planned 4"),
        ({"clicks": 2}, "refused", "shrink"),
        ({"clicks": 4, "views": 2}, "refused", "appeared"),
        ({}, "refused", "vanished"),
    ],
)
def test_counts_are_judged_against_the_planned_ones(
    seen: dict[str, int], verdict: str, reason: str
) -> None:
    check = judge_counts({"clicks": 4}, {"clicks": 4}, seen)
    assert check.verdict == verdict
    assert reason in check.reason
    assert bool(check.reason) == (verdict == "refused")


def test_after_growth_a_multiple_of_the_planned_count_is_growth_and_less_is_a_shrink() -> None:
    assert judge_counts({"clicks": 4}, {"clicks": 8}, {"clicks": 12}).verdict == "growth"
    assert judge_counts({"clicks": 4}, {"clicks": 8}, {"clicks": 4}).verdict == "refused"


def test_a_grown_plan_keeps_the_tasks_and_maps_partition_p_to_p_mod_the_planned_count() -> None:
    before = grown_plan("partition", 4, {"clicks": 2}, {"clicks": 2})
    after = grown_plan("partition", 4, {"clicks": 2}, {"clicks": 8})
    assert after.task_names() == before.task_names()
    for i, name in enumerate(after.task_names()):
        partitions = {ssp.partition for ssp in after.task(i).partitions}
        planned = {ssp.partition for ssp in before.task(i).partitions}
        assert partitions == {p for p in range(8) if p % 2 in planned}, name


def test_drained_means_every_task_reached_the_barrier_on_every_old_partition() -> None:
    barrier = {"clicks": {0: 10, 1: 5}}
    tasks = {"a": {"clicks": (0,)}, "b": {"clicks": (1,)}}
    assert not drained(barrier, {"a": {"clicks": {0: 10}}}, tasks)  # b never reported
    assert not drained(barrier, {"a": {"clicks": {0: 9}}, "b": {"clicks": {1: 5}}}, tasks)
    assert drained(barrier, {"a": {"clicks": {0: 10}}, "b": {"clicks": {1: 7}}}, tasks)


def test_a_job_model_keeps_its_planned_counts_and_refuses_counts_that_are_no_growth() -> None:
    model = JobModel(3, "clicks", 4, {"clicks": 8}, (), planned_partitions={"clicks": 4})
    assert JobModel.from_json(model.to_json()) == model
    assert JobModel.from_json(model.to_json()).planned == {"clicks": 4}
    bad = {**model.to_json(), "partitions": {"clicks": 6}}
    with pytest.raises(ProtocolError, match="not a growth of plannedPartitions"):
        JobModel.from_json(bad)
    # A model stored before growth existed has no planned counts: never grown.
    old = model.to_json()
    del old["plannedPartitions"]
    assert JobModel.from_json(old).planned == {"clicks": 8}


# The coordinator, over HTTP: stand-in containers, a real embedded log that grows.

CHECK_S = 0.3


@pytest.fixture
def log(tmp_path: Path) -> EmbeddedLog:
    log = EmbeddedLog(tmp_path / "log")
    log.create_topic("clicks", 3)
    with log.producer("clicks") as producer:
        for i in range(300):
            producer.send(f"user-{i % 40}".encode(), b"click")
    return log


@pytest.fixture
def watching(
    make_coordinator: Callable[..., Coordinator], tmp_path: Path, log: EmbeddedLog
) -> Coordinator:
    """A coordinator that looks at the log's partition counts every ``CHECK_S``."""
    watch = _InputWatch(LogInput(str(tmp_path / "log"), ("clicks",)))
    return make_coordinator(watch=watch, partition_check_s=CHECK_S)


def monitor(coordinator: Coordinator) -> dict[str, Any]:
    return coordinator.status()["partitionMonitor"]  # type: ignore[no-any-return]


def commit_up_to(coordinator: Coordinator, ends: dict[int, int]) -> None:
    """Each live container reports its tasks' partitions committed up to ``ends``."""
    for container in coordinator.status()["containers"]:
        if container["state"] != "running":
            continue
        tasks = [
            {"task": t, "offsets": {"clicks": {t.split("_")[0].split()[1]: 0}}, "lag": 0}
            for t in container["tasks"]
        ]
        for task in tasks:
            (partition,) = task["offsets"]["clicks"]
            task["offsets"]["clicks"][partition] = ends[int(partition)]
        body = {
            "containerId": container["containerId"],
            "generation": container["generation"],
            "batchId": 1,
            "recordsRead": 0,
            "recordsProcessed": 0,
            "tasks": tasks,
        }
        assert call(f"{coordinator.url}/containers/progress", body)[0] == 200


def test_growth_waits_for_the_old_partitions_to_drain_then_hands_every_container_over(
    watching: Coordinator, log: EmbeddedLog
) -> None:
    running = wait_until(
        "two registered containers",
        lambda: len(watching.running()) == 2 and watching.running(),
    )
    before = call(f"{watching.url}/jobModel")[1]
    ends = log.end_offsets("clicks")
    log.grow("clicks", 6)
    growth = wait_until("the growth seen", lambda: monitor(watching)["growth"])
    assert growth["counts"] == {"clicks": 6}
    assert growth["barrier"] == {"clicks": {str(p): o for p, o in ends.items()}}
    # Short of the barrier, nobody reads a new partition: the model stays as it was.
    commit_up_to(watching, {p: o - 1 for p, o in ends.items()})
    wait_until("another check", lambda: monitor(watching)["seen"] == {"clicks": 6})
    assert call(f"{watching.url}/jobModel")[1]["partitions"] == {"clicks": 3}
    assert monitor(watching)["growth"] is not None

    commit_up_to(watching, ends)
    model = wait_until(
        "the grown job model",
        lambda: (m := call(f"{watching.url}/jobModel")[1])["partitions"] == {"clicks": 6} and m,
    )
    assert model["partitions"] == {"clicks": 6}
    assert model["plannedPartitions"] == {"clicks": 3}
    old = {c["containerId"]: c for c in before["containers"]}
    assert not set(old) & {c["containerId"] for c in model["containers"]}
    # Same virtual tasks, each successor forked from its predecessor's checkpoint.
    pairs = {tuple(c["tasks"]): c["sources"] for c in model["containers"]}
    assert pairs == {tuple(c["tasks"]): [c["checkpoint"]] for c in old.values()}
    assert monitor(watching)["growth"] is None
    wait_until(
        "the successors running and the predecessors gone",
        lambda: set(watching.running()) == {c["containerId"] for c in model["containers"]},
    )
    states = {c["containerId"]: c["state"] for c in watching.status()["containers"]}
    assert {states[c] for c in running} == {"retired"}
    kinds = [e["kind"] for e in watching.status()["events"]]
    assert kinds.count("handover") == 2


def test_a_count_that_is_no_multiple_is_reported_and_the_job_keeps_its_model(
    watching: Coordinator, log: EmbeddedLog
) -> None:
    wait_until("two registered containers", lambda: len(watching.running()) == 2)
    log.grow("clicks", 4)
    reason = wait_until("the change refused", lambda: monitor(watching)["refused"])
    assert "4 partitions is not a multiple of the planned 3" in reason
    metrics = call_text(f"{watching.url}/metrics")
    assert "spark_elastic_partition_change_refused 1.0" in metrics
    # The job keeps its model (a failover under load may renew it, never regrow it).
    assert call(f"{watching.url}/jobModel")[1]["partitions"] == {"clicks": 3}
    events = watching.status()["events"]
    assert "not followed" in str(events)
    assert "handover" not in [e["kind"] for e in events]


def call_text(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


def watched(
    tmp_path: Path, port: int = 0, env: dict[str, str] | None = None, **supervisor: Any
) -> Coordinator:
    """A coordinator as ``job run`` starts one: its shape from the log's counts now."""
    job_input = LogInput(str(tmp_path / "log"), ("clicks",))
    counts = job_input.partition_counts()
    job_shape = JobShape("clicks", "jobs.py:job", 4, counts, TASKS, str(tmp_path / "cp"))
    return Coordinator(
        tmp_path,
        port=port,
        job_shape=job_shape,
        env=env,
        watch=_InputWatch(job_input),
        **{"partition_check_s": CHECK_S, **supervisor},
    )


def test_a_coordinator_restarted_mid_drain_resumes_the_growth(
    tmp_path: Path, log: EmbeddedLog
) -> None:
    first = watched(tmp_path)
    try:
        with first.server.running_in_thread():
            wait_until("two containers", lambda: len(first.running()) == 2)
            ends = log.end_offsets("clicks")
            log.grow("clicks", 6)
            barrier = wait_until("the growth seen", lambda: monitor(first)["growth"])["barrier"]
            crash(first)
        second = watched(tmp_path, port=int(first.url.rsplit(":", 1)[1]))
        with second.server.running_in_thread():
            # The growth and its barrier survived; nothing moved before the old partitions drain.
            assert monitor(second)["growth"]["barrier"] == barrier
            assert call(f"{second.url}/jobModel")[1]["partitions"] == {"clicks": 3}
            wait_until("both containers back", lambda: len(second.running()) == 2)
            commit_up_to(second, ends)
            wait_until(
                "the handover",
                lambda: call(f"{second.url}/jobModel")[1]["partitions"] == {"clicks": 6},
            )
            model = call(f"{second.url}/jobModel")[1]
            assert len(model["containers"]) == 2
            assert len({t for c in model["containers"] for t in c["tasks"]}) == 12
    finally:
        first.kill_all()


def test_a_successor_never_starts_while_its_predecessor_may_still_write(
    tmp_path: Path, log: EmbeddedLog
) -> None:
    # Predecessors that ignore SIGTERM and alive:false: only their leases running out may
    # let a successor start (a real container stops its writes when its lease ends). The
    # coordinators' clock moves only when the spec says, so no lease runs out on its own.
    clock = Clock()
    stubborn = {"STANDIN_STUBBORN": "1"}
    first = watched(tmp_path, env=stubborn, clock=clock, partition_check_s=0.0)
    second: Coordinator | None = None
    try:
        with first.server.running_in_thread():
            running = wait_until(
                "two containers", lambda: len(first.running()) == 2 and first.running()
            )
            log.grow("clicks", 6)
            wait_until("the growth seen", lambda: monitor(first)["growth"])
            commit_up_to(first, log.end_offsets("clicks"))
            model = wait_until(
                "the handover",
                lambda: (
                    (m := call(f"{first.url}/jobModel")[1])["partitions"] == {"clicks": 6} and m
                ),
            )
            heirs = {c["containerId"] for c in model["containers"]}

            def launched(coordinator: Coordinator) -> set[str]:
                events = coordinator.status()["events"]
                return {e["container"] for e in events if e["kind"] == "launch"} & heirs

            time.sleep(1.0)  # ticks at 0.2 s: five of them see the same clock
            assert launched(first) == set()
            crash(first)
        # The coordinator restarts right after the handover committed.
        second = watched(tmp_path, int(first.url.rsplit(":", 1)[1]), stubborn, clock=clock)
        with second.server.running_in_thread():
            # The predecessors have one lease (from the restart) to finish their batch in
            # flight: their heartbeats renew it meanwhile, and are refused after it.
            def counters() -> dict[str, int]:
                return second.status()["counters"]  # type: ignore[no-any-return]

            wait_until("renewals", lambda: counters().get("heartbeats_alive", 0) >= 4)
            assert "heartbeats_invalid" not in counters()
            clock.now += TERMS.lease_s + 0.01
            wait_until("refusals", lambda: counters().get("heartbeats_invalid"))
            # Their last renewal was at the restart's time: the lease and the margin from it.
            clock.now += TERMS.margin_s - 0.11
            time.sleep(1.0)  # ticks at 0.2 s: five of them see the same clock
            assert launched(second) == set()
            assert all(first.launcher.alive(pid, c) for c, pid in running.items())
            # Past the margin they are killed; a SIGKILL takes effect when the kernel gets to
            # it, so the heirs wait until the predecessors are seen gone. Here the kills are
            # held back until the spec lets them through.
            held: list[tuple[int, str]] = []
            second.launcher.kill = lambda pid, c, sig: held.append((pid, c))  # type: ignore[method-assign]
            clock.now += 0.2
            wait_until("the kills", lambda: {c for _, c in held} >= set(running))
            time.sleep(1.0)  # ticks at 0.2 s: five of them see the predecessors running
            assert launched(second) == set()
            for pid, c in held:
                first.launcher.kill(pid, c, signal.SIGKILL)
            wait_until("both heirs launched", lambda: launched(second) == heirs)
            assert not any(first.launcher.alive(pid, c) for c, pid in running.items())
    finally:
        first.kill_all()
        if second is not None:
            # The heirs are the second coordinator's; they ignore SIGTERM, as their
            # predecessors do. Its launcher kills again for real.
            vars(second.launcher).pop("kill", None)
            second.kill_all()


class BrokenWatch:
    """Inputs that cannot be read: every look fails as an unexpected error would."""

    def __init__(self) -> None:
        self.looks = 0

    def partition_counts(self) -> dict[str, int]:
        self.looks += 1
        raise RuntimeError(f"broker gone ({self.looks})")

    def end_offsets(self, topic: str) -> dict[int, int]:
        raise RuntimeError("broker gone")


def test_a_monitor_that_cannot_read_its_inputs_reports_it_and_the_coordinator_goes_on(
    tmp_path: Path,
) -> None:
    watch = BrokenWatch()
    c = Coordinator(tmp_path, watch=watch, partition_check_s=CHECK_S)
    try:
        with c.server.running_in_thread():
            wait_until("two containers", lambda: len(c.running()) == 2)
            wait_until("several failed looks", lambda: watch.looks >= 3)
            details = [e["detail"] for e in c.status()["events"] if e["kind"] == "partitions"]
            assert any("check failed: RuntimeError: broker gone" in d for d in details)
            status, reply = call(f"{c.url}/containerHeartbeat?executionContainerId=clicks-c1")
            assert (status, reply["alive"]) == (200, True)
    finally:
        c.kill_all()


class DownWatch:
    """Inputs whose broker is down until a spec brings it back; counts its looks."""

    def __init__(self) -> None:
        self.down = True
        self.looks = 0

    def partition_counts(self) -> dict[str, int]:
        self.looks += 1
        if self.down:
            raise RuntimeError("no broker at 127.0.0.1:9")
        return {"clicks": 3}  # the stand-ins' job's

    def end_offsets(self, topic: str) -> dict[int, int]:
        return {0: 0, 1: 0, 2: 0}


def test_an_input_down_for_many_checks_is_one_event_and_its_return_another(
    tmp_path: Path,
) -> None:
    watch = DownWatch()
    c = Coordinator(tmp_path, watch=watch, partition_check_s=CHECK_S)

    def partition_events() -> list[str]:
        return [e["detail"] for e in c.status()["events"] if e["kind"] == "partitions"]

    try:
        with c.server.running_in_thread():
            wait_until("several failed looks", lambda: watch.looks >= 4)
            assert partition_events() == ["check failed: RuntimeError: no broker at 127.0.0.1:9"]
            # The status says what fails since when (the page, `job status`, /metrics).
            health = c.status()["input"]
            assert health["state"] == "failing"
            assert health["failing"] == {
                "partitions": "check failed: RuntimeError: no broker at 127.0.0.1:9"
            }
            assert health["failingSince"] <= time.time()
            assert health["failingForS"] >= 0
            watch.down = False
            wait_until("the input's return said", lambda: len(partition_events()) == 2)
            assert re.fullmatch(  # newest first
                r"the input answers again \(\d+ s after its first failure\)", partition_events()[0]
            )
            health = c.status()["input"]
            assert (health["state"], health["failing"], health["failingSince"]) == (
                "answering",
                {},
                None,
            )
            looks = watch.looks
            wait_until("more good looks", lambda: watch.looks >= looks + 2)
            assert len(partition_events()) == 2
    finally:
        c.kill_all()
