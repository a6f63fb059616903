"""Specification: a task holds back what it cannot yet place in time (``max.task.idle.ms``).

Issue #26: a click enriched with its user's latest profile at click time
must not depend on how records fell into micro-batches. With
``max_task_idle_ms`` long enough, a task keeps the records it cannot yet
place (another of its partitions has nothing buffered) in its state, so
the enriched output equals a single-threaded pass in time order whatever
the batch size; with 0 (Kafka Streams' default) each batch is merged on its
own, and every record processed without waiting is counted
(``records_enforced``). The processor is the example job's
(``examples/jobs/enriched_clicks.py``). Each partition ends with a record at
a later time than any other (user ``~end``), so nothing real is left held.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from chispa import assert_df_equality
from enrichment import (
    ENRICHED,
    PARTITIONS,
    START,
    Record,
    end_every_partition,
    example_processor,
    new_log,
    produce,
    reference,
    seeded,
)
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from spark_elastic import (
    LOG_SOURCE_FORMAT,
    EmbeddedLog,
    register_log_source,
    rescale,
    with_task_state,
)
from spark_elastic.errors import ArgumentError, ArgumentTypeError

pytestmark = pytest.mark.slow

LONG = 3_600_000  # an hour: never over within a spec
# The trigger of queries stopped for a rescale: room between batches even on a loaded
# machine (at 1 s, a fresh-clone run's batches took longer, and no stop found a gap).
EVERY = "5 seconds"


def run(
    spark: SparkSession,
    log: EmbeddedLog,
    root: Path,
    batch: int | None,
    factor: int = 1,
    for_rescale: bool = False,
    rows: int | None = None,
    **options: Any,
) -> dict[str, int]:
    """Read what the log holds, ``batch`` records per micro-batch; the summed metrics.

    ``for_rescale``: stop between batches (``rescale`` wants the last batch committed,
    and ``query.stop()`` interrupts a batch), on a trigger that leaves room between them.
    ``rows``: also wait until the output holds that many rows (records held until the
    driver says the bootstrap streams are read come out in a later batch).
    """
    register_log_source(spark)
    checkpoint, output = root / "cp", root / "out"
    reader = (
        spark.readStream.format(LOG_SOURCE_FORMAT)
        .option("path", str(log.path))
        .option("subscribe", "clicks,profiles")
        .option("startingOffsets", "earliest")
    )
    if batch is not None:
        reader = reader.option("maxOffsetsPerTrigger", batch)
    out = reader.load().transform(
        with_task_state(
            example_processor(),
            job="enrich",
            checkpoint_location=checkpoint,
            elasticity_factor=factor,
            partitions={"clicks": PARTITIONS, "profiles": PARTITIONS},
            order="timestamp",
            **options,
        )
    )
    # A query that holds back runs a micro-batch on every trigger (its timers fire in them),
    # so it never finishes under availableNow and processAllAvailable() never returns: it is
    # drained instead, until a batch has read the log's last record.
    writer = (
        out.writeStream.format("parquet")
        .option("path", str(output))
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime=EVERY if for_rescale else "0 seconds")
    )
    query = writer.start()
    totals = Totals(query)
    try:
        drained(totals, sum(sum(log.end_offsets(t).values()) for t in ("clicks", "profiles")))
        if rows is not None:
            written(spark, totals, output, rows)
    finally:
        if for_rescale:
            stop_between_batches(query)
        else:
            query.stop()
    for _ in range(3):
        if not for_rescale or committed(checkpoint):
            return totals.sums
        # Stopped inside a batch after all: run it again to its commit, and stop again.
        query = writer.start()
        stop_between_batches(query)
    raise AssertionError(f"{checkpoint}: could not stop at a batch boundary")


def written(
    spark: SparkSession, totals: Totals, output: Path, rows: int, deadline_s: float = 120
) -> None:
    """Wait until the query's output holds ``rows`` rows."""
    give_up = time.monotonic() + deadline_s
    while time.monotonic() < give_up:
        totals.new_progress()
        metadata = output / "_spark_metadata"
        if metadata.is_dir() and spark.read.parquet(str(output)).count() >= rows:
            # The batch that wrote them reports after its commit: wait for one more report.
            while not totals.new_progress() and time.monotonic() < give_up:
                totals.query.awaitTermination(0.2)
            return
        totals.query.awaitTermination(0.5)
    raise AssertionError(f"{output}: fewer than {rows} rows after {deadline_s} s")


def committed(checkpoint: Path) -> bool:
    def last(folder: str) -> int:
        return max(
            (int(f.name) for f in (checkpoint / folder).iterdir() if f.name.isdigit()), default=-1
        )

    return last("offsets") == last("commits")


