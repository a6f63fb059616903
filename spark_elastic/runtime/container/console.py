"""What a container tells its operator: a line on stderr per step, and its exit code.

Log lines carry wall-clock times to the millisecond, so a move's timeline
reads across several containers' logs. Exit codes: 0, stopped (SIGTERM) or
removed from the job model; 1, fenced, gave up on the coordinator, or its
query failed.
"""

from __future__ import annotations

import sys
import time

__all__ = ["EXIT_FENCED", "EXIT_OK"]

EXIT_OK = 0
EXIT_FENCED = 1


def _log(message: str) -> None:
    # Wall-clock times to the millisecond: a move's timeline reads across several logs.
    now = time.time()
    stamp = time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d}"
    print(f"spark-elastic container {stamp}: {message}", file=sys.stderr, flush=True)
