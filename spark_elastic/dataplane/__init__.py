"""The data plane: where a record meets its key bucket and virtual task.

Owns the Spark side of routing: :mod:`.columns` (Kafka column names),
:mod:`.buckets` (the key-bucket column), :mod:`.routing` (bucket -> task keys),
:mod:`.transforms` (``with_virtual_tasks``, ``cogroup``), :mod:`.ordered`
(per-task processing in offset order), :mod:`.extension` (the
``DataFrame.withVirtualTasks`` method), :mod:`.session` (a SparkSession
with the settings the library needs) and :mod:`.spark_home` (the Spark home
a local session starts from, so its Python processes import pyspark compiled).

May import: :mod:`spark_elastic.model`, :mod:`spark_elastic.errors`, and
pyspark/pandas/pyarrow, but only inside functions, so that importing
``spark_elastic`` stays free of them.
"""
