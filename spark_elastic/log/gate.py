"""A read gate for the embedded log's Spark source: offsets no micro-batch passes.

A JSON file, ``{"topic": {"partition": offset}}``, that the source's
``gate`` option names and that its driver-side reader reads each trigger
(:mod:`.source`). A partition the file does not name, and a missing file,
admit nothing new; ``null`` lifts the gate. The runtime's replaying warm-ups
hold their queries at their old owners' commits with it.

Pure Python (no pyspark), so the container's driver can set a gate cheaply.
May import nothing of ours.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Mapping
from typing import Any

__all__ = ["Offsets", "read_gate", "write_gate"]

Offsets = dict[tuple[str, int], int]
"""Next offset to read, by (topic, partition)."""


def read_gate(path: str) -> Offsets | None:
    """The offsets a ``gate`` file holds; ``None`` when it lifts the gate.

    A missing or unreadable file (one being replaced) admits nothing new:
    the gate is there so that a query never reads past what it may.

    Parameters
    ----------
    path
        The gate file.

    Returns
    -------
    dict or None
        Offsets by (topic, partition), or ``None`` for no limit.
    """
    try:
        with open(path, encoding="utf-8") as handle:
            parsed = json.load(handle)
    except (OSError, ValueError):
        return {}
    if parsed is None:
        return None
    return _offsets(parsed)


def write_gate(path: str, offsets: Mapping[str, Mapping[str, int]] | None) -> None:
    """Set a ``gate`` file atomically: per-partition offsets, or ``None`` to lift it.

    Runs on the driver of the query that reads through the gate (the file
    must be readable where the driver plans its micro-batches).

    Parameters
    ----------
    path
        The gate file.
    offsets
        ``{"topic": {"partition": offset}}``, or ``None`` for no limit.
    """
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, staging = tempfile.mkstemp(prefix=".gate.", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(None if offsets is None else _as_json(offsets), handle)
        os.replace(staging, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staging)
        raise


def _offsets(document: Mapping[str, Any]) -> Offsets:
    return {
        (str(topic), int(partition)): int(offset)
        for topic, partitions in document.items()
        for partition, offset in partitions.items()
    }


def _as_json(offsets: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    return {
        str(topic): {str(p): int(o) for p, o in sorted(partitions.items(), key=lambda i: int(i[0]))}
        for topic, partitions in sorted(offsets.items())
    }
