"""The bodies of the Arrow UDFs: one call per Arrow batch, on an executor.

Spark's Python worker calls these with a batch of the key column as a pyarrow
array (``binary`` or ``string``, nulls included) and sends the returned
``int32`` array back as it is. The hashes read the array's offset and data
buffers with numpy, so no key becomes a Python object (except in a
``java_hash_code`` batch holding invalid UTF-8, which is decoded the way
Java decodes it). A pandas UDF would receive a Series of ``bytes`` objects,
one allocation per key; it measured 1.2x to 1.5x slower end to end (see
docs/benchmarks.md).

They are pickled by reference, so the worker must be able to ``import udfs``
(it can whenever the driver's environment is the worker's, as in local mode
or with the package installed on the cluster). The partition count is bound
on the driver in a :class:`KafkaPartitioner`, so it is pickled once with the
UDF instead of travelling as a literal column in every batch.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from udfs._arrow import key_array, key_buffers, null_mask
from udfs._java_hash import java_hash_buffers, utf8_keys
from udfs._murmur2 import murmur2_buffers, partitions_of

__all__ = ["KafkaPartitioner", "java_hash_code"]


class KafkaPartitioner:
    """Kafka's default partitioner for one partition count.

    Built on the driver and pickled with the UDF (it holds one int); its
    :meth:`kafka_partition` runs on executors once per Arrow batch.
    """

    __slots__ = ("num_partitions",)

    def __init__(self, num_partitions: int) -> None:
        self.num_partitions = num_partitions

    def kafka_partition(self, keys: pa.Array) -> pa.Array:
        """Kafka's default partition of each key; null for a null key.

        Spark names the UDF, and so the result column, after this method.
        """
        array = key_array(keys, "key")
        partitions = partitions_of(murmur2_buffers(key_buffers(array)), self.num_partitions)
        return _with_nulls(partitions, null_mask(array))


def java_hash_code(keys: pa.Array) -> pa.Array:
    """Java ``String.hashCode`` of each key read as UTF-8 text; null for a null key.

    Spark names the result column after this function.
    """
    array = utf8_keys(key_array(keys, "key"))
    hashes = java_hash_buffers(key_buffers(array)).view(np.int32)
    return _with_nulls(hashes, null_mask(array))


def _with_nulls(values: npt.NDArray[np.int32], nulls: npt.NDArray[np.bool_] | None) -> pa.Array:
    return pa.array(values, type=pa.int32(), mask=nulls)
