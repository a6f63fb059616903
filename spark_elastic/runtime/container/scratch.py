"""A host's scratch directories: what a container keeps on its host, swept once it is dead.

Owns the host's scratch root and its directories' owner marks. A container
keeps there what it cannot keep beside its checkpoint (a warm-up's gate and
snapshot of a checkpoint on HDFS or S3, :mod:`.follow`), and its JVM's
temporary files: a Spark driver puts them in ``java.io.tmpdir``, where each
JVM unpacks its own copy of RocksDB's native library (15 MB, for the state
store), and lz4's and snappy's, and where Spark's local directories go by
default (the ``spark-*`` directory with a copy of every jar the application
ships, about 27 MB with the Kafka and S3 jars, and the ``blockmgr-*``
shuffle files). The JVM deletes those at a clean exit, but a container
killed, as a fenced zombie or a failed-over one is, leaves them all behind:
the machine that runs this project's specs had 20 GB of them in ``/tmp``.

So a container's JVM gets ``-Djava.io.tmpdir`` of a directory of its own
(:func:`with_scratch`), and each directory is marked with its owner, the
container process's PID, start time (which tell a live owner from a reused
PID) and PID namespace. Every container sweeps, as it starts, the marked
directories whose owner no longer runs (:func:`sweep`): what a killed
container leaves lasts until the next container starts on the host. An
owner in another PID namespace (a "host" of the namespaces launcher, PID 1
in a process table of its own) is dead once nothing is left in its
namespace, which only a process of the host's initial namespace can see (a
local container; the specs sweep at their end). A clean exit leaves an
empty marked directory (the JVM deletes its files), swept likewise.

Where: ``$SPARK_ELASTIC_SCRATCH``, by default ``spark-elastic-scratch`` in
the system's temporary directory. A job that sets its own
``-Djava.io.tmpdir`` (in ``spark.driver.extraJavaOptions``,
``SPARK_SUBMIT_OPTS``, ``JAVA_TOOL_OPTIONS`` or ``JDK_JAVA_OPTIONS``) keeps
it, and nothing is added. Executors on a cluster keep theirs: the option is
the driver's.

Runs on a container's driver, as it starts. Standard library only, plus
:mod:`spark_elastic.runtime.container.console` and ``.compiler``.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from spark_elastic.runtime.container.compiler import users_java_options
from spark_elastic.runtime.container.console import _log

__all__ = ["ENV", "mark", "owner_alive", "scratch_root", "sweep", "with_scratch"]

ENV = "SPARK_ELASTIC_SCRATCH"
"""The environment variable naming the host's scratch root."""
OWNER = "owner.pid"
"""The mark in a scratch directory: its owner's PID, start time and PID namespace."""
_OPTION = "-Djava.io.tmpdir="


def scratch_root(environ: Mapping[str, str] | None = None) -> Path:
    """The root of this host's scratch directories."""
    value = (os.environ if environ is None else environ).get(ENV, "").strip()
    return Path(value) if value else Path(tempfile.gettempdir()) / "spark-elastic-scratch"


def _start_time(pid: int) -> int | None:
    """A process's start time (clock ticks since boot, from ``/proc``), or None if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else int(fields[19])


def _pid_namespace() -> str:
    """This process's PID namespace (``pid:[inode]``), or ``""`` where there is none to read."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


_INITIAL_PID_NAMESPACE = "pid:[4026531836]"
"""The kernel's first PID namespace (``PROC_PID_INIT_INO``): from it, every process is seen."""


def _namespaces_in_use() -> frozenset[str] | None:
    """Every PID namespace a process is in, or None when this process cannot see them all.

    Only root in the initial namespace sees every process and may read its
    namespace, as the namespaces launcher (root) made them; a process even
    root may not read (another security context's, outside the launcher's
    reach) is not one of its containers'.
    """
    if _pid_namespace() != _INITIAL_PID_NAMESPACE or os.geteuid() != 0:
        return None
    seen = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                seen.add(os.readlink(f"/proc/{entry}/ns/pid"))
            except OSError:
                continue  # exited meanwhile, or not one of the launcher's
    return frozenset(seen)


