"""Kafka partitions and key buckets in Spark: native vs Arrow, pandas and per-row Python UDFs.

Run: ``.venv/bin/python benchmarks/bench_udfs.py`` (``--keys 100000`` for a quick run).

One local SparkSession; for each key shape (``--shapes``), one cached
DataFrame of ``--keys`` binary keys, and for each way of computing a column
the best of ``--repeat`` full evaluations (a ``noop`` write, so nothing is
collected to the driver). Rounds are interleaved (every method once per
round) so that a slow spell of the machine hits all methods alike.

* murmur2: ``udfs.kafka_partition`` (Arrow UDF) vs a pandas UDF calling the
  same numpy function vs a per-row Python ``udf`` running a plain-Python
  transliteration of Kafka's murmur2 (``int.from_bytes`` per 4-byte block);
* key buckets: the library's own ``key_bucket(f)`` (native, the default) vs
  ``key_bucket(f, hash="java")`` (``String.hashCode`` by the Arrow UDF) vs a
  per-row Python ``udf`` computing ``abs(String.hashCode) % f``;
* floors: a scan of the key column alone, which every method pays, and an
  Arrow UDF and a pandas UDF that return a constant without reading their
  input, which every such UDF pays (Spark moving the batches to a Python
  worker and back). ``per-row / constant Arrow UDF`` is the ceiling: the
  speed-up a UDF that did no work at all would show.

Then keys/s of the numpy functions (no Spark) on the same keys as one Arrow array.
"""

from __future__ import annotations

import argparse
import platform
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import pyarrow as pa

import udfs
from spark_elastic import key_bucket
from spark_elastic.dataplane.session import local_session

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

MASK32 = 0xFFFFFFFF
SHAPES = {
    "user": "`user-<xxhash64(id)>`, 6 to 25 bytes",
    "uuid": "a random UUID as text, 36 bytes",
}


def murmur2_row(data: bytes) -> int:
    """Kafka's Utils.murmur2 in plain Python, as someone would write a per-row UDF."""
    length = len(data)
    m = 0x5BD1E995
    h = (0x9747B28C ^ length) & MASK32
    for i4 in range(0, length - length % 4, 4):
        k = int.from_bytes(data[i4 : i4 + 4], "little")
        k = (k * m) & MASK32
        k ^= k >> 24
        k = (k * m) & MASK32
        h = ((h * m) & MASK32) ^ k
    tail = length % 4
    if tail:
        h ^= int.from_bytes(data[length - tail :], "little")
        h = (h * m) & MASK32
    h ^= h >> 13
    h = (h * m) & MASK32
    return h ^ (h >> 15)


def java_hash_row(data: bytes) -> int:
    """Java's String.hashCode of the key as UTF-8 text, in plain Python."""
    h = 0
    for unit in memoryview(data.decode("utf-8").encode("utf-16-le")).cast("H"):
        h = (31 * h + unit) & MASK32
    return h - (1 << 32) if h >= 1 << 31 else h


def best_of(runs: int, action: Callable[[], object]) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return min(times)


def evaluate(df: DataFrame, column: Column) -> Callable[[], None]:
    def run() -> None:
        df.select(column.alias("out")).write.format("noop").mode("overwrite").save()

    return run


def key_frame(spark: SparkSession, shape: str, rows: int, cores: int) -> DataFrame:
    """``rows`` binary keys of the given shape (and an offset each), cached in memory."""
    from pyspark.sql import functions as F

    ids = spark.range(rows, numPartitions=cores)
    text = (
        F.concat(F.lit("user-"), F.xxhash64("id").cast("string"))
        if shape == "user"
        else F.expr("uuid(42)")
    )
    keys = ids.select(text.cast("binary").alias("key"), F.col("id").alias("offset")).persist()
    keys.count()
    return keys


