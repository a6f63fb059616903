"""The autoscaler in a running coordinator, over real HTTP, and its commands.

Stand-in container processes (no Spark) heartbeat; the spec posts their
progress reports itself, so it decides the lag and the processing rate the
coordinator sees. The policy's settings are short (a 0.5 s window, a 1 s
cool-down) so a whole load step plays out in seconds.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_runner import JOB, one_line_error, run_cli
from standins import TASKS, Coordinator, call, model, shape, wait_until

from spark_elastic import EmbeddedLog
from spark_elastic.cli.job import _autoscaler_options
from spark_elastic.cli.main import build_parser
from spark_elastic.errors import ArgumentError
from spark_elastic.runtime.coordinator.autoscaler import AutoscalerConfig
from spark_elastic.runtime.coordinator.supervisor import JobShape

FAST = AutoscalerConfig(
    enabled=True,
    max_containers=4,
    max_drain_s=2,
    window_s=0.5,
    cooldown_s=1,
    busy_lag=100,
    # Longer than a loaded machine may leave between two reports: a window without one
    # reads as a container that processed nothing.
    rate_window_s=3,
)


@pytest.fixture
def autoscaled(make_coordinator: Callable[..., Coordinator]) -> Coordinator:
    """A coordinator whose autoscaler is on with the ``FAST`` settings, its two containers up."""
    c = make_coordinator(autoscaler=FAST)
    wait_until("two containers", lambda: len(c.running()) == 2)
    return c


class Load:
    """Progress reports for every container of the job model, as a load would make them.

    Each report says the container processed its share of ``rate`` records a
    second since its last one, and that each of its tasks lags ``lag``.
    """

    def __init__(self, coordinator: Coordinator) -> None:
        self.url = coordinator.url
        self.last: dict[str, float] = {}
        self.batch = 0

    def report(self, rate: float, lag: int) -> None:
        containers = call(f"{self.url}/jobModel")[1]["containers"]
        now = time.monotonic()
        self.batch += 1
        for c in containers:
            since = self.last.get(c["containerId"], now)
            self.last[c["containerId"]] = now
            body = {
                "containerId": c["containerId"],
                "generation": c["generation"],
                "batchId": self.batch,
                "recordsRead": 0,
                "recordsProcessed": round(rate / len(containers) * (now - since)),
                "tasks": [{"task": t, "offsets": {}, "lag": lag} for t in c["tasks"]],
            }
            call(f"{self.url}/containers/progress", body)

    def until(self, what: str, rate: float, lag: int, done: Callable[[], Any]) -> Any:
        def step() -> Any:
            self.report(rate, lag)
            return done()

        return wait_until(what, step)


def decided(coordinator: Coordinator) -> str | None:
    """The rule of the autoscaler's last decision."""
    last = coordinator.status()["autoscaler"]["lastDecision"]
    return None if last is None else str(last["rule"])


def evaluations_for(coordinator: Coordinator, seconds: float) -> None:
    """Wait while the autoscaler decides again and again (every tick, 0.2 s) for ``seconds``."""

    def decided_at() -> float:
        return float(coordinator.status()["autoscaler"]["lastDecision"]["at"])

    first = decided_at()
    wait_until(f"{seconds} s more of decisions", lambda: decided_at() > first + seconds)


def autoscale_events(coordinator: Coordinator) -> list[str]:
    return [e["detail"] for e in coordinator.status()["events"] if e["kind"] == "autoscale"]


def acted(coordinator: Coordinator, action: str) -> list[str]:
    return [d for d in autoscale_events(coordinator) if d.startswith(f"autoscaler {action}")]


def test_a_load_step_scales_out_once_and_back_in_once(autoscaled: Coordinator) -> None:
    load = Load(autoscaled)
    # The step: each container processes 1000 records/s flat out and the backlog stays:
    # 4000 records behind on each of the 3 partitions, reported by each of its 4 buckets.
    load.until("a scale-out", 2000, 4000, lambda: acted(autoscaled, "scale-out"))
    (out,) = acted(autoscaled, "scale-out")
    assert out.startswith("autoscaler scale-out to 3: lagging: the backlog (12000 records)")
    # Back to 1200 records/s, no backlog: 2 containers of 1000/s carry it at 80%.
    load.until("a scale-in", 1200, 0, lambda: acted(autoscaled, "scale-in"))
    (back,) = acted(autoscaled, "scale-in")
    assert back.startswith("autoscaler scale-in to 2: underused")
    load.until("a steady hold on 2 containers", 1200, 0, lambda: decided(autoscaled) == "steady")
    deadline = time.monotonic() + 1  # the load goes on: nothing more happens
    load.until("the load to go on", 1200, 0, lambda: time.monotonic() > deadline)
    status = autoscaled.status()
    assert [len(c["tasks"]) for c in model(autoscaled)["containers"]] == [6, 6]
    assert len(acted(autoscaled, "scale-out")) == len(acted(autoscaled, "scale-in")) == 1
    assert status["autoscaler"]["capacityPerContainer"] == pytest.approx(1000, rel=0.2)
    metrics = urllib.request.urlopen(f"{autoscaled.url}/metrics").read().decode()
    assert 'spark_elastic_autoscaler_actions_total{action="scale-out"} 1.0' in metrics
    assert 'spark_elastic_autoscaler_actions_total{action="scale-in"} 1.0' in metrics
    assert 'spark_elastic_autoscaler_mode{mode="on"} 1.0' in metrics
    page = urllib.request.urlopen(f"{autoscaled.url}/").read().decode()
    assert "Autoscaler on: 1-4 containers" in page
    assert "Last decision" in page


