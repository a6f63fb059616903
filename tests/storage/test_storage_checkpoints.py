"""A stateful query checkpoints on HDFS and on S3 as it does on the local disk.

``with_task_state(checkpoint_location="hdfs://..." or "s3a://...")``: Spark
keeps its offsets, commits and RocksDB state there, and the library its
``_spark_elastic/`` files (the job, the owner object) through the same
Hadoop file system, reached from the driver with the session's settings. A
query stopped and started again resumes from what it committed there: each
record counted once. Nothing goes to a local directory named after the URI.
A fork there (what a new owner of a container's tasks starts from) copies
the committed prefix and resumes where its source committed; ``rescale`` and
``checkpoint show`` take the same URIs.
"""

from __future__ import annotations

import json
import os
import random
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import storage_jvm
from cli_runner import run_cli
from pyspark.sql import SparkSession
from stateful_job import TOPIC, Job, run_to_end

from spark_elastic import read_checkpoint, rescale
from spark_elastic.errors import CheckpointError
from spark_elastic.runtime.container.generations import fork_committed, is_forked
from spark_elastic.state.checkpoint_dir import last_batch, read_job
from spark_elastic.state.query_settings import (
    CHANGELOG_KEY,
    CHECKPOINT_MANAGER_KEY,
    S3A_MANAGER,
)
from spark_elastic.storage import Storage, open_storage

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Remote:
    """A fresh directory on one remote file system, its storage, and a job on the embedded log."""

    base: str
    storage: Storage
    job: Job
    server: storage_jvm.StorageServer
    file_system: str


# A real object store too, opt-in (SPARK_ELASTIC_CLOUD; skipped without it), in `make test-all`.
@pytest.fixture(params=["hdfs", "s3", pytest.param("cloud", marks=pytest.mark.long)])
def remote(request: pytest.FixtureRequest, spark: SparkSession, tmp_path: Path) -> Remote:
    seed = random.randrange(2**32)
    print(f"seed={seed}")
    server: storage_jvm.StorageServer = request.getfixturevalue(request.param)
    server.reach_from(spark)
    base = f"{server.uri}/checkpoints-{uuid.uuid4().hex[:12]}"
    job = Job(spark, tmp_path / "job", random.Random(seed))
    return Remote(base, open_storage(base, spark), job, server, request.param)


def _wait_for(condition: object, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)


def _counted_once(job: Job, records: int) -> None:
    """Every record's running count is in the output exactly once, in offset order per key."""
    rows = sorted(job.output().collect(), key=lambda r: (r["key"], r["count"]))
    assert len(rows) == records
    by_key: dict[str, list[tuple[int, int]]] = {}
    for row in rows:
        by_key.setdefault(row["key"], []).append((row["count"], row["offset"]))
    for key, seen in by_key.items():
        assert [c for c, _ in seen] == list(range(1, len(seen) + 1)), key
        assert [o for _, o in seen] == sorted(o for _, o in seen), key


def test_a_stateful_query_checkpoints_on_a_remote_file_system_and_resumes_exactly(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, remote: Remote
) -> None:
    monkeypatch.chdir(tmp_path)
    base, storage, job = remote.base, remote.storage, remote.job
    checkpoint = f"{base}/cp"
    options = {"elasticity_factor": 2, "partitions": job.log.partition_counts([TOPIC])}

    job.produce(150)
    run_to_end(job, checkpoint, tmp_path / "out", **options)
    assert read_job(checkpoint) is not None
    assert read_job(checkpoint).elasticity_factor == 2  # type: ignore[union-attr]
    assert storage.list(storage.join(checkpoint, "commits")), "Spark committed there"
    state = [name for name, _ in storage.files(storage.join(checkpoint, "state"))]
    assert any(name.endswith(".changelog") for name in state), "its state is there too"

    # A running query holds the owner object, naming this driver; it is gone once it ends.
    job.produce(100)
    owner = storage.join(checkpoint, "_spark_elastic", "owner.json")
    query = job.start(
        checkpoint,  # type: ignore[arg-type]
        2,
        None,
        "",
        tmp_path / "out",
        10_000,
        available_now=False,
        interval="200 milliseconds",
    )
    try:
        query.processAllAvailable()
        # Spark's own FileContext manager on HDFS (its rename is atomic at the NameNode); on
        # S3 the project's, whose no-overwrite create is a conditional put.
        session = query._jsq.streamingQuery().sparkSessionForStream()  # type: ignore[attr-defined]
        if remote.file_system == "hdfs":
            assert not session.conf().contains(CHECKPOINT_MANAGER_KEY)
        else:
            assert session.conf().get(CHECKPOINT_MANAGER_KEY) == S3A_MANAGER
        # And RocksDB's changelog checkpointing: a batch uploads its changes, not a snapshot.
        assert session.conf().get(CHANGELOG_KEY) == "true"
        held = storage.read(owner)
        assert held is not None
        assert json.loads(held)["pid"] == os.getpid()
    finally:
        query.stop()
    _wait_for(lambda: not storage.exists(owner), "the owner object to be deleted")

    job.produce(50)
    run_to_end(job, checkpoint, tmp_path / "out", **options)
    _counted_once(job, 300)
    assert sorted(os.listdir(tmp_path)) == ["job", "out"], "nothing written anywhere else"
    storage.delete(base)


