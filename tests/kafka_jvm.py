"""An Apache Kafka broker from the jars ``make jars`` fetches, for specs and ``make kafka``.

One JVM is a combined broker and controller in KRaft mode, listening on
127.0.0.1 only, with its log directory in a temporary folder that is removed
when it stops. :func:`running_kafka` formats the directory with Kafka's
``StorageTool``, starts ``kafka.Kafka``, waits until librdkafka's AdminClient
lists topics, and stops the broker by its PID at exit, whatever happened.

Lives in ``tests/`` beside the other brokers the specs start (conftest puts
this folder on ``sys.path``); ``python tests/kafka_jvm.py`` is ``make kafka``.
It imports nothing from spark_elastic and needs only confluent-kafka.
"""

from __future__ import annotations

import argparse
import base64
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
JARS = ROOT / ".cache" / "jars"
KAFKA_JARS = JARS / "kafka"
"""The broker's classpath: maven/kafka/pom.xml's dependencies."""
SPARK_KAFKA_JARS = JARS / "spark-kafka"
"""Spark's Kafka connector without what pyspark ships: maven/spark-kafka/pom.xml's."""

HEAP = "-Xmx512m"
JAVA_OPTIONS = (HEAP, "-Xms128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto")
"""A small broker that mostly starts up and serves a few records: the serial collector
and the C1 compiler alone spend less of the two cores on it."""

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
# Another process may take the free port between our probe and the broker's bind; the
# broker then exits at once and the next attempt picks other ports.
_ATTEMPTS = 3


class KafkaJvmError(RuntimeError):
    """The broker cannot start: no Java, no jars, or it did not come up (one line)."""


