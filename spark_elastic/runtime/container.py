"""A container: one process, one SparkSession, one streaming query over the tasks it is given.

What the coordinator launches (``spark-elastic container run``), configured by
environment variables (SAMZA-871 names the first):

=================================  ================================================
``EXECUTION_ENV_CONTAINER_ID``     the id the coordinator issued; required
``SPARK_ELASTIC_COORDINATOR_URL``  ``http://127.0.0.1:PORT``; required
``SPARK_ELASTIC_JOB``              ``module:attribute`` or ``file.py:attribute``; required
``SPARK_ELASTIC_MASTER``           Spark master URL (default ``local[2]``)
``SPARK_ELASTIC_CONF``             JSON object of extra Spark settings, over the job's
``SPARK_ELASTIC_HEARTBEAT_MS``     heartbeat interval (default 1000; first one at once)
``SPARK_ELASTIC_HEARTBEAT_RETRIES`` failed heartbeats in a row before giving up (6)
``SPARK_ELASTIC_HEARTBEAT_TIMEOUT_MS`` one request's time limit (twice the interval,
                                   1 to 5 s)
``SPARK_ELASTIC_SHUTDOWN_MS``      graceful-stop limit before a forced ``exit(1)`` (30000)
``SPARK_ELASTIC_WRITE_BUDGET_MS``  lease that must remain to start a write (3000)
``SPARK_ELASTIC_TOKEN``            bearer token, when the coordinator requires one
``SPARK_ELASTIC_FOLLOW_MS``        a stateful warm-up's shortest interval between
                                   snapshots of its old owners' state (10000)
``SPARK_ELASTIC_WARMUP``           how a stateful warm-up follows its old owners:
                                   ``replay`` (default, on the embedded log) or
                                   ``snapshot``
``SPARK_ELASTIC_ACCEPTABLE_LAG``   records a replaying warm-up may still have to
                                   apply when it says it is ready (10000, KIP-441's
                                   ``acceptable.recovery.lag``)
=================================  ================================================

Its life: register (which grants the first lease), fetch the job model, fork
its checkpoint generation from the previous owner's committed prefix if the
model says so (:mod:`.generations`), or, taking tasks from several owners or
some of one owner's, rescale their committed checkpoints to its share
(:func:`~spark_elastic.rescale` with ``tasks``), start the query, then heartbeat on a
thread while the main thread reports each committed batch. The query writes
through ``foreachBatch``, which checks the lease right before the job's sink
is called, and the sink checks it again right before it publishes. With the
lease lapsed (by the container's own clock, even with the coordinator
unreachable) the write waits for a renewal; a revoked lease, or no renewal
within the stop limit, fails the batch before anything is published, so the
batch never commits. ``{"alive": false}``, or failed heartbeats (Samza's
retries, with the lease over for another lease's length), stop the query
and exit 1; SIGTERM stops it at a batch boundary (the batch in flight
commits first, while the lease lasts) and exits 0; a stop that hangs past
the limit is cut short by ``os._exit(1)``, as Samza does.

A container the job model lists as a *warm-up* (KIP-441) first starts its
Spark application and Python workers; a stateful one then follows its old
owners' committed state (:mod:`.follow`). On the embedded log it *replays*:
it takes a snapshot of its tasks' keys as its own checkpoint and starts
its query there, reading up to where the old owners committed (the
source's ``gate``) and applying those records to its state without output
(the checkpoint's output fences); it registers (that says it is ready) once
it has caught up, and keeps following. When the coordinator hands it its
tasks (their old owners stopped), it takes their final offsets as its
fences and lifts the gate: the query it has been running publishes from
there. Otherwise (a Kafka input, or ``SPARK_ELASTIC_WARMUP=snapshot``) it
renews a snapshot while it waits, registers after the first, and at the
handover takes the snapshot as its checkpoint when the old owners committed
nothing since (else rescales their checkpoints again) and starts its query.
Removed from the model meanwhile, a warm-up exits 0.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_elastic.errors import ArgumentError, ProtocolError
from spark_elastic.log.gate import read_gate, write_gate
from spark_elastic.runtime.follow import (
    adopt_snapshot,
    drop_snapshot,
    follow,
    gate_for,
    highest,
    holder_checkpoints,
    holders_idle,
    holders_stopping,
    read_all_it_could,
    source_fences,
    take_snapshot,
)
from spark_elastic.runtime.generations import fork_committed
from spark_elastic.runtime.growth import grown_plan
from spark_elastic.runtime.job import BatchContext, Job, LogInput, load_job_and_module
from spark_elastic.runtime.lease import (
    RESTART_TOLERANCE_S,
    ContainerLease,
    LeaseTerms,
    gives_up,
)
from spark_elastic.runtime.protocol import (
    CONTAINER_ID_ENV,
    COORDINATOR_URL_ENV,
    JOB_ENV,
    ContainerModel,
    FailureReport,
    HeartbeatReply,
    JobModel,
    ProgressReport,
    Registration,
    TaskProgress,
    validate_container_id,
)
from spark_elastic.state.checkpoint_dir import (
    Fence,
    elastic_dir,
    fences_path,
    read_fences,
    write_fences,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

    import pandas as pd
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from spark_elastic.model.plan import JobPlan

__all__ = ["ContainerSettings", "CoordinatorClient", "run_container"]

EXIT_OK = 0
EXIT_FENCED = 1
READ_METRIC = "spark_elastic_read"
OWN_METRIC = "spark_elastic_own"


def first_line(error: BaseException | str) -> str:
    """An error in one line, as the coordinator shows it: ``Type: first line of message``.

    Parameters
    ----------
    error
        An exception, or a line already.

    Returns
    -------
    str
        At most :attr:`FailureReport.MAX_ERROR` characters.
    """
    if isinstance(error, str):
        text = error
    else:
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        text = f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    text = " ".join(text.split()) or "unknown error"
    return text[: FailureReport.MAX_ERROR]


def _log(message: str) -> None:
    # Wall-clock times to the millisecond: a move's timeline reads across several logs.
    now = time.time()
    stamp = time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d}"
    print(f"spark-elastic container {stamp}: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class ContainerSettings:
    """A container's configuration, normally from its environment (:meth:`from_env`).

    Attributes
    ----------
    container_id
        The id the coordinator issued.
    coordinator_url
        The coordinator's base URL.
    job
        The job spec, ``module:attribute`` or ``file.py:attribute``.
    master
        The Spark master URL.
    heartbeat_s
        Interval between heartbeats.
    heartbeat_retries
        Failed heartbeats in a row tolerated before the container gives up.
    heartbeat_timeout_s
        Time limit of one request to the coordinator; ``None`` for twice the
        interval, kept within 1 to 5 s (a frozen coordinator accepts
        connections but never answers, and a short limit keeps Samza's retries
        close to their interval).
    shutdown_s
        How long a graceful stop may take before a forced exit.
    write_budget_s
        Lease that must remain to start a write.
    token
        Bearer token for the coordinator, if it requires one.
    follow_s
        A stateful warm-up's shortest interval between two snapshots of its
        old owners' committed state.
    warmup
        How a stateful warm-up follows its old owners: ``"replay"`` (their
        records, from a snapshot, where the input has a gate) or
        ``"snapshot"`` (snapshots only).
    acceptable_lag
        Records a replaying warm-up may still have to apply when it registers
        as ready.
    spark_conf
        Extra Spark settings for this container's session (over the job's).
    """

    container_id: str
    coordinator_url: str
    job: str
    master: str = "local[2]"
    heartbeat_s: float = 1.0
    heartbeat_retries: int = 6
    heartbeat_timeout_s: float | None = None
    shutdown_s: float = 30.0
    write_budget_s: float = 3.0
    token: str | None = None
    follow_s: float = 10.0
    warmup: str = "replay"
    acceptable_lag: int = 10_000
    spark_conf: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ContainerSettings:
        """Read the settings from environment variables (see the module docstring).

        Parameters
        ----------
        env
            The environment (default ``os.environ``).

        Returns
        -------
        ContainerSettings
            The settings.

        Raises
        ------
        ArgumentError
            A required variable is missing or a value is malformed; one line naming it.
        """
        env = os.environ if env is None else env
        missing = [v for v in (CONTAINER_ID_ENV, COORDINATOR_URL_ENV, JOB_ENV) if not env.get(v)]
        if missing:
            raise ArgumentError(
                f"{missing[0]}: expected the environment variable to be set (the coordinator "
                "sets it when it launches a container), found it unset"
            )
        try:
            container_id = validate_container_id(env[CONTAINER_ID_ENV], CONTAINER_ID_ENV)
        except ProtocolError as exc:
            raise ArgumentError(str(exc)) from None
        url = env[COORDINATOR_URL_ENV].rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise ArgumentError.invalid(COORDINATOR_URL_ENV, "an http:// or https:// URL", url)
        return cls(
            container_id=container_id,
            coordinator_url=url,
            job=env[JOB_ENV],
            master=env.get("SPARK_ELASTIC_MASTER") or "local[2]",
            heartbeat_s=_millis(env, "SPARK_ELASTIC_HEARTBEAT_MS", 1000) / 1000,
            heartbeat_retries=int(_millis(env, "SPARK_ELASTIC_HEARTBEAT_RETRIES", 6)),
            heartbeat_timeout_s=_timeout(env),
            shutdown_s=_millis(env, "SPARK_ELASTIC_SHUTDOWN_MS", 30_000) / 1000,
            write_budget_s=_millis(env, "SPARK_ELASTIC_WRITE_BUDGET_MS", 3000) / 1000,
            token=env.get("SPARK_ELASTIC_TOKEN") or None,
            follow_s=_millis(env, "SPARK_ELASTIC_FOLLOW_MS", 10_000) / 1000,
            warmup=_choice(env, "SPARK_ELASTIC_WARMUP", ("replay", "snapshot")),
            acceptable_lag=int(_millis(env, "SPARK_ELASTIC_ACCEPTABLE_LAG", 10_000)),
            spark_conf=_conf(env.get("SPARK_ELASTIC_CONF") or "{}"),
        )


def _conf(text: str) -> dict[str, str]:
    try:
        conf = json.loads(text)
    except ValueError:
        conf = None
    if not isinstance(conf, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in conf.items()
    ):
        raise ArgumentError.invalid(
            "SPARK_ELASTIC_CONF", 'a JSON object of strings, e.g. {"spark.cores.max": "1"}', text
        )
    return conf


def _choice(env: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str:
    text = env.get(name) or choices[0]
    if text not in choices:
        raise ArgumentError.invalid(name, f"one of {', '.join(choices)}", text)
    return text


def _timeout(env: Mapping[str, str]) -> float | None:
    name = "SPARK_ELASTIC_HEARTBEAT_TIMEOUT_MS"
    if not env.get(name):
        return None
    millis = _millis(env, name, 0)
    if millis < 1:
        raise ArgumentError.invalid(name, "a whole number of milliseconds >= 1", env[name])
    return millis / 1000


def _millis(env: Mapping[str, str], name: str, default: int) -> float:
    text = env.get(name)
    if text is None or text == "":
        return float(default)
    if not (text.isascii() and text.isdigit()):
        raise ArgumentError.invalid(name, "a non-negative whole number", text)
    return float(int(text))


class CoordinatorClient:
    """The container's side of the coordinator's HTTP API (stdlib ``urllib``; one call at a time).

    Parameters
    ----------
    url
        The coordinator's base URL.
    token
        Bearer token, if the coordinator requires one.
    timeout_s
        Per-request timeout.
    """

    def __init__(self, url: str, token: str | None = None, timeout_s: float = 5.0) -> None:
        self._url = url.rstrip("/")
        self._token = token
        self._timeout = timeout_s

    def _call(self, path: str, body: Mapping[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self._url + path, data=data)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self._token:
            request.add_header("Authorization", f"Bearer {self._token}")
        with urllib.request.urlopen(request, timeout=self._timeout) as response:
            return json.loads(response.read())

    def heartbeat(
        self, container_id: str, caught_up: bool = False, stopped: bool = False
    ) -> HeartbeatReply:
        """``GET /containerHeartbeat?executionContainerId=ID``.

        Parameters
        ----------
        container_id
            This container's id.
        caught_up
            A warm-up whose old owners are stopping says it has caught up
            with them (``&caughtUp=true``).
        stopped
            A container asked to stop says its query has stopped: it writes
            nothing any more, though its process is still on its way out
            (``&stopped=true``).

        Returns
        -------
        HeartbeatReply
            Whether the coordinator considers the container alive, and its lease.
        """
        params = {"executionContainerId": container_id}
        if caught_up:
            params["caughtUp"] = "true"
        if stopped:
            params["stopped"] = "true"
        query = urllib.parse.urlencode(params)
        return HeartbeatReply.from_json(self._call(f"/containerHeartbeat?{query}"))

    def register(self, registration: Registration) -> HeartbeatReply:
        """``POST /containers/register``.

        Parameters
        ----------
        registration
            This container's id and process.

        Returns
        -------
        HeartbeatReply
            The first lease, or ``alive: false`` for an id the coordinator did not issue.
        """
        return HeartbeatReply.from_json(self._call("/containers/register", registration.to_json()))

    def progress(self, report: ProgressReport) -> HeartbeatReply:
        """``POST /containers/progress``.

        Parameters
        ----------
        report
            The last committed batch and per-task positions.

        Returns
        -------
        HeartbeatReply
            As for a heartbeat (a report renews the lease too).
        """
        return HeartbeatReply.from_json(self._call("/containers/progress", report.to_json()))

    def report_failure(self, container_id: str, error: BaseException | str) -> None:
        """``POST /containers/failure``: why this container fails, before it exits.

        Best effort: a coordinator out of reach learns of it from the lease.

        Parameters
        ----------
        container_id
            This container's id.
        error
            The exception (its type and first line are sent) or a line.
        """
        report = FailureReport(container_id, first_line(error))
        with contextlib.suppress(OSError, ValueError, ProtocolError):
            self._call("/containers/failure", report.to_json())

    def job_model(self) -> JobModel:
        """``GET /jobModel``.

        Returns
        -------
        JobModel
            The current job model.
        """
        return JobModel.from_json(self._call("/jobModel"))


class _Heartbeats(threading.Thread):
    """Samza's heartbeat loop, plus lease renewal: runs until told to stop or the container dies."""

    def __init__(
        self,
        client: CoordinatorClient,
        settings: ContainerSettings,
        lease: ContainerLease,
        on_dead: threading.Event,
    ) -> None:
        super().__init__(name="spark-elastic-heartbeat", daemon=True)
        self._client = client
        self._settings = settings
        self._lease = lease
        self._dead = on_dead
        self.stopping = threading.Event()
        self.model_version = 0
        self.lease_s = 0.0

    def run(self) -> None:
        failures = 0
        while not self.stopping.is_set():
            sent = time.monotonic()
            try:
                reply = self._client.heartbeat(self._settings.container_id)
            except (OSError, ValueError, ProtocolError) as exc:
                failures += 1
                # Samza gives up after its retries; we also wait a while past the lease's end,
                # so a coordinator restart of up to RESTART_TOLERANCE_S stops nothing.
                if gives_up(
                    failures,
                    self._settings.heartbeat_retries,
                    self._lease.remaining(),
                    self.lease_s,
                ):
                    _log(f"coordinator unreachable after {failures} heartbeats ({exc}); stopping")
                    self._dead.set()
                    return
                # Backoff, capped at the interval: the lease keeps running meanwhile.
                self.stopping.wait(min(self._settings.heartbeat_s, 0.1 * 2**failures))
                continue
            failures = 0
            if not reply.alive:
                _log("the coordinator says this container is no longer valid; stopping")
                self._lease.revoke()
                self._dead.set()
                return
            self._lease.renew(sent, reply.lease_ms)
            self.lease_s = reply.lease_ms / 1000
            self.model_version = max(self.model_version, reply.job_model_version)
            self.stopping.wait(self._settings.heartbeat_s)


