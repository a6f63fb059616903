"""spark-elastic: Samza's task model for Spark Structured Streaming.

Importing this package starts no JVM. The pure-Python task model (names,
groupers, plans, assignment) loads at once; pyspark is imported only when
used (``DataFrame.withVirtualTasks`` is registered as soon as pyspark's
DataFrame module loads, whichever is imported first).
"""

from __future__ import annotations

import importlib
from typing import Any

from spark_elastic import errors
from spark_elastic.assignment.assignor import assign, is_balanced
from spark_elastic.assignment.model import (
    AssignmentConfig,
    AssignmentResult,
    AssignmentWarning,
    ClientAssignment,
    ClientState,
    ProbingRebalance,
    TaskSpec,
)
from spark_elastic.dataplane.buckets import key_bucket
from spark_elastic.dataplane.columns import KafkaColumns
from spark_elastic.dataplane.extension import register_dataframe_method, register_when_pyspark_loads
from spark_elastic.dataplane.ordered import map_tasks_in_pandas
from spark_elastic.dataplane.routing import routing_keys
from spark_elastic.dataplane.session import local_session
from spark_elastic.dataplane.transforms import (
    VirtualTaskRouting,
    cogroup,
    register_partition_counter,
    with_virtual_tasks,
)
from spark_elastic.model.groupers import plan_job
from spark_elastic.model.names import (
    Lineage,
    SystemStreamPartition,
    TaskKind,
    TaskName,
    bucket_lineage,
    lineage,
    validate_elasticity_factor,
)
from spark_elastic.model.plan import (
    Grouper,
    JobPlan,
    PartitionMapping,
    StreamInput,
    TaskModel,
    load_plan_json,
    save_plan_json,
)
from spark_elastic.runtime.inputs import KafkaInput, LogInput
from spark_elastic.runtime.job import Job, load_job
from spark_elastic.runtime.sinks import BatchContext, KafkaSink, ParquetSink, Sink
from spark_elastic.state.columnar import BatchProcessor, TaskBatch, TaskUpdate
from spark_elastic.state.processor import TaskProcessor, TaskState, with_task_state
from spark_elastic.state.rescale import RescaleResult, rescale, starting_offsets
from spark_elastic.state.show import (
    BucketOffset,
    CheckpointReport,
    read_checkpoint,
    read_keyed_state,
)

__version__ = "0.1.0"

# Loaded on first use: the embedded log (and its Spark source, which imports pyspark).
_LAZY = {
    "EmbeddedLog": "spark_elastic.log.embedded",
    "TopicDescription": "spark_elastic.log.embedded",
    "Producer": "spark_elastic.log.producer",
    "register_log_source": "spark_elastic.log.source",
    "LOG_SOURCE_FORMAT": "spark_elastic.log.source",
    "KAFKA_SCHEMA": "spark_elastic.log.source",
    "register_kafka_source": "spark_elastic.log.kafka_source",
    "KAFKA_SOURCE_FORMAT": "spark_elastic.log.kafka_source",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'spark_elastic' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "BatchContext",
    "Job",
    "KafkaInput",
    "KafkaSink",
    "LogInput",
    "ParquetSink",
    "Sink",
    "load_job",
    "AssignmentConfig",
    "AssignmentResult",
    "AssignmentWarning",
    "ClientAssignment",
    "ClientState",
    "ProbingRebalance",
    "TaskSpec",
    "assign",
    "is_balanced",
    "BucketOffset",
    "CheckpointReport",
    "RescaleResult",
    "BatchProcessor",
    "TaskBatch",
    "TaskProcessor",
    "TaskState",
    "TaskUpdate",
    "read_checkpoint",
    "read_keyed_state",
    "rescale",
    "starting_offsets",
    "with_task_state",
    "KAFKA_SCHEMA",
    "KAFKA_SOURCE_FORMAT",
    "LOG_SOURCE_FORMAT",
    "EmbeddedLog",
    "Grouper",
    "JobPlan",
    "KafkaColumns",
    "Lineage",
    "PartitionMapping",
    "Producer",
    "StreamInput",
    "SystemStreamPartition",
    "TaskKind",
    "TaskModel",
    "TaskName",
    "TopicDescription",
    "VirtualTaskRouting",
    "__version__",
    "bucket_lineage",
    "cogroup",
    "errors",
    "key_bucket",
    "lineage",
    "load_plan_json",
    "local_session",
    "map_tasks_in_pandas",
    "plan_job",
    "register_dataframe_method",
    "register_kafka_source",
    "register_log_source",
    "routing_keys",
    "save_plan_json",
    "validate_elasticity_factor",
    "with_virtual_tasks",
]

register_when_pyspark_loads()


def _embedded_log_counts(options: Any) -> Any:
    from spark_elastic.log.embedded import source_partition_counts

    return source_partition_counts(options)


# The embedded log knows its topics' partition counts: transforms check a plan against them.
# "elastic-log" is LOG_SOURCE_FORMAT, named here so importing the package loads no pyspark.
register_partition_counter("elastic-log", _embedded_log_counts)
