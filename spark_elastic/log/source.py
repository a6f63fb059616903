"""Spark source for the embedded log, on PySpark's Python Data Source API.

``spark.readStream.format("elastic-log")`` (after :func:`register_log_source`)
reads topics of an :class:`~spark_elastic.log.embedded.EmbeddedLog` into rows with
exactly the schema of Spark's Kafka source. Options mirror the Kafka
source's where they apply:

========================  ============================================================
``path``                  the log directory (or ``.load(path)``); required
``subscribe``             comma-separated topics
``subscribePattern``      a regular expression; topics created later are picked up
``assign``                JSON ``{"topic": [0, 1]}``: just these partitions
``startingOffsets``       ``earliest``, ``latest`` (streaming default) or JSON
                          ``{"topic": {"0": 23, "1": -2}}`` (-2 earliest, -1 latest)
``endingOffsets``         batch reads only: ``latest`` (default) or JSON as above
``maxOffsetsPerTrigger``  most records per micro-batch, split over partitions in
                          proportion to their backlog
``failOnDataLoss``        accepted and ignored: the log never deletes records
``gate``                  a JSON file of offsets, ``{"topic": {"0": 23}}``, that no
                          micro-batch passes (read each trigger); a partition it
                          does not name, or a missing file, admits nothing new, and
                          ``null`` in the file lifts the gate (spark-elastic's own:
                          a warm-up that follows its old owners)
``kafka.*``               ignored, so a query can switch between this and ``kafka``
========================  ============================================================

Exactly one of ``subscribe``, ``subscribePattern`` and ``assign`` is needed.
As with Kafka, JSON starting offsets must name every partition there is at
the start. Partitions that appear later (a topic grown with
:meth:`~spark_elastic.log.embedded.EmbeddedLog.grow`, or a new topic matching the
pattern) are read from offset 0 by the next micro-batch. Trigger.AvailableNow
reads what exists when the query starts, in batches of
``maxOffsetsPerTrigger``. Each micro-batch has one Spark input partition per
log partition with new records, and executors hand Spark Arrow record
batches, not row tuples.

Offsets, in the checkpoint and in query progress, are Kafka's JSON form:
``{"topic": {"partition": next offset}}``.

The log directory must be readable at the same path by the driver and every
executor (a local or shared file system).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_elastic.errors import ArgumentError, LogError
from spark_elastic.log.embedded import EmbeddedLog, validate_topic_name
from spark_elastic.log.gate import Offsets, read_gate

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

__all__ = [
    "KAFKA_SCHEMA",
    "LOG_SOURCE_FORMAT",
    "ElasticLogDataSource",
    "register_log_source",
]

LOG_SOURCE_FORMAT: Final = "elastic-log"
"""The format name: ``spark.readStream.format("elastic-log")``."""

KAFKA_SCHEMA: Final = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
)
"""The rows' schema, the same as Spark's Kafka source (without headers)."""

_EARLIEST: Final = -2
_LATEST: Final = -1
_IGNORED: Final = frozenset({"failondataloss"})
_OPTIONS: Final = (
    "path",
    "subscribe",
    "subscribePattern",
    "assign",
    "startingOffsets",
    "endingOffsets",
    "maxOffsetsPerTrigger",
    "failOnDataLoss",
    "gate",
)

TopicPartition = tuple[str, int]
OffsetSpec = str | dict[TopicPartition, int]
"""``"earliest"``, ``"latest"``, or per-partition offsets where -2/-1 mean earliest/latest."""


def register_log_source(spark: SparkSession) -> None:
    """Make ``format("elastic-log")`` available in ``spark``; calling it again is harmless.

    Runs on the driver. Works for classic and Spark Connect sessions.

    Parameters
    ----------
    spark
        The session to register the ``elastic-log`` data source in.
    """
    spark.dataSource.register(ElasticLogDataSource)


@dataclass(frozen=True)
class _LogPartition(InputPartition):  # type: ignore[misc]
    """Offsets ``[start, end)`` of one log partition: one Spark task. Pickled to executors."""

    topic: str
    partition: int
    start: int
    end: int


@dataclass(frozen=True)
class _Options:
    """The source's options, checked. Plain data: pickled with the readers."""

    path: str
    subscribe: tuple[str, ...] | None
    pattern: str | None
    assign: dict[str, tuple[int, ...]] | None
    starting: OffsetSpec | None
    ending: OffsetSpec
    max_per_trigger: int | None
    gate: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> _Options:
        known = {name.lower() for name in _OPTIONS}
        for name in options:
            if name.lower() not in known and not name.lower().startswith("kafka."):
                raise ArgumentError.invalid(
                    "option", f"an option of the {LOG_SOURCE_FORMAT} source", name, _OPTIONS
                )
        lowered = {name.lower(): value for name, value in options.items()}
        path = lowered.get("path")
        if not path:
            raise ArgumentError.invalid("path", "the log directory (option or load(path))", path)
        chosen = [name for name in ("subscribe", "subscribepattern", "assign") if name in lowered]
        if len(chosen) != 1:
            raise ArgumentError.invalid(
                "options",
                "exactly one of 'subscribe', 'subscribePattern', 'assign'",
                chosen,
            )
        subscribe = pattern = assign = None
        if "subscribe" in lowered:
            subscribe = _parse_topics(lowered["subscribe"])
        elif "subscribepattern" in lowered:
            pattern = lowered["subscribepattern"]
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ArgumentError.invalid(
                    "subscribePattern", f"a regular expression ({exc})", pattern
                ) from None
        else:
            assign = _parse_assign(lowered["assign"])
        starting = lowered.get("startingoffsets")
        return cls(
            path=path,
            subscribe=subscribe,
            pattern=pattern,
            assign=assign,
            starting=None if starting is None else _parse_spec("startingOffsets", starting),
            ending=_parse_spec("endingOffsets", lowered.get("endingoffsets", "latest")),
            max_per_trigger=_parse_max(lowered.get("maxoffsetspertrigger")),
            gate=lowered.get("gate") or None,
        )

    def log(self) -> EmbeddedLog:
        """The log, opened read-only (no directory is created)."""
        return EmbeddedLog(self.path, create=False)

    def available(self, log: EmbeddedLog) -> Offsets:
        """End offsets of every subscribed partition now, sorted."""
        if self.assign is not None:
            return {
                (topic, p): offset
                for topic, partitions in sorted(self.assign.items())
                for p, offset in sorted(log.end_offsets(topic).items())
                if p in partitions
            }
        topics = self.subscribe
        if topics is None:
            pattern = re.compile(self.pattern or "")
            topics = tuple(t for t in log.topics() if pattern.fullmatch(t))
        return {
            (topic, p): offset
            for topic in sorted(topics)
            for p, offset in sorted(log.end_offsets(topic).items())
        }

    def check_exists(self, log: EmbeddedLog) -> None:
        """Refuse subscribed topics and assigned partitions that do not exist (typos)."""
        for topic in self.subscribe or ():
            log.partition_count(topic)
        for topic, partitions in (self.assign or {}).items():
            count = log.partition_count(topic)
            missing = [p for p in partitions if p >= count]
            if missing:
                raise LogError(
                    f"assign: topic {topic!r} has partitions 0 to {count - 1}, not {missing}"
                )

    def resolve(self, spec: OffsetSpec, available: Offsets, option: str) -> Offsets:
        """Concrete offsets for ``spec`` against the partitions and end offsets now."""
        if isinstance(spec, str):
            return dict.fromkeys(available, 0) if spec == "earliest" else dict(available)
        check_names_every_partition(spec, available, option)
        resolved: Offsets = {}
        for tp, end in available.items():
            wanted = spec[tp]
            offset = 0 if wanted == _EARLIEST else end if wanted == _LATEST else wanted
            if offset > end:
                raise LogError(
                    f"{option}: offset {offset} of partition {tp[1]} of topic {tp[0]!r} is past "
                    f"its end offset {end}"
                )
            resolved[tp] = offset
        return resolved


