"""A stateful query gets its own state partitions and state store; the session keeps its own.

Spark copies a session's settings into a query when it starts and pins the
state partition count in the checkpoint. ``with_task_state`` must neither
change the session (other queries, other stateful jobs) nor depend on it.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery
from stateful_job import RunningCount, final_state

from spark_elastic import LOG_SOURCE_FORMAT, EmbeddedLog, register_log_source, with_task_state
from spark_elastic.errors import CheckpointError
from spark_elastic.state import holdback, processor
from spark_elastic.state.checkpoint_dir import last_batch
from spark_elastic.state.query_settings import CHANGELOG_KEY, query_settings

pytestmark = pytest.mark.slow

TOPIC = "clicks"
SHUFFLE = "spark.sql.shuffle.partitions"
PROVIDER = "spark.sql.streaming.stateStore.providerClass"
MANAGER = "spark.sql.streaming.checkpointFileManagerClass"
FILE_CONTEXT_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager"
)
HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"


@pytest.fixture
def log(spark: SparkSession, tmp_path: Path) -> EmbeddedLog:
    log = EmbeddedLog(tmp_path / "log", fsync=False)
    log.create_topic(TOPIC, 3)
    register_log_source(spark)
    return log


@pytest.fixture
def session_partitions(spark: SparkSession) -> Iterator[str]:
    """The session's own shuffle partitions, 5: neither job's state partitions (2 and 3)."""
    before = spark.conf.get(SHUFFLE)
    spark.conf.set(SHUFFLE, "5")
    yield "5"
    spark.conf.set(SHUFFLE, before)


def produce(log: EmbeddedLog, rng: random.Random, count: int) -> None:
    keys = [f"user-{rng.randrange(30)}".encode() for _ in range(count)]
    with log.producer(TOPIC) as producer:
        producer.send_many(keys, [b"x"] * count)


def stateful(
    spark: SparkSession,
    log: EmbeddedLog,
    name: str,
    cp: Path,
    factor: int,
    state_partitions: int | None = None,
) -> object:
    events = (
        spark.readStream.format(LOG_SOURCE_FORMAT)
        .option("path", str(log.path))
        .option("subscribe", TOPIC)
        .option("startingOffsets", "earliest")
        .load()
    )
    return events.transform(
        with_task_state(
            RunningCount(),
            job=name,
            checkpoint_location=cp,
            elasticity_factor=factor,
            partitions=log.partition_counts([TOPIC]),
            state_partitions=state_partitions,
        )
    )


def start(out: object, cp: Path, output: Path) -> StreamingQuery:
    return (
        out.writeStream.format("parquet")  # type: ignore[attr-defined]
        .option("path", str(output))
        .option("checkpointLocation", str(cp))
        .start()  # the default trigger: processAllAvailable returns once a batch finds nothing
    )


def counts(spark: SparkSession, cp: Path) -> dict[str, int]:
    return {r.key: r["count"] for r in final_state(spark, cp).collect()}


def run_available(out: object, cp: Path) -> StreamingQuery:
    """Start ``out`` into the noop sink on ``cp``, run what is there, and return it ended."""
    query = (
        out.writeStream.format("noop")  # type: ignore[attr-defined]
        .option("checkpointLocation", str(cp))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return query


def state_files(cp: Path) -> set[str]:
    """The names of every file under the checkpoint's state directory."""
    return {p.name for p in (cp / "state").rglob("*") if p.is_file()}


