"""A stateful job for ``spark-elastic job run``: a running click count per user.

Reads the ``clicks`` topic of an embedded log, keeps one count per user in
each virtual task's keyed state, and writes ``(user, count, partition,
offset)`` for every click to Parquet. Paths come from ``CLICKS_ROOT``
(default ``/tmp/spark-elastic-clicks``), the most records a micro-batch reads
from ``CLICKS_BATCH`` (default 2000), the elasticity factor from
``CLICKS_FACTOR`` (default 4), the trigger interval from ``CLICKS_TRIGGER``
(default ``1 second``; ``0 seconds`` starts each batch as soon as the last
ends, as a catch-up wants). With ``CLICKS_KAFKA`` set to a broker's
``host:port`` it reads the topic ``CLICKS_TOPIC`` (default ``clicks``)
there instead, through Spark's Kafka source held at a gate (``KafkaInput``'s
default reader, ``gated``: containers need Spark's Kafka connector and the
project's jar, ``--conf spark.jars=...``, see docs/running-a-job.md;
``CLICKS_KAFKA_READER`` chooses another reader: ``elastic``, ``spark``), and
with ``CLICKS_OUT_TOPIC`` too it writes its
rows to that topic of the broker, exactly-once (``KafkaSink``, keyed by
user). ``CLICKS_OUT`` puts the Parquet output elsewhere, on any file system
Spark opens (``hdfs://nn:8020/clicks``, ``s3a://bucket/clicks``, with the
``--conf spark.hadoop.*`` settings that reach it)::

    spark-elastic log create $CLICKS_ROOT/log clicks --partitions 4
    spark-elastic log produce $CLICKS_ROOT/log clicks --generate 20000
    spark-elastic job run examples/jobs/click_counts.py:job --containers 2

The coordinator and each container import this file, so it must build the
job without side effects: no Spark, no I/O.
"""

from __future__ import annotations

import os

import numpy as np
import pandas as pd

from spark_elastic import (
    BatchProcessor,
    Job,
    KafkaInput,
    KafkaSink,
    LogInput,
    ParquetSink,
    TaskBatch,
    TaskUpdate,
)

ROOT = os.environ.get("CLICKS_ROOT", "/tmp/spark-elastic-clicks")
BATCH = int(os.environ.get("CLICKS_BATCH", "2000"))
KAFKA = os.environ.get("CLICKS_KAFKA")
TOPIC = os.environ.get("CLICKS_TOPIC", "clicks")
OUT_TOPIC = os.environ.get("CLICKS_OUT_TOPIC")


class ClickCount(BatchProcessor):
    """One count per user; emits the new count for every click applied.

    Vectorized: a task's clicks of a micro-batch at once, its users' counts
    as a column. Runs on an executor, once per virtual task per micro-batch;
    pickled to the executors (it holds no state of its own).
    """

    state_schema = "clicks long"
    output_schema = "user string, clicks long, partition int, offset long"
    # Besides the key: what the other columns (value, timestamps) would cost to move is saved.
    input_columns = ("partition", "offset")

    def process_batch(self, batch: TaskBatch) -> TaskUpdate:
        """Count each row's user, in offset order: a click's count is its user's before
        the batch plus its place among the user's clicks in the batch."""
        before = batch.state(default=(0,))["clicks"].to_numpy()
        users = np.array([key.decode() for key in batch.keys], dtype=object)
        return TaskUpdate(
            state=pd.DataFrame({"clicks": before + batch.key_counts()}),
            output=pd.DataFrame(
                {
                    "user": users[batch.key_index],
                    "clicks": before[batch.key_index] + batch.occurrence + 1,
                    "partition": batch.rows["partition"].to_numpy(),
                    "offset": batch.rows["offset"].to_numpy(),
                }
            ),
        )


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
    trigger_interval=os.environ.get("CLICKS_TRIGGER", "1 second"),
    checkpoint_root=os.environ.get("CLICKS_CHECKPOINTS", f"{ROOT}/checkpoints"),
    sink=(
        KafkaSink(KAFKA, OUT_TOPIC, key="user")
        if KAFKA and OUT_TOPIC
        else ParquetSink(os.environ.get("CLICKS_OUT", f"{ROOT}/out"))
    ),
    processor=ClickCount(),
)
