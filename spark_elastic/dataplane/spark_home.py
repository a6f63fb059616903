"""A Spark home for local sessions whose Python processes import pyspark compiled, not zipped.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` and its py4j zip first on
the path of every Python process it starts: the workers' daemon and each
worker it forks, the transform-with-state driver worker, a Python data
source's planners and its streaming runner. Python imports from a zip
without a bytecode cache, so each of those processes compiles the pyspark
modules it imports from source: ``import pyspark.worker`` and the
transform-with-state driver worker's modules took 1.9 s from the zip
against 0.4 s from the installed package, and a local session with a first
stateful query about 10 s less wall time on the 2-core machine
(docs/benchmarks.md, "Python processes"). A pip-installed pyspark is that
Spark home itself, with the very same modules installed and compiled beside
the zip. No Spark issue tracks this that we found.

So when a session is local (or on a standalone cluster, for its driver's
Python processes) and its Python processes run the driver's interpreter
(which imports pyspark and py4j from its installed packages), it starts its
JVM with a Spark home of its own: a directory of symbolic links to
everything of pyspark's home except the two zips in ``python/lib``. Its
Python processes then import what the driver imports, compiled once. Any
other set-up is left as it is: a ``SPARK_HOME`` that is not the installed
pyspark (a Spark distribution), another interpreter for the workers, YARN
or Kubernetes (YARN ships ``pyspark.zip`` from the driver's home to its
executors). Should the directory not be made (a read-only cache), the
session starts with pyspark's own home, as before.

Where: ``$SPARK_ELASTIC_SPARK_HOMES`` (a directory, or ``off``), by default
``$XDG_CACHE_HOME/spark-elastic/spark-homes`` (``~/.cache/...``); one home
per pyspark installation.

Runs on the driver, once before a SparkSession starts (:func:`own_spark_home`,
then :func:`launching` around the session's creation). Standard library
only, plus pyspark's ``find_spark_home`` inside :func:`own_spark_home`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import sys
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

__all__ = [
    "ENV",
    "ZIPS",
    "build",
    "cache_dir",
    "homes_dir",
    "is_local_or_standalone",
    "is_pip_install",
    "launching",
    "own_spark_home",
    "runs_this_interpreter",
]

ENV = "SPARK_ELASTIC_SPARK_HOMES"
"""The environment variable naming the homes' directory, or ``off``."""
ZIPS = ("pyspark.zip", "py4j-")
"""The names in ``$SPARK_HOME/python/lib`` left out (a name or a prefix)."""


def cache_dir(variable: str, leaf: str, environ: Mapping[str, str] | None = None) -> Path | None:
    """A host cache of the library's: ``$variable``'s directory, None if it is ``off``, or
    ``$XDG_CACHE_HOME/spark-elastic/leaf`` (``~/.cache/...``) when it is unset."""
    env = os.environ if environ is None else environ
    chosen = env.get(variable, "").strip()
    if chosen.lower() == "off":
        return None
    if chosen:
        return Path(chosen)
    cache = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "spark-elastic" / leaf


def homes_dir(environ: Mapping[str, str] | None = None) -> Path | None:
    """The homes' directory, or None when ``$SPARK_ELASTIC_SPARK_HOMES`` is ``off``."""
    return cache_dir(ENV, "spark-homes", environ)


def is_local_or_standalone(master: str) -> bool:
    """Is ``master`` local (``local``, ``local[N]``...) or a standalone cluster (``spark://``)?

    Only there does nothing but this driver's Python processes and local
    executors depend on the Spark home it starts from: a standalone worker
    starts its executors from its own; YARN ships ``pyspark.zip`` from the
    driver's home to its executors; Kubernetes runs images of their own.
    """
    return master == "local" or master.startswith(("local[", "spark://"))


def is_pip_install(spark_home: Path, pyspark_dir: Path) -> bool:
    """Is the Spark home the installed pyspark package itself, zips and jars in it?"""
    try:
        same = spark_home.resolve() == pyspark_dir.resolve()
    except OSError:
        return False
    lib = pyspark_dir / "python" / "lib"
    return same and (lib / "pyspark.zip").is_file() and (pyspark_dir / "jars").is_dir()


def runs_this_interpreter(python: str, executable: str) -> bool:
    """Is ``python`` (a path, or a name looked up on ``PATH``) this very interpreter?

    Compared as paths, not resolved: a virtual environment's ``python`` is a
    link to the system's, with other packages.
    """
    found = python if os.sep in python else shutil.which(python)
    return found is not None and os.path.abspath(found) == os.path.abspath(executable)


