"""``spark-elastic job`` and ``container``: mistakes are one line and exit 2, nothing half-made."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import JOB, one_line_error, run_cli

from spark_elastic import EmbeddedLog


def test_a_job_file_that_does_not_import_is_one_line(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("import nowhere_to_be_found\n")
    one_line_error(
        run_cli("job", "run", f"{broken}:job", "--port", "0"),
        "failed to import",
        "nowhere_to_be_found",
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.py"]


def test_an_unknown_attribute_is_one_line() -> None:
    one_line_error(run_cli("job", "run", f"{JOB}:nothing", "--port", "0"), "no attribute 'nothing'")


def test_a_missing_log_is_one_line_and_creates_nothing(tmp_path: Path) -> None:
    env_root = tmp_path / "root"
    result = subprocess.run(
        [sys.executable, "-m", "spark_elastic", "job", "run", JOB, "--port", "0"],
        env={**os.environ, "CLICKS_ROOT": str(env_root)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    one_line_error(result, "log")
    assert not env_root.exists()


def test_a_port_in_use_is_one_line(tmp_path: Path) -> None:
    log = EmbeddedLog(tmp_path / "log")
    log.create_topic("clicks", 2)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "spark_elastic", "job", "run", JOB, "--port", str(port)],
            env={**os.environ, "CLICKS_ROOT": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    one_line_error(result, f"127.0.0.1:{port}", "in use")
    assert not (tmp_path / "checkpoints").exists()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--containers", "0"), "--containers"),
        (("--lease-ms", "x"), "--lease-ms"),
        (("--port", "70000"), "--port"),
        (("--conf", "novalue"), "KEY=VALUE"),
        (("--heartbeat-timeout-ms", "0"), "--heartbeat-timeout-ms"),
        (("--heartbeat-retries", "-1"), "--heartbeat-retries"),
    ],
)
def test_bad_options_are_one_line(args: tuple[str, ...], needle: str) -> None:
    one_line_error(run_cli("job", "run", JOB, *args), needle)


@pytest.mark.parametrize(
    ("lease_options", "needles"),
    [
        (
            ("--lease-ms", "2000", "--write-budget-ms", "500", "--heartbeat-ms", "1500"),
            ("--heartbeat-ms", "half the lease"),
        ),
        (("--lease-ms", "2000", "--write-budget-ms", "2000"), ("--write-budget-ms", "--lease-ms")),
        (("--margin-ms", "1000", "--write-budget-ms", "2000"), ("--margin-ms", "a write begun")),
    ],
)
def test_inconsistent_lease_options_are_one_line_in_their_own_names(
    tmp_path: Path, lease_options: tuple[str, ...], needles: tuple[str, ...]
) -> None:
    EmbeddedLog(tmp_path / "log").create_topic("clicks", 2)
    result = subprocess.run(
        [sys.executable, "-m", "spark_elastic", "job", "run", JOB, "--port", "0", *lease_options],
        env={**os.environ, "CLICKS_ROOT": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    one_line_error(result, *needles)


def test_status_of_nothing_listening_is_one_line() -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    one_line_error(run_cli("job", "status", f"http://127.0.0.1:{port}"), "URL", "running")
    one_line_error(run_cli("job", "status", "ftp://x"), "URL")


def test_a_container_without_its_environment_is_one_line() -> None:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("EXECUTION_ENV", "SPARK_ELASTIC"))
    }
    result = subprocess.run(
        [sys.executable, "-m", "spark_elastic", "container", "run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    one_line_error(result, "EXECUTION_ENV_CONTAINER_ID")
