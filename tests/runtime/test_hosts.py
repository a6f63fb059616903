"""A stateful job whose containers are hosts of their own: fenced by the storage, not the disk.

The click-count job runs under ``spark-elastic job run --launcher namespaces``:
each container (a real Spark driver) is a host of its own on a bridge, in its
own network, mount, UTS and PID namespaces, with the job's local directory
not mounted. It reaches everything over the bridge: its coordinator
(listening there, with a token), a real Kafka broker (its input) and a real
S3 server, s3proxy (its checkpoints and its Parquet output). Nothing of the
job is on a disk the containers share.

Then a real network's faults, at once: one container is partitioned (its
link on the bridge set down) and another paused (SIGSTOP of every process
of its host) while records arrive. Both are failed over; each successor
seals its predecessor's commit log in the storage before it reads what was
published. Healed and woken, the cut-off containers publish nothing more:
what Spark reads back equals a single key-ordered pass over the broker's
records, row for row (each record once, nothing lost). Every namespace,
process and server is removed at the end, failed or not.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import kafka_jvm
import pytest
import storage_jvm
from jobs import (
    APPLY_DEADLINE_S,
    RECORDS,
    RunningJob,
    all_applied,
    key_ordered_counts,
    wait_until,
)
from kafka_clicks import Clicks, records_on
from pyspark.sql import SparkSession

from spark_elastic.runtime.coordinator.launchers.namespaces import Bridge, NamespaceLauncher
from spark_elastic.runtime.sinks import COMMITS_DIR
from spark_elastic.storage import CommitLog, open_storage

# `make test` runs this story (a short version of issue #43's: a partition and a pause);
# the one with a standby, a coordinator killed, a scale and a split is `make test-all`'s.
pytestmark = pytest.mark.slow

TOKEN = "hosts-story"
TOPIC = "clicks-hosts"


@pytest.fixture
def clicks(tmp_path: Path) -> Path:
    """The job's local directory (its coordinator's store and logs): not in any container."""
    return tmp_path


@pytest.fixture
def bridge() -> Iterator[Bridge]:
    """A bridge of this worker's own, removed at the end (root only; CI is root)."""
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("unshare") is None:
        if os.environ.get("CI"):
            pytest.fail("CI runs the namespace specs as root, with iproute2 and util-linux")
        pytest.skip("namespaces need root, ip (iproute2) and unshare (util-linux)")
    made = Bridge.create(f"seh{os.getpid() % 100_000}", f"10.79.{os.getpid() % 200}.0/24")
    try:
        yield made
    finally:
        made.delete()


@pytest.fixture
def broker(bridge: Bridge) -> Iterator[kafka_jvm.KafkaBroker]:
    """A Kafka broker listening on, and advertising, the bridge's address."""
    with kafka_jvm.running_kafka(host=bridge.gateway) as started:
        yield started


@pytest.fixture
def s3(bridge: Bridge) -> Iterator[storage_jvm.StorageServer]:
    """s3proxy on the bridge's address."""
    with storage_jvm.running_s3(host=bridge.gateway) as started:
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


def test_containers_on_hosts_of_their_own_are_fenced_by_the_storage_through_a_partition_and_a_pause(
    bridge: Bridge,
    broker: kafka_jvm.KafkaBroker,
    s3: storage_jvm.StorageServer,
    spark: SparkSession,
    start_job: Callable[..., RunningJob],
    clicks: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kafka_jvm.create_topics(broker.bootstrap, {TOPIC: 4})
    records = Clicks(broker.bootstrap, TOPIC)
    records.produce(RECORDS)
    s3.reach_from(spark)
    base = f"{s3.uri}/hosts"
    monkeypatch.setenv("CLICKS_KAFKA", broker.bootstrap)
    monkeypatch.setenv("CLICKS_TOPIC", TOPIC)
    monkeypatch.setenv("CLICKS_FACTOR", "2")
    monkeypatch.setenv("CLICKS_OUT", f"{base}/out")
    monkeypatch.setenv("CLICKS_CHECKPOINTS", f"{base}/checkpoints")
    jars = [*kafka_jvm.spark_kafka_jars(), *storage_jvm.s3a_jars()]
    conf = [item for k, v in s3.spark_conf().items() for item in ("--conf", f"{k}={v}")]
    name = bridge.name
    job = start_job(
        3,
        None,
        0,
        *("--launcher", "namespaces", "--bridge", f"{name}={bridge.network}"),
        *("--host", bridge.gateway, "--token", TOKEN, "--hide", str(clicks)),
        *conf,
        *("--conf", f"spark.jars={','.join(jars)}"),
        token=TOKEN,
    )
    # The coordinator's launcher names its namespaces for the bridge: this one sees them.
    hosts = NamespaceLauncher(bridge, clicks / "spec-logs", prefix=name[:8])
    try:
        running = wait_until(
            "three running containers",
            lambda: len(rows := job.running_rows()) == 3 and rows,
            timeout=APPLY_DEADLINE_S,
        )
        for row in running.values():
            assert str(row["handle"]).startswith(f"{name[:8]}-")  # a host of its own
        wait_until("every record applied", all_applied(job, records.total, spark), APPLY_DEADLINE_S)

        # A partition and a pause at once, while records arrive.
        (cut_id, cut), (paused_id, frozen) = sorted(running.items())[:2]
        frozen_pids = hosts.pids(str(frozen["handle"]), paused_id)
        assert frozen_pids
        hosts.cut(str(cut["handle"]))
        paused(frozen_pids, signal.SIGSTOP)
        try:
            records.produce(2000)
            wait_until(
                "both containers' tasks handed to new generations",
                lambda: (
                    not {cut_id, paused_id}
                    & {c["containerId"] for c in job.job_model()["containers"]}
                ),
                timeout=APPLY_DEADLINE_S,
            )
            wait_until(
                "every record applied by the successors",
                all_applied(job, records.total, spark),
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
            assert sealed_by(spark, f"{base}/out", int(row["generation"])) == (
                f"generation {heir['generation']} ({heir['containerId']})"
            )
        records.produce(1000)
        wait_until("every record applied", all_applied(job, records.total, spark), APPLY_DEADLINE_S)
        expected = key_ordered_counts(records_on(broker.bootstrap, TOPIC, records.total), 4)
        assert len(expected) == records.total
        assert job.output_rows(spark) == expected
    finally:
        job.cleanup()
        hosts.remove_all()
