"""The job model and the messages between the coordinator and its containers.

Pure data: frozen dataclasses with a strict JSON form (``to_json`` gives plain
dicts, ``from_json`` refuses anything else with one :class:`ProtocolError`
line naming the field). The coordinator serves these over HTTP; containers
parse them. Nothing here does I/O.

Wire names are camelCase (``executionContainerId`` is SAMZA-871's); Python
names are snake_case.

The endpoints, all JSON:

``GET /jobModel``
    :class:`JobModel`.
``GET /containerHeartbeat?executionContainerId=ID``
    :class:`HeartbeatReply` (``{"alive": ...}`` is Samza's contract; the lease
    fields are ours). 400 for a missing or malformed id.
``POST /containers/register``
    :class:`Registration` in, :class:`HeartbeatReply` out: a container
    announces its process before its first heartbeat.
``POST /containers/progress``
    :class:`ProgressReport` in, :class:`HeartbeatReply` out: after each
    committed micro-batch. A report also renews the lease.

A container the model lists under ``warmups`` registers only once it is
ready (its Spark application started); registering is how it says so.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

from spark_elastic.errors import ProtocolError

__all__ = [
    "CONTAINER_ID_ENV",
    "COORDINATORS_ENV",
    "COORDINATOR_URL_ENV",
    "JOB_ENV",
    "ContainerModel",
    "FailureReport",
    "HeartbeatReply",
    "JobModel",
    "ProgressReport",
    "Registration",
    "TaskProgress",
    "validate_container_id",
]

CONTAINER_ID_ENV: Final = "EXECUTION_ENV_CONTAINER_ID"
"""Samza's variable: the id the coordinator issued to the container it launched."""
COORDINATOR_URL_ENV: Final = "SPARK_ELASTIC_COORDINATOR_URL"
"""Where a container finds its coordinator (``http://127.0.0.1:PORT``)."""
COORDINATORS_ENV: Final = "SPARK_ELASTIC_COORDINATORS"
"""Other coordinators of the job (comma-separated URLs), tried when the one a container talks
to does not answer; a standby names the leader in its 409."""
JOB_ENV: Final = "SPARK_ELASTIC_JOB"
"""The job a container runs, as ``module:attribute`` or ``path/to/file.py:attribute``."""

_CONTAINER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def validate_container_id(value: object, name: str = "executionContainerId") -> str:
    """Return ``value`` if it is a well-formed container id, else raise :class:`ProtocolError`.

    Ids are 1-128 characters of ``A-Za-z0-9._-``, starting with a letter or
    digit, so they are safe in URLs, file names and metric labels.
    """
    if not isinstance(value, str) or not _CONTAINER_ID.fullmatch(value):
        raise ProtocolError(
            f"{name}: expected 1-128 characters of A-Z a-z 0-9 . _ - starting with a letter "
            f"or digit, found {value!r}"
        )
    return value


