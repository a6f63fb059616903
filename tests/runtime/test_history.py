"""The coordinator keeps the job's recent history: rates, lag, batch times, and each change.

The columns a chart draws (:func:`series`, pure), and the coordinator's own
history in-process (fake clock, fake processes, a real store): samples of
what its store counts, and a span for each change from its start to its end
with its outcome, kept across a coordinator restart.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from cli_runner import run_cli
from standins import call
from test_changes import running, until_handing_over, warm_ups

from conftest import InProcess
from spark_elastic.runtime.coordinator.history import (
    GAP_S,
    KEEP_S,
    MAX_POINTS,
    SAMPLE_S,
    Sample,
    Span,
    series,
)
from spark_elastic.runtime.coordinator.server import CoordinatorServer, bind
from spark_elastic.runtime.protocol import ProgressReport, TaskProgress

# the columns a chart draws, pure


def sample(at: float, read: dict[str, int], lag: dict[str, int] | None = None) -> Sample:
    return Sample(at, read, read, dict.fromkeys(read, 500), lag or {}, {}, None)


def test_rates_are_the_records_counted_between_neighbouring_samples() -> None:
    samples = [sample(100, {"c1": 0}), sample(102, {"c1": 400}), sample(104, {"c1": 1000})]
    got = series(samples, [], 300, 104)
    assert got["t"] == [100, 102, 104]
    assert got["job"]["read"] == [None, 200.0, 300.0]  # nothing before the first
    assert got["containers"]["c1"]["processed"] == [None, 200.0, 300.0]
    assert got["containers"]["c1"]["batchMs"] == [500, 500, 500]


def test_a_container_counts_from_zero_and_an_ended_ones_line_ends() -> None:
    # c2 starts between the samples (its totals start with it); c1 has ended by the third
    # (samples keep only containers that may still commit): its line ends, never a 0.
    samples = [
        sample(100, {"c1": 1000}),
        sample(102, {"c1": 1200, "c2": 300}),
        sample(104, {"c2": 700}),
    ]
    got = series(samples, [], 300, 104)
    assert got["containers"]["c2"]["read"] == [None, 150.0, 200.0]
    assert got["containers"]["c1"]["read"] == [None, 100.0, None]
    assert got["job"]["read"] == [None, 250.0, 200.0]


def test_samples_further_apart_than_the_gap_have_no_rate_between_them() -> None:
    # A coordinator down for a while: its successor's first sample starts a new line.
    samples = [sample(100, {"c1": 0}), sample(100 + GAP_S + 1, {"c1": 5000})]
    assert series(samples, [], 300, 200)["job"]["read"] == [None, None]


def test_a_window_shows_its_samples_rated_against_the_one_before_it() -> None:
    samples = [sample(at, {"c1": 10 * at}) for at in range(0, 1000, 2)]
    got = series(samples, [], 300, 998)
    assert got["t"][0] == 698
    assert got["job"]["read"][0] == 10.0  # rated against 696, outside the window


def test_a_long_window_is_thinned_with_exact_rates_and_the_longest_batches() -> None:
    samples = [
        Sample(at, {"c1": 10 * at}, {"c1": 10 * at}, {"c1": at % 7}, {}, {}, None)
        for at in range(0, 1800, 2)
    ]
    got = series(samples, [], 1800, 1798)
    assert len(got["t"]) == MAX_POINTS
    assert got["t"][-1] == 1798  # the newest always
    assert got["job"]["read"][1:] == [10.0] * (MAX_POINTS - 1)  # over 6 s, still exact
    assert got["job"]["read"][0] is None
    assert got["containers"]["c1"]["batchMs"][-1] == max(a % 7 for a in (1794, 1796, 1798))


def test_a_thinned_window_keeps_its_points_as_it_is_polled_again() -> None:
    # Intervals are fixed in time: a chart polled 2 s later moves on by at most a point.
    samples = [Sample(at, {"c1": at}, {"c1": at}, {}, {}, {}, None) for at in range(0, 3600, 2)]
    first = series(samples[:-1], [], 1800, 3596)["t"]
    again = series(samples, [], 1800, 3598)["t"]
    assert set(first[1:-1]) <= set(again)


def test_a_task_that_appears_has_no_rate_until_its_second_sample() -> None:
    # Its committed offsets are the partition's, not counted from 0 (a task of a new factor,
    # a job resumed from a checkpoint).
    samples = [
        Sample(100, {}, {}, {}, {"t1": 0}, {}, None),
        Sample(102, {}, {}, {}, {"t1": 0}, {"t1": 2_000_000}, None),
        Sample(104, {}, {}, {}, {"t1": 0}, {"t1": 2_000_400}, None),
    ]
    assert series(samples, [], 300, 104)["tasks"]["t1"]["rate"] == [None, None, 200.0]


def test_samples_at_the_same_time_or_out_of_order_have_no_rate() -> None:
    samples = [sample(100, {"c1": 0}), sample(100, {"c1": 50}), sample(98, {"c1": 80})]
    assert series(samples, [], 300, 100)["job"]["read"] == [None, None, None]


def test_the_lag_chart_names_the_tasks_with_most_lag_now() -> None:
    lag = {f"t{i:02}": i for i in range(20)} | {"t00": 0}
    got = series([sample(100, {}, lag)], [], 300, 100)
    assert got["topTasks"] == [f"t{i:02}" for i in range(19, 11, -1)]
    assert got["tasks"]["t05"]["lag"] == [5]
    unknown = series([sample(100, {}, {"a": -1, "b": 3})], [], 300, 100)
    assert unknown["tasks"]["a"]["lag"] == [None]
    assert unknown["job"]["lag"] == [None]  # one task unknown: the job's lag is unknown


def test_a_window_shows_the_changes_that_overlap_it() -> None:
    spans = [
        Span("a", "scale", "2 -> 3", 10, 20, "done", "done in 10 s"),
        Span("b", "failover", "c1 -> c3", 650, 710, "registered", "registered"),
        Span("c", "stop", "stopped 2 containers", 990),
    ]
    got = series([], spans, 300, 1000)
    assert [s["id"] for s in got["spans"]] == ["b", "c"]
    assert got["spans"][1]["endedAt"] is None


# the coordinator's history, in-process


def spans(harness: InProcess) -> list[tuple[str, str, str]]:
    """Each span's kind, whether it lasts, and its result, oldest first."""
    return [
        (s["kind"], s["label"], "lasting" if s["endedAt"] is None else s["result"])
        for s in harness.supervisor.history.read(300)["spans"]
    ]


