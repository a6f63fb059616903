"""The autoscaler's policy: when a job should run on more or fewer containers, and why.

Pure: no I/O and no clock. The supervisor (:mod:`.supervisor`) passes what the
containers last reported (each task's lag from its current owner, each
container's processing rate) with the time, carries the policy's small state
from one evaluation to the next, and carries out the decisions it can (one
it must refuse, say while a move is under way, becomes a hold). Every step
is a named predicate or a small function, and every tie is broken the same
way, so a run of observations always gives the same decisions.

The recipe, in small steps (:func:`evaluate`):

1. **Mode.** Off: hold. Pinned at N: go to N (an operator's choice, so no
   window and no cool-down; bounds do not apply), then hold.
2. **Data** (:func:`missing_data`). Every task needs a lag from its current
   owner and every container a processing rate; otherwise hold. The policy
   never scales on missing data, and a gap restarts the window.
3. **Capacity** (:func:`saturated_capacity`). A container with a backlog
   (its tasks' lag above ``busy_lag``) processes as fast as it can: its rate
   is what one container can do. The latest such figure is kept.
4. **Wish.** ``below-min`` / ``above-max``: move into the bounds.
   ``lagging`` (:func:`lagging`): the backlog would take more than
   ``max_drain_s`` to drain at the observed rate; scale out to as many
   containers as the *input* rate needs at ``target_utilization`` of their
   capacity (:func:`containers_needed`; the input rate is the processing
   rate plus the backlog's growth over the window), so the headroom drains
   the backlog, and a backlog that already drains fast enough
   (``draining``) changes nothing. ``underused`` (:func:`underused`): the
   processing rate fits on fewer containers at ``target_utilization``;
   scale in to that many. Anything else is ``steady``.
   ``lagging`` at the task count (a container needs a task), with
   ``max_elasticity_factor`` above the job's factor: split, doubling the
   tasks (:func:`may_split`); the next evaluation after the cool-down can
   then scale out. ``over-split`` (:func:`over_split`): steady, above the
   job's defined factor, and each container would still have two tasks or
   more at half the factor: merge.
5. **Busy** (:func:`busy_task`). No scale-in while a task's lag is above
   ``busy_lag``; the wish starts over once it is not busy.
6. **Stabilize.** The wish must hold continuously for ``window_s``. A
   scale-in goes to the highest target seen over the window (Kubernetes'
   scale-down stabilization); a scale-out to the latest, as its input-rate
   figure improves with the window.
7. **Cool down.** No action within ``cooldown_s`` of the last one
   (:func:`acted` records it; the supervisor calls it after any change of
   the container count or the factor, a person's included).

A load step (input x4, then back) therefore gives one scale-out, sized for
the step, and one scale-in once it is over: the window keeps a blip from
acting, and sizing by input rate rather than by backlog keeps the scale-out
from overshooting into a correcting scale-in.

May import: :mod:`spark_elastic.errors` and the standard library.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from spark_elastic.errors import ArgumentError, ArgumentTypeError

__all__ = [
    "HOLD",
    "MERGE",
    "SCALE_IN",
    "SCALE_OUT",
    "SPLIT",
    "AutoscalerConfig",
    "ContainerLoad",
    "Decision",
    "Evaluation",
    "Observation",
    "PolicyState",
    "TaskLoad",
    "acted",
    "busy_task",
    "containers_needed",
    "drain_time",
    "evaluate",
    "lagging",
    "may_split",
    "missing_data",
    "over_split",
    "processing_rate",
    "saturated_capacity",
    "underused",
]

SCALE_OUT = "scale-out"
SCALE_IN = "scale-in"
SPLIT = "split"
MERGE = "merge"
HOLD = "hold"
MAX_FACTOR = 1024

TOLERANCE = 0.1
"""Kubernetes' HPA tolerance: a scale-out sizes for 10% less load than seen, a scale-in
for 10% more, so a load near a whole number of containers does not go out and back in."""

# JSON key (the HTTP API's, the store's) -> field name.
_JSON_KEYS = {
    "enabled": "enabled",
    "pinned": "pinned",
    "minContainers": "min_containers",
    "maxContainers": "max_containers",
    "maxDrainS": "max_drain_s",
    "windowS": "window_s",
    "cooldownS": "cooldown_s",
    "busyLag": "busy_lag",
    "targetUtilization": "target_utilization",
    "rateWindowS": "rate_window_s",
    "maxElasticityFactor": "max_elasticity_factor",
}
_FIELD_KEYS = {f: k for k, f in _JSON_KEYS.items()}


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _check(values: Mapping[str, Any], name: Callable[[str], str]) -> None:
    """Every setting's type and range, then the bounds against each other; one line each."""
    if not isinstance(values["enabled"], bool):
        raise ArgumentTypeError.wrong_type(name("enabled"), "true or false", values["enabled"])
    for key in ("pinned", "min_containers", "max_containers", "busy_lag"):
        value = values[key]
        if value is None and key in ("pinned", "max_containers"):
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise ArgumentTypeError.wrong_type(name(key), "a whole number", value)
        low = 0 if key == "busy_lag" else 1
        if value < low:
            raise ArgumentError.invalid(name(key), f"a whole number >= {low}", value)
    for key in ("max_drain_s", "window_s", "cooldown_s", "rate_window_s", "target_utilization"):
        value = values[key]
        if not _is_number(value):
            raise ArgumentTypeError.wrong_type(name(key), "a finite number", value)
        if key in ("max_drain_s", "rate_window_s") and value <= 0:
            raise ArgumentError.invalid(name(key), "a number of seconds > 0", value)
        if key in ("window_s", "cooldown_s") and value < 0:
            raise ArgumentError.invalid(name(key), "a number of seconds >= 0", value)
        if key == "target_utilization" and not 0 < value <= 1:
            raise ArgumentError.invalid(name(key), "a fraction above 0 and at most 1", value)
    factor = values["max_elasticity_factor"]
    if factor is not None and (isinstance(factor, bool) or not isinstance(factor, int)):
        raise ArgumentTypeError.wrong_type(
            name("max_elasticity_factor"), "a whole number (a power of two)", factor
        )
    if factor is not None and not (1 <= factor <= MAX_FACTOR and factor & (factor - 1) == 0):
        raise ArgumentError.invalid(
            name("max_elasticity_factor"), f"a power of two from 1 to {MAX_FACTOR}", factor
        )
    low, high = values["min_containers"], values["max_containers"]
    if high is not None and high < low:
        raise ArgumentError.invalid(
            name("max_containers"), f"at least {name('min_containers')} ({low})", high
        )


