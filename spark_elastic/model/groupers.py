"""Groupers: turn a job's input stream partitions into tasks and virtual tasks.

:func:`plan_job` is the recipe; each step is a small pure function. The
groupers follow Samza (GroupByPartition, GroupBySystemStreamPartition,
AllSspToSingleTask), SAMZA-71's never-shipped ``cogroup`` scheme, SEP-5's
partition expansion and SEP-32's virtual tasks.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from spark_elastic.errors import (
    ArgumentError,
    ArgumentTypeError,
    PartitionExpansionError,
    PlanError,
)
from spark_elastic.model.names import TaskKind, TaskName, validate_elasticity_factor
from spark_elastic.model.plan import (
    MAX_PLAN_SIZE,
    Grouper,
    IntArray,
    JobPlan,
    PartitionMapping,
    StreamInput,
)

__all__ = ["plan_job"]

DEFAULT_PROCESSOR = "0"


def plan_job(
    inputs: Iterable[StreamInput | str],
    grouper: Grouper | str = Grouper.PARTITION,
    elasticity_factor: int = 1,
    previous: PartitionMapping | JobPlan | None = None,
    processors: Sequence[str] = (),
) -> JobPlan:
    """Plan a job: group its input partitions into tasks, then split tasks into virtual tasks.

    Runs on the driver (or anywhere: it is pure Python and numpy). Tasks are
    numbered ``0..n-1`` deterministically: base tasks in grouper order
    (inputs in the order given, partitions ascending), and each base task's
    virtual tasks by key bucket.

    Parameters
    ----------
    inputs
        The input streams, as :class:`StreamInput` or ``"system.stream:count"``.
    grouper
        ``"partition"`` (default), ``"ssp"``, ``"single"`` or ``"cogroup"``.
    elasticity_factor
        Virtual tasks per task, a power of two from 1 to 1024.
    previous
        The job's previous plan, or its partition mapping
        (:meth:`PartitionMapping.from_plan`, :func:`load_plan_json`). Streams
        that grew keep their task count and key-to-task mapping (SEP-5): new
        partition ``p`` joins the task of old partition ``p mod old_count``.
    processors
        Processor names for the single-task grouper (default: one, ``"0"``);
        a list or tuple, not a bare ``str``.

    Returns
    -------
    JobPlan

    Raises
    ------
    ArgumentError
        Bad factor, grouper, inputs or processors.
    ArgumentTypeError
        ``previous`` is not a plan or mapping, or ``processors`` is a bare ``str``.
    PartitionExpansionError
        A stream shrank, or grew to a count that is not a multiple of its old one.
    PlanError
        The previous plan used another grouper, or a new cogroup stream does
        not fit the existing groups, or the plan would have more than
        :data:`MAX_PLAN_SIZE` (2**24) stream-partition key buckets
        (partitions x elasticity factor).
    """
    kind = Grouper.of(grouper)
    factor = validate_elasticity_factor(elasticity_factor)
    streams = _validated_inputs(inputs)
    _check_plan_size(streams, factor)
    previous = _validated_previous(previous)
    if isinstance(processors, str):
        # A str is a Sequence[str]: "ab" would silently become processors "a" and "b".
        raise ArgumentTypeError.wrong_type(
            "processors", "a list or tuple of processor names, not a bare str", processors
        )
    if kind is Grouper.SINGLE:
        return _single_task_plan(streams, factor, processors, previous)
    if processors:
        raise ArgumentError.invalid(
            "processors", f"no processors with the {kind.value!r} grouper", list(processors)
        )
    ssp_input, ssp_partition = _flatten(streams)
    if previous is not None:
        _check_previous_grouper(previous, kind)
    keys = _base_keys(kind, streams, ssp_input, ssp_partition, previous)
    base_keys, ssp_base = np.unique(keys, return_inverse=True)
    ssp_base = ssp_base.astype(np.int64).reshape(-1)
    order = np.argsort(ssp_base, kind="stable").astype(np.int64)
    starts = np.searchsorted(ssp_base[order], np.arange(len(base_keys) + 1)).astype(np.int64)
    return JobPlan(
        grouper=kind,
        elasticity_factor=factor,
        inputs=streams,
        processors=(),
        ssp_input=ssp_input,
        ssp_partition=ssp_partition,
        ssp_base=ssp_base,
        base_keys=base_keys.astype(np.int64),
        member_order=order,
        member_starts=starts,
    )


# -- steps -------------------------------------------------------------------------------------


def _validated_inputs(inputs: Iterable[StreamInput | str]) -> tuple[StreamInput, ...]:
    if isinstance(inputs, str | StreamInput):
        inputs = [inputs]
    streams = tuple(StreamInput.parse(i) if isinstance(i, str) else i for i in inputs)
    for stream in streams:
        if not isinstance(stream, StreamInput):
            raise ArgumentTypeError.wrong_type(
                "inputs", "StreamInput or 'system.stream:count' items", stream
            )
    if not streams:
        raise ArgumentError.invalid("inputs", "at least one input stream", [])
    seen: set[tuple[str, str]] = set()
    for stream in streams:
        key = (stream.system, stream.stream)
        if key in seen:
            raise ArgumentError.invalid(
                "inputs", "each stream once", f"{stream.system}.{stream.stream} twice"
            )
        seen.add(key)
    return streams


def _check_plan_size(streams: Sequence[StreamInput], factor: int) -> None:
    """Refuse a plan too large to allocate, before numpy tries (see :data:`MAX_PLAN_SIZE`)."""
    partitions = sum(s.partition_count for s in streams)
    if partitions * factor > MAX_PLAN_SIZE:
        raise PlanError(
            f"plan: {partitions} stream partitions x elasticity factor {factor} = "
            f"{partitions * factor} partition key buckets, above the limit of {MAX_PLAN_SIZE} "
            "(2**24) a plan can hold in memory; use fewer partitions or a smaller factor"
        )


def _validated_previous(previous: object) -> PartitionMapping | None:
    if previous is None or isinstance(previous, PartitionMapping):
        return previous
    if isinstance(previous, JobPlan):
        return previous.partition_mapping()
    raise ArgumentTypeError.wrong_type(
        "previous",
        "a PartitionMapping or JobPlan (e.g. PartitionMapping.from_plan(plan) or "
        "load_plan_json(path)), or None",
        previous,
    )


def _flatten(streams: Sequence[StreamInput]) -> tuple[IntArray, IntArray]:
    """Per stream partition, in plan order: its input index and partition number."""
    counts = np.array([s.partition_count for s in streams], dtype=np.int64)
    ssp_input = np.repeat(np.arange(len(streams), dtype=np.int64), counts)
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    ssp_partition = np.arange(int(counts.sum()), dtype=np.int64) - starts
    return ssp_input, ssp_partition


def _base_keys(
    kind: Grouper,
    streams: Sequence[StreamInput],
    ssp_input: IntArray,
    ssp_partition: IntArray,
    previous: PartitionMapping | None,
) -> IntArray:
    """Per stream partition, the key of its base task (see :attr:`JobPlan.base_keys`)."""
    keys = _usual_base_keys(kind, streams, ssp_input, ssp_partition, previous)
    if previous is None:
        return keys
    offset = 0
    for stream in streams:
        old_tasks = previous.streams.get((stream.system, stream.stream))
        if old_tasks is not None:
            _check_expansion(stream, len(old_tasks))
            old_keys = np.array([_key_of(task, streams) for task in old_tasks], dtype=np.int64)
            partitions = np.arange(stream.partition_count, dtype=np.int64)
            keys[offset : offset + stream.partition_count] = old_keys[partitions % len(old_tasks)]
        offset += stream.partition_count
    return keys


def _usual_base_keys(
    kind: Grouper,
    streams: Sequence[StreamInput],
    ssp_input: IntArray,
    ssp_partition: IntArray,
    previous: PartitionMapping | None,
) -> IntArray:
    if kind is Grouper.PARTITION:
        return ssp_partition.copy()
    if kind is Grouper.SSP:
        return np.arange(len(ssp_partition), dtype=np.int64)
    groups = _cogroup_group_count(streams, previous)
    return ssp_partition % groups


def _cogroup_group_count(streams: Sequence[StreamInput], previous: PartitionMapping | None) -> int:
    """gcd of the partition counts; with a previous plan, its group count (SEP-5 keeps it)."""
    if previous is None or not previous.streams:
        return math.gcd(*(s.partition_count for s in streams))
    # Not the gcd of the previous counts: once a stream has grown (4 -> 8 beside 8, still 4
    # groups) that gcd overstates the groups, and new streams would split keys off them.
    groups = _previous_cogroup_groups(previous)
    # Streams of the previous plan keep their tasks (_check_expansion checks their growth).
    misfits = [
        str(s)
        for s in streams
        if (s.system, s.stream) not in previous.streams and s.partition_count % groups
    ]
    if misfits:
        raise PlanError(
            f"cogroup: the previous plan has {groups} tasks; every new stream needs a multiple "
            f"of {groups} partitions to join them, found {', '.join(misfits)}"
        )
    return groups


def _previous_cogroup_groups(previous: PartitionMapping) -> int:
    """The previous plan's group count G, after checking that cogroup made the plan.

    A cogroup plan of G tasks has every stream's partition count a multiple of
    G and partition ``p`` in ``Partition p mod G``. The partition grouper also
    names its tasks ``Partition i``, and a plan file without a ``grouper`` key
    cannot say which made it; read as cogroup, a partition-grouper plan would
    keep one task per partition, and a key of two streams with different counts
    would land in two tasks.
    """
    groups = len({task for tasks in previous.streams.values() for task in tasks})
    for (system, stream), tasks in previous.streams.items():
        if len(tasks) % groups:
            raise PlanError(
                f"previous plan: {system}.{stream} has {len(tasks)} partitions, not a multiple "
                f"of the plan's {groups} tasks; the previous plan was not made by the cogroup "
                "grouper"
            )
        for partition, task in enumerate(tasks):
            if task.partition != partition % groups:
                raise PlanError(
                    f"previous plan: partition {partition} of {system}.{stream} is in task "
                    f"{str(task)!r}, but a cogroup plan of {groups} tasks puts it in "
                    f"'Partition {partition % groups}'; the previous plan was not made by the "
                    "cogroup grouper"
                )
    return groups


def _check_previous_grouper(previous: PartitionMapping, kind: Grouper) -> None:
    if previous.grouper is not None and previous.grouper is not kind:
        raise PlanError(
            f"previous plan: it was made with the {previous.grouper.value!r} grouper and this "
            f"plan uses {kind.value!r}; partition expansion needs the same grouper"
        )
    for tasks in previous.streams.values():
        for task in tasks:
            if task.kind is not kind.task_kind:
                raise PlanError(
                    f"previous plan: task {str(task)!r} cannot come from the {kind.value!r} "
                    "grouper; partition expansion needs the same grouper"
                )


def _check_expansion(stream: StreamInput, old_count: int) -> None:
    """SEP-5: a stream may only grow, to a multiple of its old partition count."""
    new_count = stream.partition_count
    if new_count < old_count:
        raise PartitionExpansionError(
            f"stream {stream.system}.{stream.stream}: partition count shrank from {old_count} "
            f"to {new_count}; partitions can only grow, to a multiple of {old_count}"
        )
    if new_count % old_count:
        raise PartitionExpansionError(
            f"stream {stream.system}.{stream.stream}: partition count grew from {old_count} to "
            f"{new_count}, which is not a multiple of {old_count}; keys would move between tasks"
        )


def _key_of(task: TaskName, streams: Sequence[StreamInput]) -> int:
    """The base key (see :attr:`JobPlan.base_keys`) of a previous plan's task."""
    if task.kind is TaskKind.PARTITION:
        return int(task.partition)  # type: ignore[arg-type]
    ssp = task.ssp
    offset = 0
    for stream in streams:
        if ssp is not None and (stream.system, stream.stream) == (ssp.system, ssp.stream):
            if ssp.partition < stream.partition_count:
                return offset + ssp.partition
            break
        offset += stream.partition_count
    raise PlanError(
        f"previous plan: task {str(task)!r} names a stream partition this plan does not have"
    )


