"""A coordinator over real HTTP on loopback, launching stand-in container processes (no Spark).

The machinery the coordinator's specs share: :class:`Coordinator` (a real
coordinator server on a thread, its containers ``standin_container.py``
processes), the job it runs (:data:`TASKS`, :func:`shape`), its lease terms
(:data:`TERMS`), a :class:`Clock` that moves only when told, and the helpers
the specs call it with. The ``coordinator`` and ``make_coordinator``
fixtures (``tests/conftest.py``) start coordinators and stop them at the end.

Leases are short here (2 s, margin 1 s) so expiries happen within seconds.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from spark_elastic.runtime.coordinator.launchers import LocalLauncher
from spark_elastic.runtime.coordinator.launchers.namespaces import Bridge
from spark_elastic.runtime.coordinator.server import CoordinatorServer, bind
from spark_elastic.runtime.coordinator.stores import SQLiteStore
from spark_elastic.runtime.coordinator.supervisor import JobShape, Supervisor
from spark_elastic.runtime.lease import LeaseTerms

HERE = Path(__file__).parent
# Leases of a few heartbeats (200 ms): short enough for quick failovers, long enough that
# a loaded machine does not expire a live stand-in.
TERMS = LeaseTerms(lease_s=2.0, margin_s=1.0, write_budget_s=0.5)
TASKS = tuple(f"Partition {p}_{b}_4" for p in range(3) for b in range(4))


def wait_until(what: str, condition: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def call(
    url: str, body: Any = None, raw: bytes | None = None, token: str | None = None
) -> tuple[int, Any]:
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    request = urllib.request.Request(url, data=data)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@contextlib.contextmanager
def json_coordinator(answer: Callable[[str], Any]) -> Iterator[str]:
    """A coordinator's HTTP API on loopback, on a thread, answering each GET with
    ``answer(path)`` as JSON; yields its URL. For the container's side of the protocol,
    specified without a supervisor behind it."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # http.server's hook, named by it
            body = json.dumps(answer(self.path)).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}"
        finally:
            server.shutdown()


def shape(root: Path) -> JobShape:
    return JobShape("clicks", "jobs.py:job", 4, {"clicks": 3}, TASKS, str(root / "cp"))


class Coordinator:
    """A coordinator server on a thread, launching stand-in containers."""

    def __init__(
        self,
        root: Path,
        containers: int = 2,
        command: list[str] | None = None,
        port: int = 0,
        job_shape: JobShape | None = None,
        env: dict[str, str] | None = None,
        launcher: Any = None,
        host: str = "127.0.0.1",
        token: str | None = None,
        startup_s: float = 20,
        **supervisor: Any,
    ) -> None:
        self.root = root
        self.token = token
        self.launcher = launcher or LocalLauncher(
            root / "logs", command or [sys.executable, str(HERE / "standin_container.py")]
        )
        store = SQLiteStore(root / "coordinator.db")
        self.server = CoordinatorServer(
            lambda url: Supervisor(
                job_shape or shape(root),
                store,
                self.launcher,
                url,
                containers,
                TERMS,
                startup_s=startup_s,
                container_env={"SPARK_ELASTIC_HEARTBEAT_MS": "200", **(env or {})},
                **supervisor,
            ),
            bind(host, port),
            token,
        )
        self.url = self.server.url

    @property
    def supervisor(self) -> Supervisor:
        return self.server.supervisor

    def status(self) -> dict[str, Any]:
        return call(f"{self.url}/status.json", token=self.token)[1]  # type: ignore[no-any-return]

    def running(self) -> dict[str, int]:
        return {
            c["containerId"]: c["pid"]
            for c in self.status()["containers"]
            if c["state"] == "running"
        }

    def kill_all(self) -> None:
        if not hasattr(self.launcher, "launched"):
            self.launcher.remove_all()  # a namespace launcher: everything in its namespaces
            return
        for pid, container_id in self.launcher.launched.items():
            self.launcher.kill(pid, container_id, signal.SIGKILL)


def model(coordinator: Coordinator) -> dict[str, Any]:
    return call(f"{coordinator.url}/jobModel")[1]  # type: ignore[no-any-return]


def report_commit(
    url: str, container: dict[str, Any], lag: int = 0, records: int = 0, partition: str = ""
) -> None:
    """A container's progress report of a committed batch, as a real one sends it.

    Each task's offsets name ``partition`` (by default its own, from its name).
    """
    tasks = [
        {"task": t, "offsets": {"clicks": {partition or t.split("_")[0].split()[1]: 0}}, "lag": lag}
        for t in container["tasks"]
    ]
    body = {
        "containerId": container["containerId"],
        "generation": container["generation"],
        "batchId": 0,
        "recordsRead": records,
        "recordsProcessed": records,
        "tasks": tasks,
    }
    assert call(f"{url}/containers/progress", body)[0] == 200


def started(coordinator: Coordinator) -> None:
    """What each container of the model says once it committed a batch: a progress report."""
    for c in model(coordinator)["containers"]:
        report_commit(coordinator.url, c)


class Clock:
    """A monotonic clock that moves only when told: leases expire exactly when asked."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def crash(coordinator: Coordinator) -> None:
    """Leave the containers running when the server stops, as a crash would."""
    coordinator.server.leave_containers_running()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):
        # A zombie (exited, not yet reaped by its parent) is not running.
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    return True


def free_network(second: int) -> str:
    """A /24 of 10.``second``.0.0/16 no interface of this machine is on (two workers of one
    test session, whose PIDs pick where to look first, do not share a bridge's network)."""
    shown = subprocess.run(
        ["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=True
    ).stdout
    for step in range(200):
        network = f"10.{second}.{(os.getpid() + step) % 200}.0/24"
        if f" {network.rsplit('.', 1)[0]}." not in shown:
            return network
    raise AssertionError(f"no free /24 in 10.{second}.0.0/16")


@contextlib.contextmanager
def worker_bridge(prefix: str, second: int) -> Iterator[Bridge]:
    """A bridge of this worker's own (named for its PID, on a free /24 of 10.``second``),
    removed at the end; skips without root, ``ip`` or ``unshare`` (fails under CI, which
    has them)."""
    import pytest

    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("unshare") is None:
        if os.environ.get("CI"):
            pytest.fail("CI runs the namespace specs as root, with iproute2 and util-linux")
        pytest.skip("namespaces need root, ip (iproute2) and unshare (util-linux)")
    made = Bridge.create(f"{prefix}{os.getpid() % 100_000}", free_network(second))
    try:
        yield made
    finally:
        made.delete()
