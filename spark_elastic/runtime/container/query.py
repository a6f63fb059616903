"""The container's query, on its driver: its SparkSession, its query, its progress.

The session is the container's own Spark application, with the job's code
shipped to Python workers by value. The query subscribes only to its
tasks' partitions, keeps its tasks' records (routing or keyed state), and
writes through ``foreachBatch``, which checks the lease right before the
job's sink is called (a warm-up's batches go to Spark's no-op sink). Each
committed batch's progress becomes a :class:`ProgressReport`
(:func:`build_report`); a stop that hangs past its limit exits 1.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from spark_elastic.errors import InputError, ProtocolError
from spark_elastic.runtime.container.class_archive import with_class_archive
from spark_elastic.runtime.container.compiler import with_compiler
from spark_elastic.runtime.container.console import EXIT_FENCED, _log
from spark_elastic.runtime.container.scratch import with_scratch
from spark_elastic.runtime.container.settings import ContainerSettings
from spark_elastic.runtime.job import Job
from spark_elastic.runtime.lease import RESTART_TOLERANCE_S, ContainerLease
from spark_elastic.runtime.protocol import ContainerModel, ProgressReport, TaskProgress
from spark_elastic.runtime.sinks import TRANSACTIONAL, BatchContext, sink_guarantee

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from spark_elastic.model.plan import JobPlan
    from spark_elastic.state.checkpoint_dir import Fence

__all__ = ["build_report", "covers", "needed_partitions", "progress_since"]

READ_METRIC = "spark_elastic_read"
OWN_METRIC = "spark_elastic_own"


def _session(job: Job, settings: ContainerSettings, app_name: str) -> SparkSession:
    """The container's own SparkSession (its own Spark application), local or on a cluster."""
    from spark_elastic.dataplane.session import _DEFAULT_CONF, find_java
    from spark_elastic.dataplane.spark_home import launching, own_spark_home

    java = find_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    conf = {**_DEFAULT_CONF, **dict(job.spark_conf), **settings.spark_conf}
    home = own_spark_home(settings.master, conf)
    conf = with_class_archive(with_compiler(conf), java, home)
    # Its temporary files where a later container sweeps them if this one is killed.
    conf = with_scratch(conf, settings.container_id)
    builder = SparkSession.builder.master(settings.master).appName(app_name)
    for key, value in conf.items():
        builder = builder.config(key, value)
    with launching(home):
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _factor_of(mine: ContainerModel, job: Job) -> int:
    """The factor this container's tasks are at: the job's, or a live change's new one."""
    from spark_elastic.model.names import TaskName

    factors = {TaskName.parse(t).elasticity_factor for t in mine.tasks}
    if not factors:
        return job.elasticity_factor
    if len(factors) > 1:
        raise ProtocolError(
            f"job model: container {mine.container_id!r} has tasks at factors {sorted(factors)}"
        )
    return factors.pop()


def _job_session(job: Job, module: Any, settings: ContainerSettings) -> SparkSession:
    """The container's session, with the job's code shipped to Python workers by value."""
    spark = _session(job, settings, f"spark-elastic {job.name} {settings.container_id}")
    from pyspark import cloudpickle

    # The job's functions and classes travel to Spark's Python workers by value, so the
    # workers need not import the job file (it may not be on their path, e.g. on a cluster).
    cloudpickle.register_pickle_by_value(module)
    return spark


def needed_partitions(plan: JobPlan, tasks: tuple[str, ...]) -> dict[str, list[int]]:
    """``{topic: partitions}`` the given tasks read: all a container's query subscribes to.

    Parameters
    ----------
    plan
        The job's plan.
    tasks
        Task names of the plan.

    Returns
    -------
    dict[str, list[int]]
        Sorted partitions per topic.
    """
    ids = {name: i for i, name in enumerate(plan.task_names())}
    unknown = [t for t in tasks if t not in ids]
    if unknown:
        raise ProtocolError(f"job model: task {unknown[0]!r} is not in the job's plan")
    needed: dict[str, set[int]] = {}
    for name in tasks:
        for ssp in plan.task(ids[name]).partitions:
            needed.setdefault(ssp.stream, set()).add(ssp.partition)
    return {topic: sorted(parts) for topic, parts in sorted(needed.items())}


