"""The files of one partition of the embedded log: framed records and their commit index.

Each partition is two append-only files in its topic's directory:

``<p>.log``
    Record frames, back to back. A frame is a 32-byte little-endian header
    ``body_len u32 | crc32 u32 | offset i64 | timestamp_ms i64 | key_len i32 |
    value_len i32`` followed by the key and value bytes (a length of -1 is a
    null). ``body_len`` counts everything after the CRC and ``crc32``
    (zlib's CRC-32) covers those same bytes, offset included.
``<p>.idx``
    The commit index: one ``u64`` per record, the byte position in ``<p>.log``
    just past that record's frame. The record with offset ``o`` is the frame
    ending at entry ``o``, so offsets are dense from 0 and the end offset is
    the index size divided by 8 (one ``stat``, no scan).

A record is committed when its index entry is complete. Appends write the
frames first and the index entries after them, both at explicit positions
under an exclusive ``flock`` of the log file, so a reader that trusts only
complete index entries never sees a torn frame, and a crash mid-append leaves
at worst a torn index entry and log bytes past the last committed frame. The
next append (by any process) cuts both off before writing, so the tail never
holds garbage between committed frames. Readers take no lock; they check each
frame's length, CRC and offset and refuse a partition whose committed region
does not verify.

With ``fsync=True`` the log is flushed to disk before the index entries that
commit it are written, and the index before the append returns, so an
acknowledged record survives power loss. With ``fsync=False`` it survives a
crash of the writing process (the page cache outlives it) but not of the
machine.

Everything here is executor-safe: the source's readers call
:func:`read_batches` in Spark's Python workers.
"""

from __future__ import annotations

import fcntl
import os
import struct
import threading
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final, Protocol

import numpy as np
import numpy.typing as npt

from spark_elastic.errors import LogError

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "HEADER_SIZE",
    "MAX_BATCH_BYTES",
    "TOPIC_META",
    "PartitionAppender",
    "TopicCatalog",
    "end_offset",
    "index_path",
    "log_path",
    "read_batches",
    "record_schema",
]

TOPIC_META: Final = "topic.json"
"""The file in a topic's directory that holds its partition count."""


class TopicCatalog(Protocol):
    """What a producer needs of a log: where a topic lives and how many partitions it has.

    :class:`~spark_elastic.log.embedded.EmbeddedLog` is one; the protocol keeps
    the producer from importing the log that creates producers.
    """

    @property
    def fsync(self) -> bool:
        """Whether appends are flushed to disk before they are acknowledged."""
        ...

    def topic_dir(self, topic: str) -> Path:
        """The directory of an existing topic."""
        ...

    def partition_count(self, topic: str) -> int:
        """The topic's current partition count."""
        ...


HEADER_SIZE: Final = 32
MAX_BATCH_BYTES: Final = 16 << 20
"""Bytes of frames decoded into one Arrow record batch (at least one record)."""

_INDEX_ENTRY: Final = 8
# Records per index read while iterating; bounds memory for huge ranges.
_INDEX_CHUNK: Final = 1 << 16
_LEN_CRC = struct.Struct("<II")
_BODY_HEAD = struct.Struct("<qqii")
_HEADER_DTYPE = np.dtype(
    [
        ("body_len", "<u4"),
        ("crc", "<u4"),
        ("offset", "<i8"),
        ("timestamp", "<i8"),
        ("key_len", "<i4"),
        ("value_len", "<i4"),
    ]
)
_NULL_LEN: Final = -1

Blob = bytes | None


def log_path(topic_dir: Path, partition: int) -> Path:
    """The frame file of ``partition`` in ``topic_dir``."""
    return topic_dir / f"{partition}.log"


def index_path(topic_dir: Path, partition: int) -> Path:
    """The commit index of ``partition`` in ``topic_dir``."""
    return topic_dir / f"{partition}.idx"


def end_offset(topic_dir: Path, partition: int) -> int:
    """The partition's end offset: the number of committed records."""
    return os.stat(index_path(topic_dir, partition)).st_size // _INDEX_ENTRY


def create_partition_files(topic_dir: Path, partition: int) -> None:
    """Create the empty files of a partition; existing files are left as they are."""
    for path in (log_path(topic_dir, partition), index_path(topic_dir, partition)):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))


def encode_frames(
    base_offset: int, keys: Sequence[Blob], values: Sequence[Blob], timestamps: Sequence[int]
) -> tuple[bytes, npt.NDArray[np.uint64]]:
    """Frames for consecutive records from ``base_offset``, and each frame's end position.

    Positions are relative to the start of the returned bytes.
    """
    out = bytearray()
    ends = np.empty(len(keys), dtype=np.uint64)
    for i, (key, value, timestamp) in enumerate(zip(keys, values, timestamps, strict=True)):
        body = (
            _BODY_HEAD.pack(
                base_offset + i,
                timestamp,
                _NULL_LEN if key is None else len(key),
                _NULL_LEN if value is None else len(value),
            )
            + (key or b"")
            + (value or b"")
        )
        out += _LEN_CRC.pack(len(body), zlib.crc32(body))
        out += body
        ends[i] = len(out)
    return bytes(out), ends


