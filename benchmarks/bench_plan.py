"""Planning speed: spark-elastic's columnar plan vs a Samza-style object-per-task grouper.

Run: ``.venv/bin/python benchmarks/bench_plan.py`` (add ``--quick`` for small sizes).

For each size it plans one stream of N partitions at elasticity factor 16
and reports the best of three runs of:

* ``plan_job``: the columnar plan (every task's id, partitions and buckets);
* ``+ names``: the same plus all task names as strings;
* ``object-per-task``: the natural alternative, a dict from TaskName to a set of
  SystemStreamPartition objects built one virtual task at a time, as Samza's
  groupers do (skipped above 25,000 partitions: it is the slow side).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial

from spark_elastic import SystemStreamPartition, TaskName, plan_job

FACTOR = 16


def best_of(runs: int, fn: Callable[[], object]) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def object_per_task(partitions: int) -> dict[TaskName, set[SystemStreamPartition]]:
    grouped: dict[TaskName, set[SystemStreamPartition]] = {}
    for p in range(partitions):
        for bucket in range(FACTOR):
            name = TaskName.for_partition(p, bucket, FACTOR)
            grouped.setdefault(name, set()).add(SystemStreamPartition("kafka", "PVE", p, bucket))
    return grouped


def plan_names(inputs: list[str]) -> list[str]:
    return plan_job(inputs, elasticity_factor=FACTOR).task_names()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes only")
    args = parser.parse_args()
    sizes = [1_000, 5_000] if args.quick else [12_500, 25_000, 50_000, 100_000]
    print("| partitions | virtual tasks | plan_job (s) | + names (s) | object-per-task (s) |")
    print("|---:|---:|---:|---:|---:|")
    for n in sizes:
        inputs = [f"kafka.PVE:{n}"]
        plan_s = best_of(3, partial(plan_job, inputs, elasticity_factor=FACTOR))
        names_s = best_of(3, partial(plan_names, inputs))
        naive = f"{best_of(1, partial(object_per_task, n)):.3f}" if n <= 25_000 else "-"
        print(f"| {n:,} | {n * FACTOR:,} | {plan_s:.3f} | {names_s:.3f} | {naive} |")


if __name__ == "__main__":
    main()
