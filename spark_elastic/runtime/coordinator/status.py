"""What the status page, ``job status`` and Kafka's own lag tools show of a job, as pure functions.

No store, no clock, no processes: the supervisor (:mod:`.supervisor`) gathers
what it knows at one instant into a :class:`Facts` and :func:`job_status`
turns it into the status document (``GET /status``, ``job status --json``).
The figures the status derives live here too: the job's input lag, each
record once (:func:`input_lag`), and the offsets its consumer group shows
(:func:`group_offsets`).

May import: the coordinator's pure modules (:mod:`.changes`,
:mod:`.autoscaler`, :mod:`.placement`), :mod:`.stores`' records and
:mod:`.leadership`'s view (never a store), the shared runtime modules and the
standard library. Never :mod:`.supervisor`: it calls in here.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from spark_elastic.runtime.coordinator.autoscaler import AutoscalerConfig, Decision
from spark_elastic.runtime.coordinator.changes import (
    CATCHING_UP,
    WARMING,
    Change,
    StartFailures,
    refuse_cancel,
)
from spark_elastic.runtime.coordinator.leadership import LeadershipView
from spark_elastic.runtime.coordinator.placement import locality_key
from spark_elastic.runtime.coordinator.stores import ContainerRecord
from spark_elastic.runtime.keys import Holders
from spark_elastic.runtime.lease import LeaseTerms
from spark_elastic.runtime.protocol import JobModel

__all__ = [
    "Facts",
    "Lease",
    "autoscaler_status",
    "change_status",
    "group_offsets",
    "input_lag",
    "job_status",
    "move_status",
    "partitions_of",
    "status_json",
]


class Lease(Protocol):
    """What the status reads of a live container's lease (monotonic times)."""

    @property
    def renewed_at(self) -> float:
        """When its lease was last renewed."""
        ...

    @property
    def registered(self) -> bool:
        """Whether it registered (only then does it hold a lease)."""
        ...

    @property
    def launched_at(self) -> float:
        """When it was launched (or the coordinator restarted)."""
        ...


@dataclass(frozen=True)
class Facts:
    """What the supervisor knows at one instant, as far as its status shows it.

    Attributes
    ----------
    now
        The coordinator's monotonic time.
    job
        The job's name.
    job_state
        ``{"state", "at", "why"}`` (:meth:`.Supervisor.job_state`).
    leadership
        Which coordinator leads, on which store, since when (:mod:`.leadership`).
    standbys
        The coordinators standing by (:meth:`.Store.standbys`).
    model
        The current job model.
    records
        Every container the coordinator knows, in any order.
    leases
        The live containers' leases, by id.
    rates
        The live containers' processing rates (records/s, None while unknown), by id.
    causes
        What containers said killed them, by id.
    start_failures
        Failures at start carried by each container, by id.
    terms
        The lease terms.
    startup_s
        How long a launched container may take to register.
    change
        The change in flight, or None.
    in_phase_s
        How long the change has been in its phase.
    warm_up_deadline_s
        The deadline of a move's warming phase.
    catch_up_s
        The deadline of a move's catching-up phase.
    lags
        Each task's lag as its current owner reported it; -1 until it did.
    progress
        Each task's latest progress report (:meth:`.Store.progress`).
    task_partitions
        Each task's partitions as the job model plans them.
    throughput
        Each container's counts (:meth:`.Store.throughput`).
    enforced
        Records each container's tasks processed without waiting (:meth:`.Store.enforced`).
    time_ordered
        Whether the job's tasks merge their partitions by timestamp.
    partitions_seen
        What the partition monitor last saw: ``{topic: partitions}``.
    partitions_refused
        Why the monitor does not follow what it saw ("" if it does).
    growth
        The growth under way (its counts and barrier), or None.
    growth_waiting
        A growth seen during a change that could not be rolled back, or None.
    unread
        Partitions the broker has and no task reads yet, with their end
        offsets: ``{topic: {partition: end}}``.
    partition_check_s
        How often the monitor looks; None without a monitor.
    input_health
        Whether the input answers the coordinator
        (:meth:`.input_health.InputHealth.status`).
    autoscaler
        The autoscaler's settings.
    capacity
        The autoscaler's estimate of one container's rate.
    decision
        The autoscaler's last decision, or None.
    decided_at
        When it was taken (wall-clock seconds), or None.
    events
        The newest events, newest first.
    counters
        The coordinator's counters.
    last_batch_ms
        Each container's last micro-batch's duration, as it reported it.
    """

    now: float
    job: str
    job_state: Mapping[str, Any]
    leadership: LeadershipView
    standbys: Sequence[Mapping[str, Any]]
    model: JobModel
    records: Sequence[ContainerRecord]
    leases: Mapping[str, Lease]
    rates: Mapping[str, float | None]
    causes: Mapping[str, str]
    start_failures: Mapping[str, StartFailures]
    terms: LeaseTerms
    startup_s: float
    change: Change | None
    in_phase_s: float
    warm_up_deadline_s: float
    catch_up_s: float
    lags: Mapping[str, int]
    progress: Mapping[str, Mapping[str, Any]]
    task_partitions: Mapping[str, Mapping[str, Sequence[int]]]
    throughput: Mapping[str, Mapping[str, int]]
    enforced: Mapping[str, int]
    time_ordered: bool
    partitions_seen: Mapping[str, int]
    partitions_refused: str
    growth: Mapping[str, Any] | None
    growth_waiting: Mapping[str, Any] | None
    unread: Mapping[str, Mapping[int, int]]
    partition_check_s: float | None
    input_health: Mapping[str, Any]
    autoscaler: AutoscalerConfig
    capacity: float | None
    decision: Decision | None
    decided_at: float | None
    events: Sequence[Mapping[str, Any]]
    counters: Mapping[str, int]
    last_batch_ms: Mapping[str, int] = field(default_factory=dict)