def covers(
    plan: JobPlan,
    tasks: Sequence[str],
    offsets: Mapping[str, Mapping[str, int]],
    held: Mapping[str, Mapping[tuple[str, int], int]] | None = None,
) -> tuple[Fence, ...]:
    """What a batch's output covers: each task's key bucket up to the batch's end offsets.

    A job that holds records back (``max_task_idle_ms``, bootstrap streams)
    passes ``held``: each task that ran a step in the batch, with where its
    held records of each partition start. Its output covers only what it
    released: up to those offsets where it holds records, to the end
    offsets where it holds none. A task not in ``held`` released nothing in
    the batch and is left out, so what an earlier batch said of it stands.

    Parameters
    ----------
    plan
        The job's plan at the tasks' factor.
    tasks
        The container's tasks.
    offsets
        The batch's end offsets, ``{"topic": {"partition": next offset}}``.
    held
        ``{task name: {(stream, partition): first held offset}}``, or None for
        a job that never holds records back.

    Returns
    -------
    tuple
        ``((stream, partition, key_bucket, factor), next_offset)`` per task and
        partition it reads that the offsets name, sorted.
    """
    from spark_elastic.model.names import TaskName

    ids = {name: i for i, name in enumerate(plan.task_names())}
    out = set()
    for name in tasks:
        if held is not None and name not in held:
            continue
        starts = {} if held is None else held[name]
        bucket = TaskName.parse(name).key_bucket
        for ssp in plan.task(ids[name]).partitions:
            end = offsets.get(ssp.stream, {}).get(str(ssp.partition))
            if end is not None:
                key = (ssp.stream, ssp.partition, bucket, plan.elasticity_factor)
                out.add((key, min(int(end), starts.get((ssp.stream, ssp.partition), int(end)))))
    return tuple(sorted(out))


def _output(
    spark: SparkSession,
    job: Job,
    plan: JobPlan,
    mine: ContainerModel,
    starts: Mapping[str, Mapping[str, int]] | None = None,
    gate: str | None = None,
    quiet: Sequence[Fence] = (),
) -> DataFrame:
    """The container's streaming output over its tasks (driver, once per query).

    ``quiet``: a stateless job's records whose output an earlier owner
    published (a transactional sink's :meth:`~spark_elastic.runtime.sinks.Sink.published`);
    they are counted as processed and given to no transform.
    """
    from pyspark.sql import functions as F

    # The embedded log's source and Spark's kafka source get the same options.
    reader = job.input.stream_reader(spark, needed_partitions(plan, mine.tasks))
    if starts is not None:  # a fresh checkpoint: where the predecessors stopped
        reader = reader.option("startingOffsets", json.dumps(starts))
    if gate is not None:  # a replaying warm-up: no further than the old owners committed
        reader = reader.option("gate", gate)
    records = reader.load().observe(READ_METRIC, F.count(F.lit(1)).alias("read"))
    # A stateless job's transform sees one partition per task; a stateful query's state
    # partitions are set for it at start (state.query_settings), whatever this says.
    spark.conf.set("spark.sql.shuffle.partitions", str(plan.task_count))
    if job.processor is not None:
        from spark_elastic.state.processor import with_task_state

        output = records.transform(
            with_task_state(
                job.processor,
                job=job.name,
                checkpoint_location=mine.checkpoint,
                plan=plan,
                tasks=mine.tasks,
                hash=job.hash,  # type: ignore[arg-type]
                order=job.order,
                max_task_idle_ms=job.max_task_idle_ms,
                bootstrap=job.bootstrap,
                _marks=job.holds_back,
            )
        )
    else:
        from spark_elastic.dataplane.transforms import VirtualTaskRouting, with_virtual_tasks

        assert job.transform is not None  # noqa: S101 - Job guarantees exactly one of the two
        routed = records.transform(
            with_virtual_tasks(plan=plan, hash=job.hash, route=False)  # type: ignore[arg-type]
        ).filter(F.col("virtual_task").isin(list(mine.tasks)))
        routed = routed.observe(OWN_METRIC, F.count(F.lit(1)).alias("own"))
        if quiet:
            routed = routed.filter(~_below(quiet, job.hash))
        output = job.transform(
            routed.repartition(VirtualTaskRouting.of(plan).task_count, "routing_key")
        )
    return output


def _below(fences: Sequence[Fence], hash: str) -> Any:
    """A Column: is the row below its key bucket's fence (its output published already)?"""
    from pyspark.sql import functions as F

    from spark_elastic.dataplane.buckets import key_slot

    slot = key_slot(hash)  # type: ignore[arg-type]
    below = F.lit(False)
    for (stream, partition, bucket, factor), offset in fences:
        below = below | (
            (F.col("topic") == stream)
            & (F.col("partition") == partition)
            & (slot % factor == bucket)
            & (F.col("offset") < offset)
        )
    return below


