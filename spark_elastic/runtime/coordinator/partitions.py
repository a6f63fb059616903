"""SEP-5 on a running job: the partition monitor, a growth's drain and handover, and the
consumer group's view of progress.

Every ``partition_check_s`` the server reads the inputs' partition counts
(:class:`PartitionWatch`) and hands them to :meth:`PartitionMonitor.observe`:
new partitions start a growth, whose barrier (the old partitions' end
offsets) every task must commit past before any new partition is read;
each tick :meth:`PartitionMonitor.advance` checks the drain and, once it is
done, hands every container's tasks to a successor that also reads the new
partitions. Judging counts, the barrier and the grown plan are
:mod:`spark_elastic.runtime.growth`'s pure functions; here is the monitor's
memory and the growth's steps, written through the supervisor's own
(:class:`.moves.ChangeHost`). The same monitor shows the job's progress as a
Kafka consumer group's offsets (:meth:`PartitionMonitor.group_offsets_due`).

May import: :mod:`.changes`, :mod:`.moves` (for :class:`.moves.ChangeHost`),
:mod:`.status` (for :func:`.status.group_offsets`), :mod:`.input_health`,
:mod:`.stores`, the shared runtime modules and the standard library. Never
:mod:`.supervisor`: it hands itself in as a :class:`.moves.ChangeHost`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any, Protocol

from spark_elastic.runtime.coordinator.changes import DRAINING, HANDING_OVER
from spark_elastic.runtime.coordinator.input_health import InputHealth
from spark_elastic.runtime.coordinator.moves import ChangeHost
from spark_elastic.runtime.coordinator.status import group_offsets
from spark_elastic.runtime.growth import drained, grown_plan, judge_counts
from spark_elastic.runtime.protocol import JobModel

__all__ = [
    "GROUP_COMMIT_S",
    "PartitionMonitor",
    "PartitionWatch",
    "committed_offsets",
    "task_partitions",
]

GROUP_COMMIT_S = 5.0
"""How often the job's consumer group may show new progress (a Kafka OffsetCommit each)."""


class PartitionWatch(Protocol):
    """Where the coordinator reads its inputs' partitions (the embedded log or Kafka)."""

    def partition_counts(self) -> Mapping[str, int]:
        """``{topic: partitions}`` now."""
        ...

    def end_offsets(self, topic: str) -> Mapping[int, int]:
        """``{partition: end offset}`` of ``topic`` now."""
        ...

    @property
    def group_view(self) -> bool:
        """Whether :meth:`commit_group_offsets` shows progress anywhere (Kafka: yes)."""
        ...

    def commit_group_offsets(self, group: str, offsets: Mapping[str, Mapping[int, int]]) -> None:
        """Show ``{topic: {partition: next offset}}`` as consumer group ``group``'s commits."""
        ...


def task_partitions(grouper: str, model: JobModel) -> dict[str, dict[str, tuple[int, ...]]]:
    """Each task's partitions as the job model plans them (its grown plan).

    Parameters
    ----------
    grouper
        The job's grouper name.
    model
        The current job model.

    Returns
    -------
    dict
        ``{task: {topic: (partition, ...)}}``.
    """
    plan = grown_plan(grouper, model.elasticity_factor, model.planned, model.partitions)
    names = plan.task_names()
    result: dict[str, dict[str, tuple[int, ...]]] = {}
    for i, name in enumerate(names):
        topics: dict[str, list[int]] = {}
        for ssp in plan.task(i).partitions:
            topics.setdefault(ssp.stream, []).append(ssp.partition)
        result[name] = {t: tuple(ps) for t, ps in topics.items()}
    return result


def committed_offsets(
    progress: Mapping[str, Mapping[str, Any]],
) -> dict[str, dict[str, dict[int, int]]]:
    """Each task's last reported commit: ``{task: {topic: {partition: next offset}}}``.

    Parameters
    ----------
    progress
        Each task's latest progress report (:meth:`.Store.progress`).

    Returns
    -------
    dict
        Its offsets, with partitions as numbers.
    """
    return {
        task: {t: {int(p): o for p, o in ps.items()} for t, ps in row["offsets"].items()}
        for task, row in progress.items()
    }