def _single_task_plan(
    streams: tuple[StreamInput, ...],
    factor: int,
    processors: Sequence[str],
    previous: PartitionMapping | None,
) -> JobPlan:
    if factor != 1:
        raise ArgumentError.invalid(
            "elasticity_factor",
            "1 with the 'single' grouper (AllSspToSingleTask gives every task every partition, "
            "so there is nothing to split)",
            factor,
        )
    names = tuple(processors) or (DEFAULT_PROCESSOR,)
    for name in names:
        TaskName.for_processor(name)
    if len(set(names)) != len(names):
        raise ArgumentError.invalid("processors", "distinct processor names", list(names))
    if previous is not None:
        _check_previous_grouper(previous, Grouper.SINGLE)
    ssp_input, ssp_partition = _flatten(streams)
    count = len(ssp_partition)
    return JobPlan(
        grouper=Grouper.SINGLE,
        elasticity_factor=1,
        inputs=streams,
        processors=names,
        ssp_input=ssp_input,
        ssp_partition=ssp_partition,
        ssp_base=np.full(count, -1, dtype=np.int64),
        base_keys=np.arange(len(names), dtype=np.int64),
        member_order=np.arange(count, dtype=np.int64),
        member_starts=np.zeros(len(names) + 1, dtype=np.int64),
    )
