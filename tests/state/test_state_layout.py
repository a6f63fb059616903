"""Keyed state is stored in chunks; checkpoints of the old per-key layout convert by rescale.

``fixtures/layout1`` is a checkpoint written by spark-elastic 0.1.0 (one
StateStore entry per key; see ``fixtures/make_layout1.py``): a running count
at factor 2 that applied the first 40 of 60 records of 12 keys.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from chispa import assert_df_equality
from fixtures.make_layout1 import RunningCount  # the processor the fixture ran
from pyspark.sql import SparkSession

from spark_elastic import (
    read_keyed_state,
    register_log_source,
    rescale,
    starting_offsets,
    with_task_state,
)
from spark_elastic.errors import CheckpointError
from spark_elastic.state.checkpoint_dir import read_job

pytestmark = pytest.mark.slow

FIXTURE = Path(__file__).parent / "fixtures" / "layout1"


@pytest.fixture
def old(tmp_path: Path) -> Path:
    """A copy of the layout-1 fixture (log and checkpoint): specs never touch the original.

    Spark records its state schema files by absolute path (the fixture was made
    in ``/tmp/l1``): the copy's operator metadata names the copy instead, and
    loses the checksum Hadoop would verify against the old text.
    """
    root = tmp_path / "old"
    shutil.copytree(FIXTURE, root)
    for metadata in (root / "cp" / "state").glob("*/_metadata/v2/*"):
        if metadata.name.endswith(".crc"):
            continue
        metadata.write_text(metadata.read_text().replace("file:/tmp/l1/", f"file:{root}/"))
        (metadata.parent / f".{metadata.name}.crc").unlink(missing_ok=True)
    return root


def run(spark: SparkSession, log: Path, checkpoint: Path, factor: int) -> None:
    register_log_source(spark)
    events = (
        spark.readStream.format("elastic-log")
        .option("path", str(log))
        .option("subscribe", "clicks")
        .option("startingOffsets", starting_offsets(checkpoint))
        .load()
    )
    counted = events.transform(
        with_task_state(
            RunningCount(),
            job="layout1",
            checkpoint_location=checkpoint,
            elasticity_factor=factor,
            partitions={"clicks": 2},
        )
    )
    query = (
        counted.writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


def state_of(spark: SparkSession, checkpoint: Path) -> object:
    return read_keyed_state(checkpoint, spark).selectExpr(
        "cast(key as string) as key", "count", "last_offset"
    )


def expected_after(spark: SparkSession, log: Path, records: int) -> object:
    """Count and last offset per key over the log's first ``records`` records (i % 12 keys)."""
    register_log_source(spark)
    rows = (
        spark.read.format("elastic-log")
        .option("path", str(log))
        .option("subscribe", "clicks")
        .load()
        .selectExpr(
            "cast(key as string) as key", "cast(cast(value as string) as int) as i", "offset"
        )
        .where(f"i < {records}")
        .groupBy("key")
        .agg({"i": "count", "offset": "max"})
    )
    return rows.selectExpr("key", "`count(i)` as count", "`max(offset)` as last_offset")


def test_a_query_on_an_old_checkpoint_is_refused_with_the_command_that_converts_it(
    spark: SparkSession, old: Path
) -> None:
    with pytest.raises(CheckpointError) as info:
        run(spark, old / "log", old / "cp", 2)
    message = str(info.value)
    assert "\n" not in message
    assert "state layout 1" in message
    assert (
        f"spark-elastic rescale {old / 'cp'} --to NEW_CHECKPOINT --elasticity-factor 2" in message
    )
    assert read_job(old / "cp").state_layout == 1  # type: ignore[union-attr]


@pytest.mark.parametrize("factor", [2])  # the factor the refusal tells users to convert at
@pytest.mark.long  # `make test-all`, for the suite's time
def test_rescale_converts_an_old_checkpoint_and_its_query_goes_on_exactly(
    spark: SparkSession, old: Path, tmp_path: Path, factor: int
) -> None:
    assert read_job(old / "cp").state_layout == 1  # type: ignore[union-attr]
    # read_keyed_state reads the old layout as it was written...
    assert_df_equality(
        state_of(spark, old / "cp"),
        expected_after(spark, old / "log", 40),
        ignore_row_order=True,
        ignore_nullable=True,
        ignore_metadata=True,
    )
    # ...and the conversion keeps every key's state, then its query goes on exactly.
    new = tmp_path / "new"
    result = rescale(old / "cp", new, factor, spark)
    assert result.keys == 12
    assert read_job(new).state_layout == 2  # type: ignore[union-attr]
    assert_df_equality(
        state_of(spark, new),
        expected_after(spark, old / "log", 40),
        ignore_row_order=True,
        ignore_nullable=True,
        ignore_metadata=True,
    )
    run(spark, old / "log", new, factor)  # the 20 records the old query never read
    assert_df_equality(
        state_of(spark, new),
        expected_after(spark, old / "log", 60),
        ignore_row_order=True,
        ignore_nullable=True,
        ignore_metadata=True,
    )
