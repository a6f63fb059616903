"""KafkaInput: partition counts and end offsets from a real Apache Kafka broker, and its options.

The broker is the session's (the ``kafka`` fixture of ``tests/conftest.py``:
Kafka 4 in KRaft mode on 127.0.0.1), so every spec names topics of its own.
Reading through Spark's Kafka source is ``test_kafka_broker.py``'s; these
specs pin that a Kafka job's reader gets exactly the embedded log source's
options, which the log source accepts as they are.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path

import kafka_jvm
import pytest
from standins import wait_until

from spark_elastic import KafkaInput, LogInput
from spark_elastic.errors import ArgumentError, ArgumentTypeError, InputError
from spark_elastic.log.embedded import EmbeddedLog

TIMEOUT = 30.0


@pytest.fixture
def kafka_client() -> None:
    # confluent-kafka is the `kafka` extra; `dev` (what CI installs) includes it.
    if importlib.util.find_spec("confluent_kafka") is None:
        if os.environ.get("CI"):
            pytest.fail("no confluent_kafka: pip install 'spark-elastic[dev]' installs it")
        pytest.skip("no confluent_kafka (pip install 'spark-elastic[kafka]'); CI installs it")


def unused_address() -> str:
    """A loopback address nothing listens on (a port just bound and released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


def topic_names(kafka: kafka_jvm.KafkaBroker) -> set[str]:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    return set(admin.list_topics(timeout=TIMEOUT).topics)


def test_partition_counts_are_read_from_the_broker_in_the_order_of_topics(
    kafka: kafka_jvm.KafkaBroker,
) -> None:
    kafka_jvm.create_topics(kafka.bootstrap, {"in-clicks": 4, "in-views": 2, "in-other": 3})
    source = KafkaInput(kafka.bootstrap, ("in-views", "in-clicks"), timeout_s=TIMEOUT)
    assert list(source.partition_counts().items()) == [("in-views", 2), ("in-clicks", 4)]


def test_a_missing_topic_is_one_line_naming_it_and_is_not_created(
    kafka: kafka_jvm.KafkaBroker,
) -> None:
    kafka_jvm.create_topics(kafka.bootstrap, {"present": 4})
    source = KafkaInput(kafka.bootstrap, ("present", "nope"), timeout_s=TIMEOUT)
    with pytest.raises(InputError) as caught:
        source.partition_counts()
    message = str(caught.value)
    assert "\n" not in message
    assert message == (
        f"KafkaInput.topics: expected existing topics, found no topic 'nope' on {kafka.bootstrap}"
    )
    with pytest.raises(InputError) as caught:
        source.end_offsets("nope")
    assert str(caught.value) == message
    # Asking about it created nothing (describe_topics never does; this broker has
    # auto.create.topics.enable=false, so the spec pins only that nothing else did).
    assert "nope" not in topic_names(kafka)


def test_an_unreachable_broker_is_one_line_naming_the_servers(kafka_client: None) -> None:
    address = unused_address()
    source = KafkaInput(address, ("clicks",), timeout_s=1)
    with pytest.raises(InputError) as caught:
        source.partition_counts()
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(
        f"KafkaInput.bootstrap_servers: expected a Kafka broker answering within 1 s, "
        f"found none at {address} ("
    )


def test_records_produced_with_kafkas_partitioner_land_where_the_embedded_log_puts_them(
    kafka: kafka_jvm.KafkaBroker, tmp_path: Path
) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition

    kafka_jvm.create_topics(kafka.bootstrap, {"placed": 4})
    log = EmbeddedLog(tmp_path / "log")
    log.create_topic("clicks", 4)
    keys = [f"user-{i}".encode() for i in range(40)]
    with log.producer("clicks") as embedded:
        expected = {key: embedded.send(key, b"v").partition for key in keys}
    # murmur2_random is the Java client's partitioner, which the embedded log implements.
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "partitioner": "murmur2_random"})
    for key in keys:
        producer.produce("placed", key=key, value=b"v")
    assert producer.flush(TIMEOUT) == 0

    consumer = Consumer(
        {"bootstrap.servers": kafka.bootstrap, "group.id": "spec", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition("placed", p, 0) for p in range(4)])
    landed: dict[bytes, int] = {}

    def read_all() -> bool:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            landed[message.key()] = message.partition()
        return len(landed) == len(keys)

    try:
        wait_until("every produced record consumed back", read_all)
    finally:
        consumer.close()
    assert landed == expected
    source = KafkaInput(kafka.bootstrap, "placed", timeout_s=TIMEOUT)
    assert source.partition_counts() == {"placed": 4}
    ends = source.end_offsets("placed")
    assert ends == LogInput(str(tmp_path / "log"), "clicks").end_offsets("clicks")
    assert sum(ends.values()) == len(keys)


