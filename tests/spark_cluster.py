"""A Spark standalone cluster on loopback, started with pyspark's own ``spark-class``.

A master and workers, each a JVM this helper starts and stops by PID, for
specs that run containers on a cluster instead of ``local[*]``.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pyspark
from jvm import CONTAINER_JAVA_OPTIONS

SPARK_HOME = Path(pyspark.__file__).parent


def _wait_for(pattern: str, log: Path, what: str, count: int = 1, timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.findall(pattern, log.read_text(errors="replace")) if log.exists() else []
        if len(found) >= count:
            return str(found[0])
        time.sleep(0.25)
    tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}:\n{tail}")


@contextlib.contextmanager
def standalone_cluster(workdir: Path, workers: int = 2, cores: int = 1) -> Iterator[str]:
    """Start a master and ``workers`` workers on 127.0.0.1; yield the master URL; stop them all.

    Each worker offers ``cores`` cores and 1 GiB. The master's REST server is
    off and every service binds to loopback on a free port.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
        "SPARK_LOG_DIR": str(workdir / "logs"),
        # The master and worker daemons start, serve a spec and stop (see tests/jvm.py).
        "SPARK_DAEMON_JAVA_OPTS": CONTAINER_JAVA_OPTIONS,
    }
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    processes: list[subprocess.Popen[bytes]] = []

    def launch(name: str, *args: str) -> Path:
        log = workdir / f"{name}.log"
        with log.open("wb") as out:
            processes.append(
                subprocess.Popen(
                    [spark_class, *args],
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        return log

    try:
        master_log = launch(
            "master",
            *("org.apache.spark.deploy.master.Master", "--host", "127.0.0.1"),
            *("--port", "0", "--webui-port", "0"),
        )
        url = _wait_for(r"Starting Spark master at (spark://[\d.]+:\d+)", master_log, "the master")
        for i in range(workers):
            launch(
                f"worker-{i}",
                *("org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1"),
                *("--port", "0", "--webui-port", "0", "--cores", str(cores), "--memory", "1g"),
                *("--work-dir", str(workdir / f"work-{i}")),
            )
        _wait_for(r"Registering worker", master_log, f"{workers} workers", count=workers)
        yield url
    finally:
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
