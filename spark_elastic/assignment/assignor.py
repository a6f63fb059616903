"""KIP-441 high-availability task assignment: capacity weights, group spread, leaving members.

:func:`assign` is the recipe. It first plans a *target*: the balanced
assignment closest to what runs now. Then it hands out as much of the target
as is safe at once: a stateful task moves only to a client that is caught up
on its state; elsewhere it stays where it runs while the target client warms
up, and a probing rebalance picks the move up later.

Steps, each a small pure function over an indexed view of the input
(:class:`_Problem`; tasks, groups and clients numbered in natural order of id):

1. :func:`_running_owners`, :func:`_planned_owners` -- where each task runs
   now, and where it will run once the moves under way (warm-ups) and the
   moves forced now (tasks on no client or on a leaving one) are done.
2. :func:`_active_quotas` -- how many tasks of each group each client runs
   in the target: within the balance bounds, as close to the plan as possible.
3. :func:`_target_actives` -- which task goes where, preferring clients that
   are caught up on it (with augmenting paths: a task may go to a caught-up
   client whose own task moves on to *its* caught-up standby).
4. :func:`_target_standbys` -- standbys for the target, balanced by capacity,
   in standbys and in total load (actives + standbys per client).
5. :func:`_handed_out_actives`, :func:`_realize` -- the assignment handed out
   now: actives, the most caught-up standbys, warm-ups within the budget.

A warm-up does not say what it is for, so the next rebalance reads it from
the counts (:func:`_warmed_owners`): while the running actives are
unbalanced, a warm-up prepares an active unless its task's owner would fall
below its bounds without the task. :func:`_warmups` keeps that reading
true: standby warm-ups go beside active ones (filling the budget the active
moves leave) only for tasks whose owner cannot shed them, and wait otherwise.

Tie-breaks, everywhere: lower client index (natural order of client id)
first; when a client sheds tasks at equal cost, the task that sorts last goes
first (KIP-441's worked examples keep the lower-numbered tasks in place).
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import itertools
import math
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from spark_elastic.assignment.model import (
    AssignmentConfig,
    AssignmentResult,
    AssignmentWarning,
    ClientAssignment,
    ClientState,
    ProbingRebalance,
    TaskSpec,
    natural_key,
)
from spark_elastic.errors import ArgumentTypeError, AssignmentError

__all__ = ["assign", "is_balanced"]

_Item = TypeVar("_Item", TaskSpec, ClientState)

# Shares are products of floats; this keeps an exact share such as 3.0 from rounding to 2 or 4.
_EPSILON = 1e-9
# The smallest capacity of a staying client, relative to the largest: below it, the client's
# share of the load could round to 0 (and the load per capacity overflow).
_MIN_CAPACITY_RATIO = 1e-300


def assign(
    tasks: Iterable[TaskSpec],
    clients: Iterable[ClientState],
    config: AssignmentConfig | None = None,
) -> AssignmentResult:
    """Assign tasks to clients for one rebalance, KIP-441 style.

    Rules (see docs/assignment.md, "Rules, as implemented", for the full text):

    * every task has exactly one active client; a stateful task also has
      ``min(num_standby_replicas, staying clients - 1)`` standbys, all on
      distinct staying clients;
    * a stateful active goes to a caught-up client (lag at most
      ``acceptable_recovery_lag``, or the client already running it) when one
      may take it, else to the least-behind client; standbys go to the next
      most caught-up clients;
    * a task moves to a client that is not caught up only by way of a warm-up
      replica there, at most ``max_warmup_replicas`` at once; stateless tasks
      move at once;
    * a leaving client gets nothing new; it may shut down once it holds nothing;
    * the same input gives the same output; a balanced, caught-up assignment
      is returned unchanged.

    Parameters
    ----------
    tasks
        The tasks to assign; ids unique.
    clients
        The clients taking part in the rebalance; ids unique.
    config
        The settings; :class:`AssignmentConfig` defaults when omitted.

    Returns
    -------
    AssignmentResult
        Every client's active, standby and warm-up tasks, whether a probing
        rebalance is needed, and the leaving clients that may shut down.

    Raises
    ------
    ArgumentTypeError
        An item is not a :class:`TaskSpec` / :class:`ClientState`.
    AssignmentError
        Duplicate ids; a client lists a task in more than one of its previous
        active, standby and warm-up tasks; tasks but no client that is
        staying; a staying client's capacity below 1e-300 times the largest
        staying one's.

    Notes
    -----
    Input that is valid but cannot be fully satisfied, or is stale, is not an
    error: with fewer staying clients than ``num_standby_replicas + 1``, every
    stateful task gets as many standbys as there are other staying clients
    (the most caught-up first); lags and previous replicas of tasks that are
    not in the job, and lags, standbys and warm-ups of stateless tasks, are
    ignored. Each such case is one entry of :attr:`AssignmentResult.warnings`.
    """
    problem = _index(tasks, clients, config)
    owners = _running_owners(problem)
    target, target_standby = _target(problem, owners)
    active = _handed_out_actives(problem, owners, target, target_standby)
    if active != target and _actives_balanced(problem, active):
        # The moves that can be made now balance the actives already: the others would
        # spend warm-ups for nothing, and the next rebalance could not tell what those
        # warm-ups were for (see _warmups).
        target = active
        target_standby = _target_standbys(problem, target)
    placement = _realize(problem, active, target, target_standby)
    return _result(problem, placement)


def is_balanced(
    assignment: Mapping[str, ClientAssignment],
    tasks: Iterable[TaskSpec],
    clients: Iterable[ClientState],
    config: AssignmentConfig | None = None,
) -> bool:
    """Whether an assignment meets the balance rules (the point where probing stops).

    Balanced means, with ``share = count * capacity / staying capacity`` and
    "within bounds" meaning within one task of the share or within
    ``balance_tolerance`` of it:

    * every task has exactly one active client; every stateful task exactly
      ``min(num_standby_replicas, staying clients - 1)`` standbys, a
      stateless one no standby and no warm-up; a task's active, standbys and
      warm-ups are on distinct clients;
    * leaving clients hold no task: no active, standby or warm-up;
    * every staying client's active count is within bounds of its share of
      all tasks, and its count of each group's tasks within bounds of its share
      of that group;
    * every staying client's load -- its actives plus its standbys -- is
      within bounds of its share of all replicas (every task plus every
      standby), the share capped (by water-filling) at the tasks it can hold:
      every stateful task, and the stateless tasks active on it. So the load
      is spread within one task per unit of capacity, as in Kafka, not two
      (actives within one plus standbys within one);
    * every staying client's standby count is within bounds of its share of
      all standbys, the share capped (by water-filling) at the stateful tasks
      not active on it (a client cannot stand by for its own tasks), as far
      as the load rule allows given the actives: where both cannot hold, the
      load rule wins.

    Parameters
    ----------
    assignment
        Client id to its tasks, e.g. :attr:`AssignmentResult.assignment`.
    tasks, clients, config
        The input the assignment was made for.

    Returns
    -------
    bool
        ``True`` when every rule holds, ``False`` when any is broken.

    Raises
    ------
    AssignmentError
        The input is inconsistent (as for :func:`assign`), or the assignment
        names a client or task the input does not have.
    """
    problem = _index(tasks, clients, config)
    return not _balance_violations(problem, assignment)


# -- the plan ------------------------------------------------------------------------------------


def _target(
    problem: _Problem, owners: Sequence[int | None]
) -> tuple[list[int], list[tuple[int, ...]]]:
    """The balanced target: each task's active client and standby clients."""
    # Warm-ups prepare actives while the actives are unbalanced, standbys after (see _warmups).
    planned = _planned_owners(problem, owners, not _actives_balanced(problem, owners))
    quotas = _active_quotas(problem, planned)
    target = _target_actives(problem, planned, quotas)
    return target, _target_standbys(problem, target)


