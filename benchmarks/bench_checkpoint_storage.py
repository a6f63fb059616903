"""A stateful query's checkpoints on the local disk, on HDFS and on S3, side by side.

Run: ``.venv/bin/python benchmarks/bench_checkpoint_storage.py`` (``--records 20000``,
``--batches 6``, ``--runs 2``). Needs ``make jars`` (the MiniDFS, s3proxy and
S3A jars). Nothing else should run beside it.

The same ``with_task_state`` running count (the vectorized one, factor 4 on 4
partitions of the embedded log, 16 virtual tasks, 2 state partitions on
``local[2]``) runs from a fresh checkpoint on each file system in turn, in
one SparkSession: the local disk (the default), a real HDFS (a MiniDFS
NameNode and DataNode in their own JVM on loopback) and a real S3 server
(s3proxy on loopback, through S3A with conditional writes). Spark keeps its
offsets, commits and RocksDB state there, and the library its job and owner
objects; off the local disk the query runs with RocksDB's changelog
checkpointing, as ``with_task_state`` starts it there. After two warm-up
batches, ``--batches`` micro-batches of ``--records`` records: the median
batch time (Spark's ``triggerExecution``) and the records a second that
gives. Then the time a fork of its committed prefix takes (what a new owner
of its tasks starts from: hard links on the local disk, copies through
Hadoop elsewhere), with the files and bytes it copied. Variants alternate
in order between runs; medians over runs. The servers are on this machine,
so the figures are the file systems' protocols and round trips, not a
network's.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench_stateful import TOPIC, events, vectorized_processor

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # storage_jvm: the servers the specs start

TOPIC_PARTITIONS = 4
FACTOR = 4
VARIANTS = ("local", "hdfs", "s3")


def one(spark: Any, work: Path, checkpoint: str, records: int, batches: int) -> dict[str, float]:
    """One query from a fresh checkpoint: per-batch figures after two warm-up batches."""
    from spark_elastic import EmbeddedLog, with_task_state

    root = Path(tempfile.mkdtemp(dir=work))
    log = EmbeddedLog(root / "log", fsync=False)
    log.create_topic(TOPIC, TOPIC_PARTITIONS)
    out = events(spark, log.path, checkpoint, records).transform(  # type: ignore[arg-type]
        with_task_state(
            vectorized_processor(),
            job="bench",
            checkpoint_location=checkpoint,
            elasticity_factor=FACTOR,
            partitions={TOPIC: TOPIC_PARTITIONS},
        )
    )
    query = (
        out.writeStream.format("noop")
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="0 seconds")
        .start()
    )
    times, produced = [], 0
    try:
        for batch in range(2 + batches):
            with log.producer(TOPIC) as producer:
                keys = [f"user-{i % 997}".encode() for i in range(produced, produced + records)]
                producer.send_many(keys, [b"v"] * records)
            produced += records
            query.processAllAvailable()
            if batch >= 2:
                times.append(query.lastProgress["durationMs"]["triggerExecution"] / 1000)
    finally:
        query.stop()
    from spark_elastic.runtime.container.generations import fork_committed

    started = time.perf_counter()
    fork = fork_committed(checkpoint, f"{checkpoint}-fork")
    fork_s = time.perf_counter() - started
    batch_s = statistics.median(times)
    return {
        "batch_s": batch_s,
        "records_per_s": records / batch_s,
        "fork_s": fork_s,
        "fork_files": fork.files,
        "fork_mb": fork.bytes / 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000, help="records a batch")
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    for name in ("records", "batches", "runs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: expected a positive count, found {getattr(args, name)}")

    import storage_jvm  # type: ignore[import-not-found]

    from spark_elastic import register_log_source
    from spark_elastic.dataplane.session import local_session

    results: dict[str, list[dict[str, float]]] = {}
    with contextlib.ExitStack() as stack:
        try:
            hdfs = stack.enter_context(storage_jvm.running_hdfs())
            s3 = stack.enter_context(storage_jvm.running_s3())
        except storage_jvm.StorageJvmError as error:
            sys.exit(f"bench_checkpoint_storage: {error}")
        conf = {
            "spark.master": "local[2]",
            "spark.jars": ",".join(storage_jvm.s3a_jars()),
            **hdfs.spark_conf(),
            **s3.spark_conf(),
        }
        spark = local_session("bench-checkpoint-storage", conf=conf)
        register_log_source(spark)
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-cp-storage-"))
        roots = {"local": tmp, "hdfs": hdfs.uri, "s3": s3.uri}
        for run in range(args.runs):
            for variant in VARIANTS if run % 2 == 0 else VARIANTS[::-1]:
                checkpoint = f"{roots[variant]}/cp-{uuid.uuid4().hex[:8]}"
                figures = one(spark, Path(tmp), checkpoint, args.records, args.batches)
                results.setdefault(variant, []).append(figures)
                print(f"run {run + 1}, {variant}: {figures}", file=sys.stderr)
        spark.stop()
    local = statistics.median(r["batch_s"] for r in results["local"])
    print(
        f"| checkpoints on | batch of {args.records:,} records (median) | records/s "
        "| batch time against the local disk | a fork: seconds | files | MB |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for variant in VARIANTS:
        med = {k: statistics.median(r[k] for r in results[variant]) for k in results[variant][0]}
        print(
            f"| {variant} | {med['batch_s']:.2f} s | {args.records / med['batch_s']:,.0f} "
            f"| {med['batch_s'] / local:.2f}x | {med['fork_s']:.2f} | {med['fork_files']:.0f} "
            f"| {med['fork_mb']:.1f} |"
        )


if __name__ == "__main__":
    started = time.perf_counter()
    main()
    print(f"({time.perf_counter() - started:.0f} s in all)", file=sys.stderr)