def _session(job: Job, settings: ContainerSettings, app_name: str) -> SparkSession:
    """The container's own SparkSession (its own Spark application), local or on a cluster."""
    from spark_elastic.dataplane.session import _DEFAULT_CONF, find_java

    find_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(settings.master).appName(app_name)
    for key, value in {**_DEFAULT_CONF, **dict(job.spark_conf), **settings.spark_conf}.items():
        builder = builder.config(key, value)
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


def _output(
    spark: SparkSession,
    job: Job,
    plan: JobPlan,
    mine: ContainerModel,
    starts: Mapping[str, Mapping[str, int]] | None = None,
    gate: str | None = None,
) -> DataFrame:
    """The container's streaming output over its tasks (driver, once per query)."""
    from pyspark.sql import functions as F

    # The embedded log's source and Spark's kafka source get the same options.
    reader = job.input.stream_reader(spark, needed_partitions(plan, mine.tasks))
    if starts is not None:  # a fresh checkpoint: where the predecessors stopped
        reader = reader.option("startingOffsets", json.dumps(starts))
    if gate is not None:  # a replaying warm-up: no further than the old owners committed
        reader = reader.option("gate", gate)
    records = reader.load().observe(READ_METRIC, F.count(F.lit(1)).alias("read"))
    # Spark pins the state partition count in the checkpoint at the first start; one per task.
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
            )
        )
    else:
        from spark_elastic.dataplane.transforms import VirtualTaskRouting, with_virtual_tasks

        assert job.transform is not None  # noqa: S101 - Job guarantees exactly one of the two
        routed = records.transform(
            with_virtual_tasks(plan=plan, hash=job.hash, route=False)  # type: ignore[arg-type]
        ).filter(F.col("virtual_task").isin(list(mine.tasks)))
        routed = routed.observe(OWN_METRIC, F.count(F.lit(1)).alias("own")).repartition(
            VirtualTaskRouting.of(plan).task_count, "routing_key"
        )
        output = job.transform(routed)
    return output


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
) -> StreamingQuery:
    """Build and start the container's query. Runs on the driver, once per container.

    A replaying warm-up passes its ``gate`` file and a ``live`` event that
    is set once it owns its tasks: until then every batch is computed (its
    state must advance) into Spark's no-op sink, not the job's.
    """
    output = _output(spark, job, plan, mine, starts, gate)
    sink, container_id, generation = job.sink, mine.container_id, mine.generation
    # A write waits for a renewal through a coordinator restart (its lease lapsed meanwhile).
    wait_s = max(settings.shutdown_s, RESTART_TOLERANCE_S + settings.heartbeat_s * 2)

    def write_batch(batch: DataFrame, batch_id: int) -> None:
        # Runs on the container's driver (a py4j callback), once per micro-batch, before Spark
        # commits it: a refused write fails the batch, so it never commits.
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

        sink.write(batch, BatchContext(batch_id, container_id, generation, fence))

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
    ends = {topic: job.input.end_offsets(topic) for topic in offsets}
    ids = {name: i for i, name in enumerate(plan.task_names())}
    tasks = []
    for name in mine.tasks:
        own: dict[str, dict[int, int]] = {}
        lag = 0
        for ssp in plan.task(ids[name]).partitions:
            committed = offsets.get(ssp.stream, {}).get(ssp.partition, 0)
            own.setdefault(ssp.stream, {})[ssp.partition] = committed
            end = ends.get(ssp.stream, {})
            lag += max(int(end[ssp.partition]) - committed, 0) if ssp.partition in end else 0
        tasks.append(TaskProgress(name, own, lag))
    read = _metric(progress, READ_METRIC, "read")
    if job.processor is not None:
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
    )