def _left_out(name: str) -> bool:
    return name == ZIPS[0] or (name.startswith(ZIPS[1]) and name.endswith(".zip"))


def _key(pyspark_dir: Path) -> str:
    """One home per installation: its path and what its home and ``python/lib`` hold."""
    real = pyspark_dir.resolve()
    parts = [str(real), *sorted(e.name for e in real.iterdir())]
    parts += sorted(e.name for e in (real / "python" / "lib").iterdir())
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def _fits(home: Path, pyspark_dir: Path) -> bool:
    lib = home / "python" / "lib"
    try:
        jars = (home / "jars").resolve() == (pyspark_dir / "jars").resolve()
        return jars and lib.is_dir() and not any(_left_out(e.name) for e in lib.iterdir())
    except OSError:
        return False


def build(pyspark_dir: Path, root: Path) -> Path:
    """The home of links for ``pyspark_dir`` under ``root``: made once, then reused.

    Made under a name of its own and renamed into place, so a concurrent
    session sees a whole home or none; the loser of a race keeps the winner's.

    Raises
    ------
    OSError
        The directory could not be made (the caller starts with pyspark's home).
    """
    final = root / _key(pyspark_dir)
    if _fits(final, pyspark_dir):
        return final
    root.mkdir(parents=True, exist_ok=True)
    partial = root / f".{final.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    try:
        _link_all(pyspark_dir, partial, ("python",))
        _link_all(pyspark_dir / "python", partial / "python", ("lib",))
        lib = pyspark_dir / "python" / "lib"
        zips = tuple(e.name for e in lib.iterdir() if _left_out(e.name))
        _link_all(lib, partial / "python" / "lib", zips)
        try:
            os.rename(partial, final)
        except OSError as error:
            if not _fits(final, pyspark_dir):
                raise OSError(f"{final}: a Spark home there that does not fit ({error})") from error
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return final


def _link_all(source: Path, target: Path, except_: tuple[str, ...]) -> None:
    target.mkdir()
    for entry in source.iterdir():
        if entry.name not in except_:
            (target / entry.name).symlink_to(entry.resolve())


def own_spark_home(
    master: str, conf: Mapping[str, str], environ: Mapping[str, str] | None = None
) -> str | None:
    """The Spark home a session on ``master`` should start its JVM with, or None for Spark's own.

    Parameters
    ----------
    master
        The session's master URL.
    conf
        The settings it starts with (``spark.pyspark.python`` and
        ``spark.pyspark.driver.python`` name its Python processes' interpreter).
    environ
        The environment (``SPARK_HOME``, ``PYSPARK_PYTHON``...); ``os.environ`` by default.

    Returns
    -------
    str or None
        A home of links without pyspark's zips, when the session is local or
        on a standalone cluster and its Python processes run this
        interpreter; else None.
    """
    env = os.environ if environ is None else environ
    root = homes_dir(env)
    if root is None or not is_local_or_standalone(master):
        return None
    pythons = [
        conf.get("spark.pyspark.python") or env.get("PYSPARK_PYTHON") or "python3",
        conf.get("spark.pyspark.driver.python") or env.get("PYSPARK_DRIVER_PYTHON") or "",
    ]
    if not all(runs_this_interpreter(p, sys.executable) for p in pythons if p):
        return None
    import pyspark
    from pyspark.find_spark_home import _find_spark_home

    pyspark_dir = Path(pyspark.__file__).parent
    if not is_pip_install(Path(env.get("SPARK_HOME") or _find_spark_home()), pyspark_dir):
        return None
    try:
        return str(build(pyspark_dir, root))
    except OSError:
        return None


@contextlib.contextmanager
def launching(spark_home: str | None) -> Iterator[None]:
    """``SPARK_HOME`` set to ``spark_home`` while a session's JVM is launched, then restored.

    pyspark launches the JVM with the process's environment; once it runs,
    nothing of this process needs the variable, and a later ``spark-submit``
    of the user's keeps pyspark's own home.
    """
    if spark_home is None:
        yield
        return
    before = os.environ.get("SPARK_HOME")
    os.environ["SPARK_HOME"] = spark_home
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("SPARK_HOME", None)
        else:
            os.environ["SPARK_HOME"] = before
