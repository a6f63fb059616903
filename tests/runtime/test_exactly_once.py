"""A transactional sink's output is exactly-once: a new owner publishes nothing already published.

A container generation runs the job's query as a container does
(``_start_query``), and dies at a point of its publish: before the files,
after the sink's commit but before Spark commits the batch, or after Spark's
commit. The next generation takes its tasks over as a container does (a
fork of the committed prefix, or a rescale to a split), claims the sink's
keys, reads what it published, and runs to the end. Spark then reads each
record's output once from the sink's committed batches; on a real Kafka broker, a ``read_committed``
consumer reads it once from the output topic, and a ``read_uncommitted`` one
also sees the transaction a dead owner left open, aborted by its successor.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import enrichment
import kafka_jvm
import pytest
from chispa import assert_df_equality
from key_counts import Count, produce
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_elastic import LOG_SOURCE_FORMAT, EmbeddedLog, Job, KafkaSink, LogInput, ParquetSink
from spark_elastic.errors import ArgumentError, StorageError
from spark_elastic.log.source import register_log_source
from spark_elastic.runtime import sinks
from spark_elastic.runtime.container import ContainerSettings
from spark_elastic.runtime.container.checkpoint import _fence_published, _prepare_checkpoint
from spark_elastic.runtime.container.generations import last_committed_batch
from spark_elastic.runtime.container.query import _start_query, covers
from spark_elastic.runtime.growth import grown_plan
from spark_elastic.runtime.lease import ContainerLease, LeaseTerms
from spark_elastic.runtime.protocol import ContainerModel
from spark_elastic.runtime.sinks import (
    AT_LEAST_ONCE,
    COMMITS_DIR,
    DATA_DIR,
    TRANSACTIONAL,
    BatchContext,
    sink_guarantee,
)
from spark_elastic.state.checkpoint_dir import batch_offsets
from spark_elastic.storage import CommitLog, LocalStorage

pytestmark = pytest.mark.slow

RECORDS = 400
PARTITIONS = {"clicks": 2}
FACTOR_2 = ("Partition 0_0_2", "Partition 0_1_2", "Partition 1_0_2", "Partition 1_1_2")
FACTOR_4 = tuple(f"Partition {p}_{b}_4" for p in range(2) for b in range(4))


class KilledError(Exception):
    """The container died here (an exception in foreachBatch leaves the batch uncommitted)."""


@dataclass(frozen=True)
class DyingSink(ParquetSink):
    """A ParquetSink whose container dies at one point of batch ``at``'s publish."""

    point: str = ""
    at: int = -1

    def write(self, batch: DataFrame, context: BatchContext) -> None:
        if context.batch_id == self.at and self.point == "before the files":
            raise KilledError(self.point)
        super().write(batch, context)
        if context.batch_id == self.at and self.point == "after the publish":
            raise KilledError(self.point)


def stateless(df: DataFrame) -> DataFrame:
    return df.selectExpr("CAST(key AS STRING) AS key", "partition", "offset")


def make_job(log: EmbeddedLog, root: Path, sink: ParquetSink | KafkaSink, stateful: bool) -> Job:
    return Job(
        "exact",
        LogInput(str(log.path), ("clicks",), max_records_per_batch=100),
        2,
        str(root / "checkpoints"),
        sink,
        processor=Count() if stateful else None,
        transform=None if stateful else stateless,
        trigger_interval="100 milliseconds",
    )


@pytest.fixture
def log(tmp_path: Path) -> EmbeddedLog:
    log = EmbeddedLog(tmp_path / "log")
    log.create_topic("clicks", 2)
    produce(log, 0, RECORDS)
    return log


def lease() -> ContainerLease:
    held = ContainerLease(LeaseTerms(lease_s=3600.0, margin_s=1.0, write_budget_s=1.0))
    held.renew(time.monotonic(), 3_600_000)
    return held


