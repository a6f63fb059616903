"""Which container runs which tasks: the coordinator's placement, as pure functions.

No store, no clock, no processes: task names and container models in, task
sets out. The supervisor (:mod:`.supervisor`) calls them when it plans a new
job (:func:`initial_assignment`), scales (:func:`scale_assignment`), changes
the elasticity factor (:func:`tasks_at_factor`, :func:`model_factor`), moves
a group of warm-ups (:func:`may_shut_down`) and orders its status
(:func:`locality_key`, :func:`task_share`). KIP-441's assignor
(:mod:`spark_elastic.assignment`) decides how many tasks each container
takes and when an old owner may shut down; which tasks, here.
"""

from __future__ import annotations

from collections.abc import Sequence

from spark_elastic.errors import ArgumentError
from spark_elastic.model.names import TaskKind, TaskName
from spark_elastic.runtime.keys import Holders, buckets_at, parsed
from spark_elastic.runtime.protocol import ContainerModel, JobModel

__all__ = [
    "initial_assignment",
    "locality_key",
    "may_shut_down",
    "model_factor",
    "scale_assignment",
    "task_share",
    "tasks_at_factor",
]


def scale_assignment(
    tasks: Sequence[str], current: Sequence[ContainerModel], containers: int
) -> list[tuple[str, ...]]:
    """The task sets of ``containers`` containers, sticky to ``current`` (KIP-441's assignor).

    Scaling in, the newest containers leave; scaling out, new ones join empty.
    """
    from spark_elastic.assignment.assignor import assign
    from spark_elastic.assignment.model import ClientState, TaskSpec

    by_age = sorted(current, key=lambda c: c.generation)
    leaving = {c.container_id for c in by_age[containers:]}
    clients = [
        ClientState(c.container_id, previous_active=c.tasks, leaving=c.container_id in leaving)
        for c in current
    ]
    # Ids that sort after every current one: ties go to containers already running.
    clients += [ClientState(f"~new-{i:06d}") for i in range(containers - len(current))]
    result = assign([TaskSpec(t, stateful=False) for t in tasks], clients)
    sets = [tuple(sorted(a.active)) for a in result.assignment.values() if a.active]
    return sorted(sets)


def may_shut_down(
    warmups: Sequence[ContainerModel], owners: Sequence[ContainerModel], ready: set[str]
) -> tuple[str, ...]:
    """The old owners KIP-441's assignor lets shut down, with the ``ready`` warm-ups caught up.

    The assignor's tasks are the pieces of state the move hands over: each
    warm-up task (at the new factor, for a factor change) with each old
    owner holding some of its keys (a merge's new task has several). Each
    old owner is a leaving client running, caught up, the pieces it holds;
    a ready warm-up has caught up with the pieces of its tasks (its snapshot
    of their state), one still starting has none. The assignor leaves a
    piece active on its leaving owner while no other client has caught up
    with it, so an owner may shut down (its ``may_shut_down``) only once
    every piece it holds has a ready new owner.
    """
    from spark_elastic.assignment.assignor import assign
    from spark_elastic.assignment.model import ClientState, TaskSpec

    holders = Holders(owners)
    pieces: dict[str, list[str]] = {o.container_id: [] for o in owners}
    wanted: dict[str, list[str]] = {w.container_id: [] for w in warmups}
    for w in warmups:
        for task in w.tasks:
            for holder in sorted(holders.of([task])):
                piece = f"{task} <- {holder}"
                pieces[holder].append(piece)
                wanted[w.container_id].append(piece)
    clients = [
        ClientState(
            owner,
            previous_active=held,
            lags=dict.fromkeys(held, 0),
            leaving=True,
        )
        for owner, held in pieces.items()
    ]
    clients += [
        ClientState(
            w,
            previous_warmup=held,
            lags=dict.fromkeys(held, 0) if w in ready else {},
        )
        for w, held in wanted.items()
    ]
    every = [TaskSpec(p, stateful=True) for held in pieces.values() for p in held]
    return assign(every, clients).may_shut_down


