"""Checkpoint generations: a new owner starts from a copy of the old owner's committed prefix.

A container never shares a checkpoint directory with another process: each
task set gets a new *generation* directory whenever its owner changes. When a
container is replaced, the new one forks the old generation's checkpoint
**as of its last committed micro-batch** into its own directory, and Spark
recovers from the fork as from any checkpoint: it replays the batch that was
in flight, with the keyed state (and the library's bucket checkpoints) of the
last commit. A zombie that wakes up writes only to its old directory, which no
one reads any more.

What is copied, for last committed batch ``N``:

- ``metadata`` (the query id) and ``sources/``;
- ``offsets/0..N`` and ``commits/0..N`` (an uncommitted ``offsets/N+1`` is
  left behind: the fork plans that batch afresh); with ``reopen_last``, the
  fork runs the source's last planned batch again: its uncommitted
  ``offsets/N+1`` is kept, and if it has none, ``commits/N`` is left behind
  (so a fork of a reopened fork that never committed runs the same batch, it
  does not walk back one batch per fork);
- ``state/``: per state partition, versions ``<= N + 1`` (state version
  ``v`` is the state after batch ``v - 1``), every SST file, and the
  operator metadata and state schemas of batches ``<= N``;
- ``_spark_elastic/job.json``, a rescale ``seed/`` and the output fences of a
  warm-up that replayed its old owners' records; never the owner lock.

On the local disk, files are hard-linked when the file system allows it
(Spark and RocksDB never modify a checkpoint file in place: they write a
temporary file and rename it), else copied, into a staging directory that
one rename publishes. Hadoop has no hard links and S3 no atomic directory
rename: there every kept file is copied (on the driver, through the
storage layer), and a fork is whole once its ``_spark_elastic/forked.json``
exists (written last, create-if-absent); a target without it is a fork that
died half-way, deleted and made again (:func:`is_forked`). Runs on the
container's driver before its query starts; Spark only for a remote
checkpoint (its JVM reaches the file system).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from spark_elastic.errors import CheckpointError
from spark_elastic.state.checkpoint_dir import (
    ELASTIC_DIR,
    FENCES_FILE,
    JOB_FILE,
    SEED_DIR,
    storage_of,
)
from spark_elastic.storage import Storage

__all__ = ["FORKED_FILE", "ForkResult", "fork_committed", "is_forked"]

COPY_THREADS = 8
"""Files a fork off the local disk copies at once."""
FORKED_FILE = "forked.json"
"""Written last into a fork off the local disk: the fork is whole."""

# A checkpoint file name's leading number: "12", ".12.crc", "3.zip", "3_<uuid>.zip", "7.changelog".
_NUMBERED = re.compile(r"^\.?(\d+)(?:[._]|$)")


@dataclass(frozen=True)
class ForkResult:
    """What :func:`fork_committed` copied.

    Attributes
    ----------
    last_committed
        The source's last committed batch (-1: it never committed one).
    files
        Files linked or copied.
    bytes
        Their total size.
    """

    last_committed: int
    files: int
    bytes: int


def _number(name: str) -> int | None:
    match = _NUMBERED.match(name)
    return int(match.group(1)) if match else None


def _committed_batches(log_dir: Path) -> list[int]:
    if not log_dir.is_dir():
        return []
    return sorted(n for p in log_dir.iterdir() if (n := _number(p.name)) is not None)


def last_committed_batch(checkpoint: str | os.PathLike[str]) -> int:
    """The last batch id in ``commits/`` (-1 if none).

    Parameters
    ----------
    checkpoint
        A Spark checkpoint directory.

    Returns
    -------
    int
        The id of the last committed micro-batch, or -1.
    """
    batches = _logged_batches(Path(checkpoint) / "commits")
    return batches[-1] if batches else -1


def _logged_batches(log_dir: Path) -> list[int]:
    """The batch ids with a file of their own in ``offsets/`` or ``commits/``, in order."""
    return [n for n in _committed_batches(log_dir) if (log_dir / str(n)).is_file()]


def _link_or_copy(path: Path, out: Path) -> None:
    try:
        os.link(path, out)
    except FileNotFoundError:
        raise
    except OSError:
        shutil.copy2(path, out)


def _rerun(source: Path, last: int) -> int:
    """The batch a reopened fork of ``source`` (last committed ``last``) runs again: the
    one it planned and never committed, else its last committed one."""
    planned = _logged_batches(source / "offsets")
    return last + 1 if planned and planned[-1] > last else last


def _keep(relative: Path, last: int, rerun: int | None = None) -> bool:
    """Whether a file of the source belongs to the committed prefix (planned up to batch
    ``rerun`` and committed below it, if given)."""
    parts = relative.parts
    name = parts[-1]
    top = parts[0]
    if top in ("offsets", "commits"):
        number = _number(name)
        if number is None:
            return False
        if rerun is None:
            return number <= last
        return number <= (rerun if top == "offsets" else rerun - 1)
    if top == ELASTIC_DIR:
        return parts[1:] in ((JOB_FILE,), (FENCES_FILE,)) or (
            len(parts) > 2 and parts[1] == SEED_DIR
        )
    if top == "state":
        if "SSTs" in parts:
            return True
        number = _number(name)
        if number is None:
            return True
        # state/<operator>/<partition>/<version>.zip: versions are batch ids + 1.
        is_version = len(parts) == 4 and parts[2].isdigit()
        return number <= (last + 1 if is_version else last)
    return top in ("metadata", ".metadata.crc", "sources")


def fork_committed(
    source: str | os.PathLike[str],
    target: str | os.PathLike[str],
    *,
    live: bool = False,
    reopen_last: bool = False,
) -> ForkResult:
    """Make ``target`` a checkpoint that resumes where ``source`` last committed.

    Parameters
    ----------
    source
        The old generation's checkpoint (its owner is dead or fenced).
    target
        The new generation's checkpoint; must not exist yet.
    live
        The source's query may still be running (a warm-up following it):
        state files it deletes meanwhile are skipped. Its maintenance
        deletes only versions far below the last commit and SST files no
        retained version uses, never what the committed prefix needs.
    reopen_last
        Make the fork's query run the source's last planned batch again: its
        uncommitted one, as Spark itself would, else its last committed one,
        whose commit is left behind (its output fenced by what the sink
        published, as after a crash before the commit). A query whose last
        batch is committed runs none until new records arrive: Spark plans a
        batch without new data only after a batch of the same run. Processing-
        time timers (a holding job's idle waits) need those batches.

    Returns
    -------
    ForkResult
        The last committed batch and what was copied.

    Raises
    ------
    CheckpointError
        ``source`` is not a checkpoint directory or ``target`` exists. On any
        failure nothing is left at ``target``.
    """
    src_storage, src_root = storage_of(source)
    dst_storage, dst_root = storage_of(target)
    if src_storage.scheme != "file" or dst_storage.scheme != "file":
        if src_storage is not dst_storage:
            raise CheckpointError(
                f"fork: {src_root!r} and {dst_root!r} are on different file systems; a fork "
                "copies within one"
            )
        return _fork_through(src_storage, src_root, dst_root, live, reopen_last)
    src, dst = Path(src_root), Path(dst_root)
    if not (src / "metadata").is_file() and not (src / ELASTIC_DIR / JOB_FILE).is_file():
        raise CheckpointError(f"fork: {str(src)!r} is not a checkpoint directory")
    if dst.exists():
        raise CheckpointError(
            f"fork: target {str(dst)!r} exists already; forks go to new generations"
        )
    last = last_committed_batch(src)
    rerun = _rerun(src, last) if reopen_last and last >= 0 else None
    staging = dst.with_name(f".{dst.name}.forking")
    shutil.rmtree(staging, ignore_errors=True)
    files = size = 0
    try:
        for path in sorted(src.rglob("*")):
            if not path.is_file():
                continue
            relative = path.relative_to(src)
            if not _keep(relative, last, rerun):
                continue
            out = staging / relative
            out.parent.mkdir(parents=True, exist_ok=True)
            try:
                _link_or_copy(path, out)
            except FileNotFoundError:
                if not (live and relative.parts[0] == "state"):
                    raise
                continue
            files += 1
            size += out.stat().st_size
        staging.mkdir(parents=True, exist_ok=True)
        # The rename publishes the fork whole: a crash mid-copy leaves only the staging dir.
        os.replace(staging, dst)
    except BaseException:
        with contextlib.suppress(OSError):
            shutil.rmtree(staging)
        raise
    return ForkResult(last, files, size)


def is_forked(target: str | os.PathLike[str]) -> bool:
    """Whether ``target`` is a whole checkpoint made by :func:`fork_committed` (or any
    checkpoint, on the local disk, where a fork appears whole by one rename)."""
    storage, root = storage_of(target)
    if storage.scheme == "file":
        return storage.exists(root)
    return storage.exists(storage.join(root, ELASTIC_DIR, FORKED_FILE))


def _fork_through(
    storage: Storage, src: str, dst: str, live: bool, reopen_last: bool
) -> ForkResult:
    """:func:`fork_committed` on a file system without links or atomic directory renames."""
    listed = dict(storage.files(src))
    if "metadata" not in listed and f"{ELASTIC_DIR}/{JOB_FILE}" not in listed:
        raise CheckpointError(f"fork: {src!r} is not a checkpoint directory")
    if storage.exists(dst):
        if storage.exists(storage.join(dst, ELASTIC_DIR, FORKED_FILE)):
            raise CheckpointError(
                f"fork: target {dst!r} exists already; forks go to new generations"
            )
        storage.delete(dst)  # a fork that died half-way: no one ever ran on it
    commits = _numbered_files(listed, "commits")
    last = commits[-1] if commits else -1
    rerun = None
    if reopen_last and last >= 0:
        planned = _numbered_files(listed, "offsets")
        rerun = last + 1 if planned and planned[-1] > last else last
    kept = [(n, length) for n, length in sorted(listed.items()) if _keep(Path(n), last, rerun)]

    def copy(name: str) -> bool:
        if storage.copy(storage.join(src, name), storage.join(dst, name)):
            return True
        if not (live and name.startswith("state/")):
            raise CheckpointError(f"fork: {src}/{name} vanished while it was copied")
        return False

    # Each copy is a few round trips to the file system (create, write, close): on S3 and
    # HDFS tens of milliseconds, nearly all waiting, so they overlap (py4j gives each
    # Python thread a connection of its own).
    with concurrent.futures.ThreadPoolExecutor(COPY_THREADS) as pool:
        copied = list(pool.map(copy, [name for name, _ in kept]))
    files = sum(copied)
    size = sum(length for (_, length), done in zip(kept, copied, strict=True) if done)
    marker = json.dumps({"source": src, "lastCommitted": last, "files": files, "bytes": size})
    if not storage.create(storage.join(dst, ELASTIC_DIR, FORKED_FILE), marker.encode()):
        raise CheckpointError(f"fork: another fork into {dst!r} finished meanwhile")
    return ForkResult(last, files, size)


def _numbered_files(listed: Iterable[str], log: str) -> list[int]:
    """The batch ids with a file of their own in ``offsets/`` or ``commits/``, in order."""
    prefix = f"{log}/"
    return sorted(
        int(name[len(prefix) :])
        for name in listed
        if name.startswith(prefix) and name[len(prefix) :].isdigit()
    )
