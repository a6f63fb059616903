"""Virtual tasks on a real Structured Streaming query over the embedded log."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_elastic import (
    LOG_SOURCE_FORMAT,
    EmbeddedLog,
    PartitionMapping,
    cogroup,
    map_tasks_in_pandas,
    plan_job,
    register_log_source,
)

# Slow (left out by `pytest -m "not slow"`): streaming queries.
pytestmark = pytest.mark.slow

TOPIC = "clicks"
SEEN = (
    "virtual_task string, spark_partition int, key string, partition int, offset long, "
    "seq long, arrival int"
)


def arrivals(task: str, rows: pd.DataFrame) -> pd.DataFrame:
    """Echo each record with where (Spark partition) and when (position) the task saw it."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return pd.DataFrame(
        {
            "virtual_task": task,
            "spark_partition": context.partitionId() if context else -1,
            "key": rows["key"].map(bytes.decode),
            "partition": rows["partition"],
            "offset": rows["offset"],
            "seq": rows["value"].map(lambda v: int(v.decode())),
            "arrival": range(len(rows)),
        }
    )


def produce(log: EmbeddedLog, count: int, rng: random.Random, sent: dict[str, int]) -> None:
    """``count`` records of 40 keys; each value is the key's own sequence number."""
    keys, values = [], []
    for _ in range(count):
        key = f"user-{rng.randrange(40)}"
        keys.append(key.encode())
        values.append(str(sent.get(key, 0)).encode())
        sent[key] = sent.get(key, 0) + 1
    producer = log.producer(TOPIC)
    try:
        producer.send_many(keys, values)
    finally:
        producer.close()


@pytest.fixture
def log(tmp_path: Path) -> EmbeddedLog:
    log = EmbeddedLog(tmp_path / "log", fsync=False)
    log.create_topic(TOPIC, 3)
    return log


