"""Launchers: where a job's containers run, behind one protocol.

Owns: :mod:`.base` (the :class:`Launcher` protocol: five calls on an opaque
handle), :mod:`.local` (:class:`LocalLauncher`: processes of the
coordinator's host, the default) and :mod:`.namespaces`
(:class:`NamespaceLauncher`: each container a host of its own on this
machine, in Linux namespaces with an address on a bridge) and
:mod:`.kubernetes` (:class:`KubernetesLauncher`: each container a pod; not
imported here, as it needs ``kubernetes_asyncio``).

May import: :mod:`spark_elastic.runtime.protocol`, :mod:`spark_elastic.errors`
and the standard library. Nothing of the coordinator above it.
"""

from spark_elastic.runtime.coordinator.launchers.base import Launcher, LaunchError
from spark_elastic.runtime.coordinator.launchers.local import LocalLauncher
from spark_elastic.runtime.coordinator.launchers.namespaces import Bridge, NamespaceLauncher

__all__ = ["Bridge", "LaunchError", "Launcher", "LocalLauncher", "NamespaceLauncher"]
