"""A job runs as containers under a coordinator, fails over and fences: end to end, real processes.

Every scenario runs ``spark-elastic job run`` (the coordinator, in its own
process, launching containers that are each their own Spark application) on
the embedded log, then compares the sink's rows with a single key-ordered
pass over the same records. The click-count job emits ``(user, clicks, partition,
offset)`` for every record it applies, so equal row *sets* mean nothing was
lost, no record was applied to the keyed state twice (it would show under
another count) and each user's records were applied in offset order.
Output is at-least-once, so rows may repeat across generations; sets ignore
that.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from cli_runner import run_cli
from jvm import CONTAINER_CONF
from pyspark.sql import SparkSession
from standins import alive

from spark_elastic import LOG_SOURCE_FORMAT, EmbeddedLog
from spark_elastic.log.source import register_log_source
from spark_elastic.runtime.coordinator.launcher import LocalLauncher

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
JOB = f"{ROOT / 'examples' / 'jobs' / 'click_counts.py'}:job"
RECORDS = 6000
USERS = 97
# Short leases so failovers happen within seconds; the budget fits a local Parquet write.
LEASE_MS, MARGIN_MS, BUDGET_MS, HEARTBEAT_MS = 6000, 2500, 2000, 500


def wait_until(what: str, condition: Callable[[], Any], timeout: float = 180.0) -> Any:
    """Poll ``condition`` until it returns a truthy value; fail naming ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


@dataclass
class RunningJob:
    """A coordinator process running the click-count job, and what it launched."""

    root: Path
    process: subprocess.Popen[str]
    url: str = ""
    pids: dict[int, str] = field(default_factory=dict)
    """PID -> container id of every container the status page has shown."""

    def status(self) -> dict[str, Any]:
        document: dict[str, Any] = get_json(f"{self.url}/status.json")
        for container in document.get("containers", []):
            if container.get("pid"):
                self.pids[int(container["pid"])] = container["containerId"]
        return document

    def job_model(self) -> dict[str, Any]:
        model: dict[str, Any] = get_json(f"{self.url}/jobModel")
        return model

    def running_containers(self) -> dict[str, int]:
        """``{container id: pid}`` of containers registered and running."""
        return {
            c["containerId"]: int(c["pid"])
            for c in self.status().get("containers", [])
            if c.get("state") == "running" and c.get("pid")
        }

    def output_rows(self) -> set[tuple[str, int, int, int]]:
        return output_rows(self.root / "out")

    def takeovers(self) -> dict[str, str]:
        """``{container id: how it took its tasks over}``, from the containers' logs.

        ``replay`` (a replaying warm-up's running query took them), ``snapshot``
        (a snapshot warm-up started from the state it followed) or
        ``checkpoints`` (its predecessors' committed checkpoints, rescaled).
        """
        ways = {
            "in the query that replayed them": "replay",
            "from the state it followed": "snapshot",
            " checkpoints: ": "checkpoints",
        }
        found = {}
        for path in sorted((self.root / "checkpoints" / "logs").glob("*.log")):
            for line in path.read_text(errors="replace").splitlines():
                if ": took over " in line:
                    found[path.stem] = next(way for words, way in ways.items() if words in line)
        return found

    def cleanup(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(60)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        # A container that exited long ago may have left its PID to another process (the
        # test session's own JVM, once): the launcher signals a PID, and its process group,
        # only while /proc says they are still that container's.
        launcher = LocalLauncher(self.root / "cleanup")
        for pid, container_id in self.pids.items():
            launcher.kill(pid, container_id, signal.SIGKILL)


def output_rows(out: Path) -> set[tuple[str, int, int, int]]:
    """Rows of every completed batch directory (those with Spark's _SUCCESS marker)."""
    rows: set[tuple[str, int, int, int]] = set()
    for success in out.glob("container=*/generation=*/batch=*/_SUCCESS"):
        with contextlib.suppress(FileNotFoundError):  # overwritten by a retried batch meanwhile
            table = pq.read_table(success.parent).to_pydict()
            rows.update(
                zip(
                    table["user"], table["clicks"], table["partition"], table["offset"], strict=True
                )
            )
    return rows


def writes_by(out: Path, container_id: str) -> list[float]:
    """Modification times of the files a container wrote to the sink."""
    return [p.stat().st_mtime for p in out.glob(f"container={container_id}/**/*") if p.is_file()]


@pytest.fixture
def clicks(tmp_path: Path) -> Path:
    """An embedded log with RECORDS clicks of USERS users over 4 partitions."""
    log = EmbeddedLog(tmp_path / "log")
    log.create_topic("clicks", 4)
    produce(log, 0, RECORDS)
    return tmp_path


def produce(log: EmbeddedLog, start: int, count: int) -> None:
    with log.producer("clicks") as producer:
        for i in range(start, start + count):
            producer.send(f"user-{(i * 7919) % USERS}".encode(), f"click-{i}".encode())


@pytest.fixture
def start_job(clicks: Path) -> Iterator[Callable[..., RunningJob]]:
    started: list[RunningJob] = []

    def start(containers: int, store: Path | None = None, port: int = 0, *extra: str) -> RunningJob:
        env = {
            **os.environ,
            "CLICKS_ROOT": str(clicks),
            "PYSPARK_PYTHON": sys.executable,
        }
        command = [
            sys.executable,
            *("-m", "spark_elastic", "job", "run", JOB),
            *("--containers", str(containers), "--port", str(port)),
            *("--store", str(store or clicks / "coordinator.db")),
            *("--lease-ms", str(LEASE_MS), "--margin-ms", str(MARGIN_MS)),
            *("--write-budget-ms", str(BUDGET_MS), "--heartbeat-ms", str(HEARTBEAT_MS)),
            # Containers go on without their coordinator for about a minute of failed
            # heartbeats (Samza's retries; two leases at least): the spec's coordinator
            # restart may outlast two 6 s leases on a loaded machine.
            *("--heartbeat-retries", "120"),
            *CONTAINER_CONF,
            *extra,
        ]
        log_file = (clicks / f"coordinator-{len(started)}.log").open("w")
        process = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=log_file, text=True
        )
        job = RunningJob(clicks, process)
        started.append(job)
        assert process.stdout is not None
        line = process.stdout.readline()
        assert "http://127.0.0.1:" in line, f"no status URL printed: {line!r}"
        job.url = line[line.index("http://") :].strip().rstrip("/")
        return job

    yield start
    for job in started:
        job.cleanup()


