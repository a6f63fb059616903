"""A new generation's checkpoint, set up once from its predecessors' before its query starts.

A stateful generation that takes exactly its one predecessor's tasks forks
its committed prefix (:mod:`.generations`); one that takes tasks from
several, or some of one's, adopts the snapshot it followed
(:mod:`.follow`) or rescales their committed checkpoints to its tasks
(:func:`~spark_elastic.rescale` with ``tasks``). A stateless one starts a
fresh checkpoint where its predecessors stopped. With a transactional sink,
what the earlier owners published (:func:`_fence_published`) becomes output
fences: records below them are applied (stateful) or passed over
(stateless) without their output being published again.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from spark_elastic.runtime.container.console import _log
from spark_elastic.runtime.container.follow import highest, take_snapshot
from spark_elastic.runtime.container.generations import fork_committed
from spark_elastic.runtime.container.query import covers, needed_partitions
from spark_elastic.runtime.job import Job
from spark_elastic.runtime.protocol import ContainerModel
from spark_elastic.runtime.sinks import TRANSACTIONAL, sink_guarantee
from spark_elastic.state.checkpoint_dir import (
    ELASTIC_DIR,
    JOB_FILE,
    Fence,
    read_fences,
    storage_of,
    write_fences,
)
from spark_elastic.storage import LocalStorage

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pyspark.sql import SparkSession

    from spark_elastic.model.plan import JobPlan

_LOCAL = LocalStorage()


def reads_published_alone(job: Job) -> bool:
    """Whether the job's sink says what it published without Spark and without a seal first.

    Such a sink (a transactional one with no ``claim``:
    :class:`~spark_elastic.runtime.sinks.KafkaSink`) may be read while the
    container's SparkSession starts: what the old owners published is final
    once the container owns their tasks.
    """
    return sink_guarantee(job.sink) == TRANSACTIONAL and not callable(
        getattr(job.sink, "claim", None)
    )


def published_fences(
    job: Job,
    plan: JobPlan,
    mine: ContainerModel,
    spark: SparkSession | None = None,
    published: Sequence[Fence] | None = None,
) -> list[Fence]:
    """What earlier owners published of the partitions ``mine``'s tasks read (transactional
    sinks).

    Runs on the driver once the container owns its tasks, before its first
    batch: the old owners can no longer decide to publish (they stopped, or
    their lease ended). A sink that fences in its storage (``claim``, as
    :class:`~spark_elastic.runtime.sinks.ParquetSink` has) first seals their
    commits, so a write of theirs still in flight either counts here or
    fails; then what the sink says it published is final. ``published``:
    what the sink said, read already (:func:`reads_published_alone`).
    """
    if sink_guarantee(job.sink) != TRANSACTIONAL:
        return []
    needed = needed_partitions(plan, mine.tasks)
    claim = getattr(job.sink, "claim", None)
    if callable(claim):
        offsets = {topic: {str(p): 0 for p in parts} for topic, parts in needed.items()}
        keys = [key for key, _ in covers(plan, mine.tasks, offsets)]
        sealed = claim(mine.generation, mine.container_id, keys, spark)
        if sealed:
            _log(f"sealed the sink's commits of earlier generations {sealed}")
    if published is None:
        published = job.sink.published(job.name, mine.tasks)  # type: ignore[attr-defined]
    return [f for f in highest(published) if f[0][1] in needed.get(f[0][0], ())]


def _fence_published(
    job: Job,
    plan: JobPlan,
    mine: ContainerModel,
    spark: SparkSession | None = None,
    published: Sequence[Fence] | None = None,
) -> list[Fence]:
    """Make what earlier owners published this generation's output fences.

    A stateful generation gets them in its checkpoint's fences (the processor
    applies a record below its key's fence to state and emits nothing);
    a stateless one gets them back, for its query to leave those records out.
    Runs on the driver, once, after :func:`_prepare_checkpoint`.
    """
    fences = published_fences(job, plan, mine, spark, published)
    if not fences:
        return []
    _log(f"the sink has output of {len(fences)} key buckets' records already: fenced")
    if job.processor is None:
        return fences
    write_fences(mine.checkpoint, highest([*read_fences(mine.checkpoint), *fences]))
    return []


def _prepare_checkpoint(
    mine: ContainerModel, plan: JobPlan, stateful: bool, spark: SparkSession, reopen: bool = False
) -> dict[str, dict[str, int]] | None:
    """Set up this generation from its predecessors, once; the starting offsets, if any.

    Runs on the driver, once per container, before its query starts.

    A stateful generation that takes exactly its one predecessor's tasks
    forks its committed prefix (keyed state and bucket checkpoints included).
    One that takes tasks from several predecessors, or some of one's, forks
    each one's committed prefix privately (hard links: they may be shared
    with another successor) and rescales them to its share of the tasks.
    A stateless one starts a fresh checkpoint where its predecessors stopped:
    for each partition its tasks read, the lowest offset any of them
    committed (two predecessors may have read one partition for different
    tasks: records read again publish nothing with a transactional sink, see
    :func:`_fence_published`), and the earliest offset for a partition
    none of them read (a new one, after growth).

    ``reopen`` (a job whose tasks hold records back): a fork runs its
    predecessor's last planned batch again (``fork_committed``'s
    ``reopen_last``), so that its query goes on running batches without new
    records and the idle waits of the records its tasks hold end. The other
    ways start a new query, whose first batch runs at once.
    """
    target = mine.checkpoint
    if _prepared(target) or not mine.sources:
        return _rescaled_starts(target, plan, mine) if stateful else None
    storage, root = storage_of(target)
    if storage.scheme != "file" and storage.exists(root):
        storage.delete(root)  # set up half-way by an earlier try, which no query ran on
    if not stateful:
        from spark_elastic.state.checkpoint_dir import last_batch

        batches = [b for b in map(last_batch, mine.sources) if b is not None]
        starts: dict[str, dict[str, int]] = {}
        for topic, partitions in needed_partitions(plan, mine.tasks).items():
            for partition in partitions:
                seen = [
                    int(b.offsets[topic][str(partition)])
                    for b in batches
                    if str(partition) in b.offsets.get(topic, {})
                ]
                starts.setdefault(topic, {})[str(partition)] = min(seen) if seen else -2
        _log(f"starting from the offsets {len(mine.sources)} predecessors committed: {starts}")
        return starts
    if len(mine.sources) == 1 and _runs_exactly(mine.sources[0], plan, mine.tasks):
        result = fork_committed(mine.sources[0], target, reopen_last=reopen)
        _log(
            f"forked {mine.sources[0]} at batch {result.last_committed} into {target} "
            f"({result.files} files, {result.bytes} bytes)"
            + (", to run its last batch again" if reopen and result.last_committed >= 0 else "")
        )
        return _rescaled_starts(target, plan, mine)
    snapshot = take_snapshot(target, mine.sources)
    if snapshot is not None:
        _log(
            f"took over {len(mine.tasks)} tasks from the state it followed ({snapshot.keys} keys "
            f"as of batches {dict(snapshot.sources)}): nothing committed since"
        )
    else:
        _take_over(mine, plan, spark)
    # A source that replayed an earlier owner and had not passed its fences yet: what is
    # below them was published by that owner, so it stays quiet here too (a fork copies
    # the file; a rescale does not).
    carried = sorted({f for source in mine.sources for f in read_fences(source)})
    if carried:
        write_fences(target, carried)
    return _rescaled_starts(target, plan, mine)


def _prepared(target: str) -> bool:
    """Whether this generation's checkpoint is set up: on the local disk it appears whole
    (a rename); elsewhere its ``job.json`` is written after everything else."""
    storage, root = storage_of(target)
    if storage.scheme == "file":
        return storage.exists(root)
    return storage.exists(storage.join(root, ELASTIC_DIR, JOB_FILE))


def _runs_exactly(source: str, plan: JobPlan, tasks: tuple[str, ...]) -> bool:
    """Whether a source checkpoint ran exactly these tasks at the plan's factor."""
    from spark_elastic.state.checkpoint_dir import read_job

    job = read_job(source)
    if job is None or job.elasticity_factor != plan.elasticity_factor:
        return False
    owned = set(plan.task_names()) if job.tasks is None else set(job.tasks)
    return owned == set(tasks)


