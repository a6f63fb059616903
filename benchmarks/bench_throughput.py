"""Throughput of a keyed running count on Kafka: Kafka Streams, plain Spark and spark-elastic.

Run: ``.venv/bin/python benchmarks/bench_throughput.py`` (``--quick`` for a smoke
run of 30,000 records, about 80 s; ``--variants elastic-1,elastic-2`` for some
of them). Needs ``make jars`` (a real Apache Kafka broker, KRaft
on loopback, started for the run and stopped by its PID; Spark's Kafka
connector) and Maven and a JDK: the Kafka Streams application
(``benchmarks/kafka_streams/ClickCounts.java``) is built on first use, its jars
fetched by ``mvn`` from ``maven/kafka-streams/pom.xml`` into
``.cache/jars/kafka-streams`` and compiled into ``build/kafka-streams``.

One input topic of ``--records`` keyed records (keys ``user-0`` ..
``user-<keys-1>``, 4 partitions, Java's partitioner) is produced once. Then
each variant, one at a time (never two at once: the machine has 2 cores),
reads the whole topic from its start and writes a running count per key to a
fresh output topic of its own (4 partitions, ``LogAppendTime``: each record is
stamped by the broker as it is appended). The benchmark reads the output as
it comes (``read_committed``), stops the variant once it is complete, and
verifies it:

- ``kstreams-eos``, ``kstreams-alos``: Kafka Streams at the broker's version
  (4.4.0, ``java -cp .cache/jars/kafka-streams/*:build/kafka-streams ClickCounts``),
  ``stream -> groupByKey -> count`` (RocksDB, the default) ``-> toStream ->
  to``, record cache off (one output per input), 2 stream threads,
  ``exactly_once_v2`` or ``at_least_once``; each key's outputs must be 1..n
  in order;
- ``spark``: plain Spark Structured Streaming in a process of its own on
  ``local[2]`` (spark-elastic's ``local_session`` settings: 4 shuffle
  partitions, RocksDB state): Spark's ``kafka`` source, ``maxOffsetsPerTrigger``
  ``--batch``, ``groupBy("key").count()`` in update mode into Spark's ``kafka``
  sink (one row per key per batch), ``Trigger.AvailableNow``; each key's last
  count must be its number of records;
- ``elastic-1``, ``elastic-2``: ``spark-elastic job run
  examples/jobs/click_counts.py:job --containers N`` (factor ``--factor``, each
  container's micro-batches of at most ``--batch`` records, the default
  ``gated`` reader, an exactly-once ``KafkaSink``: one row per record); every
  input offset must be in the output exactly once, and each user's counts
  1..n in offset order.

Per variant: records/s from its first output record to its complete output
and from its launch to its complete output (broker timestamps), launch to
first output, the CPU time of the process tree it started (utime + stime of
every process, and of the children they reaped, from ``/proc``, sampled once
the output is complete, before the stop; the broker's and this process's are
not counted), per input record over the whole run and after the first output
(start-up left out: the CPU and input records from when the first output is
read), and the median micro-batch duration (plain Spark: its progress'
``triggerExecution``; spark-elastic: each container's checkpoint, commit time
minus offset-log time of each batch; each run's line also prints every
batch, and what the coordinator's ``/status.json`` said of each container when
the output was complete). Figures are medians over ``--runs``. The load
average is printed before and after each variant. ``--keep DIR`` keeps each
variant's files there (a container's log has its start-up's steps).

The first figure leaves out the time to a variant's first output, start-up
and (Spark) its whole first micro-batch, yet counts that batch's records: a
micro-batch engine's figure is high by about one batch per query (each
container is one) in ``records / --batch`` (7% for one query at the
defaults; at ``--quick`` sizes it is meaningless for the Spark variants: each
of ``elastic-2``'s containers reads its 15,000 records in one batch). The
second counts everything, start-up included.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # kafka_jvm: the broker the specs start

TOPIC = "bench-clicks"
PARTITIONS = 4
JOB = f"{ROOT / 'examples' / 'jobs' / 'click_counts.py'}:job"
STREAMS_POM = ROOT / "maven" / "kafka-streams" / "pom.xml"
STREAMS_JARS = ROOT / ".cache" / "jars" / "kafka-streams"
STREAMS_SOURCE = ROOT / "benchmarks" / "kafka_streams" / "ClickCounts.java"
STREAMS_BUILD = ROOT / "build" / "kafka-streams"
VARIANTS = ("kstreams-eos", "kstreams-alos", "spark", "elastic-1", "elastic-2")
STOP_S = 120.0
"""How long a variant has to stop once asked (SIGTERM), before it is killed."""
CLK_TCK = os.sysconf("SC_CLK_TCK")

_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.out.ref = out
"""


