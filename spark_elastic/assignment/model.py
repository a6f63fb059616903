"""The task assignor's inputs and outputs: frozen, validated dataclasses (KIP-441 names).

Pure Python, no Spark. :func:`spark_elastic.assign` takes :class:`TaskSpec`,
:class:`ClientState` and :class:`AssignmentConfig` values and returns an
:class:`AssignmentResult`. Each value checks itself when built, so a bad
argument fails where it is written, not deep inside the algorithm.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from spark_elastic.errors import ArgumentError, ArgumentTypeError

__all__ = [
    "AssignmentConfig",
    "AssignmentResult",
    "AssignmentWarning",
    "ClientAssignment",
    "ClientState",
    "ProbingRebalance",
    "TaskSpec",
    "natural_key",
]

MIN_PROBING_REBALANCE_INTERVAL_MS = 60_000
_DIGITS = re.compile(r"\d+")


def natural_key(text: str) -> tuple[str, str]:
    """Sort key that orders ``"T2"`` before ``"T10"``; ties fall back to the plain string.

    Each run of digits is replaced by its length (8 digits, zero-padded) and its
    value without leading zeros, so numbers compare by magnitude.
    """

    def padded(match: re.Match[str]) -> str:
        digits = match[0].lstrip("0") or "0"
        return f"{len(digits):08d}{digits}"

    return _DIGITS.sub(padded, text), text


def _int_at_least(value: object, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError.wrong_type(name, f"an int >= {minimum:_}", value)
    if value < minimum:
        raise ArgumentError.invalid(name, f"an int >= {minimum:_}", value)
    return value


def _identifier(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise ArgumentTypeError.wrong_type(name, "a non-empty str", value)
    if not value:
        raise ArgumentError.invalid(name, "a non-empty str", value)
    return value


def _flag(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise ArgumentTypeError.wrong_type(name, "a bool", value)
    return value


def _task_ids(value: object, name: str) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise ArgumentTypeError.wrong_type(name, "a sequence of task ids", value)
    ids = tuple(_identifier(item, f"{name}[{i}]") for i, item in enumerate(value))
    seen: set[str] = set()
    for task in ids:
        if task in seen:
            raise ArgumentError.invalid(name, "each task at most once", task)
        seen.add(task)
    return ids


@dataclass(frozen=True, slots=True)
class AssignmentConfig:
    """How the assignor trades availability against balance (KIP-441's settings).

    Parameters
    ----------
    acceptable_recovery_lag
        A client at most this many offsets behind on a task's state counts as
        caught up: it may take the task as active at once. Default 10,000; >= 0.
    num_standby_replicas
        Hot standbys kept for every stateful task, each on a client other than
        the active's. Default 0; >= 0.
    max_warmup_replicas
        Warm-up replicas allowed in flight at once across the cluster: extra
        replicas that restore a task's state on the client it is meant to move
        to. Default 2; >= 1.
    probing_rebalance_interval_ms
        How long to wait before the follow-up (probing) rebalance that checks
        whether warm-ups have caught up. Default 600,000 (10 minutes); >= 60,000.
    balance_tolerance
        Relative slack on a client's capacity share (KIP-441's older "version 4.0"
        imbalance factor): a load counts as balanced when it is within one task
        *or* within this fraction of its share. Default 0.0 (within one task);
        from 0 up to, not including, 1.
    """

    acceptable_recovery_lag: int = 10_000
    num_standby_replicas: int = 0
    max_warmup_replicas: int = 2
    probing_rebalance_interval_ms: int = 600_000
    balance_tolerance: float = 0.0

    def __post_init__(self) -> None:
        _int_at_least(self.acceptable_recovery_lag, "acceptable_recovery_lag", 0)
        _int_at_least(self.num_standby_replicas, "num_standby_replicas", 0)
        _int_at_least(self.max_warmup_replicas, "max_warmup_replicas", 1)
        _int_at_least(
            self.probing_rebalance_interval_ms,
            "probing_rebalance_interval_ms",
            MIN_PROBING_REBALANCE_INTERVAL_MS,
        )
        tolerance = self.balance_tolerance
        if isinstance(tolerance, bool) or not isinstance(tolerance, int | float):
            raise ArgumentTypeError.wrong_type(
                "balance_tolerance", "a number from 0 up to 1", tolerance
            )
        if not (0 <= tolerance < 1):
            raise ArgumentError.invalid(
                "balance_tolerance", "a number from 0 up to, not including, 1", tolerance
            )
        object.__setattr__(self, "balance_tolerance", float(tolerance))


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """One task to assign.

    Parameters
    ----------
    id
        The task's unique name.
    stateful
        Whether the task keeps state that a new owner must restore first.
    group
        The task's group (Kafka's sub-topology): tasks of one group do similar
        work, so the assignor spreads each group evenly over the clients.
    end_offset
        For a stateful task, the total offsets of its state: the lag of a
        client that has none of it (a larger lag counts as this). ``None``, the
        default, when unknown: a client without state for the task is then not
        caught up, and every reported lag, however large, counts as some state.
        Ignored for a stateless task.
    """

    id: str
    stateful: bool = True
    group: str = ""
    end_offset: int | None = None

    def __post_init__(self) -> None:
        _identifier(self.id, "task id")
        _flag(self.stateful, f"task {self.id!r}: stateful")
        if not isinstance(self.group, str):
            raise ArgumentTypeError.wrong_type(f"task {self.id!r}: group", "a str", self.group)
        end_offset = self.end_offset
        if end_offset is not None:
            name, expected = f"task {self.id!r}: end_offset", "an int >= 0, or None when unknown"
            if isinstance(end_offset, bool) or not isinstance(end_offset, int):
                raise ArgumentTypeError.wrong_type(name, expected, end_offset)
            if end_offset < 0:
                raise ArgumentError.invalid(name, expected, end_offset)


@dataclass(frozen=True, slots=True)
class ClientState:
    """One client (a container or instance) as it reports itself at a rebalance.

    Parameters
    ----------
    id
        The client's unique name.
    capacity
        Its relative size: a client of capacity 2 gets twice the tasks of one of
        capacity 1. A finite number > 0; default 1.
    lags
        Offsets behind, per stateful task whose state the client has (in whole
        or in part). A task it does not list is one it has no state for.
    previous_active
        Tasks it ran as active until this rebalance: they count as caught up.
        (Any sequence of ids; stored as a tuple, as are the next two.)
    previous_standby
        Tasks it kept as standby replicas until this rebalance.
    previous_warmup
        Tasks it was warming up until this rebalance. Reporting them apart from
        standbys lets the assignor finish the moves it started (reported as
        standbys instead, they still count as replicas, but a tie between
        equally caught-up clients may then restart a move elsewhere).
    leaving
        Whether it is about to shut down: it gets no new task of any kind, and
        is reported in :attr:`AssignmentResult.may_shut_down` once it holds none.
    """

    id: str
    capacity: float = 1.0
    lags: Mapping[str, int] = field(default_factory=dict, hash=False)
    previous_active: Sequence[str] = ()
    previous_standby: Sequence[str] = ()
    previous_warmup: Sequence[str] = ()
    leaving: bool = False

    def __post_init__(self) -> None:
        name = _identifier(self.id, "client id")
        capacity = self.capacity
        if isinstance(capacity, bool) or not isinstance(capacity, int | float):
            raise ArgumentTypeError.wrong_type(
                f"client {name!r}: capacity", "a number > 0", capacity
            )
        try:
            finite = math.isfinite(capacity)
        except OverflowError:  # an int too large for a float
            finite = False
        if not (finite and capacity > 0):
            raise ArgumentError.invalid(
                f"client {name!r}: capacity", "a finite number > 0", capacity
            )
        if not isinstance(self.lags, Mapping):
            raise ArgumentTypeError.wrong_type(
                f"client {name!r}: lags", "a mapping of task id to lag", self.lags
            )
        lags = {
            _identifier(task, f"client {name!r}: lags key"): _int_at_least(
                lag, f"client {name!r}: lag of {task!r}", 0
            )
            for task, lag in self.lags.items()
        }
        active = _task_ids(self.previous_active, f"client {name!r}: previous_active")
        standby = _task_ids(self.previous_standby, f"client {name!r}: previous_standby")
        warmup = _task_ids(self.previous_warmup, f"client {name!r}: previous_warmup")
        _flag(self.leaving, f"client {name!r}: leaving")
        object.__setattr__(self, "capacity", float(capacity))
        object.__setattr__(self, "lags", MappingProxyType(lags))
        object.__setattr__(self, "previous_active", active)
        object.__setattr__(self, "previous_standby", standby)
        object.__setattr__(self, "previous_warmup", warmup)


@dataclass(frozen=True, slots=True)
class ClientAssignment:
    """What one client runs after the rebalance; task ids in natural order.

    Attributes
    ----------
    active
        Tasks it processes.
    standby
        Stateful tasks it keeps a hot replica of (``num_standby_replicas`` per task).
    warmup
        Stateful tasks it restores so that a later rebalance can move them
        here; extra replicas, not counted as standbys.
    """

    active: tuple[str, ...] = ()
    standby: tuple[str, ...] = ()
    warmup: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ProbingRebalance:
    """Whether the group should rebalance again once warm-ups had time to catch up.

    Attributes
    ----------
    needed
        ``True`` while the assignment is not yet the balanced target.
    after_ms
        When to rebalance (the configured interval), or ``None`` when not needed.
    """

    needed: bool
    after_ms: int | None


@dataclass(frozen=True, slots=True)
class AssignmentWarning:
    """Something the assignor could not do, or input it ignored; the assignment is still valid.

    Attributes
    ----------
    kind
        ``"standby-shortfall"``: a stateful task got fewer standbys than
        ``num_standby_replicas``, because fewer staying clients than that are
        left besides its active (``client`` is ``None``).
        ``"unknown-task"``: a client reported state or a previous replica of a
        task that is not in the job (removed since); ignored.
        ``"stateless-task"``: a client reported a lag, standby or warm-up of a
        task that is stateless (now); ignored.
    task
        The task concerned.
    client
        The client that reported it, or ``None`` for a warning about the task alone.
    detail
        One human-readable sentence: what was found and what was done.
    """

    kind: str
    task: str
    client: str | None
    detail: str


@dataclass(frozen=True, slots=True)
class AssignmentResult:
    """The outcome of one rebalance.

    Attributes
    ----------
    assignment
        Every client, in natural order of id, with its tasks.
    probing_rebalance
        Whether (and when) to rebalance again.
    may_shut_down
        Leaving clients that hold nothing any more and may stop now.
    pending_moves
        Replicas (active or standby) of the balanced target that are not in
        place yet because their client is still catching up; 0 once balanced.
    warnings
        What the assignor could not do (standbys short of the configured
        count) or ignored (stale reports of removed or stateless tasks), in
        order of kind, task and client; empty when it did all it was asked.
    """

    assignment: Mapping[str, ClientAssignment] = field(hash=False)
    probing_rebalance: ProbingRebalance
    may_shut_down: tuple[str, ...]
    pending_moves: int = field(default=0)
    warnings: tuple[AssignmentWarning, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "assignment", MappingProxyType(dict(self.assignment)))
