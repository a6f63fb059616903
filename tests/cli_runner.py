"""Run the real ``spark-elastic`` command in a subprocess, for the CLI specs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOB = str(ROOT / "examples" / "jobs" / "click_counts.py")
"""The example click-count job's file (``job run`` takes its ``job`` attribute)."""


def run_cli(
    *args: str, stdin: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``python -m spark_elastic ARGS`` with this interpreter; never raises on exit codes."""
    return subprocess.run(
        [sys.executable, "-m", "spark_elastic", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def one_line_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    """The command failed as a usage error: exit 2, one line naming every needle, no traceback."""
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0]
