"""The status page, as a person sees it: rendered by a real headless browser (Chromium)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_coordinator import Coordinator, wait_until

BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture
def browser() -> str:
    if BROWSER is None:
        if os.environ.get("CI"):
            pytest.fail("no chromium on PATH: .ci/run installs Debian's chromium package")
        pytest.skip("no chromium on PATH (apt-get install chromium); CI installs it")
    return BROWSER


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[Coordinator]:
    c = Coordinator(tmp_path)
    try:
        with c.server.running_in_thread():
            yield c
    finally:
        c.kill_all()


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
