"""Changing a running stateful job: the stall of a moved task, and a live factor change.

Real processes on the embedded log: ``spark-elastic job run`` (a coordinator
launching containers, each its own Spark application) runs the click-count
job of ``examples/jobs/click_counts.py`` over 2 partitions. Once
its keyed state holds the given number of keys, a producer keeps about
200 records a second arriving, and the job is changed while it runs:

``stall``
    At factor 4, ``job scale --containers 3`` (2 -> 3): every task moves. A moved task's
    stall is the time from its old owner's last committed batch to its new
    owner's first published batch with output rows, for each way a move
    can go: warm-ups that replay (the default: the new owner's query runs on
    a snapshot of the old owner's state and applies its committed records
    quietly, so at the handover it only lifts its gate), warm-ups that
    renew snapshots (``job run --warm-up-mode snapshot``: the new owner's
    Spark application is up, its query starts at the handover), and a cold
    move (``job run --cold-moves``: the new owner starts after the old one
    stopped), which is what stopping and restarting on a rescaled
    checkpoint costs a user.
``factor``
    At factor 2, ``job scale --elasticity-factor 4`` then ``2`` (a live
    split, then a merge; ``--factors 4,8`` for another pair): each group's
    zero-output time as above, and the longest time the *whole job*
    published nothing.

``--kafka``: the same on a real Apache Kafka broker (``make jars``; one
broker per case, KRaft on loopback, stopped by its PID), the job reading
its ``clicks`` topic through the default ``gated`` reader (Spark's Kafka
source held at a gate by the project's jar; the jars given to the
containers), and one more mode, ``spark``: Spark's own Kafka source as it is
(``reader="spark"``), whose warm-ups can only renew snapshots: what a Kafka
job's move cost before spark-elastic had a gated reader.

``--storage local,hdfs,s3``: each case once per file system of the job's
``checkpoint_root``, side by side in one run (default ``local``: the local
disk alone). ``hdfs`` is a real HDFS (a MiniDFS NameNode and DataNode in
one JVM), ``s3`` a real S3 server (s3proxy, through S3A with conditional
writes), both on loopback, started once for the run from
``tests/storage_jvm.py`` (``make jars``) and stopped by their PIDs at its end,
failed or not. The job's checkpoints (Spark's and the library's files, the
warm-ups' snapshots, forks, rescale seeds) are then there and nothing of them
on the local disk; the containers reach the server through ``job run
--conf`` (its ``spark.hadoop.*`` settings, and for S3 the S3A jars in
``spark.jars``); the coordinator's store and the containers' logs stay
local (``--store``), and so does the job's output, whose commit objects
time a new owner's first batch as on the local disk. An old owner's commit
times come from the server: HDFS's own (through Hadoop in a small Spark
driver of this process), and on S3 the times s3proxy's file store wrote each
object (S3 itself keeps whole seconds). ``--keep`` keeps a case's local
files only: its checkpoints are deleted from the server after it. A case
that fails is reported as failed and the run goes on. The stall section
ends with a table that gives, per file system, each stall beside its old
owners' micro-batch interval and their ratio (the goal: a stall within 2
intervals).

Run (about 40 minutes; nothing else should load the machine)::

    .venv/bin/python benchmarks/bench_live.py
    .venv/bin/python benchmarks/bench_live.py --keys 10000 --sections stall --modes replay
    .venv/bin/python benchmarks/bench_live.py --kafka --keys 10000 --sections stall
    .venv/bin/python benchmarks/bench_live.py --keys 10000,1000000 --sections stall \\
        --modes replay --storage local,hdfs,s3
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from spark_elastic import EmbeddedLog
from spark_elastic.runtime.sinks import COMMITS_DIR, DATA_DIR
from spark_elastic.storage import CommitLog, LocalStorage, open_storage

ROOT = Path(__file__).resolve().parents[1]
# kafka_jvm: the broker the specs start (--kafka); storage_jvm: their HDFS and S3 (--storage)
sys.path.insert(0, str(ROOT / "tests"))
JOB = f"{ROOT / 'examples' / 'jobs' / 'click_counts.py'}:job"
BUILD_BATCH = 100_000
"""Records per micro-batch while the state is built (the steady trickle is far smaller)."""
TRICKLE_PER_S = 200
MODES = {
    "replay": [],
    "snapshot": ["--warm-up-mode", "snapshot"],
    "cold": ["--cold-moves"],
    "spark": ["--warm-up-mode", "snapshot"],
}
"""How a move goes, and the ``job run`` options for it (``spark``: ``--kafka`` only)."""

KAFKA: Any = None
"""``--kafka``: the case's broker (``tests/kafka_jvm.KafkaBroker``), else the embedded log."""

