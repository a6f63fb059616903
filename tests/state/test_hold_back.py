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
import random
import time
from pathlib import Path
from typing import Any

import pytest
from chispa import assert_df_equality
from enrichment import ENRICHED, example_processor
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
from spark_elastic.errors import ArgumentError

pytestmark = pytest.mark.slow

PARTITIONS = 2
START = 1_700_000_000_000
LONG = 3_600_000  # an hour: never over within a spec
EVERY = "1 second"  # the trigger of queries stopped for a rescale
Record = tuple[str, int, int, int, str, str]  # topic, partition, offset, time, user, value


def produce(log: EmbeddedLog, rng: random.Random, count: int, first: int) -> list[Record]:
    """``count`` clicks and profile updates of 8 users, 10 ms apart from ``first``; profile
    updates come in runs, so a batch often holds one topic's records only."""
    records = []
    with log.producer("clicks") as clicks, log.producer("profiles") as profiles:
        topic = "clicks"
        for i in range(first, first + count):
            if rng.random() < 0.25:
                topic = "profiles" if topic == "clicks" else "clicks"
            user, time = f"u{rng.randrange(8)}", START + 10 * i
            value = f"p{i}" if topic == "profiles" else "click"
            sent = (profiles if topic == "profiles" else clicks).send(user, value, time)
            records.append((topic, sent.partition, sent.offset, time, user, value))
    return records


def end_every_partition(log: EmbeddedLog) -> None:
    """One record at a later time than any other on every partition of both topics."""
    for topic in ("clicks", "profiles"):
        with log.producer(topic) as producer:
            for partition in range(PARTITIONS):
                producer.send("~end", "end", START + 10**9, partition=partition)


def reference(records: list[Record]) -> list[Any]:
    """One pass in time order (a user's records are all in one task, so its order is theirs)."""
    profile: dict[str, str] = {}
    rows = []
    for topic, partition, offset, _, user, value in sorted(records, key=lambda r: r[3]):
        if topic == "profiles":
            profile[user] = value
        else:
            rows.append((user, offset, partition, profile.get(user, "-")))
    return rows


