"""The Kafka-source columns the transforms read, their names, and their validation.

Runs on the driver, once per transform call, against ``DataFrame.schema``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from spark_elastic.errors import ArgumentError, ArgumentTypeError, ColumnError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["KafkaColumns", "OUTPUT_COLUMNS", "quoted"]

OUTPUT_COLUMNS = ("key_bucket", "virtual_task", "routing_key")
"""Columns :func:`~spark_elastic.with_virtual_tasks` adds."""


def quoted(name: str) -> str:
    """``name`` as a Spark SQL identifier: backquoted, so dots and spaces are its own."""
    return "`" + name.replace("`", "``") + "`"


_INTEGRAL = ("int", "bigint")
_EXPECTED_TYPES: Mapping[str, tuple[str, ...]] = {
    "key": ("binary", "string"),
    "topic": ("string",),
    "partition": _INTEGRAL,
    "offset": _INTEGRAL,
}


@dataclass(frozen=True, slots=True)
class KafkaColumns:
    """Names of the Kafka-source columns a transform reads.

    Defaults are Spark's Kafka source names; override any of them, e.g.
    ``KafkaColumns(key="user_id")``. ``key`` may be binary or string (strings
    are hashed as their UTF-8 bytes, so both give the same buckets).
    """

    key: str = "key"
    topic: str = "topic"
    partition: str = "partition"
    offset: str = "offset"

    @classmethod
    def of(cls, value: KafkaColumns | Mapping[str, str] | None) -> KafkaColumns:
        """Accept ``None`` (defaults), a :class:`KafkaColumns` or a ``{role: name}`` mapping.

        Parameters
        ----------
        value
            The columns; a mapping's roles are among ``key``, ``topic``,
            ``partition`` and ``offset``, and roles it leaves out keep their defaults.

        Returns
        -------
        KafkaColumns

        Raises
        ------
        ArgumentTypeError
            ``value`` is none of the accepted types.
        ArgumentError
            The mapping has a role other than the four.
        """
        if value is None:
            return cls()
        if isinstance(value, KafkaColumns):
            return value
        if not isinstance(value, Mapping):
            raise ArgumentTypeError.wrong_type(
                "columns", "a KafkaColumns or a mapping of role to column name", value
            )
        roles = [f.name for f in fields(cls)]
        unknown = sorted(set(value) - set(roles))
        if unknown:
            raise ArgumentError.invalid("columns", "column roles", unknown, roles)
        return replace(cls(), **dict(value))

    def validate(self, df: DataFrame) -> None:
        """Check that ``df`` has every column with an acceptable type.

        Runs on the driver, against ``df.schema`` only.

        Parameters
        ----------
        df
            The Kafka-source DataFrame: ``key`` binary or string, ``topic`` string,
            ``partition`` and ``offset`` int or bigint.

        Raises
        ------
        ColumnError
            A column is missing (the message lists the columns found) or has a
            type outside the accepted ones.
        """
        found = {f.name: f.dataType.simpleString() for f in df.schema.fields}
        for role, expected in _EXPECTED_TYPES.items():
            name = getattr(self, role)
            if name not in found:
                raise ColumnError(
                    f"column {name!r} ({role}): missing; expected a Kafka-source DataFrame "
                    f"with {role} column {name!r} of type {' or '.join(expected)}, found "
                    f"columns {sorted(found)}"
                )
            if found[name] not in expected:
                raise ColumnError(
                    f"column {name!r} ({role}): expected type {' or '.join(expected)}, "
                    f"found {found[name]}"
                )

    def check_no_output_clash(self, df: DataFrame) -> None:
        """Refuse a DataFrame that already has one of the columns we add.

        Parameters
        ----------
        df
            The DataFrame a transform is about to add :data:`OUTPUT_COLUMNS` to.

        Raises
        ------
        ColumnError
            ``df`` already has ``key_bucket``, ``virtual_task`` or ``routing_key``.
        """
        clash = [c for c in OUTPUT_COLUMNS if c in df.columns]
        if clash:
            raise ColumnError(
                f"columns {clash}: already present; withVirtualTasks adds {list(OUTPUT_COLUMNS)} "
                "and will not overwrite them (drop or rename them first)"
            )

    def as_dict(self) -> dict[str, Any]:
        """``{role: column name}``.

        Returns
        -------
        dict of str to str
            The four roles (``key``, ``topic``, ``partition``, ``offset``) and their names.
        """
        return {f.name: getattr(self, f.name) for f in fields(self)}