@pytest.mark.long  # `make test-all`, for the suite's time
def test_two_stateful_jobs_with_factors_2_and_4_run_side_by_side_and_restart(
    spark: SparkSession, tmp_path: Path, log: EmbeddedLog, session_partitions: str
) -> None:
    rng = random.Random(11)
    produce(log, rng, 300)
    cp_a, cp_b, cp_other = tmp_path / "cp-a", tmp_path / "cp-b", tmp_path / "cp-other"
    for run in range(2):
        # Both defined before either starts: the second must not change the first.
        # a: 6 tasks, the default (as many as local[2] runs at once); b: 12 tasks in 3.
        a = stateful(spark, log, "a", cp_a, 2)
        b = stateful(spark, log, "b", cp_b, 4, state_partitions=3 if run == 0 else None)
        assert spark.conf.get(SHUFFLE) == session_partitions
        queries = [start(a, cp_a, tmp_path / "out-a"), start(b, cp_b, tmp_path / "out-b")]
        try:
            for query in queries:
                query.processAllAvailable()
                assert query.isActive
        finally:
            for query in queries:
                query.stop()
        assert spark.conf.get(SHUFFLE) == session_partitions
        if run == 0:
            produce(log, rng, 100)
    assert last_batch(cp_a).conf[SHUFFLE] == "2"  # type: ignore[union-attr]
    assert last_batch(cp_b).conf[SHUFFLE] == "3"  # type: ignore[union-attr]
    # A checkpoint keeps its count: asking it for another is one line, nothing written.
    with pytest.raises(CheckpointError, match=r"runs 3 state partitions .* state_partitions=4"):
        stateful(spark, log, "b", cp_b, 4, state_partitions=4)

    # An unrelated query in the same session keeps the session's count.
    records = (
        spark.readStream.format(LOG_SOURCE_FORMAT)
        .option("path", str(log.path))
        .option("subscribe", TOPIC)
        .load()
    )
    other = (
        records.groupBy("partition")
        .count()
        .writeStream.format("memory")
        .queryName("unrelated")
        .outputMode("complete")
        .option("checkpointLocation", str(cp_other))
        .trigger(availableNow=True)
        .start()
    )
    other.awaitTermination()
    assert last_batch(cp_other).conf[SHUFFLE] == session_partitions  # type: ignore[union-attr]

    # Both jobs applied every record exactly once: 300, then 100 more after the restart.
    assert sum(counts(spark, cp_a).values()) == 400
    assert counts(spark, cp_a) == counts(spark, cp_b)

    # The restarts above wrote on into their file sinks' outputs, as they should. A new (or
    # rescaled) checkpoint starts at batch 0, and Spark's file sink skips batch ids its
    # _spark_metadata holds: pointed at out-a its output would be lost silently. Refused.
    with pytest.raises(CheckpointError) as info:
        start(
            stateful(spark, log, "a", tmp_path / "cp-new", 2),
            tmp_path / "cp-new",
            tmp_path / "out-a",
        )
    message = str(info.value)
    assert "\n" not in message
    assert str(tmp_path / "out-a") in message
    assert "skip" in message
    assert last_batch(tmp_path / "cp-new") is None
    assert not spark.streams.active