def _pwrite_all(fd: int, data: bytes | memoryview, position: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, position)
        view = view[written:]
        position += written


def _pread_exact(fd: int, size: int, position: int, what: str) -> bytes:
    data = os.pread(fd, size, position)
    if len(data) != size:
        raise LogError(
            f"{what}: expected {size} bytes at byte {position}, found {len(data)}; "
            "the file was truncated behind the log's back"
        )
    return data


class PartitionAppender:
    """Appends records to one partition; safe across threads and processes.

    One appender holds the partition's two files open. Threads sharing it
    are serialized by a lock; processes (and other appenders in the same
    process) by an exclusive ``flock`` on the log file, held for the whole
    append: repair of a crashed writer's tail, frames, index entries.

    Parameters
    ----------
    topic_dir
        The topic's directory.
    partition
        The partition number; its files must exist.
    fsync
        Flush frames before committing them and the index before returning.
    """

    def __init__(self, topic_dir: Path, partition: int, *, fsync: bool) -> None:
        self._fsync = fsync
        self._name = f"partition {partition} of {topic_dir}"
        self._lock = threading.Lock()
        self._log_fd = os.open(log_path(topic_dir, partition), os.O_RDWR)
        try:
            self._idx_fd = os.open(index_path(topic_dir, partition), os.O_RDWR)
        except OSError:
            os.close(self._log_fd)
            raise

    def append(
        self, keys: Sequence[Blob], values: Sequence[Blob], timestamps: Sequence[int]
    ) -> int:
        """Append records in order and return the offset of the first.

        The records are committed (and, with ``fsync``, on disk) when this
        returns; if it raises, none of them was acknowledged.
        """
        with self._lock:
            fcntl.flock(self._log_fd, fcntl.LOCK_EX)
            try:
                count, committed = self._repair()
                data, ends = encode_frames(count, keys, values, timestamps)
                _pwrite_all(self._log_fd, data, committed)
                if self._fsync:
                    os.fdatasync(self._log_fd)
                entries = (ends + np.uint64(committed)).astype("<u8").tobytes()
                _pwrite_all(self._idx_fd, entries, count * _INDEX_ENTRY)
                if self._fsync:
                    os.fdatasync(self._idx_fd)
                return count
            finally:
                fcntl.flock(self._log_fd, fcntl.LOCK_UN)

    def _repair(self) -> tuple[int, int]:
        """Cut off what a crashed append left behind; return (end offset, committed bytes).

        Runs under the partition lock. A torn index entry is not committed
        (readers ignore it), and log bytes past the last committed frame were
        never acknowledged, so both are dropped.
        """
        index_size = os.fstat(self._idx_fd).st_size
        count, torn = divmod(index_size, _INDEX_ENTRY)
        if torn:
            os.ftruncate(self._idx_fd, index_size - torn)
        committed = 0
        if count:
            last = _pread_exact(
                self._idx_fd, _INDEX_ENTRY, (count - 1) * _INDEX_ENTRY, f"index of {self._name}"
            )
            committed = int.from_bytes(last, "little")
        log_size = os.fstat(self._log_fd).st_size
        if log_size > committed:
            os.ftruncate(self._log_fd, committed)
        elif log_size < committed:
            raise LogError(
                f"{self._name} is damaged: its index commits {committed} bytes of frames but "
                f"the log holds {log_size} (lost writes after a machine crash with fsync off?)"
            )
        return count, committed

    def close(self) -> None:
        """Close the files; idempotent."""
        with self._lock:
            for fd in (self._log_fd, self._idx_fd):
                if fd >= 0:
                    os.close(fd)
            self._log_fd = self._idx_fd = -1


def record_schema() -> pa.Schema:
    """The Arrow schema of records: Spark's Kafka source schema, as Spark converts it."""
    import pyarrow as pa

    return pa.schema(
        [
            pa.field("key", pa.binary()),
            pa.field("value", pa.binary()),
            pa.field("topic", pa.string()),
            pa.field("partition", pa.int32()),
            pa.field("offset", pa.int64()),
            pa.field("timestamp", pa.timestamp("us", tz="UTC")),
            pa.field("timestampType", pa.int32()),
        ]
    )