def tasks_at_factor(containers: Sequence[ContainerModel], factor: int) -> list[tuple[str, ...]]:
    """Per container (in order), the tasks at ``factor`` that take over its keys.

    A split gives each task's children to its container. A merge gives each
    parent (in locality order) to the container, among those holding one of
    its children, with the fewest parents so far (ties: the oldest); once
    those have their fair share, to the one with the fewest overall.
    """
    holders: dict[str, list[str]] = {}
    for c in sorted(containers, key=lambda c: c.generation):
        for t in c.tasks:
            name = parsed(t)
            f, k = name.elasticity_factor, name.key_bucket
            for b in buckets_at(k, f, factor):
                ids = holders.setdefault(str(name.base.at_factor(b, factor)), [])
                if c.container_id not in ids:
                    ids.append(c.container_id)
    sets: dict[str, list[str]] = {c.container_id: [] for c in containers}
    fair = -(-len(holders) // max(len(containers), 1))
    oldest = [c.container_id for c in sorted(containers, key=lambda c: c.generation)]
    for new in sorted(holders, key=locality_key):
        ids = [i for i in holders[new] if len(sets[i]) < fair] or oldest
        sets[min(ids, key=lambda i: (len(sets[i]), ids.index(i)))].append(new)
    return [tuple(sorted(sets[c.container_id])) for c in containers]


def model_factor(
    model: JobModel, containers: Sequence[ContainerModel], warmups: Sequence[ContainerModel]
) -> int:
    """The job model's factor: the new one once no task of another factor is left."""
    factors = {parsed(t).elasticity_factor for c in containers for t in c.tasks}
    return factors.pop() if len(factors) == 1 and not warmups else model.elasticity_factor


def task_share(task: str) -> float:
    """A task's share of its partitions' records: a key bucket's is ``1 / F``."""
    name = parsed(task)
    return 1.0 if name.kind is TaskKind.SINGLE else 1.0 / name.elasticity_factor


def locality_key(task: str) -> tuple[int, int, str]:
    """Where a task sorts: by partition, then key bucket, so a partition's tasks sit together."""
    name = TaskName.parse(task)
    partition = name.partition if name.partition is not None else -1
    if name.ssp is not None:
        partition = name.ssp.partition
    return (partition, name.key_bucket, task)


def initial_assignment(
    tasks: Sequence[str], containers: int, capacities: Sequence[float] | None = None
) -> list[tuple[str, ...]]:
    """Share tasks among containers with the KIP-441 assignor, each share contiguous.

    The assignor (:func:`spark_elastic.assign`) decides how many tasks each
    container gets: shares follow capacities and differ by at most one task
    from them. Which tasks is decided here: in (partition, bucket) order, the
    first container takes the first contiguous run, and so on. Contiguous runs
    keep a partition's virtual tasks together, so each container reads as few
    partitions as balance allows (SEP-32's grouper optimization).

    Parameters
    ----------
    tasks
        Virtual task names.
    containers
        How many containers, at least 1 and at most the task count.
    capacities
        Each container's relative size (default: all 1).

    Returns
    -------
    list[tuple[str, ...]]
        One sorted tuple of task names per container, in container order.

    Raises
    ------
    ArgumentError
        ``containers`` out of range, or capacities not one positive number
        per container.
    """
    from spark_elastic.assignment.assignor import assign
    from spark_elastic.assignment.model import ClientState, TaskSpec

    if isinstance(containers, bool) or not isinstance(containers, int) or containers < 1:
        raise ArgumentError.invalid("containers", "a whole number >= 1", containers)
    if containers > len(tasks):
        raise ArgumentError.invalid(
            "containers", f"at most the job's {len(tasks)} virtual tasks", containers
        )
    weights = [1.0] * containers if capacities is None else list(capacities)
    if len(weights) != containers:
        raise ArgumentError.invalid(
            "capacities", f"one capacity per container ({containers})", len(weights)
        )
    # Ids that sort like their positions: the assignor breaks ties by id.
    ids = [f"container-{i:06d}" for i in range(containers)]
    # Stateless here: a new job has no state anywhere, so nothing needs warming up.
    result = assign(
        [TaskSpec(task, stateful=False) for task in tasks],
        [ClientState(i, capacity=w) for i, w in zip(ids, weights, strict=True)],
    )
    ordered = sorted(tasks, key=locality_key)
    chunks, start = [], 0
    for i in ids:
        end = start + len(result.assignment[i].active)
        chunks.append(tuple(sorted(ordered[start:end])))
        start = end
    return chunks
