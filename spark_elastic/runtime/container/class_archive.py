"""A container JVM's class archive (AppCDS): the classes of one run, mapped by later ones.

Before its first batch a container's JVM loads and verifies some 15,000
classes of the JDK, Spark, Hadoop and Kafka. Mapping them from a class data
sharing archive instead takes about 3 s off a container's start on 2 cores
(a SparkSession in 2.5 s instead of 4.3, a first query in 1.5 s instead of
2.7; docs/benchmarks.md, "A container's first seconds"). So a moved task's
new owner, a failover's successor and a scaled-out container start sooner.

The first container of a host (per Java, Spark and jar set) records the
classes it loads (``-XX:ArchiveClassesAtExit``; its own start is about 3 s
slower) and, once its JVM has exited cleanly, its archive is moved into
place; later containers map it (``-XX:SharedArchiveFile``). A JVM given a
truncated archive crashes (SIGBUS), so only a complete one is ever moved
in: written under a name of its own, renamed once its JVM exited with 0.
One container records at a time (a claim file; one older than
:data:`STALE_S` is taken over, as a long-running recorder writes nothing
until it exits). A recording that fails (the JVM exits
with an error, or writes nothing: a non-empty directory on the class path
cannot be archived) is not tried again for :data:`RETRY_S`: every
container of that set-up would otherwise start 3 s slower in vain. An
archive that no longer matches (another JDK, changed jars) is refused by
the JVM itself, which then loads its classes as usual.

Where: ``$SPARK_ELASTIC_CLASS_ARCHIVES`` (a directory, or ``off``), by
default ``$XDG_CACHE_HOME/spark-elastic/class-archives`` (``~/.cache/...``).
A job that sets its own ``-XX:SharedArchiveFile``, ``-XX:ArchiveClassesAtExit``
or ``-Xshare`` (in ``spark.driver.extraJavaOptions``, ``SPARK_SUBMIT_OPTS``,
``JAVA_TOOL_OPTIONS`` or ``JDK_JAVA_OPTIONS``) keeps them, and none are added.

Runs on a container's driver, and on a ``rescale`` or ``checkpoint show``
command's (as short-lived a JVM): :func:`with_class_archive` (or
:func:`java_options`) once before its SparkSession starts, :func:`finish`
once at its exit (with :func:`gateway_process`). Standard library only, plus
:mod:`spark_elastic.runtime.container.console` and ``.compiler``,
:func:`spark_elastic.dataplane.spark_home.cache_dir` (and pyspark's
``find_spark_home`` inside :func:`with_class_archive`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spark_elastic.dataplane.spark_home import cache_dir
from spark_elastic.runtime.container.compiler import users_java_options
from spark_elastic.runtime.container.console import _log

__all__ = [
    "ENV",
    "RETRY_S",
    "STALE_S",
    "ClassArchive",
    "archive_dir",
    "finish",
    "gateway_process",
    "java_options",
    "with_class_archive",
]

ENV = "SPARK_ELASTIC_CLASS_ARCHIVES"
"""The environment variable naming the archives' directory, or ``off``."""
STALE_S = 600.0
"""A claim or a partial archive this old belongs to a container that never finished."""
RETRY_S = 86_400.0
"""After a recording failed, how long containers of that set-up run without one."""
EXIT_S = 60.0
"""How long a recording container waits for its JVM to write the archive and exit."""
_THEIRS = ("SharedArchiveFile", "ArchiveClassesAtExit", "-Xshare")
_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
"""The JVM warns on stdout of every class it cannot archive (signed jars, old class files)."""


@dataclass(frozen=True)
class ClassArchive:
    """What a container's JVM does with its class archive.

    Attributes
    ----------
    options
        Java options to add to the driver's (empty: none).
    final
        The archive later containers map.
    recording
        Where this JVM writes its archive at exit, if it records one.
    claim
        The claim file this container holds while it records.
    """

    options: str
    final: Path
    recording: Path | None = None
    claim: Path | None = None


_CURRENT: list[ClassArchive] = []


def archive_dir(environ: os._Environ[str] | dict[str, str] | None = None) -> Path | None:
    """The archives' directory, or None when ``$SPARK_ELASTIC_CLASS_ARCHIVES`` is ``off``."""
    return cache_dir(ENV, "class-archives", environ)


