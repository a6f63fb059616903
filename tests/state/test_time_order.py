"""Specification: a stateful task reading co-grouped streams sees their records in time order.

A click enriched with its user's latest profile update at click time is the
join of issue #26: the answer is right only if each task applies its two
streams' records merged by timestamp (Kafka Streams' ``PartitionGroup``).
The processor is the example job's (``examples/jobs/enriched_clicks.py``);
the reference is a single-threaded pass over every record sorted by time.
These runs read the whole log in one micro-batch: across batches a task
does not hold records back yet (``max.task.idle.ms`` 0, the default there).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from chispa import assert_df_equality
from enrichment import ENRICHED, example_processor
from pyspark.sql import DataFrame, SparkSession

from spark_elastic import (
    LOG_SOURCE_FORMAT,
    EmbeddedLog,
    register_log_source,
    with_task_state,
)
from spark_elastic.errors import ArgumentError, ColumnError
from spark_elastic.state.checkpoint_dir import write_fences

pytestmark = pytest.mark.slow

PARTITIONS = 2
Record = tuple[str, int, int, int, str, str]  # topic, partition, offset, time, user, value


def produce(log: EmbeddedLog, seed: int) -> list[Record]:
    """Clicks and profile updates of 12 users, interleaved in time, 10 ms apart."""
    rng = random.Random(seed)
    for topic in ("clicks", "profiles"):
        log.create_topic(topic, PARTITIONS)
    records = []
    with log.producer("clicks") as clicks, log.producer("profiles") as profiles:
        for i in range(400):
            topic = "profiles" if rng.random() < 0.3 else "clicks"
            user, time = f"u{rng.randrange(12)}", 1_700_000_000_000 + 10 * i
            value = f"p{i}" if topic == "profiles" else "click"
            sent = (profiles if topic == "profiles" else clicks).send(user, value, time)
            records.append((topic, sent.partition, sent.offset, time, user, value))
    return records


def reference(records: list[Record], quiet_below: dict[tuple[str, int], int]) -> list[Any]:
    """One pass in time order; a click below its partition's fence is applied, not shown."""
    profile: dict[str, str] = {}
    rows = []
    for topic, partition, offset, _, user, value in sorted(records, key=lambda r: r[3]):
        if topic == "profiles":
            profile[user] = value
        elif offset >= quiet_below.get((topic, partition), 0):
            rows.append((user, offset, partition, profile.get(user, "-")))
    return rows


def run(spark: SparkSession, log: EmbeddedLog, root: Path, **options: Any) -> DataFrame:
    register_log_source(spark)
    checkpoint, output = root / "cp", root / "out"
    events = (
        spark.readStream.format(LOG_SOURCE_FORMAT)
        .option("path", str(log.path))
        .option("subscribe", "clicks,profiles")
        .option("startingOffsets", "earliest")
        .load()
    )
    out = events.transform(
        with_task_state(
            example_processor(),
            job="enrich",
            checkpoint_location=checkpoint,
            elasticity_factor=1,
            partitions={"clicks": PARTITIONS, "profiles": PARTITIONS},
            **options,
        )
    )
    (
        out.writeStream.format("parquet")
        .option("path", str(output))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
        .awaitTermination()
    )
    return spark.read.parquet(str(output))


def expected(spark: SparkSession, rows: list[Any]) -> DataFrame:
    return spark.createDataFrame(rows, ENRICHED)


def test_co_grouped_streams_are_merged_by_time_by_default(
    spark: SparkSession, tmp_path: Path
) -> None:
    seed = random.randrange(2**32)
    print(f"seed={seed}")
    log = EmbeddedLog(tmp_path / "log")
    records = produce(log, seed)
    enriched = run(spark, log, tmp_path / "default")
    assert_df_equality(enriched, expected(spark, reference(records, {})), ignore_row_order=True)
    # By offset (the order of one stream), every click of a batch comes before any
    # profile update: the same input gives another answer.
    by_offset = run(spark, log, tmp_path / "offset", order="offset")
    assert set(by_offset.select("profile").distinct().toPandas()["profile"]) == {"-"}


def test_quiet_records_keep_their_place_in_time(spark: SparkSession, tmp_path: Path) -> None:
    # A warm-up's output fences: records below them were published by an earlier owner,
    # so they go into the state and their output is dropped. Profile updates quiet up to
    # three quarters of the way, clicks up to half way: quiet updates come, in time, after
    # clicks that are not quiet, and must not be applied before them.
    seed = random.randrange(2**32)
    print(f"seed={seed}")
    log = EmbeddedLog(tmp_path / "log")
    records = produce(log, seed)
    fences = {}
    for topic, share in (("clicks", 0.5), ("profiles", 0.75)):
        for p in range(PARTITIONS):
            offsets = [r[2] for r in records if r[:2] == (topic, p)]
            fences[(topic, p)] = offsets[int(len(offsets) * share)]
    write_fences(tmp_path / "quiet" / "cp", [((t, p, 0, 1), o) for (t, p), o in fences.items()])
    enriched = run(spark, log, tmp_path / "quiet", order="timestamp")
    clicks_fences = {k: v for k, v in fences.items() if k[0] == "clicks"}
    assert_df_equality(
        enriched,
        expected(spark, reference(records, clicks_fences)),
        ignore_row_order=True,
    )


def test_time_order_is_refused_without_a_timestamp_column(spark: SparkSession) -> None:
    rows = spark.createDataFrame(
        [(b"k", b"v", "clicks", 0, 0)],
        "key binary, value binary, topic string, partition int, offset bigint",
    )
    transform = with_task_state(
        example_processor(),
        job="enrich",
        checkpoint_location="/nonexistent/cp",
        elasticity_factor=1,
        partitions={"clicks": 1, "profiles": 1},
    )
    with pytest.raises(ColumnError, match=r"co-grouped streams are merged by timestamp"):
        rows.transform(transform)


def test_an_unknown_order_is_refused_at_once() -> None:
    with pytest.raises(ArgumentError, match=r"order: .*'time'"):
        with_task_state(
            example_processor(), job="enrich", checkpoint_location="/tmp/x", order="time"
        )
