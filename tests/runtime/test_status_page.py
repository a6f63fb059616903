"""The status page, as a person sees it: rendered by a real headless browser (Chromium)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

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


def test_the_status_page_shows_warm_ups_and_the_pending_move(browser: str, tmp_path: Path) -> None:
    c = Coordinator(
        tmp_path,
        job_shape=JobShape(**{**shape(tmp_path).__dict__, "stateful": True}),
        env={"STANDIN_WARM_GATE": str(tmp_path / "warm")},
    )
    try:
        with c.server.running_in_thread():
            wait_until("two registered containers", lambda: len(c.running()) == 2)
            started(c)
            assert call(f"{c.url}/scale", {"containers": 3})[0] == 200
            dom = render(browser, f"{c.url}/", "--dump-dom").stdout
            assert "Pending move: warming up" in dom
            warmups = [w["containerId"] for w in c.status()["move"]["warmups"]]
            assert all(w in dom for w in warmups)
            (tmp_path / "warm").touch()
            wait_until("the move made", lambda: c.status()["move"] is None)
            dom = render(browser, f"{c.url}/", "--dump-dom").stdout
            assert "No move pending." in dom
            assert "ready: stopping" in dom  # the probing move's event
    finally:
        c.kill_all()
