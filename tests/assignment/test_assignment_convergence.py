"""Randomized convergence of the assignor: a simulated cluster over many rebalances.

Each seed builds a cluster (tasks in groups, some stateless; clients of
equal or unequal capacity; random standby count, warm-up budget and
tolerance) and then applies changes one at a time: a client joins, leaves
(is marked leaving and shuts down once told it may), crashes (down to a
single client, whatever the standby count), or comes back after a crash
with its old, now stale, state; a task is added, removed from the job (its
clients keep reporting its state), or turns stateless (they keep reporting
its lags and standbys). After each change the cluster
rebalances until no probing rebalance is needed; between rebalances every
replica handed out catches up, and state a client no longer hosts falls
further behind.

Checked on every assignment: every rule of the assignor (``check_rules``,
including a warning for every standby short and every stale report ignored)
and that shuffling the input changes nothing; no input raises. Checked after every change:
the assignment becomes balanced and stays put on a further rebalance, within
the bound of docs/assignment.md. With ``P`` the moves the first rebalance leaves
pending and ``w`` = ``max_warmup_replicas``: ``ceil(P / w) + 2`` rebalances
while the plan holds (KIP-441's ``ceil(moves / w) + 1``, plus one when
standby moves must wait for active ones; asserted for 90% of each seed's
changes, and KIP-441's own bound for 80%), and never more than
``2 * ceil(P / w) + 2`` (a standby plan may shift once a move lands).
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections import defaultdict
from dataclasses import dataclass, field

import pytest

from spark_elastic.assignment.assignor import assign, is_balanced
from spark_elastic.assignment.model import (
    AssignmentConfig,
    AssignmentResult,
    ClientState,
    TaskSpec,
)

SEEDS = range(40)
CHANGES = 25
MAX_REBALANCES = 400


def lag_of(client: ClientState, task: TaskSpec) -> float:
    """Offsets behind: the whole state without a lag, infinitely many when its size is unknown."""
    if task.id in client.previous_active:
        return 0
    if task.end_offset is None:
        return client.lags.get(task.id, math.inf)
    return min(client.lags.get(task.id, task.end_offset), task.end_offset)


def check_rules(
    tasks: list[TaskSpec],
    clients: list[ClientState],
    config: AssignmentConfig,
    result: AssignmentResult,
) -> None:
    """Every rule of the assignor, on one assignment."""
    acceptable = config.acceptable_recovery_lag
    by_id = {c.id: c for c in clients}
    staying = [c for c in clients if not c.leaving]
    standby_count = min(config.num_standby_replicas, len(staying) - 1)
    assert set(result.assignment) == set(by_id)
    owners: dict[str, list[str]] = defaultdict(list)
    standbys: dict[str, list[str]] = defaultdict(list)
    warmups: dict[str, list[str]] = defaultdict(list)
    for client_id, tasks_of in result.assignment.items():
        for t in tasks_of.active:
            owners[t].append(client_id)
        for t in tasks_of.standby:
            standbys[t].append(client_id)
        for t in tasks_of.warmup:
            warmups[t].append(client_id)
        if by_id[client_id].leaving:  # nothing new for a leaving client
            assert set(tasks_of.active) <= set(by_id[client_id].previous_active)
            assert not tasks_of.standby
            assert not tasks_of.warmup
    assert sum(map(len, warmups.values())) <= config.max_warmup_replicas
    for task in tasks:
        assert len(owners[task.id]) == 1, f"{task.id} has owners {owners[task.id]}"
        active = owners[task.id][0]
        if not task.stateful:
            assert not standbys[task.id]
            assert not warmups[task.id]
            continue
        assert len(standbys[task.id]) == standby_count
        replicas = [active, *standbys[task.id], *warmups[task.id]]
        assert len(set(replicas)) == len(replicas), f"{task.id} twice on a client: {replicas}"
        # The active goes to a caught-up client that may take it, else the least behind.
        eligible = staying + [c for c in clients if c.leaving and task.id in c.previous_active]
        caught_up = [c.id for c in eligible if lag_of(c, task) <= acceptable]
        if caught_up:
            assert active in caught_up, f"{task.id} on {active}, caught up: {caught_up}"
        else:
            assert lag_of(by_id[active], task) == min(lag_of(c, task) for c in eligible)

        # Standbys go to the next most caught-up clients.
        def rank(client_id: str, task: TaskSpec = task) -> float:
            lag = lag_of(by_id[client_id], task)
            return 0 if lag <= acceptable else lag

        others = [c.id for c in staying if c.id != active and c.id not in standbys[task.id]]
        if standbys[task.id] and others:
            assert max(map(rank, standbys[task.id])) <= min(map(rank, others))
    check_warnings(tasks, clients, config, result)
    idle_leaving = {c.id for c in clients if c.leaving and not result.assignment[c.id].active}
    assert set(result.may_shut_down) == idle_leaving
    assert result.probing_rebalance.needed == (result.pending_moves > 0)
    if result.probing_rebalance.needed:
        assert result.probing_rebalance.after_ms == config.probing_rebalance_interval_ms


def check_warnings(
    tasks: list[TaskSpec],
    clients: list[ClientState],
    config: AssignmentConfig,
    result: AssignmentResult,
) -> None:
    """One warning per stateful task short of standbys, one per client and stale task."""
    staying = [c for c in clients if not c.leaving]
    short = config.num_standby_replicas > len(staying) - 1
    expected = {("standby-shortfall", t.id, None) for t in tasks if t.stateful and short}
    stateful = {t.id: t.stateful for t in tasks}
    for c in clients:
        needs_state = [*c.lags, *c.previous_standby, *c.previous_warmup]
        for task_id in [*needs_state, *c.previous_active]:
            if task_id not in stateful:
                expected.add(("unknown-task", task_id, c.id))
        for task_id in needs_state:
            if task_id in stateful and not stateful[task_id]:
                expected.add(("stateless-task", task_id, c.id))
    found = [(w.kind, w.task, w.client) for w in result.warnings]
    assert len(found) == len(set(found)), f"a warning twice: {found}"
    assert set(found) == expected


@dataclass
class Member:
    id: str
    capacity: float
    state: dict[str, int] = field(default_factory=dict)
    """Task to offsets behind, for every task whose state the member keeps on disk."""
    active: tuple[str, ...] = ()
    standby: tuple[str, ...] = ()
    warmup: tuple[str, ...] = ()
    leaving: bool = False

    def report(self) -> ClientState:
        lags = {t: lag for t, lag in self.state.items() if t not in self.active}
        return ClientState(
            self.id,
            self.capacity,
            lags,
            self.active,
            self.standby,
            self.warmup,
            self.leaving,
        )


class Cluster:
    def __init__(self, seed: int) -> None:
        self.rng = rng = random.Random(seed)
        self.groups = groups = rng.randint(1, 4)
        self.added = 0
        self.tasks = [
            TaskSpec(
                f"t{i}",
                stateful=rng.random() < 0.8,
                group=f"g{rng.randrange(groups)}",
                end_offset=rng.randint(50_000, 500_000),
            )
            for i in range(rng.randint(5, 60))
        ]
        self.config = AssignmentConfig(
            num_standby_replicas=rng.choice([0, 1, 1, 2]),
            max_warmup_replicas=rng.choice([1, 2, 3]),
            balance_tolerance=rng.choice([0.0, 0.0, 0.25]),
        )
        self.weighted = rng.random() < 0.5
        self.live: dict[str, Member] = {}
        self.crashed: dict[str, Member] = {}
        self.joined = 0
        for _ in range(rng.randint(self.config.num_standby_replicas + 1, 6)):
            self.join()

    def join(self) -> str:
        self.joined += 1
        capacity = float(self.rng.choice([1, 2, 4])) if self.weighted else 1.0
        member = Member(f"c{self.joined}", capacity)
        self.live[member.id] = member
        return f"join {member.id}"

    def change(self) -> str:
        staying = sorted(m.id for m in self.live.values() if not m.leaving)
        kinds = ["join", "join", "add task"]
        if len(staying) > 1:
            kinds += ["leave", "crash", "crash"]
        if self.crashed:
            kinds.append("return")
        if len(self.tasks) > 3:
            kinds += ["remove task", "task turns stateless"]
        kind = self.rng.choice(kinds)
        if kind == "join":
            return self.join()
        if kind.endswith("task") or kind.startswith("task"):
            return self.change_topology(kind)
        if kind == "return":
            member = self.crashed.pop(self.rng.choice(sorted(self.crashed)))
            stale = self.rng.randint(0, 30_000)
            member.state = {t: lag + stale for t, lag in member.state.items()}
            member.active = member.standby = member.warmup = ()
            self.live[member.id] = member
            return f"return {member.id}"
        victim = self.rng.choice(staying)
        if kind == "leave":
            self.live[victim].leaving = True
            return f"leave {victim}"
        self.crashed[victim] = self.live.pop(victim)
        return f"crash {victim}"

    def change_topology(self, kind: str) -> str:
        """The job changes under the clients, which keep what they hold and report it."""
        if kind == "add task":
            self.added += 1
            group = f"g{self.rng.randrange(self.groups)}"
            task = TaskSpec(f"new{self.added}", group=group, end_offset=200_000)
            self.tasks.append(task)
            return f"add {task.id}"
        i = self.rng.randrange(len(self.tasks))
        if kind == "remove task":
            return f"remove {self.tasks.pop(i).id}"
        self.tasks[i] = dataclasses.replace(self.tasks[i], stateful=False)
        return f"{self.tasks[i].id} turns stateless"

    def clients(self) -> list[ClientState]:
        return [m.report() for m in self.live.values()]

    def rebalance(self) -> AssignmentResult:
        clients = self.clients()
        result = assign(self.tasks, clients, self.config)
        check_rules(self.tasks, clients, self.config, result)
        shuffled = list(clients)
        self.rng.shuffle(shuffled)
        assert assign(list(reversed(self.tasks)), shuffled, self.config) == result
        self.apply(result)
        return result

    def apply(self, result: AssignmentResult) -> None:
        """Until the next rebalance: hosted replicas catch up, the rest falls behind."""
        acceptable = self.config.acceptable_recovery_lag
        stateful = {t.id for t in self.tasks if t.stateful}
        for member in self.live.values():
            tasks_of = result.assignment[member.id]
            hosted = {*tasks_of.active, *tasks_of.standby, *tasks_of.warmup} & stateful
            for t in sorted(member.state):
                if t not in hosted:
                    member.state[t] += self.rng.randint(0, 4_000)
            for t in sorted(hosted):
                member.state[t] = 0 if t in tasks_of.active else self.rng.randint(0, acceptable)
            member.active, member.standby, member.warmup = (
                tasks_of.active,
                tasks_of.standby,
                tasks_of.warmup,
            )
        for client_id in result.may_shut_down:
            del self.live[client_id]


@pytest.mark.parametrize("seed", SEEDS, ids=lambda seed: f"seed={seed}")
def test_cluster_converges_to_balance_within_the_bound_after_every_change(seed: int) -> None:
    print(f"seed {seed}")
    cluster = Cluster(seed)
    warmups = cluster.config.max_warmup_replicas
    history = ["start"]
    typical = kip = 0
    for _ in range(CHANGES):
        where = f"seed {seed}, {cluster.config}, after {history[-3:]}"
        results = [cluster.rebalance()]
        while results[-1].probing_rebalance.needed:
            assert len(results) < MAX_REBALANCES, f"no convergence ({where})"
            results.append(cluster.rebalance())
        pending = results[0].pending_moves
        rounds = len(results)
        steps = [r.pending_moves for r in results]
        bound = 2 * math.ceil(pending / warmups) + 2
        assert rounds <= bound, f"{rounds} rebalances > {bound}, pending {steps} ({where})"
        typical += rounds <= math.ceil(pending / warmups) + 2
        kip += rounds <= math.ceil(pending / warmups) + 1

        clients = cluster.clients()
        settled = assign(cluster.tasks, clients, cluster.config)
        assert is_balanced(settled.assignment, cluster.tasks, clients, cluster.config), where
        assert not settled.probing_rebalance.needed, where
        assert all(settled.assignment[c.id] == results[-1].assignment[c.id] for c in clients), (
            f"reshuffled when stable ({where})"
        )
        history.append(cluster.change())
    assert typical >= 0.9 * CHANGES, f"seed {seed}: {typical}/{CHANGES} within ceil(P/w) + 2"
    assert kip >= 0.8 * CHANGES, f"seed {seed}: {kip}/{CHANGES} within ceil(P/w) + 1"


def odd_input(seed: int) -> tuple[list[TaskSpec], list[ClientState], AssignmentConfig]:
    """Any consistent input: tasks running twice or nowhere, replicas on leaving clients,
    more standbys than clients, reports of removed tasks and of stateless tasks' state, ..."""
    rng = random.Random(seed)
    tasks = [
        TaskSpec(
            f"t{i}",
            stateful=rng.random() < 0.7,
            group=rng.choice("ab"),
            end_offset=rng.choice([0, 5_000, 20_000, 300_000]),
        )
        for i in range(rng.randint(0, 15))
    ]
    config = AssignmentConfig(
        acceptable_recovery_lag=rng.choice([0, 10_000]),
        num_standby_replicas=rng.randint(0, 3),
        max_warmup_replicas=rng.randint(1, 3),
        balance_tolerance=rng.choice([0.0, 0.3]),
    )
    clients = []
    for c in range(rng.randint(1, 6)):
        active = [t.id for t in tasks if rng.random() < 0.25]
        rest = [t.id for t in tasks if t.stateful and t.id not in active]
        standby = [t for t in rest if rng.random() < 0.2]
        warmup = [t for t in rest if t not in standby and rng.random() < 0.1]
        lags = {t.id: rng.randint(0, 400_000) for t in tasks if t.stateful and rng.random() < 0.3}
        if rng.random() < 0.3:  # state of a task removed from the job, as a replica or a lag
            ghost = f"gone{rng.randint(1, 3)}"
            lags[ghost] = rng.randint(0, 400_000)
            [active, standby, warmup][rng.randrange(3)].append(ghost)
        stateless = [t.id for t in tasks if not t.stateful and t.id not in active]
        if stateless and rng.random() < 0.3:  # state of a task that is stateless now
            lags[stateless[0]] = rng.randint(0, 400_000)
            [standby, warmup][rng.randrange(2)].append(stateless[-1])
        capacity = rng.choice([0.5, 1.0, 2.0])
        leaving = rng.random() < 0.25
        clients.append(ClientState(f"c{c}", capacity, lags, active, standby, warmup, leaving))
    return tasks, clients, config


