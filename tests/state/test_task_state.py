"""TaskState refuses what would be lost silently: wrong-typed values and keys of other tasks.

A value Arrow cannot store under the state schema would come back as null,
and a key whose bucket is not the task's would be sent to another task (or
dropped) by the next rescale. Both are refused in ``put``, before anything
reaches the StateStore. These specs use a stand-in store; one spec checks the
Python key bucket against the one Spark computes.

A rescaled checkpoint's first batch gives each task its seed, then its
records: the task's step reads the seed it was given, never the store (at a
million keys that read was a third of the batch), and writes each seeded
chunk once, as it leaves it; the seed of a task without records is written
as the partition closes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from spark_elastic.dataplane.buckets import SLOTS, bucket_of_key
from spark_elastic.errors import ArgumentError, ArgumentTypeError
from spark_elastic.state.chunks import GROW_AT, Layout, decode
from spark_elastic.state.processor import StateField, TaskState


class FakeStore:
    """The part of MapState that TaskState uses (chunk -> entries, data), recording calls."""

    def __init__(self) -> None:
        self.values: dict[tuple[int], tuple[int, bytes]] = {}
        self.writes = 0
        self.reads = 0

    def getValue(self, key: tuple[int]) -> tuple[int, bytes] | None:
        self.reads += 1
        return self.values.get(key)

    def updateValue(self, key: tuple[int], value: tuple[int, bytes]) -> None:
        self.writes += 1
        self.values[key] = value

    def removeKey(self, key: tuple[int]) -> None:
        self.writes += 1
        self.values.pop(key, None)

    def iterator(self) -> Iterator[tuple[tuple[int], tuple[int, bytes]]]:
        self.reads += 1  # one paged call, however many chunks
        return iter(list(self.values.items()))

    def keyed(self) -> dict[bytes, tuple[Any, ...]]:
        """Every stored key's value, decoded from its chunk."""
        out = {}
        for (_chunk,), (entries, data) in self.values.items():
            decoded = decode(data)
            assert len(decoded) == entries
            for key, (slot, value) in decoded.items():
                assert slot & ((1 << 20) - 1) == slot
                out[key] = value
        return out


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
    assert store.keyed() == {key: (3, None)}


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


# -- the chunk layout: round trips per chunk, not per key ---------------------------------------


def keys_in_bucket(bucket: int, factor: int, count: int) -> list[bytes]:
    found = []
    i = 0
    while len(found) < count:
        key = f"k-{i}".encode()
        if bucket_of_key(key, factor) == bucket:
            found.append(key)
        i += 1
    return found


def reopened(store: FakeStore, layout: Layout, bucket: int = 1, factor: int = 4) -> TaskState:
    """The same task in the next micro-batch: a new TaskState over the same store."""
    return TaskState(
        f"Partition 0_{bucket}_{factor}", bucket, factor, store, fields=FIELDS, layout=layout
    )


def test_a_small_task_writes_all_its_keys_in_one_round_trip() -> None:
    state, store = task_state()
    keys = keys_in_bucket(1, 4, 50)
    for i, key in enumerate(keys):
        state.put(key, (i, "x"))
    layout = state.flush()
    assert store.writes == 1
    assert layout == Layout(depth=2, keys=50)  # depth log2(4): one chunk per task
    again = reopened(store, layout)
    reads = store.reads
    assert [again.get(k) for k in keys] == [(i, "x") for i in range(50)]
    assert store.reads == reads + 1


def test_chunks_double_as_keys_grow_and_every_key_survives() -> None:
    state, store = task_state()
    keys = keys_in_bucket(1, 4, 3 * GROW_AT)
    for i, key in enumerate(keys):
        state.put(key, (i, None))
    layout = state.flush()
    assert layout.keys == len(keys)
    assert layout.depth > 2
    chunks = len(store.values)
    assert 1 < chunks <= (1 << layout.depth) // 4
    assert max(entries for entries, _ in store.values.values()) < len(keys)
    assert store.keyed() == {k: (i, None) for i, k in enumerate(keys)}
    # The next batch reads one chunk per key it touches, never all chunks for one key.
    again = reopened(store, layout)
    reads = store.reads
    assert again.get(keys[7]) == (7, None)
    assert store.reads == reads + 1


