"""The autoscaler on real containers: a load step scales a stateful job out once and back once.

``spark-elastic job run`` runs the click-count job (8 stateful tasks) on one
container; the autoscaler (1-2 containers) is turned on once it is at rest.
Each micro-batch reads at most 100 records and the trigger is 1 s, so one
container can never apply more than 100 records a second: a step to 400 a
second is more than it can carry on any machine. The job is at rest before
and after the step (so the warm-ups, each its own Spark application, get
the machine's cores); a few records arrive during each move. Every move
goes through KIP-441 warm-ups, here in ``--warm-up-mode snapshot`` (the
mode of an input without a gate, such as Kafka read by Spark's own source:
the warm-up renews a copy of its old owners' state and starts its query at
the handover); ``test_job_run.py`` moves tasks through replaying warm-ups.
The story runs on the embedded log and on a topic of the session's Kafka
broker read through the gated reader (:data:`INPUTS`; ``make test-all``). At the
end, the sink's rows are compared with a single key-ordered pass over the same records: nothing
lost, nothing applied twice, each key's records in order.
(``benchmarks/bench_autoscale.py`` runs a x4 step from a steady load,
against a fixed-size job.)
"""

from __future__ import annotations

import threading
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kafka_clicks
import kafka_jvm
import pytest
from jobs import (
    APPLY_DEADLINE_S,
    CHANGE_DEADLINE_S,
    RunningJob,
    all_applied,
    counts_in_key_order,
    key_ordered_counts,
    produce,
    wait_until,
)
from pyspark.sql import SparkSession
from standins import call

from spark_elastic import EmbeddedLog

# Long (`make test-all`): the autoscaler's story; `make test` runs its policy and glue
# in-process (test_autoscaler.py, test_autoscale.py).
pytestmark = [pytest.mark.slow, pytest.mark.long]

INITIAL = 300
BATCH = 100  # records a micro-batch reads at most; with the 1 s trigger, 100 a second
STEP = 400  # records a second


class Clicks:
    """Where the job reads its clicks: 2 partitions of the embedded log, or of a Kafka topic."""

    def __init__(self, root: Path, kafka: kafka_jvm.KafkaBroker | None) -> None:
        self.root, self.kafka = root, kafka
        if kafka is None:
            self.log = EmbeddedLog(root / "log")
            self.log.create_topic("clicks", 2)
        else:
            self.topic = f"autoscale-{uuid.uuid4().hex[:8]}"
            kafka_jvm.create_topics(kafka.bootstrap, {self.topic: 2})
            self.producer = kafka_clicks.producer(kafka.bootstrap)

    def env(self) -> dict[str, str]:
        """What points ``examples/jobs/click_counts.py`` at them."""
        if self.kafka is None:
            return {}
        return {"CLICKS_KAFKA": self.kafka.bootstrap, "CLICKS_TOPIC": self.topic}

    def produce(self, start: int, count: int) -> None:
        if self.kafka is None:
            produce(self.log, start, count)
        else:
            kafka_clicks.produce(self.producer, self.topic, start, count)

    def expected(self, spark: SparkSession, total: int) -> list[tuple[str, int, int, int]]:
        """The click-count rows of a single key-ordered pass over the ``total`` records."""
        if self.kafka is None:
            return counts_in_key_order(spark, self.root, planned=2)
        records = kafka_clicks.records_on(self.kafka.bootstrap, self.topic, total)
        return key_ordered_counts(records, planned=2)


INPUTS = ["log", "kafka"]
"""The story's inputs (on Kafka it passed alone in 290 s, and 616 s beside the other stories)."""


@pytest.fixture(params=INPUTS)
def source(request: pytest.FixtureRequest, tmp_path: Path) -> Clicks:
    """A few clicks over 2 partitions, of the embedded log or of the session's broker."""
    kafka = request.getfixturevalue("kafka") if request.param == "kafka" else None
    clicks = Clicks(tmp_path, kafka)
    clicks.produce(0, INITIAL)
    return clicks


@pytest.fixture
def clicks(source: Clicks) -> Path:
    """The job's files (``start_job`` runs on them, in place of the shared fixture's log)."""
    return source.root


class Load(threading.Thread):
    """Produces ``rate`` click records a second, a tenth of a second's worth at a time.

    The pacing is the load itself, not a wait for something: specs wait on
    conditions.
    """

    def __init__(self, source: Clicks, start: int, rate: int) -> None:
        super().__init__(daemon=True)
        self.source, self.next, self.rate = source, start, rate
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(0.1):
            due = self.rate // 10
            self.source.produce(self.next, due)
            self.next += due

    def stop(self) -> int:
        """Stop producing; the index of the next record (so the count of all produced)."""
        self.stopping.set()
        self.join()
        return self.next