def job_status(facts: Facts) -> dict[str, Any]:
    """Everything the status page and ``job status --json`` show.

    Parameters
    ----------
    facts
        What the supervisor knows now.

    Returns
    -------
    dict
        ``job``, ``jobModelVersion``, ``containers`` (id, state, pid,
        generation, tasks, heartbeat age, lease left, read amplification,
        processing rate), ``tasks`` (owner, committed offsets, lag),
        ``autoscaler`` (mode, settings, bounds, last decision),
        ``move`` (a pending stateful move's phase and warm-ups, or None),
        ``jobState`` (running, stopped or failed, and why), ``change``
        (the change in flight: phase, deadline, whether it can be
        cancelled), ``inputLag`` (records not yet read, each once; None
        while any task's is unknown), ``recordsEnforced`` (records the
        job's time-ordered tasks processed without waiting for their
        other partitions, over all its containers; None unless its tasks
        merge by timestamp), ``input`` (whether the input answers the
        coordinator: what fails since when) and ``events``.
    """
    model = facts.model
    owner = model.owner_of()
    tasks = [
        {
            "task": task,
            "container": owner.get(task),
            # Where the owner starts from, even if a previous owner committed it.
            "offsets": facts.progress.get(task, {}).get("offsets", {}),
            "lag": facts.lags[task],
        }
        for task in sorted(owner, key=locality_key)
    ]
    states = {r.id: r.state for r in facts.records}
    return {
        "job": facts.job,
        "jobState": dict(facts.job_state),
        "coordinator": coordinator_status(facts.leadership, facts.standbys),
        "jobModelVersion": model.version,
        "change": change_status(
            facts.change, facts.in_phase_s, facts.warm_up_deadline_s, facts.catch_up_s
        ),
        "inputLag": input_lag(
            facts.lags, partitions_of(model, facts.progress, facts.task_partitions), facts.unread
        ),
        "recordsEnforced": sum(facts.enforced.values()) if facts.time_ordered else None,
        "move": move_status(model, states, facts.change),
        "elasticityFactor": model.elasticity_factor,
        "partitions": dict(model.partitions),
        "input": dict(facts.input_health),
        "partitionMonitor": {
            "plannedPartitions": dict(model.planned),
            "seen": dict(facts.partitions_seen),
            "refused": facts.partitions_refused,
            "growth": facts.growth,
            "growthWaiting": facts.growth_waiting,
            "unread": {t: {str(p): end for p, end in ps.items()} for t, ps in facts.unread.items()},
            "checkEveryS": facts.partition_check_s,
        },
        "lease": {
            "leaseS": facts.terms.lease_s,
            "marginS": facts.terms.margin_s,
            "writeBudgetS": facts.terms.write_budget_s,
        },
        "containers": [
            _container_row(facts, r) for r in sorted(facts.records, key=lambda r: r.generation)
        ],
        "tasks": tasks,
        "autoscaler": autoscaler_status(
            facts.autoscaler,
            sum(len(c.tasks) for c in model.containers),
            facts.capacity,
            facts.decision,
            facts.decided_at,
        ),
        "events": [dict(e) for e in facts.events],
        "counters": dict(facts.counters),
    }


