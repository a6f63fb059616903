"""A warm-up follows its old owners' committed state (KIP-441's warm-up replica).

Runs on a warm-up container's driver, in its own SparkSession, while the
old owners keep running the tasks it will take. :func:`follow` finds the
checkpoints that hold the warm-up's keys (the owners in the job model),
forks each one's committed prefix while its query runs (hard links; files
its maintenance deletes meanwhile are skipped) and rescales the forks to
the warm-up's tasks. The result, a *snapshot*, is a complete checkpoint for
those tasks as of the owners' last commits, kept next to the warm-up's
generation directory with the batch of each source it was made from. A
warm-up follows again whenever its owners have committed since, at most
every ``every_s``.

At the handover the owners have stopped. :func:`take_snapshot` moves the
snapshot into place when its sources are exactly the handover's at the
batches they last committed: nothing committed since, so its state is
theirs. Otherwise the container rescales the sources again, in a JVM and
Python workers that the snapshots have warmed (every code path of a rescale
has run at least once), so the stall pays no cold start. Following is
what makes a warm-up ready: it registers after its first snapshot.

A warm-up on the embedded log does more (a *hot* warm-up): it takes its
first snapshot as its own checkpoint (:func:`adopt_snapshot`) and runs the
job's query on it at once, reading the old owners' records up to where
they committed (:func:`gate_for`, through the source's ``gate``) and
applying them to its state without output (:func:`source_fences`, the
processor's output fences). At the handover it takes the old owners' final
offsets as its fences, lifts the gate, and its running query publishes
from there: no fork, no rescale and no first micro-batch at the move.

May import :mod:`spark_elastic.state`, :mod:`.generations` and the shared runtime modules.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from spark_elastic.errors import SparkElasticError
from spark_elastic.runtime.container.generations import fork_committed, last_committed_batch
from spark_elastic.runtime.container.scratch import mark, scratch_root
from spark_elastic.runtime.keys import Holders, parsed
from spark_elastic.runtime.protocol import ContainerModel, JobModel
from spark_elastic.state.checkpoint_dir import (
    Fence,
    last_batch,
    read_fences,
    read_job,
    storage_of,
)
from spark_elastic.storage import LocalStorage, is_local

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from spark_elastic.model.plan import JobPlan

__all__ = [
    "Snapshot",
    "adopt_snapshot",
    "follow",
    "gate_for",
    "highest",
    "holder_checkpoints",
    "holders_idle",
    "own_scratch",
    "scratch_for",
    "snapshot_dir",
    "source_fences",
    "take_snapshot",
]

_LOCAL = LocalStorage()

_SOURCES_FILE = "sources.json"
_CHECKPOINT = "checkpoint"


@dataclass(frozen=True)
class Snapshot:
    """A warm-up's copy of its keys' state, as of its sources' last commits.

    Attributes
    ----------
    path
        The rescaled checkpoint, ready to become the warm-up's generation.
    sources
        Each source checkpoint and the batch it had last committed.
    keys
        Keys of user state in it.
    seconds
        How long forking and rescaling took.
    """

    path: Path
    sources: Mapping[str, int]
    keys: int
    seconds: float


def snapshot_dir(target: str | os.PathLike[str]) -> Path:
    """Where a warm-up whose generation will be ``target`` keeps its snapshot: beside it
    on the local disk, else in this host's scratch (:func:`scratch_for`)."""
    return scratch_for(target) / f".{Path(os.fspath(target)).name}.following"


def scratch_for(target: str | os.PathLike[str]) -> Path:
    """A local directory for what a generation's container keeps on its own host.

    ``target``'s parent on the local disk (hard links reach the checkpoint);
    for a checkpoint on HDFS or S3, a directory of the host's temporary
    directory named after it: snapshots are made there and copied into place.
    """
    text = os.fspath(target)
    if is_local(text):
        return Path(text).parent
    digest = hashlib.sha256(text.rstrip("/").encode()).hexdigest()[:16]
    return scratch_root() / digest


def own_scratch(target: str | os.PathLike[str]) -> Path:
    """:func:`scratch_for` a checkpoint on HDFS or S3, made and marked as this process's.

    The mark lets :func:`~spark_elastic.runtime.container.scratch.sweep`
    delete it once the process is gone (a container killed before it could
    clean up). Not for local checkpoints, whose scratch is their own parent
    directory.
    """
    return mark(scratch_for(target))


def holder_checkpoints(model: JobModel, tasks: Sequence[str]) -> list[str]:
    """The checkpoints of the model's containers that hold keys of ``tasks``, sorted."""
    holders = Holders(model.containers).of(tasks)
    return sorted(c.checkpoint for c in model.containers if c.container_id in holders)


def holders_stopping(model: JobModel, tasks: Sequence[str]) -> bool:
    """Whether a container that holds keys of ``tasks`` is stopping for a handover."""
    return bool(Holders(model.containers).of(tasks) & set(model.stopping))


