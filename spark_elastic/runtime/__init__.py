"""The running system: job definitions, the coordinator, containers, leases.

Owns what turns a job into processes (SAMZA-871's model on Spark), in two
packages that share a few modules and never import each other:
:mod:`.coordinator` (job model versions, container registry, heartbeats and
leases, placement, the launcher, autoscaler, HTTP API, status page, metrics,
embedded store) and :mod:`.container` (one SparkSession running one query
over the tasks the job model gives it, fenced by its lease; a warm-up
copies its old owners' committed state first). They talk over HTTP only.

Shared by both: :mod:`.job` (a job defined in Python and loaded by
``module:attribute``), :mod:`.inputs` (what a job reads: the embedded log,
Kafka), :mod:`.sinks` (where its output goes: Parquet files, Kafka; each
sink's guarantee), :mod:`.protocol` (the job model and the messages
coordinator and containers exchange, as frozen dataclasses with their
JSON), :mod:`.lease` (the lease arithmetic both sides share), :mod:`.keys`
(which containers hold a task's keys across elasticity factors) and
:mod:`.growth` (SEP-5 growth of a running job, pure: the coordinator judges
and sequences it, containers plan the grown job).

May import: :mod:`spark_elastic.model`, :mod:`spark_elastic.assignment`,
:mod:`spark_elastic.state`, :mod:`spark_elastic.dataplane`,
:mod:`spark_elastic.log`, :mod:`spark_elastic.errors`; pyspark only in the
container and only inside functions, so the coordinator never loads it.
"""