def _field(document: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in document:
        raise ProtocolError(f"{where}: missing field {key!r}")
    value = document[key]
    # bool is an int in Python; a JSON true is never a count.
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise ProtocolError(f"{where}.{key}: expected {_kind_name(kind)}, found {value!r}")
    if not isinstance(value, kind):
        raise ProtocolError(f"{where}.{key}: expected {_kind_name(kind)}, found {value!r}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {int: "an integer", str: "a string", bool: "true or false", list: "a list"}
    names |= {dict: "an object", float: "a number"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _object(document: object, where: str, keys: frozenset[str]) -> Mapping[str, Any]:
    if not isinstance(document, dict):
        raise ProtocolError(f"{where}: expected a JSON object, found {type(document).__name__}")
    unknown = sorted(set(document) - keys)
    if unknown:
        raise ProtocolError(f"{where}: unknown field {unknown[0]!r} (known: {sorted(keys)})")
    return document


def _counts(doc: Mapping[str, Any], name: str, where: str) -> dict[str, int]:
    counts = _field(doc, name, dict, where)
    for topic, count in counts.items():
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ProtocolError(f"{where}.{name}.{topic}: expected a count >= 1")
    return dict(counts)


def _non_negative(value: int, where: str) -> int:
    if value < 0:
        raise ProtocolError(f"{where}: expected a non-negative integer, found {value!r}")
    return value


def _offsets(document: object, where: str) -> dict[str, dict[int, int]]:
    """``{"topic": {"partition": offset}}`` with integer partitions and offsets."""
    if not isinstance(document, dict):
        raise ProtocolError(f"{where}: expected an object of topics, found {document!r}")
    result: dict[str, dict[int, int]] = {}
    for topic, partitions in document.items():
        if not isinstance(partitions, dict):
            raise ProtocolError(f"{where}.{topic}: expected an object of partitions")
        parsed: dict[int, int] = {}
        for partition, offset in partitions.items():
            if not (isinstance(partition, str) and partition.isascii() and partition.isdigit()):
                raise ProtocolError(f"{where}.{topic}: partition {partition!r} is not a number")
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
                raise ProtocolError(f"{where}.{topic}.{partition}: expected an offset >= 0")
            parsed[int(partition)] = offset
        result[topic] = parsed
    return result


def _offsets_json(offsets: Mapping[str, Mapping[int, int]]) -> dict[str, dict[str, int]]:
    return {t: {str(p): o for p, o in sorted(ps.items())} for t, ps in sorted(offsets.items())}


@dataclass(frozen=True)
class ContainerModel:
    """One container's share of the job: its tasks and the checkpoint it runs them on.

    Attributes
    ----------
    container_id
        The id the coordinator issued (``EXECUTION_ENV_CONTAINER_ID``).
    tasks
        Virtual task names, sorted.
    generation
        The checkpoint generation of this task set: it changes whenever the
        set changes or the container is replaced, so no two processes ever
        write one checkpoint directory.
    checkpoint
        This generation's checkpoint location.
    sources
        Checkpoints of earlier generations whose committed state and offsets
        this generation starts from (empty for a fresh task set).
    """

    container_id: str
    tasks: tuple[str, ...]
    generation: int
    checkpoint: str
    sources: tuple[str, ...] = ()

    _KEYS: ClassVar[frozenset[str]] = frozenset(
        {"containerId", "tasks", "generation", "checkpoint", "sources"}
    )

    def to_json(self) -> dict[str, Any]:
        """The wire form."""
        return {
            "containerId": self.container_id,
            "tasks": list(self.tasks),
            "generation": self.generation,
            "checkpoint": self.checkpoint,
            "sources": list(self.sources),
        }

    @classmethod
    def from_json(cls, document: object, where: str = "container") -> ContainerModel:
        """Parse the wire form, refusing any other shape."""
        doc = _object(document, where, cls._KEYS)
        tasks = _field(doc, "tasks", list, where)
        sources = _field(doc, "sources", list, where)
        if not all(isinstance(t, str) for t in tasks + sources):
            raise ProtocolError(f"{where}: tasks and sources must be strings")
        return cls(
            container_id=validate_container_id(_field(doc, "containerId", str, where)),
            tasks=tuple(tasks),
            generation=_non_negative(_field(doc, "generation", int, where), where),
            checkpoint=_field(doc, "checkpoint", str, where),
            sources=tuple(sources),
        )


def _task_twice(containers: tuple[ContainerModel, ...]) -> tuple[str, str, str] | None:
    """The first task two of ``containers`` list, with their ids, or None."""
    seen: dict[str, str] = {}
    for c in containers:
        for task in c.tasks:
            if task in seen:
                return task, seen[task], c.container_id
            seen[task] = c.container_id
    return None


@dataclass(frozen=True)
class JobModel:
    """The coordinator's versioned view of the job: which container runs which tasks.

    Attributes
    ----------
    version
        Increases by one with every change; containers act on a newer version.
    job
        The job's name.
    elasticity_factor
        Virtual tasks per base task.
    partitions
        Partition count per input topic that containers read now.
    containers
        One entry per live container, sorted by id.
    planned_partitions
        The counts the virtual tasks were planned for (``None``: the same as
        ``partitions``). After SEP-5 growth the tasks stay those of this plan;
        a new partition p joins the task of p mod its topic's planned count.
    warmups
        New owners warming up for a pending move (KIP-441), sorted by id: each
        will take its ``tasks`` from their owners in ``containers``, which
        keep running them until every warm-up is ready; its ``sources`` are
        set when the move is made.
    stopping
        Ids of containers asked to stop at a batch boundary for a move, sorted:
        they own their tasks until their warm-ups take them, so a replaying
        warm-up stops following them (its next batch then covers their last
        one with its first output).
    """

    version: int
    job: str
    elasticity_factor: int
    partitions: Mapping[str, int]
    containers: tuple[ContainerModel, ...] = ()
    planned_partitions: Mapping[str, int] | None = None
    warmups: tuple[ContainerModel, ...] = ()
    stopping: tuple[str, ...] = ()

    _KEYS: ClassVar[frozenset[str]] = frozenset(
        {
            "version",
            "job",
            "elasticityFactor",
            "partitions",
            "containers",
            "plannedPartitions",
            "warmups",
            "stopping",
        }
    )

    @property
    def planned(self) -> Mapping[str, int]:
        """The counts the tasks were planned for."""
        return self.partitions if self.planned_partitions is None else self.planned_partitions

    def container(self, container_id: str) -> ContainerModel | None:
        """The entry of ``container_id``, or None if the model has none."""
        return next((c for c in self.containers if c.container_id == container_id), None)

    def warmup(self, container_id: str) -> ContainerModel | None:
        """The warm-up entry of ``container_id``, or None if it is not warming up."""
        return next((c for c in self.warmups if c.container_id == container_id), None)

    def owner_of(self) -> dict[str, str]:
        """``{task: container id}`` for every assigned task."""
        return {t: c.container_id for c in self.containers for t in c.tasks}

    def to_json(self) -> dict[str, Any]:
        """The wire form."""
        return {
            "version": self.version,
            "job": self.job,
            "elasticityFactor": self.elasticity_factor,
            "partitions": dict(sorted(self.partitions.items())),
            "plannedPartitions": dict(sorted(self.planned.items())),
            "containers": [c.to_json() for c in self.containers],
            "warmups": [c.to_json() for c in self.warmups],
            "stopping": list(self.stopping),
        }

    @classmethod
    def from_json(cls, document: object, where: str = "jobModel") -> JobModel:
        """Parse the wire form, refusing any other shape (and a task owned twice)."""
        doc = _object(document, where, cls._KEYS)
        partitions = _counts(doc, "partitions", where)
        # Models stored before SEP-5 growth existed have no planned counts: never grown.
        planned = _counts(doc, "plannedPartitions", where) if "plannedPartitions" in doc else None
        if planned is not None and (
            set(planned) != set(partitions)
            or any(partitions[t] < n or partitions[t] % n for t, n in planned.items())
        ):
            raise ProtocolError(
                f"{where}: partitions {partitions} are not a growth of plannedPartitions "
                f"{planned} (same topics, each count a multiple of its planned one)"
            )
        containers = tuple(
            ContainerModel.from_json(c, f"{where}.containers[{i}]")
            for i, c in enumerate(_field(doc, "containers", list, where))
        )
        twice = _task_twice(containers)
        if twice is not None:
            task, first, second = twice
            raise ProtocolError(f"{where}: task {task!r} is owned by both {first!r} and {second!r}")
        # Models stored before warm-ups existed have none.
        warmups = tuple(
            ContainerModel.from_json(c, f"{where}.warmups[{i}]")
            for i, c in enumerate(_field(doc, "warmups", list, where) if "warmups" in doc else [])
        )
        ids = [c.container_id for c in (*containers, *warmups)]
        if len(set(ids)) != len(ids):
            repeated = next(i for i in ids if ids.count(i) > 1)
            raise ProtocolError(f"{where}: container {repeated!r} appears twice")
        # (At a new elasticity factor a warm-up's tasks are named differently from the
        # ones it takes over; only the coordinator relates them.)
        twice = _task_twice(warmups)
        if twice is not None:
            task, first, second = twice
            raise ProtocolError(
                f"{where}: warm-ups {first!r} and {second!r} both take task {task!r}"
            )
        # Models stored before stops at a batch boundary existed have none.
        stopping = _field(doc, "stopping", list, where) if "stopping" in doc else []
        owners = {c.container_id for c in containers}
        strangers = [i for i in stopping if not isinstance(i, str) or i not in owners]
        if strangers or stopping != sorted(set(stopping)):
            raise ProtocolError(
                f"{where}.stopping: expected sorted ids of containers in the model, "
                f"found {stopping!r}"
            )
        return cls(
            version=_non_negative(_field(doc, "version", int, where), where),
            job=_field(doc, "job", str, where),
            elasticity_factor=_field(doc, "elasticityFactor", int, where),
            partitions=dict(partitions),
            containers=containers,
            planned_partitions=None if planned == partitions else planned,
            warmups=warmups,
            stopping=tuple(stopping),
        )


@dataclass(frozen=True)
class HeartbeatReply:
    """What the coordinator answers a heartbeat, registration or progress report.

    Attributes
    ----------
    alive
        Samza's answer: False means the coordinator no longer considers the
        container valid; it must stop (gracefully, then ``exit(1)``).
    lease_ms
        How long the lease lasts, counted by the container from the moment it
        *sent* the request (so its view of the lease ends before the
        coordinator's). 0 when not alive.
    job_model_version
        The current job model's version; a container seeing a newer one
        fetches ``/jobModel``.
    """

    alive: bool
    lease_ms: int = 0
    job_model_version: int = 0

    _KEYS: ClassVar[frozenset[str]] = frozenset({"alive", "leaseMs", "jobModelVersion"})

    def to_json(self) -> dict[str, Any]:
        """The wire form."""
        return {
            "alive": self.alive,
            "leaseMs": self.lease_ms,
            "jobModelVersion": self.job_model_version,
        }

    @classmethod
    def from_json(cls, document: object, where: str = "heartbeat") -> HeartbeatReply:
        """Parse the wire form; only ``alive`` is required (Samza's coordinator sends only it)."""
        doc = _object(document, where, cls._KEYS)
        alive = _field(doc, "alive", bool, where)
        lease = _field(doc, "leaseMs", int, where) if "leaseMs" in doc else 0
        version = _field(doc, "jobModelVersion", int, where) if "jobModelVersion" in doc else 0
        return cls(alive, _non_negative(lease, where), _non_negative(version, where))


@dataclass(frozen=True)
class Registration:
    """A container announcing itself before its first heartbeat.

    Attributes
    ----------
    container_id
        The id the coordinator issued.
    pid
        The container's process id (shown on the status page; used to stop it).
    spark_app_id
        Its Spark application id, once its SparkSession is up ("" before).
    """

    container_id: str
    pid: int
    spark_app_id: str = ""

    _KEYS: ClassVar[frozenset[str]] = frozenset({"containerId", "pid", "sparkAppId"})

    def to_json(self) -> dict[str, Any]:
        """The wire form."""
        return {"containerId": self.container_id, "pid": self.pid, "sparkAppId": self.spark_app_id}

    @classmethod
    def from_json(cls, document: object, where: str = "registration") -> Registration:
        """Parse the wire form, refusing any other shape."""
        doc = _object(document, where, cls._KEYS)
        app = _field(doc, "sparkAppId", str, where) if "sparkAppId" in doc else ""
        return cls(
            validate_container_id(_field(doc, "containerId", str, where)),
            _non_negative(_field(doc, "pid", int, where), where),
            app,
        )


@dataclass(frozen=True)
class FailureReport:
    """A container saying why it failed, just before it exits (its query has stopped).

    Attributes
    ----------
    container_id
        The failed container.
    error
        The exception's first line (at most 1,000 characters).
    """

    container_id: str
    error: str

    _KEYS: ClassVar[frozenset[str]] = frozenset({"containerId", "error"})
    MAX_ERROR: ClassVar[int] = 1000

    def to_json(self) -> dict[str, Any]:
        """The wire form."""
        return {"containerId": self.container_id, "error": self.error}

    @classmethod
    def from_json(cls, document: object, where: str = "failure") -> FailureReport:
        """Parse the wire form, refusing any other shape."""
        doc = _object(document, where, cls._KEYS)
        error = _field(doc, "error", str, where)
        if not error.strip() or len(error) > cls.MAX_ERROR:
            raise ProtocolError(
                f"{where}.error: expected 1 to {cls.MAX_ERROR} characters, found {len(error)}"
            )
        return cls(validate_container_id(_field(doc, "containerId", str, where)), error)


@dataclass(frozen=True)
class TaskProgress:
    """One task's committed position and backlog after a batch.

    Attributes
    ----------
    task
        The virtual task's name.
    offsets
        ``{topic: {partition: next offset}}`` the task has committed.
    lag
        Records of the task's partitions not yet read (end offset minus
        committed offset, summed), or -1 when unknown.
    """

    task: str
    offsets: Mapping[str, Mapping[int, int]]
    lag: int = -1

    _KEYS: ClassVar[frozenset[str]] = frozenset({"task", "offsets", "lag"})

    def to_json(self) -> dict[str, Any]:
        """The wire form."""
        return {"task": self.task, "offsets": _offsets_json(self.offsets), "lag": self.lag}

    @classmethod
    def from_json(cls, document: object, where: str = "task") -> TaskProgress:
        """Parse the wire form, refusing any other shape."""
        doc = _object(document, where, cls._KEYS)
        lag = _field(doc, "lag", int, where) if "lag" in doc else -1
        if lag < -1:
            raise ProtocolError(f"{where}.lag: expected -1 (unknown) or a count, found {lag}")
        return cls(
            _field(doc, "task", str, where),
            _offsets(_field(doc, "offsets", dict, where), f"{where}.offsets"),
            lag,
        )


@dataclass(frozen=True)
class ProgressReport:
    """What a container reports after each committed micro-batch.

    Attributes
    ----------
    container_id
        The reporting container.
    generation
        The checkpoint generation the batch was committed in.
    batch_id
        The committed micro-batch.
    records_read
        Records the container's query read in the batch (all of its
        partitions' records, including other containers' buckets).
    records_processed
        Records of its own tasks' buckets it processed; read amplification
        is ``records_read / records_processed``.
    tasks
        Per-task committed offsets and lag.
    records_enforced
        Records its time-ordered tasks processed in the batch without waiting
        for another of their partitions to catch up in time (Kafka Streams'
        ``enforced-processing``); 0 for other jobs.
    batch_duration_ms
        How long the batch took, from its trigger to its commit (Spark's
        ``durationMs.triggerExecution``), or -1 when not said.
    """

    container_id: str
    generation: int
    batch_id: int
    records_read: int
    records_processed: int
    tasks: tuple[TaskProgress, ...] = field(default=())
    records_enforced: int = 0
    batch_duration_ms: int = -1

    _KEYS: ClassVar[frozenset[str]] = frozenset(
        {
            "batchDurationMs",
            "containerId",
            "generation",
            "batchId",
            "recordsRead",
            "recordsProcessed",
            "tasks",
            "recordsEnforced",
        }
    )

    def to_json(self) -> dict[str, Any]:
        """The wire form."""
        return {
            "containerId": self.container_id,
            "generation": self.generation,
            "batchId": self.batch_id,
            "recordsRead": self.records_read,
            "recordsProcessed": self.records_processed,
            "tasks": [t.to_json() for t in self.tasks],
            "recordsEnforced": self.records_enforced,
            # Not said (-1): left out, as a container of an earlier version leaves it.
            **({"batchDurationMs": self.batch_duration_ms} if self.batch_duration_ms >= 0 else {}),
        }

    @classmethod
    def from_json(cls, document: object, where: str = "progress") -> ProgressReport:
        """Parse the wire form, refusing any other shape."""
        doc = _object(document, where, cls._KEYS)
        tasks = _field(doc, "tasks", list, where) if "tasks" in doc else []
        return cls(
            validate_container_id(_field(doc, "containerId", str, where)),
            _non_negative(_field(doc, "generation", int, where), f"{where}.generation"),
            _non_negative(_field(doc, "batchId", int, where), f"{where}.batchId"),
            _non_negative(_field(doc, "recordsRead", int, where), f"{where}.recordsRead"),
            _non_negative(_field(doc, "recordsProcessed", int, where), f"{where}.recordsProcessed"),
            tuple(TaskProgress.from_json(t, f"{where}.tasks[{i}]") for i, t in enumerate(tasks)),
            # Optional: a container of an earlier version does not send it.
            _non_negative(_field(doc, "recordsEnforced", int, where), f"{where}.recordsEnforced")
            if "recordsEnforced" in doc
            else 0,
            _non_negative(_field(doc, "batchDurationMs", int, where), f"{where}.batchDurationMs")
            if "batchDurationMs" in doc
            else -1,
        )
