"""Kafka's partitioner and Java's ``String.hashCode``, vectorized for numpy and Spark.

Plain numpy functions (no Spark needed) and vectorized Arrow UDFs that return
Spark Columns. Importing this package imports numpy and pyarrow only; pyspark
and pandas are imported when a Column function is called.

- :func:`murmur2`: Kafka's ``Utils.murmur2`` of each key.
- :func:`kafka_partitions`: Kafka's default partition of each key.
- :func:`kafka_partition`: the same as a Spark Column.
- :func:`java_hash_codes`: Java's ``String.hashCode`` of each key as UTF-8 text.
- :func:`java_hash_code`: the same as a Spark Column.

The numpy functions refuse null keys (:class:`~spark_elastic.errors.ArgumentError`);
the Column functions return null for them.
"""

from __future__ import annotations

from udfs._columns import java_hash_code, kafka_partition
from udfs._java_hash import java_hash_codes
from udfs._murmur2 import kafka_partitions, murmur2

__all__ = ["java_hash_code", "java_hash_codes", "kafka_partition", "kafka_partitions", "murmur2"]
