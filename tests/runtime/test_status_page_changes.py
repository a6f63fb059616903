"""The status page tells an operator what is going on: a change and its target, a failed job.

A coordinator in-process (fake clock, fake processes) behind its real HTTP
server, its page rendered by a real headless browser (Chromium).
"""

from __future__ import annotations

from cli_runner import run_cli
from test_status_page import browser, render

from conftest import InProcess
from spark_elastic.runtime.coordinator.server import CoordinatorServer, bind

__all__ = ["browser"]  # the fixture these specs use


def page(harness: InProcess, chromium: str, cli: bool = False) -> tuple[str, str]:
    """The page as the browser shows it, and ``job status URL``'s output if ``cli``."""
    server = CoordinatorServer(lambda url: harness.supervisor, bind("127.0.0.1", 0))
    server.leave_containers_running()  # the fake processes are the spec's to end
    with server.running_in_thread():
        dom = render(chromium, f"{server.url}/", "--dump-dom").stdout
        status = run_cli("job", "status", server.url) if cli else None
    assert status is None or status.returncode == 0, status.stderr
    return dom, "" if status is None else status.stdout


def test_the_page_shows_the_change_in_flight_with_its_target_and_phase(
    browser: str, in_process: InProcess
) -> None:
    in_process.restart(stateful=True)
    sup = in_process.supervisor
    sup.launch_pending()
    in_process.register_all()
    for c in sup.model.containers:
        in_process.report(c.container_id, batch=1, lag=500)
    sup.change_factor(4)
    dom, _ = page(in_process, browser)
    assert "Job running. Input lag: 1,000 records." in dom
    assert "Change in flight: elasticity factor 2 -&gt; 4: warming up, group 1 of 2" in dom
    assert "then roll back" in dom
    assert "It can be cancelled (job scale URL --cancel)." in dom
    assert "starting (60 s left to register)" not in dom  # warm-ups: bounded by the change


def test_the_page_shows_a_failed_job_and_its_cause(browser: str, in_process: InProcess) -> None:
    sup = in_process.supervisor
    sup.launch_pending()
    in_process.register_all()
    tasks = sup.model.containers[0].tasks
    while sup.job_state()["state"] == "running":
        owner = next(c.container_id for c in sup.model.containers if c.tasks == tasks)
        if owner in in_process.launcher.running():
            in_process.register_all()
            sup.report_failure(owner, "AnalysisException: refused at start")
        in_process.step(0.5)
    dom, _ = page(in_process, browser)
    assert (
        "Job failed: 5 containers in a row failed before their first commit: "
        "AnalysisException: refused at start" in dom
    )
    assert "failed: AnalysisException: refused at start" in dom  # the container's row
    assert "Input lag: unknown." in dom


def test_a_time_ordered_job_shows_the_records_processed_without_waiting_of_all_its_containers(
    browser: str, in_process: InProcess
) -> None:
    # Issue #26: Kafka Streams' enforced-processing, on the page and in `job status`, counted
    # over every container the job ran: one that failed over keeps its share.
    in_process.restart(stateful=True, time_ordered=True)
    sup = in_process.supervisor
    sup.launch_pending()
    in_process.register_all()
    first, second = (c.container_id for c in sup.model.containers)
    in_process.report(first, batch=1, enforced=3)
    in_process.report(first, batch=2, enforced=4)
    in_process.report(second, batch=1)
    in_process.launcher.exit(first)
    while first in in_process.live():
        in_process.step(0.5)
    assert {c["containerId"]: c["recordsEnforced"] for c in sup.status()["containers"]}[first] == 7
    dom, status = page(in_process, browser, cli=True)
    assert "Records processed without waiting (enforced): 7." in dom
    assert "records processed without waiting (enforced): 7" in status


def test_a_job_that_does_not_merge_by_time_shows_no_records_processed_without_waiting(
    browser: str, in_process: InProcess
) -> None:
    in_process.restart(stateful=True)
    in_process.supervisor.launch_pending()
    in_process.register_all()
    assert in_process.supervisor.status()["recordsEnforced"] is None
    dom, status = page(in_process, browser, cli=True)
    assert "without waiting" not in dom
    assert "without waiting" not in status