def test_chunks_of_large_values_double_by_their_size_not_their_key_count() -> None:
    from spark_elastic.state.chunks import TARGET_BYTES

    # A key touched rewrites its whole chunk: 200 keys of 4 KiB are not one chunk of 800 KiB.
    state, store = task_state()
    keys = keys_in_bucket(1, 4, 200)
    values = {k: (i, f"{i:>4}" * 1024) for i, k in enumerate(keys)}  # distinct: pickled apart
    for key, value in values.items():
        state.put(key, value)
    layout = state.flush()
    assert len(keys) < GROW_AT  # by key count alone it would stay one chunk
    assert len(store.values) > 1
    assert max(len(data) for _, data in store.values.values()) <= 2 * TARGET_BYTES
    assert store.keyed() == values
    small, _ = task_state()
    for i, key in enumerate(keys):
        small.put(key, (i, None))
    assert small.flush().depth < layout.depth


def test_a_batch_touching_most_chunks_reads_them_in_one_paged_call() -> None:
    state, store = task_state()
    keys = keys_in_bucket(1, 4, 3 * GROW_AT)
    for key in keys:
        state.put(key, (1, None))
    layout = state.flush()
    again = reopened(store, layout)

    again._prefetch([bucket_of_key(k, SLOTS) for k in keys])
    reads = store.reads
    assert all(again.get(k) == (1, None) for k in keys)
    assert store.reads == reads


def _seeded_store(count: int) -> tuple[FakeStore, Layout, list[bytes]]:
    """A task's state as a seed writes it: chunks in the store, and the same bytes in hand."""
    state, store = task_state()
    keys = keys_in_bucket(1, 4, count)
    for i, key in enumerate(keys):
        state.put(key, (i, None))
    return store, state.flush(), keys


def seeded(store: FakeStore, layout: Layout) -> TaskState:
    chunks = {c: data for (c,), (_, data) in store.values.items()}
    return TaskState("Partition 0_1_4", 1, 4, store, fields=FIELDS, layout=layout, seeded=chunks)


def test_a_seeded_task_reads_its_chunks_from_the_seed_not_back_from_the_store() -> None:
    store, layout, keys = _seeded_store(3 * GROW_AT)
    state = seeded(store, layout)
    reads = store.reads
    state._prefetch([bucket_of_key(k, SLOTS) for k in keys])
    assert [state.get(k) for k in keys] == [(i, None) for i in range(len(keys))]
    assert state.get(keys_in_bucket(1, 4, len(keys) + 1)[-1]) is None  # a key without state
    assert store.reads == reads


def test_a_seeded_task_writes_only_the_chunks_it_changed() -> None:
    store, layout, keys = _seeded_store(3 * GROW_AT)
    before = dict(store.values)
    state = seeded(store, layout)
    state.put(keys[0], (100, "new"))
    writes = store.writes
    assert state.flush() == layout
    assert store.writes == writes + 1
    changed = {c for c in store.values if store.values[c] != before[c]}
    assert len(changed) == 1
    assert store.keyed() == {
        k: (100, "new") if k == keys[0] else (i, None) for i, k in enumerate(keys)
    }


def test_a_seeded_task_that_grows_regroups_every_seeded_key() -> None:
    store, layout, keys = _seeded_store(GROW_AT)  # one chunk, full
    state = seeded(store, layout)
    more = keys_in_bucket(1, 4, 3 * GROW_AT)[len(keys) :]
    for key in more:
        state.put(key, (-1, None))
    grown = state.flush()
    assert grown.depth > layout.depth
    assert grown.keys == len(keys) + len(more)
    assert store.keyed() == {
        **{k: (i, None) for i, k in enumerate(keys)},
        **dict.fromkeys(more, (-1, None)),
    }


