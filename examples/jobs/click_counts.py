"""A stateful job for ``spark-elastic job run``: a running click count per user.

Reads the ``clicks`` topic of an embedded log, keeps one count per user in
each virtual task's keyed state, and writes ``(user, count, partition,
offset)`` for every click to Parquet. Paths come from ``CLICKS_ROOT``
(default ``/tmp/spark-elastic-clicks``), the most records a micro-batch reads
from ``CLICKS_BATCH`` (default 2000), the elasticity factor from
``CLICKS_FACTOR`` (default 4). With ``CLICKS_KAFKA`` set to a broker's
``host:port`` it reads the topic ``CLICKS_TOPIC`` (default ``clicks``)
there instead, through Spark's Kafka source held at a gate (``KafkaInput``'s
default reader, ``gated``: containers need Spark's Kafka connector and the
project's jar, ``--conf spark.jars=...``, see docs/running-a-job.md;
``CLICKS_KAFKA_READER`` chooses another reader: ``elastic``, ``spark``), and
with ``CLICKS_OUT_TOPIC`` too it writes its
rows to that topic of the broker, exactly-once (``KafkaSink``, keyed by
user)::

    spark-elastic log create $CLICKS_ROOT/log clicks --partitions 4
    spark-elastic log produce $CLICKS_ROOT/log clicks --generate 20000
    spark-elastic job run examples/jobs/click_counts.py:job --containers 2

The coordinator and each container import this file, so it must build the
job without side effects: no Spark, no I/O.
"""

from __future__ import annotations

import os

import pandas as pd

from spark_elastic import (
    Job,
    KafkaInput,
    KafkaSink,
    LogInput,
    ParquetSink,
    TaskProcessor,
    TaskState,
)

ROOT = os.environ.get("CLICKS_ROOT", "/tmp/spark-elastic-clicks")
BATCH = int(os.environ.get("CLICKS_BATCH", "2000"))
KAFKA = os.environ.get("CLICKS_KAFKA")
TOPIC = os.environ.get("CLICKS_TOPIC", "clicks")
OUT_TOPIC = os.environ.get("CLICKS_OUT_TOPIC")


class ClickCount(TaskProcessor):
    """One count per user; emits the new count for every click applied.

    Runs on an executor, once per virtual task per micro-batch; pickled to
    the executors (it holds no state of its own).
    """

    state_schema = "clicks long"
    output_schema = "user string, clicks long, partition int, offset long"

    def process(self, task: TaskState, rows: pd.DataFrame) -> pd.DataFrame:
        """Count each row's user, in offset order."""
        out = []
        for key, partition, offset in zip(
            rows["key"], rows["partition"], rows["offset"], strict=True
        ):
            (clicks,) = task.get(key) or (0,)
            task.put(key, (clicks + 1,))
            out.append((key.decode(), clicks + 1, int(partition), int(offset)))
        return pd.DataFrame(out, columns=["user", "clicks", "partition", "offset"])


job = Job(
    name="clicks",
    input=(
        KafkaInput(
            KAFKA,
            (TOPIC,),
            max_records_per_batch=BATCH,
            reader=os.environ.get("CLICKS_KAFKA_READER", "gated"),
        )
        if KAFKA
        else LogInput(f"{ROOT}/log", ("clicks",), max_records_per_batch=BATCH)
    ),
    elasticity_factor=int(os.environ.get("CLICKS_FACTOR", "4")),
    checkpoint_root=f"{ROOT}/checkpoints",
    sink=(
        KafkaSink(KAFKA, OUT_TOPIC, key="user")
        if KAFKA and OUT_TOPIC
        else ParquetSink(f"{ROOT}/out")
    ),
    processor=ClickCount(),
)
