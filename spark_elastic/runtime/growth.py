"""SEP-5 on a running job: how input partition growth is judged, planned and sequenced.

Pure functions over counts and offsets; no I/O, no Spark. The supervisor
(:mod:`.coordinator.supervisor`) watches the inputs' partition counts and calls in here:

1. **Judge** (:func:`judge_counts`). Counts equal to the model's: nothing to
   do. Every changed topic grew to a multiple of its *planned* count: growth.
   Anything else (a topic shrank, a count that is not a multiple, a topic
   appeared or vanished): refused, with a one-line reason; the job keeps
   running on its model.
2. **Drain** (:func:`drained`). Before any container reads a new partition,
   every task must have committed its old partitions up to the end offsets
   they had when the growth was seen (the *barrier*). A key's records in its
   old partition are therefore applied before its records in the new one,
   which a plain restart with a backlog does not give.
3. **Plan** (:func:`grown_plan`). Containers plan the job at the planned
   counts, then grow that plan with SEP-5's rule: new partition p joins the
   virtual tasks of p mod the planned count. The virtual tasks never change,
   so keyed state and bucket checkpoints stay where they are.

May import: :mod:`spark_elastic.errors`, :mod:`spark_elastic.model`, and the
standard library.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from spark_elastic.model.groupers import plan_job
from spark_elastic.model.plan import JobPlan, StreamInput

__all__ = ["CountCheck", "drained", "grown_plan", "judge_counts"]

Offsets = Mapping[str, Mapping[int, int]]


@dataclass(frozen=True)
class CountCheck:
    """What a look at the inputs' partition counts means for the job.

    Attributes
    ----------
    verdict
        ``"same"``, ``"growth"`` or ``"refused"``.
    counts
        The counts seen.
    reason
        For ``"refused"``, why, in one line; else empty.
    """

    verdict: str
    counts: Mapping[str, int]
    reason: str = ""


def _is_growth_of(planned: int, seen: int) -> bool:
    return seen >= planned and seen % planned == 0


def judge_counts(
    planned: Mapping[str, int], current: Mapping[str, int], seen: Mapping[str, int]
) -> CountCheck:
    """Judge the partition counts seen against the model's.

    Parameters
    ----------
    planned
        The counts the virtual tasks were planned for.
    current
        The counts containers read now (``planned`` or a growth of it).
    seen
        The counts the inputs report now.

    Returns
    -------
    CountCheck
        ``same`` when ``seen == current``; ``growth`` when every topic's count
        is a multiple of its planned count and one at least grew past its
        current count; otherwise ``refused`` with the first reason.
    """
    seen = dict(seen)
    if seen == dict(current):
        return CountCheck("same", seen)
    if set(seen) != set(planned):
        gone, new = sorted(set(planned) - set(seen)), sorted(set(seen) - set(planned))
        what = f"topics {gone} vanished" if gone else f"topics {new} appeared"
        return CountCheck("refused", seen, f"{what}; the job's inputs are {sorted(planned)}")
    for topic in sorted(seen):
        if seen[topic] < current[topic]:
            return CountCheck(
                "refused",
                seen,
                f"{topic}: {current[topic]} -> {seen[topic]} partitions is a shrink; keys "
                "would lose their partitions' records",
            )
        if not _is_growth_of(planned[topic], seen[topic]):
            return CountCheck(
                "refused",
                seen,
                f"{topic}: {seen[topic]} partitions is not a multiple of the planned "
                f"{planned[topic]} (SEP-5 maps partition p to the task of p mod "
                f"{planned[topic]}, which would split keys that hash together)",
            )
    return CountCheck("growth", seen)


def drained(
    barrier: Offsets,
    committed: Mapping[str, Offsets],
    task_partitions: Mapping[str, Mapping[str, tuple[int, ...]]],
) -> bool:
    """Whether every task has committed its old partitions up to the barrier.

    Parameters
    ----------
    barrier
        ``{topic: {partition: end offset when growth was seen}}``.
    committed
        ``{task: {topic: {partition: committed offset}}}``, as the tasks'
        owners last reported.
    task_partitions
        ``{task: {topic: partitions it reads}}``.

    Returns
    -------
    bool
        True when no task still has records before the barrier to apply.
    """
    for task, topics in task_partitions.items():
        for topic, partitions in topics.items():
            for partition in partitions:
                need = barrier.get(topic, {}).get(partition, 0)
                have = committed.get(task, {}).get(topic, {}).get(partition, 0)
                if have < need:
                    return False
    return True


def grown_plan(
    grouper: str,
    elasticity_factor: int,
    planned: Mapping[str, int],
    current: Mapping[str, int],
) -> JobPlan:
    """The job's plan at ``current`` counts, keeping the tasks planned at ``planned``.

    Runs wherever a plan is needed (a container's driver, once at start).

    Parameters
    ----------
    grouper
        The job's grouper name.
    elasticity_factor
        Virtual tasks per base task.
    planned
        The counts the virtual tasks were planned for.
    current
        The counts to read now: ``planned``, or a SEP-5 growth of it.

    Returns
    -------
    JobPlan
        The planned job's virtual tasks; after growth, partition p of a topic
        planned at n belongs to the tasks of partition p mod n.
    """

    def inputs(counts: Mapping[str, int]) -> list[StreamInput]:
        return [StreamInput("kafka", topic, count) for topic, count in counts.items()]

    base = plan_job(inputs(planned), grouper=grouper, elasticity_factor=elasticity_factor)
    if dict(current) == dict(planned):
        return base
    return plan_job(
        inputs(current), grouper=grouper, elasticity_factor=elasticity_factor, previous=base
    )