def unstored(store: FakeStore, layout: Layout) -> tuple[TaskState, dict[int, bytes]]:
    """A task seeded with the store's chunks, which are then taken out of the store."""
    chunks = {c: data for (c,), (_, data) in store.values.items()}
    entries = {c: n for (c,), (n, _) in store.values.items()}
    store.values.clear()
    state = TaskState(
        "Partition 0_1_4",
        1,
        4,
        store,
        fields=FIELDS,
        layout=layout,
        seeded=chunks,
        unstored=entries,
    )
    return state, chunks


def test_a_task_seeded_in_hand_writes_each_chunk_once_as_it_leaves_it() -> None:
    store, layout, keys = _seeded_store(3 * GROW_AT)
    state, chunks = unstored(store, layout)
    state.put(keys[0], (100, "new"))
    state.delete(keys[1])
    writes = store.writes
    assert state.flush() == Layout(layout.depth, layout.keys - 1)
    assert store.writes == writes + len(chunks)  # each once: the seed's write is the step's
    assert store.keyed() == {
        k: (100, "new") if k == keys[0] else (i, None) for i, k in enumerate(keys) if k != keys[1]
    }
    touched = {c for (c,), (_, data) in store.values.items() if data != chunks[c]}
    assert len(touched) <= 2  # the others as they came, not decoded and encoded again
    state.flush()
    assert store.writes == writes + len(chunks)  # written once, not at every flush


def test_a_seeded_chunk_emptied_before_it_was_stored_is_not_removed() -> None:
    store, layout, keys = _seeded_store(1)
    state, _ = unstored(store, layout)
    state.delete(keys[0])
    assert state.flush() == Layout(layout.depth, 0)
    assert (store.values, store.writes) == ({}, 1)  # the seed's one write; no removal


def test_a_task_seeded_in_hand_that_grows_writes_every_key() -> None:
    store, layout, keys = _seeded_store(GROW_AT)
    state, _ = unstored(store, layout)
    more = keys_in_bucket(1, 4, 3 * GROW_AT)[len(keys) :]
    for key in more:
        state.put(key, (-1, None))
    assert state.flush().depth > layout.depth
    assert store.keyed() == {
        **{k: (i, None) for i, k in enumerate(keys)},
        **dict.fromkeys(more, (-1, None)),
    }


def test_deleting_every_key_of_a_chunk_removes_the_chunk() -> None:
    state, store = task_state()
    keys = keys_in_bucket(1, 4, 3)
    for key in keys:
        state.put(key, (1, None))
    layout = state.flush()
    again = reopened(store, layout)
    for key in keys:
        again.delete(key)
    again.delete(keys[0])  # twice: still one key fewer, not two
    assert again.flush() == Layout(layout.depth, 0)
    assert store.values == {}


def test_a_step_knows_each_key_s_hash_once_in_bytes_and_not_null_keys() -> None:
    import pandas as pd

    from spark_elastic.state.processor import _key_hashes

    keys = pd.Series(["b", None, "a", "b", "a", None], dtype=object)
    hashes = pd.Series([7, 0, 3, 7, 3, 0])
    assert _key_hashes(keys, hashes) == {b"b": 7, b"a": 3}
    binary = pd.Series([b"k", b"k", bytearray(b"j")], dtype=object)
    assert _key_hashes(binary, pd.Series([1, 1, 2])) == {b"k": 1, b"j": 2}


