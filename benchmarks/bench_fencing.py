"""How fast a cut-off container stops writing and exits, against Samza's defaults.

Runs the stateless example job (``examples/jobs/click_tasks.py``) as one
container under a real coordinator with the default lease (10 s, write budget
3 s, heartbeat 1 s), on a log that a producer keeps writing to. It then
freezes the coordinator (``SIGSTOP``): the container can no longer renew its
lease, as in a network partition. It reports the time from that moment (at or
after the container's last answered heartbeat) to the container's last
published batch, and to its process exit. Loopback only, bounded in time.

    .venv/bin/python benchmarks/bench_fencing.py

Samza's defaults, for comparison: heartbeats every 60 s (the first at once),
6 retries with backoff, then a graceful shutdown that is forced to
``exit(1)`` after 120 s. A zombie there keeps processing for up to about 5
minutes after the coordinator's decision.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from spark_elastic import EmbeddedLog
from spark_elastic.runtime.sinks import COMMITS_DIR

ROOT = Path(__file__).resolve().parents[1]
JOB = f"{ROOT / 'examples' / 'jobs' / 'click_tasks.py'}:job"


def wait_until(what: str, condition: object, timeout: float = 180.0) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()  # type: ignore[operator]
        if value:
            return value
        time.sleep(0.1)
    raise SystemExit(f"timed out waiting for {what}")


def last_publish(out: Path) -> float:
    """Wall time of the newest published batch (its commit object appears in one step)."""
    stamps = [p.stat().st_ctime for p in out.glob(f"{COMMITS_DIR}/*/*.json")]
    return max(stamps, default=0.0)


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        log = EmbeddedLog(root / "log")
        log.create_topic("clicks", 2)
        stop = threading.Event()

        def produce() -> None:
            i = 0
            with log.producer("clicks") as producer:
                while not stop.is_set():
                    producer.send(f"user-{i % 50}".encode(), b"click")
                    i += 1
                    time.sleep(0.002)

        writer = threading.Thread(target=produce, daemon=True)
        writer.start()
        env = {**os.environ, "CLICKS_ROOT": str(root), "PYSPARK_PYTHON": sys.executable}
        coordinator = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "spark_elastic",
                "job",
                "run",
                JOB,
                "--containers",
                "1",
                "--port",
                "0",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        container_pid = 0
        try:
            assert coordinator.stdout is not None
            url = coordinator.stdout.readline().split("status: ")[1].strip().rstrip("/")

            def running() -> int:
                with urllib.request.urlopen(f"{url}/status.json", timeout=5) as response:
                    status = json.loads(response.read())
                pids = [c["pid"] for c in status["containers"] if c["state"] == "running"]
                return int(pids[0]) if pids else 0

            container_pid = int(wait_until("a running container", running))  # type: ignore[call-overload]
            out = root / "tasks-out"
            # A few batches in, so the container is in its steady state.
            wait_until("published batches", lambda: len(list(out.glob("*/*/batch=*"))) >= 5)
            frozen = time.time()
            coordinator.send_signal(signal.SIGSTOP)
            wait_until(
                "the container to exit",
                lambda: (
                    not Path(f"/proc/{container_pid}").exists()
                    or Path(f"/proc/{container_pid}/stat").read_text().split()[2] == "Z"
                ),
                timeout=300,
            )
            exited = time.time()
            print(
                "coordinator frozen (last heartbeat answered at or before): t = 0\n"
                f"  last batch published: t = {last_publish(out) - frozen:+.1f} s "
                "(lease 10 s minus write budget 3 s bounds it at +7 s)\n"
                f"  container exited:     t = {exited - frozen:+.1f} s\n"
                "Samza's defaults: processing can go on for about 5 minutes "
                "(60 s polls, 6 retries with backoff, 120 s forced shutdown)."
            )
        finally:
            stop.set()
            with contextlib.suppress(ProcessLookupError):
                coordinator.send_signal(signal.SIGCONT)
                coordinator.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                coordinator.wait(60)
            if coordinator.poll() is None:
                coordinator.kill()
            if container_pid:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(container_pid, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
