"""Specification: the steps of holding records back (``state/holdback.py``), without Spark.

A task's records, fed in chunks of any size, come out of ``release`` in the
same order as a record-at-a-time ``PartitionGroup`` gives them (Kafka
Streams: the partition whose head is earliest goes next, and nothing goes
while a partition has no record buffered); what cannot be placed yet is
held. Once every idle partition has been waited for, what is held goes on
without it and is counted as enforced.
"""

from __future__ import annotations

import random
from typing import Any

import pandas as pd
import pytest

from spark_elastic.errors import ArgumentError
from spark_elastic.state.holdback import (
    Clock,
    check_idle,
    decode_held,
    encode_held,
    final_marks,
    held_from,
    release,
    unplaced,
)

PARTITIONS = [("clicks", 0), ("clicks", 1), ("profiles", 0)]
NEVER = 10**12
COLUMNS = ["topic", "partition", "offset", "timestamp"]


def streams(rng: random.Random, count: int) -> list[tuple[str, int, int, int]]:
    """Records of three partitions in arrival order; times mostly rise, sometimes go back."""
    offsets = dict.fromkeys(PARTITIONS, 0)
    times = dict.fromkeys(PARTITIONS, 0)
    records = []
    for _ in range(count):
        partition = rng.choice(PARTITIONS)
        times[partition] += rng.choice([-3, 1, 2, 5, 8])
        records.append((*partition, offsets[partition], times[partition]))
        offsets[partition] += 1
    return records


def one_at_a_time(chunks: list[list[tuple[str, int, int, int]]]) -> list[tuple[Any, ...]]:
    """Kafka Streams' PartitionGroup, never giving up on a partition: after each chunk
    arrives, take the head with the lowest partition-time (the highest time its partition
    reached), lower topic then partition on ties, while every partition has a head."""
    queues: dict[tuple[str, int], list[tuple[str, int, int, int]]] = {p: [] for p in PARTITIONS}
    reached: dict[tuple[str, int], int] = {}
    out = []
    for chunk in chunks:
        for record in chunk:
            queues[record[:2]].append(record)
        while all(queues.values()):
            partition = min(
                PARTITIONS, key=lambda p: (max(reached.get(p, -(10**9)), queues[p][0][3]), p)
            )
            record = queues[partition].pop(0)
            reached[partition] = max(reached.get(partition, -(10**9)), record[3])
            out.append(record)
    return out


def released(chunks: list[list[tuple[str, int, int, int]]]) -> list[tuple[Any, ...]]:
    held = pd.DataFrame(columns=COLUMNS)
    clocks: dict[tuple[str, int], Clock] = {}
    out = []
    for chunk in chunks:
        buffer = pd.concat([held, pd.DataFrame(chunk, columns=COLUMNS)], ignore_index=True)
        step = release(buffer, PARTITIONS, clocks, 0, NEVER, "timestamp")
        assert step.enforced == 0
        out += [tuple(r) for r in step.ready[COLUMNS].itertuples(index=False)]
        held, clocks = step.held, step.clocks
    return out


@pytest.mark.parametrize("run", range(20))
def test_records_come_out_as_one_at_a_time_whatever_the_chunks(run: int) -> None:
    seed = random.randrange(2**32)
    print(f"seed={seed}")
    rng = random.Random(seed)
    records = streams(rng, rng.randrange(1, 120))
    chunks, start = [], 0
    while start < len(records):
        size = rng.choice([1, 2, 7, 30, len(records)])
        chunks.append(records[start : start + size])
        start += size
    assert released(chunks) == one_at_a_time(chunks)
    assert released(chunks) == released([records])


def frame(*records: tuple[str, int, int, int]) -> pd.DataFrame:
    return pd.DataFrame(list(records), columns=COLUMNS)


def test_a_partition_with_nothing_buffered_holds_the_others_until_the_wait_is_over() -> None:
    first = release(
        frame(("clicks", 0, 0, 10), ("clicks", 0, 1, 20), ("clicks", 1, 0, 15)),
        PARTITIONS,
        {},
        now_ms=1_000,
        idle_ms=500,
        timestamp="timestamp",
    )
    assert len(first.ready) == 0
    assert len(first.held) == 3
    assert first.wake_at_ms == 1_500
    assert first.clocks[("profiles", 0)].idle_since_ms == 1_000
    early = release(first.held, PARTITIONS, first.clocks, 1_499, 500, "timestamp")
    assert len(early.ready) == 0
    assert early.wake_at_ms == 1_500
    over = release(first.held, PARTITIONS, first.clocks, 1_500, 500, "timestamp")
    assert list(over.ready["timestamp"]) == [10, 15, 20]
    assert over.enforced == 3
    assert len(over.held) == 0
    # The idle partition has been waited for: records of the others go on at once, counted
    # too, as long as each of the others has one (one that ran out is waited for anew).
    after = release(
        frame(("clicks", 0, 2, 25), ("clicks", 1, 1, 30)),
        PARTITIONS,
        over.clocks,
        1_600,
        500,
        "timestamp",
    )
    assert after.enforced == 2
    assert len(after.held) == 0
    alone = release(frame(("clicks", 1, 2, 40)), PARTITIONS, after.clocks, 1_700, 500, "timestamp")
    assert len(alone.held) == 1
    assert alone.wake_at_ms == 2_200