def interleaved_best(
    rounds: int, actions: dict[tuple[str, str], Callable[[], None]]
) -> dict[tuple[str, str], float]:
    """The best time of each action over ``rounds`` rounds of all actions in turn."""
    best = dict.fromkeys(actions, float("inf"))
    for round_ in range(rounds):
        for name, action in actions.items():
            seconds = best_of(1, action)
            best[name] = min(best[name], seconds)
            if round_ == rounds - 1:
                print(f"  {name[0]}: {name[1]}: {best[name]:.3f} s", flush=True)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000, help="rows (default 1,000,000)")
    parser.add_argument(
        "--shapes",
        default="user,uuid",
        help=f"comma-separated key shapes from {', '.join(SHAPES)} (default: all)",
    )
    parser.add_argument("--partitions", type=int, default=12, help="Kafka partition count")
    parser.add_argument("--factor", type=int, default=8, help="key buckets")
    parser.add_argument("--repeat", type=int, default=5, help="rounds; each method's best is kept")
    parser.add_argument("--cores", type=int, default=2, help="local[cores]")
    parser.add_argument(
        "--arrow-batch",
        type=int,
        default=10_000,
        help="spark.sql.execution.arrow.maxRecordsPerBatch (Spark's default 10,000)",
    )
    args = parser.parse_args()
    shapes = args.shapes.split(",")
    unknown = [shape for shape in shapes if shape not in SHAPES]
    if unknown:
        parser.error(f"--shapes: unknown shape {unknown[0]!r}; choose from {', '.join(SHAPES)}")

    spark = local_session(
        "bench-udfs",
        cores=args.cores,
        conf={"spark.sql.execution.arrow.maxRecordsPerBatch": str(args.arrow_batch)},
    )
    from pyspark.sql import functions as F

    partitions, factor = args.partitions, args.factor

    @F.udf("int", useArrow=False)
    def partition_per_row(key: bytes) -> int:
        return (murmur2_row(key) & 0x7FFFFFFF) % partitions

    @F.udf("int", useArrow=False)
    def bucket_per_row(key: bytes) -> int:
        return abs(java_hash_row(key)) % factor

    @F.pandas_udf("int")
    def partition_pandas(key: pd.Series) -> pd.Series:
        return pd.Series(udfs.kafka_partitions(key, partitions))

    @F.pandas_udf("int")
    def constant_pandas(key: pd.Series) -> pd.Series:
        return pd.Series(np.zeros(len(key), dtype=np.int32))

    @F.arrow_udf("int")
    def constant_arrow(key: pa.Array) -> pa.Array:
        return pa.array(np.zeros(len(key), dtype=np.int32))

    key = F.col("key")
    methods: dict[tuple[str, str], Column] = {
        ("floor", "scan of the key column only"): key,
        ("floor", "Arrow UDF returning a constant"): constant_arrow(key),
        ("floor", "pandas UDF returning a constant"): constant_pandas(key),
        ("murmur2 partition", "Arrow UDF `udfs.kafka_partition`"): udfs.kafka_partition(
            key, partitions
        ),
        ("murmur2 partition", "pandas UDF calling `udfs.kafka_partitions`"): partition_pandas(key),
        ("murmur2 partition", "per-row Python `udf`"): partition_per_row(key),
        ("key bucket", "native `key_bucket(f)` (default)"): key_bucket(factor),
        ("key bucket", 'Arrow UDF `key_bucket(f, hash="java")`'): key_bucket(factor, "java"),
        ("key bucket", "per-row Python `udf` (String.hashCode)"): bucket_per_row(key),
    }

    tables = []
    for shape in shapes:
        print(f"{shape} keys ({SHAPES[shape]}):", flush=True)
        keys = key_frame(spark, shape, args.keys, args.cores)
        best = interleaved_best(
            args.repeat, {name: evaluate(keys, column) for name, column in methods.items()}
        )
        arrow_keys = keys.toArrow().column("key").combine_chunks()
        keys.unpersist()
        numpy_times = {
            "numpy `udfs.kafka_partitions`": best_of(
                args.repeat, partial(udfs.kafka_partitions, arrow_keys, partitions)
            ),
            "numpy `udfs.java_hash_codes`": best_of(
                args.repeat, partial(udfs.java_hash_codes, arrow_keys)
            ),
        }
        tables.append((shape, best, numpy_times))
    version = spark.version
    spark.stop()

    rows = args.keys
    print()
    print(
        f"{rows:,} keys per shape, local[{args.cores}], Spark {version}, "
        f"Python {platform.python_version()}, best of {args.repeat} interleaved rounds"
    )
    for shape, best, numpy_times in tables:
        per_row = {section: s for (section, method), s in best.items() if "per-row" in method}
        ceiling = per_row["murmur2 partition"] / best[("floor", "Arrow UDF returning a constant")]
        print()
        print(f"{shape} keys ({SHAPES[shape]}); ceiling for murmur2: {ceiling:.1f}x")
        print()
        print("| what | method | seconds | keys/s | vs per-row |")
        print("|---|---|---:|---:|---:|")
        for (section, method), seconds in best.items():
            speedup = f"{per_row[section] / seconds:.1f}x" if section in per_row else "-"
            print(f"| {section} | {method} | {seconds:.3f} | {rows / seconds:,.0f} | {speedup} |")
        for name, seconds in numpy_times.items():
            print(f"| numpy, no Spark | {name} | {seconds:.3f} | {rows / seconds:,.0f} | - |")


if __name__ == "__main__":
    main()
