"""Faults in combination on Kafka, seeded: every record published once with its key's right
running count, and a coordinator that never dies by itself.

The schedule (``kafka_faults.plan_faults``) is pure and checked here without Spark.
The story runs it on the click count from Kafka to Kafka (``examples/jobs/click_counts.py``
on the session's broker, 2 containers at factor 2 over 4 partitions, an exactly-once
``KafkaSink``) while records arrive; at the end what a ``read_committed`` consumer reads
is compared with a single key-ordered pass over what the broker holds, row for row, and
Kafka's own tools show the job's group at the end of every partition.

``make test`` runs a short schedule (a combination and one more fault) of one seed,
random unless ``SPARK_ELASTIC_FAULT_SEEDS`` names them, and prints it; ``make
test-all`` runs longer ones; ``make kafka-faults SEEDS="1 2 3"`` runs the long
schedules of chosen seeds. A seed that failed once is replayed by :data:`REPLAYED`.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from pathlib import Path

import kafka_jvm
import pytest
from jobs import RunningJob, key_ordered_counts
from kafka_clicks import group_at_end, published_rows, records_on, start_on_kafka
from kafka_faults import CHANGES, COMBINATIONS, FAULTS, Fault, FaultRun, Shape, plan_faults

SHORT, LONG = 2, 5
"""Steps of ``make test``'s schedule and of the longer ones."""
REPLAYED: tuple[int, ...] = (0,)
"""Seeds that failed once, replayed every run of ``make test-all``. Seed 0 (a coordinator
kill during a growth, two broker restarts in a row, a scale, a pause, two broker restarts):
the consumer group's offsets stayed behind for good, as the coordinator's kept admin client
timed out every group commit after a broker restart though the broker answered again
(``KafkaInput`` now drops a client whose call failed)."""


def seeds(default: list[int | None]) -> list[int | None]:
    """The seeds ``SPARK_ELASTIC_FAULT_SEEDS`` names, else ``default`` (None: a random one,
    drawn when the spec runs: xdist's workers must collect the same specs)."""
    named = os.environ.get("SPARK_ELASTIC_FAULT_SEEDS", "").split()
    return [int(s) for s in named] if named else default


@pytest.fixture
def clicks(tmp_path: Path) -> Path:
    """The job's files (checkpoints, store); its input is the broker's topic."""
    return tmp_path


# the schedule, pure


def test_a_seed_gives_the_same_schedule_and_starts_with_a_combination() -> None:
    for seed in range(200):
        schedule = plan_faults(seed, LONG)
        assert schedule == plan_faults(seed, LONG)
        assert len(schedule) == LONG
        first = schedule[0]
        during = None if first.during is None else first.during.kind
        assert (first.kind, during) in COMBINATIONS


def test_twenty_seeds_cover_every_combination_and_every_fault() -> None:
    schedules = [plan_faults(seed, LONG) for seed in range(20)]
    firsts = {(s[0].kind, None if s[0].during is None else s[0].during.kind) for s in schedules}
    assert firsts == set(COMBINATIONS)
    kinds = {f.kind for s in schedules for step in s for f in (step, step.during) if f}
    assert kinds == set(CHANGES + FAULTS)


def test_every_step_is_one_the_job_can_take() -> None:
    for seed in range(200):
        shape = Shape()
        for step in plan_faults(seed, LONG):
            for fault in (step, step.during):
                if fault is None:
                    continue
                if fault.kind == "scale":
                    assert 1 <= fault.arg <= 3
                if fault.kind == "grow":
                    assert not shape.grown, f"seed {seed} grows twice"
            assert step.kind != "scale" or step.arg != shape.containers
            assert step.kind != "factor" or step.arg != shape.factor
            shape = shape.after(step)


def test_a_fault_reads_as_what_happens() -> None:
    assert str(Fault("scale", 3, Fault("grow"))) == "scale 3 during which grow"
    assert str(Fault("brokers", 5)) == "brokers 5"


# the story


def run_seed(
    seed: int | None,
    steps: int,
    kafka: kafka_jvm.KafkaBroker,
    start_job: Callable[..., RunningJob],
    clicks: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if seed is None:
        seed = random.randrange(1_000_000)
    schedule = plan_faults(seed, steps)
    print(f"fault seed {seed}: {'; '.join(map(str, schedule))}", flush=True)
    topic, out = f"faults-{seed}-{os.getpid()}", f"faults-{seed}-{os.getpid()}-out"
    job, records, _ = start_on_kafka(kafka, start_job, monkeypatch, topic, out)
    run = FaultRun(kafka, start_job, clicks, job, records, out)
    run.run(schedule)

    expected = key_ordered_counts(records_on(kafka.bootstrap, topic, records.total), planned=4)
    assert len(expected) == records.total
    assert published_rows(kafka.bootstrap, out) == expected, f"fault seed {seed}"
    assert len(group_at_end(kafka.bootstrap, topic)) == (8 if run.shape.grown else 4)
    run.coordinator_alive()


@pytest.mark.slow
@pytest.mark.parametrize(
    "seed", seeds([None]), ids=lambda seed: f"seed-{'random' if seed is None else seed}"
)
def test_a_short_schedule_of_faults_on_kafka_publishes_every_record_once(
    seed: int | None,
    kafka: kafka_jvm.KafkaBroker,
    start_job: Callable[..., RunningJob],
    clicks: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run_seed(seed, SHORT, kafka, start_job, clicks, monkeypatch)


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.parametrize(
    "seed", seeds([*REPLAYED, None]), ids=lambda seed: f"seed-{'random' if seed is None else seed}"
)
def test_a_long_schedule_of_faults_on_kafka_publishes_every_record_once(
    seed: int | None,
    kafka: kafka_jvm.KafkaBroker,
    start_job: Callable[..., RunningJob],
    clicks: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run_seed(seed, LONG, kafka, start_job, clicks, monkeypatch)
