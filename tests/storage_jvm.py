"""A real HDFS and a real S3 server from the jars ``make jars`` fetches, for the specs.

:func:`running_hdfs` starts Hadoop's ``MiniDFSClusterManager`` (one NameNode and
one DataNode in one JVM, the Hadoop pyspark ships) and :func:`running_s3` starts
s3proxy (the S3 REST protocol over a directory, conditional writes kept
atomically), each on 127.0.0.1 with its files in a temporary folder. Each waits
until the server answers, yields where clients reach it and the Hadoop settings
that reach it, and stops it by its PID at exit, whatever happened.

Lives in ``tests/`` beside :mod:`kafka_jvm`, whose process helpers it shares;
``python tests/storage_jvm.py hdfs|s3`` runs one for trying the project.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kafka_jvm import JARS, _die_with_parent, free_port, java, stop

HDFS_JARS = JARS / "hdfs"
"""The MiniDFSCluster's classpath: maven/hdfs/pom.xml's dependencies."""
S3PROXY_JARS = JARS / "s3proxy"
"""s3proxy's jar with its dependencies: maven/s3proxy/pom.xml."""
S3A_JARS = JARS / "s3a"
"""Hadoop's S3A client for a session's spark.jars: maven/s3a/pom.xml's dependencies."""

START_TIMEOUT_S = 90.0
JAVA_OPTIONS = ("-Xms64m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto")
"""Small servers that mostly start and serve a few files: the serial collector and the C1
compiler alone spend less of the two cores on them."""

S3_ACCESS_KEY = "spark-elastic"
S3_SECRET_KEY = "spark-elastic-secret"
S3_BUCKET = "jobs"
"""The bucket :func:`running_s3` creates; ``s3a://jobs/...`` paths go to that server."""


class StorageJvmError(RuntimeError):
    """A server cannot start: no Java, no jars, or it did not come up (one line)."""


@dataclass(frozen=True)
class StorageServer:
    """A running file server: the URI of its root, the Hadoop settings that reach it."""

    uri: str
    """``hdfs://127.0.0.1:PORT`` or ``s3a://jobs``: paths under it go to this server."""
    pid: int
    workdir: Path
    log: Path
    hadoop: dict[str, str] = field(default_factory=dict)
    """Hadoop settings for clients (``spark.hadoop.`` + key in a Spark conf)."""
    started_in_s: float = 0.0

    def reach_from(self, spark: Any) -> None:
        """Point a running session's Hadoop at this server (what ``spark.hadoop.*`` does at
        start)."""
        conf = spark._jsc.hadoopConfiguration()
        for key, value in self.hadoop.items():
            conf.set(key, value)

    def spark_conf(self) -> dict[str, str]:
        """The settings as a Spark conf: ``{"spark.hadoop.KEY": value}``."""
        return {f"spark.hadoop.{key}": value for key, value in self.hadoop.items()}


def _jars(folder: Path, what: str) -> list[Path]:
    jars = sorted(folder.glob("*.jar"))
    if not jars:
        raise StorageJvmError(f"{folder}: no {what} jars; run 'make jars' to fetch them")
    return jars


def s3a_jars() -> list[str]:
    """The S3A client's jars for ``spark.jars`` (``make jars`` fetches them)."""
    return [str(p) for p in _jars(S3A_JARS, "S3A client")]


CLOUD = "SPARK_ELASTIC_CLOUD"
"""Opt-in: the root URI of a real object store for the specs (``s3a://``, ``gs://``, ``abfss://``)."""
CLOUD_CONF = "SPARK_ELASTIC_CLOUD_CONF"
"""Hadoop settings reaching it, whitespace-separated ``KEY=VALUE`` (credentials may instead
come from the environment, as each connector reads them: ``AWS_ACCESS_KEY_ID``...)."""
CLOUD_JARS = "SPARK_ELASTIC_CLOUD_JARS"
"""Comma-separated jars of its connector, when pyspark and .cache/jars/s3a lack it (GCS, ABFS)."""