def _manager(spark: SparkSession, root: str) -> object:
    jvm = spark._jvm  # type: ignore[attr-defined]
    conf = spark._jsc.hadoopConfiguration()  # type: ignore[attr-defined]
    return jvm.__getattr__(S3A_MANAGER)(jvm.org.apache.hadoop.fs.Path(root), conf)


def _write(manager: object, path: object, data: bytes, overwrite: bool) -> object:
    stream = manager.createAtomic(path, overwrite)  # type: ignore[attr-defined]
    stream.write(bytearray(data))
    return stream


def test_on_s3_two_drivers_writing_one_batch_file_cannot_both_publish(
    spark: SparkSession, s3: storage_jvm.StorageServer
) -> None:
    """Spark's offsets and commit logs create each batch's file without overwrite.

    On S3 that create is a conditional put: when a zombie driver and its
    successor both write batch 7's file, whichever completes second fails and
    the first one's bytes stay; a cancelled write leaves nothing; a create
    that may overwrite (RocksDB's files) replaces in place.
    """
    from py4j.protocol import Py4JJavaError

    s3.reach_from(spark)
    base = f"{s3.uri}/manager-{uuid.uuid4().hex[:12]}"
    storage = open_storage(base, spark)
    manager = _manager(spark, base)
    path = spark._jvm.org.apache.hadoop.fs.Path(f"{base}/offsets/7")  # type: ignore[attr-defined]

    # Both open before either completes: an existence check would pass for both.
    zombie = _write(manager, path, b"zombie's batch 7", overwrite=False)
    successor = _write(manager, path, b"successor's batch 7", overwrite=False)
    successor.close()  # type: ignore[attr-defined]
    with pytest.raises(Py4JJavaError) as lost:
        zombie.close()  # type: ignore[attr-defined]
    assert "FileAlreadyExists" in str(lost.value) or "412" in str(lost.value)
    assert storage.read(f"{base}/offsets/7") == b"successor's batch 7"
    with pytest.raises(Py4JJavaError):
        _write(manager, path, b"late", overwrite=False).close()  # type: ignore[attr-defined]
    assert storage.read(f"{base}/offsets/7") == b"successor's batch 7"

    cancelled = _write(
        manager, spark._jvm.org.apache.hadoop.fs.Path(f"{base}/offsets/8"), b"x", False
    )  # type: ignore[attr-defined]
    cancelled.cancel()  # type: ignore[attr-defined]
    assert not storage.exists(f"{base}/offsets/8")

    _write(manager, path, b"replaced", overwrite=True).close()  # type: ignore[attr-defined]
    assert storage.read(f"{base}/offsets/7") == b"replaced"
    assert storage.list(f"{base}/offsets") == ["7"], "no temporary file left beside it"
    storage.delete(base)


