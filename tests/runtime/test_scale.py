"""Scaling a running job's containers: KIP-441's assignor plans the moves, over real HTTP.

Stand-in container processes (no Spark) under a real coordinator; the
end-to-end run with real containers is in test_job_run_stateless.py.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_runner import one_line_error, run_cli
from standins import (
    TASKS,
    TERMS,
    Clock,
    Coordinator,
    alive,
    call,
    crash,
    model,
    report_commit,
    shape,
    started,
    wait_until,
)

from spark_elastic.runtime.coordinator.placement import may_shut_down
from spark_elastic.runtime.coordinator.supervisor import JobShape
from spark_elastic.runtime.protocol import ContainerModel


def scale_to(coordinator: Coordinator, containers: int) -> dict[str, Any]:
    before = model(coordinator)
    started(coordinator)
    status, reply = call(f"{coordinator.url}/scale", {"containers": containers})
    assert status == 200, reply
    after = model(coordinator)
    assert after["version"] >= reply["jobModelVersion"] > before["version"]
    wait_until(
        f"{containers} running containers, the model's",
        lambda: set(coordinator.running()) == {c["containerId"] for c in after["containers"]},
    )
    return after


def check_moves(before: dict[str, Any], after: dict[str, Any], containers: int) -> None:
    sets = [c["tasks"] for c in after["containers"]]
    assert len(sets) == containers
    assert sorted(t for s in sets for t in s) == sorted(TASKS)  # every task once
    assert max(map(len, sets)) - min(map(len, sets)) <= 1  # balanced
    old = {c["containerId"]: c for c in before["containers"]}
    for c in after["containers"]:
        if c["containerId"] in old:  # kept: same tasks, same generation, untouched
            assert c == old[c["containerId"]]
        else:  # a successor starts from every predecessor that held one of its tasks
            holders = {o["checkpoint"] for o in old.values() if set(o["tasks"]) & set(c["tasks"])}
            assert set(c["sources"]) == holders


def stayed(before: dict[str, Any], after: dict[str, Any]) -> int:
    """Tasks still run by the same container, or by the one successor that continues it.

    Each predecessor is continued by at most one successor, matched by the most
    tasks in common (a one-to-one matching, largest overlaps first).
    """
    old = {c["checkpoint"]: set(c["tasks"]) for c in before["containers"]}
    total, continued, successors = 0, set(), []
    for c in after["containers"]:
        if c["checkpoint"] in old:  # kept, untouched
            total += len(c["tasks"])
            continued.add(c["checkpoint"])
        else:
            successors.append(c)
    pairs = sorted(
        ((len(old[s] & set(c["tasks"])), s, c["containerId"]) for c in successors for s in old),
        reverse=True,
    )
    matched: set[str] = set()
    for overlap, source, successor in pairs:
        if source not in continued and successor not in matched:
            total += overlap
            continued.add(source)
            matched.add(successor)
    return total


def test_scaling_out_and_back_in_moves_only_what_balance_needs(
    coordinator: Coordinator,
) -> None:
    wait_until("two containers", lambda: len(coordinator.running()) == 2)
    two = model(coordinator)
    three = scale_to(coordinator, 3)
    check_moves(two, three, 3)
    # Sticky (KIP-441): the new container takes 4 tasks; 8 stay with the container that
    # ran them, or with its successor.
    assert stayed(two, three) == 8
    back = scale_to(coordinator, 2)
    check_moves(three, back, 2)
    assert stayed(three, back) == 8
    said = [e["detail"] for e in coordinator.status()["events"] if e["kind"] == "scale"]
    assert len(said) == 2
    assert re.fullmatch(
        r"2 -> 3 containers: 0 keep their tasks, 2 hand over to 3, job model \d+", said[-1]
    ), said


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"containers": 0}, 400, "containers: expected a whole number >= 1"),
        ({"containers": 13}, 400, "at most the job's 12 virtual tasks"),
        ({"containers": "3"}, 400, "whole number"),
        ({"count": 3}, 400, '{"containers": N}'),
    ],
)
def test_a_bad_scale_request_is_one_line_and_changes_nothing(
    coordinator: Coordinator, body: dict[str, Any], status: int, needle: str
) -> None:
    wait_until("two containers", lambda: len(coordinator.running()) == 2)
    reply = call(f"{coordinator.url}/scale", body)
    assert reply[0] == status
    assert needle in reply[1]["error"]
    assert "\n" not in reply[1]["error"]
    assert len(model(coordinator)["containers"]) == 2
    assert "scale" not in [e["kind"] for e in coordinator.status()["events"]]


@pytest.fixture
def slow_handover(make_coordinator: Callable[..., Coordinator]) -> Coordinator:
    """Predecessors that do not stop, and a clock that stands still: a handover stays
    under way until the spec moves the clock past their leases."""
    c = make_coordinator(env={"STANDIN_STUBBORN": "1"}, clock=Clock())
    wait_until("two containers", lambda: len(c.running()) == 2)
    started(c)
    return c


def test_a_scale_while_another_is_under_way_is_refused(slow_handover: Coordinator) -> None:
    assert call(f"{slow_handover.url}/scale", {"containers": 3})[0] == 200
    status, reply = call(f"{slow_handover.url}/scale", {"containers": 4})
    assert status == 409
    assert "a change is under way (2 -> 3 containers: handing over)" in reply["error"]
    assert len(model(slow_handover)["containers"]) == 3
    assert [e["kind"] for e in slow_handover.status()["events"]].count("scale") == 1


@pytest.fixture
def stateful(make_coordinator: Callable[..., Coordinator], tmp_path: Path) -> Coordinator:
    """A stateful job whose warm-ups say they are ready only once the spec opens a gate."""
    base = shape(tmp_path)
    c = make_coordinator(
        job_shape=JobShape(**{**base.__dict__, "stateful": True}),
        env={"STANDIN_WARM_GATE": str(tmp_path / "warm")},
    )
    wait_until("two containers", lambda: len(c.running()) == 2)
    started(c)
    return c


def test_a_stateful_job_moves_tasks_only_once_their_new_owners_are_warm(
    stateful: Coordinator, tmp_path: Path
) -> None:
    two = model(stateful)
    owners = stateful.running()
    status, reply = call(f"{stateful.url}/scale", {"containers": 3})
    assert status == 200, reply
    assert "warm up first" in reply["summary"]
    pending = model(stateful)
    # KIP-441: the new owners warm up while the old ones keep every task.
    assert pending["containers"] == two["containers"]
    warmups = pending["warmups"]
    assert warmups
    assert all(w["sources"] == [] for w in warmups)
    wait_until(
        "the warm-ups launched",
        lambda: all(
            c["pid"]
            for c in stateful.status()["containers"]
            if c["containerId"] in {w["containerId"] for w in warmups}
        ),
    )
    move = stateful.status()["move"]
    assert move["phase"] == "warming up"
    assert {w["containerId"] for w in move["warmups"]} == {w["containerId"] for w in warmups}
    refused = call(f"{stateful.url}/scale", {"containers": 2})
    assert refused[0] == 409
    assert "a change is under way (2 -> 3 containers: warming up)" in refused[1]["error"]
    assert stateful.running() == owners  # nobody stopped while the warm-ups are not ready

    (tmp_path / "warm").touch()
    three = wait_until(
        "the warm-ups to own their tasks",
        lambda: (m := model(stateful))["warmups"] == [] and len(m["containers"]) == 3 and m,
    )
    check_moves(two, three, 3)
    assert stayed(two, three) == 8
    wait_until("3 running containers", lambda: len(stateful.running()) == 3)
    assert stateful.status()["move"] is None
    kinds = [e["kind"] for e in stateful.status()["events"]]
    assert kinds.count("warm") == len(warmups)
    # The probing move's two phases (catch up, stop the old owners), then each hand-over.
    assert kinds.count("move") == 2 + len(warmups)
    # The old owners that handed over stopped before any warm-up took their tasks.
    leaving = [c for c in two["containers"] if c not in three["containers"]]
    for c in leaving:
        assert not alive(owners[c["containerId"]])


def test_old_owners_whose_queries_stopped_hand_over_before_their_processes_exit(
    tmp_path: Path,
) -> None:
    base = shape(tmp_path)
    # Each old owner says its query stopped, then takes a minute to exit (a JVM on its
    # way out, slowed down): its successor need not wait for that.
    c = Coordinator(
        tmp_path,
        job_shape=JobShape(**{**base.__dict__, "stateful": True}),
        env={"STANDIN_LINGER_S": "60"},
    )
    try:
        with c.server.running_in_thread():
            wait_until("two containers", lambda: len(c.running()) == 2)
            started(c)
            two, owners = model(c), c.running()
            assert call(f"{c.url}/scale", {"containers": 3})[0] == 200
            three = wait_until(
                "the warm-ups to own their tasks",
                lambda: (m := model(c))["warmups"] == [] and len(m["containers"]) == 3 and m,
            )
            leaving = [o["containerId"] for o in two["containers"] if o not in three["containers"]]
            assert leaving
            assert all(alive(owners[o]) for o in leaving)  # still on their way out
            check_moves(two, three, 3)
            c.kill_all()  # the coordinator's stop would wait for them
    finally:
        c.kill_all()


CATCH_UP_S = 5.0
"""How long these specs' old owners wait for their warm-ups: longer than a lease (2 s)."""