def autoscaler_actions(job: RunningJob) -> list[str]:
    """The autoscaler's actions among the newest events, oldest first (not its holds)."""
    actions = ("autoscaler scale", "autoscaler split", "autoscaler merge")
    return [
        e["detail"]
        for e in reversed(job.status()["events"])
        if e["kind"] == "autoscale" and e["detail"].startswith(actions)
    ]


def actions_taken(job: RunningJob) -> dict[str, float]:
    """``{action: count}`` of every action since the start, from ``/metrics``."""
    with urllib.request.urlopen(f"{job.url}/metrics", timeout=5) as response:
        text = response.read().decode()
    prefix = 'spark_elastic_autoscaler_actions_total{action="'
    return {
        line[len(prefix) :].split('"')[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(prefix)
    }


def settled(job: RunningJob, containers: int) -> Callable[[], dict[str, Any] | None]:
    """A condition: no change in flight and the job model has ``containers`` containers."""

    def check() -> dict[str, Any] | None:
        model = job.settled_model()
        return model if model and len(model["containers"]) == containers else None

    return check


def test_a_load_step_scales_a_stateful_job_out_once_and_back_once(
    spark: SparkSession,
    start_job: Callable[..., RunningJob],
    source: Clicks,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CLICKS_BATCH", str(BATCH))
    for name, value in source.env().items():
        monkeypatch.setenv(name, value)
    job = start_job(
        1,
        None,
        0,
        *("--autoscale-max", "2", "--autoscale-busy-lag", str(BATCH)),
        *("--autoscale-drain-ms", "3000", "--autoscale-window-ms", "2000"),
        *("--autoscale-cooldown-ms", "10000"),
        *("--warm-up-mode", "snapshot"),  # the other mode's end-to-end proof
    )
    wait_until("the first records applied", all_applied(job, INITIAL))
    # On once the job is at rest (its first records are a backlog a loaded machine may be
    # slow to drain), with the processing rate over 10 s, not 30: the scale-in comes sooner.
    assert call(f"{job.url}/autoscaler", {"enabled": True, "rateWindowS": 10})[0] == 200
    # At rest the job is steady on one container: the policy has its data (every task's
    # lag, the container's rate, from the reports of its idle triggers) and wants nothing.
    wait_until(
        "a steady decision",
        lambda: (job.status()["autoscaler"]["lastDecision"] or {}).get("rule") == "steady",
    )
    assert autoscaler_actions(job) == []

    load = Load(source, INITIAL, STEP)
    load.start()
    try:
        (out,) = wait_until("a scale-out", lambda: autoscaler_actions(job))
    finally:
        total = load.stop()  # the step ends with the reaction to it
    assert out.startswith("autoscaler scale-out to 2: lagging"), out
    # KIP-441: the new owners (a container's query runs a fixed set of tasks, so both
    # halves get one) warm up while the old one keeps every task, and has work meanwhile.
    pending = job.job_model()
    assert [len(c["tasks"]) for c in pending["containers"]] == [8]
    assert [len(w["tasks"]) for w in pending["warmups"]] == [4, 4]
    source.produce(total, 100)
    total += 100
    wait_until("two containers own the tasks", settled(job, 2), timeout=CHANGE_DEADLINE_S)

    # The step is over: once the backlog is drained and the rate window shows it, one
    # container is enough again.
    wait_until("a scale-in", lambda: len(autoscaler_actions(job)) == 2, timeout=CHANGE_DEADLINE_S)
    back = autoscaler_actions(job)[1]
    assert back.startswith("autoscaler scale-in to 1: underused"), back
    source.produce(total, 100)  # for the old owners while their successor warms up
    total += 100
    last = wait_until("one container owns the tasks", settled(job, 1), timeout=CHANGE_DEADLINE_S)
    assert [len(c["tasks"]) for c in last["containers"]] == [8]
    source.produce(total, 100)  # for the last owner, with the state it took over
    total += 100
    wait_until("every record applied", all_applied(job, total), APPLY_DEADLINE_S)
    # One action for the step and one after it: no flapping.
    assert {a: n for a, n in actions_taken(job).items() if n} == {"scale-out": 1, "scale-in": 1}
    assert job.output_rows() == source.expected(spark, total)
    # Three warm-ups (two for the scale-out, one for the scale-in), none of them replaying:
    # each started from the state it followed, or from checkpoints its owners committed past.
    ways = job.takeovers()
    assert len(ways) == 3, ways
    assert set(ways.values()) <= {"snapshot", "checkpoints"}, ways
    job.status()  # records the containers' pids for cleanup
