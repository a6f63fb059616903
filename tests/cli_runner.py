"""Run the real ``spark-elastic`` command in a subprocess, for the CLI specs."""

from __future__ import annotations

import subprocess
import sys


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
