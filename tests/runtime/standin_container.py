"""A stand-in container for coordinator specs: a real process that heartbeats, no Spark.

It registers, then heartbeats every SPARK_ELASTIC_HEARTBEAT_MS until the
coordinator answers ``alive: false`` (exit 1) or it gets SIGTERM (exit 0).
With STANDIN_STUBBORN=1 it ignores both and heartbeats on: a predecessor that
does not stop when told, as a hung container would not. A warm-up (in the job
model's ``warmups``) registers, i.e. says it is ready, only once the file
STANDIN_WARM_GATE names exists (at once when unset); its heartbeats then say
it has caught up with its old owners once the file STANDIN_CAUGHT_UP_GATE
names exists (at once when unset). With STANDIN_LINGER_S set, SIGTERM makes it say
its query stopped (``stopped=true``) and linger that long before it exits, as a
container's JVM on its way out does.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from spark_elastic.runtime.container import ContainerSettings, CoordinatorClient
from spark_elastic.runtime.protocol import Registration


def main() -> int:
    settings = ContainerSettings.from_env()
    client = CoordinatorClient(
        settings.coordinator_url, settings.token, others=settings.coordinator_urls
    )
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    stubborn = os.environ.get("STANDIN_STUBBORN") == "1"
    signal.signal(signal.SIGTERM, signal.SIG_IGN if stubborn else on_term)
    gate = os.environ.get("STANDIN_WARM_GATE")
    warm = client.job_model().warmup(settings.container_id) is not None
    caught_up_gate = os.environ.get("STANDIN_CAUGHT_UP_GATE")

    def caught_up() -> bool:
        return warm and (not caught_up_gate or Path(caught_up_gate).exists())

    if gate and warm:
        while not Path(gate).exists():
            time.sleep(0.05)
    deadline = time.monotonic() + 20
    while True:  # a loaded machine may answer late: retry, as a real container's start would
        try:
            if not client.register(Registration(settings.container_id, os.getpid())).alive:
                return 1
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(settings.heartbeat_s)
    while not stop:
        try:
            if not client.heartbeat(settings.container_id, caught_up()).alive and not stubborn:
                return 1
        except OSError:
            pass
        time.sleep(settings.heartbeat_s)
    linger = float(os.environ.get("STANDIN_LINGER_S", "0"))
    if linger:
        client.heartbeat(settings.container_id, stopped=True)
        time.sleep(linger)
    return 0


if __name__ == "__main__":
    sys.exit(main())