def test_a_move_is_a_span_and_its_warm_ups_another_each_ending_with_its_outcome(
    in_process: InProcess,
) -> None:
    running(in_process, stateful=True, catch_up_s=5)
    sup = in_process.supervisor
    sup.scale(3)
    assert spans(in_process) == [
        ("scale", "2 -> 3 containers", "lasting"),
        ("warm-up", "2 -> 3 containers: warm-ups warming up", "lasting"),
    ]
    until_handing_over(in_process)
    assert spans(in_process)[1][2] == "ready"
    for _ in range(10):
        in_process.step(1)
        in_process.register_all()
        for c in sup.model.containers:
            in_process.report(c.container_id, batch=2)
    assert sup.change is None
    (scale, warm) = sup.history.read(300)["spans"]
    assert warm["result"] == "ready"
    assert scale["result"] == "done"
    assert scale["outcome"].startswith("done in ")
    assert scale["endedAt"] >= scale["startedAt"]


def test_a_move_rolled_back_ends_its_span_and_its_warm_ups_rolled_back(
    in_process: InProcess,
) -> None:
    running(in_process, stateful=True)
    sup = in_process.supervisor
    sup.change_factor(4)
    sup.launch_pending()
    in_process.register_all()
    sup.cancel_change()
    (factor, warm) = sup.history.read(300)["spans"]
    assert (factor["kind"], factor["result"]) == ("factor", "rolled back")
    assert factor["outcome"] == "rolled back: cancelled by the operator"
    assert (warm["kind"], warm["result"]) == ("warm-up", "rolled back")
    assert not warm_ups(in_process)