def _prepare_checkpoint(
    mine: ContainerModel, plan: JobPlan, stateful: bool, spark: SparkSession
) -> dict[str, dict[str, int]] | None:
    """Set up this generation from its predecessors, once; the starting offsets, if any.

    Runs on the driver, once per container, before its query starts.

    A stateful generation that takes exactly its one predecessor's tasks
    forks its committed prefix (keyed state and bucket checkpoints included).
    One that takes tasks from several predecessors, or some of one's, forks
    each one's committed prefix privately (hard links: they may be shared
    with another successor) and rescales them to its share of the tasks.
    A stateless one starts a fresh checkpoint where its predecessors stopped:
    for each partition its tasks read, the lowest offset any of them
    committed (two predecessors may have read one partition for different
    tasks; output is at-least-once), and the earliest offset for a partition
    none of them read (a new one, after growth).
    """
    target = Path(mine.checkpoint)
    if target.exists() or not mine.sources:
        return _rescaled_starts(target, plan, mine) if stateful else None
    if not stateful:
        from spark_elastic.state.checkpoint_dir import last_batch

        batches = [b for b in map(last_batch, mine.sources) if b is not None]
        starts: dict[str, dict[str, int]] = {}
        for topic, partitions in needed_partitions(plan, mine.tasks).items():
            for partition in partitions:
                seen = [
                    int(b.offsets[topic][str(partition)])
                    for b in batches
                    if str(partition) in b.offsets.get(topic, {})
                ]
                starts.setdefault(topic, {})[str(partition)] = min(seen) if seen else -2
        _log(f"starting from the offsets {len(mine.sources)} predecessors committed: {starts}")
        return starts
    if len(mine.sources) == 1 and _runs_exactly(mine.sources[0], plan, mine.tasks):
        result = fork_committed(mine.sources[0], target)
        _log(
            f"forked {mine.sources[0]} at batch {result.last_committed} into {target} "
            f"({result.files} files, {result.bytes} bytes)"
        )
        return _rescaled_starts(target, plan, mine)
    snapshot = take_snapshot(target, mine.sources)
    if snapshot is not None:
        _log(
            f"took over {len(mine.tasks)} tasks from the state it followed ({snapshot.keys} keys "
            f"as of batches {dict(snapshot.sources)}): nothing committed since"
        )
    else:
        _take_over(mine, plan, spark)
    # A source that replayed an earlier owner and had not passed its fences yet: what is
    # below them was published by that owner, so it stays quiet here too (a fork copies
    # the file; a rescale does not).
    carried = sorted({f for source in mine.sources for f in read_fences(fences_path(source))})
    if carried:
        write_fences(target, carried)
    return _rescaled_starts(target, plan, mine)