class BenchError(RuntimeError):
    """Something the benchmark waited for did not happen (one line)."""


def log_tail(path: Path, lines: int = 1) -> str:
    text = path.read_text(errors="replace").strip() if path.exists() else ""
    tail = " | ".join(text.splitlines()[-lines:])
    return tail[-400:] if tail else "an empty log"


# --- building the Kafka Streams application --------------------------------------------------


def run_step(command: list[str], what: str, timeout_s: float) -> None:
    try:
        done = subprocess.run(
            command, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired as error:
        raise BenchError(f"{what} did not finish within {timeout_s:g} s") from error
    if done.returncode != 0:
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise BenchError(f"{what} failed ({done.returncode}): {tail[-400:]}")


def build_kafka_streams() -> str:
    """The Kafka Streams application's classpath, fetched and compiled when missing."""
    stamp = STREAMS_JARS / ".fetched"
    if not stamp.exists() or stamp.stat().st_mtime < STREAMS_POM.stat().st_mtime:
        if shutil.which("mvn") is None:
            raise BenchError("the Kafka Streams variants need 'mvn' (apt-get install maven)")
        shutil.rmtree(STREAMS_JARS, ignore_errors=True)
        began = time.monotonic()
        run_step(
            [
                *("mvn", "-q", "-B", "-f", str(STREAMS_POM), "dependency:copy-dependencies"),
                f"-DoutputDirectory={STREAMS_JARS}",
            ],
            "mvn dependency:copy-dependencies of maven/kafka-streams/pom.xml",
            600,
        )
        stamp.touch()
        print(f"fetched Kafka Streams' jars in {time.monotonic() - began:.0f} s", flush=True)
    compiled = STREAMS_BUILD / "ClickCounts.class"
    if not compiled.exists() or compiled.stat().st_mtime < STREAMS_SOURCE.stat().st_mtime:
        if shutil.which("javac") is None:
            raise BenchError("the Kafka Streams variants need 'javac' (a JDK 17)")
        shutil.rmtree(STREAMS_BUILD, ignore_errors=True)
        STREAMS_BUILD.mkdir(parents=True)
        run_step(
            [
                *("javac", "-Xlint:all,-path", "-Werror", "--release", "17"),
                *("-d", str(STREAMS_BUILD), "-cp", f"{STREAMS_JARS}/*", str(STREAMS_SOURCE)),
            ],
            "javac of benchmarks/kafka_streams/ClickCounts.java",
            300,
        )
    return f"{STREAMS_JARS}/*:{STREAMS_BUILD}"


# --- processes: their CPU time, and stopping them ---------------------------------------------


def _proc_stats() -> dict[int, tuple[int, int, int]]:
    """``{pid: (ppid, start time, CPU ticks)}`` of every process; CPU ticks are utime,
    stime, cutime and cstime (those of the children it reaped)."""
    stats = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            text = Path(entry.path, "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        fields = text[text.rindex(")") + 2 :].split()
        # fields[0] is field 3 of proc(5): state; ppid 4, utime 14 .. cstime 17, starttime 22
        ticks = sum(int(f) for f in fields[11:15])
        stats[int(entry.name)] = (int(fields[1]), int(fields[19]), ticks)
    return stats


@dataclass
class ProcessTree:
    """A process we started and every process under it, as seen by :meth:`sample`."""

    process: subprocess.Popen[Any]
    seen: dict[int, int] = field(default_factory=dict)
    """pid -> start time of every process of the tree seen so far (for the cleanup)."""

    def sample(self) -> float:
        """CPU seconds of the tree now (its live processes and what they reaped)."""
        stats = _proc_stats()
        children: dict[int, list[int]] = collections.defaultdict(list)
        for pid, (ppid, _, _) in stats.items():
            children[ppid].append(pid)
        total, todo = 0, [self.process.pid]
        while todo:
            pid = todo.pop()
            if pid not in stats:
                continue
            _, started, ticks = stats[pid]
            self.seen[pid] = started
            total += ticks
            todo.extend(children.get(pid, ()))
        return total / CLK_TCK

    def stop(self, timeout_s: float = STOP_S) -> None:
        """SIGTERM the process and wait up to ``timeout_s`` for it and every process of its
        tree; then SIGKILL what is left (only processes that are still those seen)."""
        deadline = time.monotonic() + timeout_s
        if self.process.poll() is None:
            self.sample()
            self.process.send_signal(signal.SIGTERM)
        while self._alive() and time.monotonic() < deadline:
            self.process.poll()  # reaps it once it exits
            time.sleep(0.2)
        left = self._alive()
        if left:
            print(f"  {len(left)} processes did not stop within {timeout_s:g} s: killed")
        for pid in left:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.process.poll() is None:
            self.process.wait(10)

    def _alive(self) -> list[int]:
        """The processes seen that still run (not zombies): the root first."""
        alive = []
        for pid, started in self.seen.items():
            try:
                text = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                continue
            fields = text[text.rindex(")") + 2 :].split()
            if int(fields[19]) == started and fields[0] != "Z":
                alive.append(pid)
        return alive


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when this process dies (Linux), so a variant
    does not outlive a benchmark killed outright."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGTERM)


def start(command: list[str], log: Path, env: dict[str, str] | None = None) -> ProcessTree:
    with log.open("wb") as out:
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )
    return ProcessTree(process)


