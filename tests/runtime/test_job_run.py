"""A job runs as containers under a coordinator, fails over and fences: end to end, real processes.

Every scenario runs ``spark-elastic job run`` (the coordinator, in its own
process, launching containers that are each their own Spark application) on
the embedded log, then compares the sink's rows with a single key-ordered
pass over the same records. The click-count job emits ``(user, clicks, partition,
offset)`` for every record it applies, so equal row *sets* mean nothing was
lost, no record was applied to the keyed state twice (it would show under
another count) and each user's records were applied in offset order.
Output is at-least-once, so rows may repeat across generations; sets ignore
that. The stateful story runs three times: with its checkpoints and output on
the local disk, on a real HDFS and on a real S3 server (every fork, snapshot
and publish a copy or a commit there).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_runner import run_cli
from jobs import (
    APPLY_DEADLINE_S,
    CHANGE_DEADLINE_S,
    RECORDS,
    RunningJob,
    all_applied,
    counts_in_key_order,
    job_files,
    produce,
    published_batches,
    wait_until,
    writes_by,
)
from pyspark.sql import SparkSession
from standins import alive

from spark_elastic import EmbeddedLog

# Long (`make test-all`): the same changes as the stateful stories on Kafka
# (test_job_run_kafka.py: `make test` runs the fence, the live scale and the split; the
# growth, restart, failover and crash are its long story's, proven in `make test` as its
# docstring says).
pytestmark = [pytest.mark.slow, pytest.mark.long]


# `cloud`: a real object store, opt-in (SPARK_ELASTIC_CLOUD; skipped without it).
@pytest.mark.parametrize("where", ["local", "hdfs", "s3", "cloud"])
def test_a_stateful_job_fences_fails_over_survives_a_restart_grows_and_changes_live(
    request: pytest.FixtureRequest,
    spark: SparkSession,
    start_job: Callable[..., RunningJob],
    clicks: Path,
    monkeypatch: pytest.MonkeyPatch,
    where: str,
) -> None:
    # One start-up for every story of a running stateful job (the suite's budget): the
    # initial assignment, a paused container fenced (SIGSTOP: a zombie), a killed one
    # (SIGKILL), a coordinator restart, growth, then live changes. Every running count is
    # checked at the end against a single key-ordered pass over the log: nothing lost,
    # nothing applied twice, each key's records in order.
    # With its checkpoints and output on HDFS or S3 (`where`), nothing of them on the local
    # disk, each of those steps copies there what the local disk links or renames.
    monkeypatch.setenv("CLICKS_FACTOR", "2")  # 4 partitions x 2: 8 tasks
    files = job_files(request, spark, monkeypatch, where)
    reader = files.spark  # reads output off the local disk
    options = ("--partition-check-ms", "500", *files.options)
    job = start_job(3, None, 0, *options)
    running = wait_until(
        "three running containers",
        lambda: len(job.running_containers()) == 3 and job.running_containers(),
    )
    model_tasks = {c["containerId"]: c["tasks"] for c in job.job_model()["containers"]}
    tasks = [set(t) for t in model_tasks.values()]
    assert sorted(len(t) for t in tasks) == [2, 3, 3]
    assert len(set().union(*tasks)) == sum(len(t) for t in tasks) == 8  # each task once
    zombie, zombie_pid = min(running.items())
    log = EmbeddedLog(clicks / "log")
    total = RECORDS

    wait_until("a first batch published", lambda: published_batches(job.out, zombie, reader))
    os.kill(zombie_pid, signal.SIGSTOP)
    try:
        # New records for every task: the zombie would have work the moment it wakes up.
        produce(log, total, 2000)
        total += 2000
        wait_until(
            "the paused container's tasks handed to a new generation",
            lambda: zombie not in {c["containerId"] for c in job.job_model()["containers"]},
        )
        before = published_batches(job.out, zombie, reader)
    finally:
        # The coordinator SIGKILLs a container it failed over, and reaps it: by now the
        # paused one may be gone altogether.
        with contextlib.suppress(ProcessLookupError):
            os.kill(zombie_pid, signal.SIGCONT)
    wait_until("the fenced container to exit", lambda: not alive(zombie_pid), timeout=60)
    assert published_batches(job.out, zombie, reader) == before
    assert zombie in json.dumps(job.status().get("events", []))

    # The victim is chosen now, among the containers running and writing: on a loaded host
    # Spark itself may have failed one over already (a Python worker that did not connect
    # back within Spark's fixed 10 s), and that one's tasks have moved on.
    victim, victim_pid = wait_until(
        "a running container that has written a batch",
        lambda: next(
            (
                (c, pid)
                for c, pid in sorted(job.running_containers().items())
                if (
                    writes_by(clicks / "out", c)
                    if reader is None
                    else published_batches(job.out, c, reader)
                )
            ),
            None,
        ),
        APPLY_DEADLINE_S,
    )
    victim_tasks = next(
        c["tasks"] for c in job.job_model()["containers"] if c["containerId"] == victim
    )
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
    assert set(replacement["tasks"]) == set(victim_tasks)
    wait_until("every record applied", all_applied(job, total, reader), APPLY_DEADLINE_S)

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
    wait_until("every record applied", all_applied(again, total, reader), APPLY_DEADLINE_S)
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
    wait_until("every record applied", all_applied(again, total, reader), APPLY_DEADLINE_S)

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
            lambda n=containers: (m := again.settled_model()) and len(m["containers"]) == n and m,
            timeout=CHANGE_DEADLINE_S,
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
    wait_until("every record applied", all_applied(again, total, reader), APPLY_DEADLINE_S)
    # Nothing lost, nothing applied twice, each key's records in order: its old partition's
    # records before its new partition's, each in offset order.
    assert again.output_rows(reader) == counts_in_key_order(spark, clicks, planned=4)
    # Each live change's new owners took their tasks in the query that replayed them.
    ways = again.takeovers()
    assert {ways.get(c) for c in warmed} == {"replay"}, ways
    files.delete()
