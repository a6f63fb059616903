"""Rescale stopped stateful queries: split or merge their virtual tasks into a new checkpoint.

Runs on the driver, with a SparkSession for Spark's state data source reader
and to write the seed. The recipe (:func:`rescale`):

1. read each source checkpoint's job and last batch, refusing a running
   query, an uncommitted last batch, a checkpoint not made by spark-elastic,
   and sources of different jobs or owning the same keys;
2. collect every source's bucket checkpoints; a task's own bucket counts as
   caught up to its query's committed source offsets (a bucket that saw no
   record has nothing pending below them);
3. for every virtual task at the new factor and every stream partition it
   reads: its start (:func:`~spark_elastic.state.bucket_checkpoints.bucket_start`, the
   SEP-32 / Samza rule, or :func:`~spark_elastic.state.bucket_checkpoints.cover_start`
   where no single factor covers it), plus the source checkpoints above that
   start, kept so records some sources already applied are skipped;
4. move every key's state to the task that owns its bucket at the new factor;
5. write the seed and ``job.json`` into a temporary sibling directory and
   rename it to the target: nothing is half-written, sources are only read.

The new query loads the seed in its first micro-batch and should start
reading at :func:`starting_offsets` (the smallest offsets its buckets need).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_elastic.dataplane.routing import routing_keys
from spark_elastic.dataplane.session import active_or_local_session
from spark_elastic.errors import ArgumentError, CheckpointError
from spark_elastic.model.names import (
    Lineage,
    TaskKind,
    TaskName,
    lineage,
    validate_elasticity_factor,
)
from spark_elastic.model.plan import JobPlan
from spark_elastic.state.bucket_checkpoints import BucketCheckpoint, bucket_start, cover_start
from spark_elastic.state.checkpoint_dir import (
    ELASTIC_DIR,
    SEED_DIR,
    SEED_SCHEMA,
    CommittedBatch,
    JobSpec,
    OwnerLock,
    checkpoint_ref,
    last_batch,
    read_job,
    read_seed,
    read_state,
    require_job,
    storage_of,
)
from spark_elastic.state.chunks import (
    LAYOUT_VERSION,
    decode,
    depth_for,
    encode,
    min_depth,
    regroup,
)
from spark_elastic.storage import LocalStorage

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["RescaleResult", "SourceCheckpoint", "rescale", "starting_offsets", "stopped_source"]

_LOCAL = LocalStorage()


@dataclass(frozen=True)
class SourceCheckpoint:
    """A stopped query's checkpoint: its job, plan, and last committed batch."""

    path: Path | str
    """A local directory, or a URI (``hdfs://``, ``s3a://``...)."""
    job: JobSpec
    plan: JobPlan
    batch: CommittedBatch

    def owned_tasks(self) -> list[TaskName]:
        """The virtual tasks this query owned."""
        names = self.plan.task_names() if self.job.tasks is None else list(self.job.tasks)
        return [TaskName.parse(n) for n in names]


@dataclass(frozen=True)
class RescaleResult:
    """What :func:`rescale` wrote.

    Attributes
    ----------
    target
        The new checkpoint directory.
    elasticity_factor
        Its factor.
    task_count
        Its virtual tasks (and state partitions).
    keys
        Keys of user state moved.
    checkpoints
        Bucket checkpoints seeded.
    starting_offsets
        Where the new query starts: ``{"topic": {"partition": offset}}``.
    """

    target: Path | str
    elasticity_factor: int
    task_count: int
    keys: int
    checkpoints: int
    starting_offsets: dict[str, dict[str, int]]


def starting_offsets(checkpoint: str | os.PathLike[str], default: str = "earliest") -> str:
    """The ``startingOffsets`` option for a query on ``checkpoint``.

    Runs on the driver, once per query start; reads ``job.json`` and Spark's
    offset log, nothing else.

    Parameters
    ----------
    checkpoint
        The query's checkpoint location (it may not exist yet).
    default
        What to return for any checkpoint but a rescaled one not started yet.

    Returns
    -------
    str
        For a checkpoint made by :func:`rescale` and not started yet, the
        JSON offsets (``{"topic": {"partition": offset}}``) its buckets
        need; otherwise ``default`` (Spark ignores ``startingOffsets`` when
        it resumes a checkpoint anyway).

    Raises
    ------
    CheckpointError
        The checkpoint's ``job.json`` or offset log cannot be read.
    """
    job = read_job(checkpoint)
    if job is None or job.starting_offsets is None or last_batch(checkpoint) is not None:
        return default
    return json.dumps(job.starting_offsets, sort_keys=True)