@dataclass(frozen=True)
class KafkaBroker:
    """A running broker: where clients connect, its process and its files."""

    bootstrap: str
    pid: int
    """The first process's; after :meth:`restart`, :attr:`current_pid` is the live one."""
    workdir: Path
    log: Path
    started_in_s: float
    """From the first JVM (format) to the first topic listing answered."""
    client_options: dict[str, str] = field(default_factory=dict)
    """librdkafka settings a client needs (SASL for a broker with users); empty otherwise."""
    _processes: list[subprocess.Popen[bytes]] = field(
        default_factory=list, compare=False, repr=False
    )
    _start: Callable[[], subprocess.Popen[bytes]] | None = field(
        default=None, compare=False, repr=False
    )

    @property
    def current_pid(self) -> int:
        return self._processes[-1].pid if self._processes else self.pid

    def kill(self) -> None:
        """SIGKILL the broker, as a crash would: its files stay, nothing is flushed."""
        process = self._processes[-1]
        os.kill(process.pid, signal.SIGKILL)
        process.wait(STOP_TIMEOUT_S)

    def restart(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start it again on the same ports and files; return once it answers."""
        assert self._start is not None, "a broker from running_kafka restarts"
        process = self._start()
        self._processes.append(process)
        deadline = time.monotonic() + timeout_s
        while not _lists_topics(self.bootstrap, self.client_options):
            if process.poll() is not None or time.monotonic() > deadline:
                state = "did not answer" if process.poll() is None else "exited"
                raise KafkaJvmError(f"the restarted broker {state} ({_reason(self.log)})")
            time.sleep(0.2)


def java() -> str:
    """``$JAVA_HOME/bin/java`` or ``java`` on PATH; a one-line error when there is none."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "java"), os.X_OK):
        return os.path.join(home, "bin", "java")
    found = shutil.which("java")
    if found is None:
        raise KafkaJvmError(
            "the Kafka broker needs Java 17 and no 'java' was found (JAVA_HOME unset or "
            "wrong, none on PATH): install a JDK 17, e.g. 'apt-get install openjdk-17-jdk-headless'"
        )
    return found


def kafka_jars() -> Path:
    """The broker's jar folder; a one-line error naming ``make jars`` when it is missing."""
    if not any(KAFKA_JARS.glob("kafka_2.13-*.jar")):
        raise KafkaJvmError(f"no Kafka broker jars in {KAFKA_JARS}: run 'make jars' (needs mvn)")
    return KAFKA_JARS


def spark_kafka_jars() -> list[str]:
    """The connector's jars for ``spark.jars``; a one-line error when they are missing."""
    jars = sorted(str(p) for p in SPARK_KAFKA_JARS.glob("*.jar"))
    if not any("spark-sql-kafka" in Path(p).name for p in jars):
        raise KafkaJvmError(
            f"no Spark Kafka connector jars in {SPARK_KAFKA_JARS}: run 'make jars' (needs mvn)"
        )
    return jars


def kafka_version() -> str:
    """The version of the cached broker jars, e.g. ``4.4.0``."""
    jar = next(kafka_jars().glob("kafka_2.13-*.jar"))
    return jar.stem.removeprefix("kafka_2.13-")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def _listening(port: int, host: str = "127.0.0.1") -> bool:
    try:
        socket.create_connection((host, port), timeout=1).close()
    except OSError:
        return False
    return True


def cluster_id() -> str:
    """A random Kafka ``Uuid`` as its tools print it: URL-safe base64 of 16 bytes, no padding.

    Like Kafka's ``Uuid.randomUuid``, never one starting with ``-`` (a command line would
    read it as an option).
    """
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def server_properties(
    workdir: Path,
    port: int,
    controller_port: int,
    users: dict[str, str] | None = None,
    internal_port: int = 0,
    host: str = "127.0.0.1",
) -> str:
    """A combined broker and controller, node 1, alone in its quorum, on ``host``.

    With ``users`` (``{name: password}``), clients connect with SASL/PLAIN on
    ``port`` and the broker talks to itself on ``internal_port`` in plain text.
    """
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1",
        # Kafka 4's dynamic quorum (KIP-853), as its own config/server.properties: the
        # controller finds the quorum here, and `format --standalone` makes it the voter.
        "controller.quorum.bootstrap.servers": f"{host}:{controller_port}",
        "controller.listener.names": "CONTROLLER",
        "listeners": f"PLAINTEXT://{host}:{port},CONTROLLER://{host}:{controller_port}",
        "advertised.listeners": (
            f"PLAINTEXT://{host}:{port},CONTROLLER://{host}:{controller_port}"
        ),
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(workdir / "data"),
        "num.partitions": "1",
        "auto.create.topics.enable": "false",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        # No time-based retention: the specs produce records stamped in 2023 (fixed, so
        # outputs compare), and the default 7 days, checked every 5 minutes, deleted every
        # such record of every topic at once, moving each partition's earliest offset to its
        # end (stop 36's CI: a spec's query then started at the end and read nothing).
        "log.retention.ms": "-1",
    }
    if users:
        accounts = " ".join(f'user_{name}="{password}"' for name, password in users.items())
        settings.update(
            {
                "listeners": f"SASL_PLAINTEXT://{host}:{port},"
                f"INTERNAL://{host}:{internal_port},CONTROLLER://{host}:{controller_port}",
                "advertised.listeners": f"SASL_PLAINTEXT://{host}:{port},"
                f"INTERNAL://{host}:{internal_port},CONTROLLER://{host}:{controller_port}",
                "inter.broker.listener.name": "INTERNAL",
                "listener.security.protocol.map": (
                    "CONTROLLER:PLAINTEXT,INTERNAL:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT"
                ),
                "sasl.enabled.mechanisms": "PLAIN",
                "listener.name.sasl_plaintext.plain.sasl.jaas.config": (
                    f"org.apache.kafka.common.security.plain.PlainLoginModule required {accounts};"
                ),
            }
        )
    return "".join(f"{key}={value}\n" for key, value in settings.items())


_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.out.ref = out
logger.server.name = kafka.server.KafkaRaftServer
logger.server.level = INFO
"""


def _jvm(workdir: Path, *main: str) -> list[str]:
    return [
        java(),
        *JAVA_OPTIONS,
        f"-Dlog4j2.configurationFile={workdir / 'log4j2.properties'}",
        "-cp",
        str(kafka_jars() / "*"),
        *main,
    ]


def _format(workdir: Path, properties: Path) -> None:
    result = subprocess.run(
        _jvm(
            workdir,
            "kafka.tools.StorageTool",
            "format",
            "-t",
            cluster_id(),
            "-c",
            str(properties),
            "--standalone",
        ),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
        check=False,
    )
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:]
        raise KafkaJvmError(f"kafka.tools.StorageTool format failed: {' '.join(tail)}")


def sasl_options(user: str, password: str) -> dict[str, str]:
    """librdkafka's settings for a SASL/PLAIN client (``kafka_options``, ``admin_options``)."""
    return {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": user,
        "sasl.password": password,
    }


