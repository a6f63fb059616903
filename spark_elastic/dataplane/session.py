"""A local SparkSession configured the way spark-elastic's examples and tests run Spark.

Runs on the driver. Nothing here is imported by ``import spark_elastic``;
pyspark is loaded only when :func:`local_session` is called.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from spark_elastic.errors import JavaNotFoundError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["ROCKSDB_PROVIDER", "active_or_local_session", "find_java", "local_session"]

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"

_DEFAULT_CONF: Mapping[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
    # Deep streaming plans overflow the default 1 MiB thread stack of the query thread.
    "spark.driver.extraJavaOptions": "-Xss16m",
    "spark.sql.session.timeZone": "UTC",
}


def find_java() -> str:
    """The path of the ``java`` executable Spark will use.

    Raises
    ------
    JavaNotFoundError
        Neither ``$JAVA_HOME/bin/java`` nor ``java`` on ``PATH`` exists; the
        message is one line saying what to install.
    """
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = os.path.join(java_home, "bin", "java")
        if os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("java")
    if found is None:
        raise JavaNotFoundError(
            "Spark needs Java 17 and no 'java' was found (JAVA_HOME unset or wrong, none on "
            "PATH): install a JDK 17, e.g. 'apt-get install openjdk-17-jre-headless'"
        )
    return found


def local_session(
    app_name: str = "spark-elastic", cores: int = 2, conf: Mapping[str, str] | None = None
) -> SparkSession:
    """Get or create a local SparkSession with spark-elastic's recommended settings.

    Runs on the driver, once per process (later calls return the same
    session). Sets ``PYSPARK_PYTHON`` to the running interpreter (unless
    already set) so Python workers match the driver, and starts the JVM
    with a Spark home whose Python processes import pyspark compiled
    (:mod:`~spark_elastic.dataplane.spark_home`). The settings that
    matter beyond a laptop's defaults: a 16 MiB driver thread stack
    (``spark.driver.extraJavaOptions=-Xss16m``: deep streaming plans
    overflow the JVM's default 1 MiB in the query thread; it must be set
    before the JVM starts, so pass it to ``spark-submit`` on a cluster),
    Arrow for pandas, UTC, the UI off, and log level ERROR. Stateful
    queries need nothing else: they get the RocksDB state store and their
    state partitions for themselves when they start.

    Parameters
    ----------
    app_name
        The Spark application name.
    cores
        Local cores: ``local[cores]``.
    conf
        Extra Spark settings; they override the defaults.

    Returns
    -------
    pyspark.sql.SparkSession
        The session.

    Raises
    ------
    JavaNotFoundError
        No Java runtime (one line saying what to install).
    """
    find_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from spark_elastic.dataplane.spark_home import launching, own_spark_home

    master = f"local[{cores}]"
    settings = {**_DEFAULT_CONF, **(conf or {})}
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    with launching(own_spark_home(master, settings)):
        session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def active_or_local_session(app_name: str = "spark-elastic") -> SparkSession:
    """The active SparkSession, or a new local one with the recommended settings."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    return active if active is not None else local_session(app_name)