def run(
    spark: SparkSession,
    log: EmbeddedLog,
    root: Path,
    batch: int | None,
    factor: int = 1,
    for_rescale: bool = False,
    **options: Any,
) -> dict[str, int]:
    """Read what the log holds, ``batch`` records per micro-batch; the summed metrics.

    ``for_rescale``: stop between batches (``rescale`` wants the last batch committed,
    and ``query.stop()`` interrupts a batch), on a trigger that leaves room between them.
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
    try:
        totals = drained(
            query, sum(sum(log.end_offsets(t).values()) for t in ("clicks", "profiles"))
        )
    finally:
        if for_rescale:
            stop_between_batches(query)
        else:
            query.stop()
    for _ in range(3):
        if not for_rescale or committed(checkpoint):
            return totals
        # Stopped inside a batch after all: run it again to its commit, and stop again.
        query = writer.start()
        stop_between_batches(query)
    raise AssertionError(f"{checkpoint}: could not stop at a batch boundary")


def committed(checkpoint: Path) -> bool:
    def last(folder: str) -> int:
        return max(
            (int(f.name) for f in (checkpoint / folder).iterdir() if f.name.isdigit()), default=-1
        )

    return last("offsets") == last("commits")


def stop_between_batches(query: StreamingQuery, deadline_s: float = 60) -> None:
    give_up = time.monotonic() + deadline_s
    while query.status["isTriggerActive"] and time.monotonic() < give_up:
        query.awaitTermination(0.05)
    query.stop()


def drained(query: StreamingQuery, records: int, deadline_s: float = 300) -> dict[str, int]:
    """Wait until a batch of ``query`` has read the ``records``-th record; summed metrics."""
    totals = {"records_enforced": 0, "records_held": 0, "batches": 0}
    seen: set[int] = set()
    give_up = time.monotonic() + deadline_s
    while time.monotonic() < give_up:
        for progress in query.recentProgress:
            if progress["batchId"] in seen:
                continue
            seen.add(progress["batchId"])
            metrics = progress["observedMetrics"].get("spark_elastic")
            if metrics is not None and progress["numInputRows"]:
                totals["batches"] += 1
                totals["records_enforced"] += metrics["records_enforced"]
                totals["records_held"] = metrics["records_held"]
            end = sum(
                int(offset)
                for source in progress["sources"]
                for partitions in json.loads(source["endOffset"] or "{}").values()
                for offset in partitions.values()
            )
            if end == records:
                return totals
        if query.exception() is not None:
            raise AssertionError(f"the query failed: {query.exception()}")
        query.awaitTermination(0.2)
    raise AssertionError(f"the query did not read {records} records in {deadline_s} s")


def enriched(spark: SparkSession, *roots: Path) -> DataFrame:
    frames = [spark.read.parquet(str(root / "out")) for root in roots]
    union = frames[0]
    for frame in frames[1:]:
        union = union.unionByName(frame)
    return union.filter(F.col("user") != "~end")


def ended_log(path: Path) -> tuple[EmbeddedLog, list[Record]]:
    """A log of 60 random records (the seed printed), each partition ended."""
    seed = random.randrange(2**32)
    print(f"seed={seed}")
    log = new_log(path)
    records = produce(log, random.Random(seed), 60, 0)
    end_every_partition(log)
    return log, records


def new_log(path: Path) -> EmbeddedLog:
    log = EmbeddedLog(path)
    for topic in ("clicks", "profiles"):
        log.create_topic(topic, PARTITIONS)
    return log


@pytest.mark.parametrize("batch", [1, 7, 100, None], ids=["1", "7", "100", "all"])
def test_the_enriched_output_is_the_same_whatever_the_batch_size(
    spark: SparkSession, tmp_path: Path, batch: int | None
) -> None:
    log, records = ended_log(tmp_path / "log")
    metrics = run(spark, log, tmp_path / "run", batch, max_task_idle_ms=LONG)
    assert_df_equality(
        enriched(spark, tmp_path / "run"),
        spark.createDataFrame(reference(records), ENRICHED),
        ignore_row_order=True,
    )
    assert metrics["records_enforced"] == 0


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


def test_held_records_survive_a_restart_a_split_and_a_merge(
    spark: SparkSession, tmp_path: Path
) -> None:
    # Each leg stops with records held (the log's last records of one topic wait for the
    # other's); the next leg starts from the checkpoint, or from one rescaled to another
    # factor, and must place them where one pass would.
    seed = random.randrange(2**32)
    print(f"seed={seed}")
    rng = random.Random(seed)
    log = new_log(tmp_path / "log")
    records = produce(log, rng, 40, 0)
    first = run(spark, log, tmp_path / "a", 7, max_task_idle_ms=LONG)
    assert first["records_held"] > 0
    records += produce(log, rng, 40, 40)
    run(spark, log, tmp_path / "a", 7, for_rescale=True, max_task_idle_ms=LONG)  # a restart
    rescale([tmp_path / "a" / "cp"], tmp_path / "b" / "cp", elasticity_factor=2)
    records += produce(log, rng, 40, 80)
    run(spark, log, tmp_path / "b", 7, factor=2, for_rescale=True, max_task_idle_ms=LONG)
    rescale([tmp_path / "b" / "cp"], tmp_path / "c" / "cp", elasticity_factor=1)
    records += produce(log, rng, 40, 120)
    end_every_partition(log)
    run(spark, log, tmp_path / "c", 7, max_task_idle_ms=LONG)
    assert_df_equality(
        enriched(spark, tmp_path / "a", tmp_path / "b", tmp_path / "c"),
        spark.createDataFrame(reference(records), ENRICHED),
        ignore_row_order=True,
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_task_idle_ms": -5}, r"max_task_idle_ms: expected a non-negative .* found -5"),
        ({"max_task_idle_ms": 1.5}, r"max_task_idle_ms: expected .* found 1.5"),
        (
            {"max_task_idle_ms": 100, "order": "offset"},
            r"max_task_idle_ms: expected 0 with order='offset'",
        ),
    ],
    ids=["negative", "not-whole", "offset-order"],
)
def test_a_bad_idle_time_is_refused_in_one_line(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ArgumentError, match=message):
        with_task_state(example_processor(), job="enrich", checkpoint_location="/tmp/x", **options)
