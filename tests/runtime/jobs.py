"""The end-to-end specs' machinery: the click-count job run by ``spark-elastic job run``.

:class:`RunningJob` is a coordinator process (its own process, launching
containers that are each their own Spark application) and what it launched;
:class:`JobStarter` starts them with short leases and cleans every one up.
The ``clicks`` and ``start_job`` fixtures (``tests/conftest.py``) start jobs on
an embedded log of :data:`RECORDS` clicks; the helpers read the sink's rows
(:func:`output_rows`) and the single key-ordered pass they are compared with
(:func:`counts_in_key_order`).

pyarrow and pyspark are imported where they are used: ``tests/conftest.py``
imports this module, and the specs without Spark need neither.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jvm import CONTAINER_CONF

from spark_elastic import EmbeddedLog, ParquetSink
from spark_elastic.runtime.coordinator.launchers import LocalLauncher
from spark_elastic.runtime.sinks import DATA_DIR
from spark_elastic.storage import is_local

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ROOT = Path(__file__).resolve().parents[2]
JOB = f"{ROOT / 'examples' / 'jobs' / 'click_counts.py'}:job"
TASKS_JOB = f"{ROOT / 'examples' / 'jobs' / 'click_tasks.py'}:job"
"""The stateless counterpart: every click tagged with its virtual task."""
RECORDS = 6000
USERS = 97
APPLY_DEADLINE_S = 600.0
"""How long a story waits for every record to be applied after a step. A bound on a hang,
not a timing claim: under CI's load (two stories side by side, up to eight Spark
applications on 2 cores) the stateful story's successors after growth ran their first
batch 222 s after they were given their tasks, and 240 s ran out twice."""
CHANGE_DEADLINE_S = 600.0
"""How long a story waits for a live change (a scale, a factor change, the autoscaler's
step) to settle: its warm-ups are new Spark applications, and under CI's load one took
213 s from launch to ready (a 3 -> 2 scale settled in 216 s). The coordinator's own
warm-up deadline is 600 s too."""
# Short leases so failovers happen within seconds; the budget fits a local Parquet write.
LEASE_MS, MARGIN_MS, BUDGET_MS, HEARTBEAT_MS = 6000, 2500, 2000, 500


def wait_until(what: str, condition: Callable[[], Any], timeout: float = 180.0) -> Any:
    """Poll ``condition`` until it returns a truthy value; fail naming ``what`` at the deadline."""
    started = time.monotonic()
    deadline = started + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            # On stdout, which pytest shows with a failed story's report: where its time went.
            waited = time.monotonic() - started
            print(f"{time.strftime('%H:%M:%S')} waited {waited:.1f} s for {what}")
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def get_json(url: str, token: str | None = None) -> Any:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())


@dataclass
class RunningJob:
    """A coordinator process running the click-count job, and what it launched."""

    root: Path
    process: subprocess.Popen[str]
    url: str = ""
    out: str = ""
    """Where its Parquet sink publishes (``CLICKS_OUT``; ``root/out`` by default)."""
    pids: dict[int, str] = field(default_factory=dict)
    """PID -> container id of every container the status page has shown."""
    token: str | None = None
    """The coordinator's bearer token (one off loopback requires it)."""

    def status(self) -> dict[str, Any]:
        document: dict[str, Any] = get_json(f"{self.url}/status.json", self.token)
        for container in document.get("containers", []):
            if container.get("pid"):
                self.pids[int(container["pid"])] = container["containerId"]
        return document

    def job_model(self) -> dict[str, Any]:
        model: dict[str, Any] = get_json(f"{self.url}/jobModel", self.token)
        return model

    def leads(self) -> bool:
        """Whether this coordinator answers as the job's leader (a standby answers 409)."""
        try:
            get_json(f"{self.url}/jobModel", self.token)
        except urllib.error.HTTPError as exc:
            if exc.code == 409:
                return False
            raise
        except OSError:
            return False
        return True

    def settled_model(self) -> dict[str, Any] | None:
        """The job model once no change is in flight, else None: a condition to wait on.

        A move publishes its job model (the new owners listed, no warm-ups) before the old
        owners have stopped at a batch boundary; the coordinator refuses another change
        until then, so a story that changes the job again waits for this, not the model.
        """
        if self.status()["change"] is not None:
            return None
        model = self.job_model()
        return model if model["warmups"] == [] and model["stopping"] == [] else None

    def running_containers(self) -> dict[str, int]:
        """``{container id: pid}`` of containers registered and running."""
        return {
            c["containerId"]: int(c["pid"])
            for c in self.status().get("containers", [])
            if c.get("state") == "running" and c.get("pid")
        }

    def running_rows(self) -> dict[str, dict[str, Any]]:
        """``{container id: its status row}`` of containers registered and running, whatever
        their launcher's handles (a PID, a namespace)."""
        return {
            c["containerId"]: c
            for c in self.status().get("containers", [])
            if c.get("state") == "running"
        }

    def output_rows(self, spark: SparkSession | None = None) -> list[tuple[str, int, int, int]]:
        """Its published rows; ``spark`` reads them off the local disk (HDFS, S3)."""
        return output_rows(self.out or self.root / "out", spark)

    def takeovers(self) -> dict[str, str]:
        """``{container id: how it took its tasks over}``, from the containers' logs.

        ``replay`` (a replaying warm-up's running query took them), ``snapshot``
        (a snapshot warm-up started from the state it followed) or
        ``checkpoints`` (its predecessors' committed checkpoints, rescaled).
        """
        ways = {
            "in the query that replayed them": "replay",
            "from the state it followed": "snapshot",
            " checkpoints: ": "checkpoints",
        }
        found = {}
        # The containers' logs: in the checkpoint root, or beside the store for a remote one.
        logs = [*(self.root / "checkpoints" / "logs").glob("*.log")]
        logs += (self.root / "logs").glob("*.log")
        for path in sorted(logs):
            for line in path.read_text(errors="replace").splitlines():
                if ": took over " in line:
                    found[path.stem] = next(way for words, way in ways.items() if words in line)
        return found

    def cleanup(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(60)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        # A container that exited long ago may have left its PID to another process (the
        # test session's own JVM, once): the launcher signals a PID, and its process group,
        # only while /proc says they are still that container's.
        launcher = LocalLauncher(self.root / "cleanup")
        for pid, container_id in self.pids.items():
            launcher.kill(pid, container_id, signal.SIGKILL)


def committed_batches(
    out: Path | str, container: str = "*", spark: SparkSession | None = None
) -> list[str]:
    """The directories of the batches the sink at ``out`` committed, of ``container`` (all
    by default): what a reader trusts (:meth:`ParquetSink.committed`; ``spark`` reaches
    a sink off the local disk)."""
    dirs = ParquetSink(str(out)).committed(spark)
    if container == "*":
        return dirs
    return [d for d in dirs if f"/container={container}/" in d]


def published_rows(
    out: Path | str,
    columns: tuple[str, ...],
    container: str = "*",
    spark: SparkSession | None = None,
) -> list[tuple[Any, ...]]:
    """``columns`` of every row of every committed batch of ``container`` (all by default).

    A list, not a set: a record whose output was published twice shows twice, and the
    stories compare it with a single pass row for row (exactly-once output). A sink on
    the local disk is read with pyarrow, one off it with ``spark``.
    """
    batches = committed_batches(out, container, spark)
    if spark is not None and not is_local(str(out)):
        if not batches:
            return []
        read = spark.read.parquet(*batches).select(*columns).collect()
        return [tuple(r) for r in read]
    import pyarrow.parquet as pq

    rows: list[tuple[Any, ...]] = []
    for batch in batches:
        table = pq.read_table(batch).to_pydict()
        rows.extend(zip(*(table[c] for c in columns), strict=True))
    return rows


def output_rows(
    out: Path | str, spark: SparkSession | None = None
) -> list[tuple[str, int, int, int]]:
    """``(user, clicks, partition, offset)`` of every row :data:`JOB` published, sorted
    (see :func:`published_rows`); compared with :func:`key_ordered_counts`."""
    columns = ("user", "clicks", "partition", "offset")
    return sorted(published_rows(out, columns, spark=spark))


def tagged_rows(out: Path) -> list[tuple[str, int, int, str]]:
    """``(user, partition, offset, task)`` of every row :data:`TASKS_JOB` published."""
    return published_rows(out, ("user", "partition", "offset", "task"))


def produce(log: EmbeddedLog, start: int, count: int) -> None:
    """Clicks ``start`` to ``start + count``, in one append per partition.

    One append, not one per record: each append is fsynced, and on CI's loaded
    machine 2,000 single sends took about 15 s of a story's time.
    """
    ids = range(start, start + count)
    with log.producer("clicks") as producer:
        users = [f"user-{(i * 7919) % USERS}".encode() for i in ids]
        producer.send_many(users, [f"click-{i}".encode() for i in ids])


def kafka_conf(env: Mapping[str, str]) -> tuple[str, ...]:
    """``--conf spark.jars=...`` for a job the environment points at Kafka (``CLICKS_KAFKA``).

    Its containers read through the gated Spark source (``KafkaInput``'s default
    reader), so they need Spark's connector and the project's jar.
    """
    if not env.get("CLICKS_KAFKA") or env.get("CLICKS_KAFKA_READER") == "elastic":
        return ()
    import kafka_jvm

    return ("--conf", f"spark.jars={','.join(kafka_jvm.spark_kafka_jars())}")


class JobStarter:
    """Starts ``spark-elastic job run`` of :data:`JOB` on the log under ``clicks``.

    Called as ``start_job(containers, store=None, port=0, *extra, job=JOB, token=None,
    prefix=())``, it returns
    the :class:`RunningJob` once its status URL is printed; :meth:`cleanup`
    stops every job it started and kills what they launched.
    """

    def __init__(self, clicks: Path) -> None:
        self.clicks = clicks
        self.started: list[RunningJob] = []

    def __call__(
        self,
        containers: int,
        store: Path | None = None,
        port: int = 0,
        *extra: str,
        job: str | None = None,
        token: str | None = None,
        prefix: Sequence[str] = (),
    ) -> RunningJob:
        clicks = self.clicks
        env = {
            **os.environ,
            "CLICKS_ROOT": str(clicks),
            "PYSPARK_PYTHON": sys.executable,
        }
        command = [
            *prefix,  # `ip netns exec NAME`: the coordinator on a host of its own
            sys.executable,
            *("-m", "spark_elastic", "job", "run", job or JOB),
            *("--containers", str(containers), "--port", str(port)),
            *("--store", str(store or clicks / "coordinator.db")),
            *("--lease-ms", str(LEASE_MS), "--margin-ms", str(MARGIN_MS)),
            *("--write-budget-ms", str(BUDGET_MS), "--heartbeat-ms", str(HEARTBEAT_MS)),
            # Containers go on without their coordinator for about a minute of failed
            # heartbeats (Samza's retries; two leases at least): the spec's coordinator
            # restart may outlast two 6 s leases on a loaded machine.
            *("--heartbeat-retries", "120"),
            *CONTAINER_CONF,
            *kafka_conf(env),
            *extra,
        ]
        log_file = (clicks / f"coordinator-{len(self.started)}.log").open("w")
        process = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=log_file, text=True
        )
        out = env.get("CLICKS_OUT", str(clicks / "out"))
        job = RunningJob(clicks, process, out=out, token=token)
        self.started.append(job)
        assert process.stdout is not None
        line = process.stdout.readline()
        assert "http://" in line, f"no status URL printed: {line!r}"
        # `status: URL/`, or a standby's `standby: URL/ (the job is led by URL)`.
        job.url = line[line.index("http://") :].split()[0].rstrip("/")
        return job

    def cleanup(self) -> None:
        for job in self.started:
            job.cleanup()

    def diagnosis(self, lines: int = 25) -> str:
        """What a failed spec's jobs did: the coordinator's events and each log's last lines.

        Read from the files (the store with SQLite, read-only; the logs), so it
        works on a coordinator that is gone. Added to the failure report by
        ``tests/conftest.py``: CI shows the report and keeps nothing else.
        """
        import sqlite3

        parts = []
        for store in sorted(self.clicks.glob("*.db")):
            with contextlib.closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True)) as db:
                events = db.execute("SELECT at, kind, container, detail FROM events ORDER BY id")
                parts.append(f"--- events of {store.name}")
                parts += [
                    f"{time.strftime('%H:%M:%S', time.gmtime(at))} {kind} {container} {detail}"
                    for at, kind, container, detail in events
                ]
        logs = sorted(self.clicks.glob("coordinator-*.log"))
        logs += sorted((self.clicks / "checkpoints" / "logs").glob("*.log"))
        logs += sorted((self.clicks / "logs").glob("*.log"))  # a remote root's: by the store
        for log in logs:
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            parts += [f"--- last lines of {log.name}", *tail]
        return "\n".join(parts)


