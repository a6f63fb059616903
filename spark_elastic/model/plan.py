"""Job plans: which tasks a job has and which stream partitions (and key buckets) each reads.

A plan is stored column-wise so that planning a million virtual tasks stays a
few numpy operations: every input stream partition carries the index of its
*base task* (the task before elasticity), and virtual task ``id`` is
``base_index * elasticity_factor + key_bucket``. :class:`TaskModel` objects
and task names are built only when someone looks at them.
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import re
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

import numpy as np
import numpy.typing as npt

from spark_elastic.errors import ArgumentError, ArgumentTypeError, PlanError
from spark_elastic.model.names import SystemStreamPartition, TaskKind, TaskName

__all__ = [
    "MAX_PARTITION_COUNT",
    "MAX_PLAN_SIZE",
    "Grouper",
    "JobPlan",
    "PartitionMapping",
    "StreamInput",
    "TaskModel",
    "load_plan_json",
    "save_plan_json",
]

IntArray = npt.NDArray[np.int64]

MAX_PARTITION_COUNT = 2**31 - 1
"""The most partitions a stream can have: Kafka numbers partitions with an int32."""

MAX_PLAN_SIZE = 2**24
"""The most stream-partition key buckets (partitions x elasticity factor) a plan may hold.

Planning takes about 75 bytes per stream partition (measured), so the limit
keeps a plan near or under 1.2 GiB; beyond it numpy would fail with a
``MemoryError`` or the operating system would kill the process.
"""


class Grouper(enum.Enum):
    """How a job's input partitions are grouped into tasks."""

    PARTITION = "partition"
    """Samza's GroupByPartition: partition ``i`` of every stream goes to ``Partition i``."""
    SSP = "ssp"
    """GroupBySystemStreamPartition (SAMZA-71 ``max``): one task per stream partition."""
    SINGLE = "single"
    """AllSspToSingleTask: one task per processor, each with every partition."""
    COGROUP = "cogroup"
    """SAMZA-71 ``cogroup``: gcd(partition counts) tasks, partition ``p`` to ``p mod gcd``."""

    @classmethod
    def of(cls, value: Grouper | str) -> Grouper:
        """Accept a :class:`Grouper` or its name, with a clear error otherwise.

        Parameters
        ----------
        value
            A :class:`Grouper`, or its value: ``"partition"``, ``"ssp"``,
            ``"single"`` or ``"cogroup"``.

        Returns
        -------
        Grouper

        Raises
        ------
        ArgumentError
            ``value`` names no grouper.
        """
        if isinstance(value, Grouper):
            return value
        try:
            return cls(value)
        except ValueError:
            raise ArgumentError.invalid(
                "grouper", "a grouper name", value, [g.value for g in cls]
            ) from None

    @property
    def task_kind(self) -> TaskKind:
        """The kind of task names this grouper produces."""
        if self is Grouper.SSP:
            return TaskKind.SSP
        if self is Grouper.SINGLE:
            return TaskKind.SINGLE
        return TaskKind.PARTITION


@dataclass(frozen=True, slots=True)
class StreamInput:
    """One input stream of a job and how many partitions it has.

    Parameters
    ----------
    system
        The system, e.g. ``"kafka"``.
    stream
        The stream (topic) name.
    partition_count
        Number of partitions, at least 1.
    """

    system: str
    stream: str
    partition_count: int

    def __post_init__(self) -> None:
        # Reuse the stream-partition name rules for system and stream.
        SystemStreamPartition(self.system, self.stream, 0)
        count = self.partition_count
        if isinstance(count, bool) or not isinstance(count, int):
            raise ArgumentTypeError.wrong_type(
                f"partition count of {self.system}.{self.stream}", "a positive int", count
            )
        if not 1 <= count <= MAX_PARTITION_COUNT:
            raise ArgumentError.invalid(
                f"partition count of {self.system}.{self.stream}",
                f"at least 1 and at most {MAX_PARTITION_COUNT} (Kafka numbers partitions with "
                "an int32)",
                count,
            )

    @classmethod
    def parse(cls, text: str) -> StreamInput:
        """Parse ``system.stream:count``, the form ``spark-elastic plan --input`` takes.

        Parameters
        ----------
        text
            ``"system.stream:count"``: the system ends at the first ``.``, the
            count (ASCII digits) follows the last ``:``.

        Returns
        -------
        StreamInput

        Raises
        ------
        ArgumentError
            ``text`` does not fit the form, a name is invalid, or the count is
            outside ``[1, MAX_PARTITION_COUNT]``.
        """
        system, dot, rest = text.partition(".")
        stream, colon, count = rest.rpartition(":")
        # ASCII digits only: str.isdigit() also takes "²" and "٣", which int() then refuses.
        if not (dot and colon and system and stream and re.fullmatch(r"[0-9]+", count)):
            raise ArgumentError.invalid(
                "input", "'system.stream:partition_count', e.g. 'kafka.PVE:8'", text
            )
        return cls(system, stream, int(count))

    def __str__(self) -> str:
        return f"{self.system}.{self.stream}:{self.partition_count}"