def advance(coordinator: Coordinator, clock: Clock, seconds: float) -> None:
    """Move the frozen clock on by ``seconds`` in steps shorter than a lease, with heartbeats
    between them (every container's lease is renewed at each step)."""
    left = seconds
    while left > 0:
        step = min(left, TERMS.lease_s / 2)
        clock.now += step
        left -= step
        beats = coordinator.status()["counters"].get("heartbeats_alive", 0)
        wait_until(
            "heartbeats at the new time",
            lambda b=beats: coordinator.status()["counters"].get("heartbeats_alive", 0) >= b + 10,
        )


@pytest.fixture
def catching_up(
    make_coordinator: Callable[..., Coordinator], tmp_path: Path
) -> tuple[Coordinator, Clock]:
    """A stateful job whose warm-ups are ready at once but say they caught up with their
    old owners only once the spec opens a gate; its clock moves only when the spec says."""
    base = shape(tmp_path)
    clock = Clock()
    c = make_coordinator(
        job_shape=JobShape(**{**base.__dict__, "stateful": True}),
        env={"STANDIN_CAUGHT_UP_GATE": str(tmp_path / "caught-up")},
        clock=clock,
        catch_up_s=CATCH_UP_S,
    )
    wait_until("two containers", lambda: len(c.running()) == 2)
    started(c)
    return c, clock


