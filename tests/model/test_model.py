"""Specification of the task model: stream partitions, factors, task names, lineage."""

from __future__ import annotations

import pytest

from spark_elastic import (
    Lineage,
    SystemStreamPartition,
    TaskKind,
    TaskName,
    bucket_lineage,
    lineage,
    validate_elasticity_factor,
)
from spark_elastic.errors import ArgumentError, ArgumentTypeError, SparkElasticError, TaskNameError
from spark_elastic.model.names import parent_bucket


def test_stream_partition_string_form_matches_samza() -> None:
    assert str(SystemStreamPartition("kafka", "PVE", 0)) == "SystemStreamPartition [kafka, PVE, 0]"


def test_stream_partition_with_bucket_string_form_matches_samza() -> None:
    ssp = SystemStreamPartition("kafka", "PVE", 0, 1)
    assert str(ssp) == "SystemStreamPartition [kafka, PVE, 0, 1]"


@pytest.mark.parametrize(
    "ssp",
    [SystemStreamPartition("kafka", "PVE", 0), SystemStreamPartition("kafka", "a.b-c_d", 12, 7)],
)
def test_stream_partition_parses_back(ssp: SystemStreamPartition) -> None:
    assert SystemStreamPartition.parse(str(ssp)) == ssp


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"system": "", "stream": "s", "partition": 0}, "system"),
        ({"system": "k", "stream": "a,b", "partition": 0}, "stream"),
        ({"system": "k", "stream": "s", "partition": -1}, "partition"),
        ({"system": "k", "stream": "s", "partition": 0, "key_bucket": -2}, "key_bucket"),
    ],
)
def test_stream_partition_rejects_bad_parts(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ArgumentError, match=message):
        SystemStreamPartition(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("factor", [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024])
def test_elasticity_factor_accepts_powers_of_two_up_to_1024(factor: int) -> None:
    assert validate_elasticity_factor(factor) == factor


@pytest.mark.parametrize("factor", [0, -2, 3, 6, 100, 2048])
def test_elasticity_factor_rejects_value_outside_range_naming_it(factor: int) -> None:
    with pytest.raises(ArgumentError) as info:
        validate_elasticity_factor(factor)
    message = str(info.value)
    assert "elasticity_factor" in message
    assert repr(factor) in message
    assert "1 to 1024" in message
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, SparkElasticError)


@pytest.mark.parametrize("factor", [2.0, "2", True, None])
def test_elasticity_factor_rejects_non_int_with_type_error(factor: object) -> None:
    with pytest.raises(ArgumentTypeError, match="elasticity_factor"):
        validate_elasticity_factor(factor)
    with pytest.raises(TypeError):
        validate_elasticity_factor(factor)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("Partition 0", TaskName.for_partition(0)),
        ("Partition 0_1_2", TaskName.for_partition(0, 1, 2)),
        ("Partition 17_1023_1024", TaskName.for_partition(17, 1023, 1024)),
        (
            "SystemStreamPartition [kafka, PVE, 0]",
            TaskName.for_stream_partition(SystemStreamPartition("kafka", "PVE", 0)),
        ),
        (
            "SystemStreamPartition [kafka, PVE, 0, 1]_2",
            TaskName.for_stream_partition(SystemStreamPartition("kafka", "PVE", 0), 1, 2),
        ),
        ("Task-processor-1", TaskName.for_processor("processor-1")),
    ],
)
def test_task_name_formats_and_parses_back(name: str, expected: TaskName) -> None:
    assert str(expected) == name
    assert TaskName.parse(name) == expected


def test_virtual_partition_task_name_tells_partition_bucket_and_factor() -> None:
    task = TaskName.parse("Partition 3_1_4")
    assert (task.kind, task.partition, task.key_bucket, task.elasticity_factor) == (
        TaskKind.PARTITION,
        3,
        1,
        4,
    )
    assert task.is_virtual
    assert task.base == TaskName.for_partition(3)


def test_virtual_ssp_task_name_tells_stream_partition_bucket_and_factor() -> None:
    task = TaskName.parse("SystemStreamPartition [kafka, PVE, 5, 3]_4")
    assert task.ssp == SystemStreamPartition("kafka", "PVE", 5)
    assert (task.key_bucket, task.elasticity_factor) == (3, 4)


@pytest.mark.parametrize(
    "name",
    [
        "partition 0",
        "Partition",
        "Partition -1",
        "Partition 0_1",
        "Partition 0_2_2",  # bucket outside its factor
        "Partition 0_0_3",  # factor not a power of two
        "Partition 0_0_1",  # factor 1 is written without a suffix
        "SystemStreamPartition [kafka, PVE]",
        "SystemStreamPartition [kafka, PVE, 0, 1]",  # bucket without factor
        "SystemStreamPartition [kafka, PVE, 0]_2",  # factor without bucket
        "Task-",
        "",
        # numbers are canonical ASCII integers, so each task has exactly one name
        "Partition 00",
        "Partition 01",
        "Partition \u0663",  # ARABIC-INDIC DIGIT THREE
        "Partition 0_01_2",
        "Partition 0_1_02",
        "Partition 0_\u0661_2",
        "SystemStreamPartition [kafka, PVE, 00]",
        "SystemStreamPartition [kafka, PVE, \u0663]",
        "SystemStreamPartition [kafka, PVE, 0, 01]_2",
        "SystemStreamPartition [kafka, PVE, 0, 1]_02",
    ],
)
def test_name_that_fits_no_format_is_reported(name: str) -> None:
    with pytest.raises(TaskNameError) as info:
        TaskName.parse(name)
    assert repr(name) in str(info.value)