def all_applied(job: RunningJob, total: int) -> Callable[[], bool]:
    return lambda: len({(u, o, p) for u, _, p, o in job.output_rows()}) >= total


def published_batches(out: Path, container_id: str) -> set[str]:
    return {
        str(p.parent) for p in out.glob(f"container={container_id}/generation=*/batch=*/_SUCCESS")
    }


def counts_in_key_order(
    spark: SparkSession, root: Path, planned: int
) -> set[tuple[str, int, int, int]]:
    """The click-count rows of a job that kept each key's order across growth.

    A key's records in its old partition (below ``planned``) come first, then
    those in its new partition, each in offset order; its running count at a
    record is the record's place in that sequence.
    """
    register_log_source(spark)
    records = (
        spark.read.format(LOG_SOURCE_FORMAT)
        .option("path", str(root / "log"))
        .option("subscribe", "clicks")
        .load()
        .select("key", "partition", "offset")
        .collect()
    )
    by_key: dict[str, list[tuple[bool, int, int]]] = {}
    for r in records:
        by_key.setdefault(r.key.decode(), []).append(
            (r.partition >= planned, r.offset, r.partition)
        )
    return {
        (user, count, partition, offset)
        for user, seq in by_key.items()
        for count, (_, offset, partition) in enumerate(sorted(seq), start=1)
    }