def cloud_from_env(environ: dict[str, str]) -> StorageServer | None:
    """The real object store the environment names (:data:`CLOUD`), or None.

    Nothing is started or stopped (``pid`` is 0); each spec works under a
    fresh directory of the root and deletes it.
    """
    uri = environ.get(CLOUD, "").rstrip("/")
    if not uri:
        return None
    if "://" not in uri:
        raise StorageJvmError(f"{CLOUD}: expected a URI such as s3a://bucket/prefix, found {uri!r}")
    hadoop = {}
    for item in environ.get(CLOUD_CONF, "").split():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise StorageJvmError(f"{CLOUD_CONF}: expected KEY=VALUE items, found {item!r}")
        hadoop[key] = value
    return StorageServer(uri, 0, Path(), Path(), hadoop)


def cloud_jars(environ: dict[str, str]) -> list[str]:
    """The jars :data:`CLOUD_JARS` names (checked to exist)."""
    jars = [j for j in environ.get(CLOUD_JARS, "").split(",") if j]
    missing = [j for j in jars if not Path(j).is_file()]
    if missing:
        raise StorageJvmError(f"{CLOUD_JARS}: expected jar files, found {missing} missing")
    return jars


def _spawn(command: list[str], workdir: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            command,
            cwd=workdir,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            # Its own session, so a Ctrl-C meant for us does not reach it half-way; we stop
            # it by PID, and if we are killed outright the kernel stops it.
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )


def _tail(log: Path) -> str:
    lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
    errors = [line for line in lines if "Exception" in line or "ERROR" in line]
    return (errors or lines or ["no output"])[0][:300]


@contextmanager
def _serving(
    name: str, command: list[str], workdir: Path, ready: object, timeout_s: float
) -> Iterator[tuple[subprocess.Popen[bytes], float]]:
    log = workdir / "server.log"
    began = time.monotonic()
    process = _spawn(command, workdir, log)
    try:
        deadline = began + timeout_s
        while process.poll() is None and time.monotonic() < deadline:
            if ready():  # type: ignore[operator]
                yield process, time.monotonic() - began
                return
            time.sleep(0.2)
        state = "did not answer" if process.poll() is None else f"exited {process.returncode}"
        raise StorageJvmError(
            f"no {name} on 127.0.0.1 within {timeout_s:.0f} s: {state} ({_tail(log)}; log {log})"
        )
    finally:
        if process.poll() is None:
            stop(process.pid)
        process.wait()


@contextmanager
def running_hdfs(timeout_s: float = START_TIMEOUT_S) -> Iterator[StorageServer]:
    """A MiniDFSCluster (one NameNode, one DataNode) on a free port; stopped by PID at exit.

    Raises
    ------
    StorageJvmError
        No Java, no jars, or no NameNode within ``timeout_s`` (one line naming its log).
    """
    jars = _jars(HDFS_JARS, "MiniDFSCluster")
    workdir = Path(tempfile.mkdtemp(prefix="spark-elastic-hdfs-"))
    details = workdir / "details.json"
    command = [
        java(),
        "-Xmx384m",
        *JAVA_OPTIONS,
        "-cp",
        ":".join(str(j) for j in jars),
        f"-Dtest.build.data={workdir / 'data'}",
        "org.apache.hadoop.test.MiniDFSClusterManager",
        "-format",
        "-nnport",
        "0",
        "-httpport",
        "0",
        "-writeDetails",
        str(details),
        # One DataNode: one replica, and no waiting for others that never come.
        "-D",
        "dfs.replication=1",
    ]
    try:
        with _serving(
            "NameNode",
            command,
            workdir,
            lambda: details.exists() and details.stat().st_size,
            timeout_s,
        ) as (process, took):
            port = json.loads(details.read_text())["namenode_port"]
            yield StorageServer(
                f"hdfs://127.0.0.1:{port}",
                process.pid,
                workdir,
                workdir / "server.log",
                {
                    "dfs.replication": "1",
                    # A client closing a file asks the NameNode to complete it, and sleeps
                    # 400 ms before asking again if the DataNode has not reported the block
                    # yet: most closes here, 0.2-0.3 s a file instead of 0.03 (measured in
                    # session 32). A client setting; docs/stateful.md recommends it.
                    "dfs.client.block.write.locateFollowingBlock.initial.delay.ms": "20",
                },
                took,
            )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except urllib.error.HTTPError:
        return True  # an S3 error document: it is up
    except OSError:
        return False