def test_the_kafka_reader_gets_exactly_the_embedded_log_sources_options(tmp_path: Path) -> None:
    from spark_elastic.log.source import _Options

    partitions = {"clicks": [0, 3], "views": [1]}

    def kafka_input(reader: str) -> KafkaInput:
        java = {"security.protocol": "SSL", "ssl.truststore.location": "/t.jks"}
        return KafkaInput(
            "b1:9092,b2:9092",
            ("clicks", "views"),
            max_records_per_batch=500,
            kafka_options=java if reader != "elastic" else {},
            admin_options={"security.protocol": "SSL", "ssl.ca.location": "/ca.pem"},
            reader=reader,
        )

    log = LogInput(str(tmp_path), ("clicks", "views"), max_records_per_batch=500)
    kafka_options = kafka_input("spark").source_options(partitions)
    shared = {
        "kafka.bootstrap.servers": "b1:9092,b2:9092",
        "assign": '{"clicks": [0, 3], "views": [1]}',
        "startingOffsets": "earliest",
        "maxOffsetsPerTrigger": "500",
    }
    # Spark's consumer takes the Java client's settings; elastic-kafka's librdkafka's.
    assert kafka_options == {
        "kafka.security.protocol": "SSL",
        "kafka.ssl.truststore.location": "/t.jks",
        **shared,
    }
    # The gated reader is Spark's consumer too, reading committed records unless told otherwise.
    assert kafka_input("gated").source_options(partitions) == {
        "kafka.isolation.level": "read_committed",
        **kafka_options,
    }
    uncommitted = KafkaInput("b1:9092", "clicks", kafka_options={"isolation.level": "x"})
    assert uncommitted.source_options({})["kafka.isolation.level"] == "x"
    assert kafka_input("elastic").source_options(partitions) == {
        "kafka.security.protocol": "SSL",
        "kafka.ssl.ca.location": "/ca.pem",
        **shared,
    }
    assert KafkaInput("b1:9092", "clicks").reader == "gated"
    shared = {k: v for k, v in kafka_options.items() if not k.startswith("kafka.")}
    assert log.source_options(partitions) == {"path": str(tmp_path), **shared}
    # The log source ignores kafka.*: a Kafka job's options read the embedded log the same way.
    assert _Options.parse({**kafka_options, "path": str(tmp_path)}) == _Options.parse(
        log.source_options(partitions)
    )
    assert "maxOffsetsPerTrigger" not in LogInput(str(tmp_path), "clicks").source_options({})


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"bootstrap_servers": "localhost"},
            ArgumentError,
            "KafkaInput.bootstrap_servers: expected 'host:port[,host:port...]', found 'localhost'",
        ),
        (
            {"topics": ()},
            ArgumentError,
            "KafkaInput.topics: expected one or more topic names, found ()",
        ),
        (
            {"max_records_per_batch": 0},
            ArgumentError,
            "KafkaInput.max_records_per_batch: expected a positive record count or None, found 0",
        ),
        (
            {"timeout_s": 0},
            ArgumentError,
            "KafkaInput.timeout_s: expected a positive number of seconds, found 0",
        ),
        (
            {"kafka_options": {"bootstrap.servers": "x:1"}},
            ArgumentError,
            "KafkaInput.kafka_options: expected no 'bootstrap.servers' "
            "(KafkaInput.bootstrap_servers sets it), found {'bootstrap.servers': 'x:1'}",
        ),
        (
            {"reader": "java"},
            ArgumentError,
            "KafkaInput.reader: expected a Kafka source, found 'java' "
            "(valid choices: 'gated', 'elastic', 'spark')",
        ),
        (
            {"kafka_options": {"security.protocol": "SSL"}, "reader": "elastic"},
            ArgumentError,
            "KafkaInput.kafka_options: expected none with reader='elastic' (its clients are "
            "librdkafka's: give their settings in admin_options), or reader='spark', "
            "found {'security.protocol': 'SSL'}",
        ),
        (
            {"admin_options": {"retries": 3}},
            ArgumentTypeError,
            "KafkaInput.admin_options: expected a mapping of str to str, found dict {'retries': 3}",
        ),
    ],
)
def test_bad_arguments_are_one_line_naming_them(
    kwargs: dict[str, object], error: type[Exception], message: str
) -> None:
    arguments: dict[str, object] = {"bootstrap_servers": "127.0.0.1:9092", "topics": ("clicks",)}
    with pytest.raises(error) as caught:
        KafkaInput(**{**arguments, **kwargs})  # type: ignore[arg-type]
    assert str(caught.value) == message


