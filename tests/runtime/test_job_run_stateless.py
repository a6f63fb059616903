"""A stateless job as three containers (scaled, grown, fenced, killed, its coordinator
restarted, split and merged), and two on a cluster.

Compared with one batch query over the same log: every record reaches the
virtual task the plan gives it (read once by the container owning it), in
offset order per task, and each record's output published once (its sink is
transactional: rows are compared as lists, repeats included).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from cli_runner import run_cli
from jobs import (
    CHANGE_DEADLINE_S,
    RECORDS,
    TASKS_JOB,
    RunningJob,
    committed_batches,
    produce,
    published_batches,
    tagged_rows,
    wait_until,
)
from jvm import CONTAINER_CONF
from pyspark.sql import SparkSession
from spark_cluster import standalone_cluster
from standins import alive

from spark_elastic import EmbeddedLog, with_virtual_tasks
from spark_elastic.log.source import LOG_SOURCE_FORMAT, register_log_source
from spark_elastic.runtime.growth import grown_plan

pytestmark = pytest.mark.slow

Row = tuple[str, int, int, str]


def reference(spark: SparkSession, root: Path, partitions: int = 2, factor: int = 4) -> set[Row]:
    """Each record with the task the plan gives it at ``factor``: planned at 2 partitions,
    grown to ``partitions`` by SEP-5's rule (partition p joins the tasks of p mod 2)."""
    register_log_source(spark)
    clicks = (
        spark.read.format(LOG_SOURCE_FORMAT)
        .option("path", str(root / "log"))
        .option("subscribe", "clicks")
        .load()
    )
    plan = grown_plan("partition", factor, {"clicks": 2}, {"clicks": partitions})
    tagged = clicks.transform(with_virtual_tasks(plan=plan, route=False))
    return {
        (r.key.decode(), r.partition, r.offset, r.virtual_task)
        for r in tagged.select("key", "partition", "offset", "virtual_task").collect()
    }


@pytest.fixture
def clicks(tmp_path: Path) -> Path:
    """RECORDS clicks over 2 partitions (in place of the shared fixture's 4)."""
    log = EmbeddedLog(tmp_path / "log")
    log.create_topic("clicks", 2)
    produce(log, 0, RECORDS)
    return tmp_path


@pytest.fixture
def run_job(clicks: Path) -> Iterator[Callable[..., RunningJob]]:
    started: list[RunningJob] = []

    def start(containers: int, *extra: str, port: int = 0) -> RunningJob:
        env = {**os.environ, "CLICKS_ROOT": str(clicks), "PYSPARK_PYTHON": sys.executable}
        command = [
            sys.executable,
            "-m",
            "spark_elastic",
            "job",
            "run",
            TASKS_JOB,
            "--containers",
            str(containers),
            *("--port", str(port), "--store", str(clicks / "coordinator.db")),
            # Containers go on without their coordinator for about a minute of failed
            # heartbeats: the story's coordinator restart may take a while on a loaded host.
            *("--heartbeat-retries", "120"),
            *CONTAINER_CONF,
            *extra,
        ]
        with (clicks / f"coordinator-{len(started)}.log").open("w") as log_file:
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


def check_against_reference(spark: SparkSession, job: RunningJob, clicks: Path) -> None:
    expected = reference(spark, clicks)
    wait_until("every record tagged", lambda: set(tagged_rows(clicks / "tasks-out")) >= expected)
    rows = tagged_rows(clicks / "tasks-out")
    assert sorted(rows) == sorted(expected)
    # Within each task, offsets rise along a partition in the order the task saw them.
    status = job.status()
    owners = {t["task"]: t["container"] for t in status["tasks"]}
    assert set(owners) == {task for *_, task in expected}


def test_containers_run_on_a_spark_standalone_cluster(
    spark: SparkSession, run_job: Callable[..., RunningJob], clicks: Path, tmp_path: Path
) -> None:
    with standalone_cluster(tmp_path / "cluster", workers=2, cores=1) as master:
        job = run_job(2, "--master", master, "--conf", "spark.cores.max=1")
        check_against_reference(spark, job, clicks)
        # Each container is its own application on the cluster, its executors on the workers.
        master_log = (tmp_path / "cluster" / "master.log").read_text(errors="replace")
        assert master_log.count("Registering app spark-elastic click-tasks") == 2
        assert "Launching executor" in master_log
        job.cleanup()