def listed_as_stopping(coordinator: Coordinator, owners: dict[str, int]) -> dict[str, Any]:
    """Scale 2 -> 3, then wait for the handover's first phase: the old owners listed as
    stopping, and a few more ticks in which they keep running."""
    assert call(f"{coordinator.url}/scale", {"containers": 3})[0] == 200
    listed: dict[str, Any] = wait_until(
        "the old owners listed as stopping", lambda: (m := model(coordinator))["stopping"] and m
    )
    assert set(listed["stopping"]) <= set(owners)
    assert all(w["sources"] == [] for w in listed["warmups"])  # no warm-up owns a task yet
    assert coordinator.status()["move"]["phase"] == "catching up"
    beats = coordinator.status()["counters"]["heartbeats_alive"]
    wait_until(
        "more heartbeats (ticks at 0.2 s)",
        lambda: coordinator.status()["counters"]["heartbeats_alive"] >= beats + 10,
    )
    return listed


def test_old_owners_stop_once_their_warm_ups_have_caught_up_with_them(
    catching_up: tuple[Coordinator, Clock], tmp_path: Path
) -> None:
    coordinator, _ = catching_up
    owners = coordinator.running()
    listed = listed_as_stopping(coordinator, owners)
    # They run on (a replaying warm-up stops raising its gate and applies what is below it).
    assert coordinator.running() == owners
    assert model(coordinator)["warmups"] == listed["warmups"]
    (tmp_path / "caught-up").touch()  # every warm-up says it caught up
    wait_until(
        "the warm-ups to own their tasks",
        lambda: (m := model(coordinator))["warmups"] == [] and m["stopping"] == [],
    )
    for owner in listed["stopping"]:
        assert not alive(owners[owner])


def test_old_owners_stop_the_catch_up_time_after_the_listing_if_a_warm_up_never_catches_up(
    catching_up: tuple[Coordinator, Clock],
) -> None:
    coordinator, clock = catching_up
    owners = coordinator.running()
    listed = listed_as_stopping(coordinator, owners)
    advance(coordinator, clock, CATCH_UP_S - 0.1)
    assert coordinator.running() == owners
    clock.now += 0.2
    wait_until("the warm-ups to own their tasks", lambda: model(coordinator)["warmups"] == [])
    for owner in listed["stopping"]:
        assert not alive(owners[owner])