def test_importing_the_package_loads_no_kafka_client() -> None:
    probe = "import spark_elastic, sys; print('confluent_kafka' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "False"


def test_the_kafka_example_creates_its_topic_once_and_produces_keyed_clicks(
    kafka: kafka_jvm.KafkaBroker,
) -> None:
    script = Path(__file__).resolve().parents[2] / "examples" / "kafka_clicks.py"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, str(script), "--bootstrap", kafka.bootstrap, *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)

    first = run("--topic", "example-clicks", "--partitions", "3", "--records", "500")
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines() == [
        "created 'example-clicks' with 3 partitions",
        f"produced 500 clicks to 'example-clicks' on {kafka.bootstrap}",
    ]
    again = run("--topic", "example-clicks", "--start", "500", "--records", "100")
    assert again.stdout.splitlines() == [
        f"produced 100 clicks to 'example-clicks' on {kafka.bootstrap}"
    ]
    source = KafkaInput(kafka.bootstrap, ("example-clicks",), timeout_s=TIMEOUT)
    assert source.partition_counts() == {"example-clicks": 3}
    assert sum(source.end_offsets("example-clicks").values()) == 600
    wrong = run("--partitions", "0")
    assert wrong.returncode == 2
    assert wrong.stderr.splitlines()[-1].endswith("found 0, 20000, 0")


def test_moved_tasks_replay_behind_a_gated_reader_and_take_snapshots_with_sparks_source(
    tmp_path: Path,
) -> None:
    from dataclasses import replace

    from spark_elastic import Job, ParquetSink
    from spark_elastic.runtime.container import ContainerSettings
    from spark_elastic.runtime.container.warmups import _replays

    def job(source: object) -> Job:
        sink = ParquetSink(str(tmp_path / "out"))
        return Job("j", source, 2, str(tmp_path), sink, transform=lambda df: df)  # type: ignore[arg-type]

    settings = ContainerSettings("c1", "http://127.0.0.1:1", "unused")
    assert settings.warmup == "replay"
    assert _replays(job(KafkaInput("b:9092", "clicks")), settings)
    assert _replays(job(KafkaInput("b:9092", "clicks", reader="elastic")), settings)
    assert _replays(job(LogInput(str(tmp_path), "clicks")), settings)
    assert not _replays(job(KafkaInput("b:9092", "clicks", reader="spark")), settings)
    assert not _replays(job(KafkaInput("b:9092", "clicks")), replace(settings, warmup="snapshot"))
