"""A container's settings come from its environment, with Samza's interval, timeout, retries."""

from __future__ import annotations

import socket
import threading

import pytest

from spark_elastic.errors import ArgumentError
from spark_elastic.runtime.container import ContainerSettings, CoordinatorClient

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
