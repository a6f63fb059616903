"""What of the job's input fails since when: each call's failure said once, its return once."""

from __future__ import annotations

from spark_elastic.runtime.coordinator.input_health import CHECK, GROUP, InputHealth


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_each_call_is_said_once_per_cause_and_its_return_counts_from_its_own_failure() -> None:
    clock, said = Clock(), []
    health = InputHealth(lambda kind, detail: said.append((kind, detail)), clock)
    assert health.status()["state"] == "unknown"
    health.failed(GROUP, "consumer group 'clicks' not updated: timed out")
    clock.now += 30
    health.failed(CHECK, "check failed: no broker")
    health.failed(CHECK, "check failed: no broker")  # the same cause: said once
    status = health.status()
    assert (status["state"], status["failingSince"], status["failingForS"]) == (
        "failing",
        1000.0,
        30.0,
    )
    assert set(status["failing"]) == {CHECK, GROUP}
    clock.now += 10
    health.answered(CHECK)
    assert said[-1] == (CHECK, "the input answers again (10 s after its first failure)")
    assert health.status()["failingSince"] == 1000.0  # the group still fails
    clock.now += 5
    health.answered(GROUP)
    assert said[-1] == (
        GROUP,
        "the consumer group takes the job's progress again (45 s after its first failure)",
    )
    assert len(said) == 4
    status = health.status()
    assert (status["state"], status["failing"], status["failingSince"]) == ("answering", {}, None)
    assert status["lastAnswerAt"] == 1045.0