def _start_query(
    spark: SparkSession,
    job: Job,
    plan: JobPlan,
    mine: ContainerModel,
    lease: ContainerLease,
    settings: ContainerSettings,
    starts: Mapping[str, Mapping[str, int]] | None = None,
    gate: str | None = None,
    live: threading.Event | None = None,
    quiet: Sequence[Fence] = (),
) -> StreamingQuery:
    """Build and start the container's query. Runs on the driver, once per container.

    A replaying warm-up passes its ``gate`` file and a ``live`` event that
    is set once it owns its tasks: until then every batch is computed (its
    state must advance) into Spark's no-op sink, not the job's. A stateless
    query leaves out the ``quiet`` records (see :func:`_output`).
    """
    from spark_elastic.state.checkpoint_dir import batch_offsets

    output = _output(spark, job, plan, mine, starts, gate, quiet)
    sink, container_id, generation = job.sink, mine.container_id, mine.generation
    transactional = sink_guarantee(sink) == TRANSACTIONAL
    # A write waits for a renewal through a coordinator restart (its lease lapsed meanwhile).
    wait_s = max(settings.shutdown_s, RESTART_TOLERANCE_S + settings.heartbeat_s * 2)

    def write_batch(batch: DataFrame, batch_id: int) -> None:
        # Runs on the container's driver (a py4j callback), once per micro-batch, before Spark
        # commits it: a refused write fails the batch, so it never commits.
        if not job.holds_back:
            publish(batch, batch_id, None)
            return
        # The batch holds each task step's mark beside the output: computed once (a second
        # run of the processor could release other records), read, then the rows published.
        from pyspark.sql import functions as F

        from spark_elastic.state.holdback import final_marks
        from spark_elastic.state.processor import MARK_COLUMNS

        kind, task, starts = MARK_COLUMNS
        batch.persist()
        try:
            marks = batch.filter(F.col(kind) == "metrics").select(task, starts).collect()
            names = plan.task_names()
            held = {
                names[task_id]: offsets
                for task_id, offsets in final_marks([(int(r[0]), str(r[1])) for r in marks]).items()
            }
            publish(batch.filter(F.col(kind) == "row").drop(*MARK_COLUMNS), batch_id, held)
        finally:
            batch.unpersist()

    def publish(
        batch: DataFrame, batch_id: int, held: Mapping[str, Mapping[tuple[str, int], int]] | None
    ) -> None:
        # A lapsed lease (coordinator unreachable) pauses the write until it is renewed.
        if live is not None and not live.is_set():
            # A warm-up's batch: every record is below its fence, so there is no output
            # to publish, and nothing is published (no lease needed).
            batch.write.format("noop").mode("append").save()
            return
        what = f"batch {batch_id}"
        lease.await_write(what, wait_s)

        def fence() -> None:
            lease.await_write(what, wait_s)

        # Spark wrote the batch's end offsets before running it: what its output covers.
        covered = (
            covers(plan, mine.tasks, batch_offsets(mine.checkpoint, batch_id), held)
            if transactional
            else ()
        )
        context = BatchContext(
            batch_id, container_id, generation, fence, covered, job.name, mine.tasks
        )
        sink.write(batch, context)

    return (
        output.writeStream.foreachBatch(write_batch)
        .option("checkpointLocation", mine.checkpoint)
        .queryName(f"{job.name}-{container_id}")
        .trigger(processingTime=job.trigger_interval)
        .start()
    )


def _progress_json(progress: Any) -> dict[str, Any]:
    if progress is None:
        return {}
    text = getattr(progress, "json", None)
    if isinstance(text, str):
        loaded: dict[str, Any] = json.loads(text)
        return loaded
    return dict(progress)


