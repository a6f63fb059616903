"""A job defined in Python: inputs, grouping, the user's logic, a sink, a checkpoint root.

A job file builds a :class:`Job` and binds it to a name; the coordinator and
every container load it by ``module:attribute`` or ``path/to/file.py:attribute``
(the way uvicorn and celery name an app), so a container process imports the
same definition the coordinator planned from.

Loading runs no Spark: a job is plain data plus the user's callables. It is
imported in the coordinator (which never starts a JVM) and in each container's
driver.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import json
import logging
import os
import shutil
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from spark_elastic.dataplane.ordered import check_order
from spark_elastic.errors import (
    ArgumentError,
    ArgumentTypeError,
    InputError,
    JobDefinitionError,
    SinkError,
)
from spark_elastic.model.groupers import plan_job
from spark_elastic.model.names import validate_elasticity_factor
from spark_elastic.model.plan import Grouper, JobPlan, StreamInput

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamReader

    from spark_elastic.state.checkpoint_dir import Fence
    from spark_elastic.state.processor import TaskProcessor

__all__ = [
    "AT_LEAST_ONCE",
    "GUARANTEES",
    "IDEMPOTENT",
    "TRANSACTIONAL",
    "BatchContext",
    "Job",
    "JobInput",
    "KafkaInput",
    "LogInput",
    "ParquetSink",
    "Sink",
    "load_job",
    "load_job_and_module",
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
class LogInput:
    """Topics of an :class:`~spark_elastic.log.embedded.EmbeddedLog`, read with its Spark source.

    Attributes
    ----------
    path
        The log directory; every container must see it at this path.
    topics
        The topics the job reads.
    max_records_per_batch
        ``maxOffsetsPerTrigger`` of each container's query (None: no limit).
    """

    path: str
    topics: tuple[str, ...]
    max_records_per_batch: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.path, str | os.PathLike):
            raise ArgumentTypeError.wrong_type("LogInput.path", "a directory path", self.path)
        object.__setattr__(self, "path", os.fspath(self.path))
        object.__setattr__(self, "topics", _topics("LogInput", self.topics))
        _check_batch_limit("LogInput", self.max_records_per_batch)

    @property
    def gated(self) -> bool:
        """Always: the ``elastic-log`` source honours a ``gate``."""
        return True

    def partition_counts(self) -> dict[str, int]:
        """The topics' current partition counts, read from the log.

        Returns
        -------
        dict[str, int]
            ``{topic: partitions}`` in the order of :attr:`topics`.
        """
        from spark_elastic.log.embedded import EmbeddedLog

        return EmbeddedLog(self.path, create=False).partition_counts(list(self.topics))

    def end_offsets(self, topic: str) -> dict[int, int]:
        """Each partition's end offset (its record count), read from the log.

        Parameters
        ----------
        topic
            One of :attr:`topics`.

        Returns
        -------
        dict[int, int]
            ``{partition: end offset}`` for partitions ``0..n-1``.
        """
        from spark_elastic.log.embedded import EmbeddedLog

        return EmbeddedLog(self.path, create=False).end_offsets(topic)

    def source_options(self, partitions: Mapping[str, Sequence[int]]) -> dict[str, str]:
        """The embedded log source's options for reading ``partitions`` from the start.

        Parameters
        ----------
        partitions
            ``{topic: [partition, ...]}``: what one container reads.

        Returns
        -------
        dict[str, str]
            The Kafka source's options (``assign``, ``startingOffsets``,
            ``maxOffsetsPerTrigger``) plus ``path``.
        """
        return {"path": self.path, **_shared_source_options(partitions, self.max_records_per_batch)}

    def stream_reader(
        self, spark: SparkSession, partitions: Mapping[str, Sequence[int]]
    ) -> DataStreamReader:
        """A streaming reader of ``partitions`` in the embedded log's Spark source.

        Parameters
        ----------
        spark
            The container's session; the log's source is registered in it.
        partitions
            ``{topic: [partition, ...]}``: what one container reads.

        Returns
        -------
        DataStreamReader
            Ready to ``load()``: rows in the Kafka source's schema.
        """
        from spark_elastic.log.source import LOG_SOURCE_FORMAT, register_log_source

        register_log_source(spark)
        return spark.readStream.format(LOG_SOURCE_FORMAT).options(**self.source_options(partitions))


@dataclass(frozen=True)
class _Admin:
    """A librdkafka ``AdminClient`` and the refused logins its error callback was told of.

    A refused login reaches only the callback (the requests themselves just
    time out), so a failed request asks :meth:`refusal` which it was.
    """

    client: Any
    refused: list[str]

    def refusal(self) -> str | None:
        """The last refused login, if any, once the callbacks librdkafka queued are served."""
        self.client.poll(0)
        return self.refused[-1] if self.refused else None


@dataclass(frozen=True)
class KafkaInput:
    """Topics of a Kafka cluster, read by spark-elastic's ``elastic-kafka`` source or Spark's.

    The same job reads the embedded log (:class:`LogInput`) or Kafka: both
    give rows in the Kafka source's schema, and every reader gets the same
    ``assign``, ``startingOffsets`` and ``maxOffsetsPerTrigger`` options.

    ``reader="gated"`` (the default) reads with Spark's own Kafka source
    (the Java client, ``read_committed`` unless :attr:`kafka_options` say
    otherwise, where Spark's default is ``read_uncommitted``: a job reading
    a :class:`KafkaSink`'s topic sees each output once) held at a gate file
    by the project's jar (``gated-kafka``: ``java/``, built by ``make
    jars``), which a replaying warm-up holds at its old owners' commits: a
    moved stateful task stalls for a micro-batch or two rather than for a
    snapshot's copy. ``reader="elastic"`` reads with
    the project's Python source (:mod:`spark_elastic.log.kafka_source`:
    librdkafka on the executors, ``read_committed``), gated too and needing
    no jars, at about two thirds of Spark's speed (``docs/benchmarks.md``).
    ``reader="spark"`` reads with Spark's ``kafka`` source as it is and warms
    up from snapshots. Spark's Kafka connector is not part of pyspark: with
    ``gated`` or ``spark`` a container needs its jars (and, for ``gated``,
    the project's) in ``spark.jars`` of :attr:`Job.spark_conf` or given to
    ``job run --conf spark.jars=...`` (``make jars`` puts them all in
    ``.cache/jars/spark-kafka``); a session without them gets one line
    naming what is missing when the query starts.
    Partition counts, which the coordinator plans from, come from the brokers
    through confluent-kafka's ``AdminClient`` (the ``kafka`` extra), so the
    coordinator needs no JVM.

    Attributes
    ----------
    bootstrap_servers
        ``host:port[,host:port...]`` of one or more brokers.
    topics
        The topics the job reads.
    max_records_per_batch
        ``maxOffsetsPerTrigger`` of each container's query (None: no limit).
    timeout_s
        How long :meth:`partition_counts` and :meth:`end_offsets` wait for the
        brokers, in seconds.
    kafka_options
        Settings of Spark's Kafka consumer (Java client names, e.g.
        ``security.protocol``), passed to Spark's source as ``kafka.<name>``;
        only with ``reader="gated"`` or ``"spark"`` (with ``elastic`` they
        are refused).
    admin_options
        Settings of the librdkafka clients (e.g. ``security.protocol``,
        ``sasl.username``): the ``AdminClient`` that reads partition counts
        and commits the job's group, and, with ``reader="elastic"``, the
        source's own admin client and consumers.
    reader
        ``"gated"`` (default), ``"elastic"`` or ``"spark"``: which Spark source
        reads the topics (see above).
    """

    bootstrap_servers: str
    topics: tuple[str, ...]
    max_records_per_batch: int | None = None
    timeout_s: float = 10.0
    kafka_options: Mapping[str, str] = field(default_factory=dict)
    admin_options: Mapping[str, str] = field(default_factory=dict)
    reader: str = "gated"
    # librdkafka clients made once per purpose and kept (a client per call leaks threads,
    # sockets and, on a broker restart, met librdkafka's aborts): never compared, copied or
    # pickled (a copy in another process makes its own).
    _clients: dict[str, _Admin] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "bootstrap_servers", _bootstrap_servers(self.bootstrap_servers))
        object.__setattr__(self, "topics", _topics("KafkaInput", self.topics))
        _check_batch_limit("KafkaInput", self.max_records_per_batch)
        _check_timeout("KafkaInput.timeout_s", self.timeout_s)
        for name in ("kafka_options", "admin_options"):
            object.__setattr__(
                self, name, _client_options(f"KafkaInput.{name}", getattr(self, name))
            )
        if self.reader not in KAFKA_READERS:
            raise ArgumentError.invalid(
                "KafkaInput.reader", "a Kafka source", self.reader, KAFKA_READERS
            )
        if self.reader == "elastic" and self.kafka_options:
            # Java's settings would reach no client: refuse rather than connect without them.
            raise ArgumentError.invalid(
                "KafkaInput.kafka_options",
                "none with reader='elastic' (its clients are librdkafka's: give their "
                "settings in admin_options), or reader='spark'",
                dict(self.kafka_options),
            )

    @property
    def gated(self) -> bool:
        """Whether its reader honours a ``gate`` (replaying warm-ups need one)."""
        return self.reader in ("elastic", "gated")

    def partition_counts(self) -> dict[str, int]:
        """The topics' current partition counts, asked of the brokers.

        One ``describe_topics`` request (a Metadata request that never creates
        a topic, unlike ``list_topics(topic=...)`` on brokers that auto-create),
        bounded by :attr:`timeout_s`.

        Returns
        -------
        dict[str, int]
            ``{topic: partitions}`` in the order of :attr:`topics`.

        Raises
        ------
        InputError
            A topic does not exist, or no broker answered within :attr:`timeout_s`.
        ModuleNotFoundError
            confluent-kafka is not installed (``pip install 'spark-elastic[kafka]'``).
        """
        with self._kept("metadata") as admin:
            return {topic: len(info.partitions) for topic, info in self._describe(admin).items()}

    def end_offsets(self, topic: str) -> dict[int, int]:
        """Each partition's end offset (the next offset to be written), asked of the brokers.

        A partition whose leader does not serve it yet (just after growth or a
        leader election) is asked again every 0.1 s until :attr:`timeout_s`.

        Parameters
        ----------
        topic
            One of :attr:`topics`.

        Returns
        -------
        dict[int, int]
            ``{partition: end offset}`` for partitions ``0..n-1``.

        Raises
        ------
        InputError
            The topic does not exist, or no broker answered (or no leader served a
            partition) within :attr:`timeout_s`.
        """
        from confluent_kafka import TopicPartition

        # confluent-kafka's stubs leave OffsetSpec out of confluent_kafka.admin's exports and
        # its latest() untyped.
        from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]

        with self._kept("metadata") as admin:
            deadline = time.monotonic() + self.timeout_s
            while True:
                count = len(self._describe(admin, (topic,))[topic].partitions)
                latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
                futures = admin.client.list_offsets(
                    {TopicPartition(topic, p): latest for p in range(count)},
                    request_timeout=self.timeout_s,
                )
                try:
                    ends = {
                        tp.partition: self._result(admin, future, topic, retry=True).offset
                        for tp, future in futures.items()
                    }
                except _LeaderMovingError as moving:
                    # Right after growth (or a leader election) the metadata lists a partition
                    # its leader does not serve yet: on a KRaft broker, for about 0.1 s in
                    # about one growth in three. Asked again, it answers.
                    if time.monotonic() + _LEADER_RETRY_S >= deadline:
                        raise self._unreachable(admin, moving.reason) from None
                    time.sleep(_LEADER_RETRY_S)
                    continue
                return dict(sorted(ends.items()))

    def commit_group_offsets(self, group: str, offsets: Mapping[str, Mapping[int, int]]) -> None:
        """Commit ``{topic: {partition: next offset}}`` as consumer group ``group``'s offsets.

        The coordinator shows a job's progress this way, so that Kafka's own
        tools (``kafka-consumer-groups --describe --group <job name>``) show
        its lag; the job reads from its checkpoints, never from the group.
        No member ever joins the group, so the broker accepts the commits.
        Runs in the coordinator, off its loop, at most every few seconds.

        Parameters
        ----------
        group
            The consumer group's id (the job's name).
        offsets
            ``{topic: {partition: next offset}}``: the offset below which every
            record of the partition was applied.

        Raises
        ------
        InputError
            The brokers refused the commit or did not answer within :attr:`timeout_s`.
        """
        from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, TopicPartition

        partitions = [
            TopicPartition(topic, partition, offset)
            for topic, by_partition in offsets.items()
            for partition, offset in sorted(by_partition.items())
        ]
        with self._kept("group") as admin:
            deadline = time.monotonic() + self.timeout_s
            while True:
                (future,) = admin.client.alter_consumer_group_offsets(
                    [ConsumerGroupTopicPartitions(group, partitions)],
                    request_timeout=self.timeout_s,
                ).values()
                try:
                    answer = future.result(timeout=self.timeout_s + 5)
                except Exception as exc:
                    error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else exc
                    refused = [(f"consumer group {group!r}", error)]
                else:
                    refused = [
                        (f"{tp.topic}/{tp.partition}", tp.error)
                        for tp in answer.topic_partitions
                        if tp.error is not None
                    ]
                if not refused:
                    return
                where, error = refused[0]
                # The group's coordinator may be loading (the offsets topic's first use) or
                # moving: those errors say to ask again.
                retriable = all(
                    isinstance(e, KafkaError) and (e.retriable() or e.code() in _COORDINATOR_MOVING)
                    for _, e in refused
                )
                if admin.refusal() is not None:
                    raise self._unreachable(admin, "")
                if not retriable or time.monotonic() + _LEADER_RETRY_S >= deadline:
                    reason = (
                        error.str()
                        if isinstance(error, KafkaError)
                        else str(error) or type(error).__name__
                    )
                    raise InputError(
                        f"KafkaInput: consumer group {group!r} refused the offsets of {where} "
                        f"on {self.bootstrap_servers}: {reason}"
                    )
                time.sleep(_LEADER_RETRY_S)

    def __getstate__(self) -> dict[str, Any]:
        return {name: value for name, value in self.__dict__.items() if name != "_clients"}

    def __setstate__(self, state: Mapping[str, Any]) -> None:
        for name, value in {**state, "_clients": {}}.items():
            object.__setattr__(self, name, value)

    @contextlib.contextmanager
    def _kept(self, purpose: str) -> Iterator[_Admin]:
        """The admin client kept for ``purpose``, dropped if the call through it fails: after
        a broker restart a kept client timed out every group commit of the coordinator
        though the broker answered again, where a new one committed at once (the seeded
        fault test, seed 0). One client per purpose while it works, one per failure after."""
        admin = self._admin(purpose)
        try:
            yield admin
        except BaseException:
            with _CLIENTS_LOCK:
                if self._clients.get(purpose) is admin:
                    del self._clients[purpose]
            raise

    def _admin(self, purpose: str) -> _Admin:
        """The admin client kept for ``purpose`` (``metadata``, ``group``), made on first use.

        One client per purpose, not per call: it keeps its connections and
        reconnects by itself when a broker comes back. Group commits get their
        own because they go through the group's coordinator broker, whose
        requests librdkafka handles apart.
        """
        with _CLIENTS_LOCK:
            admin = self._clients.get(purpose)
            if admin is None:
                admin = self._clients[purpose] = self._new_admin()
            return admin

    def _new_admin(self) -> _Admin:
        # Imported here: `import spark_elastic` and the coordinator stay free of librdkafka
        # until a Kafka job is planned.
        from confluent_kafka.admin import AdminClient

        refused: list[str] = []

        def on_error(error: Any) -> None:
            # A refused login is only said here: the requests themselves just time out.
            if error.code() in _AUTHENTICATION_FAILED:
                refused.append(error.str())

        config: dict[str, Any] = {
            **self.admin_options,
            "bootstrap.servers": self.bootstrap_servers,
            # librdkafka would print connection failures to stderr; they go to logging.
            "logger": logging.getLogger("spark_elastic.kafka"),
            "error_cb": on_error,
        }
        return _Admin(AdminClient(config), refused)

    def _describe(self, admin: _Admin, topics: Sequence[str] | None = None) -> dict[str, Any]:
        """``{topic: TopicDescription}``, in order; never creates a topic."""
        from confluent_kafka import TopicCollection

        names = list(self.topics if topics is None else topics)
        futures = admin.client.describe_topics(
            TopicCollection(names), request_timeout=self.timeout_s
        )
        return {topic: self._result(admin, futures[topic], topic) for topic in names}

    def _result(self, admin: _Admin, future: Any, topic: str, retry: bool = False) -> Any:
        """A request's answer, or its failure as one line.

        With ``retry``, a partition whose leader does not serve it yet raises
        :class:`_LeaderMovingError` instead, for the caller to ask again.
        """
        from confluent_kafka import KafkaError, KafkaException

        try:
            # The request's own timeout ends it; this one only guards against a lost reply.
            return future.result(timeout=self.timeout_s + 5)
        except KafkaException as exc:
            error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            if retry and error is not None and error.code() in _LEADER_MOVING:
                raise _LeaderMovingError(error.str()) from None
            if error is not None and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise InputError(
                    f"KafkaInput.topics: expected existing topics, found no topic {topic!r} "
                    f"on {self.bootstrap_servers}"
                ) from None
            reason = error.str() if error is not None else str(exc)
            raise self._unreachable(admin, reason) from None
        except TimeoutError:
            raise self._unreachable(admin, "no reply") from None

    def _unreachable(self, admin: _Admin, reason: str) -> InputError:
        """No answer in time: a refused login if the client was told so, else no broker."""
        refusal = admin.refusal()
        # Said once: the kept client's callback says it again on its next refused login.
        admin.refused.clear()
        if refusal is not None:
            return InputError(
                f"KafkaInput.admin_options: expected credentials the brokers accept, found "
                f"them refused at {self.bootstrap_servers} ({refusal})"
            )
        return InputError(
            f"KafkaInput.bootstrap_servers: expected a Kafka broker answering within "
            f"{self.timeout_s:g} s, found none at {self.bootstrap_servers} ({reason})"
        )

    def source_options(self, partitions: Mapping[str, Sequence[int]]) -> dict[str, str]:
        """Spark's Kafka source options for reading ``partitions`` from the start.

        Parameters
        ----------
        partitions
            ``{topic: [partition, ...]}``: what one container reads.

        Returns
        -------
        dict[str, str]
            ``kafka.bootstrap.servers`` and the reader's client settings as
            ``kafka.*`` (:attr:`admin_options` for ``elastic``,
            :attr:`kafka_options` for ``gated`` and ``spark``; ``gated`` reads
            ``read_committed`` unless they say otherwise), plus the options
            :meth:`LogInput.source_options` gives the embedded log.
        """
        settings = self.admin_options if self.reader == "elastic" else self.kafka_options
        if self.reader == "gated":
            # As the elastic reader: a job reading a KafkaSink's topic sees each output once.
            settings = {"isolation.level": "read_committed", **settings}
        client = {f"kafka.{name}": value for name, value in settings.items()}
        return {
            **client,
            "kafka.bootstrap.servers": self.bootstrap_servers,
            **_shared_source_options(partitions, self.max_records_per_batch),
        }

    def stream_reader(
        self, spark: SparkSession, partitions: Mapping[str, Sequence[int]]
    ) -> DataStreamReader:
        """A streaming reader of ``partitions`` in the chosen :attr:`reader`'s source.

        With ``reader="gated"`` or ``"spark"``, loading it needs the
        connector (and for ``gated`` the project's jar) on the session's
        classpath (``spark.jars``, see the class docstring);
        ``reader="elastic"`` registers ``elastic-kafka`` in ``spark``.

        Parameters
        ----------
        spark
            The container's session.
        partitions
            ``{topic: [partition, ...]}``: what one container reads.

        Returns
        -------
        DataStreamReader
            Ready to ``load()``: rows in the Kafka source's schema.
        """
        source = GATED_KAFKA_FORMAT if self.reader == "gated" else "kafka"
        if self.reader != "elastic":
            _check_classes(spark, self.reader)
        else:
            from spark_elastic.log.kafka_source import KAFKA_SOURCE_FORMAT, register_kafka_source

            register_kafka_source(spark)
            source = KAFKA_SOURCE_FORMAT
        return spark.readStream.format(source).options(**self.source_options(partitions))


@runtime_checkable
class JobInput(Protocol):
    """What the coordinator and containers need of a job's input.

    :class:`LogInput` and :class:`KafkaInput` both fit it.

    Attributes
    ----------
    topics
        The topics the job reads.
    max_records_per_batch
        ``maxOffsetsPerTrigger`` of each container's query (None: no limit).
    """

    @property
    def topics(self) -> tuple[str, ...]:
        """The topics the job reads."""

    @property
    def max_records_per_batch(self) -> int | None:
        """``maxOffsetsPerTrigger`` of each container's query."""

    @property
    def gated(self) -> bool:
        """Whether its source honours a ``gate`` file (replaying warm-ups need one)."""

    def partition_counts(self) -> dict[str, int]:
        """``{topic: partitions}`` now, in the order of :attr:`topics`."""

    def end_offsets(self, topic: str) -> dict[int, int]:
        """``{partition: end offset}`` of one of :attr:`topics` now."""

    def source_options(self, partitions: Mapping[str, Sequence[int]]) -> dict[str, str]:
        """The Spark source options for reading ``partitions`` from the start."""

    def stream_reader(
        self, spark: SparkSession, partitions: Mapping[str, Sequence[int]]
    ) -> DataStreamReader:
        """A streaming reader of ``partitions``, ready to ``load()``."""


KAFKA_READERS = ("gated", "elastic", "spark")
"""The Spark sources a :class:`KafkaInput` can read with."""

GATED_KAFKA_FORMAT = "gated-kafka"
"""Spark's Kafka source held at a ``gate`` file: the project's jar (``java/``)."""

_CONNECTOR = ("Spark's Kafka connector", "org.apache.spark.sql.kafka010.KafkaSourceProvider")
_GATED_JAR = ("the project's gated-kafka jar", "io.github.sparkelastic.kafka.GatedKafkaSource")

_LEADER_RETRY_S = 0.1
_CLIENTS_LOCK = threading.Lock()  # KafkaInput._clients: the coordinator calls from threads
# librdkafka's codes (confluent_kafka.KafkaError), not imported: the module loads no client.
# LEADER_NOT_AVAILABLE, NOT_LEADER_FOR_PARTITION, and FENCED_LEADER_EPOCH and
# UNKNOWN_LEADER_EPOCH ("Leader epoch is newer than broker epoch"), which a broker restarted
# a moment ago answers for a partition whose metadata it has not caught up with.
_LEADER_MOVING = frozenset({5, 6, 74, 75})
# COORDINATOR_LOAD_IN_PROGRESS, _NOT_AVAILABLE, NOT_COORDINATOR: a group's coordinator
# loading (the offsets topic's first use: about 0.5 s) or moving. librdkafka does not flag
# them retriable on an offset commit's partitions, though asking again is the answer.
_COORDINATOR_MOVING = frozenset({14, 15, 16})
# librdkafka's _AUTHENTICATION and the broker's SASL_AUTHENTICATION_FAILED.
_AUTHENTICATION_FAILED = frozenset({-169, 58})


class _LeaderMovingError(Exception):
    """A partition's leader does not serve it yet; asking again soon gets an answer."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _check_classes(spark: SparkSession, reader: str) -> None:
    """Refuse, in one line, a session whose class path lacks what ``reader``'s source needs.

    Runs on the driver, once per query start. Without it Spark says only that it
    found no data source ``gated-kafka`` (or ``kafka``). A session without a JVM
    of its own (Spark Connect) is not checked: its server says what it lacks.
    """
    jvm = getattr(spark, "_jvm", None)  # classic sessions only: py4j's view of the driver
    if jvm is None:
        return
    from py4j.java_gateway import JavaClass

    needed = (_CONNECTOR, _GATED_JAR) if reader == "gated" else (_CONNECTOR,)
    # py4j resolves a dotted name to a JavaClass only when the driver's class loader has it.
    missing = [what for what, name in needed if not isinstance(jvm.__getattr__(name), JavaClass)]
    if missing:
        raise InputError(
            f"KafkaInput.reader: expected {' and '.join(w for w, _ in needed)} in the "
            "session's spark.jars "
            f"for reader={reader!r} ('make jars' puts them in .cache/jars/spark-kafka; "
            f"reader='elastic' needs none), found {' and '.join(missing)} missing"
        )


def _topics(owner: str, value: object) -> tuple[str, ...]:
    topics = (value,) if isinstance(value, str) else tuple(value)  # type: ignore[arg-type]
    if not topics or not all(isinstance(t, str) and t for t in topics):
        raise ArgumentError.invalid(f"{owner}.topics", "one or more topic names", value)
    return topics


def _check_batch_limit(owner: str, limit: object) -> None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ArgumentError.invalid(
            f"{owner}.max_records_per_batch", "a positive record count or None", limit
        )


def _bootstrap_servers(value: object, owner: str = "KafkaInput") -> str:
    servers = value.split(",") if isinstance(value, str) else None
    if servers is None or not all(_is_host_port(s.strip()) for s in servers):
        raise ArgumentError.invalid(
            f"{owner}.bootstrap_servers", "'host:port[,host:port...]'", value
        )
    return ",".join(s.strip() for s in servers)


def _check_timeout(name: str, timeout: object) -> None:
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not 0 < timeout < float("inf")
    ):
        raise ArgumentError.invalid(name, "a positive number of seconds", timeout)


def _is_host_port(text: str) -> bool:
    host, sep, port = text.rpartition(":")
    return bool(host) and bool(sep) and port.isdigit() and 0 < int(port) < 65536


def _client_options(name: str, value: object) -> dict[str, str]:
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ArgumentTypeError.wrong_type(name, "a mapping of str to str", value)
    if "bootstrap.servers" in value:
        raise ArgumentError.invalid(
            name,
            f"no 'bootstrap.servers' ({name.split('.')[0]}.bootstrap_servers sets it)",
            dict(value),
        )
    return dict(value)


def _shared_source_options(
    partitions: Mapping[str, Sequence[int]], limit: int | None
) -> dict[str, str]:
    # The embedded log's source takes the Kafka source's options, so both inputs share them.
    # From the start: a container generation's first query starts at "earliest" and, after
    # that, at its (forked) checkpoint's offsets, so no record before the job's start is lost.
    options = {
        "assign": json.dumps({topic: list(parts) for topic, parts in partitions.items()}),
        "startingOffsets": "earliest",
    }
    if limit is not None:
        options["maxOffsetsPerTrigger"] = str(limit)
    return options


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


PROGRESS_FILE = "_spark_elastic_progress.json"
"""In each batch directory of a :class:`ParquetSink`: what its rows cover. Spark and
pyarrow skip names starting with ``_`` when they read the directory as a table."""


@dataclass(frozen=True)
class ParquetSink:
    """Each micro-batch as Parquet under ``path/container=ID/generation=G/batch=B``.

    Two phases: Spark writes the batch to a staging directory under
    ``path/_staging``, then, after ``context.fence()`` passes, one rename
    publishes it. A container paused mid-write (``SIGSTOP``, a long GC) past
    its lease finds the fence closed when it resumes and publishes nothing.
    Exactly-once (:data:`TRANSACTIONAL`): the staging directory also holds
    :data:`PROGRESS_FILE`, what the batch's rows cover (:attr:`BatchContext.covers`),
    so the rename publishes rows and progress together. A new owner reads
    :meth:`published` before its first batch and publishes nothing for the
    records it covers: a batch the old owner published but never committed
    is applied to state again (a replay) without its output appearing twice.
    ``spark.read.parquet(path)`` or pandas then give each record's output
    once, with ``container``, ``generation`` and ``batch`` columns saying
    who wrote it (``_staging`` and the progress files are hidden from them).

    What it assumes: a container publishes within its lease's write budget
    of the fence check (a rename takes microseconds; the budget is seconds).
    A process frozen between the two for longer than the coordinator's
    margin could publish after its successor read :meth:`published`.

    Cost: one small JSON file per batch, and :meth:`published` lists every
    batch directory (reading one file per container generation) once per
    new owner. Delete old generations' directories only together with the
    checkpoints that led up to them (nothing reads them otherwise).

    Attributes
    ----------
    path
        The output directory, on a local file system every container sees.
    guarantee
        :data:`TRANSACTIONAL` (default), or :data:`AT_LEAST_ONCE`: no
        progress file, and a successor may publish a batch again.
    """

    path: str
    guarantee: str = TRANSACTIONAL

    def __post_init__(self) -> None:
        if not isinstance(self.path, str | os.PathLike):
            raise ArgumentTypeError.wrong_type("ParquetSink.path", "a directory path", self.path)
        object.__setattr__(self, "path", os.fspath(self.path))
        _check_guarantee("ParquetSink.guarantee", self.guarantee, (TRANSACTIONAL, AT_LEAST_ONCE))

    def write(self, batch: DataFrame, context: BatchContext) -> None:
        """Write one micro-batch (container driver, once per batch).

        Parameters
        ----------
        batch
            The batch's output rows.
        context
            Batch id, writer, and the fence checked before the publishing rename.
        """
        name = f"container={context.container_id}/generation={context.generation}"
        target = Path(self.path) / name / f"batch={context.batch_id}"
        staging = Path(self.path) / "_staging" / f"{context.container_id}-{uuid.uuid4().hex}"
        batch.write.parquet(str(staging))
        if self.guarantee == TRANSACTIONAL:
            covers = [[*key, int(offset)] for key, offset in context.covers]
            (staging / PROGRESS_FILE).write_text(json.dumps({"covers": covers}), encoding="utf-8")
        context.fence()
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            # A retry of this generation's batch: the old copy goes first (same rows or fewer).
            shutil.rmtree(target)
        os.rename(staging, target)

    def published(self, job: str = "", tasks: Sequence[str] = ()) -> list[Fence]:
        """Per key bucket, the offset below which every record's output is published.

        Runs on a new owner's driver, once, before its first batch (the old
        owners can no longer publish). A container generation's batches
        cover its tasks cumulatively, so its last published batch says all;
        batches written before the sink recorded progress say nothing.

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
        best: dict[tuple[str, int, int, int], int] = {}
        for generation in Path(self.path).glob("container=*/generation=*"):
            for stream, partition, bucket, factor, offset in _newest_covers(generation):
                key = (str(stream), int(partition), int(bucket), int(factor))
                best[key] = max(int(offset), best.get(key, int(offset)))
        return sorted(best.items())


