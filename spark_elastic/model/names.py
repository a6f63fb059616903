"""The task model: stream partitions, key buckets, elasticity factors, task names.

Pure Python, no Spark. Names and string forms follow Samza so that a name
alone tells its partition, key bucket and elasticity factor (SEP-32):

========================================  =====================================
``SystemStreamPartition [kafka, PVE, 0]``     a stream partition
``SystemStreamPartition [kafka, PVE, 0, 1]``  key bucket 1 of that partition
``Partition 0``                               GroupByPartition task
``Partition 0_1_2``                           its virtual task: bucket 1, factor 2
``SystemStreamPartition [kafka, PVE, 0]``     GroupBySystemStreamPartition task
``SystemStreamPartition [kafka, PVE, 0, 1]_2``  its virtual task, factor 2
``Task-<processor>``                          AllSspToSingleTask task
========================================  =====================================
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from spark_elastic.errors import ArgumentError, ArgumentTypeError, TaskNameError

__all__ = [
    "MAX_ELASTICITY_FACTOR",
    "Lineage",
    "SystemStreamPartition",
    "TaskKind",
    "TaskName",
    "bucket_lineage",
    "is_power_of_two",
    "lineage",
    "parent_bucket",
    "validate_elasticity_factor",
]

MAX_ELASTICITY_FACTOR = 1024
_FORBIDDEN_NAME_CHARS = frozenset(",[]")


def is_power_of_two(value: int) -> bool:
    """Whether ``value`` is 1, 2, 4, 8, ..."""
    return value > 0 and value & (value - 1) == 0


def validate_elasticity_factor(value: object, name: str = "elasticity_factor") -> int:
    """Return ``value`` if it is a valid elasticity factor, else raise.

    A valid factor is a power of two from 1 to 1024 (SEP-32 splits and merges
    virtual tasks by halving and doubling, so only powers of two nest).

    Parameters
    ----------
    value
        The candidate factor.
    name
        The argument name to put in the error message.

    Returns
    -------
    int
        ``value`` itself.

    Raises
    ------
    ArgumentTypeError
        ``value`` is not an ``int``.
    ArgumentError
        ``value`` is not a power of two in ``[1, 1024]``.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError.wrong_type(name, "an int power of two from 1 to 1024", value)
    if not (1 <= value <= MAX_ELASTICITY_FACTOR and is_power_of_two(value)):
        raise ArgumentError.invalid(
            name, f"a power of two from 1 to {MAX_ELASTICITY_FACTOR} (1, 2, 4, ..., 1024)", value
        )
    return value


