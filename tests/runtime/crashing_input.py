"""A job input whose calls can abort or hang the process they run in, as librdkafka's can.

Unpickled in :class:`~spark_elastic.runtime.coordinator.input_process.InputProcess`'s
child (the spec puts this folder on its ``PYTHONPATH``).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from spark_elastic.errors import InputError


@dataclass(frozen=True)
class CrashingInput:
    """Answers ``{"clicks": 4}``; ``abort`` aborts its process, ``hang`` sleeps."""

    topics: tuple[str, ...] = ("clicks",)
    timeout_s: float = 1.0

    def partition_counts(self) -> dict[str, int]:
        return {"clicks": 4}

    def end_offsets(self, topic: str) -> dict[int, int]:
        return {p: 10 * p for p in range(4)}

    def pid(self) -> int:
        return os.getpid()

    def abort(self) -> None:
        os.abort()  # SIGABRT, as a failed assertion in a C library

    def hang(self, seconds: float) -> None:
        time.sleep(seconds)

    def refuse(self) -> None:
        raise InputError("KafkaInput.topics: expected existing topics, found no topic 'x'")

    def fail(self) -> None:
        raise RuntimeError("something else")
