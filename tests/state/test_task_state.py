"""TaskState refuses what would be lost silently: wrong-typed values and keys of other tasks.

A value Arrow cannot store under the state schema would come back as null,
and a key whose bucket is not the task's would be sent to another task (or
dropped) by the next rescale. Both are refused in ``put``, before anything
reaches the StateStore. These specs use a stand-in store; one spec checks the
Python key bucket against the one Spark computes.
"""

from __future__ import annotations

from typing import Any

import pytest

from spark_elastic.dataplane.buckets import bucket_of_key
from spark_elastic.errors import ArgumentError, ArgumentTypeError
from spark_elastic.state.processor import StateField, TaskState


class FakeStore:
    """The part of Spark's MapState that TaskState uses, recording writes."""

    def __init__(self) -> None:
        self.values: dict[tuple[bytes], tuple[Any, ...]] = {}
        self.writes = 0

    def getValue(self, key: tuple[bytes]) -> tuple[Any, ...] | None:
        return self.values.get(key)

    def updateValue(self, key: tuple[bytes], value: tuple[Any, ...]) -> None:
        self.writes += 1
        self.values[key] = value

    def removeKey(self, key: tuple[bytes]) -> None:
        self.writes += 1
        self.values.pop(key, None)


FIELDS = (StateField("total", "bigint", "int"), StateField("label", "string", "str"))


def key_in_bucket(bucket: int, factor: int, hash: str = "spark") -> bytes:
    return next(
        k
        for i in range(1000)
        if bucket_of_key(k := f"user-{i}".encode(), factor, hash) == bucket  # type: ignore[arg-type]
    )


def task_state(
    bucket: int = 1, factor: int = 4, hash: str = "spark"
) -> tuple[TaskState, FakeStore]:
    store = FakeStore()
    state = TaskState(
        f"Partition 0_{bucket}_{factor}", bucket, factor, store, fields=FIELDS, hash=hash
    )
    return state, store


def test_put_of_a_wrong_typed_value_names_key_field_type_and_value() -> None:
    state, store = task_state()
    key = key_in_bucket(1, 4)
    with pytest.raises(ArgumentTypeError) as info:
        state.put(key, ("not a number", "x"))
    message = str(info.value)
    assert "\n" not in message
    for part in (repr(key), "'total'", "bigint", "'not a number'"):
        assert part in message, message
    state.flush()
    assert store.writes == 0
    assert state.get(key) is None


@pytest.mark.parametrize(
    ("value", "found"),
    [
        ((1.5, "x"), "1.5"),
        ((True, "x"), "True"),
        ((1, 7), "7"),
        ((2**63, "x"), str(2**63)),
    ],
)
def test_put_refuses_each_kind_of_mismatch(value: tuple[Any, ...], found: str) -> None:
    state, store = task_state()
    with pytest.raises(ArgumentTypeError, match=found):
        state.put(key_in_bucket(1, 4), value)
    assert store.writes == 0


def test_put_refuses_a_value_with_the_wrong_number_of_fields() -> None:
    state, _ = task_state()
    with pytest.raises(ArgumentError, match=r"2 fields \(total, label\).*found 1"):
        state.put(key_in_bucket(1, 4), (1,))


def test_put_accepts_matching_values_and_nulls() -> None:
    import numpy as np

    state, store = task_state()
    key = key_in_bucket(1, 4)
    state.put(key, (np.int64(3), None))
    state.flush()
    assert store.values == {(key,): (3, None)}


@pytest.mark.parametrize("hash", ["spark", "java"])
def test_put_of_a_key_of_another_bucket_is_refused_explaining_keyed_state(hash: str) -> None:
    state, store = task_state(1, 4, hash)
    foreign = key_in_bucket(2, 4, hash)
    with pytest.raises(ArgumentError) as info:
        state.put(foreign, (1, "x"))
    message = str(info.value)
    assert "\n" not in message
    assert repr(foreign) in message
    assert "bucket 2" in message
    assert "Partition 0_1_4" in message
    assert "record keys" in message
    state.put(key_in_bucket(1, 4, hash), (1, "x"))  # its own keys are fine
    state.flush()
    assert store.writes == 1


def test_a_global_counter_key_is_refused_by_all_but_one_task() -> None:
    # Eight tasks each putting "global-counter": at most the owner of its bucket may.
    accepted = 0
    for bucket in range(8):
        state, _ = task_state(bucket, 8)
        try:
            state.put("global-counter", (1, "x"))
            accepted += 1
        except ArgumentError:
            pass
    assert accepted == 1


def test_python_key_bucket_matches_spark(spark: Any) -> None:
    from spark_elastic.dataplane.buckets import key_bucket

    keys = [b"", b"a", b"ab", b"abc", b"abcd", b"user-17", "caf\u00e9".encode(), bytes(range(256))]
    keys += [bytes([0x80 + i, 0xFF - i, i]) for i in range(20)]
    rows = [(k, i) for i, k in enumerate(keys)]
    df = spark.createDataFrame(rows, "key binary, offset long")
    for hash in ("spark", "java"):
        got = df.select("key", key_bucket(1024, hash).alias("b")).collect()  # type: ignore[arg-type]
        for row in got:
            assert bucket_of_key(bytes(row.key), 1024, hash) == row.b, (hash, row.key)  # type: ignore[arg-type]
