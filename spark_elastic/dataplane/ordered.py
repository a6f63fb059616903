"""Process each virtual task's rows in the order a Samza or Kafka Streams task sees its input.

Sorting is not allowed on streaming DataFrames, so ordering happens inside a
``mapInPandas`` after routing: each Spark partition holds one virtual task's
rows of the micro-batch, which are put in order before the user's function
sees them. Two orders (:data:`ORDERS`):

- ``"offset"``: by topic, partition, offset (one stream, or streams taken
  one after the other);
- ``"timestamp"``: the task's partitions merged by the timestamp of each
  one's next record, as Kafka Streams' ``PartitionGroup`` does, each
  partition's own offset order kept (:func:`timestamp_order`).

May import :mod:`spark_elastic.dataplane.columns` and :mod:`spark_elastic.errors`;
numpy and pandas only inside functions (they run on executors).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from spark_elastic.dataplane.columns import KafkaColumns
from spark_elastic.errors import ArgumentError, ArgumentTypeError, ColumnError

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

__all__ = ["ORDERS", "TaskFunction", "map_tasks_in_pandas", "timestamp_order"]

ORDERS = ("offset", "timestamp")
"""The orders a task may see its rows in."""

_TIMESTAMP_TYPES = ("timestamp", "timestamp_ntz", "bigint", "int")

TaskFunction = Callable[[str, "pd.DataFrame"], "pd.DataFrame | Iterable[pd.DataFrame]"]
"""``func(virtual_task, rows) -> DataFrame(s)``: one call per virtual task per micro-batch."""


def map_tasks_in_pandas(
    func: TaskFunction,
    schema: StructType | str,
    columns: KafkaColumns | Mapping[str, str] | None = None,
    *,
    order: str = "offset",
    timestamp: str = "timestamp",
) -> Callable[[DataFrame], DataFrame]:
    """Call ``func`` once per virtual task with that task's rows in order.

    Apply to a DataFrame that went through :func:`with_virtual_tasks`:
    ``df.withVirtualTasks(8, ...).transform(map_tasks_in_pandas(func, schema))``.

    Parameters
    ----------
    func
        ``func(virtual_task, rows)``: ``rows`` is a pandas DataFrame of the
        task's records in this micro-batch (or batch), in ``order``, with
        every input column; return a pandas DataFrame (or an iterable of
        them) matching ``schema``. Runs on executors, in a Python worker,
        once per virtual task per micro-batch; it must be picklable
        (module-level functions and their closures are).
    schema
        The output schema, as for ``DataFrame.mapInPandas``.
    columns
        Names of the Kafka columns used for ordering, if not the defaults.
    order
        ``"offset"`` (default): sorted by topic, partition and offset.
        ``"timestamp"``: the task's partitions (of every stream it reads)
        merged by the timestamp of each one's next record, each partition's
        offset order kept (:func:`timestamp_order`); for a task that reads
        co-grouped streams, to join or correlate them in time. Within one
        micro-batch: records of a later batch come later whatever their time.
    timestamp
        The timestamp column for ``order="timestamp"`` (Spark's Kafka source
        and the embedded log call it ``timestamp``): a timestamp, or an
        integer time, never null.

    Returns
    -------
    Callable[[DataFrame], DataFrame]
        The transform, for ``df.transform(...)``; streaming-safe (no sort on
        the DataFrame itself).

    Raises
    ------
    ArgumentError
        ``order`` is not one of :data:`ORDERS`.
    ColumnError
        When applied: no ``virtual_task`` column, or ``order="timestamp"``
        and no ``timestamp`` column of a time type.
    """
    if not callable(func):
        raise ArgumentTypeError.wrong_type("func", "a callable func(virtual_task, rows)", func)
    check_order("order", order, timestamp)
    cols = KafkaColumns.of(columns)

    def transform(df: DataFrame) -> DataFrame:
        if "virtual_task" not in df.columns:
            raise ColumnError(
                "column 'virtual_task': missing; apply withVirtualTasks(...) before "
                f"map_tasks_in_pandas, found columns {sorted(df.columns)}"
            )
        if order == "timestamp":
            check_timestamp_column(df, timestamp)
        return df.mapInPandas(_in_task_order(func, cols, order, timestamp), schema)

    return transform


def check_order(name: str, order: object, timestamp: object, default: bool = False) -> None:
    """Refuse an order outside :data:`ORDERS` (None too, unless it means a default) or a bad
    timestamp column name (driver, when a transform or job is defined).

    Parameters
    ----------
    name
        The order argument's name as the caller wrote it (``order``, ``Job.order``).
    order
        The order given.
    timestamp
        The timestamp column's name given.
    default
        Whether None (the caller's default order) is accepted.

    Raises
    ------
    ArgumentError
        An unknown order.
    ArgumentTypeError
        A timestamp column name that is not a non-empty string.
    """
    if not (default and order is None) and order not in ORDERS:
        expected = "an order, or None for the default" if default else "an order"
        raise ArgumentError.invalid(name, expected, order, ORDERS)
    if not isinstance(timestamp, str) or not timestamp:
        raise ArgumentTypeError.wrong_type("timestamp", "a column name", timestamp)


def in_order(rows: pd.DataFrame, order: str, cols: KafkaColumns, timestamp: str) -> pd.DataFrame:
    """One task's rows in ``order``, on a fresh index (executor, once per task per batch).

    Parameters
    ----------
    rows
        The task's rows of one micro-batch.
    order
        ``"offset"`` or ``"timestamp"`` (:func:`timestamp_order`).
    cols
        The topic, partition and offset columns.
    timestamp
        The timestamp column, for ``"timestamp"``.

    Returns
    -------
    pandas.DataFrame
        The same rows, reordered.
    """
    if order == "timestamp":
        positions = timestamp_order(
            rows[cols.topic], rows[cols.partition], rows[cols.offset], rows[timestamp], timestamp
        )
        return rows.iloc[positions].reset_index(drop=True)
    if _one_partition_in_offset_order(rows, cols):
        return rows.reset_index(drop=True)  # as a task's records mostly come: no sort
    by_offset = [cols.topic, cols.partition, cols.offset]
    return rows.sort_values(by_offset, kind="stable").reset_index(drop=True)


def _one_partition_in_offset_order(rows: pd.DataFrame, cols: KafkaColumns) -> bool:
    """Whether ``rows`` are of one topic partition, offsets rising (vectorized: a sort of
    the topic strings costs more than looking)."""
    if len(rows) < 2:
        return True
    partitions = rows[cols.partition].to_numpy()
    offsets = rows[cols.offset].to_numpy()
    topics = rows[cols.topic].to_numpy()
    return bool(
        (partitions[1:] == partitions[0]).all()
        and (offsets[1:] > offsets[:-1]).all()
        and (topics[1:] == topics[0]).all()
    )


def check_timestamp_column(df: DataFrame, name: str, defaulted: bool = False) -> None:
    """Refuse a DataFrame whose ``name`` column cannot order records in time (driver).

    Parameters
    ----------
    df
        The rows to order.
    name
        The timestamp column.
    defaulted
        Whether timestamp order is the default here (co-grouped streams), not
        asked for: the message then says how to keep offset order instead.

    Raises
    ------
    ColumnError
        The column is missing or not a timestamp or integer type.
    """
    found = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    why = (
        "co-grouped streams are merged by timestamp by default (order='offset' keeps them by topic)"
        if defaulted
        else "order='timestamp' needs each record's timestamp"
    )
    if name not in found:
        raise ColumnError(
            f"column {name!r} (timestamp): missing; {why}, found columns {sorted(found)}"
        )
    if found[name] not in _TIMESTAMP_TYPES:
        raise ColumnError(
            f"column {name!r} (timestamp): expected type {' or '.join(_TIMESTAMP_TYPES)}, "
            f"found {found[name]}"
        )


def timestamp_order(
    topics: Any,
    partitions: Any,
    offsets: Any,
    timestamps: Any,
    what: str = "timestamp",
    since: Mapping[tuple[str, int], Any] | None = None,
) -> Any:
    """Positions of records in the order a k-way merge by head timestamp gives them.

    The merge Kafka Streams' ``PartitionGroup`` makes: each partition's
    records in offset order, and next the partition whose head record has
    the lowest timestamp. Ties between heads go to the lower topic name,
    then the lower partition number. A record whose timestamp is below an
    earlier one of its partition is not reordered: it comes right after
    that earlier record, as in the merge.

    Computed without a loop: the merge's order is the order of each record's
    partition-time (the highest timestamp of its partition up to it, the
    head's own once it is the head), then topic, partition and offset.

    Runs on executors, once per virtual task per micro-batch (and on the
    driver in specs). Arguments are equal-length sequences (numpy arrays or
    pandas Series); timestamps are numbers or datetimes, never null.

    Parameters
    ----------
    topics, partitions, offsets, timestamps
        Each record's coordinates and time.
    what
        The timestamp column's name, for the error message.
    since
        Per ``(topic, partition)``: the partition-time its earlier records
        reached (a task holding records back across micro-batches passes
        it, so a record keeps the place it would have had in one merge of
        everything). Same kind of values as ``timestamps``.

    Returns
    -------
    numpy.ndarray
        Positions into the arguments, in merge order.

    Raises
    ------
    ColumnError
        A timestamp is null.
    """
    import numpy as np
    import pandas as pd

    frame = pd.DataFrame(
        {
            "topic": np.asarray(topics, dtype=object),
            "partition": np.asarray(partitions),
            "offset": np.asarray(offsets),
            "time": pd.Series(timestamps).to_numpy(),
        }
    )
    nulls = int(pd.isna(frame["time"]).sum())
    if nulls:
        raise ColumnError(
            f"column {what!r} (timestamp): expected a timestamp on every record for "
            f"order='timestamp', found {nulls} null of {len(frame)}"
        )
    in_partitions = frame.sort_values(["topic", "partition", "offset"], kind="stable")
    partition_time = in_partitions.groupby(["topic", "partition"], sort=False)["time"].cummax()
    if since:
        floors = [
            since.get((str(t), int(p)), time)
            for t, p, time in zip(
                in_partitions["topic"], in_partitions["partition"], partition_time, strict=True
            )
        ]
        partition_time = partition_time.where(partition_time >= floors, floors)
    in_partitions = in_partitions.assign(partition_time=partition_time)
    merged = in_partitions.sort_values(
        ["partition_time", "topic", "partition", "offset"], kind="stable"
    )
    return merged.index.to_numpy()


def _in_task_order(
    func: TaskFunction, cols: KafkaColumns, order: str, timestamp: str
) -> Callable[[Iterator[pd.DataFrame]], Iterator[pd.DataFrame]]:
    """The per-partition function ``mapInPandas`` runs on executors (must be picklable)."""

    def run(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        import pandas as pd

        # The whole partition is needed before ordering: one task's rows of one micro-batch.
        frames = [batch for batch in batches if len(batch)]
        if not frames:
            return
        rows = pd.concat(frames, ignore_index=True)
        # Routing gives one task per partition; grouping keeps this correct without routing.
        for task, group in rows.groupby("virtual_task", sort=True):
            yield from frames_of(func(str(task), in_order(group, order, cols, timestamp)))

    return run


def frames_of(result: Any) -> Iterator[pd.DataFrame]:
    """A user function's result as DataFrames: one, an iterable of them, or None."""
    import pandas as pd

    if isinstance(result, pd.DataFrame):
        yield result
    elif result is not None:
        yield from result
