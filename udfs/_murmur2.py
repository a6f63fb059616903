"""Kafka's murmur2 and default partitioner, vectorized with numpy over Arrow buffers.

A transliteration of ``org.apache.kafka.common.utils.Utils.murmur2`` and
``BuiltInPartitioner.partitionForKey``. Java's int arithmetic is done in
numpy ``uint32``, whose multiplication wraps modulo 2**32 exactly like Java's;
the result is reinterpreted as ``int32`` at the end.

Runs on the driver (numpy functions) and on executors, once per Arrow batch,
inside :func:`udfs.kafka_partition`.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from udfs._arrow import KeyBuffers, Keys, key_array, key_buffers, reject_nulls
from udfs._errors import invalid, wrong_type

__all__ = ["kafka_partitions", "murmur2", "murmur2_buffers", "partitions_of", "validate_partitions"]

_SEED = np.uint32(0x9747B28C)
_M = np.uint32(0x5BD1E995)
_R = np.uint32(24)
# The low ``tail`` bytes of a little-endian word, for tails of 0..3 bytes.
_TAIL_MASKS = np.array([0, 0xFF, 0xFFFF, 0xFFFFFF], dtype=np.uint32)
_INT32_MAX = 2**31 - 1
# Below this many keys per block index, per-step numpy call overhead outweighs
# the work, so the remaining blocks are mixed all at once instead.
_WIDE_STEP = 1024
_KEYS_PER_SLICE = 16384


def murmur2(keys: Keys) -> npt.NDArray[np.int32]:
    """Kafka's ``Utils.murmur2`` of each key's bytes.

    Parameters
    ----------
    keys
        A sequence, numpy object array, pandas Series or pyarrow array of
        ``bytes`` or ``str``; a ``str`` is hashed as its UTF-8 bytes, as
        Kafka's ``StringSerializer`` would send it.

    Returns
    -------
    numpy.ndarray
        ``int32``, one hash per key, equal to what Java returns.

    Raises
    ------
    ArgumentTypeError
        ``keys`` is not a container of bytes/str.
    ArgumentError
        A key is null. Kafka never hashes a null key (its producer picks a
        sticky partition for it), so there is no value to return; callers
        route null keys themselves. The Spark column UDF returns null instead.

    Notes
    -----
    Keys are processed in lockstep by 4-byte block index: each step is a few
    numpy operations over all the keys that have a block there, so the number
    of Python-level steps grows with the longest key's length / 4 (per slice
    of 16,384 keys), never with the number of keys.
    """
    array = key_array(keys)
    reject_nulls(array)
    return murmur2_buffers(key_buffers(array)).view(np.int32)


def kafka_partitions(keys: Keys, num_partitions: int) -> npt.NDArray[np.int32]:
    """Kafka's default partition for each key: ``toPositive(murmur2(key)) % num_partitions``.

    Exactly ``BuiltInPartitioner.partitionForKey``, with ``toPositive(h)`` being
    ``h & 0x7fffffff`` (not ``abs``).

    Parameters
    ----------
    keys
        As for :func:`murmur2`.
    num_partitions
        The topic's partition count, 1 to 2**31 - 1.

    Returns
    -------
    numpy.ndarray
        ``int32`` partitions in ``[0, num_partitions)``.

    Raises
    ------
    ArgumentTypeError
        ``num_partitions`` is not an int, or ``keys`` is not a container of bytes/str.
    ArgumentError
        ``num_partitions`` is out of range, or a key is null (see :func:`murmur2`).
    """
    n = validate_partitions(num_partitions, "num_partitions")
    array = key_array(keys)
    reject_nulls(array)
    return partitions_of(murmur2_buffers(key_buffers(array)), n)


def validate_partitions(value: object, name: str) -> int:
    """A partition count as a Python int, or a clear error."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise wrong_type(name, "an int partition count", value)
    if not 1 <= value <= _INT32_MAX:
        raise invalid(name, f"a partition count from 1 to {_INT32_MAX}", value)
    return int(value)


def partitions_of(hashes: npt.NDArray[np.uint32], num_partitions: int) -> npt.NDArray[np.int32]:
    """``toPositive(h) % num_partitions`` for murmur2 hashes given as uint32."""
    positive = hashes & np.uint32(0x7FFFFFFF)
    return (positive % np.uint32(num_partitions)).astype(np.int32)