def _validate_name(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise ArgumentTypeError.wrong_type(name, "a str", value)
    if not value or value != value.strip() or _FORBIDDEN_NAME_CHARS & set(value):
        raise ArgumentError.invalid(
            name, "a non-empty name without surrounding spaces, ',', '[' or ']'", value
        )
    return value


def _validate_index(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError.wrong_type(name, "a non-negative int", value)
    if value < 0:
        raise ArgumentError.invalid(name, "a non-negative int", value)
    return value


@dataclass(frozen=True, slots=True, order=True)
class SystemStreamPartition:
    """One partition of one stream of one system, optionally one key bucket of it.

    Parameters
    ----------
    system
        The input system, ``"kafka"`` for Kafka and the embedded log.
    stream
        The stream (Kafka topic) name.
    partition
        The partition index, from 0.
    key_bucket
        The key bucket (SEP-32's SSPKb) or ``None`` for the whole partition.
    """

    system: str
    stream: str
    partition: int
    key_bucket: int | None = None

    def __post_init__(self) -> None:
        _validate_name(self.system, "system")
        _validate_name(self.stream, "stream")
        _validate_index(self.partition, "partition")
        if self.key_bucket is not None:
            _validate_index(self.key_bucket, "key_bucket")

    def __str__(self) -> str:
        bucket = "" if self.key_bucket is None else f", {self.key_bucket}"
        return f"SystemStreamPartition [{self.system}, {self.stream}, {self.partition}{bucket}]"

    def whole(self) -> SystemStreamPartition:
        """This partition without its key bucket.

        Returns
        -------
        SystemStreamPartition
            The same system, stream and partition with ``key_bucket=None``.
        """
        return SystemStreamPartition(self.system, self.stream, self.partition)

    def with_bucket(self, key_bucket: int | None) -> SystemStreamPartition:
        """The same partition restricted to ``key_bucket``.

        Parameters
        ----------
        key_bucket
            The key bucket, a non-negative int, or ``None`` for the whole partition.

        Returns
        -------
        SystemStreamPartition

        Raises
        ------
        ArgumentTypeError
            ``key_bucket`` is neither an ``int`` nor ``None``.
        ArgumentError
            ``key_bucket`` is negative.
        """
        return SystemStreamPartition(self.system, self.stream, self.partition, key_bucket)

    @classmethod
    def parse(cls, text: str) -> SystemStreamPartition:
        """Parse Samza's string form, with or without a key bucket.

        Parameters
        ----------
        text
            ``"SystemStreamPartition [system, stream, partition]"``, optionally
            with a fourth ``key_bucket`` field, as ``str()`` writes it.

        Returns
        -------
        SystemStreamPartition

        Raises
        ------
        TaskNameError
            ``text`` does not fit the format.
        ArgumentError
            The system or stream name has surrounding spaces.
        """
        match = _SSP_RE.fullmatch(text)
        if match is None:
            raise TaskNameError(
                f"stream partition: expected 'SystemStreamPartition [system, stream, partition"
                f"(, key_bucket)]', found {text!r}"
            )
        bucket = match["bucket"]
        return cls(
            match["system"],
            match["stream"],
            int(match["partition"]),
            None if bucket is None else int(bucket),
        )


# Numbers in names are canonical ASCII integers, exactly as ``str(int)`` writes them: ``\d``
# would also take "00" or non-ASCII digits such as "٣", giving two spellings of one task.
_INT = r"(?:0|[1-9][0-9]*)"
_SSP_BODY = (
    r"SystemStreamPartition \[(?P<system>[^,\[\]]+), (?P<stream>[^,\[\]]+), "
    rf"(?P<partition>{_INT})(?:, (?P<bucket>{_INT}))?\]"
)
_SSP_RE = re.compile(_SSP_BODY)
_SSP_TASK_RE = re.compile(_SSP_BODY + rf"(?:_(?P<factor>{_INT}))?")
_PARTITION_TASK_RE = re.compile(
    rf"Partition (?P<partition>{_INT})(?:_(?P<bucket>{_INT})_(?P<factor>{_INT}))?"
)
_SINGLE_TASK_RE = re.compile(r"Task-(?P<processor>.+)", re.DOTALL)


class TaskKind(enum.Enum):
    """Which grouper family a task name belongs to."""

    PARTITION = "partition"
    """``Partition i``: GroupByPartition, cogroup (i is the task's partition or gcd group)."""
    SSP = "ssp"
    """``SystemStreamPartition [...]``: GroupBySystemStreamPartition."""
    SINGLE = "single"
    """``Task-<processor>``: AllSspToSingleTask."""


@dataclass(frozen=True, slots=True)
class TaskName:
    """A task or virtual task, in Samza's naming scheme.

    Build with :meth:`partition`, :meth:`stream_partition` or :meth:`single`;
    ``str()`` gives the Samza name and :meth:`parse` reads it back.

    Attributes
    ----------
    kind
        The grouper family.
    partition
        The partition (or cogroup group) for :attr:`TaskKind.PARTITION`.
    ssp
        The whole stream partition for :attr:`TaskKind.SSP`.
    processor
        The processor for :attr:`TaskKind.SINGLE`.
    key_bucket
        The key bucket, from 0 to ``elasticity_factor - 1`` (0 when the
        factor is 1).
    elasticity_factor
        How many virtual tasks the task was split into; 1 for a plain task.
    """

    kind: TaskKind
    partition: int | None = None
    ssp: SystemStreamPartition | None = None
    processor: str | None = None
    key_bucket: int = 0
    elasticity_factor: int = 1

    def __post_init__(self) -> None:
        validate_elasticity_factor(self.elasticity_factor)
        _validate_index(self.key_bucket, "key_bucket")
        if self.key_bucket >= self.elasticity_factor:
            raise ArgumentError.invalid(
                "key_bucket",
                f"a bucket from 0 to {self.elasticity_factor - 1} "
                f"(elasticity factor {self.elasticity_factor})",
                self.key_bucket,
            )
        if self.kind is TaskKind.SINGLE and self.elasticity_factor != 1:
            raise ArgumentError.invalid(
                "elasticity_factor",
                "1: the single-task grouper does not support elasticity",
                self.elasticity_factor,
            )

    # -- constructors -------------------------------------------------------------------------

    @classmethod
    def for_partition(
        cls, partition: int, key_bucket: int = 0, elasticity_factor: int = 1
    ) -> TaskName:
        """``Partition <partition>[_<bucket>_<factor>]``.

        Parameters
        ----------
        partition
            The partition (or cogroup group) index, from 0.
        key_bucket, elasticity_factor
            The virtual task's bucket, from 0 to ``elasticity_factor - 1``, and
            its factor, a power of two from 1 to 1024 (1: a plain task).

        Returns
        -------
        TaskName
            A :attr:`TaskKind.PARTITION` name.

        Raises
        ------
        ArgumentTypeError
            An argument is not an ``int``.
        ArgumentError
            ``partition`` is negative, the factor is invalid, or the bucket is
            outside ``[0, elasticity_factor)``.
        """
        return cls(
            TaskKind.PARTITION,
            partition=_validate_index(partition, "partition"),
            key_bucket=key_bucket,
            elasticity_factor=elasticity_factor,
        )

    @classmethod
    def for_stream_partition(
        cls, ssp: SystemStreamPartition, key_bucket: int = 0, elasticity_factor: int = 1
    ) -> TaskName:
        """``SystemStreamPartition [system, stream, p[, bucket]][_<factor>]``.

        Parameters
        ----------
        ssp
            The stream partition; any key bucket it carries is dropped.
        key_bucket, elasticity_factor
            The virtual task's bucket, from 0 to ``elasticity_factor - 1``, and
            its factor, a power of two from 1 to 1024 (1: a plain task).

        Returns
        -------
        TaskName
            A :attr:`TaskKind.SSP` name.

        Raises
        ------
        ArgumentTypeError
            ``ssp`` is not a :class:`SystemStreamPartition`, or the bucket or
            factor is not an ``int``.
        ArgumentError
            The factor is invalid, or the bucket is outside ``[0, elasticity_factor)``.
        """
        if not isinstance(ssp, SystemStreamPartition):
            raise ArgumentTypeError.wrong_type("ssp", "a SystemStreamPartition", ssp)
        return cls(
            TaskKind.SSP,
            ssp=ssp.whole(),
            key_bucket=key_bucket,
            elasticity_factor=elasticity_factor,
        )

    @classmethod
    def for_processor(cls, processor: str) -> TaskName:
        """``Task-<processor>``.

        Parameters
        ----------
        processor
            The processor name, a non-empty ``str``.

        Returns
        -------
        TaskName
            A :attr:`TaskKind.SINGLE` name (never virtual).

        Raises
        ------
        ArgumentError
            ``processor`` is not a non-empty ``str``.
        """
        if not isinstance(processor, str) or not processor:
            raise ArgumentError.invalid("processor", "a non-empty processor name", processor)
        return cls(TaskKind.SINGLE, processor=processor)

    # -- properties ---------------------------------------------------------------------------

    @property
    def is_virtual(self) -> bool:
        """Whether this is a virtual task (a key-bucket slice of a task)."""
        return self.elasticity_factor > 1

    @property
    def base(self) -> TaskName:
        """The task this virtual task is a slice of (itself when not virtual)."""
        if not self.is_virtual:
            return self
        return TaskName(self.kind, self.partition, self.ssp, self.processor)

    def at_factor(self, key_bucket: int, elasticity_factor: int) -> TaskName:
        """The task with the same base at another bucket and factor.

        Parameters
        ----------
        key_bucket, elasticity_factor
            The new bucket, from 0 to ``elasticity_factor - 1``, and factor, a
            power of two from 1 to 1024 (1 for a single-task name).

        Returns
        -------
        TaskName

        Raises
        ------
        ArgumentTypeError
            The bucket or factor is not an ``int``.
        ArgumentError
            The factor is invalid, the bucket is outside ``[0, elasticity_factor)``,
            or a single-task name is given a factor other than 1.
        """
        return TaskName(
            self.kind, self.partition, self.ssp, self.processor, key_bucket, elasticity_factor
        )

    def __str__(self) -> str:
        if self.kind is TaskKind.PARTITION:
            if not self.is_virtual:
                return f"Partition {self.partition}"
            return f"Partition {self.partition}_{self.key_bucket}_{self.elasticity_factor}"
        if self.kind is TaskKind.SSP:
            ssp = self.ssp
            if ssp is None:  # pragma: no cover - guarded by the constructors
                raise TaskNameError("stream-partition task without a stream partition")
            if not self.is_virtual:
                return str(ssp)
            return f"{ssp.with_bucket(self.key_bucket)}_{self.elasticity_factor}"
        return f"Task-{self.processor}"

    @classmethod
    def parse(cls, text: str) -> TaskName:
        """Read a task name back into its parts.

        Parameters
        ----------
        text
            A task name as ``str()`` writes it (see the module docstring).

        Returns
        -------
        TaskName

        Raises
        ------
        ArgumentTypeError
            ``text`` is not a ``str``.
        TaskNameError
            ``text`` fits none of the formats, or names a bucket outside its
            factor, or spells a plain task in the virtual form.
        """
        if not isinstance(text, str):
            raise ArgumentTypeError.wrong_type("task name", "a str", text)
        try:
            if match := _PARTITION_TASK_RE.fullmatch(text):
                bucket, factor = _bucket_and_factor(match["bucket"], match["factor"], text)
                return cls.for_partition(int(match["partition"]), bucket, factor)
            if match := _SSP_TASK_RE.fullmatch(text):
                has_bucket = match["bucket"] is not None
                if has_bucket != (match["factor"] is not None):
                    raise TaskNameError(
                        f"task name: a key bucket and an elasticity factor go together, "
                        f"found {text!r}"
                    )
                bucket, factor = _bucket_and_factor(match["bucket"], match["factor"], text)
                ssp = SystemStreamPartition(
                    match["system"], match["stream"], int(match["partition"])
                )
                return cls.for_stream_partition(ssp, bucket, factor)
            if match := _SINGLE_TASK_RE.fullmatch(text):
                return cls.for_processor(match["processor"])
        except TaskNameError:
            raise
        except ArgumentError as exc:
            raise TaskNameError(f"task name {text!r}: {exc}") from None
        raise TaskNameError(
            f"task name: expected one of 'Partition <p>', 'Partition <p>_<bucket>_<factor>', "
            f"'SystemStreamPartition [<system>, <stream>, <p>]', "
            f"'SystemStreamPartition [<system>, <stream>, <p>, <bucket>]_<factor>', "
            f"'Task-<processor>'; found {text!r}"
        )


def _bucket_and_factor(bucket: str | None, factor: str | None, text: str) -> tuple[int, int]:
    if bucket is None or factor is None:
        return 0, 1
    if int(factor) == 1:
        raise TaskNameError(
            f"task name: a task with elasticity factor 1 is written without the bucket suffix, "
            f"found {text!r}"
        )
    return int(bucket), int(factor)


def parent_bucket(key_bucket: int, elasticity_factor: int) -> int:
    """The bucket at half the factor that ``key_bucket`` was split from.

    Bucket ``b`` at factor ``f`` is the parent of buckets ``b`` and ``b + f``
    at factor ``2f``.

    Raises
    ------
    ArgumentTypeError
        ``key_bucket`` or ``elasticity_factor`` is not an ``int``.
    ArgumentError
        The factor is not a valid factor of at least 2, or ``key_bucket`` is
        outside ``[0, elasticity_factor)``.
    """
    validate_elasticity_factor(elasticity_factor)
    if elasticity_factor == 1:
        raise ArgumentError.invalid(
            "elasticity_factor", "a factor of at least 2 to have a parent", elasticity_factor
        )
    _validate_bucket(key_bucket, "key_bucket", elasticity_factor, "elasticity_factor")
    return key_bucket % (elasticity_factor // 2)


def _validate_bucket(bucket: object, name: str, factor: int, factor_name: str) -> int:
    # A bucket outside its factor names no keys; modular arithmetic would still answer.
    if isinstance(bucket, bool) or not isinstance(bucket, int):
        raise ArgumentTypeError.wrong_type(name, f"an int bucket from 0 to {factor - 1}", bucket)
    if not 0 <= bucket < factor:
        raise ArgumentError.invalid(
            name, f"a bucket from 0 to {factor - 1} ({factor_name}={factor})", bucket
        )
    return bucket


class Lineage(enum.Enum):
    """How two virtual tasks of the same task relate (SEP-32 split and merge)."""

    SAME = "same"
    ANCESTOR = "ancestor"
    """The first is an ancestor: its bucket was split into the second's."""
    DESCENDANT = "descendant"
    """The first descends from the second."""
    UNRELATED = "unrelated"
    """No key can belong to both."""


def bucket_lineage(bucket_a: int, factor_a: int, bucket_b: int, factor_b: int) -> Lineage:
    """Relate bucket ``bucket_a`` at ``factor_a`` to ``bucket_b`` at ``factor_b``.

    A key in bucket ``b`` at factor ``f`` is in bucket ``b mod g`` at every
    factor ``g`` dividing ``f``; lineage is defined only where one factor
    divides the other.

    Parameters
    ----------
    bucket_a, factor_a
        The first bucket, from 0 to ``factor_a - 1``, and its factor, a positive int.
    bucket_b, factor_b
        The second bucket and factor, likewise.

    Returns
    -------
    Lineage
        :attr:`Lineage.ANCESTOR` when ``bucket_a`` was split into ``bucket_b``,
        :attr:`Lineage.DESCENDANT` the other way round, :attr:`Lineage.SAME`
        or :attr:`Lineage.UNRELATED` otherwise.

    Raises
    ------
    ArgumentTypeError
        A bucket is not an ``int``.
    ArgumentError
        A factor is not a positive int, a bucket is outside ``[0, factor)``,
        or neither factor divides the other.
    """
    for name, value in (("factor_a", factor_a), ("factor_b", factor_b)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ArgumentError.invalid(name, "a positive int", value)
    _validate_bucket(bucket_a, "bucket_a", factor_a, "factor_a")
    _validate_bucket(bucket_b, "bucket_b", factor_b, "factor_b")
    if factor_a % factor_b and factor_b % factor_a:
        raise ArgumentError.invalid(
            "factor_b",
            f"a factor that divides or is divided by factor_a={factor_a}: lineage is "
            "defined only between nested bucketings",
            factor_b,
        )
    if factor_a == factor_b:
        return Lineage.SAME if bucket_a == bucket_b else Lineage.UNRELATED
    if factor_a < factor_b:
        return Lineage.ANCESTOR if bucket_b % factor_a == bucket_a else Lineage.UNRELATED
    return Lineage.DESCENDANT if bucket_a % factor_b == bucket_b else Lineage.UNRELATED


def lineage(a: TaskName, b: TaskName) -> Lineage:
    """Relate two task names of the same partition: same, ancestor, descendant or unrelated.

    Tasks of different partitions (or different stream partitions) are
    :attr:`Lineage.UNRELATED`.

    Parameters
    ----------
    a, b
        The task names to relate, ``a`` to ``b``.

    Returns
    -------
    Lineage
        As for :func:`bucket_lineage` on the two names' buckets and factors.

    Raises
    ------
    TaskNameError
        The names are of different grouper families, or single-task names
        (which have no key buckets).
    """
    if a.kind is not b.kind:
        raise TaskNameError(
            f"lineage: expected two task names of the same grouper, found {a.kind.value!r} "
            f"task {str(a)!r} and {b.kind.value!r} task {str(b)!r}"
        )
    if a.kind is TaskKind.SINGLE:
        raise TaskNameError(
            f"lineage: single-task names have no key buckets, found {str(a)!r} and {str(b)!r}"
        )
    if a.base != b.base:
        return Lineage.UNRELATED
    return bucket_lineage(a.key_bucket, a.elasticity_factor, b.key_bucket, b.elasticity_factor)