def test_bad_requests_change_nothing_holds_are_told_once_and_a_pin_acts(
    autoscaled: Coordinator,
) -> None:
    url = f"{autoscaled.url}/autoscaler"
    # No reports at all: the policy holds for lack of data at every tick (0.2 s)...
    wait_until("a hold for lack of data", lambda: decided(autoscaled) == "no-data")
    evaluations_for(autoscaled, 0.6)
    for body, needle in [
        ({}, "autoscaler: expected at least one setting to change"),
        ({"minContainers": 5, "maxContainers": 3}, "maxContainers: expected at least"),
        ({"maxContainers": 13}, "at most the job's 12 virtual tasks"),
        ({"pinned": 0}, "pinned: expected a whole number >= 1"),
        ({"enabled": "yes"}, "enabled: expected true or false"),
        ({"enabled": True, "pinned": 2}, "pinned: expected no enabled beside it"),
        ({"scale": 3}, "expected a known setting, found 'scale'"),
        ([1], "expected a JSON object"),
    ]:
        status, reply = call(url, body)
        assert (status, "\n" in reply["error"]) == (400, False), (body, reply)
        assert needle in reply["error"], body
    assert autoscaled.status()["autoscaler"]["settings"] == FAST.to_json()
    # ...and the hold is told once, not at every tick.
    holds = [d for d in autoscale_events(autoscaled) if d.startswith("hold")]
    assert len(holds) == 1
    assert "no data: task 'Partition 0_0_4' has no lag from its owner" in holds[0]
    status, reply = call(url, {"pinned": 3})
    assert (status, reply["summary"]) == (200, "pinned at 3 containers")
    wait_until("three containers", lambda: len(model(autoscaled)["containers"]) == 3)
    (pinned,) = acted(autoscaled, "scale-out")
    assert pinned.startswith("autoscaler scale-out to 3: pinned at 3 containers")
    status, reply = call(url, {"enabled": False})
    assert (status, reply["summary"]) == (200, "off (bounds 1-4 containers)")
    assert autoscaled.status()["autoscaler"]["mode"] == "off"
    details = autoscale_events(autoscaled)
    assert "autoscaler off (bounds 1-4 containers)" in details
    assert "autoscaler pinned at 3 containers" in details


def test_a_stateful_job_scales_through_warm_ups_and_holds_while_they_warm(
    tmp_path: Path,
) -> None:
    stateful = JobShape(**{**shape(tmp_path).__dict__, "stateful": True})
    c = Coordinator(
        tmp_path,
        job_shape=stateful,
        autoscaler=AutoscalerConfig(pinned=3),
        env={"STANDIN_WARM_GATE": str(tmp_path / "warm")},
    )
    try:
        with c.server.running_in_thread():
            wait_until("a move under way", lambda: model(c)["warmups"])
            evaluations_for(c, 0.6)  # more ticks that would scale and are refused meanwhile
            details = [e["detail"] for e in c.status()["events"] if e["kind"] == "autoscale"]
            assert sum("pinned at 3 containers; 2 -> 3 containers" in d for d in details) == 1
            # Told once per reason (first the containers starting, then the move), not per tick.
            refused = [d.split("refused: ")[-1].split(" (")[0] for d in details if "(refused)" in d]
            assert len(refused) == len(set(refused))
            assert "a change is under way" in refused
            # The old owners keep every task until the new ones are warm.
            assert len(model(c)["containers"]) == 2
            (tmp_path / "warm").touch()
            wait_until(
                "the new owners own their tasks",
                lambda: (m := model(c))["warmups"] == [] and len(m["containers"]) == 3,
            )
    finally:
        c.kill_all()


