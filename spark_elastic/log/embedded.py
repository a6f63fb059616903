"""The embedded partitioned log: Kafka-like topics in a local directory, no broker.

Layout of a log directory::

    DIR/elastic-log.json          marks DIR as a log (format version)
    DIR/<topic>/topic.json        {"topic": ..., "partitions": N}, replaced atomically
    DIR/<topic>/<p>.log, <p>.idx  one partition's frames and commit index

See :mod:`spark_elastic.log.storage` for the partition files and their
durability argument, and :mod:`spark_elastic.log.producer` for writing.

A topic's partition count only grows (SEP-5): :meth:`EmbeddedLog.grow` adds
partitions, whose files exist before the new count is published, so a reader
that sees the count always finds the files. Topic-level changes (create,
grow) are serialized by a ``flock`` on the topic directory.

An :class:`EmbeddedLog` holds no open files and only its path and settings, so
it is cheap to make anywhere, including in Spark executors.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from spark_elastic.errors import ArgumentError, ArgumentTypeError, LogError
from spark_elastic.log.producer import Producer
from spark_elastic.log.storage import (
    MAX_BATCH_BYTES,
    TOPIC_META,
    create_partition_files,
    end_offset,
    read_batches,
    record_schema,
)

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "MAX_PARTITIONS",
    "EmbeddedLog",
    "TopicDescription",
    "source_partition_counts",
    "validate_topic_name",
]

MAX_PARTITIONS: Final = 10_000
"""Most partitions a topic may have (each is two files)."""

_MARKER: Final = "elastic-log.json"
_FORMAT: Final = {"format": "spark-elastic-log", "version": 1}
# Kafka's legal topic names; '~' is not in them, so temporary names use it.
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")


def source_partition_counts(options: Mapping[str, str]) -> dict[str, int] | None:
    """The partition counts of the topics a log source's options name, as they are now.

    Runs on the driver, when a transform is applied to a DataFrame read from
    the log (registered by ``spark_elastic`` with the transforms). ``None``
    when the options do not name a readable log and subscribed topics (the
    source itself reports a bad path or topic when the query starts; ``assign``
    reads chosen partitions on purpose).

    Parameters
    ----------
    options
        The source's options (``path`` and ``subscribe``).

    Returns
    -------
    dict[str, int] or None
        ``{topic: partition count}``.
    """
    # Only ``subscribe`` reads every partition; ``assign`` reads a chosen few on purpose (a
    # container's share), and a pattern's topics are not known until the query runs.
    topics = [t.strip() for t in options.get("subscribe", "").split(",") if t.strip()]
    path = options.get("path")
    if not topics or not path:
        return None
    try:
        return EmbeddedLog(path, create=False).partition_counts(topics)
    except (LogError, ArgumentError, OSError):
        return None


def validate_topic_name(topic: object, name: str = "topic") -> str:
    """Return ``topic`` if Kafka would accept it as a topic name, else raise."""
    if not isinstance(topic, str):
        raise ArgumentTypeError.wrong_type(name, "a str topic name", topic)
    if not _TOPIC_NAME.fullmatch(topic) or topic in {".", ".."}:
        raise ArgumentError.invalid(
            name, "a Kafka topic name: 1 to 249 of A-Z a-z 0-9 . _ - (not '.' or '..')", topic
        )
    return topic


def _validate_count(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError.wrong_type(name, "an int partition count", value)
    if not 1 <= value <= MAX_PARTITIONS:
        raise ArgumentError.invalid(name, f"a partition count from 1 to {MAX_PARTITIONS}", value)
    return value


@dataclass(frozen=True, slots=True)
class TopicDescription:
    """A topic's partitions and their end offsets at one moment.

    Attributes
    ----------
    topic
        The topic name.
    end_offsets
        The end offset (number of records) of each partition, by partition number.
    """

    topic: str
    end_offsets: tuple[int, ...]

    @property
    def partitions(self) -> int:
        """The partition count."""
        return len(self.end_offsets)

    @property
    def records(self) -> int:
        """Records in all partitions."""
        return sum(self.end_offsets)

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dict: topic, partitions, end offsets keyed by partition, records.

        Returns
        -------
        dict
            ``{"topic": str, "partitions": int, "end_offsets": {"<p>": int, ...},
            "records": int}``; partition numbers are string keys, as JSON needs.
        """
        return {
            "topic": self.topic,
            "partitions": self.partitions,
            "end_offsets": {str(p): o for p, o in enumerate(self.end_offsets)},
            "records": self.records,
        }


