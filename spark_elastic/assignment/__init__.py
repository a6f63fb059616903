"""Task assignment: KIP-441's high-availability assignor, Samza task names in.

Owns :mod:`.model` (the frozen input and output types: tasks, clients,
configuration, results and their warnings) and :mod:`.assignor` (``assign``
and ``is_balanced``: sticky, capacity-weighted placement of active and
standby tasks that moves a stateful task only to a caught-up client, with
warm-ups and probing rebalances; input that is stale or cannot be fully
satisfied gives warnings, not errors).

May import: :mod:`spark_elastic.errors` and the standard library only; it takes
task names as strings, so it depends on nothing else in the package.
"""
