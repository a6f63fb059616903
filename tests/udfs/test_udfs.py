"""Tests for udfs: Kafka's murmur2 partitioner and Java's String.hashCode.

Reference values come from direct transliterations of the Java code below,
checked against vectors published by Kafka (UtilsTest.testMurmur2) and
computed by a JDK 17 (String.hashCode).
"""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pytest
from chispa import assert_df_equality
from pyspark.util import PythonEvalType

import udfs
from spark_elastic.errors import ArgumentError, ArgumentTypeError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

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


def java_hash_reference(text: str) -> int:
    """java.lang.String.hashCode: h = 31 * h + c over UTF-16 code units, in int arithmetic."""
    h = 0
    units = text.encode("utf-16-le", "surrogatepass")
    for i in range(0, len(units), 2):
        h = (31 * h + int.from_bytes(units[i : i + 2], "little")) & MASK32
    return to_int32(h)


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


# Computed with JDK 17: "text".hashCode().
JAVA_STRING_HASHES = {
    "": 0,
    "a": 97,
    "hello": 99162322,
    "Aa": 2112,
    "BB": 2112,
    "polygenelubricants": -(2**31),
    "é": 233,
    "日本語": 25921943,
    "\U0001f600": 1772899,
    "naïve-key-\U0001f600-日本": -1495323743,
    "user-00000042": -944978880,
    "The quick brown fox jumps over the lazy dog": -609428141,
}

# Computed with JDK 17: new String(bytes, StandardCharsets.UTF_8).hashCode(), for
# malformed UTF-8. Encoded surrogates (ED A0..BF ..) are where Java and
# Python's "replace" disagree on how many U+FFFD to produce.
JAVA_MALFORMED_HASHES = {
    "ff": 65533,
    "c3": 65533,
    "80": 65533,
    "fe": 65533,
    "61ff62": 2124838,
    "c0af": 2097056,
    "e6979c": 26076,
    "ed9fbf": 55295,
    "eda080": 65533,
    "eda0bdedb880": 2097056,
    "eda041": 2031588,
    "eda0": 65533,
    "61eda0": 68540,
    "c3a9eda080c3a9": 2255669,
    "f09f98": 65533,
    "f09f41": 2031588,
    "e641": 2031588,
    "f09f9880f09f98": 55025402,
    "f4908080": 2017367872,
    "e0808080": 2017367872,
}


class TestJavaHashCodes:
    def test_reference_matches_java(self) -> None:
        for text, expected in JAVA_STRING_HASHES.items():
            assert java_hash_reference(text) == expected, text

    def test_java_vectors(self) -> None:
        got = udfs.java_hash_codes(list(JAVA_STRING_HASHES))
        assert got.dtype == np.int32
        assert got.tolist() == list(JAVA_STRING_HASHES.values())

    def test_bytes_are_read_as_utf8(self) -> None:
        keys = [text.encode() for text in JAVA_STRING_HASHES]
        assert udfs.java_hash_codes(keys).tolist() == list(JAVA_STRING_HASHES.values())

    def test_malformed_utf8_decodes_like_java(self) -> None:
        keys = [bytes.fromhex(h) for h in JAVA_MALFORMED_HASHES]
        assert udfs.java_hash_codes(keys).tolist() == list(JAVA_MALFORMED_HASHES.values())

    @pytest.mark.parametrize("seed", [0, 1, 2, 3])
    def test_random_keys_match_reference(self, seed: int) -> None:
        rng = random.Random(seed)
        texts = [random_text(rng, random_length(rng)) for _ in range(2500)]
        assert_matches(seed, texts, udfs.java_hash_codes(texts), java_hash_reference)
        encoded = [t.encode() for t in texts]
        assert_matches(
            seed, encoded, udfs.java_hash_codes(encoded), lambda k: java_hash_reference(k.decode())
        )

    def test_ascii_only_and_mixed_slices(self) -> None:
        # More keys than one slice: an ASCII-only slice next to non-ASCII ones.
        rng = random.Random(5)
        keys = [f"user-{i}" for i in range(20_000)]
        keys += [random_text(rng, rng.randrange(40)) for _ in range(20_000)]
        assert_matches(5, keys, udfs.java_hash_codes(keys), java_hash_reference)

    def test_long_key(self) -> None:
        key = random_text(random.Random(8), 50_000)
        assert udfs.java_hash_codes([key, "x"]).tolist() == [java_hash_reference(key), 120]

    @pytest.mark.parametrize("key", ["xyz" * 350_001, "ab日\U0001f600" * 300_000])
    def test_key_longer_than_the_cached_power_tables(self, key: str) -> None:
        assert udfs.java_hash_codes([key, "hello"]).tolist() == [
            java_hash_reference(key),
            99162322,
        ]

    def test_containers_and_slices(self) -> None:
        texts = ["zero", "one", "日本", "", "\U0001f600"]
        expected = [java_hash_reference(t) for t in texts]
        for container in [pa.array(texts, pa.large_string()), pa.array(texts).cast(pa.binary())]:
            assert udfs.java_hash_codes(container).tolist() == expected
        assert udfs.java_hash_codes(pa.array(texts)[1:4]).tolist() == expected[1:4]

    def test_null_key_is_refused(self) -> None:
        with pytest.raises(ArgumentError, match=r"keys\[2\]"):
            udfs.java_hash_codes(["a", "b", None])

    def test_lone_surrogate_is_refused(self) -> None:
        with pytest.raises(ArgumentError, match="surrogate"):
            udfs.java_hash_codes(["\ud800"])

    def test_no_keys(self) -> None:
        assert udfs.java_hash_codes([]).tolist() == []