def run_generation(
    spark: SparkSession,
    job: Job,
    mine: ContainerModel,
    until: Callable[[], bool] | None = None,
    partitions: Mapping[str, int] = PARTITIONS,
    deadline_s: float = 120,
) -> None:
    """Run one container generation's query: to its death, to ``until``, or to the end."""
    plan = grown_plan(job.grouper, 4 if mine.tasks == FACTOR_4 else 2, partitions, partitions)
    starts = _prepare_checkpoint(mine, plan, job.stateful, spark, reopen=job.holds_back)
    quiet = _fence_published(job, plan, mine, spark)
    settings = ContainerSettings(mine.container_id, "http://127.0.0.1:1", "unused")
    query = _start_query(spark, job, plan, mine, lease(), settings, starts, quiet=quiet)
    try:
        if until is None:
            query.processAllAvailable()
            return
        deadline = time.monotonic() + deadline_s
        while query.isActive and not until() and time.monotonic() < deadline:
            time.sleep(0.05)
        if not until() and query.exception() is not None:
            # Its own cause, not ours: a query that died before its death (a Python worker
            # that missed Spark's 10 s to connect back is rerun by that message).
            raise query.exception()  # type: ignore[misc]
        assert until(), "the generation never reached its death"
    finally:
        query.stop()


def expected_rows(spark: SparkSession, log: EmbeddedLog, stateful: bool) -> DataFrame:
    """Each record's output once: what a single pass over the log gives."""
    if stateful:
        keys = [f"user-{i % 13}" for i in range(RECORDS)]
        rows = [(k, n) for k in sorted(set(keys)) for n in range(1, keys.count(k) + 1)]
        return spark.createDataFrame(rows, "key string, n long")
    register_log_source(spark)
    records = (
        spark.read.format(LOG_SOURCE_FORMAT)
        .option("path", str(log.path))
        .option("subscribe", "clicks")
        .load()
    )
    return stateless(records)


def assert_each_record_published_once(
    spark: SparkSession, log: EmbeddedLog, out: Path, stateful: bool
) -> None:
    """What a reader of the sink's directory gets (without the writer's columns), row for
    row, repeats included, is what a single pass over the log gives."""
    columns = ["key", "n"] if stateful else ["key", "partition", "offset"]
    assert_df_equality(
        ParquetSink(str(out)).read(spark).select(*columns),
        expected_rows(spark, log, stateful),
        ignore_row_order=True,
        ignore_nullable=True,
    )


@pytest.mark.parametrize(
    ("point", "stateful"),
    [
        pytest.param(
            point,
            stateful,
            id=f"{point}-{'stateful' if stateful else 'stateless'}",
            # `make test` runs two of the six (for the suite's time); `make test-all` all.
            marks=()
            if (point, stateful) in {("after the publish", True), ("after the commit", False)}
            else pytest.mark.long,
        )
        for point in ("before the files", "after the publish", "after the commit")
        for stateful in (True, False)
    ],
)
def test_a_new_owner_publishes_each_record_once_whatever_point_the_old_one_died_at(
    spark: SparkSession, log: EmbeddedLog, tmp_path: Path, point: str, stateful: bool
) -> None:
    out = tmp_path / "out"
    old = ContainerModel("c1", FACTOR_2, 1, str(tmp_path / "gen-1"))
    dying = make_job(log, tmp_path, DyingSink(str(out), point=point, at=2), stateful)
    if point == "after the commit":
        run_generation(spark, dying, old, lambda: last_committed_batch(old.checkpoint) >= 2)
    else:
        with pytest.raises(Exception, match=point):
            run_generation(spark, dying, old)
        assert last_committed_batch(old.checkpoint) == 1
    if point == "after the publish":
        # Published but never committed: the window an at-least-once sink replays.
        assert any("/generation=1/batch=2/" in d for d in ParquetSink(str(out)).committed())

    new = ContainerModel("c2", FACTOR_2, 2, str(tmp_path / "gen-2"), (old.checkpoint,))
    run_generation(spark, make_job(log, tmp_path, ParquetSink(str(out)), stateful), new)

    assert_each_record_published_once(spark, log, out, stateful)