def _newest_covers(generation: Path) -> list[list[Any]]:
    """The covers of a generation directory's newest batch that has them (none: empty)."""
    numbered = []
    for batch in generation.glob("batch=*"):
        number = batch.name.partition("=")[2]
        if number.isdigit():
            numbered.append((int(number), batch))
    for _, batch in sorted(numbered, reverse=True):
        try:
            document = json.loads((batch / PROGRESS_FILE).read_text(encoding="utf-8"))
        except FileNotFoundError:
            continue  # being replaced by a retry of its batch, or written by an older version
        except (OSError, ValueError) as exc:
            path = batch / PROGRESS_FILE
            raise SinkError(f"{path}: cannot read what its batch covers ({exc})") from None
        covers: list[list[Any]] = document["covers"]
        return covers
    return []


@dataclass(frozen=True)
class Job:
    """A streaming job the coordinator runs as containers.

    Attributes
    ----------
    name
        The job's name: checkpoints and the coordinator's store are keyed by it.
    input
        What the job reads.
    elasticity_factor
        Virtual tasks per partition (a power of two up to 1024).
    checkpoint_root
        Directory under which every container generation keeps its checkpoint
        (a local path or ``file://`` URI).
    sink
        Where output goes (:class:`Sink`).
    transform
        Stateless logic: the container's routed rows (Kafka columns plus
        ``key_bucket``, ``virtual_task``, ``routing_key``, only its own
        tasks' rows) in, output rows out. Exactly one of ``transform`` and
        ``processor`` is set.
    processor
        Stateful logic: a :class:`~spark_elastic.TaskProcessor`, run with
        :func:`~spark_elastic.with_task_state` on the container's tasks.
    grouper
        ``"partition"`` (default) or ``"ssp"``.
    hash
        Key hash of the buckets: ``"spark"`` (default) or ``"java"``.
    trigger_interval
        The containers' processing-time trigger, e.g. ``"1 second"``.
    spark_conf
        Extra Spark settings for every container's session.
    order
        The order a stateful task sees its records in within a micro-batch
        (``with_task_state``'s ``order``): ``"offset"``, ``"timestamp"``, or
        None: by timestamp for several input topics, by offset for one.
    max_task_idle_ms
        Kafka Streams' ``max.task.idle.ms`` for a stateful job read in time
        order (``with_task_state``'s): a task holds back what it cannot yet
        place in time, up to this long; 0 (the default) never holds back.
        What a task holds is not published until it is released, and a
        transactional sink's output covers only what was released, so a new
        owner publishes each record once.
    bootstrap
        Samza's bootstrap streams (``with_task_state``'s ``bootstrap``):
        input topics every container's tasks read to their end offsets as of
        its query's start before any other record.
    """

    name: str
    input: LogInput | KafkaInput
    elasticity_factor: int
    checkpoint_root: str
    sink: Sink
    transform: Callable[[DataFrame], DataFrame] | None = None
    processor: TaskProcessor | None = None
    grouper: str = "partition"
    hash: str = "spark"
    trigger_interval: str = "1 second"
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    order: str | None = None
    max_task_idle_ms: int = 0
    bootstrap: Sequence[str] = ()

    def __post_init__(self) -> None:
        if (
            not isinstance(self.name, str)
            or not self.name.replace("-", "").replace("_", "").isalnum()
        ):
            raise ArgumentError.invalid(
                "Job.name", "a non-empty name of letters, digits, '-' and '_'", self.name
            )
        if not isinstance(self.input, LogInput | KafkaInput):
            raise ArgumentTypeError.wrong_type("Job.input", "a LogInput or KafkaInput", self.input)
        validate_elasticity_factor(self.elasticity_factor)
        if not isinstance(self.checkpoint_root, str | os.PathLike):
            raise ArgumentTypeError.wrong_type(
                "Job.checkpoint_root", "a directory path", self.checkpoint_root
            )
        object.__setattr__(self, "checkpoint_root", _local_root(self.checkpoint_root))
        if not isinstance(self.sink, Sink):
            raise ArgumentTypeError.wrong_type(
                "Job.sink", "a Sink (an object with write())", self.sink
            )
        sink_guarantee(self.sink)
        if (self.transform is None) == (self.processor is None):
            raise ArgumentError.invalid(
                "Job.transform/processor",
                "exactly one of a stateless transform and a TaskProcessor",
                "both" if self.transform is not None else "neither",
            )
        if self.transform is not None and not callable(self.transform):
            raise ArgumentTypeError.wrong_type("Job.transform", "a callable", self.transform)
        kind = Grouper.of(self.grouper)
        if kind not in (Grouper.PARTITION, Grouper.SSP):
            raise ArgumentError.invalid(
                "Job.grouper",
                "a grouper that maps partitions to tasks",
                self.grouper,
                [Grouper.PARTITION.value, Grouper.SSP.value],
            )
        if self.hash not in ("spark", "java"):
            raise ArgumentError.invalid("Job.hash", "a hash mode", self.hash, ["spark", "java"])
        check_order("Job.order", self.order, "timestamp", default=True)
        self._check_hold_back()

    def _check_hold_back(self) -> None:
        """Refuse a hold-back setting the job cannot run, in one line (when defined)."""
        from spark_elastic.state.holdback import check_idle

        check_idle("Job.max_task_idle_ms", self.max_task_idle_ms)
        if isinstance(self.bootstrap, str) or not isinstance(self.bootstrap, Sequence):
            raise ArgumentTypeError.wrong_type(
                "Job.bootstrap",
                "a sequence of input topic names, such as ('profiles',)",
                self.bootstrap,
            )
        object.__setattr__(self, "bootstrap", tuple(self.bootstrap))
        if not self.holds_back:
            return
        what = "max_task_idle_ms above 0" if self.max_task_idle_ms else "bootstrap streams"
        if self.processor is None:
            raise ArgumentError.invalid(
                "Job.max_task_idle_ms/bootstrap",
                "a TaskProcessor's job (a stateful task holds records back in its state)",
                f"{what} for a stateless transform",
            )
        topics = tuple(self.input.topics)
        if self.order == "offset" or (self.order is None and len(topics) == 1):
            raise ArgumentError.invalid(
                "Job.order",
                f"'timestamp' to hold records back in time order ({what}; None means "
                f"'timestamp' only for several input topics, and the job reads {len(topics)})",
                self.order,
            )
        unknown = [t for t in self.bootstrap if t not in topics]
        if unknown:
            raise ArgumentError.invalid(
                "Job.bootstrap", f"input topics of the job {list(topics)}", unknown
            )
        if self.bootstrap and set(self.bootstrap) >= set(topics):
            raise ArgumentError.invalid(
                "Job.bootstrap",
                "some but not all input topics (the others wait for them)",
                list(self.bootstrap),
            )

    @property
    def holds_back(self) -> bool:
        """Whether its tasks hold records back (``max_task_idle_ms`` or bootstrap streams)."""
        return self.max_task_idle_ms > 0 or bool(self.bootstrap)

    @property
    def stateful(self) -> bool:
        """Whether the job keeps keyed state (it has a processor)."""
        return self.processor is not None

    @property
    def time_ordered(self) -> bool:
        """Whether its stateful tasks merge their partitions by timestamp: ``order`` is
        ``"timestamp"``, or ``None`` with several input topics. Only such tasks count
        records processed without waiting (``records_enforced``)."""
        return self.processor is not None and (
            self.order == "timestamp" or (self.order is None and len(self.input.topics) > 1)
        )

    def plan(self, partitions: Mapping[str, int]) -> JobPlan:
        """The job's plan for the given partition counts.

        Parameters
        ----------
        partitions
            ``{topic: count}`` for every input topic.

        Returns
        -------
        JobPlan
            The virtual tasks and what each reads.
        """
        inputs = [StreamInput("kafka", topic, count) for topic, count in partitions.items()]
        return plan_job(
            inputs,
            grouper=self.grouper,
            elasticity_factor=self.elasticity_factor,
        )


