"""Specification: a stateful query's tasks read no file of its checkpoint by path.

On a cluster the executors are on other hosts, and a checkpoint on HDFS or
S3 is no file a Python worker can open: what its tasks need of the driver's
files (the output fences a warm-up raises, whether the bootstrap streams
are read) travels with the tasks, by Spark's own file distribution
(``spark_elastic.state.shipped``).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from chispa import assert_df_equality
from pyspark.sql import SparkSession
from stateful_job import TOPIC, Job

from spark_elastic.state.checkpoint_dir import fences_path, write_fences
from spark_elastic.state.shipped import ship_fences

pytestmark = pytest.mark.slow


def test_fences_raised_while_a_query_runs_reach_its_tasks_without_the_file(
    spark: SparkSession, tmp_path: Path
) -> None:
    seed = random.randrange(2**32)
    print(f"seed={seed}")
    job = Job(spark, tmp_path, random.Random(seed))
    sent: list[tuple[str, int, int]] = []

    def produce(count: int) -> None:
        with job.log.producer(TOPIC) as producer:
            for _ in range(count):
                key = f"user-{job.rng.randrange(25)}"
                record = producer.send(key.encode(), b"x")
                sent.append((key, record.partition, record.offset))

    produce(200)
    checkpoint, output = tmp_path / "cp", tmp_path / "out"
    job.outputs.append(output)
    query = job.start(
        checkpoint, 1, None, "", output, 10_000, available_now=False, interval="100 milliseconds"
    )
    try:
        query.processAllAvailable()
        # As a warm-up does: fences 50 records past the end of each partition, shipped; the
        # file is gone before the records come, so only what was shipped can quiet them.
        ends = {p: 1 + max(o for _, q, o in sent if q == p) for _, p, _ in sent}
        fences = {p: end + 50 for p, end in ends.items()}
        write_fences(checkpoint, [((TOPIC, p, 0, 1), f) for p, f in fences.items()])
        ship_fences(spark, checkpoint)
        fences_path(checkpoint).unlink()
        produce(300)
        query.processAllAvailable()
    finally:
        query.stop()
    counts: dict[str, int] = {}
    expected = []
    for key, partition, offset in sorted(sent, key=lambda r: (r[1], r[2])):
        counts[key] = counts.get(key, 0) + 1  # a quiet record counts: it is applied to state
        if not ends[partition] <= offset < fences[partition]:
            expected.append((key, counts[key], offset, partition))
    assert_df_equality(
        job.output(),
        spark.createDataFrame(expected, "key string, count long, offset long, partition int"),
        ignore_row_order=True,
    )
