"""Specification of the groupers and job plans (SAMZA-71, SEP-5, SEP-32)."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from spark_elastic import (
    Grouper,
    JobPlan,
    PartitionMapping,
    StreamInput,
    SystemStreamPartition,
    TaskName,
    load_plan_json,
    plan_job,
    save_plan_json,
)
from spark_elastic.errors import (
    ArgumentError,
    ArgumentTypeError,
    PartitionExpansionError,
    PlanError,
)


def ssp(stream: str, partition: int, bucket: int | None = None) -> SystemStreamPartition:
    return SystemStreamPartition("kafka", stream, partition, bucket)


def mapping(plan_tasks: object) -> dict[str, list[str]]:
    return {str(t.name): [str(p) for p in t.partitions] for t in plan_tasks}  # type: ignore[attr-defined]


# -- by partition --------------------------------------------------------------------------------


def test_partition_grouper_puts_partition_i_of_every_stream_in_task_partition_i() -> None:
    plan = plan_job(["kafka.PVE:3", "kafka.URE:2"], Grouper.PARTITION)
    assert [(t.id, str(t.name), t.partitions) for t in plan.tasks] == [
        (0, "Partition 0", (ssp("PVE", 0), ssp("URE", 0))),
        (1, "Partition 1", (ssp("PVE", 1), ssp("URE", 1))),
        (2, "Partition 2", (ssp("PVE", 2),)),
    ]


def test_partition_grouper_with_factor_makes_f_virtual_tasks_per_partition() -> None:
    plan = plan_job(["kafka.PVE:2", "kafka.URE:2"], "partition", elasticity_factor=2)
    assert [(t.id, str(t.name), t.partitions) for t in plan.tasks] == [
        (0, "Partition 0_0_2", (ssp("PVE", 0, 0), ssp("URE", 0, 0))),
        (1, "Partition 0_1_2", (ssp("PVE", 0, 1), ssp("URE", 0, 1))),
        (2, "Partition 1_0_2", (ssp("PVE", 1, 0), ssp("URE", 1, 0))),
        (3, "Partition 1_1_2", (ssp("PVE", 1, 1), ssp("URE", 1, 1))),
    ]


# -- by stream partition (SAMZA-71 max) ----------------------------------------------------------


def test_ssp_grouper_numbers_tasks_as_samza_71_max_example() -> None:
    # SAMZA-71: task.inputs=IS2,IS1 with IS2 (8) and IS1 (4): IS2:0..7 -> 0..7, IS1:0..3 -> 8..11.
    plan = plan_job(["kafka.IS2:8", "kafka.IS1:4"], Grouper.SSP)
    expected = [ssp("IS2", p) for p in range(8)] + [ssp("IS1", p) for p in range(4)]
    assert [t.partitions for t in plan.tasks] == [(s,) for s in expected]
    assert [t.id for t in plan.tasks] == list(range(12))
    assert [str(t.name) for t in plan.tasks] == [str(s) for s in expected]


def test_ssp_grouper_with_factor_makes_f_virtual_tasks_per_stream_partition() -> None:
    plan = plan_job(["kafka.PVE:2"], "ssp", elasticity_factor=2)
    assert [str(t.name) for t in plan.tasks] == [
        "SystemStreamPartition [kafka, PVE, 0, 0]_2",
        "SystemStreamPartition [kafka, PVE, 0, 1]_2",
        "SystemStreamPartition [kafka, PVE, 1, 0]_2",
        "SystemStreamPartition [kafka, PVE, 1, 1]_2",
    ]
    assert plan.tasks[3].partitions == (ssp("PVE", 1, 1),)


# -- single task ---------------------------------------------------------------------------------


def test_single_task_grouper_gives_each_processor_every_partition() -> None:
    plan = plan_job(["kafka.PVE:2", "kafka.URE:1"], "single", processors=["a", "b"])
    everything = (ssp("PVE", 0), ssp("PVE", 1), ssp("URE", 0))
    assert [(str(t.name), t.partitions) for t in plan.tasks] == [
        ("Task-a", everything),
        ("Task-b", everything),
    ]


def test_single_task_grouper_defaults_to_one_processor() -> None:
    assert [str(t.name) for t in plan_job(["kafka.PVE:2"], "single").tasks] == ["Task-0"]


def test_single_task_grouper_refuses_elasticity() -> None:
    with pytest.raises(ArgumentError, match=r"elasticity_factor.*'single' grouper.*found 2"):
        plan_job(["kafka.PVE:2"], "single", elasticity_factor=2)


def test_processors_belong_to_the_single_task_grouper_only() -> None:
    with pytest.raises(ArgumentError, match="processors"):
        plan_job(["kafka.PVE:2"], "partition", processors=["a"])


def test_single_task_grouper_refuses_duplicate_processors() -> None:
    with pytest.raises(ArgumentError, match="distinct"):
        plan_job(["kafka.PVE:2"], "single", processors=["a", "a"])


def test_processors_given_as_a_bare_str_are_refused_not_split_into_letters() -> None:
    with pytest.raises(ArgumentTypeError, match=r"processors: expected a list .* found str 'ab'"):
        plan_job(["kafka.PVE:2"], "single", processors="ab")


# -- cogroup (SAMZA-71) --------------------------------------------------------------------------


def test_cogroup_makes_gcd_tasks_as_samza_71_example() -> None:
    # SAMZA-71: IS1 (8) and IS2 (12) under cogroup: gcd 4 tasks, partition p -> task p mod 4.
    plan = plan_job(["kafka.IS1:8", "kafka.IS2:12"], Grouper.COGROUP)
    assert plan.task_count == 4
    by_task = {t.id: set(t.partitions) for t in plan.tasks}
    for stream, count in (("IS1", 8), ("IS2", 12)):
        for p in range(count):
            assert ssp(stream, p) in by_task[p % 4]
    assert plan.task_id_of("kafka", "IS1", 5) == plan.task_id_of("kafka", "IS2", 9) == 1


def test_cogroup_sends_every_key_of_both_streams_to_one_task() -> None:
    # SAMZA-71's member ids: 1213 % 8 = 5, 1213 % 12 = 1, both in task 1; likewise for all keys.
    plan = plan_job(["kafka.IS1:8", "kafka.IS2:12"], "cogroup")
    for member in range(5000):
        assert plan.task_id_of("kafka", "IS1", member % 8) == plan.task_id_of(
            "kafka", "IS2", member % 12
        )


def test_cogroup_with_factor_splits_each_group() -> None:
    plan = plan_job(["kafka.IS1:4", "kafka.IS2:6"], "cogroup", elasticity_factor=2)
    assert [str(t.name) for t in plan.tasks] == [
        "Partition 0_0_2",
        "Partition 0_1_2",
        "Partition 1_0_2",
        "Partition 1_1_2",
    ]
    assert plan.tasks[3].partitions == (
        ssp("IS1", 1, 1),
        ssp("IS1", 3, 1),
        ssp("IS2", 1, 1),
        ssp("IS2", 3, 1),
        ssp("IS2", 5, 1),
    )


# -- numbering and lookups -----------------------------------------------------------------------


@pytest.mark.parametrize("grouper", ["partition", "ssp", "cogroup"])
@pytest.mark.parametrize("factor", [1, 4])
def test_every_task_id_is_numbered_densely_and_lookups_agree(grouper: str, factor: int) -> None:
    plan = plan_job(["kafka.A:4", "kafka.B:8"], grouper, elasticity_factor=factor)
    tasks = list(plan.tasks)
    assert [t.id for t in tasks] == list(range(plan.task_count))
    for task in tasks:
        for part in task.partitions:
            bucket = 0 if part.key_bucket is None else part.key_bucket
            assert plan.task_id_of(part.system, part.stream, part.partition, bucket) == task.id
    # every (partition, bucket) is read by exactly one task
    seen = [p for t in tasks for p in t.partitions]
    assert len(seen) == len(set(seen)) == 12 * factor


def test_plan_is_deterministic() -> None:
    a = plan_job(["kafka.A:4", "kafka.B:8"], "cogroup", 2).to_json()
    b = plan_job(["kafka.A:4", "kafka.B:8"], "cogroup", 2).to_json()
    assert a == b


def test_lookup_of_partition_outside_plan_is_an_error() -> None:
    plan = plan_job(["kafka.A:4"])
    with pytest.raises(PlanError, match=r"partition 4 of kafka\.A is not in the plan"):
        plan.task_id_of("kafka", "A", 4)
    with pytest.raises(PlanError, match=r"kafka\.Z is not an input"):
        plan.task_id_of("kafka", "Z", 0)


# -- bad inputs ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ([], "at least one input"),
        (["kafka.A:2", "kafka.A:4"], "each stream once"),
        (["kafka.A:0"], "partition count of kafka.A"),
        (["kafkaA:2"], "system.stream:partition_count"),
        (["kafka.A"], "system.stream:partition_count"),
        (["kafka.A:\u00b2"], "system.stream:partition_count"),  # SUPERSCRIPT TWO: isdigit()
        (["kafka.A:\u0663"], "system.stream:partition_count"),  # ARABIC-INDIC DIGIT THREE
        (["kafka.A:2147483648"], r"partition count of kafka.A.*at most 2147483647"),
        (["kafka.A:99999999999999"], r"partition count of kafka.A.*at most 2147483647"),
    ],
)
def test_bad_inputs_are_reported(inputs: list[str], message: str) -> None:
    with pytest.raises(ArgumentError, match=message):
        plan_job(inputs)


def test_partition_count_above_kafkas_int32_maximum_is_refused() -> None:
    assert StreamInput("kafka", "A", 2**31 - 1).partition_count == 2**31 - 1
    with pytest.raises(ArgumentError, match=r"partition count of kafka\.A.*found 2147483648"):
        StreamInput("kafka", "A", 2**31)


@pytest.mark.parametrize(
    ("inputs", "factor"),
    [
        (["kafka.A:2147483647"], 1),
        (["kafka.A:2147483647", "kafka.B:2147483647"], 1),
        (["kafka.A:16384", "kafka.B:1"], 1024),
        (["kafka.A:16777217"], 1),
    ],
)
def test_plan_above_the_size_limit_is_refused_before_allocating(
    inputs: list[str], factor: int
) -> None:
    # The limit is on partitions x factor, 2**24; numpy would otherwise raise MemoryError.
    with pytest.raises(PlanError, match=r"partitions x elasticity factor.*limit of 16777216"):
        plan_job(inputs, elasticity_factor=factor)


def test_plan_at_the_size_limit_is_made() -> None:
    assert plan_job(["kafka.A:16384"], elasticity_factor=1024).task_count == 2**24


def test_unknown_grouper_lists_the_choices() -> None:
    with pytest.raises(ArgumentError, match=r"grouper.*'nope'.*'partition', 'ssp', 'single'"):
        plan_job(["kafka.A:2"], "nope")


def test_stream_input_parse_keeps_dots_in_stream_names() -> None:
    assert StreamInput.parse("kafka.page.views:8") == StreamInput("kafka", "page.views", 8)


# -- partition expansion (SEP-5) -----------------------------------------------------------------


def previous_of(inputs: list[str], grouper: str = "partition", factor: int = 1) -> PartitionMapping:
    """The mapping as the next plan reads it: through the JSON document."""
    document = json.loads(json.dumps(plan_job(inputs, grouper, factor).to_json()))
    return PartitionMapping.from_json(document)


def previous_of_plan(plan: JobPlan) -> PartitionMapping:
    """A plan's mapping as the next plan reads it: through the JSON document."""
    return PartitionMapping.from_json(json.loads(json.dumps(plan.to_json())))


