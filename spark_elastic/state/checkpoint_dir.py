"""What spark-elastic keeps in a streaming checkpoint directory, and what it reads of Spark's.

Runs on the driver. Beside Spark's own ``offsets/``, ``commits/`` and
``state/``, a stateful spark-elastic query keeps ``_spark_elastic/``:

``job.json``
    The job's identity and shape (:class:`JobSpec`): name, inputs, grouper,
    elasticity factor, hash mode, the virtual tasks this query owns, the
    keyed-state schema, and for a checkpoint made by ``rescale`` the seed's
    starting offsets.
``owner.lock``
    On the local disk, held with ``flock`` by the driver while a query runs
    on the checkpoint (the OS releases it if the driver dies), so
    ``rescale`` can tell a running query from a stopped one.
``owner.json``
    The same on HDFS, S3 and the rest, where no lock outlives its holder:
    an object created only if absent, naming the driver's host and process,
    deleted when its query ends (:class:`OwnerLock`).
``seed/``
    Made by ``rescale``: the keyed state and bucket checkpoints the new
    query loads in its first micro-batch.
``fences.json``
    Written by a warm-up that replays its old owners' records (the
    runtime's hot warm-ups): per (stream, partition, key bucket, factor)
    the offset below which the old owners published the output already.
    Records below their key's fence are applied to state but emit nothing
    (:func:`write_fences`; the driver ships it to the executors, see
    :mod:`.shipped`).

Spark's directory is read, never written: the last batch id, whether it
committed, and its source offsets (``offsets/N`` lines 3+, one per source).

A checkpoint is a plain path or ``file:`` URI on the local disk, or a URI of
a file system Spark's Hadoop opens that can create a file only if absent
(``hdfs:``, ``s3a:``, ``gs:``, ``abfss:``; :func:`checkpoint_location`).
Everything here reads and writes through :mod:`spark_elastic.storage`, on
the driver: remote ones through its JVM, with Spark's own settings.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import re
import socket
import threading
import urllib.parse
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from spark_elastic.errors import ArgumentError, CheckpointError, StorageError
from spark_elastic.model.groupers import plan_job
from spark_elastic.model.plan import Grouper, JobPlan, StreamInput
from spark_elastic.state.chunks import LAYOUT_VERSION
from spark_elastic.storage import COMMIT_SCHEMES, Storage, is_local, scheme_of, storage_for

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "ELASTIC_DIR",
    "SEED_SCHEMA",
    "CommittedBatch",
    "JobSpec",
    "OwnerLock",
    "batch_offsets",
    "bootstrap_path",
    "bootstrapped",
    "fences_of",
    "checkpoint_location",
    "checkpoint_path",
    "checkpoint_ref",
    "has_seed",
    "is_fresh",
    "last_batch",
    "never_committed",
    "pinned_conf",
    "read_fences",
    "read_job",
    "read_seed",
    "read_state",
    "require_job",
    "storage_of",
    "write_bootstrap",
    "write_fences",
    "write_job",
]

ELASTIC_DIR = "_spark_elastic"
JOB_FILE = "job.json"
SEED_DIR = "seed"
FENCES_FILE = "fences.json"
BOOTSTRAP_FILE = "bootstrap.json"
_LOCK_FILE = "owner.lock"
_OWNER_OBJECT = "owner.json"
_FORMAT_VERSION = 1

SourceOffsets = dict[str, dict[str, int]]
"""Kafka's JSON offsets: ``{"topic": {"partition": next offset}}``."""


