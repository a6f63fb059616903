"""Test-suite wide fixtures: one local SparkSession for the whole run."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
# Test folders have no __init__.py, so pytest imports `tests/state/test_x.py` as module
# `test_x` with its folder on sys.path. Functions defined in test modules are pickled by
# reference (module `test_x`), so the Python workers Spark starts (and the processes the
# tests launch) need every test folder on their path too; so do the helper modules the
# specs share (tests/cli_runner.py, tests/runtime/standins.py, tests/state/stateful_job.py...).
_TESTS = Path(__file__).parent / "tests"
_TEST_DIRS = [
    str(_TESTS),
    *sorted(str(d) for d in _TESTS.iterdir() if d.is_dir() and not d.name.startswith((".", "_"))),
]
sys.path[:0] = [d for d in _TEST_DIRS if d not in sys.path]
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (*_TEST_DIRS, os.environ.get("PYTHONPATH", "")) if p
)

from jvm import SHORT_LIVED_OPTIONS, TEST_JAVA_OPTIONS  # noqa: E402 - from tests/ on

# Every Spark application a spec's subprocess starts gets these Java options first (the
# session's own JVM too: its extraJavaOptions come after them, and win where they differ).
os.environ["SPARK_SUBMIT_OPTS"] = SHORT_LIVED_OPTIONS
os.environ.pop("SPARK_CONF_DIR", None)  # on the class path, it would void the archive


# The end-to-end specs: real coordinators and containers, several Spark applications each,
# as two units of work (``file`` or ``file::test-name prefix``). One worker runs the first
# unit's stories in turn; another runs the second unit's lighter stories (one to three
# containers at a time, or a short story) beside them, and every worker then takes the other
# files (`make test` runs three workers). `make test` runs a few stories of each unit (the
# stateful story on Kafka and the fault test's short schedule; the operable story and one
# on HDFS); the others are marked `long` (`make test-all`).
STORIES = {
    "end-to-end": (
        "test_kafka_faults.py::test_a_short_schedule",
        "test_kafka_faults.py::test_a_long_schedule",
        "test_job_run_kafka.py",
        "test_job_run.py",
        "test_job_run_stateless.py",
    ),
    "end-to-end, beside": (
        "test_job_operable.py",
        "test_job_autoscale.py",
        "test_job_run_kafka.py::test_a_stateless_job_on_kafka",
        "test_job_run_in_time.py",
        # One worker runs the storage files, so one MiniDFSCluster and one s3proxy serve them.
        "test_storage.py",
        "test_storage_jobs.py",
        "test_storage_checkpoints.py",
    ),
}


def story_unit(nodeid: str) -> str | None:
    """The unit of :data:`STORIES` a spec belongs to (the longest match), if any."""
    name = nodeid.rsplit("/", 1)[-1]
    matches = [
        (len(prefix), unit)
        for unit, prefixes in STORIES.items()
        for prefix in prefixes
        if name.startswith(prefix if "::" in prefix else f"{prefix}::")
    ]
    return max(matches)[1] if matches else None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put the end-to-end specs first, so that ``make test`` starts them at once."""
    units = list(STORIES)

    def rank(item: pytest.Item) -> int:
        unit = story_unit(item.nodeid)
        return units.index(unit) if unit is not None else len(units)

    items.sort(key=rank)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Deal each unit of :data:`STORIES` as one under ``--dist loadfile``; the rest by file.

    Each story runs three to eight Spark applications, and two heavy stories side by
    side on the 2 cores starved them (session 14: containers 80 s from their tasks to a
    first batch, Python workers that missed Spark's fixed 10 s to connect back,
    heartbeats late past the lease). So one worker runs the heavy stories in turn while
    the other takes the light ones, then every other file. (xdist's own ``loadgroup``
    cannot do this under pytest 9: it renames node ids through an attribute pytest 9 no
    longer reads.)
    """
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class StoriesInTurn(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            unit = story_unit(nodeid)
            return unit if unit is not None else super()._split_scope(nodeid)

    return StoriesInTurn(config, log)


_BUSY: dict[str, list[float]] = {}
"""Seconds in specs (setup, call, teardown) and specs run, per xdist worker: the balance of
the workers, which decides the suite's time (the stories' worker has been the longer)."""


_FILES: dict[str, float] = {}
"""Seconds in specs per test file: where the suite's time goes, file by file (the slowest
specs alone do not say it: about a hundred Spark specs of one to three minutes each add up
to as much as the stories)."""


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Add up each worker's and each file's time in specs (in the controller, which sees
    every report)."""
    node = getattr(report, "node", None)  # xdist's worker, on reports it forwards
    worker = node.gateway.id if node is not None else "main"
    busy = _BUSY.setdefault(worker, [0.0, 0])
    busy[0] += report.duration
    busy[1] += report.when == "call"
    path = report.nodeid.split("::", 1)[0]
    _FILES[path] = _FILES.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Say how long each worker spent in specs, so the balance can be read off CI's output."""
    if _FILES:
        slowest = sorted(_FILES.items(), key=lambda item: -item[1])[:20]
        terminalreporter.write_line(
            f"time in specs per file ({sum(_FILES.values()) / 60:.1f} min in all), slowest first: "
            + ", ".join(f"{path} {seconds:.0f} s" for path, seconds in slowest)
        )
    if len(_BUSY) > 1:
        terminalreporter.write_line(
            "time in specs per worker: "
            + ", ".join(
                f"{worker} {seconds / 60:.1f} min ({int(specs)} specs)"
                for worker, (seconds, specs) in sorted(_BUSY.items())
            )
        )


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Sweep what the specs' killed containers left in the host's scratch (the controller's
    end: every worker, and so every container the specs started, is done)."""
    if hasattr(session.config, "workerinput"):
        return
    from spark_elastic.runtime.container.scratch import sweep

    sweep()


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """A local[2] SparkSession shared by every test (Spark takes ~10 s to start)."""
    from spark_elastic.dataplane.session import local_session

    conf = {"spark.driver.extraJavaOptions": TEST_JAVA_OPTIONS}
    # Spark's Kafka connector and the project's gated-kafka source, when `make jars` has
    # fetched and built them: the source specs read through both in this one session. And
    # Hadoop's S3A client: the storage specs reach an S3 server from this session too.
    jars = sorted(
        str(p)
        for folder in ("spark-kafka", "s3a")
        for p in (Path(__file__).parent / ".cache/jars" / folder).glob("*.jar")
    )
    # An opt-in real object store's connector (tests/storage_jvm.py: SPARK_ELASTIC_CLOUD).
    jars += [j for j in os.environ.get("SPARK_ELASTIC_CLOUD_JARS", "").split(",") if j]
    if jars:
        conf["spark.jars"] = ",".join(jars)
    session = local_session("spark-elastic-tests", conf=conf)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def run_on_spark_connect() -> Callable[[str], str]:
    """Run a script in a fresh process with its own local Spark Connect session.

    Spark Connect cannot share this process with the classic session, so the
    script builds ``SparkSession.builder.remote("local[2]")`` itself; a failed
    script fails the test with its stderr. Returns the script's stdout.
    """

    def run(script: str) -> str:
        result = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stdout

    return run
