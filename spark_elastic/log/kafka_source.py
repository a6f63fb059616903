"""A Kafka source of spark-elastic's own, with the embedded log's ``gate``.

``spark.readStream.format("elastic-kafka")`` (after
:func:`register_kafka_source`) streams Kafka topics into rows with exactly
the schema of Spark's Kafka source, read on the executors by librdkafka
(confluent-kafka). It exists for one thing Spark's ``kafka`` source cannot
do: stop at offsets set from outside while the query runs. Spark's source
honours only read limits in ``latestOffset`` and refuses ``endingOffsets``
in streaming queries, so a replaying warm-up (it follows its old owners'
commits, :mod:`spark_elastic.runtime.container.warmups`) cannot hold it.
This source reads the same ``gate`` file as the embedded log's
(:mod:`.gate`).

========================  ============================================================
``kafka.bootstrap.servers``  brokers, ``host:port[,...]``; required
``kafka.<name>``          any other librdkafka client setting (``security.protocol``,
                          ``sasl.mechanism``, ``sasl.username``, ``isolation.level``,
                          ...), given to the driver's admin client and to the
                          executors' consumers
``subscribe``             comma-separated topics (partitions added later are read
                          from their start by the next micro-batch)
``assign``                JSON ``{"topic": [0, 1]}``: just these partitions
``startingOffsets``       ``earliest``, ``latest`` (default) or JSON
                          ``{"topic": {"0": 23, "1": -2}}`` (-2 earliest, -1 latest)
``maxOffsetsPerTrigger``  most offsets per micro-batch, split over partitions in
                          proportion to their backlog
``failOnDataLoss``        ``true`` (default): a batch whose first offsets the broker
                          no longer holds (retention) fails; ``false`` reads from the
                          earliest offset it holds
``gate``                  a JSON file of offsets no micro-batch passes, as for the
                          ``elastic-log`` source
``kafkaConsumer.pollTimeoutMs``  how long a task waits for records it was told
                          exist (default 120000, as Spark's)
========================  ============================================================

Exactly one of ``subscribe`` and ``assign``. Unlike Spark's source (Java's
client, ``read_uncommitted`` by default), librdkafka reads
``read_committed`` by default: a micro-batch ends at each partition's last
stable offset, and records of aborted transactions are skipped (their
offsets, like transaction markers, are gaps). Set
``kafka.isolation.level=read_uncommitted`` for Spark's behaviour.

Where it runs: the reader's driver methods run in the query's Python
streaming worker (one long-lived process per query), which keeps one admin
client; :meth:`_KafkaStreamReader.read` runs on executors, once per Spark
task, in a Python worker that keeps one consumer per client configuration
(workers are reused, so a micro-batch does not pay a consumer's start-up).
What crosses from driver to executor is the options and one
:class:`_LogPartition` per task, both plain data.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from pyspark.sql.datasource import DataSource, DataSourceStreamReader
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from spark_elastic.errors import ArgumentError, InputError
from spark_elastic.log.gate import Offsets
from spark_elastic.log.source import (
    _EARLIEST,
    _LATEST,
    KAFKA_SCHEMA,
    OffsetSpec,
    _check_schema,
    _dump,
    _load,
    _LogPartition,
    _parse_assign,
    _parse_max,
    _parse_spec,
    _parse_topics,
    _ranges,
    check_names_every_partition,
    next_end,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

__all__ = ["KAFKA_SOURCE_FORMAT", "ElasticKafkaDataSource", "register_kafka_source"]

KAFKA_SOURCE_FORMAT: Final = "elastic-kafka"
"""The format name: ``spark.readStream.format("elastic-kafka")``."""

_OPTIONS: Final = (
    "kafka.bootstrap.servers",
    "kafka.<librdkafka setting>",
    "subscribe",
    "assign",
    "startingOffsets",
    "maxOffsetsPerTrigger",
    "failOnDataLoss",
    "gate",
    "kafkaConsumer.pollTimeoutMs",
)
_KNOWN: Final = frozenset(
    {
        "subscribe",
        "assign",
        "startingoffsets",
        "maxoffsetspertrigger",
        "failondataloss",
        "gate",
        "kafkaconsumer.polltimeoutms",
    }
)
_ADMIN_TIMEOUT_S: Final = 30.0
_BATCH_RECORDS: Final = 10_000
# librdkafka's codes (confluent_kafka.KafkaError), spelt out so the driver's checks read plainly.
_PARTITION_EOF: Final = -191
_AUTO_OFFSET_RESET: Final = -140
_OFFSET_OUT_OF_RANGE: Final = 1
_LEADER_MOVING: Final = frozenset({5, 6})  # LEADER_NOT_AVAILABLE, NOT_LEADER_FOR_PARTITION


def register_kafka_source(spark: SparkSession) -> None:
    """Make ``format("elastic-kafka")`` available in ``spark``; calling it again is harmless.

    Runs on the driver.

    Parameters
    ----------
    spark
        The session to register the ``elastic-kafka`` data source in.
    """
    spark.dataSource.register(ElasticKafkaDataSource)


@dataclass(frozen=True)
class _Options:
    """The source's options, checked. Plain data: pickled with the readers."""

    client: tuple[tuple[str, str], ...]
    subscribe: tuple[str, ...] | None
    assign: dict[str, tuple[int, ...]] | None
    starting: OffsetSpec
    max_per_trigger: int | None
    fail_on_data_loss: bool
    gate: str | None
    poll_timeout_s: float

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> _Options:
        client: dict[str, str] = {}
        lowered: dict[str, str] = {}
        for name, value in options.items():
            if name.lower().startswith("kafka."):
                client[name[len("kafka.") :]] = value
            elif name.lower() in _KNOWN:
                lowered[name.lower()] = value
            elif name.lower() != "path":  # Spark passes load(path) as "path"
                raise ArgumentError.invalid(
                    "option", f"an option of the {KAFKA_SOURCE_FORMAT} source", name, _OPTIONS
                )
        if not client.get("bootstrap.servers"):
            raise ArgumentError.invalid(
                "kafka.bootstrap.servers", "brokers as host:port[,host:port...]", None
            )
        chosen = [name for name in ("subscribe", "assign") if name in lowered]
        if len(chosen) != 1:
            raise ArgumentError.invalid(
                "options", "exactly one of 'subscribe', 'assign'", chosen or None
            )
        return cls(
            client=tuple(sorted(client.items())),
            subscribe=_parse_topics(lowered["subscribe"]) if "subscribe" in lowered else None,
            assign=_parse_assign(lowered["assign"]) if "assign" in lowered else None,
            starting=_parse_spec("startingOffsets", lowered.get("startingoffsets", "latest")),
            max_per_trigger=_parse_max(lowered.get("maxoffsetspertrigger")),
            fail_on_data_loss=_parse_bool("failOnDataLoss", lowered.get("failondataloss", "true")),
            gate=lowered.get("gate") or None,
            poll_timeout_s=_parse_timeout(lowered.get("kafkaconsumer.polltimeoutms", "120000")),
        )

    @property
    def isolation(self) -> str:
        """librdkafka's ``isolation.level`` for these options (its default: read_committed)."""
        return dict(self.client).get("isolation.level", "read_committed")