class _Recorded:
    """A state variable stand-in that records each call the processor makes."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        def call(*_: Any) -> None:
            self.calls.append(name)

        return call


def _seed_rows(routing_key: int) -> Any:
    import pandas as pd

    from spark_elastic.state.checkpoint_dir import SEED_SCHEMA

    names = [column.split()[0] for column in SEED_SCHEMA.split(", ")]
    rows = [
        {"kind": "chunk", "chunk": 1, "entries": 2, "data": b"c1"},
        {"kind": "layout", "depth": 3, "keys": 2},
        {"kind": "checkpoint", "stream": "clicks", "partition": 0, "key_bucket": 1, "factor": 4}
        | {"next_offset": 40},
    ]
    return pd.DataFrame([{**dict.fromkeys(names), "routing_key": routing_key, **r} for r in rows])


def _seeding_step() -> Any:
    from spark_elastic.state.processor import _ElasticProcessor, _TaskRoute

    routes = {k: _TaskRoute(f"Partition 0_{k}_4", k % 4, k, (("clicks", 0),)) for k in (5, 7)}
    step = _ElasticProcessor(object(), routes, 4, "n long", (), ("n",))  # type: ignore[arg-type]
    step.state, step.layout, step.checkpoints = _Recorded(), _Recorded(), _Recorded()
    return step


class _Client:
    """pyspark's state client, as far as close() uses it: whose key is set, recorded."""

    def __init__(self, step: Any) -> None:
        self.step = step

    def set_implicit_key(self, key: tuple[Any, ...]) -> None:
        self.step.state.calls.append(f"key {key}")

    def remove_implicit_key(self) -> None:
        self.step.state.calls.append("no key")


def _deferring_step() -> Any:
    step = _seeding_step()
    step._client = _Client(step)
    return step


def test_seeded_chunks_wait_for_their_task_s_step_which_writes_them() -> None:
    step = _deferring_step()
    step.handleInitialState((5,), _seed_rows(5), None)
    step.handleInitialState((7,), _seed_rows(7), None)
    assert step.state.calls == []  # chunks wait; the layout and checkpoints are written
    assert (step.layout.calls, step.checkpoints.calls) == (["update"] * 2, ["updateValue"] * 2)
    assert list(step.handleInputRows((7,), iter([]), None)) == []
    assert step.state.calls == ["updateValue"]  # task 7 had no records to apply: as it came
    step.close()  # task 5 had no step: its seed is written under its own key
    assert step.state.calls == ["updateValue", "key (5,)", "updateValue", "no key"]
    assert (step._seeds, step._seeds_size) == ({}, 0)


def test_close_writes_nothing_when_every_seed_was_written() -> None:
    step = _deferring_step()
    step.handleInitialState((7,), _seed_rows(7), None)
    list(step.handleInputRows((7,), iter([]), None))
    step.close()
    assert step.state.calls == ["updateValue"]


def test_a_deferred_seed_crossing_the_worker_s_bound_is_written_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from spark_elastic.state import processor

    monkeypatch.setattr(processor, "_SEEDS_KEPT_BYTES", 3)
    step = _deferring_step()
    more = _seed_rows(7)
    more.loc[len(more)] = more.iloc[0].to_dict() | {"chunk": 2, "data": b"c2"}
    step.handleInitialState((7,), more, None)  # chunk 1 kept, chunk 2 crosses the bound
    assert step.state.calls == ["updateValue"] * 2  # in the seed's own call, under its key
    assert not step._seeds[7].whole
    step.close()
    assert step.state.calls == ["updateValue"] * 2


