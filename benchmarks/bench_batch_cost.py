"""A container's micro-batch cost against the job's task count: flat, or one store per task.

Run: ``.venv/bin/python benchmarks/bench_batch_cost.py`` (``--factors 1,4,16,64``,
``--batches 6``, ``--runs 2``, ``--records 2000``, ``--master local[2]``). Nothing
else should run beside it.

A container owns some of a job's virtual tasks. Before, its stateful query had
one state partition per task of the job, owned or not, and each micro-batch
opened and committed the RocksDB store of every one: the factor, the
project's central knob, was a cost per batch. Now a query has as many state
partitions as it runs at once (its tasks, at most the default parallelism), each
holding several tasks keyed by their routing keys.

Here one query owns 4 tasks (key bucket 0 of each of 4 topic partitions of the
embedded log) of a job at each factor of ``--factors``, reading every
partition, ``--records`` records a micro-batch, into the noop sink, in one
SparkSession on ``--master``. Variants, alternating within a round:

- ``one store per task``: ``state_partitions`` = the job's task count, as before;
- ``per key``: the default state partitions, the per-key ``TaskProcessor``
  (``task.get``/``task.put`` per record);
- ``vectorized``: the default state partitions, a ``BatchProcessor``;
- ``vectorized, snapshots``: the same with RocksDB's changelog checkpointing
  off (the session says so), as the local disk ran before session 48: each
  batch uploads a snapshot of every state partition;
- ``Spark groupBy count``: what Spark does alone, ``groupBy("key").count()``
  of every record (update mode, RocksDB, 2 state partitions): the floor of a
  stateful micro-batch here, whatever the factor.

For each, after two warm-up batches, ``--batches`` batches: the median time
of a batch's records (Spark's ``triggerExecution`` of the batches they took,
:func:`step_seconds`; the table says how many steps took a second batch), the
machine's CPU-seconds per batch
(``/proc/stat``) and the processes and threads started per batch (the kernel's
last PID). Medians over rounds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from bench_checkpoint_files import last_pid, machine_cpu_s
from bench_stateful import TOPIC, counter_processor, events, vectorized_processor

TOPIC_PARTITIONS = 4
VARIANTS = (
    "one store per task",
    "per key",
    "vectorized",
    "Spark groupBy count",
    "vectorized, snapshots",
)
CHANGELOG_KEY = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"


def step_seconds(query: Any, after: int) -> tuple[float, int, int]:
    """The batches a step's records took: their seconds, their count, the last batch id.

    A query on a ``0 seconds`` trigger may start a batch while the step's
    records are still being appended, so they can take more than one batch:
    each batch with records since batch ``after`` counts (Spark's
    ``triggerExecution``; its recent progress keeps the last 100).
    """
    ran = [p for p in query.recentProgress if p["batchId"] > after and p["numInputRows"] > 0]
    last = max((p["batchId"] for p in query.recentProgress), default=after)
    return sum(p["durationMs"]["triggerExecution"] for p in ran) / 1000, len(ran), last


def timed_steps(query: Any, log: Any, records: int, batches: int) -> dict[str, float]:
    """Append ``records`` records and process them, ``2 + batches`` times; the last ones timed.

    Returns the median seconds a step's records took (:func:`step_seconds`), the
    machine's CPU-seconds and the processes and threads started per timed step, and
    how many timed steps took a second batch.
    """
    times, rng, seen, split = [], np.random.default_rng(1), -1, 0
    for step in range(2 + batches):
        if step == 2:
            cpu, pid = machine_cpu_s(), last_pid()
        with log.producer(TOPIC) as producer:
            keys = [f"user-{k}".encode() for k in rng.integers(0, 1000, records)]
            producer.send_many(keys, [b"v"] * records)
        query.processAllAvailable()
        seconds, count, seen = step_seconds(query, seen)
        if step >= 2:
            times.append(seconds)
            split += count - 1
    # PIDs wrap around at pid_max: the difference modulo it.
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    cpu, pid = machine_cpu_s() - cpu, (last_pid() - pid) % pid_max
    return {
        "batch_s": statistics.median(times),
        "cpu_s": cpu / batches,
        "started": pid / batches,
        "split": float(split),
    }


def owned_tasks(factor: int) -> list[str]:
    """Key bucket 0 of each topic partition: 4 tasks of the job at ``factor``."""
    from spark_elastic.model.groupers import plan_job
    from spark_elastic.model.names import TaskName
    from spark_elastic.model.plan import Grouper, StreamInput

    plan = plan_job((StreamInput("kafka", TOPIC, TOPIC_PARTITIONS),), Grouper.PARTITION, factor)
    return [n for n in plan.task_names() if TaskName.parse(n).key_bucket == 0]


def one(
    spark: Any, work: Path, variant: str, factor: int, batches: int, records: int
) -> dict[str, float]:
    """One query from a fresh checkpoint: per-batch figures after two warm-up batches."""
    from spark_elastic import EmbeddedLog, with_task_state

    root = Path(tempfile.mkdtemp(dir=work))
    log = EmbeddedLog(root / "log", fsync=False)
    log.create_topic(TOPIC, TOPIC_PARTITIONS)
    source = events(spark, log.path, root / "cp", records)
    if variant == VARIANTS[3]:
        out, mode = source.groupBy("key").count(), "update"
    else:
        vectorized = variant.startswith("vectorized")
        processor = vectorized_processor() if vectorized else counter_processor()
        out, mode = (
            source.transform(
                with_task_state(
                    processor,
                    job="bench",
                    checkpoint_location=root / "cp",
                    elasticity_factor=factor,
                    partitions={TOPIC: TOPIC_PARTITIONS},
                    tasks=owned_tasks(factor),
                    state_partitions=TOPIC_PARTITIONS * factor if variant == VARIANTS[0] else None,
                )
            ),
            "append",
        )
    spark.conf.set("spark.sql.shuffle.partitions", "2")  # the native query's; ours set their own
    if variant == VARIANTS[4]:
        spark.conf.set(CHANGELOG_KEY, "false")  # copied by the query at its start
    try:
        query = (
            out.writeStream.format("noop")
            .outputMode(mode)
            .option("checkpointLocation", str(root / "cp"))
            .trigger(processingTime="0 seconds")
            .start()
        )
    finally:
        spark.conf.unset(CHANGELOG_KEY)
    try:
        figures = timed_steps(query, log, records, batches)
        partitions = query.lastProgress["stateOperators"][0]["numShufflePartitions"]
    finally:
        query.stop()
    return {**figures, "partitions": float(partitions)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--factors", default="1,4,16,64", help="job factors, e.g. 1,4,16,64")
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--records", type=int, default=2_000, help="records a micro-batch")
    parser.add_argument("--master", default="local[2]", help="the session's master")
    args = parser.parse_args()
    try:
        factors = [int(p) for p in args.factors.split(",")]
    except ValueError:
        parser.error(f"--factors: expected powers of two such as 1,4,16, found {args.factors!r}")
    if any(f < 1 or f & (f - 1) for f in factors):
        parser.error(f"--factors: expected powers of two such as 1,4,16, found {args.factors!r}")

    from spark_elastic import register_log_source
    from spark_elastic.dataplane.session import local_session

    spark = local_session("bench-batch-cost", conf={"spark.master": args.master})
    spark.sparkContext.setLogLevel("ERROR")
    register_log_source(spark)
    results: dict[tuple[int, str], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-batch-cost-") as tmp:
        for run in range(args.runs):
            for factor in factors:
                order = VARIANTS[run % len(VARIANTS) :] + VARIANTS[: run % len(VARIANTS)]
                for variant in order:
                    figures = one(spark, Path(tmp), variant, factor, args.batches, args.records)
                    results.setdefault((factor, variant), []).append(figures)
                    print(f"run {run + 1}, factor {factor}, {variant}: {figures}", file=sys.stderr)
    spark.stop()
    load = Path("/proc/loadavg").read_text().split()[:3]
    print(f"master {args.master}, load average after: {' '.join(load)}")
    print(
        f"| job's tasks (factor) | variant | state partitions | batch of {args.records:,} "
        "records (median) | CPU-seconds per batch | processes and threads started per batch "
        "| steps split in two |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|")
    for (factor, variant), runs in sorted(results.items()):
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(
            f"| {TOPIC_PARTITIONS * factor} ({factor}) | {variant} | {med['partitions']:.0f} "
            f"| {med['batch_s']:.2f} s | {med['cpu_s']:.2f} | {med['started']:.0f} "
            f"| {sum(r['split'] for r in runs):.0f} |"
        )


if __name__ == "__main__":
    started = time.perf_counter()
    main()
    print(f"({time.perf_counter() - started:.0f} s in all)", file=sys.stderr)
