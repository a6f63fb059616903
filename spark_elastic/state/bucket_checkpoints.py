"""Per-key-bucket checkpoints and the split/merge rules between elasticity factors.

Pure Python, no Spark. A *bucket checkpoint* says: every record of the keys
in key bucket ``b`` at factor ``f`` of one stream partition, below
``next_offset``, has been applied. Splitting and merging virtual tasks
(SEP-32) is then a question of which checkpoints still hold for a new
bucketing:

* a key in bucket ``b`` at factor ``F`` is in bucket ``b mod g`` at every
  factor ``g`` dividing ``F`` (its *ancestors*), and in one of the buckets
  ``b + k F`` at every multiple ``G`` of ``F`` (its *descendants*);
* an ancestor's checkpoint holds for all its descendants; a set of
  descendants at one factor holds, for their common ancestor, up to the
  smallest of them.

:func:`bucket_start` is Samza's pre-revert ``ElasticityUtils`` rule (cited in
SEP-32): the start of a bucket is the larger of its largest ancestor
checkpoint and, over the factors below it, the largest per-factor smallest
descendant checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from spark_elastic.errors import ArgumentError, CheckpointError
from spark_elastic.model.names import validate_elasticity_factor

__all__ = [
    "BucketCheckpoint",
    "StreamPartitionKey",
    "bucket_start",
    "cover_start",
    "is_covered",
    "prune_covered",
    "resolve_starts",
]

StreamPartitionKey = tuple[str, str, int]
"""``(system, stream, partition)``."""


@dataclass(frozen=True, slots=True, order=True)
class BucketCheckpoint:
    """The next offset to apply for one key bucket of one stream partition at one factor."""

    system: str
    stream: str
    partition: int
    key_bucket: int
    elasticity_factor: int
    next_offset: int

    def __post_init__(self) -> None:
        validate_elasticity_factor(self.elasticity_factor)
        if not 0 <= self.key_bucket < self.elasticity_factor:
            raise ArgumentError.invalid(
                "key_bucket", f"a bucket from 0 to {self.elasticity_factor - 1}", self.key_bucket
            )
        if self.next_offset < 0:
            raise ArgumentError.invalid("next_offset", "a non-negative offset", self.next_offset)

    @property
    def stream_partition(self) -> StreamPartitionKey:
        """``(system, stream, partition)``."""
        return (self.system, self.stream, self.partition)

    def covers(self, key_bucket: int, elasticity_factor: int) -> bool:
        """Whether every key of ``key_bucket`` at ``elasticity_factor`` is in this bucket."""
        return (
            elasticity_factor % self.elasticity_factor == 0
            and key_bucket % self.elasticity_factor == self.key_bucket
        )

    def is_descendant_of(self, key_bucket: int, elasticity_factor: int) -> bool:
        """Whether this bucket is a strict sub-bucket of ``key_bucket`` at ``elasticity_factor``."""
        return (
            self.elasticity_factor > elasticity_factor
            and self.elasticity_factor % elasticity_factor == 0
            and self.key_bucket % elasticity_factor == key_bucket
        )


def bucket_start(
    checkpoints: Iterable[BucketCheckpoint], key_bucket: int, elasticity_factor: int
) -> int | None:
    """Where bucket ``key_bucket`` at ``elasticity_factor`` of one stream partition starts.

    Parameters
    ----------
    checkpoints
        Checkpoints of one stream partition, at any mix of factors.
    key_bucket, elasticity_factor
        The bucket to start.

    Returns
    -------
    int or None
        The offset below which every record of the bucket's keys has been
        applied, or ``None`` when no checkpoint says anything about it.
    """
    entries = list(checkpoints)
    ancestor = _largest_ancestor(entries, key_bucket, elasticity_factor)
    descendants = _largest_complete_descendant_minimum(entries, key_bucket, elasticity_factor)
    known = [x for x in (ancestor, descendants) if x is not None]
    return max(known) if known else None


def _largest_ancestor(
    entries: list[BucketCheckpoint], key_bucket: int, elasticity_factor: int
) -> int | None:
    offsets = [e.next_offset for e in entries if e.covers(key_bucket, elasticity_factor)]
    return max(offsets) if offsets else None


def _largest_complete_descendant_minimum(
    entries: list[BucketCheckpoint], key_bucket: int, elasticity_factor: int
) -> int | None:
    by_factor: dict[int, dict[int, int]] = {}
    for e in entries:
        if e.is_descendant_of(key_bucket, elasticity_factor):
            buckets = by_factor.setdefault(e.elasticity_factor, {})
            buckets[e.key_bucket] = max(buckets.get(e.key_bucket, 0), e.next_offset)
    minima = [
        min(buckets.values())
        for factor, buckets in by_factor.items()
        if _is_complete(buckets, factor // elasticity_factor)
    ]
    return max(minima) if minima else None


def _is_complete(buckets: Mapping[int, int], expected: int) -> bool:
    # A descendant minimum only holds when every descendant at that factor is known.
    return len(buckets) == expected


def resolve_starts(
    checkpoints: Iterable[BucketCheckpoint],
    elasticity_factor: int,
    stream_partitions: Iterable[StreamPartitionKey],
) -> dict[tuple[StreamPartitionKey, int], int | None]:
    """The start of every bucket at ``elasticity_factor`` of every given stream partition."""
    factor = validate_elasticity_factor(elasticity_factor)
    by_partition: dict[StreamPartitionKey, list[BucketCheckpoint]] = {}
    for c in checkpoints:
        by_partition.setdefault(c.stream_partition, []).append(c)
    return {
        (sp, b): bucket_start(by_partition.get(sp, []), b, factor)
        for sp in stream_partitions
        for b in range(factor)
    }


def is_covered(checkpoints: Iterable[BucketCheckpoint], key_hash: int, offset: int) -> bool:
    """Whether a record (by its key's non-negative bucket hash) is below a checkpoint of its key.

    A record below any checkpoint whose bucket contains its key has been
    applied already, and must be skipped.
    """
    return any(
        offset < c.next_offset and key_hash % c.elasticity_factor == c.key_bucket
        for c in checkpoints
    )


def prune_covered(
    checkpoints: Iterable[BucketCheckpoint], key_bucket: int, elasticity_factor: int
) -> list[BucketCheckpoint]:
    """Drop the checkpoints a task's own bucket checkpoint has overtaken.

    ``checkpoints`` are one task's entries for one stream partition; the
    entry at ``(key_bucket, elasticity_factor)`` is the task's own. Another
    entry is redundant once the own one has reached it: it can no longer
    cause a record of this task to be skipped.
    """
    entries = list(checkpoints)
    own = [
        e for e in entries if (e.key_bucket, e.elasticity_factor) == (key_bucket, elasticity_factor)
    ]
    if len(own) > 1:
        raise CheckpointError(
            f"two checkpoints for bucket {key_bucket} at factor {elasticity_factor}: {own}"
        )
    if not own:
        return entries
    mine = own[0].next_offset
    return [e for e in entries if e is own[0] or e.next_offset > mine]


def cover_start(
    checkpoints: Iterable[BucketCheckpoint], key_bucket: int, elasticity_factor: int
) -> int | None:
    """The bucket's start from any mix of checkpoints that together cover its keys.

    Splits the bucket into its sub-buckets at the finest factor present; each
    sub-bucket holds up to the largest checkpoint that contains it, and the
    bucket up to the smallest of those. Used when no single factor has every
    descendant (e.g. two queries at different factors each owned part of it);
    wherever :func:`bucket_start` answers, this answer is never lower.
    """
    entries = list(checkpoints)
    finest = max([elasticity_factor, *(e.elasticity_factor for e in entries)])
    best: list[int] = []
    for sub in range(key_bucket, finest, elasticity_factor):
        covering = [e.next_offset for e in entries if e.covers(sub, finest)]
        if not covering:
            return None
        best.append(max(covering))
    return min(best)
