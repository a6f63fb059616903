"""Kafka partitions and key buckets in Spark: native vs Arrow pandas UDF vs per-row Python UDF.

Run: ``.venv/bin/python benchmarks/bench_udfs.py`` (``--keys 100000`` for a quick run).

One local SparkSession, one cached DataFrame of ``--keys`` binary keys
(``user-<xxhash64(id)>``, 6 to 25 bytes), and for each way of computing a
column the best of ``--repeat`` runs of a full evaluation (a ``noop`` write, so
nothing is collected to the driver):

* murmur2: ``udfs.kafka_partition`` (Arrow pandas UDF) vs a per-row Python
  ``udf`` running a plain-Python transliteration of Kafka's murmur2;
* key buckets: Spark's native ``pmod(hash(key), f)`` vs ``pmod(java_hash_code(key), f)``
  (Arrow pandas UDF) vs a per-row Python ``udf`` computing ``String.hashCode``;
* floors: a scan of the key column alone, which every method pays, and an
  Arrow pandas UDF that returns a constant, which every Arrow UDF pays (moving
  the batches to a Python worker and back).

Then keys/s of the numpy functions (no Spark) on the same keys as one Arrow array.
"""

from __future__ import annotations

import argparse
import platform
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

import udfs
from spark_elastic._session import local_session

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

MASK32 = 0xFFFFFFFF


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000, help="rows (default 1,000,000)")
    parser.add_argument("--partitions", type=int, default=12, help="Kafka partition count")
    parser.add_argument("--factor", type=int, default=8, help="key buckets")
    parser.add_argument("--repeat", type=int, default=3, help="runs per method; best is kept")
    parser.add_argument("--cores", type=int, default=2, help="local[cores]")
    parser.add_argument(
        "--arrow-batch",
        type=int,
        default=10_000,
        help="spark.sql.execution.arrow.maxRecordsPerBatch (Spark's default 10,000)",
    )
    args = parser.parse_args()

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
        return java_hash_row(key) % factor

    @F.pandas_udf("int")
    def constant(key: pd.Series) -> pd.Series:
        return pd.Series(np.zeros(len(key), dtype=np.int32))

    keys = (
        spark.range(args.keys, numPartitions=args.cores)
        .select(
            F.concat(F.lit("user-"), F.xxhash64("id").cast("string")).cast("binary").alias("key")
        )
        .persist()
    )
    keys.count()
    key = F.col("key")
    rows = args.keys

    results: list[tuple[str, str, float]] = []

    def measure(section: str, method: str, column: Column) -> None:
        seconds = best_of(args.repeat, evaluate(keys, column))
        results.append((section, method, seconds))
        print(f"  {section}: {method}: {seconds:.3f} s", flush=True)

    measure("floor", "scan of the key column only", key)
    measure("floor", "Arrow pandas UDF returning a constant", constant(key))
    measure(
        "murmur2 partition",
        "Arrow pandas UDF `udfs.kafka_partition`",
        udfs.kafka_partition(key, partitions),
    )
    measure("murmur2 partition", "per-row Python `udf`", partition_per_row(key))
    measure("key bucket", "Spark native `pmod(hash(key), f)`", F.pmod(F.hash(key), F.lit(factor)))
    measure(
        "key bucket",
        "Arrow pandas UDF `pmod(udfs.java_hash_code(key), f)`",
        F.pmod(udfs.java_hash_code(key), F.lit(factor)),
    )
    measure("key bucket", "per-row Python `udf` (String.hashCode)", bucket_per_row(key))

    arrow_keys = keys.toArrow().column("key").combine_chunks()
    keys.unpersist()
    numpy_murmur = best_of(args.repeat, lambda: udfs.kafka_partitions(arrow_keys, partitions))
    numpy_java = best_of(args.repeat, lambda: udfs.java_hash_codes(arrow_keys))
    version = spark.version
    spark.stop()

    per_row = {section: s for section, method, s in results if "per-row" in method}
    print()
    print(
        f"{rows:,} keys, local[{args.cores}], Spark {version}, "
        f"Python {platform.python_version()}, best of {args.repeat}"
    )
    print()
    print("| what | method | seconds | keys/s | speed-up vs per-row |")
    print("|---|---|---:|---:|---:|")
    for section, method, seconds in results:
        speedup = f"{per_row[section] / seconds:.1f}x" if section in per_row else "-"
        print(f"| {section} | {method} | {seconds:.3f} | {rows / seconds:,.0f} | {speedup} |")
    for name, seconds in [
        ("numpy `udfs.kafka_partitions`", numpy_murmur),
        ("numpy `udfs.java_hash_codes`", numpy_java),
    ]:
        print(f"| numpy, no Spark | {name} | {seconds:.3f} | {rows / seconds:,.0f} | - |")


if __name__ == "__main__":
    main()
