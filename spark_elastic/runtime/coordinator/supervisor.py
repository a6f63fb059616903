"""The coordinator's state machine: the job model, container leases, failover, changes.

No I/O but the store and the container processes (:mod:`.processes`, the one
place they are signalled, through a :mod:`.launchers` launcher); where tasks go is
:mod:`.placement`'s pure functions; the HTTP server (:mod:`.server`)
calls in from its event loop, one call at a time, so nothing here locks.
:class:`Supervisor` is its rooms together (:mod:`.rooms`: planning,
registration, failover, changing, stopping, over the shared state of
:class:`.rooms.base.SupervisorBase`); it keeps the constructor, the tick that
drives them, the partition monitor's calls and the status.

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
import sys
import time
from collections.abc import Mapping
from typing import Any

from spark_elastic.errors import StoreError, StoreFencedError
from spark_elastic.runtime.coordinator.autoscaler import AutoscalerConfig
from spark_elastic.runtime.coordinator.autoscaling import Autoscaling
from spark_elastic.runtime.coordinator.crash_loops import CrashLoops
from spark_elastic.runtime.coordinator.history import History
from spark_elastic.runtime.coordinator.in_flight import InFlight
from spark_elastic.runtime.coordinator.input_health import InputHealth
from spark_elastic.runtime.coordinator.launchers import Launcher
from spark_elastic.runtime.coordinator.leadership import Leadership
from spark_elastic.runtime.coordinator.moves import Mover
from spark_elastic.runtime.coordinator.partitions import (
    GROUP_COMMIT_S,
    PartitionMonitor,
    PartitionWatch,
    task_partitions,
)
from spark_elastic.runtime.coordinator.processes import Processes
from spark_elastic.runtime.coordinator.retiring import Retiring
from spark_elastic.runtime.coordinator.rooms.base import AFTER_GROWTH, Clock, JobShape, LiveLease
from spark_elastic.runtime.coordinator.rooms.changing import ChangingRoom
from spark_elastic.runtime.coordinator.rooms.failover import FailoverRoom
from spark_elastic.runtime.coordinator.rooms.planning import PlanningRoom
from spark_elastic.runtime.coordinator.rooms.registration import RegistrationRoom
from spark_elastic.runtime.coordinator.rooms.stopping import StoppingRoom
from spark_elastic.runtime.coordinator.status import (
    Facts,
    coordinator_status,
    group_offsets,
    input_lag,
    job_status,
    partitions_of,
    status_json,
)
from spark_elastic.runtime.coordinator.stores import ContainerRecord, Store
from spark_elastic.runtime.lease import LeaseTerms

__all__ = [
    "GROUP_COMMIT_S",
    "JobShape",
    "PartitionWatch",
    "Supervisor",
    "group_offsets",
    "input_lag",
    "status_json",
]


class Supervisor(PlanningRoom, RegistrationRoom, FailoverRoom, ChangingRoom, StoppingRoom):
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
        self.launch_failures: dict[str, tuple[int, float]] = {}
        self._live: dict[str, LiveLease] = {}
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
            # Wall-clock times that move with the supervisor's clock (a spec's too).
            at_start = (time.time(), clock())
            self.history = History(store, lambda: at_start[0] + clock() - at_start[1])
            self.flight = InFlight(store, clock, warm_up_deadline_s, self.history)
            self.model = self._load_or_plan(containers)
            # Containers that committed before a restart are past their start.
            self.crash_loops.past_start(self.store.throughput())
            self.autoscaling = Autoscaling.load(store, clock, autoscaler, self._task_count())
        except BaseException:
            if claimed:
                store.release()
            raise

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
        try:
            self._act()
        except StoreFencedError:
            raise
        except StoreError as exc:
            if self.store.lease_s is None:
                raise  # a SQLite store that fails is the coordinator's end, as before
            # A shared store out of reach mid-tick: each step writes before it changes what
            # this coordinator holds, so the next tick (after a renewal) takes it up again.
            self.leadership.store_failed(exc)

    def _act(self) -> None:
        """The tick's decisions: failovers, moves, growth, launches, the autoscaler."""
        self._report_launcher_failures()
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
        if self.history.due():
            try:
                self._sample()
            except StoreError:
                raise  # as any write of the tick's: the caller knows what a store error means
            except Exception as exc:  # an observation must never stop leases and failovers
                self.count("history_failures")
                print(
                    f"spark-elastic coordinator: the history's sample failed: "
                    f"{type(exc).__name__}: {exc}",
                    file=sys.stderr,
                )

    def _report_launcher_failures(self) -> None:
        """What a launcher's platform refused out of the tick's sight (a pod's deletion, the
        watch on the pods), as events: where the operator looks."""
        failures = self.processes.drain_failures()
        if failures:
            with self.store.transaction() as db:
                for failure in failures:
                    self.store.add_event(db, "launcher", "", failure)

    def _sample(self) -> None:
        """A sample of the job's history (:mod:`.history`): what the store counts now, and
        the spans left open that nothing keeps open any more ended."""
        progress = self.store.progress()
        lags = self._task_lags(progress)
        planned = task_partitions(self.shape.grouper, self.model)
        # Containers that may still commit: an ended one's line ends, not drops to 0.
        running = {c for c, r in self.records.items() if r.live or c in self.retiring}
        # A successor that ended before it registered (a warm-up rolled back, say): its
        # failover is over too.
        orphans = [
            s.id
            for s in self.history.open_spans("failover")
            if s.id.split(":", 1)[1] not in running
        ]
        # A change's spans whose end was not written (a commit that failed, a coordinator
        # killed between two transactions): the change in flight says which are open.
        lost = [
            s.id
            for kind in ("scale", "factor", "growth", "warm-up")
            for s in self.history.open_spans(kind)
            if s.id not in self.flight.open_span_ids()
        ]
        if orphans or lost:
            with self.store.transaction() as db:
                for span_id in orphans:
                    self.history.end(db, span_id, "cut short", "its successor ended unregistered")
                for span_id in lost:
                    self.history.end(db, span_id, "cut short", "no longer in flight")
        self.history.sample(
            {c: totals for c, totals in self.store.throughput().items() if c in running},
            lags,
            {task: p["offsets"] for task, p in progress.items() if task in lags},
            input_lag(lags, partitions_of(self.model, progress, planned), self.partitions.unread()),
        )

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
                last_batch_ms=dict(self.history.last_batch_ms),
            )
        )
