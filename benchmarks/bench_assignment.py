"""Benchmark of the task assignor: time per rebalance, and rebalances to converge.

Run: ``.venv/bin/python benchmarks/bench_assignment.py`` (about two minutes).
Prints two markdown tables:

* time of one ``assign`` call on the issue's three shapes, for a cold start
  (no state anywhere), a stable cluster (balanced and caught up: returned
  unchanged), 10% more clients, and 10% of the clients leaving;
* rebalances until balanced after a scale-out and a scale-in, with every
  replica handed out caught up between rebalances (the probing interval).

Every task is stateful (the expensive case); tasks come in groups
(sub-topologies) of 100 or 1,000.
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from spark_elastic.assignment.assignor import assign, is_balanced
from spark_elastic.assignment.model import (
    AssignmentConfig,
    AssignmentResult,
    ClientState,
    TaskSpec,
)

FULL = 1_000_000


@dataclass(frozen=True)
class Shape:
    tasks: int
    clients: int
    standbys: int
    groups: int
    kafka: str
    """Kafka Streams' HighAvailabilityTaskAssignor on the same shape, in a warm JVM on this
    machine class (measured for issue 10)."""
    repeats: int
    warmups: int
    """max_warmup_replicas for the convergence runs."""
    change: float
    """Fraction of clients added or removed in the convergence runs."""

    @property
    def label(self) -> str:
        return f"{self.tasks:,} tasks, {self.clients:,} clients, {self.standbys} standby" + (
            "s" if self.standbys > 1 else ""
        )


SHAPES = (
    Shape(1_000, 1_000, 1, 10, "2.9 s", 5, 2, 0.10),
    Shape(1_000, 100, 50, 10, "1.0 s", 5, 100, 0.10),
    Shape(100_000, 1_000, 1, 100, "not measured", 1, 1_000, 0.01),
)


def task_list(shape: Shape) -> list[TaskSpec]:
    return [
        TaskSpec(f"t{i}", group=f"g{i % shape.groups}", end_offset=FULL) for i in range(shape.tasks)
    ]


def fresh(count: int, prefix: str = "c") -> list[ClientState]:
    return [ClientState(f"{prefix}{i}") for i in range(count)]


def caught_up(clients: Sequence[ClientState], result: AssignmentResult) -> list[ClientState]:
    """The clients at the next rebalance: every replica they were given has caught up."""
    following = []
    for c in clients:
        if c.id in result.may_shut_down:
            continue
        a = result.assignment[c.id]
        lags = dict.fromkeys((*a.standby, *a.warmup), 0)
        following.append(
            ClientState(c.id, c.capacity, lags, a.active, a.standby, a.warmup, c.leaving)
        )
    return following


def leaving(clients: Sequence[ClientState], fraction: float) -> list[ClientState]:
    count = max(1, round(len(clients) * fraction))
    return [
        ClientState(
            c.id,
            c.capacity,
            c.lags,
            c.previous_active,
            c.previous_standby,
            c.previous_warmup,
            i < count,
        )
        for i, c in enumerate(clients)
    ]


def seconds(call: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@dataclass(frozen=True)
class Convergence:
    pending: int
    rebalances: int
    seconds: float
    balanced: bool


def converge(
    tasks: list[TaskSpec], clients: list[ClientState], config: AssignmentConfig
) -> Convergence:
    start = time.perf_counter()
    result = assign(tasks, clients, config)
    pending, rebalances = result.pending_moves, 1
    while result.probing_rebalance.needed:
        clients = caught_up(clients, result)
        result = assign(tasks, clients, config)
        rebalances += 1
    elapsed = time.perf_counter() - start
    return Convergence(
        pending, rebalances, elapsed, is_balanced(result.assignment, tasks, clients, config)
    )


def main() -> int:
    print(
        f"Python {platform.python_version()} on {platform.machine()}, "
        f"{os.cpu_count()} CPUs; times are the median of the repeats shown.\n"
    )
    timing = [
        "| shape | Kafka HATaskAssignor | cold start | stable | scale-out +10% | scale-in -10% "
        "| runs |",
        "|---|---|---|---|---|---|---|",
    ]
    moves = [
        "| shape | change | max warm-ups w | pending P | rebalances | bound ceil(P/w)+2 "
        "| time | balanced |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for shape in SHAPES:
        tasks = task_list(shape)
        config = AssignmentConfig(num_standby_replicas=shape.standbys)
        cold = fresh(shape.clients)
        stable = caught_up(cold, assign(tasks, cold, config))
        grown = stable + fresh(max(1, shape.clients // 10), "n")
        shrunk = leaving(stable, 0.10)
        row = [
            seconds(partial(assign, tasks, clients, config), shape.repeats)
            for clients in (cold, stable, grown, shrunk)
        ]
        timing.append(
            f"| {shape.label} | {shape.kafka} | "
            + " | ".join(f"{t:.2f} s" for t in row)
            + f" | {shape.repeats} |"
        )
        budget = AssignmentConfig(
            num_standby_replicas=shape.standbys, max_warmup_replicas=shape.warmups
        )
        added = max(1, round(shape.clients * shape.change))
        for change, clients in (
            (f"+{added} clients", stable + fresh(added, "n")),
            (f"{added} leaving", leaving(stable, shape.change)),
        ):
            run = converge(tasks, clients, budget)
            bound = math.ceil(run.pending / shape.warmups) + 2
            moves.append(
                f"| {shape.label} | {change} | {shape.warmups} | {run.pending:,} | "
                f"{run.rebalances} | {bound} | {run.seconds:.1f} s | {run.balanced} |"
            )
        print(f"done: {shape.label}", file=sys.stderr)
    print("\n".join(timing))
    print()
    print("\n".join(moves))
    return 0


if __name__ == "__main__":
    sys.exit(main())
