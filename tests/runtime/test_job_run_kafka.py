"""A stateful job from Kafka to Kafka, and a stateless one, through what a running job meets
on a real broker.

`make test`'s story: a paused container fenced, a live scale, a live split and
the consumer group's lag. `make test-all` adds a coordinator restart, a killed
container failed over, the topic's growth 4 -> 8, a merge and a broker crash
(proven in `make test` elsewhere: ``test_job_operable.py``, the fault test's
schedules, ``test_kafka_outage.py``, ``test_kafka_sink.py``, the in-process
specs), the broker away 75 s, and the stateless job's story. The click-count job
(``examples/jobs/click_counts.py`` with ``CLICKS_KAFKA`` and ``CLICKS_OUT_TOPIC``)
reads a topic of the session's broker
(the ``kafka`` fixture: Kafka 4, KRaft, on 127.0.0.1) through Spark's Kafka
source held at a gate (``KafkaInput``'s default ``gated`` reader: moved
tasks warm up by replaying behind the gate; the containers get the jars
``make jars`` put in .cache/jars/spark-kafka), and writes its rows to
another topic through
an exactly-once ``KafkaSink``. Records are produced with librdkafka's
``murmur2_random`` partitioner, which is Java's. As on the embedded log
(``test_job_run.py``), what a ``read_committed`` consumer of the output
reads is compared at the end with a single key-ordered pass over what the
broker holds, row for row: nothing lost, nothing applied or published
twice, each key's records in order. The stateless job
(``examples/jobs/click_tasks.py`` with ``CLICKS_KAFKA``) goes through a
failover, a split and a scale, and its Parquet rows are compared with the
plan's task for each record the broker holds.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import kafka_jvm
import pytest
from cli_runner import run_cli
from jobs import (
    APPLY_DEADLINE_S,
    CHANGE_DEADLINE_S,
    RECORDS,
    TASKS_JOB,
    RunningJob,
    key_ordered_counts,
    tagged_rows,
    wait_until,
)
from kafka_clicks import (
    OPTIONS,
    OUT,
    TOPIC,
    all_published,
    change_factor,
    group_at_end,
    grow,
    produce,
    published_rows,
    records_on,
    start_on_kafka,
)
from pyspark.sql import SparkSession
from standins import alive

from spark_elastic import with_virtual_tasks
from spark_elastic.runtime.growth import grown_plan

pytestmark = pytest.mark.slow


@pytest.fixture
def clicks(tmp_path: Path) -> Path:
    """The job's files (checkpoints, sink, store); its input is the broker's topic."""
    return tmp_path


def test_a_stateful_job_on_kafka_fences_a_zombie_and_scales_and_splits_live_exactly(
    kafka: kafka_jvm.KafkaBroker,
    start_job: Callable[..., RunningJob],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    job, records, running = start_on_kafka(kafka, start_job, monkeypatch, TOPIC, OUT)

    # A container paused past its lease (SIGSTOP: a zombie): its tasks go to a new
    # generation, and woken, it publishes nothing more (the lease, and the broker fencing
    # its transactional id once the successor's producer starts under it).
    zombie, zombie_pid = sorted(running.items())[1]
    os.kill(zombie_pid, signal.SIGSTOP)
    try:
        records.produce(2000)
        wait_until(
            "the paused container's tasks handed to a new generation",
            lambda: zombie not in {c["containerId"] for c in job.job_model()["containers"]},
        )
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(zombie_pid, signal.SIGCONT)
    wait_until("the fenced container to exit", lambda: not alive(zombie_pid), timeout=60)
    assert zombie in json.dumps(job.status().get("events", []))
    wait_until(
        "every record applied", all_published(kafka.bootstrap, records.total), APPLY_DEADLINE_S
    )

    # 2 -> 3 containers while records arrive: the new owners warm up first, replaying their
    # old owners' records behind the source's gate, and keyed state moves with its tasks.
    before = {c["containerId"] for c in job.job_model()["containers"]}
    scaled = run_cli("job", "scale", job.url, "--containers", "3")
    assert scaled.returncode == 0, scaled.stderr
    records.produce(1000)
    after = wait_until(
        "3 containers",
        lambda: (m := job.settled_model()) and len(m["containers"]) == 3 and m,
        timeout=CHANGE_DEADLINE_S,
    )
    warmed = {c["containerId"] for c in after["containers"]} - before
    job.status()  # records the new containers' pids for cleanup
    records.produce(1000)

    # A live split, factor 2 -> 4, while records arrive: each new group warms up by
    # replaying, its state split from its old owners'. (The merge back, on Kafka, is
    # `make test-all`'s: test_a_stateful_job_on_kafka_survives_a_restart_a_kill_growth_...)
    warmed |= change_factor(job, 4, lambda: records.produce(1000))
    records.produce(1000)
    wait_until(
        "every record applied", all_published(kafka.bootstrap, records.total), APPLY_DEADLINE_S
    )

    # Kafka's own tools show the job's lag: its consumer group (named for the job) holds,
    # for every partition, where every task reading it has got to: the end, by now. (The
    # autoscaler's story runs a job of the same name on another topic of this broker.)
    group_at_end(kafka.bootstrap, TOPIC)

    expected = key_ordered_counts(records_on(kafka.bootstrap, TOPIC, records.total), planned=4)
    assert len(expected) == records.total
    assert published_rows(kafka.bootstrap) == expected
    ways = job.takeovers()
    assert {ways.get(c) for c in warmed} == {"replay"}, ways


AGAIN, AGAIN_OUT = "clicks-again", "click-counts-again"  # the long story's topics


# Long (`make test-all`): on Kafka, what `make test` proves elsewhere: a coordinator restart,
# a failover and a merge (the operable story, the in-process specs), the topic's growth
# (test_kafka_broker.py, test_kafka_source.py, the fault test's schedules) and a broker crash
# (test_kafka_outage.py, test_kafka_sink.py, the fault test's schedules).
@pytest.mark.long
def test_a_stateful_job_on_kafka_survives_a_restart_a_kill_growth_a_split_a_merge_and_a_crash(
    kafka: kafka_jvm.KafkaBroker,
    start_job: Callable[..., RunningJob],
    clicks: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    job, records, running = start_on_kafka(kafka, start_job, monkeypatch, AGAIN, AGAIN_OUT)

    # The coordinator dies and comes back on its address while records arrive: the same
    # containers go on, nothing relaunched.
    job.process.send_signal(signal.SIGKILL)
    job.process.wait(30)
    records.produce(1000)
    port = int(job.url.rsplit(":", 1)[1])
    again = start_job(2, clicks / "coordinator.db", port, *OPTIONS)
    again.pids.update(job.pids)
    job = again
    wait_until("every record applied", records.applied(AGAIN_OUT), APPLY_DEADLINE_S)
    assert job.running_containers() == running

    # A container killed outright: its tasks go on from its last Kafka offsets checkpointed.
    victim, victim_pid = sorted(running.items())[0]
    wait_until(
        "a first batch written",
        lambda: any(
            c["containerId"] == victim and c["lastBatch"] is not None
            for c in job.status()["containers"]
        ),
    )
    os.kill(victim_pid, signal.SIGKILL)
    records.produce(2000)
    wait_until(
        "a new container forked from the killed one's checkpoint",
        lambda: any(
            victim in source for c in job.job_model()["containers"] for source in c["sources"]
        ),
    )
    wait_until("every record applied", records.applied(AGAIN_OUT), APPLY_DEADLINE_S)

    # The topic grows 4 -> 8 through CreatePartitions, with a backlog in the old partitions:
    # the old partitions drain to what they held before anything in the new ones is read.
    records.produce(4000)
    grow(kafka.bootstrap, 8, AGAIN)
    records.produce(2000)
    wait_until(
        "the job model grown to 8 partitions",
        lambda: job.job_model()["partitions"] == {AGAIN: 8},
        timeout=240,
    )
    wait_until("every record applied", records.applied(AGAIN_OUT), APPLY_DEADLINE_S)

    # A live split, factor 2 -> 4, then a merge back to 2, each while records arrive: each
    # new group warms up by replaying, its state split or merged from its old owners'.
    warmed: set[str] = set()
    for factor in (4, 2):
        warmed |= change_factor(job, factor, lambda: records.produce(1000))
        records.produce(1000)
    wait_until("every record applied", records.applied(AGAIN_OUT), APPLY_DEADLINE_S)
    ways = job.takeovers()
    assert {ways.get(c) for c in warmed} == {"replay"}, ways

    # The broker crashes (SIGKILL) and comes back on its port with its files, while the job
    # runs: the status page says the input was lost and is back, and once records flow
    # again nothing is lost or applied twice.
    def said(detail: str) -> Callable[[], bool]:
        return lambda: any(
            e["kind"] == "partitions" and detail in e["detail"] for e in job.status()["events"]
        )

    kafka.kill()
    try:
        wait_until("the input's loss on the status page", said("check failed: InputError"), 60)
    finally:
        kafka.restart()  # the session's broker: later specs of this worker use it
    records.produce(1000)
    wait_until("every record applied", records.applied(AGAIN_OUT), APPLY_DEADLINE_S)
    wait_until("the input's return on the status page", said("the input answers again"), 60)
    expected = key_ordered_counts(records_on(kafka.bootstrap, AGAIN, records.total), planned=4)
    assert published_rows(kafka.bootstrap, AGAIN_OUT) == expected


AWAY, AWAY_OUT = "clicks-away", "click-counts-away"  # the long outage's topics
AWAY_S = 75  # how long the broker stays away once the coordinator says so


# Long (`make test-all`): `make test` restarts the broker at once (the story above) and in a
# row during a scale (test_kafka_outage.py); the fault test's schedules keep it away 0-15 s.
@pytest.mark.long
def test_a_stateful_job_rides_out_a_broker_away_75_s_under_a_backlog_without_a_failover(
    kafka: kafka_jvm.KafkaBroker,
    start_job: Callable[..., RunningJob],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    job, records, running = start_on_kafka(kafka, start_job, monkeypatch, AWAY, AWAY_OUT)
    # A backlog, so that batches are being published when the broker dies: before the sink
    # rode out an outage, each container failed in it 30 s later, and its successor at start.
    records.produce(20_000)
    kafka.kill()
    try:
        wait_until(
            f"the broker away {AWAY_S} s by the coordinator's count",
            lambda: (job.status()["input"]["failingForS"] or 0) >= AWAY_S,
            timeout=AWAY_S + 120,
        )
        assert job.running_containers() == running
    finally:
        kafka.restart()
    records.produce(1000)
    wait_until("every record applied", records.applied(AWAY_OUT), APPLY_DEADLINE_S)
    assert job.running_containers() == running  # the same containers: none failed over
    assert job.status()["counters"].get("failovers", 0) == 0
    expected = key_ordered_counts(records_on(kafka.bootstrap, AWAY, records.total), planned=4)
    assert published_rows(kafka.bootstrap, AWAY_OUT) == expected


TAGGED = "tagged-clicks"  # the stateless job's topic on the session's broker


def tasks_of(
    spark: SparkSession, records: list[tuple[bytes, int, int]], factor: int
) -> dict[tuple[str, int, int], str]:
    """``{(user, partition, offset): task}``: each record's virtual task at ``factor`` (2
    partitions planned), by the plan and hash the job's containers route with."""
    plan = grown_plan("partition", factor, {TAGGED: 2}, {TAGGED: 2})
    df = spark.createDataFrame(
        [(key, TAGGED, partition, offset) for key, partition, offset in records],
        "key binary, topic string, partition int, offset long",
    )
    tagged = df.transform(with_virtual_tasks(plan=plan, route=False))
    return {
        (r.key.decode(), r.partition, r.offset): r.virtual_task
        for r in tagged.select("key", "partition", "offset", "virtual_task").collect()
    }