def test_catching_up_resumes_after_a_coordinator_restart(tmp_path: Path) -> None:
    base = shape(tmp_path)
    stateful = JobShape(**{**base.__dict__, "stateful": True})
    env = {"STANDIN_CAUGHT_UP_GATE": str(tmp_path / "caught-up")}
    clock = Clock()
    first = Coordinator(tmp_path, job_shape=stateful, env=env, clock=clock, catch_up_s=CATCH_UP_S)
    try:
        with first.server.running_in_thread():
            wait_until("two containers", lambda: len(first.running()) == 2)
            started(first)
            owners = first.running()
            listed = listed_as_stopping(first, owners)
            crash(first)
        # The coordinator comes back while the warm-ups catch up: the old owners are still
        # listed and still run; the phase goes on, its time counted from the restart.
        port = int(first.url.rsplit(":", 1)[1])
        second = Coordinator(
            tmp_path, port=port, job_shape=stateful, env=env, clock=clock, catch_up_s=CATCH_UP_S
        )
        with second.server.running_in_thread():
            assert model(second)["stopping"] == listed["stopping"]
            assert second.status()["move"]["phase"] == "catching up"
            advance(second, clock, CATCH_UP_S - 0.1)
            assert second.running() == owners
            (tmp_path / "caught-up").touch()
            wait_until(
                "the warm-ups to own their tasks",
                lambda: (m := model(second))["warmups"] == [] and m["stopping"] == [],
            )
            assert len(model(second)["containers"]) == 3
            for owner in listed["stopping"]:
                assert not alive(owners[owner])
    finally:
        first.kill_all()


def test_job_scale_on_the_command_line(slow_handover: Coordinator) -> None:
    url = slow_handover.url
    result = run_cli("job", "scale", url, "--containers", "3")
    assert result.returncode == 0, result.stderr
    assert "2 -> 3 containers" in result.stdout
    one_line_error(
        run_cli("job", "scale", url, "--containers", "4"), "2 -> 3 containers: handing over"
    )
    one_line_error(run_cli("job", "scale", url, "--containers", "0"), "--containers")
    one_line_error(run_cli("job", "scale", "http://127.0.0.1:9", "--containers", "2"), "URL")


def test_a_move_goes_on_after_a_warm_up_dies_and_after_a_coordinator_restart(
    tmp_path: Path,
) -> None:
    base = shape(tmp_path)
    stateful = JobShape(**{**base.__dict__, "stateful": True})
    gate = {"STANDIN_WARM_GATE": str(tmp_path / "warm")}
    first = Coordinator(tmp_path, job_shape=stateful, env=gate)
    try:
        with first.server.running_in_thread():
            wait_until("two containers", lambda: len(first.running()) == 2)
            started(first)
            two = model(first)
            assert call(f"{first.url}/scale", {"containers": 3})[0] == 200
            warmups = {w["containerId"]: w["tasks"] for w in model(first)["warmups"]}
            pids = wait_until(
                "the warm-ups launched",
                lambda: (
                    (
                        p := {
                            c["containerId"]: c["pid"]
                            for c in first.status()["containers"]
                            if c["containerId"] in warmups and c["pid"]
                        }
                    )
                    and len(p) == len(warmups)
                    and p
                ),
            )
            victim = sorted(pids)[0]
            first.launcher.kill(pids[victim], victim, signal.SIGKILL)
            # A warm-up that died is replaced by another for the same tasks; nothing moved.
            replaced = wait_until(
                "a new warm-up for the dead one's tasks",
                lambda: (
                    (ws := model(first)["warmups"])
                    and victim not in {w["containerId"] for w in ws}
                    and ws
                ),
            )
            assert sorted(w["tasks"] for w in replaced) == sorted(warmups.values())
            assert model(first)["containers"] == two["containers"]
            crash(first)
        # The coordinator comes back mid-warm-up: the move is still pending, then completes.
        second = Coordinator(
            tmp_path, port=int(first.url.rsplit(":", 1)[1]), job_shape=stateful, env=gate
        )
        with second.server.running_in_thread():
            assert model(second)["warmups"] == replaced
            assert second.status()["move"]["phase"] == "warming up"
            (tmp_path / "warm").touch()
            three = wait_until(
                "the warm-ups to own their tasks",
                lambda: (m := model(second))["warmups"] == [] and len(m["containers"]) == 3 and m,
            )
            check_moves(two, three, 3)
            wait_until("3 running containers", lambda: len(second.running()) == 3)
    finally:
        first.kill_all()


