"""spark-elastic: Samza's task model for Spark Structured Streaming.

Importing this package starts no JVM. The pure-Python task model (names,
groupers, plans, assignment) loads at once; Spark-facing parts are imported
from pyspark only when used.
"""

from __future__ import annotations

from spark_elastic import errors
from spark_elastic._groupers import plan_job
from spark_elastic._model import (
    Lineage,
    SystemStreamPartition,
    TaskKind,
    TaskName,
    bucket_lineage,
    lineage,
    validate_elasticity_factor,
)
from spark_elastic._plan import (
    Grouper,
    JobPlan,
    PartitionMapping,
    StreamInput,
    TaskModel,
    load_plan_json,
    save_plan_json,
)

__version__ = "0.1.0"

__all__ = [
    "Grouper",
    "JobPlan",
    "Lineage",
    "PartitionMapping",
    "StreamInput",
    "SystemStreamPartition",
    "TaskKind",
    "TaskModel",
    "TaskName",
    "__version__",
    "bucket_lineage",
    "errors",
    "lineage",
    "load_plan_json",
    "plan_job",
    "save_plan_json",
    "validate_elasticity_factor",
]
