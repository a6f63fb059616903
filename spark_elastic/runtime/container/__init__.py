"""A container: one process, one SparkSession, one streaming query over the tasks it is given.

What the coordinator launches (``spark-elastic container run``). Owns:
:mod:`.settings` (its configuration, from the environment), :mod:`.client`
(the coordinator's HTTP API, and the heartbeat loop that renews its lease),
:mod:`.run` (its life, :func:`run_container`), :mod:`.query` (its
SparkSession, its query over its tasks, fenced by its lease, and its
progress reports), :mod:`.checkpoint` (its generation's checkpoint from its
predecessors'), :mod:`.generations` (forks of a checkpoint's committed
prefix), :mod:`.warmups` (a KIP-441 warm-up before it owns its tasks),
:mod:`.follow` (a warm-up's copies of its old owners' committed state, and
the gate and fences of a replaying one), :mod:`.class_archive` (its JVM's
class archive, recorded by a host's first container and mapped by later
ones), :mod:`.scratch` (its JVM's temporary files, swept once it is dead)
and :mod:`.console` (its log lines and exit codes).

May import: the shared runtime modules (:mod:`spark_elastic.runtime.protocol`,
:mod:`~spark_elastic.runtime.lease`, :mod:`~spark_elastic.runtime.job`,
:mod:`~spark_elastic.runtime.inputs`, :mod:`~spark_elastic.runtime.sinks`,
:mod:`~spark_elastic.runtime.keys`, :mod:`~spark_elastic.runtime.growth`),
:mod:`spark_elastic.state`, :mod:`spark_elastic.log`,
:mod:`spark_elastic.dataplane`, :mod:`spark_elastic.model`,
:mod:`spark_elastic.errors`; pyspark, pandas and pyarrow inside functions
only. Never :mod:`spark_elastic.runtime.coordinator`: a container reaches
the coordinator over HTTP only.
"""

from spark_elastic.runtime.container.client import CoordinatorClient
from spark_elastic.runtime.container.run import run_container
from spark_elastic.runtime.container.settings import ContainerSettings

__all__ = ["ContainerSettings", "CoordinatorClient", "run_container"]
