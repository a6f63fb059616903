"""Specification of the ``elastic-log`` Spark source, with real streaming queries."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from chispa import assert_df_equality

from spark_elastic.log.embedded import EmbeddedLog
from spark_elastic.log.gate import read_gate, write_gate
from spark_elastic.log.source import KAFKA_SCHEMA, _admit, register_log_source

# Slow (left out by `pytest -m "not slow"`): streaming queries on the embedded log.
pytestmark = pytest.mark.slow

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

Row = tuple[bytes | None, bytes | None, str, int, int, datetime, int]


@pytest.fixture(scope="module")
def session(spark: SparkSession) -> SparkSession:
    register_log_source(spark)
    register_log_source(spark)  # registering twice is harmless
    return spark


@pytest.fixture
def log(tmp_path: Path) -> EmbeddedLog:
    return EmbeddedLog(tmp_path / "log", fsync=False)


def produce(
    log: EmbeddedLog, topic: str, values: Sequence[str], partition: int | None = None
) -> list[Row]:
    """Send ``values`` (key = value's first letter) and return the rows Spark should show."""
    rows: list[Row] = []
    with log.producer(topic) as producer:
        for i, value in enumerate(values):
            stamp = 1_700_000_000_000 + i
            p, o = producer.send(value[:1], value, timestamp=stamp, partition=partition)
            when = datetime.fromtimestamp(stamp / 1000, tz=UTC)
            rows.append((value[:1].encode(), value.encode(), topic, p, o, when, 0))
    return rows


def expected(spark: SparkSession, rows: Sequence[Row]) -> DataFrame:
    return spark.createDataFrame(sorted(rows, key=lambda r: (r[2], r[3], r[4])), KAFKA_SCHEMA)


def stream(spark: SparkSession, log: EmbeddedLog, **options: str) -> DataFrame:
    reader = spark.readStream.format("elastic-log").option("path", str(log.path))
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def to_memory(df: DataFrame, checkpoint: Path, available_now: bool) -> tuple[StreamingQuery, str]:
    name = f"log_{uuid.uuid4().hex}"
    writer = df.writeStream.format("memory").queryName(name)
    writer = writer.option("checkpointLocation", str(checkpoint))
    if available_now:
        writer = writer.trigger(availableNow=True)
    return writer.start(), name


def table(spark: SparkSession, name: str) -> DataFrame:
    return spark.table(name).orderBy("topic", "partition", "offset")


def input_rows(query: StreamingQuery) -> list[int]:
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]


@pytest.fixture
def running(session: SparkSession) -> Iterator[list[StreamingQuery]]:
    queries: list[StreamingQuery] = []
    yield queries
    for query in queries:
        query.stop()


def test_rows_have_the_kafka_source_schema(session: SparkSession, log: EmbeddedLog) -> None:
    log.create_topic("t", 1)
    assert stream(session, log, subscribe="t").schema == KAFKA_SCHEMA
    assert KAFKA_SCHEMA.simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
        "timestamp:timestamp,timestampType:int>"
    )


def test_available_now_reads_everything_in_batches_of_max_offsets(
    session: SparkSession, log: EmbeddedLog, tmp_path: Path
) -> None:
    log.create_topic("t", 3)
    log.create_topic("u", 1)
    rows = produce(log, "t", [f"{c}{i}" for i, c in enumerate("abcdefghij")])
    rows += produce(log, "u", ["zed", "zoo"])
    df = stream(session, log, subscribe="t,u", startingOffsets="earliest", maxOffsetsPerTrigger="5")

    query, name = to_memory(df, tmp_path / "ck", available_now=True)
    query.awaitTermination()

    assert_df_equality(table(session, name), expected(session, rows))
    assert input_rows(query) == [5, 5, 2]
    end = query.lastProgress["sources"][0]["endOffset"]
    assert json.loads(end) == {"t": log.describe("t").to_json()["end_offsets"], "u": {"0": 2}}