@dataclass(frozen=True, slots=True)
class TaskModel:
    """One (virtual) task of a plan: its id, name and the partitions it reads.

    ``partitions`` carry a key bucket when the plan's elasticity factor is
    above 1: the task reads only that bucket of each partition.
    """

    id: int
    name: TaskName
    partitions: tuple[SystemStreamPartition, ...]

    def to_json(self) -> dict[str, Any]:
        """The ``spark-elastic plan --json`` form of this task.

        Returns
        -------
        dict
            ``{"id", "name", "partitions"}``; each partition is a dict of
            ``system``, ``stream``, ``partition`` and, when bucketed, ``keyBucket``.
        """
        return {
            "id": self.id,
            "name": str(self.name),
            "partitions": [_ssp_json(ssp) for ssp in self.partitions],
        }


def _ssp_json(ssp: SystemStreamPartition) -> dict[str, Any]:
    out: dict[str, Any] = {
        "system": ssp.system,
        "stream": ssp.stream,
        "partition": ssp.partition,
    }
    if ssp.key_bucket is not None:
        out["keyBucket"] = ssp.key_bucket
    return out


@dataclass(frozen=True, eq=False)
class JobPlan:
    """The tasks of a job and the input each one reads. Build with :func:`plan_job`.

    Attributes
    ----------
    grouper
        The grouper that made the plan.
    elasticity_factor
        Virtual tasks per task (1: no virtual tasks).
    inputs
        The input streams in the order given.
    processors
        Processor names (single-task grouper only).
    ssp_input
        Per input stream partition (inputs in order, partitions ascending):
        the index of its stream in :attr:`inputs`.
    ssp_partition
        Per input stream partition: its partition number.
    ssp_base
        Per input stream partition: the index of its base task, or -1 under
        the single-task grouper, where every task reads every partition.
    base_keys
        Per base task, in id order: the partition or cogroup group
        (``Partition`` tasks), the index of the task's own stream partition
        (``SystemStreamPartition`` tasks) or the processor index.
    member_order
        Stream partition indices sorted (stably) by base task.
    member_starts
        Where each base task's run starts in :attr:`member_order`; one
        extra entry at the end.
    """

    grouper: Grouper
    elasticity_factor: int
    inputs: tuple[StreamInput, ...]
    processors: tuple[str, ...]
    ssp_input: IntArray
    ssp_partition: IntArray
    ssp_base: IntArray
    base_keys: IntArray
    member_order: IntArray
    member_starts: IntArray

    # -- sizes --------------------------------------------------------------------------------

    @property
    def task_count(self) -> int:
        """Number of (virtual) tasks."""
        return len(self.base_keys) * self.elasticity_factor

    @property
    def partition_count(self) -> int:
        """Number of input stream partitions."""
        return len(self.ssp_partition)

    @property
    def tasks(self) -> TaskList:
        """All tasks in id order, built lazily."""
        return TaskList(self)

    # -- lookups ------------------------------------------------------------------------------

    def stream_partitions(self) -> list[SystemStreamPartition]:
        """Every input stream partition, in plan order.

        Returns
        -------
        list of SystemStreamPartition
            Whole partitions (no key bucket): inputs in order, partitions ascending.
        """
        return [self._ssp(i) for i in range(self.partition_count)]

    def _ssp(self, index: int, key_bucket: int | None = None) -> SystemStreamPartition:
        stream = self.inputs[int(self.ssp_input[index])]
        return SystemStreamPartition(
            stream.system, stream.stream, int(self.ssp_partition[index]), key_bucket
        )

    def base_task_name(self, base_index: int) -> TaskName:
        """The (non-virtual) name of base task ``base_index``.

        Parameters
        ----------
        base_index
            The base task's index, from 0 to ``task_count // elasticity_factor - 1``
            (not checked: numpy indexing applies).

        Returns
        -------
        TaskName
        """
        key = int(self.base_keys[base_index])
        kind = self.grouper.task_kind
        if kind is TaskKind.PARTITION:
            return TaskName.for_partition(key)
        if kind is TaskKind.SSP:
            return TaskName.for_stream_partition(self._ssp(key))
        return TaskName.for_processor(self.processors[key])

    def task_name(self, task_id: int) -> TaskName:
        """The name of task ``task_id``.

        Parameters
        ----------
        task_id
            The task id, from 0 to ``task_count - 1``.

        Returns
        -------
        TaskName
            The virtual task's name, or the base task's when the factor is 1.

        Raises
        ------
        ArgumentTypeError
            ``task_id`` is not an ``int``.
        ArgumentError
            ``task_id`` is outside ``[0, task_count)``.
        """
        base_index, bucket = divmod(self._check_task_id(task_id), self.elasticity_factor)
        base = self.base_task_name(base_index)
        if self.elasticity_factor == 1:
            return base
        return base.at_factor(bucket, self.elasticity_factor)

    def task_names(self) -> list[str]:
        """Every task's name as a string, in id order (fast path for large plans).

        Returns
        -------
        list of str
            ``str(self.task_name(i))`` for every id ``i``.
        """
        factor = self.elasticity_factor
        bases = [str(self.base_task_name(i)) for i in range(len(self.base_keys))]
        if factor == 1:
            return bases
        buckets = range(factor)
        if self.grouper.task_kind is TaskKind.PARTITION:
            return [f"{base}_{b}_{factor}" for base in bases for b in buckets]
        # "SystemStreamPartition [s, t, p]" -> "SystemStreamPartition [s, t, p, b]_f"
        return [f"{base[:-1]}, {b}]_{factor}" for base in bases for b in buckets]

    def task(self, task_id: int) -> TaskModel:
        """The full :class:`TaskModel` of task ``task_id``.

        Parameters
        ----------
        task_id
            The task id, from 0 to ``task_count - 1``.

        Returns
        -------
        TaskModel
            Its partitions carry the task's key bucket when the factor is above 1.

        Raises
        ------
        ArgumentTypeError
            ``task_id`` is not an ``int``.
        ArgumentError
            ``task_id`` is outside ``[0, task_count)``.
        """
        base_index, bucket = divmod(self._check_task_id(task_id), self.elasticity_factor)
        if self.grouper is Grouper.SINGLE:
            members: Sequence[int] | IntArray = range(self.partition_count)
        else:
            members = self._members_of(base_index)
        key_bucket = bucket if self.elasticity_factor > 1 else None
        return TaskModel(
            task_id, self.task_name(task_id), tuple(self._ssp(i, key_bucket) for i in members)
        )

    def task_id_of(self, system: str, stream: str, partition: int, key_bucket: int = 0) -> int:
        """The id of the task that reads ``key_bucket`` of the given stream partition.

        Parameters
        ----------
        system, stream, partition
            The stream partition, which must be an input of the plan.
        key_bucket
            The key bucket, from 0 to ``elasticity_factor - 1``.

        Returns
        -------
        int
            The task id.

        Raises
        ------
        ArgumentError
            ``key_bucket`` is outside ``[0, elasticity_factor)``.
        PlanError
            The stream partition is not in the plan (for instance a partition
            added after the plan was made), or the plan is single-task, where
            every task reads every partition.
        """
        if self.grouper is Grouper.SINGLE:
            raise PlanError("task_id_of: every single-task-grouper task reads every partition")
        index = self._ssp_index(system, stream, partition)
        if not 0 <= key_bucket < self.elasticity_factor:
            raise ArgumentError.invalid(
                "key_bucket", f"a bucket from 0 to {self.elasticity_factor - 1}", key_bucket
            )
        return int(self.ssp_base[index]) * self.elasticity_factor + key_bucket

    def ssp_task_ids(self) -> IntArray:
        """Per input stream partition, the id of its bucket-0 task (add the bucket for others).

        Returns
        -------
        numpy.ndarray of int64
            One id per stream partition, in plan order; -1 under the single-task
            grouper, where every task reads every partition.
        """
        return self.ssp_base * self.elasticity_factor

    def _ssp_index(self, system: str, stream: str, partition: int) -> int:
        offset = 0
        for stream_input in self.inputs:
            if (stream_input.system, stream_input.stream) == (system, stream):
                if 0 <= partition < stream_input.partition_count:
                    return offset + partition
                raise PlanError(
                    f"partition {partition} of {system}.{stream} is not in the plan, which has "
                    f"partitions 0 to {stream_input.partition_count - 1}; re-plan after the "
                    "stream grows"
                )
            offset += stream_input.partition_count
        known = ", ".join(f"{s.system}.{s.stream}" for s in self.inputs)
        raise PlanError(f"stream {system}.{stream} is not an input of the plan (inputs: {known})")

    def _check_task_id(self, task_id: int) -> int:
        if isinstance(task_id, bool) or not isinstance(task_id, int | np.integer):
            raise ArgumentTypeError.wrong_type("task_id", "an int", task_id)
        if not 0 <= task_id < self.task_count:
            raise ArgumentError.invalid(
                "task_id", f"an id from 0 to {self.task_count - 1}", task_id
            )
        return int(task_id)

    def _members_of(self, base_index: int) -> IntArray:
        start, stop = self.member_starts[base_index], self.member_starts[base_index + 1]
        return self.member_order[start:stop]

    # -- mappings -----------------------------------------------------------------------------

    def partition_mapping(self) -> PartitionMapping:
        """Each input stream partition's base task: what the next plan's expansion reads.

        Returns
        -------
        PartitionMapping
            As :meth:`PartitionMapping.from_plan` makes it.
        """
        return PartitionMapping.from_plan(self)

    def to_json(self) -> dict[str, Any]:
        """The ``spark-elastic plan --json`` document.

        Returns
        -------
        dict
            ``grouper``, ``elasticityFactor``, ``inputs`` (``system``, ``stream``,
            ``partitions``) and ``tasks`` (each as :meth:`TaskModel.to_json`).
        """
        return {
            "grouper": self.grouper.value,
            "elasticityFactor": self.elasticity_factor,
            "inputs": [
                {"system": s.system, "stream": s.stream, "partitions": s.partition_count}
                for s in self.inputs
            ],
            "tasks": [task.to_json() for task in self.tasks],
        }


