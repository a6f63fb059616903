"""Specification of the ``elastic-kafka`` Spark source, on a real broker, with real queries.

The broker is the session's (the ``kafka`` fixture: Kafka 4, KRaft, on
127.0.0.1), so every spec names topics of its own. The source needs no
jars: it runs in the suite's shared session. That it reads the same rows as
Spark's own Kafka source is ``tests/runtime/test_kafka_broker.py``'s.

The gate's specs also hold for ``gated-kafka`` (Spark's own Kafka source
held at the same gate file: the project's jar, ``java/``), which the shared
session has on its class path when ``make jars`` built it.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import kafka_jvm
import pytest
from chispa import assert_df_equality
from pyspark.errors import StreamingQueryException

from spark_elastic.log.gate import write_gate
from spark_elastic.log.kafka_source import KAFKA_SOURCE_FORMAT, register_kafka_source
from spark_elastic.log.source import KAFKA_SCHEMA

pytestmark = pytest.mark.slow

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

TIMEOUT = 30.0
Row = tuple[bytes | None, bytes | None, str, int, int, datetime, int]


@pytest.fixture(scope="module")
def session(spark: SparkSession) -> SparkSession:
    register_kafka_source(spark)
    return spark


@pytest.fixture
def topic(kafka: kafka_jvm.KafkaBroker) -> str:
    """A fresh topic of 2 partitions on the session's broker."""
    name = f"source-{uuid.uuid4().hex[:8]}"
    kafka_jvm.create_topics(kafka.bootstrap, {name: 2})
    return name


