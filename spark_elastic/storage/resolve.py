"""Which :class:`~spark_elastic.storage.files.Storage` a path or URI is on.

Runs on a driver, or anywhere for a local path (it needs no JVM then).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from spark_elastic.errors import ArgumentTypeError
from spark_elastic.storage.files import LocalStorage, Storage, is_local
from spark_elastic.storage.hadoop import HadoopStorage

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["open_storage"]


def open_storage(uri: str, spark: SparkSession | None = None) -> Storage:
    """The :class:`Storage` for ``uri``: the local disk, or Spark's Hadoop file system.

    Runs on a driver (or anywhere, for a local path: it needs no JVM).

    Parameters
    ----------
    uri
        A plain path, or a URI any file system on the session's Hadoop classpath
        opens (``file:``, ``hdfs:``, ``s3a:``...), with the session's
        ``spark.hadoop.*`` settings and credentials.
    spark
        The session whose JVM reaches a non-local ``uri``; the active one if None.

    Returns
    -------
    Storage
        A :class:`LocalStorage`, or a :class:`~spark_elastic.storage.hadoop.HadoopStorage`
        whose create-if-absent the scheme's file system has been checked to keep.

    Raises
    ------
    StorageError
        A scheme that cannot create a file only if absent, no session for a remote
        ``uri``, or a file system Hadoop cannot open (one line each).
    """
    if not isinstance(uri, str | os.PathLike):
        raise ArgumentTypeError.wrong_type("uri", "a path or URI", uri)
    text = os.fspath(uri)
    if is_local(text):
        return LocalStorage()
    return HadoopStorage.open(text, spark)
