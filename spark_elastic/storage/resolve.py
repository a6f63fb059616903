"""Which :class:`~spark_elastic.storage.files.Storage` a path or URI is on.

Runs on a driver, or anywhere for a local path (it needs no JVM then).
"""

from __future__ import annotations

import os
import threading
import urllib.parse
from typing import TYPE_CHECKING, Any

from spark_elastic.errors import ArgumentTypeError
from spark_elastic.storage.files import LocalStorage, Storage, is_local
from spark_elastic.storage.hadoop import HadoopStorage

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["open_storage", "storage_for"]


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


_OPENED: dict[tuple[str, int], tuple[Any, Storage]] = {}
"""Remote storages opened, per file system (scheme and authority) and Spark context; the
context is kept with its storage so that its id is not reused meanwhile."""
_OPENED_LOCK = threading.Lock()
_LOCAL = LocalStorage()


def storage_for(uri: str, spark: SparkSession | None = None) -> Storage:
    """The :class:`Storage` for ``uri``, opened (and checked) once per file system and context.

    Runs on a driver. Opening a remote file system checks it (round trips to
    it); a caller that reaches the same one every micro-batch (a checkpoint's
    files, a sink's commits) pays that once per Spark context.

    Parameters
    ----------
    uri
        As for :func:`open_storage`.
    spark
        As for :func:`open_storage`.

    Returns
    -------
    Storage
        As :func:`open_storage` returns it; one object per file system and context.
    """
    text = os.fspath(uri)
    if is_local(text):
        return _LOCAL
    if spark is None:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
    context = None if spark is None else spark.sparkContext
    parts = urllib.parse.urlsplit(text)
    key = (f"{parts.scheme.lower()}://{parts.netloc}", id(context))
    with _OPENED_LOCK:
        cached = _OPENED.get(key)
    if cached is None:
        cached = (context, open_storage(text, spark))
        with _OPENED_LOCK:
            _OPENED[key] = cached
    return cached[1]