# -- the indexed problem ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Problem:
    """The validated input with tasks, groups and clients numbered in natural order."""

    config: AssignmentConfig
    task_ids: tuple[str, ...]
    group_of: tuple[int, ...]
    group_sizes: tuple[int, ...]
    stateful: tuple[bool, ...]
    end_offset: tuple[int, ...]
    """Per task: the lag of a client without state. When the task's end_offset is unknown,
    one more than the largest of the acceptable lag and every reported lag."""
    client_ids: tuple[str, ...]
    leaving: tuple[bool, ...]
    weight: tuple[float, ...]
    """Capacity share among staying clients; 0 for a leaving client."""
    staying: tuple[int, ...]
    by_weight: tuple[int, ...]
    """Staying clients, largest capacity first: those with a positive lower bound lead."""
    lags: tuple[dict[int, int], ...]
    """Per task: client to offsets behind (0 where the task ran as active; at most end_offset)."""
    running: tuple[tuple[int, ...], ...]
    previous_standby: tuple[frozenset[int], ...]
    previous_warmup: tuple[frozenset[int], ...]
    ready: tuple[tuple[int, ...], ...]
    """Per task: the staying clients caught up on it, previous warm-ups first."""
    state_holders: tuple[frozenset[int], ...]
    standby_count: int
    """Standbys per stateful task: ``min(num_standby_replicas, staying - 1)``."""
    warnings: tuple[AssignmentWarning, ...]
    """What could not be done or was ignored, for :attr:`AssignmentResult.warnings`."""

    def lag(self, task: int, client: int) -> int:
        """Offsets ``client`` is behind on ``task``: the whole state when it has none."""
        return self.lags[task].get(client, self.end_offset[task])

    def needs_restore(self, task: int) -> bool:
        """Whether a client without the task's state would have to restore first."""
        return self.stateful[task] and self.end_offset[task] > self.config.acceptable_recovery_lag

    def is_caught_up(self, task: int, client: int) -> bool:
        """Whether ``client`` could run ``task`` at once."""
        return (
            not self.needs_restore(task)
            or self.lag(task, client) <= self.config.acceptable_recovery_lag
        )

    def recovery_rank(self, task: int, client: int) -> int:
        """KIP-441's rank: 0 when caught up, else the lag (lower is more caught up)."""
        return 0 if self.is_caught_up(task, client) else self.lag(task, client)

    def holders(self, task: int) -> frozenset[int]:
        """Staying clients with some state of (or a previous replica of) ``task``."""
        return self.state_holders[task]


def _index(
    tasks: Iterable[TaskSpec], clients: Iterable[ClientState], config: AssignmentConfig | None
) -> _Problem:
    config = AssignmentConfig() if config is None else config
    if not isinstance(config, AssignmentConfig):
        raise ArgumentTypeError.wrong_type("config", "an AssignmentConfig", config)
    task_list = _sorted_unique(tasks, TaskSpec, "task")
    client_list = _sorted_unique(clients, ClientState, "client")
    task_index = {task.id: t for t, task in enumerate(task_list)}
    group_names = sorted({task.group for task in task_list}, key=natural_key)
    group_index = {name: g for g, name in enumerate(group_names)}
    group_of = tuple(group_index[task.group] for task in task_list)
    stateful = tuple(task.stateful for task in task_list)

    lags: list[dict[int, int]] = [{} for _ in task_list]
    running: list[list[int]] = [[] for _ in task_list]
    previous_standby: list[set[int]] = [set() for _ in task_list]
    previous_warmup: list[set[int]] = [set() for _ in task_list]
    stateful_by_id = {task.id: task.stateful for task in task_list}
    reports = [_without_stale(client, stateful_by_id) for client in client_list]
    for c, (client, _) in enumerate(reports):
        for task_id, lag in client.lags.items():
            lags[task_index[task_id]][c] = lag
        for task_id in client.previous_active:
            t = task_index[task_id]
            running[t].append(c)
            lags[t][c] = 0
        for listed, replicas in (
            (client.previous_standby, previous_standby),
            (client.previous_warmup, previous_warmup),
        ):
            for task_id in listed:
                t = task_index[task_id]
                if c in running[t] or c in previous_standby[t] or c in previous_warmup[t]:
                    raise AssignmentError(
                        f"client {client.id!r}: task {task_id!r} is listed in more than one "
                        "of its previous active, standby and warm-up tasks"
                    )
                replicas[t].add(c)

    end_offset = tuple(
        _end_offset(task, task_lags, config.acceptable_recovery_lag)
        for task, task_lags in zip(task_list, lags, strict=True)
    )
    for task_lags, end in zip(lags, end_offset, strict=True):
        for c, lag in task_lags.items():
            # No state at all is as far behind as a client can be.
            task_lags[c] = min(lag, end)

    leaving = tuple(client.leaving for client in client_list)
    staying = tuple(c for c, gone in enumerate(leaving) if not gone)
    if task_list and not staying:
        raise AssignmentError(
            f"clients: {len(task_list)} tasks need at least one client that is not leaving, "
            f"found {len(client_list)} clients, all leaving"
        )
    standby_count = min(config.num_standby_replicas, len(staying) - 1) if staying else 0
    weight = _weights(client_list, staying)
    acceptable = config.acceptable_recovery_lag
    ready = tuple(
        _warm_first(
            [c for c, lag in task_lags.items() if lag <= acceptable and not leaving[c]], warm
        )
        for task_lags, warm in zip(lags, previous_warmup, strict=True)
    )
    sizes = Counter(group_of)
    holders = tuple(
        frozenset(c for c in (*lag, *standby, *warm) if not leaving[c])
        for lag, standby, warm in zip(lags, previous_standby, previous_warmup, strict=True)
    )
    return _Problem(
        config=config,
        task_ids=tuple(task.id for task in task_list),
        group_of=group_of,
        group_sizes=tuple(sizes[g] for g in range(len(group_names))),
        stateful=stateful,
        end_offset=end_offset,
        client_ids=tuple(client.id for client in client_list),
        leaving=leaving,
        weight=weight,
        staying=staying,
        by_weight=tuple(sorted(staying, key=lambda c: (-weight[c], c))),
        lags=tuple(lags),
        running=tuple(tuple(owners) for owners in running),
        previous_standby=tuple(frozenset(s) for s in previous_standby),
        previous_warmup=tuple(frozenset(s) for s in previous_warmup),
        ready=ready,
        state_holders=holders,
        standby_count=standby_count,
        warnings=_sorted_warnings(
            [
                *(warning for _, warnings in reports for warning in warnings),
                *_standby_shortfall(task_list, config.num_standby_replicas, len(staying)),
            ]
        ),
    )


def _end_offset(task: TaskSpec, lags: Mapping[int, int], acceptable: int) -> int:
    """The lag of a client without state for ``task``.

    When the task's end_offset is unknown, a client without state must not count as
    caught up, and any reported lag is some state: one more than every lag there is.
    """
    if task.end_offset is not None:
        return task.end_offset
    if not task.stateful:
        return 0
    return max((acceptable, *lags.values())) + 1


def _weights(client_list: Sequence[ClientState], staying: Sequence[int]) -> tuple[float, ...]:
    """Each client's capacity share among the staying clients; 0 for a leaving client.

    Capacities are taken relative to the largest, so that neither their sum
    overflows nor a share underflows to 0 (which ``_MIN_CAPACITY_RATIO`` rules out).
    """
    if not staying:
        return (0.0,) * len(client_list)
    largest = max(staying, key=lambda c: (client_list[c].capacity, -c))
    top = client_list[largest].capacity
    relative = {c: client_list[c].capacity / top for c in staying}
    for c, ratio in relative.items():
        if ratio < _MIN_CAPACITY_RATIO:
            small = client_list[c]
            raise AssignmentError(
                f"client {small.id!r}: capacity: expected at least {_MIN_CAPACITY_RATIO:g} times "
                f"the largest capacity ({top!r}, client {client_list[largest].id!r}), "
                f"found {small.capacity!r}"
            )
    total = math.fsum(relative.values())
    return tuple(relative[c] / total if c in relative else 0.0 for c in range(len(client_list)))


