"""A warm-up follows its old owner's committed state while the owner's query runs (KIP-441)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery
from test_generations import Count, counts, produce

from spark_elastic import EmbeddedLog, Job, LogInput, ParquetSink, rescale
from spark_elastic.runtime.container import _rehearse
from spark_elastic.runtime.follow import follow, holder_batches, snapshot_dir, take_snapshot
from spark_elastic.runtime.generations import last_committed_batch
from spark_elastic.runtime.growth import grown_plan
from spark_elastic.runtime.protocol import ContainerModel, JobModel
from spark_elastic.state.checkpoint_dir import seed_dir

pytestmark = pytest.mark.slow

ALL = ("Partition 0_0_2", "Partition 0_1_2", "Partition 1_0_2", "Partition 1_1_2")
# A split's share: the children at factor 4 of two of the owner's four tasks.
WANTED = ("Partition 0_1_4", "Partition 0_3_4", "Partition 1_0_4", "Partition 1_2_4")


def start_owner(spark: SparkSession, log: EmbeddedLog, checkpoint: Path) -> StreamingQuery:
    """The old owner: a running query over every task, at factor 2."""
    return (
        counts(spark, log, checkpoint)
        .writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="100 milliseconds")
        .start()
    )


@pytest.fixture
def log(tmp_path: Path) -> EmbeddedLog:
    log = EmbeddedLog(tmp_path / "log")
    log.create_topic("clicks", 2)
    return log


@pytest.fixture
def owner(spark: SparkSession, log: EmbeddedLog, tmp_path: Path) -> Iterator[StreamingQuery]:
    produce(log, 0, 100)
    query = start_owner(spark, log, tmp_path / "gen-1")
    query.processAllAvailable()
    yield query
    query.stop()


def seed_rows(checkpoint: Path) -> set[tuple[object, ...]]:
    table = pq.read_table(seed_dir(checkpoint))
    return {tuple(row.values()) for row in table.to_pylist()}


def model_with_warmup(owner_checkpoint: Path, warm_checkpoint: Path) -> JobModel:
    return JobModel(
        2,
        "forks",
        2,
        {"clicks": 2},
        (ContainerModel("c1", ALL, 1, str(owner_checkpoint)),),
        warmups=(ContainerModel("w2", WANTED, 2, str(warm_checkpoint)),),
    )


def click_job(log: EmbeddedLog, root: Path) -> Job:
    """The owner's query as a container runs it (the rehearsal builds it from the job)."""
    return Job(
        "forks",
        LogInput(str(log.path), ("clicks",), max_records_per_batch=40),
        2,
        str(root / "checkpoints"),
        ParquetSink(str(root / "out")),
        processor=Count(),
    )


def test_a_warm_up_follows_a_running_owner_and_takes_the_snapshot_when_nothing_committed_since(
    spark: SparkSession,
    log: EmbeddedLog,
    tmp_path: Path,
    owner: StreamingQuery,
    capfd: pytest.CaptureFixture[str],
) -> None:
    old, new = tmp_path / "gen-1", tmp_path / "gen-2"
    model = model_with_warmup(old, new)
    warm = model.warmups[0]
    assert holder_batches(model, warm.tasks) == {str(old): last_committed_batch(old)}

    first = follow(spark, model, warm, 4)
    assert first is not None
    assert owner.isActive  # the snapshot was made while the owner's query ran
    assert first.sources == {str(old): last_committed_batch(old)}
    assert follow(spark, model, warm, 4) is None  # the owner committed nothing since

    produce(log, 100, 60)
    owner.processAllAvailable()
    newer = follow(spark, model, warm, 4)
    assert newer is not None
    assert newer.sources[str(old)] > first.sources[str(old)]

    # The warm-up rehearses the new owner's first micro-batch on a throwaway copy.
    files = sorted(p.relative_to(newer.path) for p in newer.path.rglob("*"))
    _rehearse(
        spark,
        click_job(log, tmp_path),
        grown_plan("partition", 4, *[{"clicks": 2}] * 2),
        warm,
        newer.path,
    )
    assert "rehearsed a first micro-batch" in capfd.readouterr().err
    assert sorted(p.relative_to(newer.path) for p in newer.path.rglob("*")) == files
    assert not (tmp_path / "out").exists()  # the job's sink saw nothing
    assert not list(tmp_path.glob(".rehearsal.*"))

    # The handover: the owner stops at a batch boundary without committing again.
    owner.stop()
    direct = rescale(old, tmp_path / "direct", 4, spark, tasks=WANTED)
    taken = take_snapshot(new, [str(old)])
    assert taken is not None
    assert taken.keys == direct.keys > 0
    assert seed_rows(new) == seed_rows(tmp_path / "direct")
    assert not snapshot_dir(new).exists()


def test_a_snapshot_the_owner_committed_past_is_dropped_at_the_handover(
    spark: SparkSession, log: EmbeddedLog, tmp_path: Path, owner: StreamingQuery
) -> None:
    old, new = tmp_path / "gen-1", tmp_path / "gen-2"
    model = model_with_warmup(old, new)
    assert follow(spark, model, model.warmups[0], 4) is not None
    produce(log, 100, 10)
    owner.processAllAvailable()  # one more commit after the snapshot, then the stop
    owner.stop()
    assert take_snapshot(new, [str(old)]) is None
    assert not new.exists()
    assert not snapshot_dir(new).exists()


def test_a_warm_up_has_nothing_to_follow_before_its_owners_first_commit(
    spark: SparkSession, tmp_path: Path
) -> None:
    model = model_with_warmup(tmp_path / "never-ran", tmp_path / "gen-2")
    assert holder_batches(model, WANTED) is None
    assert follow(spark, model, model.warmups[0], 4) is None
    assert not snapshot_dir(tmp_path / "gen-2").exists()