def test_grown_stream_keeps_task_count_and_new_partition_joins_p_mod_old() -> None:
    # SEP-5's example: partitions 2 -> 4; partitions 0 and 2 share a task, 1 and 3 share one.
    previous = previous_of(["kafka.PVE:2"])
    plan = plan_job(["kafka.PVE:4"], previous=previous)
    assert mapping(plan.tasks) == {
        "Partition 0": [str(ssp("PVE", 0)), str(ssp("PVE", 2))],
        "Partition 1": [str(ssp("PVE", 1)), str(ssp("PVE", 3))],
    }


def test_grown_stream_keeps_key_to_task_mapping() -> None:
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    previous = previous_of(["kafka.PVE:4", "kafka.URE:4"])
    plan = plan_job(["kafka.PVE:16", "kafka.URE:4"], previous=previous)
    before = plan_job(["kafka.PVE:4", "kafka.URE:4"])
    for _ in range(2000):
        key_hash = rng.randrange(2**31)
        old_task = before.task_name(before.task_id_of("kafka", "PVE", key_hash % 4))
        new_task = plan.task_name(plan.task_id_of("kafka", "PVE", key_hash % 16))
        assert old_task == new_task, f"seed={seed} hash={key_hash}"
    assert plan.task_count == 4


def test_unchanged_and_new_streams_group_as_usual_beside_a_grown_one() -> None:
    previous = previous_of(["kafka.PVE:2", "kafka.URE:4"])
    plan = plan_job(["kafka.PVE:4", "kafka.URE:4", "kafka.NEW:3"], previous=previous)
    assert mapping(plan.tasks) == {
        "Partition 0": [
            str(ssp(s, p)) for s, p in [("PVE", 0), ("PVE", 2), ("URE", 0), ("NEW", 0)]
        ],
        "Partition 1": [
            str(ssp(s, p)) for s, p in [("PVE", 1), ("PVE", 3), ("URE", 1), ("NEW", 1)]
        ],
        "Partition 2": [str(ssp(s, p)) for s, p in [("URE", 2), ("NEW", 2)]],
        "Partition 3": [str(ssp("URE", 3))],
    }