def _take_over(mine: ContainerModel, plan: JobPlan, spark: SparkSession) -> None:
    """Rescale the predecessors' committed checkpoints to this container's tasks."""
    from spark_elastic.state.rescale import rescale

    target = mine.checkpoint
    # The forks are private, on the local disk: beside the target (hard links) when it is
    # there, else in a scratch directory of this container's host.
    local = storage_of(target)[0].scheme == "file"
    if local:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
    scratch = str(Path(target).parent) if local else None
    staging = Path(tempfile.mkdtemp(prefix=f".{Path(target).name}.sources.", dir=scratch))
    try:
        forks = []
        for i, source in enumerate(mine.sources):
            fork = staging / str(i)
            fork_committed(source, fork)
            forks.append(fork)
        started = time.monotonic()
        result = rescale(forks, target, plan.elasticity_factor, spark, tasks=mine.tasks)
        _log(
            f"took over {len(mine.tasks)} tasks from {len(mine.sources)} checkpoints: "
            f"{result.keys} keys in {time.monotonic() - started:.1f} s"
        )
    finally:
        _LOCAL.discard(str(staging))


def _rescaled_starts(
    target: str | Path, plan: JobPlan, mine: ContainerModel
) -> dict[str, dict[str, int]] | None:
    """Where a rescaled checkpoint's first query reads (None once it ran, or if not rescaled)."""
    from spark_elastic.state.rescale import starting_offsets

    text = starting_offsets(target, default="")
    if not text:
        return None
    needed = needed_partitions(plan, mine.tasks)
    offsets: dict[str, dict[str, int]] = json.loads(text)
    return {
        topic: {str(p): int(offsets.get(topic, {}).get(str(p), 0)) for p in partitions}
        for topic, partitions in needed.items()
    }