def test_a_stateful_job_fences_fails_over_survives_a_restart_grows_and_changes_live(
    spark: SparkSession,
    start_job: Callable[..., RunningJob],
    clicks: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One start-up for every story of a running stateful job (the suite's budget): the
    # initial assignment, a paused container fenced (SIGSTOP: a zombie), a killed one
    # (SIGKILL), a coordinator restart, growth, then live changes. Every running count is
    # checked at the end against a single key-ordered pass over the log: nothing lost,
    # nothing applied twice, each key's records in order.
    monkeypatch.setenv("CLICKS_FACTOR", "2")  # 4 partitions x 2: 8 tasks
    options = ("--partition-check-ms", "500")
    job = start_job(3, None, 0, *options)
    running = wait_until(
        "three running containers",
        lambda: len(job.running_containers()) == 3 and job.running_containers(),
    )
    model_tasks = {c["containerId"]: c["tasks"] for c in job.job_model()["containers"]}
    tasks = [set(t) for t in model_tasks.values()]
    assert sorted(len(t) for t in tasks) == [2, 3, 3]
    assert len(set().union(*tasks)) == sum(len(t) for t in tasks) == 8  # each task once
    (zombie, zombie_pid), (victim, victim_pid) = sorted(running.items())[:2]
    log = EmbeddedLog(clicks / "log")
    total = RECORDS

    wait_until("a first batch published", lambda: published_batches(clicks / "out", zombie))
    os.kill(zombie_pid, signal.SIGSTOP)
    try:
        # New records for every task: the zombie would have work the moment it wakes up.
        produce(log, total, 2000)
        total += 2000
        wait_until(
            "the paused container's tasks handed to a new generation",
            lambda: zombie not in {c["containerId"] for c in job.job_model()["containers"]},
        )
        before = published_batches(clicks / "out", zombie)
    finally:
        os.kill(zombie_pid, signal.SIGCONT)
    wait_until("the fenced container to exit", lambda: not alive(zombie_pid), timeout=60)
    assert published_batches(clicks / "out", zombie) == before
    assert zombie in json.dumps(job.status().get("events", []))

    wait_until("a first batch written", lambda: writes_by(clicks / "out", victim))
    os.kill(victim_pid, signal.SIGKILL)
    produce(log, total, 2000)
    total += 2000
    replacement = wait_until(
        "a new container forked from the killed one's checkpoint",
        lambda: next(
            (c for c in job.job_model()["containers"] if any(victim in s for s in c["sources"])),
            None,
        ),
    )
    assert victim not in {c["containerId"] for c in job.job_model()["containers"]}
    assert set(replacement["tasks"]) == set(model_tasks[victim])
    wait_until("every record applied", all_applied(job, total), timeout=240)

    # The coordinator dies and comes back while records keep arriving.
    running = wait_until(
        "three running containers",
        lambda: len(job.running_containers()) == 3 and job.running_containers(),
    )
    model = job.job_model()
    job.process.send_signal(signal.SIGKILL)
    job.process.wait(30)
    produce(log, total, 2000)
    total += 2000
    # Back on the same address: the containers have been retrying it all along.
    port = int(job.url.rsplit(":", 1)[1])
    again = start_job(3, clicks / "coordinator.db", port, *options)
    again.pids.update(job.pids)
    assert again.job_model()["containers"] == model["containers"]
    wait_until("every record applied", all_applied(again, total), timeout=240)
    # The same processes did the work: nothing was relaunched or failed over.
    assert again.running_containers() == running
    assert all(alive(pid) for pid in running.values())

    # The topic grows 4 -> 8 with a backlog in the old partitions (SEP-5).
    produce(log, total, 4000)
    log.grow("clicks", 8)
    produce(log, total + 4000, 2000)
    total += 6000
    wait_until(
        "the job model grown to 8 partitions",
        lambda: again.job_model()["partitions"] == {"clicks": 8},
        timeout=240,
    )
    wait_until("every record applied", all_applied(again, total), timeout=240)

    # Then, while records arrive: 3 -> 2 containers, a split to factor 4 (one container at
    # a time), a merge back to 2, 2 -> 3 containers, each asked for as soon as the last one
    # was made (the new owners may still be starting). Keyed state moves with its tasks.
    warmed: set[str] = set()
    for option, value, containers, factor in (
        ("--containers", 2, 2, 2),
        ("--elasticity-factor", 4, 2, 4),
        ("--elasticity-factor", 2, 2, 2),
        ("--containers", 3, 3, 2),
    ):
        before = again.job_model()
        scaled = run_cli("job", "scale", again.url, option, str(value))
        assert scaled.returncode == 0, scaled.stderr
        pending = again.job_model()
        # KIP-441: new owners warm up while the old ones keep every task.
        assert pending["warmups"]
        assert pending["containers"] == before["containers"]
        produce(log, total, 1000)  # for the old owners, meanwhile
        total += 1000
        after = wait_until(
            f"{containers} containers at factor {factor}",
            lambda n=containers: (
                (m := again.job_model())["warmups"] == [] and len(m["containers"]) == n and m
            ),
            timeout=300,
        )
        assert after["elasticityFactor"] == factor
        moved = sorted(t for c in after["containers"] for t in c["tasks"])
        assert moved == sorted(
            f"Partition {p}_{b}_{factor}" for p in range(4) for b in range(factor)
        )
        warmed |= {c["containerId"] for c in after["containers"]} - {
            c["containerId"] for c in before["containers"]
        }
        again.status()  # records the new containers' pids for cleanup
    produce(log, total, 1000)  # for the last owners, with the state they took over
    total += 1000
    wait_until("every record applied", all_applied(again, total), timeout=240)
    # Nothing lost, nothing applied twice, each key's records in order: its old partition's
    # records before its new partition's, each in offset order.
    assert again.output_rows() == counts_in_key_order(spark, clicks, planned=4)
    # Each live change's new owners took their tasks in the query that replayed them.
    ways = again.takeovers()
    assert {ways.get(c) for c in warmed} == {"replay"}, ways
