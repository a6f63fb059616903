"""A job defined in Python: inputs, grouping, the user's logic, a sink, a checkpoint root.

A job file builds a :class:`Job` and binds it to a name; the coordinator and
every container load it by ``module:attribute`` or ``path/to/file.py:attribute``
(the way uvicorn and celery name an app), so a container process imports the
same definition the coordinator planned from.

Loading runs no Spark: a job is plain data plus the user's callables. It is
imported in the coordinator (which never starts a JVM) and in each container's
driver.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_elastic.dataplane.ordered import check_order
from spark_elastic.errors import (
    ArgumentError,
    ArgumentTypeError,
    JobDefinitionError,
)
from spark_elastic.model.groupers import plan_job
from spark_elastic.model.names import validate_elasticity_factor
from spark_elastic.model.plan import Grouper, JobPlan, StreamInput
from spark_elastic.runtime.inputs import KafkaInput, LogInput
from spark_elastic.runtime.sinks import Sink, sink_guarantee
from spark_elastic.storage import COMMIT_SCHEMES, scheme_of

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from spark_elastic.state.processor import TaskProcessor


__all__ = [
    "Job",
    "load_job",
    "load_job_and_module",
]


@dataclass(frozen=True)
class Job:
    """A streaming job the coordinator runs as containers.

    Attributes
    ----------
    name
        The job's name: checkpoints and the coordinator's store are keyed by it.
    input
        What the job reads.
    elasticity_factor
        Virtual tasks per partition (a power of two up to 1024).
    checkpoint_root
        Directory under which every container generation keeps its checkpoint
        (a local path or ``file://`` URI).
    sink
        Where output goes (:class:`Sink`).
    transform
        Stateless logic: the container's routed rows (Kafka columns plus
        ``key_bucket``, ``virtual_task``, ``routing_key``, only its own
        tasks' rows) in, output rows out. Exactly one of ``transform`` and
        ``processor`` is set.
    processor
        Stateful logic: a :class:`~spark_elastic.TaskProcessor`, run with
        :func:`~spark_elastic.with_task_state` on the container's tasks.
    grouper
        ``"partition"`` (default) or ``"ssp"``.
    hash
        Key hash of the buckets: ``"spark"`` (default) or ``"java"``.
    trigger_interval
        The containers' processing-time trigger, e.g. ``"1 second"``.
    spark_conf
        Extra Spark settings for every container's session.
    order
        The order a stateful task sees its records in within a micro-batch
        (``with_task_state``'s ``order``): ``"offset"``, ``"timestamp"``, or
        None: by timestamp for several input topics, by offset for one.
    max_task_idle_ms
        Kafka Streams' ``max.task.idle.ms`` for a stateful job read in time
        order (``with_task_state``'s): a task holds back what it cannot yet
        place in time, up to this long; 0 (the default) never holds back.
        What a task holds is not published until it is released, and a
        transactional sink's output covers only what was released, so a new
        owner publishes each record once.
    bootstrap
        Samza's bootstrap streams (``with_task_state``'s ``bootstrap``):
        input topics every container's tasks read to their end offsets as of
        its query's start before any other record.
    """

    name: str
    input: LogInput | KafkaInput
    elasticity_factor: int
    checkpoint_root: str
    sink: Sink
    transform: Callable[[DataFrame], DataFrame] | None = None
    processor: TaskProcessor | None = None
    grouper: str = "partition"
    hash: str = "spark"
    trigger_interval: str = "1 second"
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    order: str | None = None
    max_task_idle_ms: int = 0
    bootstrap: Sequence[str] = ()

    def __post_init__(self) -> None:
        if (
            not isinstance(self.name, str)
            or not self.name.replace("-", "").replace("_", "").isalnum()
        ):
            raise ArgumentError.invalid(
                "Job.name", "a non-empty name of letters, digits, '-' and '_'", self.name
            )
        if not isinstance(self.input, LogInput | KafkaInput):
            raise ArgumentTypeError.wrong_type("Job.input", "a LogInput or KafkaInput", self.input)
        validate_elasticity_factor(self.elasticity_factor)
        if not isinstance(self.checkpoint_root, str | os.PathLike):
            raise ArgumentTypeError.wrong_type(
                "Job.checkpoint_root", "a directory path", self.checkpoint_root
            )
        object.__setattr__(self, "checkpoint_root", _checkpoint_root(self.checkpoint_root))
        if not isinstance(self.sink, Sink):
            raise ArgumentTypeError.wrong_type(
                "Job.sink", "a Sink (an object with write())", self.sink
            )
        sink_guarantee(self.sink)
        if (self.transform is None) == (self.processor is None):
            raise ArgumentError.invalid(
                "Job.transform/processor",
                "exactly one of a stateless transform and a TaskProcessor",
                "both" if self.transform is not None else "neither",
            )
        if self.transform is not None and not callable(self.transform):
            raise ArgumentTypeError.wrong_type("Job.transform", "a callable", self.transform)
        kind = Grouper.of(self.grouper)
        if kind not in (Grouper.PARTITION, Grouper.SSP):
            raise ArgumentError.invalid(
                "Job.grouper",
                "a grouper that maps partitions to tasks",
                self.grouper,
                [Grouper.PARTITION.value, Grouper.SSP.value],
            )
        if self.hash not in ("spark", "java"):
            raise ArgumentError.invalid("Job.hash", "a hash mode", self.hash, ["spark", "java"])
        check_order("Job.order", self.order, "timestamp", default=True)
        self._check_hold_back()

    def _check_hold_back(self) -> None:
        """Refuse a hold-back setting the job cannot run, in one line (when defined)."""
        from spark_elastic.state.holdback import check_idle

        check_idle("Job.max_task_idle_ms", self.max_task_idle_ms)
        if isinstance(self.bootstrap, str) or not isinstance(self.bootstrap, Sequence):
            raise ArgumentTypeError.wrong_type(
                "Job.bootstrap",
                "a sequence of input topic names, such as ('profiles',)",
                self.bootstrap,
            )
        object.__setattr__(self, "bootstrap", tuple(self.bootstrap))
        if not self.holds_back:
            return
        what = "max_task_idle_ms above 0" if self.max_task_idle_ms else "bootstrap streams"
        if self.processor is None:
            raise ArgumentError.invalid(
                "Job.max_task_idle_ms/bootstrap",
                "a TaskProcessor's job (a stateful task holds records back in its state)",
                f"{what} for a stateless transform",
            )
        topics = tuple(self.input.topics)
        if self.order == "offset" or (self.order is None and len(topics) == 1):
            raise ArgumentError.invalid(
                "Job.order",
                f"'timestamp' to hold records back in time order ({what}; None means "
                f"'timestamp' only for several input topics, and the job reads {len(topics)})",
                self.order,
            )
        unknown = [t for t in self.bootstrap if t not in topics]
        if unknown:
            raise ArgumentError.invalid(
                "Job.bootstrap", f"input topics of the job {list(topics)}", unknown
            )
        if self.bootstrap and set(self.bootstrap) >= set(topics):
            raise ArgumentError.invalid(
                "Job.bootstrap",
                "some but not all input topics (the others wait for them)",
                list(self.bootstrap),
            )

    @property
    def holds_back(self) -> bool:
        """Whether its tasks hold records back (``max_task_idle_ms`` or bootstrap streams)."""
        return self.max_task_idle_ms > 0 or bool(self.bootstrap)

    @property
    def stateful(self) -> bool:
        """Whether the job keeps keyed state (it has a processor)."""
        return self.processor is not None

    @property
    def time_ordered(self) -> bool:
        """Whether its stateful tasks merge their partitions by timestamp: ``order`` is
        ``"timestamp"``, or ``None`` with several input topics. Only such tasks count
        records processed without waiting (``records_enforced``)."""
        return self.processor is not None and (
            self.order == "timestamp" or (self.order is None and len(self.input.topics) > 1)
        )

    def plan(self, partitions: Mapping[str, int]) -> JobPlan:
        """The job's plan for the given partition counts.

        Parameters
        ----------
        partitions
            ``{topic: count}`` for every input topic.

        Returns
        -------
        JobPlan
            The virtual tasks and what each reads.
        """
        inputs = [StreamInput("kafka", topic, count) for topic, count in partitions.items()]
        return plan_job(
            inputs,
            grouper=self.grouper,
            elasticity_factor=self.elasticity_factor,
        )


def _checkpoint_root(root: str | os.PathLike[str]) -> str:
    """The checkpoint root: an absolute local path, or a URI of a file system that can
    create a file only if absent (HDFS, S3 with conditional writes, ...), without a
    trailing ``/``."""
    text = os.fspath(root)
    if text.startswith("file://"):
        text = text[len("file://") :]
        if not text.startswith("/"):
            raise ArgumentError.invalid(
                "Job.checkpoint_root", "a file:// URI with an absolute path", os.fspath(root)
            )
    elif "://" in text:
        if scheme_of(text) not in COMMIT_SCHEMES:
            supported = ", ".join(f"{s}:" for s in sorted(COMMIT_SCHEMES))
            raise ArgumentError.invalid(
                "Job.checkpoint_root",
                "a local path or a URI of a file system that can create a file only if absent "
                f"({supported})",
                text,
            )
        return text.rstrip("/")
    return str(Path(text).resolve())


def load_job(spec: str) -> Job:
    """Import the :class:`Job` named by ``spec``.

    Parameters
    ----------
    spec
        ``package.module:attribute`` or ``path/to/file.py:attribute``; the
        attribute defaults to ``job``.

    Returns
    -------
    Job
        The job definition.

    Raises
    ------
    JobDefinitionError
        The file or module does not import, the attribute is missing, or it is
        not a :class:`Job`; one line, naming which.
    """
    return load_job_and_module(spec)[0]


def load_job_and_module(spec: str) -> tuple[Job, Any]:
    """:func:`load_job`, also returning the module the job was defined in.

    A container registers that module with cloudpickle to pickle by value, so
    Spark's Python workers need not import the job file themselves.

    Parameters
    ----------
    spec
        As for :func:`load_job`.

    Returns
    -------
    tuple[Job, module]
        The job and its module.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise JobDefinitionError(
            f"job: expected 'module:attribute' or 'file.py:attribute', found {spec!r}"
        )
    target, _, attribute = spec.rpartition(":") if _has_attribute(spec) else (spec, ":", "job")
    attribute = attribute or "job"
    module = _import_target(target, spec)
    try:
        value: Any = getattr(module, attribute)
    except AttributeError:
        raise JobDefinitionError(
            f"job {spec!r}: {target!r} has no attribute {attribute!r}"
        ) from None
    if not isinstance(value, Job):
        raise JobDefinitionError(
            f"job {spec!r}: expected a spark_elastic Job, found {type(value).__name__}"
        )
    return value, module


def _has_attribute(spec: str) -> bool:
    # A Windows-style drive letter never occurs here; the last ':' separates the attribute
    # unless what follows it is a path (contains '/').
    head, sep, tail = spec.rpartition(":")
    return bool(sep) and "/" not in tail and bool(head)


def _import_target(target: str, spec: str) -> Any:
    if target.endswith(".py") or os.sep in target:
        path = Path(target)
        if not path.is_file():
            raise JobDefinitionError(f"job {spec!r}: no such file {str(path)!r}")
        digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
        name = f"spark_elastic_job_{path.stem}_{digest}"
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise JobDefinitionError(f"job {spec!r}: {str(path)!r} is not a Python file")
        module = importlib.util.module_from_spec(module_spec)
        # Registered before running it: dataclasses and pickling look classes up by module.
        sys.modules[name] = module
        try:
            module_spec.loader.exec_module(module)
        except Exception as exc:  # any error in the user's file is one line
            sys.modules.pop(name, None)
            raise JobDefinitionError(
                f"job {spec!r}: {str(path)!r} failed to import: {type(exc).__name__}: {exc}"
            ) from None
        return module
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as exc:
        raise JobDefinitionError(f"job {spec!r}: no module named {exc.name!r}") from None
    except Exception as exc:  # any error in the user's module is one line
        raise JobDefinitionError(
            f"job {spec!r}: module {target!r} failed to import: {type(exc).__name__}: {exc}"
        ) from None
