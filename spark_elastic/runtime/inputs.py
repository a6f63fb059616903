"""A job's inputs: :class:`LogInput` (the embedded log) and :class:`KafkaInput`.

An input names what a job reads and, in a container, builds the streaming reader
over the partitions its tasks own; the coordinator asks it for partition counts
(growth) and backlogs (autoscaling) without a JVM. The Kafka client options and
checks here are shared with :class:`~spark_elastic.runtime.sinks.KafkaSink`.

May import :mod:`spark_elastic.errors`, :mod:`spark_elastic.model` and
:mod:`spark_elastic.dataplane`; pyspark and confluent-kafka only inside functions,
so the coordinator loads neither.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from spark_elastic.errors import (
    ArgumentError,
    ArgumentTypeError,
    InputError,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import DataStreamReader


__all__ = [
    "GATED_KAFKA_FORMAT",
    "KAFKA_READERS",
    "JobInput",
    "KafkaInput",
    "LogInput",
]


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
