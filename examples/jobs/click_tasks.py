"""A stateless job for ``spark-elastic job run``: tag every click with its virtual task.

Reads the ``clicks`` topic of the embedded log at ``$CLICKS_ROOT/log`` (or,
with ``CLICKS_KAFKA`` set to a broker's ``host:port``, the topic
``CLICKS_TOPIC`` there, default ``clicks``, through Spark's Kafka source
held at a gate, ``KafkaInput``'s default: containers need
``--conf spark.jars=...``) and writes ``(user, partition, offset, task)``
for every click, each virtual task's records in offset order, to Parquet
under ``$CLICKS_ROOT/tasks-out``::

    spark-elastic job run examples/jobs/click_tasks.py:job --containers 3

Imported by the coordinator and every container: no Spark, no I/O here.
"""

from __future__ import annotations

import os

import pandas as pd

from spark_elastic import Job, KafkaInput, LogInput, ParquetSink, map_tasks_in_pandas

ROOT = os.environ.get("CLICKS_ROOT", "/tmp/spark-elastic-clicks")
KAFKA = os.environ.get("CLICKS_KAFKA")
TOPIC = os.environ.get("CLICKS_TOPIC", "clicks")
SCHEMA = "user string, partition int, offset long, task string"


def tag(task: str, rows: pd.DataFrame) -> pd.DataFrame:
    """One virtual task's records of a micro-batch, tagged with the task.

    Runs on an executor, once per virtual task per micro-batch, with the rows
    sorted by partition and offset; pickled to the executors by value.
    """
    return pd.DataFrame(
        {
            "user": [key.decode() for key in rows["key"]],
            "partition": rows["partition"].astype("int32"),
            "offset": rows["offset"].astype("int64"),
            "task": task,
        }
    )


job = Job(
    name="click-tasks",
    input=(
        KafkaInput(KAFKA, (TOPIC,), max_records_per_batch=2000)
        if KAFKA
        else LogInput(f"{ROOT}/log", ("clicks",), max_records_per_batch=2000)
    ),
    elasticity_factor=4,
    checkpoint_root=f"{ROOT}/tasks-checkpoints",
    sink=ParquetSink(f"{ROOT}/tasks-out"),
    transform=map_tasks_in_pandas(tag, SCHEMA),
)
