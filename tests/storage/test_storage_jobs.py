"""A running job publishes its output on HDFS and on S3, exactly once through a failover.

The click-count job runs under ``spark-elastic job run`` (a coordinator and two
containers, real Spark) with its :class:`ParquetSink` on a real HDFS and on a
real S3 server, its checkpoints on the local disk. One container is
paused past its lease (``SIGSTOP``: a zombie) while records arrive; its
successor claims its keys, sealing its commit log, before it reads what the
sink published. Woken, the zombie publishes nothing more, and Spark reads
each record's running count once from the sink's committed batches. The same
job with its checkpoints there too (nothing of it on the local disk) forks
the zombie's checkpoint there, and a scale's new owner warms up from
snapshots it copies there; still each record once. A sink
whose file system cannot be reached fails the job in one line that says so,
in `job status`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_runner import run_cli
from jobs import (
    APPLY_DEADLINE_S,
    CHANGE_DEADLINE_S,
    RECORDS,
    RunningJob,
    counts_in_key_order,
    job_files,
    produce,
    wait_until,
)
from pyspark.sql import SparkSession
from standins import alive

from spark_elastic import EmbeddedLog, ParquetSink
from spark_elastic.runtime.container.follow import scratch_for
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


def sealer(spark: SparkSession, sink: ParquetSink, generation: int) -> Callable[[], str | None]:
    """Who sealed ``generation``'s commit log in the sink's storage (None: not sealed yet)."""
    log = CommitLog(open_storage(sink.path, spark), f"{sink.path}/{COMMITS_DIR}")

    def sealed() -> str | None:
        end = log.entry(generation, log.sequences(generation)[-1])
        return end.sealed_by if end is not None else None

    return sealed


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


@pytest.mark.parametrize(
    ("file_system", "checkpoints_there"),
    [
        ("hdfs", True),
        # On S3 `make test` runs test_hosts.py's story instead (its checkpoints and output
        # there, a zombie and a partitioned container fenced by their successors' seals);
        # this one, with a scale's warm-ups copying snapshots there, is `make test-all`'s.
        pytest.param("s3", True, marks=pytest.mark.long),
        # Output alone there, checkpoints on the local disk: `make test-all`.
        pytest.param("hdfs", False, marks=pytest.mark.long),
        pytest.param("s3", False, marks=pytest.mark.long),
        # A real object store, opt-in (SPARK_ELASTIC_CLOUD; skipped without it).
        pytest.param("cloud", True, marks=pytest.mark.long),
    ],
)
def test_a_job_on_a_remote_file_system_publishes_once_through_a_zombie_and_a_scale(
    request: pytest.FixtureRequest,
    spark: SparkSession,
    start_job: Callable[..., RunningJob],
    clicks: Path,
    monkeypatch: pytest.MonkeyPatch,
    file_system: str,
    checkpoints_there: bool,
) -> None:
    # With its checkpoints there too, a paused container's successor forks its checkpoint
    # there, and (on S3) a scale's new owners warm up from snapshots they copy there.
    # The containers reach the server as the test session does: Spark's own settings.
    files = job_files(request, spark, monkeypatch, file_system, checkpoints_there)
    assert files.base is not None
    base = files.base
    sink = ParquetSink(f"{base}/out")
    job = start_job(2, None, 0, *files.options)
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
    storage = open_storage(base, spark)
    if checkpoints_there:
        assert storage.list(f"{base}/checkpoints/generations"), "the checkpoints are there"
        assert not (clicks / "checkpoints").exists(), "and nothing of them on the local disk"

    log = EmbeddedLog(clicks / "log")
    os.kill(zombie_pid, signal.SIGSTOP)
    total = RECORDS
    try:
        produce(log, total, 1000)
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
    # Its successor sealed its commit log in the storage before it read what it published.
    sealed_by = wait_until("the zombie's commits sealed", sealer(spark, sink, generation))
    assert "generation" in sealed_by

    if checkpoints_there and file_system != "hdfs":
        # A scale's warm-ups on S3, the file system without renames; HDFS forks above, and
        # `make test` keeps within its 15 minutes.
        wait_until("the job settled", job.settled_model, CHANGE_DEADLINE_S)
        # The coordinator takes a change once every container runs (it says so until then).
        wait_until(
            "the scale to 3 containers taken",
            lambda: run_cli("job", "scale", job.url, "--containers", "3").returncode == 0,
            CHANGE_DEADLINE_S,
        )
        produce(log, total, 1000)
        total += 1000
        wait_until(
            "3 containers",
            lambda: (m := job.settled_model()) and len(m["containers"]) == 3,
            CHANGE_DEADLINE_S,
        )

    expected = counts_in_key_order(spark, clicks, planned=4)
    assert len(expected) == total
    wait_until(
        f"all {total} records published",
        lambda: len({(u, p, o) for u, _, p, o in rows(spark, sink)}) >= total,
        APPLY_DEADLINE_S,
    )
    # Exactly once: row for row, repeats included, what a single key-ordered pass gives.
    assert rows(spark, sink) == expected
    owners = [c["checkpoint"] for c in job.job_model()["containers"]]
    warmed = [c for c in owners if scratch_for(c).exists()]
    job.cleanup()
    if checkpoints_there and file_system != "hdfs":
        # The scale's new owners read their gates on their host; stopped, they leave nothing.
        assert warmed, "the replaying warm-ups' gates were on this host"
        assert [c for c in owners if scratch_for(c).exists()] == []
    storage.delete(base)