def _sorted_unique(items: Iterable[_Item], kind: type[_Item], noun: str) -> list[_Item]:
    if isinstance(items, str | bytes) or not isinstance(items, Iterable):
        raise ArgumentTypeError.wrong_type(f"{noun}s", f"an iterable of {kind.__name__}", items)
    result = list(items)
    for item in result:
        if not isinstance(item, kind):
            raise ArgumentTypeError.wrong_type(f"{noun}s", f"{kind.__name__} items", item)
    result.sort(key=lambda item: natural_key(item.id))
    for before, after in itertools.pairwise(result):
        if before.id == after.id:
            raise AssignmentError(f"{noun}s: duplicate {noun} id {after.id!r}")
    return result


def _warm_first(clients: list[int], warmed: set[int]) -> tuple[int, ...]:
    """Clients in index order, those that were warming the task up first (the move under way)."""
    return tuple(sorted(clients, key=lambda c: (c not in warmed, c)))


def _without_stale(
    client: ClientState, stateful: Mapping[str, bool]
) -> tuple[ClientState, tuple[AssignmentWarning, ...]]:
    """The client's report without what it says about tasks that are gone or stateless.

    A live cluster reports what it last ran: after a topology change a client
    may still hold state of a task removed from the job, or of one that is
    stateless now. Kafka ignores such reports, and so do we, with one warning
    per client and task.
    """
    ignored: dict[tuple[str, str], list[str]] = {}

    def keep(task_id: str, where: str, needs_state: bool) -> bool:
        known = task_id in stateful
        if known and (stateful[task_id] or not needs_state):
            return True
        kind = "stateless-task" if known else "unknown-task"
        ignored.setdefault((kind, task_id), []).append(where)
        return False

    cleaned = dataclasses.replace(
        client,
        lags={t: lag for t, lag in client.lags.items() if keep(t, "a lag", True)},
        previous_active=[t for t in client.previous_active if keep(t, "an active", False)],
        previous_standby=[t for t in client.previous_standby if keep(t, "a standby", True)],
        previous_warmup=[t for t in client.previous_warmup if keep(t, "a warm-up", True)],
    )
    warnings = tuple(
        AssignmentWarning(
            kind,
            task_id,
            client.id,
            f"client {client.id!r} reports {' and '.join(where)} of task {task_id!r}, "
            + ("which is stateless" if kind == "stateless-task" else "which is not in the job")
            + ": ignored",
        )
        for (kind, task_id), where in ignored.items()
    )
    return cleaned, warnings


def _standby_shortfall(
    task_list: Sequence[TaskSpec], wanted: int, staying: int
) -> Iterator[AssignmentWarning]:
    """A warning per stateful task when the staying clients cannot host every standby.

    Kafka assigns as many standbys as there are other clients and logs the
    rest; refusing to assign at all would leave a job without any assignment
    exactly when a client has crashed.
    """
    hosted = max(staying - 1, 0)
    if wanted <= hosted:
        return
    for task in task_list:
        if task.stateful:
            yield AssignmentWarning(
                "standby-shortfall",
                task.id,
                None,
                f"task {task.id!r} gets {hosted} of {wanted} standby replicas: "
                f"{staying} staying clients host at most {hosted} besides the active",
            )


def _sorted_warnings(warnings: Iterable[AssignmentWarning]) -> tuple[AssignmentWarning, ...]:
    return tuple(
        sorted(
            warnings,
            key=lambda w: (w.kind, natural_key(w.task), natural_key(w.client or "")),
        )
    )


# -- step 1: where tasks run now -------------------------------------------------------------


def _running_owners(problem: _Problem) -> list[int | None]:
    """The client running each task, preferring a staying one when several claim it."""
    owners: list[int | None] = []
    for claimants in problem.running:
        staying = [c for c in claimants if not problem.leaving[c]]
        owners.append((staying or claimants)[0] if claimants else None)
    return owners


def _planned_owners(
    problem: _Problem, owners: Sequence[int | None], warmups_move_actives: bool
) -> list[int | None]:
    """Where each task will run once the moves under way, or forced now, are done.

    Planning from there, not from where tasks run now, keeps the target still
    while warm-ups catch up: the moves already started are part of the
    starting point, so the next target has no reason to pick other ones.

    * While ``warmups_move_actives`` (see :func:`_warmups`), a task counts as
      running on its warm-up client, the least behind if it has several.
    * A stateful task that runs nowhere, or on a leaving client, will run on a
      caught-up staying client now if it has one (the rules say so): it counts
      as running on the one with the fewest tasks per capacity.
    """
    planned = _warmed_owners(problem, owners) if warmups_move_actives else list(owners)
    load = Counter(c for c in planned if c is not None and not problem.leaving[c])
    weight = problem.weight
    for t, c in enumerate(planned):
        if (c is None or problem.leaving[c]) and problem.needs_restore(t) and problem.ready[t]:
            ready = min(problem.ready[t], key=lambda r: (load[r] / weight[r], r))
            planned[t] = ready
            load[ready] += 1
    return planned


def _warmed_owners(problem: _Problem, owners: Sequence[int | None]) -> list[int | None]:
    """Owners once the warm-ups under way have become actives; standby warm-ups stay put.

    A warm-up counts as an active move unless its task's owner would fall below
    its active bounds (in the task's group or in total) without it: such a
    warm-up can only prepare a standby (see :func:`_warmups`, which starts
    standby warm-ups beside active ones only for such tasks). Moves are taken
    until none is left that fits, so that a chain of moves is read whole.
    """
    planned = list(owners)
    counts = _group_counts(problem, planned)
    pending = {
        t: min(staying, key=lambda c: (problem.lag(t, c), c))
        for t, warm in enumerate(problem.previous_warmup)
        if (staying := [c for c in warm if not problem.leaving[c]])
    }
    while pending:
        taken = [t for t in pending if not _below_bounds_without(problem, counts, planned[t], t)]
        if not taken:
            break
        for t in taken:
            _move_count(problem, counts, t, planned[t], pending[t])
            planned[t] = pending.pop(t)
    return planned


def _below_bounds_without(
    problem: _Problem, counts: Sequence[Mapping[int, int]], owner: int | None, task: int
) -> bool:
    """Whether a staying ``owner`` would fall below its active bounds without ``task``."""
    if owner is None or problem.leaving[owner]:
        return False
    g, tolerance, weight = problem.group_of[task], problem.config.balance_tolerance, problem.weight
    in_group = counts[g].get(owner, 0) - 1
    in_total = sum(cell.get(owner, 0) for cell in counts) - 1
    return (
        in_group < _share_bounds(problem.group_sizes[g] * weight[owner], tolerance)[0]
        or in_total < _share_bounds(len(problem.task_ids) * weight[owner], tolerance)[0]
    )


def _move_count(
    problem: _Problem, counts: list[dict[int, int]], task: int, source: int | None, dest: int
) -> None:
    cell = counts[problem.group_of[task]]
    if source is not None and not problem.leaving[source]:
        cell[source] -= 1
    cell[dest] = cell.get(dest, 0) + 1


def _actives_balanced(problem: _Problem, owners: Sequence[int | None]) -> bool:
    """Whether every task runs on a staying client and the active counts are balanced."""
    if any(c is None or problem.leaving[c] for c in owners):
        return False
    return not any(_active_count_checks(problem, _group_counts(problem, owners)))


def _active_count_checks(
    problem: _Problem, counts: Sequence[Mapping[int, int]]
) -> Iterator[tuple[str, int, tuple[int, int]]]:
    """The active counts outside their bounds: (what, count, bounds), per group and in total.

    Only the cells that hold tasks or whose lower bound is positive are looked
    at, so many small groups cost no more than one large one.
    """
    tolerance, weight = problem.config.balance_tolerance, problem.weight
    total: Counter[int] = Counter()
    for g, cell in enumerate(counts):
        size = problem.group_sizes[g]
        total.update(cell)
        for c in problem.by_weight:
            if (bounds := _share_bounds(size * weight[c], tolerance))[0] == 0:
                break
            if c not in cell:
                yield f"client {problem.client_ids[c]!r}: tasks of group {g}", 0, bounds
        for c, found in cell.items():
            bounds = _share_bounds(size * weight[c], tolerance)
            if not bounds[0] <= found <= bounds[1]:
                yield f"client {problem.client_ids[c]!r}: tasks of group {g}", found, bounds
    for c in problem.staying:
        bounds = _share_bounds(len(problem.task_ids) * weight[c], tolerance)
        if not bounds[0] <= total[c] <= bounds[1]:
            yield f"client {problem.client_ids[c]!r}: active tasks", total[c], bounds


