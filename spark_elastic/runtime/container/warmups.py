"""A warm-up (KIP-441): a new owner that gets going before it owns its tasks.

A container the job model lists as a *warm-up* (KIP-441) first starts its
Spark application and Python workers; a stateful one then follows its old
owners' committed state (:mod:`.follow`). When its input's source has a
gate (the embedded log, or Kafka through the ``gated-kafka`` or
``elastic-kafka`` source) it *replays*:
it takes a snapshot of its tasks' keys as its own checkpoint and starts
its query there, reading up to where the old owners committed (the
source's ``gate``) and applying those records to its state without output
(the checkpoint's output fences); it registers (that says it is ready) once
it has caught up, and keeps following. When the coordinator hands it its
tasks (their old owners stopped), it takes their final offsets as its
fences and lifts the gate: the query it has been running publishes from
there. Otherwise (Spark's own Kafka source, or ``SPARK_ELASTIC_WARMUP=snapshot``) it
renews a snapshot while it waits, registers after the first, and at the
handover takes the snapshot as its checkpoint when the old owners committed
nothing since (else rescales their checkpoints again) and starts its query.
Removed from the model meanwhile, a warm-up exits 0.

Every container has a :class:`WarmUp`, chosen by :func:`warm_up_for`:
``_Cold`` (no warm-up, or a stateless one: the query starts when the tasks
are given), ``_Follower`` (takes the snapshots) or ``_Replayer`` (runs the
replaying query). :func:`run_container` drives it the same way whichever it
is: ``prepare`` before registering, following while it waits for its tasks
(:func:`_await_tasks`), ``take_over`` once they are given, ``discard`` if
the move is called off.
"""

from __future__ import annotations

import collections
import contextlib
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from spark_elastic.errors import ProtocolError, StorageError
from spark_elastic.log.gate import read_gate, write_gate
from spark_elastic.runtime.container.checkpoint import (
    _fence_published,
    _prepare_checkpoint,
    _rescaled_starts,
    published_fences,
    reads_published_alone,
)
from spark_elastic.runtime.container.client import CoordinatorClient, _Heartbeats, first_line
from spark_elastic.runtime.container.console import _log
from spark_elastic.runtime.container.follow import (
    adopt_snapshot,
    drop_snapshot,
    follow,
    gate_for,
    highest,
    holder_checkpoints,
    holders_idle,
    holders_stopping,
    own_scratch,
    read_all_it_could,
    source_fences,
)
from spark_elastic.runtime.container.query import (
    _factor_of,
    _job_session,
    _offsets_of,
    _output,
    _progress_json,
    _start_query,
    _stop_within,
    progress_since,
)
from spark_elastic.runtime.container.settings import ContainerSettings
from spark_elastic.runtime.growth import grown_plan
from spark_elastic.runtime.job import Job
from spark_elastic.runtime.lease import ContainerLease
from spark_elastic.runtime.protocol import ContainerModel, JobModel
from spark_elastic.state.checkpoint_dir import Fence, elastic_dir, storage_of, write_fences
from spark_elastic.state.shipped import ship_fences
from spark_elastic.storage import LocalStorage, is_local

if TYPE_CHECKING:
    from collections.abc import Iterator

    import pandas as pd
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from spark_elastic.model.plan import JobPlan


_LOCAL = LocalStorage()


def _warm_up(spark: SparkSession) -> None:
    """Start the Python workers a query's first batch would wait for (driver, once)."""
    spark.range(0, 64, numPartitions=spark.sparkContext.defaultParallelism).mapInPandas(
        _pass_through, "id long"
    ).count()


def _pass_through(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """``mapInPandas`` function of the warm-up; runs on executors, once per partition."""
    # What a stateful task's worker imports when it unpickles the processor.
    import spark_elastic.state.processor  # noqa: F401

    yield from frames


class _Ahead:
    """A step of a container's start run beside the others, on a daemon thread (driver, once).

    A daemon thread, so a step still waiting on an unreachable service (a
    sink's brokers) never holds the process's exit back; its error is
    raised where its result is asked for.
    """

    def __init__(self, step: Callable[[], Any]) -> None:
        self.value: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(step,), daemon=True)
        self.thread.start()

    def _run(self, step: Callable[[], Any]) -> None:
        try:
            self.value = step()
        except BaseException as exc:  # raised again by result(), in the caller's thread
            self.error = exc

    def result(self) -> Any:
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.value