def stopped_source(
    path: str | os.PathLike[str], spark: SparkSession | None = None
) -> SourceCheckpoint:
    """Read a source checkpoint, refusing one that cannot be rescaled.

    Parameters
    ----------
    path
        The checkpoint of a stopped query that ran :func:`with_task_state`.
    spark
        The session, to tell whether a query of this process still runs on it.

    Returns
    -------
    SourceCheckpoint

    Raises
    ------
    CheckpointError
        Not a spark-elastic stateful checkpoint, running, never ran, or its
        last batch did not commit.
    """
    checkpoint = checkpoint_ref(path, "source")
    job = require_job(checkpoint, "source checkpoint")
    _check_stopped(checkpoint, spark)
    batch = last_batch(checkpoint)
    if batch is None:
        raise CheckpointError(f"source checkpoint {str(checkpoint)!r} never ran a micro-batch")
    if not batch.committed:
        raise CheckpointError(
            f"source checkpoint {str(checkpoint)!r}: its last batch {batch.batch_id} did not "
            "commit; restart the query until it commits (or stops cleanly), then rescale"
        )
    return SourceCheckpoint(checkpoint, job, job.plan(), batch)


def _check_stopped(checkpoint: Path | str, spark: SparkSession | None) -> None:
    if OwnerLock.held_here(checkpoint):
        if _running_here(checkpoint, spark):
            raise CheckpointError(
                f"source checkpoint {str(checkpoint)!r} is in use by a running query; stop it first"
            )
        OwnerLock.release(checkpoint)
    with OwnerLock.probe(checkpoint):
        pass


def _running_here(checkpoint: Path | str, spark: SparkSession | None) -> bool:
    if spark is None:
        return True
    storage, root = storage_of(checkpoint)
    try:
        query_id = json.loads(storage.read(storage.join(root, "metadata")) or b"")["id"]
    except (ValueError, KeyError):
        return False
    return any(str(q.id) == query_id and q.isActive for q in spark.streams.active)


def rescale(
    sources: Sequence[str | os.PathLike[str]] | str | os.PathLike[str],
    target: str | os.PathLike[str],
    elasticity_factor: int,
    spark: SparkSession | None = None,
    tasks: Sequence[str] | None = None,
) -> RescaleResult:
    """Prepare a new checkpoint that runs the sources' job at ``elasticity_factor``.

    Parameters
    ----------
    sources
        Checkpoints of stopped queries that ran virtual tasks of one job (for
        example two queries each owning half of the tasks).
    target
        The new checkpoint directory: absent or empty.
    elasticity_factor
        The new factor, a power of two from 1 to 1024.
    spark
        The session to read state with (default: the active one, or a local one).
    tasks
        The virtual tasks (names at the new factor) the new checkpoint's query
        owns, for example those a container takes over when a job is scaled;
        the sources must own all their keys, and may own others, which are
        left out. Default: every task, and the sources must own the whole job.

    Returns
    -------
    RescaleResult

    Raises
    ------
    ArgumentError
        Bad factor, no sources, a target that is not empty or is a source,
        ``tasks`` empty or naming a task the job does not have at the new factor.
    CheckpointError
        A source is running, uncommitted, or not spark-elastic's; sources of
        different jobs, owning the same keys, or not owning all the keys of
        the new checkpoint's tasks.
    """
    factor = validate_elasticity_factor(elasticity_factor)
    wanted_names = _task_names_argument(tasks)
    paths = (
        [checkpoint_ref(sources, "sources")]
        if isinstance(sources, str | os.PathLike)
        else [checkpoint_ref(s, "sources") for s in sources]
    )
    if not paths:
        raise ArgumentError.invalid("sources", "at least one source checkpoint", [])
    out = checkpoint_ref(target, "target")
    _check_target(out, paths)
    session = spark if spark is not None else active_or_local_session("spark-elastic-rescale")
    checkpoints = [stopped_source(p, session) for p in paths]
    with contextlib.ExitStack() as held:
        # Held to the end: a query started on a source meanwhile would move its state
        # past the offsets read above, and the new checkpoint would replay those records.
        for source in checkpoints:
            held.enter_context(OwnerLock.probe(source.path))
        for source in checkpoints:
            _check_unchanged(source)
        _check_one_job(checkpoints)
        _check_one_layout(checkpoints)
        _check_one_time_mode(checkpoints)
        _check_disjoint(checkpoints)
        new_plan = checkpoints[0].job.plan(factor)
        wanted = _wanted_ids(new_plan, wanted_names)
        _check_complete(checkpoints, new_plan, wanted)

        entries = _effective_checkpoints(session, checkpoints)
        seeded = _seeded_checkpoints(new_plan, entries, wanted)
        offsets = _starting_offsets(new_plan, seeded, wanted)
        job = replace(
            checkpoints[0].job,
            elasticity_factor=factor,
            tasks=None if wanted_names is None else wanted_names,
            starting_offsets=offsets,
            state_layout=LAYOUT_VERSION,
        )
        keys = _write_target(
            out,
            lambda where: _write_seed_and_job(
                session, where, job, new_plan, checkpoints, seeded, wanted
            ),
        )
    return RescaleResult(out, factor, new_plan.task_count, keys, len(seeded), offsets)


# -- steps -------------------------------------------------------------------------------------


def _check_unchanged(source: SourceCheckpoint) -> None:
    """Refuse a source whose offset log moved between its checks and taking its lock."""
    if last_batch(source.path) != source.batch:
        raise CheckpointError(
            f"source checkpoint {str(source.path)!r} ran another micro-batch while being "
            "rescaled; stop its query and rescale again"
        )


