"""Shared fixtures of the specs: coordinators in-process, over HTTP with stand-ins, and real jobs.

``in_process``: a coordinator in-process, with a fake clock and fake processes.
The coordinator's logic (leases, failovers, changes, deadlines, cancel, resume,
store ownership) is specified here without processes or HTTP: a
:class:`Supervisor` over a real store, driven tick by tick with a clock that
moves only when told and a launcher whose "processes" live and die when told.

``coordinator`` and ``make_coordinator``: a real coordinator serving HTTP on
loopback, on a thread, whose containers are stand-in processes (no Spark);
its machinery is ``tests/runtime/standins.py``. A spec that needs another
job or other options asks ``make_coordinator`` for one.

``clicks`` and ``start_job``: the end-to-end specs' click-count job, run by
``spark-elastic job run`` (the coordinator in its own process, real
containers, real Spark) on an embedded log; its machinery is
``tests/runtime/jobs.py``. A module whose job reads another log overrides
``clicks``: ``start_job`` then runs on that one.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import os
import signal
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kafka_jvm
import postgresql_server
import pytest
import storage_jvm
from jobs import RECORDS, JobStarter, RunningJob, produce
from standins import Clock, Coordinator

from spark_elastic import EmbeddedLog
from spark_elastic.runtime.coordinator.stores import SQLiteStore
from spark_elastic.runtime.coordinator.supervisor import JobShape, Supervisor
from spark_elastic.runtime.lease import LeaseTerms
from spark_elastic.runtime.protocol import ProgressReport, Registration, TaskProgress

FAKE_TERMS = LeaseTerms(lease_s=10.0, margin_s=5.0, write_budget_s=3.0)
FAKE_TASKS = tuple(f"Partition {p}_{b}_2" for p in range(2) for b in range(2))


@dataclass
class FakeProcess:
    container_id: str
    env: Mapping[str, str]
    alive: bool = True
    terminated: bool = False
    killed: bool = False


@dataclass
class FakeLauncher:
    """Processes that run until a spec (or the coordinator's SIGKILL) ends them.

    ``exits_on_sigterm`` makes a terminated process exit at once, as a
    container whose query stops at its batch boundary would.
    """

    exits_on_sigterm: bool = True
    processes: dict[str, FakeProcess] = field(default_factory=dict)
    _pids: Iterator[int] = field(default_factory=lambda: itertools.count(50_000))

    def launch(self, container_id: str, env: Mapping[str, str]) -> str:
        handle = f"fake-{next(self._pids)}"  # opaque to the coordinator, as a pod's UID is
        self.processes[handle] = FakeProcess(container_id, dict(env))
        return handle

    def alive(self, handle: str, container_id: str) -> bool:
        process = self.processes.get(handle)
        return process is not None and process.container_id == container_id and process.alive

    def terminate(self, handle: str, container_id: str) -> None:
        process = self.processes.get(handle)
        if process is not None and process.container_id == container_id:
            process.terminated = True
            if self.exits_on_sigterm:
                process.alive = False

    def kill(self, handle: str, container_id: str, sig: int) -> None:
        process = self.processes.get(handle)
        if process is not None and process.container_id == container_id:
            if sig == signal.SIGKILL:
                process.killed = True
            process.alive = False

    def reap(self) -> None:
        return None

    def exit(self, container_id: str) -> None:
        """The container's process exits by itself."""
        for process in self.processes.values():
            if process.container_id == container_id:
                process.alive = False

    def handle_of(self, container_id: str) -> str:
        return next(h for h, proc in self.processes.items() if proc.container_id == container_id)

    def running(self) -> list[str]:
        return sorted(p.container_id for p in self.processes.values() if p.alive)


@dataclass
class InProcess:
    """A coordinator's state machine, its store, its fake clock and fake processes."""

    root: Path
    clock: Clock
    launcher: FakeLauncher
    make: Callable[..., Supervisor]
    supervisor: Supervisor

    def restart(self, **changes: Any) -> Supervisor:
        """A new coordinator on the same store (the old one's store closed first)."""
        self.supervisor.store.close()
        self.supervisor = self.make(**changes)
        return self.supervisor

    def states(self) -> dict[str, str]:
        return {c["containerId"]: c["state"] for c in self.supervisor.status()["containers"]}

    def live(self) -> list[str]:
        return sorted(c.container_id for c in self.supervisor.model.containers)

    def register_all(self) -> None:
        """Every launched, unregistered container registers (its Spark application is up)."""
        states = self.states()
        for number, process in enumerate(self.launcher.processes.values(), 50_000):
            if process.alive and states.get(process.container_id) == "launching":
                self.supervisor.register(Registration(process.container_id, number))

    def beat_all(self) -> None:
        for process in self.launcher.processes.values():
            if process.alive:
                self.supervisor.heartbeat(process.container_id)

    def report(self, container_id: str, batch: int = 0, lag: int = 0, enforced: int = 0) -> None:
        """A container reports a committed batch over its tasks (offset ``batch``), in which
        they processed ``enforced`` records without waiting."""
        mine = next(c for c in self.supervisor.model.containers if c.container_id == container_id)
        self.supervisor.progress(
            ProgressReport(
                container_id,
                mine.generation,
                batch,
                10,
                10,
                tuple(
                    TaskProgress(t, {"clicks": {int(t.split()[1].split("_")[0]): batch}}, lag)
                    for t in mine.tasks
                ),
                enforced,
            )
        )

    def step(self, seconds: float = 1.0, beat: bool = True) -> None:
        """Time passes: containers heartbeat (unless told not to), the coordinator ticks."""
        self.clock.advance(seconds)
        if beat:
            self.beat_all()
        self.supervisor.tick()


@pytest.fixture
def in_process(tmp_path: Path) -> Iterator[InProcess]:
    """A stateless two-container job's coordinator, in-process; its store closed at the end."""
    clock, launcher = Clock(), FakeLauncher()
    store_path = tmp_path / "coordinator.db"

    def make(
        stateful: bool = False,
        time_ordered: bool = False,
        containers: int = 2,
        url: str = "http://127.0.0.1:9",
        **options: Any,
    ) -> Supervisor:
        job = JobShape(
            "clicks",
            "jobs.py:job",
            2,
            {"clicks": 2},
            FAKE_TASKS,
            str(tmp_path / "cp"),
            stateful=stateful,
            time_ordered=time_ordered,
        )
        return Supervisor(
            job,
            SQLiteStore(store_path),
            launcher,
            url,
            containers,
            FAKE_TERMS,
            startup_s=60,
            clock=clock,
            **options,
        )

    harness = InProcess(tmp_path, clock, launcher, make, make())
    try:
        yield harness
    finally:
        harness.supervisor.store.close()


@pytest.fixture
def make_coordinator(tmp_path: Path) -> Iterator[Callable[..., Coordinator]]:
    """``make_coordinator(**options)``: a :class:`Coordinator` on ``tmp_path`` (``options``
    are its own), serving on a thread until the spec ends.

    At the end, even when the spec failed, every container it launched is
    killed, then each coordinator stops serving (it would wait a minute for
    stand-ins that ignore SIGTERM), then what it launched meanwhile is killed.
    """
    with contextlib.ExitStack() as stack:

        def make(**options: Any) -> Coordinator:
            c = Coordinator(tmp_path, **options)
            stack.callback(c.kill_all)
            stack.enter_context(c.server.running_in_thread())
            stack.callback(c.kill_all)  # runs first: the stack unwinds last in, first out
            return c

        yield make


@pytest.fixture
def coordinator(make_coordinator: Callable[..., Coordinator]) -> Coordinator:
    """A coordinator with the defaults: two stand-in containers of ``standins.shape``'s job."""
    return make_coordinator()


@pytest.fixture
def clicks(tmp_path: Path) -> Path:
    """An embedded log with RECORDS clicks of USERS users over 4 partitions."""
    log = EmbeddedLog(tmp_path / "log")
    log.create_topic("clicks", 4)
    produce(log, 0, RECORDS)
    return tmp_path


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed end-to-end spec's report says what its coordinators and containers did."""
    outcome = yield
    report = outcome.get_result()
    starter = getattr(item, "funcargs", {}).get("start_job")
    if report.failed and report.when == "call" and isinstance(starter, JobStarter):
        report.sections.append(("what the jobs did", starter.diagnosis()))


@pytest.fixture
def start_job(clicks: Path) -> Iterator[Callable[..., RunningJob]]:
    """``start_job(containers, store=None, port=0, *extra, job=JOB)``: the click-count job
    (or ``job``) on ``clicks``.

    Every job it started is stopped at the end, and what it launched killed.
    """
    starter = JobStarter(clicks)
    yield starter
    starter.cleanup()


def _kafka_or_skip() -> None:
    """Skip (fail under CI, which has them) without confluent-kafka, Java or the jars."""

    def missing(why: str) -> None:
        if os.environ.get("CI"):
            pytest.fail(f"{why}: CI runs the Kafka specs")
        pytest.skip(why)

    if importlib.util.find_spec("confluent_kafka") is None:
        missing("no confluent_kafka (pip install 'spark-elastic[kafka]')")
    try:
        kafka_jvm.java()
        kafka_jvm.kafka_jars()
    except kafka_jvm.KafkaJvmError as why:
        missing(str(why))


@pytest.fixture(scope="session")
def kafka() -> Iterator[kafka_jvm.KafkaBroker]:
    """One real Apache Kafka broker (KRaft, loopback) for the worker's session, stopped by PID.

    Its jars come from ``make jars`` (``make test`` fetches them). Without
    confluent-kafka, Java or the jars the Kafka specs skip saying so, and fail
    under CI, which has them all.
    """

    _kafka_or_skip()
    with kafka_jvm.running_kafka() as broker:
        yield broker


@pytest.fixture(scope="session")
def kafka_sasl() -> Iterator[kafka_jvm.KafkaBroker]:
    """A second broker whose clients authenticate with SASL/PLAIN (user ``alice``).

    Started only for the specs that ask for it; ``client_options`` holds
    alice's settings, ``kafka_jvm.sasl_options`` builds others.
    """
    _kafka_or_skip()
    with kafka_jvm.running_kafka(users={"alice": "alice-secret"}) as broker:
        yield broker


def _servers_or_skip() -> None:
    """Skip (fail under CI, which has them) without Java or the storage servers' jars."""
    try:
        kafka_jvm.java()
        storage_jvm.s3a_jars()
    except (kafka_jvm.KafkaJvmError, storage_jvm.StorageJvmError) as why:
        if os.environ.get("CI"):
            pytest.fail(f"{why}: CI runs the storage specs")
        pytest.skip(str(why))


@pytest.fixture(scope="session")
def postgresql() -> Iterator[postgresql_server.PostgreSQLServer]:
    """One real PostgreSQL server (Debian's package) for the worker's session.

    Skipped without it or psycopg, except under CI (which installs both); stopped
    by PID at the end. Each spec makes a database of its own on it.
    """
    try:
        import psycopg  # noqa: F401

        postgresql_server.binaries()
    except (ImportError, postgresql_server.PostgreSQLServerError) as why:
        if os.environ.get("CI"):
            pytest.fail(f"{why}: CI runs the PostgreSQL specs")
        pytest.skip(str(why))
    with postgresql_server.running_postgresql() as server:
        yield server


_databases = itertools.count(1)


@pytest.fixture
def pg_url(postgresql: postgresql_server.PostgreSQLServer) -> str:
    """The URL of a new, empty database on the session's PostgreSQL server."""
    return postgresql.create_database(f"job_{os.getpid()}_{next(_databases)}")


@pytest.fixture(scope="session")
def hdfs() -> Iterator[storage_jvm.StorageServer]:
    """One real HDFS (a MiniDFSCluster: a NameNode and a DataNode) for the worker's session.

    Its jars come from ``make jars``; stopped by PID at the end.
    """
    _servers_or_skip()
    with storage_jvm.running_hdfs() as server:
        yield server


@pytest.fixture(scope="session")
def cloud() -> storage_jvm.StorageServer:
    """A real object store (S3, GCS, ABFS), opt-in: skipped unless SPARK_ELASTIC_CLOUD names one.

    Outside CI, with credentials; see docs/running-a-job.md#on-a-real-object-store.
    """
    try:
        server = storage_jvm.cloud_from_env(dict(os.environ))
        storage_jvm.cloud_jars(dict(os.environ))
    except storage_jvm.StorageJvmError as why:
        pytest.fail(str(why))
    if server is None:
        pytest.skip(f"no real object store: set {storage_jvm.CLOUD} to run the specs on one")
    return server


@pytest.fixture(scope="session")
def s3() -> Iterator[storage_jvm.StorageServer]:
    """One real S3 server (s3proxy over a directory, bucket ``jobs``) for the worker's session.

    Its jar comes from ``make jars``; stopped by PID at the end.
    """
    _servers_or_skip()
    with storage_jvm.running_s3() as server:
        yield server