def test_a_failover_lasts_until_its_successor_registers(in_process: InProcess) -> None:
    running(in_process)
    before = set(in_process.live())
    first = min(before)
    in_process.launcher.exit(first)
    while first in in_process.live():
        in_process.step(0.5)
    (successor,) = set(in_process.live()) - before
    assert spans(in_process) == [("failover", f"{first} -> {successor}", "lasting")]
    in_process.supervisor.launch_pending()
    in_process.register_all()
    assert spans(in_process) == [("failover", f"{first} -> {successor}", "registered")]
    in_process.step(SAMPLE_S)
    assert any(first in s.read for s in in_process.supervisor.history.samples)
    assert first not in in_process.supervisor.history.samples[-1].read  # its line ends
    assert successor not in in_process.supervisor.history.samples[-1].read  # not reported yet


def test_a_failover_whose_successor_ends_unregistered_is_cut_short(in_process: InProcess) -> None:
    # A warm-up dies before it is ready, its successor is launched, then the operator rolls
    # the move back: that successor never registers, and its failover ends with it.
    running(in_process, stateful=True)
    sup = in_process.supervisor
    sup.scale(3)
    sup.launch_pending()
    dead = warm_ups(in_process)[0]
    in_process.launcher.exit(dead)
    while dead in warm_ups(in_process):
        in_process.step(0.5)
    sup.cancel_change()
    in_process.step(SAMPLE_S)
    (failover,) = [s for s in sup.history.read(300)["spans"] if s["kind"] == "failover"]
    assert failover["label"].startswith(f"{dead} -> ")
    assert (failover["result"], failover["outcome"]) == (
        "cut short",
        "its successor ended unregistered",
    )


def test_a_change_span_left_open_by_a_lost_write_is_cut_short_at_the_next_sample(
    in_process: InProcess,
) -> None:
    # A coordinator killed between a change's end and its span's (or a commit that failed):
    # no change is in flight, so its successor ends the span rather than show it forever.
    running(in_process)
    sup = in_process.supervisor
    lost = Span("scale:1000.000000", "scale", "2 -> 3 containers", sup.history.wall() - 30)
    with sup.store.transaction() as db:
        sup.store.put_span(db, lost.id, lost.started_at, lost.to_json())
    in_process.restart()
    assert spans(in_process) == [("scale", "2 -> 3 containers", "lasting")]
    in_process.step(SAMPLE_S)
    assert spans(in_process) == [("scale", "2 -> 3 containers", "cut short")]


def test_a_stop_lasts_until_the_job_resumes_and_the_history_outlives_its_coordinator(
    in_process: InProcess,
) -> None:
    running(in_process)
    sup = in_process.supervisor
    for batch in range(1, 4):
        for c in sup.model.containers:
            in_process.report(c.container_id, batch=batch)
        in_process.step(SAMPLE_S)
    taken = sup.history.read(300)["t"]
    assert len(taken) >= 3
    sup.stop_end(sup.stop_begin())
    assert spans(in_process) == [("stop", "stopped 2 containers", "lasting")]
    resumed = in_process.restart()
    assert resumed.history.read(300)["t"] == taken  # read back from the store
    assert spans(in_process) == [("stop", "stopped 2 containers", "resumed")]