class TaskList(Sequence[TaskModel]):
    """A read-only, lazily built sequence of a plan's tasks."""

    __slots__ = ("_plan",)

    def __init__(self, plan: JobPlan) -> None:
        self._plan = plan

    def __len__(self) -> int:
        return self._plan.task_count

    @overload
    def __getitem__(self, index: int) -> TaskModel: ...
    @overload
    def __getitem__(self, index: slice) -> list[TaskModel]: ...
    def __getitem__(self, index: int | slice) -> TaskModel | list[TaskModel]:
        if isinstance(index, slice):
            return [self._plan.task(i) for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        return self._plan.task(index)

    def __iter__(self) -> Iterator[TaskModel]:
        for i in range(len(self)):
            yield self._plan.task(i)


@dataclass(frozen=True)
class PartitionMapping:
    """Which base task each stream partition went to in an earlier plan (SEP-5).

    Attributes
    ----------
    grouper
        The grouper of the earlier plan, or ``None`` when unknown.
    streams
        ``(system, stream)`` -> the base task of partition 0, 1, ... in order.
    """

    grouper: Grouper | None
    streams: Mapping[tuple[str, str], tuple[TaskName, ...]]

    def partition_count(self, system: str, stream: str) -> int | None:
        """The stream's partition count in the earlier plan, ``None`` if it was not an input.

        Parameters
        ----------
        system, stream
            The stream to look up.

        Returns
        -------
        int or None
        """
        tasks = self.streams.get((system, stream))
        return None if tasks is None else len(tasks)

    @classmethod
    def from_plan(cls, plan: JobPlan) -> PartitionMapping:
        """The mapping a plan defines.

        Parameters
        ----------
        plan
            The plan to read.

        Returns
        -------
        PartitionMapping
            Each input stream's base tasks by partition; empty for a
            single-task-grouper plan.
        """
        if plan.grouper is Grouper.SINGLE:
            return cls(plan.grouper, {})
        names = [plan.base_task_name(i) for i in range(len(plan.base_keys))]
        streams: dict[tuple[str, str], tuple[TaskName, ...]] = {}
        offset = 0
        for stream_input in plan.inputs:
            bases = plan.ssp_base[offset : offset + stream_input.partition_count]
            streams[(stream_input.system, stream_input.stream)] = tuple(
                names[int(b)] for b in bases
            )
            offset += stream_input.partition_count
        return cls(plan.grouper, streams)

    @classmethod
    def from_json(cls, document: object, source: str = "previous plan") -> PartitionMapping:
        """Read the mapping back from a ``spark-elastic plan --json`` document.

        Parameters
        ----------
        document
            The parsed JSON document, as :meth:`JobPlan.to_json` writes it.
        source
            What to call the document in error messages.

        Returns
        -------
        PartitionMapping
            With the document's grouper, or ``None`` when it names none.

        Raises
        ------
        PlanError
            The document is not a plan, or its partitions are not numbered
            densely from 0 per stream, or a partition is in two tasks, or it
            mixes single-task names with others.
        """
        if not isinstance(document, dict) or not isinstance(document.get("tasks"), list):
            raise PlanError(f"{source}: expected a JSON object with a 'tasks' list")
        grouper = _document_grouper(document.get("grouper"), source)
        found: dict[tuple[str, str], dict[int, TaskName]] = {}
        kinds: set[TaskKind] = set()
        try:
            for task in document["tasks"]:
                base = TaskName.parse(task["name"]).base
                kinds.add(base.kind)
                for part in task["partitions"]:
                    key = (str(part["system"]), str(part["stream"]))
                    partition = _partition_number(part["partition"], key, source)
                    if base.kind is TaskKind.SINGLE:
                        # Every single-task-grouper task reads every partition: no mapping.
                        continue
                    seen = found.setdefault(key, {}).setdefault(partition, base)
                    if seen != base:
                        raise PlanError(
                            f"{source}: partition {partition} of {key[0]}.{key[1]} is in two "
                            f"tasks, {seen} and {base}"
                        )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, PlanError):
                raise
            raise PlanError(f"{source}: malformed task entry ({exc})") from None
        if TaskKind.SINGLE in kinds:
            return cls._single_from_json(grouper, kinds, source)
        streams: dict[tuple[str, str], tuple[TaskName, ...]] = {}
        for key, by_partition in found.items():
            if sorted(by_partition) != list(range(len(by_partition))):
                raise PlanError(
                    f"{source}: partitions of {key[0]}.{key[1]} must be numbered 0 to "
                    f"{len(by_partition) - 1}, found {sorted(by_partition)}"
                )
            streams[key] = tuple(by_partition[p] for p in range(len(by_partition)))
        return cls(grouper, streams)

    @classmethod
    def _single_from_json(
        cls, grouper: Grouper | None, kinds: set[TaskKind], source: str
    ) -> PartitionMapping:
        """The empty mapping of a single-task-grouper plan, as :meth:`from_plan` makes it."""
        if kinds != {TaskKind.SINGLE}:
            raise PlanError(
                f"{source}: expected the tasks of one grouper, found 'Task-<processor>' tasks "
                "beside tasks of another grouper"
            )
        if grouper is not None and grouper is not Grouper.SINGLE:
            raise PlanError(
                f"{source}: the plan says grouper {grouper.value!r} but its tasks are "
                "'Task-<processor>' tasks of the 'single' grouper"
            )
        return cls(Grouper.SINGLE, {})


