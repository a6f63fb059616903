"""spark-elastic's argument errors, imported only when one is raised.

``import spark_elastic`` loads pyspark (it adds ``DataFrame.withVirtualTasks``),
so importing :mod:`spark_elastic.errors` up front would make ``import udfs``
load pyspark too; the numpy functions must not need it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spark_elastic.errors import ArgumentError, ArgumentTypeError

__all__ = ["invalid", "type_error", "wrong_type"]


def invalid(name: str, expected: str, found: object) -> ArgumentError:
    """:meth:`spark_elastic.errors.ArgumentError.invalid`."""
    from spark_elastic.errors import ArgumentError

    return ArgumentError.invalid(name, expected, found)


def wrong_type(name: str, expected: str, found: object) -> ArgumentTypeError:
    """:meth:`spark_elastic.errors.ArgumentTypeError.wrong_type`."""
    from spark_elastic.errors import ArgumentTypeError

    return ArgumentTypeError.wrong_type(name, expected, found)


def type_error(name: str, expected: str, found: str) -> ArgumentTypeError:
    """An ArgumentTypeError in the standard wording, ``found`` described rather than repr'd.

    For containers of keys, whose repr could run to megabytes.
    """
    from spark_elastic.errors import ArgumentTypeError

    return ArgumentTypeError(f"{name}: expected {expected}, found {found}")