def _check_target(target: Path | str, sources: Sequence[Path | str]) -> None:
    def inside(a: Path | str, b: Path | str) -> bool:
        if isinstance(a, Path) and isinstance(b, Path):
            return a.resolve().is_relative_to(b.resolve())
        return str(a).rstrip("/") == str(b).rstrip("/") or str(a).startswith(
            str(b).rstrip("/") + "/"
        )

    for source in sources:
        # Nested either way, writing one would change the other.
        if inside(target, source) or inside(source, target):
            raise ArgumentError.invalid(
                "target",
                "a directory other than the sources, and neither inside one nor holding one "
                "(sources are never modified)",
                str(target),
            )
    if isinstance(target, Path):
        if target.exists() and (not target.is_dir() or any(target.iterdir())):
            raise ArgumentError.invalid(
                "target", "a new or empty checkpoint directory", f"{target} (not empty)"
            )
        return
    storage, root = storage_of(target)
    if storage.list(root):
        raise ArgumentError.invalid(
            "target", "a new or empty checkpoint directory", f"{target} (not empty)"
        )


def _check_one_job(checkpoints: list[SourceCheckpoint]) -> None:
    first = checkpoints[0]
    for other in checkpoints[1:]:
        if not other.job.same_job(first.job):
            raise CheckpointError(
                f"checkpoints of different jobs: {str(first.path)!r} is job {first.job.name!r} "
                f"(inputs {', '.join(map(str, first.job.inputs))}, grouper "
                f"{first.job.grouper.value}, hash {first.job.hash}, state "
                f"{first.job.state_schema!r}); {str(other.path)!r} is job {other.job.name!r} "
                f"(inputs {', '.join(map(str, other.job.inputs))}, grouper "
                f"{other.job.grouper.value}, hash {other.job.hash}, state "
                f"{other.job.state_schema!r})"
            )


def _check_one_layout(checkpoints: list[SourceCheckpoint]) -> None:
    layouts = {source.job.state_layout for source in checkpoints}
    if len(layouts) > 1:
        raise CheckpointError(
            "sources store keyed state in different layouts "
            f"({', '.join(f'{str(c.path)!r}: {c.job.state_layout}' for c in checkpoints)}); "
            "convert the layout-1 ones first: `spark-elastic rescale OLD --to NEW "
            "--elasticity-factor F` on each"
        )


def _check_one_time_mode(checkpoints: list[SourceCheckpoint]) -> None:
    modes = {source.job.holds_back for source in checkpoints}
    if len(modes) > 1:
        raise CheckpointError(
            "sources differ in holding records back (max_task_idle_ms): "
            + ", ".join(
                f"{str(c.path)!r} {'holds back' if c.job.holds_back else 'does not'}"
                for c in checkpoints
            )
        )


def _check_disjoint(checkpoints: list[SourceCheckpoint]) -> None:
    """Each key must come from one source: no two sources may own related virtual tasks."""
    owners: dict[TaskName, list[tuple[TaskName, Path | str]]] = {}
    for source in checkpoints:
        for task in source.owned_tasks():
            owners.setdefault(task.base, []).append((task, source.path))
    for tasks in owners.values():
        for i, (a, path_a) in enumerate(tasks):
            for b, path_b in tasks[i + 1 :]:
                if lineage(a, b) is not Lineage.UNRELATED:
                    raise CheckpointError(
                        f"sources overlap: {str(path_a)!r} owns {a} and {str(path_b)!r} owns {b}, "
                        "which share keys; pass only the latest checkpoint of each virtual task"
                    )


def _task_names_argument(tasks: Sequence[str] | None) -> tuple[str, ...] | None:
    """``tasks`` as the sorted, distinct names a query's ``job.json`` records (None: all)."""
    if tasks is None:
        return None
    if isinstance(tasks, str) or not all(isinstance(t, str) for t in tasks):
        raise ArgumentError.invalid("tasks", "a sequence of virtual task names", tasks)
    names = tuple(sorted(set(tasks)))
    if not names:
        raise ArgumentError.invalid("tasks", "at least one virtual task name", list(tasks))
    return names


def _wanted_ids(plan: JobPlan, names: tuple[str, ...] | None) -> tuple[int, ...]:
    """Task ids of the new plan the target owns, in plan order."""
    ids = {name: i for i, name in enumerate(plan.task_names())}
    if names is None:
        return tuple(range(plan.task_count))
    unknown = [n for n in names if n not in ids]
    if unknown:
        raise ArgumentError.invalid(
            "tasks",
            f"names of the job's {plan.task_count} virtual tasks at factor "
            f"{plan.elasticity_factor}",
            unknown[0],
        )
    return tuple(sorted(ids[n] for n in names))


def _shares_keys(a: TaskName, b: TaskName) -> bool:
    """Whether two tasks of one job own some keys in common."""
    if a.kind is TaskKind.SINGLE or b.kind is TaskKind.SINGLE:
        return a == b
    return lineage(a, b) is not Lineage.UNRELATED