class ElasticLogDataSource(DataSource):  # type: ignore[misc]
    """The ``elastic-log`` data source: streaming and batch reads of the embedded log.

    Spark instantiates it with the user's options on the driver, in each
    Python worker that plans the query, and pickles it; it holds only the
    options. :meth:`schema` runs once per ``load()``, the reader methods once
    per query (see :class:`_LogStreamReader` and :class:`_LogBatchReader`).
    """

    @classmethod
    def name(cls) -> str:
        """``"elastic-log"``."""
        return LOG_SOURCE_FORMAT

    def schema(self) -> StructType:
        """The Kafka source's schema. Runs on the driver at ``load()``, checking the options."""
        _Options.parse(self.options)
        return KAFKA_SCHEMA

    def streamReader(self, schema: StructType) -> _LogStreamReader:
        """A streaming reader. Runs on the driver when a query starts."""
        _check_schema(schema)
        return _LogStreamReader(_Options.parse(self.options))

    def reader(self, schema: StructType) -> _LogBatchReader:
        """A batch reader. Runs on the driver when a batch query is planned."""
        _check_schema(schema)
        return _LogBatchReader(_Options.parse(self.options))


class _LogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]
    """Micro-batch reader of the embedded log.

    Spark makes one in the driver's streaming worker, which calls every
    method but :meth:`read`, and one in a planning worker that is pickled to
    the executors, which call only :meth:`read`. Both hold only the parsed
    options (and, in the driver's, the Trigger.AvailableNow target), so
    pickling is cheap and no state crosses from driver to executor except the
    :class:`_LogPartition` of each task.
    """

    def __init__(self, options: _Options) -> None:
        self._options = options
        self._target: Offsets | None = None

    def initialOffset(self) -> dict[str, dict[str, int]]:
        """Where a new query starts: ``startingOffsets`` (default latest).

        Runs on the driver, once per query that has no checkpointed offsets.
        """
        log = self._options.log()
        self._options.check_exists(log)
        available = self._options.available(log)
        spec = self._options.starting or "latest"
        return _dump(self._options.resolve(spec, available, "startingOffsets"))

    def getDefaultReadLimit(self) -> ReadLimit:
        """``maxOffsetsPerTrigger`` as a row limit, else no limit. Driver, once per query."""
        limit = self._options.max_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix the query's target: the end offsets now. Driver, once, for Trigger.AvailableNow."""
        self._target = self._options.available(self._options.log())

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, dict[str, int]]:
        """The end of the next micro-batch: all new records, or ``limit`` rows of them.

        Runs on the driver once per trigger. Partitions that are new since
        ``start`` start at 0; they are included once they hold records.
        """
        available = self._options.available(self._options.log())
        return _dump(next_end(_load(start), available, self._target, self._options.gate, limit))

    def reportLatestOffset(self) -> dict[str, dict[str, int]]:
        """End offsets now, for query progress. Driver, once per trigger."""
        return _dump(self._options.available(self._options.log()))

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[_LogPartition]:
        """One input partition per log partition with records in ``[start, end)``.

        Runs on the driver once per micro-batch (again for a batch replayed
        after a restart); each returned partition is pickled to an executor.
        """
        return _ranges(_load(start), _load(end))

    def read(self, partition: _LogPartition) -> Iterator[pa.RecordBatch]:
        """Arrow batches of one partition's records. Runs on an executor, once per task."""
        return _read(self._options, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: the log keeps every record. Driver, after each micro-batch."""


class _LogBatchReader(DataSourceReader):  # type: ignore[misc]
    """Batch reader: ``startingOffsets`` (default earliest) to ``endingOffsets`` (latest).

    Made and planned in a driver worker; pickled with its options to the
    executors, which call :meth:`read` once per input partition.
    """

    def __init__(self, options: _Options) -> None:
        self._options = options

    def partitions(self) -> Sequence[InputPartition]:
        """The offset ranges to read, one per log partition with records. Driver, once."""
        log = self._options.log()
        self._options.check_exists(log)
        available = self._options.available(log)
        start = self._options.resolve(
            self._options.starting or "earliest", available, "startingOffsets"
        )
        end = self._options.resolve(self._options.ending, available, "endingOffsets")
        backwards = [tp for tp in available if end[tp] < start[tp]]
        if backwards:
            raise ArgumentError.invalid(
                "endingOffsets",
                f"offsets at or after startingOffsets (not for {_names(backwards)})",
                _dump(end),
            )
        return _ranges(start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Arrow batches of one partition's records. Runs on an executor, once per task."""
        if not isinstance(partition, _LogPartition):
            # Spark plans one empty partition when there are none.
            return iter(())
        return _read(self._options, partition)


def _read(options: _Options, partition: _LogPartition) -> Iterator[pa.RecordBatch]:
    return options.log().read_batches(
        partition.topic, partition.partition, partition.start, partition.end
    )


def next_end(
    begin: Offsets,
    available: Offsets,
    target: Offsets | None,
    gate: str | None,
    limit: ReadLimit,
) -> Offsets:
    """Where the micro-batch that starts at ``begin`` ends: a streaming reader's ``latestOffset``.

    What is ``available``, no further than the Trigger.AvailableNow ``target``
    and the ``gate`` file, and at most ``limit`` rows. Partitions new since
    ``begin`` start at 0 and are included once they hold records. Shared by
    the ``elastic-log`` and ``elastic-kafka`` sources; runs on the driver.
    """
    if target is not None:
        available = {tp: min(end, target[tp]) for tp, end in available.items() if tp in target}
    if gate is not None:
        available = _gated(available, begin, read_gate(gate))
    end = {tp: max(available.get(tp, 0), begin.get(tp, 0)) for tp in available.keys() | begin}
    end = {tp: o for tp, o in end.items() if o > 0 or tp in begin}
    if isinstance(limit, ReadMaxRows):
        end = _admit(begin, end, limit.max_rows)
    return end


def check_names_every_partition(spec: Offsets, available: Offsets, option: str) -> None:
    """Refuse JSON offsets that lack a subscribed partition or name one not subscribed."""
    missing = sorted(set(available) - set(spec))
    extra = sorted(set(spec) - set(available))
    if missing or extra:
        problem = (
            f"it lacks partitions {_names(missing)}"
            if missing
            else f"it names partitions not subscribed: {_names(extra)}"
        )
        raise ArgumentError.invalid(
            option, f"an offset for every subscribed partition ({problem})", _dump(spec)
        )


def _gated(available: Offsets, begin: Offsets, gate: Offsets | None) -> Offsets:
    """End offsets no further than the gate (and never behind where a batch begins)."""
    if gate is None:
        return available
    return {tp: max(min(end, gate.get(tp, 0)), begin.get(tp, 0)) for tp, end in available.items()}


def _ranges(start: Offsets, end: Offsets) -> list[_LogPartition]:
    return [
        _LogPartition(topic, p, start.get((topic, p), 0), stop)
        for (topic, p), stop in sorted(end.items())
        if stop > start.get((topic, p), 0)
    ]


def _admit(begin: Offsets, end: Offsets, limit: int) -> Offsets:
    """Cap ``end`` to ``limit`` records in all, split in proportion to each partition's backlog.

    Largest-remainder rounding: the caps add up to exactly ``limit`` when the
    backlog is larger, so every batch makes progress and none overshoots.
    """
    backlog = {tp: end[tp] - begin.get(tp, 0) for tp in end}
    total = sum(backlog.values())
    if total <= limit:
        return end
    shares = {tp: divmod(limit * size, total) for tp, size in backlog.items()}
    left = limit - sum(whole for whole, _ in shares.values())
    ranked = sorted(shares, key=lambda tp: (-shares[tp][1], tp))
    bonus = set(ranked[:left])
    return {tp: begin.get(tp, 0) + shares[tp][0] + (tp in bonus) for tp in end}


def _dump(offsets: Offsets) -> dict[str, dict[str, int]]:
    """Kafka's offset JSON, topics and partitions in order (Spark compares offsets as text)."""
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = offset
    return out


def _load(offsets: Mapping[str, Any]) -> Offsets:
    return {
        (topic, int(partition)): int(offset)
        for topic, partitions in offsets.items()
        for partition, offset in partitions.items()
    }


def _names(partitions: Sequence[TopicPartition]) -> str:
    return ", ".join(f"{topic}:{p}" for topic, p in partitions)


def _check_schema(schema: StructType) -> None:
    if schema != KAFKA_SCHEMA:
        raise ArgumentError.invalid(
            "schema", f"the Kafka source schema {KAFKA_SCHEMA.simpleString()}", schema
        )


def _parse_topics(text: str) -> tuple[str, ...]:
    topics = tuple(t.strip() for t in text.split(",") if t.strip())
    if not topics:
        raise ArgumentError.invalid("subscribe", "comma-separated topic names", text)
    for topic in topics:
        validate_topic_name(topic, "subscribe")
    return topics


def _json_object(name: str, text: str, expected: str) -> dict[str, Any]:
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict) or not parsed:
        raise ArgumentError.invalid(name, expected, text)
    return parsed