def progress_since(query: StreamingQuery, since: str) -> list[dict[str, Any]]:
    """The query's progress with a trigger timestamp after ``since``, oldest first.

    Runs on the container's driver, every poll of its supervising loop (a
    few times a second). ``query.recentProgress`` renders each of the up
    to 100 progresses it keeps as JSON in the JVM and parses it in Python,
    on every call: 52 ms a call with 60 kept (21 ms of it in Python), a
    third of a core per container at five polls a second. Spark keeps them
    in trigger order, so this walks back from the newest through py4j and
    renders only those not seen: a few cheap calls when nothing is new.
    ``since`` is a trigger timestamp (ISO 8601: they order as strings).
    """
    jquery = getattr(query, "_jsq", None)
    if jquery is None:  # not a classic query (Spark Connect): no JVM handle to walk
        every = map(_progress_json, query.recentProgress)
        return [p for p in every if p.get("timestamp", "") > since]
    kept = jquery.recentProgress()
    fresh: list[dict[str, Any]] = []
    for index in range(len(kept) - 1, -1, -1):
        progress = kept[index]
        if str(progress.timestamp()) <= since:
            break
        fresh.append(json.loads(progress.json()))
    return fresh[::-1]


def _offsets_of(progress: Mapping[str, Any]) -> dict[str, dict[int, int]]:
    offsets: dict[str, dict[int, int]] = {}
    for source in progress.get("sources", []):
        end = source.get("endOffset")
        if isinstance(end, str):
            end = json.loads(end)
        for topic, partitions in (end or {}).items():
            for partition, offset in partitions.items():
                offsets.setdefault(topic, {})[int(partition)] = int(offset)
    return offsets


def _metric(progress: Mapping[str, Any], name: str, field: str) -> int:
    value = progress.get("observedMetrics", {}).get(name, {})
    return int(value.get(field, 0)) if isinstance(value, Mapping) else 0


def build_report(
    job: Job, plan: JobPlan, mine: ContainerModel, progress: Mapping[str, Any]
) -> ProgressReport:
    """The progress report for one committed batch (driver, once per batch).

    Parameters
    ----------
    job, plan, mine
        The job, its plan and this container's share of the model.
    progress
        The query's last progress, as JSON.

    Returns
    -------
    ProgressReport
        Committed offsets and lag per task, and records read against processed.
    """
    offsets = _offsets_of(progress)
    try:
        ends: dict[str, dict[int, int]] | None = {
            topic: dict(job.input.end_offsets(topic)) for topic in offsets
        }
    except InputError as exc:
        # A broker away for a while: the commit is reported all the same (the coordinator
        # needs it for moves and growth), its lag as unknown.
        _log(f"lag of batch {progress.get('batchId')} unknown: {exc}")
        ends = None
    ids = {name: i for i, name in enumerate(plan.task_names())}
    tasks = []
    for name in mine.tasks:
        own: dict[str, dict[int, int]] = {}
        lag = 0
        for ssp in plan.task(ids[name]).partitions:
            committed = offsets.get(ssp.stream, {}).get(ssp.partition, 0)
            own.setdefault(ssp.stream, {})[ssp.partition] = committed
            end = (ends or {}).get(ssp.stream, {})
            lag += max(int(end[ssp.partition]) - committed, 0) if ssp.partition in end else 0
        tasks.append(TaskProgress(name, own, lag if ends is not None else -1))
    read = _metric(progress, READ_METRIC, "read")
    enforced = 0
    if job.processor is not None:
        enforced = _metric(progress, "spark_elastic", "records_enforced")
        processed = _metric(progress, "spark_elastic", "records_processed") + _metric(
            progress, "spark_elastic", "records_skipped"
        )
    else:
        processed = _metric(progress, OWN_METRIC, "own")
    return ProgressReport(
        mine.container_id,
        mine.generation,
        int(progress.get("batchId", 0)),
        read,
        processed,
        tuple(tasks),
        enforced,
        _duration_ms(progress),
    )


def _duration_ms(progress: Mapping[str, Any]) -> int:
    """The batch's time from its trigger to its commit, or -1 when Spark did not say."""
    value = progress.get("durationMs", {})
    took = value.get("triggerExecution") if isinstance(value, Mapping) else None
    return int(took) if isinstance(took, int | float) and took >= 0 else -1


def _stop_within(query: StreamingQuery, limit_s: float) -> None:
    """Stop the query gracefully; if that hangs past ``limit_s``, exit 1 at once (Samza)."""

    def force() -> None:
        _log(f"graceful stop took over {limit_s:.0f} s; forcing exit(1)")
        os._exit(EXIT_FENCED)

    watchdog = threading.Timer(limit_s, force)
    watchdog.daemon = True
    watchdog.start()
    try:
        query.stop()
    except Exception as exc:  # stopping a failed query may raise its error again
        _log(f"stop: {type(exc).__name__}: {exc}")
    finally:
        watchdog.cancel()