def _check_tasks(values: Mapping[str, Any], task_count: int, name: Callable[[str], str]) -> None:
    """No bound and no pin above the task count: a container needs a task."""
    for key in ("min_containers", "max_containers", "pinned"):
        value = values[key]
        if value is not None and value > task_count:
            raise ArgumentError.invalid(
                name(key), f"at most the job's {task_count} virtual tasks", value
            )


@dataclass(frozen=True)
class AutoscalerConfig:
    """What the autoscaler may do, and when.

    Attributes
    ----------
    enabled
        Whether it scales on load (off by default).
    pinned
        Hold the job at this many containers, whatever the load (overrides
        ``enabled`` and the bounds); None: not pinned.
    min_containers, max_containers
        Bounds on the container count; ``max_containers`` None means the
        job's task count (a container needs at least one task).
    max_drain_s
        Scale out when the backlog would take longer than this to drain at
        the observed processing rate.
    window_s
        How long a wish must hold continuously before it acts.
    cooldown_s
        No action this long after the last change of the container count.
    busy_lag
        A task with more lag than this is busy: no scale-in meanwhile. A
        container whose tasks lag more in total is saturated (its rate is
        its capacity).
    target_utilization
        The share of a container's capacity the policy plans for; the rest
        is headroom that drains backlogs.
    rate_window_s
        The span a container's processing rate is measured over; make it
        longer than a micro-batch takes, as a container that reported no
        batch in it processed nothing.
    max_elasticity_factor
        The highest factor the autoscaler may split the job to when it
        needs more containers than it has tasks; it merges back down to the
        job's defined factor once that leaves each container two tasks or
        more. None (the default): it never changes the factor.

    Raises
    ------
    ArgumentError, ArgumentTypeError
        A setting of the wrong type or out of range, or
        ``max_containers`` below ``min_containers``: one line naming it.
    """

    enabled: bool = False
    pinned: int | None = None
    min_containers: int = 1
    max_containers: int | None = None
    max_drain_s: float = 60.0
    window_s: float = 60.0
    cooldown_s: float = 120.0
    busy_lag: int = 1000
    target_utilization: float = 0.8
    rate_window_s: float = 30.0
    max_elasticity_factor: int | None = None

    def __post_init__(self) -> None:
        _check(self.__dict__, lambda key: key)

    @property
    def mode(self) -> str:
        """``"pinned"``, ``"on"`` or ``"off"``."""
        if self.pinned is not None:
            return "pinned"
        return "on" if self.enabled else "off"

    def max_for(self, task_count: int) -> int:
        """The largest container count allowed for a job of ``task_count`` tasks.

        Parameters
        ----------
        task_count
            The job's virtual tasks.

        Returns
        -------
        int
            ``max_containers``, or ``task_count`` when that is None.
        """
        return task_count if self.max_containers is None else self.max_containers

    def check_against(self, task_count: int) -> None:
        """Refuse bounds (and a pin) a job of ``task_count`` tasks cannot have.

        Parameters
        ----------
        task_count
            The job's virtual tasks: no more containers than that.

        Raises
        ------
        ArgumentError
            ``min_containers``, ``max_containers`` or ``pinned`` above the
            task count.
        """
        _check_tasks(self.__dict__, task_count, lambda key: key)

    def describe(self, task_count: int) -> str:
        """The settings in one line, for events, the status page and the CLI.

        Parameters
        ----------
        task_count
            The job's virtual tasks (the default maximum).

        Returns
        -------
        str
            For instance ``on: 1-12 containers, scale out past 60 s of
            backlog, window 60 s, cool-down 120 s``.
        """
        bounds = f"{self.min_containers}-{self.max_for(task_count)} containers"
        if self.mode == "pinned":
            return f"pinned at {self.pinned} containers"
        if self.max_elasticity_factor is not None:
            bounds += f", factor up to {self.max_elasticity_factor}"
        if self.mode == "off":
            return f"off (bounds {bounds})"
        return (
            f"on: {bounds}, scale out past {self.max_drain_s:g} s of backlog, "
            f"window {self.window_s:g} s, cool-down {self.cooldown_s:g} s"
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON form (the store's and the HTTP API's keys).

        Returns
        -------
        dict
            ``enabled``, ``pinned``, ``minContainers``, ``maxContainers``,
            ``maxDrainS``, ``windowS``, ``cooldownS``, ``busyLag``,
            ``targetUtilization``, ``rateWindowS``, ``maxElasticityFactor``.
        """
        return {key: getattr(self, name) for key, name in _JSON_KEYS.items()}

    @classmethod
    def from_json(cls, document: Mapping[str, Any]) -> AutoscalerConfig:
        """Read :meth:`to_json`'s form; missing keys take their defaults.

        Parameters
        ----------
        document
            The JSON object.

        Returns
        -------
        AutoscalerConfig
            The settings.

        Raises
        ------
        ArgumentError, ArgumentTypeError
            An unknown key or a bad value, named by its JSON key.
        """
        return cls().updated(document, pin_or_enable=False)

    def updated(
        self,
        changes: Mapping[str, Any],
        task_count: int | None = None,
        names: Mapping[str, str] | None = None,
        pin_or_enable: bool = True,
    ) -> AutoscalerConfig:
        """These settings with ``changes`` (JSON keys) applied: the HTTP API's update.

        ``{"enabled": b}`` turns scaling on load on or off and unpins;
        ``{"pinned": N}`` pins. Errors name the settings by their JSON keys,
        or by ``names``.

        Parameters
        ----------
        changes
            Some of :meth:`to_json`'s keys, with their new values.
        task_count
            The job's virtual tasks, to check the bounds and pin against
            (None: not checked).
        names
            JSON key -> the name the caller knows it by (a CLI flag).
        pin_or_enable
            Whether ``enabled`` and ``pinned`` exclude each other (a request
            does one or the other; a stored document has both).

        Returns
        -------
        AutoscalerConfig
            The new settings; ``self`` is unchanged.

        Raises
        ------
        ArgumentError, ArgumentTypeError
            An unknown key, ``enabled`` beside ``pinned``, a bad value, or
            bounds that contradict each other or the task count.
        """

        def name(field: str) -> str:
            key = _FIELD_KEYS[field]
            return (names or {}).get(key, key)

        unknown = sorted(set(changes) - set(_JSON_KEYS))
        if unknown:
            raise ArgumentError.invalid(
                "autoscaler", "a known setting", unknown[0], choices=list(_JSON_KEYS)
            )
        values = dict(self.__dict__)
        if pin_or_enable:
            if "enabled" in changes and "pinned" in changes:
                raise ArgumentError.invalid(
                    name("pinned"),
                    f"no {name('enabled')} beside it (pin, or turn on or off)",
                    changes["pinned"],
                )
            if "enabled" in changes:
                values["pinned"] = None
            if "pinned" in changes and changes["pinned"] is None:
                raise ArgumentError.invalid(name("pinned"), "a whole number >= 1", None)
        values.update({_JSON_KEYS[key]: value for key, value in changes.items()})
        _check(values, name)
        if task_count is not None:
            _check_tasks(values, task_count, name)
        return AutoscalerConfig(**values)


@dataclass(frozen=True)
class TaskLoad:
    """One task as its current owner last reported it.

    Attributes
    ----------
    task
        The virtual task's name.
    owner
        The container that runs it now.
    lag
        Records of its partitions not yet read; -1 when its owner has not
        reported it (no data).
    share
        The task's share of those records: ``1 / F`` for a key bucket of
        factor ``F`` (its partition's other records belong to its sibling
        buckets, which report the same lag), 1 for a task that owns its
        partitions whole. The job's backlog is the sum of ``lag * share``,
        each record counted once.
    """

    task: str
    owner: str
    lag: int
    share: float = 1.0


@dataclass(frozen=True)
class ContainerLoad:
    """One running container's processing rate.

    Attributes
    ----------
    container
        The container's id.
    rate
        Records of its own tasks it processed per second over the rate
        window (:func:`processing_rate`); None when not known yet.
    """

    container: str
    rate: float | None


@dataclass(frozen=True)
class Observation:
    """What the policy sees at one evaluation.

    Attributes
    ----------
    at
        The supervisor's monotonic time, in seconds.
    containers
        The job model's containers, oldest generation first: a scale-in
        removes them from the end, as the supervisor's does.
    tasks
        Every task of the job; their number is the job's task count.
    elasticity_factor
        The job's factor now.
    defined_factor
        The factor its definition gives: the autoscaler merges no lower.
    """

    at: float
    containers: tuple[ContainerLoad, ...]
    tasks: tuple[TaskLoad, ...]
    elasticity_factor: int = 1
    defined_factor: int = 1


@dataclass(frozen=True)
class PolicyState:
    """What the policy carries from one evaluation to the next.

    Attributes
    ----------
    wish
        The rule that has held continuously (``lagging``, ``underused``,
        ``below-min``, ``above-max``), or "" for none.
    since
        When it began to hold.
    since_lag
        The total lag then (the backlog's growth over the window gives the
        input rate).
    target
        The scale-in target kept over the window (the highest seen).
    factor
        The factor the wish goes to (None: the wish keeps the factor).
    last_action_at
        When the container count or the factor last changed.
    capacity
        Records per second one container processed while it had a backlog;
        None until one had.
    """

    wish: str = ""
    since: float | None = None
    since_lag: int = 0
    target: int = 0
    factor: int | None = None
    last_action_at: float | None = None
    capacity: float | None = None


@dataclass(frozen=True)
class Decision:
    """What the policy decided, and why.

    Attributes
    ----------
    action
        :data:`SCALE_OUT`, :data:`SCALE_IN`, :data:`SPLIT`, :data:`MERGE`
        or :data:`HOLD`.
    target
        The container count to go to (the current one for a hold, a split
        or a merge).
    rule
        The rule that decided, a stable name (``off``, ``pinned``,
        ``no-data``, ``steady``, ``lagging``, ``draining``, ``stalled``,
        ``at-max``, ``underused``, ``over-split``, ``below-min``,
        ``above-max``, ``busy``, ``stabilizing``, ``cooling-down``; the
        supervisor adds ``refused``).
    reason
        One line for people.
    factor
        The elasticity factor to go to, for a split or a merge; else None.
    """

    action: str
    target: int
    rule: str
    reason: str
    factor: int | None = None

    @property
    def acts(self) -> bool:
        """Whether the container count or the factor should change."""
        return self.action != HOLD

    def to_json(self) -> dict[str, Any]:
        """The JSON form.

        Returns
        -------
        dict
            ``action``, ``target``, ``rule``, ``reason``, and
            ``elasticityFactor`` for a split or a merge.
        """
        out: dict[str, Any] = {
            "action": self.action,
            "target": self.target,
            "rule": self.rule,
            "reason": self.reason,
        }
        if self.factor is not None:
            out["elasticityFactor"] = self.factor
        return out


@dataclass(frozen=True)
class Evaluation:
    """A decision and the state to carry to the next evaluation.

    Attributes
    ----------
    decision
        What to do now.
    state
        The policy's state after this evaluation (call :func:`acted` on it
        once a scale is carried out).
    """

    decision: Decision
    state: PolicyState


# 2. data


def missing_data(observation: Observation) -> str | None:
    """Why the observation cannot be judged, or None when it can.

    Parameters
    ----------
    observation
        The evaluation's input.

    Returns
    -------
    str or None
        The first task (in the observation's order) without a lag from its
        owner, or the first container without a rate; None when all are there.
    """
    for task in observation.tasks:
        if task.lag < 0:
            return f"task {task.task!r} has no lag from its owner {task.owner!r} yet"
    for container in observation.containers:
        if container.rate is None:
            return f"container {container.container!r} has no processing rate yet"
    if not observation.containers:
        return "no containers"
    return None


def _total_lag(observation: Observation) -> int:
    """The job's backlog in records, each counted once (see :attr:`TaskLoad.share`)."""
    return round(sum(t.lag * t.share for t in observation.tasks))


def _total_rate(observation: Observation) -> float:
    return sum(c.rate or 0.0 for c in observation.containers)


def drain_time(observation: Observation) -> float:
    """Seconds the whole backlog would take to drain at the observed processing rate.

    Parameters
    ----------
    observation
        An observation with no missing data.

    Returns
    -------
    float
        Total lag over total rate: 0 with no backlog, ``inf`` with a
        backlog and no records processed.
    """
    lag, rate = _total_lag(observation), _total_rate(observation)
    if lag <= 0:
        return 0.0
    return math.inf if rate <= 0 else lag / rate


# 3. capacity


def saturated_capacity(observation: Observation, busy_lag: int) -> float | None:
    """What one container processes when it has a backlog, as this observation shows it.

    Parameters
    ----------
    observation
        An observation with no missing data.
    busy_lag
        A container whose tasks' backlog is more than this in total is
        saturated.

    Returns
    -------
    float or None
        The mean rate of the saturated containers that processed anything;
        None when none did.
    """
    lag: dict[str, float] = {}
    for task in observation.tasks:
        lag[task.owner] = lag.get(task.owner, 0) + task.lag * task.share
    rates = [
        c.rate
        for c in observation.containers
        if c.rate is not None and c.rate > 0 and lag.get(c.container, 0) > busy_lag
    ]
    return sum(rates) / len(rates) if rates else None


# 4. wish


def lagging(observation: Observation, config: AutoscalerConfig) -> bool:
    """Whether the backlog would take longer than ``max_drain_s`` to drain.

    Parameters
    ----------
    observation
        An observation with no missing data.
    config
        The settings.

    Returns
    -------
    bool
        ``drain_time(observation) > config.max_drain_s``.
    """
    return drain_time(observation) > config.max_drain_s


def containers_needed(rate: float, capacity: float, utilization: float) -> int:
    """How many containers process ``rate`` at ``utilization`` of their ``capacity``.

    Parameters
    ----------
    rate
        Records per second to process.
    capacity
        Records per second one container can process (> 0).
    utilization
        The share of capacity to plan for, above 0 and at most 1.

    Returns
    -------
    int
        At least 1; rounded up, with a hair of tolerance so an exact fit
        does not round up through float error.
    """
    return max(1, math.ceil(rate / (capacity * utilization) - 1e-9))


def underused(
    observation: Observation, config: AutoscalerConfig, capacity: float | None
) -> int | None:
    """The smaller container count the observed rate fits on, or None.

    Parameters
    ----------
    observation
        An observation with no missing data.
    config
        The settings (``target_utilization``, ``min_containers``).
    capacity
        One container's capacity in records per second; None when not seen.

    Returns
    -------
    int or None
        ``max(needed, min_containers)`` when that is below the current
        count; None when the job needs all it has, or no capacity is known.
    """
    if capacity is None:
        return None
    rate = _total_rate(observation) * (1 + TOLERANCE)
    needed = containers_needed(rate, capacity, config.target_utilization)
    target = max(needed, config.min_containers)
    return target if target < len(observation.containers) else None


def may_split(observation: Observation, config: AutoscalerConfig, needed: int) -> bool:
    """Whether more containers than tasks are wanted and a split may make the tasks.

    Parameters
    ----------
    observation
        An observation with no missing data.
    config
        The settings (``max_containers``, ``max_elasticity_factor``).
    needed
        The containers the input rate needs.

    Returns
    -------
    bool
        True when ``needed`` exceeds the task count, the container bound is
        the task count (no lower maximum was set), and twice the factor is
        within ``max_elasticity_factor``.
    """
    tasks = len(observation.tasks)
    return (
        config.max_elasticity_factor is not None
        and observation.elasticity_factor * 2 <= config.max_elasticity_factor
        and needed > tasks
        and (config.max_containers is None or config.max_containers > tasks)
    )


def over_split(observation: Observation) -> bool:
    """Whether the job runs above its defined factor with tasks to spare.

    Parameters
    ----------
    observation
        An observation with no missing data.

    Returns
    -------
    bool
        True when the factor is above the defined one and, at half of it,
        every container would still have two tasks or more (so a later
        scale-out has room before it needs another split).
    """
    return observation.elasticity_factor > observation.defined_factor and len(
        observation.tasks
    ) // 2 >= 2 * len(observation.containers)


def busy_task(observation: Observation, config: AutoscalerConfig) -> str | None:
    """Why a scale-in must wait, or None.

    A task lagging more than ``busy_lag`` is busy, whichever container owns
    it. A small lag is not: under a steady load every task has one when its
    owner reports (the records that arrived during its batch), and a moved
    task's old owner keeps running it until its new owner is warm, so the
    records it has not applied yet are not at risk.

    Parameters
    ----------
    observation
        An observation with no missing data.
    config
        The settings (``busy_lag``).

    Returns
    -------
    str or None
        The first task (in the observation's order) with lag above
        ``busy_lag``; None when no task is busy.
    """
    for task in observation.tasks:
        if task.lag > config.busy_lag:
            return f"task {task.task!r} is busy ({task.lag} records of lag > {config.busy_lag})"
    return None


@dataclass(frozen=True)
class _Wish:
    """A rule that holds now (``rule``; "" for none), its target, and the hold's rule
    when the target is the current count (``draining``, ``at-max``, ``stalled``, ``steady``);
    ``factor`` for a wish to split or merge."""

    rule: str
    target: int
    reason: str
    hold_rule: str = ""
    factor: int | None = None


def _seconds(value: float) -> str:
    return "forever" if math.isinf(value) else f"{value:.0f} s"


def _wish(
    config: AutoscalerConfig, state: PolicyState, observation: Observation, max_c: int
) -> _Wish:
    current = len(observation.containers)
    if current < config.min_containers:
        return _Wish("below-min", config.min_containers, f"{current} containers, under the bounds")
    if current > max_c:
        return _Wish("above-max", max_c, f"{current} containers, over the bounds")
    drain, rate, lag = drain_time(observation), _total_rate(observation), _total_lag(observation)
    if lagging(observation, config):
        backlog = (
            f"the backlog ({lag} records) would take {_seconds(drain)} to drain "
            f"(limit {config.max_drain_s:g} s)"
        )
        if rate <= 0:
            return _Wish("", current, f"{backlog}; more containers would not help", "stalled")
        # The input rate is what was processed plus what the backlog grew by meanwhile.
        growth = 0.0
        if state.wish == "lagging" and state.since is not None and observation.at > state.since:
            growth = (lag - state.since_lag) / (observation.at - state.since)
        capacity = state.capacity or rate / current
        inflow_rate = max(rate + growth, 0.0) * (1 - TOLERANCE)
        needed = containers_needed(inflow_rate, capacity, config.target_utilization)
        inflow = f"input ~{rate + growth:.0f} records/s, {capacity:.0f}/s per container"
        if min(max_c, needed) > current:
            return _Wish("lagging", min(max_c, needed), f"{backlog}; {inflow}")
        if needed > current and may_split(observation, config, needed):
            factor = observation.elasticity_factor * 2
            return _Wish(
                "lagging",
                current,
                f"{backlog}; {inflow}: {needed} containers wanted, more than the "
                f"{len(observation.tasks)} tasks; split to factor {factor}",
                factor=factor,
            )
        if needed > current:
            return _Wish("lagging", current, f"{backlog}; at the maximum of {max_c}", "at-max")
        return _Wish("lagging", current, f"{backlog}; {inflow} fits {current}", "draining")
    target = underused(observation, config, state.capacity)
    if target is not None:
        return _Wish(
            "underused",
            target,
            f"{rate:.0f} records/s fit {target} containers at "
            f"{config.target_utilization:.0%} of {state.capacity:.0f}/s each",
        )
    if over_split(observation):
        factor = observation.elasticity_factor // 2
        return _Wish(
            "over-split",
            current,
            f"{current} containers run {len(observation.tasks)} tasks at factor "
            f"{observation.elasticity_factor}, above the job's {observation.defined_factor}; "
            f"merge to factor {factor}",
            factor=factor,
        )
    if state.capacity is None:
        reason = "no container has had a backlog yet (capacity unknown)"
    else:
        reason = f"{rate:.0f} records/s, the backlog drains in {_seconds(drain)}"
    return _Wish("", current, reason, "steady")


# 6. stabilize


def _stabilized(state: PolicyState, wish: _Wish, at: float, lag: int) -> PolicyState:
    # A scale-in's target must itself hold for the window: one step down, not a
    # staircase while the rate settles. A scale-out's improves with the window.
    scale_in = wish.target < state.target and wish.rule in ("underused", "above-max")
    if wish.rule != state.wish or scale_in or wish.factor != state.factor:
        return replace(
            state, wish=wish.rule, since=at, since_lag=lag, target=wish.target, factor=wish.factor
        )
    if wish.rule == "underused":
        # A higher target does not restart the window: the most cautious one is kept.
        return replace(state, target=max(state.target, wish.target))
    return replace(state, target=wish.target)


def _reset(state: PolicyState) -> PolicyState:
    return replace(state, wish="", since=None, since_lag=0, target=0, factor=None)


def _hold(current: int, rule: str, reason: str) -> Decision:
    return Decision(HOLD, current, rule, reason)


def evaluate(config: AutoscalerConfig, state: PolicyState, observation: Observation) -> Evaluation:
    """One evaluation of the policy: the module's recipe, steps 1 to 7.

    Parameters
    ----------
    config
        The settings.
    state
        The state the previous evaluation returned (``PolicyState()`` at first).
    observation
        What the containers last reported, and the time.

    Returns
    -------
    Evaluation
        The decision, and the state to pass next time.
    """
    current = len(observation.containers)
    # 1. mode
    if config.pinned is not None:
        reason = f"pinned at {config.pinned} containers"
        if current == config.pinned:
            return Evaluation(_hold(current, "pinned", reason), _reset(state))
        action = SCALE_OUT if config.pinned > current else SCALE_IN
        return Evaluation(Decision(action, config.pinned, "pinned", reason), _reset(state))
    if not config.enabled:
        return Evaluation(_hold(current, "off", "autoscaler off"), _reset(state))
    # 2. data
    gap = missing_data(observation)
    if gap is not None:
        return Evaluation(_hold(current, "no-data", f"no data: {gap}"), _reset(state))
    # 3. capacity
    seen = saturated_capacity(observation, config.busy_lag)
    if seen is not None:
        state = replace(state, capacity=seen)
    # 4. wish
    max_c = config.max_for(len(observation.tasks))
    wish = _wish(config, state, observation, max_c)
    if not wish.rule:
        return Evaluation(_hold(current, wish.hold_rule, wish.reason), _reset(state))
    # 5. busy: a merge takes tasks down as a scale-in takes containers
    merging = wish.factor is not None and wish.factor < observation.elasticity_factor
    if wish.target < current or merging:
        busy = busy_task(observation, config)
        if busy is not None:
            what = "merge" if merging else "scale-in"
            return Evaluation(_hold(current, "busy", f"no {what}: {busy}"), _reset(state))
    # 6. stabilize
    state = _stabilized(state, wish, observation.at, _total_lag(observation))
    if state.target == current and state.factor is None:
        return Evaluation(_hold(current, wish.hold_rule, wish.reason), state)
    if state.factor is not None:
        action = SPLIT if state.factor > observation.elasticity_factor else MERGE
        want = f"{action} to factor {state.factor} wanted ({wish.rule}: {wish.reason})"
    else:
        action = SCALE_OUT if state.target > current else SCALE_IN
        want = f"{action} to {state.target} wanted ({wish.rule}: {wish.reason})"
    # 7. cool down, then the window
    if state.last_action_at is not None:
        left = state.last_action_at + config.cooldown_s - observation.at
        if left > 0:
            return Evaluation(
                _hold(current, "cooling-down", f"{want}; cooling down, {left:.0f} s left"), state
            )
    held = observation.at - (state.since if state.since is not None else observation.at)
    if held < config.window_s:
        return Evaluation(
            _hold(
                current,
                "stabilizing",
                f"{want}; held {held:.0f} of {config.window_s:g} s",
            ),
            state,
        )
    reason = f"{wish.rule}: {wish.reason} (held {held:.0f} s)"
    return Evaluation(Decision(action, state.target, wish.rule, reason, state.factor), state)


def acted(state: PolicyState, at: float) -> PolicyState:
    """The state after the container count changed at ``at``: cool-down starts, wishes reset.

    Parameters
    ----------
    state
        The state before.
    at
        When the change was made (the supervisor's monotonic time).

    Returns
    -------
    PolicyState
        The state to carry on with.
    """
    return replace(_reset(state), last_action_at=at)


# the supervisor's figures


def processing_rate(
    first_report_at: float | None,
    reports: Sequence[tuple[float, int]],
    now: float,
    window_s: float,
) -> float | None:
    """A container's processing rate over the last ``window_s``, from its progress reports.

    Each report carries the records its batch processed, received at a time:
    the records of a report count for the span before it. A container's very
    first report counts for nothing (its batch began before anything was
    known of it).

    Parameters
    ----------
    first_report_at
        When the container's first report was received; None if never.
    reports
        ``(received at, records processed)`` pairs, oldest first; older ones
        than the window may be left out.
    now
        The time of the evaluation.
    window_s
        The span to measure over.

    Returns
    -------
    float or None
        Records per second over the window (a container that reported
        nothing in it processed nothing); for a container younger than the
        window, from its first report to its last (then it needs a second
        report); None without enough reports.
    """
    if first_report_at is None:
        return None
    if first_report_at <= now - window_s:
        return sum(n for at, n in reports if now - window_s < at <= now) / window_s
    # Young: the span its reports cover, not up to now, or a rate read between two
    # reports would come out low and look like a drop in load.
    later = [(at, n) for at, n in reports if first_report_at < at <= now]
    if not later or later[-1][0] <= first_report_at:
        return None
    return sum(n for _, n in later) / (later[-1][0] - first_report_at)