@contextmanager
def running_s3(
    timeout_s: float = START_TIMEOUT_S, host: str = "127.0.0.1", bucket: str = S3_BUCKET
) -> Iterator[StorageServer]:
    """s3proxy on a free port of ``host`` (a bridge's address, for containers on hosts of
    their own) over a temporary directory, with ``bucket``.

    A second server in one test session needs a bucket of its own: Hadoop caches a
    FileSystem per bucket, so a session that reached the first server's ``jobs`` would
    go on reaching it there.

    Raises
    ------
    StorageJvmError
        No Java, no jar, or no server within ``timeout_s`` (one line naming its log).
    """
    jar = _jars(S3PROXY_JARS, "s3proxy")[0]
    workdir = Path(tempfile.mkdtemp(prefix="spark-elastic-s3-"))
    store = workdir / "store"
    (store / bucket).mkdir(parents=True)  # the filesystem store's bucket is a directory
    port = free_port(host)
    endpoint = f"http://{host}:{port}"
    (workdir / "s3proxy.conf").write_text(
        f"s3proxy.endpoint={endpoint}\n"
        "s3proxy.authorization=aws-v2-or-v4\n"
        f"s3proxy.identity={S3_ACCESS_KEY}\n"
        f"s3proxy.credential={S3_SECRET_KEY}\n"
        # The NIO.2 file store evaluates If-None-Match as it writes (a conditional create
        # that loses the race fails with 412), which the storage's commits rely on.
        "jclouds.provider=filesystem-nio2\n"
        f"jclouds.filesystem.basedir={store}\n"
    )
    command = [
        java(),
        "-Xmx256m",
        *JAVA_OPTIONS,
        "-jar",
        str(jar),
        "--properties",
        str(workdir / "s3proxy.conf"),
    ]
    try:
        with _serving("s3proxy", command, workdir, lambda: _answers(endpoint), timeout_s) as (
            process,
            took,
        ):
            yield StorageServer(
                f"s3a://{bucket}",
                process.pid,
                workdir,
                workdir / "server.log",
                {
                    f"fs.s3a.bucket.{bucket}.endpoint": endpoint,
                    f"fs.s3a.bucket.{bucket}.endpoint.region": "us-east-1",
                    f"fs.s3a.bucket.{bucket}.access.key": S3_ACCESS_KEY,
                    f"fs.s3a.bucket.{bucket}.secret.key": S3_SECRET_KEY,
                    f"fs.s3a.bucket.{bucket}.path.style.access": "true",
                    f"fs.s3a.bucket.{bucket}.connection.ssl.enabled": "false",
                    # A client that finds the server gone gives up within seconds, not minutes.
                    f"fs.s3a.bucket.{bucket}.attempts.maximum": "2",
                    f"fs.s3a.bucket.{bucket}.retry.limit": "2",
                },
                took,
            )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("server", choices=("hdfs", "s3"))
    args = parser.parse_args(argv)
    run = running_hdfs if args.server == "hdfs" else running_s3
    try:
        with run() as server:
            print(f"{server.uri} (pid {server.pid}); Hadoop settings:", flush=True)
            for key, value in server.spark_conf().items():
                print(f"  --conf {key}={value}", flush=True)
            print("Ctrl-C stops it.", flush=True)
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        return 0
    except StorageJvmError as exc:
        print(f"storage_jvm: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