def _runs_exactly(source: str, plan: JobPlan, tasks: tuple[str, ...]) -> bool:
    """Whether a source checkpoint ran exactly these tasks at the plan's factor."""
    from spark_elastic.state.checkpoint_dir import read_job

    job = read_job(source)
    if job is None or job.elasticity_factor != plan.elasticity_factor:
        return False
    owned = set(plan.task_names()) if job.tasks is None else set(job.tasks)
    return owned == set(tasks)


def _take_over(mine: ContainerModel, plan: JobPlan, spark: SparkSession) -> None:
    """Rescale the predecessors' committed checkpoints to this container's tasks."""
    from spark_elastic.state.rescale import rescale

    target = Path(mine.checkpoint)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.sources.", dir=target.parent))
    try:
        forks = []
        for i, source in enumerate(mine.sources):
            fork = staging / str(i)
            fork_committed(source, fork)
            forks.append(fork)
        started = time.monotonic()
        result = rescale(forks, target, plan.elasticity_factor, spark, tasks=mine.tasks)
        _log(
            f"took over {len(mine.tasks)} tasks from {len(mine.sources)} checkpoints: "
            f"{result.keys} keys in {time.monotonic() - started:.1f} s"
        )
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _rescaled_starts(
    target: Path, plan: JobPlan, mine: ContainerModel
) -> dict[str, dict[str, int]] | None:
    """Where a rescaled checkpoint's first query reads (None once it ran, or if not rescaled)."""
    from spark_elastic.state.rescale import starting_offsets

    text = starting_offsets(target, default="")
    if not text:
        return None
    needed = needed_partitions(plan, mine.tasks)
    offsets: dict[str, dict[str, int]] = json.loads(text)
    return {
        topic: {str(p): int(offsets.get(topic, {}).get(str(p), 0)) for p in partitions}
        for topic, partitions in needed.items()
    }