def load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


# --- Kafka: the input, the output topics and reading them -------------------------------------


def produce(bootstrap: str, records: int, keys: int) -> collections.Counter[str]:
    """The input topic's records; returns the number of records per key."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "partitioner": "murmur2_random",  # Java's producer's partitioner
            "linger.ms": 20,
            "batch.num.messages": 10_000,
        }
    )
    counts: collections.Counter[str] = collections.Counter()
    for i in range(records):
        key = f"user-{(i * 7919) % keys}"
        counts[key] += 1
        while True:
            try:
                producer.produce(TOPIC, key=key.encode(), value=f"click-{i}".encode())
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(120) != 0:
        raise BenchError(f"the input's {records:,} records not all delivered within 120 s")
    return counts


def create_output(bootstrap: str, topic: str) -> None:
    """A topic of 4 partitions whose records the broker stamps as it appends them."""
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap})
    config = {"message.timestamp.type": "LogAppendTime"}
    for future in admin.create_topics([NewTopic(topic, PARTITIONS, 1, config=config)]).values():
        future.result(timeout=30)
    deadline = time.monotonic() + 30
    while len(getattr(admin.list_topics(topic, timeout=30).topics.get(topic), "partitions", {})) < (
        PARTITIONS
    ):
        if time.monotonic() > deadline:
            raise BenchError(f"output topic {topic!r} not listed within 30 s")
        time.sleep(0.05)


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-ends"})
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), 30, cached=False)[1]
            for p in range(PARTITIONS)
        }
    finally:
        consumer.close()


class Output:
    """A variant's output topic, read as it comes with ``read_committed``.

    ``records`` holds ``(partition, key, value, broker append time in ms)``, in each
    partition's order.
    """

    def __init__(self, bootstrap: str, topic: str, complete: Callable[[Output], bool]) -> None:
        from confluent_kafka import Consumer, TopicPartition

        self.bootstrap, self.topic, self.complete = bootstrap, topic, complete
        self.records: list[tuple[int, bytes | None, bytes | None, int]] = []
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"bench-read-{topic}",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "isolation.level": "read_committed",
            }
        )
        self.consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        self.eof: dict[int, int] = {}
        """partition -> the offset of its last end-of-partition event."""

    def poll(self, timeout_s: float) -> None:
        from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, KafkaError

        for message in self.consumer.consume(num_messages=10_000, timeout=timeout_s):
            error = message.error()
            if error is None:
                kind, stamp = message.timestamp()
                if kind != TIMESTAMP_LOG_APPEND_TIME:
                    raise BenchError(f"{self.topic!r}: a record not stamped at its append")
                partition = message.partition() or 0  # None only for errors of no partition
                self.records.append((partition, message.key(), message.value(), stamp))
            elif error.code() == KafkaError._PARTITION_EOF:
                self.eof[message.partition() or 0] = message.offset() or 0
            else:
                raise BenchError(f"reading {self.topic!r}: {error}")

    def drain(self, timeout_s: float = 60.0) -> None:
        """Read on to each partition's end as it is now (transactions open now ended)."""
        ends = end_offsets(self.bootstrap, self.topic)
        deadline = time.monotonic() + timeout_s
        while any(end > 0 and self.eof.get(p, -1) < end for p, end in ends.items()):
            if time.monotonic() > deadline:
                raise BenchError(f"output {self.topic!r} not read to its end {ends} in time")
            self.poll(0.2)

    def close(self) -> None:
        self.consumer.close()


