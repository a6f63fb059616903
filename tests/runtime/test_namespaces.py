"""Specification: containers on hosts of their own, on one machine (Linux namespaces).

A coordinator listens on a bridge and launches stand-in containers (real
processes that heartbeat through the container's own client) with the
:class:`NamespaceLauncher`: each in its own network, mount, UTS and PID
namespaces, with an address on the bridge and the job's directory not
mounted. Then the faults of a real network: a partition (the container's
link set down) and a pause (SIGSTOP) of two containers at once; both are
failed over into new namespaces, and each, once it hears from the
coordinator again, is told it is no longer valid and exits. Every
namespace and process is removed at the end, failed or not.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from standins import HERE, Coordinator, call, wait_until, worker_bridge

from spark_elastic.runtime.coordinator.launchers.namespaces import Bridge, NamespaceLauncher

TOKEN = "namespaces-spec"


@pytest.fixture
def bridge() -> Iterator[Bridge]:
    """A bridge of this worker's own (name and network from its PID), removed at the end."""
    with worker_bridge("sebr", 78) as made:
        yield made


@pytest.fixture
def hosts(bridge: Bridge, tmp_path: Path) -> Iterator[Coordinator]:
    """A coordinator on the bridge whose containers are hosts of their own; the job's
    directory (``tmp_path``: its store and checkpoints) is not mounted in them."""
    (tmp_path / "cp").mkdir()
    (tmp_path / "cp" / "only-on-the-coordinators-disk").write_text("x")
    launcher = NamespaceLauncher(
        bridge,
        tmp_path / "logs",
        prefix=f"sec{os.getpid() % 10_000}",
        hidden=(tmp_path,),
        command=(sys.executable, str(HERE / "standin_container.py")),
    )
    coordinator = Coordinator(
        tmp_path,
        launcher=launcher,
        host=bridge.gateway,
        token=TOKEN,
        env={"SPARK_ELASTIC_TOKEN": TOKEN},
    )
    try:
        with coordinator.server.running_in_thread():
            yield coordinator
    finally:
        launcher.remove_all()


def inside(pid: int, *command: str) -> str:
    """Run ``command`` in the mount, UTS and network namespaces of process ``pid``."""
    return subprocess.run(
        ["nsenter", "-t", str(pid), "-m", "-u", "-n", *command],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    ).stdout.strip()


def two_running(coordinator: Coordinator) -> dict[str, dict[str, object]] | None:
    """The running containers and their rows, once there are two (None until then)."""
    rows = coordinator.status()["containers"]
    running = {c["containerId"]: c for c in rows if c["state"] == "running"}
    return running if len(running) == 2 else None


def test_a_container_is_a_host_of_its_own_reaching_its_coordinator_over_the_bridge(
    hosts: Coordinator, bridge: Bridge, tmp_path: Path
) -> None:
    launcher = hosts.launcher
    running = wait_until("two registered containers", lambda: two_running(hosts))
    handles = {str(row["handle"]) for row in running.values()}
    assert handles <= set(launcher.namespaces())
    for container_id, row in running.items():
        handle = str(row["handle"])
        (pid,) = launcher.pids(handle, container_id)[:1] or [0]
        assert pid, f"no process of {container_id} in {handle}"
        assert inside(pid, "hostname") == container_id
        # Its name is its own address (a JVM looks it up as it starts; no name server waits).
        resolved = inside(pid, "getent", "hosts", container_id).split()
        assert resolved[:1] == [launcher.address_of(handle)]
        assert inside(pid, "ls", "-A", str(tmp_path)) == ""  # the job's directory: not there
        addresses = inside(pid, "ip", "-4", "-o", "addr", "show", "dev", "eth0")
        assert launcher.address_of(handle) in addresses
    # The coordinator's loopback is not the container's: only the bridge reaches it.
    port = hosts.url.rsplit(":", 1)[1]
    some = next(iter(running))
    (pid,) = launcher.pids(str(running[some]["handle"]), some)[:1]
    reach = f"import urllib.request as u; u.urlopen('http://127.0.0.1:{port}/healthz', timeout=2)"
    refused = subprocess.run(
        ["nsenter", "-t", str(pid), "-n", "python3", "-c", reach],
        capture_output=True, text=True, timeout=20, check=False,
    )  # fmt: skip
    assert refused.returncode != 0
    assert "refused" in refused.stderr.lower() or "unreachable" in refused.stderr.lower()


def test_a_partitioned_and_a_paused_container_are_failed_over_and_the_cut_off_one_goes_on_return(
    hosts: Coordinator,
) -> None:
    launcher = hosts.launcher
    first = wait_until("two registered containers", lambda: two_running(hosts))
    (cut_id, cut), (paused_id, paused) = sorted(first.items())
    cut_handle, paused_handle = str(cut["handle"]), str(paused["handle"])
    launcher.cut(cut_handle)
    for pid in launcher.pids(paused_handle, paused_id):
        os.kill(pid, signal.SIGSTOP)

    # Both leases run out: their tasks go to successors, each a host of its own.
    after = wait_until(
        "both failed over to registered successors",
        lambda: (now := two_running(hosts)) and not set(now) & set(first) and now,
        timeout=60,
    )
    states = {c["containerId"]: c["state"] for c in hosts.status()["containers"]}
    assert states[cut_id] == states[paused_id] == "expired"
    # The paused one is killed where it stands; the cut-off one is out of the coordinator's
    # reach, as on another host: it runs on, its lease over, its writes fenced.
    wait_until("the paused one gone", lambda: paused_handle not in launcher.namespaces())
    assert launcher.pids(cut_handle, cut_id)
    assert cut_handle not in {str(c["handle"]) for c in after.values()}

    # Back on the network, it hears that it is no longer valid, and goes; so does its
    # namespace.
    launcher.restore(cut_handle)
    wait_until(
        "the cut-off one gone with its namespace",
        lambda: cut_handle not in launcher.namespaces(),
        timeout=60,
    )
    now = two_running(hosts) or {}
    assert {c: row["handle"] for c, row in now.items()} == {
        c: row["handle"] for c, row in after.items()
    }
    assert call(f"{hosts.url}/jobModel", token=TOKEN)[0] == 200


def test_no_container_is_given_an_address_the_bridge_holds_a_standby_coordinators(
    bridge: Bridge, tmp_path: Path
) -> None:
    standby = bridge.address(2)
    bridge.add_address(standby)
    assert 2 in bridge.own_numbers()
    assert 1 in bridge.own_numbers()  # its first address, the leader's
    launcher = NamespaceLauncher(bridge, tmp_path / "logs", prefix=f"sen{os.getpid() % 10_000}")
    assert launcher._next_number() == 3
