"""Routing benchmark: withVirtualTasks vs plain hash repartitioning, side by side in one run.

Run: ``.venv/bin/python benchmarks/bench_routing.py`` (``--rows`` to change the size).

1. Placement: for one DataFrame of Kafka-shaped rows (8 partitions, factor 8,
   64 virtual tasks), how many of the 64 Spark partitions are idle and how
   uneven they are, routed by ``withVirtualTasks`` vs ``repartition(64, "virtual_task")``.
2. Throughput: the same jobs with ``.withVirtualTasks(8)`` vs
   ``.repartition(64, "key")``, best of N runs, alternating so neither side
   benefits from warm-up: one that only hashes every routed row (pure routing
   cost), and one that counts keys per partition in pandas (what a virtual
   task does with its rows).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import spark_elastic  # noqa: F401 - registers DataFrame.withVirtualTasks
from spark_elastic.dataplane.session import local_session

PARTITIONS = 8
FACTOR = 8
TASKS = PARTITIONS * FACTOR


def kafka_rows(spark: SparkSession, rows: int, keys: int) -> DataFrame:
    """Kafka-shaped rows generated in the JVM and cached, so the source costs nothing."""
    df = spark.range(rows).select(
        F.concat(F.lit("user-"), (F.col("id") % keys).cast("string")).cast("binary").alias("key"),
        F.lit(b"payload-" * 8).alias("value"),
        F.lit("events").alias("topic"),
        F.col("id").alias("offset"),
    )
    df = df.withColumn("partition", F.pmod(F.xxhash64("key"), F.lit(PARTITIONS)).cast("int"))
    return df.repartition(4).cache()


def placement(df: DataFrame) -> tuple[int, float]:
    """Idle partitions and max/mean rows per partition."""
    counted = df.groupBy(F.spark_partition_id().alias("p")).count().collect()
    sizes = [r["count"] for r in counted] + [0] * (TASKS - len(counted))
    mean = sum(sizes) / len(sizes)
    return sum(1 for s in sizes if s == 0), max(sizes) / mean


def job(routed: DataFrame) -> None:
    """Pure routing cost: the cheapest job that reads every routed row.

    It reads every Kafka column, as a query on a Kafka source does (the source
    produces them all), so the cache does not spare the baseline columns that
    virtual tasks need.
    """
    routed.select(F.sum(F.hash("key", "value", "topic", "partition", "offset"))).collect()


def count_keys(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """What a task typically does with its partition: per-key work in pandas."""
    frames = [b[["key", "partition", "offset"]] for b in batches]
    if frames:
        counts = pd.concat(frames).groupby("key").size()
        yield pd.DataFrame({"keys": [len(counts)], "rows": [int(counts.sum())]})


def pandas_job(routed: DataFrame) -> None:
    """A job that processes each partition in pandas, as virtual tasks are meant to."""
    routed.select("key", "partition", "offset").mapInPandas(
        count_keys, "keys long, rows long"
    ).select(F.sum("rows")).collect()


def timed(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    spark = local_session("bench-routing", conf={"spark.sql.adaptive.enabled": "false"})
    df = kafka_rows(spark, args.rows, args.keys)
    df.count()
    counts = {"events": PARTITIONS}
    ours = df.withVirtualTasks(FACTOR, partitions=counts)
    by_name = df.withVirtualTasks(FACTOR, partitions=counts, route=False).repartition(
        TASKS, "virtual_task"
    )
    by_key = df.repartition(TASKS, "key")

    print(f"{args.rows:,} rows, {args.keys:,} keys, {PARTITIONS} partitions x factor {FACTOR}")
    print("\n| routing | idle partitions of 64 | max/mean rows per partition |")
    print("|---|---:|---:|")
    for label, routed in (
        ("withVirtualTasks(8)", ours),
        ('repartition(64, "virtual_task")', by_name),
    ):
        idle, skew = placement(routed)
        print(f"| {label} | {idle} | {skew:.2f} |")

    for name, run in (
        ("route, then hash every row", job),
        ("route, then count keys per partition in pandas", pandas_job),
    ):
        run(ours)
        run(by_key)  # warm both plans up
        ours_s, key_s = [], []
        for _ in range(args.runs):
            ours_s.append(timed(lambda: run(ours)))  # noqa: B023 - called at once
            key_s.append(timed(lambda: run(by_key)))  # noqa: B023
        best_ours, best_key = min(ours_s), min(key_s)
        print(f"\n| job: {name} | best of {args.runs} (s) | rows/s |")
        print("|---|---:|---:|")
        print(f'| repartition(64, "key") | {best_key:.2f} | {args.rows / best_key:,.0f} |')
        print(f"| withVirtualTasks(8) | {best_ours:.2f} | {args.rows / best_ours:,.0f} |")
        print(f"\nwithVirtualTasks / repartition time: {best_ours / best_key:.2f}")
    spark.stop()


if __name__ == "__main__":
    main()
