"""A container's settings come from its environment, with Samza's interval, timeout, retries."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

import pytest
from standins import json_coordinator

from spark_elastic.errors import ArgumentError
from spark_elastic.runtime.container import ContainerSettings, CoordinatorClient
from spark_elastic.runtime.container.client import _Heartbeats
from spark_elastic.runtime.lease import ContainerLease, LeaseTerms

TERMS = LeaseTerms(lease_s=2.0, margin_s=1.0, write_budget_s=1.0)

BASE = {
    "EXECUTION_ENV_CONTAINER_ID": "clicks-c1",
    "SPARK_ELASTIC_COORDINATOR_URL": "http://127.0.0.1:8470",
    "SPARK_ELASTIC_JOB": "jobs.py:job",
}


def test_heartbeat_interval_timeout_and_retries_are_configurable() -> None:
    settings = ContainerSettings.from_env(
        {
            **BASE,
            "SPARK_ELASTIC_HEARTBEAT_MS": "250",
            "SPARK_ELASTIC_HEARTBEAT_TIMEOUT_MS": "400",
            "SPARK_ELASTIC_HEARTBEAT_RETRIES": "3",
        }
    )
    assert (settings.heartbeat_s, settings.heartbeat_timeout_s, settings.heartbeat_retries) == (
        0.25,
        0.4,
        3,
    )
    assert ContainerSettings.from_env(BASE).heartbeat_timeout_s is None  # derived from interval


@pytest.mark.parametrize("bad", ["0", "-5", "1.5", "soon"])
def test_a_bad_heartbeat_timeout_is_one_line_naming_the_variable(bad: str) -> None:
    with pytest.raises(ArgumentError, match="SPARK_ELASTIC_HEARTBEAT_TIMEOUT_MS") as info:
        ContainerSettings.from_env({**BASE, "SPARK_ELASTIC_HEARTBEAT_TIMEOUT_MS": bad})
    assert "\n" not in str(info.value)


def test_a_warm_up_replays_by_default_and_snapshots_when_told() -> None:
    assert ContainerSettings.from_env(BASE).warmup == "replay"
    snapshot = ContainerSettings.from_env({**BASE, "SPARK_ELASTIC_WARMUP": "snapshot"})
    assert snapshot.warmup == "snapshot"


def test_an_unknown_warm_up_mode_is_one_line_naming_the_variable_and_the_choices() -> None:
    with pytest.raises(ArgumentError) as info:
        ContainerSettings.from_env({**BASE, "SPARK_ELASTIC_WARMUP": "copy"})
    assert str(info.value) == (
        "SPARK_ELASTIC_WARMUP: expected one of replay, snapshot, found 'copy'"
    )


def test_a_heartbeat_to_a_coordinator_that_never_answers_fails_at_its_timeout() -> None:
    # A frozen coordinator: the kernel accepts the connection, nobody ever answers.
    with socket.socket() as frozen:
        frozen.bind(("127.0.0.1", 0))
        frozen.listen(8)
        url = f"http://127.0.0.1:{frozen.getsockname()[1]}"
        outcome: list[BaseException] = []

        def beat() -> None:
            try:
                CoordinatorClient(url, timeout_s=0.3).heartbeat("clicks-c1")
            except BaseException as exc:  # the outcome is what the spec checks
                outcome.append(exc)

        caller = threading.Thread(target=beat, daemon=True)
        caller.start()
        caller.join(60)  # a deadline for the spec itself, far beyond the timeout
        assert not caller.is_alive(), "the heartbeat waited on past its timeout"
        assert outcome
        assert isinstance(outcome[0], OSError)


def test_a_warm_up_says_it_caught_up_in_its_one_heartbeat_loop_at_once() -> None:
    # One heartbeat loop per container: the warm-up's "caught up" (the handover's first
    # phase) goes out with the next beat, sent at once rather than an interval later.
    seen: list[tuple[float, str]] = []

    def answer(path: str) -> object:
        seen.append((time.monotonic(), path))
        return {"alive": True, "leaseMs": 60000, "jobModelVersion": 3}

    def wait_for(condition: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 60
        while not condition() and time.monotonic() < deadline:
            threading.Event().wait(0.01)
        assert condition()

    with json_coordinator(answer) as url:
        settings = ContainerSettings.from_env(
            {**BASE, "SPARK_ELASTIC_COORDINATOR_URL": url, "SPARK_ELASTIC_HEARTBEAT_MS": "600000"}
        )
        beats = _Heartbeats(
            CoordinatorClient(url, timeout_s=5), settings, ContainerLease(TERMS), threading.Event()
        )
        beats.start()
        try:
            wait_for(lambda: len(seen) == 1)  # the first beat; the next is 10 minutes away
            told = time.monotonic()
            beats.say_caught_up()
            wait_for(lambda: len(seen) == 2)
        finally:
            beats.stop()
            beats.join(60)
    assert not beats.is_alive()
    assert beats.model_version == 3
    (_, plain), (at, caught_up) = seen
    assert "caughtUp" not in plain
    assert caught_up == "/containerHeartbeat?executionContainerId=clicks-c1&caughtUp=true"
    assert at >= told