def test_a_query_checkpointing_on_s3_without_the_projects_manager_is_refused(
    spark: SparkSession,
    s3: storage_jvm.StorageServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import spark_elastic.state.query_settings as query_settings

    s3.reach_from(spark)
    base = f"{s3.uri}/no-manager-{uuid.uuid4().hex[:12]}"
    job = Job(spark, tmp_path / "job", random.Random(0))
    job.produce(10)
    absent = "io.github.sparkelastic.s3a.Absent"
    monkeypatch.setattr(query_settings, "S3A_MANAGER", absent)
    partitions = job.log.partition_counts([TOPIC])
    with pytest.raises(CheckpointError) as refused:
        run_to_end(job, f"{base}/cp", tmp_path / "out", elasticity_factor=2, partitions=partitions)
    message = str(refused.value)
    assert "\n" not in message
    assert f"{base}/cp" in message
    assert absent in message
    assert "make jars" in message
    assert not open_storage(base, spark).exists(f"{base}/cp/offsets"), "Spark never started"


# `make test-all`: `make test`'s story in test_storage_jobs.py forks on each file system.
@pytest.mark.long
def test_a_fork_on_a_remote_file_system_resumes_where_its_source_committed(
    tmp_path: Path, remote: Remote
) -> None:
    base, storage, job = remote.base, remote.storage, remote.job
    source, fork = f"{base}/g1", f"{base}/g2"
    options = {"elasticity_factor": 2, "partitions": job.log.partition_counts([TOPIC])}
    job.produce(120)
    run_to_end(job, source, tmp_path / "out-g1", **options)
    committed = last_batch(source)
    assert committed is not None
    assert committed.committed

    # A fork that died half-way left files but no marker: it is made again, whole.
    storage.put(storage.join(fork, "state", "0", "0", "1.zip"), b"half a fork")
    assert not is_forked(fork)
    result = fork_committed(source, fork)
    assert is_forked(fork)
    assert result.last_committed == committed.batch_id
    assert result.files > 0
    assert result.bytes > 0
    assert storage.read(storage.join(fork, "state", "0", "0", "1.zip")) != b"half a fork"
    assert not storage.exists(storage.join(fork, "_spark_elastic", "owner.json"))
    with pytest.raises(CheckpointError, match="exists already"):
        fork_committed(source, fork)

    job.produce(80)
    # Spark's file sink logs batches by id beside its data, and the fork goes on with the
    # source's ids: it writes where the source did (the source runs no more).
    run_to_end(job, fork, tmp_path / "out-g1", **options)
    _counted_once(job, 200)
    assert last_batch(source) == committed, "the source is as it was"
    storage.delete(base)


# The CLI's two Spark applications on HDFS are the long half (`make test-all`).
@pytest.mark.parametrize(
    "remote", [pytest.param("hdfs", marks=pytest.mark.long), "s3"], indirect=True
)
def test_rescale_and_show_take_remote_checkpoints(
    spark: SparkSession, tmp_path: Path, remote: Remote
) -> None:
    base, storage, job = remote.base, remote.storage, remote.job
    source, split = f"{base}/f2", f"{base}/f4"
    counts = job.log.partition_counts([TOPIC])
    job.produce(150)
    run_to_end(job, source, tmp_path / "out-f2", elasticity_factor=2, partitions=counts)
    if remote.file_system == "hdfs":
        # As an operator runs them: each command's own Spark, told how to reach HDFS.
        conf = [a for k, v in remote.server.spark_conf().items() for a in ("--conf", f"{k}={v}")]
        shown = run_cli("checkpoint", "show", source, "--json", *conf, timeout=300)
        assert shown.returncode == 0, shown.stderr[-2000:]
        assert json.loads(shown.stdout)["job"]["name"] == "running-count"
        done = run_cli(
            "rescale",
            "--from",
            source,
            "--to",
            split,
            "--elasticity-factor",
            "4",
            *conf,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-2000:]
    else:
        assert read_checkpoint(source, spark).committed
        assert rescale(source, split, 4, spark).target == split
    assert read_job(split).elasticity_factor == 4  # type: ignore[union-attr]

    # A rescale that died before its job file: the seed alone is refused, not run empty.
    half = f"{base}/half"
    storage.put(storage.join(half, "_spark_elastic", "seed", "part-0.parquet"), b"")
    with pytest.raises(CheckpointError, match="did not finish"):
        run_to_end(job, half, tmp_path / "out-half", elasticity_factor=4, partitions=counts)

    job.produce(100)
    run_to_end(job, split, tmp_path / "out-f4", elasticity_factor=4, partitions=counts)
    _counted_once(job, 250)
    storage.delete(base)