def test_a_restarted_coordinator_keeps_the_autoscaler_settings(tmp_path: Path) -> None:
    first = Coordinator(tmp_path, autoscaler=AutoscalerConfig(enabled=True, max_containers=5))
    try:
        with first.server.running_in_thread():
            assert call(f"{first.url}/autoscaler", {"minContainers": 2})[0] == 200
    finally:
        first.kill_all()
    again = Coordinator(tmp_path)  # no settings given: the store's
    try:
        assert again.supervisor.autoscaler == AutoscalerConfig(
            enabled=True, min_containers=2, max_containers=5
        )
    finally:
        again.supervisor.store.close()


def test_job_autoscale_on_the_command_line(autoscaled: Coordinator) -> None:
    url = autoscaled.url
    result = run_cli("job", "autoscale", url, "--off", "--min", "2", "--max", "3")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "autoscaler off (bounds 2-3 containers)\n"
    one_line_error(run_cli("job", "autoscale", url), "one of --on, --off, --pin N")
    one_line_error(run_cli("job", "autoscale", url, "--min", "4"), "maxContainers", "(4)")
    assert autoscaled.status()["autoscaler"]["summary"] == "off (bounds 2-3 containers)"
    result = run_cli("job", "autoscale", url, "--max-factor", "8")
    assert result.stdout == "autoscaler off (bounds 2-3 containers, factor up to 8)\n"
    one_line_error(
        run_cli("job", "autoscale", url, "--max-factor", "3"),
        "--max-factor: expected a power of two from 1 to 1024, found '3'",
    )


def test_bad_autoscaler_options_of_job_run_are_one_line_in_their_own_names(
    tmp_path: Path,
) -> None:
    EmbeddedLog(tmp_path / "log").create_topic("clicks", 2)
    bounds = ["--autoscale-min", "5", "--autoscale-max", "3"]
    result = subprocess.run(
        [sys.executable, "-m", "spark_elastic", "job", "run", JOB, "--port", "0", *bounds],
        env={**os.environ, "CLICKS_ROOT": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    one_line_error(result, "--autoscale-max: expected at least --autoscale-min (5)")
    assert not (tmp_path / "checkpoints").exists()
    # The same options, read in this process (no job to load): bounds against the task count.
    args = build_parser().parse_args(["job", "run", JOB, "--autoscale", "--autoscale-max", "13"])
    with pytest.raises(ArgumentError, match="--autoscale-max: expected at most the job's 12"):
        _autoscaler_options(args, len(TASKS))
    args = build_parser().parse_args(["job", "run", JOB, "--autoscale-window-ms", "0"])
    assert _autoscaler_options(args, len(TASKS)) == AutoscalerConfig(window_s=0)
    assert _autoscaler_options(build_parser().parse_args(["job", "run", JOB]), 12) is None


assert len(TASKS) == 12  # the bounds above are about this job


def test_a_job_lagging_at_one_container_per_task_is_split_within_the_factor_bound(
    tmp_path: Path,
) -> None:
    # One partition at factor 2: two tasks, already one per container.
    two_tasks = JobShape(
        "clicks",
        "jobs.py:job",
        2,
        {"clicks": 1},
        ("Partition 0_0_2", "Partition 0_1_2"),
        str(tmp_path / "cp"),
    )
    config = AutoscalerConfig(
        **{**FAST.__dict__, "max_containers": None, "max_elasticity_factor": 4}
    )
    c = Coordinator(tmp_path, job_shape=two_tasks, autoscaler=config)
    try:
        with c.server.running_in_thread():
            wait_until("two containers", lambda: len(c.running()) == 2)
            assert c.status()["autoscaler"]["summary"].startswith(
                "on: 1-2 containers, factor up to 4"
            )
            load = Load(c)
            # Both containers flat out at 1000 records/s each, a backlog of 5 s (each
            # bucket reports its partition's 10000 records).
            load.until("a split", 2000, 10000, lambda: acted(c, "split"))
            (split,) = acted(c, "split")
            assert split.startswith("autoscaler split to factor 4: lagging:")
            assert "more than the 2 tasks; split to factor 4" in split
            # The new owners report progress as they start (each group waits for that).
            after = load.until(
                "the job at factor 4",
                1000,
                0,
                lambda: (m := model(c))["elasticityFactor"] == 4 and not m["warmups"] and m,
            )
            assert sorted(t for x in after["containers"] for t in x["tasks"]) == [
                f"Partition 0_{b}_4" for b in range(4)
            ]
            metrics = urllib.request.urlopen(f"{c.url}/metrics").read().decode()
            assert 'spark_elastic_autoscaler_actions_total{action="split"} 1.0' in metrics
    finally:
        c.kill_all()
