"""A task step's output crosses back as the processor gave it, its figures on one more row.

pyspark converts every frame a stateful processor yields to an Arrow batch
of its own, at about a millisecond each whatever its size, and a column of
null arrays row by row. So a step's figures (records processed, skipped,
held...) are one comma-separated string on a copy of the step's last output
row, null on every output row; a step without output yields them alone. The
JVM tells the two apart by that column alone: output rows are where it is
null. The specs: the frames a step yields, and pyspark's own conversion of
them against the declared schema.
"""

from __future__ import annotations

from collections.abc import Iterator

import pandas as pd
from pyspark.sql import SparkSession
from pyspark.sql.conversion import PandasToArrowConversion
from pyspark.sql.types import StructField, StructType

from spark_elastic import TaskProcessor, TaskState
from spark_elastic.state.processor import (
    _HELD_FROM,
    _METRICS,
    _TASK,
    _ElasticProcessor,
    _TaskRoute,
)

FIGURES = (3, 1, 250, 900, 0, 2)
ROUTE = _TaskRoute("Partition 0_4_1", 1, 5, (("clicks", 0),))


class Counts(TaskProcessor):
    state_schema = "n long"
    output_schema = "user string, clicks long"

    def process(self, task: TaskState, rows: pd.DataFrame) -> pd.DataFrame:
        raise AssertionError("the specs hand the step its output directly")


def _step(idle_ms: int = 0) -> _ElasticProcessor:
    return _ElasticProcessor(Counts(), {}, 4, "n long", (), ("user", "clicks"), idle_ms=idle_ms)


def _frames(*sizes: int) -> Iterator[pd.DataFrame]:
    start = 0
    for size in sizes:
        yield pd.DataFrame(
            {
                "user": [f"u{i}" for i in range(start, start + size)],
                "clicks": pd.Series(range(start, start + size), dtype="int64"),
            }
        )
        start += size


def test_the_figures_ride_on_a_copy_of_the_last_output_row() -> None:
    first, last = _step()._tagged(_frames(2, 3), FIGURES, ROUTE, None)
    assert first[_METRICS].isna().all()
    assert list(first["user"]) == ["u0", "u1"]
    assert len(last) == 4
    assert last[_METRICS].isna().tolist() == [True, True, True, False]
    assert last[_METRICS].iloc[-1] == "3,1,250,900,0,2"
    assert last.iloc[-1][["user", "clicks"]].tolist() == ["u4", 4]
    assert last["clicks"].dtype == "int64"  # the copy keeps the column's type
    assert list(last.index) == [0, 1, 2, 3]


def test_a_step_without_output_yields_its_figures_alone() -> None:
    (only,) = _step()._tagged(_frames(0, 0), FIGURES, ROUTE, None)
    assert len(only) == 1
    assert only[["user", "clicks"]].isna().all(axis=None)
    assert only[_METRICS].iloc[0] == "3,1,250,900,0,2"


def test_a_holding_query_s_task_and_mark_are_on_the_figures_row_only() -> None:
    (frame,) = _step(idle_ms=100)._tagged(_frames(2), FIGURES, ROUTE, "clicks:0=7")
    assert frame[_TASK].tolist() == [None, None, 5]
    assert frame[_HELD_FROM].tolist() == [None, None, "clicks:0=7"]
    (alone,) = _step(idle_ms=100)._tagged(_frames(), FIGURES, ROUTE, "clicks:0=7")
    assert alone[[_TASK, _HELD_FROM]].iloc[0].tolist() == [5, "clicks:0=7"]


def test_pyspark_converts_every_frame_a_step_yields_to_the_declared_schema(
    spark: SparkSession,
) -> None:
    ddl = f"user string, clicks long, {_METRICS} string, {_TASK} long, {_HELD_FROM} string"
    schema = StructType([StructField("_0", spark.createDataFrame([], ddl).schema)])
    frames = [
        *_step(idle_ms=100)._tagged(_frames(2, 1), FIGURES, ROUTE, "m"),
        *_step(idle_ms=100)._tagged(_frames(), FIGURES, ROUTE, "m"),
    ]
    batches = [
        PandasToArrowConversion.convert(
            [f], schema, timezone="UTC", safecheck=True, arrow_cast=True, assign_cols_by_name=True
        )
        for f in frames
    ]
    rows = [row["_0"] for b in batches for row in b.to_pylist()]
    assert [r[_METRICS] for r in rows] == [None, None, None, "3,1,250,900,0,2", "3,1,250,900,0,2"]
    assert [r["clicks"] for r in rows] == [0, 1, 2, 2, None]
    assert [r[_TASK] for r in rows] == [None, None, None, 5, 5]
