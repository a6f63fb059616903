"""Kafka's partitioner and Java's ``String.hashCode``, vectorized for numpy and Spark.

Plain numpy functions (no Spark needed) and Arrow pandas UDFs that return
Spark Columns. Importing this package imports numpy and pyarrow only; pyspark
and pandas are imported when a Column function is first called.

- :func:`murmur2`: Kafka's ``Utils.murmur2`` of each key.
- :func:`kafka_partitions`: Kafka's default partition of each key.
"""

from __future__ import annotations

from udfs._murmur2 import kafka_partitions, murmur2

__all__ = ["kafka_partitions", "murmur2"]
