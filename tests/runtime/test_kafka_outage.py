"""A broker that goes away and comes back, again, under the coordinator's real cadence: the
coordinator keeps running, says what fails since when (during a change too), and shows the
job's progress again once the broker answers.

The replay of an abort seen on Kafka 4.1: librdkafka 2.16 aborted the coordinator's
process (``rdkafka_queue.h: rd_kafka_enq_once_del_source_return: Assertion
'eonce->refcnt > 0' failed``) 10-30 s after a broker restart, with a group commit and a
partition check under way and a new admin client made for each. Here a real coordinator
server (in this process, its containers stand-ins that heartbeat) reads a real broker's
topic through a real :class:`InputProcess`; stand-in progress moves every 0.2 s and the
group commit is due as often (``GROUP_COMMIT_S``), the partition check every 0.5 s; the
broker is SIGKILLed and restarted twice in a row, the second time with a scale in flight.
Had librdkafka aborted in this process, the spec (its pytest worker) would have died.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kafka_jvm
import pytest
from cli_runner import run_cli
from kafka_clicks import produce
from standins import TASKS, Coordinator, call, model, wait_until

from spark_elastic import KafkaInput
from spark_elastic.runtime.coordinator import partitions
from spark_elastic.runtime.coordinator.input_process import InputProcess
from spark_elastic.runtime.coordinator.supervisor import JobShape

pytestmark = pytest.mark.slow

TOPIC = "outage"  # no other spec of the session's broker uses it
FAILED_CALLS = 3  # of each kind, per outage: the broker is brought back only after them


class CountingProcess(InputProcess):
    """An :class:`InputProcess` that counts the calls that failed, by method."""

    def __init__(self, job_input: KafkaInput) -> None:
        super().__init__(job_input)
        self.failed: dict[str, int] = {}

    def call(self, method: str, *args: Any) -> Any:
        try:
            return super().call(method, *args)
        except Exception:
            self.failed[method] = self.failed.get(method, 0) + 1
            raise


class Progress:
    """Stand-in containers' progress reports, a step further every 0.2 s, on a thread."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator, self.offset = coordinator, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Progress:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.offset += 1
            for container in model(self.coordinator)["containers"]:
                tasks = [
                    {"task": t, "offsets": {TOPIC: {t.split("_")[0].split()[1]: self.offset}}}
                    for t in container["tasks"]
                ]
                call(
                    f"{self.coordinator.url}/containers/progress",
                    {
                        "containerId": container["containerId"],
                        "generation": container["generation"],
                        "batchId": self.offset,
                        "recordsRead": 0,
                        "recordsProcessed": 0,
                        "tasks": [{**t, "lag": 0} for t in tasks],
                    },
                )


@pytest.fixture
def on_kafka(
    kafka: kafka_jvm.KafkaBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Coordinator, CountingProcess]]:
    """A stateful job of 2 stand-in containers over the broker's 3-partition topic."""
    kafka_jvm.create_topics(kafka.bootstrap, {TOPIC: 3})
    produce(kafka.bootstrap, TOPIC, 0, 3000)  # the group's offsets stay below the ends
    monkeypatch.setattr(partitions, "GROUP_COMMIT_S", 0.2)
    watch = CountingProcess(KafkaInput(kafka.bootstrap, (TOPIC,), timeout_s=2.0))
    coordinator = Coordinator(
        tmp_path,
        job_shape=JobShape(
            TOPIC, "jobs.py:job", 4, {TOPIC: 3}, TASKS, str(tmp_path / "cp"), stateful=True
        ),
        env={"STANDIN_WARM_GATE": str(tmp_path / "warm")},
        watch=watch,
        partition_check_s=0.5,
    )
    try:
        yield coordinator, watch
    finally:
        coordinator.kill_all()


