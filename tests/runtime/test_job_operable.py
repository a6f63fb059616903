"""What an operator does daily, on a real coordinator, real containers and the embedded log.

One stateful click count runs through: a second coordinator refused while the
first keeps running untouched; a move cancelled by the operator; a
coordinator whose loop fails (its store claimed behind its back) exits 1 and
a restarted one resumes; stop and resume; a move whose warm-up is not ready
by its deadline rolled back; a stop in the middle of a move and a resume that
finishes it. It ends compared with a single key-ordered pass over the log.
``make test-all`` runs it again with the job's checkpoints and output on a
real HDFS and on a real S3 server.
A job Spark refuses at start ends as failed, its cause where the operator
looks. The logic of each is specified in-process in ``test_changes.py`` and
``test_operable.py``; here it is the real thing, once.
"""

from __future__ import annotations

import re
import signal
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_runner import run_cli
from jobs import (
    APPLY_DEADLINE_S,
    RECORDS,
    RunningJob,
    all_applied,
    counts_in_key_order,
    job_files,
    produce,
    published_batches,
    wait_until,
)
from pyspark.sql import SparkSession

from spark_elastic import EmbeddedLog

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent


def events(job: RunningJob, kind: str) -> list[str]:
    return [e["detail"] for e in job.status()["events"] if e["kind"] == kind]


def stop(job: RunningJob) -> None:
    """SIGTERM, as Ctrl-C: the containers stop, then the coordinator; it exits 0."""
    job.status()  # the PIDs shown, for cleanup
    job.process.send_signal(signal.SIGTERM)
    assert job.process.wait(120) == 0


def live_ids(job: RunningJob) -> set[str]:
    return {c["containerId"] for c in job.job_model()["containers"]}


