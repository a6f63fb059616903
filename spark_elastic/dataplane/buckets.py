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

from spark_elastic.dataplane.columns import KafkaColumns, quoted
from spark_elastic.errors import ArgumentError
from spark_elastic.model.names import validate_elasticity_factor

if TYPE_CHECKING:
    from pyspark.sql import Column

__all__ = [
    "HASH_MODES",
    "SLOTS",
    "SLOT_BITS",
    "HashMode",
    "bucket_of_key",
    "key_bucket",
    "key_hash",
    "key_slot",
    "spark_hash_bytes",
]

HashMode = Literal["spark", "java"]
SLOT_BITS = 20
SLOTS = 1 << SLOT_BITS
"""Key slots per stream partition: the finest buckets, a multiple of every allowed factor."""
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
    if mode == "spark":
        return F.expr(_spark_hash_sql(cols))
    key, offset = F.col(cols.key), F.col(cols.offset)
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
    return _reduced(validate_elasticity_factor(elasticity_factor), hash, columns)


def key_slot(hash: HashMode = "spark", columns: KafkaColumns | None = None) -> Column:
    """The key slot, ``0 <= slot < SLOTS``, of each record, as an int Column.

    A slot is a key bucket at factor :data:`SLOTS`: the bucket at any allowed
    factor ``f`` is ``slot % f``, and a state chunk of depth ``d`` holds the
    keys whose ``slot % 2**d`` is its number (see :mod:`spark_elastic.state.chunks`).
    Evaluated on executors, like :func:`key_hash`.
    """
    return _reduced(SLOTS, hash, columns)


def _spark_hash_sql(cols: KafkaColumns) -> str:
    """:func:`key_hash`'s ``"spark"`` mode as SQL text: one py4j call to build, where a
    column function at a time was about 90 (see ``transforms._task_id_column``)."""
    key, offset = quoted(cols.key), quoted(cols.offset)
    return (
        f"CASE WHEN {key} IS NULL THEN hash(CAST({offset} AS BIGINT)) "
        f"ELSE hash(CAST({key} AS BINARY)) END"
    )


def _reduced(modulus: int, hash: HashMode, columns: KafkaColumns | None) -> Column:
    from pyspark.sql import functions as F

    if _validate_mode(hash) == "java":
        h = key_hash(hash, columns)
        # 64-bit abs: Integer.MIN_VALUE maps to 2**31, whose remainder is 0.
        return F.pmod(F.abs(h.cast("long")), F.lit(modulus)).cast("int")
    return F.expr(f"CAST(pmod({_spark_hash_sql(columns or KafkaColumns())}, {modulus}) AS INT)")


_MASK = 0xFFFFFFFF


def _rotl(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (32 - bits))) & _MASK


def _mix(h1: int, k1: int) -> int:
    k1 = _rotl((k1 * 0xCC9E2D51) & _MASK, 15) * 0x1B873593 & _MASK
    return (_rotl(h1 ^ k1, 13) * 5 + 0xE6546B64) & _MASK


def spark_hash_bytes(key: bytes) -> int:
    """Spark's ``hash(key)`` of a binary value (Murmur3 x86_32, seed 42), in pure Python.

    Spark's ``hashUnsafeBytes``: 4-byte little-endian words, then every
    trailing byte mixed alone as a sign-extended int (not Murmur3's usual
    tail). Runs wherever a bucket is needed outside the JVM, one key a call.

    Parameters
    ----------
    key
        The key's bytes.

    Returns
    -------
    int
        The signed 32-bit hash, as ``F.hash(col.cast("binary"))`` gives it.
    """
    h1 = 42
    aligned = len(key) - len(key) % 4
    for i in range(0, aligned, 4):
        h1 = _mix(h1, int.from_bytes(key[i : i + 4], "little"))
    for byte in key[aligned:]:
        h1 = _mix(h1, (byte - 256 if byte > 127 else byte) & _MASK)
    h1 ^= len(key)
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & _MASK
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & _MASK
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


def bucket_of_key(key: bytes, elasticity_factor: int, hash: HashMode = "spark") -> int:
    """The key bucket of a (non-null) record key, as :func:`key_bucket` computes it in Spark.

    Runs in Python, one key a call (on an executor, for :class:`TaskState`'s
    check that a key belongs to its task).

    Parameters
    ----------
    key
        The record key's bytes.
    elasticity_factor
        A power of two from 1 to 1024 (not validated here: callers pass a plan's factor).
    hash
        ``"spark"`` or ``"java"``.

    Returns
    -------
    int
        ``0 <= bucket < elasticity_factor``.
    """
    if _validate_mode(hash) == "java":
        from udfs import java_hash_codes

        return abs(int(java_hash_codes([key])[0])) % elasticity_factor
    return spark_hash_bytes(key) % elasticity_factor
