"""A container JVM's just-in-time compiler: C1 only, unless the job chooses.

A container's driver JVM runs its query's tasks (``local[*]``) and plans
every micro-batch. On a few cores the JVM's default tiered compilation
spends much of a container's first minutes in C2 compiler threads, beside
the work they compete with: on 2 cores, C1 only
(``-XX:TieredStopAtLevel=1``) took a container's CPU per record after its
first output down by 15-35% and its first output 4-8 s earlier, over
300,000 and 1,000,000 records, in session 38's runs of
``benchmarks/bench_throughput.py`` (session 30's, of the CPU over a whole
run, agreed)
(docs/benchmarks.md, "Throughput on Kafka"). So a container's JVM gets C1
only by default.

A job whose Java options already choose a compiler keeps them, and nothing
is added: any of ``TieredStopAtLevel``, ``TieredCompilation``,
``CompilationMode``, ``-Xint`` or ``-Xcomp`` in
``spark.driver.extraJavaOptions``, ``SPARK_SUBMIT_OPTS``,
``JAVA_TOOL_OPTIONS`` or ``JDK_JAVA_OPTIONS``. The JVM's own default is
``-XX:TieredStopAtLevel=4`` (say it to have C2 back: a long-running
container on many cores may gain from it).

Runs on a container's driver, once before its SparkSession starts.
Standard library only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["C1_ONLY", "users_java_options", "with_compiler"]

C1_ONLY = "-XX:TieredStopAtLevel=1"
"""The option a container's JVM gets unless its job chose a compiler."""
_CHOICES = ("TieredStopAtLevel", "TieredCompilation", "CompilationMode", "-Xint", "-Xcomp")
_ENVIRONMENT_OPTIONS = ("SPARK_SUBMIT_OPTS", "JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS")
"""Where else a driver JVM's options come from: Spark's launcher puts ``SPARK_SUBMIT_OPTS``
before the driver's options; the JVM reads the other two itself."""


def users_java_options(conf: Mapping[str, str]) -> str:
    """Every Java option the job or its environment gives the driver's JVM, in one string."""
    return " ".join(
        [conf.get("spark.driver.extraJavaOptions", "")]
        + [os.environ.get(name, "") for name in _ENVIRONMENT_OPTIONS]
    )


def with_compiler(conf: Mapping[str, str]) -> dict[str, str]:
    """``conf`` with :data:`C1_ONLY` after the driver's options, unless they choose a compiler.

    Parameters
    ----------
    conf
        The Spark settings the container's session is about to start with.

    Returns
    -------
    dict
        A copy of ``conf``.
    """
    out = dict(conf)
    if not any(choice in users_java_options(out) for choice in _CHOICES):
        own = out.get("spark.driver.extraJavaOptions", "")
        out["spark.driver.extraJavaOptions"] = f"{own} {C1_ONLY}".strip()
    return out