def _check_complete(
    checkpoints: list[SourceCheckpoint], plan: JobPlan, wanted: Sequence[int]
) -> None:
    """The sources together must own every key of the target's tasks, or some would restart
    from 0.

    Sources are disjoint (checked first), so a target task's keys are all
    owned exactly when the shares of them its related source tasks own add up
    to its own share, ``1 / factor``: a source task at factor ``f'`` owns
    ``1 / max(f, f')`` of the keys of a task at ``f`` it is related to.
    """
    owned: dict[TaskName, list[TaskName]] = {}
    for source in checkpoints:
        for task in source.owned_tasks():
            owned.setdefault(task.base, []).append(task)
    names = plan.task_names()
    missing = []
    for task_id in wanted:
        task = TaskName.parse(names[task_id])
        share = sum(
            (
                Fraction(1, max(task.elasticity_factor, other.elasticity_factor))
                for other in owned.get(task.base, [])
                if _shares_keys(other, task)
            ),
            Fraction(0),
        )
        if share != Fraction(1, task.elasticity_factor):
            missing.append(str(task))
    if missing:
        shown = ", ".join(missing[:5]) + (
            f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        )
        what = "the whole job" if len(wanted) == plan.task_count else "the target's tasks"
        raise CheckpointError(
            f"sources do not cover {what}: no source owns all the keys of {shown}; "
            "pass the latest checkpoint of every query that ran them "
            "(a task left out would start again from offset 0)"
        )


def _effective_checkpoints(
    spark: SparkSession, checkpoints: list[SourceCheckpoint]
) -> list[BucketCheckpoint]:
    """Every source's stored checkpoints, with each owned bucket raised to its committed offsets."""
    from spark_elastic.state.processor import CHECKPOINT_STATE

    entries: list[BucketCheckpoint] = []
    for source in checkpoints:
        system = source.job.system
        stored = read_state(spark, source.path, CHECKPOINT_STATE, source.batch.batch_id)
        if stored is not None:
            for row in stored.select("user_map_key.*", "user_map_value.*").collect():
                entries.append(
                    BucketCheckpoint(
                        system,
                        row.stream,
                        row.partition,
                        row.key_bucket,
                        row.factor,
                        row.next_offset,
                    )
                )
        ids = {name: i for i, name in enumerate(source.plan.task_names())}
        for task in source.owned_tasks():
            for ssp in source.plan.task(ids[str(task)]).partitions:
                committed = source.batch.committed_offset(ssp.stream, ssp.partition)
                entries.append(
                    BucketCheckpoint(
                        system,
                        ssp.stream,
                        ssp.partition,
                        task.key_bucket,
                        task.elasticity_factor,
                        committed,
                    )
                )
    return entries


def _seeded_checkpoints(
    plan: JobPlan, entries: list[BucketCheckpoint], wanted: Sequence[int]
) -> list[tuple[int, BucketCheckpoint]]:
    """Per wanted task id: its own start per stream partition, plus source checkpoints above it."""
    by_partition: dict[tuple[str, str, int], list[BucketCheckpoint]] = {}
    for entry in entries:
        by_partition.setdefault(entry.stream_partition, []).append(entry)
    factor = plan.elasticity_factor
    seeded: list[tuple[int, BucketCheckpoint]] = []
    for task_id in wanted:
        bucket = task_id % factor
        for ssp in plan.task(task_id).partitions:
            known = by_partition.get((ssp.system, ssp.stream, ssp.partition), [])
            related = [
                e for e in known if e.covers(bucket, factor) or e.is_descendant_of(bucket, factor)
            ]
            start = bucket_start(related, bucket, factor)
            if start is None:
                start = cover_start(related, bucket, factor)
            if start is not None:
                own = BucketCheckpoint(ssp.system, ssp.stream, ssp.partition, bucket, factor, start)
                seeded.append((task_id, own))
            for e in _distinct(related):
                if e.is_descendant_of(bucket, factor) and (start is None or e.next_offset > start):
                    seeded.append((task_id, e))
    return seeded


def _distinct(entries: Iterable[BucketCheckpoint]) -> list[BucketCheckpoint]:
    """One entry per bucket and factor, the largest: each is a valid bound, the largest tightest."""
    best: dict[tuple[int, int], BucketCheckpoint] = {}
    for e in entries:
        key = (e.key_bucket, e.elasticity_factor)
        if key not in best or e.next_offset > best[key].next_offset:
            best[key] = e
    return sorted(best.values())


