"""Specification of per-bucket checkpoints and the split/merge start rule (SEP-32)."""

from __future__ import annotations

import random

import pytest

from spark_elastic.errors import ArgumentError
from spark_elastic.state.bucket_checkpoints import (
    BucketCheckpoint,
    bucket_start,
    cover_start,
    is_covered,
    prune_covered,
    resolve_starts,
)


def cp(bucket: int, factor: int, offset: int, partition: int = 0) -> BucketCheckpoint:
    return BucketCheckpoint("kafka", "PVE", partition, bucket, factor, offset)


def test_split_child_inherits_parent_checkpoint() -> None:
    parent = [cp(1, 2, 100)]
    assert bucket_start(parent, 1, 4) == 100
    assert bucket_start(parent, 3, 4) == 100
    assert bucket_start(parent, 0, 4) is None  # bucket 0 at 4 descends from bucket 0 at 2


def test_merged_task_starts_at_smallest_child_checkpoint() -> None:
    children = [cp(1, 4, 120), cp(3, 4, 90)]
    assert bucket_start(children, 1, 2) == 90


def test_merge_needs_every_child() -> None:
    assert bucket_start([cp(1, 4, 120)], 1, 2) is None


def test_general_rule_takes_larger_of_ancestor_and_descendant_minimum() -> None:
    # Deploys at factors 1, 2 and 4 left checkpoints for partition 0.
    mixed = [cp(0, 1, 50), cp(1, 2, 70), cp(1, 4, 90), cp(3, 4, 80)]
    # bucket 1 at 2: ancestor (0 at 1) says 50, itself 70, descendants at 4 say min(90, 80)
    assert bucket_start(mixed, 1, 2) == 80
    # bucket 3 at 4: ancestors 50 (factor 1) and 70 (bucket 1 at 2), itself 80
    assert bucket_start(mixed, 3, 4) == 80
    # bucket 0 at 2: only the factor-1 ancestor speaks for it
    assert bucket_start(mixed, 0, 2) == 50
    # merging everything to factor 1: itself 50; descendants at 2 incomplete; at 4 incomplete
    assert bucket_start(mixed, 0, 1) == 50


def test_general_rule_takes_largest_over_descendant_factors() -> None:
    entries = [cp(0, 2, 10), cp(1, 2, 40), cp(0, 4, 60), cp(1, 4, 70), cp(2, 4, 65), cp(3, 4, 90)]
    assert bucket_start(entries, 0, 1) == 60  # max(min(10, 40), min(60, 70, 65, 90))


def test_bucket_start_is_safe_for_random_histories() -> None:
    """Whatever checkpoints say, the start never passes an unapplied record of the bucket."""
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    for _ in range(300):
        # Simulate applied offsets per key hash: key h applied every record below applied[h].
        applied = {h: rng.randrange(100) for h in range(64)}
        entries = []
        for factor in rng.sample([1, 2, 4, 8, 16], 3):
            for b in range(factor):
                if rng.random() < 0.8:
                    keys = [h for h in applied if h % factor == b]
                    # a checkpoint is a bound every one of its keys has reached
                    entries.append(cp(b, factor, min(applied[h] for h in keys)))
        for factor in (1, 2, 4, 8, 16, 32):
            for b in range(factor):
                start = bucket_start(entries, b, factor)
                if start is not None:
                    keys = [h for h in applied if h % factor == b]
                    assert start <= min(applied[h] for h in keys), f"seed={seed}"


def test_resolve_starts_covers_every_bucket_of_every_partition() -> None:
    starts = resolve_starts(
        [cp(0, 1, 5, partition=1)], 2, [("kafka", "PVE", 0), ("kafka", "PVE", 1)]
    )
    assert starts == {
        (("kafka", "PVE", 0), 0): None,
        (("kafka", "PVE", 0), 1): None,
        (("kafka", "PVE", 1), 0): 5,
        (("kafka", "PVE", 1), 1): 5,
    }


def test_record_below_a_checkpoint_of_its_key_is_covered() -> None:
    entries = [cp(1, 2, 100), cp(3, 4, 150)]
    assert is_covered(entries, key_hash=7, offset=149)  # 7 % 4 == 3
    assert not is_covered(entries, key_hash=7, offset=150)
    assert is_covered(entries, key_hash=5, offset=99)  # 5 % 2 == 1, 5 % 4 == 1
    assert not is_covered(entries, key_hash=5, offset=100)
    assert not is_covered(entries, key_hash=4, offset=0)


def test_own_checkpoint_prunes_overtaken_entries() -> None:
    entries = [cp(1, 2, 100), cp(1, 4, 120), cp(3, 4, 90)]
    assert prune_covered(entries, 1, 2) == [cp(1, 2, 100), cp(1, 4, 120)]
    assert prune_covered([cp(3, 4, 90)], 1, 2) == [cp(3, 4, 90)]


def test_bad_checkpoint_is_refused() -> None:
    with pytest.raises(ArgumentError, match="key_bucket"):
        cp(2, 2, 0)
    with pytest.raises(ArgumentError, match="elasticity_factor"):
        cp(0, 3, 0)
    with pytest.raises(ArgumentError, match="next_offset"):
        cp(0, 1, -1)


def test_cover_start_joins_mixed_factors_no_single_factor_completes() -> None:
    # Query A owned bucket 0 at 2, query B buckets 1 and 3 at 4: together they cover factor 1.
    mixed = [cp(0, 2, 70), cp(1, 4, 90), cp(3, 4, 60)]
    assert bucket_start(mixed, 0, 1) is None
    assert cover_start(mixed, 0, 1) == 60
    assert cover_start(mixed[:2], 0, 1) is None  # bucket 3 at 4 unknown


def test_cover_start_is_never_below_the_samza_rule() -> None:
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    for _ in range(300):
        entries = [
            cp(b, f, rng.randrange(100))
            for f in rng.sample([1, 2, 4, 8], 3)
            for b in range(f)
            if rng.random() < 0.85
        ]
        for factor in (1, 2, 4):
            for b in range(factor):
                samza = bucket_start(entries, b, factor)
                if samza is not None:
                    covered = cover_start(entries, b, factor)
                    assert covered is not None
                    assert covered >= samza, f"seed={seed}"


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_a_task_step_s_last_offsets_are_the_group_by_s_whatever_its_partitions(seed: int) -> None:
    import numpy as np
    import pandas as pd

    from spark_elastic.state.processor import _last_offsets

    print(f"seed {seed}")
    rng = random.Random(seed)
    for _ in range(50):
        size = rng.randint(1, 40)
        one = rng.random() < 0.5  # a step mostly reads one partition: the fast case
        records = pd.DataFrame(
            {
                "topic": [rng.choice(["a"] if one else ["a", "b"]) for _ in range(size)],
                "partition": np.array(
                    [rng.choice([0] if one else [0, 1, 2]) for _ in range(size)], dtype=np.int32
                ),
                "offset": np.array([rng.randint(0, 10**12) for _ in range(size)], dtype=np.int64),
            }
        )
        expected = records.groupby(["topic", "partition"], sort=True)["offset"].max()
        assert [(k, int(v)) for k, v in _last_offsets(records)] == [
            (k, int(v)) for k, v in expected.items()
        ]
