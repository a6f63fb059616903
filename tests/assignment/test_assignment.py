"""Specification of the KIP-441 task assignor: one rule per test, then the KIP's worked examples."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence

import pytest

from spark_elastic.assignment.assignor import assign, is_balanced
from spark_elastic.assignment.model import (
    AssignmentConfig,
    AssignmentResult,
    AssignmentWarning,
    ClientAssignment,
    ClientState,
    TaskSpec,
)
from spark_elastic.errors import ArgumentError, ArgumentTypeError, AssignmentError

FULL = 1_000_000  # offsets of a task's whole state: far above the acceptable recovery lag


def tasks(*ids: str, stateful: bool = True, group: str = "") -> list[TaskSpec]:
    return [TaskSpec(i, stateful=stateful, group=group, end_offset=FULL) for i in ids]


def client(
    id: str,
    active: Sequence[str] = (),
    standby: Sequence[str] = (),
    lags: dict[str, int] | None = None,
    *,
    warmup: Sequence[str] = (),
    capacity: float = 1.0,
    leaving: bool = False,
) -> ClientState:
    """A client whose previous standbys are caught up unless ``lags`` says otherwise."""
    caught_up = dict.fromkeys((*standby, *warmup), 0)
    return ClientState(
        id,
        capacity,
        {**caught_up, **(lags or {})},
        tuple(active),
        tuple(standby),
        tuple(warmup),
        leaving,
    )


def next_round(clients: Iterable[ClientState], result: AssignmentResult) -> list[ClientState]:
    """The clients at the next rebalance: every replica handed out has caught up."""
    return [
        client(
            c.id,
            result.assignment[c.id].active,
            result.assignment[c.id].standby,
            warmup=result.assignment[c.id].warmup,
            capacity=c.capacity,
            leaving=c.leaving,
        )
        for c in clients
        if c.id not in result.may_shut_down
    ]


def until_balanced(
    task_list: Sequence[TaskSpec],
    clients: list[ClientState],
    config: AssignmentConfig,
    limit: int = 20,
) -> tuple[list[AssignmentResult], list[ClientState]]:
    """Rebalance, letting warm-ups catch up in between, until no probing rebalance is needed."""
    results = [assign(task_list, clients, config)]
    while results[-1].probing_rebalance.needed:
        assert len(results) < limit, "no convergence"
        clients = next_round(clients, results[-1])
        results.append(assign(task_list, clients, config))
    return results, clients


def table(result: AssignmentResult) -> dict[str, tuple[list[str], list[str], list[str]]]:
    return {
        c: (list(a.active), list(a.standby), list(a.warmup)) for c, a in result.assignment.items()
    }


def owners_of(result: AssignmentResult, task: str) -> list[str]:
    return [c for c, a in result.assignment.items() if task in a.active]


# -- configuration and input validation -------------------------------------------------------


def test_config_has_kip441_names_and_defaults() -> None:
    config = AssignmentConfig()
    assert config.acceptable_recovery_lag == 10_000
    assert config.num_standby_replicas == 0
    assert config.max_warmup_replicas == 2
    assert config.probing_rebalance_interval_ms == 600_000
    assert config.balance_tolerance == 0.0


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("acceptable_recovery_lag", -1),
        ("num_standby_replicas", -1),
        ("max_warmup_replicas", 0),
        ("probing_rebalance_interval_ms", 59_999),
        ("balance_tolerance", -0.1),
        ("balance_tolerance", 1.0),
    ],
)
def test_config_rejects_values_below_the_kip_minimums(field: str, value: float) -> None:
    with pytest.raises(ArgumentError, match=field):
        AssignmentConfig(**{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [True, "2", 2.5, None])
def test_config_rejects_integers_of_the_wrong_type(value: object) -> None:
    with pytest.raises(ArgumentTypeError, match="max_warmup_replicas"):
        AssignmentConfig(max_warmup_replicas=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("capacity", [-1, 0, float("inf"), float("nan")])
def test_client_capacity_must_be_a_positive_finite_number(capacity: float) -> None:
    with pytest.raises(ArgumentError, match="capacity"):
        ClientState("c1", capacity=capacity)


def test_negative_lag_and_end_offset_are_refused() -> None:
    with pytest.raises(ArgumentError, match="lag"):
        ClientState("c1", lags={"t1": -5})
    with pytest.raises(ArgumentError, match="end_offset"):
        TaskSpec("t1", end_offset=-1)


def test_end_offset_is_an_int_or_none_for_unknown() -> None:
    assert TaskSpec("t1").end_offset is None
    with pytest.raises(ArgumentTypeError, match=r"end_offset: expected an int >= 0, or None"):
        TaskSpec("t1", end_offset="5")  # type: ignore[arg-type]


def test_duplicate_task_or_client_ids_are_inconsistent_input() -> None:
    with pytest.raises(AssignmentError, match="duplicate task id 't1'"):
        assign(tasks("t1", "t1"), [client("c1")])
    with pytest.raises(AssignmentError, match="duplicate client id 'c1'"):
        assign(tasks("t1"), [client("c1"), client("c1")])


def test_state_reported_for_a_task_no_longer_in_the_job_is_ignored_with_a_warning() -> None:
    # After a topology change a client still holds what it ran: Kafka ignores it, so do we.
    reported = [client("c1", active=["t1", "ghost"], lags={"ghost": 3}), client("c2")]
    result = assign(tasks("t1"), reported)
    assert table(result) == {"c1": (["t1"], [], []), "c2": ([], [], [])}
    assert result.warnings == (
        AssignmentWarning(
            "unknown-task",
            "ghost",
            "c1",
            "client 'c1' reports a lag and an active of task 'ghost', which is not in the job: "
            "ignored",
        ),
    )


def test_a_lag_standby_or_warmup_of_a_task_now_stateless_is_ignored_with_a_warning() -> None:
    config = AssignmentConfig(num_standby_replicas=1)
    reported = [
        client("c1", active=["t1"], standby=["t2"]),
        client("c2", active=["t2"], lags={"t1": 0}, warmup=["t1"]),
    ]
    result = assign(tasks("t1", "t2", stateful=False), reported, config)
    assert table(result) == {"c1": (["t1"], [], []), "c2": (["t2"], [], [])}
    assert [(w.kind, w.task, w.client) for w in result.warnings] == [
        ("stateless-task", "t1", "c2"),
        ("stateless-task", "t2", "c1"),
    ]
    assert "reports a lag and a warm-up of task 't1', which is stateless" in (
        result.warnings[0].detail
    )


def test_a_task_is_active_or_standby_on_a_client_not_both() -> None:
    with pytest.raises(AssignmentError, match="more than one"):
        assign(tasks("t1"), [client("c1", active=["t1"], standby=["t1"])])


def test_more_standbys_than_other_clients_assigns_what_fits_and_warns_per_task() -> None:
    # Kafka assigns as many standbys as there are other clients and warns: a crash that
    # leaves too few clients must not leave the job without any assignment.
    config = AssignmentConfig(num_standby_replicas=2)
    survivors = [client("c1", active=["t1"], standby=["t2"]), client("c2", active=["t2"])]
    result = assign(tasks("t1", "t2", "t3"), [*survivors, client("c3", leaving=True)], config)
    assert [c for c, a in result.assignment.items() if "t1" in a.standby] == ["c2"]
    assert [c for c, a in result.assignment.items() if "t2" in a.standby] == ["c1"]
    assert [(w.kind, w.task, w.client) for w in result.warnings] == [
        ("standby-shortfall", task, None) for task in ("t1", "t2", "t3")
    ]
    assert result.warnings[0].detail == (
        "task 't1' gets 1 of 2 standby replicas: 2 staying clients host at most 1 besides "
        "the active"
    )


def test_with_one_client_left_no_standby_fits_and_every_stateful_task_warns() -> None:
    config = AssignmentConfig(num_standby_replicas=1)
    result = assign([*tasks("t1"), *tasks("s1", stateful=False)], [client("c1")], config)
    assert table(result) == {"c1": (["s1", "t1"], [], [])}
    assert [(w.kind, w.task) for w in result.warnings] == [("standby-shortfall", "t1")]


def test_an_assignment_that_did_all_it_was_asked_has_no_warnings() -> None:
    config = AssignmentConfig(num_standby_replicas=1)
    result = assign(tasks("t1", "t2"), [client("c1"), client("c2")], config)
    assert result.warnings == ()


def test_tasks_need_a_client_that_is_not_leaving() -> None:
    with pytest.raises(AssignmentError, match="all leaving"):
        assign(tasks("t1"), [client("c1", leaving=True)])


def test_items_of_the_wrong_type_are_refused() -> None:
    with pytest.raises(ArgumentTypeError, match="TaskSpec"):
        assign(["t1"], [client("c1")])  # type: ignore[list-item]


# -- rules --------------------------------------------------------------------------------------


def test_every_task_has_exactly_one_active_owner() -> None:
    result = assign(tasks(*(f"t{i}" for i in range(10))), [client(f"c{i}") for i in range(3)])
    for i in range(10):
        assert len(owners_of(result, f"t{i}")) == 1


def test_a_tasks_active_and_standbys_are_on_distinct_clients() -> None:
    config = AssignmentConfig(num_standby_replicas=2)
    result = assign(tasks("t1", "t2", "t3"), [client(f"c{i}") for i in range(4)], config)
    for task in ("t1", "t2", "t3"):
        holders = [c for c, a in result.assignment.items() if task in a.active or task in a.standby]
        assert len(holders) == 3


def test_every_stateful_task_has_min_of_standbys_and_staying_clients_minus_one() -> None:
    config = AssignmentConfig(num_standby_replicas=2)
    clients = [client("c1", active=["t1"]), client("c2"), client("c3", leaving=True)]
    result = assign(tasks("t1"), clients, config)
    standbys = [c for c, a in result.assignment.items() if "t1" in a.standby]
    assert standbys == ["c2"]


def test_stateless_tasks_get_no_standbys_or_warmups() -> None:
    config = AssignmentConfig(num_standby_replicas=1)
    result = assign(tasks("t1", "t2", stateful=False), [client("c1"), client("c2")], config)
    assert all(not a.standby and not a.warmup for a in result.assignment.values())


def test_stateful_active_goes_to_caught_up_client() -> None:
    # c1 ran t1 and is gone; c3 has a standby within the acceptable lag, c2 is further behind.
    clients = [client("c2", lags={"t1": 50_000}), client("c3", standby=["t1"], lags={"t1": 9_000})]
    result = assign(tasks("t1"), clients)
    assert owners_of(result, "t1") == ["c3"]


def test_the_running_owner_counts_as_caught_up() -> None:
    clients = [client("c1", active=["t1"]), client("c2", standby=["t1"])]
    result = assign(tasks("t1"), clients, AssignmentConfig(num_standby_replicas=1))
    assert owners_of(result, "t1") == ["c1"]


def test_active_goes_to_least_behind_client_when_none_is_caught_up() -> None:
    clients = [
        client("c1", lags={"t1": 90_000}),
        client("c2", lags={"t1": 40_000}),
        client("c3"),
    ]
    result = assign(tasks("t1"), clients)
    assert owners_of(result, "t1") == ["c2"]
    assert not result.probing_rebalance.needed


def test_a_lag_beyond_the_whole_state_counts_as_no_state() -> None:
    # c0 sheds t2 to c1 and t3 to c2; with one warm-up at a time, the least lag goes first.
    # c1's state of t2 is older than the changelog: no further behind than c2, which has
    # none of t3, so the tie goes to the lower task. Taken as it is, c1's lag of three
    # whole states would put t3's warm-up first.
    clients = [client("c0", active=["t1", "t2", "t3"]), client("c1", lags={"t2": FULL * 3})]
    clients.append(client("c2"))
    result = assign(tasks("t1", "t2", "t3"), clients, AssignmentConfig(max_warmup_replicas=1))
    assert table(result) == {
        "c0": (["t1", "t2", "t3"], [], []),
        "c1": ([], [], ["t2"]),
        "c2": ([], [], []),
    }


def test_stateful_task_without_end_offset_moves_to_an_empty_client_only_through_a_warmup() -> None:
    # The size of the state is unknown: a client that reports no lag has no state, so it
    # is not caught up and must warm up before it takes the task.
    task_list = [TaskSpec("t1"), TaskSpec("t2")]
    clients = [ClientState("c1", previous_active=["t1", "t2"]), ClientState("c2")]
    result = assign(task_list, clients)
    assert table(result) == {"c1": (["t1", "t2"], [], []), "c2": ([], [], ["t2"])}
    assert result.probing_rebalance.needed

    moved = assign(task_list, next_round(clients, result))
    assert table(moved) == {"c1": (["t1"], [], []), "c2": (["t2"], [], [])}
    assert not moved.probing_rebalance.needed


def test_without_end_offset_any_reported_lag_is_less_behind_than_no_state() -> None:
    # Nothing to clamp the lag to: however large, it is some state, and no state is less.
    clients = [ClientState("c1"), ClientState("c2", lags={"t1": FULL * 5})]
    result = assign([TaskSpec("t1")], clients)
    assert owners_of(result, "t1") == ["c2"]


def test_an_end_offset_within_the_acceptable_lag_needs_no_restore() -> None:
    # An explicit end_offset of 0 (an empty state) still lets every client take the task.
    task_list = [TaskSpec("t1", end_offset=0), TaskSpec("t2", end_offset=0)]
    clients = [ClientState("c1", previous_active=["t1", "t2"]), ClientState("c2")]
    result = assign(task_list, clients)
    assert table(result) == {"c1": (["t1"], [], []), "c2": (["t2"], [], [])}
    assert not result.probing_rebalance.needed


def test_standbys_go_to_the_next_most_caught_up_clients() -> None:
    config = AssignmentConfig(num_standby_replicas=2)
    clients = [
        client("c1", active=["t1"]),
        client("c2", lags={"t1": 500_000}),
        client("c3", lags={"t1": 20_000}),
        client("c4", standby=["t1"], lags={"t1": 3_000}),
    ]
    result = assign(tasks("t1"), clients, config)
    assert [c for c, a in result.assignment.items() if "t1" in a.standby] == ["c3", "c4"]


def test_a_move_to_a_client_that_is_not_caught_up_goes_through_a_warmup() -> None:
    clients = [client("c1", active=["t1", "t2"]), client("c2")]
    result = assign(tasks("t1", "t2"), clients)
    assert table(result) == {"c1": (["t1", "t2"], [], []), "c2": ([], [], ["t2"])}
    assert result.probing_rebalance.needed

    moved = assign(tasks("t1", "t2"), next_round(clients, result))
    assert table(moved) == {"c1": (["t1"], [], []), "c2": (["t2"], [], [])}
    assert not moved.probing_rebalance.needed


def test_warmups_in_flight_never_exceed_max_warmup_replicas() -> None:
    task_list = tasks(*(f"t{i}" for i in range(12)))
    clients = [client("c1", active=[f"t{i}" for i in range(12)]), client("c2"), client("c3")]
    result = assign(task_list, clients, AssignmentConfig(max_warmup_replicas=3))
    assert sum(len(a.warmup) for a in result.assignment.values()) == 3
    assert result.pending_moves == 8


def test_stateless_tasks_move_at_once() -> None:
    clients = [client("c1", active=["t1", "t2"]), client("c2")]
    result = assign(tasks("t1", "t2", stateful=False), clients)
    assert table(result) == {"c1": (["t1"], [], []), "c2": (["t2"], [], [])}
    assert not result.probing_rebalance.needed


def test_a_leaving_client_gets_no_new_task_of_any_kind() -> None:
    config = AssignmentConfig(num_standby_replicas=1)
    clients = [
        client("c1", active=["t1"], leaving=True),
        client("c2", active=["t2"]),
        client("c3", standby=["t2"], lags={"t3": 0}),
    ]
    result = assign(tasks("t1", "t2", "t3"), clients, config)
    assert result.assignment["c1"].active == ("t1",)  # it keeps running t1 until c2/c3 caught up
    assert not result.assignment["c1"].standby
    assert not result.assignment["c1"].warmup
    assert result.may_shut_down == ()


def test_a_leaving_client_may_shut_down_once_none_of_its_tasks_state_is_only_there() -> None:
    clients = [client("c1", active=["t1"], leaving=True), client("c2", standby=["t1"])]
    result = assign(tasks("t1"), clients, AssignmentConfig(num_standby_replicas=1))
    assert owners_of(result, "t1") == ["c2"]
    assert result.may_shut_down == ("c1",)


def test_a_leaving_client_without_caught_up_replacement_waits_for_a_warmup() -> None:
    clients = [client("c1", active=["t1"], leaving=True), client("c2")]
    first = assign(tasks("t1"), clients)
    assert table(first) == {"c1": (["t1"], [], []), "c2": ([], [], ["t1"])}
    assert first.may_shut_down == ()
    second = assign(tasks("t1"), next_round(clients, first))
    assert table(second) == {"c1": ([], [], []), "c2": (["t1"], [], [])}
    assert second.may_shut_down == ("c1",)


def test_warmups_for_leaving_clients_come_first() -> None:
    clients = [
        client("c1", active=["t1", "t2", "t3"]),
        client("c2", active=["t4"], leaving=True),
        client("c3"),
    ]
    result = assign(tasks("t1", "t2", "t3", "t4"), clients, AssignmentConfig(max_warmup_replicas=1))
    assert [t for a in result.assignment.values() for t in a.warmup] == ["t4"]


def test_a_balanced_caught_up_assignment_is_returned_unchanged() -> None:
    config = AssignmentConfig(num_standby_replicas=1)
    clients = [
        client("c1", active=["t2", "t3"], standby=["t1"]),
        client("c2", active=["t1"], standby=["t2", "t3"]),
    ]
    result = assign(tasks("t1", "t2", "t3"), clients, config)
    assert table(result) == {
        "c1": (["t2", "t3"], ["t1"], []),
        "c2": (["t1"], ["t2", "t3"], []),
    }
    assert not result.probing_rebalance.needed
    assert result.probing_rebalance.after_ms is None


def test_a_stable_cluster_never_reshuffles() -> None:
    config = AssignmentConfig(num_standby_replicas=1)
    task_list = [TaskSpec(f"t{i}", group=f"g{i % 3}", end_offset=FULL) for i in range(30)]
    results, clients = until_balanced(task_list, [client(f"c{i}") for i in range(4)], config)
    for _ in range(3):
        again = assign(task_list, next_round(clients, results[-1]), config)
        assert table(again) == table(results[-1])


def test_probing_rebalance_comes_after_the_configured_interval() -> None:
    config = AssignmentConfig(probing_rebalance_interval_ms=90_000)
    result = assign(tasks("t1", "t2"), [client("c1", active=["t1", "t2"]), client("c2")], config)
    assert result.probing_rebalance.needed
    assert result.probing_rebalance.after_ms == 90_000


def test_probing_stops_once_balanced() -> None:
    # 5 of 8 tasks leave c1, 2 warm-ups per rebalance: ceil(5 / 2) + 1 = 4 rebalances.
    task_list = tasks(*(f"t{i}" for i in range(8)))
    clients = [client("c1", active=[f"t{i}" for i in range(8)]), client("c2"), client("c3")]
    needed, balanced = [], []
    for _ in range(6):
        result = assign(task_list, clients)
        needed.append(result.probing_rebalance.needed)
        balanced.append(is_balanced(result.assignment, task_list, clients))
        clients = next_round(clients, result)
    assert balanced == [False, False, False, True, True, True]
    assert needed == [not b for b in balanced]


def test_the_same_input_always_gives_the_same_output() -> None:
    config = AssignmentConfig(num_standby_replicas=1)
    task_list = [TaskSpec(f"t{i}", group=f"g{i % 2}", end_offset=FULL) for i in range(20)]
    clients = [
        client("c1", active=[f"t{i}" for i in range(12)], lags={"t15": 4_000}),
        client("c2", active=[f"t{i}" for i in range(12, 20)]),
        client("c3"),
    ]
    expected = assign(task_list, clients, config)
    rng = random.Random(7)
    for _ in range(5):
        shuffled_tasks, shuffled_clients = list(task_list), list(clients)
        rng.shuffle(shuffled_tasks)
        rng.shuffle(shuffled_clients)
        assert assign(shuffled_tasks, shuffled_clients, config) == expected


def test_task_ids_sort_naturally_in_the_output() -> None:
    result = assign(tasks("t10", "t2", "t1"), [client("c1")])
    assert result.assignment["c1"].active == ("t1", "t2", "t10")


def test_load_follows_capacity() -> None:
    task_list = tasks(*(f"t{i}" for i in range(12)))
    clients = [client("small"), client("medium", capacity=2), client("large", capacity=3)]
    result = assign(task_list, clients)
    assert {c: len(a.active) for c, a in result.assignment.items()} == {
        "large": 6,
        "medium": 4,
        "small": 2,
    }


def test_balance_tolerance_keeps_a_load_within_its_tolerance_where_it_is() -> None:
    task_list = tasks(*(f"t{i}" for i in range(10)))
    clients = [client("c1", active=[f"t{i}" for i in range(6)]), client("c2", active=["t6", "t7"])]
    clients.append(client("c3", active=["t8", "t9"]))
    strict = assign(task_list, clients)
    assert strict.probing_rebalance.needed  # 6 is more than one task above a share of 3.33
    tolerant = assign(task_list, clients, AssignmentConfig(balance_tolerance=0.9))
    assert not tolerant.probing_rebalance.needed


def test_each_group_spreads_evenly() -> None:
    task_list = [TaskSpec(f"{g}{i}", group=g, end_offset=FULL) for g in "ab" for i in range(4)]
    result = assign(task_list, [client("c1"), client("c2")])
    for a in result.assignment.values():
        assert sorted(t[0] for t in a.active) == ["a", "a", "b", "b"]


def test_group_spread_is_restored_by_swapping_groups_between_clients() -> None:
    task_list = [TaskSpec(f"{g}{i}", group=g, end_offset=FULL) for g in "ab" for i in range(2)]
    clients = [client("c1", active=["a0", "a1"]), client("c2", active=["b0", "b1"])]
    results, clients = until_balanced(task_list, clients, AssignmentConfig())
    assert is_balanced(results[-1].assignment, task_list, clients)
    for a in results[-1].assignment.values():
        assert sorted(t[0] for t in a.active) == ["a", "b"]


def test_a_new_cluster_is_balanced_in_one_rebalance() -> None:
    task_list = [TaskSpec(f"t{i}", group=f"g{i % 4}", end_offset=FULL) for i in range(40)]
    clients = [client(f"c{i}") for i in range(6)]
    result = assign(task_list, clients, AssignmentConfig(num_standby_replicas=2))
    assert not result.probing_rebalance.needed
    assert is_balanced(
        result.assignment, task_list, clients, AssignmentConfig(num_standby_replicas=2)
    )


def test_a_crashed_clients_tasks_go_to_their_caught_up_standbys() -> None:
    config = AssignmentConfig(num_standby_replicas=1)
    clients = [client("c2", active=["t2"], standby=["t1"]), client("c3", active=["t3"])]
    result = assign(tasks("t1", "t2", "t3"), clients, config)
    assert owners_of(result, "t1") == ["c2"]


def test_a_warmup_in_flight_keeps_its_slot_until_it_catches_up() -> None:
    task_list = tasks("t1", "t2", "t3", "t4")
    clients = [client("c1", active=["t1", "t2", "t3", "t4"]), client("c2")]
    config = AssignmentConfig(max_warmup_replicas=1)
    first = assign(task_list, clients, config)
    warming = first.assignment["c2"].warmup
    halfway = [
        client("c1", active=["t1", "t2", "t3", "t4"]),
        client("c2", warmup=warming, lags={warming[0]: 400_000}),
    ]
    second = assign(task_list, halfway, config)
    assert second.assignment["c2"].warmup == warming
    assert second.assignment["c1"].active == ("t1", "t2", "t3", "t4")


def test_a_move_to_a_caught_up_client_happens_at_once_even_through_a_chain() -> None:
    # t4 can only go to c2 (caught up) if c2's t2 moves on to c3, which is caught up on it.
    config = AssignmentConfig(num_standby_replicas=1)
    clients = [
        client("c2", active=["t2"], standby=["t1", "t4"]),
        client("c3", active=["t3"], standby=["t2"]),
    ]
    result = assign(tasks("t1", "t2", "t3", "t4"), clients, config)
    assert not result.probing_rebalance.needed
    assert table(result)["c2"][0] == ["t1", "t4"]
    assert table(result)["c3"][0] == ["t2", "t3"]


def test_a_standby_warmup_started_beside_an_active_one_completes_as_a_standby() -> None:
    # c4 joins: c1 sheds active T2 and standby T5 to it, both warmed in the same rebalance.
    # Next time T5's warm-up must not read as an active move (c3 would drop below its one
    # task): both moves complete, and nothing else moves.
    config = AssignmentConfig(num_standby_replicas=1)
    clients = [
        client("c1", active=["T1", "T2"], standby=["T4", "T5"]),
        client("c2", active=["T3", "T4"], standby=["T2"]),
        client("c3", active=["T5"], standby=["T1", "T3"]),
        client("c4"),
    ]
    task_list = tasks("T1", "T2", "T3", "T4", "T5")
    results, _ = until_balanced(task_list, clients, config)
    assert table(results[0])["c4"] == ([], [], ["T2", "T5"])
    assert table(results[-1]) == {
        "c1": (["T1"], ["T4"], []),
        "c2": (["T3", "T4"], ["T2"], []),
        "c3": (["T5"], ["T1", "T3"], []),
        "c4": (["T2"], ["T5"], []),
    }
    assert len(results) == 2


def test_is_balanced_rejects_an_uneven_assignment() -> None:
    task_list = tasks("t1", "t2", "t3")
    clients = [client("c1", active=["t1", "t2", "t3"]), client("c2")]
    unchanged = assign(task_list, clients, AssignmentConfig(max_warmup_replicas=1))
    assert not is_balanced(unchanged.assignment, task_list, clients)


def test_is_balanced_rejects_a_load_two_over_its_share_with_even_actives_and_standbys() -> None:
    # Shares: 4/3 actives, 4/3 standbys, 8/3 replicas per client. c1 holds 2 actives and 2
    # standbys, each within one of its share, but 4 replicas, more than one above 8/3.
    task_list, config = tasks("t1", "t2", "t3", "t4"), AssignmentConfig(num_standby_replicas=1)
    clients = [client("c1"), client("c2"), client("c3")]
    heavy = {
        "c1": ClientAssignment(("t1", "t2"), ("t3", "t4")),
        "c2": ClientAssignment(("t3",), ("t1",)),
        "c3": ClientAssignment(("t4",), ("t2",)),
    }
    assert not is_balanced(heavy, task_list, clients, config)
    even = {
        "c1": ClientAssignment(("t1", "t2"), ("t3",)),
        "c2": ClientAssignment(("t3",), ("t1", "t4")),
        "c3": ClientAssignment(("t4",), ("t2",)),
    }
    assert is_balanced(even, task_list, clients, config)


def test_actives_plus_standbys_per_client_end_within_one_task_of_each_other() -> None:
    # 100 tasks on 10 clients with 1 standby, then 2 clients join: shares of 8.33 actives and
    # 8.33 standbys, each within one, could leave a client 2 tasks above another in total.
    config = AssignmentConfig(num_standby_replicas=1, max_warmup_replicas=10)
    task_list = [TaskSpec(f"t{i}", group=f"g{i % 10}", end_offset=FULL) for i in range(100)]
    first = assign(task_list, [client(f"c{i}") for i in range(10)], config)
    clients = next_round([client(f"c{i}") for i in range(10)], first)
    results, clients = until_balanced(task_list, [*clients, client("c10"), client("c11")], config)
    loads = [len(a.active) + len(a.standby) for a in results[-1].assignment.values()]
    assert max(loads) - min(loads) == 1
    actives = [len(a.active) for a in results[-1].assignment.values()]
    assert max(actives) - min(actives) == 1
    assert is_balanced(results[-1].assignment, task_list, clients, config)


def balanced_with_standbys() -> tuple[list[TaskSpec], list[ClientState], AssignmentConfig]:
    """c1 and c2 stay, c3 leaves; one standby per task."""
    clients = [client("c1"), client("c2"), client("c3", leaving=True)]
    return tasks("t1", "t2", "t3", "t4"), clients, AssignmentConfig(num_standby_replicas=1)


BALANCED_WITH_STANDBYS = {
    "c1": ClientAssignment(active=("t1", "t2"), standby=("t3", "t4")),
    "c2": ClientAssignment(active=("t3", "t4"), standby=("t1", "t2")),
    "c3": ClientAssignment(),
}


def test_is_balanced_accepts_an_even_assignment_with_standbys() -> None:
    task_list, clients, config = balanced_with_standbys()
    assert is_balanced(BALANCED_WITH_STANDBYS, task_list, clients, config)


@pytest.mark.parametrize(
    "held",
    [
        ClientAssignment(active=("t1",)),
        ClientAssignment(standby=("t1",)),
        ClientAssignment(warmup=("t1",)),
    ],
    ids=["active", "standby", "warmup"],
)
def test_is_balanced_rejects_replicas_on_leaving_clients(held: ClientAssignment) -> None:
    task_list, clients, config = balanced_with_standbys()
    assignment = {**BALANCED_WITH_STANDBYS, "c3": held}
    if held.active:  # the leaving client took t1 over from c1
        assignment["c1"] = ClientAssignment(active=("t2",), standby=("t3", "t4"))
    assert not is_balanced(assignment, task_list, clients, config)


def test_is_balanced_rejects_a_task_active_twice_and_another_nowhere() -> None:
    task_list = tasks("t1", "t2", "t3", "t4")
    clients = [client("c1"), client("c2")]
    even = {"c1": ClientAssignment(("t1", "t2")), "c2": ClientAssignment(("t3", "t4"))}
    assert is_balanced(even, task_list, clients)
    t1_twice_t3_nowhere = {**even, "c2": ClientAssignment(("t1", "t4"))}
    assert not is_balanced(t1_twice_t3_nowhere, task_list, clients)


@pytest.mark.parametrize("kind", ["standby", "warmup"])
def test_is_balanced_rejects_a_replica_on_the_client_of_its_active(kind: str) -> None:
    task_list, clients, config = balanced_with_standbys()
    # Each client stands by for its own tasks: the counts are even, the replicas useless.
    own = {
        "c1": ClientAssignment(active=("t1", "t2"), standby=("t1", "t2")),
        "c2": ClientAssignment(active=("t3", "t4"), standby=("t3", "t4")),
    }
    if kind == "warmup":  # a warm-up of c1's own t1, on top of the balanced assignment
        own = {
            **BALANCED_WITH_STANDBYS,
            "c1": ClientAssignment(("t1", "t2"), ("t3", "t4"), ("t1",)),
        }
    assert not is_balanced(own, task_list, clients, config)


def test_is_balanced_rejects_a_stateful_task_without_its_standbys() -> None:
    task_list = tasks("t1", "t2", "t3")
    clients = [client("c1"), client("c2"), client("c3")]
    config = AssignmentConfig(num_standby_replicas=1)
    ring = {
        "c1": ClientAssignment(("t1",), ("t2",)),
        "c2": ClientAssignment(("t2",), ("t3",)),
        "c3": ClientAssignment(("t3",), ("t1",)),
    }
    assert is_balanced(ring, task_list, clients, config)
    t2_twice_t1_none = {**ring, "c3": ClientAssignment(("t3",), ("t2",))}
    assert not is_balanced(t2_twice_t1_none, task_list, clients, config)


def test_is_balanced_rejects_replicas_of_a_stateless_task() -> None:
    task_list = tasks("t1", "t2", stateful=False)
    clients = [client("c1"), client("c2")]
    config = AssignmentConfig(num_standby_replicas=1)
    even = {"c1": ClientAssignment(("t1",)), "c2": ClientAssignment(("t2",))}
    assert is_balanced(even, task_list, clients, config)
    warming = {**even, "c2": ClientAssignment(("t2",), warmup=("t1",))}
    assert not is_balanced(warming, task_list, clients, config)


def test_capacities_near_the_float_limit_are_weighed_against_the_largest() -> None:
    # 1e308 + 1e308 overflows a float: shares are taken relative to the largest capacity.
    clients = [client("c1", capacity=1e308), client("c2", capacity=1e308)]
    result = assign(tasks("t1", "t2"), clients)
    assert {c: len(a.active) for c, a in result.assignment.items()} == {"c1": 1, "c2": 1}


def test_a_capacity_too_small_beside_the_largest_is_inconsistent_input() -> None:
    clients = [client("huge", capacity=1e300), client("tiny", capacity=1e-300)]
    with pytest.raises(
        AssignmentError,
        match=r"client 'tiny': capacity: expected at least 1e-300 times the largest "
        r"capacity \(1e\+300, client 'huge'\), found 1e-300",
    ):
        assign(tasks("t1"), clients)


def test_a_capacity_at_the_smallest_ratio_gets_a_share_of_nothing() -> None:
    # Leaving clients take no share, so their capacity is not weighed at all.
    clients = [
        client("big"),
        client("tiny", capacity=1e-300),
        client("gone", capacity=1e-301, leaving=True),
    ]
    result = assign(tasks("t1", "t2"), clients)
    assert table(result) == {
        "big": (["t1", "t2"], [], []),
        "gone": ([], [], []),
        "tiny": ([], [], []),
    }


# -- KIP-441's worked examples ------------------------------------------------------------------


def test_kip441_scaling_out_i1_i2_to_i3() -> None:
    config = AssignmentConfig(num_standby_replicas=1)
    task_list = tasks("T1", "T2", "T3")
    initial = [
        client("I1", active=["T1", "T3"], standby=["T2"]),
        client("I2", active=["T2"], standby=["T1", "T3"]),
        client("I3"),
    ]
    results, _ = until_balanced(task_list, initial, config)
    # First rebalance: nothing moves yet; I3 warms up T3, the active it is meant to take.
    assert table(results[0]) == {
        "I1": (["T1", "T3"], ["T2"], []),
        "I2": (["T2"], ["T1", "T3"], []),
        "I3": ([], [], ["T3"]),
    }
    # The KIP's stable state. (The KIP warms T1 and T3 together; we warm the active move
    # first and the standby move after, one probing rebalance more, so that the next
    # rebalance knows what each warm-up was for.)
    assert table(results[-1]) == {
        "I1": (["T1"], ["T2"], []),
        "I2": (["T2"], ["T3"], []),
        "I3": (["T3"], ["T1"], []),
    }
    assert len(results) == 3


def test_kip441_scale_out_shape_settles_in_ceil_moves_over_warmups_plus_two() -> None:
    # 12 tasks in two groups, 1 standby, 3 -> 4 clients: 3 actives and 3 standbys move to the
    # new client, 2 warm-ups at a time. Standby moves fill the warm-up slots the active moves
    # leave, so it takes KIP-441's ceil(6 / 2) + 1 = 4 rebalances plus the confirming one.
    config = AssignmentConfig(num_standby_replicas=1)
    task_list = [TaskSpec(f"T{i}", group=f"g{i // 6}", end_offset=FULL) for i in range(12)]
    three = [client(f"c{i}") for i in (1, 2, 3)]
    settled = next_round(three, assign(task_list, three, config))
    results, clients = until_balanced(task_list, [*settled, client("c4")], config)
    assert results[0].pending_moves == 6
    assert len(results) == math.ceil(6 / config.max_warmup_replicas) + 1 == 4
    assert [is_balanced(r.assignment, task_list, clients, config) for r in results] == [
        False,
        False,
        False,
        True,
    ]
    confirming = assign(task_list, next_round(clients, results[-1]), config)
    assert table(confirming) == table(results[-1])
    assert not confirming.probing_rebalance.needed
    assert [len(a.active) for a in confirming.assignment.values()] == [3, 3, 3, 3]
    assert [len(a.standby) for a in confirming.assignment.values()] == [3, 3, 3, 3]


def test_kip441_scaling_in_with_standbys_in_sync() -> None:
    config = AssignmentConfig(num_standby_replicas=1)
    # I1 (active T1, T4; standby T3) is brought down.
    remaining = [
        client("I2", active=["T2"], standby=["T1", "T4"]),
        client("I3", active=["T3"], standby=["T2"]),
    ]
    result = assign(tasks("T1", "T2", "T3", "T4"), remaining, config)
    assert table(result) == {
        "I2": (["T1", "T4"], ["T2", "T3"], []),
        "I3": (["T2", "T3"], ["T1", "T4"], []),
    }
    assert not result.probing_rebalance.needed


def test_kip441_scaling_in_with_lagging_standbys() -> None:
    config = AssignmentConfig(num_standby_replicas=1)
    lagging = 50_000
    remaining = [
        client("I2", active=["T2"], standby=["T1", "T4"], lags={"T1": lagging, "T4": lagging}),
        client("I3", active=["T3"], standby=["T2"], lags={"T2": lagging}),
    ]
    first = assign(tasks("T1", "T2", "T3", "T4"), remaining, config)
    assert table(first) == {
        "I2": (["T1", "T2", "T4"], ["T3"], []),
        "I3": (["T3"], ["T1", "T2", "T4"], []),
    }
    assert first.probing_rebalance.needed
    # I3 finishes restoring T4.
    restored = [
        client("I2", active=["T1", "T2", "T4"], standby=["T3"]),
        client("I3", active=["T3"], standby=["T1", "T2", "T4"], lags={"T1": 30_000, "T2": 30_000}),
    ]
    second = assign(tasks("T1", "T2", "T3", "T4"), restored, config)
    assert table(second) == {
        "I2": (["T1", "T2"], ["T3", "T4"], []),
        "I3": (["T3", "T4"], ["T1", "T2"], []),
    }
    assert not second.probing_rebalance.needed


def test_kip441_host_swapping_with_leaving_members() -> None:
    config = AssignmentConfig(max_warmup_replicas=4)
    task_list = tasks("T1", "T2", "T3", "T4")
    stable = [client("S1", active=["T1", "T2"]), client("S2", active=["T3", "T4"])]
    # S3 and S4 join.
    first = assign(task_list, [*stable, client("S3"), client("S4")], config)
    assert table(first) == {
        "S1": (["T1", "T2"], [], []),
        "S2": (["T3", "T4"], [], []),
        "S3": ([], [], ["T2"]),
        "S4": ([], [], ["T4"]),
    }
    # S1 and S2 are marked leaving before the warm-ups have caught up.
    behind = 500_000
    leaving = [
        client("S1", active=["T1", "T2"], leaving=True),
        client("S2", active=["T3", "T4"], leaving=True),
        client("S3", warmup=["T2"], lags={"T2": behind}),
        client("S4", warmup=["T4"], lags={"T4": behind}),
    ]
    second = assign(task_list, leaving, config)
    assert table(second) == {
        "S1": (["T1", "T2"], [], []),
        "S2": (["T3", "T4"], [], []),
        "S3": ([], [], ["T1", "T2"]),
        "S4": ([], [], ["T3", "T4"]),
    }
    assert second.may_shut_down == ()
    # S3 and S4 finish replaying T1..T4.
    third = assign(task_list, next_round(leaving, second), config)
    assert table(third) == {
        "S1": ([], [], []),
        "S2": ([], [], []),
        "S3": (["T1", "T2"], [], []),
        "S4": (["T3", "T4"], [], []),
    }
    assert third.may_shut_down == ("S1", "S2")
    assert not third.probing_rebalance.needed


def test_kip441_scaling_down_a_running_application() -> None:
    task_list = tasks("T1", "T2", "T3", "T4", "T5")
    clients = [
        client("S1", active=["T1", "T2"]),
        client("S2", active=["T3", "T4"], leaving=True),
        client("S3", active=["T5"]),
    ]
    first = assign(task_list, clients)
    # Learners: S1 for T3, S3 for T4, as in the KIP.
    assert table(first) == {
        "S1": (["T1", "T2"], [], ["T3"]),
        "S2": (["T3", "T4"], [], []),
        "S3": (["T5"], [], ["T4"]),
    }
    second = assign(task_list, next_round(clients, first))
    assert table(second) == {
        "S1": (["T1", "T2", "T3"], [], []),
        "S2": ([], [], []),
        "S3": (["T4", "T5"], [], []),
    }
    assert second.may_shut_down == ("S2",)