@pytest.mark.parametrize("block", range(5), ids=lambda block: f"seeds {block * 200}+")
def test_any_consistent_input_gets_an_assignment_that_follows_every_rule(block: int) -> None:
    checked = 0
    for seed in range(block * 200, (block + 1) * 200):
        print(f"seed {seed}")
        tasks, clients, config = odd_input(seed)
        staying = [c for c in clients if not c.leaving]
        if tasks and not staying:
            continue  # inconsistent: refused with an AssignmentError (see test_assignment.py)
        result = assign(tasks, clients, config)
        check_rules(tasks, clients, config, result)
        checked += 1
    assert checked > 100


@pytest.mark.parametrize("block", range(2), ids=lambda block: f"seeds {block * 200}+")
def test_any_consistent_input_without_end_offsets_follows_every_rule(block: int) -> None:
    # The same inputs with every state's size unknown: a client without a lag has no state.
    checked = 0
    for seed in range(block * 200, (block + 1) * 200):
        print(f"seed {seed}")
        tasks, clients, config = odd_input(seed)
        tasks = [dataclasses.replace(task, end_offset=None) for task in tasks]
        staying = [c for c in clients if not c.leaving]
        if tasks and not staying:
            continue
        result = assign(tasks, clients, config)
        check_rules(tasks, clients, config, result)
        checked += 1
    assert checked > 100
