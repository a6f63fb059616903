"""Exceptions raised by spark-elastic.

Every exception the library raises on purpose derives from
:class:`SparkElasticError`, so ``except spark_elastic.errors.SparkElasticError``
catches them all. Errors about a caller's arguments also derive from the
built-in :class:`ValueError` or :class:`TypeError`, so code that already
handles those keeps working.

Messages follow one pattern: what was wrong, what was expected, and (where
there is a closed set) the valid choices.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "ArgumentError",
    "ArgumentTypeError",
    "AssignmentError",
    "CheckpointError",
    "ColumnError",
    "FencedError",
    "InputError",
    "JavaNotFoundError",
    "JobDefinitionError",
    "LogError",
    "PartitionExpansionError",
    "PlanError",
    "ProtocolError",
    "SinkError",
    "SparkElasticError",
    "StorageError",
    "StoreError",
    "StoreFencedError",
    "StoreOwnedError",
    "TaskNameError",
]


class SparkElasticError(Exception):
    """Root of every exception spark-elastic raises on purpose."""


class ArgumentError(SparkElasticError, ValueError):
    """An argument has the right type but an unacceptable value."""

    @classmethod
    def invalid(
        cls,
        name: str,
        expected: str,
        found: object,
        choices: Iterable[object] | None = None,
    ) -> ArgumentError:
        """Build the standard message: argument, expectation, what was found.

        Parameters
        ----------
        name
            The argument's name as the caller wrote it.
        expected
            What a valid value looks like, in words.
        found
            The value that was given; shown with ``repr``.
        choices
            The closed set of valid values, if there is one.
        """
        message = f"{name}: expected {expected}, found {found!r}"
        if choices is not None:
            message += f" (valid choices: {', '.join(repr(c) for c in choices)})"
        return cls(message)


class ArgumentTypeError(SparkElasticError, TypeError):
    """An argument has the wrong type."""

    @classmethod
    def wrong_type(cls, name: str, expected: str, found: object) -> ArgumentTypeError:
        """Build the standard message naming the argument and both types."""
        return cls(f"{name}: expected {expected}, found {type(found).__name__} {found!r}")


class TaskNameError(ArgumentError):
    """A string does not fit any of the task-name formats."""


class PlanError(SparkElasticError):
    """A job plan cannot be made from the given inputs."""


class PartitionExpansionError(PlanError, ValueError):
    """A stream's partition count changed in a way the plan cannot absorb (SEP-5)."""


class InputError(SparkElasticError):
    """A job's input cannot be read: a topic is missing, or no broker answered in time."""


class LogError(SparkElasticError):
    """The embedded partitioned log refused an operation."""


class AssignmentError(SparkElasticError, ValueError):
    """A task-assignment problem is inconsistent (unknown task, duplicate ids, too few clients)."""


class ColumnError(ArgumentError):
    """A DataFrame lacks a column a transform needs, or the column has the wrong type."""


class CheckpointError(SparkElasticError):
    """A streaming checkpoint cannot be read, or cannot be rescaled as asked."""


class JavaNotFoundError(SparkElasticError, RuntimeError):
    """Spark needs a Java runtime and none was found."""


class JobDefinitionError(SparkElasticError):
    """A job cannot be loaded: its file or module does not import, or the attribute is no job."""


class ProtocolError(SparkElasticError, ValueError):
    """A coordinator or container message is malformed (wrong JSON shape, unknown id)."""


class SinkError(SparkElasticError):
    """A sink could not publish a micro-batch: its target refused the output (one line)."""


class StorageError(SparkElasticError):
    """A file system refuses what the library asks of it, cannot be reached, or cannot
    create a file only if absent (what publishing relies on)."""


class FencedError(SparkElasticError, RuntimeError):
    """A container may no longer publish: its lease has expired, or a successor has
    sealed its generation's commits in the storage (it must not write output or commit
    a batch)."""


class ChangeRefusedError(SparkElasticError):
    """A running job cannot take a change now: another is under way, or it is not built yet."""


class StoreError(SparkElasticError):
    """The coordinator's store cannot be used: unreachable, refused, or lost to another
    coordinator. A coordinator that meets one while running stops writing."""


class StoreOwnedError(StoreError):
    """A coordinator store is owned by another running coordinator: one coordinator per job."""


class StoreFencedError(StoreError):
    """Another coordinator claimed this coordinator's store: it must write nothing more."""