# --- the variants -----------------------------------------------------------------------------


@dataclass
class Setup:
    bootstrap: str
    records: int
    batch: int
    factor: int
    expected: collections.Counter[str]
    ends: dict[int, int]
    work: Path
    classpath: str = ""
    deadline_s: float = 0.0
    container_conf: tuple[str, ...] = ()
    """Extra ``KEY=VALUE`` Spark settings for spark-elastic's containers (``--container-conf``)."""
    container_master: str | None = None
    """Each container's Spark master (``--container-master``; ``job run``'s default if None)."""


@dataclass
class Launched:
    """A running variant: its processes, and what to read once its output is complete."""

    tree: ProcessTree
    log: Path
    url: str = ""
    checkpoints: list[Path] = field(default_factory=list)


def count_of(value: bytes | None) -> int:
    return int.from_bytes(value or b"", "big", signed=True)


def complete_by_rows(setup: Setup) -> Callable[[Output], bool]:
    """One output per input record (Kafka Streams, spark-elastic)."""
    return lambda out: len(out.records) >= setup.records


def complete_by_counts(setup: Setup) -> Callable[[Output], bool]:
    """Every key's latest count is its number of records (plain Spark: a row per key per
    batch). Incremental: only the records not yet looked at are read."""
    latest: dict[bytes | None, int] = {}
    seen = [0]
    want = {key.encode(): n for key, n in setup.expected.items()}

    def check(out: Output) -> bool:
        for _, key, value, _ in out.records[seen[0] :]:
            latest[key] = int(value or b"0")
        seen[0] = len(out.records)
        return latest == want

    return check


def launch_kstreams(setup: Setup, name: str, out: str) -> Launched:
    guarantee = "exactly_once_v2" if name == "kstreams-eos" else "at_least_once"
    work = setup.work / f"{name}-{out}"
    work.mkdir()
    (work / "log4j2.properties").write_text(_LOG4J2)
    log = work / "streams.log"
    command = [
        str(shutil.which("java") or "java"),
        f"-Dlog4j2.configurationFile={work / 'log4j2.properties'}",
        *("-cp", setup.classpath, "ClickCounts"),
        *(setup.bootstrap, TOPIC, out, guarantee, f"bench-{out}", str(work / "state")),
    ]
    return Launched(start(command, log), log)


def verify_kstreams(setup: Setup, out: Output) -> None:
    """Each key's outputs are 1..n in order: exact, and complete."""
    per_key: dict[str, list[int]] = collections.defaultdict(list)
    for _, raw, value, _ in out.records:
        per_key[(raw or b"").decode()].append(count_of(value))
    wrong = [key for key, n in setup.expected.items() if per_key.get(key) != list(range(1, n + 1))]
    extra = set(per_key) - set(setup.expected)
    if wrong or extra:
        key = (wrong or sorted(extra))[0]
        raise BenchError(
            f"output not exact: {len(wrong)} keys' counts are not 1..n, {len(extra)} unknown "
            f"keys (e.g. {key}: {per_key.get(key, [])[:5]}... of {len(per_key.get(key, []))}, "
            f"expected {setup.expected.get(key)})"
        )