def test_expansion_applies_the_new_elasticity_factor_to_old_tasks() -> None:
    previous = previous_of(["kafka.PVE:2"], factor=4)
    plan = plan_job(["kafka.PVE:4"], elasticity_factor=2, previous=previous)
    assert [str(t.name) for t in plan.tasks] == [
        "Partition 0_0_2",
        "Partition 0_1_2",
        "Partition 1_0_2",
        "Partition 1_1_2",
    ]
    assert plan.tasks[1].partitions == (ssp("PVE", 0, 1), ssp("PVE", 2, 1))


def test_ssp_grouper_expansion_joins_old_stream_partition_task() -> None:
    previous = previous_of(["kafka.PVE:2"], "ssp")
    plan = plan_job(["kafka.PVE:4"], "ssp", previous=previous)
    assert mapping(plan.tasks) == {
        str(ssp("PVE", 0)): [str(ssp("PVE", 0)), str(ssp("PVE", 2))],
        str(ssp("PVE", 1)): [str(ssp("PVE", 1)), str(ssp("PVE", 3))],
    }


def test_cogroup_expansion_keeps_groups_when_gcd_would_grow() -> None:
    # gcd(4, 8) = 4; PVE growing to 8 would make gcd 8 and move URE's keys: keep 4 groups.
    previous = previous_of(["kafka.PVE:4", "kafka.URE:8"], "cogroup")
    plan = plan_job(["kafka.PVE:8", "kafka.URE:8"], "cogroup", previous=previous)
    assert plan.task_count == 4
    for key_hash in range(1000):
        assert plan.task_id_of("kafka", "PVE", key_hash % 8) == plan.task_id_of(
            "kafka", "URE", key_hash % 8
        )


