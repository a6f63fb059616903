"""A container's settings come from its environment, with Samza's interval, timeout, retries."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time

import pytest

from spark_elastic.errors import ArgumentError
from spark_elastic.runtime.container import ContainerSettings, CoordinatorClient
from spark_elastic.runtime.container.warmups import _heartbeating

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


def test_a_warm_up_heartbeats_through_a_long_step_before_it_registers() -> None:
    # Its first snapshot may outlast the coordinator's start-up bound: a warm-up that sent
    # nothing meanwhile was failed over, and its replacements too (bench_live, snapshot mode).
    seen: list[str] = []

    class Coordinator(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # http.server's hook, named by it
            seen.append(self.path)
            body = json.dumps({"alive": False}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Coordinator) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        client = CoordinatorClient(f"http://127.0.0.1:{server.server_address[1]}", timeout_s=5)
        deadline = time.monotonic() + 60
        with _heartbeating(client, "clicks-c3", every_s=0.05):
            # The long step: it waits for three heartbeats, which only the helper sends.
            while len(seen) < 3 and time.monotonic() < deadline:
                threading.Event().wait(0.01)
        after = len(seen)
        server.shutdown()
    assert after >= 3
    assert all(p.startswith("/containerHeartbeat?executionContainerId=clicks-c3") for p in seen)
    assert len(seen) == after  # none once the step is over
