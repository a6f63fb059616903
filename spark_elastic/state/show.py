"""Read a stateful checkpoint: bucket checkpoints (`spark-elastic checkpoint show`) and keyed state.

Runs on the driver; reads the checkpoint with Spark's state data source
reader (the last committed batch), so it works on stopped and running queries.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_elastic.dataplane.routing import routing_keys
from spark_elastic.state.checkpoint_dir import (
    JobSpec,
    checkpoint_ref,
    has_seed,
    last_batch,
    never_committed,
    read_seed,
    read_state,
    require_job,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

    import pandas as pd
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["BucketOffset", "CheckpointReport", "read_checkpoint", "read_keyed_state"]


@dataclass(frozen=True, order=True)
class BucketOffset:
    """One bucket checkpoint of one virtual task.

    Attributes
    ----------
    virtual_task
        The task's name, e.g. ``Partition 0_1_2``.
    stream, partition
        The stream partition the checkpoint is for.
    key_bucket, elasticity_factor
        The key bucket it covers (a task may hold checkpoints of coarser or
        finer buckets after a rescale).
    next_offset
        The next offset of that bucket's keys to apply.
    committed_offset
        The offset the query's last committed batch read up to in that partition.
    behind
        ``committed_offset - next_offset``: records of other buckets (or
        none at all) since this bucket last saw one. Negative when the
        bucket is ahead of the query (a rescaled bucket that some source
        had already applied).
    """

    virtual_task: str
    stream: str
    partition: int
    key_bucket: int
    elasticity_factor: int
    next_offset: int
    committed_offset: int
    behind: int


@dataclass(frozen=True)
class CheckpointReport:
    """A checkpoint's job, last batch and bucket checkpoints.

    Attributes
    ----------
    path
        The checkpoint directory.
    job
        Its ``job.json``.
    batch_id
        The last micro-batch in Spark's offset log, ``None`` before the first.
    committed
        Whether that batch committed.
    offsets
        The source offsets the last committed batch read up to, per topic
        and partition (as strings, like Spark's offset log).
    buckets
        Every bucket checkpoint stored, by virtual task.
    """

    path: Path | str
    job: JobSpec
    batch_id: int | None
    committed: bool
    offsets: dict[str, dict[str, int]]
    buckets: tuple[BucketOffset, ...]

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` document.

        Returns
        -------
        dict
            ``checkpoint``, ``job`` (its ``job.json``), ``batchId``,
            ``lastBatchCommitted``, ``committedOffsets`` and ``buckets``, one dict
            per bucket checkpoint with the :class:`BucketOffset` fields in camelCase.
        """
        return {
            "checkpoint": str(self.path),
            "job": self.job.to_json(),
            "batchId": self.batch_id,
            "lastBatchCommitted": self.committed,
            "committedOffsets": self.offsets,
            "buckets": [
                {
                    "virtualTask": b.virtual_task,
                    "stream": b.stream,
                    "partition": b.partition,
                    "keyBucket": b.key_bucket,
                    "elasticityFactor": b.elasticity_factor,
                    "nextOffset": b.next_offset,
                    "committedOffset": b.committed_offset,
                    "behind": b.behind,
                }
                for b in self.buckets
            ],
        }


def read_checkpoint(
    path: str | os.PathLike[str], spark: SparkSession | None = None
) -> CheckpointReport:
    """Each virtual task's bucket checkpoints and how far behind the committed offsets they are.

    Runs on the driver; reads the state with Spark's state data source, so it
    works on a running query's checkpoint too (as of its last commit).

    Parameters
    ----------
    path
        A checkpoint written by a :func:`with_task_state` query or by :func:`rescale`.
    spark
        The session to read state with (default: the active one, or a local one).

    Returns
    -------
    CheckpointReport

    Raises
    ------
    CheckpointError
        Not a spark-elastic stateful checkpoint, or unreadable.
    """
    from spark_elastic.dataplane.session import active_or_local_session
    from spark_elastic.state.processor import CHECKPOINT_STATE

    checkpoint = checkpoint_ref(path)
    job = require_job(checkpoint)
    batch = last_batch(checkpoint)
    plan = job.plan()
    names = dict(zip(routing_keys(plan.task_count).tolist(), plan.task_names(), strict=True))
    buckets: list[BucketOffset] = []
    if (batch is not None and batch.committed) or (batch is not None and batch.batch_id > 0):
        stored = read_state(spark or active_or_local_session(), checkpoint, CHECKPOINT_STATE)
        rows = (
            []
            if stored is None
            else stored.select("key.routing_key", "user_map_key.*", "user_map_value.*").collect()
        )
        for row in rows:
            committed = batch.committed_offset(row.stream, row.partition)
            buckets.append(
                BucketOffset(
                    names.get(row.routing_key, f"<routing key {row.routing_key}>"),
                    row.stream,
                    row.partition,
                    row.key_bucket,
                    row.factor,
                    row.next_offset,
                    committed,
                    committed - row.next_offset,
                )
            )
    order = {name: i for i, name in enumerate(plan.task_names())}
    buckets.sort(
        key=lambda b: (
            order.get(b.virtual_task, -1),
            b.stream,
            b.partition,
            b.elasticity_factor,
            b.key_bucket,
        )
    )
    return CheckpointReport(
        checkpoint,
        job,
        None if batch is None else batch.batch_id,
        False if batch is None else batch.committed,
        {} if batch is None else batch.offsets,
        tuple(buckets),
    )


def read_keyed_state(
    path: str | os.PathLike[str],
    spark: SparkSession | None = None,
    batch_id: int | None = None,
) -> DataFrame:
    """A stateful checkpoint's keyed state, one row per key: what ``TaskState.get`` would return.

    Runs on the driver (plans a batch read with Spark's state data source);
    the chunks are decoded on executors, in Python workers. Works on running
    queries (as of their last commit) and on both state layouts.

    Parameters
    ----------
    path
        A checkpoint written by a :func:`with_task_state` query or by :func:`rescale`.
    spark
        The session to read with (default: the active one, or a local one).
    batch_id
        Read as of this committed batch (default: the last committed one; for
        a checkpoint :func:`rescale` made whose query has not committed a
        batch yet, the state its first batch will load).

    Returns
    -------
    pyspark.sql.DataFrame
        ``virtual_task string, key binary``, then the ``state_schema`` fields.
        Empty when the checkpoint holds no state yet.

    Raises
    ------
    CheckpointError
        Not a spark-elastic stateful checkpoint, or unreadable.
    """
    from pyspark.sql import functions as F

    from spark_elastic.dataplane.session import active_or_local_session
    from spark_elastic.state.processor import OLD_USER_STATE, USER_STATE

    session = spark or active_or_local_session()
    checkpoint = checkpoint_ref(path)
    job = require_job(checkpoint)
    plan = job.plan()
    fields = session.createDataFrame([], job.state_schema).schema.fields
    columns = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in fields)
    schema = f"virtual_task string, key binary, {columns}"
    names = dict(zip(routing_keys(plan.task_count).tolist(), plan.task_names(), strict=True))
    task_name = F.create_map(*[x for k, n in names.items() for x in (F.lit(k), F.lit(n))])
    if job.state_layout == 1:
        stored = read_state(session, checkpoint, OLD_USER_STATE, batch_id)
        if stored is None:
            return session.createDataFrame([], schema)
        return stored.select(
            task_name[F.col("key.routing_key")].alias("virtual_task"),
            F.col("user_map_key.key").alias("key"),
            *[F.col(f"user_map_value.`{f.name}`") for f in fields],
        )
    seed = has_seed(checkpoint) if never_committed(checkpoint) else None
    if seed is not None:
        # Made by rescale, not started: the state is the seed its first batch loads.
        chunks = (
            read_seed(session, seed)
            .where("kind = 'chunk'")
            .select(task_name[F.col("routing_key")].alias("virtual_task"), "data")
        )
    else:
        stored = read_state(session, checkpoint, USER_STATE, batch_id)
        if stored is None:
            return session.createDataFrame([], schema)
        chunks = stored.select(
            task_name[F.col("key.routing_key")].alias("virtual_task"),
            F.col("user_map_value.data").alias("data"),
        )
    return chunks.mapInPandas(_DecodeChunks(tuple(f.name for f in fields)), schema)