def test_cogroup_refuses_a_previous_mapping_that_is_not_cogroup() -> None:
    # A partition-grouper plan file without a "grouper" key: its tasks are also "Partition i",
    # but it has 4 tasks, one per PVE partition, which URE's 2 partitions cannot cogroup with.
    document = plan_job(["kafka.PVE:4", "kafka.URE:2"], "partition").to_json()
    del document["grouper"]
    previous = PartitionMapping.from_json(json.loads(json.dumps(document)))
    with pytest.raises(
        PlanError, match=r"kafka\.URE has 2 partitions.*4 tasks.*not made by the cogroup grouper"
    ):
        plan_job(["kafka.PVE:4", "kafka.URE:2"], "cogroup", previous=previous)


def test_cogroup_refuses_a_previous_mapping_where_partition_p_is_not_in_p_mod_groups() -> None:
    p0, p1 = TaskName.for_partition(0), TaskName.for_partition(1)
    previous = PartitionMapping(None, {("kafka", "PVE"): (p0, p1, p1, p0)})
    with pytest.raises(
        PlanError, match=r"partition 2 of kafka\.PVE is in task 'Partition 1'.*'Partition 0'"
    ):
        plan_job(["kafka.PVE:4"], "cogroup", previous=previous)


def test_cogroup_new_stream_joins_the_groups_after_an_earlier_expansion() -> None:
    # PVE:4 + URE:8 is 4 groups; PVE growing to 8 keeps them, though gcd(8, 8) is 8.
    first = plan_job(["kafka.PVE:4", "kafka.URE:8"], "cogroup")
    second = plan_job(["kafka.PVE:8", "kafka.URE:8"], "cogroup", previous=previous_of_plan(first))
    for new_count in (4, 8):
        plan = plan_job(
            ["kafka.PVE:8", "kafka.URE:8", f"kafka.NEW:{new_count}"],
            "cogroup",
            previous=previous_of_plan(second),
        )
        assert plan.task_count == 4
        for key_hash in range(1000):
            assert plan.task_id_of("kafka", "PVE", key_hash % 8) == plan.task_id_of(
                "kafka", "NEW", key_hash % new_count
            )


