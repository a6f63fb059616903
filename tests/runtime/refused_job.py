"""A job Spark refuses at start: a streaming aggregation written in append mode, no watermark.

Every container of it registers, starts its query, and fails there with Spark's
``AnalysisException``: the crash loop the coordinator must end, saying why.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from spark_elastic import Job, LogInput, ParquetSink

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

ROOT = os.environ.get("CLICKS_ROOT", "/tmp/spark-elastic-clicks")


def per_partition(clicks: DataFrame) -> DataFrame:
    """Clicks per partition: an aggregation, so the append mode of the job's sink refuses it."""
    return clicks.groupBy("partition").count()


job = Job(
    name="refused",
    input=LogInput(f"{ROOT}/log", ("clicks",)),
    elasticity_factor=1,
    checkpoint_root=f"{ROOT}/refused-checkpoints",
    sink=ParquetSink(f"{ROOT}/refused-out"),
    transform=per_partition,
)