def _container_row(facts: Facts, record: ContainerRecord) -> dict[str, Any]:
    now = facts.now
    live = facts.leases.get(record.id)
    counts = facts.throughput.get(record.id, {})
    read, processed = counts.get("totalRead", 0), counts.get("totalProcessed", 0)
    return {
        "containerId": record.id,
        "state": record.state,
        # A local process's handle is its PID; another launcher's (a pod's UID) is not one.
        "pid": int(record.handle) if record.handle and record.handle.isdigit() else None,
        "handle": record.handle,
        "generation": record.generation,
        "tasks": list(record.tasks),
        "checkpoint": record.checkpoint,
        "sources": list(record.sources),
        "heartbeatAgeS": None
        if live is None or not live.registered
        else round(now - live.renewed_at, 3),
        # No lease before it registers: a start-up bound, counted from launch.
        "leaseLeftS": None
        if live is None or not live.registered
        else max(0.0, round(facts.terms.coordinator_expiry(live.renewed_at) - now, 3)),
        "startupLeftS": None
        if live is None or live.registered or facts.model.warmup(record.id)
        else max(0.0, round(live.launched_at + facts.startup_s - now, 1)),
        "cause": facts.causes.get(record.id),
        "startFailures": facts.start_failures.get(record.id, StartFailures()).count,
        "recordsRead": read,
        "recordsProcessed": processed,
        "readAmplification": round(read / processed, 3) if processed else None,
        "recordsEnforced": facts.enforced.get(record.id, 0),
        "lastBatch": counts.get("batch"),
        "lastBatchMs": facts.last_batch_ms.get(record.id),
        "recordsPerS": None if live is None else facts.rates.get(record.id),
    }


def partitions_of(
    model: JobModel,
    progress: Mapping[str, Mapping[str, Any]],
    planned: Mapping[str, Mapping[str, Sequence[int]]],
) -> dict[str, frozenset[str]]:
    """Each task's partitions, as its owner reported them, else as the job model plans them."""
    result = {}
    for task in model.owner_of():
        offsets = progress.get(task, {}).get("offsets") or planned.get(task, {})
        result[task] = frozenset(f"{t}/{p}" for t, ps in offsets.items() for p in ps)
    return result


def move_status(
    model: JobModel, states: Mapping[str, str], change: Change | None
) -> dict[str, Any] | None:
    """The pending move: its warm-ups, the owners they take over from, and its phase.

    Parameters
    ----------
    model
        The current job model.
    states
        Each container's state, by id (every warm-up's at least).
    change
        The change in flight, or None.

    Returns
    -------
    dict or None
        ``{"phase", "warmups"}``, or None while the job model lists no warm-up.
    """
    if not model.warmups:
        return None
    holders = Holders(model.containers)
    warmups = [
        {
            "containerId": w.container_id,
            "state": states[w.container_id],
            "tasks": list(w.tasks),
            "from": sorted(holders.of(w.tasks)),
        }
        for w in model.warmups
    ]
    return {"phase": change.phase if change is not None else WARMING, "warmups": warmups}


def change_status(
    change: Change | None, in_phase_s: float, warm_up_deadline_s: float, catch_up_s: float
) -> dict[str, Any] | None:
    """The change in flight, its phase, how long it has been in it and its deadline.

    Parameters
    ----------
    change
        The change in flight, or None.
    in_phase_s
        How long it has been in its phase.
    warm_up_deadline_s, catch_up_s
        The deadlines of a move's warming and catching-up phases.

    Returns
    -------
    dict or None
        The change's JSON with ``inPhaseS``, ``deadlineS``, ``atDeadline``
        and ``cancellable``; None without a change.
    """
    if change is None:
        return None
    deadline = warm_up_deadline_s if change.phase == WARMING else None
    if change.phase == CATCHING_UP:
        deadline = catch_up_s
    return {
        **change.to_json(),
        "inPhaseS": round(in_phase_s, 1),
        "deadlineS": deadline,
        "atDeadline": None
        if deadline is None
        else ("go on" if change.phase == CATCHING_UP or change.moved else "roll back"),
        "cancellable": refuse_cancel(change) is None,
    }


def autoscaler_status(
    config: AutoscalerConfig,
    tasks: int,
    capacity: float | None,
    decision: Decision | None,
    decided_at: float | None,
) -> dict[str, Any]:
    """The autoscaler's settings, bounds and last decision.

    Parameters
    ----------
    config
        Its settings.
    tasks
        The job's task count (which bounds the container count).
    capacity
        Its estimate of one container's rate.
    decision, decided_at
        Its last decision and when it was taken (wall clock), or None.

    Returns
    -------
    dict
        ``mode``, ``summary``, ``settings``, ``bounds``,
        ``capacityPerContainer`` and ``lastDecision``.
    """
    last = None
    if decision is not None:
        last = {**decision.to_json(), "at": decided_at}
    return {
        "mode": config.mode,
        "summary": config.describe(tasks),
        "settings": config.to_json(),
        "bounds": [config.min_containers, config.max_for(tasks)],
        "capacityPerContainer": capacity,
        "lastDecision": last,
    }


