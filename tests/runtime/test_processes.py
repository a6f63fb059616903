"""Specification of :class:`Processes`: the one place container processes are signalled.

In-process, with the suite's fake launcher and fake clock (the ``in_process``
fixture's): a doomed container is asked to stop at once and killed a grace
later unless it exits first; nothing without a handle is signalled.
"""

from __future__ import annotations

from conftest import InProcess
from spark_elastic.runtime.coordinator.processes import Processes


def test_a_doomed_container_that_ignores_its_stop_is_killed_once_its_grace_is_over(
    in_process: InProcess,
) -> None:
    launcher, clock = in_process.launcher, in_process.clock
    launcher.exits_on_sigterm = False  # busy past its batch boundary
    processes = Processes(launcher, clock, grace_s=6.0)
    pid = processes.launch("c9", {})
    processes.doom(pid, "c9")
    assert launcher.processes[pid].terminated
    assert processes.alive(pid, "c9")
    clock.advance(5.9)
    processes.reap()
    assert processes.alive(pid, "c9")  # within its grace: it may still finish its batch
    clock.advance(0.2)
    processes.reap()
    assert launcher.processes[pid].killed
    assert not processes.alive(pid, "c9")


def test_a_doomed_container_that_exits_is_killed_at_once_and_forgotten(
    in_process: InProcess,
) -> None:
    launcher, clock = in_process.launcher, in_process.clock
    launcher.exits_on_sigterm = False
    processes = Processes(launcher, clock, grace_s=6.0)
    pid = processes.launch("c9", {})
    processes.doom(pid, "c9")
    launcher.exit("c9")  # its main process exited; what is left of its group is killed
    processes.reap()
    assert launcher.processes[pid].killed
    launcher.processes[pid].killed = False
    clock.advance(60)
    processes.reap()
    assert not launcher.processes[pid].killed  # forgotten: not signalled again


def test_a_container_never_launched_is_never_signalled(in_process: InProcess) -> None:
    processes = Processes(in_process.launcher, in_process.clock, grace_s=6.0)
    processes.doom(None, "c9")
    processes.stop(None, "c9")
    processes.kill(None, "c9")
    in_process.clock.advance(60)
    processes.reap()
    assert not processes.alive(None, "c9")
    assert in_process.launcher.processes == {}