def murmur2_buffers(keys: KeyBuffers) -> npt.NDArray[np.uint32]:
    """Murmur2 of every key in ``keys``, as uint32 (nulls' slots hash whatever bytes they span)."""
    first, last = int(keys.offsets[0]), int(keys.offsets[-1])
    starts = keys.offsets[:-1] - first
    lengths = np.diff(keys.offsets)
    # The tail and block reads fetch 4 bytes at once, up to 3 past a key's end.
    data = np.concatenate([keys.data[first:last], np.zeros(4, dtype=np.uint8)])
    words = _unaligned_words(data)

    h = _SEED ^ lengths.astype(np.uint32)
    blocks = lengths >> 2
    # Every block step sweeps its keys' bytes once; slices of keys keep those
    # sweeps in cache (4x faster on 1M keys than one pass over everything).
    for lo in range(0, len(h), _KEYS_PER_SLICE):
        hi = lo + _KEYS_PER_SLICE
        _mix_blocks(h[lo:hi], starts[lo:hi], blocks[lo:hi], words)

    tails = lengths & 3
    tail_words = words[starts + (lengths - tails)] & _TAIL_MASKS[tails]
    h ^= tail_words
    h = np.where(tails > 0, h * _M, h)

    h ^= h >> np.uint32(13)
    h *= _M
    h ^= h >> np.uint32(15)
    return h


def _mix_blocks(
    h: npt.NDArray[np.uint32],
    starts: npt.NDArray[np.int64],
    blocks: npt.NDArray[np.int64],
    words: npt.NDArray[np.uint32],
) -> None:
    """Fold each key's 4-byte blocks into ``h`` (a view, updated in place), in lockstep.

    ``h = h * m ^ mix(k)`` depends on the previous ``h``, so block ``i`` must
    wait for block ``i - 1``; keys are independent, so each step handles every
    key that has a block ``i``. Sorting keys by block count (most first)
    makes those keys a prefix of the sorted order, so every step works on
    contiguous slices and the total work is the number of blocks, however
    uneven the key lengths.
    """
    most = int(blocks.max()) if len(blocks) else 0
    if most == 0:
        return
    if int(blocks.min()) == most:
        order = None
        active = np.full(most, len(blocks), dtype=np.int64)
    else:
        # A 16-bit sort key makes numpy's stable argsort a radix sort.
        sort_key = most - blocks
        order = np.argsort(sort_key.astype(np.uint16) if most < 2**16 else sort_key, kind="stable")
        # active[i]: how many keys have more than i blocks.
        active = len(blocks) - np.cumsum(np.bincount(blocks, minlength=most + 1))[:most]
    ranked_h = h if order is None else h[order]
    positions = starts.copy() if order is None else starts[order]

    step = 0
    while step < most and active[step] >= _WIDE_STEP:
        count = int(active[step])
        current = ranked_h[:count]
        current *= _M
        current ^= _mixed(words[positions[:count]])
        positions[:count] += 4
        step += 1
    if step < most:
        _mix_narrow_steps(ranked_h, positions, active[step:], words)
    if order is not None:
        h[order] = ranked_h


def _mix_narrow_steps(
    ranked_h: npt.NDArray[np.uint32],
    positions: npt.NDArray[np.int64],
    active: npt.NDArray[np.int64],
    words: npt.NDArray[np.uint32],
) -> None:
    """The steps that only a few long keys reach, with all their blocks mixed up front.

    Per-step gathers would cost several numpy calls per block of a lone long
    key; here the remaining blocks are gathered and mixed in one pass, laid
    out step-major so that each step is a contiguous run, leaving two
    in-place operations per step.
    """
    steps = len(active)
    step_starts = np.zeros(steps + 1, dtype=np.int64)
    np.cumsum(active, out=step_starts[1:])
    step_of_block = np.repeat(np.arange(steps, dtype=np.int64), active)
    rank_of_block = np.arange(step_starts[-1], dtype=np.int64) - step_starts[step_of_block]
    k = _mixed(words[positions[rank_of_block] + 4 * step_of_block])
    for step in range(steps):
        lo, hi = int(step_starts[step]), int(step_starts[step + 1])
        current = ranked_h[: hi - lo]
        current *= _M
        current ^= k[lo:hi]


def _mixed(k: npt.NDArray[np.uint32]) -> npt.NDArray[np.uint32]:
    """Murmur2's per-block mix, in place on a fresh gather."""
    k *= _M
    k ^= k >> _R
    k *= _M
    return k


def _unaligned_words(data: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint32]:
    """``words[p]`` is the little-endian uint32 of ``data[p:p + 4]``, for every byte ``p``.

    A strided view (stride 1 byte) over the same memory, so one gather reads
    a whole block at any alignment instead of four byte gathers and shifts.
    """
    count = max(len(data) - 3, 0)
    return np.ndarray(shape=(count,), dtype="<u4", buffer=data, strides=(1,))