@pytest.mark.parametrize("options", [{}, {"startingOffsets": "latest"}], ids=["default", "latest"])
def test_latest_starting_offsets_skip_what_was_there_before_the_query(
    session: SparkSession, log: EmbeddedLog, tmp_path: Path, options: dict[str, str]
) -> None:
    # Like Kafka's source, a streaming query starts at the end of the log unless told otherwise.
    log.create_topic("t", 2)
    produce(log, "t", ["a-old", "b-old", "c-old"])
    writer = (
        stream(session, log, subscribe="t", **options)
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
    )
    first = writer.start()
    first.awaitTermination()
    assert input_rows(first) == []

    later = produce(log, "t", ["d-new", "e-new"])
    writer.start().awaitTermination()
    out = session.read.schema(KAFKA_SCHEMA).parquet(str(tmp_path / "out"))
    assert_df_equality(out.orderBy("partition", "offset"), expected(session, later))


def test_assign_and_json_starting_offsets_select_partitions_and_positions(
    session: SparkSession, log: EmbeddedLog, tmp_path: Path, running: list[StreamingQuery]
) -> None:
    log.create_topic("t", 3)
    first = {p: produce(log, "t", [f"p{p}-{i}" for i in range(3)], partition=p) for p in range(3)}
    df = stream(
        session,
        log,
        assign=json.dumps({"t": [0, 2]}),
        startingOffsets=json.dumps({"t": {"0": 1, "2": -1}}),
    )
    query, name = to_memory(df, tmp_path / "ck", available_now=False)
    running.append(query)
    query.processAllAvailable()
    assert_df_equality(table(session, name), expected(session, first[0][1:]))

    later = produce(log, "t", ["p2-late"], partition=2) + produce(log, "t", ["p1-x"], partition=1)
    query.processAllAvailable()
    assert_df_equality(table(session, name), expected(session, first[0][1:] + later[:1]))


def test_a_running_query_picks_up_partitions_added_by_grow(
    session: SparkSession, log: EmbeddedLog, tmp_path: Path, running: list[StreamingQuery]
) -> None:
    log.create_topic("t", 2)
    rows = produce(log, "t", ["a", "b", "c"])
    query, name = to_memory(
        stream(session, log, subscribe="t", startingOffsets="earliest"),
        tmp_path / "ck",
        available_now=False,
    )
    running.append(query)
    query.processAllAvailable()

    log.grow("t", 4)
    rows += produce(log, "t", ["new-2"], partition=2) + produce(log, "t", ["new-3"], partition=3)
    query.processAllAvailable()

    assert_df_equality(table(session, name), expected(session, rows))
    assert sorted(json.loads(query.lastProgress["sources"][0]["endOffset"])["t"]) == [
        "0",
        "1",
        "2",
        "3",
    ]


def test_a_gate_file_holds_a_running_query_at_its_offsets_until_it_is_lifted(
    session: SparkSession, log: EmbeddedLog, tmp_path: Path, running: list[StreamingQuery]
) -> None:
    log.create_topic("t", 2)
    rows = produce(log, "t", ["a1", "b1", "a2", "b2", "a3", "b3"])
    ends = log.end_offsets("t")
    gate = tmp_path / "gate.json"
    query, name = to_memory(
        stream(session, log, subscribe="t", startingOffsets="earliest", gate=str(gate)),
        tmp_path / "ck",
        available_now=False,
    )
    running.append(query)

    # No gate file yet: nothing is read.
    query.processAllAvailable()
    assert table(session, name).count() == 0

    # Partition 0 up to one record before its end; partition 1 not named: nothing of it.
    write_gate(str(gate), {"t": {"0": ends[0] - 1}})
    query.processAllAvailable()
    held = [r for r in rows if r[3] == 0 and r[4] < ends[0] - 1]
    assert_df_equality(table(session, name), expected(session, held))

    # A gate never moves a query back: lowering it reads nothing more.
    write_gate(str(gate), {"t": {"0": 0, "1": 0}})
    query.processAllAvailable()
    assert table(session, name).count() == len(held)

    write_gate(str(gate), None)  # lifted
    query.processAllAvailable()
    assert_df_equality(table(session, name), expected(session, rows))