def _offsets_text(offsets: Mapping[str, Mapping[int, int]]) -> str:
    return json.dumps({t: {str(p): o for p, o in sorted(ps.items())} for t, ps in offsets.items()})


class PartitionMonitor:
    """SEP-5's partition monitor of one coordinator, its growths and its group view.

    Parameters
    ----------
    host
        The supervisor whose job grows.
    watch
        Where the inputs' partitions are read; None turns the monitor off.
    check_s
        How often the monitor looks.
    grouper
        The job's grouper name (which tasks read a new partition).

    Attributes
    ----------
    watch, check_s
        As given.
    seen
        What the monitor last saw: ``{topic: partitions}``.
    refused
        Why it does not follow what it saw ("" if it does).
    health
        Whether the input answers the monitor's and the group view's calls.
    ends
        The end offsets the monitor last saw: ``{topic: {partition: end}}``.
    waiting
        A growth seen while another change was in flight (``{"counts",
        "barrier"}``), which starts when that change is rolled back or ends.
    """

    def __init__(
        self, host: ChangeHost, watch: PartitionWatch | None, check_s: float, grouper: str
    ) -> None:
        self.host = host
        self.watch = watch
        self.check_s = check_s
        self.grouper = grouper
        self._next_check = host.clock() + check_s
        self.seen: dict[str, int] = {}
        self.refused = ""
        # The last look's end offsets, and a growth seen while another change was in flight.
        self.ends: dict[str, dict[int, int]] = {}
        self.waiting: dict[str, Any] | None = None
        # The consumer group view of progress (Kafka's own lag tools): what was last shown.
        self._group_shown: dict[str, dict[int, int]] = {}
        self._next_group_commit = host.clock()
        self.health = InputHealth(lambda kind, detail: host.store.event(kind, detail=detail))

    def check_due(self) -> bool:
        """Whether the monitor should look at the inputs now: once per ``check_s`` with a
        watch, whatever change is under way: an outage shows during a change too
        (:meth:`.Supervisor.partition_check_due`)."""
        clock = self.host.clock
        if self.watch is None or clock() < self._next_check:
            return False
        self._next_check = clock() + self.check_s
        return True

    def group_offsets_due(self) -> dict[str, dict[int, int]] | None:
        """What the job's consumer group should show now, if due and moved (see
        :meth:`.Supervisor.group_offsets_due`)."""
        if self.watch is None or not getattr(self.watch, "group_view", False):
            return None
        clock = self.host.clock
        if clock() < self._next_group_commit:
            return None
        self._next_group_commit = clock() + GROUP_COMMIT_S
        offsets = group_offsets(
            committed_offsets(self.host.store.progress()),
            task_partitions(self.grouper, self.host.model),
        )
        return offsets if offsets and offsets != self._group_shown else None

    def group_offsets_shown(self, offsets: Mapping[str, Mapping[int, int]]) -> None:
        """The server committed ``offsets`` to the job's group: only a move commits again."""
        self._group_shown = {t: dict(ps) for t, ps in offsets.items()}

    def growth(self) -> dict[str, Any] | None:
        """The growth under way (``{"counts", "barrier"}``, from the store), or None."""
        text = self.host.store.meta("growth")
        return json.loads(text) if text else None

    def observe(self, counts: Mapping[str, int], ends: Mapping[str, Mapping[int, int]]) -> str:
        """Take in what the monitor saw: start a growth (its barrier: ``ends`` below the old
        counts), or report a change it refuses, once; the parameters and the verdict are
        :meth:`.Supervisor.observe_partitions`'s."""
        host = self.host
        store, model = host.store, host.model
        check = judge_counts(model.planned, model.partitions, counts)
        self.seen = dict(counts)
        if check.verdict == "refused":
            if check.reason != self.refused:
                store.event("partitions", detail=f"not followed: {check.reason}")
            self.refused = check.reason
            return check.verdict
        self.refused = ""
        self.ends = {t: dict(ps) for t, ps in ends.items()}
        if check.verdict != "growth":
            return check.verdict
        if self.growth() is not None:
            return "growing"  # the growth under way: counted once, when it began
        # Everything the old partitions hold now goes before anything in the new ones (any
        # barrier read after the growth keeps each key's order; the earliest drains soonest).
        barrier = {
            topic: {p: int(o) for p, o in ends.get(topic, {}).items() if p < current}
            for topic, current in model.partitions.items()
            if counts[topic] != current
        }
        change = host.flight.change
        if change is not None:
            if self.waiting is None or self.waiting["counts"] != dict(counts):
                self.waiting = {"counts": dict(counts), "barrier": barrier}
                store.event(
                    "partitions",
                    detail=f"growth {dict(model.partitions)} -> {dict(counts)} seen during "
                    f"{change.describe()}: it starts once that change is rolled back or ends",
                )
            return "waits"
        self._begin(dict(counts), barrier)
        return check.verdict

    def begin_waiting(self) -> bool:
        """Start the growth seen during a change, now that none is in flight; whether one
        started."""
        if self.waiting is None or self.host.flight.change is not None:
            return False
        waiting, self.waiting = self.waiting, None
        self._begin(waiting["counts"], waiting["barrier"])
        return True

    def unread(self) -> dict[str, dict[int, int]]:
        """Partitions the broker has and no task reads yet, with their end offsets (as last
        looked at): a growth not yet handed over, or one that waits for a change."""
        current = self.host.model.partitions
        return {
            topic: {p: end for p, end in sorted(ends.items()) if p >= current.get(topic, 0)}
            for topic, ends in self.ends.items()
            if any(p >= current.get(topic, 0) for p in ends)
        }

    def _begin(self, counts: dict[str, int], barrier: dict[str, dict[int, int]]) -> None:
        host = self.host
        store, model = host.store, host.model
        growth = {"counts": counts, "barrier": barrier}
        self.waiting = None
        with store.transaction() as db:
            store.set_meta(db, "growth", json.dumps(growth, sort_keys=True))
            host.flight.begin(
                db,
                "growth",
                f"partitions {dict(model.partitions)} -> {dict(counts)}",
                {"partitions": dict(counts)},
                DRAINING,
            )
            store.add_event(
                db,
                "partitions",
                detail=f"growth {dict(model.partitions)} -> {dict(counts)}: old "
                f"partitions drain to {_offsets_text(barrier)} before new ones are read",
            )
        host.count("partition_growths")

    def advance(self) -> None:
        """Start a growth that waited for a change once none is in flight; once the old
        partitions drained to the growth's barrier, hand every task over."""
        self.begin_waiting()
        growth = self.growth()
        if growth is None:
            return
        barrier = {t: {int(p): o for p, o in ps.items()} for t, ps in growth["barrier"].items()}
        committed = committed_offsets(self.host.store.progress())
        if drained(barrier, committed, task_partitions(self.grouper, self.host.model)):
            self._hand_over(dict(growth["counts"]))

    def _hand_over(self, counts: dict[str, int]) -> None:
        """Every container hands its tasks to a successor that also reads the new partitions.

        The successors fork their predecessors' committed prefixes, as in a failover,
        and start only once their predecessors have stopped (or their leases ran out).
        """
        host = self.host
        store, current = host.store, host.model
        old = [host.records[c.container_id] for c in current.containers]
        with store.transaction() as db:
            successors = [host.new_container(db, r.tasks, host.sources_of(r)) for r in old]
            model = host.next_model(
                db,
                partitions=counts,
                containers=successors,
                planned_partitions=dict(current.planned),
            )
            store.set_meta(db, "growth", "")
            host.flight.enter(db, HANDING_OVER)
            for record, new in zip(old, successors, strict=True):
                store.update_container(db, record.id, state="retired", ended_at=time.time())
                store.add_event(
                    db,
                    "handover",
                    new.container_id,
                    f"takes {len(record.tasks)} tasks of {record.id} with partitions "
                    f"{counts}, job model {model.version}",
                )
        host.retire(old)
        host.model = model
