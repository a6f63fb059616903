"""Specification of key buckets, withVirtualTasks routing and cogroup on real Spark (batch)."""

from __future__ import annotations

import random
import textwrap
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import spark_elastic
import udfs
from spark_elastic import (
    LOG_SOURCE_FORMAT,
    EmbeddedLog,
    KafkaColumns,
    PartitionMapping,
    cogroup,
    key_bucket,
    plan_job,
    register_log_source,
    routing_keys,
    with_virtual_tasks,
)
from spark_elastic.dataplane.extension import METHOD_NAME, register_dataframe_method
from spark_elastic.dataplane.routing import spark_hash_int
from spark_elastic.errors import ArgumentError, ArgumentTypeError, ColumnError
from udfs import kafka_partitions

KAFKA_SCHEMA = "key binary, value binary, topic string, partition int, offset bigint"


def kafka_df(
    spark: SparkSession, rows: list[tuple[bytes | None, str, int, int]], slices: int = 2
) -> DataFrame:
    """A Kafka-shaped batch DataFrame from (key, topic, partition, offset) rows."""
    data = [(k, b"v", t, p, o) for k, t, p, o in rows]
    return spark.createDataFrame(data, KAFKA_SCHEMA).repartition(slices)


def produced(
    topic: str, partitions: int, keys: list[bytes]
) -> list[tuple[bytes | None, str, int, int]]:
    """Rows as Kafka's default producer would write them: murmur2 partitions, dense offsets."""
    next_offset: Counter[int] = Counter()
    rows = []
    for key, p in zip(keys, kafka_partitions(keys, partitions).tolist(), strict=True):
        rows.append((key, topic, p, next_offset[p]))
        next_offset[p] += 1
    return rows


def partition_contents(df: DataFrame) -> list[list[str]]:
    """The distinct virtual tasks in each Spark partition, in partition order."""
    per_partition = (
        df.select("virtual_task").rdd.glom().map(lambda rows: sorted({r[0] for r in rows}))
    )
    return per_partition.collect()


@pytest.fixture(scope="module")
def keys() -> list[bytes]:
    seed = 20261121
    rng = random.Random(seed)
    return [f"user-{rng.randrange(10**9)}".encode() for _ in range(4000)]


# -- key buckets ---------------------------------------------------------------------------------


GOLDEN_SPARK_BUCKETS = [
    # key, bucket at 8, bucket at 1024: pinned so a Spark upgrade that changed them would fail.
    ("", 4, 348),
    ("a", 2, 82),
    ("user-42", 0, 248),
    ("ключ", 5, 573),
    ("polygenelubricants", 0, 752),
    ("🙂", 5, 669),
]


def test_native_key_bucket_is_pinned_murmur3_of_key_bytes(spark: SparkSession) -> None:
    rows = [(k.encode(), "t", 0, i) for i, (k, _, _) in enumerate(GOLDEN_SPARK_BUCKETS)]
    df = kafka_df(spark, rows, slices=1).select(
        "offset", key_bucket(8).alias("b8"), key_bucket(1024).alias("b1024")
    )
    expected = spark.createDataFrame(
        [(i, b8, b1024) for i, (_, b8, b1024) in enumerate(GOLDEN_SPARK_BUCKETS)],
        "offset bigint, b8 int, b1024 int",
    )
    assert_df_equality(df, expected, ignore_row_order=True, ignore_nullable=True)


def test_string_and_binary_keys_get_the_same_bucket(spark: SparkSession) -> None:
    df = spark.createDataFrame(
        [(k, k.encode(), 0) for k, _, _ in GOLDEN_SPARK_BUCKETS],
        "s string, b binary, offset bigint",
    )
    as_string = df.select(key_bucket(64, columns=KafkaColumns(key="s")).alias("bucket"))
    as_binary = df.select(key_bucket(64, columns=KafkaColumns(key="b")).alias("bucket"))
    assert_df_equality(as_string, as_binary)


def test_bucket_at_double_factor_is_b_or_b_plus_f(spark: SparkSession, keys: list[bytes]) -> None:
    df = kafka_df(spark, [(k, "t", 0, i) for i, k in enumerate(keys)])
    buckets = df.select(*(key_bucket(f).alias(f"b{f}") for f in (1, 2, 4, 8, 16))).collect()
    for row in buckets:
        assert row["b1"] == 0
        for f in (1, 2, 4, 8):
            assert row[f"b{2 * f}"] in (row[f"b{f}"], row[f"b{f}"] + f)