# -- step 2: how many tasks of each group each client runs -----------------------------------


@functools.lru_cache(maxsize=1 << 16)
def _share_bounds(share: float, tolerance: float) -> tuple[int, int]:
    """The counts that are balanced for ``share``: within one task, or within the tolerance."""
    low = math.floor(share + _EPSILON)
    high = math.ceil(share - _EPSILON)
    if tolerance:
        low = min(low, math.ceil(share * (1 - tolerance) - _EPSILON))
        high = max(high, math.floor(share * (1 + tolerance) + _EPSILON))
    return max(low, 0), high


class _Columns:
    """Per-client counts, with the lightest client (by count per capacity) at hand."""

    def __init__(self, weight: Sequence[float], clients: Sequence[int], count: list[int]) -> None:
        self.weight = weight
        self.count = count
        self._lightest = [(self._grow_key(c), c) for c in clients]
        heapq.heapify(self._lightest)

    def _grow_key(self, client: int) -> float:
        # D'Hondt: the client whose load per capacity stays lowest after one more task.
        return (self.count[client] + 1) / self.weight[client]

    def change(self, client: int, delta: int) -> None:
        self.count[client] += delta
        # The old heap entry goes stale; pops skip entries whose key no longer matches.
        heapq.heappush(self._lightest, (self._grow_key(client), client))

    def grow(self, quota: dict[int, int], need: int, high_of: Callable[[int], int]) -> None:
        """Raise ``need`` quotas by one each, lightest clients first, none above ``high_of``."""
        full: list[tuple[float, int]] = []
        while need:
            key, c = heapq.heappop(self._lightest)
            if key != self._grow_key(c):
                continue
            if quota.get(c, 0) >= high_of(c):
                full.append((key, c))
                continue
            quota[c] = quota.get(c, 0) + 1
            need -= 1
            self.change(c, 1)
        for entry in full:
            heapq.heappush(self._lightest, entry)

    def shrink(self, quota: dict[int, int], excess: int, low_of: Callable[[int], int]) -> None:
        """Lower ``excess`` quotas by one each, heaviest clients first, none below ``low_of``."""
        heaviest = [(-self.count[c] / self.weight[c], c) for c, q in quota.items() if q > low_of(c)]
        heapq.heapify(heaviest)
        while excess:
            _, c = heapq.heappop(heaviest)
            quota[c] -= 1
            excess -= 1
            self.change(c, -1)
            if quota[c] > low_of(c):
                heapq.heappush(heaviest, (-self.count[c] / self.weight[c], c))
            if quota[c] == 0:
                del quota[c]


def _fit_row(
    quota: dict[int, int],
    total: int,
    columns: _Columns,
    bounds_of: Callable[[int], tuple[int, int]],
) -> None:
    """Make one group's quotas sum to its size within their bounds.

    Every unit taken costs one task move, every unit added none, so this
    touches as few quotas as the sum allows; which ones is left to the
    column loads: the heaviest clients shed, the lightest gain.
    """
    excess = sum(quota.values()) - total
    if excess > 0:
        columns.shrink(quota, excess, lambda c: bounds_of(c)[0])
    elif excess < 0:
        columns.grow(quota, -excess, lambda c: bounds_of(c)[1])


def _active_quotas(problem: _Problem, owners: Sequence[int | None]) -> list[dict[int, int]]:
    """Per group, client to the number of that group's tasks it runs in the target.

    Each count starts at what the client runs now, clamped into its group
    bounds; rows are then fixed to the group sizes (lightest clients gain,
    heaviest lose), and columns to the client bounds by moving one unit of
    some group from a client over its bounds to one under (a residual path in
    the groups-to-clients flow, so it always exists: the fractional shares are
    a solution, and flows with integer bounds have integer solutions).
    """
    tolerance = problem.config.balance_tolerance
    weight = problem.weight
    current = _group_counts(problem, owners)
    count = [0] * len(problem.client_ids)
    quotas: list[dict[int, int]] = []
    for g, size in enumerate(problem.group_sizes):
        quota: dict[int, int] = {}
        for c, now in current[g].items():
            low, high = _share_bounds(size * weight[c], tolerance)
            if clamped := min(max(now, low), high):
                quota[c] = clamped
        for c in problem.by_weight:
            low = _share_bounds(size * weight[c], tolerance)[0]
            if low == 0:
                break
            quota.setdefault(c, low)
        for c, q in quota.items():
            count[c] += q
        quotas.append(quota)
    columns = _Columns(weight, problem.staying, count)
    for g, size in enumerate(problem.group_sizes):
        _fit_row(quotas[g], size, columns, _bounds_for(size, weight, tolerance))
    _fit_columns(problem, quotas, current, columns)
    return quotas


def _bounds_for(
    size: int, weight: Sequence[float], tolerance: float
) -> Callable[[int], tuple[int, int]]:
    return lambda c: _share_bounds(size * weight[c], tolerance)


def _group_counts(problem: _Problem, owners: Sequence[int | None]) -> list[dict[int, int]]:
    """Per group, staying client to how many of the group's tasks it runs now."""
    counts: list[dict[int, int]] = [{} for _ in problem.group_sizes]
    for t, c in enumerate(owners):
        if c is not None and not problem.leaving[c]:
            group = counts[problem.group_of[t]]
            group[c] = group.get(c, 0) + 1
    return counts


def _fit_columns(
    problem: _Problem,
    quotas: list[dict[int, int]],
    current: list[dict[int, int]],
    columns: _Columns,
) -> None:
    """Bring every client's total within its bounds, one group unit at a time.

    The heaviest client above its bounds gives to the lightest one that may
    take more; then the lightest below its bounds takes from the heaviest
    that may give.
    """
    tolerance = problem.config.balance_tolerance
    weight, count = problem.weight, columns.count
    total = len(problem.task_ids)
    bounds = {c: _share_bounds(total * weight[c], tolerance) for c in problem.staying}
    groups_of: dict[int, set[int]] = {c: set() for c in problem.staying}
    for g, quota in enumerate(quotas):
        for c in quota:
            groups_of[c].add(g)
    heavy = _LazyHeap(problem.staying, lambda c: -count[c] / weight[c])
    light = _LazyHeap(problem.staying, lambda c: count[c] / weight[c])
    while True:
        donor = heavy.best(lambda c: count[c] > bounds[c][1])
        if donor is not None:
            taker = light.best(lambda c: count[c] < bounds[c][1])
        else:
            taker = light.best(lambda c: count[c] < bounds[c][0])
            if taker is None:
                return
            donor = heavy.best(lambda c: count[c] > bounds[c][0])
        if donor is None or taker is None:  # pragma: no cover - the sums make both exist
            return
        path = _exchange_path(problem, quotas, current, groups_of, donor, taker)
        if path is None:  # pragma: no cover - excluded by the flow argument in _active_quotas
            return
        for g, source, dest in path:
            quota = quotas[g]
            quota[source] -= 1
            if not quota[source]:
                del quota[source]
                groups_of[source].discard(g)
            quota[dest] = quota.get(dest, 0) + 1
            groups_of[dest].add(g)
        count[donor] -= 1
        count[taker] += 1
        for c in (donor, taker):
            heavy.touch(c)
            light.touch(c)