def holders_idle(model: JobModel, tasks: Sequence[str], now: float, floor_s: float) -> bool:
    """Whether the holders of ``tasks`` have committed nothing for a while (no records flow).

    Each holder's last commit is longer ago than ``floor_s`` and than twice
    the interval between its last two commits (by the commit files' times,
    ``now`` on the same clock: :func:`time.time`).
    """
    for checkpoint in holder_checkpoints(model, tasks):
        storage, root = storage_of(checkpoint)
        commits = storage.join(root, "commits")
        with contextlib.suppress(SparkElasticError):
            last = sorted(int(n) for n in storage.list(commits) if n.isdigit())[-2:]
            stamps = [storage.modified(storage.join(commits, str(n))) for n in last]
            times = [t for t in stamps if t is not None]
            interval = times[-1] - times[0] if len(times) == 2 else 0.0
            if times and now - times[-1] < max(floor_s, 2 * interval):
                return False
    return True


def read_all_it_could(
    gates: Sequence[tuple[float, Mapping[str, Mapping[str, int]]]],
    started: float,
    committed: Mapping[str, Mapping[int, int]],
) -> bool:
    """Whether a warm-up's batch read everything its gate held when the batch started.

    Pure. ``gates`` are ``(time written, gate)`` in the order written (times
    taken after each write, on the batch's clock); ``committed`` is where the
    batch ended, per topic and partition. A batch that did keeps pace with
    its owners however long it takes (each batch reads what they published
    meanwhile), while one that read less (a row limit: a backlog) does not.
    Unknown (no gate written by then) is False.
    """
    in_force = [gate for at, gate in gates if at <= started]
    if not in_force:
        return False
    return all(
        committed.get(topic, {}).get(int(partition), 0) >= offset
        for topic, partitions in in_force[-1].items()
        for partition, offset in partitions.items()
    )


def source_fences(sources: Sequence[str], plan_at: Callable[[int], JobPlan]) -> list[Fence]:
    """Where each source checkpoint's owner published its output up to, per key bucket.

    Runs on a warm-up's driver, each time it follows and once at the
    handover. For every task a source ran, and every partition the task
    reads, the offset the source last committed there (its owner published
    everything below it before the commit); a source's own fences (it was
    a hot warm-up once and has not passed them yet) come along. A source
    that never committed a batch adds only its own fences.

    Parameters
    ----------
    sources
        Checkpoints of the owners (current holders, or a handover's sources).
    plan_at
        The job's plan at an elasticity factor (each source's own factor).

    Returns
    -------
    list
        ``((stream, partition, key_bucket, factor), next_offset)`` entries.
    """
    fences: list[Fence] = []
    for source in sources:
        own = read_fences(source)
        spec, batch = read_job(source), last_batch(source)
        if spec is None or batch is None or (not batch.committed and batch.batch_id == 0):
            fences.extend(own)
            continue
        # Its own fences only while it has not read past them: once passed, they would
        # hold a warm-up's gate (the lowest fence of a bucket's keys) where it was then.
        fences.extend(
            (key, offset) for key, offset in own if offset > batch.committed_offset(*key[:2])
        )
        plan = plan_at(spec.elasticity_factor)
        ids = {name: i for i, name in enumerate(plan.task_names())}
        for name in plan.task_names() if spec.tasks is None else spec.tasks:
            bucket = parsed(name).key_bucket
            for ssp in plan.task(ids[name]).partitions:
                offset = batch.committed_offset(ssp.stream, ssp.partition)
                fences.append(((ssp.stream, ssp.partition, bucket, plan.elasticity_factor), offset))
    return fences


def highest(fences: Sequence[Fence]) -> list[Fence]:
    """One fence per key bucket, the highest: a bucket's output was published up to there."""
    best: dict[tuple[str, int, int, int], int] = {}
    for key, offset in fences:
        best[key] = max(offset, best.get(key, offset))
    return sorted(best.items())


def gate_for(
    fences: Sequence[Fence], plan: JobPlan, tasks: Sequence[str]
) -> dict[str, dict[str, int]]:
    """How far a hot warm-up may read: per partition of its tasks, the lowest fence of
    a key bucket sharing keys with them there (every record it reads is then below its
    key's fence: applied without output). A partition without a fence is not read."""
    gate: dict[str, dict[str, int]] = {}
    ids = {name: i for i, name in enumerate(plan.task_names())}
    fences = highest(fences)
    for name in tasks:
        mine = parsed(name)
        for ssp in plan.task(ids[name]).partitions:
            below = [
                offset
                for (stream, partition, bucket, factor), offset in fences
                if stream == ssp.stream
                and partition == ssp.partition
                and bucket % min(factor, mine.elasticity_factor)
                == mine.key_bucket % min(factor, mine.elasticity_factor)
            ]
            if below:
                current = gate.setdefault(ssp.stream, {}).get(str(ssp.partition), min(below))
                gate[ssp.stream][str(ssp.partition)] = min(current, *below)
    return gate


