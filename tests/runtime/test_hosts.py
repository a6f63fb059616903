"""A stateful job whose containers are hosts of their own: fenced by the storage, not the disk.

The click-count job runs under ``spark-elastic job run --launcher namespaces``:
each container (a real Spark driver) is a host of its own on a bridge, in its
own network, mount, UTS and PID namespaces, with the job's local directory
not mounted. It reaches everything over the bridge: its coordinator
(listening there, with a token), a real Kafka broker (its input) and a real
S3 server, s3proxy (its checkpoints and its Parquet output). Nothing of the
job is on a disk the containers share.

`make test`'s story: a real network's faults at once, one container
partitioned (its link on the bridge set down) and another paused (SIGSTOP of
every process of its host) while records arrive. Both are failed over; each
successor seals its predecessor's commit log in the storage before it reads
what was published. Healed and woken, the cut-off containers publish nothing
more: what Spark reads back equals a single key-ordered pass over the
broker's records, row for row (each record once, nothing lost).

`make test-all`'s story (issue #43's): the same with two coordinators on a
shared PostgreSQL store (listening on the bridge), a leader at the bridge's
address and a standby on a host of its own (a fourth network namespace with
its link on the bridge; its launcher makes the containers' links in the
machine's own network, where the bridge lives). After the faults the leader
is killed; the standby leads the same containers once the store's lease is out,
then scales them 3 -> 4 -> 3 and splits the factor 2 -> 4, live. Also in
`make test-all`: the containers' executors on a Spark standalone cluster
whose master and workers are hosts of their own on the bridge, through a
partition. Every namespace, process and server is removed at the end,
failed or not.
"""

from __future__ import annotations

import contextlib
import os
import signal
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kafka_jvm
import postgresql_server
import pytest
import storage_jvm
from cli_runner import run_cli
from jobs import (
    APPLY_DEADLINE_S,
    CHANGE_DEADLINE_S,
    RECORDS,
    RunningJob,
    all_applied,
    key_ordered_counts,
    wait_until,
)
from jvm import CONTAINER_JAVA_OPTIONS
from kafka_clicks import Clicks, records_on
from pyspark.sql import SparkSession
from spark_cluster import SPARK_HOME, _wait_for
from standins import worker_bridge

from spark_elastic.runtime.coordinator.launchers.namespaces import Bridge, NamespaceLauncher, ip
from spark_elastic.runtime.protocol import CONTAINER_ID_ENV
from spark_elastic.runtime.sinks import COMMITS_DIR
from spark_elastic.storage import CommitLog, open_storage

# `make test` runs this story (a short version of issue #43's: a partition and a pause);
# the one with a standby, a coordinator killed, a scale and a split is `make test-all`'s.
pytestmark = pytest.mark.slow

TOKEN = "hosts-story"
TOPIC = "clicks-hosts"
STORE_LEASE_MS = 9000  # the shared store's lease: at least the containers' lease and margin


@pytest.fixture
def clicks(tmp_path: Path) -> Path:
    """The job's local directory (its coordinator's store and logs): not in any container."""
    return tmp_path


@pytest.fixture
def bridge() -> Iterator[Bridge]:
    """A bridge of this worker's own, removed at the end (root only; CI is root)."""
    with worker_bridge("seh", 79) as made:
        yield made


@pytest.fixture
def broker(bridge: Bridge) -> Iterator[kafka_jvm.KafkaBroker]:
    """A Kafka broker listening on, and advertising, the bridge's address."""
    with kafka_jvm.running_kafka(host=bridge.gateway) as started:
        yield started


@pytest.fixture
def s3(bridge: Bridge) -> Iterator[storage_jvm.StorageServer]:
    """s3proxy on the bridge's address."""
    # A bucket of its own, each story's: Hadoop caches a FileSystem per bucket, and the
    # session's Spark may have reached another server's (the session's s3proxy, or an
    # earlier story's) under the same name.
    bucket = f"hosts-{uuid.uuid4().hex[:8]}"
    with storage_jvm.running_s3(host=bridge.gateway, bucket=bucket) as started:
        yield started


def sealed_by(spark: SparkSession, out: str, generation: int) -> str | None:
    """Who sealed ``generation``'s commit log in the sink's storage (None: no one)."""
    log = CommitLog(open_storage(out, spark), f"{out}/{COMMITS_DIR}")
    end = log.entry(generation, log.sequences(generation)[-1])
    return end.sealed_by if end is not None else None