def all_applied(
    job: RunningJob, total: int, spark: SparkSession | None = None
) -> Callable[[], bool]:
    return lambda: len({(u, o, p) for u, _, p, o in job.output_rows(spark)}) >= total


def writes_by(out: Path, container_id: str) -> list[float]:
    """Modification times of the files a container wrote to the sink (committed or not)."""
    files = (out / DATA_DIR).glob(f"container={container_id}/**/*")
    return [p.stat().st_mtime for p in files if p.is_file()]


def published_batches(
    out: Path | str, container_id: str, spark: SparkSession | None = None
) -> set[str]:
    return set(committed_batches(out, container_id, spark))


def counts_in_key_order(
    spark: SparkSession, root: Path, planned: int
) -> list[tuple[str, int, int, int]]:
    """The click-count rows of a job that kept each key's order across growth, on the log.

    See :func:`key_ordered_counts`; the records are the embedded log's under ``root``.
    """
    from spark_elastic import LOG_SOURCE_FORMAT
    from spark_elastic.log.source import register_log_source

    register_log_source(spark)
    records = (
        spark.read.format(LOG_SOURCE_FORMAT)
        .option("path", str(root / "log"))
        .option("subscribe", "clicks")
        .load()
        .select("key", "partition", "offset")
        .collect()
    )
    return key_ordered_counts(((r.key, r.partition, r.offset) for r in records), planned)