def _document_grouper(value: object, source: str) -> Grouper | None:
    if value is None:
        return None
    choices = [g.value for g in Grouper]
    if not isinstance(value, str) or value not in choices:
        expected = ", ".join(map(repr, choices))
        raise PlanError(f"{source}: 'grouper': expected one of {expected}, found {value!r}")
    return Grouper(value)


def _partition_number(value: object, stream: tuple[str, str], source: str) -> int:
    # JSON numbers arrive as int, float (1.0, 1e400 -> inf) or bool; only a plain int is a
    # partition, so int() must not round, truncate or overflow its way to one.
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PlanError(
            f"{source}: partition of {stream[0]}.{stream[1]}: expected a non-negative integer, "
            f"found {value!r}"
        )
    return value


def save_plan_json(plan: JobPlan, path: str | os.PathLike[str]) -> None:
    """Write ``plan`` as JSON to ``path`` atomically.

    The file is written to a temporary sibling, flushed to disk and renamed
    over ``path``, so a reader sees the old plan or the new one, never half.
    Missing parent directories are created.

    Parameters
    ----------
    plan
        The plan to write, as :meth:`JobPlan.to_json`.
    path
        The file to write; an existing file is replaced.

    Raises
    ------
    PlanError
        ``path`` cannot be written: it is a directory, or a parent cannot be
        created, or the disk refused. Nothing is left behind: no temporary
        file and no directory this call created.
    """
    write_plan_json(plan, path, "path")