def test_cogroup_keeps_its_groups_when_a_stream_is_dropped() -> None:
    previous = previous_of(["kafka.PVE:4", "kafka.URE:8"], "cogroup")
    plan = plan_job(["kafka.URE:8"], "cogroup", previous=previous)
    assert plan.task_count == 4
    assert [plan.task_id_of("kafka", "URE", p) for p in range(8)] == [0, 1, 2, 3] * 2


def test_cogroup_accepts_its_own_previous_plan_without_a_grouper_key() -> None:
    document = plan_job(["kafka.PVE:4", "kafka.URE:2"], "cogroup").to_json()
    del document["grouper"]
    previous = PartitionMapping.from_json(json.loads(json.dumps(document)))
    plan = plan_job(["kafka.PVE:8", "kafka.URE:2"], "cogroup", previous=previous)
    assert plan.task_count == 2
    for key_hash in range(1000):
        assert plan.task_id_of("kafka", "PVE", key_hash % 8) == plan.task_id_of(
            "kafka", "URE", key_hash % 2
        )


def test_cogroup_expansion_refuses_new_stream_that_does_not_fit_groups() -> None:
    previous = previous_of(["kafka.PVE:4", "kafka.URE:8"], "cogroup")
    with pytest.raises(PlanError, match=r"multiple of 4 partitions.*kafka.NEW:6"):
        plan_job(["kafka.PVE:4", "kafka.URE:8", "kafka.NEW:6"], "cogroup", previous=previous)