def group_at(bootstrap: str, offset: int) -> Callable[[], bool]:
    """Whether Kafka's own tools show the job's group at ``offset`` or beyond everywhere."""

    def check() -> bool:
        shown = kafka_jvm.describe_group(bootstrap, TOPIC)
        return len(shown) == 3 and all(o >= offset for o, _ in shown.values())

    return check


def test_the_coordinator_rides_out_two_broker_restarts_and_says_so_during_a_change(
    kafka: kafka_jvm.KafkaBroker, on_kafka: tuple[Coordinator, CountingProcess], tmp_path: Path
) -> None:
    coordinator, watch = on_kafka

    def health() -> dict[str, Any]:
        return coordinator.status()["input"]  # type: ignore[no-any-return]

    def details(kind: str) -> list[str]:
        return [e["detail"] for e in coordinator.status()["events"] if e["kind"] == kind]

    with coordinator.server.running_in_thread(), Progress(coordinator) as progress:
        wait_until("two containers", lambda: len(coordinator.running()) == 2)
        wait_until("the job's group shown", group_at(kafka.bootstrap, 1), timeout=60)
        owners = coordinator.running()
        for outage in (1, 2):
            if outage == 2:
                assert coordinator.running() == owners  # the same containers, leases kept
                # A scale whose warm-ups wait at the gate: a change in flight all outage long.
                assert call(f"{coordinator.url}/scale", {"containers": 3})[0] == 200
                assert coordinator.status()["change"] is not None
            kafka.kill()
            try:
                wait_until(
                    f"{FAILED_CALLS} failed checks and group commits",
                    _failed_again(watch, dict(watch.failed)),
                    timeout=120,
                )
                shown = health()
                assert shown["state"] == "failing"
                assert shown["failing"]["partitions"].startswith("check failed: InputError: ")
                assert shown["failing"]["group"].startswith(
                    f"consumer group {TOPIC!r} not updated: InputError: "
                )
                if outage == 2:
                    # Where the operator looks, during a change: the page, job status, metrics.
                    assert coordinator.status()["change"]["phase"] == "warming up"
                    assert "spark_elastic_input_up 0.0" in _metrics(coordinator)
                    assert "Input failing since" in _text(f"{coordinator.url}/")
                    printed = run_cli("job", "status", coordinator.url)
                    assert "input failing for" in printed.stdout, printed.stdout
                    assert "partitions: check failed: InputError: " in printed.stdout
            finally:
                kafka.restart()
            reached = progress.offset
            wait_until("the input answering", lambda: health()["state"] == "answering", 60)
            wait_until("the group shown again", group_at(kafka.bootstrap, reached), timeout=60)
        # (A client process librdkafka aborts after the return makes one more short episode.)
        wait_until(
            "the metrics saying the input is up",
            lambda: "spark_elastic_input_up 1.0" in _metrics(coordinator),
            timeout=60,
        )
        (tmp_path / "warm").touch()
        wait_until("the scale done", lambda: coordinator.status()["change"] is None, 60)
        assert coordinator.server.failure is None
        assert coordinator.status()["counters"].get("failovers", 0) == 0
        # Each outage said and its return too (a client process that librdkafka aborted
        # after the broker's return is one more short episode, said as such).
        said = details("partitions")  # newest first
        assert sum("check failed" in d for d in said) >= 2
        assert sum("the input answers again" in d for d in said) >= 2
        assert "the input answers again" in said[0]
        restarts = health()["clientRestarts"]
        assert restarts == watch.restarts


def _failed_again(watch: CountingProcess, before: dict[str, int]) -> Callable[[], bool]:
    """Whether the partition check and the group commit each failed FAILED_CALLS more times."""
    return lambda: all(
        watch.failed.get(m, 0) >= before.get(m, 0) + FAILED_CALLS
        for m in ("partition_counts", "commit_group_offsets")
    )


def _metrics(coordinator: Coordinator) -> str:
    return _text(f"{coordinator.url}/metrics")


def _text(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as reply:
        return str(reply.read().decode())