FILE_SYSTEMS = ("local", "hdfs", "s3")
"""Where ``--storage`` may put a job's checkpoint root."""
SERVERS: dict[str, Any] = {}
"""``--storage``: the running HDFS and S3 servers (``tests/storage_jvm.StorageServer``)."""
READER: Any = None
"""With a remote file system: this process's small Spark driver, whose Hadoop reads HDFS's
commit times and deletes each case's checkpoints from the servers."""


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def wait_until(what: str, condition: Any, timeout: float = 1800.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            value = condition()
            if value:
                return value
        time.sleep(0.2)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


class Trickle(threading.Thread):
    """Keeps records arriving for existing users, so every container has batches to run."""

    def __init__(self, log: EmbeddedLog, keys: int) -> None:
        super().__init__(daemon=True)
        self.log, self.keys, self.stopping = log, keys, threading.Event()

    def stop(self) -> None:
        """Stop sending and wait for the send in flight (before the case's broker goes)."""
        self.stopping.set()
        self.join(timeout=30)

    def run(self) -> None:
        i = 0
        while not self.stopping.wait(0.1):
            batch = [f"user-{(i + j) * 7919 % self.keys}".encode() for j in range(20)]
            send(self.log, batch)
            i += len(batch)


PRODUCERS: dict[str, Any] = {}
"""One producer per broker: the trickle sends 20 records every 0.1 s."""


def send(log: EmbeddedLog, users: list[bytes]) -> None:
    """Clicks of ``users`` to the ``clicks`` topic: of the case's broker, else of ``log``."""
    if KAFKA is None:
        with log.producer("clicks") as producer:
            producer.send_many(users, [b"x"] * len(users))
        return
    from confluent_kafka import Producer

    producer = PRODUCERS.get(KAFKA.bootstrap)
    if producer is None:
        producer = PRODUCERS[KAFKA.bootstrap] = Producer(
            {"bootstrap.servers": KAFKA.bootstrap, "partitioner": "murmur2_random", "linger.ms": 5}
        )
    for user in users:
        while True:
            try:
                producer.produce("clicks", key=user, value=b"x")
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0


class RunningJob:
    """``spark-elastic job run`` in its own process, and what it launched."""

    def __init__(self, root: Path, mode: str, factor: int, checkpoints: str | None = None) -> None:
        env = {
            **os.environ,
            "CLICKS_ROOT": str(root),
            "CLICKS_BATCH": str(BUILD_BATCH),
            "CLICKS_FACTOR": str(factor),
            "PYSPARK_PYTHON": sys.executable,
        }
        jars: list[str] = []
        settings = list(CONF)
        store: list[str] = []
        if KAFKA is not None:
            import kafka_jvm  # type: ignore[import-not-found]

            env["CLICKS_KAFKA"] = KAFKA.bootstrap
            if mode == "spark":
                env["CLICKS_KAFKA_READER"] = "spark"
            jars += kafka_jvm.spark_kafka_jars()
        if checkpoints is not None:
            # The checkpoint root on a server; the coordinator's store (and the containers'
            # logs beside it) and the output stay on the local disk.
            server = server_of(checkpoints)
            env["CLICKS_CHECKPOINTS"] = checkpoints
            store = ["--store", str(root / "coordinator.db")]
            settings += [f"{key}={value}" for key, value in server.spark_conf().items()]
            if checkpoints.startswith("s3a://"):
                import storage_jvm  # type: ignore[import-not-found]

                jars += storage_jvm.s3a_jars()
        command = [
            sys.executable,
            *("-m", "spark_elastic", "job", "run", JOB, "--containers", "2", "--port", "0"),
            *store,
            *MODES[mode],
            *(arg for setting in settings for arg in ("--conf", setting)),
            *(["--conf", f"spark.jars={','.join(jars)}"] if jars else []),
        ]
        self.log_file = (root / "coordinator.log").open("w")
        self.process = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=self.log_file, text=True
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        self.url = line[line.index("http://") :].strip().rstrip("/")
        self.root = root

    def status(self) -> dict[str, Any]:
        return get_json(f"{self.url}/status.json")  # type: ignore[no-any-return]

    def model(self) -> dict[str, Any]:
        return get_json(f"{self.url}/jobModel")  # type: ignore[no-any-return]

    def caught_up(self) -> bool:
        lags = [t["lag"] for t in self.status()["tasks"]]
        return bool(lags) and all(lag == 0 for lag in lags)

    def scale(self, *option: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "spark_elastic", "job", "scale", self.url, *option],
            capture_output=True,
            text=True,
            check=True,
        )
        return done.stdout.strip()

    def stop(self) -> None:
        stop_process(self.process)
        self.log_file.close()