def test_null_key_hashes_its_offset(spark: SparkSession) -> None:
    df = kafka_df(spark, [(None, "t", 0, 7), (None, "t", 1, 7), (None, "t", 0, 8)], slices=1)
    got = df.select("partition", "offset", key_bucket(1024).alias("bucket"))
    seven = 1293116811 % 1024  # Spark's hash(cast(7 as bigint)), pinned
    assert {(r[0], r[1]): r[2] for r in got.collect()}[(0, 7)] == seven
    assert got.filter("offset = 7").select("bucket").distinct().count() == 1


def test_java_null_key_hashes_its_offset_as_text(spark: SparkSession) -> None:
    # Samza's rule in java mode: String.hashCode of the offset's decimal text.
    df = kafka_df(spark, [(None, "t", 0, 7), (None, "t", 1, 12345), (b"7", "t", 0, 99)], slices=1)
    got = df.select("offset", key_bucket(16, hash="java").alias("bucket"))
    # "7".hashCode() == 55 and "12345".hashCode() == 46792755; the key "7" hashes like offset 7.
    expected = spark.createDataFrame(
        [(7, 55 % 16), (12345, 46792755 % 16), (99, 55 % 16)], "offset long, bucket int"
    )
    assert_df_equality(got, expected, ignore_row_order=True, ignore_nullable=True)


def test_buckets_stay_balanced_inside_kafka_partitioned_data(
    spark: SparkSession, keys: list[bytes]
) -> None:
    # Keys placed by Kafka's murmur2 % 8; native buckets at factor 8 must still spread
    # evenly inside every partition (a murmur2 bucket would be one bucket per partition).
    df = kafka_df(spark, produced("t", 8, keys))
    counts = df.groupBy("partition", key_bucket(8).alias("b")).count().collect()
    per_partition: dict[int, list[int]] = {}
    for row in counts:
        per_partition.setdefault(row["partition"], []).append(row["count"])
    assert sorted(per_partition) == list(range(8))
    for partition, bucket_counts in per_partition.items():
        mean = sum(bucket_counts) / 8
        assert len(bucket_counts) == 8, f"partition {partition} uses {len(bucket_counts)} buckets"
        assert max(bucket_counts) < 1.6 * mean, f"partition {partition}: {bucket_counts}"
        assert min(bucket_counts) > 0.4 * mean, f"partition {partition}: {bucket_counts}"


def test_murmur2_buckets_would_collapse_to_one_per_partition(
    spark: SparkSession, keys: list[bytes]
) -> None:
    # The reason the default bucket hash is not Kafka's. Keys placed by the producer's
    # toPositive(murmur2) % 12: a bucket toPositive(murmur2) % 4 is fixed by the partition
    # (4 divides 12), so each partition's keys share one bucket, while native buckets of
    # the same records use all four.
    df = kafka_df(spark, produced("t", 12, keys))
    murmur2_bucket = udfs.kafka_partition("key", 4)  # toPositive(murmur2) % 4
    used = df.groupBy("partition").agg(
        F.countDistinct(murmur2_bucket).alias("murmur2"),
        F.countDistinct(key_bucket(4)).alias("native"),
    )
    expected = spark.createDataFrame(
        [(p, 1, 4) for p in range(12)], "partition int, murmur2 long, native long"
    )
    assert_df_equality(used, expected, ignore_row_order=True, ignore_nullable=True)


def test_java_bucket_is_abs_string_hash_code_mod_factor(spark: SparkSession) -> None:
    words = ["", "hello", "ключ", "🙂x", "polygenelubricants"]
    df = kafka_df(spark, [(w.encode(), "t", 0, i) for i, w in enumerate(words)], slices=1)
    got = {r[0]: r[1] for r in df.select("offset", key_bucket(16, hash="java")).collect()}
    for i, word in enumerate(words):
        h = java_string_hash(word)
        expected = 0 if h == -(2**31) else abs(h) % 16
        assert got[i] == expected, word


def test_java_bucket_of_integer_min_value_hash_is_zero(spark: SparkSession) -> None:
    assert java_string_hash("polygenelubricants") == -(2**31)
    df = kafka_df(spark, [(b"polygenelubricants", "t", 0, 0)], slices=1)
    assert df.select(key_bucket(1024, hash="java")).first()[0] == 0  # type: ignore[index]


def java_string_hash(text: str) -> int:
    h = 0
    units = text.encode("utf-16-le")
    for i in range(0, len(units), 2):
        h = (31 * h + int.from_bytes(units[i : i + 2], "little")) & 0xFFFFFFFF
    return h - 2**32 if h >= 2**31 else h


