"""State chunks: how a virtual task's keyed state is laid out in its StateStore.

Owns the layout of user state (Flink's key groups, made adaptive): a task's
keys are grouped into *chunks* by their key slot (:data:`~spark_elastic.dataplane.buckets.SLOTS`
fine buckets per partition), chunk ``slot % 2**depth``, and each chunk is one
StateStore value holding all its keys' states. Transform-with-state calls are
socket round trips (about 60 µs each, and no multi-key get or put), so a
micro-batch costs a round trip per chunk it touches instead of one per key,
and a rescale moves whole chunks instead of single keys.

A task's ``depth`` grows with its key count (a chunk holds
:data:`TARGET_KEYS` keys on average after growing, at most :data:`GROW_AT`
before; fewer when its values are large, so that a chunk stays near
:data:`TARGET_BYTES`): small states take a handful of chunks, large ones
enough that a micro-batch rewrites only the chunks its records touch. Chunk
numbers are stable when the depth grows: chunk ``c`` splits into ``c`` and
``c + 2**depth``.
A task at factor ``f`` owns the chunks ``c`` with ``c % f`` its key bucket,
so at ``depth >= log2(f)`` a split or merge of virtual tasks moves chunks
whole, never decoding them.

Pure Python (pickle and the standard library): runs on executors, inside
Python workers, and on the driver. May import :mod:`spark_elastic.errors` only.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "GROW_AT",
    "LAYOUT_VERSION",
    "TARGET_BYTES",
    "TARGET_KEYS",
    "Entries",
    "Layout",
    "chunk_count",
    "chunk_of",
    "decode",
    "depth_for",
    "encode",
    "min_depth",
    "regroup",
    "should_grow",
    "target_keys",
]

LAYOUT_VERSION = 2
"""``job.json``'s ``state_layout``: 1 was one StateStore entry per key; 2 is chunks."""
TARGET_KEYS = 1024
"""Average keys per chunk right after the chunks double.

A round trip per chunk costs more than decoding and encoding a thousand
keys: at a million keys, 20,000-record batches ran 38% faster than at 64
keys a chunk, and a rescaled checkpoint's first batch a quarter faster;
2,000-record batches, which touch few keys of each chunk, about 13% slower
(docs/benchmarks.md, session 43). Checkpoints keep the depth they grew to.
"""
GROW_AT = 2 * TARGET_KEYS
"""Average keys per chunk beyond which a task's chunks double."""
TARGET_BYTES = 64 << 10
"""A chunk's encoded size right after the chunks double, at most: a key touched
rewrites its whole chunk, so large values get fewer keys a chunk (64 of 1 KiB)."""
MAX_DEPTH = 20
"""No deeper than the key slots themselves (``SLOT_BITS``)."""

Entries = dict[bytes, tuple[int, tuple[Any, ...]]]
"""One chunk's keys: ``key -> (slot, value)``, value in the order of ``state_schema``."""


@dataclass(frozen=True)
class Layout:
    """A task's chunk depth and key count, stored beside its chunks.

    Attributes
    ----------
    depth
        Chunks are numbered ``slot % 2**depth``.
    keys
        Keys with state in the task.
    """

    depth: int
    keys: int


def min_depth(elasticity_factor: int) -> int:
    """The smallest depth at which a chunk's keys all belong to one task (``log2(factor)``)."""
    return elasticity_factor.bit_length() - 1


def chunk_of(slot: int, depth: int) -> int:
    """The chunk number of a key slot at ``depth``."""
    return slot & ((1 << depth) - 1)


def chunk_count(depth: int, elasticity_factor: int) -> int:
    """How many chunk numbers one task at ``elasticity_factor`` has at ``depth``."""
    return max(1, (1 << depth) // elasticity_factor)


def target_keys(bytes_per_key: float | None = None) -> int:
    """Keys a chunk averages right after doubling, for keys of ``bytes_per_key`` encoded.

    :data:`TARGET_KEYS`, or fewer when that many would pass
    :data:`TARGET_BYTES`; at least one. Unknown sizes (``None``) take
    :data:`TARGET_KEYS`.
    """
    if not bytes_per_key:
        return TARGET_KEYS
    return max(1, min(TARGET_KEYS, int(TARGET_BYTES / bytes_per_key)))


def depth_for(keys: int, elasticity_factor: int, target: int = TARGET_KEYS) -> int:
    """The depth for ``keys`` keys in a task: the shallowest averaging <= ``target`` a chunk."""
    depth = min_depth(elasticity_factor)
    while depth < MAX_DEPTH and keys > target * chunk_count(depth, elasticity_factor):
        depth += 1
    return depth


def should_grow(layout: Layout, elasticity_factor: int, target: int = TARGET_KEYS) -> bool:
    """Do the task's chunks average more than twice ``target`` keys (and may they split)?

    ``target`` is :func:`target_keys` of the task's key size; by default
    :data:`TARGET_KEYS`, so the limit is :data:`GROW_AT`.
    """
    return layout.depth < MAX_DEPTH and layout.keys > 2 * target * chunk_count(
        layout.depth, elasticity_factor
    )


def encode(entries: Mapping[bytes, tuple[int, tuple[Any, ...]]]) -> bytes:
    """One chunk as the bytes stored in the StateStore.

    Pickle of builtins (bytes, ints, tuples and the state fields' Python
    values): the fastest codec Python has for these, and stable across
    Python versions at a fixed protocol. Only spark-elastic reads these bytes,
    from its own checkpoints.
    """
    return pickle.dumps(dict(entries), protocol=4)


def decode(data: bytes) -> Entries:
    """The entries of a chunk written by :func:`encode`."""
    entries: Entries = pickle.loads(data)  # the library's own state values, never foreign input
    return entries


def regroup(chunks: Iterable[Entries], depth: int) -> dict[int, Entries]:
    """Every entry of ``chunks`` in its chunk at ``depth``; chunks left empty are absent."""
    out: dict[int, Entries] = {}
    mask = (1 << depth) - 1
    for entries in chunks:
        for key, entry in entries.items():
            out.setdefault(entry[0] & mask, {})[key] = entry
    return out