def test_a_partition_that_delivers_again_makes_the_others_wait_again() -> None:
    idle = {("profiles", 0): Clock(5, 0)}
    step = release(
        frame(("clicks", 0, 0, 10), ("clicks", 1, 0, 12), ("profiles", 0, 0, 11)),
        PARTITIONS,
        idle,
        now_ms=10_000,
        idle_ms=500,
        timestamp="timestamp",
    )
    # clicks-0 runs out after its one record, so the rest waits for it; profiles-0,
    # delivering again, is no longer idle.
    assert list(step.ready["timestamp"]) == [10]
    assert list(step.held["timestamp"]) == [11, 12]
    assert step.enforced == 0
    assert step.clocks[("profiles", 0)].idle_since_ms is None
    assert step.clocks[("clicks", 0)].idle_since_ms == 10_000
    assert step.wake_at_ms == 10_500


def test_without_waiting_the_records_after_a_partition_ran_out_are_counted() -> None:
    records = frame(("clicks", 0, 0, 10), ("profiles", 0, 0, 11), ("clicks", 1, 0, 12))
    step = release(records, PARTITIONS, {}, now_ms=0, idle_ms=0, timestamp="timestamp")
    # Only the first goes with every partition holding a record: clicks-0 then runs out.
    assert len(step.ready) == 3
    assert step.enforced == 2
    assert unplaced(step.ready, PARTITIONS) == 2
    assert unplaced(step.ready.iloc[:0], PARTITIONS) == 0


def test_datetime_timestamps_are_merged_and_stored_as_nanoseconds() -> None:
    records = frame(("clicks", 0, 0, 0), ("clicks", 1, 0, 0), ("profiles", 0, 0, 0))
    records["timestamp"] = pd.to_datetime(
        ["2026-01-01 00:00:03", "2026-01-01 00:00:00", "2026-01-02 00:00:00"]
    )
    step = release(records, PARTITIONS, {}, 0, NEVER, "timestamp")
    assert list(step.ready["partition"]) == [1]  # then clicks-1 has run out
    assert step.clocks[("clicks", 1)].time == pd.Timestamp("2026-01-01").value
    assert step.clocks[("clicks", 0)].time is None  # a held record does not move the clock


def test_held_records_and_clocks_round_trip_through_one_state_value() -> None:
    held = frame(("clicks", 0, 4, 10), ("clicks", 1, 2, 11))
    clocks = {("clicks", 0): Clock(9, None), ("profiles", 0): Clock(None, 1_000)}
    rows, text = encode_held(held, clocks)
    back, back_clocks = decode_held(rows, text)
    pd.testing.assert_frame_equal(back, held)
    assert back_clocks == clocks


@pytest.mark.parametrize("value", [-1, 1.5, "10", True, None])
def test_an_idle_time_that_is_not_a_whole_non_negative_number_is_refused(value: object) -> None:
    with pytest.raises(ArgumentError, match=r"^max_task_idle_ms: expected a non-negative"):
        check_idle("max_task_idle_ms", value)


@pytest.mark.parametrize("run", range(10))
def test_a_task_has_released_every_record_of_a_partition_below_where_its_mark_says_it_holds(
    run: int,
) -> None:
    # What a running job's transactional sink publishes as covered: it must be exactly what
    # was released, whatever the chunks, for a new owner to publish the rest once.
    seed = random.randrange(2**32)
    print(f"seed={seed}")
    rng = random.Random(seed)
    records = streams(rng, 60)
    held, clocks = pd.DataFrame(columns=COLUMNS), {}
    out: dict[tuple[str, int], list[int]] = {p: [] for p in PARTITIONS}
    read = 0
    while read < len(records):
        chunk = records[read : read + rng.randint(1, 10)]
        read += len(chunk)
        buffer = pd.concat([held, pd.DataFrame(chunk, columns=COLUMNS)], ignore_index=True)
        step = release(buffer, PARTITIONS, clocks, 0, NEVER, "timestamp")
        for topic, partition, offset in step.ready[["topic", "partition", "offset"]].itertuples(
            index=False
        ):
            out[(topic, partition)].append(int(offset))
        mark = final_marks([(7, held_from(step.held, timer=False))])[7]
        for p in PARTITIONS:
            seen = sum(1 for r in records[:read] if r[:2] == p)
            assert sorted(out[p]) == list(range(mark.get(p, seen))), (p, mark)
        held, clocks = step.held, step.clocks


def test_of_a_tasks_marks_in_one_batch_its_timers_is_the_last() -> None:
    holding = pd.DataFrame([("clicks", 0, 5, 1), ("clicks", 0, 6, 2)], columns=COLUMNS)
    marks = [
        (1, held_from(holding, timer=True)),
        (1, held_from(None, timer=False)),
        (2, held_from(None, timer=False)),
    ]
    assert final_marks(marks) == {1: {("clicks", 0): 5}, 2: {}}
    assert final_marks(list(reversed(marks))) == {1: {("clicks", 0): 5}, 2: {}}