def report_progress(coordinator: Coordinator) -> None:
    """A first progress report from each container that has not sent one (its query runs)."""
    reported = set(coordinator.supervisor.store.throughput())
    for c in model(coordinator)["containers"]:
        if c["containerId"] not in reported:
            report_commit(coordinator.url, c)


def factors(m: dict[str, Any]) -> set[int]:
    return {int(t.rsplit("_", 1)[1]) for c in m["containers"] for t in c["tasks"]}


def test_a_live_factor_change_moves_one_container_at_a_time_and_each_key_has_one_owner(
    stateful: Coordinator, tmp_path: Path
) -> None:
    four = model(stateful)
    status, reply = call(f"{stateful.url}/scale", {"elasticityFactor": 8})
    assert status == 200, reply
    assert "elasticity factor 4 -> 8" in reply["summary"]
    pending = model(stateful)
    assert pending["containers"] == four["containers"]
    # Each container's warm-up takes its tasks' children at the new factor.
    for old, warm in zip(four["containers"], pending["warmups"], strict=True):
        children = {
            f"{t.rsplit('_', 2)[0]}_{int(t.split('_')[1]) + j}_8"
            for t in old["tasks"]
            for j in (0, 4)
        }
        assert set(warm["tasks"]) == children
    refused = call(f"{stateful.url}/scale", {"containers": 3})
    assert refused[0] == 409
    # The status names, for each warm-up, the container whose keys it takes.
    move = stateful.status()["move"]
    owners = [c["containerId"] for c in four["containers"]]
    assert [w["from"] for w in move["warmups"]] == [[o] for o in owners]

    (tmp_path / "warm").touch()
    wait_until("the first group moved", lambda: len(model(stateful)["warmups"]) == 1)
    # The second group waits until the first one's new owner runs (reports progress), so the
    # job as a whole never stops at once.
    beats = stateful.status()["counters"]["heartbeats_alive"]
    wait_until(
        "more heartbeats (and ticks)",
        lambda: stateful.status()["counters"]["heartbeats_alive"] > beats + 20,
    )
    assert len(model(stateful)["warmups"]) == 1
    eight = wait_until(
        "the job at factor 8",
        lambda: report_progress(stateful) or ((m := model(stateful))["warmups"] == [] and m),
    )
    assert eight["elasticityFactor"] == 8
    assert sorted(t for c in eight["containers"] for t in c["tasks"]) == sorted(
        f"Partition {p}_{b}_8" for p in range(3) for b in range(8)
    )
    # One group at a time: a model in between ran one container at each factor.
    store = stateful.supervisor.store
    between = [store.model(v).to_json() for v in store.model_versions()]  # type: ignore[union-attr]
    assert any(factors(m) == {4, 8} for m in between)
    for m in between:  # never a key without an owner, never one with two
        owned = [
            (t.rsplit("_", 2)[0], b)
            for c in m["containers"]
            for t in c["tasks"]
            for b in range(8)
            if b % int(t.rsplit("_", 1)[1]) == int(t.split("_")[1])
        ]
        assert len(owned) == len(set(owned)) == 24

    # Merge back: each parent goes to one container; the factor is 4 again.
    wait_until("2 running containers", lambda: len(stateful.running()) == 2)
    started(stateful)
    assert call(f"{stateful.url}/scale", {"elasticityFactor": 4})[0] == 200
    back = wait_until(
        "the job at factor 4",
        lambda: report_progress(stateful) or ((m := model(stateful))["warmups"] == [] and m),
    )
    assert back["elasticityFactor"] == 4
    assert sorted(t for c in back["containers"] for t in c["tasks"]) == sorted(TASKS)


@pytest.mark.parametrize(
    ("factor", "needle"),
    [
        (3, "elasticity_factor: expected a power of two from 1 to 1024"),
        (2048, "elasticity_factor: expected a power of two from 1 to 1024"),
        (True, "elasticity_factor: expected an int power of two"),
    ],
)
def test_a_bad_factor_is_one_line_and_changes_nothing(
    coordinator: Coordinator, factor: object, needle: str
) -> None:
    wait_until("two containers", lambda: len(coordinator.running()) == 2)
    status, reply = call(f"{coordinator.url}/scale", {"elasticityFactor": factor})
    assert status == 400
    assert needle in reply["error"]
    assert model(coordinator)["warmups"] == []
    assert "scale" not in [e["kind"] for e in coordinator.status()["events"]]
    one_line_error(
        run_cli("job", "scale", coordinator.url, "--elasticity-factor", "3"),
        "--elasticity-factor",
    )