def launch_spark(setup: Setup, name: str, out: str) -> Launched:
    work = setup.work / f"{name}-{out}"
    work.mkdir()
    log = work / "query.log"
    command = [
        sys.executable,
        __file__,
        "--spark-query",
        *(setup.bootstrap, TOPIC, out, str(setup.batch), str(work / "checkpoint")),
    ]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONUNBUFFERED": "1"}
    return Launched(start(command, log, env), log)


def verify_spark(setup: Setup, out: Output) -> None:
    """Each key's counts never go down, and its last is its number of records."""
    per_key: dict[str, list[int]] = collections.defaultdict(list)
    for _, raw, value, _ in out.records:
        per_key[(raw or b"").decode()].append(int(value or b"0"))
    wrong = [
        key
        for key, n in setup.expected.items()
        if not per_key.get(key) or per_key[key][-1] != n or per_key[key] != sorted(per_key[key])
    ]
    if wrong or set(per_key) - set(setup.expected):
        key = (wrong or sorted(set(per_key) - set(setup.expected)))[0]
        raise BenchError(
            f"output not exact: {len(wrong)} keys' last counts wrong (e.g. {key}: "
            f"{per_key.get(key)}, expected {setup.expected.get(key)})"
        )


def spark_ended(launched: Launched) -> None:
    """Wait for the query process's progress lines (printed once its query ended)."""
    deadline = time.monotonic() + 120
    while "done" not in launched.log.read_text(errors="replace").splitlines():
        if launched.tree.process.poll() is not None or time.monotonic() > deadline:
            raise BenchError(
                f"the Spark query process printed no progress in 120 s ({log_tail(launched.log)})"
            )
        time.sleep(0.2)


def spark_batches(launched: Launched) -> list[float]:
    """Seconds of each micro-batch with input, from the query process's progress lines."""
    batches = []
    for line in launched.log.read_text(errors="replace").splitlines():
        if line.startswith("progress "):
            progress = json.loads(line.removeprefix("progress "))
            if progress.get("numInputRows", 0) > 0:
                batches.append(progress["durationMs"]["triggerExecution"] / 1000)
    return batches


def launch_elastic(setup: Setup, name: str, out: str) -> Launched:
    import kafka_jvm  # type: ignore[import-not-found]

    containers = int(name.removeprefix("elastic-"))
    work = setup.work / f"{name}-{out}"
    work.mkdir()
    log = work / "coordinator.log"
    env = {
        **os.environ,
        "CLICKS_KAFKA": setup.bootstrap,
        "CLICKS_TOPIC": TOPIC,
        "CLICKS_OUT_TOPIC": out,
        "CLICKS_BATCH": str(setup.batch),
        # Each batch as soon as the last ends, as Spark's default trigger and the plain
        # Spark variant run: the job's default of one a second would cap a container at
        # --batch records a second.
        "CLICKS_TRIGGER": "0 seconds",
        "CLICKS_FACTOR": str(setup.factor),
        "CLICKS_ROOT": str(work),
        "PYSPARK_PYTHON": sys.executable,
    }
    command = [
        sys.executable,
        *("-m", "spark_elastic", "job", "run", JOB),
        *("--containers", str(containers), "--port", "0"),
        *("--conf", f"spark.jars={','.join(kafka_jvm.spark_kafka_jars())}"),
        *(arg for setting in setup.container_conf for arg in ("--conf", setting)),
        *(("--master", setup.container_master) if setup.container_master else ()),
    ]
    launched = Launched(start(command, log, env), log)
    deadline = time.monotonic() + 120
    while not launched.url:
        for line in log.read_text(errors="replace").splitlines():
            if "http://127.0.0.1:" in line:
                launched.url = line[line.index("http://") :].split()[0].rstrip("/")
        if launched.tree.process.poll() is not None or time.monotonic() > deadline:
            launched.tree.stop()
            raise BenchError(f"job run printed no status URL in 120 s ({log_tail(log)})")
        time.sleep(0.1)
    return launched