def adopt_snapshot(target: str | os.PathLike[str]) -> Snapshot | None:
    """Make the snapshot kept for ``target`` its checkpoint, whatever its sources did since.

    A hot warm-up does this once, before its query starts: it replays what
    the sources committed after the snapshot. Returns the snapshot, or
    ``None`` if there is none.
    """
    snapshot = read_snapshot(target)
    return None if snapshot is None else _into_place(snapshot, target)


def _into_place(snapshot: Snapshot, target: str | os.PathLike[str]) -> Snapshot:
    """Move the snapshot's checkpoint to ``target`` and remove what is left of it.

    Off the local disk the snapshot (a seed and its job file) is copied there,
    the job file last, as a fork is.
    """
    if is_local(os.fspath(target)):
        _LOCAL.move(str(snapshot.path), os.fspath(target))
    else:
        fork_committed(snapshot.path, target)
    _LOCAL.discard(str(snapshot_dir(target)))
    return snapshot


def holder_batches(model: JobModel, tasks: Sequence[str]) -> dict[str, int] | None:
    """The checkpoints holding keys of ``tasks``, each with its last committed batch.

    ``None`` while one of them has committed nothing: there is no state to
    copy yet (a new owner that has just started holds what its own sources
    hold, and those are not to be read while it may still fork them).
    """
    holders = Holders(model.containers).of(tasks)
    batches = {
        c.checkpoint: last_committed_batch(c.checkpoint)
        for c in model.containers
        if c.container_id in holders
    }
    if not batches or min(batches.values()) < 0:
        return None
    return dict(sorted(batches.items()))


def read_snapshot(target: str | os.PathLike[str]) -> Snapshot | None:
    """The snapshot kept for ``target``, if a complete one is there."""
    home = snapshot_dir(target)
    try:
        meta = json.loads((home / _SOURCES_FILE).read_text())
    except (OSError, ValueError):
        return None
    return Snapshot(
        home / _CHECKPOINT,
        {str(k): int(v) for k, v in meta["sources"].items()},
        int(meta["keys"]),
        float(meta["seconds"]),
    )


def follow(
    spark: SparkSession, model: JobModel, warm: ContainerModel, factor: int
) -> Snapshot | None:
    """Bring the warm-up's snapshot up to its owners' last commits.

    Runs on the warm-up's driver, once when it starts and then whenever it
    is due. Returns the new snapshot, or ``None`` if the owners committed
    nothing since the last one (or nothing at all yet).

    Raises
    ------
    SparkElasticError
        The fork or the rescale failed (for example an owner's checkpoint
        vanished because the job model moved on); the previous snapshot
        stays.
    """
    from spark_elastic.state.rescale import rescale

    batches = holder_batches(model, warm.tasks)
    previous = read_snapshot(warm.checkpoint)
    if batches is None or (previous is not None and previous.sources == batches):
        return None
    home = snapshot_dir(warm.checkpoint)
    if is_local(warm.checkpoint):
        home.parent.mkdir(parents=True, exist_ok=True)
    else:
        own_scratch(warm.checkpoint)
    staging = Path(tempfile.mkdtemp(prefix=f"{home.name}.", dir=home.parent))
    try:
        started = time.monotonic()
        forked = {}
        for i, source in enumerate(batches):
            forked[source] = fork_committed(source, staging / "forks" / str(i), live=True)
        # The fork read each source's last commit itself; a commit between the two reads
        # only makes the snapshot newer.
        made_from = {s: f.last_committed for s, f in forked.items()}
        result = rescale(
            [staging / "forks" / str(i) for i in range(len(forked))],
            staging / _CHECKPOINT,
            factor,
            spark,
            tasks=warm.tasks,
        )
        _LOCAL.delete(str(staging / "forks"))
        seconds = time.monotonic() - started
        (staging / _SOURCES_FILE).write_text(
            json.dumps({"sources": made_from, "keys": result.keys, "seconds": seconds})
        )
        # The sources file is written last and the directory replaced whole: a crash
        # leaves the old snapshot, or a staging directory no one reads.
        _LOCAL.delete(str(home))
        _LOCAL.move(str(staging), str(home))
    except BaseException:
        _LOCAL.discard(str(staging))
        raise
    return Snapshot(home / _CHECKPOINT, made_from, result.keys, seconds)


def take_snapshot(target: str | os.PathLike[str], sources: Sequence[str]) -> Snapshot | None:
    """Make the snapshot ``target``'s checkpoint if it is still the sources' state.

    Runs on the new owner's driver at the handover, after its old owners
    stopped. The snapshot is taken when it was made from exactly
    ``sources`` and none of them committed a batch since; it is discarded
    otherwise. Returns it, or ``None``.
    """
    snapshot = read_snapshot(target)
    current = {s: last_committed_batch(s) for s in sources}
    if snapshot is None or dict(snapshot.sources) != current:
        drop_snapshot(target)
        return None
    return _into_place(snapshot, target)


def drop_snapshot(target: str | os.PathLike[str]) -> None:
    """Remove a warm-up's snapshot (its move was called off, or it was taken)."""
    _LOCAL.discard(str(snapshot_dir(target)))