class _LazyHeap:
    """Clients by a changing key, smallest first; ``touch`` a client after its key changes."""

    def __init__(self, clients: Iterable[int], key: Callable[[int], float]) -> None:
        self.key = key
        self.heap = [(key(c), c) for c in clients]
        heapq.heapify(self.heap)

    def touch(self, client: int) -> None:
        heapq.heappush(self.heap, (self.key(client), client))

    def best(self, accept: Callable[[int], bool]) -> int | None:
        """The client with the smallest key (then index) that ``accept`` takes, if any."""
        passed: list[tuple[float, int]] = []
        found = None
        while self.heap:
            entry = heapq.heappop(self.heap)
            if entry[0] != self.key(entry[1]):
                continue  # stale: a fresher entry was pushed when the key changed
            passed.append(entry)
            if accept(entry[1]):
                found = entry[1]
                break
        for entry in passed:
            heapq.heappush(self.heap, entry)
        return found


def _exchange_path(
    problem: _Problem,
    quotas: list[dict[int, int]],
    current: list[dict[int, int]],
    groups_of: Mapping[int, set[int]],
    donor: int,
    taker: int,
) -> list[tuple[int, int, int]] | None:
    """Group-unit moves from ``donor`` to ``taker`` that keep every cell in its bounds.

    The direct move of one group is tried first, choosing the group that
    costs the fewest task moves; with unequal capacities a chain through
    other clients may be needed (breadth-first search).
    """
    tolerance = problem.config.balance_tolerance
    sizes, weight = problem.group_sizes, problem.weight

    def can_give(g: int, c: int) -> bool:
        return quotas[g].get(c, 0) > _share_bounds(sizes[g] * weight[c], tolerance)[0]

    def can_take(g: int, c: int) -> bool:
        return quotas[g].get(c, 0) < _share_bounds(sizes[g] * weight[c], tolerance)[1]

    def moves_added(g: int) -> int:
        # A unit below what runs now costs a move; one above what ran saves one.
        gives = quotas[g][donor] <= current[g].get(donor, 0)
        saves = quotas[g].get(taker, 0) < current[g].get(taker, 0)
        return int(gives) - int(saves)

    direct = [g for g in groups_of[donor] if can_give(g, donor) and can_take(g, taker)]
    if direct:
        g = min(direct, key=lambda g: (moves_added(g), g))
        return [(g, donor, taker)]
    parent: dict[int, tuple[int, int]] = {}
    frontier = [donor]
    seen = {donor}
    while frontier:
        following: list[int] = []
        for source in frontier:
            for g in sorted(groups_of[source]):
                if not can_give(g, source):
                    continue
                for dest in problem.staying:
                    if dest in seen or not can_take(g, dest):
                        continue
                    seen.add(dest)
                    parent[dest] = (source, g)
                    if dest == taker:
                        path: list[tuple[int, int, int]] = []
                        while dest != donor:
                            source_of, group = parent[dest]
                            path.append((group, source_of, dest))
                            dest = source_of
                        return path[::-1]
                    following.append(dest)
        frontier = following
    return None  # pragma: no cover


# -- step 3: which task goes where -----------------------------------------------------------


def _target_actives(
    problem: _Problem, owners: Sequence[int | None], quotas: Sequence[dict[int, int]]
) -> list[int]:
    """Each task's active client in the target, group by group within the quotas."""
    target = [-1] * len(problem.task_ids)
    members: list[list[int]] = [[] for _ in quotas]
    for t, g in enumerate(problem.group_of):
        members[g].append(t)
    for g, tasks in enumerate(members):
        for c, held in _place_group(problem, owners, tasks, quotas[g]).items():
            for t in held:
                target[t] = c
    return target


def _place_group(
    problem: _Problem,
    owners: Sequence[int | None],
    tasks: Sequence[int],
    quota: Mapping[int, int],
) -> dict[int, dict[int, None]]:
    """Client to the tasks of one group it runs in the target (dicts as ordered sets)."""
    placed: dict[int, dict[int, None]] = {c: {} for c in sorted(quota)}
    unplaced: list[int] = []
    for t in tasks:
        owner = owners[t]
        if owner is not None and owner in placed:
            placed[owner][t] = None
        else:
            unplaced.append(t)
    for c, held in placed.items():
        surplus = len(held) - quota[c]
        if surplus > 0:
            for t in sorted(held, key=lambda t: _eviction_key(problem, t, c))[:surplus]:
                del held[t]
                unplaced.append(t)
    free = {c: quota[c] - len(held) for c, held in placed.items()}
    matcher = _CaughtUpMatcher(problem, placed, free)
    rest = [
        t
        for t in sorted(unplaced, key=lambda t: (_urgency(problem, owners[t]), t))
        if not (problem.needs_restore(t) and matcher.place(t))
    ]
    _fill(problem, rest, placed, free)
    return placed


def _eviction_key(problem: _Problem, task: int, client: int) -> tuple[int, int, int]:
    """Which tasks a client over its quota sheds first: the cheapest to move, last-sorted first."""
    if not problem.needs_restore(task):
        return 0, 0, -task
    others = [c for c in problem.ready[task] if c != client]
    if others:
        return 1, int(not problem.previous_warmup[task] & set(others)), -task
    partial = [
        lag
        for c, lag in problem.lags[task].items()
        if c != client and not problem.leaving[c] and lag < problem.end_offset[task]
    ]
    if partial:
        return 2, min(partial), -task
    return 3, 0, -task


def _urgency(problem: _Problem, owner: int | None) -> int:
    """Tasks running nowhere get caught-up clients first, then those on leaving clients."""
    if owner is None:
        return 0
    return 1 if problem.leaving[owner] else 2


class _CaughtUpMatcher:
    """Places tasks on caught-up clients, shifting placed tasks along augmenting paths.

    A path runs task -> caught-up client -> a task placed there -> a client
    caught up on *that* task -> ... -> a client with room. A task that needs
    no restore can go to any client with room. A failed search marks every
    client it reached as dead: no later search can find room through them
    (augmentations never touch them, and room only shrinks), so the whole
    group costs one pass over its caught-up graph.
    """

    def __init__(
        self, problem: _Problem, placed: dict[int, dict[int, None]], free: dict[int, int]
    ) -> None:
        self.problem = problem
        self.placed = placed
        self.free = free
        self.dead: set[int] = set()
        self._open = [c for c in placed if free[c] > 0]

    def _room_besides(self, client: int) -> int | None:
        while self._open and not self.free[self._open[0]]:
            self._open.pop(0)
        return next((c for c in self._open if c != client and self.free[c]), None)

    def place(self, task: int) -> bool:
        parent: dict[int, tuple[int | None, int]] = {}
        queue: deque[int] = deque()
        for c in self.problem.ready[task]:
            if c in self.placed and c not in self.dead and c not in parent:
                parent[c] = (None, task)
                if self.free[c]:
                    self._augment(parent, c)
                    return True
                queue.append(c)
        while queue:
            c = queue.popleft()
            for held in self.placed[c]:
                if not self.problem.needs_restore(held):
                    room = self._room_besides(c)
                    if room is not None:
                        parent[room] = (c, held)
                        self._augment(parent, room)
                        return True
                    continue
                for other in self.problem.ready[held]:
                    if other in parent or other in self.dead or other not in self.placed:
                        continue
                    parent[other] = (c, held)
                    if self.free[other]:
                        self._augment(parent, other)
                        return True
                    queue.append(other)
        self.dead.update(parent)
        return False

    def _augment(self, parent: Mapping[int, tuple[int | None, int]], end: int) -> None:
        self.free[end] -= 1
        client: int | None = end
        while client is not None:
            source, task = parent[client]
            self.placed[client][task] = None
            if source is not None:
                del self.placed[source][task]
            client = source


