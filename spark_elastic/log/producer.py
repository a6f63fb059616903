"""Writing to the embedded log: a producer that partitions keys like Kafka's.

A keyed record goes to Kafka's default partition for its key,
``toPositive(murmur2(key)) % partitions`` (:func:`udfs.kafka_partitions`), so
data produced here is laid out exactly as a Kafka producer would lay it out.
Kafka sends null-keyed records to a *sticky* partition that changes with
batch timing; for reproducible runs this producer deals them round-robin
instead, starting at partition 0, per producer.

A producer reads the topic's partition count on every call, so records sent
after :meth:`EmbeddedLog.grow` use the new count (as a Kafka producer does once
its metadata refreshes).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Final, NamedTuple

import numpy as np
import numpy.typing as npt

from spark_elastic.errors import ArgumentError, ArgumentTypeError, LogError
from spark_elastic.log.storage import TOPIC_META, Blob, PartitionAppender, TopicCatalog

__all__ = ["MAX_RECORD_BYTES", "MAX_TIMESTAMP", "Producer", "SendResult", "SentBatch"]

MAX_RECORD_BYTES: Final = 1 << 30
"""Most bytes of key plus value in one record."""
MAX_TIMESTAMP: Final = 253_402_300_799_999
"""The last millisecond of year 9999, the latest timestamp Spark can show."""

Data = bytes | bytearray | memoryview | str | None


class SendResult(NamedTuple):
    """Where :meth:`Producer.send` put a record: unpacks as ``partition, offset``."""

    partition: int
    offset: int


@dataclass(frozen=True, slots=True, eq=False)
class SentBatch:
    """Where :meth:`Producer.send_many` put each record, in the order they were given.

    Attributes
    ----------
    partitions
        ``int32`` partition of each record.
    offsets
        ``int64`` offset of each record in its partition.
    """

    partitions: npt.NDArray[np.int32]
    offsets: npt.NDArray[np.int64]

    def __len__(self) -> int:
        return len(self.offsets)


def _to_blob(value: Data, name: str) -> Blob:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        # Kafka's StringSerializer: UTF-8.
        return value.encode("utf-8")
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise ArgumentTypeError.wrong_type(name, "bytes, str or None", value)


def _to_timestamp(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ArgumentTypeError.wrong_type(name, "an int timestamp in epoch milliseconds", value)
    if not 0 <= value <= MAX_TIMESTAMP:
        raise ArgumentError.invalid(
            name, f"epoch milliseconds from 0 to {MAX_TIMESTAMP} (year 9999)", value
        )
    return int(value)


class Producer:
    """Appends records to one topic of an :class:`~spark_elastic.log.embedded.EmbeddedLog`.

    Safe to share between threads; producers in other processes may write
    the same topic at the same time. Every record whose offset was returned
    is in the log exactly once. Close it (or use it as a context manager) to
    release its open files.

    Parameters
    ----------
    log
        The log.
    topic
        An existing topic.

    Raises
    ------
    LogError
        No such topic.
    """

    def __init__(self, log: TopicCatalog, topic: str) -> None:
        self._log = log
        self._topic = topic
        self._topic_dir = log.topic_dir(topic)
        self._lock = threading.Lock()
        self._appenders: dict[int, PartitionAppender] = {}
        self._next_null_key = 0
        self._count_stamp: tuple[int, int] | None = None
        self._count = 0
        self._closed = False

    @property
    def topic(self) -> str:
        """The topic written to."""
        return self._topic

    def __repr__(self) -> str:
        return f"Producer({self._log!r}, {self._topic!r})"

    def send(
        self,
        key: Data,
        value: Data,
        timestamp: int | None = None,
        partition: int | None = None,
    ) -> SendResult:
        """Append one record; return its partition and offset once it is committed.

        Parameters
        ----------
        key, value
            ``bytes``, ``str`` (sent as UTF-8) or ``None``.
        timestamp
            Create time in epoch milliseconds; default now.
        partition
            Write to this partition instead of the key's.

        Returns
        -------
        SendResult
            The record's ``partition, offset``.

        Raises
        ------
        ArgumentTypeError
            A key, value, timestamp or partition has the wrong type.
        ArgumentError
            ``partition`` does not exist, or a value is out of range.
        LogError
            The producer is closed.
        """
        blob_key = _to_blob(key, "key")
        blob_value = _to_blob(value, "value")
        _check_size(blob_key, blob_value)
        stamp = _now() if timestamp is None else _to_timestamp(timestamp, "timestamp")
        count = self._partition_count()
        if partition is not None:
            if isinstance(partition, bool) or not isinstance(partition, int):
                raise ArgumentTypeError.wrong_type("partition", "an int or None", partition)
            if not 0 <= partition < count:
                raise ArgumentError.invalid(
                    "partition", f"a partition of {self._topic!r}, 0 to {count - 1}", partition
                )
            target = partition
        else:
            target = int(self._partitions_for([blob_key], count)[0])
        offset = self._appender(target).append([blob_key], [blob_value], [stamp])
        return SendResult(target, offset)

    def send_many(
        self,
        keys: Sequence[Data],
        values: Sequence[Data],
        timestamps: Sequence[int] | npt.NDArray[np.integer] | None = None,
    ) -> SentBatch:
        """Append many records, each to its key's partition; one append per partition.

        Records of one partition keep their order. Each partition's share is
        committed atomically; if the call raises, the shares already committed
        stay (their offsets were not returned, like a Kafka send that timed out).

        Parameters
        ----------
        keys, values
            Equally long sequences of ``bytes``, ``str`` or ``None``.
        timestamps
            Create times in epoch milliseconds; default now, for all.

        Returns
        -------
        SentBatch
            Partition and offset of each record, in input order.
        """
        blob_keys = [_to_blob(k, "keys[]") for k in keys]
        blob_values = [_to_blob(v, "values[]") for v in values]
        if len(blob_keys) != len(blob_values):
            raise ArgumentError.invalid(
                "values", f"as many values as keys ({len(blob_keys)})", f"{len(blob_values)} values"
            )
        for key, value in zip(blob_keys, blob_values, strict=True):
            _check_size(key, value)
        if timestamps is None:
            stamps = [_now()] * len(blob_keys)
        else:
            stamps = [_to_timestamp(t, "timestamps[]") for t in timestamps]
            if len(stamps) != len(blob_keys):
                raise ArgumentError.invalid(
                    "timestamps",
                    f"as many timestamps as keys ({len(blob_keys)})",
                    f"{len(stamps)} timestamps",
                )
        partitions = self._partitions_for(blob_keys, self._partition_count())
        offsets = np.empty(len(blob_keys), dtype=np.int64)
        order = np.argsort(partitions, kind="stable")
        bounds = np.flatnonzero(np.diff(partitions[order])) + 1
        for rows in np.split(order, bounds) if len(order) else []:
            picked = rows.tolist()
            base = self._appender(int(partitions[picked[0]])).append(
                [blob_keys[i] for i in picked],
                [blob_values[i] for i in picked],
                [stamps[i] for i in picked],
            )
            offsets[rows] = np.arange(base, base + len(picked), dtype=np.int64)
        return SentBatch(partitions, offsets)

    def close(self) -> None:
        """Release the open files; the producer cannot send afterwards."""
        with self._lock:
            self._closed = True
            appenders, self._appenders = self._appenders, {}
        for appender in appenders.values():
            appender.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _partitions_for(self, keys: list[Blob], count: int) -> npt.NDArray[np.int32]:
        partitions = np.empty(len(keys), dtype=np.int32)
        null = np.fromiter((k is None for k in keys), dtype=bool, count=len(keys))
        if not null.all():
            import pyarrow as pa

            from udfs import kafka_partitions

            present = [k for k in keys if k is not None]
            offsets = np.zeros(len(present) + 1, dtype=np.int64)
            np.cumsum(np.fromiter(map(len, present), np.int64, len(present)), out=offsets[1:])
            # Arrow buffers built directly: hashed in place, and unlike pa.array(list)
            # this does not import pandas (which costs a CLI run half a second).
            keyed = pa.Array.from_buffers(
                pa.large_binary(),
                len(present),
                [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(present))],
            )
            partitions[~null] = kafka_partitions(keyed, count)
        nulls = int(np.count_nonzero(null))
        if nulls:
            with self._lock:
                first = self._next_null_key
                self._next_null_key += nulls
            partitions[null] = np.arange(first, first + nulls) % count
        return partitions

    def _partition_count(self) -> int:
        # The count changes only by replacing topic.json, which changes its inode:
        # one stat per call instead of a read and a JSON parse.
        meta = os.stat(self._topic_dir / TOPIC_META)
        stamp = (meta.st_ino, meta.st_mtime_ns)
        if stamp != self._count_stamp:
            self._count = self._log.partition_count(self._topic)
            self._count_stamp = stamp
        return self._count

    def _appender(self, partition: int) -> PartitionAppender:
        with self._lock:
            if self._closed:
                raise LogError(f"the producer of topic {self._topic!r} is closed")
            appender = self._appenders.get(partition)
            if appender is None:
                appender = PartitionAppender(self._topic_dir, partition, fsync=self._log.fsync)
                self._appenders[partition] = appender
            return appender


def _check_size(key: Blob, value: Blob) -> None:
    size = len(key or b"") + len(value or b"")
    if size > MAX_RECORD_BYTES:
        raise ArgumentError.invalid(
            "record", f"at most {MAX_RECORD_BYTES} bytes of key and value", f"{size} bytes"
        )


def _now() -> int:
    return time.time_ns() // 1_000_000
