"""The job's consumer group: a view of its progress for Kafka's own tools, never its truth.

In-process (``tests/conftest.py``'s harness: fake clock and launcher): the
coordinator offers the offsets its containers committed, a partition at the
slowest of the virtual tasks reading it, at most every ``GROUP_COMMIT_S``
and only when they moved. ``test_job_run_kafka.py`` reads the group with
Kafka's ``ConsumerGroupCommand`` on a real broker.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from conftest import InProcess
from spark_elastic.runtime.coordinator.supervisor import GROUP_COMMIT_S, group_offsets


@dataclass
class Watch:
    """An input's partitions as the coordinator sees them; ``group_view`` as Kafka's has."""

    group_view: bool = True
    commits: list[dict[str, dict[int, int]]] = field(default_factory=list)

    def partition_counts(self) -> Mapping[str, int]:
        return {"clicks": 2}

    def end_offsets(self, topic: str) -> Mapping[int, int]:
        return {0: 100, 1: 100}


def test_a_partition_shows_the_slowest_task_reading_it_and_nothing_until_all_committed() -> None:
    tasks = {
        "Partition 0_0_2": {"clicks": (0,)},
        "Partition 0_1_2": {"clicks": (0,)},
        "Partition 1_0_2": {"clicks": (1,)},
        "Partition 1_1_2": {"clicks": (1,)},
    }
    committed = {
        "Partition 0_0_2": {"clicks": {0: 70}},
        "Partition 0_1_2": {"clicks": {0: 40}},
        "Partition 1_0_2": {"clicks": {1: 90}},  # its partition's other task has not committed
    }
    assert group_offsets(committed, tasks) == {"clicks": {0: 40}}
    assert group_offsets({}, tasks) == {}


def test_the_coordinator_offers_progress_when_due_and_moved_and_again_after_a_failed_commit(
    in_process: InProcess,
) -> None:
    supervisor = in_process.restart(watch=Watch())
    in_process.register_all()
    assert supervisor.group_offsets_due() is None  # nothing committed yet
    for container in in_process.live():
        in_process.report(container, batch=30)
    in_process.clock.advance(GROUP_COMMIT_S)
    assert supervisor.group_offsets_due() == {"clicks": {0: 30, 1: 30}}
    # The commit failed (the server did not say it was shown): offered again when due.
    assert supervisor.group_offsets_due() is None
    in_process.clock.advance(GROUP_COMMIT_S)
    offered = supervisor.group_offsets_due()
    assert offered == {"clicks": {0: 30, 1: 30}}
    supervisor.group_offsets_shown(offered)
    in_process.clock.advance(GROUP_COMMIT_S)
    assert supervisor.group_offsets_due() is None  # nothing moved
    for container in in_process.live():
        in_process.report(container, batch=45)
    assert supervisor.group_offsets_due() is None  # moved, but not due yet
    in_process.clock.advance(GROUP_COMMIT_S)
    assert supervisor.group_offsets_due() == {"clicks": {0: 45, 1: 45}}


def test_an_input_without_a_group_view_is_offered_nothing(in_process: InProcess) -> None:
    supervisor = in_process.restart(watch=Watch(group_view=False))
    in_process.register_all()
    for container in in_process.live():
        in_process.report(container, batch=30)
    in_process.clock.advance(GROUP_COMMIT_S)
    assert supervisor.group_offsets_due() is None