def test_unknown_hash_mode_lists_choices() -> None:
    with pytest.raises(ArgumentError, match=r"hash.*'murmur2'.*'spark', 'java'"):
        key_bucket(4, hash="murmur2")  # type: ignore[arg-type]


# -- exact routing -------------------------------------------------------------------------------


def test_routing_keys_hash_to_their_own_partition(spark: SparkSession) -> None:
    for n in (1, 7, 64, 1000):
        keys_n = routing_keys(n)
        assert (spark_hash_int(keys_n).astype("int64") % n).tolist() == list(range(n))
    df = spark.createDataFrame([(int(k),) for k in routing_keys(50)], "k int")
    placed = df.repartition(50, "k").select("k", F.spark_partition_id().alias("p")).collect()
    assert sorted((r["p"], r["k"]) for r in placed) == list(enumerate(routing_keys(50).tolist()))


def test_each_virtual_task_occupies_exactly_one_partition(
    spark: SparkSession, keys: list[bytes]
) -> None:
    df = kafka_df(spark, produced("events", 3, keys)).withVirtualTasks(4)
    contents = partition_contents(df)
    plan = plan_job(["kafka.events:3"], elasticity_factor=4)
    # partition t holds exactly task t: no collisions, no empty partitions
    assert contents == [[name] for name in plan.task_names()]


def test_plain_repartition_by_task_name_collides(spark: SparkSession, keys: list[bytes]) -> None:
    df = kafka_df(spark, produced("events", 3, keys)).withVirtualTasks(4, route=False)
    contents = df.repartition(12, "virtual_task").select("virtual_task").rdd.glom().collect()
    assert sum(1 for rows in contents if not rows) > 0  # the problem routing solves


def test_virtual_task_names_and_buckets_follow_the_plan(spark: SparkSession) -> None:
    df = kafka_df(spark, [(b"a", "events", 1, 0), (b"user-42", "events", 0, 0)])
    got = df.withVirtualTasks(8).select("partition", "key_bucket", "virtual_task")
    expected = spark.createDataFrame(
        [(1, 2, "Partition 1_2_8"), (0, 0, "Partition 0_0_8")],
        "partition int, key_bucket int, virtual_task string",
    )
    assert_df_equality(got, expected, ignore_row_order=True, ignore_nullable=True)


def test_transform_factory_equals_dataframe_method(spark: SparkSession, keys: list[bytes]) -> None:
    df = kafka_df(spark, produced("events", 2, keys[:200]))
    assert_df_equality(
        df.withVirtualTasks(2, partitions={"events": 2}),
        df.transform(with_virtual_tasks(2, partitions={"events": 2})),
        ignore_row_order=True,
    )


def test_ssp_grouper_routes_each_stream_partition_bucket_alone(
    spark: SparkSession, keys: list[bytes]
) -> None:
    rows = produced("a", 2, keys[:2000]) + produced("b", 2, keys[2000:])
    df = kafka_df(spark, rows).withVirtualTasks(2, "ssp")
    assert partition_contents(df) == [
        [n] for n in plan_job(["kafka.a:2", "kafka.b:2"], "ssp", 2).task_names()
    ]


def test_explicit_plan_keeps_task_names_after_topic_grows(spark: SparkSession) -> None:
    previous = PartitionMapping.from_plan(plan_job(["kafka.events:2"], elasticity_factor=2))
    plan = plan_job(["kafka.events:4"], elasticity_factor=2, previous=previous)
    df = kafka_df(spark, [(b"a", "events", 3, 0), (b"a", "events", 1, 0)])
    got = df.withVirtualTasks(plan=plan).select("partition", "virtual_task")
    expected = spark.createDataFrame(
        [(3, "Partition 1_0_2"), (1, "Partition 1_0_2")], "partition int, virtual_task string"
    )
    assert_df_equality(got, expected, ignore_row_order=True, ignore_nullable=True)


def test_record_outside_the_plan_fails_instead_of_misrouting(spark: SparkSession) -> None:
    df = kafka_df(spark, [(b"a", "events", 5, 0)]).withVirtualTasks(2, partitions={"events": 2})
    with pytest.raises(
        Exception, match=r"topic 'events' partition 5 is outside the virtual-task plan"
    ):
        df.collect()


