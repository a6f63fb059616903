"""The running system: job definitions, the coordinator, containers, leases.

Owns what turns a job into processes (SAMZA-871's model on Spark): :mod:`.job`
(a job defined in Python and loaded by ``module:attribute``), :mod:`.protocol`
(the job model and the messages coordinator and containers exchange, as
frozen dataclasses with their JSON), :mod:`.lease` (the lease arithmetic both
sides share), the coordinator (job model versions, container registry,
heartbeats and leases, autoscaler, HTTP API, status page, metrics, embedded store) and
the container (one SparkSession running one query over the tasks the job
model gives it, fenced by its lease; as a warm-up, :mod:`.follow` copies its
old owners' committed state first).

May import: :mod:`spark_elastic.model`, :mod:`spark_elastic.assignment`,
:mod:`spark_elastic.state`, :mod:`spark_elastic.dataplane`,
:mod:`spark_elastic.log`, :mod:`spark_elastic.errors`; pyspark only in the
container and only inside functions, so the coordinator never loads it.
"""