def produce(
    kafka: kafka_jvm.KafkaBroker, topic: str, values: Sequence[str], partition: int
) -> list[Row]:
    """Send ``values`` to one partition (key = value's first letter); the rows Spark should show."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    delivered: list[tuple[int, int]] = []
    for i, value in enumerate(values):
        producer.produce(
            topic,
            key=value[:1].encode(),
            value=value.encode(),
            partition=partition,
            timestamp=1_700_000_000_000 + i,
            on_delivery=lambda _err, m: delivered.append((m.partition(), m.offset())),
        )
    assert producer.flush(TIMEOUT) == 0
    return [
        (
            v[:1].encode(),
            v.encode(),
            topic,
            p,
            o,
            datetime.fromtimestamp((1_700_000_000_000 + i) / 1000, tz=UTC),
            0,  # CreateTime, as Java's client numbers it
        )
        for i, (v, (p, o)) in enumerate(zip(values, delivered, strict=True))
    ]


GATED = ("elastic-kafka", "gated-kafka")
"""The two sources with a gate: ours on librdkafka, and Spark's held by the project's jar."""


@pytest.fixture(params=GATED)
def gated(request: pytest.FixtureRequest, session: SparkSession) -> str:
    """The format name of a source with a gate (skipped for gated-kafka without its jar)."""
    if request.param == "gated-kafka":
        needs_gated_jar(session)
    return str(request.param)


def needs_gated_jar(session: SparkSession) -> None:
    """Skip (fail under CI, whose `make test` builds it) without the gated-kafka jar."""
    if "gated-kafka" not in session.conf.get("spark.jars", ""):
        why = "no gated-kafka jar in the session: run 'make jars'"
        if os.environ.get("CI"):
            pytest.fail(f"{why}: CI runs the Kafka specs")
        pytest.skip(why)


def stream(
    spark: SparkSession,
    kafka: kafka_jvm.KafkaBroker,
    source: str = KAFKA_SOURCE_FORMAT,
    **options: str,
) -> DataFrame:
    reader = spark.readStream.format(source)
    reader = reader.option("kafka.bootstrap.servers", kafka.bootstrap)
    return reader.options(**options).load()


def to_memory(
    df: DataFrame, checkpoint: Path, available_now: bool = False
) -> tuple[StreamingQuery, str]:
    name = f"kafka_{uuid.uuid4().hex}"
    writer = df.writeStream.format("memory").queryName(name)
    writer = writer.option("checkpointLocation", str(checkpoint))
    if available_now:
        writer = writer.trigger(availableNow=True)
    return writer.start(), name


def landed(spark: SparkSession, name: str) -> DataFrame:
    return spark.table(name).orderBy("topic", "partition", "offset")


def expected(spark: SparkSession, rows: Sequence[Row]) -> DataFrame:
    return spark.createDataFrame(sorted(rows, key=lambda r: (r[2], r[3], r[4])), KAFKA_SCHEMA)


def test_every_record_arrives_once_in_the_kafka_schema_in_batches_of_max_offsets(
    session: SparkSession, kafka: kafka_jvm.KafkaBroker, topic: str, tmp_path: Path
) -> None:
    rows = produce(kafka, topic, [f"a{i}" for i in range(30)], 0)
    rows += produce(kafka, topic, [f"b{i}" for i in range(10)], 1)
    df = stream(session, kafka, subscribe=topic, startingOffsets="earliest")
    assert df.schema == KAFKA_SCHEMA
    query, name = to_memory(
        stream(
            session, kafka, subscribe=topic, startingOffsets="earliest", maxOffsetsPerTrigger="8"
        ),
        tmp_path / "checkpoint",
        available_now=True,
    )
    query.awaitTermination(120)
    assert query.exception() is None
    assert_df_equality(landed(session, name), expected(session, rows))
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes == [8] * 5  # 40 records, split over the partitions by backlog


def test_a_gate_holds_a_running_query_at_its_offsets_until_it_is_lifted(
    session: SparkSession, kafka: kafka_jvm.KafkaBroker, topic: str, tmp_path: Path, gated: str
) -> None:
    rows = produce(kafka, topic, [f"a{i}" for i in range(20)], 0)
    rows += produce(kafka, topic, [f"b{i}" for i in range(20)], 1)
    gate = tmp_path / "gate.json"
    write_gate(str(gate), {topic: {"0": 5}})  # partition 1 unnamed: nothing new from it
    df = stream(
        session,
        kafka,
        gated,
        assign=f'{{"{topic}": [0, 1]}}',
        startingOffsets="earliest",
        gate=str(gate),
    )
    query, name = to_memory(df, tmp_path / "checkpoint")
    try:
        query.processAllAvailable()
        assert_df_equality(landed(session, name), expected(session, rows[:5]))
        write_gate(str(gate), {topic: {"0": 12, "1": 3}})
        query.processAllAvailable()
        assert_df_equality(landed(session, name), expected(session, rows[:12] + rows[20:23]))
        write_gate(str(gate), {topic: {"0": 2, "1": 3}})  # behind the query: holds it, no rewind
        (tmp_path / "gate.json").unlink()  # a missing file admits nothing new either
        produce(kafka, topic, ["a20"], 0)
        query.processAllAvailable()
        assert_df_equality(landed(session, name), expected(session, rows[:12] + rows[20:23]))
        write_gate(str(gate), None)
        query.processAllAvailable()
        assert landed(session, name).count() == len(rows) + 1
    finally:
        query.stop()


def test_a_partition_added_while_gated_is_read_from_its_start_once_the_gate_names_it(
    session: SparkSession, kafka: kafka_jvm.KafkaBroker, topic: str, tmp_path: Path, gated: str
) -> None:
    from confluent_kafka.admin import AdminClient, NewPartitions

    rows = produce(kafka, topic, [f"a{i}" for i in range(4)], 0)
    gate = tmp_path / "gate.json"
    write_gate(str(gate), {topic: {"0": 4, "1": 0}})
    df = stream(session, kafka, gated, subscribe=topic, startingOffsets="earliest", gate=str(gate))
    query, name = to_memory(df, tmp_path / "checkpoint")
    try:
        query.processAllAvailable()
        admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
        for future in admin.create_partitions([NewPartitions(topic, 3)]).values():
            future.result(TIMEOUT)
        added = produce(kafka, topic, [f"c{i}" for i in range(6)], 2)
        query.processAllAvailable()  # the gate does not name partition 2: nothing of it
        assert_df_equality(landed(session, name), expected(session, rows))
        write_gate(str(gate), {topic: {"0": 4, "1": 0, "2": 4}})
        query.processAllAvailable()
        assert_df_equality(landed(session, name), expected(session, rows + added[:4]))
    finally:
        query.stop()


def test_read_committed_skips_aborted_records_and_markers_and_ends_its_batches(
    session: SparkSession, kafka: kafka_jvm.KafkaBroker, topic: str, tmp_path: Path
) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": topic})
    producer.init_transactions(TIMEOUT)
    for outcome, count in (("commit", 10), ("abort", 5), ("commit", 10)):
        producer.begin_transaction()
        for i in range(count):
            producer.produce(topic, key=b"k", value=f"{outcome}-{i}".encode(), partition=0)
        if outcome == "commit":
            producer.commit_transaction(TIMEOUT)
        else:
            assert producer.flush(TIMEOUT) == 0  # on the broker: abort drops what is queued
            producer.abort_transaction(TIMEOUT)

    def values(source: str = KAFKA_SOURCE_FORMAT, **options: str) -> list[str]:
        df = stream(session, kafka, source, subscribe=topic, startingOffsets="earliest", **options)
        checkpoint = tmp_path / uuid.uuid4().hex
        query, name = to_memory(df.selectExpr("CAST(value AS STRING)"), checkpoint, True)
        query.awaitTermination(120)
        assert query.exception() is None
        return sorted(r.value for r in session.table(name).collect())

    committed = sorted(f"commit-{i}" for i in range(10)) * 2
    # librdkafka's default (read_committed): the aborted five and the three markers are gaps.
    assert values(maxOffsetsPerTrigger="4") == sorted(committed)
    uncommitted = values(**{"kafka.isolation.level": "read_uncommitted"})
    assert uncommitted == sorted(committed + [f"abort-{i}" for i in range(5)])
    # Spark's consumer behind the gate reads them alike when told read_committed (KafkaInput
    # tells it so by default), batch by batch past the gaps.
    needs_gated_jar(session)
    gated = {"source": "gated-kafka", "kafka.isolation.level": "read_committed"}
    assert values(maxOffsetsPerTrigger="4", **gated) == sorted(committed)


def test_records_the_brokers_no_longer_hold_fail_the_batch_unless_told_otherwise(
    session: SparkSession, kafka: kafka_jvm.KafkaBroker, topic: str, tmp_path: Path
) -> None:
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    rows = produce(kafka, topic, [f"a{i}" for i in range(10)], 0)
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    for future in admin.delete_records([TopicPartition(topic, 0, 4)]).values():
        future.result(TIMEOUT)  # offsets 0-3 gone, as retention would remove them
    start = f'{{"{topic}": {{"0": 0, "1": 0}}}}'

    def read(checkpoint: str, **options: str) -> str:
        df = stream(session, kafka, subscribe=topic, startingOffsets=start, **options)
        query, name = to_memory(df, tmp_path / checkpoint, available_now=True)
        query.awaitTermination(120)
        return name

    with pytest.raises(StreamingQueryException, match="failOnDataLoss: offsets 0 to 10 of"):
        read("strict")
    name = read("lenient", failOnDataLoss="false")
    assert_df_equality(landed(session, name), expected(session, rows[4:]))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": "t"}, "kafka.bootstrap.servers: expected brokers as host:port"),
        (
            {"kafka.bootstrap.servers": "127.0.0.1:1"},
            "options: expected exactly one of 'subscribe', 'assign', found None",
        ),
        (
            {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t", "subscribePattern": "x"},
            "option: expected an option of the elastic-kafka source, found 'subscribepattern'",
        ),
        (
            {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t", "failOnDataLoss": "no"},
            "failOnDataLoss: expected true or false, found 'no'",
        ),
    ],
)
def test_bad_options_fail_at_load_with_one_line_naming_them(
    session: SparkSession, options: dict[str, str], message: str
) -> None:
    with pytest.raises(Exception, match=message):
        session.readStream.format(KAFKA_SOURCE_FORMAT).options(**options).load()


def test_a_missing_topic_or_a_setting_librdkafka_refuses_stops_the_query_saying_so(
    session: SparkSession, kafka: kafka_jvm.KafkaBroker, tmp_path: Path
) -> None:
    for name, options, message in [
        (
            "missing",
            {"subscribe": "no-such-topic"},
            "subscribe: expected topic 'no-such-topic' on the brokers, found",
        ),
        (
            "setting",
            {"subscribe": "t", "kafka.sasl.jaas.config": "x"},
            "kafka.*: expected settings librdkafka accepts",
        ),
    ]:
        query, _ = to_memory(stream(session, kafka, **options), tmp_path / name, True)
        with pytest.raises(StreamingQueryException, match=re.escape(message)):
            query.awaitTermination(120)


def test_a_session_without_the_gated_readers_jars_is_refused_in_one_line_naming_them(
    session: SparkSession, kafka: kafka_jvm.KafkaBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    from spark_elastic import KafkaInput
    from spark_elastic.errors import InputError
    from spark_elastic.runtime import inputs as job_module

    needs_gated_jar(session)
    source = KafkaInput(kafka.bootstrap, "t")
    assert source.stream_reader(session, {"t": [0]}).load().schema == KAFKA_SCHEMA
    # As the driver's class loader would see a session without the jar.
    what, _ = job_module._GATED_JAR
    monkeypatch.setattr(job_module, "_GATED_JAR", (what, "io.github.sparkelastic.kafka.Absent"))
    with pytest.raises(InputError) as refused:
        source.stream_reader(session, {"t": [0]})
    assert str(refused.value) == (
        "KafkaInput.reader: expected Spark's Kafka connector and the project's gated-kafka "
        "jar in the session's spark.jars for reader='gated' ('make jars' puts them in "
        ".cache/jars/spark-kafka; reader='elastic' needs none), found the project's "
        "gated-kafka jar missing"
    )