def _parse_assign(text: str) -> dict[str, tuple[int, ...]]:
    expected = 'JSON like {"topic": [0, 1]}'
    parsed = _json_object("assign", text, expected)
    assign: dict[str, tuple[int, ...]] = {}
    for topic, partitions in parsed.items():
        validate_topic_name(topic, "assign")
        if (
            not isinstance(partitions, list)
            or not partitions
            or not all(
                isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in partitions
            )
        ):
            raise ArgumentError.invalid("assign", expected, text)
        assign[topic] = tuple(sorted(set(partitions)))
    return assign


def _parse_spec(name: str, text: str) -> OffsetSpec:
    word = text.strip().lower()
    if word in {"earliest", "latest"}:
        return word
    expected = 'earliest, latest, or JSON like {"topic": {"0": 23, "1": -2}}'
    parsed = _json_object(name, text, expected)
    spec: dict[TopicPartition, int] = {}
    for topic, partitions in parsed.items():
        validate_topic_name(topic, name)
        if not isinstance(partitions, dict):
            raise ArgumentError.invalid(name, expected, text)
        for partition, offset in partitions.items():
            if (
                not partition.isdigit()
                or isinstance(offset, bool)
                or not isinstance(offset, int)
                or offset < _EARLIEST
            ):
                raise ArgumentError.invalid(name, expected, text)
            spec[topic, int(partition)] = offset
    return spec


def _parse_max(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ArgumentError.invalid("maxOffsetsPerTrigger", "a positive number of records", text)
    return value
