"""The task model and planning: names, partitions, groupers and job plans.

Owns what a job *is* before any record flows: :mod:`.names` (task names,
stream partitions, elasticity factors and bucket lineage), :mod:`.plan` (the
plan and task-model data types and their JSON form) and :mod:`.groupers`
(Samza's partition groupers, cogroup's gcd, SEP-5 growth and SEP-32 virtual
tasks, all pure functions that return a :class:`~.plan.JobPlan`).

May import: :mod:`spark_elastic.errors` and the standard library only. It is
pure Python, so ``spark-elastic plan`` starts without pyspark, pandas or pyarrow.
"""
