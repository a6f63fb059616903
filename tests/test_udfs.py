"""Tests for udfs: Kafka's murmur2 partitioner and Java's String.hashCode.

Reference values come from direct transliterations of the Java code below,
checked against vectors published by Kafka (UtilsTest.testMurmur2) and
computed by a JDK 17 (String.hashCode).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import udfs
from spark_elastic.errors import ArgumentError, ArgumentTypeError

MASK32 = 0xFFFFFFFF


def to_int32(value: int) -> int:
    value &= MASK32
    return value - (1 << 32) if value >= 1 << 31 else value


def murmur2_reference(data: bytes) -> int:
    """org.apache.kafka.common.utils.Utils.murmur2, line by line."""
    length = len(data)
    seed = 0x9747B28C
    m = 0x5BD1E995
    r = 24
    h = (seed ^ length) & MASK32
    length4 = length // 4
    for i in range(length4):
        i4 = i * 4
        k = data[i4 + 0] + (data[i4 + 1] << 8) + (data[i4 + 2] << 16) + (data[i4 + 3] << 24)
        k = (k * m) & MASK32
        k ^= k >> r
        k = (k * m) & MASK32
        h = (h * m) & MASK32
        h ^= k
    # Java's switch (length % 4) with fallthrough from case 3 to case 1.
    remainder = length % 4
    if remainder >= 3:
        h ^= data[(length & ~3) + 2] << 16
    if remainder >= 2:
        h ^= data[(length & ~3) + 1] << 8
    if remainder >= 1:
        h ^= data[length & ~3]
        h = (h * m) & MASK32
    h ^= h >> 13
    h = (h * m) & MASK32
    h ^= h >> 15
    return to_int32(h)


def partition_reference(data: bytes, num_partitions: int) -> int:
    """BuiltInPartitioner.partitionForKey: toPositive(murmur2(key)) % numPartitions."""
    return (murmur2_reference(data) & 0x7FFFFFFF) % num_partitions


def random_text(rng: random.Random, length: int) -> str:
    """Text mixing ASCII, 2- and 3-byte UTF-8 and astral (4-byte, surrogate pair) characters."""
    pools = [(0x20, 0x7E), (0x80, 0x7FF), (0x800, 0xD7FF), (0xE000, 0xFFFF), (0x10000, 0x10FFFF)]
    chars = []
    for _ in range(length):
        low, high = rng.choice(pools)
        chars.append(chr(rng.randint(low, high)))
    return "".join(chars)


def random_length(rng: random.Random) -> int:
    """Mostly short keys, every remainder mod 4, and some long ones."""
    return rng.choice([0, 1, 2, 3, 4, 5, 6, 7, 8, rng.randrange(64), rng.randrange(3000)])


def random_keys(seed: int, count: int) -> list[bytes | str]:
    rng = random.Random(seed)
    keys: list[bytes | str] = []
    for _ in range(count):
        length = random_length(rng)
        keys.append(rng.randbytes(length) if rng.random() < 0.5 else random_text(rng, length))
    return keys


def utf8(key: bytes | str) -> bytes:
    return key.encode("utf-8") if isinstance(key, str) else key


def assert_matches(
    seed: int, keys: list[Any], got: np.ndarray[Any, Any], reference: Callable[[Any], int]
) -> None:
    expected = np.array([reference(key) for key in keys], dtype=np.int64)
    mismatched = np.flatnonzero(got.astype(np.int64) != expected)
    assert mismatched.size == 0, (
        f"seed {seed}: {mismatched.size} of {len(keys)} keys differ, first "
        f"{keys[mismatched[0]]!r}: got {got[mismatched[0]]}, expected {expected[mismatched[0]]}"
    )


# Kafka's own vectors, from clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java.
KAFKA_MURMUR2_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


class TestMurmur2:
    def test_reference_matches_kafka_vectors(self) -> None:
        for key, expected in KAFKA_MURMUR2_VECTORS.items():
            assert murmur2_reference(key) == expected, key

    def test_kafka_vectors(self) -> None:
        got = udfs.murmur2(list(KAFKA_MURMUR2_VECTORS))
        assert got.dtype == np.int32
        assert got.tolist() == list(KAFKA_MURMUR2_VECTORS.values())

    def test_empty_key_and_every_tail_length(self) -> None:
        keys = [b"", b"a", b"ab", b"abc", b"abcd", b"abcde", b"\xff\xfe\xfd", b"\x00"]
        assert udfs.murmur2(keys).tolist() == [murmur2_reference(k) for k in keys]
        assert udfs.murmur2([b""]).tolist() == [275646681]

    def test_str_hashes_its_utf8_bytes(self) -> None:
        keys = ["", "é", "日本", "naïve-key", "\U0001f600", "a\x00b"]
        assert udfs.murmur2(keys).tolist() == udfs.murmur2([k.encode() for k in keys]).tolist()
        assert udfs.murmur2(keys).tolist() == [murmur2_reference(k.encode()) for k in keys]

    @pytest.mark.parametrize("seed", [0, 1, 2, 3])
    def test_random_keys_match_reference(self, seed: int) -> None:
        keys = random_keys(seed, 2500)
        assert_matches(seed, keys, udfs.murmur2(keys), lambda k: murmur2_reference(utf8(k)))

    def test_lone_long_key_among_many_short(self) -> None:
        # More short keys than one lockstep slice, with long outliers that
        # outlive the wide steps.
        rng = random.Random(11)
        keys = [rng.randbytes(rng.randrange(12)) for _ in range(40_000)]
        keys[5] = rng.randbytes(100_003)
        keys[-1] = rng.randbytes(20_002)
        assert_matches(11, keys, udfs.murmur2(keys), murmur2_reference)

    @pytest.mark.parametrize(("count", "length"), [(3000, 13), (5, 8), (2000, 3)])
    def test_keys_of_one_length(self, count: int, length: int) -> None:
        rng = random.Random(count)
        keys = [rng.randbytes(length) for _ in range(count)]
        assert_matches(count, keys, udfs.murmur2(keys), murmur2_reference)

    def test_containers(self) -> None:
        import pandas as pd

        keys = [b"a", b"bc", b"", b"defgh"]
        expected = [murmur2_reference(k) for k in keys]
        as_text = ["a", "bc", "", "defgh"]
        containers: list[Any] = [
            keys,
            tuple(keys),
            np.array(keys, dtype=object),
            pd.Series(keys),
            pd.Series(as_text, dtype="string"),
            pa.array(keys),
            pa.array(keys, pa.large_binary()),
            pa.array(as_text, pa.large_string()),
            pa.array(as_text, pa.string_view()),
            pa.array(keys, pa.binary_view()),
            pa.chunked_array([keys[:2], keys[2:]]),
            pa.array(as_text).dictionary_encode(),
            [b"a", "bc", b"", "defgh"],
        ]
        for container in containers:
            assert udfs.murmur2(container).tolist() == expected, type(container)

    def test_sliced_arrow_array(self) -> None:
        keys = [b"zero", b"one", b"two", b"three", b"four"]
        sliced = pa.array(keys)[2:4]
        assert udfs.murmur2(sliced).tolist() == [murmur2_reference(k) for k in keys[2:4]]

    def test_no_keys(self) -> None:
        assert udfs.murmur2([]).dtype == np.int32
        assert udfs.murmur2([]).size == 0
        assert udfs.kafka_partitions(pa.array([], pa.binary()), 3).size == 0

    def test_null_key_is_refused(self) -> None:
        with pytest.raises(ArgumentError, match=r"keys\[1\].*null"):
            udfs.murmur2([b"a", None, b"c"])
        with pytest.raises(ArgumentError, match=r"keys\[0\]"):
            udfs.kafka_partitions(pa.array([None, "x"]), 4)

    @pytest.mark.parametrize("bad", ["abc", b"abc", [1, 2], [b"a", 3], np.arange(3)])
    def test_wrong_key_types(self, bad: Any) -> None:
        with pytest.raises(ArgumentTypeError, match="keys"):
            udfs.murmur2(bad)


class TestKafkaPartitions:
    @pytest.mark.parametrize("num_partitions", [1, 2, 3, 7, 12, 1000, 2**31 - 1])
    def test_random_keys_match_reference(self, num_partitions: int) -> None:
        seed = num_partitions
        keys = random_keys(seed, 1500)
        got = udfs.kafka_partitions(keys, num_partitions)
        assert got.dtype == np.int32
        assert_matches(seed, keys, got, lambda k: partition_reference(utf8(k), num_partitions))

    def test_to_positive_masks_the_sign_bit(self) -> None:
        # abs() would differ from & 0x7fffffff for every negative hash.
        negative = [k for k in KAFKA_MURMUR2_VECTORS if KAFKA_MURMUR2_VECTORS[k] < 0]
        got = udfs.kafka_partitions(negative, 2**31 - 1)
        assert got.tolist() == [KAFKA_MURMUR2_VECTORS[k] & 0x7FFFFFFF for k in negative]

    @pytest.mark.parametrize("bad", [0, -3, 2**31])
    def test_partition_count_out_of_range(self, bad: int) -> None:
        with pytest.raises(ArgumentError, match="num_partitions"):
            udfs.kafka_partitions([b"a"], bad)

    @pytest.mark.parametrize("bad", [True, 2.0, "4", None])
    def test_partition_count_wrong_type(self, bad: Any) -> None:
        with pytest.raises(ArgumentTypeError, match="num_partitions"):
            udfs.kafka_partitions([b"a"], bad)

    def test_numpy_integer_partition_count(self) -> None:
        assert udfs.kafka_partitions([b"abc"], np.int64(5)).tolist() == [479470107 % 5]
