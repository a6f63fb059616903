"""Specification of a registered warm-up's wait for its tasks, through its ``WarmUp``.

Whatever the kind of warm-up (cold, snapshots, replay), the container
drives it the same way while it waits (``warmups._await_tasks``): it follows
with every job model it fetches, says it caught up through its one
heartbeat loop, and stops waiting when the model gives it its tasks, drops
it, or what the warm-up runs ends. The coordinator here is a real loopback
HTTP server serving job models in turn; the warm-up is a plain recorder of
the calls (the kinds themselves run Spark: ``test_follow.py`` and the
end-to-end stories).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from standins import json_coordinator

from spark_elastic.runtime.container import ContainerSettings, CoordinatorClient
from spark_elastic.runtime.container.client import _Heartbeats
from spark_elastic.runtime.container.warmups import Taken, _await_tasks
from spark_elastic.runtime.lease import ContainerLease, LeaseTerms
from spark_elastic.runtime.protocol import ContainerModel, JobModel

TASKS = ("Partition 0_0_2", "Partition 1_0_2")
OWNER = ContainerModel("clicks-c1", TASKS, 1, "/checkpoints/c1")
WARM = ContainerModel("clicks-c2", TASKS, 2, "/checkpoints/c2")


def model(
    version: int, *, warm: bool = True, given: bool = False, stopping: bool = False
) -> JobModel:
    return JobModel(
        version,
        "clicks",
        2,
        {"clicks": 2},
        (WARM,) if given else (OWNER,),
        warmups=(WARM,) if warm and not given else (),
        stopping=("clicks-c1",) if stopping else (),
    )


@dataclass
class Coordinator:
    """Serves ``models`` in turn on ``GET /jobModel`` (the last one from then on; one that
    hands the warm-up its tasks only after a beat said it caught up), and records every
    heartbeat's query string."""

    models: list[JobModel]
    beats: list[str] = field(default_factory=list)
    url: str = ""


@pytest.fixture
def coordinator() -> Iterator[Coordinator]:
    state = Coordinator([])

    def answer(path: str) -> object:
        if path == "/jobModel":
            # As the coordinator does, a warm-up gets its tasks only once it said it caught
            # up (in the handover's first phase): until then the model before stays.
            served = state.models[0]
            hands_over = len(state.models) > 1 and state.models[1].container(WARM.container_id)
            caught_up = any("caughtUp=true" in beat for beat in state.beats)
            if len(state.models) > 1 and (caught_up or not hands_over):
                state.models.pop(0)
            return served.to_json()
        state.beats.append(path)
        return {"alive": True, "leaseMs": 60000, "jobModelVersion": 1}

    with json_coordinator(answer) as url:
        state.url = url
        yield state


@dataclass
class Recorder:
    """A ``WarmUp`` that records what it was asked: caught up once the owners are
    stopping; failed after ``fails_after`` follows, if set."""

    fails_after: int | None = None
    poll_s: float = 0.01
    followed: list[int] = field(default_factory=list)

    def prepare(self, client: CoordinatorClient) -> bool:
        return True

    def __call__(self, model: JobModel, container_id: str) -> None:
        assert container_id == WARM.container_id
        self.followed.append(model.version)

    def caught_up(self, model: JobModel, container_id: str) -> bool:
        return bool(model.stopping)

    def failure(self) -> str | None:
        if self.fails_after is not None and len(self.followed) >= self.fails_after:
            return "the replaying query ended: boom"
        return None

    def take_over(self, mine: ContainerModel, model: JobModel, plan: object) -> Taken:
        raise AssertionError("the wait never takes over")

    def discard(self) -> None:
        raise AssertionError("the wait never discards")


def wait(coordinator: Coordinator, warm_up: Recorder) -> tuple[JobModel | None, bool]:
    """Run the wait with a heartbeat loop of 10 minutes (only its first beat and a caught-up
    one go out); the model it returned, and whether it set the container dead."""
    settings = ContainerSettings.from_env(
        {
            "SPARK_ELASTIC_COORDINATOR_URL": coordinator.url,
            "EXECUTION_ENV_CONTAINER_ID": WARM.container_id,
            "SPARK_ELASTIC_JOB": "jobs.py:job",
            "SPARK_ELASTIC_HEARTBEAT_MS": "600000",
        }
    )
    client = CoordinatorClient(coordinator.url, timeout_s=5)
    dead = threading.Event()
    terms = LeaseTerms(lease_s=2.0, margin_s=1.0, write_budget_s=1.0)
    beats = _Heartbeats(client, settings, ContainerLease(terms), dead)
    beats.start()
    stop = threading.Event()
    deadline = threading.Timer(60, stop.set)  # a wait that never ends fails, not hangs
    deadline.start()
    try:
        got = _await_tasks(client, WARM.container_id, stop, dead, beats, warm_up)
    finally:
        deadline.cancel()
        beats.stop()
        beats.join(60)
    assert not stop.is_set(), "the wait did not end within 60 s"
    return got, dead.is_set()


def test_it_follows_each_model_says_it_caught_up_and_returns_the_one_that_gives_it_its_tasks(
    coordinator: Coordinator,
) -> None:
    coordinator.models = [model(3), model(4, stopping=True), model(5, given=True)]
    warm_up = Recorder()
    got, dead = wait(coordinator, warm_up)
    assert got == model(5, given=True)
    assert not dead
    assert list(dict.fromkeys(warm_up.followed)) == [3, 4], "each model in turn"
    assert any("caughtUp=true" in beat for beat in coordinator.beats)


def test_it_stops_waiting_when_the_model_drops_it(coordinator: Coordinator) -> None:
    coordinator.models = [model(3), model(4, warm=False)]
    warm_up = Recorder()
    got, dead = wait(coordinator, warm_up)
    assert got is None
    assert not dead
    assert warm_up.followed == [3]
    assert not any("caughtUp=true" in beat for beat in coordinator.beats)


def test_a_warm_up_whose_query_ended_ends_the_container_as_fenced(
    coordinator: Coordinator,
) -> None:
    coordinator.models = [model(3)]
    warm_up = Recorder(fails_after=2)
    got, dead = wait(coordinator, warm_up)
    assert got is None
    assert dead
    assert warm_up.followed == [3, 3]
