"""A processor sees its records exactly as pyspark gives them, however they crossed.

Records cross into the stateful operator's Python worker with their
timestamps as microseconds and without ``virtual_task`` (pyspark's worker
walks every row of every column there); the task restores both before
anything reads them. The specs: the pure restore against pyspark's own
conversion of the same instants, and a real stateful query whose processor
reports what it saw, against a batch read of the same records.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import _check_series_localize_timestamps

from spark_elastic import (
    LOG_SOURCE_FORMAT,
    EmbeddedLog,
    TaskProcessor,
    TaskState,
    register_log_source,
    starting_offsets,
    with_task_state,
    with_virtual_tasks,
)
from spark_elastic.state.crossing import Crossing

INSTANTS = pd.Series(
    pd.to_datetime(
        ["2026-03-08 09:59:59.123456", "2026-11-01 08:30:00.000001", "1969-12-31 23:59:59.5"],
        utc=True,
    )
)


@pytest.mark.parametrize("timezone", ["UTC", "America/Los_Angeles", "Asia/Kolkata"])
def test_a_timestamp_is_restored_to_what_pyspark_gives_in_the_session_s_time_zone(
    timezone: str,
) -> None:
    micros = INSTANTS.astype("int64") // 1000
    crossed = pd.DataFrame({"offset": [1, 2, 3], "timestamp": micros})
    restored = Crossing(("offset", "timestamp"), ("timestamp",), timezone).restore(crossed, "t")
    expected = _check_series_localize_timestamps(INSTANTS, timezone)
    assert restored["timestamp"].dtype == np.dtype("datetime64[ns]")
    assert restored["timestamp"].tolist() == expected.tolist()


def test_a_null_timestamp_is_restored_as_nat_whichever_way_pandas_held_it() -> None:
    for column in ([1_700_000_000_000_000, np.nan], [1_700_000_000_000_000, None]):
        crossed = pd.DataFrame({"timestamp": pd.Series(column, dtype=object)})
        out = Crossing(("timestamp",), ("timestamp",)).restore(crossed, "t")["timestamp"]
        assert out.iloc[0] == pd.Timestamp("2023-11-14 22:13:20")
        assert out.isna().tolist() == [False, True]


def test_the_task_s_name_and_key_bucket_go_back_where_they_were() -> None:
    crossed = pd.DataFrame({"key": [b"a", b"b"], "routing_key": [7, 7]})
    columns = ("key", "key_bucket", "virtual_task", "routing_key")
    out = Crossing(columns).restore(crossed, "Partition 0_1_2", 1)
    assert tuple(out.columns) == columns
    assert out["virtual_task"].tolist() == ["Partition 0_1_2"] * 2
    assert out["key_bucket"].tolist() == [1, 1]
    assert out["key_bucket"].dtype == np.dtype("int64")


def test_records_that_never_had_those_columns_are_left_as_they_are() -> None:
    crossed = pd.DataFrame({"key": [b"a"], "offset": [3]})
    out = Crossing(("key", "offset")).restore(crossed.copy(), "t")
    pd.testing.assert_frame_equal(out, crossed)


DTYPES = {
    "key": "object",
    "value": "object",
    "topic": "object",
    "partition": "int64",
    "offset": "int64",
    "timestamp": "datetime64[ns]",
    "timestampType": "int64",
    "key_bucket": "int64",
    "virtual_task": "object",
}
"""What pyspark's worker gives a transform-with-state processor, rows regrouped (before
records crossed as they do now, the same spec passed with these)."""


class Look(TaskProcessor):
    """Per record: what the processor was given (executor; pickled by reference)."""

    state_schema = "n long"
    output_schema = (
        "offset long, partition int, task string, bucket int, ts timestamp, columns string, "
        "dtypes string"
    )

    def process(self, task: TaskState, rows: pd.DataFrame) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "offset": rows["offset"],
                "partition": rows["partition"],
                "task": rows["virtual_task"],
                "bucket": rows["key_bucket"],
                "ts": rows["timestamp"],
                "columns": ",".join(rows.columns),
                "dtypes": ",".join(str(t) for t in rows.dtypes),
            }
        )


def _clicks(spark: SparkSession, tmp_path: Path, records: int) -> Any:
    """A 2-partition embedded log of ``records`` clicks; its reader for ``spark.read(Stream)``."""
    log = EmbeddedLog(tmp_path / "log", fsync=False)
    log.create_topic("clicks", 2)
    with log.producer("clicks") as producer:
        producer.send_many([f"user-{i % 7}".encode() for i in range(records)], [b"x"] * records)
    register_log_source(spark)

    def source(reader: Any) -> Any:
        return (
            reader.format(LOG_SOURCE_FORMAT)
            .option("path", str(log.path))
            .option("subscribe", "clicks")
        )

    return source


def _stateful(
    spark: SparkSession, tmp_path: Path, processor: TaskProcessor, source: Any = None
) -> Any:
    """``processor`` over ``source`` (default: 40 clicks), factor 2, as a streaming DataFrame."""
    source = source or _clicks(spark, tmp_path, 40)
    return (
        source(spark.readStream)
        .option("startingOffsets", starting_offsets(tmp_path / "cp"))
        .load()
        .transform(
            with_task_state(
                processor,
                job="look",
                checkpoint_location=str(tmp_path / "cp"),
                elasticity_factor=2,
                partitions={"clicks": 2},
            )
        )
    )


def _run(out: Any, tmp_path: Path) -> Any:
    """Run ``out`` into Parquet to the end of the log; what it wrote."""
    query = (
        out.writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    return out.sparkSession.read.parquet(str(tmp_path / "out"))


def test_a_stateful_query_s_processor_sees_what_a_batch_read_of_its_records_gives(
    spark: SparkSession, tmp_path: Path
) -> None:
    source = _clicks(spark, tmp_path, 60)
    seen = _run(_stateful(spark, tmp_path, Look(), source), tmp_path)
    tasks = with_virtual_tasks(2, partitions={"clicks": 2})
    expected = source(spark.read).load().transform(tasks)
    assert seen.count() == 60
    (seen_as,) = seen.select("columns", "dtypes").distinct().collect()
    given = [c for c in expected.columns if c != "routing_key"]
    assert seen_as.columns == ",".join(given)
    assert dict(zip(given, seen_as.dtypes.split(","), strict=True)) == DTYPES
    joined = seen.join(expected, ["partition", "offset"]).select(
        (F.col("task") == F.col("virtual_task")).alias("same_task"),
        (F.col("bucket") == F.col("key_bucket")).alias("same_bucket"),
        (F.col("ts") == F.col("timestamp")).alias("same_time"),
    )
    assert joined.count() == 60
    assert joined.filter("same_task and same_bucket and same_time").count() == 60
    assert expected.filter(F.col("timestamp") > F.lit(dt.datetime(2000, 1, 1))).count() == 60


def test_a_column_the_same_in_every_record_is_restored_in_its_place_as_a_string() -> None:
    crossed = pd.DataFrame({"key": [b"a", b"b"], "partition": [0, 1]})
    columns = ("key", "topic", "partition", "virtual_task")
    out = Crossing(columns, constants=(("topic", "clicks"),)).restore(crossed, "t")
    assert tuple(out.columns) == columns
    assert out["topic"].tolist() == ["clicks", "clicks"]
    assert out["topic"].dtype == np.dtype("object")


# -- A processor's input columns ---------------------------------------------------------------


class ValueOnly(Look):
    """Reads its records' values: the other columns need not cross."""

    input_columns = ("value",)

    def process(self, task: TaskState, rows: pd.DataFrame) -> pd.DataFrame:
        out = super().process(task, rows.assign(timestamp=pd.NaT))  # it has none to report
        out["columns"] = ",".join(rows.columns)
        out["dtypes"] = ",".join(str(t) for t in rows.dtypes)
        return out


