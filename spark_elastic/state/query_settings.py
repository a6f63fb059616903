"""Per-query Spark settings of stateful queries: in force while the query starts, nowhere else.

Runs on the driver. A streaming query copies its session's SQL settings when
it starts (``start()``/``toTable()``), and its checkpoint pins two of them
at its first start: the number of state partitions
(``spark.sql.shuffle.partitions``) and the state store provider. A
:func:`~spark_elastic.with_task_state` query needs its own state partition
count (its checkpoint's, or for a new one as many as it runs at once) and
the RocksDB provider, whatever the session says and whatever else it runs.

A third setting only makes it faster: the checkpoint file manager
(``spark.sql.streaming.checkpointFileManagerClass``). Spark's default goes
through Hadoop's ``FileContext``, which on a local file system without
Hadoop's native library runs ``readlink`` in a new process for every file it
renames; the RocksDB store renames several per state partition and
micro-batch. The ``FileSystem``-based manager Spark also ships renames
without it: at 32 state partitions a micro-batch took 4.3 s instead of 5.4
(``benchmarks/bench_checkpoint_files.py``), and the operable story used 205
CPU-seconds instead of 246 (docs/stateful.md#checkpoint-files). Its one
difference, a rename that does not refuse an existing file by itself, is
covered by what already keeps one writer per checkpoint (its owner lock,
the coordinator's leases). A session that names a manager keeps it. A
checkpoint on HDFS keeps Spark's default, whose rename without overwrite
is the NameNode's own atomic step. One on S3 gets the project's
``ConditionalPutCheckpointFileManager`` (java/): S3 renames by copying after
a separate existence check, so two drivers could both publish one batch's
offsets; it writes each file in place, and a create that must not overwrite
is a conditional put (``If-None-Match: *``) that only one writer wins.

Every stateful query gets RocksDB's changelog checkpointing (unless the
session says otherwise): each batch writes the changes it made, not a new
snapshot. On HDFS and S3 batches ran at 0.75-0.78x the local disk's time
(1.02-1.10x without it) and a fork copied a third of the bytes
(``benchmarks/bench_checkpoint_storage.py``). On the local disk a batch no
longer zips and uploads a snapshot of every state partition: the processes a
micro-batch starts (Hadoop's ``chmod`` of each new file, ``rm -rf`` of each
committed snapshot's directory) fell from 16 to 9, its threads and
processes from 43 to 31, and a batch used 7-11% less CPU
(docs/benchmarks.md, "Checkpoint files: a stateful batch's cost per state
partition").

So the settings travel with the query's plan: ``with_task_state`` records its
state partition count as the ``state_partitions`` metric of its ``spark_elastic``
observation, and :func:`install_start_hook` wraps pyspark's
``DataStreamWriter.start`` and ``toTable``. For a plan carrying that
observation, the wrapper sets the two settings on the session, starts the
query (which copies them), and puts the session's own values back before
returning; any other query starts untouched. Starts through the wrapper are
serialized by one lock, so no other query started from Python sees the
temporary values; a batch job running in another thread of the same session
could see them for the duration of ``start()`` (the planning of the first
batch does not happen there).

The same wrapper refuses one start that would lose output silently: a new
or rescaled checkpoint (its batches start at 0) writing into an earlier
query's file-sink output, whose ``_spark_metadata`` log makes Spark skip those
batch ids (see :func:`_check_file_sink`).

Nothing for users to remember: every way pyspark offers to start a query
goes through ``start`` or ``toTable``. A query started some other way (from
the JVM, or Spark Connect) still runs exactly: a task's state is keyed by its
routing key, whatever partition holds it. It runs on the session's count
(pinned in its checkpoint, kept on later starts) with one more shuffle, and
on the session's state store provider.

May import what :mod:`spark_elastic.state` may; pyspark only inside functions.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from spark_elastic.dataplane.session import ROCKSDB_PROVIDER
from spark_elastic.errors import ArgumentError, CheckpointError
from spark_elastic.storage import is_local, scheme_of

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "CHANGELOG_KEY",
    "CHECKPOINT_MANAGER_KEY",
    "PROVIDER_KEY",
    "SHUFFLE_PARTITIONS_KEY",
    "STATE_PARTITIONS_METRIC",
    "install_start_hook",
    "query_settings",
    "session_settings",
]

SHUFFLE_PARTITIONS_KEY = "spark.sql.shuffle.partitions"
PROVIDER_KEY = "spark.sql.streaming.stateStore.providerClass"
CHECKPOINT_MANAGER_KEY = "spark.sql.streaming.checkpointFileManagerClass"
CHANGELOG_KEY = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"
_FILE_SYSTEM_MANAGERS = (
    # Where Spark 4.1 and later keep it, then where 4.0 did.
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager",
    "org.apache.spark.sql.execution.streaming.FileSystemBasedCheckpointFileManager",
)
STATE_PARTITIONS_METRIC = "state_partitions"
"""The metric of the ``spark_elastic`` observation that carries the query's state partitions."""

_START_LOCK = threading.RLock()
_INSTALLED: list[bool] = []
_MANAGER: dict[str, str | None] = {}


