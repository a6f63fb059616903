"""Key buckets: which slice of its partition a record belongs to (SEP-32's SSPKb).

Two hash modes, both deterministic across runs, executors and Spark versions:

``"spark"`` (default)
    ``pmod(hash(key), factor)`` with Spark's native Murmur3 (seed 42) over the
    key's bytes; no row leaves the JVM. It is deliberately *not* Kafka's
    producer hash (murmur2): keys partitioned by ``murmur2 % N`` would, under
    the same hash, all fall in one bucket per partition when ``N`` and the
    factor share factors.
``"java"``
    Samza-compatible: ``abs(h) mod factor`` with ``h`` Java's
    ``String.hashCode`` of the key as UTF-8 text, computed by a vectorized
    Arrow UDF. Where ``h`` is ``Integer.MIN_VALUE`` the bucket is 0 (``abs`` is taken
    in 64 bits, and ``2**31`` is a multiple of every allowed factor).

A null key hashes its offset instead (SEP-32). For power-of-two factors the
bucket at ``2f`` is ``b`` or ``b + f`` when it was ``b`` at ``f``: both modes
reduce one fixed integer modulo the factor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from spark_elastic.dataplane.columns import KafkaColumns
from spark_elastic.errors import ArgumentError
from spark_elastic.model.names import validate_elasticity_factor

if TYPE_CHECKING:
    from pyspark.sql import Column

__all__ = ["HASH_MODES", "HashMode", "key_bucket", "key_hash"]

HashMode = Literal["spark", "java"]
HASH_MODES: tuple[HashMode, ...] = ("spark", "java")


def _validate_mode(mode: object) -> HashMode:
    if mode not in HASH_MODES:
        raise ArgumentError.invalid("hash", "a key-bucket hash mode", mode, HASH_MODES)
    return mode  # type: ignore[return-value]


def key_hash(hash: HashMode = "spark", columns: KafkaColumns | None = None) -> Column:
    """The integer every bucket of a record derives from, as a Column.

    Evaluated on executors, per row (``"spark"``, in the JVM) or per Arrow
    batch (``"java"``, in a Python worker).
    """
    from pyspark.sql import functions as F

    mode = _validate_mode(hash)
    cols = columns or KafkaColumns()
    key, offset = F.col(cols.key), F.col(cols.offset)
    if mode == "spark":
        return F.when(key.isNull(), F.hash(offset.cast("long"))).otherwise(
            F.hash(key.cast("binary"))
        )
    from udfs import java_hash_code

    # Samza hashes the offset's string form when the key is null.
    text = F.when(key.isNull(), offset.cast("string")).otherwise(key.cast("string"))
    return java_hash_code(text)


def key_bucket(
    elasticity_factor: int, hash: HashMode = "spark", columns: KafkaColumns | None = None
) -> Column:
    """The key bucket, ``0 <= bucket < elasticity_factor``, of each record, as an int Column.

    Parameters
    ----------
    elasticity_factor
        A power of two from 1 to 1024.
    hash
        ``"spark"`` (native Murmur3, default) or ``"java"`` (Samza-compatible).
    columns
        Names of the key and offset columns.

    Returns
    -------
    Column
        An int column, evaluated on executors as :func:`key_hash` is.

    Raises
    ------
    ArgumentTypeError
        ``elasticity_factor`` is not an ``int``.
    ArgumentError
        ``elasticity_factor`` is not a power of two from 1 to 1024, or ``hash``
        is not a hash mode.
    """
    from pyspark.sql import functions as F

    factor = validate_elasticity_factor(elasticity_factor)
    h = key_hash(hash, columns)
    if _validate_mode(hash) == "java":
        # 64-bit abs: Integer.MIN_VALUE maps to 2**31, whose remainder is 0.
        return F.pmod(F.abs(h.cast("long")), F.lit(factor)).cast("int")
    return F.pmod(h, F.lit(factor)).cast("int")