def test_a_sample_counts_records_lag_and_the_longest_batch_of_each_container(
    in_process: InProcess,
) -> None:
    running(in_process)
    sup = in_process.supervisor
    in_process.step(SAMPLE_S)
    owner = sup.model.containers[0]
    for batch, took in ((2, 700), (3, 1300), (4, 900)):
        sup.progress(
            ProgressReport(
                owner.container_id,
                owner.generation,
                batch,
                1000,
                800,
                tuple(
                    TaskProgress(t, {"clicks": {int(t.split()[1].split("_")[0]): batch}}, 40)
                    for t in owner.tasks
                ),
                batch_duration_ms=took,
            )
        )
    in_process.step(SAMPLE_S)
    got = sup.history.read(300)
    mine = got["containers"][owner.container_id]
    assert mine["read"][-1] == pytest.approx(3000 / SAMPLE_S)
    assert mine["processed"][-1] == pytest.approx(2400 / SAMPLE_S)
    assert mine["batchMs"][-1] == 1300
    assert got["job"]["batchMs"][-1] == 1300
    assert all(got["tasks"][t]["lag"][-1] == 40 for t in owner.tasks)
    rows = {c["containerId"]: c for c in sup.status()["containers"]}
    assert rows[owner.container_id]["lastBatchMs"] == 900  # its last, not its longest


def test_a_coordinator_whose_clock_is_behind_its_predecessors_goes_on_after_its_samples(
    in_process: InProcess,
) -> None:
    # A standby on another host, its clock a minute behind the leader's that wrote the
    # store: its samples still come after the leader's, and the rates stay positive.
    running(in_process)
    sup = in_process.supervisor
    in_process.step(SAMPLE_S)
    last = sup.history.samples[-1]
    with sup.store.transaction() as db:
        ahead = replace(last, at=last.at + 60, read={c: v + 100 for c, v in last.read.items()})
        sup.store.add_sample(db, ahead.at, ahead.to_json(), 0)
    restarted = in_process.restart()
    in_process.step(SAMPLE_S)
    times = [s.at for s in restarted.history.samples]
    assert times == sorted(times)
    assert times[-1] > ahead.at
    assert all(r is None or r >= 0 for r in restarted.history.read(300)["job"]["read"])


def test_history_older_than_its_window_is_forgotten_by_memory_and_store(
    in_process: InProcess,
) -> None:
    running(in_process)
    sup = in_process.supervisor
    for _ in range(int(KEEP_S / SAMPLE_S) + 20):
        in_process.step(SAMPLE_S)
    stored = sup.store.samples(0)
    assert stored[0]["at"] >= sup.history.wall() - KEEP_S - SAMPLE_S
    assert len(stored) <= KEEP_S / SAMPLE_S + 1


# served


def test_the_history_is_served_as_json_and_job_status_prints_it(in_process: InProcess) -> None:
    running(in_process)
    in_process.supervisor.scale(3)
    for _ in range(3):
        in_process.step(SAMPLE_S)
    server = CoordinatorServer(lambda url: in_process.supervisor, bind("127.0.0.1", 0))
    server.leave_containers_running()
    with server.running_in_thread():
        code, body = call(f"{server.url}/history.json?window=1800")
        assert code == 200
        assert body["windowS"] == 1800
        assert len(body["t"]) >= 3
        code, body = call(f"{server.url}/history.json?window=60")
        assert code == 400
        assert body == {"error": "window: expected one of [300, 1800] (seconds), found '60'"}
        printed = run_cli("job", "status", server.url, "--json", "--history", "300")
        text = run_cli("job", "status", server.url, "--history", "300")
        wrong = run_cli("job", "status", server.url, "--history", "60")
    assert printed.returncode == 0, printed.stderr
    assert json.loads(printed.stdout)["history"]["spans"][0]["label"] == "2 -> 3 containers"
    assert text.returncode == 0, text.stderr
    assert "last 5 min: " in text.stdout
    assert "scale 2 -> 3 containers: under way since " in text.stdout
    assert wrong.returncode == 2
    assert wrong.stderr == (
        "spark-elastic job status: error: argument --history: invalid choice: 60 "
        "(choose from 300, 1800)\n"
    )
