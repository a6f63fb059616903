"""Checkpoint locations as Spark takes them: plain paths and file:// URIs here.

Spark writes ``file:///data/cp`` to ``/data/cp``; the library's job file and
owner lock must go to the same directory, and ``checkpoint show`` and
``rescale`` must read it there. A scheme that cannot create a file only if
absent is refused in one line, and nothing is written anywhere. (Queries on
``hdfs://`` and ``s3a://`` checkpoints: ``tests/storage/test_storage_checkpoints.py``.)
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
from cli_runner import run_cli
from pyspark.sql import SparkSession
from stateful_job import TOPIC, Job, RunningCount, final_state, run_to_end

from spark_elastic import (
    read_checkpoint,
    rescale,
    with_task_state,
)
from spark_elastic.errors import ArgumentError
from spark_elastic.state.checkpoint_dir import checkpoint_path, read_job


@pytest.mark.parametrize(
    ("location", "path"),
    [
        ("/data/cp", "/data/cp"),
        ("relative/cp", "relative/cp"),
        ("file:///data/cp", "/data/cp"),
        ("file:/data/cp", "/data/cp"),
        ("file://localhost/data/cp", "/data/cp"),
        ("file:///data/with%20space", "/data/with space"),
    ],
)
def test_plain_paths_and_file_uris_name_the_directory_spark_writes(
    location: str, path: str
) -> None:
    assert checkpoint_path(location) == Path(path)


@pytest.mark.parametrize("location", ["s3://bucket/cp", "ftp://host/cp", "wasb://c@a/cp"])
def test_a_scheme_that_cannot_create_only_if_absent_is_refused_in_one_line_writing_nothing(
    location: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ArgumentError) as info:
        with_task_state(RunningCount(), job="j", checkpoint_location=location, elasticity_factor=1)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(
        "checkpoint_location: expected a local path, or a URI of a file system that can "
        "create a file only if absent (abfs:, abfss:, gs:, hdfs:, s3a:, viewfs:;"
    )
    assert location in message
    with pytest.raises(ArgumentError, match="source"):
        rescale(location, tmp_path / "new", 2)
    assert list(tmp_path.iterdir()) == []


def test_a_file_uri_of_another_host_is_refused() -> None:
    with pytest.raises(ArgumentError, match="absolute local path"):
        checkpoint_path("file://otherhost/data/cp")


def run_uri(job: Job, checkpoint: str, factor: int, output: Path) -> None:
    run_to_end(
        job,
        checkpoint,
        output,
        elasticity_factor=factor,
        partitions=job.log.partition_counts([TOPIC]),
    )


@pytest.mark.slow
@pytest.mark.long  # `make test-all`, for the suite's time
def test_a_file_uri_checkpoint_runs_shows_and_rescales(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    job = Job(spark, tmp_path / "job", random.Random(7))
    first, split = tmp_path / "cp", tmp_path / "cp-split"
    job.produce(120)
    run_uri(job, first.as_uri(), 1, tmp_path / "out-1")
    # The library's files are beside Spark's, not under a relative ./file:/...
    assert read_job(first) is not None
    assert (first / "commits").is_dir()
    assert not (tmp_path / "file:").exists()

    report = read_checkpoint(first.as_uri(), spark)
    assert report.committed
    shown = run_cli("checkpoint", "show", first.as_uri(), "--json", timeout=300)
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert json.loads(shown.stdout)["job"]["name"] == "running-count"
    assert " WARN " not in shown.stderr, shown.stderr  # the CLI's Spark logs errors only

    result = rescale(first.as_uri(), split.as_uri(), 2, spark)
    assert result.target == split
    job.produce(80)
    run_uri(job, split.as_uri(), 2, tmp_path / "out-2")
    assert sum(r["count"] for r in final_state(spark, split).collect()) == 200
    assert sorted(os.listdir(tmp_path)) == sorted(["cp", "cp-split", "job", "out-1", "out-2"]), (
        "nothing written anywhere else"
    )
