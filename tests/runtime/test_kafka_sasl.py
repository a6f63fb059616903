"""Client options reach every Kafka client: a broker whose clients log in with SASL/PLAIN.

The broker is the session's second one (the ``kafka_sasl`` fixture:
Kafka 4 on 127.0.0.1, user ``alice``). A ``KafkaInput``'s ``admin_options``
(librdkafka) reach its partition counts, end offsets, group commits and the
``elastic-kafka`` source's clients, its ``kafka_options`` (Java's client
properties) Spark's consumer (of the ``gated`` and ``spark`` readers), and a
``KafkaSink``'s ``kafka_options`` its transactional producer. A wrong
password is one line naming the options that carry it.
"""

from __future__ import annotations

from pathlib import Path

import kafka_jvm
import pytest
from kafka_reads import read_with_spark
from pyspark.sql import SparkSession

from spark_elastic import BatchContext, KafkaInput, KafkaSink
from spark_elastic.errors import InputError, SinkError

TIMEOUT = 30.0
JAAS = "org.apache.kafka.common.security.plain.PlainLoginModule required"


def java_options(user: str, password: str) -> dict[str, str]:
    """Spark's consumer's SASL/PLAIN settings (Java client properties, ``kafka.`` prefixed)."""
    return {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.jaas.config": f'{JAAS} username="{user}" password="{password}";',
    }


def test_an_input_logs_in_for_counts_offsets_and_its_groups_commits(
    kafka_sasl: kafka_jvm.KafkaBroker,
) -> None:
    kafka_jvm.create_topics(kafka_sasl.bootstrap, {"sasl-in": 3}, options=kafka_sasl.client_options)
    source = KafkaInput(
        kafka_sasl.bootstrap,
        ("sasl-in",),
        timeout_s=TIMEOUT,
        admin_options=kafka_sasl.client_options,
    )
    assert source.partition_counts() == {"sasl-in": 3}
    assert source.end_offsets("sasl-in") == {0: 0, 1: 0, 2: 0}
    source.commit_group_offsets("sasl-job", {"sasl-in": {0: 0, 1: 0, 2: 0}})


def test_a_wrong_password_is_one_line_naming_the_options_that_carry_it(
    spark: SparkSession, kafka_sasl: kafka_jvm.KafkaBroker
) -> None:
    wrong = kafka_jvm.sasl_options("alice", "not-her-password")
    source = KafkaInput(kafka_sasl.bootstrap, ("sasl-in",), timeout_s=5, admin_options=wrong)
    with pytest.raises(InputError) as caught:
        source.partition_counts()
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(
        "KafkaInput.admin_options: expected credentials the brokers accept, found them "
        f"refused at {kafka_sasl.bootstrap} ("
    )
    assert "Authentication failed" in message

    sink = KafkaSink(kafka_sasl.bootstrap, "sasl-out", kafka_options=wrong, timeout_s=5)
    batch = spark.createDataFrame([("a",)], "user string")
    context = BatchContext(0, "sasl-c1", 1, lambda: None)
    with pytest.raises(SinkError) as refused:
        sink.write(batch, context)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(
        "KafkaSink.kafka_options: expected credentials the brokers accept, found them "
        f"refused at {kafka_sasl.bootstrap} ("
    )


def test_a_sink_logs_in_and_publishes_its_batch(
    spark: SparkSession, kafka_sasl: kafka_jvm.KafkaBroker
) -> None:
    from confluent_kafka import Consumer, TopicPartition

    options = kafka_sasl.client_options
    kafka_jvm.create_topics(kafka_sasl.bootstrap, {"sasl-out": 1}, options=options)
    batch = spark.createDataFrame([(f"user-{i}",) for i in range(5)], "user string")
    sink = KafkaSink(kafka_sasl.bootstrap, "sasl-out", key="user", kafka_options=options)
    sink.write(batch, BatchContext(0, "sasl-c1", 1, lambda: None))
    consumer = Consumer(
        {
            **options,
            "bootstrap.servers": kafka_sasl.bootstrap,
            "group.id": "sasl-reads",
            "isolation.level": "read_committed",
        }
    )
    consumer.assign([TopicPartition("sasl-out", 0, 0)])
    try:
        messages = consumer.consume(num_messages=5, timeout=TIMEOUT)
    finally:
        consumer.close()
    assert sorted(m.key() for m in messages) == [f"user-{i}".encode() for i in range(5)]


@pytest.mark.slow
def test_sparks_consumer_and_ours_log_in_with_the_inputs_options(
    spark: SparkSession, kafka_sasl: kafka_jvm.KafkaBroker, tmp_path: Path
) -> None:
    from confluent_kafka import Producer

    options = kafka_sasl.client_options
    kafka_jvm.create_topics(kafka_sasl.bootstrap, {"sasl-read": 2}, options=options)
    producer = Producer({**options, "bootstrap.servers": kafka_sasl.bootstrap})
    for i in range(30):
        producer.produce("sasl-read", key=f"user-{i}".encode(), value=b"v")
    assert producer.flush(TIMEOUT) == 0

    # Spark's consumer takes the Java client's settings, ours librdkafka's (admin_options).
    for reader in ("gated", "spark", "elastic"):
        source = KafkaInput(
            kafka_sasl.bootstrap,
            ("sasl-read",),
            kafka_options=java_options("alice", "alice-secret") if reader != "elastic" else {},
            admin_options=options,
            reader=reader,
        )
        (tmp_path / reader).mkdir()
        read = read_with_spark(spark, source, 2, tmp_path / reader)
        keys = sorted(key for key, _, _ in read["rows"])
        assert keys == sorted(f"user-{i}" for i in range(30)), reader
