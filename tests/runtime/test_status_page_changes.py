"""The status page tells an operator what is going on: a change and its target, a failed job.

A coordinator in-process (fake clock, fake processes) behind its real HTTP
server, its page rendered by a real headless browser (Chromium).
"""

from __future__ import annotations

from test_status_page import browser, render

from conftest import InProcess
from spark_elastic.runtime.coordinator.server import CoordinatorServer, bind

__all__ = ["browser"]  # the fixture these specs use


def page(harness: InProcess, chromium: str) -> str:
    server = CoordinatorServer(lambda url: harness.supervisor, bind("127.0.0.1", 0))
    server.leave_containers_running()  # the fake processes are the spec's to end
    with server.running_in_thread():
        return render(chromium, f"{server.url}/", "--dump-dom").stdout


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
    dom = page(in_process, browser)
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
    dom = page(in_process, browser)
    assert (
        "Job failed: 5 containers in a row failed before their first commit: "
        "AnalysisException: refused at start" in dom
    )
    assert "failed: AnalysisException: refused at start" in dom  # the container's row
    assert "Input lag: unknown." in dom