class _DecodeChunks:
    """``mapInPandas`` function: chunks to one row per key.

    Runs on executors, once per Arrow batch of chunks; pickled with the field names.
    """

    def __init__(self, fields: tuple[str, ...]) -> None:
        self.fields = fields

    def __call__(self, frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        import pandas as pd

        from spark_elastic.state.chunks import decode

        for frame in frames:
            tasks, keys = [], []
            values: list[list[object]] = [[] for _ in self.fields]
            for task, data in zip(frame["virtual_task"], frame["data"], strict=True):
                for key, (_, value) in decode(bytes(data)).items():
                    tasks.append(task)
                    keys.append(key)
                    for column, v in zip(values, value, strict=True):
                        column.append(v)
            out = {"virtual_task": tasks, "key": keys}
            # object columns: an int field with nulls must not turn into floats
            out.update(
                (name, pd.Series(column, dtype=object))
                for name, column in zip(self.fields, values, strict=True)
            )
            yield pd.DataFrame(out)


def format_report(report: CheckpointReport) -> str:
    """The human table."""
    job = report.job
    lines = [
        f"checkpoint {report.path}: job {job.name!r}, elasticity factor {job.elasticity_factor}, "
        f"tasks {'all' if job.tasks is None else len(job.tasks)}; last batch "
        + (
            "none"
            if report.batch_id is None
            else f"{report.batch_id} ({'committed' if report.committed else 'NOT committed'})"
        )
    ]
    if job.starting_offsets is not None and report.batch_id is None:
        lines.append(
            f"seeded by rescale; start the query at startingOffsets {job.starting_offsets}"
        )
    header = ("VIRTUAL TASK", "STREAM", "PARTITION", "BUCKET", "NEXT OFFSET", "COMMITTED", "BEHIND")
    rows = [
        (
            b.virtual_task,
            b.stream,
            str(b.partition),
            f"{b.key_bucket}/{b.elasticity_factor}",
            str(b.next_offset),
            str(b.committed_offset),
            str(b.behind),
        )
        for b in report.buckets
    ]
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)
    ]
    lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    lines.extend("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)
    if not rows:
        lines.append("(no bucket checkpoints yet)")
    return "\n".join(lines)
