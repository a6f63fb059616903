"""A stateful job on the embedded log, run step by step: the state specs' machinery.

:class:`RunningCount` keeps a running count and the last offset per key and
emits one row per record, so loss (a missing count), duplication (a repeated
count) and reordering (offsets not increasing with the count) are visible.
:class:`Job` produces records and runs RunningCount queries on checkpoints
(failing once mid-batch when asked); :func:`run_to_end` runs one with any
``with_task_state`` options; :func:`final_state` reads a checkpoint's keyed
state. Spark's Python workers import RunningCount from here (every test
folder is on their path: see the root ``conftest.py``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from spark_elastic import (
    LOG_SOURCE_FORMAT,
    BatchProcessor,
    EmbeddedLog,
    TaskBatch,
    TaskProcessor,
    TaskState,
    TaskUpdate,
    read_keyed_state,
    register_log_source,
    starting_offsets,
    with_task_state,
)

TOPIC = "clicks"
PARTITIONS = 2


class RunningCount(TaskProcessor):
    """Count and last offset per key; fails once mid-batch when its marker file exists."""

    state_schema = "count long, last_offset long"
    output_schema = "key string, count long, offset long, partition int, task string"

    def __init__(self, fail_marker: str | None = None) -> None:
        self.fail_marker = fail_marker

    def process(self, task: TaskState, rows: pd.DataFrame) -> pd.DataFrame:
        out = []
        for i, (key, offset, partition) in enumerate(
            zip(rows["key"], rows["offset"], rows["partition"], strict=True)
        ):
            if self.fail_marker and i == len(rows) // 2 and Path(self.fail_marker).exists():
                Path(self.fail_marker).unlink()
                raise RuntimeError("injected failure in the middle of a micro-batch")
            count, _ = task.get(key, (0, -1))
            task.put(key, (count + 1, int(offset)))
            out.append((key.decode(), count + 1, int(offset), int(partition), task.name))
        return pd.DataFrame(out, columns=["key", "count", "offset", "partition", "task"])


class RunningCountColumns(BatchProcessor):
    """RunningCount, vectorized: the same rows and state, with a whole batch at once."""

    state_schema = RunningCount.state_schema
    output_schema = RunningCount.output_schema

    def __init__(self, fail_marker: str | None = None) -> None:
        self.fail_marker = fail_marker

    def process_batch(self, batch: TaskBatch) -> TaskUpdate:
        if self.fail_marker and Path(self.fail_marker).exists():
            Path(self.fail_marker).unlink()
            raise RuntimeError("injected failure in the middle of a micro-batch")
        before = batch.state(default=(0, -1))
        counts = before["count"].to_numpy()[batch.key_index] + batch.occurrence + 1
        offsets = batch.rows["offset"].to_numpy()
        # Each key's last record: the highest index among its rows.
        last = np.zeros(len(batch.keys), dtype=np.int64)
        np.maximum.at(last, batch.key_index, np.arange(len(offsets)))
        state = pd.DataFrame(
            {
                "count": before["count"].to_numpy() + batch.key_counts(),
                "last_offset": offsets[last],
            }
        )
        users = np.array([k.decode() for k in batch.keys], dtype=object)
        output = pd.DataFrame(
            {
                "key": users[batch.key_index],
                "count": counts,
                "offset": offsets,
                "partition": batch.rows["partition"].to_numpy(),
                "task": batch.name,
            }
        )
        return TaskUpdate(state=state, output=output)


@dataclass
class Job:
    """A stateful job on the embedded log, run step by step."""

    spark: SparkSession
    root: Path
    rng: random.Random
    scramble: bool = False
    """Shuffle the input round-robin first, so only the library's sort keeps offset order."""
    log: EmbeddedLog = field(init=False)
    outputs: list[Path] = field(default_factory=list)
    processor: type[TaskProcessor] = RunningCount
    """The running count's class: per key (``RunningCount``) or vectorized."""

    def __post_init__(self) -> None:
        self.log = EmbeddedLog(self.root / "log", fsync=False)
        if TOPIC not in self.log.topics():  # a copy of another job's root has it already
            self.log.create_topic(TOPIC, PARTITIONS)
        register_log_source(self.spark)

    def produce(self, count: int, key: bytes | None = None) -> None:
        """``count`` records of random keys (25 of them), or all of ``key``."""
        keys = [key or f"user-{self.rng.randrange(25)}".encode() for _ in range(count)]
        with self.log.producer(TOPIC) as producer:
            producer.send_many(keys, [b"x"] * count)

    def run(
        self,
        checkpoint: Path,
        factor: int,
        tasks: list[str] | None = None,
        fail: bool = False,
        max_per_trigger: int = 150,
    ) -> None:
        """Run to the end of the log; with ``fail``, die mid-batch once and restart."""
        marker = self.root / "fail-once"
        if fail:
            marker.touch()
        # A file sink's log lives beside its data and follows the checkpoint's batches,
        # so every run on one checkpoint writes to that checkpoint's output.
        output = self.root / f"out-{checkpoint.name}"
        if output not in self.outputs:
            self.outputs.append(output)
        if fail:
            with pytest.raises(StreamingQueryException) as died:
                self.start(
                    checkpoint, factor, tasks, str(marker), output, max_per_trigger
                ).awaitTermination()
            # The processor removes the marker just before it raises, so the query died
            # mid-batch of the injected failure (not of something before it), whichever
            # wrapper Spark's message puts around the Python error (CI once saw one that
            # did not quote it).
            print(f"the query died of: {str(died.value)[:2000]}")
            assert not marker.exists(), f"died before the injected failure: {died.value}"
        self.start(
            checkpoint, factor, tasks, str(marker), output, max_per_trigger
        ).awaitTermination()
        assert not marker.exists()

    def start(
        self,
        checkpoint: Path,
        factor: int,
        tasks: list[str] | None,
        marker: str,
        output: Path,
        max_per_trigger: int,
        available_now: bool = True,
        interval: str = "1 hour",
    ) -> StreamingQuery:
        events = (
            self.spark.readStream.format(LOG_SOURCE_FORMAT)
            .option("path", str(self.log.path))
            .option("subscribe", TOPIC)
            .option("startingOffsets", starting_offsets(checkpoint))
            .option("maxOffsetsPerTrigger", max_per_trigger)
            .load()
        )
        if self.scramble:
            events = events.repartition(3)
        out = events.transform(
            with_task_state(
                self.processor(marker),  # type: ignore[call-arg]
                job="running-count",
                checkpoint_location=checkpoint,
                elasticity_factor=factor,
                partitions=self.log.partition_counts([TOPIC]),
                tasks=tasks,
            )
        )
        writer = (
            out.writeStream.format("parquet")
            .option("path", str(output))
            .option("checkpointLocation", str(checkpoint))
        )
        if available_now:
            return writer.trigger(availableNow=True).start()
        return writer.trigger(processingTime=interval).start()

    def output(self) -> DataFrame:
        frames = [self.spark.read.parquet(str(p)) for p in self.outputs if p.exists()]
        union = frames[0]
        for frame in frames[1:]:
            union = union.unionByName(frame)
        return union.select("key", "count", "offset", "partition")


def final_state(spark: SparkSession, checkpoint: Path) -> DataFrame:
    return read_keyed_state(checkpoint, spark).selectExpr(
        "cast(key as string) as key",
        "count",
        "last_offset",
    )


def run_to_end(job: Job, checkpoint: Path | str, output: Path, **task_state: Any) -> None:
    """Run a RunningCount query on ``checkpoint`` (a path or URI) to the end of the log."""
    if output not in job.outputs:
        job.outputs.append(output)
    events = (
        job.spark.readStream.format(LOG_SOURCE_FORMAT)
        .option("path", str(job.log.path))
        .option("subscribe", TOPIC)
        .option("startingOffsets", starting_offsets(checkpoint))
        .load()
    )
    out = events.transform(
        with_task_state(
            RunningCount(), job="running-count", checkpoint_location=checkpoint, **task_state
        )
    )
    (
        out.writeStream.format("parquet")
        .option("path", str(output))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
        .awaitTermination()
    )