def _local_root(root: str | os.PathLike[str]) -> str:
    """The checkpoint root as an absolute local path; other schemes are refused for now."""
    text = os.fspath(root)
    if text.startswith("file://"):
        text = text[len("file://") :]
        if not text.startswith("/"):
            raise ArgumentError.invalid(
                "Job.checkpoint_root", "a file:// URI with an absolute path", os.fspath(root)
            )
    elif "://" in text:
        raise ArgumentError.invalid(
            "Job.checkpoint_root",
            "a local path or file:// URI (containers fork checkpoints by copying files; other "
            "file systems are not supported yet)",
            text,
        )
    return str(Path(text).resolve())


def load_job(spec: str) -> Job:
    """Import the :class:`Job` named by ``spec``.

    Parameters
    ----------
    spec
        ``package.module:attribute`` or ``path/to/file.py:attribute``; the
        attribute defaults to ``job``.

    Returns
    -------
    Job
        The job definition.

    Raises
    ------
    JobDefinitionError
        The file or module does not import, the attribute is missing, or it is
        not a :class:`Job`; one line, naming which.
    """
    return load_job_and_module(spec)[0]


def load_job_and_module(spec: str) -> tuple[Job, Any]:
    """:func:`load_job`, also returning the module the job was defined in.

    A container registers that module with cloudpickle to pickle by value, so
    Spark's Python workers need not import the job file themselves.

    Parameters
    ----------
    spec
        As for :func:`load_job`.

    Returns
    -------
    tuple[Job, module]
        The job and its module.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise JobDefinitionError(
            f"job: expected 'module:attribute' or 'file.py:attribute', found {spec!r}"
        )
    target, _, attribute = spec.rpartition(":") if _has_attribute(spec) else (spec, ":", "job")
    attribute = attribute or "job"
    module = _import_target(target, spec)
    try:
        value: Any = getattr(module, attribute)
    except AttributeError:
        raise JobDefinitionError(
            f"job {spec!r}: {target!r} has no attribute {attribute!r}"
        ) from None
    if not isinstance(value, Job):
        raise JobDefinitionError(
            f"job {spec!r}: expected a spark_elastic Job, found {type(value).__name__}"
        )
    return value, module


def _has_attribute(spec: str) -> bool:
    # A Windows-style drive letter never occurs here; the last ':' separates the attribute
    # unless what follows it is a path (contains '/').
    head, sep, tail = spec.rpartition(":")
    return bool(sep) and "/" not in tail and bool(head)


def _import_target(target: str, spec: str) -> Any:
    if target.endswith(".py") or os.sep in target:
        path = Path(target)
        if not path.is_file():
            raise JobDefinitionError(f"job {spec!r}: no such file {str(path)!r}")
        digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
        name = f"spark_elastic_job_{path.stem}_{digest}"
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise JobDefinitionError(f"job {spec!r}: {str(path)!r} is not a Python file")
        module = importlib.util.module_from_spec(module_spec)
        # Registered before running it: dataclasses and pickling look classes up by module.
        sys.modules[name] = module
        try:
            module_spec.loader.exec_module(module)
        except Exception as exc:  # any error in the user's file is one line
            sys.modules.pop(name, None)
            raise JobDefinitionError(
                f"job {spec!r}: {str(path)!r} failed to import: {type(exc).__name__}: {exc}"
            ) from None
        return module
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as exc:
        raise JobDefinitionError(f"job {spec!r}: no module named {exc.name!r}") from None
    except Exception as exc:  # any error in the user's module is one line
        raise JobDefinitionError(
            f"job {spec!r}: module {target!r} failed to import: {type(exc).__name__}: {exc}"
        ) from None
