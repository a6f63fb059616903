"""Specification of map_tasks_in_pandas: each virtual task's rows arrive in offset or time order."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pandas as pd
import pytest
from pyspark.sql import DataFrame, SparkSession

from spark_elastic import map_tasks_in_pandas
from spark_elastic.errors import ArgumentError, ArgumentTypeError, ColumnError

SEEN_SCHEMA = "virtual_task string, topic string, partition int, offset bigint, seq int"
KAFKA_SCHEMA = "key binary, value binary, topic string, partition int, offset bigint"


def record_arrival(task: str, rows: pd.DataFrame) -> pd.DataFrame:
    """Echo each row with the position it arrived at in the task's call."""
    out = rows[["topic", "partition", "offset"]].copy()
    out.insert(0, "virtual_task", task)
    out["seq"] = range(len(out))
    return out


def assert_arrived_in_offset_order(seen: DataFrame) -> None:
    rows = seen.collect()
    by_task: dict[str, list[tuple[int, str, int, int]]] = {}
    for r in rows:
        by_task.setdefault(r.virtual_task, []).append((r.seq, r.topic, r.partition, r.offset))
    for task, arrivals in by_task.items():
        in_arrival_order = [a[1:] for a in sorted(arrivals)]
        assert in_arrival_order == sorted(in_arrival_order), task


def test_each_task_sees_its_rows_sorted_by_topic_partition_offset(spark: SparkSession) -> None:
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    rows = [
        (f"k{rng.randrange(50)}".encode(), b"v", topic, p, o)
        for topic in ("a", "b")
        for p in range(2)
        for o in range(300)
    ]
    rng.shuffle(rows)
    df = spark.createDataFrame(rows, KAFKA_SCHEMA).repartition(3)
    seen = df.withVirtualTasks(4).transform(map_tasks_in_pandas(record_arrival, SEEN_SCHEMA))
    assert seen.count() == len(rows), f"seed={seed}"
    assert_arrived_in_offset_order(seen)
    assert seen.select("virtual_task").distinct().count() == 8, f"seed={seed}"


def test_function_may_return_several_frames_or_none(spark: SparkSession) -> None:
    def split_halves(task: str, rows: pd.DataFrame) -> list[pd.DataFrame]:
        out = record_arrival(task, rows)
        return [out.iloc[: len(out) // 2], out.iloc[len(out) // 2 :]]

    rows = [(b"k", b"v", "a", 0, o) for o in range(10)]
    df = spark.createDataFrame(rows, KAFKA_SCHEMA).withVirtualTasks(1)
    assert df.transform(map_tasks_in_pandas(split_halves, SEEN_SCHEMA)).count() == 10


def test_requires_virtual_task_column(spark: SparkSession) -> None:
    df = spark.createDataFrame([(b"k", b"v", "a", 0, 0)], KAFKA_SCHEMA)
    with pytest.raises(ColumnError, match="apply withVirtualTasks"):
        df.transform(map_tasks_in_pandas(record_arrival, SEEN_SCHEMA))


def test_requires_a_callable() -> None:
    with pytest.raises(ArgumentTypeError, match="func"):
        map_tasks_in_pandas("not callable", SEEN_SCHEMA)  # type: ignore[arg-type]


TIMED_SCHEMA = KAFKA_SCHEMA + ", timestamp timestamp"
SEEN_TIMED = "virtual_task string, topic string, partition int, offset bigint, seq int"


def test_timestamp_order_merges_a_tasks_streams_by_time(spark: SparkSession) -> None:
    # Two co-grouped streams, each partition's times rising with random gaps: every task
    # must see the merge by time (Kafka Streams' PartitionGroup), not clicks-then-profiles.
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    base = datetime(2026, 1, 1, tzinfo=UTC)
    rows = []
    for topic in ("clicks", "profiles"):
        for p in range(2):
            t = 0
            for o in range(200):
                t += rng.randrange(0, 5)
                key = f"k{rng.randrange(20)}".encode()
                rows.append((key, b"v", topic, p, o, base + timedelta(seconds=t)))
    rng.shuffle(rows)
    df = spark.createDataFrame(rows, TIMED_SCHEMA).repartition(3)
    seen = (
        df.withVirtualTasks(2)
        .transform(map_tasks_in_pandas(record_arrival, SEEN_TIMED, order="timestamp"))
        .collect()
    )
    assert len(seen) == len(rows), f"seed={seed}"
    time_of = {(r[2], r[3], r[4]): r[5] for r in rows}
    by_task: dict[str, list[tuple[int, str, int, int]]] = {}
    for r in seen:
        by_task.setdefault(r.virtual_task, []).append((r.seq, r.topic, r.partition, r.offset))
    for task, arrivals in by_task.items():
        records = [a[1:] for a in sorted(arrivals)]
        times = [time_of[r] for r in records]
        assert times == sorted(times), f"seed={seed} task={task}"
        assert {r[0] for r in records} == {"clicks", "profiles"}, f"seed={seed}"
        for stream_partition in {r[:2] for r in records}:
            offsets = [r[2] for r in records if r[:2] == stream_partition]
            assert offsets == sorted(offsets), f"seed={seed} task={task}"


def test_timestamp_order_needs_a_timestamp_column(spark: SparkSession) -> None:
    df = spark.createDataFrame([(b"k", b"v", "a", 0, 0)], KAFKA_SCHEMA).withVirtualTasks(1)
    with pytest.raises(ColumnError, match=r"column 'timestamp' \(timestamp\): missing"):
        df.transform(map_tasks_in_pandas(record_arrival, SEEN_SCHEMA, order="timestamp"))
    with pytest.raises(ColumnError, match=r"column 'value' \(timestamp\): expected type"):
        df.transform(
            map_tasks_in_pandas(record_arrival, SEEN_SCHEMA, order="timestamp", timestamp="value")
        )


def test_an_unknown_order_is_refused_naming_the_choices() -> None:
    with pytest.raises(ArgumentError, match=r"order: .*'time'.*offset.*timestamp"):
        map_tasks_in_pandas(record_arrival, SEEN_SCHEMA, order="time")
