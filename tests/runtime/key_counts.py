"""Running counts per key of the embedded log's clicks: the generation and follow specs' query.

:class:`Count` keeps a running count per key and emits ``(key, count)`` for
every record applied; :func:`counts` is the streaming query of it at factor
2; :func:`produce` appends records of 13 keys. Spark's Python workers import
Count from here (every test folder is on their path: see the root
``conftest.py``).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from pyspark.sql import DataFrame, SparkSession

from spark_elastic import LOG_SOURCE_FORMAT, EmbeddedLog, TaskProcessor, TaskState, with_task_state
from spark_elastic.log.source import register_log_source


class Count(TaskProcessor):
    """A running count per key; emits (key, count) for every record applied."""

    state_schema = "n long"
    output_schema = "key string, n long"

    def process(self, task: TaskState, rows: pd.DataFrame) -> pd.DataFrame:
        out = []
        for key in rows["key"]:
            (n,) = task.get(key, (0,))
            task.put(key, (n + 1,))
            out.append((key.decode(), n + 1))
        return pd.DataFrame(out, columns=["key", "n"])


def produce(log: EmbeddedLog, start: int, count: int) -> None:
    with log.producer("clicks") as producer:  # one fsynced append per partition
        keys = [f"user-{i % 13}".encode() for i in range(start, start + count)]
        producer.send_many(keys, [b"v"] * count)


def counts(spark: SparkSession, log: EmbeddedLog, checkpoint: Path) -> DataFrame:
    """Running counts of every key of ``clicks``, at factor 2, 40 records a batch."""
    register_log_source(spark)
    events = (
        spark.readStream.format(LOG_SOURCE_FORMAT)
        .option("path", str(log.path))
        .option("subscribe", "clicks")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", 40)
        .load()
    )
    return events.transform(
        with_task_state(
            Count(),
            job="forks",
            checkpoint_location=checkpoint,
            elasticity_factor=2,
            partitions={"clicks": 2},
        )
    )
