"""KIP-441's moves in a running coordinator: warm-ups first, then one group at a time.

A stateful scale or an elasticity-factor change first launches the new
owners as warm-ups (``JobModel.warmups``) while the old owners run every
task (:meth:`Mover.start`, from a :class:`MovePlan`). Each tick,
:meth:`Mover.advance` moves one group (warm-ups sharing an old owner,
:func:`move_groups`) once KIP-441's assignor lets all its old owners shut
down (:func:`.placement.may_shut_down`: every piece of state they hold has
a ready warm-up): it lists them as stopping so the warm-ups catch up with
them, stops them at a batch boundary, then, once they are gone, hands the
warm-ups their tasks with the old owners' checkpoints as sources. Each step
is derived from the store, so a restarted coordinator resumes where the last
one was. A stateless scale has no warm-ups: :meth:`Mover.hand_over` retires
the old owners at once and their successors start from their commits.

The steps write through the supervisor's own primitives (a new container,
the next job model version, the change's phase, retiring containers), which
it hands in as a :class:`ChangeHost`: here are the order of the steps and what
a move remembers between ticks, not the job model's bookkeeping.

May import: :mod:`.changes`, :mod:`.in_flight`, :mod:`.placement`,
:mod:`.stores`, the shared runtime modules and the standard library. Never
:mod:`.supervisor`: it hands itself in as a :class:`ChangeHost`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from spark_elastic.runtime.coordinator.changes import (
    CATCHING_UP,
    HANDING_OVER,
    WARMING,
)
from spark_elastic.runtime.coordinator.in_flight import InFlight
from spark_elastic.runtime.coordinator.placement import may_shut_down, model_factor, tasks_at_factor
from spark_elastic.runtime.coordinator.stores import ContainerRecord, Store
from spark_elastic.runtime.keys import Holders
from spark_elastic.runtime.protocol import ContainerModel, JobModel

__all__ = [
    "ChangeHost",
    "MovePlan",
    "Mover",
    "factor_move",
    "move_groups",
    "scale_move",
]

Group = tuple[list[ContainerModel], list[ContainerModel]]
"""Warm-ups that move together, and the old owners they take from."""


class ChangeHost(Protocol):
    """What a change's steps (a move's, a growth's) need of the supervisor, which is one.

    Its store, its job model (which a step replaces), the change in flight
    (:class:`.in_flight.InFlight`), and the primitives every change is
    written with: the supervisor's interface to :mod:`.moves` and
    :mod:`.partitions`, used by nothing outside the coordinator package (the
    CLI drives the supervisor through its operations: scale, change_factor,
    cancel_change, stop).
    """

    model: JobModel

    @property
    def store(self) -> Store:
        """The coordinator's store."""
        ...

    @property
    def flight(self) -> InFlight:
        """The change in flight, which each step begins, moves through its phases or saves."""
        ...

    @property
    def clock(self) -> Callable[[], float]:
        """The coordinator's monotonic clock."""
        ...

    @property
    def records(self) -> Mapping[str, ContainerRecord]:
        """Every container the coordinator knows, by id."""
        ...

    def new_container(
        self, db: Any, tasks: tuple[str, ...], sources: tuple[str, ...]
    ) -> ContainerModel:
        """A new container of the next generation, launching, saved in ``db``."""
        ...

    def next_model(self, db: Any, base: JobModel | None = None, **changes: Any) -> JobModel:
        """The job model's next version, saved in ``db`` (the one writer of versions)."""
        ...

    def retire(self, records: Sequence[ContainerRecord]) -> None:
        """Stop predecessors at a batch boundary; their successors wait for them."""
        ...

    def set_record(self, container_id: str, **changes: Any) -> None:
        """Change a container's record in memory (the store was written already)."""
        ...

    def sources_of(self, record: ContainerRecord) -> tuple[str, ...]:
        """Where a successor of ``record`` starts from."""
        ...

    def waits_cold(self, container_id: str) -> bool:
        """A new owner that, with warm-ups off, waits for its tasks to be handed over."""
        ...

    def may_write(self) -> list[str]:
        """Retired containers that may still write."""
        ...

    def count(self, name: str) -> None:
        """Count one more of ``name`` (the coordinator's counters)."""
        ...


@dataclass(frozen=True)
class MovePlan:
    """A move to start.

    Attributes
    ----------
    kind, summary, target
        The change it is (``scale`` or ``factor``), in one line, and what it aims at.
    sets
        The warm-ups' task sets (an empty one gets no warm-up).
    describe
        Its event's text, given the warm-up count and the job model's version.
    """

    kind: str
    summary: str
    target: Mapping[str, Any]
    sets: tuple[tuple[str, ...], ...]
    describe: Callable[[int, int], str]