def test_seeds_are_written_and_kept_until_their_own_task_s_step() -> None:
    step = _seeding_step()  # without pyspark's client: each seed written as it comes
    # pyspark may hand over every seed of a partition before any task's records.
    step.handleInitialState((5,), _seed_rows(5), None)
    step.handleInitialState((7,), _seed_rows(7), None)
    # Written as before: the seed is the checkpoint's state whether or not a step follows.
    assert (step.state.calls, step.layout.calls, step.checkpoints.calls) == (
        ["updateValue"] * 2,
        ["update"] * 2,
        ["updateValue"] * 2,
    )
    five = step._seeds[5]
    assert (five.chunks, five.layout, five.whole) == ({1: b"c1"}, Layout(3, 2), True)
    assert five.checkpoints == {("clicks", 0, 1, 4): 40}
    assert list(step.handleInputRows((7,), iter([]), None)) == []
    assert set(step._seeds) == {5}  # task 7's step took its own seed only
    step.handleInitialState((5,), _seed_rows(5), None)  # its chunk again: it replaces
    assert step._seeds_size == step._seeds[5].size == len(b"c1")
    step.close()  # task 5 had no records: its state is in the store
    assert step._seeds == {}
    assert step._seeds_size == 0


def test_a_seed_beyond_the_worker_s_bound_is_read_back_not_kept_in_part(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from spark_elastic.state import processor

    monkeypatch.setattr(processor, "_SEEDS_KEPT_BYTES", 3)
    step = _seeding_step()
    step.handleInitialState((5,), _seed_rows(5), None)  # 2 bytes: kept
    more = _seed_rows(7)
    more.loc[len(more)] = more.iloc[0].to_dict() | {"chunk": 2, "data": b"c2"}
    step.handleInitialState((7,), more, None)  # 2 + 4 bytes: not all of it
    assert step._seeds[5].whole
    assert (step._seeds[7].whole, step._seeds[7].chunks) == (False, {})
    assert step._seeds_size == 2
    assert step.state.calls == ["updateValue"] * 3  # every chunk written all the same


class _NoReads(_Recorded):
    """A state variable stand-in for a seeded checkpoint's first batch: nothing to read."""

    def getValue(self, *_: Any) -> None:
        raise AssertionError("a seeded task's first step read a chunk back")

    def get(self) -> None:
        raise AssertionError("a seeded task's first step read its layout back")

    def iterator(self) -> Any:
        raise AssertionError("a seeded task's first step read its chunks or checkpoints back")


def test_a_seeded_task_s_first_step_counts_on_from_its_seed_without_reading_it_back() -> None:
    import pandas as pd
    from key_counts import Count  # the runtime specs' running count per key

    from spark_elastic.state.chunks import encode
    from spark_elastic.state.processor import _METRICS, BUCKET_HASH, _ElasticProcessor, _TaskRoute

    slot = 4 * 1000 + 1  # a key slot of bucket 1 of 4 (the step takes its slot from Spark)
    seed = _seed_rows(5)
    seed.loc[0, ["data", "entries"]] = [encode({b"k": (slot, (5,))}), 1]  # chunk 1: k -> 5
    seed.loc[1, ["depth", "keys"]] = [2, 1]
    route = _TaskRoute("Partition 0_1_4", 1, 5, (("clicks", 0),))
    fields = (StateField("n", "bigint", "int"),)
    step = _ElasticProcessor(Count(), {5: route}, 4, "n long", fields, ("key", "n"))
    step.state, step.layout, step.checkpoints = _NoReads(), _NoReads(), _NoReads()
    step.handleInitialState((5,), seed, None)
    records = pd.DataFrame(
        {
            "key": [b"k", b"k"],
            "topic": ["clicks"] * 2,
            "partition": [0, 0],
            "offset": [39, 40],  # 39 is below the seed's checkpoint (40): applied already
            "routing_key": [5, 5],
            BUCKET_HASH: [slot, slot],
        }
    )
    out = pd.concat(step.handleInputRows((5,), iter([records]), None))
    assert out[out[_METRICS].isna()]["n"].tolist() == [6]  # the figures ride on a copy
    assert step.state.calls == ["updateValue", "updateValue"]  # the seed, then the step
    step.close()
    assert step.state.calls == ["updateValue", "updateValue"]


def test_a_deferred_seed_is_written_once_by_its_step_with_the_step_s_changes() -> None:
    import pandas as pd
    from key_counts import Count

    from spark_elastic.state.chunks import decode, encode
    from spark_elastic.state.processor import BUCKET_HASH, _ElasticProcessor, _TaskRoute

    slot = 4 * 1000 + 1
    seed = _seed_rows(5)
    seed.loc[0, ["data", "entries"]] = [encode({b"k": (slot, (5,))}), 1]
    seed.loc[1, ["depth", "keys"]] = [2, 1]
    route = _TaskRoute("Partition 0_1_4", 1, 5, (("clicks", 0),))
    fields = (StateField("n", "bigint", "int"),)
    step = _ElasticProcessor(Count(), {5: route}, 4, "n long", fields, ("key", "n"))
    store = FakeStore()
    step.state, step.layout, step.checkpoints = store, _NoReads(), _NoReads()
    step._client = object()  # present: nothing is set under another key in this spec
    step.handleInitialState((5,), seed, None)
    assert store.writes == 0
    records = pd.DataFrame(
        {
            "key": [b"k"],
            "topic": ["clicks"],
            "partition": [0],
            "offset": [40],
            "routing_key": [5],
            BUCKET_HASH: [slot],
        }
    )
    list(step.handleInputRows((5,), iter([records]), None))
    assert (store.writes, store.reads) == (1, 0)
    assert {k: v for k, (_, v) in decode(store.values[(1,)][1]).items()} == {b"k": (6,)}


_PLANNING_PASS = """
import json, pickle, sys

class Client:  # pyspark's state client in the planning pass, as far as init() reads it
    class handle_state:
        name = "PRE_INIT"

class Handle:
    _statefulProcessorApiClient = Client()
    def __init__(self):
        self.registered = []
    def getMapState(self, name, key_schema, value_schema):
        self.registered.append(["map", name, key_schema.simpleString()])
    def getValueState(self, name, schema):
        self.registered.append(["value", name, schema.simpleString()])

processor = pickle.loads(open(sys.argv[1], "rb").read())
handle = Handle()
processor.init(handle)
processor.close()
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("spark_elastic", "pandas", "tests"))
print(json.dumps({"registered": handle.registered, "loaded": loaded}))
"""


def test_spark_s_planning_pass_registers_the_state_variables_and_loads_no_code_of_ours(
    tmp_path: Any,
) -> None:
    # To plan a query's first batch Spark unpickles the stateful processor in a fresh Python
    # process on the driver, only to call init(), at every start of every stateful query:
    # spark-elastic's modules, the user's processor and what it imports (pandas) stay out.
    import json
    import subprocess
    import sys

    from pyspark import cloudpickle

    from spark_elastic.state.processor import _as_stateful_processor, _ElasticProcessor

    class Count:
        def process(self, task: Any, rows: Any) -> Any:
            return rows

    step = _ElasticProcessor(Count(), {}, 4, "n long", (), ("n",))  # type: ignore[arg-type]
    shipped = tmp_path / "processor.pickle"
    shipped.write_bytes(cloudpickle.dumps(_as_stateful_processor(step)))
    ran = subprocess.run(
        [sys.executable, "-c", _PLANNING_PASS, str(shipped)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    seen = json.loads(ran.stdout)
    assert seen["loaded"] == []
    assert [(kind, name) for kind, name, _ in seen["registered"]] == [
        ("map", "user_state_chunks"),
        ("value", "user_state_layout"),
        ("map", "bucket_checkpoints"),
    ]


def test_a_processor_that_cannot_be_pickled_is_refused_naming_it() -> None:
    import threading

    from spark_elastic.state.processor import _as_stateful_processor, _ElasticProcessor

    class Locked:
        def __init__(self) -> None:
            self.lock = threading.Lock()

        def process(self, task: Any, rows: Any) -> Any:
            return rows

    step = _ElasticProcessor(Locked(), {}, 4, "n long", (), ("n",))  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError, match=r"^processor: expected .* found Locked that"):
        _as_stateful_processor(step)
