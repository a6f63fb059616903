"""A rescaled checkpoint's first start cannot skip records: a forgotten startingOffsets is loud.

Kafka's default ``startingOffsets`` is ``latest``; a rescaled query started
there would silently skip the records its buckets still need. Starting lower
(``earliest``) is safe: bucket checkpoints skip what the state holds.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from stateful_job import TOPIC, Job, RunningCount

from spark_elastic import LOG_SOURCE_FORMAT, rescale, starting_offsets, with_task_state
from spark_elastic.errors import CheckpointError

pytestmark = pytest.mark.slow


def transform_on(job: Job, checkpoint: Path, starting: str | None) -> None:
    reader = (
        job.spark.readStream.format(LOG_SOURCE_FORMAT)
        .option("path", str(job.log.path))
        .option("subscribe", TOPIC)
    )
    if starting is not None:
        reader = reader.option("startingOffsets", starting)
    reader.load().transform(
        with_task_state(
            RunningCount(),
            job="running-count",
            checkpoint_location=checkpoint,
            elasticity_factor=2,
            partitions={TOPIC: 2},
        )
    )


def test_a_rescaled_query_started_past_its_offsets_is_refused(
    spark: SparkSession, tmp_path: Path
) -> None:
    job = Job(spark, tmp_path / "job", random.Random(1))
    job.produce(100)
    job.run(tmp_path / "cp", 1)
    split = tmp_path / "cp-split"
    rescale(tmp_path / "cp", split, 2, spark)
    before = sorted(p.relative_to(split) for p in split.rglob("*"))
    needed = json.loads(starting_offsets(split))
    past = json.dumps({TOPIC: {p: o + 1 for p, o in needed[TOPIC].items()}})
    for starting in (None, "latest", past):
        with pytest.raises(CheckpointError) as info:
            transform_on(job, split, starting)
        message = str(info.value)
        assert "\n" not in message
        assert "was made by rescale" in message
        assert 'option("startingOffsets", starting_offsets(checkpoint))' in message
    assert sorted(p.relative_to(split) for p in split.rglob("*")) == before
    transform_on(job, split, starting_offsets(split))  # what it needs
    transform_on(job, split, "earliest")  # lower is safe: the bucket checkpoints skip
