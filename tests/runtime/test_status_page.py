"""The status page, as a person sees it: rendered by a real headless browser (Chromium)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import quote

import pytest
from standins import Coordinator, call, shape, started, wait_until

from spark_elastic.runtime.coordinator.supervisor import JobShape

BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture
def browser() -> str:
    if BROWSER is None:
        if os.environ.get("CI"):
            pytest.fail("no chromium on PATH: .ci/run installs Debian's chromium package")
        pytest.skip("no chromium on PATH (apt-get install chromium); CI installs it")
    return BROWSER


def render(browser: str, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            *args,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )


def test_the_status_page_renders_containers_tasks_leases_and_events(
    browser: str, coordinator: Coordinator, tmp_path: Path
) -> None:
    wait_until("two registered containers", lambda: len(coordinator.running()) == 2)
    dom = render(browser, f"{coordinator.url}/", "--dump-dom").stdout
    for expected in (
        "Job clicks: job model 1",
        "clicks-c1",
        "clicks-c2",
        "running",
        "valid (",
        "Partition 2_3_4",
        "register",
    ):
        assert expected in dom, expected
    shot = tmp_path / "page.png"
    render(browser, f"{coordinator.url}/", f"--screenshot={shot}", "--window-size=1200,900")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def charts(dom: str) -> dict[str, dict[str, int]]:
    """Each chart the page's script drew: its data points and change bands."""
    drawn = {}
    for tag in re.findall(r"<div class=\"chart\"[^>]*>", dom):
        attrs = dict(re.findall(r'([\w-]+)="([^"]*)"', tag))
        if "hidden" not in attrs:
            drawn[attrs["id"]] = {
                "points": int(attrs.get("data-points", 0)),
                "bands": int(attrs.get("data-bands", 0)),
            }
    return drawn


def test_the_status_page_charts_a_live_scale_with_its_warm_ups_as_bands(
    browser: str, tmp_path: Path
) -> None:
    # Stand-ins report micro-batches at a steady rate: the page charts the job's rate, lag
    # and batch times live, each change a band from its start to its end.
    c = Coordinator(
        tmp_path,
        job_shape=JobShape(**{**shape(tmp_path).__dict__, "stateful": True}),
        env={"STANDIN_WARM_GATE": str(tmp_path / "warm"), "STANDIN_RATE": "3000"},
    )
    live = ("--virtual-time-budget=6000", "--window-size=1300,2000")
    try:
        with c.server.running_in_thread():
            wait_until("two registered containers", lambda: len(c.running()) == 2)
            started(c)
            wait_until("five samples", lambda: len(c.supervisor.history.samples) >= 5)
            assert call(f"{c.url}/scale", {"containers": 3})[0] == 200
            before = len(c.supervisor.history.samples)
            wait_until("two samples", lambda: len(c.supervisor.history.samples) >= before + 2)
            dom = render(browser, f"{c.url}/", "--dump-dom", *live).stdout
            assert "Pending move: warming up" in dom
            warmups = [w["containerId"] for w in c.status()["move"]["warmups"]]
            assert all(w in dom for w in warmups)
            drawn = charts(dom)
            assert set(drawn) == {
                "chart-rate",
                "chart-lag",
                "chart-batch",
                "chart-containers",
                "chart-containers-read",
            }
            for chart in drawn.values():
                assert chart["points"] > 0
                assert chart["bands"] == 2  # the scale, and its warm-ups within it
            assert "<td>2 -&gt; 3 containers</td>" in dom  # the list of changes
            # The README's picture is this screenshot: SPARK_ELASTIC_PAGE_SHOT=docs/status-page.png
            shot = Path(os.environ.get("SPARK_ELASTIC_PAGE_SHOT", tmp_path / "page.png"))
            render(browser, f"{c.url}/", f"--screenshot={shot.resolve()}", *live)
            assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

            (tmp_path / "warm").touch()
            wait_until("the scale done", lambda: c.status()["change"] is None)
            dom = render(browser, f"{c.url}/", "--dump-dom", *live).stdout
            assert "No move pending." in dom
            assert "ready: stopping" in dom  # the probing move's event
            assert re.search(r"<td[^>]*>done in \d+ s</td>", dom)  # the scale's outcome
            task = c.status()["tasks"][0]["task"]
            dom = render(browser, f"{c.url}/#task={quote(task)}", "--dump-dom", *live).stdout
            assert charts(dom)["chart-task"]["points"] > 0  # a task's own lag and rate
            assert f"Task {task}: its lag" in dom
    finally:
        c.kill_all()