def query_settings(df: DataFrame, observation: str) -> dict[str, str]:
    """The settings a streaming DataFrame's stateful spark-elastic operator needs at start.

    Runs on the driver, once per query start: walks the analyzed plan (a
    few py4j calls per plan node).

    Parameters
    ----------
    df
        The DataFrame being started.
    observation
        The name of spark-elastic's observation (``"spark_elastic"``).

    Returns
    -------
    dict[str, str]
        Empty for a plan without spark-elastic state; else the shuffle
        partitions, the state store provider and, unless the session names
        them, the ``FileSystem``-based checkpoint file manager and RocksDB's
        changelog checkpointing.

    Raises
    ------
    ArgumentError
        The plan holds stateful spark-elastic operators with different
        task counts (one query has one state partition count).
    """
    jdf = getattr(df, "_jdf", None)
    if jdf is None:
        return {}
    from py4j.protocol import Py4JError

    counts = set()
    try:
        stack = [jdf.queryExecution().analyzed()]
        while stack:
            node = stack.pop()
            if node.nodeName() == "CollectMetrics" and node.name() == observation:
                metrics = node.metrics()
                for i in range(metrics.size()):
                    metric = metrics.apply(i)
                    if metric.name() == STATE_PARTITIONS_METRIC:
                        counts.add(int(metric.child().value()))
            children = node.children()
            stack.extend(children.apply(i) for i in range(children.size()))
    except Py4JError:
        # A plan this walk cannot read must not stop an unrelated query from starting; a
        # stateful one started without its settings fails its first batch saying so.
        return {}
    if not counts:
        return {}
    if len(counts) > 1:
        raise ArgumentError.invalid(
            "query",
            "at most one stateful spark-elastic job per streaming query (Spark gives a query "
            "one state partition count)",
            f"jobs with {sorted(counts)} state partitions",
        )
    settings = {SHUFFLE_PARTITIONS_KEY: str(counts.pop()), PROVIDER_KEY: ROCKSDB_PROVIDER}
    manager = _file_system_manager(df.sparkSession)
    if manager is not None and not df.sparkSession.conf.get(CHECKPOINT_MANAGER_KEY, None):
        settings[CHECKPOINT_MANAGER_KEY] = manager
    if df.sparkSession.conf.get(CHANGELOG_KEY, None) is None:
        # Each batch writes its changes, not a new RocksDB snapshot of them.
        settings[CHANGELOG_KEY] = "true"
    return settings


def _file_system_manager(spark: SparkSession) -> str | None:
    """The class name of Spark's ``FileSystem``-based checkpoint file manager, if it has one.

    Runs on the driver; looks the class up in the JVM once per process.
    """
    if "class" not in _MANAGER:
        from py4j.protocol import Py4JError

        _MANAGER["class"] = None
        for name in _FILE_SYSTEM_MANAGERS:
            try:
                spark._jvm.java.lang.Class.forName(name)  # type: ignore[union-attr]
            except Py4JError:
                continue
            _MANAGER["class"] = name
            break
    return _MANAGER["class"]


S3A_MANAGER = "io.github.sparkelastic.s3a.ConditionalPutCheckpointFileManager"
"""The checkpoint file manager of a query checkpointing on S3 (java/, ``make jars``)."""


def _s3a_manager(spark: SparkSession, location: str) -> str:
    """:data:`S3A_MANAGER`, when the session's class loader has it.

    Runs on the driver, once per start of a stateful query checkpointing on
    ``s3a://``. Spark's own managers publish by rename, which S3 does as a
    copy after a separate existence check: two drivers could both publish
    one batch. Starting without ours would lose that fence silently.
    """
    from py4j.java_gateway import JavaClass

    if not isinstance(spark._jvm.__getattr__(S3A_MANAGER), JavaClass):  # type: ignore[union-attr]
        raise CheckpointError(
            f"checkpointLocation {location}: expected spark-elastic's S3 checkpoint manager "
            f"({S3A_MANAGER}) in the session's spark.jars ('make jars' puts "
            "spark-elastic-s3a.jar in .cache/jars/s3a, beside the S3A client), found it missing"
        )
    return S3A_MANAGER


@contextlib.contextmanager
def session_settings(spark: SparkSession, settings: Mapping[str, str]) -> Iterator[None]:
    """Set ``settings`` on the session for the body, then restore (or unset) each one.

    Runs on the driver, under the start lock when called by the start hook.

    Parameters
    ----------
    spark
        The session.
    settings
        SQL settings, name to value.

    Yields
    ------
    None
    """
    conf = spark._jsparkSession.sessionState().conf()
    before: dict[str, str | None] = {
        key: (str(conf.getConfString(key)) if conf.contains(key) else None) for key in settings
    }
    try:
        for key, value in settings.items():
            spark.conf.set(key, value)
        yield
    finally:
        for key, old in before.items():
            if old is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, old)