def archive_key(java: str, spark_home: str, conf: Mapping[str, str]) -> str:
    """Which archive fits this JVM: its Java, Spark's jars, the job's jars and class path.

    The JVM checks the class path itself and refuses an archive that does
    not fit; the key only keeps different set-ups from replacing each
    other's archives.
    """
    real = os.path.realpath(java)
    # The home's own path too: the JVM's class path names the jars through it, and an
    # archive made on another path would be refused (a session's home of links, spark_home.py).
    parts = [real, str(_mtime(real)), os.path.abspath(spark_home)]
    jars = Path(spark_home) / "jars"
    if jars.is_dir():
        parts += sorted(entry.name for entry in jars.iterdir())
    for key in ("spark.jars", "spark.driver.extraClassPath", "spark.jars.packages"):
        parts.append(f"{key}={conf.get(key, '')}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def _mtime(path: str) -> int:
    try:
        return int(os.stat(path).st_mtime)
    except OSError:
        return 0


def with_class_archive(
    conf: Mapping[str, str], java: str, spark_home: str | None = None
) -> dict[str, str]:
    """``conf`` with the class-archive options (:func:`java_options`) after the driver's own.

    Parameters
    ----------
    conf
        The Spark settings the session is about to start with.
    java
        The ``java`` executable Spark will run.
    spark_home
        The Spark home the JVM starts from; pyspark's by default.

    Returns
    -------
    dict
        A copy of ``conf``; its ``spark.driver.extraJavaOptions`` extended
        when there is an archive to map or to record.
    """
    from pyspark.find_spark_home import _find_spark_home

    out = dict(conf)
    archive = java_options(java, spark_home or _find_spark_home(), out)
    if archive:
        own = out.get("spark.driver.extraJavaOptions", "")
        out["spark.driver.extraJavaOptions"] = f"{own} {archive}".strip()
    return out


def java_options(java: str, spark_home: str, conf: Mapping[str, str]) -> str:
    """The class-archive options for a container's JVM (empty when there are none).

    Maps the archive when there is one; else records one unless another
    container is recording (then none). Remembers what it chose for
    :func:`finish`.
    """
    directory = archive_dir()
    # Sharing options the job or its environment gives are the user's (and would conflict).
    theirs = users_java_options(conf)
    if directory is None or any(option in theirs for option in _THEIRS):
        return ""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        _sweep(directory)
    except OSError as exc:
        _log(f"no class archive: {directory} is not writable ({exc.strerror or exc})")
        return ""
    key = archive_key(java, spark_home, conf)
    final = directory / f"{key}.jsa"
    failed = directory / f"{key}.failed"
    if final.is_file():
        chosen = ClassArchive(f"-XX:SharedArchiveFile={final} {_QUIET}", final)
    elif _younger_than(failed, RETRY_S):
        # An environment the JVM cannot archive (a non-empty directory on the class path,
        # say) would otherwise slow every container's start that records in vain.
        reason = failed.read_text(errors="replace").strip()
        _log(f"no class archive: the last recording failed ({reason}); delete {failed} to retry")
        return ""
    else:
        claim = directory / f"{key}.recording"
        if not _claimed(claim):
            return ""
        recording = directory / f"{key}.{os.getpid()}.partial"
        chosen = ClassArchive(
            f"-XX:ArchiveClassesAtExit={recording} {_QUIET}", final, recording, claim
        )
        _log(f"recording the JVM's classes for later starts (containers, commands) ({final})")
    _CURRENT[:] = [chosen]
    return chosen.options


def _younger_than(path: Path, seconds: float) -> bool:
    try:
        return time.time() - path.stat().st_mtime < seconds
    except OSError:
        return False


def _claimed(claim: Path) -> bool:
    """Take the recording claim, or a stale one over; False if another container holds it."""
    for _ in range(2):
        try:
            fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                if time.time() - claim.stat().st_mtime < STALE_S:
                    return False
                claim.unlink()
            except FileNotFoundError:
                pass
            continue
        except OSError:
            return False
        with os.fdopen(fd, "w") as out:
            out.write(f"{os.getpid()}\n")
        return True
    return False


def _sweep(directory: Path) -> None:
    """Delete partial archives of containers that never finished (killed while recording)."""
    now = time.time()
    for partial in directory.glob("*.partial"):
        try:
            if now - partial.stat().st_mtime > STALE_S:
                partial.unlink()
        except FileNotFoundError:
            pass


def _failed(marker: Path, why: str) -> None:
    """Say for a day that recording fails here (see :data:`RETRY_S`)."""
    # A directory gone read-only: the next container finds out for itself.
    with contextlib.suppress(OSError):
        marker.write_text(f"{why}, {time.strftime('%Y-%m-%d %H:%M:%S')}\n")


def gateway_process() -> subprocess.Popen[Any] | None:
    """This process's Spark JVM (pyspark's gateway process), if a session ever started.

    For :func:`finish`; reads only what pyspark already loaded, so it loads nothing.
    """
    context = sys.modules.get("pyspark.core.context")
    gateway = None if context is None else getattr(context.SparkContext, "_gateway", None)
    return getattr(gateway, "proc", None)


def finish(gateway_process: subprocess.Popen[Any] | None) -> None:
    """At a recording container's exit: let its JVM write the archive, then move it in.

    Closes the JVM's stdin (pyspark's gateway then exits, and the JVM writes
    the archive as it does), waits up to :data:`EXIT_S`, and renames the
    archive into place only if the JVM exited with 0. Does nothing for a
    container that did not record. Runs last: no Spark call works after it.
    """
    archive = _CURRENT.pop() if _CURRENT else None
    recording = None if archive is None else archive.recording
    if archive is None or recording is None:
        return
    started = time.monotonic()
    try:
        code = None
        if gateway_process is not None:
            if gateway_process.stdin is not None:
                gateway_process.stdin.close()
            try:
                code = gateway_process.wait(EXIT_S)
            except subprocess.TimeoutExpired:
                gateway_process.kill()
                _log(f"the JVM did not exit within {EXIT_S:g} s: its class archive is dropped")
        if code == 0 and recording.is_file() and recording.stat().st_size > 0:
            os.replace(recording, archive.final)
            size = archive.final.stat().st_size / 2**20
            _log(
                f"recorded the JVM's classes in {time.monotonic() - started:.1f} s "
                f"({size:.0f} MiB): later containers and commands map them ({archive.final})"
            )
        elif code is not None:
            why = f"the JVM exited with {code}" if code else "the JVM wrote no archive"
            _log(f"{why}: its class archive is dropped")
            _failed(archive.final.with_suffix(".failed"), why)
    finally:
        for leftover in (archive.recording, archive.claim):
            if leftover is not None:
                leftover.unlink(missing_ok=True)
