"""The coordinator's state machine: the job model, container leases, failover, changes.

No I/O but the store and the container processes (:mod:`.processes`, the one
place they are signalled, through a :mod:`.launcher`); where tasks go is
:mod:`.placement`'s pure functions; the HTTP server (:mod:`.server`)
calls in from its event loop, one call at a time, so nothing here locks.

The recipe, in small steps:

1. **Plan once.** A new store gets the job model: the KIP-441 assignor
   decides how many of the plan's virtual tasks each container takes (by
   capacity, within one task), and each takes a contiguous run of them in
   (partition, bucket) order, so each partition's tasks sit in as few
   containers as balance allows (:func:`.placement.initial_assignment`). A
   store that has a model keeps it: the job definition must still match it,
   so a restart never remaps keys.
2. **Lease.** A heartbeat, registration or progress report from a live
   container renews its lease at the coordinator's monotonic time of receipt.
   Anything from a container that is not live gets ``alive: false``.
3. **Expire.** :meth:`Supervisor.tick` finds live containers whose lease has
   expired plus the margin (:meth:`LeaseTerms.reassignable_at`); a container
   that never registered is given ``startup_s`` instead, and one whose
   process is gone before it registered held no lease at all.
4. **Fail over.** Each expired container is replaced by a new one that takes
   exactly its tasks (the assignor returns a balanced assignment unchanged,
   and the successor carries the old one's state, so it is the same client
   in a new generation): new id, next generation, new checkpoint directory,
   the old checkpoint as its source (it forks the committed prefix). The new job model version, the
   container rows and the events commit in one transaction, then the old
   process (if still there) is killed and the new one launched.
5. **Restart.** A coordinator started on an existing store re-adopts the live
   containers by PID and gives each a fresh lease from its own start: their
   renewal times died with the old process, and a container whose own lease
   lapsed meanwhile pauses its writes until it is renewed.
6. **Autoscale.** Each tick, unless the autoscaler is off, the pure policy of
   :mod:`.autoscaler` judges each task's lag (from its current owner) and
   each container's processing rate (from its progress reports, as received)
   and :class:`.autoscaling.Autoscaling` carries out what it decides through
   :meth:`Supervisor.scale` or :meth:`Supervisor.change_factor`; a refusal (a
   change under way) becomes a hold. Its settings live in the store, so a
   restarted coordinator keeps a pin.
7. **Move (KIP-441).** A stateful scale or a factor change first launches
   the new owners as warm-ups (``JobModel.warmups``) while the old owners run
   every task; each tick, :meth:`.moves.Mover.advance` moves one group
   (warm-ups sharing an old owner) once the assignor's ``may_shut_down``
   lists all its old owners (:func:`.placement.may_shut_down`: every piece of state
   they hold has a ready warm-up): it stops the group's old owners, then, once they are
   gone, hands the warm-ups their tasks with the old owners' checkpoints as
   sources.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from spark_elastic.errors import (
    ArgumentError,
    ChangeRefusedError,
    ProtocolError,
    StoreError,
    StoreFencedError,
)
from spark_elastic.model.names import TaskKind, validate_elasticity_factor
from spark_elastic.runtime.coordinator.autoscaler import (
    AutoscalerConfig,
    Decision,
    Observation,
)
from spark_elastic.runtime.coordinator.autoscaling import Autoscaling
from spark_elastic.runtime.coordinator.changes import (
    CATCHING_UP,
    WARMING,
    Change,
    StartFailures,
    backoff_s,
    refuse_cancel,
)
from spark_elastic.runtime.coordinator.crash_loops import CrashLoops
from spark_elastic.runtime.coordinator.in_flight import InFlight
from spark_elastic.runtime.coordinator.input_health import InputHealth
from spark_elastic.runtime.coordinator.launchers import Launcher
from spark_elastic.runtime.coordinator.leadership import Leadership
from spark_elastic.runtime.coordinator.moves import (
    MovePlan,
    Mover,
    factor_move,
    scale_move,
)
from spark_elastic.runtime.coordinator.partitions import (
    GROUP_COMMIT_S,
    PartitionMonitor,
    PartitionWatch,
    task_partitions,
)
from spark_elastic.runtime.coordinator.placement import (
    initial_assignment,
    scale_assignment,
)
from spark_elastic.runtime.coordinator.processes import Processes
from spark_elastic.runtime.coordinator.retiring import Retiring
from spark_elastic.runtime.coordinator.status import (
    Facts,
    coordinator_status,
    group_offsets,
    input_lag,
    job_status,
    status_json,
)
from spark_elastic.runtime.coordinator.stores import ContainerRecord, Store
from spark_elastic.runtime.growth import judge_counts
from spark_elastic.runtime.keys import parsed
from spark_elastic.runtime.lease import LeaseTerms
from spark_elastic.runtime.protocol import (
    CONTAINER_ID_ENV,
    COORDINATOR_URL_ENV,
    COORDINATORS_ENV,
    JOB_ENV,
    ContainerModel,
    HeartbeatReply,
    JobModel,
    ProgressReport,
    Registration,
)

__all__ = [
    "GROUP_COMMIT_S",
    "JobShape",
    "PartitionWatch",
    "Supervisor",
    "group_offsets",
    "input_lag",
    "status_json",
]

AFTER_GROWTH = "afterGrowth"
"""The store's key for the change a growth rolled back (its target), asked again after it."""

Clock = Callable[[], float]


@dataclass(frozen=True)
class JobShape:
    """What the coordinator needs of a job definition: no Spark, no user code.

    Attributes
    ----------
    name
        The job's name.
    spec
        How containers load the job (``file.py:attribute`` or ``module:attribute``).
    elasticity_factor
        Virtual tasks per partition.
    partitions
        Partition count per input topic.
    tasks
        Every virtual task's name, in plan order.
    checkpoint_root
        Local directory under which generations keep their checkpoints.
    grouper
        The job's grouper name.
    stateful
        Whether the job keeps keyed state (a ``TaskProcessor``).
    time_ordered
        Whether its tasks merge their partitions by timestamp (``Job.time_ordered``):
        then the status shows the records they processed without waiting.
    """

    name: str
    spec: str
    elasticity_factor: int
    partitions: Mapping[str, int]
    tasks: tuple[str, ...]
    checkpoint_root: str
    grouper: str = "partition"
    stateful: bool = False
    time_ordered: bool = False

    def checkpoint_of(self, generation: int, container_id: str) -> str:
        """Where a generation keeps its checkpoint.

        Parameters
        ----------
        generation
            The generation number.
        container_id
            The container that owns it.

        Returns
        -------
        str
            ``<root>/generations/<generation:06d>-<container_id>``.
        """
        # Joined as text: a root on HDFS or S3 is a URI, which Path would fold.
        return f"{self.checkpoint_root.rstrip('/')}/generations/{generation:06d}-{container_id}"


