"""A ``KafkaInput``'s reader (Spark's Kafka source, gated or not, or ours) reading a topic.

The suite's shared session has Spark's Kafka connector and the project's
jar on its class path when ``make jars`` built them (the root
``conftest.py``): :func:`read_with_spark` runs a short ``availableNow``
query in it and returns what it read.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from spark_elastic import KafkaInput

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def read_with_spark(
    spark: SparkSession, source: KafkaInput, partitions: int, workdir: Path
) -> dict[str, Any]:
    """Every record of ``source``'s first topic, read by its reader with ``availableNow``.

    Skips (fails under CI, whose ``make test`` fetches them) when the session
    lacks the jars.

    Returns
    -------
    dict
        ``rows`` (``(key, partition, offset)`` each), ``full`` (``(key,
        partition, offset, value, topic, timestamp ms, timestampType)`` each)
        and ``batches`` (micro-batches that read records).
    """
    if "spark-sql-kafka" not in spark.conf.get("spark.jars", ""):
        why = "no Spark Kafka connector in the session: run 'make jars'"
        if os.environ.get("CI"):
            pytest.fail(f"{why}: CI runs the Kafka specs")
        pytest.skip(why)
    topic = source.topics[0]
    name = f"landed_{uuid.uuid4().hex}"
    rows = source.stream_reader(spark, {topic: list(range(partitions))}).load()
    query = (
        rows.selectExpr(
            "CAST(key AS STRING) AS key",
            "partition",
            "offset",
            "CAST(value AS STRING) AS value",
            "topic",
            "unix_millis(timestamp) AS millis",
            "timestampType",
        )
        .writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(workdir / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(240)
        assert not query.isActive, "the availableNow query did not finish in 240 s"
        assert query.exception() is None, query.exception()
        full = [tuple(r) for r in spark.table(name).collect()]
    finally:
        query.stop()
        spark.catalog.dropTempView(name)
    return {
        "rows": [r[:3] for r in full],
        "full": full,
        "batches": sum(1 for p in query.recentProgress if p["numInputRows"] > 0),
    }