def test_a_processor_is_given_the_columns_it_reads_and_those_its_records_are_known_by(
    spark: SparkSession, tmp_path: Path
) -> None:
    seen = _run(_stateful(spark, tmp_path, ValueOnly()), tmp_path)
    assert seen.count() == 40
    (seen_as,) = seen.select("columns", "dtypes").distinct().collect()
    given = ["key", "value", "topic", "partition", "offset", "key_bucket", "virtual_task"]
    assert seen_as.columns == ",".join(given)
    assert seen_as.dtypes.split(",") == [DTYPES[c] for c in given]


def test_input_columns_that_are_not_names_are_refused_when_the_job_is_defined() -> None:
    class Named(ValueOnly):
        input_columns = "value"  # type: ignore[assignment]

    with pytest.raises(TypeError, match=r"Named\.input_columns: expected a sequence of column"):
        with_task_state(Named(), job="j", checkpoint_location="/tmp/x", elasticity_factor=1)


def test_an_input_column_the_records_lack_is_refused_before_anything_is_written(
    spark: SparkSession, tmp_path: Path
) -> None:
    class Lacking(ValueOnly):
        input_columns = ("value", "price")

    with pytest.raises(ValueError, match=r"Lacking\.input_columns: expected columns of the rec"):
        _stateful(spark, tmp_path, Lacking())
    assert not (tmp_path / "cp").exists()


def test_in_time_order_the_timestamp_is_kept_whatever_the_processor_reads() -> None:
    from spark_elastic.dataplane.columns import KafkaColumns
    from spark_elastic.state.processor import _kept_columns

    present = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
    by_offset = _kept_columns(
        ValueOnly(), ("value",), present, KafkaColumns(), "offset", "timestamp"
    )
    in_time = _kept_columns(
        ValueOnly(), ("value",), present, KafkaColumns(), "timestamp", "timestamp"
    )
    assert by_offset is not None
    assert in_time is not None
    assert {"timestamp", "timestampType"} & set(by_offset) == set()
    assert "timestamp" in in_time
    assert "timestampType" not in in_time
    assert _kept_columns(Look(), None, present, KafkaColumns(), "offset", "timestamp") is None


def test_held_records_keep_the_columns_the_processor_reads_and_cannot_gain_one() -> None:
    from spark_elastic.errors import CheckpointError
    from spark_elastic.state.processor import _ElasticProcessor, _TaskRoute

    now = Crossing(("key", "value", "offset"))
    task = _ElasticProcessor(ValueOnly(), {}, 1, "n long", (), ("offset",), crossing=now)
    route = _TaskRoute("Partition 0_1_0", 0, 0, (("clicks", 0),))
    wider = pd.DataFrame({"key": [b"a"], "value": [b"x"], "timestamp": [1], "offset": [4]})
    assert list(task._as_crossed(route, wider).columns) == ["key", "value", "offset"]
    narrower = pd.DataFrame({"key": [b"a"], "offset": [4]})
    assert task._as_crossed(route, narrower.iloc[:0]) is not None  # nothing held: fine
    with pytest.raises(CheckpointError, match=r"Partition 0_1_0: .* without columns \['value'\]"):
        task._as_crossed(route, narrower)
