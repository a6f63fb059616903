"""A job's sinks: :class:`ParquetSink` (files) and :class:`KafkaSink` (a Kafka topic).

A sink writes each micro-batch's output and states its guarantee
(:data:`AT_LEAST_ONCE`, :data:`IDEMPOTENT`, :data:`TRANSACTIONAL`). A
transactional sink publishes a batch's rows with what they cover in one atomic
step, visible only after the container's lease check (``context.fence()``), and
reads that back (:meth:`Sink.published`), so a new owner publishes nothing twice:
a ``ParquetSink`` by a commit object written create-if-absent after its files
(:mod:`spark_elastic.storage`), a ``KafkaSink`` by a transaction holding the rows
and that record.

May import :mod:`spark_elastic.errors`, :mod:`spark_elastic.storage` and
:mod:`spark_elastic.runtime.inputs` (the Kafka client options a ``KafkaSink``
shares with ``KafkaInput``); pyspark,
pyarrow and confluent-kafka only inside functions, so a job file that names a sink
loads none of them in the coordinator.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from spark_elastic.dataplane.columns import quoted
from spark_elastic.errors import (
    ArgumentError,
    ArgumentTypeError,
    FencedError,
    SinkError,
)
from spark_elastic.runtime.inputs import (
    _AUTHENTICATION_FAILED,
    _bootstrap_servers,
    _check_timeout,
    _client_options,
)
from spark_elastic.storage import (
    COMMIT_SCHEMES,
    CommitLog,
    Storage,
    is_local,
    scheme_of,
    storage_for,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from spark_elastic.state.checkpoint_dir import Fence

__all__ = [
    "AT_LEAST_ONCE",
    "GUARANTEES",
    "IDEMPOTENT",
    "COMMITS_DIR",
    "DATA_DIR",
    "TRANSACTIONAL",
    "BatchContext",
    "KafkaSink",
    "ParquetSink",
    "Sink",
    "sink_guarantee",
]

AT_LEAST_ONCE = "at-least-once"
"""A sink's guarantee: after a failover, a move or a restart, the output of the batch the
old owner was publishing may be published again by its successor (the default)."""
IDEMPOTENT = "idempotent"
"""A sink's guarantee: writing a batch's rows again replaces them (an upsert by key, a
file named by its content), so a replay publishes nothing new; the container does nothing
more for it than for an at-least-once sink."""
TRANSACTIONAL = "transactional"
"""A sink's guarantee: it publishes each batch's rows together with what they cover
(:attr:`BatchContext.covers`) in one atomic step, and :meth:`Sink.published` reads that
back. A new owner then publishes nothing for records already covered: output is
exactly-once (:class:`ParquetSink`, :class:`~spark_elastic.runtime.sinks.KafkaSink`)."""
GUARANTEES = (AT_LEAST_ONCE, IDEMPOTENT, TRANSACTIONAL)


@dataclass(frozen=True)
class BatchContext:
    """What a sink knows of the micro-batch it writes.

    Attributes
    ----------
    batch_id
        The micro-batch id within this container generation's checkpoint.
    container_id
        The writing container.
    generation
        Its checkpoint generation.
    fence
        Call it right before making output visible (a rename, a transaction
        commit): it raises :class:`~spark_elastic.errors.FencedError` unless
        the container's lease still allows a write, so a container paused
        mid-write never publishes after its lease expired.
    covers
        What the output covers once this batch is published:
        ``((stream, partition, key_bucket, factor), next_offset)`` for every
        key bucket of the container's tasks, meaning that every record of
        that bucket below ``next_offset`` has its output published (by this
        batch or before it). A :data:`TRANSACTIONAL` sink stores it with the
        rows, in the same atomic step, and returns the highest from
        :meth:`Sink.published`. Empty for other sinks.
    job
        The job's name.
    tasks
        The container's tasks (a transactional Kafka producer's id is made of
        them, so a successor with the same tasks fences a zombie in the broker).
    """

    batch_id: int
    container_id: str
    generation: int
    fence: Callable[[], None]
    covers: tuple[Fence, ...] = ()
    job: str = ""
    tasks: tuple[str, ...] = ()


@runtime_checkable
class Sink(Protocol):
    """Where a job's output goes: called once per micro-batch, on the container's driver.

    The container checks its lease before it calls :meth:`write`, from inside
    ``foreachBatch``; a sink that can publish atomically should also call
    ``context.fence()`` right before it does (see :class:`ParquetSink`).

    A sink says what it guarantees in a ``guarantee`` attribute, one of
    :data:`GUARANTEES` (:data:`AT_LEAST_ONCE` when it has none; :class:`Job`
    refuses anything else). A :data:`TRANSACTIONAL` sink also has
    ``published(job, tasks)``: before a new owner's first batch the
    container calls it and publishes nothing for the records it says are
    covered, so each record's output is published once, through failovers,
    moves, growth, factor changes and restarts. It returns
    ``((stream, partition, key_bucket, factor), next_offset)`` entries, the
    highest :attr:`BatchContext.covers` it published per key bucket, for
    the job named ``job``; ``tasks`` are the new owner's (a sink may fence
    their earlier writers first, as a Kafka transactional producer does).
    Without a ``claim``, the container calls it on a thread of its own while
    its SparkSession starts: it must not need Spark.

    A transactional sink that fences in its storage also has ``claim(generation,
    container_id, keys, spark)``, which the container calls before ``published``
    (see :meth:`ParquetSink.claim`): ``keys`` are the ``(stream, partition,
    key_bucket, factor)`` of every key bucket the new owner's tasks read.
    """

    def write(self, batch: DataFrame, context: BatchContext) -> None:
        """Write one micro-batch's output.

        Parameters
        ----------
        batch
            The batch's output rows (a static DataFrame).
        context
            Batch id, writer, and the fence to call before publishing.
        """


def _check_guarantee(name: str, value: object, choices: Sequence[str]) -> None:
    """One of the guarantees a sink can give, or one line naming them."""
    if value not in choices:
        raise ArgumentError.invalid(name, "a guarantee this sink gives", value, list(choices))


def sink_guarantee(sink: object, name: str = "Job.sink") -> str:
    """What ``sink`` declares it guarantees, checked: one of :data:`GUARANTEES`.

    Parameters
    ----------
    sink
        A :class:`Sink`.
    name
        The argument named in an error.

    Returns
    -------
    str
        Its ``guarantee`` (:data:`AT_LEAST_ONCE` when it declares none).

    Raises
    ------
    ArgumentError
        An unknown guarantee, or a :data:`TRANSACTIONAL` sink without a
        callable ``published``.
    """
    guarantee = getattr(sink, "guarantee", AT_LEAST_ONCE)
    if guarantee not in GUARANTEES:
        raise ArgumentError.invalid(
            f"{name}.guarantee", "a sink guarantee", guarantee, list(GUARANTEES)
        )
    if guarantee == TRANSACTIONAL and not callable(getattr(sink, "published", None)):
        raise ArgumentError.invalid(
            f"{name}.published",
            "a method returning what the sink published (a transactional sink has one)",
            getattr(sink, "published", None),
        )
    return str(guarantee)


COMMITS_DIR = "_commits"
"""Under a :class:`ParquetSink`'s path: one commit log per container generation
(:class:`~spark_elastic.storage.CommitLog`). A batch is published when its commit is."""
DATA_DIR = "_data"
"""Under a :class:`ParquetSink`'s path: every attempt's Parquet files, committed or not, as
``container=ID/generation=G/batch=B/attempt-HEX``. Spark and pyarrow skip names starting
with ``_``, so only :meth:`ParquetSink.read` (or the paths it lists) reads them."""

_NEXT_COMMIT: dict[tuple[str, int], int] = {}
"""Per container process: the sequence each (sink path, generation) commits next."""
_NEXT_LOCK = threading.Lock()


def _keys_meet(a: Sequence[Sequence[Any]], b: Sequence[Sequence[Any]]) -> bool:
    """Whether two lists of ``(stream, partition, key_bucket, factor)`` share a key.

    Factors are powers of two (SEP-32), so bucket ``x`` at ``f`` and ``y`` at
    ``g`` share keys exactly when they agree modulo the smaller factor.
    """
    index: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for stream, partition, bucket, factor in b:
        index.setdefault((str(stream), int(partition)), []).append((int(bucket), int(factor)))
    for stream, partition, bucket, factor in a:
        for other, other_factor in index.get((str(stream), int(partition)), ()):
            least = min(int(factor), other_factor)
            if int(bucket) % least == other % least:
                return True
    return False


@dataclass(frozen=True)
class ParquetSink:
    """Each micro-batch as Parquet files, published by a commit object, on any file system.

    A batch's rows go to a directory of their own that no one writes twice
    (``path/_data/container=ID/generation=G/batch=B/attempt-HEX``), then,
    after ``context.fence()`` passes, one commit object written
    create-if-absent in the generation's commit log (``path/_commits/G/``)
    publishes them, with what they cover (:attr:`BatchContext.covers`) for an
    exactly-once (:data:`TRANSACTIONAL`) sink. Nothing is renamed, so it works
    as well on S3 (whose rename is a copy) as on HDFS and the local disk
    (:mod:`spark_elastic.storage`).

    The storage itself fences a zombie, not only the lease: a new owner first
    claims its keys (:meth:`claim`), sealing the commit log of every earlier
    generation that wrote them, and only then reads :meth:`published`. A
    commit still in flight from a container paused past its lease (a
    ``SIGSTOP``, an S3 request retried) either landed before the seal, and is
    read, or fails. The new owner publishes nothing for the records it covers:
    a batch the old owner published but never committed is applied to state
    again without its output appearing twice.

    Readers trust only committed batches: :meth:`read` gives them as one
    DataFrame (each record's output once, with ``container``, ``generation``
    and ``batch`` columns saying who wrote it), :meth:`committed` lists their
    directories for pandas or pyarrow. A plain ``spark.read.parquet(path)``
    finds nothing to read: the files are under ``_data``, which Spark skips.

    Cost: one small JSON object per batch; :meth:`claim` reads the first
    entry of each earlier generation's log (one listing and one read each)
    and seals those it shares keys with; :meth:`published` reads the newest
    commit of each. Delete old generations' files only together with the
    checkpoints that led up to them.

    Attributes
    ----------
    path
        The output directory: a local path or any URI Spark's Hadoop opens
        (``hdfs://``, ``s3a://``), with the session's ``spark.hadoop.*``
        settings.
    guarantee
        :data:`TRANSACTIONAL` (default), or :data:`AT_LEAST_ONCE`: commits
        without covers, and a successor may publish a batch again.
    """

    path: str
    guarantee: str = TRANSACTIONAL

    def __post_init__(self) -> None:
        if not isinstance(self.path, str | os.PathLike):
            raise ArgumentTypeError.wrong_type("ParquetSink.path", "a directory path", self.path)
        object.__setattr__(self, "path", os.fspath(self.path))
        _check_guarantee("ParquetSink.guarantee", self.guarantee, (TRANSACTIONAL, AT_LEAST_ONCE))
        if not is_local(self.path) and scheme_of(self.path) not in COMMIT_SCHEMES:
            raise ArgumentError.invalid(
                "ParquetSink.path",
                "a local path or a URI of a file system that can create a file only if "
                f"absent ({', '.join(f'{s}:' for s in sorted(COMMIT_SCHEMES))})",
                self.path,
            )

    def write(self, batch: DataFrame, context: BatchContext) -> None:
        """Write one micro-batch and commit it (container driver, once per batch).

        Parameters
        ----------
        batch
            The batch's output rows.
        context
            Batch id, writer, and the fence checked right before the commit.

        Raises
        ------
        FencedError
            The lease is over, or a successor sealed this generation's log:
            nothing of the batch is published.
        """
        storage = self._storage(batch.sparkSession)
        log = CommitLog(storage, storage.join(self.path, COMMITS_DIR))
        data = (
            f"container={context.container_id}/generation={context.generation}/"
            f"batch={context.batch_id}/attempt-{uuid.uuid4().hex}"
        )
        batch.write.parquet(storage.join(self.path, DATA_DIR, data))
        payload: dict[str, Any] = {
            "container": context.container_id,
            "batch": context.batch_id,
            "data": data,
        }
        if self.guarantee == TRANSACTIONAL:
            payload["covers"] = [[*key, int(offset)] for key, offset in context.covers]
        context.fence()
        key = (self.path, context.generation)
        with _NEXT_LOCK:
            sequence = _NEXT_COMMIT.get(key)
        if sequence is None:
            sequence = log.next_sequence(context.generation)
        log.append(context.generation, sequence, payload)
        with _NEXT_LOCK:
            _NEXT_COMMIT[key] = sequence + 1

    def claim(
        self,
        generation: int,
        container_id: str,
        keys: Sequence[tuple[str, int, int, int]],
        spark: SparkSession | None = None,
    ) -> list[int]:
        """Begin ``generation``'s log with its keys and seal earlier ones that wrote them.

        Runs on a new owner's driver, once, before :meth:`published` and its
        first batch, after its lease was granted (so that a zombie's in-flight
        commit finds the seal, or lands before it and is read). Earlier
        generations are told apart by their first entry's keys: a generation
        shares a key with this one only if this one takes its tasks over
        (one owner per key at a time), so a live container is never sealed.

        Parameters
        ----------
        generation, container_id
            The new owner.
        keys
            ``(stream, partition, key_bucket, factor)`` of every key bucket
            its tasks read.
        spark
            The session whose Hadoop reaches a remote path (the active one if None).

        Returns
        -------
        list
            The earlier generations it sealed (or found sealed), ascending.

        Raises
        ------
        SinkError
            ``path`` holds batches an earlier spark-elastic published by rename
            (their progress is not in commit logs: a new owner would publish
            their records again).
        """
        storage = self._storage(spark)
        legacy = [n for n in storage.list(self.path) if n.startswith("container=")]
        if legacy:
            raise SinkError(
                f"{self.path}: expected output of this spark-elastic (committed batches "
                f"under {DATA_DIR} and {COMMITS_DIR}), found batches of an earlier one "
                f"({legacy[0]}, published by rename); give the job another path, or move "
                "them aside (spark.read.parquet reads them as before)"
            )
        log = CommitLog(storage, storage.join(self.path, COMMITS_DIR))
        mine = [list(k) for k in keys]
        sequence = log.next_sequence(generation)
        if sequence == 0:
            log.append(generation, 0, {"container": container_id, "keys": mine})
            sequence = 1
        with _NEXT_LOCK:
            _NEXT_COMMIT[(self.path, generation)] = sequence
        sealed = []
        by = f"generation {generation} ({container_id})"
        for earlier in log.generations():
            if earlier >= generation:
                continue
            first = log.entry(earlier, 0)
            if first is None:
                continue
            theirs = first.payload.get("keys") or first.payload.get("covers") or []
            if first.is_seal or _keys_meet(mine, [k[:4] for k in theirs]):
                log.seal(earlier, by)
                sealed.append(earlier)
        return sealed

    def published(self, job: str = "", tasks: Sequence[str] = ()) -> list[Fence]:
        """Per key bucket, the offset below which every record's output is published.

        Runs on a new owner's driver, once, after :meth:`claim` and before its
        first batch. A container generation's batches cover its tasks
        cumulatively, so its newest commit says all.

        Parameters
        ----------
        job, tasks
            The job and the new owner's tasks (unused: the directory is the job's).

        Returns
        -------
        list
            ``((stream, partition, key_bucket, factor), next_offset)``, the
            highest per key bucket, sorted.
        """
        log = self._log()
        best: dict[tuple[str, int, int, int], int] = {}
        for generation in log.generations():
            newest = log.last_commit(generation)
            for entry in [] if newest is None else newest.payload.get("covers", []):
                stream, partition, bucket, factor, offset = entry
                key = (str(stream), int(partition), int(bucket), int(factor))
                best[key] = max(int(offset), best.get(key, int(offset)))
        return sorted(best.items())

    def committed(self, spark: SparkSession | None = None) -> list[str]:
        """The directories of the committed batches, each batch's last attempt, in order.

        Runs on a driver (or anywhere, for a local path): for pandas or pyarrow.

        Parameters
        ----------
        spark
            The session whose Hadoop reaches a remote path (the active one if None).

        Returns
        -------
        list
            Directory URIs (paths on the local disk), by generation then batch.
        """
        log = self._log(spark)
        found: dict[tuple[int, int], str] = {}
        for generation in log.generations():
            for commit in log.commits(generation):
                if "data" in commit.payload:
                    batch = int(commit.payload["batch"])
                    # A retried batch commits again: its last attempt holds its rows.
                    found[(generation, batch)] = str(commit.payload["data"])
        storage = log.storage
        return [storage.join(self.path, DATA_DIR, found[k]) for k in sorted(found)]

    def read(self, spark: SparkSession) -> DataFrame:
        """Every committed batch's rows, with ``container``, ``generation`` and ``batch``.

        Runs on a driver.

        Parameters
        ----------
        spark
            The session to read with.

        Returns
        -------
        DataFrame
            Each record's output once (the last attempt of each committed batch).

        Raises
        ------
        SinkError
            Nothing committed yet (there is no schema to read).
        """
        paths = self.committed(spark)
        if not paths:
            raise SinkError(f"{self.path}: no batch committed yet, nothing to read")
        base = f"{self.path.rstrip('/')}/{DATA_DIR}"
        return spark.read.option("basePath", base).parquet(*paths)

    def _log(self, spark: SparkSession | None = None) -> CommitLog:
        storage = self._storage(spark)
        return CommitLog(storage, storage.join(self.path, COMMITS_DIR))

    def _storage(self, spark: SparkSession | None) -> Storage:
        # foreachBatch gives each batch a session object of its own, all on one context,
        # whose Hadoop settings the storage uses: opened and checked once per context.
        return storage_for(self.path, spark)


PROGRESS_SUFFIX = ".spark-elastic-progress"
"""A :class:`KafkaSink`'s progress topic is its output topic's name with this suffix."""

TRANSACTION_TIMEOUT_MS = 60_000
"""The producers' ``transaction.timeout.ms`` (librdkafka's default, stated): a container
killed mid-transaction under a transactional id no successor takes holds back
``read_committed`` readers of its partitions until the broker aborts it, this long."""

# Delivery failures that say no broker answered in time (librdkafka's _MSG_TIMED_OUT,
# _TIMED_OUT, _TRANSPORT, _ALL_BROKERS_DOWN), not that one refused the records.
_UNDELIVERED = frozenset({-192, -185, -195, -187})

# One transactional producer per (servers, transactional id) in a container's driver: a
# producer's init_transactions is a round trip to the transaction coordinator, once.
_PRODUCERS: dict[tuple[str, str], Any] = {}
_PRODUCERS_LOCK = threading.Lock()


@dataclass(frozen=True)
class KafkaSink:
    """Each micro-batch's rows as records of a Kafka topic, published in one transaction.

    The container's driver produces the batch's records inside a Kafka
    transaction, calls ``context.fence()`` (the container's lease check) and
    only then commits: a container paused past its lease aborts and
    publishes nothing to ``read_committed`` consumers, as :class:`ParquetSink`
    renames nothing. Records are keyed by :attr:`key` and partitioned as
    Kafka's Java producer does (murmur2).

    Exactly-once (:data:`TRANSACTIONAL`, the
    default): the transaction also holds one record of the progress topic
    (:attr:`progress_topic`, compacted, made when missing) saying what the
    batch covers (:attr:`BatchContext.covers`),
    keyed by job, container and generation. A new owner reads it back
    (:meth:`published`, ``read_committed``) before its first batch and
    publishes nothing for the records it covers. The transactional id is
    made of the job and the container's tasks, so a successor that takes a
    zombie's tasks (a failover) fences it in the broker too: its
    ``init_transactions`` aborts the zombie's open transaction, and the
    zombie's commit fails. With
    :data:`AT_LEAST_ONCE` there is no progress
    record, each container has its own transactional id, and a batch the old
    owner committed to Kafka but not to Spark may be published again.

    A row's value is its ``value`` column if the output has one (string or
    binary), else the whole row as JSON (Spark's ``to_json``, so every Spark
    type has its JSON form).

    Attributes
    ----------
    bootstrap_servers
        ``host:port[,host:port...]``.
    topic
        The output topic; it must exist (its partition count is the producer's).
    key
        The column whose value keys each record (cast to a string unless
        binary), or None for records without a key.
    kafka_options
        librdkafka producer settings (security protocol, SASL...), except
        ``bootstrap.servers`` and ``transactional.id``.
    timeout_s
        Bound on each transaction step (init, commit, abort).
    outage_s
        How long a batch, or a new owner's first transaction, is tried again
        while the brokers do not answer (timed out, unreachable, a
        transaction the broker aborted meanwhile): each try aborts the last
        and sends the batch again in a new transaction, so nothing is
        published twice, and a commit whose outcome is unknown is asked
        again, never redone. Past it the batch fails, and its container with
        it. A broker fencing the producer (a successor took its tasks) or
        refusing the records is never tried again.
    guarantee
        :data:`TRANSACTIONAL` (default) or
        :data:`AT_LEAST_ONCE`.
    progress_topic
        Where the progress records go (default: the topic's name and
        :data:`PROGRESS_SUFFIX`); several jobs may share it.

    Runs on the container's driver, once per micro-batch; the batch is
    collected there (``DataFrame.toArrow``), so a batch must fit the
    driver's memory: bound it with the input's ``max_records_per_batch``.
    """

    bootstrap_servers: str
    topic: str
    key: str | None = None
    kafka_options: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 30.0
    guarantee: str = TRANSACTIONAL
    outage_s: float = 120.0
    progress_topic: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "bootstrap_servers", _bootstrap_servers(self.bootstrap_servers, "KafkaSink")
        )
        if not isinstance(self.topic, str):
            raise ArgumentTypeError.wrong_type("KafkaSink.topic", "a topic name", self.topic)
        if not self.topic:
            raise ArgumentError.invalid("KafkaSink.topic", "a topic name", self.topic)
        if self.key is not None and not isinstance(self.key, str):
            raise ArgumentTypeError.wrong_type("KafkaSink.key", "a column name or None", self.key)
        if self.key == "":
            raise ArgumentError.invalid("KafkaSink.key", "a column name or None", self.key)
        options = _client_options("KafkaSink.kafka_options", self.kafka_options)
        if "transactional.id" in options:
            raise ArgumentError.invalid(
                "KafkaSink.kafka_options",
                "no 'transactional.id' (each container sets its own)",
                options,
            )
        object.__setattr__(self, "kafka_options", options)
        _check_timeout("KafkaSink.timeout_s", self.timeout_s)
        _check_timeout("KafkaSink.outage_s", self.outage_s)
        _check_guarantee("KafkaSink.guarantee", self.guarantee, (TRANSACTIONAL, AT_LEAST_ONCE))
        if not isinstance(self.progress_topic, str):
            raise ArgumentTypeError.wrong_type(
                "KafkaSink.progress_topic", "a topic name", self.progress_topic
            )
        if not self.progress_topic:
            object.__setattr__(self, "progress_topic", self.topic + PROGRESS_SUFFIX)
        elif self.progress_topic == self.topic:
            raise ArgumentError.invalid(
                "KafkaSink.progress_topic", "a topic other than the output's", self.progress_topic
            )

    def write(self, batch: DataFrame, context: BatchContext) -> None:
        """Publish one micro-batch (container driver, once per batch).

        Parameters
        ----------
        batch
            The batch's output rows.
        context
            Batch id, writer, and the fence checked before the commit.

        Raises
        ------
        FencedError
            The lease no longer allows a write: the transaction was aborted.
        SinkError
            The output has no :attr:`key` column, or Kafka refused the
            records or the transaction (the cause in one line).
        """
        records = self._records(batch)
        transactional_id = self._tid(context.job, context.tasks, context.container_id)
        deadline = time.monotonic() + self.outage_s
        while True:
            producer = self._producer(transactional_id, deadline)
            try:
                self._publish(producer, records, context, deadline)
                return
            except FencedError:
                self._abort(producer, transactional_id)
                raise
            except Exception as exc:
                self._abort(producer, transactional_id)
                if _broker_away(exc) and time.monotonic() + 1 < deadline:
                    time.sleep(1)  # the batch again, in a new transaction
                    continue
                raise SinkError(
                    f"KafkaSink: batch {context.batch_id} of {context.container_id} was not "
                    f"published to {self.topic!r} on {self.bootstrap_servers}: "
                    f"{_first_line(exc)}"
                ) from exc

    def _publish(
        self,
        producer: Any,
        records: Sequence[tuple[bytes | str | None, bytes | str | None]],
        context: BatchContext,
        deadline: float,
    ) -> None:
        """One transaction of the batch: its records, its progress record, the lease check,
        the commit (asked again while its outcome is unknown, within ``deadline``)."""
        refused: list[Any] = []

        def delivered(error: Any, _: Any) -> None:
            # Records not delivered because no broker answered in time fail the commit as
            # an abortable error, as refused ones do: only the reports tell them apart.
            if error is not None and error.code() not in _UNDELIVERED:
                refused.append(error)

        producer.begin_transaction()
        produce, topic = producer.produce, self.topic
        for key, value in records:
            # The fast path, a call per record; a full queue takes the waiting one.
            try:
                produce(topic, key=key, value=value, on_delivery=delivered)
            except BufferError:
                self._produce(producer, topic, key, value, delivered)
        if self.guarantee == TRANSACTIONAL:
            progress = {"covers": [[*key, int(offset)] for key, offset in context.covers]}
            self._produce(
                producer,
                self.progress_topic,
                f"{context.job}/{context.container_id}/{context.generation}".encode(),
                json.dumps(progress).encode(),
                delivered,
            )
        # Everything sent before the lease check, so that only the commit's round trip
        # lies between the check and the batch becoming visible (the write budget).
        unsent = producer.flush(self.timeout_s)
        if refused:
            raise SinkError(f"the brokers refused records: {refused[0].str()}")
        if unsent:
            raise SinkError(f"{unsent} records not sent within {self.timeout_s:g} s")
        while True:
            context.fence()
            try:
                producer.commit_transaction(self.timeout_s)
                return
            except Exception as exc:
                if refused:
                    raise SinkError(f"the brokers refused records: {refused[0].str()}") from exc
                # A commit that timed out may have landed: it is resumed (librdkafka's
                # retriable commit), never redone in a new transaction.
                error = _kafka_error(exc)
                if error is None or not error.retriable() or time.monotonic() > deadline:
                    raise

    def _records(self, batch: DataFrame) -> list[tuple[bytes | str | None, bytes | str | None]]:
        """``(key, value)`` of each row, as bytes or text (the producer sends text as UTF-8)."""
        columns = batch.columns
        if self.key is not None and self.key not in columns:
            raise SinkError(
                f"KafkaSink.key: expected a column of the job's output, found {self.key!r} "
                f"not among {columns}"
            )
        # One expression string each: a batch's select is one py4j call, not one per column
        # (tens of ms a batch on the driver, while the executors wait).
        value = "`value`" if "value" in columns else "to_json(struct(*))"
        key = "NULL" if self.key is None else quoted(self.key)
        table = batch.selectExpr(f"{key} AS k", f"{value} AS v").toArrow()
        pairs = zip(table.column("k").to_pylist(), table.column("v").to_pylist(), strict=True)
        if all(_texts(table.column(c).type) for c in ("k", "v")):
            return list(pairs)  # a null value is a tombstone, as Kafka has it
        return [(_bytes(k), _bytes(v)) for k, v in pairs]

    def published(self, job: str, tasks: Sequence[str]) -> list[Fence]:
        """Per key bucket, the offset below which every record's output of ``job`` is published.

        Runs on a new owner's driver, once, before its first batch. It first
        starts its own transactional producer (the id of ``job`` and
        ``tasks``): the broker aborts a transaction a zombie with the same
        tasks left open and fences its producer. Then it reads the progress
        topic to its end with ``read_committed``: the newest record of each
        container generation of ``job``, the highest per key bucket.

        Parameters
        ----------
        job
            The job's name.
        tasks
            The new owner's tasks.

        Returns
        -------
        list
            ``((stream, partition, key_bucket, factor), next_offset)``, sorted.

        Raises
        ------
        SinkError
            The progress topic could not be read to its end in time (one line).
        """
        self._producer(self._tid(job, tasks, ""))
        newest: dict[bytes, bytes] = {}
        for key, value in self._progress_records():
            if key is not None and key.startswith(f"{job}/".encode()) and value is not None:
                newest[key] = value
        best: dict[tuple[str, int, int, int], int] = {}
        for value in newest.values():
            for stream, partition, bucket, factor, offset in json.loads(value)["covers"]:
                bucket_key = (str(stream), int(partition), int(bucket), int(factor))
                best[bucket_key] = max(int(offset), best.get(bucket_key, int(offset)))
        return sorted(best.items())

    def _progress_records(self) -> list[tuple[bytes | None, bytes | None]]:
        """Every committed record of the progress topic, in order (driver, once per owner)."""
        from confluent_kafka import Consumer, KafkaError, TopicPartition

        consumer = Consumer(
            {
                **self.kafka_options,
                "bootstrap.servers": self.bootstrap_servers,
                "group.id": "spark-elastic-progress-reader",
                "enable.auto.commit": False,
                # The EOF event says the end is reached sooner than the position does
                # past a tail of aborted records and transaction markers (seconds).
                "enable.partition.eof": True,
                "isolation.level": "read_committed",
                "logger": logging.getLogger("spark_elastic.kafka"),
            }
        )
        # An open transaction of a writer no successor fences holds the end back until the
        # broker aborts it: wait that long, and a little more.
        wait_s = self.timeout_s + TRANSACTION_TIMEOUT_MS / 1000
        records: list[tuple[bytes | None, bytes | None]] = []
        try:
            partition = TopicPartition(self.progress_topic, 0)
            _, end = consumer.get_watermark_offsets(partition, self.timeout_s, cached=False)
            if end <= 0:
                return records
            consumer.assign([TopicPartition(self.progress_topic, 0, 0)])
            deadline = time.monotonic() + wait_s
            reached = False
            while not reached and consumer.position([partition])[0].offset < end:
                if time.monotonic() > deadline:
                    raise SinkError(
                        f"KafkaSink.progress_topic: expected to read {self.progress_topic!r} "
                        f"to offset {end} within {wait_s:g} s, found it at "
                        f"{consumer.position([partition])[0].offset} on {self.bootstrap_servers}"
                    )
                for message in consumer.consume(num_messages=1000, timeout=0.2):
                    error = message.error()
                    if error is None:
                        records.append((message.key(), message.value()))
                    elif error.code() == KafkaError._PARTITION_EOF:
                        reached = (message.offset() or 0) >= end
        finally:
            consumer.close()
        return records

    def _tid(self, job: str, tasks: Sequence[str], container_id: str) -> str:
        """The transactional id: the job's and its tasks' when exactly-once (a successor with
        the same tasks fences a zombie), else the container's own."""
        if self.guarantee == TRANSACTIONAL and tasks:
            digest = hashlib.sha256("\n".join(sorted(tasks)).encode()).hexdigest()[:16]
            return f"spark-elastic-{job}-{digest}-{self.topic}"
        return _tid(container_id, self.topic)

    def _produce(
        self,
        producer: Any,
        topic: str,
        key: bytes | str | None,
        value: bytes | str | None,
        delivered: Callable[[Any, Any], None] | None = None,
    ) -> None:
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                producer.produce(topic, key=key, value=value, on_delivery=delivered)
                return
            except BufferError:
                # The producer's queue is full: let it send, then try again, for a while.
                if time.monotonic() > deadline:
                    raise SinkError(
                        f"the producer's queue stayed full for {self.timeout_s:g} s"
                    ) from None
                producer.poll(0.1)

    def _producer(self, transactional_id: str, deadline: float | None = None) -> Any:
        """The container's transactional producer for ``transactional_id``, made and
        initialised once (``init_transactions`` asked again while the brokers do not
        answer, until ``deadline``; by default :attr:`outage_s` from now)."""
        if deadline is None:
            deadline = time.monotonic() + self.outage_s
        cache_key = (self.bootstrap_servers, transactional_id)
        with _PRODUCERS_LOCK:
            producer = _PRODUCERS.get(cache_key)
            if producer is None:
                from confluent_kafka import Producer

                refused: list[str] = []

                def on_error(error: Any) -> None:
                    # A refused login is only said here: init_transactions just times out.
                    if error.code() in _AUTHENTICATION_FAILED:
                        refused.append(error.str())

                producer = Producer(
                    {
                        **self.kafka_options,
                        "bootstrap.servers": self.bootstrap_servers,
                        "transactional.id": transactional_id,
                        # Java's partitioner: keys land where the `spark` hash expects.
                        "partitioner": "murmur2_random",
                        "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
                        "logger": logging.getLogger("spark_elastic.kafka"),
                        "error_cb": on_error,
                    }
                )
                try:
                    while True:
                        try:
                            producer.init_transactions(self.timeout_s)
                            break
                        except Exception as exc:
                            producer.poll(0)  # serves the error callbacks: a refused login?
                            if refused or not _broker_away(exc):
                                raise
                            if time.monotonic() + self.timeout_s > deadline:
                                raise
                except Exception as exc:
                    producer.poll(0)  # serves the error callbacks librdkafka has queued
                    if refused:
                        raise SinkError(
                            f"KafkaSink.kafka_options: expected credentials the brokers accept, "
                            f"found them refused at {self.bootstrap_servers} ({refused[-1]})"
                        ) from exc
                    raise SinkError(
                        f"KafkaSink.bootstrap_servers: expected a Kafka broker that starts a "
                        f"transaction within {self.timeout_s:g} s, found none at "
                        f"{self.bootstrap_servers} ({_first_line(exc)}; asked again for up "
                        f"to {self.outage_s:g} s)"
                    ) from exc
                if self.guarantee == TRANSACTIONAL:
                    self._create_progress_topic()
                _PRODUCERS[cache_key] = producer
            return producer

    def _create_progress_topic(self) -> None:
        """Make the compacted progress topic unless it exists (driver, once per producer)."""
        from confluent_kafka import KafkaError
        from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

        admin = AdminClient({**self.kafka_options, "bootstrap.servers": self.bootstrap_servers})
        # One partition: a reader reads it whole; compacted: the newest per generation stays.
        topic = NewTopic(self.progress_topic, 1, config={"cleanup.policy": "compact"})
        future = admin.create_topics([topic], request_timeout=self.timeout_s)[self.progress_topic]
        try:
            future.result(timeout=self.timeout_s)
        except Exception as exc:
            error = exc.args[0] if exc.args else None
            if getattr(error, "code", lambda: None)() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise SinkError(
                    f"KafkaSink.progress_topic: expected {self.progress_topic!r} to exist or be "
                    f"made on {self.bootstrap_servers}, found {_first_line(exc)}"
                ) from exc

    def _abort(self, producer: Any, transactional_id: str) -> None:
        try:
            producer.abort_transaction(self.timeout_s)
        except Exception:
            # A producer that cannot abort (fenced, fatal) is dropped: the next batch
            # starts a new one, whose init_transactions aborts what this one left open.
            with _PRODUCERS_LOCK:
                _PRODUCERS.pop((self.bootstrap_servers, transactional_id), None)


def _tid(container_id: str, topic: str) -> str:
    """An at-least-once container's transactional id: its own, so no two containers fence
    each other in Kafka (the lease fences a zombie); a restarted process of the container
    resumes it."""
    return f"spark-elastic-{container_id}-{topic}"


def _kafka_error(exc: BaseException) -> Any:
    """The ``KafkaError`` a confluent-kafka call raised, or None."""
    error = exc.args[0] if exc.args else None
    return error if hasattr(error, "retriable") and hasattr(error, "fatal") else None


def _broker_away(exc: BaseException) -> bool:
    """Whether ``exc`` says the brokers did not answer (or aborted the transaction
    meanwhile), not that they refused: worth another transaction once they are back."""
    if isinstance(exc, SinkError):
        return "not sent within" in str(exc)  # our own flush's bound
    error = _kafka_error(exc)
    if error is None or error.fatal():
        return False  # fenced by a successor, or no producer any more
    return bool(error.retriable() or error.txn_requires_abort())


def _texts(arrow_type: Any) -> bool:
    """Whether an Arrow column holds only what the producer takes as is: bytes, text, null."""
    import pyarrow as pa

    return bool(
        pa.types.is_binary(arrow_type)
        or pa.types.is_large_binary(arrow_type)
        or pa.types.is_string(arrow_type)
        or pa.types.is_large_string(arrow_type)
        or pa.types.is_null(arrow_type)
    )


def _bytes(value: object) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    return str(value).encode()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