def stop_between_batches(query: StreamingQuery, deadline_s: float = 120) -> None:
    give_up = time.monotonic() + deadline_s
    while query.status["isTriggerActive"] and time.monotonic() < give_up:
        query.awaitTermination(0.05)
    query.stop()


class Totals:
    """A query's spark-elastic metrics, summed over its batches seen so far (with or without
    input: a timer's release comes in a batch without)."""

    def __init__(self, query: StreamingQuery) -> None:
        self.query = query
        self.seen: set[int] = set()
        self.sums = {"records_enforced": 0, "records_held": 0, "batches": 0}

    def new_progress(self) -> list[dict[str, Any]]:
        fresh = [p for p in self.query.recentProgress if p["batchId"] not in self.seen]
        for progress in fresh:
            self.seen.add(progress["batchId"])
            metrics = progress["observedMetrics"].get("spark_elastic")
            if metrics is None:
                continue
            self.sums["records_enforced"] += metrics["records_enforced"]
            if progress["numInputRows"]:
                self.sums["batches"] += 1
                self.sums["records_held"] = metrics["records_held"]
        if self.query.exception() is not None:
            raise AssertionError(f"the query failed: {self.query.exception()}")
        return fresh


def drained(totals: Totals, records: int, deadline_s: float = 300) -> None:
    """Wait until a batch of the query has read the ``records``-th record."""
    give_up = time.monotonic() + deadline_s
    while time.monotonic() < give_up:
        for progress in totals.new_progress():
            end = sum(
                int(offset)
                for source in progress["sources"]
                for partitions in json.loads(source["endOffset"] or "{}").values()
                for offset in partitions.values()
            )
            if end == records:
                return
        totals.query.awaitTermination(0.2)
    raise AssertionError(f"the query did not read {records} records in {deadline_s} s")


def enriched(spark: SparkSession, *roots: Path) -> DataFrame:
    frames = [spark.read.parquet(str(root / "out")) for root in roots]
    union = frames[0]
    for frame in frames[1:]:
        union = union.unionByName(frame)
    return union.filter(F.col("user") != "~end")


def ended_log(path: Path, count: int = 60) -> tuple[EmbeddedLog, list[Record]]:
    """A log of ``count`` random records (the seed printed), each partition ended."""
    rng = seeded()
    log = new_log(path)
    records = produce(log, rng, count, 0)
    end_every_partition(log)
    return log, records


@pytest.mark.parametrize(
    "batch",
    # `make test` reads it all at once; one record at a time and the others are `make test-all`'s.
    [pytest.param(b, marks=pytest.mark.long) for b in (1, 7, 100)] + [None],
    ids=["1", "7", "100", "all"],
)
def test_the_enriched_output_is_the_same_whatever_the_batch_size(
    spark: SparkSession, tmp_path: Path, batch: int | None
) -> None:
    # A micro-batch costs about 2 s here (state commits, Python state calls): at one record
    # per batch, 30 records are as many holds and releases in a minute.
    log, records = ended_log(tmp_path / "log", 30 if batch == 1 else 60)
    metrics = run(spark, log, tmp_path / "run", batch, max_task_idle_ms=LONG)
    assert_df_equality(
        enriched(spark, tmp_path / "run"),
        spark.createDataFrame(reference(records), ENRICHED),
        ignore_row_order=True,
    )
    assert metrics["records_enforced"] == 0


# `make test-all`; `make test` runs the held records' failover in test_exactly_once.py
@pytest.mark.long
def test_without_waiting_what_differs_is_what_the_metric_counted(
    spark: SparkSession, tmp_path: Path
) -> None:
    log, records = ended_log(tmp_path / "log")
    metrics = run(spark, log, tmp_path / "run", 7)
    got = {tuple(r) for r in enriched(spark, tmp_path / "run").collect()}
    expected = set(reference(records))
    assert len(got) == len(expected)
    assert metrics["records_enforced"] > 0
    assert len(got - expected) <= metrics["records_enforced"]


