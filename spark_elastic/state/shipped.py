"""What a stateful query's tasks read of its checkpoint, sent to the executors by Spark.

A task needs two small documents that the driver may change while the
query runs: the output fences (a warm-up raises them as its old owners
commit) and whether the bootstrap streams are read. Executors never open a
file of the checkpoint by path: on a cluster they are on other hosts, and
the checkpoint may be on HDFS or S3, which a Python worker cannot read.

So the driver *ships* each version of a document with
``SparkContext.addFile``, under a name never used before in this process
(kind, a digest of the checkpoint, a rising sequence). Spark sends every file
added before a task was created to the task's executor before the task runs
(``Executor.updateDependencies``), on every cluster manager, so a task of a
micro-batch planned after :func:`ship` returned reads that version or a
later one: the highest sequence in its ``SparkFiles`` directory.

Runs on the driver (:func:`ship`) and in Python workers on executors
(:meth:`Shipped.latest`, once per task per micro-batch; a worker parses a
version once). :class:`Shipped` is pickled with the query's processor.
May import: :mod:`spark_elastic.errors`, :mod:`.checkpoint_dir`; pyspark only
inside functions.
"""

from __future__ import annotations

import atexit
import hashlib
import itertools
import json
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_elastic.errors import CheckpointError
from spark_elastic.state.checkpoint_dir import (
    bootstrapped,
    read_fences,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["Shipped", "ship", "ship_bootstrap", "ship_fences"]

_PREFIX = "spark-elastic"


@dataclass(frozen=True)
class Shipped:
    """One kind of document of one checkpoint, as its tasks find it (picklable).

    Attributes
    ----------
    kind
        ``"fences"`` or ``"bootstrap"``: which file of ``_spark_elastic/`` it ships.
    digest
        Names the checkpoint (a digest of its location) in file names.
    """

    kind: str
    digest: str

    @classmethod
    def of(cls, kind: str, checkpoint: str | os.PathLike[str]) -> Shipped:
        """The ``kind`` document of ``checkpoint`` (driver)."""
        text = os.fspath(checkpoint)
        location = text if "://" in text else str(Path(text).resolve())
        return cls(kind, hashlib.sha256(location.encode()).hexdigest()[:16])

    @property
    def prefix(self) -> str:
        """File names of this document's versions start with it."""
        return f"{_PREFIX}-{self.kind}-{self.digest}-"

    def latest(self) -> Any:
        """The newest version shipped to this executor (executor, once per task per batch).

        Raises
        ------
        CheckpointError
            None was shipped: the query was not set up by :func:`ship`'s callers.
        """
        from pyspark import SparkFiles

        root = SparkFiles.getRootDirectory()
        # Listed on every call (tens of microseconds): a directory's modification time is
        # too coarse to tell a version added a moment after the last look.
        names = [n for n in os.listdir(root) if n.startswith(self.prefix)]
        if not names:
            raise CheckpointError(
                f"no {self.kind} document of checkpoint {self.digest} was shipped to this "
                f"executor ({root}); the query was not started by with_task_state"
            )
        # Zero-padded, names sort by sequence. A version may still be being copied in for a
        # task that starts beside this one (Spark copies in place): one that does not parse
        # whole yet is passed over for the one before, which is what this task was made with.
        for name in sorted(names, reverse=True):
            document = _parsed(os.path.join(root, name))
            if document is not None:
                return document
        raise CheckpointError(f"{self.prefix}*: no shipped version in {root} reads whole")


_PARSED: dict[str, Any] = {}
"""Per Python worker: each shipped file, parsed (files are never rewritten once whole)."""


def _parsed(path: str) -> Any:
    """The document at ``path``, or ``None`` while it is not whole."""
    if path not in _PARSED:
        try:
            with open(path, encoding="utf-8") as f:
                document = json.load(f)
        except ValueError:
            return None
        except OSError as exc:
            raise CheckpointError(f"{path}: cannot read a shipped document ({exc})") from None
        _PARSED[path] = document
    return _PARSED[path]


_SEQUENCE = itertools.count()
_DIRECTORY: list[Path] = []
_MUTEX = threading.Lock()


def _directory() -> Path:
    """This process's directory of shipped files (removed when it exits)."""
    with _MUTEX:
        if not _DIRECTORY:
            made = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}-shipped-"))
            atexit.register(shutil.rmtree, made, True)
            _DIRECTORY.append(made)
        return _DIRECTORY[0]


def ship(spark: SparkSession, shipped: Shipped, document: Any) -> None:
    """Send a new version of a document to the query's executors (driver).

    Tasks created after this returns read it (or a later version); tasks
    already running keep the version they started with.

    Parameters
    ----------
    spark
        The session whose context runs the query.
    shipped
        Which document of which checkpoint.
    document
        Its content, as a JSON object.
    """
    with _MUTEX:
        sequence = next(_SEQUENCE)
    path = _directory() / f"{shipped.prefix}{sequence:012d}.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    spark.sparkContext.addFile(str(path))


def ship_fences(spark: SparkSession, checkpoint: str | os.PathLike[str]) -> Shipped:
    """Ship the checkpoint's output fences as its ``fences.json`` has them now (driver).

    Called when a query is defined on the checkpoint, and by whoever raises
    the fences while it runs, after writing the file.
    """
    shipped = Shipped.of("fences", checkpoint)
    entries = sorted([[*key, offset] for key, offset in read_fences(checkpoint)])
    ship(spark, shipped, {"fences": entries})
    return shipped


def ship_bootstrap(spark: SparkSession, checkpoint: str | os.PathLike[str]) -> Shipped:
    """Ship whether the checkpoint's bootstrap streams are read, as its file says now (driver)."""
    shipped = Shipped.of("bootstrap", checkpoint)
    ship(spark, shipped, {"done": bootstrapped(checkpoint)})
    return shipped
