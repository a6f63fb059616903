"""Spark needs Java: without it, one clear line saying what to install."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from spark_elastic.dataplane.session import find_java
from spark_elastic.errors import JavaNotFoundError

ROOT = Path(__file__).resolve().parents[2]


def test_missing_java_is_one_line_naming_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(JavaNotFoundError) as info:
        find_java()
    message = str(info.value)
    assert "\n" not in message
    assert "Java 17" in message
    assert "install" in message


def test_java_home_is_preferred(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    java = tmp_path / "bin" / "java"
    java.parent.mkdir()
    java.write_text("#!/bin/sh\n")
    java.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    assert find_java() == str(java)


def test_example_without_java_exits_with_one_line_and_no_traceback(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = str(tmp_path)  # no java (and nothing else) on PATH
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "clickstream.py"), "--events", "10"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        line for line in result.stderr.strip().splitlines() if "Java 17" in line
    ]