@dataclass(frozen=True)
class JobSpec:
    """The identity and shape of a stateful virtual-task job, as stored in ``job.json``.

    Two checkpoints belong to the same job when name, inputs, grouper, system,
    hash mode and keyed-state schema agree; factors and owned tasks may differ.
    """

    name: str
    inputs: tuple[StreamInput, ...]
    grouper: Grouper
    elasticity_factor: int
    hash: str
    system: str
    state_schema: str
    tasks: tuple[str, ...] | None = None
    """Names of the virtual tasks this query owns; ``None`` means all of them."""
    starting_offsets: SourceOffsets | None = field(default=None, compare=False)
    """Where a seeded checkpoint's query must start reading (set by ``rescale``)."""
    task_inputs: tuple[StreamInput, ...] | None = None
    """The inputs the job's tasks were planned for, when its topics have grown since (SEP-5:
    new partition ``p`` joins the task of ``p mod`` the count here); ``None``: :attr:`inputs`."""
    state_layout: int = field(default=LAYOUT_VERSION, compare=False)
    """How keyed state is stored: 1, one StateStore entry per key (before 0.2); 2, chunks."""
    holds_back: bool = field(default=False, compare=False)
    """Whether its tasks hold records back in time order (``max_task_idle_ms`` above 0): their
    state then has held records, and the query runs in processing-time mode."""

    def same_job(self, other: JobSpec) -> bool:
        """Whether ``other`` describes the same job (factor and owned tasks aside)."""
        return self.identity() == other.identity()

    def identity(self) -> tuple[Any, ...]:
        """The fields that make a job the same job."""
        return (
            self.name,
            self.inputs,
            self.task_inputs or self.inputs,
            self.grouper,
            self.system,
            self.hash,
            self.state_schema,
        )

    def same_job_but_counts(self, other: JobSpec) -> bool:
        """Whether ``other`` is this job with (possibly) other partition counts of its streams."""

        def shape(spec: JobSpec) -> tuple[Any, ...]:
            streams = tuple((s.system, s.stream) for s in spec.inputs)
            return (spec.name, streams, *spec.identity()[3:])

        return shape(self) == shape(other)

    def plan(self, elasticity_factor: int | None = None) -> JobPlan:
        """The job's plan (at ``elasticity_factor``, default its own), grown as SEP-5 grows it.

        Parameters
        ----------
        elasticity_factor
            The factor to plan at; default :attr:`elasticity_factor`.

        Returns
        -------
        JobPlan
            Tasks as planned for :attr:`task_inputs`, reading :attr:`inputs`.
        """
        factor = self.elasticity_factor if elasticity_factor is None else elasticity_factor
        previous = (
            None if self.task_inputs is None else plan_job(self.task_inputs, self.grouper, factor)
        )
        return plan_job(self.inputs, self.grouper, factor, previous=previous)

    def grown_to(self, inputs: tuple[StreamInput, ...], checkpoint: str) -> JobSpec:
        """This job with its streams grown to ``inputs`` (SEP-5), or a clear refusal.

        Parameters
        ----------
        inputs
            The same streams, in the same order, with their counts now.
        checkpoint
            Named in errors.

        Returns
        -------
        JobSpec
            With ``inputs`` and the counts its tasks were planned for.

        Raises
        ------
        CheckpointError
            A count shrank, or grew to a count that is not a multiple of the old one.
        """
        for old, new in zip(self.inputs, inputs, strict=True):
            if new.partition_count == old.partition_count:
                continue
            problem = (
                "shrank"
                if new.partition_count < old.partition_count
                else "grew to a count that is not a multiple of the old one"
            )
            if new.partition_count % old.partition_count:
                raise CheckpointError(
                    f"checkpoint {checkpoint!r}: input {old} now has {new.partition_count} "
                    f"partitions; it {problem}, so keys would move between virtual tasks and "
                    "their state would not follow. Grow topics to a multiple of their count "
                    f"(e.g. {2 * old.partition_count}), or start the job afresh on a new "
                    "checkpoint (its state starts empty)"
                )
        return replace(self, inputs=inputs, task_inputs=self.task_inputs or self.inputs)

    def to_json(self) -> dict[str, Any]:
        """The ``job.json`` document."""
        return {
            "format": _FORMAT_VERSION,
            "name": self.name,
            "inputs": [
                {"system": s.system, "stream": s.stream, "partitions": s.partition_count}
                for s in self.inputs
            ],
            "grouper": self.grouper.value,
            "elasticityFactor": self.elasticity_factor,
            "hash": self.hash,
            "system": self.system,
            "stateSchema": self.state_schema,
            "tasks": None if self.tasks is None else list(self.tasks),
            "startingOffsets": self.starting_offsets,
            "stateLayout": self.state_layout,
            "taskInputs": None
            if self.task_inputs is None
            else [
                {"system": s.system, "stream": s.stream, "partitions": s.partition_count}
                for s in self.task_inputs
            ],
            # Only when set, so job files of queries that never hold back stay as they were.
            **({"holdsBack": True} if self.holds_back else {}),
        }

    @classmethod
    def from_json(cls, document: Mapping[str, Any], source: str) -> JobSpec:
        """Parse ``job.json``; a malformed file is a :class:`CheckpointError` naming it."""
        try:
            tasks = document["tasks"]
            task_inputs = document.get("taskInputs")
            return cls(
                name=str(document["name"]),
                inputs=_stream_inputs(document["inputs"]),
                task_inputs=None if task_inputs is None else _stream_inputs(task_inputs),
                grouper=Grouper.of(document["grouper"]),
                elasticity_factor=int(document["elasticityFactor"]),
                hash=str(document["hash"]),
                system=str(document["system"]),
                state_schema=str(document["stateSchema"]),
                tasks=None if tasks is None else tuple(str(t) for t in tasks),
                starting_offsets=document.get("startingOffsets"),
                state_layout=int(document.get("stateLayout", 1)),
                holds_back=bool(document.get("holdsBack", False)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{source}: not a spark-elastic job file ({exc!r})") from None


def _stream_inputs(items: Any) -> tuple[StreamInput, ...]:
    return tuple(StreamInput(i["system"], i["stream"], int(i["partitions"])) for i in items)


_LOCAL_HOSTS = ("", "localhost")


def checkpoint_path(location: str | os.PathLike[str], name: str = "checkpoint") -> Path:
    """The local directory of a checkpoint location, given as Spark accepts it.

    Runs on the driver. A plain path or a ``file:`` URI (``file:///data/cp``,
    ``file:/data/cp``, ``file://localhost/data/cp``) names the directory
    Spark writes; the library's own files go beside Spark's there. This is
    the local half of :func:`checkpoint_location`, for what only the local
    disk has (a lock file, a gate): other schemes are refused here, so that
    nothing lands in a local directory named after a URI.

    Parameters
    ----------
    location
        The location, as given to ``checkpointLocation``.
    name
        The argument's name, for errors.

    Returns
    -------
    pathlib.Path
        The local directory.

    Raises
    ------
    ArgumentError
        A URI of another scheme, or a ``file:`` URI naming another host.
    """
    text = os.fspath(location)
    if isinstance(text, bytes):
        raise ArgumentError.invalid(name, "a str path or file:// URI", text)
    match = re.match(r"^([A-Za-z][A-Za-z0-9+.-]+):", text)
    if match is None:
        return Path(text)
    parsed = urllib.parse.urlsplit(text)
    if parsed.scheme.lower() != "file":
        raise ArgumentError.invalid(
            name,
            f"a local path or file:// URI here ({parsed.scheme}:// is not the local disk; "
            "nothing was written)",
            text,
        )
    if parsed.netloc not in _LOCAL_HOSTS or not parsed.path.startswith("/"):
        raise ArgumentError.invalid(
            name, "a file:// URI of an absolute local path, e.g. file:///data/cp", text
        )
    return Path(urllib.parse.unquote(parsed.path))


def checkpoint_location(location: str | os.PathLike[str], name: str = "checkpoint") -> str:
    """A checkpoint location as the library's files name it: a local path, or a remote URI.

    Runs on the driver, when a query is defined (nothing is written here).

    Parameters
    ----------
    location
        As given to ``checkpointLocation``: a plain path, a ``file:`` URI, or a
        URI of a file system that can create a file only if absent (``hdfs:``,
        ``s3a:``, ``gs:``, ``abfs[s]:``, ``viewfs:``), opened with the
        session's ``spark.hadoop.*`` settings when first used.
    name
        The argument's name, for errors.

    Returns
    -------
    str
        The local directory, or the URI without a trailing ``/``.

    Raises
    ------
    ArgumentError
        Another scheme, or a ``file:`` URI naming another host (one line).
    """
    text = os.fspath(location)
    if isinstance(text, bytes):
        raise ArgumentError.invalid(name, "a str path or URI", text)
    if is_local(text):
        return str(checkpoint_path(text, name))
    scheme = scheme_of(text)
    if scheme not in COMMIT_SCHEMES:
        supported = ", ".join(f"{s}:" for s in sorted(COMMIT_SCHEMES - {"file"}))
        raise ArgumentError.invalid(
            name,
            "a local path, or a URI of a file system that can create a file only if absent "
            f"({supported}; {scheme}: cannot, and nothing was written)",
            text,
        )
    return text.rstrip("/")


def checkpoint_ref(location: str | os.PathLike[str], name: str = "checkpoint") -> Path | str:
    """:func:`checkpoint_location` as a ``Path`` on the local disk, else the URI (driver)."""
    text = checkpoint_location(location, name)
    return Path(text) if is_local(text) else text


def storage_of(checkpoint: str | os.PathLike[str]) -> tuple[Storage, str]:
    """The storage a checkpoint is on and its root there (driver; remote ones opened once
    per file system and Spark context)."""
    text = os.fspath(checkpoint)
    if is_local(text):
        return storage_for(text), str(checkpoint_path(text))
    return storage_for(text), text.rstrip("/")


def _read(checkpoint: str | os.PathLike[str], *names: str) -> tuple[bytes | None, str]:
    """A file of the checkpoint (None if missing) and its path, for errors."""
    storage, root = storage_of(checkpoint)
    path = storage.join(root, *names)
    return storage.read(path), path


def elastic_dir(checkpoint: str | os.PathLike[str]) -> Path:
    """``<checkpoint>/_spark_elastic`` of a checkpoint on the local disk."""
    return checkpoint_path(checkpoint) / ELASTIC_DIR


def seed_dir(checkpoint: str | os.PathLike[str]) -> Path:
    """``<checkpoint>/_spark_elastic/seed``: the rescaled state, loaded in batch 0."""
    return elastic_dir(checkpoint) / SEED_DIR


def has_seed(checkpoint: str | os.PathLike[str]) -> str | None:
    """Where the checkpoint's rescaled seed is, for Spark to read; None if it has none."""
    storage, root = storage_of(checkpoint)
    seed = storage.join(root, ELASTIC_DIR, SEED_DIR)
    return seed if storage.exists(seed) else None


SEED_SCHEMA = (
    "routing_key int, kind string, chunk int, entries int, data binary, depth int, keys long, "
    "stream string, partition int, key_bucket int, factor int, next_offset long, clocks string"
)
"""One schema for every seed row: ``chunk``, ``layout``, ``checkpoint`` and ``held`` rows
(``clocks`` since held rows came; a seed written before reads it as null)."""


def read_seed(spark: SparkSession, seed: str) -> DataFrame:
    """The seed's Parquet rows (driver), in :data:`SEED_SCHEMA`.

    Given the schema, Spark does not infer it: inferring runs a Spark job that
    reads a file's footer, once for every read of the seed (rescale's key
    counts, the rescaled query's start, ``checkpoint show``).
    """
    return spark.read.schema(SEED_SCHEMA).parquet(seed)


Fence = tuple[tuple[str, int, int, int], int]
"""``((stream, partition, key_bucket, factor), next_offset)``, as a bucket checkpoint."""


def fences_path(checkpoint: str | os.PathLike[str]) -> Path:
    """``<checkpoint>/_spark_elastic/fences.json``."""
    return elastic_dir(checkpoint) / FENCES_FILE


def bootstrap_path(checkpoint: str | os.PathLike[str]) -> Path:
    """``<checkpoint>/_spark_elastic/bootstrap.json``: whether the bootstrap streams are read."""
    return elastic_dir(checkpoint) / BOOTSTRAP_FILE


def write_bootstrap(checkpoint: str | os.PathLike[str], streams: Sequence[str], done: bool) -> None:
    """Say whether a query has read its bootstrap ``streams`` to their end (driver, atomic).

    Written ``done=False`` when the transform is applied and ``True`` once the
    query's committed offsets pass the bootstrap streams' end offsets as of
    its start; the tasks hold the other streams' records until then.
    """
    _write_json(checkpoint, BOOTSTRAP_FILE, {"streams": list(streams), "done": done})


def bootstrapped(checkpoint: str | os.PathLike[str]) -> bool:
    """Whether the bootstrap file says the bootstrap streams are read (driver; a missing or
    unreadable file says not yet)."""
    data, _ = _read(checkpoint, ELASTIC_DIR, BOOTSTRAP_FILE)
    try:
        return data is not None and bool(json.loads(data)["done"])
    except (ValueError, KeyError, TypeError):
        return False


def write_fences(checkpoint: str | os.PathLike[str], fences: list[Fence]) -> None:
    """Replace the checkpoint's output fences atomically (driver).

    A record whose key bucket's fence is above its offset was published by
    an earlier owner: the processor applies it to state and emits nothing.
    Fences may only rise while a query runs on the checkpoint.

    Parameters
    ----------
    checkpoint
        The checkpoint.
    fences
        ``((stream, partition, key_bucket, factor), next_offset)`` entries.
    """
    entries = sorted([[*key, int(offset)] for key, offset in fences])
    _write_json(checkpoint, FENCES_FILE, {"fences": entries})


def read_fences(checkpoint: str | os.PathLike[str]) -> list[Fence]:
    """The checkpoint's output fences (empty when it has none; driver)."""
    data, path = _read(checkpoint, ELASTIC_DIR, FENCES_FILE)
    if data is None:
        return []
    try:
        return fences_of(json.loads(data))
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path}: cannot read the output fences ({exc!r})") from None


def fences_of(document: Mapping[str, Any]) -> list[Fence]:
    """The fences of a ``fences.json`` document (driver, or executor as shipped)."""
    return [((str(s), int(p), int(b), int(f)), int(o)) for s, p, b, f, o in document["fences"]]


def read_job(checkpoint: str | os.PathLike[str]) -> JobSpec | None:
    """The checkpoint's job, or ``None`` if spark-elastic never ran a query on it."""
    data, path = _read(checkpoint, ELASTIC_DIR, JOB_FILE)
    if data is None:
        return None
    try:
        document = json.loads(data)
    except ValueError as exc:  # bad JSON, or bytes that are not UTF-8
        raise CheckpointError(f"{path}: cannot read the job file ({exc})") from None
    return JobSpec.from_json(document, path)


def require_job(checkpoint: str | os.PathLike[str], role: str = "checkpoint") -> JobSpec:
    """The checkpoint's job, or a clear error if it is missing or not spark-elastic's."""
    storage, path = storage_of(checkpoint)
    if not storage.exists(path):
        raise CheckpointError(f"{role} {path!r} does not exist")
    job = read_job(path)
    if job is None:
        raise CheckpointError(
            f"{role} {path!r} has no {ELASTIC_DIR}/{JOB_FILE}: it was not written by a "
            "spark-elastic stateful query"
        )
    return job


def read_state(
    spark: SparkSession,
    checkpoint: str | os.PathLike[str],
    variable: str,
    batch_id: int | None = None,
) -> DataFrame | None:
    """One state variable, via Spark's state data source reader.

    As of committed batch ``batch_id`` when given (a reader that evaluates the
    frame twice then sees the same state even if a batch commits in between),
    else of the last committed batch. ``None`` when the checkpoint has no state yet.
    """
    storage, root = storage_of(checkpoint)
    if not storage.exists(storage.join(root, "state")):
        return None
    reader = spark.read.format("statestore").option("stateVarName", variable)
    if batch_id is not None:
        reader = reader.option("batchId", batch_id)
    return reader.load(root)


def write_job(checkpoint: str | os.PathLike[str], job: JobSpec) -> None:
    """Write ``job.json``, visible whole or not at all."""
    _write_json(checkpoint, JOB_FILE, job.to_json(), indent=2)


def _write_json(
    checkpoint: str | os.PathLike[str], name: str, document: Any, indent: int | None = None
) -> None:
    """Replace ``_spark_elastic/name`` with ``document``, visible whole or not at all."""
    storage, root = storage_of(checkpoint)
    data = json.dumps(document, indent=indent).encode("utf-8")
    storage.put(storage.join(root, ELASTIC_DIR, name), data)


@dataclass(frozen=True)
class CommittedBatch:
    """The last micro-batch in a checkpoint's offset log.

    Attributes
    ----------
    batch_id
        The batch's id.
    committed
        Whether ``commits/<batch_id>`` exists: the batch (state and sink) finished.
    offsets
        The source offsets at the end of the last *committed* batch, merged
        over the query's sources: ``{"topic": {"partition": next offset}}``.
    conf
        The Spark settings the checkpoint pinned (e.g. the shuffle partitions).
    """

    batch_id: int
    committed: bool
    offsets: SourceOffsets
    conf: Mapping[str, str]

    def committed_offset(self, topic: str, partition: int) -> int:
        """Where the next batch starts reading ``partition`` of ``topic`` (0 if never read)."""
        return int(self.offsets.get(topic, {}).get(str(partition), 0))


def is_fresh(checkpoint: str | os.PathLike[str]) -> bool:
    """Whether no micro-batch was ever planned in ``checkpoint``."""
    return not _batch_ids(checkpoint, "offsets")


def never_committed(checkpoint: str | os.PathLike[str]) -> bool:
    """Whether no micro-batch ever committed in ``checkpoint`` (batch 0 may have been tried)."""
    return not _batch_ids(checkpoint, "commits")


def last_batch(checkpoint: str | os.PathLike[str]) -> CommittedBatch | None:
    """The last batch of a checkpoint, or ``None`` when no batch was ever planned."""
    ids = _batch_ids(checkpoint, "offsets")
    if not ids:
        return None
    last = ids[-1]
    storage, root = storage_of(checkpoint)
    committed = storage.exists(storage.join(root, "commits", str(last)))
    conf: Mapping[str, str] = {}
    offsets: SourceOffsets = {}
    source_batch = last if committed else last - 1
    if source_batch >= 0:
        conf, offsets = _read_offset_log(checkpoint, source_batch)
    return CommittedBatch(last, committed, offsets, conf)


def pinned_conf(checkpoint: str | os.PathLike[str]) -> Mapping[str, str]:
    """The settings Spark pinned in the checkpoint's latest planned batch; empty if none.

    Runs on the driver. A restarted query takes them from its last offset log
    entry, committed or not (a failed batch 0 included), whatever its session
    says: so this, not :attr:`CommittedBatch.conf`, is what its next start runs with.
    """
    ids = _batch_ids(checkpoint, "offsets")
    return _read_offset_log(checkpoint, ids[-1])[0] if ids else {}


def batch_offsets(checkpoint: str | os.PathLike[str], batch_id: int) -> SourceOffsets:
    """Where micro-batch ``batch_id`` ends: its source offsets in ``offsets/<batch_id>``.

    Spark writes the entry before the batch runs, so a sink may read it while
    it writes the batch (driver, once per batch).

    Raises
    ------
    CheckpointError
        The entry is missing or unreadable.
    """
    return _read_offset_log(checkpoint, batch_id)[1]


def _batch_ids(checkpoint: str | os.PathLike[str], log: str) -> list[int]:
    """The batch ids in Spark's ``offsets/`` or ``commits/`` log, in order."""
    storage, root = storage_of(checkpoint)
    where = storage.join(root, log)
    try:
        names = storage.list(where)
    except StorageError as exc:
        what = "offset log" if log == "offsets" else "commit log"
        raise CheckpointError(f"{where}: cannot list Spark's {what} ({exc})") from None
    return sorted(int(name) for name in names if re.fullmatch(r"[0-9]+", name))


def _read_offset_log(
    checkpoint: str | os.PathLike[str], batch_id: int
) -> tuple[Mapping[str, str], SourceOffsets]:
    """``offsets/N``: ``v1``, the batch metadata, then one offset line per source."""
    data, path = _read(checkpoint, "offsets", str(batch_id))
    try:
        if data is None:
            raise FileNotFoundError(path)
        lines = data.decode("utf-8").splitlines()
        metadata = json.loads(lines[1])
        merged: SourceOffsets = {}
        for line in lines[2:]:
            if line.strip() in ("", "-"):
                continue
            for topic, partitions in json.loads(line).items():
                merged.setdefault(topic, {}).update({str(p): int(o) for p, o in partitions.items()})
    except (OSError, IndexError, ValueError, AttributeError) as exc:
        raise CheckpointError(f"{path}: cannot read Spark's offset log ({exc!r})") from None
    return dict(metadata.get("conf", {})), merged


class OwnerLock:
    """Marks a checkpoint as in use by a running query of this driver.

    On the local disk, a ``flock`` on ``_spark_elastic/owner.lock`` (the OS
    releases it if the driver dies). Elsewhere, no lock outlives its holder:
    ``_spark_elastic/owner.json`` is created only if absent, naming this
    driver's host and process, and deleted when the query ends. One left by a
    driver that died is taken over when it names a process of this host that
    is gone; else the refusal names it, for the operator to remove. (A running
    job never meets one: each generation of a container has a checkpoint of
    its own, see ``runtime/container/generations.py``.)

    One lock per checkpoint per process: acquiring again from the same process
    is a no-op, so a query can be rebuilt and restarted in one driver. A
    query's lock is freed when Spark's listener bus reports its run
    terminated, a moment after ``stop()`` returns: another process may be
    refused for that moment.
    """

    _held: ClassVar[dict[str, tuple[str, int | str]]] = {}
    """Per lock: the checkpoint and the handle (a descriptor, or the owner object's token)."""
    _runs: ClassVar[dict[str, str]] = {}
    _mutex: ClassVar[threading.Lock] = threading.Lock()

    @staticmethod
    def _key(checkpoint: str | os.PathLike[str]) -> tuple[str, bool]:
        """The lock's path (resolved, on the local disk) and whether it is local."""
        storage, root = storage_of(checkpoint)
        if storage.scheme == "file":
            return str((Path(root) / ELASTIC_DIR / _LOCK_FILE).resolve()), True
        return storage.join(root, ELASTIC_DIR, _OWNER_OBJECT), False

    @classmethod
    def acquire(cls, checkpoint: str | os.PathLike[str]) -> None:
        """Take the lock, or raise :class:`CheckpointError` if another process holds it."""
        key, local = cls._key(checkpoint)
        with cls._mutex:
            if key in cls._held:
                # A new run is being set up: the previous run's late termination must not free it.
                cls._runs.pop(key, None)
                return
            handle = _lock_local(key, checkpoint) if local else _claim_object(key, checkpoint)
            cls._held[key] = (os.fspath(checkpoint), handle)

    @classmethod
    def release(cls, checkpoint: str | os.PathLike[str]) -> None:
        """Give the lock up (no-op if this process does not hold it)."""
        key, _ = cls._key(checkpoint)
        # Freed before the mutex is let go: an acquire in between (a rescale right after a
        # query's stop) would find the lock neither held here nor free, as if another
        # process had it.
        with cls._mutex:
            held = cls._held.pop(key, None)
            cls._runs.pop(key, None)
            if held is None:
                return
            handle = held[1]
            if isinstance(handle, int):
                with contextlib.suppress(OSError):
                    fcntl.flock(handle, fcntl.LOCK_UN)
                os.close(handle)
                return
            storage, _ = storage_of(checkpoint)
            data = storage.read(key)
            if data is not None and _owner_of(data).get("token") == handle:
                storage.delete(key)

    @classmethod
    def bind_run(cls, query_id: str, run_id: str, id_of: Callable[[str], str | None]) -> None:
        """Tie the held, unbound lock of the checkpoint of query ``query_id`` to ``run_id``."""
        with cls._mutex:
            for key, (checkpoint, _) in cls._held.items():
                if key not in cls._runs and id_of(checkpoint) == query_id:
                    cls._runs[key] = run_id

    @classmethod
    def release_run(cls, run_id: str) -> None:
        """Release the lock bound to ``run_id`` (its run terminated)."""
        with cls._mutex:
            checkpoints = [cls._held[k][0] for k, r in cls._runs.items() if r == run_id]
        for checkpoint in checkpoints:
            cls.release(checkpoint)

    @classmethod
    def held_here(cls, checkpoint: str | os.PathLike[str]) -> bool:
        """Whether this process holds the checkpoint's lock."""
        return cls._key(checkpoint)[0] in cls._held

    @classmethod
    @contextlib.contextmanager
    def probe(cls, checkpoint: str | os.PathLike[str]) -> Iterator[None]:
        """Hold the lock for the body (refusing if another process has it)."""
        held = cls.held_here(checkpoint)
        cls.acquire(checkpoint)
        try:
            yield
        finally:
            if not held:
                cls.release(checkpoint)


def _in_use(checkpoint: str | os.PathLike[str], by: str = "") -> CheckpointError:
    return CheckpointError(
        f"checkpoint {os.fspath(checkpoint)!r} is in use by a running query in another "
        f"process{by}; stop it first"
    )


def _lock_local(path: str, checkpoint: str | os.PathLike[str]) -> int:
    """``flock`` the local lock file; its descriptor."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise _in_use(checkpoint) from None
    return fd


def _owner_of(data: bytes) -> dict[str, Any]:
    try:
        owner = json.loads(data)
    except ValueError:
        return {}
    return owner if isinstance(owner, dict) else {}


def _gone(owner: Mapping[str, Any]) -> bool:
    """Whether an owner object names a process of this host that no longer runs."""
    if owner.get("host") != socket.gethostname() or not isinstance(owner.get("pid"), int):
        return False
    try:
        os.kill(owner["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _claim_object(path: str, checkpoint: str | os.PathLike[str]) -> str:
    """Create the owner object only if absent (taking over a dead local owner's); its token."""
    storage, _ = storage_of(checkpoint)
    token = uuid.uuid4().hex
    document = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "since": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "token": token,
    }
    data = json.dumps(document).encode("utf-8")
    for _ in range(2):
        if storage.create(path, data):
            return token
        found = storage.read(path)
        owner = _owner_of(found) if found is not None else {}
        if found is not None and not _gone(owner):
            raise _in_use(
                checkpoint,
                f" ({owner.get('host', '?')}, pid {owner.get('pid', '?')}, since "
                f"{owner.get('since', '?')}; if that driver is gone, delete {path})",
            )
        if found is not None:
            storage.delete(path)  # its driver died on this host: the lock is free
    raise _in_use(checkpoint, f" (another driver took {path} meanwhile)")
