"""The embedded partitioned log: Kafka's record schema on a local directory.

Owns :mod:`.storage` (segment files and the topic layout), :mod:`.embedded`
(:class:`~.embedded.EmbeddedLog`: topics, partitions, growth, reads),
:mod:`.producer` (batched appends with Kafka's partitioner), :mod:`.source`
(the Spark data source that streams a topic with the Kafka source's schema),
:mod:`.gate` (the file that holds a query of that source at given offsets)
and :mod:`.kafka_source` (``elastic-kafka``: the same gate on a Kafka
cluster's topics, read with librdkafka). The same gate on Spark's own Kafka
source, ``gated-kafka``, is the project's jar (``java/``): Java, outside
this package.

May import: :mod:`spark_elastic.errors`, numpy, (in :mod:`.source` and
:mod:`.kafka_source` only) pyspark, and (in :mod:`.kafka_source` only)
confluent-kafka. It knows nothing of tasks or plans: the log is an input
like Kafka. Inside the package, storage <- producer <- embedded <- source
<- kafka_source, and gate <- source, kafka_source.
"""