def test_import_loads_neither_pyspark_nor_pandas() -> None:
    script = (
        "import sys, udfs; "
        "print(sorted(m for m in ('pandas', 'pyspark', 'py4j') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "[]"


@pytest.fixture
def small_arrow_batches(spark: SparkSession) -> Iterator[None]:
    """Several Arrow batches per partition, so the UDFs see batch boundaries."""
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    previous = spark.conf.get(key)
    spark.conf.set(key, "250")
    yield
    spark.conf.set(key, previous)


def keyed_rows(seed: int, count: int) -> list[tuple[int, bytes | None, str | None]]:
    """(id, key as bytes, key as text) rows, with some null keys."""
    rng = random.Random(seed)
    rows: list[tuple[int, bytes | None, str | None]] = []
    for i in range(count):
        if rng.random() < 0.02:
            rows.append((i, None, None))
        else:
            text = random_text(rng, random_length(rng) % 100)
            rows.append((i, text.encode(), text))
    return rows


@pytest.mark.usefixtures("small_arrow_batches")
class TestColumns:
    @pytest.mark.parametrize("num_partitions", [1, 6, 12])
    def test_kafka_partition_matches_kafka(self, spark: SparkSession, num_partitions: int) -> None:
        rows = keyed_rows(num_partitions, 2000)
        source = spark.createDataFrame(rows, "id int, key binary, text string").repartition(3)
        actual = source.select(
            "id",
            udfs.kafka_partition("key", num_partitions).alias("from_bytes"),
            udfs.kafka_partition(source.text, num_partitions).alias("from_text"),
        )
        expected_rows = []
        for i, key, _ in rows:
            partition = None if key is None else partition_reference(key, num_partitions)
            expected_rows.append((i, partition, partition))
        expected = spark.createDataFrame(expected_rows, "id int, from_bytes int, from_text int")
        assert_df_equality(actual, expected, ignore_row_order=True, ignore_nullable=True)

    def test_kafka_partition_agrees_with_numpy(self, spark: SparkSession) -> None:
        rows = [r for r in keyed_rows(3, 1000) if r[1] is not None]
        source = spark.createDataFrame(rows, "id int, key binary, text string")
        actual = source.select("id", udfs.kafka_partition("key", 9).alias("partition"))
        numpy_partitions = udfs.kafka_partitions([r[1] for r in rows], 9).tolist()
        expected = spark.createDataFrame(
            list(zip([r[0] for r in rows], numpy_partitions, strict=True)),
            "id int, partition int",
        )
        assert_df_equality(actual, expected, ignore_row_order=True, ignore_nullable=True)

    def test_java_hash_code_matches_java(self, spark: SparkSession) -> None:
        rows = keyed_rows(7, 2000)
        source = spark.createDataFrame(rows, "id int, key binary, text string").repartition(3)
        actual = source.select(
            "id",
            udfs.java_hash_code("key").alias("from_bytes"),
            udfs.java_hash_code(source.text).alias("from_text"),
        )
        expected_rows = []
        for i, _, text in rows:
            h = None if text is None else java_hash_reference(text)
            expected_rows.append((i, h, h))
        expected = spark.createDataFrame(expected_rows, "id int, from_bytes int, from_text int")
        assert_df_equality(actual, expected, ignore_row_order=True, ignore_nullable=True)

    def test_java_hash_code_vectors(self, spark: SparkSession) -> None:
        rows = [(t.encode(), t, h) for t, h in JAVA_STRING_HASHES.items()]
        rows += [(bytes.fromhex(x), None, h) for x, h in JAVA_MALFORMED_HASHES.items()]
        source = spark.createDataFrame(rows, "key binary, text string, java int")
        actual = source.select("key", udfs.java_hash_code("key").alias("java"))
        assert_df_equality(
            actual, source.select("key", "java"), ignore_row_order=True, ignore_nullable=True
        )
        text_rows = source.where("text is not null")
        assert_df_equality(
            text_rows.select("text", udfs.java_hash_code("text").alias("java")),
            text_rows.select("text", "java"),
            ignore_row_order=True,
            ignore_nullable=True,
        )

    def test_default_column_names(self, spark: SparkSession) -> None:
        source = spark.createDataFrame([(b"abc",)], "key binary")
        names = source.select(udfs.kafka_partition("key", 4), udfs.java_hash_code("key")).columns
        assert names == ["kafka_partition(key)", "java_hash_code(key)"]

    def test_columns_are_scalar_arrow_udfs_not_pandas_udfs(self, spark: SparkSession) -> None:
        # An Arrow UDF hands the hash the batch's buffers; a pandas UDF would first box
        # every key as a Python bytes object (docs/benchmarks.md, key buckets and murmur2).
        source = spark.createDataFrame([(b"abc",)], "key binary")
        query = source.select(udfs.kafka_partition("key", 4), udfs.java_hash_code("key"))
        plan = query._jdf.queryExecution().executedPlan().toString()
        evaluations = [line for line in plan.splitlines() if "ArrowEvalPython" in line]
        assert len(evaluations) == 1, plan
        assert evaluations[0].rsplit(", ", 1)[1] == str(PythonEvalType.SQL_SCALAR_ARROW_UDF)

    def test_wrong_column_type_fails_the_task(self, spark: SparkSession) -> None:
        source = spark.createDataFrame([(1,)], "key int")
        with pytest.raises(Exception, match="key: expected keys"):
            source.select(udfs.kafka_partition("key", 4)).collect()


@pytest.mark.parametrize("bad", [3, None, b"key"])
def test_column_argument_must_be_column_or_name(bad: Any) -> None:
    with pytest.raises(ArgumentTypeError, match="col"):
        udfs.kafka_partition(bad, 4)
    with pytest.raises(ArgumentTypeError, match="col"):
        udfs.java_hash_code(bad)


def test_partition_count_is_checked_on_the_driver() -> None:
    with pytest.raises(ArgumentError, match="n: expected a partition count"):
        udfs.kafka_partition("key", 0)
    with pytest.raises(ArgumentTypeError, match="n: expected an int"):
        udfs.kafka_partition("key", 2.5)  # type: ignore[arg-type]


CONNECT_SCRIPT = textwrap.dedent(
    """
    from pyspark.sql import SparkSession
    spark = SparkSession.builder.remote("local[2]").getOrCreate()
    import udfs
    df = spark.createDataFrame([(b"abc", "hello"), (None, None)], "key binary, text string")
    got = df.select(udfs.kafka_partition("key", 7), udfs.java_hash_code(df.text)).collect()
    assert [tuple(r) for r in got] == [(479470107 % 7, 99162322), (None, None)], got
    print("connect ok")
    spark.stop()
    """
)


@pytest.mark.slow
@pytest.mark.long  # `make test-all`; `make test` runs Spark Connect in test_transforms.py
def test_columns_work_on_spark_connect(run_on_spark_connect: Callable[[str], str]) -> None:
    assert "connect ok" in run_on_spark_connect(CONNECT_SCRIPT)