@pytest.mark.long  # `make test-all`: the split's fences; `make test` runs the deaths without one
def test_a_split_of_an_owner_that_died_after_its_publish_publishes_each_record_once(
    spark: SparkSession, log: EmbeddedLog, tmp_path: Path
) -> None:
    # The old owner's progress is at factor 2, the new owner's buckets at factor 4: each
    # fence covers the two buckets that split from it.
    out = tmp_path / "out"
    old = ContainerModel("c1", FACTOR_2, 1, str(tmp_path / "gen-1"))
    with pytest.raises(Exception, match="after the publish"):
        run_generation(
            spark,
            make_job(log, tmp_path, DyingSink(str(out), point="after the publish", at=2), True),
            old,
        )
    new = ContainerModel("c2", FACTOR_4, 2, str(tmp_path / "gen-2"), (old.checkpoint,))
    run_generation(spark, make_job(log, tmp_path, ParquetSink(str(out)), True), new)

    assert_each_record_published_once(spark, log, out, stateful=True)


def test_published_is_the_newest_batch_of_each_generation_and_the_highest_per_bucket(
    spark: SparkSession, tmp_path: Path
) -> None:
    sink = ParquetSink(str(tmp_path / "out"))
    rows = spark.createDataFrame([("a", 1)], "key string, n long")
    bucket = ("clicks", 0, 1, 2)

    def write(container: str, generation: int, batch: int, offset: int) -> None:
        covered = ((bucket, offset),)
        sink.write(rows, BatchContext(batch, container, generation, lambda: None, covered))

    assert sink.published() == []
    write("c1", 1, 0, 40)
    write("c1", 1, 1, 80)
    write("c2", 2, 0, 60)  # a successor that replayed up to 60 so far
    assert sink.published() == [(bucket, 80)]
    # Files never committed (their fence closed, or the process died first) say nothing,
    # and no reader sees them.
    left = tmp_path / "out" / DATA_DIR / "container=c3" / "generation=3" / "batch=0" / "attempt-0"
    rows.write.parquet(str(left))
    assert sink.published() == [(bucket, 80)]
    assert sink.read(spark).count() == 3
    assert spark.read.parquet(str(tmp_path / "out" / DATA_DIR)).count() == 4


def test_a_commit_that_cannot_be_read_is_one_line(tmp_path: Path) -> None:
    commits = tmp_path / "out" / COMMITS_DIR / "1"
    commits.mkdir(parents=True)
    (commits / "000000000000.json").write_text("{not json")
    with pytest.raises(StorageError, match=r"_commits/1/000000000000\.json: expected a commit"):
        ParquetSink(str(tmp_path / "out")).published()


def test_the_covers_of_a_batch_are_each_task_bucket_up_to_its_end_offsets() -> None:
    plan = grown_plan("partition", 2, PARTITIONS, PARTITIONS)
    offsets = {"clicks": {"0": 17, "1": 5}}
    assert covers(plan, ("Partition 1_1_2", "Partition 0_0_2"), offsets) == (
        (("clicks", 0, 0, 2), 17),
        (("clicks", 1, 1, 2), 5),
    )
    assert covers(plan, ("Partition 1_1_2",), {"clicks": {"0": 3}}) == ()


def test_a_holding_jobs_batch_covers_what_its_tasks_released_and_nothing_of_idle_ones() -> None:
    # Task 0_0_2 holds clicks-0 from offset 9; 1_1_2 holds nothing; 0_1_2 ran no step in the
    # batch (it released nothing), so the batch says nothing of it.
    plan = grown_plan("partition", 2, PARTITIONS, PARTITIONS)
    offsets = {"clicks": {"0": 17, "1": 5}}
    held = {"Partition 0_0_2": {("clicks", 0): 9}, "Partition 1_1_2": {}}
    tasks = ("Partition 0_0_2", "Partition 0_1_2", "Partition 1_1_2")
    assert covers(plan, tasks, offsets, held) == (
        (("clicks", 0, 0, 2), 9),
        (("clicks", 1, 1, 2), 5),
    )


class Declared:
    def __init__(self, guarantee: str, published: object = None) -> None:
        self.guarantee = guarantee
        if published is not None:
            self.published = published

    def write(self, batch: DataFrame, context: BatchContext) -> None:
        raise NotImplementedError


