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
import json
import os
import re
from collections.abc import Callable, Iterable
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
from spark_elastic.storage import LocalStorage, Storage

__all__ = ["FORKED_FILE", "ForkResult", "fork_committed", "is_forked"]

COPY_THREADS = 8
"""Files a fork off the local disk copies at once."""
FORKED_FILE = "forked.json"
"""Written last into a fork off the local disk: the fork is whole."""

_LOCAL = LocalStorage()
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


def last_committed_batch(checkpoint: str | os.PathLike[str]) -> int:
    """The last batch id in ``commits/`` (-1 if none).

    Parameters
    ----------
    checkpoint
        A Spark checkpoint directory, local or remote.

    Returns
    -------
    int
        The id of the last committed micro-batch, or -1.
    """
    storage, root = storage_of(checkpoint)
    batches = _numbered_files(
        (f"commits/{name}" for name in storage.list(storage.join(root, "commits"))), "commits"
    )
    return batches[-1] if batches else -1


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
    if dst_storage.scheme != "file":
        if src_storage.scheme != "file" and src_storage is not dst_storage:
            raise CheckpointError(
                f"fork: {src_root!r} and {dst_root!r} are on different remote file systems; "
                "a fork copies within one, or between it and the local disk"
            )
        return _fork_to_remote(src_storage, src_root, dst_storage, dst_root, live, reopen_last)
    dst = Path(dst_root)
    if dst.exists():
        raise CheckpointError(
            f"fork: target {str(dst)!r} exists already; forks go to new generations"
        )
    last, kept = _committed_prefix(src_storage, src_root, reopen_last)
    local_source = src_storage.scheme == "file"
    staging = dst.with_name(f".{dst.name}.forking")
    _LOCAL.discard(str(staging))

    def fetch(name: str) -> bool:
        out = str(staging / name)
        source_file = src_storage.join(src_root, name)
        if local_source:
            fetched = _LOCAL.link(source_file, out)
        else:
            (staging / name).parent.mkdir(parents=True, exist_ok=True)
            fetched = src_storage.download(source_file, out)
        return fetched or _vanished(src_root, name, live)

    try:
        # Linking is quick; a download waits on the file system, so they overlap.
        copied = _each(fetch, [name for name, _ in kept], 1 if local_source else COPY_THREADS)
        staging.mkdir(parents=True, exist_ok=True)
        # The move publishes the fork whole: a crash mid-copy leaves only the staging dir.
        _LOCAL.move(str(staging), str(dst))
    except BaseException:
        _LOCAL.discard(str(staging))
        raise
    return _result(last, kept, copied)


def _committed_prefix(
    storage: Storage, root: str, reopen_last: bool
) -> tuple[int, list[tuple[str, int]]]:
    """The source's last committed batch and the files of its committed prefix, with sizes."""
    listed = dict(storage.files(root))
    if "metadata" not in listed and f"{ELASTIC_DIR}/{JOB_FILE}" not in listed:
        raise CheckpointError(f"fork: {root!r} is not a checkpoint directory")
    commits = _numbered_files(listed, "commits")
    last = commits[-1] if commits else -1
    rerun = None
    if reopen_last and last >= 0:
        planned = _numbered_files(listed, "offsets")
        rerun = last + 1 if planned and planned[-1] > last else last
    return last, [(n, size) for n, size in sorted(listed.items()) if _keep(Path(n), last, rerun)]


def _vanished(root: str, name: str, live: bool) -> bool:
    """False for a state file a live source deleted since it was listed; else an error."""
    if live and name.startswith("state/"):
        return False
    raise CheckpointError(f"fork: {root}/{name} vanished while it was copied")


def _each(copy: Callable[[str], bool], names: list[str], threads: int) -> list[bool]:
    """``copy`` each name, ``threads`` at a time (py4j gives each thread a connection)."""
    if threads <= 1:
        return [copy(name) for name in names]
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        return list(pool.map(copy, names))


def _result(last: int, kept: list[tuple[str, int]], copied: list[bool]) -> ForkResult:
    return ForkResult(
        last,
        sum(copied),
        sum(size for (_, size), done in zip(kept, copied, strict=True) if done),
    )


def is_forked(target: str | os.PathLike[str]) -> bool:
    """Whether ``target`` is a whole checkpoint made by :func:`fork_committed` (or any
    checkpoint, on the local disk, where a fork appears whole by one rename)."""
    storage, root = storage_of(target)
    if storage.scheme == "file":
        return storage.exists(root)
    return storage.exists(storage.join(root, ELASTIC_DIR, FORKED_FILE))


def _fork_to_remote(
    src_storage: Storage,
    src: str,
    storage: Storage,
    dst: str,
    live: bool,
    reopen_last: bool,
) -> ForkResult:
    """:func:`fork_committed` onto a file system without links or atomic directory renames:
    every file copied (or uploaded from the local disk), ``job.json`` after the rest, and
    the fork whole once its ``forked.json`` exists."""
    last, kept = _committed_prefix(src_storage, src, reopen_last)
    if storage.exists(dst):
        if storage.exists(storage.join(dst, ELASTIC_DIR, FORKED_FILE)):
            raise CheckpointError(
                f"fork: target {dst!r} exists already; forks go to new generations"
            )
        storage.delete(dst)  # a fork that died half-way: no one ever ran on it

    def copy(name: str) -> bool:
        target = storage.join(dst, name)
        if src_storage.scheme == "file":
            local = str(Path(src) / name)
            if not os.path.exists(local):
                return _vanished(src, name, live)
            storage.upload(local, target)
            return True
        return storage.copy(storage.join(src, name), target) or _vanished(src, name, live)

    job = f"{ELASTIC_DIR}/{JOB_FILE}"
    # The job file after the rest: a checkpoint with one is a whole one (rescale does the same).
    first = [name for name, _ in kept if name != job]
    copied = dict(zip(first, _each(copy, first, COPY_THREADS), strict=True))
    if any(name == job for name, _ in kept):
        copied[job] = copy(job)
    marker = json.dumps({"source": src, "lastCommitted": last, "files": len(copied)})
    if not storage.create(storage.join(dst, ELASTIC_DIR, FORKED_FILE), marker.encode()):
        raise CheckpointError(f"fork: another fork into {dst!r} finished meanwhile")
    return _result(last, kept, [copied[name] for name, _ in kept])


def _numbered_files(listed: Iterable[str], log: str) -> list[int]:
    """The batch ids with a file of their own in ``offsets/`` or ``commits/``, in order."""
    prefix = f"{log}/"
    return sorted(
        int(name[len(prefix) :])
        for name in listed
        if name.startswith(prefix) and name[len(prefix) :].isdigit()
    )