def _lists_topics(bootstrap: str, options: dict[str, str]) -> bool:
    from confluent_kafka.admin import AdminClient

    # log_level 0: no "Connection refused" lines on stderr while the broker starts.
    admin = AdminClient({**options, "bootstrap.servers": bootstrap, "log_level": 0})
    try:
        admin.list_topics(timeout=1)
    except Exception:  # KafkaException: no broker yet
        return False
    return True


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when the process that started it dies (Linux)."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGTERM)


def stop(pid: int, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM the broker (a clean shutdown), SIGKILL it after ``timeout_s``; wait for it."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _reaped(pid):
            return
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    while not _reaped(pid):
        time.sleep(0.05)


def _reaped(pid: int) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # not our child, or already reaped
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False
    return done == pid


def create_topics(
    bootstrap: str,
    partitions: dict[str, int],
    timeout_s: float = 30.0,
    options: dict[str, str] | None = None,
) -> None:
    """Create ``{topic: partition count}`` on the broker at ``bootstrap`` (replication 1).

    Returns once the broker's metadata lists every partition: the controller
    answers CreateTopics first, and for a moment after it the broker still
    says the topic does not exist.
    """
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({**(options or {}), "bootstrap.servers": bootstrap})
    topics = [NewTopic(topic, count, 1) for topic, count in partitions.items()]
    for future in admin.create_topics(topics, request_timeout=timeout_s).values():
        future.result(timeout=timeout_s)
    deadline = time.monotonic() + timeout_s
    while True:
        listed = admin.list_topics(timeout=timeout_s).topics
        if all(
            topic in listed and len(listed[topic].partitions) == count
            for topic, count in partitions.items()
        ):
            return
        if time.monotonic() > deadline:
            raise KafkaJvmError(f"topics {sorted(partitions)} not listed within {timeout_s:g} s")
        time.sleep(0.05)


def describe_group(bootstrap: str, group: str) -> dict[tuple[str, int], tuple[int, int]]:
    """Kafka's own ``kafka-consumer-groups --describe``: ``{(topic, partition): (offset, end)}``.

    Runs ``ConsumerGroupCommand`` from the broker's jars, as an operator would;
    a partition the group has no offset for is left out.
    """
    result = subprocess.run(
        [
            java(),
            "-Xmx128m",
            "-XX:TieredStopAtLevel=1",
            "-cp",
            str(kafka_jars() / "*"),
            "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
            *("--bootstrap-server", bootstrap, "--describe", "--group", group),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        raise KafkaJvmError(f"kafka-consumer-groups failed: {result.stderr.strip()[-300:]}")
    rows = {}
    for line in result.stdout.splitlines():
        fields = line.split()
        # GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG CONSUMER-ID HOST CLIENT-ID
        if len(fields) >= 6 and fields[0] == group and fields[2].isdigit() and fields[3].isdigit():
            rows[fields[1], int(fields[2])] = (int(fields[3]), int(fields[4]))
    return rows


def read_to_end(
    bootstrap: str, topic: str, isolation: str = "read_committed", timeout_s: float = 60.0
) -> list[bytes | None]:
    """The values of every record of ``topic`` a consumer with ``isolation`` reads, to the end.

    The end is each partition's high watermark when the call starts; a
    ``read_committed`` consumer reaches it once the transactions open then
    have ended (librdkafka says so with a partition EOF at or past it).
    """
    from confluent_kafka import Consumer, KafkaError, TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    count = len(admin.list_topics(topic, timeout=timeout_s).topics[topic].partitions)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"read-to-end-{topic}-{isolation}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": isolation,
        }
    )
    values: list[bytes | None] = []
    try:
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout_s, cached=False)[1]
            for p in range(count)
        }
        waiting = {p for p, end in ends.items() if end > 0}
        consumer.assign([TopicPartition(topic, p, 0) for p in sorted(waiting)])
        deadline = time.monotonic() + timeout_s
        while waiting:
            if time.monotonic() > deadline:
                raise KafkaJvmError(f"{topic!r} not read to {ends} within {timeout_s:g} s")
            for message in consumer.consume(num_messages=5000, timeout=0.2):
                error = message.error()
                if error is None:
                    values.append(message.value())
                elif (
                    error.code() == KafkaError._PARTITION_EOF
                    and message.offset() >= ends[message.partition()]
                ):
                    waiting.discard(message.partition())
    finally:
        consumer.close()
    return values


