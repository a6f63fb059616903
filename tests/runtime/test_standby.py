"""Specification: a hot standby takes a job over when its leading coordinator dies.

Two coordinators, each a process of its own (``standin_coordinator.py``)
on one real PostgreSQL store, with stand-in containers (real processes that
heartbeat through the container's own client). The second stands by: it
answers 409 naming the leader, and the leader's status lists it. The leader
is SIGKILLed: once its store lease has run out the standby claims the
store, and the same containers, which were given both addresses, heartbeat
to it; it fails none of them over.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_runner import run_cli
from kafka_jvm import free_port
from standins import HERE, call, wait_until


def ids(url: str) -> list[str]:
    """The running containers the coordinator at ``url`` shows."""
    status = call(f"{url}/status.json")[1]
    return sorted(c["containerId"] for c in status["containers"] if c["state"] == "running")


def line_from(process: subprocess.Popen[str], timeout: float = 60.0) -> str:
    """The next line the process prints, within ``timeout``."""
    assert process.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(timeout):
            raise AssertionError(f"no line from pid {process.pid} within {timeout:.0f} s")
    return process.stdout.readline().strip()


@pytest.fixture
def coordinators(pg_url: str, tmp_path: Path) -> Iterator[Any]:
    """``start(port, peer_port)``: a stand-in coordinator process; at the end each is
    stopped, and every container any of them launched is killed."""
    started: list[subprocess.Popen[str]] = []
    containers: set[int] = set()

    def start(port: int, peer: int) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [
                sys.executable,
                str(HERE / "standin_coordinator.py"),
                *(pg_url, str(tmp_path), str(port), f"http://127.0.0.1:{peer}"),
            ],
            stdout=subprocess.PIPE,
            stderr=(tmp_path / f"coordinator-{port}.log").open("w"),
            text=True,
            start_new_session=True,
        )
        started.append(process)
        return process

    def seen(url: str) -> None:
        with contextlib.suppress(OSError):
            status = call(f"{url}/status.json")[1]
            containers.update(c["pid"] for c in status.get("containers", []) if c["pid"])

    start.seen = seen  # type: ignore[attr-defined]
    try:
        yield start
    finally:
        for process in started:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        for pid in containers:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


def test_a_standby_leads_the_same_containers_once_its_leader_is_killed(coordinators: Any) -> None:
    port_a, port_b = free_port(), free_port()
    a_url, b_url = f"http://127.0.0.1:{port_a}", f"http://127.0.0.1:{port_b}"
    a = coordinators(port_a, port_b)
    assert line_from(a) == f"status: {a_url}/"
    running = wait_until(
        "two containers under the leader", lambda: len(ids(a_url)) == 2 and ids(a_url)
    )
    coordinators.seen(a_url)

    # A second coordinator of the job stands by: it names the leader, which lists it.
    b = coordinators(port_b, port_a)
    assert line_from(b) == f"standby: {b_url}/ (led by {a_url})"
    code, answer = call(f"{b_url}/jobModel")
    assert (code, answer["leader"], answer["standby"]) == (409, a_url, b_url)
    leader = wait_until(
        "the standby listed by the leader",
        lambda: (c := call(f"{a_url}/status.json")[1]["coordinator"])["standbys"] and c,
    )
    assert (leader["url"], leader["epoch"], leader["standbys"][0]["url"]) == (a_url, 1, b_url)
    # Where the operator looks: `job status` of the leader names the standby; of the
    # standby, in one line, the leader.
    shown = run_cli("job", "status", a_url)
    assert shown.returncode == 0, shown.stderr
    assert f"Coordinator {a_url} leads since" in shown.stdout
    assert f"standing by: {b_url} (host " in shown.stdout
    asked = run_cli("job", "status", b_url)
    assert asked.returncode == 2
    assert f"this coordinator ({b_url}) stands by; the job is led by {a_url}" in asked.stderr
    assert len(asked.stderr.strip().splitlines()) == 1

    # The leader dies with its host's process table; its containers live on elsewhere.
    a.send_signal(signal.SIGKILL)
    a.wait()
    assert line_from(b, timeout=60) == f"status: {b_url}/"
    status = call(f"{b_url}/status.json")[1]
    assert (status["coordinator"]["url"], status["coordinator"]["epoch"]) == (b_url, 2)
    assert status["coordinator"]["waitsS"] > 0  # it waits out the old leader's leases first

    # The containers find the new leader themselves and renew with it, past its wait: none
    # is failed over, nothing is launched again.
    def followed() -> dict[str, Any] | None:
        now = call(f"{b_url}/status.json")[1]
        rows = [c for c in now["containers"] if c["state"] == "running"]
        if now["coordinator"]["waitsS"] or len(rows) != 2:
            return None
        return now if all(c["heartbeatAgeS"] < 1.0 for c in rows) else None

    after = wait_until("the containers heartbeating to the new leader", followed, timeout=60)
    coordinators.seen(b_url)
    assert ids(b_url) == running
    assert [e["kind"] for e in after["events"]].count("launch") == 2
    assert after["counters"].get("failovers", 0) == 0


def test_a_standby_leaves_a_job_its_leader_stopped_stopped(coordinators: Any) -> None:
    port_a, port_b = free_port(), free_port()
    a_url, b_url = f"http://127.0.0.1:{port_a}", f"http://127.0.0.1:{port_b}"
    a = coordinators(port_a, port_b)
    assert line_from(a) == f"status: {a_url}/"
    wait_until("two containers under the leader", lambda: len(ids(a_url)) == 2)
    coordinators.seen(a_url)
    b = coordinators(port_b, port_a)
    assert line_from(b).startswith(f"standby: {b_url}/")

    # The operator stops the job at its leader (Ctrl-C): its containers stop, it gives the
    # store up at once, and the standby, which may lead now, does not start the job again.
    a.send_signal(signal.SIGINT)
    assert a.wait(60) == 0
    assert line_from(b) == "the job is stopped: this standby leaves it so (job run resumes it)"
    assert b.wait(30) == 0