def verify_elastic(setup: Setup, out: Output) -> None:
    """Every input offset once; each user's counts 1..n in offset order."""
    rows = [json.loads(value or b"{}") for _, _, value, _ in out.records]
    offsets = collections.Counter((r["partition"], r["offset"]) for r in rows)
    twice = sum(1 for n in offsets.values() if n > 1)
    missing = sum(end - sum(1 for p, _ in offsets if p == part) for part, end in setup.ends.items())
    unknown = sum(1 for p, o in offsets if not 0 <= o < setup.ends.get(p, 0))
    if twice or missing or unknown:
        raise BenchError(
            f"output not exactly once: {twice} offsets published more than once, "
            f"{missing} missing, {unknown} not in the input"
        )
    per_user: dict[str, list[tuple[int, int, int]]] = collections.defaultdict(list)
    for r in rows:
        per_user[r["user"]].append((r["partition"], r["offset"], r["clicks"]))
    wrong = [
        user
        for user, n in setup.expected.items()
        if [c for _, _, c in sorted(per_user.get(user, []))] != list(range(1, n + 1))
    ]
    if wrong or set(per_user) - set(setup.expected):
        raise BenchError(
            f"output not exact: {len(wrong)} users' counts are not 1..n in offset order "
            f"(e.g. {(wrong or ['?'])[0]})"
        )


def elastic_checkpoints(launched: Launched) -> None:
    """The containers' checkpoints, as ``/status.json`` names them."""
    with urllib.request.urlopen(f"{launched.url}/status.json", timeout=10) as response:
        status = json.loads(response.read())
    launched.checkpoints = [
        Path(c["checkpoint"]) for c in status.get("containers", []) if c.get("checkpoint")
    ]
    for c in status.get("containers", []):
        rate = c.get("recordsPerS")
        print(
            f"  status.json: {c['containerId']} {c['state']}, last batch {c.get('lastBatch')}, "
            f"{c.get('recordsProcessed', 0):,} records processed, "
            f"{'-' if rate is None else f'{rate:,.0f}'} records/s",
            flush=True,
        )


def elastic_batches(launched: Launched) -> list[float]:
    """Seconds of each micro-batch of every container: its commit's time minus its offset
    log entry's, from the containers' checkpoints (read once they stopped)."""
    batches = []
    for checkpoint in launched.checkpoints:
        commits = sorted((checkpoint / "commits").glob("[0-9]*"), key=lambda p: int(p.name))
        for commit in commits:
            offsets = checkpoint / "offsets" / commit.name
            if offsets.exists():
                batches.append(commit.stat().st_mtime - offsets.stat().st_mtime)
    return batches


@dataclass(frozen=True)
class Variant:
    launch: Callable[[Setup, str, str], Launched]
    complete: Callable[[Setup], Callable[[Output], bool]]
    verify: Callable[[Setup, Output], None]
    at_complete: Callable[[Launched], None] | None = None
    """What to read once the output is complete, before the stop."""
    batches: Callable[[Launched], list[float]] | None = None
    """Micro-batch durations in seconds, read after the stop."""


KINDS = {
    "kstreams": Variant(launch_kstreams, complete_by_rows, verify_kstreams),
    "spark": Variant(launch_spark, complete_by_counts, verify_spark, spark_ended, spark_batches),
    "elastic": Variant(
        launch_elastic, complete_by_rows, verify_elastic, elastic_checkpoints, elastic_batches
    ),
}


def covered(output: Output, per_key: bool) -> int:
    """Input records the output read so far answers for: one per output record, or (a
    count per key per batch) each key's latest count."""
    if not per_key:
        return len(output.records)
    latest: dict[bytes | None, int] = {}
    for _, key, value, _ in output.records:
        latest[key] = int(value or b"0")
    return sum(latest.values())


def wait_complete(
    setup: Setup, name: str, variant: Variant, launched: Launched, output: Output
) -> tuple[float, float, int]:
    """Read the output until it is complete; the tree's CPU seconds then, and at the first
    output (with the input records that output answers for)."""
    deadline = time.monotonic() + setup.deadline_s
    sampled = time.monotonic()
    first: tuple[float, int] | None = None
    while not output.complete(output):
        if first is None and output.records:
            first = (launched.tree.sample(), covered(output, name == "spark"))
        if launched.tree.process.poll() is not None:
            raise BenchError(
                f"{name} exited ({launched.tree.process.returncode}) before its output was "
                f"complete, {len(output.records):,} records in ({log_tail(launched.log)})"
            )
        if time.monotonic() > deadline:
            raise BenchError(
                f"{name}'s output not complete within {setup.deadline_s:.0f} s: "
                f"{len(output.records):,} records in ({log_tail(launched.log)})"
            )
        output.poll(0.5)
        if time.monotonic() - sampled > 2:
            launched.tree.sample()  # every process of the tree, for the cleanup
            sampled = time.monotonic()
    cpu_s = launched.tree.sample()
    if first is None:  # complete at its first read
        first = (cpu_s, setup.records)
    if variant.at_complete is not None:
        variant.at_complete(launched)
    return cpu_s, first[0], first[1]