def test_record_of_unknown_topic_fails_instead_of_misrouting(spark: SparkSession) -> None:
    df = kafka_df(spark, [(b"a", "other", 0, 0)]).withVirtualTasks(2, partitions={"events": 2})
    with pytest.raises(Exception, match=r"topic 'other' partition 0 is outside"):
        df.collect()


# -- argument errors -----------------------------------------------------------------------------


def test_missing_column_is_named_with_the_columns_found(spark: SparkSession) -> None:
    df = spark.createDataFrame([(b"k", 0, 0)], "key binary, partition int, offset bigint")
    with pytest.raises(ColumnError, match=r"column 'topic' \(topic\): missing.*found columns"):
        df.withVirtualTasks(2)


def test_mistyped_column_is_named_with_its_type(spark: SparkSession) -> None:
    df = spark.createDataFrame(
        [(1, "t", 0, 0)], "key int, topic string, partition int, offset bigint"
    )
    with pytest.raises(
        ColumnError, match=r"column 'key' \(key\): expected type binary or string, found int"
    ):
        df.withVirtualTasks(2)


def test_renamed_columns_are_accepted(spark: SparkSession) -> None:
    df = spark.createDataFrame([("u1", "t", 0, 0)], "user string, topic string, p int, o bigint")
    out = df.withVirtualTasks(2, columns={"key": "user", "partition": "p", "offset": "o"})
    assert out.columns[-3:] == ["key_bucket", "virtual_task", "routing_key"]


def test_existing_output_column_is_not_overwritten(spark: SparkSession) -> None:
    df = kafka_df(spark, [(b"a", "t", 0, 0)]).withColumn("virtual_task", F.lit("x"))
    with pytest.raises(ColumnError, match="already present"):
        df.withVirtualTasks(2)


def test_streaming_dataframe_needs_partition_counts(spark: SparkSession) -> None:
    stream = (
        spark.readStream.format("rate")
        .load()
        .selectExpr(
            "cast(value as string) as key", "'t' as topic", "0 as partition", "value as offset"
        )
    )
    with pytest.raises(
        ArgumentError, match=r"partitions: expected the input topics' partition counts"
    ):
        stream.withVirtualTasks(2)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"elasticity_factor": 3}, ArgumentError, "elasticity_factor"),
        ({"elasticity_factor": 2, "grouper": "single"}, ArgumentError, "'single' grouper"),
        ({"elasticity_factor": 2, "grouper": "max"}, ArgumentError, "valid choices"),
        (
            {"elasticity_factor": 4, "plan": plan_job(["kafka.t:1"], elasticity_factor=2)},
            ArgumentError,
            "plan's factor 2",
        ),
        ({}, ArgumentError, "elasticity_factor"),
        ({"elasticity_factor": 2, "columns": {"nope": "x"}}, ArgumentError, "column roles"),
    ],
)
def test_bad_arguments_are_clear_errors(
    spark: SparkSession, kwargs: dict[str, object], error: type[Exception], message: str
) -> None:
    df = kafka_df(spark, [(b"a", "t", 0, 0)])
    with pytest.raises(error, match=message):
        df.withVirtualTasks(**kwargs)


@pytest.mark.parametrize("partitions", [4, 4.0, None.__class__])
def test_partitions_of_the_wrong_type_is_one_line_naming_it(partitions: object) -> None:
    with pytest.raises(ArgumentTypeError) as info:
        with_virtual_tasks(4, partitions=partitions)  # type: ignore[arg-type]
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("partitions: expected the input topics' partition counts")
    assert f"found {type(partitions).__name__}" in message


def test_partition_counts_that_disagree_with_the_embedded_log_are_refused(
    spark: SparkSession, tmp_path: Path
) -> None:
    log = EmbeddedLog(tmp_path / "log")
    log.create_topic("clicks", 4)
    register_log_source(spark)
    stream = (
        spark.readStream.format(LOG_SOURCE_FORMAT)
        .option("path", str(tmp_path / "log"))
        .option("subscribe", "clicks")
        .load()
    )
    with pytest.raises(ArgumentError) as info:
        stream.withVirtualTasks(2, partitions={"clicks": 16})
    message = str(info.value)
    assert "\n" not in message
    assert "topic 'clicks' has 4 partitions" in message
    assert "plan says 16: 24 virtual tasks would never get a record" in message
    with pytest.raises(ArgumentError, match="first record of partitions 2 to 3 would fail"):
        stream.withVirtualTasks(2, partitions={"clicks": 2})
    stream.withVirtualTasks(2, partitions=log.partition_counts(["clicks"]))  # the real counts


