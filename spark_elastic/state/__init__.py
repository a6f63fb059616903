"""Stateful virtual tasks: keyed state, per-bucket checkpoints, show and rescale.

Owns :mod:`.bucket_checkpoints` (the pure math of per-bucket offsets across
split and merge), :mod:`.chunks` (how keyed state is laid out in the
StateStore: keys grouped into chunks by key slot), :mod:`.holdback` (the
pure steps of holding records back in time order, Kafka Streams'
``max.task.idle.ms``), :mod:`.checkpoint_dir`
(the library's files beside Spark's in a checkpoint: ``job.json`` and the
owner lock), :mod:`.shipped` (what a query's tasks need of those files, sent
to the executors by Spark's file distribution), :mod:`.processor`
(``with_task_state``, :class:`~.processor.TaskProcessor` and its per-task
state), :mod:`.columnar` (:class:`~.columnar.BatchProcessor`: a task's records
and their keys' state as columns, for vectorized logic), :mod:`.crossing`
(a task's records as they cross into the stateful operator's Python worker,
and restored there), :mod:`.query_settings`
(the state partitions and state store a stateful query gets for itself
when it starts, leaving the session alone),
:mod:`.show` (reading a checkpoint and its keyed state back) and :mod:`.rescale` (offline split
and merge of a stopped query's checkpoint).

May import: :mod:`spark_elastic.model`, :mod:`spark_elastic.dataplane`,
:mod:`spark_elastic.errors`; pyspark and pandas only inside functions.
"""