def published_rows(out: Path) -> list[tuple[str, int, int, int, int]]:
    """``(user, partition, offset, generation, batch)`` of every published row."""
    rows = []
    for directory in map(Path, committed_batches(out)):
        generation = int(directory.parent.parent.name.split("=")[1])
        batch = int(directory.parent.name.split("=")[1])
        t = pq.read_table(directory).to_pydict()
        rows.extend(
            (u, p, o, generation, batch)
            for u, p, o in zip(t["user"], t["partition"], t["offset"], strict=True)
        )
    return rows


# Long (`make test-all`): a stateless job's changes (`make test` runs the stateful story on
# Kafka and the operable story).
@pytest.mark.long
def test_each_record_published_once_through_scale_growth_failover_restart_split_and_merge(
    spark: SparkSession, run_job: Callable[..., RunningJob], clicks: Path
) -> None:
    # One start-up for every story of a running stateless job (the suite's budget):
    # reading, live scaling, growth, a fence, a failover, a coordinator restart, a split
    # and a merge.
    job = run_job(3, "--partition-check-ms", "500")
    check_against_reference(spark, job, clicks)

    def running() -> list[dict[str, Any]]:
        return [c for c in job.status()["containers"] if c["state"] == "running"]

    # A batch's output is published before its progress report is sent, so the counts
    # catch up with the sink a little later; a report lost on the way never catches up.
    wait_until(
        "every record counted in the containers' progress reports",
        lambda: sum(c["recordsProcessed"] for c in running()) >= RECORDS,
    )
    containers = running()
    assert len(containers) == 3
    assert sum(c["recordsProcessed"] for c in containers) == RECORDS  # no failure: once each
    # Each container reads exactly the partitions its tasks need (8 tasks over 2 partitions
    # in 3 containers: one of them needs both), not the whole topic.
    expected = reference(spark, clicks)
    partitions_of = {task: {p for _, p, _, t in expected if t == task} for *_, task in expected}
    for c in containers:
        needed = set().union(*(partitions_of[t] for t in c["tasks"]))
        assert c["recordsRead"] == sum(1 for _, p, _, _ in expected if p in needed), c
    assert sum(c["recordsRead"] for c in containers) < 3 * RECORDS

    log = EmbeddedLog(clicks / "log")
    produced = RECORDS
    for count in (2, 3):
        before = job.job_model()["version"]
        result = run_cli("job", "scale", job.url, "--containers", str(count))
        assert result.returncode == 0, result.stderr
        produce(log, produced, 1000)  # records arrive during the handover
        produced += 1000
        model = job.job_model()
        assert model["version"] == before + 1
        assert len(model["containers"]) == count
        wait_until(
            f"{count} containers running the new model",
            lambda: (
                set(job.running_containers())
                == {c["containerId"] for c in job.job_model()["containers"]}
            ),
            timeout=CHANGE_DEADLINE_S,
        )
    expected = reference(spark, clicks)
    wait_until("every record tagged", lambda: set(tagged_rows(clicks / "tasks-out")) >= expected)
    assert sorted(tagged_rows(clicks / "tasks-out")) == sorted(expected)
    assert [e["kind"] for e in job.status()["events"]].count("scale") == 2

    # The topic grows 2 -> 4 with a backlog in the old partitions (SEP-5).
    produce(log, produced, 4000)
    log.grow("clicks", 4)
    produce(log, produced + 4000, 3000)  # these keys now hash over 4 partitions
    model = wait_until(
        "the job model grown to 4 partitions",
        lambda: (m := job.job_model())["partitions"] == {"clicks": 4} and m,
        timeout=240,
    )
    assert model["plannedPartitions"] == {"clicks": 2}
    # Same eight virtual tasks: partitions 2 and 3 joined the tasks of 0 and 1.
    expected = reference(spark, clicks, partitions=4)
    assert {task for *_, task in expected} == {t for c in model["containers"] for t in c["tasks"]}
    wait_until("every record tagged", lambda: set(tagged_rows(clicks / "tasks-out")) >= expected)
    assert sorted(tagged_rows(clicks / "tasks-out")) == sorted(expected)

    # Per key: the records it had in its old partition (0 or 1) were all published before
    # any of its records in a new one (2 or 3), which only the successors read.
    first_new: dict[str, tuple[int, int]] = {}
    last_old: dict[str, tuple[int, int]] = {}
    for user, partition, _, generation, batch in published_rows(clicks / "tasks-out"):
        when = (generation, batch)
        if partition >= 2:
            first_new[user] = min(first_new.get(user, when), when)
        else:
            last_old[user] = max(last_old.get(user, when), when)
    assert first_new, "no record was read from a new partition"
    out_of_order = [u for u in first_new if u in last_old and last_old[u] >= first_new[u]]
    assert out_of_order == []
    events = [e["kind"] for e in job.status()["events"]]
    assert events.count("handover") == 3  # every container of the 3 hands over

    # One container paused past its lease (SIGSTOP: a zombie) and another killed outright
    # (SIGKILL), while records arrive: each one's successor starts where it last committed,
    # what it had published beyond that is not published again, and the zombie, woken up,
    # publishes nothing.
    (zombie, zombie_pid), (victim, victim_pid) = sorted(job.running_containers().items())[:2]
    os.kill(zombie_pid, signal.SIGSTOP)
    try:
        produce(log, produced + 7000, 1000)
        wait_until(
            "the paused container's tasks given to a successor",
            lambda: zombie not in {c["containerId"] for c in job.job_model()["containers"]},
            timeout=CHANGE_DEADLINE_S,
        )
        before = published_batches(clicks / "tasks-out", zombie)
    finally:
        with contextlib.suppress(ProcessLookupError):  # the coordinator may have killed it
            os.kill(zombie_pid, signal.SIGCONT)
    wait_until("the fenced container to exit", lambda: not alive(zombie_pid), timeout=60)
    assert published_batches(clicks / "tasks-out", zombie) == before
    os.kill(victim_pid, signal.SIGKILL)
    produce(log, produced + 8000, 1000)
    wait_until(
        "the killed container's tasks given to a successor",
        lambda: victim not in {c["containerId"] for c in job.job_model()["containers"]},
        timeout=CHANGE_DEADLINE_S,
    )
    expected = reference(spark, clicks, partitions=4)
    wait_until("every record tagged", lambda: set(tagged_rows(clicks / "tasks-out")) >= expected)
    assert sorted(tagged_rows(clicks / "tasks-out")) == sorted(expected)

    # The coordinator dies and comes back on its address while records arrive: the same
    # containers go on, and publish each new record once.
    running = wait_until(
        "three running containers",
        lambda: len(job.running_containers()) == 3 and job.running_containers(),
    )
    job.process.send_signal(signal.SIGKILL)
    job.process.wait(30)
    produce(log, produced + 9000, 1000)
    produced += 10000
    again = run_job(3, "--partition-check-ms", "500", port=int(job.url.rsplit(":", 1)[1]))
    again.pids.update(job.pids)
    expected = reference(spark, clicks, partitions=4)
    wait_until("every record tagged", lambda: set(tagged_rows(clicks / "tasks-out")) >= expected)
    assert sorted(tagged_rows(clicks / "tasks-out")) == sorted(expected)
    assert again.running_containers() == running

    # A live split, factor 4 -> 8, then a merge back to 4, each while records arrive: a
    # record is tagged with its task at the factor in force when it was read, and is
    # published once whichever generation read it.
    for factor in (8, 4):
        changed = run_cli("job", "scale", again.url, "--elasticity-factor", str(factor))
        assert changed.returncode == 0, changed.stderr
        produce(log, produced, 1000)
        produced += 1000
        model = wait_until(
            f"factor {factor}",
            lambda f=factor: (m := again.settled_model()) and m["elasticityFactor"] == f and m,
            timeout=CHANGE_DEADLINE_S,
        )
        assert sorted(t for c in model["containers"] for t in c["tasks"]) == sorted(
            f"Partition {p}_{b}_{factor}" for p in range(2) for b in range(factor)
        )
        again.status()  # records the new containers' pids for cleanup
    produce(log, produced, 1000)  # for the merged tasks' owners
    produced += 1000
    at = {f: {r[:3]: r[3] for r in reference(spark, clicks, 4, f)} for f in (4, 8)}
    assert len(at[4]) == produced
    wait_until(
        "every record tagged",
        lambda: {r[:3] for r in tagged_rows(clicks / "tasks-out")} >= set(at[4]),
    )
    rows = tagged_rows(clicks / "tasks-out")
    assert sorted(r[:3] for r in rows) == sorted(at[4])  # each record's row once
    assert [r for r in rows if r[3] not in (at[4][r[:3]], at[8][r[:3]])] == []
    assert any(r[3] == at[8][r[:3]] for r in rows), "no record was read at factor 8"