def _fill(
    problem: _Problem,
    rest: Sequence[int],
    placed: dict[int, dict[int, None]],
    free: dict[int, int],
) -> None:
    """Place what no caught-up client took: partial state first, then in client order."""
    restoring = [t for t in rest if problem.needs_restore(t)]
    warm = sorted(
        (lag, t, c)
        for t in restoring
        for c, lag in problem.lags[t].items()
        if free.get(c, 0) > 0 and lag < problem.end_offset[t]
    )
    done: set[int] = set()
    for _, t, c in warm:
        if t not in done and free[c]:
            placed[c][t] = None
            free[c] -= 1
            done.add(t)
    open_clients = iter([c for c in placed if free[c] > 0])
    client = next(open_clients, -1)
    for t in [t for t in rest if not problem.needs_restore(t)] + restoring:
        if t in done:
            continue
        while not free[client]:
            client = next(open_clients)
        placed[client][t] = None
        free[client] -= 1


# -- step 4: standbys of the target ----------------------------------------------------------


def _water_filled(problem: _Problem, total: int, cap: Mapping[int, int]) -> dict[int, float]:
    """Each staying client's share of ``total`` by capacity, none above its ``cap``.

    What a capped client cannot take is spread over the others by capacity.
    """
    shares: dict[int, float] = {}
    remaining, weight_left = float(total), sum(problem.weight[c] for c in problem.staying)
    for c in sorted(problem.staying, key=lambda c: (cap[c] / problem.weight[c], c)):
        fair = remaining * problem.weight[c] / weight_left if weight_left > 0 else 0.0
        shares[c] = min(float(cap[c]), fair)
        remaining -= shares[c]
        weight_left -= problem.weight[c]
    return shares


def _capped_bounds(
    problem: _Problem, total: int, cap: Mapping[int, int]
) -> dict[int, tuple[int, int]]:
    """Balanced counts of a water-filled share: within bounds of the share, never above the cap."""
    tolerance = problem.config.balance_tolerance
    bounds: dict[int, tuple[int, int]] = {}
    for c, share in _water_filled(problem, total, cap).items():
        low, high = _share_bounds(share, tolerance)
        high = min(high, cap[c])
        bounds[c] = min(low, high), high
    return bounds


def _standby_bounds(
    problem: _Problem, actives_on: Mapping[int, int], stateful_count: int
) -> dict[int, tuple[int, int]]:
    """Standby counts within bounds of a share of all standbys.

    A client cannot stand by for tasks active on it, so its share is capped at
    the stateful tasks it does not run.
    """
    cap = {c: stateful_count - actives_on.get(c, 0) for c in problem.staying}
    return _capped_bounds(problem, stateful_count * problem.standby_count, cap)


def _load_bounds(
    problem: _Problem, stateful_on: Mapping[int, int], active_on: Mapping[int, int]
) -> dict[int, tuple[int, int]]:
    """Counts of actives plus standbys within bounds of a share of all replicas.

    A client holds a task at most once, so its share is capped at every
    stateful task plus the stateless tasks active on it.
    """
    stateful_count = sum(problem.stateful)
    total = len(problem.task_ids) + stateful_count * problem.standby_count
    cap = {c: stateful_count + active_on.get(c, 0) - stateful_on.get(c, 0) for c in problem.staying}
    return _capped_bounds(problem, total, cap)


def _standby_quota_bounds(
    problem: _Problem, stateful_on: Mapping[int, int], active_on: Mapping[int, int]
) -> dict[int, tuple[int, int]]:
    """Standby counts that keep each client balanced in total load, and in standbys as far
    as the total allows.

    Actives and standbys each within one of their shares could add up to two
    tasks over a client's share of the load; intersecting with the total's
    bounds, given the actives, keeps that within one as well. Where the two
    cannot both hold (unequal capacities, caps), the total wins: it is what
    a client's resources carry.
    """
    stateful_count = sum(problem.stateful)
    own = _standby_bounds(problem, stateful_on, stateful_count)
    load = _load_bounds(problem, stateful_on, active_on)
    bounds: dict[int, tuple[int, int]] = {}
    for c, (low, high) in own.items():
        cap = stateful_count - stateful_on.get(c, 0)
        by_load = (
            max(load[c][0] - active_on.get(c, 0), 0),
            min(load[c][1] - active_on.get(c, 0), cap),
        )
        both = max(low, by_load[0]), min(high, by_load[1])
        bounds[c] = both if both[0] <= both[1] else by_load
    needed = stateful_count * problem.standby_count
    feasible = all(low <= high for low, high in bounds.values()) and (
        sum(low for low, _ in bounds.values()) <= needed <= sum(high for _, high in bounds.values())
    )
    return bounds if feasible else own


def _standby_preference(problem: _Problem, task: int, client: int) -> int:
    """Among equally caught-up clients: the previous warm-up (the move under way), then the
    previous standby, then the previous active."""
    if client in problem.previous_warmup[task]:
        return 0
    if client in problem.previous_standby[task]:
        return 1
    return 2 if client in problem.running[task] else 3


def _standby_order(problem: _Problem, task: int, client: int) -> tuple[int, int, int]:
    """Most caught up first; among equals the previous warm-up, standby, active; then index."""
    return problem.recovery_rank(task, client), _standby_preference(problem, task, client), client


def _target_standbys(problem: _Problem, target: Sequence[int]) -> list[tuple[int, ...]]:
    """Standbys of the target: kept where they are as far as balance allows.

    Quotas come from the previous standbys, each client's count clamped into
    its bounds. Warm-ups under way then take the place of a standby on a client
    above its quota (the move they were started for), clients still above
    their quota shed the standbys that are cheapest to replace, and the gaps
    are filled with caught-up, then partly caught-up, then the emptiest
    clients. Warm-ups do not count towards the quotas, so the quotas, and with
    them the plan, stay the same while the warm-ups catch up.
    """
    count = problem.standby_count
    if not count:
        return [()] * len(problem.task_ids)
    tasks = [t for t, stateful in enumerate(problem.stateful) if stateful]
    bounds = _standby_quota_bounds(problem, Counter(target[t] for t in tasks), Counter(target))
    held = _held_standbys(problem, tasks, target)
    load = Counter(c for t in tasks for c in held[t])
    quota = {c: min(max(load[c], bounds[c][0]), bounds[c][1]) for c in problem.staying}
    _fit_in_order(quota, len(tasks) * count, bounds, problem.staying)
    _adopt_warmups(problem, tasks, target, held, quota, load)
    on_client: dict[int, list[int]] = {c: [] for c in problem.staying}
    for t in tasks:
        for c in held[t]:
            on_client[c].append(t)
    replaceable = {t: _replaceability(problem, t, held[t]) for t in tasks}
    for c, standing in on_client.items():
        surplus = load[c] - quota.get(c, 0)
        if surplus > 0:
            for t in sorted(standing, key=lambda t: (replaceable[t], -t))[:surplus]:
                held[t].remove(c)
                load[c] -= 1
    _fill_from_state(problem, tasks, target, held, quota, load)
    _fill_standbys(problem, tasks, target, held, quota, load)
    return [tuple(sorted(c)) for c in held]


def _held_standbys(
    problem: _Problem, tasks: Sequence[int], target: Sequence[int]
) -> list[list[int]]:
    """Per task, its previous standbys (at most the standby count, most caught up first)."""
    held: list[list[int]] = [[] for _ in problem.task_ids]
    for t in tasks:
        ranked = sorted(
            (c for c in problem.previous_standby[t] if c != target[t] and not problem.leaving[c]),
            key=lambda c: (problem.recovery_rank(t, c), c),
        )
        held[t] = ranked[: problem.standby_count]
    return held


def _adopt_warmups(
    problem: _Problem,
    tasks: Sequence[int],
    target: Sequence[int],
    held: list[list[int]],
    quota: Mapping[int, int],
    load: Counter[int],
) -> None:
    """Let each warm-up under way take a standby slot of its task.

    A task short of standbys just gains it. Otherwise the warm-up replaces
    the standby on the client furthest above its quota, if any is: that is
    the move it was started for (which standby goes does not matter, both
    are caught up, as long as each client above its quota loses the right
    number). Tasks with the fewest such choices go first.
    """
    count = problem.standby_count
    warming = []
    for t in tasks:
        for c in sorted(problem.previous_warmup[t]):
            if c != target[t] and c not in held[t] and not problem.leaving[c]:
                warming.append((t, c))

    def choices(t: int) -> int:
        return sum(load[c] > quota.get(c, 0) for c in held[t])

    for t, c in sorted(warming, key=lambda pair: (choices(pair[0]), pair)):
        if len(held[t]) >= count:
            over = [z for z in held[t] if load[z] > quota.get(z, 0)]
            if not over:
                continue
            dropped = max(over, key=lambda z: (load[z] - quota.get(z, 0), -z))
            held[t].remove(dropped)
            load[dropped] -= 1
        held[t].append(c)
        load[c] += 1