def _warm_up_beside(spark: SparkSession) -> None:
    """Start the Python workers while the driver plans the first batch (driver, once).

    A cold container's first batch otherwise waits for the workers'
    processes and imports (about 2 s on 2 cores); meanwhile the driver's
    own start-up (its checkpoint, the sink's fences, the query's planning)
    leaves the executors idle. A failure here only loses the head start.
    """

    def run() -> None:
        try:
            _warm_up(spark)
        except Exception as exc:
            _log(f"starting the Python workers ahead failed ({first_line(exc)})")

    threading.Thread(target=run, name="spark-elastic-warm-workers", daemon=True).start()


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
        _LOCAL.link_tree(str(snapshot), str(copy))
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
        _LOCAL.discard(str(scratch))


@dataclass(frozen=True)
class Taken:
    """A container's query over the tasks it was given, as its warm-up hands it over."""

    query: StreamingQuery
    since: str = ""
    """Trigger timestamp of the query's last batch as a warm-up (ISO 8601): those batches
    published nothing and are not reported as the owner's."""
    steps: tuple[tuple[str, float], ...] = ()
    """Where the take-over's time went, ``(step, seconds)`` in order, for the container's log."""


class _Steps:
    """Times a take-over's steps one after another (driver, once per take-over)."""

    def __init__(self) -> None:
        self.last = time.monotonic()
        self.taken: tuple[tuple[str, float], ...] = ()

    def done(self, step: str) -> None:
        now = time.monotonic()
        self.taken += ((step, now - self.last),)
        self.last = now


class WarmUp(Protocol):
    """How a container gets ready for its tasks and takes them (KIP-441).

    Runs on the container's driver, driven by :func:`run_container` in this
    order: :meth:`prepare` once, before the container registers; while it
    waits for its tasks, :meth:`__call__` and :meth:`caught_up` each time
    it looks at the job model (every :attr:`poll_s`); then
    :meth:`take_over` once, or :meth:`discard` if the move is called off.
    """

    poll_s: float
    """How often the container looks at the job model while it waits for its tasks."""

    def prepare(self, client: CoordinatorClient) -> bool:
        """Get ready to register; False if the warm-up was called off or failed."""
        ...

    def __call__(self, model: JobModel, container_id: str) -> None:
        """Follow the old owners as ``model`` has them."""
        ...

    def caught_up(self, model: JobModel, container_id: str) -> bool:
        """Whether the old owners may stop now (the handover's first phase)."""
        ...

    def failure(self) -> str | None:
        """Why what it runs ended, if it did (the container then exits as fenced)."""
        ...

    def take_over(self, mine: ContainerModel, model: JobModel, plan: JobPlan) -> Taken:
        """Own ``mine``'s tasks: the query that publishes from here on."""
        ...

    def discard(self) -> None:
        """The move was called off: leave nothing behind that no one will read."""
        ...


class _Cold:
    """No warm-up to speak of: the query starts when the tasks are given.

    A container launched as an owner (a start, a failover), or a stateless
    warm-up, which has no state to follow (its Spark application and
    Python workers are started already, see :func:`warm_up_for`).
    """

    def __init__(
        self,
        job: Job,
        module: Any,
        settings: ContainerSettings,
        lease: ContainerLease,
        spark: SparkSession | None = None,
    ) -> None:
        self.job, self.module, self.settings, self.lease = job, module, settings, lease
        self.spark = spark
        self.poll_s = settings.heartbeat_s

    def prepare(self, client: CoordinatorClient) -> bool:
        """Nothing to get ready."""
        return True

    def __call__(self, model: JobModel, container_id: str) -> None:
        """Nothing to follow."""

    def caught_up(self, model: JobModel, container_id: str) -> bool:
        """Never says so: its old owners stop after a lease (the coordinator's bound)."""
        return False

    def failure(self) -> str | None:
        """Nothing runs before it takes over."""
        return None

    def take_over(self, mine: ContainerModel, model: JobModel, plan: JobPlan) -> Taken:
        """Its checkpoint from its predecessors' (:mod:`.checkpoint`), and its query on it."""
        steps = _Steps()
        job = self.job
        # What the old owners published is final now that this container owns their tasks:
        # a sink that can say so without Spark is read while the session starts.
        early = (
            _Ahead(lambda: job.sink.published(job.name, mine.tasks))  # type: ignore[attr-defined]
            if reads_published_alone(job)
            else None
        )
        if self.spark is None:
            self.spark = _job_session(job, self.module, self.settings)
            steps.done("Spark session")
            if job.processor is not None:
                _warm_up_beside(self.spark)
        starts = _prepare_checkpoint(
            mine, plan, job.processor is not None, self.spark, reopen=job.holds_back
        )
        steps.done("checkpoint")
        published = None if early is None else early.result()
        quiet = _fence_published(job, plan, mine, self.spark, published)
        steps.done("published fences")
        query = _start_query(
            self.spark, job, plan, mine, self.lease, self.settings, starts, quiet=quiet
        )
        steps.done("query start")
        return Taken(query, steps=steps.taken)

    def discard(self) -> None:
        """Nothing of its own to remove."""


