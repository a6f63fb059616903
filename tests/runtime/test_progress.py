"""A container reads its query's progress without rendering what it has already seen.

A real streaming query in this process, three micro-batches of one file each
(``availableNow``): ``progress_since`` gives each progress newer than a
trigger timestamp, oldest first, exactly as ``recentProgress`` holds them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from spark_elastic.errors import InputError
from spark_elastic.model.groupers import plan_job
from spark_elastic.runtime.container.query import build_report, progress_since
from spark_elastic.runtime.protocol import ContainerModel


def three_batches(spark: SparkSession, tmp_path: Path) -> Any:
    source = tmp_path / "in"
    source.mkdir()
    for n in range(3):
        (source / f"{n}.txt").write_text(f"line {n}\n")
    query = (
        spark.readStream.option("maxFilesPerTrigger", 1)
        .text(str(source))
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    return query


def test_progress_since_a_trigger_is_what_recent_progress_holds_after_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    query = three_batches(spark, tmp_path)
    every = [json.loads(p.json) for p in query.recentProgress]
    assert [p["batchId"] for p in every] == [0, 1, 2]

    assert progress_since(query, "") == every
    assert progress_since(query, every[0]["timestamp"]) == every[1:]
    assert progress_since(query, every[2]["timestamp"]) == []


class _BrokerAway:
    """A job's input whose broker is away: end offsets fail as KafkaInput's do."""

    def end_offsets(self, topic: str) -> dict[int, int]:
        raise InputError(
            f"KafkaInput.bootstrap_servers: expected a Kafka broker, found none ({topic})"
        )


class _Job:
    processor = None

    def __init__(self, job_input: Any) -> None:
        self.input = job_input


def test_a_commit_is_reported_with_its_lag_unknown_while_the_broker_is_away() -> None:
    # A container whose progress report raised stopped supervising its query: a broker
    # outage must never fail over the containers that wait for it.
    plan = plan_job(["kafka.clicks:2"], elasticity_factor=1)
    mine = ContainerModel("clicks-c1", tuple(plan.task_names()), 1, "/cp")
    progress = {"batchId": 7, "sources": [{"endOffset": {"clicks": {"0": 40, "1": 35}}}]}
    report = build_report(_Job(_BrokerAway()), plan, mine, progress)  # type: ignore[arg-type]
    assert [(t.task, t.offsets, t.lag) for t in report.tasks] == [
        ("Partition 0", {"clicks": {0: 40}}, -1),
        ("Partition 1", {"clicks": {1: 35}}, -1),
    ]


def test_a_report_says_how_long_its_batch_took_as_spark_measured_it() -> None:
    plan = plan_job(["kafka.clicks:2"], elasticity_factor=1)
    mine = ContainerModel("clicks-c1", tuple(plan.task_names()), 1, "/cp")
    progress = {
        "batchId": 7,
        "durationMs": {"triggerExecution": 812, "addBatch": 640},
        "sources": [{"endOffset": {"clicks": {"0": 40, "1": 35}}}],
    }
    report = build_report(_Job(_BrokerAway()), plan, mine, progress)  # type: ignore[arg-type]
    assert report.batch_duration_ms == 812
    assert report.to_json()["batchDurationMs"] == 812
    del progress["durationMs"]
    unsaid = build_report(_Job(_BrokerAway()), plan, mine, progress)  # type: ignore[arg-type]
    assert unsaid.batch_duration_ms == -1
    assert "batchDurationMs" not in unsaid.to_json()  # as a container of an earlier version
