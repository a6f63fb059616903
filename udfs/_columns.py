"""Spark Column versions of the hashes, as Arrow UDFs.

The functions here run on the driver and only build Columns; pyspark is
imported inside them so that ``import udfs`` does not load it. The per-batch
work runs on executors, in :mod:`udfs._batches`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from udfs._errors import wrong_type
from udfs._murmur2 import validate_partitions

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column

__all__ = ["java_hash_code", "kafka_partition"]


def kafka_partition(col: Column | str, n: int) -> Column:
    """Kafka's default partition of each key, as an int Column.

    ``toPositive(murmur2(key)) % n``, exactly what Kafka's producer picks for
    a non-null key (``BuiltInPartitioner.partitionForKey``); the same as
    :func:`udfs.kafka_partitions` row by row.

    Parameters
    ----------
    col
        A binary or string column, or its name; a string key hashes its
        UTF-8 bytes, as Kafka's ``StringSerializer`` sends them.
    n
        The topic's partition count, 1 to 2**31 - 1.

    Returns
    -------
    pyspark.sql.Column
        An int column named ``kafka_partition(<col>)``; null where the
        key is null (Kafka's producer does not hash null keys, it gives them
        a sticky partition, which a column cannot reproduce).

    Raises
    ------
    ArgumentTypeError
        ``col`` is not a Column or name, or ``n`` is not an int.
    ArgumentError
        ``n`` is out of range.

    Notes
    -----
    A vectorized Arrow UDF (``pyspark.sql.functions.arrow_udf``, the
    vectorized UDF whose batches arrive as pyarrow arrays rather than pandas
    Series): executors hash one Arrow batch per call
    (``spark.sql.execution.arrow.maxRecordsPerBatch`` rows) with numpy over
    the batch's buffers, without making a Python object per key. The UDF
    pickles a reference to ``udfs._batches.KafkaPartitioner`` and ``n``, so the
    executors' Python must be able to import ``udfs``. A column of another
    type fails the Spark task with an ``ArgumentTypeError`` naming ``key``.
    Inside your own pandas UDF, call :func:`udfs.kafka_partitions` on the
    Series instead.
    """
    from udfs import _batches

    count = validate_partitions(n, "n")
    return _arrow_udf(_batches.KafkaPartitioner(count).kafka_partition, _column(col, "col"))


def java_hash_code(col: Column | str) -> Column:
    """Java ``String.hashCode`` of each key read as UTF-8 text, as an int Column.

    What a JVM computes for ``new String(key, StandardCharsets.UTF_8).hashCode()``
    (binary key) or ``key.hashCode()`` (string key): a polynomial in 31 over
    the UTF-16 code units, astral characters counting as two surrogates,
    in wrapping int arithmetic. Samza's key-bucket hash uses it.

    Parameters
    ----------
    col
        A binary or string column, or its name. Bytes that are not valid
        UTF-8 decode to U+FFFD as Java decodes them (slower: such a batch is
        decoded in Python).

    Returns
    -------
    pyspark.sql.Column
        An int column named ``java_hash_code(<col>)``; null where the key is null.

    Raises
    ------
    ArgumentTypeError
        ``col`` is not a Column or name.

    Notes
    -----
    A vectorized Arrow UDF, like :func:`kafka_partition`: executors hash one
    Arrow batch per call with numpy. The UDF pickles a reference to
    ``udfs._batches.java_hash_code``, so the executors' Python must be able to
    import ``udfs``. Inside your own pandas UDF, call
    :func:`udfs.java_hash_codes` on the Series instead.
    """
    from udfs import _batches

    return _arrow_udf(_batches.java_hash_code, _column(col, "col"))


def _arrow_udf(func: Callable[[pa.Array], pa.Array], key: Column) -> Column:
    """``func`` applied to ``key`` as a scalar Arrow UDF returning int."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import IntegerType

    # Spark reads the eval type (scalar, pa.Array -> pa.Array) from func's hints.
    udf = F.arrow_udf(func, IntegerType())
    column: Column = udf(key)
    return column


def _column(col: object, name: str) -> Column:
    from pyspark.sql import Column
    from pyspark.sql import functions as F

    if isinstance(col, Column):
        return col
    if isinstance(col, str):
        return F.col(col)
    raise wrong_type(name, "a Column or column name", col)