def scale_move(
    current: int,
    containers: int,
    new_sets: Sequence[tuple[str, ...]],
    kept: int,
    moved: int,
    warm_ups: bool = True,
) -> MovePlan:
    """A scale: a stateful job's successors warm up while the old owners keep running
    (:meth:`Mover.start`); a stateless job's old owners stop at once and hand over
    (``warm_ups=False``, :meth:`Mover.hand_over`).

    Parameters
    ----------
    current, containers
        The container count now, and the one wanted.
    new_sets
        The successors' task sets.
    kept, moved
        How many containers keep their tasks, and how many hand them over.
    warm_ups
        Whether the successors warm up first.

    Returns
    -------
    MovePlan
        The move, its event's text said its way.
    """

    def warming(warmups: int, version: int) -> str:
        return (
            f"{current} -> {kept + warmups} containers: {kept} keep their tasks, "
            f"{moved} will hand over to {warmups} new ones, which warm up first while "
            f"the old owners keep running (job model {version})"
        )

    def at_once(successors: int, version: int) -> str:
        return (
            f"{current} -> {containers} containers: {kept} keep their tasks, "
            f"{moved} hand over to {successors}, job model {version}"
        )

    return MovePlan(
        "scale",
        f"{current} -> {containers} containers",
        {"containers": containers},
        tuple(new_sets),
        warming if warm_ups else at_once,
    )


def factor_move(old: int, factor: int, current: Sequence[ContainerModel]) -> MovePlan:
    """A factor change: each container gets a warm-up that owns its keys at ``factor``.

    Parameters
    ----------
    old, factor
        The elasticity factor now, and the one wanted.
    current
        The job model's containers.

    Returns
    -------
    MovePlan
        The move for :meth:`Mover.start` (:func:`.placement.tasks_at_factor`'s sets).
    """
    return MovePlan(
        "factor",
        f"elasticity factor {old} -> {factor}",
        {"elasticityFactor": factor},
        tuple(tasks_at_factor(current, factor)),
        lambda warmups, version: (
            f"elasticity factor {old} -> {factor}: {warmups} containers warm up to take "
            f"over from {len(current)}, one group at a time (job model {version})"
        ),
    )


def move_groups(model: JobModel) -> list[Group]:
    """The pending move in groups that move together: (warm-ups, the owners they take from).

    Warm-ups that take tasks from a common owner share a group (that owner
    stops once for all of them); owners hand all their tasks over. Groups
    are in order of their first warm-up's id, and move one at a time, so
    the rest of the job keeps running.

    Parameters
    ----------
    model
        A job model.

    Returns
    -------
    list of (list of ContainerModel, list of ContainerModel)
        Each group's warm-ups and old owners, in id order; empty without warm-ups.
    """
    holders = Holders(model.containers)
    by_id = {c.container_id: c for c in model.containers}
    groups: list[tuple[set[str], set[str]]] = []
    for warm in model.warmups:
        owners = holders.of(warm.tasks)
        joined = [g for g in groups if g[1] & owners]
        merged = ({warm.container_id}, set(owners))
        for g in joined:
            merged[0].update(g[0])
            merged[1].update(g[1])
            groups.remove(g)
        groups.append(merged)
    warm_by_id = {w.container_id: w for w in model.warmups}
    ordered = sorted(groups, key=lambda g: min(g[0]))
    return [
        ([warm_by_id[w] for w in sorted(ws)], [by_id[o] for o in sorted(os_)])
        for ws, os_ in ordered
    ]


