"""Exact routing: one virtual task per Spark partition, and one Spark partition per task.

Spark's hash partitioning puts a row in partition
``pmod(murmur3_x86_32(routing_key, seed=42), n)``. A plain
``repartition(n, "virtual_task")`` therefore collides tasks and leaves about
``n / e`` partitions empty. Instead, for every task id ``t`` we precompute the
smallest non-negative int ``routing_key[t]`` whose Spark hash lands in
partition ``t``; repartitioning by that int column is then exact, and a
stateful operator grouped by it (with ``n`` shuffle partitions) sees the same
hash partitioning, so Spark adds no second shuffle.

Pure numpy; runs on the driver once per plan.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from spark_elastic.errors import ArgumentError

__all__ = ["SPARK_HASH_SEED", "routing_keys", "spark_hash_int", "spark_partition_of_int"]

SPARK_HASH_SEED = 42
"""The seed of Spark's ``Murmur3Hash`` expression and of its ``HashPartitioning``."""

_C1 = np.uint32(0xCC9E2D51)
_C2 = np.uint32(0x1B873593)
_MAX_ROUTED_TASKS = 1 << 20


def _rotl(x: npt.NDArray[np.uint32], r: int) -> npt.NDArray[np.uint32]:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def spark_hash_int(values: npt.ArrayLike, seed: int = SPARK_HASH_SEED) -> npt.NDArray[np.int32]:
    """Spark's ``hash(cast(v as int))``: Murmur3_x86_32 ``hashInt`` of each value.

    Parameters
    ----------
    values
        Integers in the int32 range.
    seed
        The Murmur3 seed (Spark uses 42).
    """
    with np.errstate(over="ignore"):
        k1 = np.asarray(values, dtype=np.int64).astype(np.uint32)
        k1 = _rotl(k1 * _C1, 15) * _C2
        h1 = np.uint32(seed) ^ k1
        h1 = _rotl(h1, 13) * np.uint32(5) + np.uint32(0xE6546B64)
        h1 ^= np.uint32(4)
        h1 ^= h1 >> np.uint32(16)
        h1 *= np.uint32(0x85EBCA6B)
        h1 ^= h1 >> np.uint32(13)
        h1 *= np.uint32(0xC2B2AE35)
        h1 ^= h1 >> np.uint32(16)
    return h1.view(np.int32)


def spark_partition_of_int(values: npt.ArrayLike, num_partitions: int) -> npt.NDArray[np.int64]:
    """The partition ``repartition(num_partitions, int_column)`` sends each value to."""
    return np.mod(spark_hash_int(values).astype(np.int64), num_partitions)


def routing_keys(num_tasks: int) -> npt.NDArray[np.int32]:
    """For each task id ``t < num_tasks``, the smallest int that Spark hash-partitions to ``t``.

    Deterministic: the same ``num_tasks`` always gives the same keys.

    Parameters
    ----------
    num_tasks
        The number of tasks (and of Spark partitions), from 1 to 1,048,576.

    Returns
    -------
    numpy.ndarray of int32
        ``num_tasks`` distinct non-negative keys, indexed by task id.

    Raises
    ------
    ArgumentError
        ``num_tasks`` is not from 1 to 1,048,576.
    """
    if isinstance(num_tasks, bool) or not isinstance(num_tasks, int):
        raise ArgumentError.invalid("num_tasks", "an int", num_tasks)
    if not 1 <= num_tasks <= _MAX_ROUTED_TASKS:
        raise ArgumentError.invalid("num_tasks", f"from 1 to {_MAX_ROUTED_TASKS:,}", num_tasks)
    keys = np.full(num_tasks, -1, dtype=np.int64)
    missing = num_tasks
    start = 0
    # Coupon collector: about n ln n candidates find every partition; scan in chunks.
    chunk = max(1024, 4 * num_tasks)
    while missing:
        candidates = np.arange(start, start + chunk, dtype=np.int64)
        partitions = spark_partition_of_int(candidates, num_tasks)
        # First candidate per partition: np.unique returns first occurrences of sorted values.
        found, first = np.unique(partitions, return_index=True)
        fresh = keys[found] < 0
        keys[found[fresh]] = candidates[first[fresh]]
        missing = int((keys < 0).sum())
        start += chunk
    return keys.astype(np.int32)