@pytest.mark.parametrize(
    "where",
    [
        "local",
        # Checkpoints and output on HDFS, on S3: `make test-all`.
        pytest.param("hdfs", marks=pytest.mark.long),
        pytest.param("s3", marks=pytest.mark.long),
        # A real object store, opt-in (SPARK_ELASTIC_CLOUD; skipped without it).
        pytest.param("cloud", marks=pytest.mark.long),
    ],
)
def test_an_operator_stops_resumes_cancels_and_a_second_coordinator_is_refused(
    request: pytest.FixtureRequest,
    spark: SparkSession,
    start_job: Callable[..., RunningJob],
    clicks: Path,
    monkeypatch: pytest.MonkeyPatch,
    where: str,
) -> None:
    monkeypatch.setenv("CLICKS_FACTOR", "2")  # 4 partitions x 2: 8 tasks
    monkeypatch.setenv("CLICKS_ROOT", str(clicks))  # for the CLI's own `job run`
    files = job_files(request, spark, monkeypatch, where)
    reader, options = files.spark, files.options
    log = EmbeddedLog(clicks / "log")
    total = RECORDS
    job = start_job(2, None, 0, *options)
    first = wait_until(
        "two running containers",
        lambda: len(job.running_containers()) == 2 and job.running_containers(),
    )
    wait_until("a first batch", lambda: any(published_batches(job.out, c, reader) for c in first))
    # A coordinator on loopback keeps its containers' Spark drivers there too.
    for pid in first.values():
        assert b"SPARK_LOCAL_IP=127.0.0.1" in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")

    # A second coordinator of the same job (on another port) is refused at once, in one line
    # naming the first, and changes nothing.
    version = job.job_model()["version"]
    second = run_cli(
        "job",
        "run",
        str(HERE.parents[1] / "examples" / "jobs" / "click_counts.py") + ":job",
        "--port",
        "0",
        "--store",
        str(clicks / "coordinator.db"),
    )
    assert second.returncode == 2
    pid = job.process.pid
    assert re.fullmatch(
        rf"spark-elastic job: error: --store: \S+ is owned by the running coordinator at "
        rf"{re.escape(job.url)} \(pid {pid}\); .*\n",
        second.stderr,
    ), second.stderr
    assert job.job_model()["version"] == version
    assert job.running_containers() == first

    # The operator cancels a move: its warm-up stops, the old owners never stopped.
    assert run_cli("job", "scale", job.url, "--containers", "3").returncode == 0
    warm = {w["containerId"] for w in job.job_model()["warmups"]}
    assert warm
    cancelled = run_cli("job", "scale", job.url, "--cancel")
    assert cancelled.returncode == 0, cancelled.stderr
    assert "2 -> 3 containers rolled back: cancelled by the operator" in cancelled.stdout
    assert job.job_model()["warmups"] == []
    assert job.running_containers() == first
    wait_until("the cancelled warm-ups gone", lambda: not warm & set(job.running_containers()))
    refused = run_cli("job", "scale", job.url, "--cancel")
    assert refused.returncode == 2
    assert "no change is under way: nothing to cancel" in refused.stderr

    # Its store claimed behind its back, the coordinator's loop fails: it exits 1 with the
    # traceback in its log and leaves the containers to the store's new owner. Restarted,
    # it resumes them.
    produce(log, total, 1000)
    total += 1000
    job.status()
    with sqlite3.connect(clicks / "coordinator.db") as db:
        db.execute("UPDATE meta SET value = value + 1 WHERE key = 'epoch'")
    assert job.process.wait(60) == 1
    coordinator_log = (clicks / "coordinator-0.log").read_text()
    assert "StoreFencedError: the store" in coordinator_log
    assert "Traceback" in coordinator_log
    port = int(job.url.rsplit(":", 1)[1])
    job = start_job(2, clicks / "coordinator.db", port, *options)
    wait_until("every record applied", all_applied(job, total, reader), APPLY_DEADLINE_S)
    assert job.running_containers() == first

    # Stopped (Ctrl-C) and resumed: the same tasks, from their last commits.
    stop(job)
    with sqlite3.connect(clicks / "coordinator.db") as db:
        (state,) = db.execute("SELECT value FROM meta WHERE key = 'jobState'").fetchone()
        states = {s for (s,) in db.execute("SELECT state FROM containers")}
    assert '"state": "stopped"' in state
    assert "running" not in states
    produce(log, total, 1000)
    total += 1000
    job = start_job(2, clicks / "coordinator.db", 0, *options)
    resumed = wait_until(
        "two running containers",
        lambda: len(job.running_containers()) == 2 and job.running_containers(),
    )
    assert not set(resumed) & set(first)
    assert [e for e in events(job, "resume") if "2 containers' tasks go to successors" in e]
    wait_until("every record applied", all_applied(job, total, reader), APPLY_DEADLINE_S)

    # Stopped in the middle of a move and resumed: the move goes on, with fresh warm-ups,
    # here under a deadline no warm-up meets, so it is rolled back there.
    assert run_cli("job", "scale", job.url, "--containers", "3").returncode == 0
    warm = {w["containerId"] for w in job.job_model()["warmups"]}
    stop(job)
    produce(log, total, 1000)
    total += 1000
    job = start_job(2, clicks / "coordinator.db", 0, "--warm-up-deadline-ms", "2000", *options)
    fresh = {w["containerId"] for w in job.job_model()["warmups"]}
    assert len(fresh) == len(warm)
    assert not fresh & warm
    owners = {c["containerId"] for c in job.job_model()["containers"]}
    assert not owners & set(resumed)  # the owners stopped too: successors from their commits
    rolled = wait_until("the move rolled back at its deadline", lambda: events(job, "deadline"))
    assert "2 -> 3 containers rolled back: its warm-ups were not ready within 2 s" in rolled[0]
    assert job.job_model()["warmups"] == []
    wait_until("the old owners running", lambda: set(job.running_containers()) == owners)
    produce(log, total, 1000)
    total += 1000
    wait_until("every record applied", all_applied(job, total, reader), APPLY_DEADLINE_S)
    assert job.output_rows(reader) == counts_in_key_order(spark, clicks, planned=4)
    files.delete()


def test_a_job_spark_refuses_at_start_fails_saying_why(
    start_job: Callable[..., RunningJob], clicks: Path
) -> None:
    job = start_job(1, None, 0, "--max-start-failures", "2", job=f"{HERE / 'refused_job.py'}:job")
    state = wait_until(
        "the job failed", lambda: (s := job.status())["jobState"]["state"] == "failed" and s
    )["jobState"]
    assert state["why"].startswith("2 containers in a row failed before their first commit: ")
    assert "AnalysisException" in state["why"]
    assert "streaming aggregations" in state["why"] or "Append output mode" in state["why"]
    expired = events(job, "expire")
    assert any("it failed: " in e and "AnalysisException" in e for e in expired)
    assert any("failure 1 at start; its successor waits 1 s" in e for e in expired)
    # Where the operator looks: `job status` and the status page.
    status = run_cli("job", "status", job.url)
    assert status.returncode == 0
    assert "job refused failed" in status.stdout
    assert f"why: {state['why']}" in status.stdout
    page = get_page(job.url)
    assert "Job failed: 2 containers in a row failed before their first commit" in page
    wait_until("no container left running", lambda: not job.running_containers())


def get_page(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url + "/", timeout=10) as response:
        return str(response.read().decode())