def test_gate_files_read_back_and_a_missing_one_admits_nothing(tmp_path: Path) -> None:
    gate = tmp_path / "nested" / "gate.json"
    assert read_gate(str(gate)) == {}
    write_gate(str(gate), {"t": {"1": 5, "0": 7}})
    assert read_gate(str(gate)) == {("t", 0): 7, ("t", 1): 5}
    write_gate(str(gate), None)
    assert read_gate(str(gate)) is None
    assert [p.name for p in gate.parent.iterdir()] == ["gate.json"]  # nothing half-written


def test_a_restarted_query_continues_from_its_checkpoint_without_duplicates(
    session: SparkSession, log: EmbeddedLog, tmp_path: Path
) -> None:
    log.create_topic("t", 2)
    rows = produce(log, "t", ["a1", "b1", "c1", "d1"])
    df = stream(session, log, subscribe="t", startingOffsets="earliest")
    # The memory sink cannot recover from a checkpoint; the exactly-once file sink can.
    writer = (
        df.writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
    )
    writer.start().awaitTermination()
    rows += produce(log, "t", ["a2", "e2"])
    restarted = writer.start()
    restarted.awaitTermination()

    assert input_rows(restarted) == [2]
    out = session.read.schema(KAFKA_SCHEMA).parquet(str(tmp_path / "out"))
    assert_df_equality(out.orderBy("partition", "offset"), expected(session, rows))


def test_batch_reads_take_a_pattern_and_starting_and_ending_offsets(
    session: SparkSession, log: EmbeddedLog
) -> None:
    log.create_topic("t", 2)
    log.create_topic("other", 1)
    rows = {p: produce(log, "t", [f"v{p}{i}" for i in range(4)], partition=p) for p in range(2)}
    produce(log, "other", ["not subscribed"])
    df = (
        session.read.format("elastic-log")
        .option("subscribePattern", "t.*")
        .option("startingOffsets", json.dumps({"t": {"0": 1, "1": -2}}))
        .option("endingOffsets", json.dumps({"t": {"0": 3, "1": -1}}))
        .load(str(log.path))
    )
    assert_df_equality(df.orderBy("partition", "offset"), expected(session, rows[0][1:3] + rows[1]))


def test_bad_options_fail_with_one_clear_message(session: SparkSession, log: EmbeddedLog) -> None:
    log.create_topic("t", 2)
    with pytest.raises(Exception, match="exactly one of 'subscribe', 'subscribePattern'"):
        stream(session, log)
    with pytest.raises(Exception, match="option: expected an option of the elastic-log source"):
        stream(session, log, subscribe="t", maxOffsetPerTrigger="5")
    with pytest.raises(Exception, match=r"lacks partitions t:1"):
        session.read.format("elastic-log").option("subscribe", "t").option(
            "startingOffsets", json.dumps({"t": {"0": 0}})
        ).load(str(log.path)).collect()


@pytest.mark.parametrize(
    ("begin", "end", "limit", "admitted"),
    [
        # Everything fits.
        ({("t", 0): 0}, {("t", 0): 3}, 5, {("t", 0): 3}),
        # Proportional to backlog, exactly `limit` in all.
        ({("t", 0): 0, ("t", 1): 0}, {("t", 0): 30, ("t", 1): 10}, 8, {("t", 0): 6, ("t", 1): 2}),
        # Remainders go to the largest fractions, ties to the first partition.
        (
            {},
            {("t", 0): 1, ("t", 1): 1, ("t", 2): 1},
            2,
            {("t", 0): 1, ("t", 1): 1, ("t", 2): 0},
        ),
        # A limit of 1 still makes progress; caps add to the start.
        ({("t", 0): 7, ("u", 0): 2}, {("t", 0): 9, ("u", 0): 9}, 1, {("t", 0): 7, ("u", 0): 3}),
    ],
)
def test_max_offsets_per_trigger_splits_by_backlog(
    begin: dict[Any, int], end: dict[Any, int], limit: int, admitted: dict[Any, int]
) -> None:
    assert _admit(begin, end, limit) == admitted
