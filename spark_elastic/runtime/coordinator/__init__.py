"""The coordinator: one process per job that owns its job model and its containers' leases.

Owns: :mod:`.supervisor` (the state machine: plan once, leases, failover
into a new generation, re-adoption after a restart, growth, scale and
factor changes), :mod:`.moves` (KIP-441's moves through warm-ups, one group
at a time), :mod:`.partitions` (SEP-5's partition monitor, a growth's drain and
handover, the consumer group view), :mod:`.status` (what the status
shows, as pure functions of what the supervisor knows), :mod:`.placement`
(which container runs which tasks, as pure functions), :mod:`.launchers`
(where containers run: the ``Launcher`` protocol, local processes, Linux
namespaces), :mod:`.processes` (the one place container processes are
launched, stopped and killed, through a launcher), :mod:`.retiring`
(retired containers their successors wait for), :mod:`.crash_loops`
(failures at start carried to successors, backoffs, reported causes),
:mod:`.input_process` (a Kafka input's calls in a child process it restarts:
librdkafka's aborts are failed calls), :mod:`.input_health` (what of the
input fails since when),
:mod:`.stores` (where job model versions, containers,
generations and events are kept: SQLite on one host, PostgreSQL shared by
a leader and its standbys), :mod:`.server` (the HTTP
API, status page and metrics), :mod:`.changes` (a change's phases and
deadlines, pure), :mod:`.autoscaler` (the autoscaler's policy, pure) and
:mod:`.autoscaling` (the autoscaler in a running coordinator: its settings in
the store, its state, the processing rates it judges, its actions).

May import: the shared runtime modules (:mod:`spark_elastic.runtime.protocol`,
:mod:`~spark_elastic.runtime.lease`, :mod:`~spark_elastic.runtime.job`,
:mod:`~spark_elastic.runtime.inputs`, :mod:`~spark_elastic.runtime.sinks`,
:mod:`~spark_elastic.runtime.keys`, :mod:`~spark_elastic.runtime.growth`),
:mod:`spark_elastic.model`, :mod:`spark_elastic.assignment`,
:mod:`spark_elastic.state` (checkpoint files only), :mod:`spark_elastic.errors`,
aiohttp and prometheus_client. Never :mod:`spark_elastic.runtime.container`,
and never pyspark, pandas or pyarrow: a coordinator starts no JVM.
"""