def test_a_session_with_another_state_store_runs_stateful_queries_on_rocksdb(
    spark: SparkSession, tmp_path: Path, log: EmbeddedLog
) -> None:
    before = spark.conf.get(PROVIDER)
    spark.conf.set(PROVIDER, HDFS_PROVIDER)
    try:
        produce(log, random.Random(3), 50)
        out = stateful(spark, log, "c", tmp_path / "cp", 1)
        query = (
            out.writeStream.format("parquet")  # type: ignore[attr-defined]
            .option("path", str(tmp_path / "out"))
            .option("checkpointLocation", str(tmp_path / "cp"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        assert spark.conf.get(PROVIDER) == HDFS_PROVIDER
        assert sum(counts(spark, tmp_path / "cp").values()) == 50
    finally:
        spark.conf.set(PROVIDER, before)


def manager_of(query: StreamingQuery) -> str | None:
    """The checkpoint file manager the running query's own session (Spark's copy) names."""
    session = query._jsq.streamingQuery().sparkSessionForStream()  # type: ignore[attr-defined]
    return str(session.conf().get(MANAGER, None)) if session.conf().contains(MANAGER) else None


def test_a_stateful_query_checkpoints_changelogs_through_the_file_system_manager_unless_told(
    spark: SparkSession, tmp_path: Path, log: EmbeddedLog
) -> None:
    # Spark's default (FileContext) starts a readlink process per file it renames on a local
    # disk without Hadoop's native library (query_settings): the RocksDB store renames
    # several per state partition and batch. A snapshot per state partition and batch
    # starts more (chmod of each file, rm -rf of its directory): a batch writes its
    # changes instead.
    rng = random.Random(5)
    assert not spark.conf.get(MANAGER, None)
    assert spark.conf.get(CHANGELOG_KEY, None) is None
    out = stateful(spark, log, "m", tmp_path / "cp", 1)
    for _ in range(2):  # two batches: RocksDB snapshots a store's first version
        produce(log, rng, 20)
        query = run_available(out, tmp_path / "cp")
    assert (manager_of(query) or "").endswith(".FileSystemBasedCheckpointFileManager")
    assert not spark.conf.get(MANAGER, None)  # the session as it was
    assert spark.conf.get(CHANGELOG_KEY, None) is None
    assert sum(counts(spark, tmp_path / "cp").values()) == 40
    state = state_files(tmp_path / "cp")
    assert "2.changelog" in state, sorted(state)
    assert not any(n.startswith(("2.", "2_")) and n.endswith(".zip") for n in state), state

    # A session that says whether to checkpoint changelogs keeps its choice.
    spark.conf.set(CHANGELOG_KEY, "false")
    try:
        assert CHANGELOG_KEY not in query_settings(out, "spark_elastic")  # type: ignore[arg-type]
    finally:
        spark.conf.unset(CHANGELOG_KEY)
    assert query_settings(out, "spark_elastic")[CHANGELOG_KEY] == "true"  # type: ignore[arg-type]

    # A session that names a manager keeps it for its stateful queries too.
    spark.conf.set(MANAGER, FILE_CONTEXT_MANAGER)
    try:
        assert MANAGER not in query_settings(out, "spark_elastic")  # type: ignore[arg-type]
    finally:
        spark.conf.unset(MANAGER)
    assert query_settings(out, "spark_elastic")[MANAGER] == manager_of(query)  # type: ignore[arg-type]


def test_a_checkpoint_written_with_snapshots_goes_on_with_changelogs_exactly(
    spark: SparkSession, tmp_path: Path, log: EmbeddedLog
) -> None:
    # Checkpoints written before changelogs were the local disk's default: their next
    # batch loads the last snapshot and writes its changes from there.
    rng = random.Random(6)
    out = stateful(spark, log, "u", tmp_path / "cp", 1)
    for changelogs in (False, True):
        produce(log, rng, 25)
        if not changelogs:
            spark.conf.set(CHANGELOG_KEY, "false")
        try:
            run_available(out, tmp_path / "cp")  # the query copies the session's settings
        finally:
            spark.conf.unset(CHANGELOG_KEY)
        state = state_files(tmp_path / "cp")
        assert ("1.changelog" in state) is False, sorted(state)
        assert ("2.changelog" in state) is changelogs, sorted(state)
    assert sum(counts(spark, tmp_path / "cp").values()) == 50


def test_a_query_started_around_the_hook_runs_exactly_on_the_sessions_count_and_keeps_it(
    spark: SparkSession, tmp_path: Path, log: EmbeddedLog, session_partitions: str
) -> None:
    # A task's state is keyed by its routing key, not placed by partition: a query started
    # without the hook (from the JVM, Spark Connect) pins the session's count and is exact.
    from pyspark.sql.streaming.readwriter import DataStreamWriter

    produce(log, random.Random(4), 60)
    cp = tmp_path / "cp"

    def writer() -> DataStreamWriter:
        return (
            stateful(spark, log, "d", cp, 2)  # type: ignore[attr-defined]
            .writeStream.format("parquet")
            .option("path", str(tmp_path / "out"))
            .option("checkpointLocation", str(cp))
            .trigger(availableNow=True)
        )

    unwrapped = DataStreamWriter.start.__wrapped__  # type: ignore[attr-defined]
    unwrapped(writer()).awaitTermination()
    assert last_batch(cp).conf[SHUFFLE] == session_partitions  # type: ignore[union-attr]
    assert sum(counts(spark, cp).values()) == 60

    # Started through the hook later, it keeps the checkpoint's count and goes on exactly.
    produce(log, random.Random(5), 40)
    writer().start().awaitTermination()
    assert last_batch(cp).conf[SHUFFLE] == session_partitions  # type: ignore[union-attr]
    assert sum(counts(spark, cp).values()) == 100


@pytest.mark.parametrize(
    "ddl",
    [
        processor.CHUNK_KEY_SCHEMA,
        processor.CHUNK_VALUE_SCHEMA,
        processor.LAYOUT_SCHEMA,
        processor.CHECKPOINT_KEY_SCHEMA,
        processor.CHECKPOINT_VALUE_SCHEMA,
        holdback.HELD_SCHEMA,
    ],
)
def test_the_state_schemas_go_to_spark_as_the_structs_it_parses_from_their_ddl(
    spark: SparkSession, ddl: str
) -> None:
    # A StructType saves a parse round trip per state variable and task; it must be the
    # schema Spark stored in checkpoints made from the DDL, or those would not load.
    from spark_elastic.state.processor import struct_of

    assert struct_of(ddl) == spark.createDataFrame([], ddl).schema
