"""``spark-elastic job`` and ``container``: mistakes are one line and exit 2, nothing half-made."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

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


def run_job_on_store(root: Path, store: str, *options: str) -> subprocess.CompletedProcess[str]:
    """``job run`` of the click-count job on ``store``, from a fresh log at ``root``."""
    if not (root / "log" / "clicks").exists():
        EmbeddedLog(root / "log").create_topic("clicks", 2)
    command = [sys.executable, "-m", "spark_elastic", "job", "run", JOB, "--port", "0"]
    return subprocess.run(
        [*command, "--store", store, *options],
        env={**os.environ, "CLICKS_ROOT": str(root)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_postgresql_store_that_cannot_be_used_is_one_line_and_nothing_starts(
    tmp_path: Path, postgresql: Any, pg_url: str
) -> None:
    from kafka_jvm import free_port

    wrong = pg_url.replace(":spark-elastic@", ":wrong@")
    one_line_error(
        run_job_on_store(tmp_path, wrong), "--store", "password authentication failed", ":***@"
    )
    nowhere = f"postgresql://u:p@127.0.0.1:{free_port()}/jobs"
    one_line_error(run_job_on_store(tmp_path, nowhere), "--store", "refused")
    one_line_error(
        run_job_on_store(tmp_path, pg_url, "--store-lease-ms", "12000"),
        "--store-lease-ms",
        "--lease-ms plus --margin-ms (15000)",
    )
    assert not (tmp_path / "checkpoints").exists()
    assert not (tmp_path / "logs").exists()


def test_another_jobs_store_is_refused_in_one_line_before_anything_is_written(
    tmp_path: Path, postgresql: Any, pg_url: str
) -> None:
    import psycopg

    from spark_elastic.runtime.coordinator.stores import open_store

    other = open_store(pg_url)
    try:
        with other.transaction() as db:
            other.set_meta(db, "job", "invoices")
    finally:
        other.close()
    one_line_error(
        run_job_on_store(tmp_path, pg_url),
        "--store: expected the store of job 'clicks', or an empty one",
        "the store of job 'invoices'",
    )
    with psycopg.connect(pg_url) as db:
        assert db.execute("SELECT count(*) FROM leader").fetchone() == (0,)
        assert db.execute("SELECT key FROM meta").fetchall() == [("job",)]


def test_namespaces_need_the_coordinator_on_their_bridge_and_nothing_is_made_otherwise(
    tmp_path: Path,
) -> None:
    EmbeddedLog(tmp_path / "log").create_topic("clicks", 2)
    command = [sys.executable, "-m", "spark_elastic", "job", "run", JOB, "--port", "0"]
    result = subprocess.run(
        [*command, "--launcher", "namespaces", "--bridge", "sebrcli=10.78.251.0/24"],
        env={**os.environ, "CLICKS_ROOT": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    one_line_error(
        result, "--host: expected an address of the bridge's network 10.78.251.0/24", "127.0.0.1"
    )
    assert not Path("/sys/class/net/sebrcli").exists()
    assert not (tmp_path / "checkpoints").exists()


def test_kubernetes_needs_an_image_and_an_api_server_and_nothing_is_made_otherwise(
    tmp_path: Path,
) -> None:
    EmbeddedLog(tmp_path / "log").create_topic("clicks", 2)
    command = [sys.executable, "-m", "spark_elastic", "job", "run", JOB, "--port", "0"]
    env = {**os.environ, "CLICKS_ROOT": str(tmp_path)}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*command, "--launcher", "kubernetes", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    one_line_error(run(), "--k8s-image: expected the containers' image")
    one_line_error(
        run("--k8s-image", "i", "--host", "0.0.0.0", "--token", "t"),
        "--advertise: expected the URL containers reach this coordinator at, with --host 0.0.0.0",
    )
    one_line_error(
        run("--k8s-image", "spark-elastic:1", "--k8s-server", "http://127.0.0.1:9"),
        "the Kubernetes API server http://127.0.0.1:9 refused or was out of reach",
    )
    one_line_error(
        run("--k8s-image", "i", "--k8s-pod-template", str(tmp_path / "missing.yaml")),
        "--k8s-pod-template: expected a readable YAML or JSON pod",
    )
    assert not (tmp_path / "checkpoints").exists()