def group_offsets(
    committed: Mapping[str, Mapping[str, Mapping[int, int]]],
    task_partitions: Mapping[str, Mapping[str, Sequence[int]]],
) -> dict[str, dict[int, int]]:
    """Each partition's offset for a consumer group: where every task reading it has got to.

    Virtual tasks split a partition's keys, so several tasks (in several
    containers) read one partition, each at its own pace; the group shows
    the slowest, the offset below which every task has applied every record.

    Parameters
    ----------
    committed
        Each task's committed next offsets: ``{task: {topic: {partition: offset}}}``.
    task_partitions
        Each task's partitions as the job model plans them.

    Returns
    -------
    dict
        ``{topic: {partition: offset}}``; a partition some task reading it has
        not committed yet is left out (the group shows nothing for it).
    """
    readers: dict[tuple[str, int], list[str]] = {}
    for task, topics in task_partitions.items():
        for topic, partitions in topics.items():
            for partition in partitions:
                readers.setdefault((topic, partition), []).append(task)
    result: dict[str, dict[int, int]] = {}
    for (topic, partition), tasks in sorted(readers.items()):
        offsets = [committed.get(task, {}).get(topic, {}).get(partition) for task in tasks]
        if all(offset is not None for offset in offsets):
            result.setdefault(topic, {})[partition] = min(o for o in offsets if o is not None)
    return result


def input_lag(
    lags: Mapping[str, int],
    partitions_of: Mapping[str, frozenset[str]],
    unread: Mapping[str, Mapping[int, int]] | None = None,
) -> int | None:
    """The job's backlog, each record once: tasks over the same partitions (a partition's
    key buckets) each report all of its backlog, so it counts once, at the slowest; a
    partition no task reads yet counts whole.

    Parameters
    ----------
    lags
        Each task's lag as its owner reported it; -1 when unknown.
    partitions_of
        Each task's partitions (``"topic/partition"``).
    unread
        Partitions the broker has and no task reads yet: ``{topic: {partition:
        end offset}}`` (a new partition starts at offset 0).

    Returns
    -------
    int or None
        Records not yet read, or None (unknown) while any task's lag is unknown.
    """
    if any(lag < 0 for lag in lags.values()):
        return None
    slowest: dict[frozenset[str], int] = {}
    for task, lag in lags.items():
        key = partitions_of.get(task, frozenset({task}))
        slowest[key] = max(slowest.get(key, 0), lag)
    return sum(slowest.values()) + sum(
        end for ends in (unread or {}).values() for end in ends.values()
    )


def coordinator_status(
    leadership: LeadershipView, standbys: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """The status's ``coordinator``: which leads, on which store, since when, what fails, and
    which coordinators stand by (``standbys``, as :meth:`.Store.standbys` lists them)."""
    return {
        "standbys": [dict(s) for s in standbys],
        "url": leadership.url,
        "store": leadership.store,
        "leadsSince": leadership.since,
        "epoch": leadership.epoch,
        "heldForS": leadership.held_for_s,
        "waitsS": leadership.waits_s,
        "storeError": leadership.store_error,
    }


def coordinator_line(coordinator: dict[str, Any]) -> str:
    """Which coordinator leads, on which store, since when; a store it cannot renew, loudly.

    Plain text (the status page escapes it, ``job status`` prints it)."""
    since = time.strftime("%H:%M:%S", time.localtime(coordinator["leadsSince"]))
    line = (
        f"Coordinator {coordinator['url']} leads since {since} (epoch {coordinator['epoch']}, "
        f"store {coordinator['store']})"
    )
    if coordinator["heldForS"] is not None:
        line += f", holding the store {coordinator['heldForS']:g} s more"
    if coordinator["waitsS"]:
        line += (
            f"; it took over and waits {coordinator['waitsS']:g} s more before it fails over "
            "or moves anything"
        )
    if coordinator["storeError"]:
        line += f"; its store fails: {coordinator['storeError']}"
    standbys = coordinator["standbys"]
    if standbys:
        line += "; standing by: " + ", ".join(f"{s['url']} (host {s['host']})" for s in standbys)
    elif coordinator["heldForS"] is not None:
        line += "; no standby"
    return line + "."


def status_json(status: Mapping[str, Any]) -> str:
    """The status as indented JSON text."""
    return json.dumps(status, indent=2, sort_keys=True)
