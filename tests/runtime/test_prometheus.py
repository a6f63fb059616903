"""A real Prometheus scrapes a running job's coordinator, and the Grafana dashboard's queries
answer against it.

Debian's ``prometheus`` server (``.ci/run`` installs it), started by the spec
on loopback with a 1-s scrape of the coordinator's ``/metrics``; the job is a
coordinator with stand-in containers that report committed micro-batches at
a steady rate (real processes, real HTTP, no Spark), through a live scale.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from standins import Coordinator, call, shape, wait_until

from spark_elastic.runtime.coordinator.supervisor import JobShape

DASHBOARD = Path(__file__).parents[2] / "docs" / "grafana-dashboard.json"
PROMETHEUS = shutil.which("prometheus")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def prometheus(root: Path, target: str) -> Iterator[str]:
    """A Prometheus server scraping ``target`` (host:port) every second; its URL.

    Stopped by its PID when the block ends, however it ends.
    """
    if PROMETHEUS is None:
        if os.environ.get("CI"):
            pytest.fail("no prometheus on PATH: .ci/run installs Debian's prometheus package")
        pytest.skip("no prometheus on PATH (apt-get install prometheus); CI installs it")
    config = root / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: clicks\n    static_configs: [{{targets: ['{target}']}}]\n"
    )
    port = free_port()
    log = (root / "prometheus.log").open("w")
    process = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={root / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until("prometheus ready", lambda: _ready(url, process), timeout=60)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _ready(url: str, process: subprocess.Popen[bytes]) -> bool:
    if process.poll() is not None:
        raise AssertionError(f"prometheus exited {process.returncode}")
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def query(url: str, expr: str) -> list[dict[str, Any]]:
    """An instant query's result; fails on any error Prometheus reports (a bad query)."""
    with urllib.request.urlopen(
        f"{url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}", timeout=10
    ) as response:
        answer = json.loads(response.read())
    assert answer["status"] == "success", answer
    return answer["data"]["result"]  # type: ignore[no-any-return]


def value(url: str, expr: str) -> float | None:
    result = query(url, expr)
    return float(result[0]["value"][1]) if result else None


def dashboard_queries() -> list[str]:
    """Every query of the Grafana dashboard, panels and annotations, ``$job`` as any job."""
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p["targets"]]
    exprs += [a["expr"] for a in doc["annotations"]["list"]]
    return [e.replace("$job", ".*") for e in exprs]


@pytest.fixture
def job(tmp_path: Path) -> Iterator[Coordinator]:
    c = Coordinator(
        tmp_path,
        job_shape=JobShape(**{**shape(tmp_path).__dict__, "stateful": True}),
        env={"STANDIN_RATE": "2000", "STANDIN_WARM_GATE": str(tmp_path / "warm")},
    )
    try:
        with c.server.running_in_thread():
            yield c
    finally:
        c.kill_all()


def test_prometheus_scrapes_rates_lag_by_task_and_changes_in_flight_of_a_running_job(
    job: Coordinator, tmp_path: Path
) -> None:
    with prometheus(tmp_path, job.url.removeprefix("http://")) as prom:
        wait_until("two containers reporting", lambda: len(job.running()) == 2)
        rate = 'sum(rate(spark_elastic_records_processed_total{job="clicks"}[5s]))'
        processed = wait_until("a rate of records processed", lambda: value(prom, rate))
        assert 500 < processed < 8000  # the stand-ins' 2 x 2,000 a second, give or take
        by_task = query(prom, 'spark_elastic_task_lag_records{job="clicks"}')
        assert {r["metric"]["task"] for r in by_task} == set(job.supervisor.model.owner_of())

        assert call(f"{job.url}/scale", {"containers": 3})[0] == 200
        in_flight = 'spark_elastic_changes_in_flight{job="clicks",kind="%s"}'
        wait_until("the scale in flight", lambda: value(prom, in_flight % "scale") == 1)
        assert value(prom, in_flight % "warm-up") == 1
        assert value(prom, in_flight % "failover") == 0
        # The Grafana dashboard's every query runs; each has data now or once the scale is done.
        answered = {expr for expr in dashboard_queries() if query(prom, expr)}

        (tmp_path / "warm").touch()
        wait_until("the scale done", lambda: value(prom, in_flight % "scale") == 0, timeout=60)
        done = 'spark_elastic_changes_total{job="clicks",kind="scale",result="done"}'
        assert value(prom, done) == 1
        wait_until("three containers reporting", lambda: len(job.running()) == 3)
        per_container = 'spark_elastic_batch_duration_seconds{job="clicks"}'
        wait_until("batch times of three", lambda: len(query(prom, per_container)) == 3)

        def all_answered() -> bool:
            answered.update(expr for expr in dashboard_queries() if query(prom, expr))
            return answered == set(dashboard_queries())

        wait_until("every dashboard query answered", all_answered)


def test_every_metric_the_dashboard_charts_is_one_the_coordinator_exposes(
    job: Coordinator, tmp_path: Path
) -> None:
    wait_until("two containers reporting", lambda: len(job.running()) == 2)
    wait_until("a batch reported", lambda: job.status()["containers"][0]["lastBatchMs"])
    assert call(f"{job.url}/scale", {"containers": 3})[0] == 200
    (tmp_path / "warm").touch()
    wait_until("the scale done", lambda: job.status()["change"] is None)

    def all_reported() -> bool:
        status = job.status()
        live = [c for c in status["containers"] if c["state"] == "running"]
        known = status["inputLag"] is not None
        return known and len(live) == 3 and all(c["lastBatchMs"] for c in live)

    wait_until("the new owners reporting", all_reported)
    with urllib.request.urlopen(f"{job.url}/metrics", timeout=5) as response:
        exposed = response.read().decode()
    names = {
        line.split("{")[0].split(" ")[0]
        for line in exposed.splitlines()
        if line and not line.startswith("#")
    }
    # Only running containers have series: each scale or failover makes new ones.
    ended = [c["containerId"] for c in job.status()["containers"] if c["state"] == "retired"]
    assert ended
    assert not [
        line
        for line in exposed.splitlines()
        if line.startswith("spark_elastic_records_") and any(f'"{c}"' in line for c in ended)
    ]
    charted = {m for e in dashboard_queries() for m in re.findall(r"spark_elastic_\w+", e)}
    assert charted, "the dashboard charts nothing"
    assert charted <= names, charted - names
    # Prometheus' conventions: a counter's name ends in _total, and no other's does.
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", exposed, re.M))
    assert types
    for name, kind in types.items():
        assert name.endswith("_total") == (kind == "counter"), (name, kind)