class Mover:
    """The move in flight of one coordinator: its steps, and what it remembers between ticks.

    Parameters
    ----------
    host
        The supervisor whose job model moves.
    stateful
        Whether the job keeps keyed state (only then do warm-ups catch up).
    catch_up_s
        How long a moving group's old owners keep running, listed as
        stopping, for its warm-ups to say they caught up.
    """

    def __init__(self, host: ChangeHost, stateful: bool, catch_up_s: float) -> None:
        self.host = host
        self.stateful = stateful
        self.catch_up_s = catch_up_s
        # The handover's first phase: warm-ups that said they caught up with their stopping
        # old owners, and when (clock) the phase began (None: no group in it).
        self._caught_up: set[str] = set()
        self._catching_up_since: float | None = None

    def caught_up(self, container_id: str) -> None:
        """A warm-up says it has applied everything its stopping old owners committed."""
        self._caught_up.add(container_id)

    def call_off(self) -> None:
        """The move was rolled back: no group is catching up any more."""
        self._caught_up.clear()
        self._catching_up_since = None

    def start(self, plan: MovePlan, reason: str) -> str:
        """Add a warm-up per non-empty task set to the job model; its event says what.

        Parameters
        ----------
        plan
            The move (:func:`scale_move`, :func:`factor_move`).
        reason
            Why, when the autoscaler asks: the event is then an ``autoscale``
            event that starts with it (else a ``scale`` event).

        Returns
        -------
        str
            What will change, in one line.
        """
        host = self.host
        with host.store.transaction() as db:
            warmups = [host.new_container(db, tasks, ()) for tasks in plan.sets if tasks]
            self._mark_move(db, warmups)
            model = host.next_model(db, warmups=warmups)
            host.flight.begin(
                db, plan.kind, plan.summary, dict(plan.target), WARMING, len(move_groups(model))
            )
            summary = plan.describe(len(warmups), model.version)
            if reason:
                host.store.add_event(db, "autoscale", detail=f"{reason}; {summary}")
            else:
                host.store.add_event(db, "scale", detail=summary)
        host.model = model
        return summary

    def hand_over(
        self,
        plan: MovePlan,
        kept: Sequence[ContainerModel],
        moved: Sequence[ContainerModel],
        reason: str,
    ) -> str:
        """A stateless scale's handover, at once: ``moved`` retire at a batch boundary and
        a successor per task set of ``plan`` starts once they stopped, from the offsets they
        committed (the lowest where two read one partition: output is at-least-once).

        Returns
        -------
        str
            What changed, in one line (its event's text).
        """
        host = self.host
        owner = {t: c for c in (*kept, *moved) for t in c.tasks}
        with host.store.transaction() as db:
            successors = [
                host.new_container(
                    db,
                    tasks,
                    tuple(
                        dict.fromkeys(
                            src
                            for t in tasks
                            for src in host.sources_of(host.records[owner[t].container_id])
                        )
                    ),
                )
                for tasks in plan.sets
            ]
            model = host.next_model(db, containers=[*kept, *successors])
            summary = plan.describe(len(successors), model.version)
            if reason:
                host.store.add_event(db, "autoscale", detail=f"{reason}; {summary}")
            else:
                host.store.add_event(db, "scale", detail=summary)
            host.flight.begin(db, plan.kind, plan.summary, dict(plan.target), HANDING_OVER)
            for record in moved:
                host.store.update_container(
                    db, record.container_id, state="retired", ended_at=time.time()
                )
        host.retire([host.records[c.container_id] for c in moved])
        host.model = model
        return summary

    def _mark_move(self, db: Any, warmups: Sequence[ContainerModel]) -> None:
        """Remember where this move's generations start (its new owners are from there on)."""
        if warmups:
            self.host.store.set_meta(db, "moveFrom", str(min(w.generation for w in warmups)))

    def advance(self) -> None:
        """KIP-441's probing move, one group at a time once its warm-ups are ready.

        Per group, three phases, each derived from the store, so a restarted
        coordinator resumes where the last one was: warm-ups starting (wait);
        the assignor lets the group's old owners shut down (every piece of
        state they hold has a ready warm-up: stop them; they finish their
        batch and exit); old owners stopped (their queries, as they say, or their
        processes) or their leases out (the warm-ups own the tasks, from the
        old owners' committed checkpoints). A group in its
        last phase goes first; no other group starts moving meanwhile, nor
        until the new owners of the groups before it have reported progress
        (their queries run), so the job as a whole never stops at once.
        """
        records = self.host.records
        groups = move_groups(self.host.model)
        if not groups:
            return
        moving = [
            g for g in groups if any(records[o.container_id].state == "retired" for o in g[1])
        ]
        if moving:
            warmups, owners = moving[0]
            if any(records[o.container_id].state != "retired" for o in owners):
                self._stop_owners(warmups, owners)  # a restart between the two transactions
                return
            writing = self.host.may_write()
            if not any(o.container_id in writing for o in owners):
                self._hand_to(warmups, owners)
            return
        ready = next((g for g in groups if self._owners_may_shut_down(*g)), None)
        if (
            ready is not None
            and not self._new_owners_starting(groups)
            and self._warm_ups_caught_up(*ready)
        ):
            self._stop_owners(*ready)

    def _ready(self, container_id: str) -> bool:
        """Whether a new owner may take its tasks: warm, or cold (never launched)."""
        record = self.host.records[container_id]
        return record.state == "warm" or (
            self.host.waits_cold(container_id) and record.handle is None
        )

    def _owners_may_shut_down(
        self, warmups: list[ContainerModel], owners: list[ContainerModel]
    ) -> bool:
        """Whether KIP-441's assignor lets every old owner of a group shut down now."""
        ready = {w.container_id for w in warmups if self._ready(w.container_id)}
        allowed = may_shut_down(warmups, owners, ready)
        return all(o.container_id in allowed for o in owners)

    def _new_owners_starting(self, groups: list[Group]) -> list[str]:
        """New owners of this move's earlier groups that have not reported progress yet."""
        store = self.host.store
        since = int(store.meta("moveFrom") or 0)
        leaving = {o.container_id for _, owners in groups for o in owners}
        reported = store.throughput()
        return [
            c.container_id
            for c in self.host.model.containers
            if c.generation >= since
            and c.container_id not in leaving
            and c.container_id not in reported
        ]

    def _warm_ups_caught_up(
        self, warmups: list[ContainerModel], owners: list[ContainerModel]
    ) -> bool:
        """The handover's first phase: whether a ready group's old owners may stop now.

        The job model first lists the old owners under ``stopping`` (they
        keep running). A replaying warm-up then follows them until its query
        keeps pace with them and is past its slow first batches
        (``_Replayer.caught_up`` in the container), stops raising its gate,
        applies what is below it and says it has caught up; the owners stop
        once every warm-up of the
        group has said so, or ``catch_up_s`` after the listing. So the
        warm-ups' queries wait at their gates when the owners' last batch
        commits: their first batch as owners publishes.
        A cold new owner (never launched) has nothing to catch up, nor has a
        stateless job's: it follows no state, so waiting for it would only
        hold the move for ``catch_up_s`` per group.
        """
        host = self.host
        ids = {o.container_id for o in owners}
        now = host.clock()
        if not ids <= set(host.model.stopping):
            stopping = tuple(sorted({*host.model.stopping, *ids}))
            with host.store.transaction() as db:
                model = host.next_model(db, stopping=stopping)
                host.store.add_event(
                    db,
                    "move",
                    detail=f"warm-ups {', '.join(w.container_id for w in warmups)} ready: "
                    f"they catch up with {', '.join(sorted(ids))} (job model {model.version})",
                )
                host.flight.enter(db, CATCHING_UP)
            host.model = model
            self._caught_up.clear()
            self._catching_up_since = now
            return False
        if self._catching_up_since is None:  # listed by a coordinator before a restart
            self._catching_up_since = now
        caught = not self.stateful or all(
            w.container_id in self._caught_up or host.waits_cold(w.container_id) for w in warmups
        )
        return caught or now > self._catching_up_since + self.catch_up_s

    def _stop_owners(self, warmups: list[ContainerModel], owners: list[ContainerModel]) -> None:
        host = self.host
        running = [host.records[o.container_id] for o in owners]
        running = [r for r in running if r.state != "retired"]
        # The job model lists them as stopping already (_warm_ups_caught_up did, first).
        self._catching_up_since = None
        with host.store.transaction() as db:
            for record in running:
                host.store.update_container(db, record.id, state="retired", ended_at=time.time())
            host.store.add_event(
                db,
                "move",
                detail=f"warm-ups {', '.join(w.container_id for w in warmups)} ready: stopping "
                f"{', '.join(r.id for r in running)} at a batch boundary",
            )
            host.flight.enter(db, HANDING_OVER)
        host.retire(running)

    def _hand_to(self, warmups: list[ContainerModel], owners: list[ContainerModel]) -> None:
        host = self.host
        records = host.records
        holders = Holders(owners)
        taking = []
        with host.store.transaction() as db:
            for warm in warmups:
                previous = sorted(holders.of(warm.tasks))
                sources = tuple(
                    dict.fromkeys(src for o in previous for src in host.sources_of(records[o]))
                )
                taking.append(replace(warm, sources=sources))
                # A cold new owner launches now, as any successor does.
                state = "running" if records[warm.container_id].state == "warm" else "launching"
                host.store.update_container(db, warm.container_id, state=state, sources=sources)
                host.store.add_event(
                    db,
                    "move",
                    warm.container_id,
                    f"takes {len(warm.tasks)} tasks of {', '.join(previous)}",
                )
            gone = {c.container_id for c in owners}
            took = {w.container_id for w in warmups}
            current = host.model
            staying = [c for c in current.containers if c.container_id not in gone]
            left = tuple(w for w in current.warmups if w.container_id not in took)
            model = host.next_model(
                db,
                containers=[*staying, *taking],
                warmups=left,
                elasticity_factor=model_factor(current, [*staying, *taking], left),
                stopping=tuple(c for c in current.stopping if c not in gone),
            )
            change = host.flight.change
            if change is not None:
                host.flight.save(db, change.group_moved(time.time()))
        for warm in taking:
            state = "running" if records[warm.container_id].state == "warm" else "launching"
            host.set_record(warm.container_id, state=state, sources=warm.sources)
        self.host.model = model