def run_variant(setup: Setup, name: str, run: int) -> dict[str, float]:
    variant = KINDS[name.split("-")[0]]
    out_topic = f"out-{name}-{run}-{uuid.uuid4().hex[:6]}"
    create_output(setup.bootstrap, out_topic)
    output = Output(setup.bootstrap, out_topic, variant.complete(setup))
    print(f"run {run + 1} {name}: load average before {load()}", flush=True)
    try:
        launched_at = time.time()
        launched = variant.launch(setup, name, out_topic)
        try:
            cpu_s, first_cpu_s, first_covered = wait_complete(
                setup, name, variant, launched, output
            )
        finally:
            launched.tree.stop()
        output.drain()
        batches = variant.batches(launched) if variant.batches else []
    finally:
        output.close()
    variant.verify(setup, output)
    stamps = [stamp for *_, stamp in output.records]
    first, last = min(stamps) / 1000, max(stamps) / 1000
    result = {
        "output_rate": setup.records / (last - first) if last > first else float("nan"),
        "launch_rate": setup.records / (last - launched_at),
        "first_s": first - launched_at,
        "complete_s": last - launched_at,
        "cpu_s": cpu_s,
        "cpu_us": cpu_s / setup.records * 1e6,
        # After the first output: start-up (a JVM compiling, a session, workers) left out.
        "steady_us": (
            (cpu_s - first_cpu_s) / (setup.records - first_covered) * 1e6
            if setup.records > first_covered
            else float("nan")
        ),
        "batch_s": statistics.median(batches) if batches else float("nan"),
        "batches": len(batches),
        "output_records": len(output.records),
    }
    median_batch = f"{result['batch_s']:.2f} s of {len(batches)}" if batches else "-"
    if batches:
        print(f"  micro-batches (s): {', '.join(f'{b:.2f}' for b in batches)}", flush=True)
    print(
        f"run {run + 1} {name}: {result['output_rate']:,.0f} records/s first to complete output "
        f"({result['launch_rate']:,.0f} from launch), first output {result['first_s']:.1f} s "
        f"after launch, complete at {result['complete_s']:.1f} s, CPU {cpu_s:.1f} s "
        f"({result['cpu_us']:.0f} us a record; {result['steady_us']:.0f} after the first "
        f"output), {len(output.records):,} output records, "
        f"median micro-batch {median_batch}; verified; "
        f"load average after {load()}",
        flush=True,
    )
    return result


# --- plain Spark's query, in a process of its own ---------------------------------------------