@dataclass
class _Brokers:
    """The driver's view of the brokers: one admin client, made when first needed.

    Lives in the query's streaming worker; never pickled (the readers drop it).
    """

    options: _Options
    _admin: Any = field(default=None, repr=False)
    _assigned: list[tuple[str, int]] | None = field(default=None, repr=False)

    def admin(self) -> Any:
        if self._admin is None:
            from confluent_kafka.admin import AdminClient

            config: dict[str, Any] = {
                k: v for k, v in self.options.client if k not in _CONSUMER_ONLY
            }
            config["logger"] = logging.getLogger("spark_elastic.kafka")
            try:
                self._admin = AdminClient(config)
            except Exception as exc:  # librdkafka refuses an unknown or bad setting here
                raise ArgumentError.invalid(
                    "kafka.*", "settings librdkafka accepts", _first_line(exc)
                ) from None
        return self._admin

    def partitions(self) -> list[tuple[str, int]]:
        """The subscribed partitions now, checked to exist.

        One DescribeTopics request (a Metadata request naming a topic would
        create it on brokers that auto-create topics). With ``assign`` the
        partitions never change, so it is asked once.
        """
        if self._assigned is not None:
            return self._assigned
        from confluent_kafka import TopicCollection

        topics = list(self.options.subscribe or sorted(self.options.assign or {}))
        futures = self.admin().describe_topics(
            TopicCollection(topics), request_timeout=_ADMIN_TIMEOUT_S
        )
        found: list[tuple[str, int]] = []
        for topic in topics:
            try:
                count = len(futures[topic].result().partitions)
            except Exception as exc:
                option = "subscribe" if self.options.assign is None else "assign"
                raise InputError(
                    f"{option}: expected topic {topic!r} on the brokers, found {_first_line(exc)}"
                ) from None
            wanted = range(count) if self.options.assign is None else self.options.assign[topic]
            missing = [p for p in wanted if p >= count]
            if missing:
                raise InputError(
                    f"assign: topic {topic!r} has partitions 0 to {count - 1}, not {missing}"
                )
            found.extend((topic, p) for p in wanted)
        if self.options.assign is not None:
            self._assigned = sorted(found)
        return sorted(found)

    def offsets(self, spec: str) -> Offsets:
        """Each subscribed partition's ``"earliest"`` or ``"latest"`` offset now.

        ``latest`` is the end a consumer of the options' isolation level reads
        to: the high watermark, or (``read_committed``) the last stable offset.
        One ListOffsets request, bounded by 30 s; asked again every 0.1 s
        within that while a partition's leader does not serve it yet (just
        after a topic is created or grown, or a leader election).
        """
        from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
        from confluent_kafka.admin import OffsetSpec as Spec  # type: ignore[attr-defined]

        which = Spec.earliest() if spec == "earliest" else Spec.latest()  # type: ignore[no-untyped-call]
        level = (
            IsolationLevel.READ_COMMITTED
            if self.options.isolation == "read_committed"
            else IsolationLevel.READ_UNCOMMITTED
        )
        deadline = time.monotonic() + _ADMIN_TIMEOUT_S
        while True:
            futures = self.admin().list_offsets(
                {TopicPartition(t, p): which for t, p in self.partitions()},
                isolation_level=level,
                request_timeout=_ADMIN_TIMEOUT_S,
            )
            out: Offsets = {}
            try:
                for tp, future in futures.items():
                    try:
                        out[tp.topic, tp.partition] = future.result().offset
                    except KafkaException as exc:
                        code = exc.args[0].code() if exc.args else None
                        if code in _LEADER_MOVING and time.monotonic() < deadline:
                            raise _LeaderMovingError from None
                        raise InputError(
                            f"kafka.bootstrap.servers: expected the {spec} offset of "
                            f"{tp.topic}:{tp.partition} from the brokers, found {_first_line(exc)}"
                        ) from None
            except _LeaderMovingError:
                time.sleep(0.1)
                continue
            return dict(sorted(out.items()))