def test_shrunk_stream_is_an_error_naming_stream_and_counts() -> None:
    previous = previous_of(["kafka.PVE:4"])
    with pytest.raises(PartitionExpansionError, match=r"kafka.PVE.*shrank from 4 to 2"):
        plan_job(["kafka.PVE:2"], previous=previous)


def test_growth_to_non_multiple_is_an_error_naming_stream_and_counts() -> None:
    previous = previous_of(["kafka.PVE:4"])
    with pytest.raises(PartitionExpansionError, match=r"kafka.PVE.*from 4 to 6.*not a multiple"):
        plan_job(["kafka.PVE:6"], previous=previous)


def test_previous_plan_of_another_grouper_is_refused() -> None:
    with pytest.raises(PlanError, match="'ssp' grouper"):
        plan_job(["kafka.PVE:4"], "partition", previous=previous_of(["kafka.PVE:4"], "ssp"))


def test_previous_may_be_the_previous_job_plan_itself() -> None:
    plan = plan_job(["kafka.PVE:4"], previous=plan_job(["kafka.PVE:2"]))
    assert plan.task_count == 2


@pytest.mark.parametrize("previous", ["plan.json", Path("plan.json"), {}])
def test_previous_that_is_not_a_mapping_or_plan_is_refused_naming_the_argument(
    previous: object,
) -> None:
    with pytest.raises(
        ArgumentTypeError, match=r"previous: expected a PartitionMapping or JobPlan"
    ):
        plan_job(["kafka.PVE:4"], previous=previous)  # type: ignore[arg-type]