def _warm_up(spark: SparkSession) -> None:
    """Start the Python workers a query's first batch would wait for (driver, once)."""
    spark.range(0, 64, numPartitions=spark.sparkContext.defaultParallelism).mapInPandas(
        _pass_through, "id long"
    ).count()


def _pass_through(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """``mapInPandas`` function of the warm-up; runs on executors, once per partition."""
    yield from frames


def _rehearse(
    spark: SparkSession, job: Job, plan: JobPlan, warm: ContainerModel, snapshot: Path
) -> None:
    """Run the job's query once on a throwaway copy of a snapshot, into a no-op sink.

    Runs on a warm-up's driver, once: the new owner's first micro-batch then
    finds the source, the routing, the state store loading its initial
    state and the processor's Python workers already warm. The copy is
    hard-linked and removed after; nothing reaches the job's sink.
    """
    scratch = Path(tempfile.mkdtemp(prefix=".rehearsal.", dir=snapshot.parent.parent))
    started = time.monotonic()
    try:
        copy = scratch / "checkpoint"
        shutil.copytree(snapshot, copy, copy_function=os.link)
        rehearsal = ContainerModel(warm.container_id, warm.tasks, warm.generation, str(copy))
        output = _output(spark, job, plan, rehearsal, _rescaled_starts(copy, plan, rehearsal))
        query = (
            output.writeStream.format("noop")
            .option("checkpointLocation", str(copy))
            .trigger(processingTime="0 seconds")
            .start()
        )
        try:
            deadline = time.monotonic() + 300
            while query.isActive and query.lastProgress is None and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            query.stop()
        _log(f"rehearsed a first micro-batch in {time.monotonic() - started:.1f} s")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


class _Follower:
    """A stateful warm-up's snapshots of its old owners' state (driver; see :mod:`.follow`)."""

    def __init__(self, spark: SparkSession, job: Job, every_s: float) -> None:
        self.spark, self.job, self.every_s = spark, job, every_s
        self.last = -float("inf")
        self.rehearsed = False

    def __call__(self, model: JobModel, container_id: str) -> None:
        warm = model.warmup(container_id)
        if warm is None or time.monotonic() - self.last < self.every_s:
            return
        if holders_stopping(model, warm.tasks):
            return  # the handover forks their final checkpoints: a snapshot now is wasted
        self.last = time.monotonic()
        factor = _factor_of(warm, self.job)
        try:
            snapshot = follow(self.spark, model, warm, factor)
            if snapshot is not None and not self.rehearsed:
                self.rehearsed = True
                plan = grown_plan(self.job.grouper, factor, model.planned, model.partitions)
                _rehearse(self.spark, self.job, plan, warm, snapshot.path)
        except Exception as exc:  # the owners moved on: the handover rescales instead
            _log(f"following the old owners failed ({type(exc).__name__}: {exc}); will retry")
            return
        if snapshot is not None:
            _log(
                f"followed {len(snapshot.sources)} old owners to batches "
                f"{sorted(snapshot.sources.values())}: {snapshot.keys} keys in "
                f"{snapshot.seconds:.1f} s"
            )

    def caught_up(self, model: JobModel, container_id: str) -> bool:
        """Snapshots have nothing to catch up with: ready once the old owners are stopping."""
        warm = model.warmup(container_id)
        return warm is not None and holders_stopping(model, warm.tasks)


class _Replayer:
    """A replaying warm-up: its query on a snapshot, following its old owners' commits.

    Runs on the warm-up's driver (see :mod:`.follow`). The gate and the
    fences are the same offsets, the old owners' last commits: fences are
    written first, so the query never reads a record above its key's fence
    before it owns its tasks, and every record it applies meanwhile is one
    the old owners published already.
    """

    GATE_FILE = "gate.json"

    def __init__(
        self,
        spark: SparkSession,
        job: Job,
        settings: ContainerSettings,
        lease: ContainerLease,
        warm: ContainerModel,
        model: JobModel,
    ) -> None:
        self.spark, self.job, self.settings, self.lease, self.warm = (
            spark,
            job,
            settings,
            lease,
            warm,
        )
        self.plan = grown_plan(job.grouper, _factor_of(warm, job), model.planned, model.partitions)
        self.gate = str(elastic_dir(warm.checkpoint) / self.GATE_FILE)
        self.live = threading.Event()
        self.fences: list[Fence] = []
        self.query: StreamingQuery | None = None
        # Set once caught up with stopping owners: the gate stays where it is from then on.
        self.frozen = False
        # Each gate written, with the time after its write (what a batch could read); the
        # gate when the query started; the query's batches that read records.
        self.gates: collections.deque[tuple[float, dict[str, dict[str, int]]]] = collections.deque(
            maxlen=1024
        )
        self.start_gate: dict[str, dict[str, int]] | None = None
        self.batches_read: set[int] = set()

    def _plan_at(self, model: JobModel) -> Any:
        return lambda factor: grown_plan(self.job.grouper, factor, model.planned, model.partitions)

    def start(self, model: JobModel) -> bool:
        """Take a snapshot as the checkpoint and start the query on it (once).

        Returns False while the old owners have committed nothing to copy.
        """
        snapshot = follow(self.spark, model, self.warm, self.plan.elasticity_factor)
        if snapshot is None or adopt_snapshot(self.warm.checkpoint) is None:
            return False
        self.follow(model)
        self.start_gate = self.gate_offsets
        starts = _rescaled_starts(Path(self.warm.checkpoint), self.plan, self.warm)
        self.query = _start_query(
            self.spark,
            self.job,
            self.plan,
            self.warm,
            self.lease,
            self.settings,
            starts,
            gate=self.gate,
            live=self.live,
        )
        _log(
            f"replaying: {snapshot.keys} keys as of batches {sorted(snapshot.sources.values())} "
            f"({snapshot.seconds:.1f} s), query started on them"
        )
        return True

    def follow(self, model: JobModel) -> None:
        """Raise fences and gate to the current holders' last commits."""
        sources = holder_checkpoints(model, self.warm.tasks)
        self._raise(source_fences(sources, self._plan_at(model)))

    def _raise(self, fences: list[Fence]) -> None:
        # Fences only rise: a source's earlier figure was published too.
        merged = highest([*self.fences, *fences])
        if merged == self.fences:
            return
        write_fences(self.warm.checkpoint, merged)
        gate = gate_for(merged, self.plan, self.warm.tasks)
        write_gate(self.gate, gate)
        self.fences = merged
        if gate != self.gate_offsets:
            self.gates.append((time.time(), gate))

    @property
    def gate_offsets(self) -> dict[str, dict[str, int]]:
        """The gate as last written (empty before the first)."""
        return self.gates[-1][1] if self.gates else {}

    @property
    def previous_gate(self) -> dict[str, dict[str, int]]:
        """The gate before its last rise (empty before the second)."""
        return self.gates[-2][1] if len(self.gates) > 1 else {}

    def __call__(self, model: JobModel, container_id: str) -> None:
        """Follow, as :func:`_await_tasks` calls it while the warm-up waits.

        Not once caught up with stopping owners (:meth:`caught_up`): their
        last batches then land beyond the gate, and the query, idle at the
        gate, covers them and what came after in one batch once it owns the
        tasks. Following them would start a batch of no output just before
        the handover, which the first batch as owner would wait for.
        """
        if model.warmup(container_id) is None:
            return
        if self.frozen and not holders_stopping(model, self.warm.tasks):
            self.frozen = False  # the phase was called off (a failover): follow again
        if not self.frozen:
            self.follow(model)

    WARM_BATCHES = 3
    """Batches that read records a warm-up runs before it holds its gate: the first ones
    after its snapshot are slow, and its first batch as owner should not be one of them
    (measured with 500,000 keys at factor 4 beside three other containers on 2 cores:
    53, 18, 12, 8.8, 6.6, 4.8 and 3.4 s; after two, a new owner's first batch took 9.4 s)."""

    IDLE_S = 3.0
    """Owners that committed nothing for this long, and for twice as long as between
    their last two commits, have no records flowing (:func:`.follow.holders_idle`): a
    warm-up that has applied everything they committed need not wait for more batches."""

    def caught_up(self, model: JobModel, container_id: str) -> bool:
        """Whether the warm-up is ready for its old owners to stop (the handover's first phase).

        Once the owners are listed as stopping, the warm-up follows them
        until its query has run :attr:`WARM_BATCHES` batches that read
        records (its state stores are open and past their slow first
        batches) and keeps pace with them: it is within one of their commits
        (it has applied what the gate held before its last rise), or its
        last batch read everything the gate held when that batch started (a
        warm-up slower per batch than its owners, which commit several times
        meanwhile, is never within one commit; its next batch reads what
        they published meanwhile). The gate then stays put, and the warm-up
        has caught up once its query has applied what is below it: the
        owners' later batches, and what comes after them, are its next
        batch, once it owns the tasks. Requiring the query to reach a gate
        that keeps rising would rarely succeed while records flow. With no
        records flowing (the owners committed nothing for :attr:`IDLE_S` and
        twice the interval between their last two commits) a query that has
        applied all they committed is caught up as it is.
        """
        warm = model.warmup(container_id)
        if warm is None or not holders_stopping(model, warm.tasks):
            return False
        if not self.frozen and self._may_hold_the_gate(model):
            self.frozen = True
            _log(f"keeping pace with the stopping owners: the gate stays ({self.lag()} to go)")
        return self.frozen and self.lag() == 0

    def _may_hold_the_gate(self, model: JobModel) -> bool:
        if self.lag() == 0 and holders_idle(model, self.warm.tasks, time.time(), self.IDLE_S):
            return True
        if self.read_batches() < self.WARM_BATCHES:
            return False
        raised = self.gate_offsets != self.start_gate
        if self.lag(self.previous_gate if raised else self.gate_offsets) == 0:
            return True
        return self._kept_pace()

    def _kept_pace(self) -> bool:
        # Whether the last batch read all its gate held as it started (driver, per heartbeat).
        progress = _progress_json(self.query.lastProgress) if self.query is not None else {}
        if not progress.get("timestamp"):
            return False
        started = datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00"))
        return read_all_it_could(list(self.gates), started.timestamp(), _offsets_of(progress))

    def read_batches(self) -> int:
        """How many batches of the query read records (driver; from its recent progress)."""
        if self.query is not None:
            for progress in map(_progress_json, self.query.recentProgress):
                if progress.get("numInputRows", 0) > 0:
                    self.batches_read.add(int(progress["batchId"]))
        return len(self.batches_read)

    def failed(self) -> bool:
        """Whether the query ended (it should run until the container stops)."""
        return self.query is not None and not self.query.isActive

    def lag(self, gate: Mapping[str, Mapping[str, int]] | None = None) -> int | None:
        """Records up to the gate (or ``gate``) the query has yet to commit; None before its
        first progress."""
        if self.query is None:
            return None
        progress = _progress_json(self.query.lastProgress)
        if not progress:
            return None
        committed = _offsets_of(progress)
        limits = (
            read_gate(self.gate) or {}
            if gate is None
            else {(t, int(p)): o for t, parts in gate.items() for p, o in parts.items()}
        )
        return sum(
            max(offset - committed.get(topic, {}).get(partition, 0), 0)
            for (topic, partition), offset in limits.items()
        )

    def take_over(self, mine: ContainerModel, model: JobModel) -> StreamingQuery:
        """Own the tasks: the old owners' final offsets become the fences, the gate lifts."""
        assert self.query is not None  # noqa: S101 - a replaying warm-up registers after start
        self._raise(source_fences(mine.sources, self._plan_at(model)))
        self.live.set()
        write_gate(self.gate, None)
        _log(f"took over {len(mine.tasks)} tasks in the query that replayed them")
        return self.query

    def discard(self) -> None:
        """The move was called off: stop the query, remove the checkpoint no one will read."""
        if self.query is not None:
            _stop_within(self.query, self.settings.shutdown_s)
        shutil.rmtree(self.warm.checkpoint, ignore_errors=True)
        drop_snapshot(self.warm.checkpoint)


@contextlib.contextmanager
def _heartbeating(client: CoordinatorClient, container_id: str, every_s: float) -> Iterator[None]:
    """Heartbeat every ``every_s`` from a thread while the block runs (driver).

    For a warm-up's long steps before it registers: its heartbeats keep the
    coordinator's start-up timer from running out. A failed heartbeat is
    retried at the next beat; the thread has stopped when the block exits.
    """
    done = threading.Event()

    def beat() -> None:
        while not done.wait(every_s):
            with contextlib.suppress(OSError, ValueError, ProtocolError):
                client.heartbeat(container_id)

    thread = threading.Thread(target=beat, name="warm-up heartbeats", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _catch_up(
    client: CoordinatorClient, replayer: _Replayer, container_id: str, acceptable_lag: int
) -> bool:
    """Start the replaying query and follow until it is within ``acceptable_lag``.

    Runs before the warm-up registers; it heartbeats meanwhile, which keeps
    the coordinator's start-up timer from running out. Returns False if the
    warm-up was removed from the model or its query ended.
    """
    while True:
        model = client.job_model()
        if model.warmup(container_id) is None:
            _log(f"job model {model.version} no longer has warm-up {container_id!r}")
            return False
        if replayer.query is None:
            replayer.start(model)
        else:
            replayer.follow(model)
            lag = replayer.lag()
            if lag is not None and lag <= acceptable_lag:
                _log(f"caught up with the old owners' commits (lag {lag} records)")
                return True
        if replayer.failed():
            _log(f"the replaying query ended: {replayer.query.exception()}")  # type: ignore[union-attr]
            return False
        with contextlib.suppress(OSError, ValueError, ProtocolError):
            client.heartbeat(container_id)
        time.sleep(0.5)


def _await_tasks(
    client: CoordinatorClient,
    container_id: str,
    every_s: float,
    stop: threading.Event,
    dead: threading.Event,
    follower: _Follower | _Replayer | None = None,
) -> JobModel | None:
    """Wait, heartbeating, until the job model hands this warm-up its tasks.

    Returns the model that lists it among the containers, or None if it was
    stopped, fenced, or removed from the model (the move was called off).
    A stateful warm-up follows its old owners' state meanwhile.
    """
    while not (stop.is_set() or dead.is_set()):
        try:
            model = client.job_model()
        except (OSError, ValueError, ProtocolError) as exc:
            _log(f"job model fetch failed ({exc}); retrying")
        else:
            if model.container(container_id) is not None:
                return model
            if model.warmup(container_id) is None:
                _log(f"job model {model.version} no longer has warm-up {container_id!r}")
                return None
            if follower is not None:
                follower(model, container_id)
                if follower.caught_up(model, container_id):
                    # The handover's first phase: the old owners stop once their warm-ups
                    # say this (or after a lease).
                    with contextlib.suppress(OSError, ValueError, ProtocolError):
                        client.heartbeat(container_id, caught_up=True)
            if isinstance(follower, _Replayer) and follower.failed():
                _log(f"the replaying query ended: {follower.query.exception()}")  # type: ignore[union-attr]
                dead.set()
        stop.wait(every_s)
    return None


def run_container(settings: ContainerSettings) -> int:
    """Run a container until it is stopped, fenced, or its query fails.

    Runs in the container's own process, on its driver; returns the exit code
    (0: stopped by SIGTERM or removed from the job model; 1: fenced, gave up
    on the coordinator, or the query failed).

    Parameters
    ----------
    settings
        Where the coordinator is, which job, and the heartbeat settings.

    Returns
    -------
    int
        The process exit code.
    """
    timeout = settings.heartbeat_timeout_s or min(5.0, max(1.0, 2 * settings.heartbeat_s))
    client = CoordinatorClient(settings.coordinator_url, settings.token, timeout)
    started: list[StreamingQuery] = []
    try:
        return _run_container(settings, client, started)
    except Exception as exc:
        # Why it fails goes where the operator looks (the coordinator's events and status),
        # not only into this log, but only once nothing of it can write: its query stopped.
        _log(f"failed: {first_line(exc)}")
        for query in started:
            _stop_within(query, settings.shutdown_s)
        client.report_failure(settings.container_id, exc)
        raise


def _run_container(
    settings: ContainerSettings, client: CoordinatorClient, started: list[StreamingQuery]
) -> int:
    """:func:`run_container`'s life; every query it starts is put in ``started`` at once."""
    job, module = load_job_and_module(settings.job)
    # On this side only the write budget and the drift allowance matter; the lease's length
    # comes with every reply, and the margin is the coordinator's.
    terms = LeaseTerms(
        lease_s=max(settings.write_budget_s * 2, 1.0),
        margin_s=settings.write_budget_s,
        write_budget_s=settings.write_budget_s,
    )
    lease = ContainerLease(terms)
    spark: SparkSession | None = None
    follower: _Follower | None = None
    first = client.job_model()
    replayer: _Replayer | None = None
    warm_first = first.warmup(settings.container_id)
    if warm_first is not None:
        # KIP-441: a new owner gets going while the old one still runs its tasks; it
        # registers (holds a lease) only once it is ready, and writes nothing before.
        spark = _job_session(job, module, settings)
        _warm_up(spark)
        if job.processor is not None and _replays(job, settings):
            replayer = _Replayer(spark, job, settings, lease, warm_first, first)
            if not _catch_up(client, replayer, settings.container_id, settings.acceptable_lag):
                replayer.discard()
                return EXIT_OK if not replayer.failed() else EXIT_FENCED
        elif job.processor is not None:
            follower = _Follower(spark, job, settings.follow_s)
            # Its first snapshot may outlast the coordinator's start-up bound on a loaded
            # machine: unregistered and silent, it would be failed over, again and again.
            with _heartbeating(client, settings.container_id, settings.heartbeat_s):
                follower(first, settings.container_id)
    sent = time.monotonic()
    reply = client.register(Registration(settings.container_id, os.getpid()))
    if not reply.alive:
        _log(f"the coordinator did not issue container id {settings.container_id!r}")
        if replayer is not None:
            replayer.discard()
        return EXIT_FENCED
    lease.renew(sent, reply.lease_ms)

    dead = threading.Event()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    beats = _Heartbeats(client, settings, lease, dead)
    beats.lease_s = reply.lease_ms / 1000
    beats.start()
    model = client.job_model()
    warm = model.warmup(settings.container_id)
    if warm is not None:
        _log(f"warm: waiting for tasks {', '.join(warm.tasks)}")
        # A replaying warm-up looks more often: its stall ends when it sees the handover.
        every_s = settings.heartbeat_s if replayer is None else min(settings.heartbeat_s, 0.2)
        awaited = _await_tasks(
            client, settings.container_id, every_s, stop, dead, replayer or follower
        )
        if awaited is None:
            if replayer is not None:
                replayer.discard()
            drop_snapshot(warm.checkpoint)
            beats.stopping.set()
            return EXIT_FENCED if dead.is_set() else EXIT_OK
        model = awaited
    mine = model.container(settings.container_id)
    if mine is None:
        beats.stopping.set()
        _log(f"job model {model.version} has no container {settings.container_id!r}")
        return EXIT_FENCED

    # The tasks are those planned for the planned counts; after SEP-5 growth a new
    # partition joins the tasks of its partition modulo the planned count.
    plan = grown_plan(job.grouper, _factor_of(mine, job), model.planned, model.partitions)
    # From here to the first commit is this container's share of a moved task's stall.
    given = time.monotonic()
    since = ""
    if replayer is not None:
        query = replayer.take_over(mine, model)
        started.append(query)
        # Its batches so far were the warm-up's (no output): not reported as the owner's.
        since = max(
            (p.get("timestamp", "") for p in map(_progress_json, query.recentProgress)), default=""
        )
    else:
        if spark is None:
            spark = _job_session(job, module, settings)
        starts = _prepare_checkpoint(mine, plan, job.processor is not None, spark)
        query = _start_query(spark, job, plan, mine, lease, settings, starts)
        started.append(query)
    _log(
        f"running tasks {', '.join(mine.tasks)} in generation {mine.generation} "
        f"({time.monotonic() - given:.1f} s after they were given)"
    )
    code = _supervise(query, job, plan, mine, client, stop, dead, given, since)
    if stop.is_set() and not dead.is_set():
        # Asked to stop (a handover, or the job's stop): the heartbeats go on renewing the
        # lease while the batch in flight commits, so its records are published here
        # rather than replayed by a successor.
        _finish_batch(query, settings.shutdown_s, dead)
    beats.stopping.set()
    _stop_within(query, settings.shutdown_s)
    if stop.is_set() and not dead.is_set():
        # Its successor may start now rather than once this process (a JVM on its way
        # out) has exited: the query has stopped, so nothing more is written.
        with contextlib.suppress(OSError, ValueError, ProtocolError):
            client.heartbeat(settings.container_id, stopped=True)
    return code


def _finish_batch(query: StreamingQuery, limit_s: float, dead: threading.Event) -> None:
    """Wait until the query's micro-batch in flight has committed (or none runs).

    Runs on the container's driver, once, when the container is asked to
    stop. Spark has no stop at a batch boundary for Structured Streaming
    (``query.stop()`` interrupts the batch), so this watches the query's
    status: no trigger active, or a newer progress than when it was asked.
    Gives up after ``limit_s`` or once the lease is lost (``dead``): the
    batch is then abandoned, uncommitted, as a crash would leave it.
    """

    def last() -> str:
        return str(_progress_json(query.lastProgress).get("timestamp", ""))

    asked, before = time.monotonic(), last()
    while time.monotonic() < asked + limit_s and not dead.is_set() and query.isActive:
        if not query.status.get("isTriggerActive") or last() != before:
            _log(f"stopping at a batch boundary ({time.monotonic() - asked:.1f} s after asked)")
            return
        time.sleep(0.05)
    _log("stopping mid-batch: the batch in flight is abandoned")


def _replays(job: Job, settings: ContainerSettings) -> bool:
    """Whether a stateful warm-up replays its old owners' records (their input has a gate)."""
    return settings.warmup == "replay" and isinstance(job.input, LogInput)


def _supervise(
    query: StreamingQuery,
    job: Job,
    plan: JobPlan,
    mine: ContainerModel,
    client: CoordinatorClient,
    stop: threading.Event,
    dead: threading.Event,
    given: float,
    since: str = "",
) -> int:
    """Report committed batches until asked to stop, fenced, or the query ends.

    Progress from before ``since`` (a trigger timestamp) is not reported.
    """
    # Spark also reports idle triggers, under the id of the batch that has not run yet; the
    # batch itself reports again under that id when it runs. Progress events are therefore
    # told apart by their trigger timestamp (ISO 8601, so they order as strings), and each
    # is reported once: the coordinator adds the counts up.
    reported = since
    first = True
    while True:
        if stop.is_set():
            return EXIT_OK
        if dead.is_set():
            return EXIT_FENCED
        if not query.isActive:
            error = query.exception()
            fenced = error is not None and "FencedError" in str(error)
            _log("fenced: stopped before writing" if fenced else f"query ended: {error}")
            if not fenced:
                # Its query has ended: nothing of this container writes any more.
                client.report_failure(
                    mine.container_id,
                    first_line(error) if error is not None else "the query stopped by itself",
                )
            return EXIT_FENCED
        for progress in map(_progress_json, query.recentProgress):
            batch, at = progress.get("batchId"), progress.get("timestamp")
            if not isinstance(batch, int) or not isinstance(at, str) or at <= reported:
                continue
            if first:
                first = False
                _log(
                    f"first batch {batch} done {time.monotonic() - given:.1f} s after the tasks "
                    "were given"
                )
            reported = at
            try:
                reply = client.progress(build_report(job, plan, mine, progress))
            except (OSError, ValueError, ProtocolError) as exc:
                _log(f"progress report of batch {batch} failed ({exc})")
            else:
                if not reply.alive:
                    dead.set()
        stop.wait(0.2)


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
