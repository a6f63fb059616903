"""The main example: a clickstream job with virtual tasks, end to end on the embedded log.

Run with ``make example`` (see the README). It

1. creates an embedded log with a ``clicks`` topic of 4 partitions and
   produces keyed click events into it, partitioned like Kafka's default
   producer; each event's value carries its user's sequence number;
2. runs a Structured Streaming query that reads the topic, applies
   ``.withVirtualTasks(8)`` (4 partitions x 8 = 32 virtual tasks, each in its
   own Spark partition) and processes each virtual task's records in offset
   order, checking that every user's events arrive in sequence;
3. prints a progress line per micro-batch and, at the end, the record count
   of every virtual task.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

import spark_elastic
from spark_elastic import LOG_SOURCE_FORMAT, EmbeddedLog, map_tasks_in_pandas, register_log_source
from spark_elastic.dataplane.session import local_session
from spark_elastic.errors import SparkElasticError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

TOPIC = "clicks"
TASK_SUMMARY = "virtual_task string, records long, users long, in_order boolean"


def summarize_task(task: str, rows: pd.DataFrame) -> pd.DataFrame:
    """One virtual task's micro-batch: count it, and check each user's events are in sequence.

    Runs on an executor, once per virtual task per micro-batch, with the rows
    already sorted by partition and offset.
    """
    sequence = rows["value"].map(lambda v: int(v.split(b":")[1]))
    in_order = bool(sequence.groupby(rows["key"]).apply(lambda s: s.is_monotonic_increasing).all())
    return pd.DataFrame(
        {
            "virtual_task": [task],
            "records": [len(rows)],
            "users": [rows["key"].nunique()],
            "in_order": [in_order],
        }
    )


def produce(log: EmbeddedLog, events: int, users: int, partitions: int, seed: int) -> int:
    """Write ``events`` clicks of ``users`` users; values are ``page:<user sequence number>``."""
    log.create_topic(TOPIC, partitions)
    rng = random.Random(seed)
    keys, values, sent = [], [], [0] * users
    for _ in range(events):
        user = rng.randrange(users)
        keys.append(f"user-{user}".encode())
        values.append(f"page{rng.randrange(20)}:{sent[user]}".encode())
        sent[user] += 1
    producer = log.producer(TOPIC)
    try:
        producer.send_many(keys, values)
    finally:
        producer.close()
    return events


def run(args: argparse.Namespace, workdir: Path) -> int:
    log = EmbeddedLog(workdir / "log")
    produced = produce(log, args.events, args.users, args.partitions, args.seed)
    print(
        f"produced {produced} click events of {args.users} users into topic {TOPIC!r} "
        f"({args.partitions} partitions) at {log.path}"
    )
    spark = local_session("spark-elastic-example")
    register_log_source(spark)
    clicks = (
        spark.readStream.format(LOG_SOURCE_FORMAT)
        .option("path", str(log.path))
        .option("subscribe", TOPIC)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", args.max_per_trigger)
        .load()
    )
    per_task = clicks.withVirtualTasks(
        args.factor, partitions=log.partition_counts([TOPIC])
    ).transform(map_tasks_in_pandas(summarize_task, TASK_SUMMARY))

    totals: dict[str, int] = {}
    all_in_order = True

    def report(batch: DataFrame, batch_id: int) -> None:
        nonlocal all_in_order
        rows = batch.collect()
        records = sum(r.records for r in rows)
        in_order = all(r.in_order for r in rows)
        all_in_order &= in_order
        for r in rows:
            totals[r.virtual_task] = totals.get(r.virtual_task, 0) + r.records
        print(
            f"batch {batch_id}: {records} records in {len(rows)} virtual tasks, "
            f"every user's events in order: {'yes' if in_order else 'NO'}",
            flush=True,
        )

    query = (
        per_task.writeStream.foreachBatch(report)
        .option("checkpointLocation", str(workdir / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    spark.stop()

    names = spark_elastic.plan_job(
        [f"kafka.{TOPIC}:{args.partitions}"], elasticity_factor=args.factor
    ).task_names()
    print(f"\n{'VIRTUAL TASK':<20} RECORDS")
    for name in names:
        print(f"{name:<20} {totals.get(name, 0)}")
    total = sum(totals.values())
    print(f"{'total':<20} {total} of {produced} produced; in order: {all_in_order}")
    return 0 if total == produced and all_in_order else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--users", type=int, default=500)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--factor", type=int, default=8, help="elasticity factor")
    parser.add_argument("--max-per-trigger", type=int, default=5_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--workdir", type=Path, help="keep the log and checkpoint here")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="spark-elastic-example-"))
    try:
        return run(args, workdir)
    except SparkElasticError as exc:
        print(f"clickstream example: error: {exc}", file=sys.stderr)
        return 2
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