def test_single_grouper_plan_file_reads_back_as_an_empty_single_mapping(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    save_plan_json(plan_job(["kafka.A:2"], "single", processors=["a", "b"]), path)
    previous = load_plan_json(path)
    assert previous == PartitionMapping.from_plan(
        plan_job(["kafka.A:2"], "single", processors=["a", "b"])
    )
    assert previous.grouper is Grouper.SINGLE
    plan = plan_job(["kafka.A:4"], "single", processors=["a", "b"], previous=previous)
    assert plan.task_names() == ["Task-a", "Task-b"]
    with pytest.raises(PlanError, match="'single' grouper"):
        plan_job(["kafka.A:2"], "partition", previous=previous)


def test_previous_plan_is_saved_atomically_and_read_back(tmp_path: Path) -> None:
    target = tmp_path / "state" / "plan.json"
    save_plan_json(plan_job(["kafka.PVE:2"], elasticity_factor=2), target)
    assert [p.name for p in target.parent.iterdir()] == ["plan.json"]  # no temp file left over
    previous = load_plan_json(target)
    assert previous.streams[("kafka", "PVE")] == (
        TaskName.for_partition(0),
        TaskName.for_partition(1),
    )
    save_plan_json(plan_job(["kafka.PVE:4"], elasticity_factor=2, previous=previous), target)
    assert load_plan_json(target).streams[("kafka", "PVE")] == tuple(
        TaskName.for_partition(p % 2) for p in range(4)
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json", "cannot read"),
        ('{"nope": 1}', "'tasks' list"),
        ('{"tasks": [{"name": "Partition 0"}]}', "malformed"),
        ('{"tasks": [{"name": "bad", "partitions": []}]}', "task name"),
        (
            '{"tasks": [{"name": "Partition 0", "partitions": '
            '[{"system": "kafka", "stream": "A", "partition": 1}]}]}',
            "numbered 0 to 0",
        ),
        (
            '{"tasks": [{"name": "Partition 0", "partitions": '
            '[{"system": "kafka", "stream": "A", "partition": 1e400}]}]}',
            r"partition of kafka\.A: expected a non-negative integer, found inf",
        ),
        (
            '{"tasks": [{"name": "Partition 0", "partitions": '
            '[{"system": "kafka", "stream": "A", "partition": 0.0}]}]}',
            r"partition of kafka\.A: expected a non-negative integer, found 0\.0",
        ),
        (
            '{"tasks": [{"name": "Partition 0", "partitions": '
            '[{"system": "kafka", "stream": "A", "partition": false}]}]}',
            r"partition of kafka\.A: expected a non-negative integer, found False",
        ),
        (
            '{"tasks": [{"name": "Partition 0", "partitions": '
            '[{"system": "kafka", "stream": "A", "partition": "0"}]}]}',
            r"partition of kafka\.A: expected a non-negative integer, found '0'",
        ),
        ('{"grouper": ["partition"], "tasks": []}', r"'grouper': expected one of"),
        (
            '{"tasks": [{"name": "Task-a", "partitions": []}, '
            '{"name": "Partition 0", "partitions": []}]}',
            "tasks of one grouper",
        ),
        ('{"grouper": "ssp", "tasks": [{"name": "Task-a", "partitions": []}]}', "says grouper"),
    ],
)
def test_unreadable_previous_plan_is_a_clear_error(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "plan.json"
    path.write_text(content)
    with pytest.raises(PlanError, match=message):
        load_plan_json(path)


def test_save_to_a_directory_is_refused_naming_the_path_argument(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match=r"path: expected a file .* found directory"):
        save_plan_json(plan_job(["kafka.A:1"]), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_save_under_a_regular_file_is_refused_naming_the_path_argument(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    with pytest.raises(PlanError, match=r"path: .*afile' is not a directory"):
        save_plan_json(plan_job(["kafka.A:1"]), tmp_path / "afile" / "sub" / "plan.json")
    assert [p.name for p in tmp_path.iterdir()] == ["afile"]


def test_failed_save_leaves_no_temporary_file_no_new_directory_and_the_old_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = tmp_path / "plan.json"
    save_plan_json(plan_job(["kafka.A:1"]), old)
    before = old.read_text()

    def disk_full(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", disk_full)
    with pytest.raises(PlanError, match=r"path: .*'.*plan\.json' \(No space left on device\)"):
        save_plan_json(plan_job(["kafka.A:2"]), old)
    with pytest.raises(PlanError, match="No space left"):
        save_plan_json(plan_job(["kafka.A:2"]), tmp_path / "new" / "deeper" / "plan.json")
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]
    assert old.read_text() == before


def test_missing_previous_plan_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="does not exist"):
        load_plan_json(tmp_path / "absent.json")


# -- JSON ----------------------------------------------------------------------------------------


def test_json_lists_key_bucket_only_with_factor_above_one() -> None:
    plain = plan_job(["kafka.PVE:1"]).to_json()["tasks"]
    assert plain == [
        {
            "id": 0,
            "name": "Partition 0",
            "partitions": [{"system": "kafka", "stream": "PVE", "partition": 0}],
        }
    ]
    virtual = plan_job(["kafka.PVE:1"], elasticity_factor=2).to_json()["tasks"]
    assert virtual[1] == {
        "id": 1,
        "name": "Partition 0_1_2",
        "partitions": [{"system": "kafka", "stream": "PVE", "partition": 0, "keyBucket": 1}],
    }


def test_large_plan_is_columnar_and_complete() -> None:
    plan = plan_job(["kafka.BIG:100000"], elasticity_factor=16)
    assert plan.task_count == 1_600_000
    last = plan.tasks[-1]
    assert str(last.name) == "Partition 99999_15_16"
    assert last.partitions == (ssp("BIG", 99999, 15),)


@pytest.mark.parametrize(
    ("grouper", "factor"),
    [("partition", 1), ("partition", 2), ("ssp", 1), ("ssp", 2), ("cogroup", 2), ("single", 1)],
)
def test_task_names_fast_path_matches_task_models(grouper: str, factor: int) -> None:
    plan = plan_job(["kafka.A:4", "kafka.B:6"], grouper, elasticity_factor=factor)
    assert plan.task_names() == [str(t.name) for t in plan.tasks]