def _fit_in_order(
    quota: dict[int, int],
    total: int,
    bounds: Mapping[int, tuple[int, int]],
    clients: Sequence[int],
) -> None:
    """Make ``quota`` sum to ``total`` within bounds, taking clients in a fixed order."""
    excess = sum(quota.values()) - total
    for c in clients:
        if excess > 0:
            step = min(excess, quota[c] - bounds[c][0])
        elif excess < 0:
            step = -min(-excess, bounds[c][1] - quota[c])
        else:
            return
        quota[c] -= step
        excess -= step


def _replaceability(problem: _Problem, task: int, held: Sequence[int]) -> int:
    """How cheaply a standby of ``task`` can be replaced: 0 by a caught-up client, 1 by a
    partly caught-up one, 2 only from scratch. Clients over their quota shed the cheapest.

    Warm-up clients do not count: a warm-up catching up must not change which standby
    its client sheds, or the plan would change under it.
    """
    spare = problem.holders(task) - set(held) - problem.previous_warmup[task]
    if any(problem.is_caught_up(task, c) for c in spare):
        return 0
    if any(problem.lag(task, c) < problem.end_offset[task] for c in spare):
        return 1
    return 2


def _fill_from_state(
    problem: _Problem,
    tasks: Sequence[int],
    target: Sequence[int],
    held: list[list[int]],
    quota: Mapping[int, int],
    load: Counter[int],
) -> None:
    """Fill standby gaps with clients that have some of the task's state, most caught up first."""
    count = problem.standby_count
    candidates = sorted(
        (problem.recovery_rank(t, c), _standby_preference(problem, t, c), t, c)
        for t in tasks
        if len(held[t]) < count
        for c in problem.holders(t)
        if c != target[t] and c not in held[t] and problem.lag(t, c) < problem.end_offset[t]
    )
    for *_, t, c in candidates:
        if len(held[t]) < count and load[c] < quota.get(c, 0) and c not in held[t]:
            held[t].append(c)
            load[c] += 1


def _fill_standbys(
    problem: _Problem,
    tasks: Sequence[int],
    target: Sequence[int],
    chosen: list[list[int]],
    quota: Mapping[int, int],
    load: Counter[int],
) -> None:
    """Give every task its standbys from the clients with the most room left."""
    count = problem.standby_count
    book = _StandbyBook(problem, tasks, target, chosen, load)
    room = [(load[c] - quota.get(c, 0), c) for c in problem.staying if quota.get(c, 0) > load[c]]
    heapq.heapify(room)
    for t in tasks:
        skipped: list[tuple[int, int]] = []
        while len(chosen[t]) < count and room:
            key, c = heapq.heappop(room)
            if key != load[c] - quota.get(c, 0):
                if load[c] < quota.get(c, 0):  # a swap changed its load: queue it afresh
                    heapq.heappush(room, (load[c] - quota.get(c, 0), c))
                continue
            if book.holds(c, t):
                skipped.append((key, c))
                continue
            book.add(t, c)
            if load[c] < quota.get(c, 0):
                heapq.heappush(room, (load[c] - quota.get(c, 0), c))
        for entry in skipped:
            heapq.heappush(room, entry)
        while len(chosen[t]) < count:
            # Every client with room already holds this task: hand one of them a standby
            # from a client that does not, and give that client this task instead.
            with_room = [c for c in problem.staying if load[c] < quota.get(c, 0)]
            freed = book.swap_for_room(t, with_room)
            book.add(t, freed if freed is not None else book.lightest_outside(t))


class _StandbyBook:
    """Standbys being chosen, indexed both ways, so a swap is a few set operations."""

    def __init__(
        self,
        problem: _Problem,
        tasks: Sequence[int],
        target: Sequence[int],
        chosen: list[list[int]],
        load: Counter[int],
    ) -> None:
        self.problem = problem
        self.target = target
        self.chosen = chosen
        self.load = load
        self.on_client: dict[int, set[int]] = {c: set() for c in problem.staying}
        self.active_on: dict[int, set[int]] = {c: set() for c in problem.staying}
        for t in tasks:
            self.active_on[target[t]].add(t)
            for c in chosen[t]:
                self.on_client[c].add(t)

    def holds(self, client: int, task: int) -> bool:
        return task in self.on_client[client] or self.target[task] == client

    def add(self, task: int, client: int) -> None:
        self.chosen[task].append(client)
        self.on_client[client].add(task)
        self.load[client] += 1

    def lightest_outside(self, task: int) -> int:
        """Last resort, over quota: the client with the least standbys per capacity."""
        weight = self.problem.weight
        return min(
            (c for c in self.problem.staying if not self.holds(c, task)),
            key=lambda c: (self.load[c] / weight[c], c),
        )

    def swap_for_room(self, task: int, with_room: Sequence[int]) -> int | None:
        """Free a client that does not hold ``task`` by moving one of its standbys to a
        client with room; returns the freed client (it loses one standby, gains ``task``)."""
        problem = self.problem
        # Clients with the task's state first: giving it to them keeps a replica in place.
        stateful_first = sorted(
            problem.holders(task),
            key=lambda c: (
                problem.recovery_rank(task, c),
                _standby_preference(problem, task, c),
                c,
            ),
        )
        givers = [*stateful_first, *(c for c in problem.staying if c not in stateful_first)]
        for receiver in with_room:
            taken = self.on_client[receiver] | self.active_on[receiver]
            for giver in givers:
                if giver == receiver or self.holds(giver, task):
                    continue
                movable = self.on_client[giver] - taken
                if not movable:
                    continue
                other = min(movable)
                standbys = self.chosen[other]
                standbys[standbys.index(giver)] = receiver
                self.on_client[giver].discard(other)
                self.on_client[receiver].add(other)
                self.load[receiver] += 1
                self.load[giver] -= 1
                return giver
        return None


# -- step 5: what is handed out now ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Placement:
    active: list[int]
    standby: list[tuple[int, ...]]
    warmup: list[tuple[int, int]]
    """(task, client) pairs."""
    pending: int


def _handed_out_actives(
    problem: _Problem,
    owners: Sequence[int | None],
    target: Sequence[int],
    target_standby: Sequence[tuple[int, ...]],
) -> list[int]:
    """Each task's active client now: the target's where it is caught up, else a caught-up one."""
    active = [-1] * len(problem.task_ids)
    load = [0] * len(problem.client_ids)
    undecided: list[int] = []
    for t in range(len(problem.task_ids)):
        c = _settled_owner(problem, owners[t], target[t], t)
        if c is None:
            undecided.append(t)
        else:
            active[t] = c
            load[c] += 1
    for t in undecided:
        c = _least_behind(problem, t, target, target_standby, load)
        active[t] = c
        load[c] += 1
    return active


def _realize(
    problem: _Problem,
    active: Sequence[int],
    target: Sequence[int],
    target_standby: Sequence[tuple[int, ...]],
) -> _Placement:
    """Standbys and warm-ups next to the active clients handed out, and the moves pending."""
    standby = [
        _next_most_caught_up(problem, t, active[t], {target[t], *target_standby[t]})
        for t in range(len(problem.task_ids))
    ]
    warmup = _warmups(problem, active, standby, target, target_standby)
    pending = sum(
        (active[t] != target[t])
        + sum(not problem.is_caught_up(t, c) for c in set(target_standby[t]) - set(standby[t]))
        for t in range(len(problem.task_ids))
    )
    return _Placement(list(active), standby, warmup, pending)