def run_available_now(
    spark: SparkSession, log: EmbeddedLog, routed: DataFrame, checkpoint: Path
) -> list[pd.DataFrame]:
    """Run the query to the end of the log; return what each micro-batch saw."""
    batches: list[pd.DataFrame] = []

    def collect(batch: DataFrame, batch_id: int) -> None:
        frame = batch.toPandas()
        frame["batch"] = batch_id
        batches.append(frame)

    query = (
        routed.writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return batches


def stream(
    spark: SparkSession, log: EmbeddedLog, topic: str = TOPIC, max_per_trigger: int = 400
) -> DataFrame:
    register_log_source(spark)
    return (
        spark.readStream.format(LOG_SOURCE_FORMAT)
        .option("path", str(log.path))
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", max_per_trigger)
        .load()
    )


def each_key_in_sequence(seen: pd.DataFrame) -> Iterator[tuple[str, list[int]]]:
    ordered = seen.sort_values(["batch", "virtual_task", "arrival"])
    for key, group in ordered.groupby("key"):
        yield str(key), group["seq"].tolist()


def test_streaming_virtual_tasks_are_exact_and_in_key_order(
    spark: SparkSession, log: EmbeddedLog, tmp_path: Path
) -> None:
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    sent: dict[str, int] = {}
    produce(log, 1500, rng, sent)
    # A round-robin shuffle first, so the rows reach the routing shuffle out of offset
    # order: only map_tasks_in_pandas's sort can put each key's records back in order.
    routed = (
        stream(spark, log)
        .repartition(5)
        .withVirtualTasks(4, partitions=log.partition_counts([TOPIC]))
        .transform(map_tasks_in_pandas(arrivals, SEEN))
    )
    seen = pd.concat(run_available_now(spark, log, routed, tmp_path / "cp"))
    assert len(seen) == 1500, f"seed={seed}"
    assert seen["batch"].nunique() >= 3, "maxOffsetsPerTrigger should split the backlog"
    names = plan_job([f"kafka.{TOPIC}:3"], elasticity_factor=4).task_names()
    # Exact routing: task t alone in Spark partition t, in every micro-batch.
    placement = seen.groupby(["batch", "spark_partition"])["virtual_task"].unique()
    for (batch, partition), tasks in placement.items():
        assert list(tasks) == [names[partition]], f"seed={seed} batch {batch}"
    # Every key's records reach the function in production order, across micro-batches.
    for key, sequence in each_key_in_sequence(seen):
        assert sequence == list(range(sent[key])), f"seed={seed} key={key}"


def test_grown_topic_keeps_task_names_with_previous_plan(
    spark: SparkSession, log: EmbeddedLog, tmp_path: Path
) -> None:
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    sent: dict[str, int] = {}
    before = plan_job([f"kafka.{TOPIC}:3"], elasticity_factor=2)
    produce(log, 300, rng, sent)
    routed = stream(spark, log).withVirtualTasks(plan=before)
    first = run_available_now(
        spark, log, routed.transform(map_tasks_in_pandas(arrivals, SEEN)), tmp_path / "cp"
    )
    log.grow(TOPIC, 6)
    produce(log, 300, rng, sent)

    # The old plan refuses records of the new partitions instead of misrouting them.
    with pytest.raises(StreamingQueryException, match="outside the virtual-task plan"):
        run_available_now(
            spark, log, routed.transform(map_tasks_in_pandas(arrivals, SEEN)), tmp_path / "cp"
        )

    after = plan_job(
        [f"kafka.{TOPIC}:6"], elasticity_factor=2, previous=PartitionMapping.from_plan(before)
    )
    grown = stream(spark, log).withVirtualTasks(plan=after)
    second = run_available_now(
        spark, log, grown.transform(map_tasks_in_pandas(arrivals, SEEN)), tmp_path / "cp"
    )
    seen = pd.concat(first + second)
    assert len(seen) == 600, f"seed={seed}"
    assert set(seen["virtual_task"]) <= set(before.task_names())
    # a key keeps its virtual task after the topic grew (SEP-5 + SEP-32)
    assert (seen.groupby("key")["virtual_task"].nunique() == 1).all(), f"seed={seed}"


def test_stateless_query_changes_factor_on_restart(
    spark: SparkSession, log: EmbeddedLog, tmp_path: Path
) -> None:
    # A stateless query keeps no state partitions, so the factor may change between runs
    # on the same checkpoint: no rescale needed (only stateful jobs need one).
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    sent: dict[str, int] = {}
    checkpoint = tmp_path / "cp"
    seen = []
    for factor in (2, 4):
        produce(log, 300, rng, sent)
        routed = (
            stream(spark, log)
            .withVirtualTasks(factor, partitions=log.partition_counts([TOPIC]))
            .transform(map_tasks_in_pandas(arrivals, SEEN))
        )
        batches = pd.concat(run_available_now(spark, log, routed, checkpoint))
        names = plan_job([f"kafka.{TOPIC}:3"], elasticity_factor=factor).task_names()
        assert set(batches["virtual_task"]) <= set(names), f"seed={seed}"
        assert (batches["spark_partition"] == batches["virtual_task"].map(names.index)).all()
        seen.append(batches)
    assert sum(len(b) for b in seen) == 600, f"seed={seed}"  # nothing lost or repeated


def test_streaming_cogroup_gives_a_task_every_record_of_its_keys_from_both_topics(
    spark: SparkSession, tmp_path: Path
) -> None:
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    log = EmbeddedLog(tmp_path / "log", fsync=False)
    counts = {"views": 4, "clicks": 6}
    for topic, count in counts.items():
        log.create_topic(topic, count)
        keys = [f"user-{rng.randrange(60)}".encode() for _ in range(400)]
        producer = log.producer(topic)
        try:
            producer.send_many(keys, [b"v"] * len(keys))
        finally:
            producer.close()
    views, clicks = (stream(spark, log, topic, max_per_trigger=300) for topic in counts)
    routed = cogroup(
        views, clicks, partition_counts=log.partition_counts(list(counts)), elasticity_factor=2
    ).select(
        F.col("key").cast("string").alias("key"),
        "topic",
        "virtual_task",
        F.spark_partition_id().alias("spark_partition"),
    )
    seen = pd.concat(run_available_now(spark, log, routed, tmp_path / "cp"))
    assert len(seen) == 800, f"seed={seed}"
    # gcd(4, 6) = 2 tasks x factor 2: one virtual task per key across both topics.
    names = plan_job(["kafka.views:4", "kafka.clicks:6"], "cogroup", 2).task_names()
    assert set(seen["virtual_task"]) == set(names), f"seed={seed}"
    assert (seen.groupby("key")["virtual_task"].nunique() == 1).all(), f"seed={seed}"
    both = seen.groupby("key")["topic"].nunique()
    assert (both == 2).sum() > 40, f"seed={seed}: most keys should appear in both topics"
    placement = seen.groupby(["batch", "spark_partition"])["virtual_task"].unique()
    for (batch, partition), tasks in placement.items():
        assert list(tasks) == [names[partition]], f"seed={seed} batch {batch}"
