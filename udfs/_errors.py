"""spark-elastic's argument errors, imported only when one is raised.

Importing :mod:`spark_elastic.errors` runs ``spark_elastic``'s package
``__init__``, which loads the whole task model and installs the import hook
that adds ``DataFrame.withVirtualTasks`` (about 50 modules, no pyspark);
deferring it until an error is raised keeps ``import udfs``, which the
producer and Spark's Python workers do, down to numpy and pyarrow.
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
