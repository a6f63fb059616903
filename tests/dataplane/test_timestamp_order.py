"""Specification of timestamp order: a task's partitions merged by their head records' times.

The reference is the merge itself, one record at a time (Kafka Streams'
``PartitionGroup``): take the partition whose next record has the lowest
timestamp, ties to the lower topic then partition; each partition keeps its
offset order.
"""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest

from spark_elastic.dataplane.ordered import timestamp_order
from spark_elastic.errors import ColumnError

Record = tuple[str, int, int, int]  # topic, partition, offset, timestamp


def reference_merge(records: list[Record]) -> list[Record]:
    queues: dict[tuple[str, int], list[Record]] = {}
    for record in sorted(records, key=lambda r: (r[0], r[1], r[2])):
        queues.setdefault((record[0], record[1]), []).append(record)
    merged = []
    while any(queues.values()):
        head = min((q[0][3], tp) for tp, q in queues.items() if q)[1]
        merged.append(queues[head].pop(0))
    return merged


def ordered(records: list[Record]) -> list[Record]:
    topics, partitions, offsets, times = zip(*records, strict=True)
    return [records[i] for i in timestamp_order(topics, partitions, offsets, times)]


def test_two_streams_interleave_by_time_each_partition_in_offset_order() -> None:
    clicks = [("clicks", 0, 0, 10), ("clicks", 0, 1, 30), ("clicks", 0, 2, 50)]
    profiles = [("profiles", 0, 7, 20), ("profiles", 0, 8, 40)]
    assert [r[3] for r in ordered(profiles + clicks)] == [10, 20, 30, 40, 50]


def test_a_timestamp_that_goes_back_stays_behind_its_partitions_earlier_records() -> None:
    # The late record (time 5) is not moved before the other stream's time-20 record:
    # its partition's head was 40 until 40 went, so it comes right after 40.
    a = [("a", 0, 0, 40), ("a", 0, 1, 5), ("a", 0, 2, 60)]
    b = [("b", 0, 0, 20), ("b", 0, 1, 50)]
    assert ordered(a + b) == [b[0], a[0], a[1], b[1], a[2]]


def test_equal_head_times_go_to_the_lower_topic_then_partition() -> None:
    records = [("b", 0, 0, 7), ("a", 1, 0, 7), ("a", 0, 0, 7)]
    assert ordered(records) == [("a", 0, 0, 7), ("a", 1, 0, 7), ("b", 0, 0, 7)]


def test_matches_the_record_at_a_time_merge_on_random_streams() -> None:
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    for _ in range(200):
        records = [
            (topic, partition, offset, rng.randrange(0, 30))
            for topic in rng.sample(["a", "b", "c"], rng.randint(1, 3))
            for partition in range(rng.randint(1, 3))
            for offset in rng.sample(range(100), rng.randint(0, 12))
        ]
        rng.shuffle(records)
        if records:
            assert ordered(records) == reference_merge(records), f"seed={seed}"


def test_datetimes_order_as_their_instants() -> None:
    times = pd.to_datetime(["2026-01-01 00:00:02", "2026-01-01 00:00:01"])
    positions = timestamp_order(["a", "b"], [0, 0], [0, 0], pd.Series(times))
    assert list(positions) == [1, 0]


def test_a_null_timestamp_is_refused_naming_the_column() -> None:
    with pytest.raises(ColumnError, match=r"column 'ts' \(timestamp\).*found 1 null of 2"):
        timestamp_order(["a", "a"], [0, 0], [0, 1], pd.Series([1.0, np.nan]), "ts")


@pytest.mark.parametrize("seed", range(5))
def test_offset_order_is_topic_partition_offset_whatever_order_the_records_came_in(
    seed: int,
) -> None:
    from spark_elastic.dataplane.columns import KafkaColumns
    from spark_elastic.dataplane.ordered import in_order

    print(f"seed {seed}")
    rng = random.Random(seed)
    one = [("clicks", 1, offset) for offset in range(20, 30)]
    several = [*one, ("clicks", 0, 5), ("profiles", 1, 3), ("clicks", 1, 7)]
    for records in (one, several, [one[0]], []):
        came = records[:]
        if rng.random() < 0.7:
            rng.shuffle(came)
        rows = pd.DataFrame(came, columns=["topic", "partition", "offset"], dtype=object)
        rows.index = rows.index + 100  # a task's rows come on any index
        out = in_order(rows, "offset", KafkaColumns(), "timestamp")
        assert list(out.itertuples(index=False, name=None)) == sorted(records)
        assert list(out.index) == list(range(len(records)))