def test_with_warm_ups_off_a_new_owner_launches_only_after_its_old_owners_stopped(
    tmp_path: Path,
) -> None:
    base = shape(tmp_path)
    c = Coordinator(
        tmp_path, job_shape=JobShape(**{**base.__dict__, "stateful": True}), warm_ups=False
    )
    try:
        with c.server.running_in_thread():
            wait_until("two containers", lambda: len(c.running()) == 2)
            started(c)
            two = model(c)
            assert call(f"{c.url}/scale", {"containers": 3})[0] == 200
            three = wait_until(
                "the new owners own their tasks",
                lambda: (m := model(c))["warmups"] == [] and len(m["containers"]) == 3 and m,
            )
            check_moves(two, three, 3)
            wait_until("3 running containers", lambda: len(c.running()) == 3)
            events = list(reversed(c.status()["events"]))  # oldest first
            stopping = next(i for i, e in enumerate(events) if e["kind"] == "move")
            new = {x["containerId"] for x in three["containers"]} - {
                x["containerId"] for x in two["containers"]
            }
            launches = [
                i for i, e in enumerate(events) if e["kind"] == "launch" and e["container"] in new
            ]
            assert launches
            assert min(launches) > stopping
            assert "warm" not in [e["kind"] for e in events]
    finally:
        c.kill_all()


def test_an_owner_dying_mid_move_is_replaced_and_its_new_owner_starts_from_committed_work(
    stateful: Coordinator, tmp_path: Path
) -> None:
    two = model(stateful)
    owners = stateful.running()
    assert call(f"{stateful.url}/scale", {"containers": 3})[0] == 200
    # An old owner dies while the warm-ups start: it fails over as usual.
    victim = sorted(owners)[0]
    victim_checkpoint = next(
        c["checkpoint"] for c in two["containers"] if c["containerId"] == victim
    )
    stateful.launcher.kill(owners[victim], victim, signal.SIGKILL)
    heir = wait_until(
        "the dead owner's successor",
        lambda: next(
            (c for c in model(stateful)["containers"] if victim_checkpoint in c["sources"]), None
        ),
    )
    assert model(stateful)["warmups"]  # the move is still pending
    (tmp_path / "warm").touch()
    three = wait_until(
        "the warm-ups to own their tasks",
        lambda: (m := model(stateful))["warmups"] == [] and len(m["containers"]) == 3 and m,
    )
    # The successor never committed a batch, so the warm-ups take what it was given.
    taken = {s for c in three["containers"] for s in c["sources"]}
    assert victim_checkpoint in taken
    assert heir["checkpoint"] not in taken
    # A new owner that dies before its first commit hands on the same committed work.
    wait_until("3 running containers", lambda: len(stateful.running()) == 3)
    first = three["containers"][0]
    pid = stateful.running()[first["containerId"]]
    stateful.launcher.kill(pid, first["containerId"], signal.SIGKILL)
    again = wait_until(
        "its successor",
        lambda: next(
            (
                c
                for c in model(stateful)["containers"]
                if c["tasks"] == first["tasks"] and c["containerId"] != first["containerId"]
            ),
            None,
        ),
    )
    assert again["sources"] == first["sources"]


def container(name: str, *tasks: str) -> ContainerModel:
    return ContainerModel(name, tasks, 1, f"/cp/{name}")


def test_an_old_owner_may_shut_down_only_once_every_task_it_runs_has_a_ready_new_owner() -> None:
    # KIP-441's assignor decides: a task stays active on its leaving owner while no other
    # client has caught up with it.
    old = container("old", "Partition 0_0_2", "Partition 0_1_2")
    split = [
        container("w1", "Partition 0_0_4", "Partition 0_2_4"),
        container("w2", "Partition 0_1_4"),
    ]
    assert may_shut_down(split, [old], ready=set()) == ()
    assert may_shut_down(split, [old], ready={"w1"}) == ()
    assert may_shut_down(split, [old], ready={"w1", "w2"}) == ("old",)
    # A merge: one new task's keys are held by two old owners; both wait for its new owner.
    a, b = container("a", "Partition 0_0_4", "Partition 0_1_4"), container("b", "Partition 0_2_4")
    merge = [container("w", "Partition 0_0_2")]
    assert may_shut_down(merge, [a, b], ready=set()) == ()
    assert set(may_shut_down(merge, [a, b], ready={"w"})) == {"a", "b"}
