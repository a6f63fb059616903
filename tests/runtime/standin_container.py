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
container's JVM on its way out does. With STANDIN_RATE set (records a second),
an owner of tasks also reports a committed micro-batch every half second: its
tasks' offsets advancing at that rate, a lag that rises and falls, batch
durations of 0.3-0.9 s (what the coordinator's history and charts show).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from spark_elastic.runtime.container import ContainerSettings, CoordinatorClient
from spark_elastic.runtime.protocol import ProgressReport, Registration, TaskProgress

REPORT_S = 0.5


def report(
    client: CoordinatorClient, container_id: str, rate: float, batch: int, caught_up: bool
) -> bool:
    """One committed micro-batch of this container's tasks if it owns any now (else a
    heartbeat, as a warm-up sends); False once the coordinator says it is no longer alive."""
    model = client.job_model()
    mine = next((c for c in model.containers if c.container_id == container_id), None)
    if mine is None or not mine.tasks:
        return client.heartbeat(container_id, caught_up).alive
    # Containers, and tasks, differ a little, so that their lines do not hide each other.
    share = 1 + 0.2 * (int(container_id.rsplit("c", 1)[-1]) % 3)
    per_task = int(share * rate * REPORT_S / len(mine.tasks))
    wave = abs((batch % 40) - 20)  # a lag that rises and falls
    tasks = tuple(
        TaskProgress(
            t,
            {"clicks": {int(t.split("_")[0].split()[1]): batch * per_task}},
            10 * wave * (2 + i % 5),
        )
        for i, t in enumerate(mine.tasks)
    )
    records = per_task * len(tasks)
    return client.progress(
        ProgressReport(
            container_id,
            mine.generation,
            batch,
            records,
            records,
            tasks,
            batch_duration_ms=int(share * (300 + 600 * (batch % 7) // 6)),
        )
    ).alive


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
    rate = float(os.environ.get("STANDIN_RATE", "0"))
    batch, reported_at = 0, time.monotonic()
    while not stop:
        try:
            if rate and time.monotonic() - reported_at >= REPORT_S:
                batch, reported_at = batch + 1, time.monotonic()
                alive = report(client, settings.container_id, rate, batch, caught_up())
                if not alive and not stubborn:
                    return 1
            elif not client.heartbeat(settings.container_id, caught_up()).alive and not stubborn:
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