# `make test-all`; `make test` runs the held records' failover in test_exactly_once.py
@pytest.mark.long
def test_held_records_survive_a_restart_a_split_and_a_merge(
    spark: SparkSession, tmp_path: Path
) -> None:
    # Each leg stops with records held (the log's last records of one topic wait for the
    # other's); the next leg starts from the checkpoint, or from one rescaled to another
    # factor, and must place them where one pass would.
    rng = seeded()
    log = new_log(tmp_path / "log")
    records = produce(log, rng, 40, 0)
    first = run(spark, log, tmp_path / "a", 7, max_task_idle_ms=LONG)
    assert first["records_held"] > 0
    records += produce(log, rng, 40, 40)
    # The legs stopped for a rescale run a batch per trigger (5 s), so they read 20 records
    # a batch: each ends, all the same, with the last records of one topic held.
    restarted = run(spark, log, tmp_path / "a", 20, for_rescale=True, max_task_idle_ms=LONG)
    assert restarted["records_held"] > 0
    rescale([tmp_path / "a" / "cp"], tmp_path / "b" / "cp", elasticity_factor=2)
    records += produce(log, rng, 40, 80)
    split = run(spark, log, tmp_path / "b", 20, factor=2, for_rescale=True, max_task_idle_ms=LONG)
    assert split["records_held"] > 0
    rescale([tmp_path / "b" / "cp"], tmp_path / "c" / "cp", elasticity_factor=1)
    records += produce(log, rng, 40, 120)
    end_every_partition(log)
    run(spark, log, tmp_path / "c", 7, max_task_idle_ms=LONG)
    assert_df_equality(
        enriched(spark, tmp_path / "a", tmp_path / "b", tmp_path / "c"),
        spark.createDataFrame(reference(records), ENRICHED),
        ignore_row_order=True,
    )


def test_when_the_wait_is_over_a_timer_releases_what_is_held_without_new_records(
    spark: SparkSession, tmp_path: Path
) -> None:
    # No end markers: each task's last records wait for a partition that delivers nothing
    # more, until the wait (1 s) is over and the task's timer releases them, counted.
    rng = seeded()
    log = new_log(tmp_path / "log")
    records = produce(log, rng, 60, 0)
    clicks = reference(records)
    metrics = run(spark, log, tmp_path / "run", None, rows=len(clicks), max_task_idle_ms=1_000)
    got = {tuple(r) for r in enriched(spark, tmp_path / "run").collect()}
    assert len(got) == len(clicks)
    # The batch that read the records held some; the timer released them, counted.
    assert metrics["records_held"] > 0
    assert metrics["records_enforced"] == metrics["records_held"]


def test_a_bootstrap_stream_is_read_to_its_end_before_any_other_record(
    spark: SparkSession, tmp_path: Path
) -> None:
    # Every profile update is in the log before the query starts but stamped later than
    # every click: in time order alone each click would come first and find no profile.
    # Read first as a bootstrap stream, the profiles are all applied before any click.
    rng = seeded()
    log = new_log(tmp_path / "log")
    latest: dict[str, str] = {}
    with log.producer("profiles") as profiles:
        for i in range(30):
            user = f"u{rng.randrange(8)}"
            profiles.send(user, f"p{i}", START + 10**6 + i)
            latest[user] = f"p{i}"
    expected = []
    with log.producer("clicks") as clicks:
        for i in range(30):
            user = f"u{rng.randrange(8)}"
            sent = clicks.send(user, "click", START + i)
            expected.append((user, sent.offset, sent.partition, latest.get(user, "-")))
    run(spark, log, tmp_path / "run", 7, rows=len(expected), bootstrap=["profiles"])
    assert_df_equality(
        enriched(spark, tmp_path / "run"),
        spark.createDataFrame(expected, ENRICHED),
        ignore_row_order=True,
    )


def test_a_bootstrap_stream_must_be_another_input_of_the_job(spark: SparkSession) -> None:
    rows = spark.createDataFrame(
        [(b"k", b"v", "clicks", 0, 0, 0)],
        "key binary, value binary, topic string, partition int, offset bigint, timestamp bigint",
    )
    for streams, message in (
        (["nope"], r"bootstrap: expected input streams of the job .* found \['nope'\]"),
        (["clicks", "profiles"], r"bootstrap: expected some but not all input streams"),
    ):
        transform = with_task_state(
            example_processor(),
            job="enrich",
            checkpoint_location="/nonexistent/cp",
            elasticity_factor=1,
            partitions={"clicks": 1, "profiles": 1},
            bootstrap=streams,
        )
        with pytest.raises(ArgumentError, match=message):
            rows.transform(transform)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_task_idle_ms": -5}, r"max_task_idle_ms: expected a non-negative .* found -5"),
        ({"max_task_idle_ms": 1.5}, r"max_task_idle_ms: expected .* found 1.5"),
        (
            {"max_task_idle_ms": 100, "order": "offset"},
            r"max_task_idle_ms: expected 0 with order='offset'",
        ),
        ({"bootstrap": "profiles"}, r"bootstrap: expected a sequence of input stream names"),
        (
            {"bootstrap": ["profiles"], "order": "offset"},
            r"bootstrap: expected no streams with order='offset'",
        ),
    ],
    ids=["negative", "not-whole", "offset-order", "bootstrap-string", "bootstrap-offset-order"],
)
def test_a_bad_idle_time_or_bootstrap_is_refused_in_one_line(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises((ArgumentError, ArgumentTypeError), match=message):
        with_task_state(example_processor(), job="enrich", checkpoint_location="/tmp/x", **options)
