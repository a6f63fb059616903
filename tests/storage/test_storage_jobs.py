"""A running job publishes its output on HDFS and on S3, exactly once through a failover.

The click-count job runs under ``spark-elastic job run`` (a coordinator and two
containers, real Spark) with its :class:`ParquetSink` on a real HDFS and on a
real S3 server, its checkpoints still on the local disk. One container is
paused past its lease (``SIGSTOP``: a zombie) while records arrive; its
successor claims its keys, sealing its commit log, before it reads what the
sink published. Woken, the zombie publishes nothing more, and Spark reads
each record's running count once from the sink's committed batches. A sink
whose file system cannot be reached fails the job in one line that says so,
in `job status`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import storage_jvm
from cli_runner import run_cli
from jobs import (
    APPLY_DEADLINE_S,
    RECORDS,
    RunningJob,
    counts_in_key_order,
    produce,
    wait_until,
)
from pyspark.sql import SparkSession
from standins import alive

from spark_elastic import EmbeddedLog, ParquetSink
from spark_elastic.runtime.sinks import COMMITS_DIR
from spark_elastic.storage import CommitLog, open_storage

pytestmark = pytest.mark.slow


def rows(spark: SparkSession, sink: ParquetSink) -> list[tuple[str, int, int, int]]:
    """``(user, clicks, partition, offset)`` of every committed row, sorted, repeats kept."""
    if not sink.committed(spark):
        return []
    read = sink.read(spark).select("user", "clicks", "partition", "offset").collect()
    return sorted((r.user, r.clicks, r.partition, r.offset) for r in read)


def committed_by(spark: SparkSession, sink: ParquetSink, container: str) -> list[str]:
    return [d for d in sink.committed(spark) if f"/container={container}/" in d]


@pytest.mark.parametrize("file_system", ["hdfs", "s3"])
def test_a_job_publishes_on_a_remote_file_system_once_through_a_fenced_zombie(
    request: pytest.FixtureRequest,
    spark: SparkSession,
    start_job: Callable[..., RunningJob],
    clicks: Path,
    monkeypatch: pytest.MonkeyPatch,
    file_system: str,
) -> None:
    server: storage_jvm.StorageServer = request.getfixturevalue(file_system)
    conf = spark._jsc.hadoopConfiguration()  # type: ignore[attr-defined]
    for key, value in server.hadoop.items():
        conf.set(key, value)
    sink = ParquetSink(f"{server.uri}/clicks-{uuid.uuid4().hex[:8]}/out")
    monkeypatch.setenv("CLICKS_OUT", sink.path)
    # The containers reach the server as the test session does: Spark's own settings.
    options = [item for k, v in server.spark_conf().items() for item in ("--conf", f"{k}={v}")]
    if file_system == "s3":
        options += ["--conf", f"spark.jars={','.join(storage_jvm.s3a_jars())}"]
    job = start_job(2, None, 0, *options)
    running = wait_until(
        "two running containers",
        lambda: len(job.running_containers()) == 2 and job.running_containers(),
    )
    zombie, zombie_pid = min(running.items())
    generation = next(
        c["generation"] for c in job.job_model()["containers"] if c["containerId"] == zombie
    )
    wait_until(
        "a first batch committed", lambda: committed_by(spark, sink, zombie), APPLY_DEADLINE_S
    )

    os.kill(zombie_pid, signal.SIGSTOP)
    total = RECORDS
    try:
        produce(EmbeddedLog(clicks / "log"), total, 1000)
        total += 1000
        wait_until(
            "the paused container's tasks handed to a new generation",
            lambda: zombie not in {c["containerId"] for c in job.job_model()["containers"]},
        )
        before = committed_by(spark, sink, zombie)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(zombie_pid, signal.SIGCONT)
    wait_until("the fenced container to exit", lambda: not alive(zombie_pid), timeout=60)
    assert committed_by(spark, sink, zombie) == before
    # Its successor seals its commit log in the storage before it reads what it published.
    log = CommitLog(open_storage(sink.path, spark), f"{sink.path}/{COMMITS_DIR}")

    def sealed() -> str | None:
        end = log.entry(generation, log.sequences(generation)[-1])
        return end.sealed_by if end is not None else None

    assert "generation" in wait_until("the zombie's commits sealed", sealed)

    expected = counts_in_key_order(spark, clicks, planned=4)
    assert len(expected) == total
    wait_until(
        f"all {total} records published",
        lambda: len({(u, p, o) for u, _, p, o in rows(spark, sink)}) >= total,
        APPLY_DEADLINE_S,
    )
    # Exactly once: row for row, repeats included, what a single key-ordered pass gives.
    assert rows(spark, sink) == expected
    job.cleanup()


def test_a_job_whose_sink_cannot_be_reached_fails_saying_why_where_the_operator_looks(
    start_job: Callable[..., RunningJob], clicks: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A NameNode address where nothing listens; the client is told not to retry for long.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("CLICKS_OUT", f"hdfs://127.0.0.1:{port}/clicks/out")
    job = start_job(
        1,
        None,
        0,
        "--max-start-failures",
        "1",
        "--conf",
        "spark.hadoop.ipc.client.connect.max.retries=0",
    )
    state = wait_until(
        "the job failed", lambda: (s := job.status())["jobState"]["state"] == "failed" and s
    )["jobState"]
    assert state["why"].startswith("a container failed before its first commit: StorageError: ")
    assert f"hdfs://127.0.0.1:{port}/clicks/out: cannot reach the file system" in state["why"]
    status = run_cli("job", "status", job.url)
    assert status.returncode == 0
    assert f"why: {state['why']}" in status.stdout
