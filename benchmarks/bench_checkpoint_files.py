"""Checkpoint file managers: a stateful micro-batch's cost per state partition, side by side.

Run: ``.venv/bin/python benchmarks/bench_checkpoint_files.py`` (``--partitions 8,32``,
``--batches 6``, ``--runs 2``). Nothing else should run beside it.

A container's stateful query has one state partition per virtual task of the
job, whichever it owns, and every micro-batch opens and commits the RocksDB
store of each. So a batch's fixed cost grows with the job's task count. This
measures that cost under the two checkpoint file managers Spark ships, in one
SparkSession on ``local[1]`` (as each container has), with the job's
``with_task_state`` running count over 4 topic partitions of the embedded
log:

- ``FileContext``: Spark's default. On a local disk without Hadoop's native
  library, Hadoop's ``FileContext`` starts a ``readlink`` process for every
  file it renames.
- ``FileSystem``: what spark-elastic starts its stateful queries with
  (:mod:`spark_elastic.state.query_settings`), unless the session names a
  manager.

For each, after two warm-up batches, ``--batches`` micro-batches of 2,000
records: the median batch time (Spark's ``triggerExecution``), the machine's
CPU-seconds per batch (``/proc/stat``: the JVM, its Python workers and the
processes it starts), and the processes and threads started per batch (the
kernel's last PID). Variants alternate within a round; medians over rounds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_stateful import TOPIC, counter_processor, events

TOPIC_PARTITIONS = 4
RECORDS = 2_000
MANAGER_KEY = "spark.sql.streaming.checkpointFileManagerClass"
FILE_CONTEXT = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager"
)
VARIANTS = ("FileContext", "FileSystem")


def machine_cpu_s() -> float:
    """CPU-seconds the machine has spent, all cores (``/proc/stat``'s first line)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    busy = sum(int(v) for i, v in enumerate(fields) if i not in (3, 4))  # not idle, iowait
    return busy / 100


def last_pid() -> int:
    return int(Path("/proc/loadavg").read_text().split()[4])


def one(spark: Any, work: Path, variant: str, factor: int, batches: int) -> dict[str, float]:
    """One query from a fresh checkpoint: per-batch figures after two warm-up batches."""
    from spark_elastic import EmbeddedLog, with_task_state

    root = Path(tempfile.mkdtemp(dir=work))
    log = EmbeddedLog(root / "log", fsync=False)
    log.create_topic(TOPIC, TOPIC_PARTITIONS)
    if variant == "FileContext":
        spark.conf.set(MANAGER_KEY, FILE_CONTEXT)
    try:
        out = events(spark, log.path, root / "cp", RECORDS).transform(
            with_task_state(
                counter_processor(),
                job="bench",
                checkpoint_location=root / "cp",
                elasticity_factor=factor,
                partitions={TOPIC: TOPIC_PARTITIONS},
            )
        )
        query = (
            out.writeStream.format("noop")
            .option("checkpointLocation", str(root / "cp"))
            .trigger(processingTime="0 seconds")
            .start()
        )
    finally:
        spark.conf.unset(MANAGER_KEY)
    times, produced = [], 0
    try:
        for batch in range(2 + batches):
            if batch == 2:
                cpu, pid = machine_cpu_s(), last_pid()
            with log.producer(TOPIC) as producer:
                keys = [f"user-{i % 997}".encode() for i in range(produced, produced + RECORDS)]
                producer.send_many(keys, [b"v"] * RECORDS)
            produced += RECORDS
            query.processAllAvailable()
            if batch >= 2:
                times.append(query.lastProgress["durationMs"]["triggerExecution"] / 1000)
        cpu, pid = machine_cpu_s() - cpu, last_pid() - pid
    finally:
        query.stop()
    return {
        "batch_s": statistics.median(times),
        "cpu_s": cpu / batches,
        "started": pid / batches,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", default="8,32", help="state partitions, e.g. 8,32")
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    try:
        counts = [int(p) for p in args.partitions.split(",")]
    except ValueError:
        parser.error(
            f"--partitions: expected multiples of 4 such as 8,32, found {args.partitions!r}"
        )
    if any(c < TOPIC_PARTITIONS or c % TOPIC_PARTITIONS or c & (c - 1) for c in counts):
        parser.error(f"--partitions: expected powers of two from 4, found {args.partitions!r}")

    from spark_elastic import register_log_source
    from spark_elastic.dataplane.session import local_session

    spark = local_session("bench-checkpoint-files", conf={"spark.master": "local[1]"})
    register_log_source(spark)
    results: dict[tuple[int, str], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-checkpoint-files-") as tmp:
        for run in range(args.runs):
            for count in counts:
                order = VARIANTS if run % 2 == 0 else VARIANTS[::-1]
                for variant in order:
                    figures = one(
                        spark, Path(tmp), variant, count // TOPIC_PARTITIONS, args.batches
                    )
                    results.setdefault((count, variant), []).append(figures)
                    print(
                        f"run {run + 1}, {count} state partitions, {variant}: {figures}",
                        file=sys.stderr,
                    )
    spark.stop()
    print(
        f"| state partitions | manager | batch of {RECORDS:,} records (median) "
        "| CPU-seconds per batch | processes and threads started per batch |"
    )
    print("|---:|---|---:|---:|---:|")
    for (count, variant), runs in sorted(results.items()):
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(
            f"| {count} | {variant} | {med['batch_s']:.2f} s | {med['cpu_s']:.2f} "
            f"| {med['started']:.0f} |"
        )


if __name__ == "__main__":
    started = time.perf_counter()
    main()
    print(f"({time.perf_counter() - started:.0f} s in all)", file=sys.stderr)