def _shown(handle: str) -> str:
    """A launcher's handle in an event: ``pid 4242`` for a local process, else as it is."""
    return f"pid {handle}" if handle.isdigit() else f"handle {handle}"


def _cause_of(reason: str) -> str:
    """A failure's cause without its figures, so that failures of one cause count together."""
    return "lease expired" if reason.startswith("lease expired") else reason


def _sorted(containers: Sequence[ContainerModel]) -> tuple[ContainerModel, ...]:
    return tuple(sorted(containers, key=lambda c: c.container_id))


@dataclass
class _Live:
    """In-memory lease state of one live container (monotonic times)."""

    renewed_at: float
    registered: bool
    last_valid_beat: float = 0.0
    launched_at: float = 0.0
    """When it was launched (or the coordinator restarted): its start-up bound counts from
    here, whatever it heartbeats before it registers."""


class Supervisor:
    """The coordinator's state machine over its store.

    Parameters
    ----------
    shape
        The job's shape.
    store
        The coordinator's store.
    launcher
        Starts and signals container processes (through :class:`.processes.Processes`).
    url
        The coordinator's URL, passed to containers.
    containers
        How many containers a new job gets.
    terms
        Lease terms.
    startup_s
        How long a launched container may take to register.
    container_env
        Extra environment for containers (heartbeat interval, write budget, master).
    clock
        Monotonic clock (tests pass their own).
    watch
        Where the inputs' partition counts are read (SEP-5's monitor); ``None``
        turns the monitor off.
    partition_check_s
        How often the monitor looks (Samza's default: 5 minutes).
    autoscaler
        The autoscaler's settings, checked against the task count and kept
        in the store; None keeps the store's (off for a new store).
    warm_ups
        Whether a move's new owners start before their old owners stop
        (KIP-441's warm-ups, the default); False launches each only once its
        tasks are handed over (a *cold* move, for comparison).
    catch_up_s
        How long a moving group's old owners keep running, listed as
        stopping, for replaying warm-ups to say they caught up with them;
        they stop after it anyway. They keep publishing meanwhile, so waiting
        costs no output; stopping them early makes the new owners' first
        batch apply what the warm-ups had not.
    warm_up_deadline_s
        How long a move's warm-ups may take to be ready (each group's
        warming phase): past it the move is rolled back, or, once a group has
        moved, its warm-ups start again (:mod:`.changes`).
    max_start_failures
        Failures in a row, of one cause, of a task set's containers before
        their first commit, after which the job stops as failed (saying why);
        until then each successor launches after an exponential backoff.
    """

    def __init__(
        self,
        shape: JobShape,
        store: Store,
        launcher: Launcher,
        url: str,
        containers: int,
        terms: LeaseTerms,
        startup_s: float = 180.0,
        container_env: Mapping[str, str] | None = None,
        clock: Clock = time.monotonic,
        watch: PartitionWatch | None = None,
        partition_check_s: float = 300.0,
        autoscaler: AutoscalerConfig | None = None,
        warm_ups: bool = True,
        catch_up_s: float = 60.0,
        warm_up_deadline_s: float = 600.0,
        max_start_failures: int = 5,
    ) -> None:
        self.shape = shape
        self.max_start_failures = max_start_failures
        self.crash_loops = CrashLoops()
        self._job_state: dict[str, Any] = {"state": "running", "at": None, "why": ""}
        self.warm_ups = warm_ups
        self.store = store
        self.processes = Processes(launcher, clock, terms.lease_s)
        self.url = url
        self.terms = terms
        self.startup_s = startup_s
        self.container_env = dict(container_env or {})
        self.clock = clock
        self.counters: dict[str, int] = {}
        self._live: dict[str, _Live] = {}
        self.records: dict[str, ContainerRecord] = {}
        self.partitions = PartitionMonitor(self, watch, partition_check_s, shape.grouper)
        # The change a growth rolled back, asked for again once nothing is in flight.
        after_growth = self.store.meta(AFTER_GROWTH)
        self._after_growth: dict[str, Any] | None = (
            json.loads(after_growth) if after_growth else None
        )
        # Predecessors a successor waits for, finishing their batch in flight.
        self.retiring = Retiring(terms.lease_s)
        self.moves = Mover(self, shape.stateful, catch_up_s)
        # One coordinator per job: a second one is refused here, before it changes anything.
        claimed = store.epoch is None
        if claimed:
            store.claim(url)
        # A coordinator after another (a restart, or a standby taking over) waits before it acts.
        self.leadership = Leadership(store, url, clock, terms.margin_s, (store.epoch or 1) > 1)
        self._last_status: dict[str, Any] | None = None
        try:
            text = self.store.meta("jobState")
            if text:
                self._job_state = dict(json.loads(text))
            self.flight = InFlight(store, clock, warm_up_deadline_s)
            self.model = self._load_or_plan(containers)
            # Containers that committed before a restart are past their start.
            self.crash_loops.past_start(self.store.throughput())
            self.autoscaling = Autoscaling.load(store, clock, autoscaler, self._task_count())
        except BaseException:
            if claimed:
                store.release()
            raise

    # 1. plan once

    def _load_or_plan(self, containers: int) -> JobModel:
        stored = self.store.latest_model()
        if stored is None:
            return self._plan(containers)
        self._check_same_job(stored)
        now = self.clock()
        for record in self.store.containers():
            self.records[record.id] = record
            if record.live:
                # Renewal times died with the previous coordinator: a fresh lease from now.
                self._live[record.id] = _Live(
                    now, record.state in ("running", "warm"), launched_at=now
                )
            elif record.state == "retired" and record.handle is not None:
                # It may still be stopping: its successor waits for it as for a live lease.
                self.retiring.retire(record.id, now, now)
        self.store.event("start", detail=f"coordinator restarted on job model {stored.version}")
        return self._resume(stored)

    def _resume(self, model: JobModel) -> JobModel:
        """A stopped (or failed) job runs again: each stopped container's tasks go to a
        successor that starts from its last commits, as after a failover.

        A stop in the middle of a move stopped its warm-ups too: each gets a
        fresh successor (a warm-up owns nothing yet), and the move goes on.
        """

        def stopped(c: ContainerModel) -> bool:
            # A failed job's containers are stopped, the one that failed last is "failed".
            return self.records[c.container_id].state in ("stopped", "failed")

        owners = [c for c in model.containers if stopped(c)]
        warmups = [w for w in model.warmups if stopped(w)]
        if not owners and not warmups and self.job_state()["state"] == "running":
            return model
        with self.store.transaction() as db:
            heirs = {
                c.container_id: self.new_container(
                    db, c.tasks, self.sources_of(self.records[c.container_id])
                )
                for c in owners
            }
            heirs.update({w.container_id: self.new_container(db, w.tasks, ()) for w in warmups})
            resumed = self.next_model(
                db,
                model,
                containers=[heirs.get(c.container_id, c) for c in model.containers],
                warmups=[heirs.get(w.container_id, w) for w in model.warmups],
                stopping=tuple(c for c in model.stopping if c not in heirs),
            )
            self._set_job_state(db, "running", "resumed")
            self.flight.resume(db)
            self.store.add_event(
                db,
                "resume",
                detail=f"job resumed: {len(owners)} containers' tasks go to successors that "
                f"start from their last commits"
                + (f", {len(warmups)} warm-ups start again" if warmups else "")
                + f" (job model {resumed.version})",
            )
        return resumed

    def serving(self) -> None:
        """The coordinator now answers heartbeats: every lease it knows starts from now.

        Called once its server listens. A restarted coordinator gave its
        containers fresh leases when it read its store; however long it then
        took to listen (loading the job, a loaded machine) must not count
        against them, or it would fail over containers that could not reach it.
        """
        now = self.clock()
        for live in self._live.values():
            live.renewed_at = max(live.renewed_at, now)
            live.launched_at = max(live.launched_at, now)
        self.retiring.serving(now)

    def deaf_for(self, seconds: float) -> None:
        """The coordinator heard no one for the last ``seconds``: no lease is charged for them.

        Called by the server when its loop was held (the process descheduled
        on a loaded machine, a slow step): heartbeats sent meanwhile are still
        queued, and judging leases before reading them would fail over
        containers that did renew. So leases count only the time the
        coordinator could listen: every renewal (and launch) from before the
        stall moves later by its length; one heard since is not moved. A
        container that is really gone still fails over, after a lease and its
        margin of listening. Moving a lease later only delays a failover,
        never lets two owners write (a container's own lease counts from the
        renewal it last had answered), as :meth:`serving` does for a restart.

        Parameters
        ----------
        seconds
            How long the loop could not serve requests, up to now.
        """
        if seconds <= 0:
            return
        began = self.clock() - seconds
        for live in self._live.values():
            if live.renewed_at <= began:
                live.renewed_at += seconds
            if live.launched_at <= began:
                live.launched_at += seconds
        self.retiring.deaf_for(began, seconds)
        self.count("stalls")

    def _check_same_job(self, stored: JobModel) -> None:
        shape = self.shape
        # Inputs that grew (SEP-5) since the store was written are the same job: the
        # monitor takes the growth up; anything else would remap keys.
        grown = judge_counts(stored.planned, stored.partitions, shape.partitions)
        # A live factor change makes the model's factor the job's; the definition may
        # still say the one it was planned at.
        factors = {stored.elasticity_factor, int(self.store.meta("plannedFactor") or 0)}
        if (
            stored.job != shape.name
            or shape.elasticity_factor not in factors
            or grown.verdict == "refused"
        ):
            raise ArgumentError.invalid(
                "--store",
                f"the store of job {shape.name!r} with partitions {dict(shape.partitions)} and "
                f"factor {shape.elasticity_factor} (a restart must not remap keys; use a new "
                "store or a rescale)",
                f"job {stored.job!r} with partitions {dict(stored.partitions)} and factor "
                f"{stored.elasticity_factor} in {self.store.location}",
            )

    def _plan(self, containers: int) -> JobModel:
        chunks = initial_assignment(self.shape.tasks, containers)
        entries = []
        with self.store.transaction() as db:
            self.store.set_meta(db, "job", self.shape.name)
            self.store.set_meta(db, "spec", self.shape.spec)
            self.store.set_meta(db, "plannedFactor", str(self.shape.elasticity_factor))
            for tasks in chunks:
                entries.append(self.new_container(db, tasks, ()))
            # Version 1 follows an empty version 0, which is never stored.
            empty = JobModel(
                0, self.shape.name, self.shape.elasticity_factor, dict(self.shape.partitions)
            )
            model = self.next_model(db, empty, containers=entries)
            self.store.add_event(
                db,
                "start",
                detail=f"job model 1: {len(self.shape.tasks)} tasks in {containers} containers",
            )
        return model

    def next_model(self, db: Any, base: JobModel | None = None, **changes: Any) -> JobModel:
        """The job model's next version, saved in ``db``'s transaction: the one writer of
        job model versions.

        ``changes`` (``JobModel`` fields) are applied to ``base`` (default:
        the current model), the version is one higher, and the containers and
        warm-ups are in id order. The caller sets ``self.model`` once its
        own steps are done.
        """
        base = self.model if base is None else base
        model = replace(base, **changes, version=base.version + 1)
        model = replace(model, containers=_sorted(model.containers), warmups=_sorted(model.warmups))
        self.store.save_model(db, model)
        return model

    def new_container(
        self, db: Any, tasks: tuple[str, ...], sources: tuple[str, ...]
    ) -> ContainerModel:
        generation = self.store.next_generation(db)
        container_id = f"{self.shape.name}-c{generation}"
        checkpoint = self.shape.checkpoint_of(generation, container_id)
        record = ContainerRecord(
            container_id,
            generation,
            "launching",
            None,
            "",
            tasks,
            checkpoint,
            sources,
            None,
            None,
            None,
        )
        self.store.add_container(db, record)
        self.records[container_id] = record
        return ContainerModel(container_id, tasks, generation, checkpoint, sources)

    def launch_pending(self) -> None:
        """Start every container that is launching, has no process yet, and waits for no one."""
        for record in list(self.records.values()):
            if (
                record.state == "launching"
                and record.handle is None
                and not self._waits(record)
                and not self.waits_cold(record.id)
                and self.crash_loops.may_launch(record.id, self.clock())
            ):
                self._launch(record)

    def waits_cold(self, container_id: str) -> bool:
        """A new owner that, with warm-ups off, waits for its tasks to be handed over."""
        return not self.warm_ups and self.model.warmup(container_id) is not None

    def _waits(self, record: ContainerRecord) -> bool:
        """Whether a predecessor retired by a handover may still write."""
        return any(self.records[old].checkpoint in record.sources for old in self.may_write())

    def may_write(self) -> list[str]:
        """Retired containers that may still write: not gone, nor said their query stopped.

        A question only: what it knows is as of the last :meth:`_reap_retired` (each
        tick), which can only make it wait longer, never less.
        """
        return self.retiring.may_write()

    def _reap_retired(self) -> None:
        """Forget retired containers that stopped; kill those whose lease and margin ran
        out by this clock (they write nothing any more). The rest may still write.

        A container that stopped has stopped its query: what is left of its
        process group (its JVM on the way out) is killed, so nothing of it can
        commit once its successor reads its final offsets. One killed at its
        lease's end is forgotten only once its process is seen gone, at a later
        tick: SIGKILL takes effect asynchronously, and no successor is launched
        beside a process still on its way out."""
        for old_id in self.retiring:
            old = self.records[old_id]
            stopped = not self.processes.alive(old.handle, old_id)
            if stopped or self.clock() > self.terms.reassignable_at(
                self.retiring.renewed_at(old_id)
            ):
                self.processes.kill(old.handle, old_id)
            if stopped:
                self.retiring.forget(old_id)

    def _launch(self, record: ContainerRecord) -> None:
        # Where else to look for the job's leader: the operator's peers and the standbys.
        others = [u for u in self.container_env.get(COORDINATORS_ENV, "").split(",") if u]
        others += [standby["url"] for standby in self.store.standbys()]
        env = {
            **self.container_env,
            CONTAINER_ID_ENV: record.id,
            COORDINATOR_URL_ENV: self.url,
            COORDINATORS_ENV: ",".join(dict.fromkeys(others)),
            JOB_ENV: self.shape.spec,
        }
        handle = self.processes.launch(record.id, env)
        with self.store.transaction() as db:
            self.store.update_container(db, record.id, handle=handle, launched_at=time.time())
            self.store.add_event(
                db, "launch", record.id, f"{_shown(handle)}, generation {record.generation}"
            )
        self.set_record(record.id, handle=handle, launched_at=time.time())
        self._live[record.id] = _Live(self.clock(), False, launched_at=self.clock())

    def set_record(self, container_id: str, **changes: Any) -> None:
        record = self.records[container_id]
        self.records[container_id] = ContainerRecord(**{**record.__dict__, **changes})

    # 2. lease

    def count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    def _reply(self, container_id: str) -> HeartbeatReply:
        live = self._live.get(container_id)
        now = self.clock()
        if live is None and self.retiring.heard(container_id, now):
            # Retired and finishing its batch in flight: its lease holds until it exits
            # (its successor waits for that) or its time to finish runs out.
            self.count("heartbeats_alive")
            return HeartbeatReply(True, self._granted_ms(), self.model.version)
        if live is None:
            self.count("heartbeats_invalid")
            return HeartbeatReply(False, 0, self.model.version)
        live.renewed_at = now
        live.last_valid_beat = now
        self.count("heartbeats_alive")
        return HeartbeatReply(True, self._granted_ms(), self.model.version)

    def _granted_ms(self) -> int:
        """A container lease, nested in this coordinator's hold on its store."""
        return int(self.leadership.grant(self.terms.lease_s) * 1000)

    def heartbeat(
        self, container_id: str, caught_up: bool = False, stopped: bool = False
    ) -> HeartbeatReply:
        """Answer SAMZA-871's heartbeat; renew the lease of a live container.

        Parameters
        ----------
        container_id
            The id from ``executionContainerId``.
        caught_up
            A warm-up says it has applied everything its stopping old owners
            committed (``caughtUp=true``): its query waits at its gate, so
            its first batch as owner will publish.
        stopped
            A retired container says its query has stopped (``stopped=true``):
            it writes nothing any more, so its successors need not wait for
            its process to exit.

        Returns
        -------
        HeartbeatReply
            ``alive`` and the lease, or ``alive: false`` (counted) for a
            container that is not live.
        """
        reply = self._reply(container_id)
        if reply.alive and caught_up and self.model.warmup(container_id) is not None:
            self.moves.caught_up(container_id)
        if reply.alive and stopped:
            self.retiring.said_stopped(container_id)
        return reply

    def register(self, registration: Registration) -> HeartbeatReply:
        """A launched container announces its process; grants its first lease.

        Parameters
        ----------
        registration
            Its id, PID and Spark application id.

        Returns
        -------
        HeartbeatReply
            As for a heartbeat.
        """
        reply = self._reply(registration.container_id)
        if reply.alive:
            cid = registration.container_id
            self._live[cid].registered = True
            # A warm-up registers once its Spark application is up: ready for the move.
            warmup = self.model.warmup(cid)
            state = "warm" if warmup is not None else "running"
            # The launcher's handle stays the container's: the PID it reports is its own,
            # on a host the coordinator may not share.
            handle = self.records[cid].handle
            handle = str(registration.pid) if handle is None else handle
            with self.store.transaction() as db:
                self.store.update_container(
                    db,
                    cid,
                    state=state,
                    handle=handle,
                    spark_app=registration.spark_app_id,
                    registered_at=time.time(),
                )
                if warmup is not None:
                    self.store.add_event(
                        db,
                        "warm",
                        cid,
                        f"pid {registration.pid}: ready to take {len(warmup.tasks)} tasks",
                    )
                else:
                    self.store.add_event(db, "register", cid, f"pid {registration.pid}")
            self.set_record(cid, state=state, handle=handle, registered_at=time.time())
        return reply

    def progress(self, report: ProgressReport) -> HeartbeatReply:
        """Keep a container's committed positions; renews its lease too.

        Parameters
        ----------
        report
            The container's last committed batch.

        Returns
        -------
        HeartbeatReply
            As for a heartbeat.
        """
        reply = self._reply(report.container_id)
        if reply.alive:
            mine = set(self.records[report.container_id].tasks)
            strangers = [t.task for t in report.tasks if t.task not in mine]
            if strangers:
                raise ProtocolError(
                    f"progress: container {report.container_id!r} reported task "
                    f"{strangers[0]!r}, which it does not own"
                )
            self.store.save_progress(report)
            self.autoscaling.keep_report(report, self._live)
            self.crash_loops.commit(report.container_id)
        return reply

    def _task_lags(self, progress: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, int]:
        """Each task's lag as its current owner reported it; -1 until the owner reports
        (a previous owner's figure went stale when it stopped). From ``progress`` if
        given (the status's read of it), else from the store."""
        owner = self.model.owner_of()
        progress = self.store.progress() if progress is None else progress
        return {
            task: progress[task]["lag"]
            if progress.get(task, {}).get("container") == owner.get(task)
            else -1
            for task in owner
        }

    # 3. expire, 4. fail over

    def _expired(self, container_id: str, now: float) -> str | None:
        """Why a live container's tasks may move now, or None."""
        live = self._live[container_id]
        record = self.records[container_id]
        if live.registered:
            if now > self.terms.reassignable_at(live.renewed_at):
                late = now - self.terms.coordinator_expiry(live.renewed_at)
                return f"lease expired {late:.1f} s ago (margin {self.terms.margin_s:.1f} s)"
            return None
        # Not registered: it never held a lease, so it cannot have written anything.
        if record.handle is not None and not self.processes.alive(record.handle, container_id):
            return "its process exited before it registered"
        # A warm-up's readiness is bounded by its change's deadline (it may take long to
        # follow its old owners); anything else must register within the start-up bound,
        # counted from its launch whatever it heartbeats meanwhile.
        if self.model.warmup(container_id) is None and now > live.launched_at + self.startup_s:
            return f"it did not register within {self.startup_s:.0f} s of its launch"
        return None

    def tick(self) -> None:
        """Fail over every container whose lease (or start-up time) ran out; launch pending ones."""
        self.processes.reap()
        self.leadership.renew_if_due()
        if self.leadership.store_error:
            return  # the store is out of reach: nothing is decided that could not be written
        if self._job_state["state"] != "running":
            return  # a failed job: nothing is launched or moved until `job run` resumes it
        if not self.leadership.may_act():
            return  # not surely leading, or a new leader waiting out its predecessor's leases
        now = self.clock()
        for container_id in sorted(self._live):
            reason = self._expired(container_id, now)
            if reason is not None and container_id in self._live:
                self.fail_over(container_id, reason)
            if self._job_state["state"] != "running":
                return
        self._reap_retired()
        self.partitions.advance()
        self.moves.advance()
        self.flight.settle(self)
        self._ask_again_after_growth()
        self.launch_pending()
        if self.autoscaler.mode != "off":
            try:
                self.autoscaling.decide(self.observe_load(), self, self.count)
            except Exception as exc:  # an optional policy must never stop leases and failovers
                self.autoscaling.failed(exc, len(self.model.containers))

    # 5. partitions (SEP-5)

    @property
    def watch(self) -> PartitionWatch | None:
        """Where the inputs' partitions are read (None: no monitor)."""
        return self.partitions.watch

    @property
    def input_health(self) -> InputHealth:
        """Whether the input answers the coordinator's calls (the server tells it each outcome)."""
        return self.partitions.health

    def partition_check_due(self) -> bool:
        """Whether the monitor should look at the inputs now (the server asks each tick).

        Returns
        -------
        bool
            True once per ``partition_check_s`` while a watch is set, whatever
            change is under way (a growth starts only when none is).
        """
        return self.partitions.check_due()

    def group_offsets_due(self) -> dict[str, dict[int, int]] | None:
        """What the job's consumer group should show now, if it is due and has moved.

        The checkpoints stay the truth; the group (named for the job) is a view
        for Kafka's own tools (``kafka-consumer-groups --describe``). Asked each
        tick by the server, which commits the offsets off the loop.

        Returns
        -------
        dict or None
            ``{topic: {partition: next offset}}`` (see :func:`.status.group_offsets`),
            or None: no view for this input, not due yet (every
            :data:`.partitions.GROUP_COMMIT_S`), or nothing moved since the last commit.
        """
        return self.partitions.group_offsets_due()

    def group_offsets_shown(self, offsets: Mapping[str, Mapping[int, int]]) -> None:
        """The server committed ``offsets`` to the job's group: only a move commits again."""
        self.partitions.group_offsets_shown(offsets)

    def observe_partitions(
        self, counts: Mapping[str, int], ends: Mapping[str, Mapping[int, int]]
    ) -> str:
        """Take in what the monitor saw: start a growth, or report a change it refuses.

        Parameters
        ----------
        counts
            ``{topic: partitions}`` now.
        ends
            ``{topic: {partition: end offset}}`` now, read right after the counts.

        Returns
        -------
        str
            The verdict: ``"same"``, ``"growth"`` (one began), ``"growing"``
            (the growth under way), ``"refused"``, or ``"waits"``: the inputs
            grew during a change that can no longer be rolled back, and the
            growth starts once it ends.
        """
        verdict = self.partitions.observe(counts, ends)
        change = self.change
        if verdict != "waits" or change is None or refuse_cancel(change) is not None:
            return verdict
        # A growth is never held hostage by a change: one that can still be undone is,
        # and asked again once the growth is done (the new partitions are read meanwhile).
        self.flight.roll_back(
            self,
            f"the inputs grew to {dict(counts)}; the growth goes first, then the change is "
            "asked again",
            "partitions",
        )
        # Kept in the store: a coordinator restarted meanwhile asks for it too. (Killed
        # between the roll back and this, it does not: the operator asks again.)
        self._after_growth = dict(change.target)
        with self.store.transaction() as db:
            self.store.set_meta(db, AFTER_GROWTH, json.dumps(change.target, sort_keys=True))
        self.partitions.begin_waiting()
        return "growth"

    def _ask_again_after_growth(self) -> None:
        """Ask again for the change a growth rolled back, once nothing else is in flight."""
        target = self._after_growth
        if not target or self.change is not None or self.partitions.waiting is not None:
            return
        try:
            if "containers" in target:
                summary = self.scale(int(target["containers"]))
            else:
                summary = self.change_factor(int(target["elasticityFactor"]))
        except ChangeRefusedError:
            return  # containers still starting, say: the next tick asks again
        except ArgumentError as exc:  # the grown job cannot take it: said, not retried
            summary = f"not taken: {exc}"
        self._after_growth = None
        with self.store.transaction() as db:
            self.store.set_meta(db, AFTER_GROWTH, "")
            self.store.add_event(
                db, "partitions", detail=f"the change rolled back for the growth: {summary}"
            )

    # the change in flight

    @property
    def change(self) -> Change | None:
        """The change in flight (growth, scale, factor change), or None (:mod:`.in_flight`)."""
        return self.flight.change

    def nothing_left(self) -> bool:
        """Nothing of the change is left: no warm-up, no drain, no predecessor still
        stopping, and every container of the job model runs."""
        return (
            not self.model.warmups
            and self.partitions.growth() is None
            and not self.retiring
            and all(self.records[c.container_id].state == "running" for c in self.model.containers)
        )

    def cancel_change(self) -> str:
        """Roll the change in flight back, as the operator asks: its warm-ups stop, the old
        owners keep their tasks. Returns the event's line; raises
        :class:`~spark_elastic.errors.ChangeRefusedError` saying why when it cannot
        (:meth:`.in_flight.InFlight.cancel`)."""
        return self.flight.cancel(self)

    def is_live(self, container_id: str) -> bool:
        """Whether the container holds a lease (or is starting to)."""
        return container_id in self._live

    def call_off_moves(self) -> None:
        """The move was rolled back: nothing of it is catching up any more."""
        self.moves.call_off()

    def doom(self, container_id: str, state: str) -> None:
        """No lease any more: stopped now, killed a lease later unless it exited."""
        self._live.pop(container_id, None)
        self.set_record(container_id, state=state, ended_at=time.time())
        self.processes.doom(self.records[container_id].handle, container_id)

    # crash loops

    def report_failure(self, container_id: str, cause: str) -> HeartbeatReply:
        """A container says why it failed, before it exits (its query has stopped).

        Its tasks move at once, as after an expired lease (nothing of it
        writes any more), and the cause shows in the events and the status.

        Parameters
        ----------
        container_id
            The failed container.
        cause
            The exception's first line.

        Returns
        -------
        HeartbeatReply
            ``alive: false``.
        """
        cause = " ".join(cause.split())[:500] or "unknown"
        self.crash_loops.reported(container_id, cause)
        if container_id in self.records:
            self.store.event("fail", container_id, cause)
        if container_id in self._live and self._job_state["state"] == "running":
            self.fail_over(container_id, f"it failed: {cause}")
        return HeartbeatReply(False, 0, self.model.version)

    def _fail_job(self, old_id: str, reason: str, tally: StartFailures) -> None:
        """Too many failures at start: every container stops, the job is failed, saying why."""
        who = (
            "a container failed before its"
            if tally.count == 1
            else f"{tally.count} containers in a row failed before their"
        )
        why = f"{who} first commit: {tally.cause}"
        others = [r.id for r in self.records.values() if r.live and r.id != old_id]
        with self.store.transaction() as db:
            self.store.update_container(db, old_id, state="failed", ended_at=time.time())
            for container_id in others:
                self.store.update_container(db, container_id, state="stopped", ended_at=time.time())
            self.store.add_event(db, "expire", old_id, reason)
            self.store.add_event(
                db, "failed", detail=f"job failed: {why}; `job run` again resumes it once fixed"
            )
            self._set_job_state(db, "failed", why)
            if self.change is not None:
                self.flight.save(db, None)
        self.doom(old_id, "failed")
        for container_id in others:
            self.doom(container_id, "stopped")
        self.count("failovers")

    # 6. scale

    def scale(self, containers: int, reason: str = "") -> str:
        """Run the job's tasks on ``containers`` containers from now on (KIP-441 moves).

        The assignor plans the moves, sticky: a container whose tasks stay the
        same keeps running. Every other one hands over to a successor, like a
        growth handover: the successor starts once its predecessors stopped
        (or their leases ran out), a stateless one from the offsets they
        committed (the lowest where two read one partition: output is
        at-least-once).

        A stateful job moves as KIP-441 does: the successors are launched
        first, as *warm-ups* (``JobModel.warmups``), while the old owners keep
        running every task. Once every warm-up is ready, the probing move
        (:meth:`.moves.Mover.advance`, on the ticks) stops the old owners at a batch
        boundary and then hands each warm-up its tasks, with their committed
        state (a subset :func:`~spark_elastic.rescale` of the old owners'
        checkpoints, in the warm-up's own Spark application).

        Parameters
        ----------
        containers
            The new container count, from 1 to the job's task count.
        reason
            Why, when the autoscaler asks: the change's event is then an
            ``autoscale`` event that starts with it (else a ``scale`` event).

        Returns
        -------
        str
            What changed, in one line.

        Raises
        ------
        ArgumentError
            ``containers`` out of range.
        ChangeRefusedError
            Another change (a growth, a handover, a move) is under way.
        """
        tasks = [t for c in self.model.containers for t in c.tasks]
        if isinstance(containers, bool) or not isinstance(containers, int) or containers < 1:
            raise ArgumentError.invalid("containers", "a whole number >= 1", containers)
        if containers > len(tasks):
            raise ArgumentError.invalid(
                "containers", f"at most the job's {len(tasks)} virtual tasks", containers
            )
        self._refuse_if_busy()
        current = list(self.model.containers)
        if containers == len(current):
            return f"already {containers} containers: nothing to do"
        plan = scale_assignment(tasks, current, containers)
        kept = [c for c in current if c.tasks in plan]
        moved = [c for c in current if c.tasks not in plan]
        new_sets = [t for t in plan if t not in {c.tasks for c in kept}]
        if self.shape.stateful:
            return self._start_move(
                scale_move(len(current), containers, new_sets, len(kept), len(moved)), reason
            )
        summary = self.moves.hand_over(
            scale_move(len(current), containers, new_sets, len(kept), len(moved), warm_ups=False),
            kept,
            moved,
            reason,
        )
        # Any change of the count, a person's too, starts the autoscaler's cool-down.
        self.autoscaling.start_cool_down()
        return summary

    def _start_move(self, plan: MovePlan, reason: str) -> str:
        summary = self.moves.start(plan, reason)
        # Any change, a person's too, starts the autoscaler's cool-down.
        self.autoscaling.start_cool_down()
        return summary

    def change_factor(self, factor: int, reason: str = "") -> str:
        """Run the job at elasticity factor ``factor`` from now on, one container at a time.

        Each container gets a warm-up that will own its keys at the new factor
        (a split gives it its tasks' children; a merge gives each parent to
        the first container, by generation, that holds one of its children).
        The move then goes group by group (:meth:`.moves.Mover.advance`): a group's
        old owners stop at a batch boundary, and its warm-ups rescale their
        committed checkpoints to the new factor and start, while the rest of
        the job keeps running. Between groups the job runs at both factors,
        each key in exactly one task.

        Parameters
        ----------
        factor
            The new factor, a power of two from 1 to 1024.
        reason
            Why, when the autoscaler asks (see :meth:`scale`).

        Returns
        -------
        str
            What will change, in one line.

        Raises
        ------
        ArgumentError
            Not a power of two from 1 to 1024, or the job's tasks have no key buckets.
        ChangeRefusedError
            Another change is under way.
        """
        factor = validate_elasticity_factor(factor, "elasticity_factor")
        current = list(self.model.containers)
        names = [parsed(t) for c in current for t in c.tasks]
        if names and names[0].kind is TaskKind.SINGLE:
            raise ArgumentError.invalid(
                "elasticity_factor",
                "a job whose grouper has key buckets (AllSspToSingleTask has one task)",
                factor,
            )
        self._refuse_if_busy()
        old = self.model.elasticity_factor
        if factor == old:
            return f"already at elasticity factor {factor}: nothing to do"
        return self._start_move(factor_move(old, factor, current), reason)

    def _refuse_if_busy(self) -> None:
        if self._job_state["state"] != "running":
            raise ChangeRefusedError(
                f"the job is {self._job_state['state']} ({self._job_state['why']}); "
                "`job run` resumes it"
            )
        self.flight.settle(self)  # one that is done since the last tick is over now
        if self.change is not None:
            raise ChangeRefusedError(
                f"a change is under way ({self.change.describe()}); retry after it, or cancel "
                "it (job scale URL --cancel)"
            )
        grown = self.partitions.waiting
        if grown is not None:
            raise ChangeRefusedError(
                f"the inputs grew to {grown['counts']} and that growth goes first; retry after it"
            )
        waiting = sorted(r.id for r in self.records.values() if r.state == "launching")
        if waiting:
            raise ChangeRefusedError(
                f"containers {waiting} are still starting; retry once they run"
            )

    def retire(self, records: Sequence[ContainerRecord]) -> None:
        """Stop predecessors at a batch boundary; successors wait for them (``_waits``).

        Each gets SIGTERM and one lease to finish its micro-batch in flight
        and stop (its heartbeats renew its lease until then), so its last
        records are published by it, not replayed by its successor.
        """
        for record in records:
            live = self._live.pop(record.id, None)
            self.set_record(record.id, state="retired", ended_at=time.time())
            if live is not None and record.handle is not None:
                self.retiring.retire(record.id, live.renewed_at, self.clock())
                self.processes.stop(record.handle, record.id)

    def sources_of(self, record: ContainerRecord) -> tuple[str, ...]:
        """Where a successor of ``record`` starts from: its checkpoint once it reported a
        committed batch, else what it was given (its own sources are never modified).

        Known from its progress reports, not from its checkpoint's files: the
        coordinator need not share a disk, or a host, with its containers. A
        container that committed a batch but died before reporting it hands on
        its sources: its successor replays from there (state stays exact, its
        bucket offsets committed with it; output is at-least-once anyway).
        """
        return record.sources if self.crash_loops.at_start(record.id) else (record.checkpoint,)

    def fail_over(self, old_id: str, reason: str) -> None:
        """Replace a live container by a new one of the next generation that takes its tasks
        (a warm-up by another warm-up), or end a crash loop (:mod:`.crash_loops`)."""
        old = self.records[old_id]
        warming = self.model.warmup(old_id) is not None
        # A container that never committed failed at start: its successor inherits the
        # tally, waits its backoff, and too many of one cause fail the job.
        at_start = self.crash_loops.at_start(old_id)
        tally = StartFailures()
        if at_start:
            tally = self.crash_loops.failed_at_start(old_id, _cause_of(reason))
            if tally.count >= self.max_start_failures:
                change = self.change
                if warming and change is not None and refuse_cancel(change) is None:
                    self.store.event("expire", old_id, reason)
                    self.flight.roll_back(
                        self,
                        f"{tally.count} warm-ups in a row failed before they were ready: "
                        f"{tally.cause}",
                        "rollback",
                    )
                else:
                    self._fail_job(old_id, reason, tally)
                return
            reason = f"{reason} (failure {tally.count} at start; its successor waits " + (
                f"{backoff_s(tally.count):.0f} s)"
            )
        # The new generation starts from the old one's committed prefix; a warm-up that
        # failed is replaced by another (it owned nothing yet).
        warming = self.model.warmup(old_id) is not None
        # A failover calls off a handover's first phase (its group is no longer ready): the
        # owners listed as stopping that still run go on, and their warm-ups follow again.
        stopping = tuple(c for c in self.model.stopping if self.records[c].state == "retired")
        with self.store.transaction() as db:
            new = self.new_container(db, old.tasks, () if warming else self.sources_of(old))
            if warming:
                warmups = [w for w in self.model.warmups if w.container_id != old_id]
                model = self.next_model(db, warmups=[*warmups, new], stopping=stopping)
            else:
                containers = [c for c in self.model.containers if c.container_id != old_id]
                model = self.next_model(db, containers=[*containers, new], stopping=stopping)
            self.store.update_container(db, old_id, state="expired", ended_at=time.time())
            self.store.add_event(db, "expire", old_id, reason)
            self.store.add_event(
                db,
                "failover",
                new.container_id,
                f"takes {len(old.tasks)} tasks of {old_id} in generation {new.generation}, "
                f"job model {model.version}",
            )
        self.set_record(old_id, state="expired", ended_at=time.time())
        del self._live[old_id]
        self.model = model
        if at_start:
            self.crash_loops.inherit(new.container_id, tally, self.clock())
        if self.change is not None and self.change.phase == CATCHING_UP and not model.stopping:
            # A failover calls the catching-up phase off: the group is no longer ready.
            with self.store.transaction() as db:
                self.flight.enter(db, WARMING)
        self.count("failovers")
        # Fenced already (its lease is over); killing it just frees its resources.
        self.processes.kill(old.handle, old_id)

    # 7. autoscale

    def _task_count(self) -> int:
        return sum(len(c.tasks) for c in self.model.containers)

    @property
    def autoscaler(self) -> AutoscalerConfig:
        """The autoscaler's settings in force (:class:`.autoscaling.Autoscaling` keeps them)."""
        return self.autoscaling.config

    @property
    def decision(self) -> Decision | None:
        """The autoscaler's last decision, or None before its first."""
        return self.autoscaling.decision

    def configure_autoscaler(self, changes: Mapping[str, Any]) -> str:
        """Turn the autoscaler on or off, pin it, or change its bounds (``POST /autoscaler``).

        Parameters
        ----------
        changes
            Some of :meth:`AutoscalerConfig.to_json`'s keys: ``{"enabled": b}``,
            ``{"pinned": N}``, ``{"minContainers": A, "maxContainers": B}``...

        Returns
        -------
        str
            The new settings, in one line.

        Raises
        ------
        ArgumentError, ArgumentTypeError
            An unknown key, a bad value, or bounds that contradict each other
            or the task count; nothing is changed.
        """
        return self.autoscaling.configure(changes, self._task_count())

    def observe_load(self) -> Observation:
        """What the autoscaler sees now: each task's lag, each container's rate.

        Returns
        -------
        Observation
            Containers oldest generation first (a scale-in retires the
            newest), tasks in (partition, bucket) order.
        """
        return self.autoscaling.observe(self.model, self._task_lags(), self.shape.elasticity_factor)

    # 8. stop

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop every live container: SIGTERM, then SIGKILL after ``timeout_s``.

        Blocks its thread while they stop; the coordinator's server uses the
        three steps below instead, so it keeps answering their last heartbeats
        and reports on its own thread meanwhile.

        Parameters
        ----------
        timeout_s
            How long containers get to stop gracefully.
        """
        stopping = self.stop_begin()
        deadline = time.monotonic() + timeout_s
        while self.stop_pending(stopping) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.stop_end(stopping)

    def stop_begin(self) -> list[ContainerRecord]:
        """SIGTERM to every live container with a process; returns them, and those retiring.

        Returns
        -------
        list of ContainerRecord
            Every container whose process may still run (pass to the next two steps).
        """
        live = [r for r in self.records.values() if r.live]
        for record in live:
            self.processes.stop(record.handle, record.id)
        retiring = [self.records[c] for c in self.retiring if self.records[c].handle is not None]
        # Those never launched stop too (as "stopped"): a resume treats every container alike.
        return [*live, *retiring]

    def stop_pending(self, stopping: Sequence[ContainerRecord]) -> bool:
        """Whether any of ``stopping`` still runs.

        Parameters
        ----------
        stopping
            What :meth:`stop_begin` returned.

        Returns
        -------
        bool
            True while one of their processes is alive.
        """
        return any(self.processes.alive(r.handle, r.id) for r in stopping)

    def stop_end(self, stopping: Sequence[ContainerRecord], failed: str | None = None) -> None:
        """SIGKILL what is left, and record the job as stopped (``job run`` resumes it).

        Parameters
        ----------
        stopping
            What :meth:`stop_begin` returned.
        failed
            Why the coordinator stops, when it failed (recorded in the event).
        """
        for record in stopping:
            self.processes.kill(record.handle, record.id)
        live = [r for r in stopping if r.live]
        with self.store.transaction() as db:
            for record in live:
                self.store.update_container(db, record.id, state="stopped", ended_at=time.time())
            detail = f"stopped {len(live)} containers"
            if failed:
                detail += f": the coordinator failed ({failed})"
            self.store.add_event(db, "stop", detail=detail)
            if self.job_state()["state"] != "failed":
                self._set_job_state(
                    db, "stopped", "the coordinator stopped" + (f": {failed}" if failed else "")
                )
        for record in live:
            self.set_record(record.id, state="stopped")
            self._live.pop(record.id, None)
        self.retiring.clear()

    def kill_all(self) -> None:
        """SIGKILL every process this coordinator knows of (the last resort of a failed stop)."""
        for record in self.records.values():
            if record.live or record.id in self.retiring:
                self.processes.kill(record.handle, record.id)

    def job_state(self) -> dict[str, Any]:
        """The job's own state: ``running``, ``stopped`` or ``failed``, since when, and why.

        Returns
        -------
        dict
            ``{"state": ..., "at": wall-clock seconds or None, "why": one line}``.
        """
        return dict(self._job_state)

    def _set_job_state(self, db: Any, state: str, why: str) -> None:
        self._job_state = {"state": state, "at": time.time(), "why": why}
        self.store.set_meta(db, "jobState", json.dumps(self._job_state, sort_keys=True))

    # status

    def status(self) -> dict[str, Any]:
        """Everything the status page and ``job status --json`` show.

        Returns
        -------
        dict
            :func:`.status.job_status` of what the supervisor knows now.
        """
        try:
            status = self._status()
        except StoreFencedError:
            raise
        except StoreError as exc:
            if self.store.lease_s is None:
                raise
            # A shared store out of reach: what was read last (nothing before the first
            # read), with the coordinator's line saying what fails.
            self.leadership.store_failed(exc)
            last = self._last_status or {}
            standbys = last.get("coordinator", {}).get("standbys", [])
            return {**last, "coordinator": coordinator_status(self.leadership.view(), standbys)}
        self._last_status = status
        return status

    def _status(self) -> dict[str, Any]:
        now = self.clock()
        throughput, enforced, progress = (
            self.store.throughput(),
            self.store.enforced(),
            self.store.progress(),
        )
        return job_status(
            Facts(
                now=now,
                job=self.shape.name,
                job_state=self.job_state(),
                leadership=self.leadership.view(),
                standbys=self.store.standbys(),
                model=self.model,
                records=tuple(self.records.values()),
                leases=dict(self._live),
                rates={c: self.autoscaling.rate(c, now) for c in self._live},
                causes=self.crash_loops.causes(),
                start_failures=self.crash_loops.tallies(),
                terms=self.terms,
                startup_s=self.startup_s,
                change=self.change,
                in_phase_s=self.flight.in_phase_s,
                warm_up_deadline_s=self.flight.warm_up_deadline_s,
                catch_up_s=self.moves.catch_up_s,
                lags=self._task_lags(progress),
                progress=progress,
                task_partitions=task_partitions(self.shape.grouper, self.model),
                throughput=throughput,
                enforced=enforced,
                time_ordered=self.shape.time_ordered,
                partitions_seen=dict(self.partitions.seen),
                partitions_refused=self.partitions.refused,
                growth=self.partitions.growth(),
                growth_waiting=self.partitions.waiting,
                unread=self.partitions.unread(),
                partition_check_s=self.partitions.check_s if self.watch is not None else None,
                input_health=self.partitions.health.status(self.watch),
                autoscaler=self.autoscaling.config,
                capacity=self.autoscaling.policy.capacity,
                decision=self.autoscaling.decision,
                decided_at=self.autoscaling.decided_at,
                events=[e.__dict__ for e in self.store.events()],
                counters=dict(self.counters),
            )
        )
