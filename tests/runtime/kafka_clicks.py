"""The end-to-end specs' clicks on a Kafka broker: produced as the embedded log's, read back,
and the steps the Kafka stories share.

Keys and values are those of :func:`jobs.produce` (``user-N``, ``click-N``),
partitioned by librdkafka's ``murmur2_random``, which is Java's producer's
partitioner; :func:`records_on` reads what the broker holds for the single
key-ordered pass the stories compare with. :func:`start_on_kafka` starts the
click count on two containers over a topic of the session's broker,
:func:`grow` adds partitions, :func:`change_factor` splits or merges live, and
:func:`published_rows` reads the output with ``read_committed``
(``test_job_run_kafka.py``'s stories, ``test_kafka_faults.py``'s seeded one).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING

import kafka_jvm
import pytest
from cli_runner import run_cli
from jobs import APPLY_DEADLINE_S, CHANGE_DEADLINE_S, RECORDS, USERS, RunningJob, wait_until

if TYPE_CHECKING:
    from confluent_kafka import Producer

TOPIC = "clicks"  # the example job's topic; no other spec of the session's broker uses it
OUT = "click-counts"  # where it writes
TIMEOUT = 30.0
OPTIONS = ("--partition-check-ms", "500")  # the coordinator's, for growth within the story


def producer(bootstrap: str) -> Producer:
    """A producer that partitions keys as Kafka's Java producer does."""
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random"})


def produce(bootstrap: str | Producer, topic: str, start: int, count: int) -> None:
    """Clicks ``start .. start+count-1`` to ``topic``, through ``bootstrap``'s broker (or
    a producer of :func:`producer`), flushed before it returns."""
    sender = producer(bootstrap) if isinstance(bootstrap, str) else bootstrap
    for i in range(start, start + count):
        sender.produce(topic, key=f"user-{(i * 7919) % USERS}".encode(), value=f"click-{i}")
    assert sender.flush(TIMEOUT) == 0


def records_on(bootstrap: str, topic: str, count: int) -> list[tuple[bytes, int, int]]:
    """``(key, partition, offset)`` of the topic's ``count`` records, read back from the broker."""
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    partitions = admin.list_topics(topic, timeout=TIMEOUT).topics[topic].partitions
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "spec-reads", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    found: dict[tuple[int, int], bytes] = {}

    def read() -> bool:
        for message in consumer.consume(num_messages=count, timeout=0.5):
            if message.error() is None:
                found[message.partition(), message.offset()] = message.key()
        return len(found) >= count

    try:
        wait_until(f"{count} records read back from the broker", read)
    finally:
        consumer.close()
    return [(key, partition, offset) for (partition, offset), key in found.items()]


def grow(bootstrap: str, partitions: int, topic: str = TOPIC) -> None:
    """Add partitions to ``topic`` with Kafka's CreatePartitions; returns once the metadata
    lists them."""
    from confluent_kafka.admin import AdminClient, NewPartitions

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_partitions([NewPartitions(topic, partitions)]).values():
        future.result(timeout=TIMEOUT)
    wait_until(
        f"{partitions} partitions listed",
        lambda: (
            len(admin.list_topics(topic, timeout=TIMEOUT).topics[topic].partitions) == partitions
        ),
    )


def published_rows(bootstrap: str, out: str = OUT) -> list[tuple[str, int, int, int]]:
    """The job's rows a ``read_committed`` consumer of the output reads, to its end, sorted."""
    rows = [json.loads(value or b"{}") for value in kafka_jvm.read_to_end(bootstrap, out)]
    return sorted((r["user"], r["clicks"], r["partition"], r["offset"]) for r in rows)


def all_published(bootstrap: str, total: int, out: str = OUT) -> Callable[[], bool]:
    """Whether the output holds a row for each of ``total`` records (repeats not counted)."""
    return lambda: len({(u, p, o) for u, _, p, o in published_rows(bootstrap, out)}) >= total


def change_factor(job: RunningJob, factor: int, meanwhile: Callable[[], None]) -> set[str]:
    """``job scale --elasticity-factor``, ``meanwhile`` run as it starts, the change settled:
    the containers that warmed up for it.

    The tasks are still those of the 4 partitions planned (SEP-5: growth maps onto them).
    """
    before = {c["containerId"] for c in job.job_model()["containers"]}
    changed = run_cli("job", "scale", job.url, "--elasticity-factor", str(factor))
    assert changed.returncode == 0, changed.stderr
    meanwhile()
    after = wait_until(
        f"factor {factor}",
        lambda: (m := job.settled_model()) and m["elasticityFactor"] == factor and m,
        timeout=CHANGE_DEADLINE_S,
    )
    assert sorted(t for c in after["containers"] for t in c["tasks"]) == sorted(
        f"Partition {p}_{b}_{factor}" for p in range(4) for b in range(factor)
    )
    job.status()  # records the new containers' pids for cleanup
    return {c["containerId"] for c in after["containers"]} - before


class Clicks:
    """Records produced to the job's topic while it runs, counted."""

    def __init__(self, bootstrap: str, topic: str = TOPIC) -> None:
        self.bootstrap, self.topic, self.total = bootstrap, topic, 0

    def produce(self, count: int) -> None:
        produce(self.bootstrap, self.topic, self.total, count)
        self.total += count

    def applied(self, out: str = OUT) -> Callable[[], bool]:
        """Whether ``out`` holds a row for each record produced so far."""
        return all_published(self.bootstrap, self.total, out)


def start_on_kafka(
    kafka: kafka_jvm.KafkaBroker,
    start_job: Callable[..., RunningJob],
    monkeypatch: pytest.MonkeyPatch,
    topic: str,
    out: str,
) -> tuple[RunningJob, Clicks, dict[str, int]]:
    """The click count on 2 containers, factor 2 over ``topic``'s 4 partitions (8 tasks),
    writing to ``out``; returns once it has applied the first records, with the containers
    running then (one that failed at its start, as Spark's fixed 10 s wait for a Python
    worker can make one do on a loaded machine, has been failed over meanwhile)."""
    kafka_jvm.create_topics(kafka.bootstrap, {topic: 4, out: 4})
    records = Clicks(kafka.bootstrap, topic)
    records.produce(RECORDS)
    monkeypatch.setenv("CLICKS_KAFKA", kafka.bootstrap)
    monkeypatch.setenv("CLICKS_TOPIC", topic)
    monkeypatch.setenv("CLICKS_OUT_TOPIC", out)
    monkeypatch.setenv("CLICKS_FACTOR", "2")
    job = start_job(2, None, 0, *OPTIONS)
    wait_until("every record applied", records.applied(out), APPLY_DEADLINE_S)
    running = wait_until(
        "two running containers",
        lambda: len(job.running_containers()) == 2 and job.running_containers(),
    )
    return job, records, running


def group_at_end(bootstrap: str, topic: str) -> dict[tuple[str, int], int]:
    """Wait until Kafka's own tools show the job's consumer group (``clicks``, named for the
    job) at the end of every partition of ``topic``; returns the ends.

    The group holds, for every partition, where every task reading it has got to. Other
    stories run jobs of the same name on other topics of the broker.
    """
    from spark_elastic import KafkaInput

    ends = {(topic, p): o for p, o in KafkaInput(bootstrap, (topic,)).end_offsets(topic).items()}
    wait_until(
        "the job's consumer group at the end of every partition",
        lambda: (
            {
                k: offset
                for k, (offset, _) in kafka_jvm.describe_group(bootstrap, "clicks").items()
                if k[0] == topic
            }
            == ends
        ),
        timeout=60,
    )
    return ends
