"""A stateful job goes on after its topic grows to a multiple of its count (SEP-5).

Kafka's partitioner sends a key to ``hash mod count``: after 2 -> 4 a key of
partition ``p`` goes to ``p`` or ``p + 2``, both read by the task of
``p mod 2``. So the job keeps its virtual tasks and their keyed state, and
no rescale is needed; a count that shrank or is not a multiple is refused.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from stateful_job import TOPIC, Job, final_state, run_to_end

from spark_elastic import plan_job, rescale
from spark_elastic.errors import CheckpointError
from spark_elastic.model.plan import Grouper, JobPlan, StreamInput
from spark_elastic.state.checkpoint_dir import JobSpec, read_job

FACTOR = 2
SIZES = (200, 200, 150)


def grown_plan() -> JobPlan:
    return plan_job(
        [f"kafka.{TOPIC}:4"],
        elasticity_factor=FACTOR,
        previous=plan_job([f"kafka.{TOPIC}:2"], elasticity_factor=FACTOR),
    )


def run_with_plan(job: Job, checkpoint: Path, plan: JobPlan) -> None:
    run_to_end(job, checkpoint, job.root / f"out-{checkpoint.name}", plan=plan)


def same_records(spark: SparkSession, root: Path, seed: int) -> Job:
    """A job on a log that receives the same records and grows at the same point."""
    job = Job(spark, root, random.Random(seed))
    job.produce(SIZES[0])
    job.log.grow(TOPIC, 4)
    for size in SIZES[1:]:
        job.produce(size)
    return job


# In `make test` since session 49: the Kafka story no longer grows its topic there (its
# `long` story does), so this is the gate's proof that keyed state stays exact over growth.
@pytest.mark.slow
def test_topic_grown_to_a_multiple_while_stopped_goes_on_without_rescale(
    spark: SparkSession, tmp_path: Path
) -> None:
    seed = random.randrange(2**32)
    print(f"seed={seed}")
    job = Job(spark, tmp_path / "job", random.Random(seed))
    checkpoint = tmp_path / "cp"
    job.produce(SIZES[0])
    job.run(checkpoint, FACTOR)  # 2 partitions, 4 virtual tasks

    job.log.grow(TOPIC, 4)  # while stopped
    job.produce(SIZES[1])
    job.run(checkpoint, FACTOR)  # partitions={"clicks": 4}: the same job, grown
    recorded = read_job(checkpoint)
    assert recorded is not None
    assert recorded.inputs == (StreamInput("kafka", TOPIC, 4),)
    assert recorded.task_inputs == (StreamInput("kafka", TOPIC, 2),)
    assert recorded.plan().task_names() == grown_plan().task_names()
    assert len(recorded.plan().task_names()) == 4

    job.produce(SIZES[2])
    run_with_plan(job, checkpoint, grown_plan())  # a SEP-5 plan= is the same job too

    reference = same_records(spark, tmp_path / "reference", seed)
    run_with_plan(reference, tmp_path / "reference" / "cp", grown_plan())
    from chispa import assert_df_equality

    assert_df_equality(
        job.output(), reference.output(), ignore_row_order=True, ignore_nullable=True
    )
    assert_df_equality(
        final_state(spark, checkpoint),
        final_state(spark, tmp_path / "reference" / "cp"),
        ignore_row_order=True,
        ignore_nullable=True,
    )
    # Per key, every record applied once, across its old and new partition.
    counts: dict[str, list[int]] = {}
    for row in job.output().collect():
        counts.setdefault(row.key, []).append(row["count"])
    for key, applied in counts.items():
        assert sorted(applied) == list(range(1, len(applied) + 1)), f"seed={seed} {key}"

    # A grown checkpoint rescales like any other, keeping the grown tasks.
    result = rescale(checkpoint, tmp_path / "cp-f4", 4, spark)
    assert result.task_count == 8
    assert set(result.starting_offsets[TOPIC]) == {"0", "1", "2", "3"}


@pytest.mark.slow
def test_topic_grown_to_a_non_multiple_is_refused_and_nothing_written(
    spark: SparkSession, tmp_path: Path
) -> None:
    job = Job(spark, tmp_path / "job", random.Random(5))
    checkpoint = tmp_path / "cp"
    job.produce(50)
    job.run(checkpoint, FACTOR)
    before = (checkpoint / "_spark_elastic" / "job.json").read_text()
    job.log.grow(TOPIC, 3)
    with pytest.raises(CheckpointError) as info:
        job.run(checkpoint, FACTOR)
    message = str(info.value)
    assert "\n" not in message
    assert "now has 3 partitions" in message
    assert "not a multiple" in message
    assert "start the job afresh on a new checkpoint" in message
    assert (checkpoint / "_spark_elastic" / "job.json").read_text() == before


def spec(count: int) -> JobSpec:
    return JobSpec(
        name="j",
        inputs=(StreamInput("kafka", TOPIC, count),),
        grouper=Grouper.PARTITION,
        elasticity_factor=2,
        hash="spark",
        system="kafka",
        state_schema="count long",
    )


def test_job_spec_grows_to_multiples_only() -> None:
    grown = spec(4).grown_to(spec(8).inputs, "cp")
    assert grown.task_inputs == spec(4).inputs
    assert grown.plan().task_count == spec(4).plan().task_count
    assert grown.grown_to(spec(16).inputs, "cp").task_inputs == spec(4).inputs
    assert JobSpec.from_json(json.loads(json.dumps(grown.to_json())), "x") == grown
    with pytest.raises(CheckpointError, match="it shrank"):
        spec(4).grown_to(spec(2).inputs, "cp")
    with pytest.raises(CheckpointError, match="not a multiple"):
        spec(4).grown_to(spec(6).inputs, "cp")