def _settled_owner(problem: _Problem, owner: int | None, target: int, task: int) -> int | None:
    """The active client when no choice by load is needed; ``None`` otherwise."""
    if problem.is_caught_up(task, target):
        return target
    if owner is not None and not problem.leaving[owner]:
        return owner  # it stays put until the target client has caught up
    if problem.ready[task] or owner is None:
        return None  # a caught-up staying client takes it over, or the least-behind one
    return owner  # a leaving client runs it until a staying one has caught up


def _least_behind(
    problem: _Problem,
    task: int,
    target: Sequence[int],
    target_standby: Sequence[tuple[int, ...]],
    load: Sequence[int],
) -> int:
    """A caught-up staying client if any, else the least-behind; ties to the target, then load."""
    candidates: Sequence[int] = problem.ready[task]
    if not candidates:
        behind = {c: problem.lag(task, c) for c in problem.holders(task)}
        least = min(behind.values(), default=problem.end_offset[task])
        if least < problem.end_offset[task]:
            candidates = [c for c, lag in behind.items() if lag == least]
        else:
            candidates = [target[task]]
    preferred = {target[task], *target_standby[task]}
    return min(candidates, key=lambda c: (c not in preferred, load[c] / problem.weight[c], c))


def _next_most_caught_up(
    problem: _Problem, task: int, active: int, targets: set[int]
) -> tuple[int, ...]:
    """Standbys: the most caught-up staying clients besides the active one.

    Among equally caught-up clients the target's come first, then previous
    warm-ups, standbys and the previous active: that is what makes a balanced
    assignment stick.
    """
    count = problem.standby_count
    if not (count and problem.stateful[task]):
        return ()
    pool = (problem.holders(task) | targets) - {active}
    ranked = sorted(
        pool,
        key=lambda c: (
            problem.recovery_rank(task, c),
            c not in targets,
            _standby_preference(problem, task, c),
            c,
        ),
    )
    return tuple(sorted(ranked[:count]))


def _warmups(
    problem: _Problem,
    active: Sequence[int],
    standby: Sequence[tuple[int, ...]],
    target: Sequence[int],
    target_standby: Sequence[tuple[int, ...]],
) -> list[tuple[int, int]]:
    """Target replicas not yet in place, within the budget.

    Order: tasks still on a leaving client (so it can shut down), then future
    actives before future standbys, then the least lag (warm-ups already in
    flight keep their slot), then task and client order.
    """
    wanted: list[tuple[bool, bool, int, int, int]] = []
    for t in range(len(problem.task_ids)):
        if not problem.stateful[t]:
            continue
        have = {active[t], *standby[t]}
        for c in {target[t], *target_standby[t]} - have:
            wanted.append((not problem.leaving[active[t]], c != target[t], problem.lag(t, c), t, c))
    wanted.sort()
    budget = problem.config.max_warmup_replicas
    active_moves = [w for w in wanted if not w[1]]
    if active_moves:
        # While actives still move, the next rebalance reads a warm-up as an active move
        # unless its owner would fall below its bounds without the task (_warmed_owners).
        # Standby moves that cannot be misread so fill what the active moves leave of the
        # budget; the others wait until the actives are in place.
        counts = _group_counts(problem, active)
        wanted = active_moves + [
            w
            for w in wanted
            if w[1]
            and len(active_moves) < budget
            and _below_bounds_without(problem, counts, active[w[3]], w[3])
        ]
    return [(t, c) for *_, t, c in wanted[:budget]]


def _result(problem: _Problem, placement: _Placement) -> AssignmentResult:
    actives: list[list[str]] = [[] for _ in problem.client_ids]
    standbys: list[list[str]] = [[] for _ in problem.client_ids]
    warmups: list[list[str]] = [[] for _ in problem.client_ids]
    for t, task_id in enumerate(problem.task_ids):
        actives[placement.active[t]].append(task_id)
        for c in placement.standby[t]:
            standbys[c].append(task_id)
    for t, c in sorted(placement.warmup):
        warmups[c].append(problem.task_ids[t])
    needed = placement.pending > 0
    return AssignmentResult(
        assignment={
            client_id: ClientAssignment(tuple(actives[c]), tuple(standbys[c]), tuple(warmups[c]))
            for c, client_id in enumerate(problem.client_ids)
        },
        probing_rebalance=ProbingRebalance(
            needed, problem.config.probing_rebalance_interval_ms if needed else None
        ),
        may_shut_down=tuple(
            client_id
            for c, client_id in enumerate(problem.client_ids)
            if problem.leaving[c] and not actives[c]
        ),
        pending_moves=placement.pending,
        warnings=problem.warnings,
    )


# -- balance -----------------------------------------------------------------------------------


def _balance_violations(problem: _Problem, assignment: Mapping[str, ClientAssignment]) -> list[str]:
    """Why an assignment is not balanced, one line per broken rule (empty when balanced)."""
    client_index = {client_id: c for c, client_id in enumerate(problem.client_ids)}
    task_index = {task_id: t for t, task_id in enumerate(problem.task_ids)}
    replicas: dict[str, list[list[int]]] = {
        kind: [[] for _ in problem.task_ids] for kind in ("active", "standby", "warm-up")
    }
    standby_count: Counter[int] = Counter()
    problems: list[str] = []
    for client_id, tasks in assignment.items():
        c = client_index.get(client_id)
        if c is None:
            raise AssignmentError(f"assignment: unknown client {client_id!r}")
        unknown = [t for t in (*tasks.active, *tasks.standby, *tasks.warmup) if t not in task_index]
        if unknown:
            raise AssignmentError(
                f"assignment: client {client_id!r} has unknown task {unknown[0]!r}"
            )
        held = len(tasks.active) + len(tasks.standby) + len(tasks.warmup)
        if problem.leaving[c] and held:
            problems.append(f"leaving client {client_id!r} still holds {held} tasks")
        for kind, listed in (
            ("active", tasks.active),
            ("standby", tasks.standby),
            ("warm-up", tasks.warmup),
        ):
            for task_id in listed:
                replicas[kind][task_index[task_id]].append(c)
        if not problem.leaving[c]:
            standby_count[c] += len(tasks.standby)
    problems.extend(_replica_violations(problem, replicas))
    owners = [clients[0] if len(clients) == 1 else None for clients in replicas["active"]]
    stateful_on = Counter(c for t, c in enumerate(owners) if c is not None and problem.stateful[t])
    active_on = Counter(c for c in owners if c is not None)
    checks = list(_active_count_checks(problem, _group_counts(problem, owners)))
    if problem.standby_count:
        for c, bounds in _standby_quota_bounds(problem, stateful_on, active_on).items():
            if not bounds[0] <= standby_count[c] <= bounds[1]:
                checks.append(
                    (f"client {problem.client_ids[c]!r}: standbys", standby_count[c], bounds)
                )
        for c, bounds in _load_bounds(problem, stateful_on, active_on).items():
            load = active_on[c] + standby_count[c]
            if not bounds[0] <= load <= bounds[1]:
                checks.append(
                    (f"client {problem.client_ids[c]!r}: actives + standbys", load, bounds)
                )
    problems.extend(f"{what}: {found} outside {low}..{high}" for what, found, (low, high) in checks)
    return problems


def _replica_violations(
    problem: _Problem, replicas: Mapping[str, list[list[int]]]
) -> Iterator[str]:
    """Tasks without exactly one active and their standbys, or with two replicas on a client."""
    for t, task_id in enumerate(problem.task_ids):
        expected = {"active": 1, "standby": problem.standby_count if problem.stateful[t] else 0}
        if not problem.stateful[t]:
            expected["warm-up"] = 0
        for kind, count in expected.items():
            if len(replicas[kind][t]) != count:
                found = len(replicas[kind][t])
                yield f"task {task_id!r}: {found} {kind} replicas, expected {count}"
        on = [c for clients in replicas.values() for c in clients[t]]
        if len(set(on)) < len(on):
            twice = min(c for c in on if on.count(c) > 1)
            yield f"task {task_id!r}: two replicas on client {problem.client_ids[twice]!r}"