def mark(directory: Path) -> Path:
    """Make ``directory`` (and its parents) and mark it as this process's; ``directory``.

    The mark names the process's PID, start time and PID namespace: a
    container of the namespaces launcher has a process table of its own
    (where it is PID 1) over the host's shared temporary directory.
    """
    directory.mkdir(parents=True, exist_ok=True)
    me = os.getpid()
    (directory / OWNER).write_text(f"{me} {_start_time(me) or 0} {_pid_namespace()}\n")
    return directory


def owner_alive(
    directory: Path, namespaces: Callable[[], frozenset[str] | None] = _namespaces_in_use
) -> bool | None:
    """Whether the process that marked ``directory`` runs; None when it bears no mark.

    An owner in another PID namespace counts as alive until no process is
    left in that namespace, which only a process of the initial namespace
    can tell (elsewhere such a directory is never deleted); ``namespaces``
    gives the ones in use (a sweep reads ``/proc`` for them once). A mark
    of a PID alone (written before start times were) counts as alive while
    any process has that PID.
    """
    try:
        fields = (directory / OWNER).read_text().split()
        pid = int(fields[0])
        start = int(fields[1]) if len(fields) > 1 else None
    except (OSError, ValueError, IndexError):
        return None
    if len(fields) > 2 and fields[2] != _pid_namespace():
        in_use = namespaces()
        return in_use is None or fields[2] in in_use
    if start is not None and Path("/proc/self/stat").exists():
        return _start_time(pid) == start
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: alive
    return True


def sweep(root: Path | None = None) -> list[Path]:
    """Delete the scratch directories whose owner no longer runs; the ones deleted.

    Runs on a container's driver, once as it starts. A directory without a
    mark is not known to be anyone's, and is left.
    """
    gone: list[Path] = []
    try:
        entries = sorted((root or scratch_root()).iterdir())
    except OSError:
        return gone
    # Read once a sweep, and only if a directory of another namespace asks.
    namespaces = functools.cache(_namespaces_in_use)
    for entry in entries:
        if entry.is_dir() and owner_alive(entry, namespaces) is False:
            shutil.rmtree(entry, ignore_errors=True)
            gone.append(entry)
    return gone


def with_scratch(conf: Mapping[str, str], container_id: str) -> dict[str, str]:
    """``conf`` with the driver's ``java.io.tmpdir`` in a scratch directory of its own.

    Nothing changes when the job or its environment sets
    ``java.io.tmpdir``, or when the directory cannot be made or named in a
    Java option (said in the container's log).

    Parameters
    ----------
    conf
        The Spark settings the container's session is about to start with.
    container_id
        The container's id, in its directory's name.

    Returns
    -------
    dict
        A copy of ``conf``.
    """
    out = dict(conf)
    if _OPTION in users_java_options(out):
        return out
    root = scratch_root()
    if any(c.isspace() for c in str(root)):
        # Spark splits the driver's Java options at white space.
        _log(f"temporary files in the JVM's default place: {root} has white space in its path")
        return out
    name = re.sub(r"[^A-Za-z0-9_-]", "_", container_id)
    try:
        root.mkdir(parents=True, exist_ok=True)
        # A name of its own: in a PID namespace of its own every container is PID 1.
        directory = mark(Path(tempfile.mkdtemp(prefix=f"jvm-{name}-", dir=root)))
    except OSError as exc:
        _log(f"temporary files in the JVM's default place: {root} is not writable ({exc})")
        return out
    own = out.get("spark.driver.extraJavaOptions", "")
    out["spark.driver.extraJavaOptions"] = f"{own} {_OPTION}{directory}".strip()
    return out