def paused(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


@dataclass
class Story:
    """The job's setting: its records on the broker, its files on S3, its ``job run`` options,
    and the spec's own view of the coordinators' namespaces."""

    records: Clicks
    base: str
    options: tuple[str, ...]
    hosts: NamespaceLauncher


@pytest.fixture
def story(
    bridge: Bridge,
    broker: kafka_jvm.KafkaBroker,
    s3: storage_jvm.StorageServer,
    spark: SparkSession,
    clicks: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Story]:
    """The click count at factor 2 over a topic of 4 partitions, its first records produced;
    every namespace of the bridge removed at the end."""
    kafka_jvm.create_topics(broker.bootstrap, {TOPIC: 4})
    records = Clicks(broker.bootstrap, TOPIC)
    records.produce(RECORDS)
    s3.reach_from(spark)
    base = f"{s3.uri}/clicks"
    monkeypatch.setenv("CLICKS_KAFKA", broker.bootstrap)
    monkeypatch.setenv("CLICKS_TOPIC", TOPIC)
    monkeypatch.setenv("CLICKS_FACTOR", "2")
    monkeypatch.setenv("CLICKS_OUT", f"{base}/out")
    monkeypatch.setenv("CLICKS_CHECKPOINTS", f"{base}/checkpoints")
    jars = [*kafka_jvm.spark_kafka_jars(), *storage_jvm.s3a_jars()]
    conf = [item for k, v in s3.spark_conf().items() for item in ("--conf", f"{k}={v}")]
    options = (
        *("--launcher", "namespaces", "--bridge", f"{bridge.name}={bridge.network}"),
        *("--token", TOKEN, "--hide", str(clicks), "--logs", str(clicks / "logs")),
        *conf,
        *("--conf", f"spark.jars={','.join(jars)}"),
    )
    # The coordinators' launchers name their namespaces for the bridge: this one sees them.
    hosts = NamespaceLauncher(bridge, clicks / "spec-logs", prefix=bridge.name[:8])
    try:
        yield Story(records, base, options, hosts)
    finally:
        hosts.remove_all()


def three_running(job: RunningJob, story: Story, spark: SparkSession) -> dict[str, Any]:
    """The job's three containers, each a host of its own, once they applied every record."""
    running = wait_until(
        "three running containers",
        lambda: len(rows := job.running_rows()) == 3 and rows,
        timeout=APPLY_DEADLINE_S,
    )
    for row in running.values():
        assert str(row["handle"]).startswith(f"{story.hosts.prefix}-")  # a host of its own
    wait_until(
        "every record applied", all_applied(job, story.records.total, spark), APPLY_DEADLINE_S
    )
    return running


def cut_and_pause(
    job: RunningJob, story: Story, spark: SparkSession, running: dict[str, Any]
) -> None:
    """Partition one container and pause another while records arrive; both are failed
    over, each successor seals its predecessor's commit log, and, healed and woken, they exit."""
    hosts = story.hosts
    (cut_id, cut), (paused_id, frozen) = sorted(running.items())[:2]
    frozen_pids = hosts.pids(str(frozen["handle"]), paused_id)
    assert frozen_pids
    hosts.cut(str(cut["handle"]))
    paused(frozen_pids, signal.SIGSTOP)
    try:
        story.records.produce(2000)
        wait_until(
            "both containers' tasks handed to new generations",
            lambda: (
                not {cut_id, paused_id} & {c["containerId"] for c in job.job_model()["containers"]}
            ),
            timeout=APPLY_DEADLINE_S,
        )
        wait_until(
            "every record applied by the successors",
            all_applied(job, story.records.total, spark),
            APPLY_DEADLINE_S,
        )
    finally:
        hosts.restore(str(cut["handle"]))
        paused(frozen_pids, signal.SIGCONT)
    # Back on the network, each hears it is no longer valid and exits, publishing nothing.
    for container_id, row in ((cut_id, cut), (paused_id, frozen)):
        wait_until(
            f"{container_id} to exit",
            lambda h=str(row["handle"]), c=container_id: not hosts.pids(h, c),
            timeout=120,
        )
    # Each successor sealed its predecessor's commit log in S3 before it read the output.
    successors = {c["tasks"][0]: c for c in job.job_model()["containers"] if c["tasks"]}
    for row in (cut, frozen):
        heir = successors[row["tasks"][0]]
        assert sealed_by(spark, f"{story.base}/out", int(row["generation"])) == (
            f"generation {heir['generation']} ({heir['containerId']})"
        )


def each_record_once(
    job: RunningJob, story: Story, broker: kafka_jvm.KafkaBroker, spark: SparkSession
) -> None:
    """The output read back equals a single key-ordered pass over the broker's records."""
    records = story.records
    wait_until("every record applied", all_applied(job, records.total, spark), APPLY_DEADLINE_S)
    expected = key_ordered_counts(records_on(broker.bootstrap, TOPIC, records.total), 4)
    assert len(expected) == records.total
    assert job.output_rows(spark) == expected


def test_containers_on_hosts_of_their_own_are_fenced_by_the_storage_through_a_partition_and_a_pause(
    story: Story,
    bridge: Bridge,
    broker: kafka_jvm.KafkaBroker,
    spark: SparkSession,
    start_job: Callable[..., RunningJob],
) -> None:
    job = start_job(3, None, 0, *story.options, "--host", bridge.gateway, token=TOKEN)
    try:
        cut_and_pause(job, story, spark, three_running(job, story, spark))
        story.records.produce(1000)
        each_record_once(job, story, broker, spark)
    finally:
        job.cleanup()


@pytest.mark.long
def test_across_hosts_a_standby_takes_over_the_same_containers_which_scale_and_split_live(
    story: Story,
    bridge: Bridge,
    broker: kafka_jvm.KafkaBroker,
    spark: SparkSession,
    start_job: Callable[..., RunningJob],
) -> None:
    # Two coordinators on a shared PostgreSQL store (listening on the bridge), the standby on
    # a host of its own (a network namespace with its link on the bridge): the leader tells
    # its containers of it.
    with (
        postgresql_server.running_postgresql(
            host=bridge.gateway, clients=str(bridge.network)
        ) as postgresql,
        host_of_its_own(bridge, "sehs") as (standby_ns, standby_host),
    ):
        pg_url = postgresql.create_database("hosts")
        standby_port = kafka_jvm.free_port()
        standby_url = f"http://{standby_host}:{standby_port}"
        shared = (*story.options, "--store", pg_url, "--store-lease-ms", str(STORE_LEASE_MS))
        leader = start_job(
            3, None, 0, *shared, "--host", bridge.gateway, "--peer", standby_url, token=TOKEN
        )
        standby = start_job(
            3,
            None,
            standby_port,
            *shared,
            *("--host", standby_host),
            token=TOKEN,
            prefix=("ip", "netns", "exec", standby_ns),
        )
        assert standby.url == standby_url
        # Its address is its own interface's, not the bridge's.
        assert f" {standby_host}/" not in ip("-4", "-o", "addr", "show", "dev", bridge.name)
        standby_takes_over(story, bridge, broker, spark, leader, standby, standby_url)


def standby_takes_over(
    story: Story,
    bridge: Bridge,
    broker: kafka_jvm.KafkaBroker,
    spark: SparkSession,
    leader: RunningJob,
    standby: RunningJob,
    standby_url: str,
) -> None:
    """The faults, the leader killed, the standby leading, 3 -> 4 -> 3 and a split."""
    try:
        running = three_running(leader, story, spark)
        wait_until(
            "the standby listed by the leader",
            lambda: [s["url"] for s in leader.status()["coordinator"]["standbys"]],
        )
        cut_and_pause(leader, story, spark, running)
        before = set(leader.running_rows())

        # The leader's host dies (SIGKILL): the standby claims the store once its lease is
        # out and leads the same containers, which find it themselves.
        leader.process.kill()
        leader.process.wait(30)
        story.records.produce(1000)
        led = wait_until(
            "the standby leading",
            lambda: standby.leads() and standby.status(),
            timeout=STORE_LEASE_MS / 1000 * 4,
        )
        assert led["coordinator"]["url"].rstrip("/") == standby_url
        assert set(standby.running_rows()) == before  # the same containers, none failed over
        wait_until(
            "every record applied",
            all_applied(standby, story.records.total, spark),
            APPLY_DEADLINE_S,
        )

        # 3 -> 4 -> 3 containers and a split 2 -> 4, each live while records arrive.
        for change, settled in (
            (("--containers", "4"), lambda m: len(m["containers"]) == 4),
            (("--containers", "3"), lambda m: len(m["containers"]) == 3),
            (("--elasticity-factor", "4"), lambda m: m["elasticityFactor"] == 4),
        ):
            asked = run_cli("job", "scale", standby.url, *change, "--token", TOKEN)
            assert asked.returncode == 0, asked.stderr
            story.records.produce(1000)
            wait_until(
                f"{' '.join(change)} settled",
                lambda s=settled: (m := standby.settled_model()) and s(m),
                timeout=CHANGE_DEADLINE_S,
            )
        story.records.produce(1000)
        each_record_once(standby, story, broker, spark)
    finally:
        standby.cleanup()
        leader.cleanup()


@contextlib.contextmanager
def host_of_its_own(bridge: Bridge, prefix: str) -> Iterator[tuple[str, str]]:
    """A network namespace with a link on the bridge and the network's last address: a
    coordinator's host; yields its name and address, removed at the end."""
    name = f"{prefix}{os.getpid() % 100_000}"
    address = str(bridge.network.broadcast_address - 1)
    ip("netns", "add", name)
    try:
        link = f"{prefix}v{os.getpid() % 100_000}"
        ip("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", name)
        ip("link", "set", link, "master", bridge.name, "up")
        ip("-n", name, "addr", "add", f"{address}/{bridge.network.prefixlen}", "dev", "eth0")
        ip("-n", name, "link", "set", "eth0", "up")
        ip("-n", name, "link", "set", "lo", "up")
        ip("-n", name, "route", "add", "default", "via", bridge.gateway)
        yield name, address
    finally:
        ip("netns", "del", name, check=False)


@contextlib.contextmanager
def cluster_on_hosts(bridge: Bridge, root: Path, workers: int) -> Iterator[str]:
    """A Spark standalone master and ``workers`` workers, each a host of its own on the
    bridge (pyspark's own ``spark-class``, the job's directory ``root`` not mounted);
    yields the master's URL. They share the story's namespace names, so no address is
    handed out twice; the story's ``remove_all`` ends them."""
    env = {
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
        "SPARK_DAEMON_JAVA_OPTS": CONTAINER_JAVA_OPTIONS,
    }
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    logs = root.parent / f"{root.name}-cluster"

    def host(name: str, *command: str) -> str:
        launcher = NamespaceLauncher(
            bridge, logs, prefix=bridge.name[:8], hidden=(root,), command=(spark_class, *command)
        )
        return launcher.address_of(launcher.launch(name, {**env, CONTAINER_ID_ENV: name}))

    master = host(
        "spark-master",
        "org.apache.spark.deploy.master.Master",
        "--port",
        "7077",
        "--webui-port",
        "0",
    )
    url = f"spark://{master}:7077"
    _wait_for(r"Starting Spark master at", logs / "spark-master.log", "the master")
    for i in range(workers):
        host(
            f"spark-worker-{i}",
            *("org.apache.spark.deploy.worker.Worker", url, "--webui-port", "0"),
            *("--cores", "2", "--memory", "2g", "--work-dir", str(logs / f"work-{i}")),
        )
    _wait_for(r"Registering worker", logs / "spark-master.log", f"{workers} workers", workers)
    yield url


@pytest.mark.long
def test_a_containers_executors_run_on_workers_that_are_hosts_of_their_own(
    story: Story,
    bridge: Bridge,
    broker: kafka_jvm.KafkaBroker,
    spark: SparkSession,
    start_job: Callable[..., RunningJob],
    clicks: Path,
) -> None:
    # Each container is a Spark driver on a host of its own; its executors run on a
    # standalone cluster whose master and workers are hosts of their own too, reaching the
    # driver, the broker and S3 over the bridge.
    with cluster_on_hosts(bridge, clicks, workers=2) as master:
        job = start_job(
            2,
            None,
            0,
            *story.options,
            *("--host", bridge.gateway, "--master", master),
            *("--conf", "spark.cores.max=1", "--conf", "spark.executor.memory=512m"),
            token=TOKEN,
        )
        try:
            running = wait_until(
                "two running containers",
                lambda: len(rows := job.running_rows()) == 2 and rows,
                timeout=APPLY_DEADLINE_S,
            )
            wait_until(
                "every record applied",
                all_applied(job, story.records.total, spark),
                APPLY_DEADLINE_S,
            )
            master_log = (clicks.parent / f"{clicks.name}-cluster" / "spark-master.log").read_text()
            assert master_log.count("Registering app ") >= 2  # each container its application
            assert "Launching executor" in master_log
            # A partitioned container is failed over; its successor's executors take its tasks.
            (cut_id, cut) = sorted(running.items())[0]
            story.hosts.cut(str(cut["handle"]))
            try:
                story.records.produce(1000)
                wait_until(
                    "its tasks handed to a new generation",
                    lambda: cut_id not in {c["containerId"] for c in job.job_model()["containers"]},
                    timeout=APPLY_DEADLINE_S,
                )
                wait_until(
                    "every record applied",
                    all_applied(job, story.records.total, spark),
                    APPLY_DEADLINE_S,
                )
            finally:
                story.hosts.restore(str(cut["handle"]))
            each_record_once(job, story, broker, spark)
        finally:
            job.cleanup()
