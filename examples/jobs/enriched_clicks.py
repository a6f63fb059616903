"""A two-stream job for ``spark-elastic job run``: each click with its user's latest profile.

Reads the ``clicks`` and ``profiles`` topics of an embedded log (the same
partition count, keyed by user, so partition ``p`` of both holds the same
users and one task reads both), keeps each user's latest profile in the
task's keyed state, and writes ``(user, click_offset, partition, profile)``
for every click to Parquet, ``"-"`` before the user's first profile. Several
input topics: each task sees its records merged by timestamp (``Job.order``
defaults to ``"timestamp"``), so a click gets the profile its user had at
click time, not whatever the micro-batch happened to hold. Paths come from
``ENRICH_ROOT`` (default ``/tmp/spark-elastic-enrich``)::

    spark-elastic log create $ENRICH_ROOT/log clicks --partitions 4
    spark-elastic log create $ENRICH_ROOT/log profiles --partitions 4
    spark-elastic log produce $ENRICH_ROOT/log profiles --generate 2000 --keys 50 --seed 1
    spark-elastic log produce $ENRICH_ROOT/log clicks --generate 20000 --keys 50
    spark-elastic job run examples/jobs/enriched_clicks.py:job --containers 2

Across micro-batches too: a task holds back the records it cannot yet place
in time, because its other partition has nothing at or past their time yet,
until that partition catches up or has been idle for ``ENRICH_IDLE_MS``
(default 5000; Kafka Streams' ``max.task.idle.ms``). What it released without
waiting shows on the status page and in ``job status`` ("processed without
waiting"); ``ENRICH_IDLE_MS=0`` enriches within each micro-batch only
(docs/stateful.md). ``tests/runtime/test_job_run_in_time.py`` runs this job
through a failover and a move, ``tests/state/test_hold_back.py`` its processor
in a query. The coordinator and each container import this file, so it must
build the job without side effects: no Spark, no I/O.
"""

from __future__ import annotations

import os

import pandas as pd

from spark_elastic import Job, LogInput, ParquetSink, TaskProcessor, TaskState

ROOT = os.environ.get("ENRICH_ROOT", "/tmp/spark-elastic-enrich")


class Enrich(TaskProcessor):
    """Each click with its user's latest profile so far; profile updates go to state.

    Runs on an executor, once per virtual task per micro-batch, with the
    task's records of both topics in time order; pickled to the executors
    (it holds no state of its own).
    """

    state_schema = "profile string"
    output_schema = "user string, click_offset long, partition int, profile string"
    input_columns = ("value",)  # the key, topic, partition, offset and timestamp come anyway

    def process(self, task: TaskState, rows: pd.DataFrame) -> pd.DataFrame:
        """Apply profile updates and enrich clicks, in the order given."""
        out = []
        for key, topic, partition, offset, value in zip(
            rows["key"],
            rows["topic"],
            rows["partition"],
            rows["offset"],
            rows["value"],
            strict=True,
        ):
            if topic == "profiles":
                task.put(key, (value.decode(),))
            else:
                (profile,) = task.get(key) or ("-",)
                out.append((key.decode(), int(offset), int(partition), profile))
        return pd.DataFrame(out, columns=["user", "click_offset", "partition", "profile"])


job = Job(
    name="enrich",
    input=LogInput(f"{ROOT}/log", ("clicks", "profiles"), max_records_per_batch=2000),
    elasticity_factor=2,
    checkpoint_root=f"{ROOT}/checkpoints",
    sink=ParquetSink(f"{ROOT}/out"),
    processor=Enrich(),
    max_task_idle_ms=int(os.environ.get("ENRICH_IDLE_MS", "5000")),
)
