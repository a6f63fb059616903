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

Run (about 40 minutes; nothing else should load the machine)::

    .venv/bin/python benchmarks/bench_live.py
    .venv/bin/python benchmarks/bench_live.py --keys 10000 --sections stall --modes replay
    .venv/bin/python benchmarks/bench_live.py --kafka --keys 10000 --sections stall
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from spark_elastic import EmbeddedLog
from spark_elastic.runtime.sinks import COMMITS_DIR, DATA_DIR
from spark_elastic.storage import CommitLog, LocalStorage

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # kafka_jvm: the broker the specs start (--kafka)
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

    def __init__(self, root: Path, mode: str, factor: int) -> None:
        env = {
            **os.environ,
            "CLICKS_ROOT": str(root),
            "CLICKS_BATCH": str(BUILD_BATCH),
            "CLICKS_FACTOR": str(factor),
            "PYSPARK_PYTHON": sys.executable,
        }
        jars: list[str] = []
        if KAFKA is not None:
            import kafka_jvm  # type: ignore[import-not-found]

            env["CLICKS_KAFKA"] = KAFKA.bootstrap
            if mode == "spark":
                env["CLICKS_KAFKA_READER"] = "spark"
            jars = ["--conf", f"spark.jars={','.join(kafka_jvm.spark_kafka_jars())}"]
        command = [
            sys.executable,
            *("-m", "spark_elastic", "job", "run", JOB, "--containers", "2", "--port", "0"),
            *MODES[mode],
            *(arg for setting in CONF for arg in ("--conf", setting)),
            *jars,
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
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(120)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.log_file.close()


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


def last_commit(checkpoint: str) -> float:
    commits = [p for p in Path(checkpoint, "commits").glob("[0-9]*") if p.is_file()]
    return max(p.stat().st_mtime for p in commits)


def batch_intervals(checkpoint: str, last: int = 6) -> list[float]:
    """Seconds between an old owner's last ``last`` commits: its micro-batch interval."""
    commits = [p for p in Path(checkpoint, "commits").glob("[0-9]*") if p.is_file()]
    times = sorted(p.stat().st_mtime for p in commits)[-last:]
    return [b - a for a, b in itertools.pairwise(times)]


def build_state(
    root: Path, keys: int, mode: str, factor: int = 4
) -> tuple[RunningJob, EmbeddedLog]:
    log = EmbeddedLog(root / "log", fsync=False)
    if KAFKA is None:
        log.create_topic("clicks", 2)
    else:
        import kafka_jvm

        kafka_jvm.create_topics(KAFKA.bootstrap, {"clicks": 2})
    for start in range(0, keys, 50_000):
        send(log, [f"user-{i}".encode() for i in range(start, min(start + 50_000, keys))])
    job = RunningJob(root, mode, factor)
    started = time.monotonic()
    wait_until(f"{keys} keys of state built", job.caught_up)
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


def stall_case(keys: int, mode: str) -> dict[str, Any]:
    with case_dir(f"stall-{keys}-{mode}") as tmp, broker():
        job, log = build_state(Path(tmp), keys, mode)
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
    return {"keys": keys, "mode": mode, "stalls": stalls, "took": took, "intervals": intervals}


def factor_case(keys: int, mode: str, low: int, high: int) -> list[dict[str, Any]]:
    rows = []
    with case_dir(f"factor-{keys}-{mode}-{low}-{high}") as tmp, broker():
        job, log = build_state(Path(tmp), keys, mode, low)
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
    parser.add_argument("--keep", type=Path, help="keep each case's files under this directory")
    parser.add_argument("--kafka", action="store_true", help="on a real Kafka broker per case")
    parser.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE", help="a containers' setting"
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
    try:
        low, high = (int(f) for f in args.factors.split(","))
    except ValueError:
        parser.error(f"--factors: expected LOW,HIGH (two integers), found {args.factors!r}")
    if high <= low:
        parser.error(f"--factors: expected LOW below HIGH, found {args.factors!r}")
    where = "a Kafka broker" if args.kafka else "the embedded log"
    print(f"bench_live: {os.cpu_count()} cores, trigger 1 s, 2 partitions of {where}", flush=True)
    if "stall" in sections:
        print(
            "\nstall of a moved task, factor 4, 2 -> 3 containers (every task moves):", flush=True
        )
        for k in keys:
            for mode in modes:
                row = stall_case(k, mode)
                if not row["stalls"]:
                    # A change past its deadline is rolled back: the old owners keep their tasks.
                    print(
                        f"  {k:>9} keys  {row['mode']:<9} no task moved: the change ended "
                        f"without new owners after {row['took']:.0f} s (rolled back?)",
                        flush=True,
                    )
                    continue
                stalls = ", ".join(f"{s:.1f}" for s in row["stalls"])
                every = row["intervals"] or [float("nan")]
                print(
                    f"  {k:>9} keys  {row['mode']:<9} stall per new owner {stalls} s "
                    f"(max {max(row['stalls']):.1f} s); change made in {row['took']:.0f} s; "
                    f"old owners' last batches every {every[0]:.1f}-{every[-1]:.1f} s",
                    flush=True,
                )
    if "factor" in sections:
        k = max(keys)
        for mode in [m for m in modes if m not in ("cold", "spark")]:
            print(f"\nlive factor change with {k} keys (2 containers, {mode}):", flush=True)
            for row in factor_case(k, mode, low, high):
                stalls = ", ".join(f"{s:.1f}" for s in row["stalls"])
                print(
                    f"  {row['change']:<12} zero output per group {stalls} s; whole job's longest "
                    f"gap {row['job_gap']:.1f} s; change made in {row['took']:.0f} s",
                    flush=True,
                )


if __name__ == "__main__":
    main()
