"""A BatchProcessor sees a task's records and their keys' state as columns, and is exact.

The first specs drive ``BatchProcessor.process`` against the stand-in store
of ``test_task_state.py``: what the batch holds (keys in order, each
record's key index and occurrence, the keys' state), that its update is
stored, and that an update that cannot be stored as given is refused whole.
The last one runs a vectorized running count beside the per-key one
(``RunningCount``) through a mid-batch failure, a restart and a split, on
the same log: both emit the same rows and keep the same state.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from pyspark.sql import SparkSession
from stateful_job import Job, RunningCount, RunningCountColumns, final_state
from test_task_state import FakeStore

from spark_elastic import BatchProcessor, TaskBatch, TaskUpdate, rescale
from spark_elastic.errors import ArgumentError, ArgumentTypeError
from spark_elastic.state.processor import StateField, TaskState

FIELDS = (StateField("total", "bigint", "int"), StateField("label", "string", "str"))


class Sum(BatchProcessor):
    """Per key: the sum of the records' ``amount`` and the last record's label."""

    state_schema = "total long, label string"
    output_schema = "key binary, total long"

    def process_batch(self, batch: TaskBatch) -> TaskUpdate:
        before = batch.state(default=(0, ""))
        amounts = batch.rows["amount"].to_numpy()
        total = before["total"].to_numpy() + np.bincount(
            batch.key_index, weights=amounts, minlength=len(batch.keys)
        ).astype(np.int64)
        last = pd.Series(batch.rows["label"]).groupby(batch.key_index).last()
        state = pd.DataFrame({"total": total, "label": last.to_numpy()})
        return TaskUpdate(state=state, output=pd.DataFrame({"key": batch.keys, "total": total}))


def task(store: FakeStore) -> TaskState:
    return TaskState("Partition 0_0_1", 0, 1, store, fields=FIELDS)


def rows(keys: list[bytes | None], amounts: list[int] | None = None) -> pd.DataFrame:
    amounts = amounts or [1] * len(keys)
    return pd.DataFrame({"key": keys, "amount": amounts, "label": [f"l{a}" for a in amounts]})


def test_the_batch_names_each_records_key_and_occurrence_in_order_of_first_appearance() -> None:
    seen: list[TaskBatch] = []

    class Look(Sum):
        null_keys = True

        def process_batch(self, batch: TaskBatch) -> TaskUpdate:
            seen.append(batch)
            return TaskUpdate()

    Look().process(task(FakeStore()), rows([b"b", b"a", b"b", None, b"b", b"a"]))
    (batch,) = seen
    assert batch.keys.tolist() == [b"b", b"a"]
    assert batch.key_index.tolist() == [0, 1, 0, -1, 0, 1]
    assert batch.occurrence.tolist() == [0, 0, 1, -1, 2, 1]
    assert batch.key_counts().tolist() == [3, 2]
    assert batch.has_state.tolist() == [False, False]
    assert batch.state().isna().all().all()


def test_an_update_is_stored_and_the_next_batch_reads_it_as_columns() -> None:
    store = FakeStore()
    t = task(store)
    out = Sum().process(t, rows([b"a", b"b", b"a"], [1, 2, 3]))
    assert out is not None
    assert dict(zip(out["key"], out["total"], strict=True)) == {b"a": 4, b"b": 2}
    assert not store.values  # buffered until the library flushes, as put() is
    t.flush()
    assert task(store).get(b"a") == (4, "l3")

    seen: list[pd.DataFrame] = []

    class Look(Sum):
        def process_batch(self, batch: TaskBatch) -> TaskUpdate:
            seen.append(batch.state())
            assert batch.has_state.tolist() == [True, False]
            return super().process_batch(batch)

    t = task(store)
    Look().process(t, rows([b"b", b"c"], [10, 5]))
    t.flush()
    assert seen[0].to_dict("records")[0] == {"total": 2, "label": "l2"}
    assert store.keyed() == {b"a": (4, "l3"), b"b": (12, "l10"), b"c": (5, "l5")}


def test_a_record_without_a_key_is_refused_unless_the_processor_takes_them() -> None:
    with pytest.raises(ArgumentTypeError, match="record 1 of the batch has no 'key'"):
        Sum().process(task(FakeStore()), rows([b"a", None]))


def test_a_nullable_column_stores_its_missing_values_as_nulls() -> None:
    store = FakeStore()
    t = task(store)

    class Nullable(Sum):
        def process_batch(self, batch: TaskBatch) -> TaskUpdate:
            totals = pd.array([7, None], dtype="Int64")
            return TaskUpdate(state=pd.DataFrame({"total": totals, "label": ["x", None]}))

    Nullable().process(t, rows([b"a", b"b"]))
    t.flush()
    assert store.keyed() == {b"a": (7, "x"), b"b": (None, None)}


def test_deleted_keys_are_forgotten() -> None:
    store = FakeStore()
    t = task(store)
    Sum().process(t, rows([b"a", b"b"]))

    class Forget(Sum):
        def process_batch(self, batch: TaskBatch) -> TaskUpdate:
            return TaskUpdate(delete=batch.keys == b"a")

    Forget().process(t, rows([b"a", b"b"]))
    t.flush()
    assert store.keyed() == {b"b": (1, "l1")}


@pytest.mark.parametrize(
    ("column", "found"),
    [
        (pd.Series([1.5, 2.0]), "float 1.5"),
        (pd.Series([1, None], dtype="float64"), "float 1.0 (a float64 column)"),
        (pd.Series(["1", "2"]), "str '1'"),
        (pd.Series([1 << 63, 1], dtype="uint64"), f"int {1 << 63}"),
    ],
)
def test_a_state_column_that_cannot_be_stored_as_given_writes_nothing(
    column: pd.Series, found: str
) -> None:
    store = FakeStore()
    t = task(store)
    Sum().process(t, rows([b"a", b"b"]))
    t.flush()
    before = dict(store.values)

    class Bad(Sum):
        def process_batch(self, batch: TaskBatch) -> TaskUpdate:
            return TaskUpdate(state=pd.DataFrame({"total": column, "label": ["x", "y"]}))

    t = task(store)
    expected = "column 'total' of state_schema expects bigint"
    with pytest.raises(ArgumentTypeError, match=expected) as info:
        Bad().process(t, rows([b"a", b"b"]))
    assert found in str(info.value)
    assert "\n" not in str(info.value)
    t.flush()
    assert store.values == before


@pytest.mark.parametrize(
    "update",
    [
        TaskUpdate(state=pd.DataFrame({"total": [1]})),  # no label, one row for two keys
        TaskUpdate(delete=[True]),
    ],
)
def test_an_update_of_the_wrong_shape_is_refused_naming_what_was_expected(update: Any) -> None:
    class Bad(Sum):
        def process_batch(self, batch: TaskBatch) -> TaskUpdate:
            return update  # type: ignore[no-any-return]

    with pytest.raises(ArgumentError, match="one per key of the batch"):
        Bad().process(task(FakeStore()), rows([b"a", b"b"]))


def test_a_result_that_is_not_a_task_update_is_refused() -> None:
    class Bad(Sum):
        def process_batch(self, batch: TaskBatch) -> Any:
            return pd.DataFrame()

    expected = r"Bad.process_batch\(\) result: expected a TaskUpdate"
    with pytest.raises(ArgumentTypeError, match=expected):
        Bad().process(task(FakeStore()), rows([b"a"]))


@pytest.mark.slow
def test_a_vectorized_running_count_emits_and_keeps_what_the_per_key_one_does(
    spark: SparkSession, tmp_path: Path
) -> None:
    # Through a failure mid-batch and its restart, then a split to factor 4, on equal logs.
    outputs, states = {}, {}
    for name, processor in (("keyed", RunningCount), ("columns", RunningCountColumns)):
        job = Job(spark, tmp_path / name, random.Random(7), processor=processor)
        job.produce(400)
        cp, split = tmp_path / name / "cp", tmp_path / name / "cp-4"
        job.run(cp, factor=2, fail=True)
        rescale(cp, split, elasticity_factor=4, spark=spark)
        job.produce(200)
        job.run(split, factor=4)
        outputs[name] = job.output().toPandas().sort_values(["key", "count"], ignore_index=True)
        states[name] = sorted(final_state(spark, split).collect())
    pd.testing.assert_frame_equal(outputs["keyed"], outputs["columns"])
    assert states["keyed"] == states["columns"]
    assert len(outputs["columns"]) == 600
    assert not outputs["columns"].duplicated(["key", "count"]).any()