@pytest.mark.parametrize(
    "text",
    ["SystemStreamPartition [kafka, PVE, 07]", "SystemStreamPartition [kafka, PVE, 0, \u0661]"],
)
def test_stream_partition_parse_refuses_non_canonical_numbers(text: str) -> None:
    with pytest.raises(TaskNameError) as info:
        SystemStreamPartition.parse(text)
    assert repr(text) in str(info.value)


def test_single_task_cannot_be_virtual() -> None:
    with pytest.raises(ArgumentError, match="single-task"):
        TaskName(TaskKind.SINGLE, processor="p", elasticity_factor=2)


def test_bucket_is_parent_of_b_and_b_plus_f_at_double_factor() -> None:
    for factor in (1, 2, 4, 8):
        for bucket in range(factor):
            for child in (bucket, bucket + factor):
                assert parent_bucket(child, 2 * factor) == bucket
                assert bucket_lineage(bucket, factor, child, 2 * factor) is Lineage.ANCESTOR


@pytest.mark.parametrize(("key_bucket", "factor"), [(4, 4), (9, 4), (-1, 2), (2, 2)])
def test_parent_bucket_refuses_a_bucket_outside_its_factor(key_bucket: int, factor: int) -> None:
    with pytest.raises(ArgumentError) as info:
        parent_bucket(key_bucket, factor)
    assert "key_bucket" in str(info.value)
    assert repr(key_bucket) in str(info.value)


def test_parent_bucket_refuses_a_bucket_that_is_not_an_int() -> None:
    with pytest.raises(ArgumentTypeError, match="key_bucket"):
        parent_bucket(1.0, 4)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("args", "name"),
    [
        ((-1, 2, 1, 4), "bucket_a"),
        ((2, 2, 1, 4), "bucket_a"),
        ((0, 2, 4, 4), "bucket_b"),
        ((0, 2, -3, 4), "bucket_b"),
    ],
)
def test_bucket_lineage_refuses_a_bucket_outside_its_factor(
    args: tuple[int, int, int, int], name: str
) -> None:
    with pytest.raises(ArgumentError) as info:
        bucket_lineage(*args)
    assert name in str(info.value)
    assert "a bucket from 0 to" in str(info.value)


def test_split_children_descend_from_parent_task() -> None:
    parent = TaskName.parse("Partition 0_1_2")
    children = [TaskName.parse("Partition 0_1_4"), TaskName.parse("Partition 0_3_4")]
    for child in children:
        assert lineage(parent, child) is Lineage.ANCESTOR
        assert lineage(child, parent) is Lineage.DESCENDANT
    assert lineage(parent, TaskName.parse("Partition 0_2_4")) is Lineage.UNRELATED


def test_lineage_spans_several_generations() -> None:
    assert lineage(TaskName.parse("Partition 2"), TaskName.parse("Partition 2_5_8")) is (
        Lineage.ANCESTOR
    )
    assert lineage(TaskName.parse("Partition 2_5_8"), TaskName.parse("Partition 2_1_2")) is (
        Lineage.DESCENDANT
    )
    assert lineage(TaskName.parse("Partition 2_5_8"), TaskName.parse("Partition 2_5_8")) is (
        Lineage.SAME
    )


def test_tasks_of_different_partitions_are_unrelated() -> None:
    assert lineage(TaskName.parse("Partition 0_1_2"), TaskName.parse("Partition 1_1_4")) is (
        Lineage.UNRELATED
    )
    a = TaskName.parse("SystemStreamPartition [kafka, PVE, 0, 1]_2")
    b = TaskName.parse("SystemStreamPartition [kafka, URE, 0, 1]_4")
    assert lineage(a, b) is Lineage.UNRELATED


def test_ssp_task_lineage_follows_buckets() -> None:
    a = TaskName.parse("SystemStreamPartition [kafka, PVE, 0, 1]_2")
    b = TaskName.parse("SystemStreamPartition [kafka, PVE, 0, 3]_4")
    assert lineage(a, b) is Lineage.ANCESTOR


def test_lineage_is_undefined_when_neither_factor_divides_the_other() -> None:
    with pytest.raises(ArgumentError, match="divides"):
        bucket_lineage(0, 4, 1, 6)


def test_lineage_is_undefined_across_grouper_families() -> None:
    with pytest.raises(TaskNameError, match="same grouper"):
        lineage(TaskName.parse("Partition 0"), TaskName.parse("SystemStreamPartition [k, s, 0]"))
    with pytest.raises(TaskNameError, match="no key buckets"):
        lineage(TaskName.parse("Task-a"), TaskName.parse("Task-a"))
