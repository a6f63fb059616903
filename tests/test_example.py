"""The main example, run the way the README's quick start runs it (smaller)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

# Slow (left out by `pytest -m "not slow"`): the example is a Spark app with a streaming query.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


def test_clickstream_example_runs_end_to_end_on_the_embedded_log(tmp_path: Path) -> None:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    command = [
        sys.executable,
        str(ROOT / "examples" / "clickstream.py"),
        *("--events", "3000", "--users", "60", "--partitions", "2", "--factor", "4"),
        *("--max-per-trigger", "1000", "--workdir", str(tmp_path)),
    ]
    result = subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=600, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    progress = re.findall(
        r"^batch (\d+): (\d+) records in (\d+) virtual tasks", result.stdout, re.M
    )
    # One progress line per micro-batch: 3,000 records, at most 1,000 per trigger.
    assert [int(batch) for batch, _, _ in progress] == list(range(len(progress)))
    assert len(progress) >= 3
    assert sum(int(records) for _, records, _ in progress) == 3000
    assert "every user's events in order: NO" not in result.stdout
    # The per-task table: 2 partitions x factor 4 = 8 virtual tasks, then the total.
    table = re.findall(r"^(Partition \d+_\d+_4)\s+(\d+)$", result.stdout, re.M)
    assert len(table) == 8
    assert sum(int(count) for _, count in table) == 3000
    assert "3000 of 3000 produced; in order: True" in result.stdout