def test_a_sink_declares_its_guarantee_and_a_transactional_one_says_what_it_published() -> None:
    assert sink_guarantee(ParquetSink("/data/out")) == TRANSACTIONAL
    assert sink_guarantee(object()) == AT_LEAST_ONCE  # nothing declared
    assert sink_guarantee(Declared("idempotent")) == "idempotent"
    assert sink_guarantee(Declared(TRANSACTIONAL, published=list)) == TRANSACTIONAL
    with pytest.raises(ArgumentError, match=r"Job\.sink\.guarantee: expected a sink guarantee"):
        sink_guarantee(Declared("exactly-twice"))
    with pytest.raises(ArgumentError, match=r"Job\.sink\.published: expected a method"):
        sink_guarantee(Declared(TRANSACTIONAL))


# -- on a real Kafka broker ------------------------------------------------------------------


class AbandonedError(BaseException):
    """Raised by a fence to leave KafkaSink.write without its abort (a kill leaves none)."""


@dataclass(frozen=True)
class DyingKafkaSink(KafkaSink):
    """A KafkaSink whose container dies at one point of batch ``at``'s publish."""

    point: str = ""
    at: int = -1

    def write(self, batch: DataFrame, context: BatchContext) -> None:
        if context.batch_id != self.at or self.point == "after the commit":
            super().write(batch, context)
            return
        if self.point == "before the transaction":
            raise KilledError(self.point)
        if self.point == "before the commit":

            def die() -> None:
                raise AbandonedError

            try:
                super().write(batch, replace(context, fence=die))
            except AbandonedError:
                # The records are on the broker in a transaction no one will end: the dead
                # process's producer is dropped as it is, transaction open.
                with sinks._PRODUCERS_LOCK:
                    sinks._PRODUCERS.clear()
                raise KilledError(self.point) from None
        super().write(batch, context)
        raise KilledError(self.point)  # after the transaction's commit


def read_to_end(bootstrap: str, topic: str, isolation: str) -> list[tuple[str, int]]:
    """``(key, n)`` of every record of ``topic`` a consumer with ``isolation`` sees, sorted."""
    rows = [json.loads(v or b"{}") for v in kafka_jvm.read_to_end(bootstrap, topic, isolation)]
    return sorted((row["key"], row["n"]) for row in rows)


@pytest.mark.parametrize(
    "point",
    [
        # `make test` runs the death between the transaction's records and its commit; the
        # others are `make test-all`'s (for the suite's time).
        pytest.param("before the transaction", marks=pytest.mark.long),
        "before the commit",
        pytest.param("after the transaction", marks=pytest.mark.long),
        pytest.param("after the commit", marks=pytest.mark.long),
    ],
)
def test_on_kafka_a_read_committed_consumer_sees_each_output_once_whatever_the_death(
    spark: SparkSession,
    log: EmbeddedLog,
    tmp_path: Path,
    kafka: kafka_jvm.KafkaBroker,
    point: str,
) -> None:
    topic = f"exact-{uuid.uuid4().hex[:8]}"
    kafka_jvm.create_topics(kafka.bootstrap, {topic: 2})
    old = ContainerModel("c1", FACTOR_2, 1, str(tmp_path / "gen-1"))
    dying = DyingKafkaSink(kafka.bootstrap, topic, key="key", point=point, at=2)
    if point == "after the commit":
        until = lambda: last_committed_batch(old.checkpoint) >= 2  # noqa: E731
        run_generation(spark, make_job(log, tmp_path, dying, True), old, until)
    else:
        with pytest.raises(Exception, match=point):
            run_generation(spark, make_job(log, tmp_path, dying, True), old)
    new = ContainerModel("c2", FACTOR_2, 2, str(tmp_path / "gen-2"), (old.checkpoint,))
    sink = KafkaSink(kafka.bootstrap, topic, key="key")
    run_generation(spark, make_job(log, tmp_path, sink, True), new)

    expected = sorted(expected_rows(spark, log, True).collect())
    committed = read_to_end(kafka.bootstrap, topic, "read_committed")
    assert committed == [tuple(row) for row in expected]
    uncommitted = read_to_end(kafka.bootstrap, topic, "read_uncommitted")
    if point == "before the commit":
        # The dead owner's batch reached the broker, and its successor (same tasks, same
        # transactional id) aborted it: only a read_uncommitted consumer sees it, twice.
        aborted = Counter(uncommitted) - Counter(committed)
        assert aborted
        assert set(aborted) <= set(committed)
        assert all(count == 1 for count in aborted.values())
    else:
        assert uncommitted == committed


