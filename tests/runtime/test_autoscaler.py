"""The autoscaler's policy, as pure steps: observations in, decisions out, no clock, no I/O.

A small simulated job (containers of a fixed capacity, an input rate that
steps up and back) drives the policy second by second; the other specs feed
it hand-made observations.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from spark_elastic.errors import ArgumentError, ArgumentTypeError
from spark_elastic.runtime.coordinator.autoscaler import (
    HOLD,
    MERGE,
    SCALE_IN,
    SCALE_OUT,
    SPLIT,
    AutoscalerConfig,
    ContainerLoad,
    Decision,
    Observation,
    PolicyState,
    TaskLoad,
    acted,
    drain_time,
    evaluate,
    processing_rate,
)

TASKS = tuple(f"Partition {p}_{b}_4" for p in range(3) for b in range(4))
ON = AutoscalerConfig(enabled=True, max_drain_s=30, window_s=60, cooldown_s=120)


def observe(
    at: float,
    containers: int,
    lag: int | dict[str, int] = 0,
    rate: float | dict[str, float] | None = 1000.0,
    factor: int = 4,
    defined: int = 4,
) -> Observation:
    """``containers`` containers (c0 oldest) dealt the tasks round robin; each task lags
    ``lag`` (or ``lag[task]``, 0 if absent) and each container processes ``rate``/s
    (or ``rate[container]``). The job has 3 partitions, at ``factor`` (its definition's:
    ``defined``)."""
    ids = [f"c{i}" for i in range(containers)]
    tasks = tuple(f"Partition {p}_{b}_{factor}" for p in range(3) for b in range(factor))
    lags = lag if isinstance(lag, dict) else dict.fromkeys(tasks, lag)
    rates = rate if isinstance(rate, dict) else dict.fromkeys(ids, rate)
    return Observation(
        at,
        tuple(ContainerLoad(c, rates[c]) for c in ids),
        tuple(TaskLoad(t, ids[i % containers], lags.get(t, 0)) for i, t in enumerate(tasks)),
        factor,
        defined,
    )


def run(
    config: AutoscalerConfig,
    observations: list[Observation],
    state: PolicyState | None = None,
) -> tuple[list[Decision], PolicyState]:
    state = state or PolicyState()
    decisions = []
    for observation in observations:
        evaluation = evaluate(config, state, observation)
        decisions.append(evaluation.decision)
        state = evaluation.state
    return decisions, state


@dataclass
class SimulatedJob:
    """A job whose containers each process up to ``capacity`` records/s.

    Each second, records arrive at ``input_rate(t)``, the containers process
    what they can, and the rest waits as lag, spread evenly over the tasks.
    For ``startup_s`` after a change of the container count the new
    containers have not reported (no data), as in a real handover.
    """

    containers: int
    input_rate: Callable[[int], float]
    capacity: float = 1000.0
    startup_s: int = 5
    backlog: float = 0.0
    actions: list[tuple[int, Decision]] = field(default_factory=list)
    peak_lag: float = 0.0

    def run(self, config: AutoscalerConfig, seconds: int) -> SimulatedJob:
        state, reporting_from = PolicyState(), 0
        for t in range(seconds):
            processed = min(self.input_rate(t) + self.backlog, self.containers * self.capacity)
            self.backlog += self.input_rate(t) - processed
            self.peak_lag = max(self.peak_lag, self.backlog)
            if t < reporting_from:
                observation = observe(t, self.containers, lag=-1, rate=None)
            else:
                observation = observe(
                    t, self.containers, int(self.backlog / len(TASKS)), processed / self.containers
                )
            evaluation = evaluate(config, state, observation)
            state = evaluation.state
            if evaluation.decision.acts:
                self.actions.append((t, evaluation.decision))
                self.containers = evaluation.decision.target
                state = acted(state, t)
                reporting_from = t + self.startup_s
        return self


def load_step(base: float, factor: float, start: int, end: int) -> Callable[[int], float]:
    return lambda t: base * factor if start <= t < end else base


def test_a_load_step_gives_one_scale_out_sized_for_it_and_one_scale_in_after_it() -> None:
    # 1200 records/s on 2 containers of 1000/s, x4 from t=300 to t=900.
    job = SimulatedJob(2, load_step(1200, 4, 300, 900)).run(ON, 1800)
    assert [(d.action, d.target) for _, d in job.actions] == [(SCALE_OUT, 6), (SCALE_IN, 2)]
    (out_at, out), (in_at, back) = job.actions
    # The backlog must be lagging for the whole window (60 s) before it acts...
    assert 300 + ON.window_s < out_at < 300 + ON.window_s + 30
    assert out.rule == "lagging"
    assert "input ~4800 records/s" in out.reason
    # ...and the load must be back for a window before the scale-in.
    assert 900 + ON.window_s <= in_at < 900 + ON.window_s + 30
    assert back.rule == "underused"
    assert job.backlog == 0
    # Against the same job at a fixed size, whose backlog only grows during the step.
    fixed = SimulatedJob(2, load_step(1200, 4, 300, 900)).run(AutoscalerConfig(), 1800)
    assert fixed.actions == []
    assert job.peak_lag < fixed.peak_lag / 4


@pytest.mark.parametrize(("base", "factor", "containers"), [(600, 4, 1), (1000, 3, 2), (300, 4, 1)])
def test_other_load_steps_also_give_one_action_each_way(
    base: float, factor: float, containers: int
) -> None:
    job = SimulatedJob(containers, load_step(base, factor, 300, 900)).run(ON, 1800)
    assert [d.action for _, d in job.actions] == [SCALE_OUT, SCALE_IN]
    assert job.actions[-1][1].target == containers


def test_a_blip_shorter_than_the_window_changes_nothing() -> None:
    blip = [observe(t, 2, lag=10_000 if 10 <= t < 60 else 0) for t in range(200)]
    decisions, _ = run(ON, blip)
    assert not any(d.acts for d in decisions)
    assert {d.rule for d in decisions[10:60]} == {"stabilizing"}


def test_the_wish_must_hold_continuously_for_the_window() -> None:
    lagging = [observe(t, 2, lag=10_000) for t in range(70)]
    decisions, _ = run(ON, lagging)
    acting = [i for i, d in enumerate(decisions) if d.acts]
    assert acting[0] == 60  # the first observation at which it has held 60 s
    assert "held 59 of 60 s" in decisions[59].reason
    # One observation without the wish in between starts the window over.
    broken = [
        *lagging[:40],
        observe(40, 2, lag=0),
        *[observe(t, 2, lag=10_000) for t in range(41, 102)],
    ]
    decisions, _ = run(ON, broken)
    assert next(i for i, d in enumerate(decisions) if d.acts) == 101


def test_no_action_during_the_cool_down_after_any_change() -> None:
    state = acted(PolicyState(), 0.0)
    lagging = [observe(t, 2, lag=10_000) for t in range(130)]
    decisions, _ = run(ON, lagging, state)
    assert not any(d.acts for d in decisions[:120])
    assert decisions[100].rule == "cooling-down"
    assert "20 s left" in decisions[100].reason
    # The window ran during the cool-down: the wish acts as soon as it ends.
    assert decisions[120].acts


def test_a_busy_task_blocks_scale_in_and_the_window_starts_over() -> None:
    capacity = run(ON, [observe(0, 4, lag=10_000, rate=1000)])[1]  # saw what a container can do
    idle = [observe(t, 4, lag=0, rate=200) for t in range(1, 200)]
    # Task 5 (c1's) lags above busy_lag (1000): c1 runs flat out, the others idle.
    busy_task = dict.fromkeys(TASKS, 0) | {TASKS[5]: 1500}
    rates = {"c0": 200.0, "c1": 1000.0, "c2": 200.0, "c3": 200.0}
    busy = [observe(t, 4, lag=busy_task, rate=rates) for t in range(200, 230)]
    decisions, _ = run(ON, [*idle[:50], *busy, *idle[50:]], capacity)
    assert not any(d.acts for d in decisions[:80])
    assert decisions[60].rule == "busy"
    assert f"task '{TASKS[5]}' is busy (1500 records of lag > 1000)" in decisions[60].reason
    first = next(i for i, d in enumerate(decisions) if d.acts)
    assert first == 80 + 60  # a full window after the task stopped being busy
    assert (decisions[first].action, decisions[first].target) == (SCALE_IN, 2)


def test_a_small_backlog_under_a_steady_load_does_not_block_a_scale_in_on_any_container() -> None:
    capacity = run(ON, [observe(0, 4, lag=10_000, rate=1000)])[1]
    # Scaling 4 -> 2 removes c2 and c3, the newest; task 2 is c2's (round robin). Under a
    # steady load every task lags a little when its owner reports: that is not busy.
    small = dict.fromkeys(TASKS, 0) | {TASKS[2]: 10, TASKS[0]: 10}
    assert evaluate(ON, capacity, observe(1, 4, lag=small, rate=200)).decision.rule == (
        "stabilizing"
    )
    # Above the busy limit it blocks, on a leaving container as on one that stays (its
    # owner then runs flat out).
    for task, owner in ((TASKS[2], "c2"), (TASKS[0], "c0")):
        busy = dict.fromkeys(TASKS, 0) | {task: 1500}
        rates = dict.fromkeys(("c0", "c1", "c2", "c3"), 200.0) | {owner: 1000.0}
        decision = evaluate(ON, capacity, observe(1, 4, lag=busy, rate=rates)).decision
        assert decision.rule == "busy"
        assert f"task '{task}' is busy (1500 records of lag > 1000)" in decision.reason


def test_bounds_are_kept() -> None:
    bounded = replace(ON, min_containers=2, max_containers=3, window_s=0, cooldown_s=0)
    lagging = evaluate(bounded, PolicyState(), observe(0, 2, lag=50_000)).decision
    assert (lagging.action, lagging.target) == (SCALE_OUT, 3)
    at_max = evaluate(bounded, PolicyState(), observe(0, 3, lag=50_000)).decision
    assert (at_max.action, at_max.rule) == (HOLD, "at-max")
    capacity = run(bounded, [observe(0, 3, lag=10_000, rate=1000)])[1]
    idle = evaluate(bounded, capacity, observe(1, 3, lag=0, rate=10)).decision
    assert (idle.action, idle.target) == (SCALE_IN, 2)  # 1 would do; the minimum is 2
    assert evaluate(bounded, capacity, observe(1, 2, rate=10)).decision.rule == "steady"
    # A job outside its bounds (they were just changed) is brought back inside.
    below = evaluate(bounded, PolicyState(), observe(0, 1)).decision
    assert (below.action, below.target, below.rule) == (SCALE_OUT, 2, "below-min")
    above = evaluate(bounded, PolicyState(), observe(0, 6)).decision
    assert (above.action, above.target, above.rule) == (SCALE_IN, 3, "above-max")


@pytest.mark.parametrize(
    ("observation", "needle"),
    [
        (
            observe(30, 2, lag={**dict.fromkeys(TASKS, 5000), TASKS[3]: -1}),
            "task 'Partition 0_3_4'",
        ),
        (observe(30, 2, lag=10_000, rate=None), "container 'c0' has no processing rate"),
    ],
)
def test_missing_data_holds_and_starts_the_window_over(
    observation: Observation, needle: str
) -> None:
    lagging = [observe(t, 2, lag=10_000) for t in range(30)]
    after = [observe(t, 2, lag=10_000) for t in range(31, 92)]
    decisions, _ = run(ON, [*lagging, observation, *after])
    assert decisions[30].rule == "no-data"
    assert needle in decisions[30].reason
    assert [i for i, d in enumerate(decisions) if d.acts] == [91]  # 60 s after the gap


def test_a_stalled_job_is_not_scaled() -> None:
    decision = evaluate(ON, PolicyState(), observe(0, 2, lag=10_000, rate=0.0)).decision
    assert (decision.action, decision.rule) == (HOLD, "stalled")
    assert "would take forever to drain" in decision.reason


def test_without_a_capacity_figure_there_is_no_scale_in() -> None:
    decisions, _ = run(ON, [observe(t, 4, lag=0, rate=1.0) for t in range(300)])
    assert {d.rule for d in decisions} == {"steady"}
    assert "capacity unknown" in decisions[-1].reason


def test_pinned_goes_to_its_count_at_once_and_off_does_nothing() -> None:
    pinned = replace(ON, pinned=5)
    decision = evaluate(pinned, PolicyState(), observe(0, 2, lag=-1, rate=None)).decision
    assert (decision.action, decision.target, decision.rule) == (SCALE_OUT, 5, "pinned")
    held = evaluate(pinned, PolicyState(), observe(0, 5, lag=50_000)).decision
    assert (held.action, held.target, held.rule) == (HOLD, 5, "pinned")
    off = evaluate(AutoscalerConfig(), PolicyState(), observe(0, 2, lag=50_000)).decision
    assert (off.action, off.rule) == (HOLD, "off")


def test_decisions_are_deterministic() -> None:
    observations = [observe(t, 2, lag=10_000 + 10 * t) for t in range(100)]
    assert run(ON, observations)[0] == run(ON, observations)[0]


def test_the_processing_rate_counts_reports_received_in_the_window() -> None:
    assert processing_rate(None, [], 10.0, 5.0) is None
    assert processing_rate(0.0, [(0.0, 100)], 1.0, 5.0) is None  # one report: no span known
    # Younger than the window: from the first report (whose own records do not count)
    # to the last, however long ago that was.
    assert processing_rate(0.0, [(0.0, 100), (1.0, 50), (2.0, 50)], 2.5, 5.0) == 50.0
    reports = [(float(t), 10) for t in range(21)]
    assert processing_rate(0.0, reports, 20.0, 5.0) == 10.0
    assert processing_rate(0.0, reports, 40.0, 5.0) == 0.0  # nothing since: idle, not unknown


@pytest.mark.parametrize(
    ("settings", "error", "needle"),
    [
        ({"min_containers": 0}, ArgumentError, "min_containers: expected a whole number >= 1"),
        (
            {"min_containers": 4, "max_containers": 3},
            ArgumentError,
            "max_containers: expected at least min_containers (4)",
        ),
        ({"pinned": 0}, ArgumentError, "pinned: expected a whole number >= 1"),
        ({"window_s": -1}, ArgumentError, "window_s: expected a number of seconds >= 0"),
        ({"max_drain_s": 0}, ArgumentError, "max_drain_s: expected a number of seconds > 0"),
        ({"target_utilization": 1.5}, ArgumentError, "target_utilization: expected a fraction"),
        ({"cooldown_s": math.inf}, ArgumentTypeError, "cooldown_s: expected a finite number"),
        ({"enabled": "yes"}, ArgumentTypeError, "enabled: expected true or false"),
        ({"max_containers": True}, ArgumentTypeError, "max_containers: expected a whole number"),
        (
            {"max_elasticity_factor": 3},
            ArgumentError,
            "max_elasticity_factor: expected a power of two from 1 to 1024, found 3",
        ),
        (
            {"max_elasticity_factor": 2.0},
            ArgumentTypeError,
            "max_elasticity_factor: expected a whole number (a power of two)",
        ),
    ],
)
def test_bad_settings_are_one_line_naming_the_setting(
    settings: dict[str, Any], error: type[Exception], needle: str
) -> None:
    with pytest.raises(error) as raised:
        AutoscalerConfig(**settings)
    assert needle in str(raised.value)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"maxContainers": 13}, "maxContainers: expected at most the job's 12 virtual tasks"),
        ({"pinned": 13}, "pinned: expected at most the job's 12 virtual tasks"),
        (
            {"minContainers": 5, "maxContainers": 4},
            "maxContainers: expected at least minContainers",
        ),
        ({"enabled": True, "pinned": 3}, "pinned: expected no enabled beside it"),
        ({"size": 3}, "autoscaler: expected a known setting, found 'size'"),
        ({"minContainers": "2"}, "minContainers: expected a whole number, found str '2'"),
    ],
)
def test_updates_name_their_keys_and_check_the_task_count(
    changes: dict[str, Any], needle: str
) -> None:
    before = AutoscalerConfig(enabled=True)
    with pytest.raises((ArgumentError, ArgumentTypeError)) as raised:
        before.updated(changes, task_count=12)
    assert needle in str(raised.value)
    assert before == AutoscalerConfig(enabled=True)


def test_an_update_turns_on_off_pins_and_keeps_the_rest() -> None:
    config = AutoscalerConfig(enabled=True, min_containers=2)
    pinned = config.updated({"pinned": 3}, task_count=12)
    assert (pinned.mode, pinned.min_containers) == ("pinned", 2)
    assert pinned.updated({"enabled": False}).mode == "off"
    assert pinned.updated({"enabled": True}).mode == "on"
    assert AutoscalerConfig.from_json(pinned.to_json()) == pinned
    assert pinned.describe(12) == "pinned at 3 containers"
    assert config.describe(12).startswith("on: 2-12 containers, scale out past 60 s of backlog")


def growing_backlog(
    containers: int, factor: int, seconds: int, growth: int = 3000
) -> list[Observation]:
    """Every container busy at 1000/s while the backlog grows by ``growth`` records a second."""
    return [
        observe(t, containers, lag=(t + 1) * growth // (3 * factor), factor=factor, defined=1)
        for t in range(seconds)
    ]


def test_more_containers_than_tasks_wanted_splits_the_factor_up_to_its_bound() -> None:
    # 3 containers run the 3 tasks of factor 1, and the input needs about 6.
    allowed = replace(ON, max_elasticity_factor=4)
    decisions, _ = run(allowed, growing_backlog(3, 1, 120))
    split = next(d for d in decisions if d.acts)
    assert (split.action, split.target, split.factor, split.rule) == (SPLIT, 3, 2, "lagging")
    assert "more than the 3 tasks; split to factor 2" in split.reason
    assert split.to_json()["elasticityFactor"] == 2
    # Without a factor bound the task count is the container maximum; at the bound, too.
    decisions, _ = run(ON, growing_backlog(3, 1, 120))
    assert not any(d.acts for d in decisions)
    assert decisions[-1].rule == "at-max"
    decisions, _ = run(allowed, growing_backlog(12, 4, 120, growth=30_000))
    assert not any(d.acts for d in decisions)
    assert decisions[-1].rule == "at-max"


def test_a_container_maximum_below_the_task_count_is_never_split_past() -> None:
    bounded = replace(ON, max_elasticity_factor=4, max_containers=2)
    decisions, _ = run(bounded, growing_backlog(2, 1, 120))
    assert not any(d.acts for d in decisions)
    assert decisions[-1].rule == "at-max"


def test_a_job_split_far_beyond_its_containers_merges_back_when_no_task_is_busy() -> None:
    allowed = replace(ON, max_elasticity_factor=8)
    # 2 containers run 24 tasks at factor 8 (the job defines 1): 6 each at factor 4.
    steady = [observe(t, 2, factor=8, defined=1) for t in range(61)]
    decisions, _ = run(allowed, steady)
    merge = decisions[-1]
    assert (merge.action, merge.target, merge.factor, merge.rule) == (MERGE, 2, 4, "over-split")
    assert {d.rule for d in decisions[:-1]} == {"stabilizing"}
    # A busy task holds the merge, as it holds a scale-in.
    busy = [observe(t, 2, lag=5000, factor=8, defined=1) for t in range(61)]
    decisions, _ = run(replace(allowed, max_drain_s=1000), busy)
    assert not any(d.acts for d in decisions)
    # At the defined factor, or with too few tasks to keep two per container, no merge.
    for factor, defined in ((8, 8), (2, 1)):
        decisions, _ = run(
            allowed, [observe(t, 2, factor=factor, defined=defined) for t in range(61)]
        )
        assert not any(d.acts for d in decisions)


def test_sibling_buckets_count_their_partitions_backlog_once() -> None:
    # 3 partitions, 4000 records behind each; the 4 buckets of a partition all report 4000.
    seen = observe(0, 2, lag=4000, rate=1000.0)
    shared = replace(seen, tasks=tuple(replace(t, share=1 / 4) for t in seen.tasks))
    assert drain_time(shared) == 12_000 / 2000
    assert drain_time(seen) == 4 * drain_time(shared)  # what summing the raw lags would say