def spark_query(argv: Sequence[str]) -> int:
    """``--spark-query BOOTSTRAP INPUT OUTPUT BATCH CHECKPOINT``: the plain Spark variant.

    Prints each micro-batch's progress as a JSON line once the query has ended, then
    ``done``, then waits to be stopped (SIGTERM), so its CPU time can be read.
    """
    bootstrap, source, sink, batch, checkpoint = argv
    import kafka_jvm

    from spark_elastic.dataplane.session import local_session

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    spark = local_session(
        "bench-throughput-spark", conf={"spark.jars": ",".join(kafka_jvm.spark_kafka_jars())}
    )
    try:
        from pyspark.sql import functions as F

        counts = (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", source)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", batch)
            .load()
            .groupBy("key")
            .count()
            .select("key", F.col("count").cast("string").alias("value"))
        )
        query = (
            counts.writeStream.outputMode("update")
            .format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("topic", sink)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        for progress in query.recentProgress:
            text = getattr(progress, "json", None)
            document = json.loads(text) if isinstance(text, str) else dict(progress)
            print("progress " + json.dumps(document), flush=True)
        print("done", flush=True)
        while True:
            time.sleep(3600)
    finally:
        spark.stop()


# --- the run ----------------------------------------------------------------------------------


COLUMNS = (
    ("records/s, first to complete output", "output_rate", "{:,.0f}"),
    ("records/s, launch to complete output", "launch_rate", "{:,.0f}"),
    ("launch to first output (s)", "first_s", "{:.1f}"),
    ("CPU (s)", "cpu_s", "{:.1f}"),
    ("CPU per record (us)", "cpu_us", "{:.0f}"),
    ("CPU per record after the first output (us)", "steady_us", "{:.0f}"),
    ("median micro-batch (s)", "batch_s", "{:.2f}"),
)


def table(results: dict[str, list[dict[str, float]]]) -> str:
    lines = [
        "| variant | " + " | ".join(title for title, _, _ in COLUMNS) + " |",
        "|---|" + "---:|" * len(COLUMNS),
    ]
    for name, runs in results.items():
        cells = []
        for _, key, form in COLUMNS:
            value = statistics.median(r[key] for r in runs)
            cells.append("-" if value != value else form.format(value))  # NaN: not measured
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--spark-query":
        return spark_query(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--batch", type=int, default=20_000, help="records a micro-batch")
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}"
    )
    parser.add_argument("--factor", type=int, default=4, help="spark-elastic's elasticity factor")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="30,000 records")
    parser.add_argument(
        "--container-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting for spark-elastic's containers (repeatable), e.g. JVM options",
    )
    parser.add_argument(
        "--container-master",
        metavar="URL",
        help="each spark-elastic container's Spark master (default: job run's, local[2])",
    )
    parser.add_argument(
        "--keep",
        metavar="DIR",
        help="keep each variant's files and logs in DIR (a new directory), not a temporary one",
    )
    args = parser.parse_args()
    if args.keep and Path(args.keep).exists():
        parser.error(f"--keep: expected a directory that does not exist yet, found {args.keep!r}")
    if args.quick:
        args.records = 30_000
    names = [name.strip() for name in args.variants.split(",") if name.strip()]
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}: choose from {', '.join(VARIANTS)}")
    bad = [c for c in args.container_conf if "=" not in c or c.startswith("=")]
    if bad:
        parser.error(f"--container-conf: expected KEY=VALUE, found {bad[0]!r}")

    import kafka_jvm

    began = time.monotonic()
    try:
        classpath = build_kafka_streams() if any(n.startswith("kstreams") for n in names) else ""
        with ExitStack() as stack:
            if args.keep:
                work = Path(args.keep)
                work.mkdir(parents=True)
            else:
                work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-tput-")))
            broker = stack.enter_context(kafka_jvm.running_kafka())
            kafka_jvm.create_topics(broker.bootstrap, {TOPIC: PARTITIONS})
            produced = time.monotonic()
            expected = produce(broker.bootstrap, args.records, args.keys)
            ends = end_offsets(broker.bootstrap, TOPIC)
            print(
                f"Kafka {kafka_jvm.kafka_version()} on {broker.bootstrap}; produced "
                f"{args.records:,} records of {len(expected):,} keys to {PARTITIONS} partitions "
                f"({', '.join(str(e) for e in ends.values())}) in "
                f"{time.monotonic() - produced:.1f} s",
                flush=True,
            )
            setup = Setup(
                broker.bootstrap,
                args.records,
                args.batch,
                args.factor,
                expected,
                ends,
                work,
                classpath,
                deadline_s=300 + args.records / 200,
                container_conf=tuple(args.container_conf),
                container_master=args.container_master,
            )
            results: dict[str, list[dict[str, float]]] = {}
            for run in range(args.runs):
                for name in names:
                    results.setdefault(name, []).append(run_variant(setup, name, run))
    except (BenchError, kafka_jvm.KafkaJvmError) as error:
        print(f"bench_throughput: {error}", file=sys.stderr)
        return 1
    print(
        f"\n{args.records:,} records of {args.keys:,} keys, {PARTITIONS} partitions, "
        f"micro-batches of {args.batch:,} records, spark-elastic at factor {args.factor}; "
        f"median of {args.runs} run(s); {time.monotonic() - began:.0f} s in all\n"
    )
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