# Long (`make test-all`): the stateless job's changes; on Kafka, `make test` runs the
# stateful story.
@pytest.mark.long
def test_a_stateless_job_on_kafka_publishes_each_record_once_through_failover_scale_and_split(
    spark: SparkSession,
    kafka: kafka_jvm.KafkaBroker,
    start_job: Callable[..., RunningJob],
    clicks: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The stateless job (examples/jobs/click_tasks.py: every click tagged with its virtual
    # task, to Parquet) on 3 containers reading 2 partitions at factor 4 through
    # the gated reader: a container killed, a live split to factor 8, a scale 3 -> 2, each
    # while records arrive. Each record's row is published once, tagged with its task at
    # the factor in force when it was read.
    kafka_jvm.create_topics(kafka.bootstrap, {TAGGED: 2})
    produce(kafka.bootstrap, TAGGED, 0, RECORDS)
    total = RECORDS
    monkeypatch.setenv("CLICKS_KAFKA", kafka.bootstrap)
    monkeypatch.setenv("CLICKS_TOPIC", TAGGED)
    job = start_job(3, None, 0, job=TASKS_JOB)
    out = clicks / "tasks-out"

    def all_tagged(count: int) -> Callable[[], bool]:
        return lambda: len({r[:3] for r in tagged_rows(out)}) >= count

    wait_until("every record tagged", all_tagged(total), APPLY_DEADLINE_S)
    running = wait_until(
        "three running containers",
        lambda: len(job.running_containers()) == 3 and job.running_containers(),
    )

    victim, victim_pid = sorted(running.items())[0]
    os.kill(victim_pid, signal.SIGKILL)
    produce(kafka.bootstrap, TAGGED, total, 1000)
    total += 1000
    wait_until(
        "the killed container's tasks given to a successor",
        lambda: victim not in {c["containerId"] for c in job.job_model()["containers"]},
        timeout=CHANGE_DEADLINE_S,
    )
    wait_until("every record tagged", all_tagged(total), APPLY_DEADLINE_S)

    for option, value, settled in (
        ("--elasticity-factor", "8", lambda m: m["elasticityFactor"] == 8),
        ("--containers", "2", lambda m: len(m["containers"]) == 2),
    ):
        changed = run_cli("job", "scale", job.url, option, value)
        assert changed.returncode == 0, changed.stderr
        produce(kafka.bootstrap, TAGGED, total, 1000)
        total += 1000
        wait_until(
            f"{option} {value}",
            lambda s=settled: (m := job.settled_model()) and s(m),
            timeout=CHANGE_DEADLINE_S,
        )
        job.status()  # records the new containers' pids for cleanup
    produce(kafka.bootstrap, TAGGED, total, 1000)
    total += 1000
    wait_until("every record tagged", all_tagged(total), APPLY_DEADLINE_S)

    records = records_on(kafka.bootstrap, TAGGED, total)
    at = {factor: tasks_of(spark, records, factor) for factor in (4, 8)}
    rows = tagged_rows(out)
    assert sorted(r[:3] for r in rows) == sorted(at[4])  # each record's row once
    assert [r for r in rows if r[3] not in (at[4][r[:3]], at[8][r[:3]])] == []
    assert any(r[3] == at[8][r[:3]] and r[3] != at[4][r[:3]] for r in rows)
