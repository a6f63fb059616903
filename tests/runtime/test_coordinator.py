"""The coordinator over real HTTP on loopback, with stand-in container processes (no Spark).

Leases are short here (2 s, margin 1 s: ``standins.TERMS``) so expiries happen within seconds.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from standins import (
    TASKS,
    TERMS,
    Clock,
    Coordinator,
    call,
    crash,
    report_commit,
    shape,
    wait_until,
)

from spark_elastic.errors import ArgumentError
from spark_elastic.runtime.coordinator.launchers import LocalLauncher
from spark_elastic.runtime.coordinator.placement import initial_assignment
from spark_elastic.runtime.coordinator.server import MAX_BODY, CoordinatorServer, _TokenBucket, bind
from spark_elastic.runtime.coordinator.stores import SQLiteStore
from spark_elastic.runtime.coordinator.supervisor import JobShape, Supervisor


def test_a_launched_container_counts_as_alive_from_its_launch(tmp_path: Path) -> None:
    # Between fork and exec, /proc shows the launcher's own environment: judged by it, a
    # container just launched looked as if it had exited (4 of 30 launches here), and the
    # coordinator failed it over before it could register.
    launcher = LocalLauncher(tmp_path, [sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for i in range(30):
            pid = launcher.launch(f"c{i}", {"EXECUTION_ENV_CONTAINER_ID": f"c{i}"})
            assert launcher.alive(pid, f"c{i}")
    finally:
        for pid, container_id in list(launcher.launched.items()):
            launcher.kill(pid, container_id, signal.SIGKILL)
    wait_until(
        "every one gone",
        lambda: not any(launcher.alive(p, c) for p, c in launcher.launched.items()),
    )


def test_initial_assignment_keeps_each_partitions_tasks_together() -> None:
    chunks = initial_assignment(TASKS, 3)
    assert [len(c) for c in chunks] == [4, 4, 4]
    assert [{t.split("_")[0] for t in chunk} for chunk in chunks] == [
        {"Partition 0"},
        {"Partition 1"},
        {"Partition 2"},
    ]
    assert [len(c) for c in initial_assignment(TASKS, 5)] == [3, 3, 2, 2, 2]
    with pytest.raises(ArgumentError, match="at most the job's 12 virtual tasks"):
        initial_assignment(TASKS, 13)


def test_initial_shares_follow_capacities_and_stay_contiguous() -> None:
    chunks = initial_assignment(TASKS, 3, capacities=(2, 1, 1))
    assert [len(c) for c in chunks] == [6, 3, 3]
    # TASKS is in (partition, bucket) order: the shares are its consecutive runs.
    assert [t for chunk in chunks for t in sorted(chunk, key=TASKS.index)] == list(TASKS)
    with pytest.raises(ArgumentError, match="one capacity per container"):
        initial_assignment(TASKS, 3, capacities=(1, 1))


def test_the_job_model_is_served_and_containers_register(coordinator: Coordinator) -> None:
    status, model = call(f"{coordinator.url}/jobModel")
    assert status == 200
    assert model["version"] == 1
    assert [len(c["tasks"]) for c in model["containers"]] == [6, 6]
    running = wait_until("two registered containers", lambda: len(coordinator.running()) == 2)
    assert running


def test_heartbeats_answer_alive_for_issued_ids_and_false_for_others(
    coordinator: Coordinator,
) -> None:
    status, reply = call(f"{coordinator.url}/containerHeartbeat?executionContainerId=clicks-c1")
    assert (status, reply["alive"], reply["leaseMs"]) == (200, True, 2000)
    status, reply = call(f"{coordinator.url}/containerHeartbeat?executionContainerId=never-issued")
    assert (status, reply) == (200, {"alive": False, "leaseMs": 0, "jobModelVersion": 1})
    _, metrics = 0, urllib.request.urlopen(f"{coordinator.url}/metrics").read().decode()
    assert "spark_elastic_expired_heartbeats_total 1.0" in metrics


@pytest.mark.parametrize(
    "query",
    [
        "",
        "?executionContainerId=",
        "?executionContainerId=a%20b",
        "?executionContainerId=a&executionContainerId=b",
    ],
)
def test_a_missing_or_malformed_container_id_is_400(coordinator: Coordinator, query: str) -> None:
    status, reply = call(f"{coordinator.url}/containerHeartbeat{query}")
    assert status == 400
    assert "executionContainerId" in reply["error"]


@pytest.mark.parametrize("flag", ["caughtUp", "stopped"])
def test_a_heartbeat_flag_other_than_true_is_400_naming_it(
    coordinator: Coordinator, flag: str
) -> None:
    status, reply = call(
        f"{coordinator.url}/containerHeartbeat?executionContainerId=clicks-c1&{flag}=yes"
    )
    assert (status, reply["error"]) == (400, f"{flag}: expected true or nothing, found ['yes']")


def test_malformed_and_oversized_bodies_are_refused_in_one_line(coordinator: Coordinator) -> None:
    status, reply = call(f"{coordinator.url}/containers/register", raw=b"{not json")
    assert (status, reply["error"]) == (400, "/containers/register: the body is not JSON")
    status, reply = call(f"{coordinator.url}/containers/register", {"containerId": "c1"})
    assert status == 400
    assert "missing field 'pid'" in reply["error"]
    status, reply = call(f"{coordinator.url}/containers/register", raw=b"x" * (MAX_BODY + 1))
    assert status == 413


def test_a_killed_container_is_replaced_only_after_its_lease_and_margin(
    coordinator: Coordinator,
) -> None:
    running = wait_until(
        "two registered containers",
        lambda: len(coordinator.running()) == 2 and coordinator.running(),
    )
    victim = "clicks-c1"
    os.killpg(running[victim], signal.SIGKILL)
    killed_at = time.monotonic()
    model = wait_until(
        "a replacement",
        lambda: (m := call(f"{coordinator.url}/jobModel")[1])["version"] == 2 and m,
    )
    # Never before the lease and the margin have run out since the last renewal.
    assert time.monotonic() - killed_at >= TERMS.lease_s + TERMS.margin_s - 0.25
    replacement = next(c for c in model["containers"] if c["containerId"] not in running)
    assert replacement["containerId"] == "clicks-c3"
    assert replacement["generation"] == 3
    assert replacement["checkpoint"].endswith("generations/000003-clicks-c3")
    old_tasks = {c["containerId"]: c["tasks"] for c in coordinator.status()["containers"]}[victim]
    assert replacement["tasks"] == old_tasks
    kinds = [(e["kind"], e["container"]) for e in coordinator.status()["events"]]
    assert ("expire", victim) in kinds
    assert ("failover", "clicks-c3") in kinds
    wait_until("the replacement registers", lambda: "clicks-c3" in coordinator.running())


def report_progress(url: str, container: dict[str, Any], lag: int) -> None:
    report_commit(url, container, lag=lag, records=10, partition="0")


def lags(coordinator: Coordinator) -> dict[str, int]:
    return {t["task"]: t["lag"] for t in coordinator.status()["tasks"]}


def test_lag_is_the_owners_and_unknown_until_a_new_owner_reports(
    coordinator: Coordinator,
) -> None:
    running = wait_until(
        "two registered containers",
        lambda: len(coordinator.running()) == 2 and coordinator.running(),
    )
    containers = {c["containerId"]: c for c in coordinator.status()["containers"]}
    victim = containers["clicks-c1"]
    assert set(lags(coordinator).values()) == {-1}  # nothing reported yet
    report_progress(coordinator.url, victim, lag=7)
    assert {lags(coordinator)[t] for t in victim["tasks"]} == {7}
    metric = f'spark_elastic_task_lag_records{{task="{victim["tasks"][0]}"}} 7.0'
    assert metric in urllib.request.urlopen(f"{coordinator.url}/metrics").read().decode()

    os.killpg(running["clicks-c1"], signal.SIGKILL)
    wait_until("a replacement", lambda: "clicks-c3" in coordinator.running())
    # The old owner's lag stopped being true when it died: no figure, not a stale 7.
    assert {lags(coordinator)[t] for t in victim["tasks"]} == {-1}
    assert metric not in urllib.request.urlopen(f"{coordinator.url}/metrics").read().decode()
    successor = {c["containerId"]: c for c in coordinator.status()["containers"]}["clicks-c3"]
    report_progress(coordinator.url, successor, lag=3)
    assert {lags(coordinator)[t] for t in victim["tasks"]} == {3}


def test_a_paused_container_is_told_it_is_dead_when_it_wakes(coordinator: Coordinator) -> None:
    running = wait_until(
        "two registered containers",
        lambda: len(coordinator.running()) == 2 and coordinator.running(),
    )
    # Any running one (on a loaded machine one may already have been replaced).
    victim, pid = sorted(running.items())[-1]
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_until(
            "the paused container's replacement",
            lambda: (
                victim
                not in {
                    c["containerId"] for c in call(f"{coordinator.url}/jobModel")[1]["containers"]
                }
            ),
        )
    finally:
        os.kill(pid, signal.SIGCONT)
    # The stand-in exits 1 on its first `alive: false`; the coordinator had SIGKILLed it anyway.
    wait_until("the zombie to be gone", lambda: not coordinator.launcher.alive(pid, victim))


def test_a_restarted_coordinator_keeps_its_model_and_its_containers(tmp_path: Path) -> None:
    first = Coordinator(tmp_path)
    try:
        with first.server.running_in_thread():
            running = wait_until(
                "two containers", lambda: len(first.running()) == 2 and first.running()
            )
            model = call(f"{first.url}/jobModel")[1]
            # Stop the server without stopping its containers, as a crash would.
            first.server.leave_containers_running()
        # Back on the same address, which the containers keep heartbeating to.
        second = Coordinator(tmp_path, port=int(first.url.rsplit(":", 1)[1]))
        with second.server.running_in_thread():
            assert call(f"{second.url}/jobModel")[1] == model
            assert second.supervisor.store.model_versions() == [1]
            # The same processes renew with the new coordinator for longer than a lease and its
            # margin (2 containers x 10 heartbeats at 200 ms); nothing was relaunched or moved.
            wait_until(
                "heartbeats from both containers",
                lambda: second.status()["counters"].get("heartbeats_alive", 0) >= 20,
            )
            assert second.running() == running
            assert all(second.launcher.alive(p, c) for c, p in running.items())
            assert call(f"{second.url}/jobModel")[1]["version"] == 1
            events = [e["kind"] for e in second.status()["events"]]
            assert events.count("launch") == 2
    finally:
        first.kill_all()


def test_a_restarted_coordinator_slow_to_listen_counts_leases_from_when_it_listens(
    tmp_path: Path,
) -> None:
    clock = Clock()
    first = Coordinator(tmp_path, clock=clock)
    try:
        with first.server.running_in_thread():
            running = wait_until(
                "two containers", lambda: len(first.running()) == 2 and first.running()
            )
            crash(first)
        # It read its store, then took longer than a lease and its margin to listen (a slow
        # job import, a loaded machine): the containers could not reach it meanwhile.
        second = Coordinator(tmp_path, port=int(first.url.rsplit(":", 1)[1]), clock=clock)
        clock.now += TERMS.lease_s + TERMS.margin_s + 1
        with second.server.running_in_thread():
            wait_until(
                "heartbeats from both containers",
                lambda: second.status()["counters"].get("heartbeats_alive", 0) >= 10,
            )
            assert second.running() == running
            assert "failover" not in [e["kind"] for e in second.status()["events"]]
    finally:
        first.kill_all()


def test_a_store_of_another_job_shape_is_refused(tmp_path: Path) -> None:
    Supervisor(
        shape(tmp_path), SQLiteStore(tmp_path / "db"), LocalLauncher(tmp_path), "http://x", 2, TERMS
    ).store.close()
    cp = str(tmp_path / "cp")
    for other in (
        JobShape("clicks", "jobs.py:job", 4, {"clicks": 4}, TASKS, cp),  # 3 -> 4: remaps keys
        JobShape("clicks", "jobs.py:job", 4, {"clicks": 2}, TASKS, cp),  # a shrink
        JobShape("clicks", "jobs.py:job", 8, {"clicks": 3}, TASKS, cp),  # another factor
        JobShape("views", "jobs.py:job", 4, {"clicks": 3}, TASKS, cp),  # another job
    ):
        with pytest.raises(ArgumentError, match="must not remap keys"):
            Supervisor(
                other, SQLiteStore(tmp_path / "db"), LocalLauncher(tmp_path), "http://x", 2, TERMS
            )
    # Inputs that grew while the coordinator was down are the same job (SEP-5): its
    # monitor takes the growth up, with the tasks it planned.
    grown = JobShape("clicks", "jobs.py:job", 4, {"clicks": 6}, TASKS, cp)
    again = Supervisor(
        grown, SQLiteStore(tmp_path / "db"), LocalLauncher(tmp_path), "http://x", 2, TERMS
    )
    assert again.model.partitions == {"clicks": 3}
    assert again.model.version == 1
    again.store.close()


def test_a_port_in_use_is_one_line(tmp_path: Path) -> None:
    taken = bind("127.0.0.1", 0)
    try:
        port = taken.getsockname()[1]
        with pytest.raises(ArgumentError, match=f"127.0.0.1:{port} \\(the port is in use\\)"):
            bind("127.0.0.1", port)
    finally:
        taken.close()


def test_binding_off_loopback_needs_a_token(tmp_path: Path) -> None:
    sock = bind("0.0.0.0", 0)
    try:
        with pytest.raises(ArgumentError, match="--token"):
            CoordinatorServer(lambda url: None, sock)  # type: ignore[arg-type,return-value]
    finally:
        sock.close()


def test_with_a_token_every_request_needs_it(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "db")
    launcher = LocalLauncher(tmp_path, [sys.executable, "-c", "import time; time.sleep(60)"])
    server = CoordinatorServer(
        lambda url: Supervisor(shape(tmp_path), store, launcher, url, 1, TERMS),
        bind("127.0.0.1", 0),
        token="s3cret",
    )
    try:
        with server.running_in_thread():
            status, reply = call(f"{server.url}/jobModel")
            assert (status, reply["error"]) == (401, "missing or wrong bearer token")
            request = urllib.request.Request(f"{server.url}/jobModel")
            request.add_header("Authorization", "Bearer s3cret")
            with urllib.request.urlopen(request, timeout=5) as response:
                assert json.loads(response.read())["version"] == 1
    finally:
        for pid, container_id in launcher.launched.items():
            launcher.kill(pid, container_id, signal.SIGKILL)


def test_the_status_page_shows_containers_tasks_and_events(coordinator: Coordinator) -> None:
    wait_until("two containers", lambda: len(coordinator.running()) == 2)
    page = urllib.request.urlopen(f"{coordinator.url}/").read().decode()
    for expected in (
        "clicks-c1",
        "clicks-c2",
        "Partition 2_3_4",
        "launch",
        "register",
        "read amplification",
    ):
        assert expected in page


def test_the_coordinator_loads_no_spark(tmp_path: Path) -> None:
    probe = (
        "import sys; import spark_elastic.runtime.coordinator.server, "
        "spark_elastic.runtime.coordinator.supervisor, spark_elastic.cli.job; "
        "print(sorted(m for m in ('pyspark', 'pandas', 'pyarrow') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def test_a_container_id_the_coordinator_never_issued_exits_1_in_one_line(
    coordinator: Coordinator,
) -> None:
    job = Path(__file__).resolve().parents[2] / "examples" / "jobs" / "click_counts.py"
    env = {
        **os.environ,
        "EXECUTION_ENV_CONTAINER_ID": "ghost-7",
        "SPARK_ELASTIC_COORDINATOR_URL": coordinator.url,
        "SPARK_ELASTIC_JOB": f"{job}:job",
    }
    result = subprocess.run(
        [sys.executable, "-m", "spark_elastic", "container", "run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert re.fullmatch(
        r"spark-elastic container \d\d:\d\d:\d\d\.\d{3}: "
        r"the coordinator did not issue container id 'ghost-7'",
        result.stderr.strip(),
    ), result.stderr
    assert coordinator.status()["counters"]["heartbeats_invalid"] == 1


def test_slow_clients_do_not_stall_heartbeats(coordinator: Coordinator) -> None:
    host, port = coordinator.url.removeprefix("http://").split(":")
    # Clients that send half a request and then nothing, holding their connections open.
    stalled = [socket.create_connection((host, int(port)), timeout=5) for _ in range(50)]
    try:
        for sock in stalled:
            sock.sendall(b"GET /jobModel HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        for _ in range(20):
            status, reply = call(
                f"{coordinator.url}/containerHeartbeat?executionContainerId=clicks-c1"
            )
            assert (status, reply["alive"]) == (200, True)
    finally:
        for sock in stalled:
            sock.close()


def test_a_client_polling_the_status_in_a_loop_is_refused_not_served_before_heartbeats(
    coordinator: Coordinator,
) -> None:
    wait_until("a registered container", lambda: "clicks-c1" in coordinator.running())
    answers: list[tuple[int, Any]] = []
    # 300 calls would need 5 s to stay within 50 a second; on loopback they take far less.
    while len(answers) < 300 and (not answers or answers[-1][0] != 429):
        answers.append(call(f"{coordinator.url}/status.json"))
    assert {status for status, _ in answers} == {200, 429}
    # The refused answer itself says why (a later call may find the budget refilled: 20 ms).
    refused = answers[-1]
    assert refused[0] == 429
    assert "status views over 50 a second" in refused[1]["error"]
    status, reply = call(f"{coordinator.url}/containerHeartbeat?executionContainerId=clicks-c1")
    assert (status, reply["alive"]) == (200, True)


def test_the_view_budget_refills_at_its_rate_up_to_its_burst() -> None:
    now = [0.0]
    bucket = _TokenBucket(rate=50, burst=50, clock=lambda: now[0])
    assert sum(bucket.take() for _ in range(80)) == 50
    now[0] += 0.1  # five more
    assert sum(bucket.take() for _ in range(80)) == 5
    now[0] += 100  # never more than the burst
    assert sum(bucket.take() for _ in range(80)) == 50