def _with_query_settings(original: Callable[..., Any], observation: str) -> Callable[..., Any]:
    @functools.wraps(original)
    def start(self: Any, *args: Any, **kwargs: Any) -> Any:
        # Runs on the driver, once per query start. Every start takes the lock, so an
        # unrelated query started meanwhile in another thread never copies our settings.
        with _START_LOCK:
            settings = query_settings(self._df, observation)
            if not settings:
                return original(self, *args, **kwargs)
            if original.__name__ == "start":
                _check_file_sink(self._jwrite, args, kwargs)
            location = _checkpoint_location(self._jwrite, kwargs)
            if location is not None and not is_local(location):
                # Off the local disk, Spark's own FileContext manager: its rename without
                # overwrite is atomic at an HDFS NameNode (the FileSystem one checks first).
                # On S3 a rename is a copy: ours writes in place, conditionally.
                settings.pop(CHECKPOINT_MANAGER_KEY, None)
                if scheme_of(location) == "s3a" and not self._spark.conf.get(
                    CHECKPOINT_MANAGER_KEY, None
                ):
                    settings[CHECKPOINT_MANAGER_KEY] = _s3a_manager(self._spark, location)
            with session_settings(self._spark, settings):
                return original(self, *args, **kwargs)

    start.spark_elastic_hook = True  # type: ignore[attr-defined]
    return start


_FILE_SINKS = frozenset({"parquet", "json", "csv", "orc", "text", "avro", "xml"})


def _check_file_sink(jwrite: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    """Refuse a stateful query whose new checkpoint would write into a file sink's old output.

    Runs on the driver, once per start of a spark-elastic stateful query.
    Spark's file sink skips every micro-batch whose id its ``_spark_metadata``
    log already holds. A checkpoint that has never planned a batch (a new
    one, or one ``rescale`` made) starts at batch 0, so pointed at the output
    of an earlier checkpoint its first batches would be dropped without a
    word. A restart of the same query is untouched: its offset log holds the
    batch it is re-running, and skipping what the sink committed is right.
    """
    from spark_elastic.errors import CheckpointError
    from spark_elastic.state.checkpoint_dir import checkpoint_path, last_batch

    source = kwargs.get("format") or (args[1] if len(args) > 1 else None)
    path = kwargs.get("path") or (args[0] if args else None)
    options = _writer_options(jwrite)
    source = str(source or options.get("__source__") or "").lower()
    path = path or options.get("path")
    location = _checkpoint_location(jwrite, kwargs, options)
    if source not in _FILE_SINKS or not path or not location:
        return
    try:
        output, checkpoint = checkpoint_path(path, "path"), checkpoint_path(location)
    except ArgumentError:
        return  # not a local path: Spark reports its own errors
    if last_batch(checkpoint) is not None:
        return
    logged = sorted(int(f.name) for f in (output / "_spark_metadata").glob("*") if f.name.isdigit())
    if logged:
        raise CheckpointError(
            f"output path {str(output)!r} already holds micro-batches 0-{logged[-1]} of another "
            f"checkpoint's file sink; checkpoint {str(checkpoint)!r} has not run a batch (a new "
            "or rescaled one), so its batches start at 0 and Spark's file sink would skip them "
            "without a word: write to a new path (for example a sibling named after the new "
            "checkpoint)"
        )


def _checkpoint_location(
    jwrite: Any, kwargs: Mapping[str, Any], options: Mapping[str, str] | None = None
) -> str | None:
    """The ``checkpointLocation`` a start names (argument or writer option), if any."""
    given = kwargs.get("checkpointLocation")
    if given:
        return str(given)
    found = (options if options is not None else _writer_options(jwrite)).get("checkpointlocation")
    return str(found) if found else None


def _writer_options(jwrite: Any) -> dict[str, str]:
    """The format (as ``__source__``) and options set on a JVM DataStreamWriter so far."""
    from py4j.protocol import Py4JError

    try:
        fields = {f.getName(): f for f in jwrite.getClass().getDeclaredFields()}
        out: dict[str, str] = {}
        for name in ("source", "extraOptions"):
            field = fields[name]
            field.setAccessible(True)
            value = field.get(jwrite)
            if name == "source":
                out["__source__"] = str(value)
            else:
                it = value.iterator()
                while it.hasNext():
                    pair = it.next()
                    out[str(pair._1()).lower()] = str(pair._2())
        return out
    except (Py4JError, KeyError):
        # Another writer class or pyspark: the check is skipped, the query starts as before.
        return {}


def install_start_hook(observation: str) -> None:
    """Wrap pyspark's ``DataStreamWriter.start`` and ``toTable`` once per process.

    Runs on the driver; called by ``with_task_state``. Idempotent.

    Parameters
    ----------
    observation
        The name of spark-elastic's observation, whose ``state_partitions``
        metric marks a plan that needs per-query settings.
    """
    with _START_LOCK:
        if _INSTALLED:
            return
        from pyspark.sql.streaming.readwriter import DataStreamWriter

        for name in ("start", "toTable"):
            original = getattr(DataStreamWriter, name)
            if not getattr(original, "spark_elastic_hook", False):
                setattr(DataStreamWriter, name, _with_query_settings(original, observation))
        _INSTALLED.append(True)
