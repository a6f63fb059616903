"""KafkaSink: a micro-batch's rows published to a real Kafka broker in one fenced transaction.

Real Spark (the suite's session) builds each batch; the broker is the
session's (the ``kafka`` fixture: Kafka 4 in KRaft mode on 127.0.0.1), so
each spec writes a topic of its own. What consumers see is read back with
``isolation.level=read_committed``, as a downstream job would read it.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import kafka_jvm
import pytest
from pyspark.sql import SparkSession
from standins import wait_until

import udfs
from spark_elastic import BatchContext, KafkaSink
from spark_elastic.errors import ArgumentError, ArgumentTypeError, FencedError, SinkError
from spark_elastic.runtime import sinks

TIMEOUT = 30.0


def context(batch_id: int, fence: Callable[[], None] = lambda: None) -> BatchContext:
    return BatchContext(batch_id=batch_id, container_id="sink-c1", generation=1, fence=fence)


def read_back(
    bootstrap: str, topic: str, count: int, isolation: str = "read_committed"
) -> list[tuple[bytes | None, bytes | None, int]]:
    """``(key, value, partition)`` of the first ``count`` records a consumer of ``topic`` sees."""
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    partitions = admin.list_topics(topic, timeout=TIMEOUT).topics[topic].partitions
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"read-{topic}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    seen: list[tuple[bytes | None, bytes | None, int]] = []

    def read() -> bool:
        for message in consumer.consume(num_messages=count, timeout=0.5):
            if message.error() is None:
                seen.append((message.key(), message.value(), message.partition()))
        return len(seen) >= count

    try:
        wait_until(f"{count} records of {topic!r} read back", read)
    finally:
        consumer.close()
    return seen


def test_a_batch_is_one_transaction_of_json_rows_keyed_and_partitioned_as_java_does(
    spark: SparkSession, kafka: kafka_jvm.KafkaBroker
) -> None:
    kafka_jvm.create_topics(kafka.bootstrap, {"sink-json": 4})
    rows = [(f"user-{i}", i, 1.5 * i) for i in range(60)]
    batch = spark.createDataFrame(rows, "user string, clicks long, score double")
    KafkaSink(kafka.bootstrap, "sink-json", key="user").write(batch, context(0))

    seen = read_back(kafka.bootstrap, "sink-json", len(rows))
    assert sorted((k.decode(), json.loads(v)) for k, v, _ in seen if k and v) == sorted(
        (user, {"user": user, "clicks": clicks, "score": score}) for user, clicks, score in rows
    )
    keys = [k.decode() for k, _, _ in seen if k]
    assert [p for _, _, p in seen] == udfs.kafka_partitions(keys, 4).tolist()


def test_a_value_column_is_the_value_as_it_is_and_a_null_one_a_tombstone(
    spark: SparkSession, kafka: kafka_jvm.KafkaBroker
) -> None:
    kafka_jvm.create_topics(kafka.bootstrap, {"sink-values": 1})
    batch = spark.createDataFrame([("a", b"\x00raw"), ("b", None)], "id string, value binary")
    KafkaSink(kafka.bootstrap, "sink-values", key="id").write(batch, context(0))
    assert sorted(read_back(kafka.bootstrap, "sink-values", 2)) == [
        (b"a", b"\x00raw", 0),
        (b"b", None, 0),
    ]


def test_a_key_or_value_that_is_not_text_is_published_as_its_text(
    spark: SparkSession, kafka: kafka_jvm.KafkaBroker
) -> None:
    kafka_jvm.create_topics(kafka.bootstrap, {"sink-numbers": 1})
    batch = spark.createDataFrame([(7, 3), (8, None)], "id long, value int")
    KafkaSink(kafka.bootstrap, "sink-numbers", key="id").write(batch, context(0))
    assert sorted(read_back(kafka.bootstrap, "sink-numbers", 2)) == [
        (b"7", b"3", 0),
        (b"8", None, 0),
    ]
    kafka_jvm.create_topics(kafka.bootstrap, {"sink-keyless": 1})
    KafkaSink(kafka.bootstrap, "sink-keyless").write(batch.limit(1), context(0))
    assert read_back(kafka.bootstrap, "sink-keyless", 1) == [(None, b"3", 0)]


def test_a_batch_larger_than_the_producers_queue_waits_for_room_and_is_published_whole(
    spark: SparkSession, kafka: kafka_jvm.KafkaBroker
) -> None:
    # The records go in a tight loop; a full queue (here 50 messages) takes the waiting path.
    kafka_jvm.create_topics(kafka.bootstrap, {"sink-queue": 2})
    rows = [(f"user-{i}", i) for i in range(1_000)]
    batch = spark.createDataFrame(rows, "user string, clicks long")
    sink = KafkaSink(
        kafka.bootstrap,
        "sink-queue",
        key="user",
        kafka_options={"queue.buffering.max.messages": "50"},
    )
    sink.write(batch, context(0))
    seen = read_back(kafka.bootstrap, "sink-queue", len(rows))
    assert sorted(json.loads(v)["clicks"] for _, v, _ in seen if v) == list(range(1_000))


def test_a_batch_whose_fence_closes_publishes_nothing_and_the_next_one_publishes(
    spark: SparkSession, kafka: kafka_jvm.KafkaBroker
) -> None:
    kafka_jvm.create_topics(kafka.bootstrap, {"sink-fenced": 2})
    sink = KafkaSink(kafka.bootstrap, "sink-fenced", key="user")
    first = spark.createDataFrame([(f"zombie-{i}",) for i in range(10)], "user string")

    def closed() -> None:
        raise FencedError("lease expired 1.0 s ago")

    with pytest.raises(FencedError):
        sink.write(first, context(0, closed))
    second = spark.createDataFrame([(f"owner-{i}",) for i in range(10)], "user string")
    sink.write(second, context(1))

    # The fenced batch reached the broker (the fence sits between produce and commit) and
    # was aborted: only an uncommitted read sees it; a committed read sees the next batch.
    uncommitted = read_back(kafka.bootstrap, "sink-fenced", 20, "read_uncommitted")
    assert {k.decode().split("-")[0] for k, _, _ in uncommitted if k} == {"zombie", "owner"}
    committed = read_back(kafka.bootstrap, "sink-fenced", 10)
    assert sorted(k.decode() for k, _, _ in committed if k) == sorted(
        f"owner-{i}" for i in range(10)
    )


def test_a_successor_with_the_zombies_tasks_fences_its_transaction_in_the_broker(
    spark: SparkSession, kafka: kafka_jvm.KafkaBroker
) -> None:
    # The zombie passed its lease check and froze before its commit; meanwhile its
    # successor (another process: a producer of its own) took its tasks and read what
    # the sink published. The broker refuses the zombie's commit, whatever its lease said.
    kafka_jvm.create_topics(kafka.bootstrap, {"sink-zombie": 2})
    sink = KafkaSink(kafka.bootstrap, "sink-zombie", key="user")
    tasks = ("Partition 0_0_2", "Partition 1_0_2")
    covered = ((("clicks", 0, 0, 2), 40), (("clicks", 1, 0, 2), 35))
    first = spark.createDataFrame([(f"first-{i}",) for i in range(5)], "user string")
    sink.write(first, BatchContext(0, "c1", 1, lambda: None, covered, "zombies", tasks))
    published: list[object] = []

    def successor_takes_over() -> None:
        with sinks._PRODUCERS_LOCK:
            sinks._PRODUCERS.clear()  # the successor's process has producers of its own
        published.extend(sink.published("zombies", tasks))

    zombie = spark.createDataFrame([(f"zombie-{i}",) for i in range(5)], "user string")
    later = tuple((bucket, offset + 40) for bucket, offset in covered)
    with pytest.raises(SinkError, match=r"(?i)fenced"):
        sink.write(zombie, BatchContext(1, "c1", 1, successor_takes_over, later, "zombies", tasks))
    assert published == list(covered)  # the zombie's batch is not among what was published
    assert sink.published("zombies", tasks) == list(covered)
    committed = read_back(kafka.bootstrap, "sink-zombie", 5)
    assert sorted(k.decode() for k, _, _ in committed if k) == [f"first-{i}" for i in range(5)]


def test_what_an_aborted_batch_covered_is_not_published_and_reading_past_it_ends(
    spark: SparkSession, kafka: kafka_jvm.KafkaBroker
) -> None:
    # The progress topic holds only an aborted record and its transaction marker: a
    # successor's read of it ends, and finds nothing published.
    kafka_jvm.create_topics(kafka.bootstrap, {"sink-aborted": 1})
    sink = KafkaSink(kafka.bootstrap, "sink-aborted", key="user")
    tasks = ("Partition 0_0_1",)
    batch = spark.createDataFrame([("a",)], "user string")

    def closed() -> None:
        raise FencedError("lease expired 1.0 s ago")

    covered = ((("clicks", 0, 0, 1), 9),)
    with pytest.raises(FencedError):
        sink.write(batch, BatchContext(0, "c1", 1, closed, covered, "aborts", tasks))
    assert sink.published("aborts", tasks) == []


def test_a_missing_key_column_is_one_line_and_nothing_is_published(
    spark: SparkSession, kafka: kafka_jvm.KafkaBroker
) -> None:
    kafka_jvm.create_topics(kafka.bootstrap, {"sink-nokey": 1})
    batch = spark.createDataFrame([("a", 1)], "user string, clicks long")
    with pytest.raises(SinkError) as caught:
        KafkaSink(kafka.bootstrap, "sink-nokey", key="id").write(batch, context(0))
    assert str(caught.value) == (
        "KafkaSink.key: expected a column of the job's output, found 'id' not among "
        "['user', 'clicks']"
    )


def test_no_broker_is_one_line_naming_the_servers(spark: SparkSession) -> None:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
    batch = spark.createDataFrame([("a",)], "user string")
    with pytest.raises(SinkError) as caught:
        KafkaSink(address, "out", timeout_s=2, outage_s=5).write(batch, context(0))
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(
        "KafkaSink.bootstrap_servers: expected a Kafka broker that starts a transaction "
        f"within 2 s, found none at {address} ("
    )
    assert message.endswith("; asked again for up to 5 s)")  # a broker away rides that long


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"bootstrap_servers": "localhost"},
            ArgumentError,
            "KafkaSink.bootstrap_servers: expected 'host:port[,host:port...]', found 'localhost'",
        ),
        ({"topic": ""}, ArgumentError, "KafkaSink.topic: expected a topic name, found ''"),
        (
            {"topic": 3},
            ArgumentTypeError,
            "KafkaSink.topic: expected a topic name, found int 3",
        ),
        (
            {"key": 1},
            ArgumentTypeError,
            "KafkaSink.key: expected a column name or None, found int 1",
        ),
        (
            {"kafka_options": {"transactional.id": "x"}},
            ArgumentError,
            "KafkaSink.kafka_options: expected no 'transactional.id' (each container sets "
            "its own), found {'transactional.id': 'x'}",
        ),
        (
            {"timeout_s": 0},
            ArgumentError,
            "KafkaSink.timeout_s: expected a positive number of seconds, found 0",
        ),
        (
            {"guarantee": "exactly-once"},
            ArgumentError,
            "KafkaSink.guarantee: expected a guarantee this sink gives, found 'exactly-once' "
            "(valid choices: 'transactional', 'at-least-once')",
        ),
        (
            {"progress_topic": "out"},
            ArgumentError,
            "KafkaSink.progress_topic: expected a topic other than the output's, found 'out'",
        ),
    ],
)
def test_bad_arguments_are_one_line_naming_them(
    kwargs: dict[str, object], error: type[Exception], message: str
) -> None:
    arguments: dict[str, object] = {"bootstrap_servers": "127.0.0.1:9092", "topic": "out"}
    with pytest.raises(error) as caught:
        KafkaSink(**{**arguments, **kwargs})  # type: ignore[arg-type]
    assert str(caught.value) == message


def test_a_batch_written_while_the_broker_is_away_is_published_once_when_it_returns(
    spark: SparkSession, kafka: kafka_jvm.KafkaBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dataclasses
    import threading

    kafka_jvm.create_topics(kafka.bootstrap, {"sink-outage": 2})
    sink = KafkaSink(kafka.bootstrap, "sink-outage", key="user", timeout_s=2.0, outage_s=120)
    sink.write(spark.createDataFrame([("before-0",)], "user string"), context(0))
    tries: list[BaseException] = []
    away = sinks._broker_away

    def counted(exc: BaseException) -> bool:
        tries.append(exc)
        return away(exc)

    monkeypatch.setattr(sinks, "_broker_away", counted)
    after = spark.createDataFrame([(f"after-{i}",) for i in range(10)], "user string")
    kafka.kill()
    try:
        # Away longer than a sink allows: the batch fails, saying so.
        with pytest.raises(SinkError, match=r"^KafkaSink: batch 1 of sink-c1 was not published"):
            dataclasses.replace(sink, outage_s=3.0).write(after, context(1))
        tried = len(tries)
        failed: list[BaseException] = []

        def write() -> None:
            try:
                sink.write(after, context(1))
            except BaseException as exc:  # the spec's thread reports what it met
                failed.append(exc)

        writer = threading.Thread(target=write)
        writer.start()
        wait_until("two tries of the batch", lambda: len(tries) >= tried + 2, timeout=60)
    finally:
        kafka.restart()
    writer.join(120)
    assert not writer.is_alive()
    assert failed == []
    # Each record once, though the batch was sent in several transactions.
    committed = read_back(kafka.bootstrap, "sink-outage", 11)
    assert sorted(k.decode() for k, _, _ in committed if k) == sorted(
        ["before-0"] + [f"after-{i}" for i in range(10)]
    )