class _Follower(_Cold):
    """A stateful warm-up's snapshots of its old owners' state (driver; see :mod:`.follow`).

    At the handover it starts its query as a cold container does: the
    checkpoint is then its last snapshot when the old owners committed
    nothing since, else their checkpoints rescaled again (:mod:`.checkpoint`).
    """

    def __init__(
        self,
        job: Job,
        module: Any,
        settings: ContainerSettings,
        lease: ContainerLease,
        spark: SparkSession,
        warm: ContainerModel,
        first: JobModel,
    ) -> None:
        super().__init__(job, module, settings, lease, spark)
        self.spark: SparkSession = spark
        self.warm, self.first = warm, first
        self.every_s = settings.follow_s
        self.last = -float("inf")
        self.rehearsed = False

    def prepare(self, client: CoordinatorClient) -> bool:
        """Take a first snapshot. It may take long on a loaded machine: the coordinator
        bounds a warm-up's readiness by its change's deadline, not by the start-up bound."""
        self(self.first, self.warm.container_id)
        return True

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

    def discard(self) -> None:
        """Remove its snapshot."""
        drop_snapshot(self.warm.checkpoint)


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
        # Read on this driver by the source, each trigger: a local file, off the checkpoint
        # when the checkpoint is on HDFS or S3.
        self.gate = str(
            elastic_dir(warm.checkpoint) / self.GATE_FILE
            if is_local(warm.checkpoint)
            else own_scratch(warm.checkpoint) / f"{Path(warm.checkpoint).name}.{self.GATE_FILE}"
        )
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
        self.starts: dict[str, dict[str, int]] | None = None
        self.restarts = 0
        self.batches_read: set[int] = set()
        self._read_since = ""  # the newest progress read_batches has seen
        # It looks more often than it heartbeats: its stall ends when it sees the handover.
        self.poll_s = min(settings.heartbeat_s, 0.2)

    def prepare(self, client: CoordinatorClient) -> bool:
        """Start the replaying query and follow until it is within ``acceptable_lag``."""
        return _catch_up(client, self, self.warm.container_id, self.settings.acceptable_lag)

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
        self.starts = _rescaled_starts(self.warm.checkpoint, self.plan, self.warm)
        self.query = self._start()
        _log(
            f"replaying: {snapshot.keys} keys as of batches {sorted(snapshot.sources.values())} "
            f"({snapshot.seconds:.1f} s), query started on them"
        )
        return True

    def _start(self) -> StreamingQuery:
        return _start_query(
            self.spark,
            self.job,
            self.plan,
            self.warm,
            self.lease,
            self.settings,
            self.starts,
            gate=self.gate,
            live=self.live,
        )

    RESTARTS = 2
    """Times a warm-up starts its replaying query again after it ended. It publishes nothing
    before it owns its tasks, so running its batches again is harmless; and the query most
    often ends at start on a loaded machine, its Python worker too slow for Spark's fixed
    10 s to connect back. Exiting instead cost the new Spark application a successor needs
    (session 18's bench_live on Kafka: the change rolled back at its deadline)."""

    def restart_if_ended(self) -> None:
        """Start the query again on its checkpoint if it ended, up to :attr:`RESTARTS` times.

        Runs on the driver, each time the warm-up looks at the job model, and
        only before it takes over (the container's own failure handling
        takes it from there).
        """
        if self.query is None or self.query.isActive or self.restarts >= self.RESTARTS:
            return
        self.restarts += 1
        _log(
            f"the replaying query ended ({self._why()}); "
            f"starting it again ({self.restarts} of {self.RESTARTS})"
        )
        self.query = self._start()

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
        if self.query is not None:
            # Before the gate rises: a batch that reads past the old fences is planned after
            # its tasks can read the new ones (a query defined later ships them itself).
            ship_fences(self.spark, self.warm.checkpoint)
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
        self.restart_if_ended()
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
            for progress in progress_since(self.query, self._read_since):
                self._read_since = progress.get("timestamp", self._read_since)
                if progress.get("numInputRows", 0) > 0:
                    self.batches_read.add(int(progress["batchId"]))
        return len(self.batches_read)

    def failure(self) -> str | None:
        """Why the query ended, if it did and will not be started again (it should run
        until the container stops)."""
        if self.query is None or self.query.isActive:
            return None
        return f"the replaying query ended: {self._why()}"

    def _why(self) -> str:
        why = self.query.exception() if self.query is not None else None
        return first_line(why) if why is not None else "stopped"

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

    def take_over(
        self, mine: ContainerModel, model: JobModel, plan: JobPlan | None = None
    ) -> Taken:
        """Own the tasks: the old owners' final offsets become the fences, the gate lifts.

        With a transactional sink, what the sink says they published counts
        too: an owner killed after publishing a batch, before committing it.
        The query is the one it has run since it started (its own plan).
        """
        assert self.query is not None  # noqa: S101 - a replaying warm-up registers after start
        published = published_fences(self.job, self.plan, mine, self.spark)
        self._raise([*source_fences(mine.sources, self._plan_at(model)), *published])
        self.live.set()
        write_gate(self.gate, None)
        _log(f"took over {len(mine.tasks)} tasks in the query that replayed them")
        # Spark keeps progress in trigger order: the newest is the latest trigger.
        latest = _progress_json(self.query.lastProgress).get("timestamp", "")
        return Taken(self.query, latest)

    def discard(self) -> None:
        """The move was called off: stop the query, remove the checkpoint no one will read."""
        if self.query is not None:
            _stop_within(self.query, self.settings.shutdown_s)
        storage, root = storage_of(self.warm.checkpoint)
        with contextlib.suppress(StorageError):
            storage.delete(root)
        drop_snapshot(self.warm.checkpoint)