# -- cogroup -------------------------------------------------------------------------------------


def test_cogroup_gives_a_task_every_record_of_its_keys_from_both_streams(
    spark: SparkSession, keys: list[bytes]
) -> None:
    views = kafka_df(spark, produced("views", 8, keys))
    clicks = kafka_df(spark, produced("clicks", 12, keys[::3]))
    both = cogroup(views, clicks, partition_counts={"views": 8, "clicks": 12}, elasticity_factor=2)
    tasks_per_key = both.groupBy("key").agg(F.countDistinct("virtual_task").alias("n"))
    assert tasks_per_key.filter("n > 1").count() == 0
    # gcd(8, 12) = 4 tasks, times factor 2, each alone in its partition
    assert partition_contents(both) == [
        [n] for n in plan_job(["kafka.views:8", "kafka.clicks:12"], "cogroup", 2).task_names()
    ]


def test_cogroup_needs_partition_counts_even_for_batch_inputs(
    spark: SparkSession, keys: list[bytes]
) -> None:
    # Counts derived from the data could be too low (a topic's last partitions empty),
    # and a wrong gcd splits a key's records across tasks without any error.
    views = kafka_df(spark, produced("views", 4, keys))
    clicks = kafka_df(spark, produced("clicks", 6, keys))
    with pytest.raises(ArgumentError, match="partition_counts: expected every input topic's"):
        cogroup(views, clicks)
    with pytest.raises(ArgumentError, match="partitions: expected every input topic's"):
        views.withVirtualTasks(2, grouper="cogroup")  # type: ignore[attr-defined]
    both = cogroup(views, clicks, partition_counts={"views": 4, "clicks": 6})
    assert both.select("virtual_task").distinct().count() == 2


def test_cogroup_refuses_nothing_and_zero_counts(spark: SparkSession) -> None:
    with pytest.raises(ArgumentError, match="at least one DataFrame"):
        cogroup()
    df = kafka_df(spark, [(b"a", "t", 0, 0)])
    with pytest.raises(ArgumentError, match=r"partition count of kafka\.t"):
        cogroup(df, partition_counts={"t": 0})


# -- DataFrame method registration ---------------------------------------------------------------


def test_method_is_registered_on_the_shared_dataframe_base() -> None:
    from pyspark.sql.classic.dataframe import DataFrame as ClassicDataFrame
    from pyspark.sql.dataframe import DataFrame as BaseDataFrame

    assert METHOD_NAME in BaseDataFrame.__dict__
    assert ClassicDataFrame.withVirtualTasks is BaseDataFrame.withVirtualTasks  # type: ignore[attr-defined]
    assert spark_elastic.register_dataframe_method() is True  # idempotent


def test_registration_refuses_to_override_a_foreign_attribute() -> None:
    from pyspark.sql.dataframe import DataFrame as BaseDataFrame

    ours = BaseDataFrame.__dict__[METHOD_NAME]

    def foreign(self: object) -> None:
        """Someone else's method."""

    setattr(BaseDataFrame, METHOD_NAME, foreign)
    try:
        with pytest.warns(RuntimeWarning, match="already has an attribute 'withVirtualTasks'"):
            assert register_dataframe_method() is False
        assert BaseDataFrame.__dict__[METHOD_NAME] is foreign
    finally:
        setattr(BaseDataFrame, METHOD_NAME, ours)


CONNECT_SCRIPT = textwrap.dedent(
    """
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    spark = SparkSession.builder.remote("local[2]").getOrCreate()
    import spark_elastic
    from pyspark.sql.connect.dataframe import DataFrame
    df = spark.createDataFrame(
        [(f"k{i}".encode(), b"v", "t", i % 2, i) for i in range(200)],
        "key binary, value binary, topic string, partition int, offset bigint",
    )
    assert isinstance(df, DataFrame)
    routed = df.withVirtualTasks(4)
    per_partition = (
        routed.groupBy(F.spark_partition_id()).agg(F.collect_set("virtual_task")).collect()
    )
    got = sorted((r[0], tuple(r[1])) for r in per_partition)
    names = spark_elastic.plan_job(["kafka.t:2"], elasticity_factor=4).task_names()
    assert got == [(i, (n,)) for i, n in enumerate(names)], got
    print("connect ok")
    spark.stop()
    """
)


@pytest.mark.slow
def test_method_works_on_spark_connect_dataframes(
    run_on_spark_connect: Callable[[str], str],
) -> None:
    assert "connect ok" in run_on_spark_connect(CONNECT_SCRIPT)