def write_plan_json(plan: JobPlan, path: str | os.PathLike[str], name: str) -> None:
    """:func:`save_plan_json`, naming the path ``name`` in errors (the CLI passes ``--save``)."""
    target = Path(path)
    if target.is_dir():
        raise PlanError(
            f"{name}: expected a file to write the plan to, found directory {os.fspath(path)!r}"
        )
    created = _missing_parents(target)
    existing = created[-1].parent if created else target.parent
    if existing.exists() and not existing.is_dir():
        raise PlanError(
            f"{name}: expected a file path whose parents are directories, found "
            f"{os.fspath(path)!r} ({os.fspath(existing)!r} is not a directory)"
        )
    tmp: str | None = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(plan.to_json(), out, separators=(",", ":"))
            out.write("\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, target)
    except OSError as exc:
        _remove_partial(tmp, created)
        raise PlanError(
            f"{name}: expected a writable file path for the plan, found {os.fspath(path)!r} "
            f"({exc.strerror or exc})"
        ) from None
    except BaseException:
        _remove_partial(tmp, created)
        raise


def _missing_parents(target: Path) -> list[Path]:
    """The parent directories of ``target`` that do not exist yet, deepest first."""
    missing = []
    parent = target.parent
    while not parent.exists() and parent != parent.parent:
        missing.append(parent)
        parent = parent.parent
    return missing


def _remove_partial(tmp: str | None, created: list[Path]) -> None:
    # Best effort: the original error matters more than a failure to clean up after it.
    if tmp is not None:
        with contextlib.suppress(OSError):
            Path(tmp).unlink(missing_ok=True)
    for directory in created:
        with contextlib.suppress(OSError):
            directory.rmdir()


def load_plan_json(path: str | os.PathLike[str]) -> PartitionMapping:
    """Read the partition mapping from a plan file written by :func:`save_plan_json`.

    Parameters
    ----------
    path
        The plan file (UTF-8 JSON).

    Returns
    -------
    PartitionMapping
        To pass to :func:`plan_job` as ``previous``.

    Raises
    ------
    PlanError
        The file is missing, not JSON, or not a plan.
    """
    try:
        with open(path, encoding="utf-8") as f:
            document = json.load(f)
    except FileNotFoundError:
        raise PlanError(f"previous plan: file {os.fspath(path)!r} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PlanError(f"previous plan: cannot read {os.fspath(path)!r} as JSON ({exc})") from None
    return PartitionMapping.from_json(document, source=f"previous plan {os.fspath(path)!r}")