class _LeaderMovingError(Exception):
    """A partition's leader does not serve it yet: ask again."""


class ElasticKafkaDataSource(DataSource):  # type: ignore[misc]
    """The ``elastic-kafka`` data source: streaming reads of Kafka with a ``gate``.

    Spark instantiates it with the user's options on the driver and in the
    Python workers that plan the query, and pickles it; it holds only the
    options. :meth:`schema` runs once per ``load()``, :meth:`streamReader`
    once per query.
    """

    @classmethod
    def name(cls) -> str:
        """``"elastic-kafka"``."""
        return KAFKA_SOURCE_FORMAT

    def schema(self) -> StructType:
        """The Kafka source's schema. Runs on the driver at ``load()``, checking the options."""
        _Options.parse(self.options)
        return KAFKA_SCHEMA

    def streamReader(self, schema: StructType) -> _KafkaStreamReader:
        """A streaming reader. Runs on the driver when a query starts."""
        _check_schema(schema)
        return _KafkaStreamReader(_Options.parse(self.options))


class _KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]
    """Micro-batch reader of Kafka.

    The driver's copy (in the query's streaming worker) calls every method
    but :meth:`read` and keeps an admin client; the copy pickled to the
    executors calls only :meth:`read`, and carries only the options.
    """

    def __init__(self, options: _Options) -> None:
        self._options = options
        self._brokers = _Brokers(options)
        self._target: Offsets | None = None
        self._latest: Offsets | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Only the options cross to the executors: the admin client and offsets stay here.
        return {"_options": self._options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._options = state["_options"]
        self._brokers = _Brokers(self._options)
        self._target = self._latest = None

    def initialOffset(self) -> dict[str, dict[str, int]]:
        """Where a new query starts: ``startingOffsets``. Driver, once per new query."""
        spec = self._options.starting
        if isinstance(spec, str):
            return _dump(self._brokers.offsets(spec))
        earliest = self._brokers.offsets("earliest")
        latest = self._brokers.offsets("latest")
        check_names_every_partition(spec, latest, "startingOffsets")
        out: Offsets = {}
        for tp, wanted in spec.items():
            offset = (
                earliest[tp] if wanted == _EARLIEST else latest[tp] if wanted == _LATEST else wanted
            )
            if offset > latest[tp]:
                raise InputError(
                    f"startingOffsets: offset {offset} of {tp[0]}:{tp[1]} is past its end "
                    f"offset {latest[tp]}"
                )
            out[tp] = offset
        return _dump(out)

    def getDefaultReadLimit(self) -> ReadLimit:
        """``maxOffsetsPerTrigger`` as a row limit, else no limit. Driver, once per query."""
        limit = self._options.max_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix the query's target: the end offsets now. Driver, once, for Trigger.AvailableNow."""
        self._target = self._brokers.offsets("latest")

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, dict[str, int]]:
        """The end of the next micro-batch: what the brokers hold, no further than the gate.

        Runs on the driver once per trigger: one DescribeTopics request (none
        with ``assign``) and one ListOffsets request. A partition that is new
        since ``start`` (a topic grown) starts at offset 0.
        """
        available = self._latest = self._brokers.offsets("latest")
        return _dump(next_end(_load(start), available, self._target, self._options.gate, limit))

    def reportLatestOffset(self) -> dict[str, dict[str, int]]:
        """End offsets for query progress, as :meth:`latestOffset` read them. Driver."""
        return _dump(self._latest if self._latest is not None else self._brokers.offsets("latest"))

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[_LogPartition]:
        """One input partition per Kafka partition with offsets in ``[start, end)``.

        Runs on the driver once per micro-batch; each range is pickled to an executor.
        """
        return _ranges(_load(start), _load(end))

    def read(self, partition: _LogPartition) -> Iterator[pa.RecordBatch]:
        """Arrow batches of one range's records. Runs on an executor, once per task."""
        return _read(self._options, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: progress lives in Spark's checkpoint. Driver, per micro-batch."""


# One consumer per client configuration per Python worker: Spark reuses its workers, and a
# librdkafka consumer takes tens of milliseconds (and a connection) to start.
_CONSUMERS: dict[tuple[tuple[str, str], ...], Any] = {}
_CONSUMERS_LOCK = threading.Lock()
# Consumer settings (ours or the user's) that the admin client has no use for.
_CONSUMER_ONLY: Final = frozenset({"isolation.level", "auto.offset.reset", "group.id"})


def _consumer(options: _Options) -> Any:
    from confluent_kafka import Consumer

    config = (
        *options.client,
        ("auto.offset.reset", "error" if options.fail_on_data_loss else "earliest"),
    )
    with _CONSUMERS_LOCK:
        consumer = _CONSUMERS.get(config)
        if consumer is None:
            settings = {
                # Its connection failures (a broker restarting) go to logging, not stderr.
                "logger": logging.getLogger("spark_elastic.kafka"),
                # librdkafka wants a group for a consumer; this one never joins or commits.
                "group.id": "spark-elastic-reader",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "enable.partition.eof": True,
                # A task reads a range it knows exists, as fast as it can: librdkafka's
                # defaults prefetch too little for that (300,000 records of 100 bytes from
                # one partition took 2.6 s with them, 0.9 s with these).
                "queued.min.messages": 1_000_000,
                "fetch.wait.max.ms": 10,
                **dict(config),
            }
            consumer = _CONSUMERS[config] = Consumer(settings)
        return consumer


def _read(options: _Options, task: _LogPartition) -> Iterator[pa.RecordBatch]:
    """The records of ``[start, end)`` in batches of up to 10,000, in offset order.

    Offsets with no record (transaction markers, aborted records under
    ``read_committed``, compacted-away keys) are skipped; the range ends when
    the consumer's position reaches ``end``.
    """
    from confluent_kafka import TopicPartition

    consumer = _consumer(options)
    consumer.assign([TopicPartition(task.topic, task.partition, task.start)])
    deadline = time.monotonic() + options.poll_timeout_s
    position = task.start
    try:
        while position < task.end:
            wanted = min(_BATCH_RECORDS, task.end - position)
            messages = consumer.consume(num_messages=wanted, timeout=0.5)
            records = _records(options, task, messages, consumer, position)
            if records:
                position = records[-1].offset() + 1
                yield _batch(task, records)
            elif position < task.end:
                # Past markers and aborted records there is no message, only a position.
                (now,) = consumer.position([TopicPartition(task.topic, task.partition)])
                position = max(position, now.offset)
                if position < task.end and time.monotonic() > deadline:
                    raise InputError(
                        f"kafkaConsumer.pollTimeoutMs: expected offsets up to {task.end} of "
                        f"{task.topic}:{task.partition} within {options.poll_timeout_s:g} s, "
                        f"found the read at {position}"
                    )
    finally:
        consumer.unassign()


def _records(
    options: _Options, task: _LogPartition, messages: list[Any], consumer: Any, position: int
) -> list[Any]:
    """The messages that are records of the range (not events, not past its end).

    An offset-out-of-range error is data loss only when the brokers' earliest
    offset is past the range's start: the suite's CI once saw one on a
    consumer reused from an earlier task for offsets the broker held, so
    the claim is checked before it is made (and the read goes on otherwise).
    """
    errors = [m.error() for m in messages]
    if any(errors):
        for error in errors:
            if error is None or error.code() == _PARTITION_EOF:
                continue
            if error.code() in (_AUTO_OFFSET_RESET, _OFFSET_OUT_OF_RANGE) and not _lost(
                consumer, task, position
            ):
                from confluent_kafka import TopicPartition

                # Set back to `position`: what this batch holds is read again.
                consumer.assign([TopicPartition(task.topic, task.partition, position)])
                return []
            raise _read_error(options, task, error)
        messages = [m for m, error in zip(messages, errors, strict=True) if error is None]
    if messages and messages[-1].offset() >= task.end:
        messages = [m for m in messages if m.offset() < task.end]
    return messages


def _batch(task: _LogPartition, messages: list[Any]) -> pa.RecordBatch:
    """One Arrow batch of Spark's Kafka schema; one pass over the messages per column."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from spark_elastic.log.storage import record_schema

    schema = record_schema()
    count = len(messages)
    stamps = [m.timestamp() for m in messages]
    millis = [stamp for _, stamp in stamps]
    kinds = [kind for kind, _ in stamps]
    return pa.RecordBatch.from_arrays(
        [
            pa.array([m.key() for m in messages], pa.binary()),
            pa.array([m.value() for m in messages], pa.binary()),
            pa.repeat(pa.scalar(task.topic, pa.string()), count),
            pa.repeat(pa.scalar(task.partition, pa.int32()), count),
            pa.array([m.offset() for m in messages], pa.int64()),
            pc.multiply(pa.array(millis, pa.int64()), 1000).cast(schema.field(5).type),
            # librdkafka: 0 none, 1 create time, 2 log-append time; Spark (Java's): -1, 0, 1.
            pc.subtract(pa.array(kinds, pa.int32()), pa.scalar(1, pa.int32())),
        ],
        schema=schema,
    )


def _lost(consumer: Any, task: _LogPartition, position: int) -> bool:
    """Whether the brokers no longer hold ``position``, the next offset to read (retention
    deleted it): their earliest offset is past it."""
    from confluent_kafka import TopicPartition

    low, _ = consumer.get_watermark_offsets(
        TopicPartition(task.topic, task.partition), timeout=_ADMIN_TIMEOUT_S, cached=False
    )
    return bool(low > position)


def _read_error(options: _Options, task: _LogPartition, error: Any) -> InputError:
    if error.code() in (_AUTO_OFFSET_RESET, _OFFSET_OUT_OF_RANGE):
        return InputError(
            f"failOnDataLoss: offsets {task.start} to {task.end} of {task.topic}:"
            f"{task.partition} are no longer on the brokers (retention?); set "
            f"failOnDataLoss=false to read from the earliest offset they hold"
        )
    return InputError(f"{task.topic}:{task.partition}: the read failed: {error.str()}")


def _parse_bool(name: str, text: str) -> bool:
    word = text.strip().lower()
    if word not in {"true", "false"}:
        raise ArgumentError.invalid(name, "true or false", text)
    return word == "true"


def _parse_timeout(text: str) -> float:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ArgumentError.invalid(
            "kafkaConsumer.pollTimeoutMs", "a positive number of milliseconds", text
        )
    return value / 1000


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
