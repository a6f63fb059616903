"""A real Apache Kafka broker: metadata, Java's partitioner, growth, and Spark's Kafka source.

One Kafka 4 broker (KRaft, broker and controller in one JVM, see
``kafka_jvm``; the ``kafka`` fixture of ``tests/conftest.py``) serves the
session. Its jars and Spark's Kafka connector come from ``make jars``;
without them, or without Java, the specs skip saying so (and fail under
CI). The Spark spec runs in a fresh process: ``spark.jars`` must be set
before a session starts, and the suite's shared session has none.
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import kafka_jvm
import pytest
from kafka_reads import read_with_spark
from standins import wait_until

import udfs
from spark_elastic import KafkaInput
from spark_elastic.errors import InputError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

TIMEOUT = 30.0


def create_topic(kafka: kafka_jvm.KafkaBroker, topic: str, partitions: int) -> None:
    kafka_jvm.create_topics(kafka.bootstrap, {topic: partitions})


def consume_all(kafka: kafka_jvm.KafkaBroker, topic: str, count: int) -> dict[bytes, int]:
    """Every record of ``topic`` from the start: ``{key: partition}``, ``count`` of them."""
    from confluent_kafka import Consumer, TopicPartition

    partitions = KafkaInput(kafka.bootstrap, topic, timeout_s=TIMEOUT).partition_counts()[topic]
    consumer = Consumer(
        {"bootstrap.servers": kafka.bootstrap, "group.id": "spec", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    landed: dict[bytes, int] = {}

    def read() -> bool:
        for message in consumer.consume(num_messages=count, timeout=0.5):
            if message.error() is None:
                landed[message.key()] = message.partition()
        return len(landed) == count

    try:
        wait_until(f"{count} records of {topic!r} consumed back", read)
    finally:
        consumer.close()
    return landed


def test_the_broker_serves_metadata_and_creates_no_topic_it_is_asked_about(
    kafka: kafka_jvm.KafkaBroker,
) -> None:
    from confluent_kafka.admin import AdminClient

    create_topic(kafka, "meta", 3)
    metadata = AdminClient({"bootstrap.servers": kafka.bootstrap}).list_topics(timeout=TIMEOUT)
    assert [(b.id, f"{b.host}:{b.port}") for b in metadata.brokers.values()] == [
        (1, kafka.bootstrap)
    ]
    assert sorted(metadata.topics["meta"].partitions) == [0, 1, 2]
    assert KafkaInput(kafka.bootstrap, "meta", timeout_s=TIMEOUT).partition_counts() == {"meta": 3}
    with pytest.raises(InputError, match="found no topic 'absent'"):
        KafkaInput(kafka.bootstrap, "absent", timeout_s=TIMEOUT).partition_counts()
    topics = AdminClient({"bootstrap.servers": kafka.bootstrap}).list_topics(timeout=TIMEOUT)
    assert "absent" not in topics.topics  # auto.create.topics.enable=false


def test_the_broker_keeps_records_whatever_their_timestamps(kafka: kafka_jvm.KafkaBroker) -> None:
    # The specs stamp their records in 2023: Kafka's default retention (7 days by record
    # time, checked every 5 minutes) deleted them all mid-run, so it is off on this broker.
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    create_topic(kafka, "kept", 1)
    resource = ConfigResource(ResourceType.TOPIC, "kept")
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    configs = admin.describe_configs([resource])[resource].result(TIMEOUT)
    assert configs["retention.ms"].value == "-1"
    assert configs["retention.bytes"].value == "-1"


def test_keyed_records_from_kafkas_java_producer_land_where_udfs_murmur2_says(
    kafka: kafka_jvm.KafkaBroker,
) -> None:
    create_topic(kafka, "keyed", 4)
    keys = [f"user-{i}" for i in range(200)]
    lines = "".join(f"{key}:v{i}\n" for i, key in enumerate(keys))
    # Kafka's own console producer: the Java client's default (murmur2) partitioner.
    producer = subprocess.run(
        [
            kafka_jvm.java(),
            "-Xmx128m",
            "-XX:TieredStopAtLevel=1",
            "-cp",
            str(kafka_jvm.kafka_jars() / "*"),
            "org.apache.kafka.tools.ConsoleProducer",
            "--bootstrap-server",
            kafka.bootstrap,
            "--topic",
            "keyed",
            "--reader-property",
            "parse.key=true",
            "--reader-property",
            "key.separator=:",
        ],
        input=lines,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert producer.returncode == 0, producer.stderr[-2000:]
    landed = consume_all(kafka, "keyed", len(keys))
    expected = udfs.kafka_partitions(keys, 4).tolist()
    assert [landed[key.encode()] for key in keys] == expected
    assert set(expected) == {0, 1, 2, 3}


def test_partitions_grow_from_4_to_8_and_keys_then_follow_the_new_count(
    kafka: kafka_jvm.KafkaBroker,
) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewPartitions

    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    # For about 0.1 s after growth the metadata lists new partitions whose leader does not
    # serve them yet (ListOffsets: NOT_LEADER_OR_FOLLOWER), after about one growth in
    # three: end_offsets asks again. Five growths, each read at once, meet that moment.
    for topic in ("growing", *(f"growing-{i}" for i in range(4))):
        create_topic(kafka, topic, 4)
        source = KafkaInput(kafka.bootstrap, topic, timeout_s=TIMEOUT)
        assert source.partition_counts() == {topic: 4}
        for future in admin.create_partitions([NewPartitions(topic, 8)]).values():
            future.result(timeout=TIMEOUT)
        wait_until("8 partitions", lambda s=source, t=topic: s.partition_counts() == {t: 8})
        assert source.end_offsets(topic) == dict.fromkeys(range(8), 0)

    source = KafkaInput(kafka.bootstrap, "growing", timeout_s=TIMEOUT)
    keys = [f"user-{i}" for i in range(100)]
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "partitioner": "murmur2_random"})
    for key in keys:
        producer.produce("growing", key=key.encode(), value=b"v")
    assert producer.flush(TIMEOUT) == 0
    landed = consume_all(kafka, "growing", len(keys))
    assert [landed[key.encode()] for key in keys] == udfs.kafka_partitions(keys, 8).tolist()
    assert sum(source.end_offsets("growing").values()) == len(keys)


@pytest.mark.slow
def test_sparks_kafka_source_and_ours_read_every_record_alike_with_available_now(
    spark: SparkSession, kafka: kafka_jvm.KafkaBroker, tmp_path: Path
) -> None:
    from confluent_kafka import Producer

    # A topic of this attempt's own: a rerun (Spark's fixed 10 s wait for a Python worker,
    # pyproject's --only-rerun) must not find the last attempt's records in it.
    topic = f"spark-read-{uuid.uuid4().hex[:8]}"
    create_topic(kafka, topic, 4)
    keys = [f"user-{i}" for i in range(150)]
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "partitioner": "murmur2_random"})
    for key in keys:
        producer.produce(topic, key=key.encode(), value=b"v")
    assert producer.flush(TIMEOUT) == 0

    def read(reader: str) -> dict[str, Any]:
        source = KafkaInput(kafka.bootstrap, (topic,), max_records_per_batch=40, reader=reader)
        (tmp_path / reader).mkdir()
        return read_with_spark(spark, source, 4, tmp_path / reader)

    theirs = read("spark")
    rows = theirs["rows"]
    assert sorted(key for key, _, _ in rows) == sorted(keys)  # every record, once
    expected = dict(zip(keys, udfs.kafka_partitions(keys, 4).tolist(), strict=True))
    assert {key: partition for key, partition, _ in rows} == expected
    # maxOffsetsPerTrigger=40 over 150 records: availableNow runs at least 4 batches.
    assert theirs["batches"] >= 4
    # The gated reader (no gate: a query that is not a warm-up) and spark-elastic's own
    # source read the same rows: keys, values, offsets, timestamps.
    for reader in ("gated", "elastic"):
        ours = read(reader)
        assert sorted(map(tuple, ours["full"])) == sorted(map(tuple, theirs["full"])), reader
        assert ours["batches"] >= 4, reader


def test_the_cached_connector_is_the_four_jars_pyspark_lacks_and_the_projects_own() -> None:
    """Nothing in .cache/jars/spark-kafka duplicates a jar pyspark ships (no class twice)."""
    try:
        jars = [Path(p).name for p in kafka_jvm.spark_kafka_jars()]
    except kafka_jvm.KafkaJvmError as missing:
        pytest.skip(str(missing))
    import pyspark

    shipped = {p.name.rsplit("-", 1)[0] for p in (Path(pyspark.__file__).parent / "jars").iterdir()}
    artifacts = sorted(name.rsplit("-", 1)[0] for name in jars)
    assert artifacts == [
        "commons-pool2",
        "kafka-clients",
        "spark-elastic-gated",  # make jars builds it from java/: the gated-kafka source
        "spark-sql-kafka-0-10_2.13",
        "spark-token-provider-kafka-0-10_2.13",
    ]
    assert not shipped & set(artifacts)