def _catch_up(
    client: CoordinatorClient, replayer: _Replayer, container_id: str, acceptable_lag: int
) -> bool:
    """Start the replaying query and follow until it is within ``acceptable_lag``.

    Runs before the warm-up registers (the coordinator bounds that by its
    change's deadline). Returns False if the warm-up was removed from the
    model or its query ended.
    """
    while True:
        model = client.job_model()
        if model.warmup(container_id) is None:
            _log(f"job model {model.version} no longer has warm-up {container_id!r}")
            return False
        if replayer.query is None:
            replayer.start(model)
        else:
            replayer.restart_if_ended()
            replayer.follow(model)
            lag = replayer.lag()
            if lag is not None and lag <= acceptable_lag:
                _log(f"caught up with the old owners' commits (lag {lag} records)")
                return True
        failure = replayer.failure()
        if failure is not None:
            _log(failure)
            return False
        time.sleep(0.5)


def _await_tasks(
    client: CoordinatorClient,
    container_id: str,
    stop: threading.Event,
    dead: threading.Event,
    beats: _Heartbeats,
    warm_up: WarmUp,
) -> JobModel | None:
    """Wait until the job model hands this registered warm-up its tasks.

    Returns the model that lists it among the containers, or None if it was
    stopped, fenced, or removed from the model (the move was called off).
    The warm-up follows its old owners meanwhile, and says through the
    heartbeats (``beats``) when it has caught up with them.
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
            warm_up(model, container_id)
            if warm_up.caught_up(model, container_id):
                # The handover's first phase: the old owners stop once their warm-ups say
                # this (or after a lease).
                beats.say_caught_up()
            failure = warm_up.failure()
            if failure is not None:
                _log(failure)
                dead.set()
        stop.wait(warm_up.poll_s)
    return None


def warm_up_for(
    job: Job, module: Any, settings: ContainerSettings, lease: ContainerLease, first: JobModel
) -> WarmUp:
    """The container's :class:`WarmUp`, as the first job model it fetched lists it.

    A warm-up (KIP-441) starts its Spark application and Python workers at
    once, while the old owners still run its tasks; a stateful one then
    follows their state, replaying their records when its input has a gate
    (:func:`_replays`), else taking snapshots. Runs on the driver, once.
    """
    warm = first.warmup(settings.container_id)
    if warm is None:
        return _Cold(job, module, settings, lease)
    spark = _job_session(job, module, settings)
    _warm_up(spark)
    if job.processor is None:
        return _Cold(job, module, settings, lease, spark)
    if _replays(job, settings):
        return _Replayer(spark, job, settings, lease, warm, first)
    return _Follower(job, module, settings, lease, spark, warm, first)


def _replays(job: Job, settings: ContainerSettings) -> bool:
    """Whether a stateful warm-up replays its old owners' records (their input has a gate).

    Not for a job whose tasks hold records back: a replaying warm-up applies
    quietly what its old owners committed (:func:`.follow.source_fences`), and
    the records they held at their last commit were read but never output. It
    warms up from their state instead, held records included.
    """
    if job.holds_back:
        return False
    # An input of the user's own that does not say has no gate.
    return settings.warmup == "replay" and bool(getattr(job.input, "gated", False))