HOLDING = {"clicks": 2, "profiles": 2}


def holding_job(log: EmbeddedLog, root: Path, sink: ParquetSink) -> Job:
    """The example's enrichment (a click with its user's latest profile at click time), its
    tasks holding back what they cannot yet place in time."""
    return Job(
        "held",
        LogInput(str(log.path), ("clicks", "profiles"), max_records_per_batch=7),
        2,
        str(root / "checkpoints"),
        sink,
        processor=enrichment.example_processor(),
        trigger_interval="100 milliseconds",
        max_task_idle_ms=3_600_000,
    )


def enriched_clicks(spark: SparkSession, out: Path) -> DataFrame:
    """What a reader of the sink's directory gets, without the end markers."""
    rows = ParquetSink(str(out)).read(spark).select("user", "click_offset", "partition", "profile")
    return rows.filter(~F.col("user").startswith("~end"))


@pytest.mark.parametrize(
    "tasks",
    # The split is `make test-all`'s (for the suite's time; the live split of held state is
    # also test_job_run_in_time.py's).
    [FACTOR_2, pytest.param(FACTOR_4, marks=pytest.mark.long)],
    ids=["same tasks", "split"],
)
def test_held_records_are_published_once_by_the_new_owner_of_one_that_died_holding_them(
    spark: SparkSession, tmp_path: Path, tasks: tuple[str, ...]
) -> None:
    # Issue #26 in a job: the old owner's tasks held records back (one of a task's
    # partitions behind the other in time) when it died after publishing a batch it never
    # committed. What that batch covers stops where the held records start, so its
    # successor (the same tasks, or a split of them) publishes them, and nothing twice.
    log = enrichment.new_log(tmp_path / "log")
    records = enrichment.produce(log, enrichment.seeded(), 60, 0)
    enrichment.end_every_task(log, 4)
    out = tmp_path / "out"
    old = ContainerModel("c1", FACTOR_2, 1, str(tmp_path / "gen-1"))
    dying = DyingSink(str(out), point="after the publish", at=3)
    with pytest.raises(Exception, match="after the publish"):
        run_generation(spark, holding_job(log, tmp_path, dying), old, partitions=HOLDING)
    ends = batch_offsets(old.checkpoint, 3)
    last = CommitLog(LocalStorage(), str(out / COMMITS_DIR)).last_commit(1)
    assert last is not None
    assert last.payload["batch"] == 3
    covered = last.payload["covers"]
    assert covered, "the dead owner's last batch covers nothing"
    assert any(offset < int(ends[s][str(p)]) for s, p, _, _, offset in covered), (covered, ends)

    new = ContainerModel("c2", tasks, 2, str(tmp_path / "gen-2"), (old.checkpoint,))
    clicks = enrichment.reference(records)
    ends = {t: {str(p): o for p, o in log.end_offsets(t).items()} for t in HOLDING}

    seen: dict[str, object] = {}

    def done() -> bool:
        last = last_committed_batch(new.checkpoint)
        seen.update(batch=last, read=batch_offsets(new.checkpoint, last) if last >= 0 else {})
        seen.update(published=enriched_clicks(spark, out).count())
        return seen["read"] == ends and seen["published"] == len(clicks)

    job = holding_job(log, tmp_path, ParquetSink(str(out)))
    try:
        # A batch on every trigger (processing-time mode), each one slow on a loaded machine.
        run_generation(spark, job, new, done, partitions=HOLDING, deadline_s=300)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {len(clicks)} clicks in {ends}; {seen}") from None
    assert_df_equality(
        enriched_clicks(spark, out),
        spark.createDataFrame(clicks, enrichment.ENRICHED),
        ignore_row_order=True,
        ignore_nullable=True,
    )
