"""Which containers hold which keys: virtual tasks related across elasticity factors.

Pure functions over task names; the coordinator uses them to plan a move and
a warm-up container to find the checkpoints it follows. A bucket at factor
``f`` shares keys with its one parent at a coarser factor and with all its
children at a finer one (SEP-32: bucket ``b`` at ``f`` holds the keys whose
hash is ``b`` modulo ``f``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING

from spark_elastic.model.names import TaskName

if TYPE_CHECKING:
    from spark_elastic.runtime.protocol import ContainerModel

__all__ = ["Holders", "buckets_at", "parsed"]


@functools.lru_cache(maxsize=65536)
def parsed(task: str) -> TaskName:
    """``TaskName.parse``, cached: the coordinator parses the same names every tick."""
    return TaskName.parse(task)


def buckets_at(bucket: int, factor: int, at: int) -> Sequence[int]:
    """The buckets at factor ``at`` sharing keys with ``bucket`` at ``factor``: its one
    parent at a coarser factor (itself at the same one), all its children at a finer one."""
    return [bucket % at] if at <= factor else range(bucket, at, factor)


class Holders:
    """Which of some containers hold keys of given tasks, at any mix of factors."""

    def __init__(self, containers: Sequence[ContainerModel]) -> None:
        self.index: dict[tuple[str, int, int], str] = {}
        for c in containers:
            for t in c.tasks:
                name = parsed(t)
                self.index[(str(name.base), name.elasticity_factor, name.key_bucket)] = (
                    c.container_id
                )
        self.factors = sorted({f for _, f, _ in self.index})

    def of(self, tasks: Sequence[str]) -> set[str]:
        """Ids of the containers holding a task that shares keys with one of ``tasks``."""
        found: set[str] = set()
        for t in tasks:
            name = parsed(t)
            base, factor, bucket = str(name.base), name.elasticity_factor, name.key_bucket
            for f in self.factors:
                found.update(
                    self.index[(base, f, b)]
                    for b in buckets_at(bucket, factor, f)
                    if (base, f, b) in self.index
                )
        return found
