"""The bodies of the Arrow pandas UDFs: one call per Arrow batch, on an executor.

Spark's Python worker calls these with a batch of the key column as a pandas
Series (``bytes`` for a binary column, ``str`` for a string column, ``None``
for null). They are pickled by reference, so the worker must be able to
``import udfs`` (it can whenever the driver's environment is the worker's, as
in local mode or with the package installed on the cluster). This module
imports pandas, so only :mod:`udfs._columns` imports it, lazily.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pandas as pd

from udfs._arrow import key_array, key_buffers, null_mask
from udfs._java_hash import java_hash_buffers, utf8_keys
from udfs._murmur2 import murmur2_buffers, partitions_of

__all__ = ["java_hash_code", "kafka_partition"]


def kafka_partition(keys: pd.Series, num_partitions: pd.Series) -> pd.Series:
    """Kafka's default partition of each key; null for a null key.

    ``num_partitions`` is the literal partition count, repeated per row.
    Spark names the result column after this function.
    """
    if len(keys) == 0:
        return pd.Series([], dtype="int32")
    array = key_array(keys, "key")
    count = int(num_partitions.iloc[0])
    partitions = partitions_of(murmur2_buffers(key_buffers(array)), count)
    return _with_nulls(partitions, null_mask(array))


def java_hash_code(keys: pd.Series) -> pd.Series:
    """Java ``String.hashCode`` of each key read as UTF-8 text; null for a null key.

    Spark names the result column after this function.
    """
    array = utf8_keys(key_array(keys, "key"))
    hashes = java_hash_buffers(key_buffers(array)).view(np.int32)
    return _with_nulls(hashes, null_mask(array))


def _with_nulls(values: npt.NDArray[np.int32], nulls: npt.NDArray[np.bool_] | None) -> pd.Series:
    if nulls is None:
        return pd.Series(values)
    return pd.Series(pd.arrays.IntegerArray(values, nulls))