def _starting_offsets(
    plan: JobPlan, seeded: list[tuple[int, BucketCheckpoint]], wanted: Sequence[int]
) -> dict[str, dict[str, int]]:
    """Per stream partition the wanted tasks read, the smallest start any of them needs
    (0 if one has none)."""
    factor = plan.elasticity_factor
    starts: dict[tuple[str, int], dict[int, int]] = {}
    for task_id, e in seeded:
        if e.elasticity_factor == factor:
            starts.setdefault((e.stream, e.partition), {})[task_id] = e.next_offset
    readers: dict[tuple[str, int], set[int]] = {}
    for task_id in wanted:
        for ssp in plan.task(task_id).partitions:
            readers.setdefault((ssp.stream, ssp.partition), set()).add(task_id)
    offsets: dict[str, dict[str, int]] = {}
    for (stream, partition), tasks in sorted(readers.items()):
        known = starts.get((stream, partition), {})
        complete = tasks <= known.keys()
        offsets.setdefault(stream, {})[str(partition)] = (
            min(known[t] for t in tasks) if complete else 0
        )
    return offsets


def _write_target(target: Path | str, write: Callable[[Path | str], int]) -> int:
    """``write`` the seed and job file to a temporary sibling, then rename it into place.

    Off the local disk (no atomic directory rename on S3) they go to the target
    itself, ``job.json`` last: a target with a seed and no job file is a
    rescale that did not finish, which a query refuses to start on.
    """
    if isinstance(target, Path):
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            keys = write(staging)
            if target.exists():
                target.rmdir()
            _LOCAL.move(str(staging), str(target))
        except BaseException:
            _LOCAL.discard(str(staging))
            raise
        return keys
    storage, root = storage_of(target)
    try:
        return write(root)
    except BaseException:
        storage.delete(root)
        raise


def _write_seed_and_job(
    spark: SparkSession,
    target: Path | str,
    job: JobSpec,
    plan: JobPlan,
    checkpoints: list[SourceCheckpoint],
    seeded: list[tuple[int, BucketCheckpoint]],
    wanted: Sequence[int],
) -> int:
    """The seed (Spark writes it), then ``job.json``; the keys written."""
    from spark_elastic.state.checkpoint_dir import write_job

    storage, root = storage_of(target)
    seed = storage.join(root, ELASTIC_DIR, SEED_DIR)
    chunks, depths = _seed_chunks(spark, plan, checkpoints, job.state_schema, wanted)
    chunks.write.parquet(str(seed))
    # Key counts from what was written: evaluating the chunks again would read every
    # source's state a second time.
    # Summed here, not by a groupBy: a row per chunk is few, and a shuffle's second stage
    # cost a fresh process about 1 s of a rescale.
    counts: dict[int, int] = {}
    for row in read_seed(spark, str(seed)).select("routing_key", "entries").collect():
        counts[row.routing_key] = counts.get(row.routing_key, 0) + row.entries
    keys = routing_keys(plan.task_count).tolist()
    task_of = {k: t for t, k in enumerate(keys)}
    none5: tuple[None, ...] = (None,) * 5
    rows: list[tuple[Any, ...]] = [
        (key, "layout", None, None, None, depths[task_of[key]], count, *none5, None)
        for key, count in sorted(counts.items())
    ]
    rows += [
        (
            keys[task_id],
            "checkpoint",
            *none5,
            e.stream,
            e.partition,
            e.key_bucket,
            e.elasticity_factor,
            e.next_offset,
            None,
        )
        for task_id, e in seeded
    ]
    if job.holds_back:
        rows += [
            (keys[task_id], "held", None, None, data, None, None, *none5, clocks)
            for task_id, (data, clocks) in _seed_held(spark, plan, checkpoints, wanted).items()
        ]
    _local_rows(spark, rows, SEED_SCHEMA).write.mode("append").parquet(str(seed))
    write_job(target, job)
    return sum(counts.values())


def _seed_chunks(
    spark: SparkSession,
    plan: JobPlan,
    checkpoints: list[SourceCheckpoint],
    state_schema: str,
    wanted: Sequence[int],
) -> tuple[DataFrame, list[int]]:
    """The sources' keyed state as chunks of the wanted new tasks, and each new task's depth.

    Layout-2 sources move whole chunks (re-chunked in a Python worker only
    where a new task's depth is deeper than the chunk's); layout-1 sources
    (one entry per key) are chunked here, which is how old checkpoints convert.
    Only old tasks sharing keys with a wanted task are read.
    """
    from pyspark.sql import functions as F

    from spark_elastic.state.processor import LAYOUT_STATE, USER_STATE

    if checkpoints[0].job.state_layout == 1:
        return _chunked_keys(spark, checkpoints, plan, state_schema, wanted)
    factor = plan.elasticity_factor
    new_keys = routing_keys(plan.task_count).tolist()
    wanted_keys = [new_keys[t] for t in wanted]
    names = plan.task_names()
    targets = [TaskName.parse(names[t]) for t in wanted]
    sources = []
    for source in checkpoints:
        layouts = read_state(spark, source.path, LAYOUT_STATE, source.batch.batch_id)
        depth_of = (
            {}
            if layouts is None
            else {
                int(r.routing_key): int(r.depth)
                for r in layouts.select("key.routing_key", "value.depth").collect()
            }
        )
        sources.append((source, _old_tasks(source), depth_of))
    depths = _new_depths(plan, sources)
    moves: list[DataFrame] = []
    for source, (bases, buckets), depth_of in sources:
        stored = read_state(spark, source.path, USER_STATE, source.batch.batch_id)
        if stored is None:
            continue
        move = _ChunkMover(bases, depth_of, depths, factor, new_keys)
        old_keys = routing_keys(source.plan.task_count).tolist()
        old_names = source.plan.task_names()
        related = [
            old_keys[i]
            for i, name in enumerate(old_names)
            if any(_shares_keys(TaskName.parse(name), t) for t in targets)
        ]
        chunks = stored.select(
            "key.routing_key",
            "user_map_key.chunk",
            "user_map_value.entries",
            "user_map_value.data",
        )
        if len(wanted) < plan.task_count:
            chunks = chunks.filter(F.col("routing_key").isin(related))
        if _whole_keys(
            bases, buckets, depth_of, depths, factor, source.plan.elasticity_factor
        ) >= set(related):
            moved = _moved_whole(chunks, bases, factor, new_keys)
        else:
            moved = chunks.mapInPandas(move, CHUNK_ROWS)
        if len(wanted) < plan.task_count:
            moved = moved.filter(F.col("routing_key").isin(wanted_keys))
        moves.append(moved)
    seed = _no_chunks(spark) if not moves else moves[0]
    for moved in moves[1:]:
        seed = seed.unionByName(moved)
    return _as_seed_rows(seed), depths