def stop_process(process: subprocess.Popen[str], timeout_s: float = 120.0) -> None:
    """SIGTERM (a coordinator stops its containers), SIGKILL past ``timeout_s``; by its PID."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(30)


def published(out: Path, container: str) -> list[float]:
    """Times a container published batches with rows (their commit objects), ascending.

    A batch without rows (a new owner's first batch may hold only records its old
    owner published already) is not output.
    """
    log = CommitLog(LocalStorage(), str(out / COMMITS_DIR))
    times = []
    for generation in log.generations():
        for commit in log.commits(generation):
            if commit.payload.get("container") != container or "data" not in commit.payload:
                continue
            files = (out / DATA_DIR / str(commit.payload["data"])).glob("*.parquet")
            if sum(pq.read_metadata(f).num_rows for f in files):
                times.append(Path(log.path(generation, commit.sequence)).stat().st_mtime)
    return sorted(times)


def server_of(uri: str) -> Any:
    """The ``--storage`` server a URI is on."""
    for server in SERVERS.values():
        if uri == server.uri or uri.startswith(f"{server.uri}/"):
            return server
    raise ValueError(f"{uri}: on none of the servers started ({', '.join(SERVERS) or 'none'})")


def commit_times(checkpoint: str) -> list[float]:
    """When each micro-batch of a checkpoint committed (Spark's ``commits/N``), ascending."""
    if "://" not in checkpoint:
        commits = [p for p in Path(checkpoint, "commits").glob("[0-9]*") if p.is_file()]
        return sorted(p.stat().st_mtime for p in commits)
    server = server_of(checkpoint)
    if checkpoint.startswith("s3a://"):
        # S3 gives an object's time in whole seconds; s3proxy's file store keeps each object
        # as a file of its own, written when the put arrived: its time to the millisecond.
        import storage_jvm

        key = checkpoint[len(server.uri) :].strip("/")
        folder = server.workdir / "store" / storage_jvm.S3_BUCKET / key / "commits"
        return sorted(p.stat().st_mtime for p in folder.iterdir() if p.name.isdigit())
    # HDFS: the NameNode's time, in milliseconds, through this process's Hadoop.
    path = READER._jvm.org.apache.hadoop.fs.Path(f"{checkpoint}/commits")
    fs = path.getFileSystem(READER._jsc.hadoopConfiguration())
    return sorted(
        status.getModificationTime() / 1000
        for status in fs.listStatus(path)
        if status.isFile() and str(status.getPath().getName()).isdigit()
    )


def last_commit(checkpoint: str) -> float:
    return commit_times(checkpoint)[-1]


def batch_intervals(checkpoint: str, last: int = 6) -> list[float]:
    """Seconds between an old owner's last ``last`` commits: its micro-batch interval."""
    times = commit_times(checkpoint)[-last:]
    return [b - a for a, b in itertools.pairwise(times)]


def build_state(
    root: Path, keys: int, mode: str, factor: int = 4, checkpoints: str | None = None
) -> tuple[RunningJob, EmbeddedLog]:
    log = EmbeddedLog(root / "log", fsync=False)
    if KAFKA is None:
        log.create_topic("clicks", 2)
    else:
        import kafka_jvm

        kafka_jvm.create_topics(KAFKA.bootstrap, {"clicks": 2})
    for start in range(0, keys, 50_000):
        send(log, [f"user-{i}".encode() for i in range(start, min(start + 50_000, keys))])
    job = RunningJob(root, mode, factor, checkpoints)
    started = time.monotonic()
    try:
        wait_until(f"{keys} keys of state built", job.caught_up)
    except BaseException:
        job.stop()
        raise
    print(f"    built {keys} keys of state in {time.monotonic() - started:.0f} s", flush=True)
    return job, log


def moves(job: RunningJob, before: dict[str, Any]) -> list[dict[str, Any]]:
    """Each new owner's stall: old owners' last commit to its first published batch."""
    old = {c["containerId"] for c in before["containers"]}
    after = job.model()
    result = []
    for c in after["containers"]:
        if c["containerId"] in old:
            continue
        first = wait_until(
            f"{c['containerId']}'s first batch",
            lambda c=c: published(job.root / "out", c["containerId"]),
        )[0]
        stopped = max(last_commit(s) for s in c["sources"])
        intervals = [i for s in c["sources"] for i in batch_intervals(s)]
        result.append(
            {
                "container": c["containerId"],
                "tasks": len(c["tasks"]),
                "stall": first - stopped,
                "intervals": intervals,
            }
        )
    return result


def job_gap(job: RunningJob, since: float, until: float) -> float:
    """The longest time in [since, until] in which no container published a batch."""
    times = sorted(
        t
        for p in (job.root / "out" / DATA_DIR).glob("container=*")
        for t in published(job.root / "out", p.name.split("=", 1)[1])
        if since <= t <= until
    )
    edges = [since, *times, until]
    return max(b - a for a, b in itertools.pairwise(edges))


def change(job: RunningJob, *option: str) -> tuple[list[dict[str, Any]], float, float]:
    before = job.model()
    asked = time.time()
    print(f"    {job.scale(*option)}", flush=True)
    wait_until("the change made", lambda: job.model()["warmups"] == [] and job.model() != before)
    result = moves(job, before)
    done = time.time()
    time.sleep(3)  # a few batches after the change, so the last gap is closed by a batch
    return result, done - asked, job_gap(job, asked, done)


CONF: list[str] = []
"""``--conf KEY=VALUE``: Spark settings for every container (``job run --conf``)."""

KEEP: Path | None = None
"""``--keep DIR``: each case's files (logs, checkpoints, the coordinator's store) stay there."""


@contextlib.contextmanager
def case_dir(name: str) -> Any:
    if KEEP is None:
        with tempfile.TemporaryDirectory(prefix="bench-live-") as tmp:
            yield tmp
        return
    folder = KEEP / name
    folder.mkdir(parents=True, exist_ok=False)
    yield str(folder)


@contextlib.contextmanager
def broker() -> Any:
    """With ``--kafka``, a fresh broker for the case (its topic starts empty), else nothing."""
    global KAFKA
    if not USE_KAFKA:
        yield
        return
    import kafka_jvm

    with kafka_jvm.running_kafka() as running:
        KAFKA = running
        try:
            yield
        finally:
            KAFKA = None
            # Before the broker stops: a producer left behind retries it for the rest of the
            # run, filling the log with connection errors.
            producer = PRODUCERS.pop(running.bootstrap, None)
            if producer is not None:
                producer.flush(10)
                producer.close()


USE_KAFKA = False
"""``--kafka``: each case runs on a broker of its own."""


@contextlib.contextmanager
def checkpoint_root(storage: str) -> Any:
    """The case's checkpoint root: None (under the case's folder), or a fresh folder on the
    server, deleted from it after the case (the server's files go at the run's end anyway)."""
    if storage == "local":
        yield None
        return
    root = f"{SERVERS[storage].uri}/bench-live-{uuid.uuid4().hex[:8]}/checkpoints"
    try:
        yield root
    finally:
        with contextlib.suppress(Exception):
            open_storage(root, READER).delete(root.rsplit("/", 1)[0])


def case_name(*parts: object, storage: str) -> str:
    return "-".join(map(str, parts if storage == "local" else (*parts, storage)))


def stall_case(keys: int, mode: str, storage: str = "local") -> dict[str, Any]:
    with (
        case_dir(case_name("stall", keys, mode, storage=storage)) as tmp,
        broker(),
        checkpoint_root(storage) as checkpoints,
    ):
        job, log = build_state(Path(tmp), keys, mode, checkpoints=checkpoints)
        trickle = Trickle(log, keys)
        trickle.start()
        try:
            time.sleep(5)  # steady batches before the change
            result, took, _ = change(job, "--containers", "3")
        finally:
            trickle.stop()
            job.stop()
    stalls = [m["stall"] for m in result]
    intervals = sorted(i for m in result for i in m["intervals"])
    return {
        "keys": keys,
        "mode": mode,
        "storage": storage,
        "stalls": stalls,
        "took": took,
        "intervals": intervals,
    }


def factor_case(
    keys: int, mode: str, low: int, high: int, storage: str = "local"
) -> list[dict[str, Any]]:
    rows = []
    with (
        case_dir(case_name("factor", keys, mode, low, high, storage=storage)) as tmp,
        broker(),
        checkpoint_root(storage) as checkpoints,
    ):
        job, log = build_state(Path(tmp), keys, mode, low, checkpoints)
        trickle = Trickle(log, keys)
        trickle.start()
        try:
            time.sleep(5)
            for before, factor in ((low, high), (high, low)):
                result, took, gap = change(job, "--elasticity-factor", str(factor))
                rows.append(
                    {
                        "change": f"{'split' if factor > before else 'merge'} {before} -> {factor}",
                        "stalls": [m["stall"] for m in result],
                        "took": took,
                        "job_gap": gap,
                    }
                )
        finally:
            trickle.stop()
            job.stop()
    return rows


LABELS = {"local": "local disk", "hdfs": "HDFS", "s3": "S3"}


def start_servers(stack: contextlib.ExitStack, storages: list[str]) -> None:
    """``--storage``: start the HDFS and S3 servers asked for, once for the run, and this
    process's small Spark driver that reaches them; all stopped when ``stack`` closes."""
    global READER
    remote = [s for s in storages if s != "local"]
    if not remote:
        return
    import storage_jvm

    stack.callback(SERVERS.clear)
    for name in remote:
        run = storage_jvm.running_hdfs if name == "hdfs" else storage_jvm.running_s3
        try:
            server = SERVERS[name] = stack.enter_context(run())
        except storage_jvm.StorageJvmError as error:
            sys.exit(f"bench_live: {error}")
        print(
            f"{LABELS[name]}: {server.uri} (pid {server.pid}, up in {server.started_in_s:.1f} s)",
            flush=True,
        )
    from spark_elastic.dataplane.session import local_session

    conf = {key: value for server in SERVERS.values() for key, value in server.spark_conf().items()}
    if "s3" in SERVERS:
        conf["spark.jars"] = ",".join(storage_jvm.s3a_jars())
    READER = local_session("bench-live-storage", cores=1, conf=conf)

    def stop_reader() -> None:
        global READER
        READER.stop()
        READER = None

    stack.callback(stop_reader)


def failed(error: BaseException) -> str:
    lines = str(error).strip().splitlines() or [""]
    return f"{type(error).__name__}: {lines[0][:200]}"


def stall_table(rows: list[dict[str, Any]]) -> None:
    """The stall section as a markdown table: each stall against its old owners' interval."""
    print("\n### A moved task's stall: factor 4, 2 -> 3 containers (every task moves)\n")
    print(
        "| checkpoints on | keys | mode | stall per new owner (s) "
        "| old owners' batch interval: median (range) (s) | longest stall / median interval "
        "| change made in (s) |"
    )
    print("|---|---:|---|---|---|---:|---:|")
    for row in rows:
        head = f"| {LABELS[row['storage']]} | {row['keys']:,} | {row['mode']} |"
        if "error" in row:
            print(f"{head} failed: {row['error']} | - | - | - |")
            continue
        if not row["stalls"]:
            print(f"{head} no task moved (rolled back?) | - | - | {row['took']:.0f} |")
            continue
        stalls = ", ".join(f"{s:.1f}" for s in row["stalls"])
        every = row["intervals"]
        if every:
            median = statistics.median(every)
            interval = f"{median:.1f} ({every[0]:.1f}-{every[-1]:.1f})"
            ratio = f"{max(row['stalls']) / median:.1f}"
        else:
            interval = ratio = "-"
        print(f"{head} {stalls} | {interval} | {ratio} | {row['took']:.0f} |")


def stall_section(keys: list[int], modes: list[str], storages: list[str]) -> None:
    print("\nstall of a moved task, factor 4, 2 -> 3 containers (every task moves):", flush=True)
    rows = []
    for k in keys:
        for mode in modes:
            for storage in storages:
                where = f" on {LABELS[storage]}" if storages != ["local"] else ""
                try:
                    row = stall_case(k, mode, storage)
                except Exception as error:
                    rows.append(
                        {"keys": k, "mode": mode, "storage": storage, "error": failed(error)}
                    )
                    print(f"  {k:>9} keys  {mode:<9}{where} failed: {failed(error)}", flush=True)
                    continue
                rows.append(row)
                if not row["stalls"]:
                    # A change past its deadline is rolled back: the old owners keep their tasks.
                    print(
                        f"  {k:>9} keys  {row['mode']:<9}{where} no task moved: the change ended "
                        f"without new owners after {row['took']:.0f} s (rolled back?)",
                        flush=True,
                    )
                    continue
                stalls = ", ".join(f"{s:.1f}" for s in row["stalls"])
                every = row["intervals"] or [float("nan")]
                print(
                    f"  {k:>9} keys  {row['mode']:<9}{where} stall per new owner {stalls} s "
                    f"(max {max(row['stalls']):.1f} s); change made in {row['took']:.0f} s; "
                    f"old owners' last batches every {every[0]:.1f}-{every[-1]:.1f} s",
                    flush=True,
                )
    stall_table(rows)


def factor_section(k: int, modes: list[str], storages: list[str], low: int, high: int) -> None:
    rows: list[tuple[str, str, dict[str, Any] | None, str]] = []
    for mode in [m for m in modes if m not in ("cold", "spark")]:
        for storage in storages:
            where = f", checkpoints on {LABELS[storage]}" if storages != ["local"] else ""
            print(f"\nlive factor change with {k} keys (2 containers, {mode}{where}):", flush=True)
            try:
                changes = factor_case(k, mode, low, high, storage)
            except Exception as error:
                print(f"  failed: {failed(error)}", flush=True)
                rows.append((storage, mode, None, failed(error)))
                continue
            for row in changes:
                rows.append((storage, mode, row, ""))
                stalls = ", ".join(f"{s:.1f}" for s in row["stalls"])
                print(
                    f"  {row['change']:<12} zero output per group {stalls} s; whole job's longest "
                    f"gap {row['job_gap']:.1f} s; change made in {row['took']:.0f} s",
                    flush=True,
                )
    print(f"\n### A live factor change with {k:,} keys (2 containers)\n")
    print(
        "| checkpoints on | mode | change | zero output per group (s) "
        "| whole job's longest gap (s) | change made in (s) |"
    )
    print("|---|---|---|---|---:|---:|")
    for storage, mode, change_row, why in rows:
        if change_row is None:
            print(f"| {LABELS[storage]} | {mode} | failed: {why} | - | - | - |")
            continue
        stalls = ", ".join(f"{s:.1f}" for s in change_row["stalls"]) or "none moved"
        print(
            f"| {LABELS[storage]} | {mode} | {change_row['change']} | {stalls} "
            f"| {change_row['job_gap']:.1f} | {change_row['took']:.0f} |"
        )


def command_line() -> str:
    python = os.path.relpath(sys.executable)
    script = os.path.relpath(sys.argv[0])
    return shlex.join(
        [sys.executable if python.startswith("..") else python, script, *sys.argv[1:]]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", default="10000,1000000", help="comma-separated key counts")
    parser.add_argument("--sections", default="stall,factor", help="stall, factor")
    parser.add_argument(
        "--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}"
    )
    parser.add_argument(
        "--factors", default="2,4", help="the factor section's LOW,HIGH: split to HIGH, merge back"
    )
    parser.add_argument(
        "--storage",
        default="local",
        help=f"comma-separated file systems of the job's checkpoint root, of "
        f"{', '.join(FILE_SYSTEMS)}: each case on each in turn (default: local)",
    )
    parser.add_argument("--keep", type=Path, help="keep each case's files under this directory")
    parser.add_argument("--kafka", action="store_true", help="on a real Kafka broker per case")
    parser.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE", help="a containers' setting"
    )
    parser.add_argument(
        "--trigger",
        default="1 second",
        help="the job's micro-batch trigger (CLICKS_TRIGGER; default: 1 second)",
    )
    args = parser.parse_args()
    global KEEP, USE_KAFKA
    KEEP = args.keep
    USE_KAFKA = args.kafka
    CONF.extend(args.conf)
    keys = [int(k) for k in args.keys.split(",")]
    sections = set(args.sections.split(","))
    modes = [m for m in args.modes.split(",") if m and (args.kafka or m != "spark")]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"--modes: expected some of {', '.join(MODES)}, found {unknown[0]!r}")
    storages = list(dict.fromkeys(s for s in args.storage.split(",") if s))
    unknown = [s for s in storages if s not in FILE_SYSTEMS]
    if unknown or not storages:
        parser.error(
            f"--storage: expected some of {', '.join(FILE_SYSTEMS)}, found {args.storage!r}"
        )
    try:
        low, high = (int(f) for f in args.factors.split(","))
    except ValueError:
        parser.error(f"--factors: expected LOW,HIGH (two integers), found {args.factors!r}")
    if high <= low:
        parser.error(f"--factors: expected LOW below HIGH, found {args.factors!r}")
    # Stopped by `timeout` or `kill`: unwind, so that the job and the servers are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    where = "a Kafka broker" if args.kafka else "the embedded log"
    os.environ["CLICKS_TRIGGER"] = args.trigger  # the job's, through `job run`'s environment
    print(f"$ {command_line()}", flush=True)
    print(
        f"bench_live: {os.cpu_count()} cores, trigger {args.trigger}, 2 partitions of {where}",
        flush=True,
    )
    with contextlib.ExitStack() as stack:
        start_servers(stack, storages)
        if "stall" in sections:
            stall_section(keys, modes, storages)
        if "factor" in sections:
            factor_section(max(keys), modes, storages, low, high)


if __name__ == "__main__":
    main()
