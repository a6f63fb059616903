"""Hold back what a task cannot yet place in time: Kafka Streams' ``max.task.idle.ms``.

A task reading co-grouped streams in timestamp order merges its partitions
by each one's head record (:func:`~spark_elastic.dataplane.ordered.timestamp_order`).
Within one micro-batch that merge is only as good as what the batch holds:
when one of the task's partitions has nothing buffered, a record of another
partition may be placed before records that partition has yet to deliver.
Kafka Streams' ``PartitionGroup`` then waits, up to ``max.task.idle.ms``
(KIP-353, KIP-695), and counts the records it processes without waiting
(its ``enforced-processing`` metric). So does a stateful task here: what it
cannot yet place stays in its state (:data:`HELD_SCHEMA`) with its
partitions' clocks, and comes back in the next micro-batch (or when its
timer fires) merged with what is new.

The recipe (:func:`release`), pure and deterministic:

1. merge the buffer (held records, then new ones) by head timestamp, each
   partition's merge time floored at what it reached before;
2. the *ready* prefix: merge positions up to the last record of the
   partition that runs out first (the merge is the same whatever comes
   later, as long as every partition still has a record);
3. a partition with nothing buffered starts (or keeps) its idle clock;
4. when every idle partition has waited ``max_task_idle_ms`` (or the wait
   is 0), everything buffered is released and the records past the ready
   prefix are counted as *enforced*; otherwise they stay held, and the task
   asks to be woken when the longest wait ends.

Runs on executors, once per virtual task per micro-batch and per timer
(and on the driver in specs and in ``rescale``, which moves held records
with their keys). May import :mod:`spark_elastic.dataplane` and
:mod:`spark_elastic.errors`; numpy, pandas and pyarrow only inside functions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spark_elastic.dataplane.ordered import timestamp_order
from spark_elastic.errors import ArgumentError

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "HELD_SCHEMA",
    "HELD_STATE",
    "Clock",
    "Release",
    "check_idle",
    "decode_held",
    "encode_held",
    "final_marks",
    "held_from",
    "release",
    "unplaced",
]

HELD_STATE = "held_records"
"""Name of the ValueState holding a task's held-back records and its partitions' clocks."""
HELD_SCHEMA = "rows binary, clocks string"
"""The held records as one Arrow IPC stream (few large values: each state call is a round
trip), and the clocks as JSON."""

Partition = tuple[str, int]


@dataclass(frozen=True)
class Clock:
    """One partition's place in a task's merge.

    Attributes
    ----------
    time
        The partition-time its records reached (nanoseconds for timestamp
        columns, the column's own unit for integer ones), or None before any.
    idle_since_ms
        Wall-clock milliseconds since when it has had nothing buffered while
        other partitions had records waiting, or None.
    """

    time: int | None = None
    idle_since_ms: int | None = None


@dataclass(frozen=True)
class Release:
    """What a task processes now and what it keeps.

    Attributes
    ----------
    ready
        Records to process now, in merge order, on a fresh index.
    held
        Records kept for later, in merge order.
    enforced
        How many of ``ready`` were released without every partition having
        a record buffered (Kafka Streams' ``enforced-processing``).
    clocks
        Every partition's clock after this step.
    wake_at_ms
        When the longest idle wait ends, if records are held.
    """

    ready: pd.DataFrame
    held: pd.DataFrame
    enforced: int
    clocks: Mapping[Partition, Clock]
    wake_at_ms: int | None


def check_idle(name: str, value: object) -> int:
    """``value`` as a wait in milliseconds, or one clear line (driver, when defined).

    Raises
    ------
    ArgumentError
        ``value`` is not a non-negative integer.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ArgumentError.invalid(
            name, "a non-negative whole number of milliseconds (0: never wait)", value
        )
    return value


def release(
    buffer: pd.DataFrame,
    partitions: Sequence[Partition],
    clocks: Mapping[Partition, Clock],
    now_ms: int,
    idle_ms: int,
    timestamp: str,
    bootstrapping: frozenset[str] = frozenset(),
) -> Release:
    """Split a task's buffer into what it processes now and what it holds back.

    Parameters
    ----------
    buffer
        Held records first, then the micro-batch's new ones, with ``topic``,
        ``partition``, ``offset`` and ``timestamp`` columns.
    partitions
        Every ``(topic, partition)`` the task reads.
    clocks
        The partitions' clocks from the last step (missing: a new partition).
    now_ms
        Wall-clock time of this step.
    idle_ms
        How long a partition with nothing buffered is waited for (0: never).
    timestamp
        The timestamp column.
    bootstrapping
        Bootstrap streams (Samza) not yet read to their end: only their
        records go now, in time order among them; every other record is
        held, and no partition counts as idle meanwhile.
    """
    if bootstrapping:
        return _bootstrap_first(buffer, partitions, clocks, timestamp, bootstrapping)
    times = _as_ints(buffer[timestamp])
    since = {p: c.time for p, c in clocks.items() if c.time is not None}
    order = timestamp_order(
        buffer["topic"], buffer["partition"], buffer["offset"], times, timestamp, since
    )
    merged = buffer.iloc[order].reset_index(drop=True)
    merged_times = times[order]
    ready_count = _ready_count(merged, partitions)
    after = _advanced(clocks, merged, merged_times, ready_count, partitions, now_ms)
    idle = [p for p in partitions if after[p].idle_since_ms is not None]
    if not idle or _waited_out(after, idle, now_ms, idle_ms):
        released = _raised(after, merged, merged_times, len(merged))
        return Release(merged, merged.iloc[:0], len(merged) - ready_count, released, None)
    waits = [after[p].idle_since_ms for p in idle]
    wake = max(w for w in waits if w is not None) + idle_ms
    held = merged.iloc[ready_count:].reset_index(drop=True)
    return Release(merged.iloc[:ready_count], held, 0, after, wake)


def _bootstrap_first(
    buffer: pd.DataFrame,
    partitions: Sequence[Partition],
    clocks: Mapping[Partition, Clock],
    timestamp: str,
    bootstrapping: frozenset[str],
) -> Release:
    """The bootstrap streams' records now; everything else held (idle clocks stopped)."""
    first = buffer["topic"].isin(list(bootstrapping)).to_numpy()
    now = buffer[first].reset_index(drop=True)
    later = buffer[~first].reset_index(drop=True)
    if len(now):
        times = _as_ints(now[timestamp])
        since = {p: c.time for p, c in clocks.items() if c.time is not None}
        order = timestamp_order(now["topic"], now["partition"], now["offset"], times, "", since)
        now = now.iloc[order].reset_index(drop=True)
        clocks = _raised(
            {p: clocks.get(p, Clock()) for p in partitions}, now, times[order], len(now)
        )
    stopped = {p: Clock(clocks.get(p, Clock()).time, None) for p in partitions}
    return Release(now, later, 0, stopped, None)


def unplaced(merged: pd.DataFrame, partitions: Sequence[Partition]) -> int:
    """How many of a task's records, merged in time order, come after one of its partitions
    ran out: what a task that never waits processes without waiting (its enforced count)."""
    return len(merged) - _ready_count(merged, partitions)


def _as_ints(times: pd.Series) -> Any:
    """Timestamps as int64 (nanoseconds for datetimes): comparable, and storable as JSON."""
    import numpy as np
    import pandas as pd

    if pd.api.types.is_datetime64_any_dtype(times):
        if getattr(times.dt, "tz", None) is not None:
            times = times.dt.tz_convert(None)
        return times.astype("datetime64[ns]").to_numpy().astype(np.int64)
    return times.to_numpy().astype(np.int64)


def _ready_count(merged: pd.DataFrame, partitions: Sequence[Partition]) -> int:
    """How many merged records come before some partition runs out (the merge's sure prefix)."""
    import numpy as np

    topics = merged["topic"].to_numpy()
    numbers = merged["partition"].to_numpy()
    last = len(merged)
    for topic, partition in partitions:
        positions = np.flatnonzero((topics == topic) & (numbers == partition))
        if not len(positions):
            return 0
        last = min(last, int(positions[-1]) + 1)
    return last


def _advanced(
    clocks: Mapping[Partition, Clock],
    merged: pd.DataFrame,
    times: Any,
    ready_count: int,
    partitions: Sequence[Partition],
    now_ms: int,
) -> dict[Partition, Clock]:
    """Each partition's clock once the buffer is seen.

    Its time rises to its highest record's in the ready prefix (a held
    record's time must not move the records held before it). It is *idle* while records past
    the ready prefix wait and it has none of them buffered: since now if it
    delivered records in this buffer or was not idle before, else since
    when it became idle. With nothing left waiting no partition is idle.
    """
    topics = merged["topic"].to_numpy()
    numbers = merged["partition"].to_numpy()
    waiting = ready_count < len(merged)
    after: dict[Partition, Clock] = {}
    for p in partitions:
        before = clocks.get(p, Clock())
        mine = (topics == p[0]) & (numbers == p[1])
        time = _highest(before.time, times[:ready_count][mine[:ready_count]])
        if not waiting or mine[ready_count:].any():
            after[p] = Clock(time, None)
        elif mine.any() or before.idle_since_ms is None:
            after[p] = Clock(time, now_ms)
        else:
            after[p] = Clock(time, before.idle_since_ms)
    return after


def _raised(
    clocks: Mapping[Partition, Clock], merged: pd.DataFrame, times: Any, upto: int
) -> dict[Partition, Clock]:
    """Clocks with each partition's time raised to its records among the first ``upto``.

    A partition that delivered none stays idle since when it was: as in Kafka
    Streams, once its wait is over, records go on without it until it
    delivers again.
    """
    topics = merged["topic"].to_numpy()[:upto]
    numbers = merged["partition"].to_numpy()[:upto]
    raised = {}
    for p, c in clocks.items():
        mine = times[:upto][(topics == p[0]) & (numbers == p[1])]
        raised[p] = Clock(_highest(c.time, mine), None if len(mine) else c.idle_since_ms)
    return raised


def _highest(time: int | None, times: Any) -> int | None:
    if not len(times):
        return time
    reached = int(times.max())
    return reached if time is None else max(time, reached)


def _waited_out(
    clocks: Mapping[Partition, Clock], idle: Sequence[Partition], now_ms: int, idle_ms: int
) -> bool:
    """Whether every idle partition has been waited for long enough."""
    return all(
        now_ms - since >= idle_ms for p in idle if (since := clocks[p].idle_since_ms) is not None
    )


def encode_held(held: pd.DataFrame, clocks: Mapping[Partition, Clock]) -> tuple[bytes, str]:
    """A task's held records and clocks as one state value (:data:`HELD_SCHEMA`)."""
    import pyarrow as pa

    table = pa.Table.from_pandas(held, preserve_index=False)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    shown = [[t, p, c.time, c.idle_since_ms] for (t, p), c in sorted(clocks.items())]
    return sink.getvalue().to_pybytes(), json.dumps(shown)


def decode_held(rows: bytes, clocks: str) -> tuple[pd.DataFrame, dict[Partition, Clock]]:
    """The inverse of :func:`encode_held`."""
    import pyarrow as pa

    held = pa.ipc.open_stream(rows).read_all().to_pandas()
    return held, {(str(t), int(p)): Clock(time, since) for t, p, time, since in json.loads(clocks)}


def held_from(held: pd.DataFrame | None, timer: bool) -> str:
    """A task's mark after one step: where each partition's held records start (JSON).

    The records a task holds of one partition are the last ones it read of
    it (a partition's records leave the merge in offset order), so below
    that offset everything it read is released, and output. A running job's
    transactional sink publishes that as what the batch's output covers.
    ``timer``: the step was a timer's (within a micro-batch, Spark runs a
    task's new records before its timers, so a timer's mark is the later).
    Runs on executors, once per task per step.
    """
    starts: dict[str, dict[str, int]] = {}
    if held is not None and len(held):
        firsts = held.groupby(["topic", "partition"], sort=True)["offset"].min()
        for (topic, partition), offset in firsts.items():
            starts.setdefault(str(topic), {})[str(int(partition))] = int(offset)
    return json.dumps({"timer": timer, "held": starts}, sort_keys=True)


def final_marks(marks: Sequence[tuple[int, str]]) -> dict[int, dict[Partition, int]]:
    """Each task's last mark of a micro-batch: ``{task id: {(stream, partition): offset}}``.

    ``marks`` are ``(task id, held_from JSON)`` in any order; of a task's
    marks, a timer's wins (it ran after the task's new records). A task
    absent from the result ran no step in the batch: it released nothing.
    Runs on the driver, once per micro-batch of a running job that holds
    records back.
    """
    chosen: dict[int, dict[str, Any]] = {}
    for task_id, text in marks:
        mark = json.loads(text)
        if task_id not in chosen or (mark["timer"] and not chosen[task_id]["timer"]):
            chosen[task_id] = mark
    return {
        task_id: {
            (topic, int(partition)): int(offset)
            for topic, offsets in mark["held"].items()
            for partition, offset in offsets.items()
        }
        for task_id, mark in sorted(chosen.items())
    }