CHUNK_ROWS = "routing_key int, chunk int, entries int, data binary"


def _no_chunks(spark: SparkSession) -> DataFrame:
    """No chunk rows, in :data:`CHUNK_ROWS`, planned in the JVM alone.

    ``createDataFrame([], ...)`` is a Python RDD: writing it starts Python
    workers (a daemon and one per core) though it has no row.
    """
    columns = [c.split() for c in CHUNK_ROWS.split(", ")]
    return spark.range(0).selectExpr(*(f"CAST(NULL AS {kind}) AS {name}" for name, kind in columns))


def _local_rows(spark: SparkSession, rows: list[tuple[Any, ...]], schema: str) -> DataFrame:
    """A few driver-side ``rows`` as a DataFrame of ``schema`` that runs in the JVM alone.

    Through Arrow: a list given to ``createDataFrame`` becomes a Python RDD,
    which starts Python workers to be read (a rescale whose chunks all move
    in SQL would start them for these rows only).
    """
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    struct = spark.createDataFrame([], schema).schema
    names = struct.fieldNames()
    table = pa.Table.from_pylist(
        [dict(zip(names, row, strict=True)) for row in rows], schema=to_arrow_schema(struct)
    )
    return spark.createDataFrame(table, struct)


def _old_tasks(source: SourceCheckpoint) -> tuple[dict[int, int], dict[int, int]]:
    """Per routing key of the source's tasks: its base task and its key bucket."""
    factor = source.plan.elasticity_factor
    keys = routing_keys(source.plan.task_count).tolist()
    return {k: t // factor for t, k in enumerate(keys)}, {k: t % factor for t, k in enumerate(keys)}


def _seed_held(
    spark: SparkSession, plan: JobPlan, checkpoints: list[SourceCheckpoint], wanted: Sequence[int]
) -> dict[int, tuple[bytes, str]]:
    """Per wanted new task: the records its keys' old tasks held back, and their clocks.

    Each held record goes to the new task owning its key bucket; a new task
    takes each partition's time as the highest of the old tasks sharing its
    keys, and its idle waits start over. Held records are few (what one wait
    keeps), so they are moved on the driver.
    """
    import pandas as pd

    from spark_elastic.state.holdback import HELD_STATE, Clock, decode_held, encode_held
    from spark_elastic.state.processor import BUCKET_HASH

    factor = plan.elasticity_factor
    names = plan.task_names()
    wanted_set = set(wanted)
    frames: dict[int, list[pd.DataFrame]] = {}
    clocks: dict[int, dict[tuple[str, int], Clock]] = {}
    empty = None
    for source in checkpoints:
        stored = read_state(spark, source.path, HELD_STATE, source.batch.batch_id)
        if stored is None:
            continue
        bases, _ = _old_tasks(source)
        old_names = dict(
            zip(
                routing_keys(source.plan.task_count).tolist(), source.plan.task_names(), strict=True
            )
        )
        for row in stored.select("key.routing_key", "value.rows", "value.clocks").collect():
            held, old_clocks = decode_held(bytes(row.rows), str(row.clocks))
            empty = held.iloc[:0]
            old = TaskName.parse(old_names[int(row.routing_key)])
            for task_id in wanted:
                if not _shares_keys(old, TaskName.parse(names[task_id])):
                    continue
                mine = clocks.setdefault(task_id, {})
                for partition, clock in old_clocks.items():
                    times = [
                        t for t in (clock.time, mine.get(partition, Clock()).time) if t is not None
                    ]
                    mine[partition] = Clock(max(times) if times else None, None)
            if len(held):
                base = bases[int(row.routing_key)]
                new_ids = base * factor + held[BUCKET_HASH].to_numpy() % factor
                for task_id, part in held.groupby(new_ids, sort=True):
                    if int(task_id) in wanted_set:
                        frames.setdefault(int(task_id), []).append(part)
    if empty is None:
        return {}
    seeded = {}
    for task_id in sorted(clocks.keys() | frames.keys()):
        parts = frames.get(task_id, [])
        held = pd.concat(parts, ignore_index=True) if parts else empty
        seeded[task_id] = encode_held(held, clocks.get(task_id, {}))
    return seeded


def _as_seed_rows(chunks: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    columns = {
        "kind": F.lit("chunk"),
        "depth": F.lit(None).cast("int"),
        "keys": F.lit(None).cast("long"),
        "stream": F.lit(None).cast("string"),
        "partition": F.lit(None).cast("int"),
        "key_bucket": F.lit(None).cast("int"),
        "factor": F.lit(None).cast("int"),
        "next_offset": F.lit(None).cast("long"),
        "clocks": F.lit(None).cast("string"),
    }
    names = [c.split()[0] for c in SEED_SCHEMA.split(", ")]
    return chunks.withColumns(columns).select(*names)


def _new_depths(
    plan: JobPlan,
    sources: list[tuple[SourceCheckpoint, tuple[dict[int, int], dict[int, int]], dict[int, int]]],
) -> list[int]:
    """Per new task: the deepest chunks among the old tasks sharing its keys, at least log2(f).

    Depth tracks a partition's key density, so a split or a merge keeps it and
    chunks move whole; only a merge of tasks that grew to different depths
    re-chunks the shallower side.
    """
    factor = plan.elasticity_factor
    depths = [min_depth(factor)] * plan.task_count
    for source, (bases, buckets), depth_of in sources:
        old_factor = source.plan.elasticity_factor
        for key, depth in depth_of.items():
            for task in _fed_tasks(bases[key], buckets[key], factor, old_factor):
                depths[task] = max(depths[task], depth)
    return depths


def _fed_tasks(base: int, bucket: int, factor: int, old_factor: int) -> range:
    """The new tasks an old task's keys go to: those of its base whose bucket matches its own
    modulo the smaller factor."""
    common = min(factor, old_factor)
    return range(base * factor + bucket % common, (base + 1) * factor, common)


def _whole_keys(
    bases: dict[int, int],
    buckets: dict[int, int],
    depth_of: dict[int, int],
    depths: list[int],
    factor: int,
    old_factor: int,
) -> set[int]:
    """The old tasks (routing keys) every chunk of which moves whole to one new task.

    A chunk at a depth of at least ``log2(factor)`` holds keys of one new
    task only; it moves whole when that task's depth is the chunk's. The new
    tasks an old one feeds are :func:`_fed_tasks`. A task without a layout (it
    never stored a key) is never whole, so its chunks, if any, still go
    through :class:`_ChunkMover`.
    """
    return {
        key
        for key, depth in depth_of.items()
        if depth >= min_depth(factor)
        and all(
            depths[task] == depth
            for task in _fed_tasks(bases[key], buckets[key], factor, old_factor)
        )
    }


def _moved_whole(
    chunks: DataFrame, bases: dict[int, int], factor: int, new_keys: list[int]
) -> DataFrame:
    """Chunks of old tasks that all move whole, renamed to their new tasks in Spark's SQL.

    What :class:`_ChunkMover` does for such chunks (new task: the old task's
    base times the factor plus the chunk's number modulo the factor), without
    a Python worker: the bytes are never decoded, so they need not leave the
    JVM (a fresh process would otherwise start its workers for it).
    """
    from pyspark.sql import functions as F

    base_of = F.create_map(*[F.lit(x) for k, b in sorted(bases.items()) for x in (k, b)])
    new_key = F.array(*[F.lit(k) for k in new_keys])
    task = base_of[F.col("routing_key")] * factor + F.pmod(F.col("chunk"), F.lit(factor))
    # Every stored routing key is one of the source plan's tasks; one that is not fails the
    # rescale (as the mover's lookup would) rather than writing a chunk without a task.
    unknown = F.raise_error(
        F.concat(
            F.lit("state of routing key "),
            F.col("routing_key").cast("string"),
            F.lit(", which is no task of the checkpoint's job plan"),
        )
    )
    return chunks.select(
        F.coalesce(F.element_at(new_key, task + 1), unknown).cast("int").alias("routing_key"),
        F.col("chunk").cast("int"),
        F.col("entries").cast("int"),
        F.col("data").cast("binary"),
    )


class _ChunkMover:
    """``mapInPandas`` function: old tasks' chunks as chunks of the new tasks.

    Runs on executors, once per Arrow batch of stored chunks; pickled with
    its small tables (per old task: base and depth; per new task: depth).
    """

    def __init__(
        self,
        bases: dict[int, int],
        depth_of: dict[int, int],
        depths: list[int],
        factor: int,
        new_keys: list[int],
    ) -> None:
        self.bases, self.depth_of, self.depths = bases, depth_of, depths
        self.factor, self.new_keys = factor, new_keys

    def __call__(self, frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        import pandas as pd

        for frame in frames:
            out: dict[str, list[Any]] = {"routing_key": [], "chunk": [], "entries": [], "data": []}
            for key, chunk, entries, data in zip(
                frame["routing_key"], frame["chunk"], frame["entries"], frame["data"], strict=True
            ):
                for task, new_chunk, count, blob in self.moved(int(key), int(chunk), entries, data):
                    out["routing_key"].append(self.new_keys[task])
                    out["chunk"].append(new_chunk)
                    out["entries"].append(count)
                    out["data"].append(blob)
            yield pd.DataFrame(out)

    def moved(
        self, key: int, chunk: int, entries: int, data: bytes
    ) -> Iterator[tuple[int, int, int, bytes]]:
        base, depth = self.bases[key], self.depth_of.get(key, 0)
        if depth >= min_depth(self.factor):
            task = base * self.factor + chunk % self.factor
            if self.depths[task] == depth:
                yield task, chunk, int(entries), bytes(data)  # whole: never decoded
                return
        by_task: dict[int, dict[bytes, Any]] = {}
        for k, entry in decode(bytes(data)).items():
            by_task.setdefault(base * self.factor + entry[0] % self.factor, {})[k] = entry
        for task, part in sorted(by_task.items()):
            for new_chunk, piece in sorted(regroup([part], self.depths[task]).items()):
                yield task, new_chunk, len(piece), encode(piece)


def _chunked_keys(
    spark: SparkSession,
    checkpoints: list[SourceCheckpoint],
    plan: JobPlan,
    state_schema: str,
    wanted: Sequence[int],
) -> tuple[DataFrame, list[int]]:
    """Layout-1 sources' per-key state as chunks of the new tasks (how old checkpoints convert).

    The new tasks' depths follow their key counts (one aggregation first);
    keys are then grouped per (task, chunk) and encoded in a Python worker.
    """
    from pyspark.sql import functions as F

    from spark_elastic.dataplane.buckets import key_slot
    from spark_elastic.dataplane.columns import KafkaColumns
    from spark_elastic.state.processor import OLD_USER_STATE, _as_kind, _kind_of

    factor = plan.elasticity_factor
    new_keys = routing_keys(plan.task_count).tolist()
    fields = spark.createDataFrame([], state_schema).schema.fields
    state_columns = [f"state_{i}" for i in range(len(fields))]
    rows = None
    for source in checkpoints:
        stored = read_state(spark, source.path, OLD_USER_STATE, source.batch.batch_id)
        if stored is None:
            continue
        bases, _ = _old_tasks(source)
        base_of = F.create_map(*[x for k, b in bases.items() for x in (F.lit(k), F.lit(b))])
        slot = key_slot(source.job.hash, KafkaColumns())  # type: ignore[arg-type]
        keyed = stored.select(
            F.col("key.routing_key").alias("old_routing_key"),
            F.col("user_map_key.key").alias("key"),
            F.lit(0).cast("long").alias("offset"),
            *[
                F.col(f"user_map_value.`{f.name}`").alias(c)
                for f, c in zip(fields, state_columns, strict=True)
            ],
        ).withColumn("slot", slot)
        keyed = keyed.withColumn(
            "task", base_of[F.col("old_routing_key")] * factor + F.pmod("slot", F.lit(factor))
        )
        rows = keyed if rows is None else rows.unionByName(keyed)
    if rows is None:
        return _as_seed_rows(_no_chunks(spark)), [min_depth(factor)] * len(new_keys)
    if len(wanted) < plan.task_count:
        rows = rows.filter(F.col("task").isin(list(wanted)))
    rows = rows.localCheckpoint()
    counts = {int(r.task): int(r["count"]) for r in rows.groupBy("task").count().collect()}
    depths = [depth_for(counts.get(t, 0), factor) for t in range(len(new_keys))]
    mask = F.element_at(F.array(*[F.lit((1 << d) - 1) for d in depths]), F.col("task") + 1)
    rows = rows.withColumn("chunk", F.col("slot").bitwiseAND(mask))
    kinds = [_kind_of(f.dataType) for f in fields]

    def encode_group(group: pd.DataFrame) -> pd.DataFrame:
        """Runs on an executor, once per (new task, chunk); pickled with the tables above."""
        import pandas as pd

        entries = {
            bytes(row[0]): (
                int(row[1]),
                tuple(_as_kind(v, kind) for v, kind in zip(row[2:], kinds, strict=True)),
            )
            for row in group[["key", "slot", *state_columns]].itertuples(index=False, name=None)
        }
        first = group.iloc[0]
        return pd.DataFrame(
            {
                "routing_key": [new_keys[int(first["task"])]],
                "chunk": [int(first["chunk"])],
                "entries": [len(entries)],
                "data": [encode(entries)],
            }
        )

    chunks = rows.groupBy("task", "chunk").applyInPandas(encode_group, CHUNK_ROWS)
    return _as_seed_rows(chunks), depths