class EmbeddedLog:
    """A durable, append-only partitioned log in a local directory.

    Parameters
    ----------
    path
        The log directory.
    create
        Make the directory (and mark it as a log) if it does not exist yet. A
        directory that exists, is not empty and is not a log is refused either way.
    fsync
        Flush every append to disk before acknowledging it (see
        :mod:`spark_elastic.log.storage`). ``False`` still survives the
        writer's crash, not the machine's.

    Raises
    ------
    LogError
        ``path`` is not a log (and ``create`` is false, or it holds other files).
    """

    def __init__(self, path: str | os.PathLike[str], *, create: bool = True, fsync: bool = True):
        if not isinstance(path, str | os.PathLike):
            raise ArgumentTypeError.wrong_type("path", "a str or path", path)
        self._path = Path(path)
        self._fsync = bool(fsync)
        marker = self._path / _MARKER
        if marker.is_file():
            return
        if not create:
            raise LogError(f"no embedded log at {str(self._path)!r}: create it first")
        self._path.mkdir(parents=True, exist_ok=True)
        if any(p.name != _MARKER for p in self._path.iterdir()):
            raise LogError(f"{str(self._path)!r} is not empty and is not an embedded log")
        with contextlib.suppress(FileExistsError):
            # O_EXCL: two processes creating the log at once both succeed, one writes.
            fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.write(fd, json.dumps(_FORMAT).encode())
                if self._fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            self._sync_dir(self._path)

    @property
    def path(self) -> Path:
        """The log directory."""
        return self._path

    @property
    def fsync(self) -> bool:
        """Whether appends are flushed to disk before they are acknowledged."""
        return self._fsync

    def __repr__(self) -> str:
        return f"EmbeddedLog({str(self._path)!r})"

    def topics(self) -> list[str]:
        """The topic names, sorted.

        Returns
        -------
        list of str
            Every complete topic (topics still being created are left out).
        """
        return sorted(
            entry.name
            for entry in self._path.iterdir()
            if _TOPIC_NAME.fullmatch(entry.name) and (entry / TOPIC_META).is_file()
        )

    def create_topic(self, topic: str, partitions: int) -> TopicDescription:
        """Create a topic with ``partitions`` empty partitions.

        The topic appears at once, complete: it is built under a temporary
        name and renamed into place.

        Parameters
        ----------
        topic
            A Kafka topic name: 1 to 249 of ``A-Z a-z 0-9 . _ -``, not ``.`` or ``..``.
        partitions
            The partition count, from 1 to :data:`MAX_PARTITIONS` (10,000).

        Returns
        -------
        TopicDescription
            The new topic, every end offset 0.

        Raises
        ------
        ArgumentTypeError
            ``topic`` is not a ``str`` or ``partitions`` not an ``int``.
        ArgumentError
            ``topic`` is not a valid name or ``partitions`` is out of range.
        LogError
            The topic exists.
        """
        validate_topic_name(topic)
        count = _validate_count(partitions, "partitions")
        final = self._path / topic
        if final.exists():
            raise LogError(f"topic {topic!r} already exists in {str(self._path)!r}")
        staging = self._path / f"~creating~{topic}~{uuid.uuid4().hex}"
        staging.mkdir()
        try:
            for partition in range(count):
                create_partition_files(staging, partition)
            self._write_meta(staging, topic, count)
            try:
                os.rename(staging, final)
            except OSError:
                # rename(2) refuses a non-empty target: someone created it first.
                raise LogError(f"topic {topic!r} already exists in {str(self._path)!r}") from None
        finally:
            if staging.exists():
                for child in staging.iterdir():
                    child.unlink()
                staging.rmdir()
        self._sync_dir(self._path)
        return self.describe(topic)

    def partition_count(self, topic: str) -> int:
        """The topic's current partition count.

        Parameters
        ----------
        topic
            The topic name.

        Returns
        -------
        int

        Raises
        ------
        LogError
            No such topic.
        """
        return self._read_meta(topic)

    def partition_counts(self, topics: Iterable[str] | str | None = None) -> dict[str, int]:
        """``{topic: partition count}`` for ``topics`` (default: every topic), in the order given.

        The form ``withVirtualTasks(partitions=...)`` and ``cogroup(partition_counts=...)`` take.

        Parameters
        ----------
        topics
            Topic names, or one topic name as a ``str``, or ``None`` for every topic.

        Returns
        -------
        dict of str to int

        Raises
        ------
        LogError
            A topic does not exist.
        """
        if isinstance(topics, str):
            topics = [topics]
        names = self.topics() if topics is None else list(topics)
        return {topic: self.partition_count(topic) for topic in names}

    def grow(self, topic: str, partitions: int) -> TopicDescription:
        """Raise the topic's partition count to ``partitions`` (SEP-5).

        Any increase is allowed, as in Kafka; existing records stay where they
        are, so keys produced from now on may map to other partitions. Asking
        for the current count is a no-op, so a repeated grow is harmless.

        Parameters
        ----------
        topic
            An existing topic.
        partitions
            The new partition count, from the current count to :data:`MAX_PARTITIONS`.

        Returns
        -------
        TopicDescription
            The topic after growing.

        Raises
        ------
        ArgumentTypeError
            ``topic`` is not a ``str`` or ``partitions`` not an ``int``.
        ArgumentError
            ``topic`` is not a valid name or ``partitions`` is outside
            ``[1, MAX_PARTITIONS]``.
        LogError
            No such topic, or ``partitions`` is below the current count.
        """
        validate_topic_name(topic)
        count = _validate_count(partitions, "partitions")
        with self._topic_lock(topic):
            current = self._read_meta(topic)
            if count < current:
                raise LogError(
                    f"topic {topic!r} has {current} partitions and cannot shrink to {count}: "
                    "partition counts only grow"
                )
            if count > current:
                topic_dir = self._path / topic
                for partition in range(current, count):
                    create_partition_files(topic_dir, partition)
                self._sync_dir(topic_dir)
                self._write_meta(topic_dir, topic, count)
        return self.describe(topic)

    def end_offsets(self, topic: str) -> dict[int, int]:
        """Each partition's end offset (its record count), by partition number.

        Parameters
        ----------
        topic
            The topic name.

        Returns
        -------
        dict of int to int
            ``{partition: end offset}`` for partitions ``0..n-1``.

        Raises
        ------
        LogError
            No such topic.
        """
        return dict(enumerate(self.describe(topic).end_offsets))

    def describe(self, topic: str) -> TopicDescription:
        """The topic's partitions and end offsets.

        Parameters
        ----------
        topic
            The topic name.

        Returns
        -------
        TopicDescription

        Raises
        ------
        LogError
            No such topic.
        """
        count = self._read_meta(topic)
        topic_dir = self._path / topic
        return TopicDescription(topic, tuple(end_offset(topic_dir, p) for p in range(count)))

    def read(
        self, topic: str, partition: int, start: int = 0, end: int | None = None
    ) -> pa.RecordBatch:
        """The records of offsets ``[start, end)`` as one Arrow record batch.

        Columns are those of Spark's Kafka source: ``key``, ``value`` (binary),
        ``topic``, ``partition``, ``offset``, ``timestamp`` (microseconds,
        UTC) and ``timestampType`` (0, create time).

        Parameters
        ----------
        topic, partition
            Where to read.
        start
            First offset.
        end
            Offset after the last; ``None`` is the partition's end offset now.

        Returns
        -------
        pyarrow.RecordBatch
            ``end - start`` rows, in offset order (empty, with the schema, if none).

        Raises
        ------
        LogError
            No such topic or partition, the range is outside ``[0, end offset]``,
            or a committed record fails its checks.
        """
        import pyarrow as pa

        batches = list(self.read_batches(topic, partition, start, end))
        if not batches:
            return pa.RecordBatch.from_pylist([], schema=record_schema())
        if len(batches) == 1:
            return batches[0]
        # Table.combine_chunks rather than pa.concat_batches, which needs pyarrow 19.
        return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]

    def read_batches(
        self,
        topic: str,
        partition: int,
        start: int = 0,
        end: int | None = None,
        *,
        max_bytes: int = MAX_BATCH_BYTES,
    ) -> Iterator[pa.RecordBatch]:
        """Like :meth:`read`, as several batches of at most ``max_bytes`` of records each.

        The range is checked at once, before the first batch is asked for. The
        ``elastic-log`` source calls it on executors, once per Spark task.

        Parameters
        ----------
        topic, partition, start, end
            As for :meth:`read`.
        max_bytes
            Most bytes of record frames per batch; a larger record gets a batch
            of its own.

        Returns
        -------
        Iterator of pyarrow.RecordBatch
            Batches of the rows of ``[start, end)``, in offset order.

        Raises
        ------
        ArgumentTypeError
            ``partition``, ``start`` or ``end`` is not an ``int``.
        LogError
            No such topic or partition, the range is outside ``[0, end offset]``,
            or (while iterating) a committed record fails its checks.
        """
        self._check_partition(topic, partition)
        available = end_offset(self._path / topic, partition)
        stop = available if end is None else end
        for name, value in (("start", start), ("end", stop)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ArgumentTypeError.wrong_type(name, "an int offset", value)
        if not 0 <= start <= stop <= available:
            raise LogError(
                f"offsets [{start}, {stop}) are outside partition {partition} of topic "
                f"{topic!r}, which holds [0, {available})"
            )
        return read_batches(self._path / topic, topic, partition, start, stop, max_bytes=max_bytes)

    def producer(self, topic: str) -> Producer:
        """A :class:`~spark_elastic.log.producer.Producer` for ``topic``.

        Parameters
        ----------
        topic
            An existing topic.

        Returns
        -------
        Producer
            A new producer; close it when done.

        Raises
        ------
        LogError
            No such topic.
        """
        return Producer(self, topic)

    def topic_dir(self, topic: str) -> Path:
        """The directory of an existing topic.

        Parameters
        ----------
        topic
            The topic name.

        Returns
        -------
        pathlib.Path
            ``<log path>/<topic>``.

        Raises
        ------
        LogError
            No such topic.
        """
        self._read_meta(topic)
        return self._path / topic

    def _check_partition(self, topic: str, partition: object) -> None:
        count = self._read_meta(topic)
        if isinstance(partition, bool) or not isinstance(partition, int):
            raise ArgumentTypeError.wrong_type("partition", "an int partition number", partition)
        if not 0 <= partition < count:
            raise LogError(
                f"topic {topic!r} has no partition {partition}: it has partitions 0 to {count - 1}"
            )

    def _read_meta(self, topic: str) -> int:
        validate_topic_name(topic)
        try:
            text = (self._path / topic / TOPIC_META).read_text()
        except FileNotFoundError:
            known = ", ".join(self.topics()) or "none"
            raise LogError(f"no topic {topic!r} in {str(self._path)!r} (topics: {known})") from None
        try:
            count = json.loads(text)["partitions"]
        except (ValueError, KeyError, TypeError):
            count = None
        if isinstance(count, bool) or not isinstance(count, int):
            raise LogError(f"topic {topic!r} has a damaged {TOPIC_META}: {text[:80]!r}")
        return count

    def _write_meta(self, topic_dir: Path, topic: str, partitions: int) -> None:
        # Write-then-rename: readers see the old count or the new one, never a torn file.
        staging = topic_dir / f"{TOPIC_META}~{uuid.uuid4().hex}"
        with open(staging, "w") as out:
            json.dump({"topic": topic, "partitions": partitions}, out)
            out.flush()
            if self._fsync:
                os.fsync(out.fileno())
        os.replace(staging, topic_dir / TOPIC_META)
        self._sync_dir(topic_dir)

    @contextlib.contextmanager
    def _topic_lock(self, topic: str) -> Iterator[None]:
        try:
            fd = os.open(self._path / topic, os.O_RDONLY)
        except FileNotFoundError:
            self._read_meta(topic)  # raises the standard unknown-topic error
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _sync_dir(self, directory: Path) -> None:
        # New names and renames are durable only once their directory is flushed.
        if not self._fsync:
            return
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
