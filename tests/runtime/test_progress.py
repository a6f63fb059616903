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

from spark_elastic.runtime.container.query import progress_since


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