def key_ordered_counts(
    records: Iterable[tuple[bytes, int, int]], planned: int
) -> list[tuple[str, int, int, int]]:
    """The click-count rows of a single key-ordered pass over ``(key, partition, offset)``, sorted.

    A key's records in its old partition (below ``planned``) come first, then
    those in its new partition, each in offset order; its running count at a
    record is the record's place in that sequence.
    """
    by_key: dict[str, list[tuple[bool, int, int]]] = {}
    for key, partition, offset in records:
        by_key.setdefault(key.decode(), []).append((partition >= planned, offset, partition))
    return sorted(
        (user, count, partition, offset)
        for user, seq in by_key.items()
        for count, (_, offset, partition) in enumerate(sorted(seq), start=1)
    )


@dataclass(frozen=True)
class JobFiles:
    """Where a story's click-count job keeps its checkpoints and output, and how to reach it.

    ``local``: both under the story's directory (the default). ``hdfs``, ``s3``
    or ``cloud``: both on that test server or real object store (nothing of them
    on the local disk), the containers reaching it with Spark's own settings
    (``options``, for ``job run``).
    """

    where: str
    options: tuple[str, ...] = ()
    base: str | None = None
    spark: SparkSession | None = None
    """Reads the output off the local disk (None on it)."""

    def delete(self) -> None:
        if self.base is not None:
            from spark_elastic.storage import open_storage

            open_storage(self.base, self.spark).delete(self.base)


def job_files(
    request: Any, spark: SparkSession, monkeypatch: Any, where: str, checkpoints: bool = True
) -> JobFiles:
    """Put the job's checkpoints and output ``where``: ``local``, ``hdfs``, ``s3`` (test
    servers) or ``cloud`` (a real object store, opt-in: the ``cloud`` fixture); the
    checkpoints stay on the local disk unless ``checkpoints``."""
    if where == "local":
        return JobFiles(where)
    import uuid

    import storage_jvm

    server: storage_jvm.StorageServer = request.getfixturevalue(where)
    server.reach_from(spark)
    base = f"{server.uri}/jobs-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("CLICKS_OUT", f"{base}/out")
    if checkpoints:
        monkeypatch.setenv("CLICKS_CHECKPOINTS", f"{base}/checkpoints")
    options = [item for k, v in server.spark_conf().items() for item in ("--conf", f"{k}={v}")]
    jars = storage_jvm.s3a_jars() if server.uri.startswith("s3a://") else []
    jars += storage_jvm.cloud_jars(dict(os.environ)) if where == "cloud" else []
    if jars:
        options += ["--conf", f"spark.jars={','.join(jars)}"]
    return JobFiles(where, tuple(options), base, spark)
