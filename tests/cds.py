"""A class-data archive of Spark's classes, so the tests' many Spark applications start sooner.

Every container, CLI command and session the suite starts is a new JVM that
loads and verifies ten thousand or so of Spark's classes before its first
batch, on 2 cores shared by up to eight of them. Java's application
class-data sharing (AppCDS, JEP 350) maps those classes, already parsed and
verified, from an archive instead: on this machine a session and its first
query took 8 to 10 CPU-seconds with the archive and 16 to 18 without (7 s
and 14 s of wall time, one at a time; see docs/development.md).

``python tests/cds.py`` (``make cds``, before ``make test``'s pytest) runs a
short workload that loads what a container loads (the embedded log's Python
source, keyed state in RocksDB, Arrow, a Parquet sink) under
``-XX:ArchiveClassesAtExit`` and keeps the archive in ``.cache/cds``, with a
stamp of what it was made for (the ``java`` and pyspark it ran on). It does
nothing when the stamp still matches.
:mod:`jvm` adds ``-XX:SharedArchiveFile`` to the tests' Java options when the
archive is there; a JVM that cannot use it (another class path) says so on
stderr and starts as it would have without it.

Containers record and map an archive of their own
(:mod:`spark_elastic.runtime.container.class_archive`, in the user's cache)
unless their JVM is given one already: the suite's, named in
``SPARK_SUBMIT_OPTS``, wins for every JVM the specs start, so a fresh clone's
specs never wait for a container recording its classes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "runtime"))

from jvm import ARCHIVE, SHORT_LIVED_JAVA_OPTIONS

STAMP = ARCHIVE.with_suffix(".json")


def wanted_stamp() -> dict[str, str | None]:
    """What an archive is good for: the JVM, and Spark's jars (the class path, through the
    Spark home the sessions start from)."""
    import importlib.metadata

    from spark_elastic.dataplane.spark_home import own_spark_home

    java = subprocess.run(["java", "-version"], capture_output=True, text=True, check=True)
    python = {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    return {
        "java": java.stderr.strip(),
        "pyspark": importlib.metadata.version("pyspark"),
        "python": sys.executable,
        "spark_home": own_spark_home("local[2]", {}, {**os.environ, **python}),
    }


def workload(archive: Path) -> None:
    """What a container does, briefly, in a JVM that archives its classes when it exits."""
    from key_counts import counts, produce

    from spark_elastic import (
        LOG_SOURCE_FORMAT,
        EmbeddedLog,
        map_tasks_in_pandas,
        with_virtual_tasks,
    )
    from spark_elastic.dataplane.session import local_session

    options = f"-Xss16m {SHORT_LIVED_JAVA_OPTIONS} -XX:ArchiveClassesAtExit={archive}"
    spark = local_session("spark-elastic-cds", conf={"spark.driver.extraJavaOptions": options})
    with tempfile.TemporaryDirectory(prefix="spark-elastic-cds-") as tmp:
        root = Path(tmp)
        log = EmbeddedLog(root / "log")
        log.create_topic("clicks", 2)
        produce(log, 0, 200)
        query = (
            counts(spark, log, root / "state")
            .writeStream.foreachBatch(
                lambda df, _: df.write.mode("append").parquet(str(root / "out"))
            )
            .option("checkpointLocation", str(root / "query"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(300)
        stateless = (
            spark.read.format(LOG_SOURCE_FORMAT)
            .option("path", str(log.path))
            .option("subscribe", "clicks")
            .load()
            .transform(with_virtual_tasks(2))
            .transform(map_tasks_in_pandas(lambda _, rows: rows[["key"]], "key binary"))
        )
        stateless.write.parquet(str(root / "tagged"))
    jvm = spark.sparkContext._gateway.proc  # type: ignore[attr-defined]
    spark.stop()
    # The JVM writes the archive as it exits, which it does when its stdin closes: wait for
    # it, or this process would be gone before the archive is.
    jvm.stdin.close()
    jvm.wait(300)


def main() -> int:
    wanted = wanted_stamp()
    if ARCHIVE.is_file() and STAMP.is_file() and json.loads(STAMP.read_text()) == wanted:
        print(f"spark-elastic tests: class-data archive up to date: {ARCHIVE}")
        return 0
    ARCHIVE.parent.mkdir(parents=True, exist_ok=True)
    for stale in (ARCHIVE, STAMP):
        stale.unlink(missing_ok=True)
    partial = ARCHIVE.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    here = Path(__file__).resolve().parent
    # Spark's Python workers import the workload's processor (key_counts.Count) by name.
    path = os.pathsep.join([str(here), str(here / "runtime"), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": path}
    env.pop("SPARK_CONF_DIR", None)  # as in the specs (conftest.py)
    env.pop("SPARK_SUBMIT_OPTS", None)  # it may name the archive being replaced
    # A fresh interpreter: its jvm module sees no archive, so nothing maps the old one.
    code = f"import cds; cds.workload(cds.Path({str(partial)!r}))"
    log = ARCHIVE.with_suffix(".log")  # Spark's banners and a thousand CDS notes: not for CI
    with log.open("w") as out:
        try:
            done = subprocess.run(
                [sys.executable, "-c", code], cwd=here, env=env, stdout=out, stderr=out, timeout=600
            ).returncode
        except subprocess.TimeoutExpired:  # the child is killed: its archive is not written
            done = None
    if done != 0 or not partial.is_file():
        # The suite runs without the archive, only slower: not a reason to stop it.
        print("\n".join(log.read_text(errors="replace").splitlines()[-20:]))
        outcome = f"exit status {done}" if done is not None else "no exit within 600 s"
        print(f"spark-elastic tests: no class-data archive ({outcome}; {log}): specs run slower")
        return 0
    partial.rename(ARCHIVE)
    STAMP.write_text(json.dumps(wanted, indent=1))
    print(f"spark-elastic tests: class-data archive made: {ARCHIVE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
