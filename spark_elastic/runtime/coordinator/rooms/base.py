"""The supervisor's shared state and the steps every room of it takes.

:class:`SupervisorBase` holds what the coordinator knows (the job model,
the containers' records and leases, the store, the processes) and the small
steps the rooms (:mod:`.planning`, :mod:`.registration`, :mod:`.failover`,
:mod:`.changing`, :mod:`.stopping`) share: the one writer of job model
versions (:meth:`SupervisorBase.next_model`), new containers, launches,
retirements. :class:`~..supervisor.Supervisor` is all the rooms together.

May import what :mod:`..supervisor` may (the coordinator's modules below it,
the shared runtime modules and the standard library).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from spark_elastic.runtime.coordinator.autoscaling import Autoscaling
from spark_elastic.runtime.coordinator.changes import Change
from spark_elastic.runtime.coordinator.crash_loops import CrashLoops
from spark_elastic.runtime.coordinator.history import History
from spark_elastic.runtime.coordinator.in_flight import InFlight
from spark_elastic.runtime.coordinator.launchers import LaunchError
from spark_elastic.runtime.coordinator.leadership import Leadership
from spark_elastic.runtime.coordinator.moves import Mover
from spark_elastic.runtime.coordinator.partitions import PartitionMonitor
from spark_elastic.runtime.coordinator.processes import Processes
from spark_elastic.runtime.coordinator.retiring import Retiring
from spark_elastic.runtime.coordinator.stores import ContainerRecord, Store
from spark_elastic.runtime.lease import LeaseTerms
from spark_elastic.runtime.protocol import (
    CONTAINER_ID_ENV,
    COORDINATOR_URL_ENV,
    COORDINATORS_ENV,
    JOB_ENV,
    ContainerModel,
    JobModel,
)

AFTER_GROWTH = "afterGrowth"
"""The store's key for the change a growth rolled back (its target), asked again after it."""

Clock = Callable[[], float]

LAUNCH_RETRY_S = (2.0, 30.0)
"""A launch the launcher's platform refused is tried again after the first figure, doubling
up to the second while it goes on failing."""


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


def shown_handle(handle: str) -> str:
    """A launcher's handle in an event: ``pid 4242`` for a local process, else as it is."""
    return f"pid {handle}" if handle.isdigit() else f"handle {handle}"


def cause_of(reason: str) -> str:
    """A failure's cause without its figures, so that failures of one cause count together."""
    return "lease expired" if reason.startswith("lease expired") else reason


def sorted_by_id(containers: Sequence[ContainerModel]) -> tuple[ContainerModel, ...]:
    return tuple(sorted(containers, key=lambda c: c.container_id))


@dataclass
class LiveLease:
    """In-memory lease state of one live container (monotonic times)."""

    renewed_at: float
    registered: bool
    last_valid_beat: float = 0.0
    launched_at: float = 0.0
    """When it was launched (or the coordinator restarted): its start-up bound counts from
    here, whatever it heartbeats before it registers."""


class SupervisorBase:
    """What the coordinator knows, and the steps its rooms share (see the module).

    Set up by :class:`~..supervisor.Supervisor`'s constructor; each room is a
    mixin of it, and calls another room only through what is declared here.
    """

    shape: JobShape
    max_start_failures: int
    crash_loops: CrashLoops
    _job_state: dict[str, Any]
    warm_ups: bool
    store: Store
    processes: Processes
    url: str
    terms: LeaseTerms
    startup_s: float
    container_env: dict[str, str]
    clock: Clock
    counters: dict[str, int]
    _live: dict[str, LiveLease]
    records: dict[str, ContainerRecord]
    partitions: PartitionMonitor
    _after_growth: dict[str, Any] | None
    retiring: Retiring
    moves: Mover
    leadership: Leadership
    _last_status: dict[str, Any] | None
    flight: InFlight
    history: History
    model: JobModel
    autoscaling: Autoscaling
    launch_failures: dict[str, tuple[int, float]]
    """Container id -> (launches refused in a row, when it is tried again)."""

    if TYPE_CHECKING:  # the failover room's, which the registration room and the flight call

        def fail_over(self, old_id: str, reason: str) -> None: ...

    def count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    def set_record(self, container_id: str, **changes: Any) -> None:
        record = self.records[container_id]
        self.records[container_id] = ContainerRecord(**{**record.__dict__, **changes})

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
        model = replace(
            model, containers=sorted_by_id(model.containers), warmups=sorted_by_id(model.warmups)
        )
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
                and self.clock() >= self.launch_failures.get(record.id, (0, 0.0))[1]
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
        try:
            handle = self.processes.launch(record.id, env)
        except LaunchError as exc:
            self._launch_failed(record.id, exc)
            return
        self.launch_failures.pop(record.id, None)
        launched = f"{shown_handle(handle)}, generation {record.generation}"
        try:
            with self.store.transaction() as db:
                self.store.update_container(db, record.id, handle=handle, launched_at=time.time())
                self.store.add_event(db, "launch", record.id, launched)
        except BaseException:
            # Unrecorded, it would be launched again beside itself: it goes (it holds no lease).
            self.processes.kill(handle, record.id)
            raise
        self.set_record(record.id, handle=handle, launched_at=time.time())
        self._live[record.id] = LiveLease(self.clock(), False, launched_at=self.clock())

    def _launch_failed(self, container_id: str, exc: LaunchError) -> None:
        """A launch the platform refused (a Kubernetes API server out of reach, a quota):
        an event on the status page, and another try later, never the coordinator's end."""
        failures = self.launch_failures.get(container_id, (0, 0.0))[0] + 1
        wait = min(LAUNCH_RETRY_S[0] * 2 ** (failures - 1), LAUNCH_RETRY_S[1])
        self.launch_failures[container_id] = (failures, self.clock() + wait)
        self.count("launch_failures")
        with self.store.transaction() as db:
            self.store.add_event(
                db, "launch-failed", container_id, f"{exc} (tried again in {wait:.0f} s)"
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

    def doom(self, container_id: str, state: str) -> None:
        """No lease any more: stopped now, killed a lease later unless it exited."""
        self._live.pop(container_id, None)
        self.set_record(container_id, state=state, ended_at=time.time())
        self.processes.doom(self.records[container_id].handle, container_id)

    def nothing_left(self) -> bool:
        """Nothing of the change is left: no warm-up, no drain, no predecessor still
        stopping, and every container of the job model runs."""
        return (
            not self.model.warmups
            and self.partitions.growth() is None
            and not self.retiring
            and all(self.records[c.container_id].state == "running" for c in self.model.containers)
        )

    def is_live(self, container_id: str) -> bool:
        """Whether the container holds a lease (or is starting to)."""
        return container_id in self._live

    def call_off_moves(self) -> None:
        """The move was rolled back: nothing of it is catching up any more."""
        self.moves.call_off()

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

    @property
    def change(self) -> Change | None:
        """The change in flight (growth, scale, factor change), or None (:mod:`.in_flight`)."""
        return self.flight.change

    def _task_count(self) -> int:
        return sum(len(c.tasks) for c in self.model.containers)