def read_batches(
    topic_dir: Path,
    topic: str,
    partition: int,
    start: int,
    end: int,
    *,
    max_bytes: int = MAX_BATCH_BYTES,
) -> Iterator[pa.RecordBatch]:
    """Decode the committed records ``[start, end)`` into Arrow batches of :func:`record_schema`.

    The caller checks ``0 <= start <= end <= end_offset``. Each batch covers
    at most ``max_bytes`` of frames, or one record if that is larger.

    Raises
    ------
    LogError
        A frame in the range fails its length, CRC or offset check.
    """
    name = f"partition {partition} of topic {topic!r}"
    with (
        open(log_path(topic_dir, partition), "rb", buffering=0) as log,
        open(index_path(topic_dir, partition), "rb", buffering=0) as idx,
    ):
        position = 0
        if start > 0:
            previous = _pread_exact(
                idx.fileno(), _INDEX_ENTRY, (start - 1) * _INDEX_ENTRY, f"index of {name}"
            )
            position = int.from_bytes(previous, "little")
        while start < end:
            chunk = min(end - start, _INDEX_CHUNK)
            raw = _pread_exact(
                idx.fileno(), chunk * _INDEX_ENTRY, start * _INDEX_ENTRY, f"index of {name}"
            )
            ends = np.frombuffer(raw, dtype="<u8").astype(np.int64)
            # Cut where the frames pass max_bytes, keeping at least one record.
            take = max(1, int(np.searchsorted(ends, position + max_bytes, side="right")))
            ends = ends[:take]
            data = _pread_exact(log.fileno(), int(ends[-1]) - position, position, f"log of {name}")
            yield _decode(data, ends - position, start, topic, partition, name)
            start += take
            position = int(ends[-1])


def _decode(
    data: bytes,
    ends: npt.NDArray[np.int64],
    first_offset: int,
    topic: str,
    partition: int,
    name: str,
) -> pa.RecordBatch:
    """One Arrow batch from back-to-back frames whose end positions are ``ends``."""
    import pyarrow as pa

    count = len(ends)
    starts = np.empty(count, dtype=np.int64)
    starts[0] = 0
    starts[1:] = ends[:-1]
    if np.any(ends - starts < HEADER_SIZE):
        raise LogError(f"{name}: a committed frame is shorter than its header")
    raw = np.frombuffer(data, dtype=np.uint8)
    headers = raw[starts[:, None] + np.arange(HEADER_SIZE)].view(_HEADER_DTYPE).reshape(count)
    key_lens = np.maximum(headers["key_len"], 0).astype(np.int64)
    value_lens = np.maximum(headers["value_len"], 0).astype(np.int64)
    if not np.array_equal(headers["body_len"].astype(np.int64) + 8, ends - starts) or (
        not np.array_equal(HEADER_SIZE + key_lens + value_lens, ends - starts)
    ):
        raise LogError(f"{name}: frame lengths disagree with the commit index")
    if not np.array_equal(headers["offset"], np.arange(first_offset, first_offset + count)):
        raise LogError(f"{name}: frame offsets are not dense from {first_offset}")
    view = memoryview(data)
    frames = zip(starts.tolist(), ends.tolist(), headers["crc"].tolist(), strict=True)
    for i, (frame_start, frame_end, crc) in enumerate(frames):
        if zlib.crc32(view[frame_start + 8 : frame_end]) != crc:
            raise LogError(f"{name}: CRC mismatch in the record at offset {first_offset + i}")
    keys = _binary_column(raw, starts + HEADER_SIZE, key_lens, headers["key_len"] >= 0)
    values = _binary_column(
        raw, starts + HEADER_SIZE + key_lens, value_lens, headers["value_len"] >= 0
    )
    schema = record_schema()
    return pa.RecordBatch.from_arrays(
        [
            keys,
            values,
            pa.repeat(pa.scalar(topic, pa.string()), count),
            pa.array(np.full(count, partition, dtype=np.int32)),
            pa.array(headers["offset"].astype(np.int64)),
            pa.array(headers["timestamp"].astype(np.int64) * 1000, type=schema.field(5).type),
            pa.array(np.zeros(count, dtype=np.int32)),
        ],
        schema=schema,
    )


def _binary_column(
    raw: npt.NDArray[np.uint8],
    starts: npt.NDArray[np.int64],
    lengths: npt.NDArray[np.int64],
    valid: npt.NDArray[np.bool_],
) -> pa.Array:
    """A binary Arrow array of the byte ranges ``raw[starts[i] : starts[i] + lengths[i]]``."""
    import pyarrow as pa

    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    # Output byte j of record i comes from raw[starts[i] + j - offsets[i]].
    gather = np.arange(total, dtype=np.int64) - np.repeat(offsets[:-1] - starts, lengths)
    data = raw[gather]
    null_count = int(len(valid) - np.count_nonzero(valid))
    validity = (
        None if null_count == 0 else pa.py_buffer(np.packbits(valid, bitorder="little").tobytes())
    )
    return pa.Array.from_buffers(
        pa.binary(),
        len(lengths),
        [validity, pa.py_buffer(offsets.astype(np.int32).tobytes()), pa.py_buffer(data.tobytes())],
        null_count=null_count,
    )