def rss_mib(pid: int) -> float:
    """The resident set size of a process, in MiB (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise KafkaJvmError(f"no VmRSS for PID {pid}")


@contextmanager
def running_kafka(
    port: int = 0,
    timeout_s: float = START_TIMEOUT_S,
    users: dict[str, str] | None = None,
    host: str = "127.0.0.1",
) -> Iterator[KafkaBroker]:
    """Start a broker, yield it once it answers, stop it by PID and delete its files at exit.

    Parameters
    ----------
    port
        The client port on ``host``; 0 picks a free one (and retries on a lost race).
    timeout_s
        The deadline of each attempt, from format to the first topic listing.
    users
        ``{name: password}``: clients authenticate with SASL/PLAIN (see
        :func:`server_properties`); the broker's ``client_options`` are the
        first user's.
    host
        The address it listens on and advertises (a bridge's, for containers on
        hosts of their own).

    Raises
    ------
    KafkaJvmError
        No Java, no jars, or no broker within the deadline (one line naming its log).
    """
    kafka_jars()
    java()
    if port and _listening(port, host):
        raise KafkaJvmError(
            f"{host}:{port} is taken (another broker?): pick another port, or 0 for a free one"
        )
    failures: list[str] = []
    for attempt in range(_ATTEMPTS if port == 0 else 1):
        workdir = Path(tempfile.mkdtemp(prefix="spark-elastic-kafka-"))
        processes: list[subprocess.Popen[bytes]] = []
        try:
            client_port = port or free_port(host)
            controller_port = free_port(host)
            bootstrap = f"{host}:{client_port}"
            properties = workdir / "server.properties"
            properties.write_text(
                server_properties(
                    workdir, client_port, controller_port, users, free_port(host), host
                )
            )
            options = sasl_options(*next(iter(users.items()))) if users else {}
            (workdir / "log4j2.properties").write_text(_LOG4J2)
            log = workdir / "server.log"
            began = time.monotonic()
            _format(workdir, properties)

            def start(workdir: Path = workdir, properties: Path = properties) -> Any:
                with (workdir / "server.log").open("ab") as out:
                    return subprocess.Popen(
                        _jvm(workdir, "kafka.Kafka", str(properties)),
                        cwd=workdir,
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        # Its own session: a Ctrl-C meant for us does not reach it half-way;
                        # we stop it by PID. If we are killed outright, the kernel stops it.
                        start_new_session=True,
                        preexec_fn=_die_with_parent,
                    )

            process = start()
            processes = [process]
            deadline = began + timeout_s
            while process.poll() is None and time.monotonic() < deadline:
                if _lists_topics(bootstrap, options):
                    yield KafkaBroker(
                        bootstrap,
                        process.pid,
                        workdir,
                        log,
                        time.monotonic() - began,
                        options,
                        processes,
                        start,
                    )
                    return
                time.sleep(0.2)
            state = "did not answer" if process.poll() is None else f"exited {process.returncode}"
            failures.append(f"attempt {attempt + 1}: {state} ({_reason(log)})")
        finally:
            for started in processes:
                if started.poll() is None:
                    stop(started.pid)
                started.wait()
            shutil.rmtree(workdir, ignore_errors=True)
    raise KafkaJvmError(f"no Kafka broker on {host}: {'; '.join(failures)}")


def _reason(log: Path) -> str:
    """The broker log's first exception with a message, else its first error, else its end."""
    lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
    for marker in ("Exception: ", "ERROR "):
        found = next((line for line in lines if marker in line), None)
        if found is not None:
            return found.strip()[:300]
    return lines[-1][:300] if lines else "an empty log"


def main(argv: list[str] | None = None) -> int:
    """``make kafka``: run a broker until Ctrl-C."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=9092, help="client port; 0 = a free one")
    args = parser.parse_args(argv)
    # Ctrl-C, or a plain `kill`, stops the broker and removes its files (also when started
    # from a shell that ignores SIGINT in background jobs).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        with running_kafka(args.port) as broker:
            print(
                f"Kafka {kafka_version()} (KRaft, broker+controller) listening on "
                f"{broker.bootstrap}, started in {broker.started_in_s:.1f} s, PID {broker.pid}, "
                f"log {broker.log}; Ctrl-C stops it",
                flush=True,
            )
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                print("stopping the broker", flush=True)
    except KafkaJvmError as error:
        print(f"spark-elastic: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
