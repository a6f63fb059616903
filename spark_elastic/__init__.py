"""spark-elastic: Samza's task model for Spark Structured Streaming.

Importing this package starts no JVM. The pure-Python task model (names,
groupers, plans, assignment) loads at once; of pyspark only the DataFrame
class is touched, to register ``DataFrame.withVirtualTasks``.
"""

from __future__ import annotations

from spark_elastic import errors
from spark_elastic._buckets import key_bucket
from spark_elastic._columns import KafkaColumns
from spark_elastic._extension import register_dataframe_method
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
from spark_elastic._ordered import map_tasks_in_pandas
from spark_elastic._plan import (
    Grouper,
    JobPlan,
    PartitionMapping,
    StreamInput,
    TaskModel,
    load_plan_json,
    save_plan_json,
)
from spark_elastic._routing import routing_keys
from spark_elastic._transforms import VirtualTaskRouting, cogroup, with_virtual_tasks

__version__ = "0.1.0"

__all__ = [
    "Grouper",
    "JobPlan",
    "KafkaColumns",
    "Lineage",
    "PartitionMapping",
    "StreamInput",
    "SystemStreamPartition",
    "TaskKind",
    "TaskModel",
    "TaskName",
    "VirtualTaskRouting",
    "__version__",
    "bucket_lineage",
    "cogroup",
    "errors",
    "key_bucket",
    "lineage",
    "load_plan_json",
    "map_tasks_in_pandas",
    "plan_job",
    "routing_keys",
    "save_plan_json",
    "validate_elasticity_factor",
    "with_virtual_tasks",
]

register_dataframe_method()
