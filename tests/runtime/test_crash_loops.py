"""Specification of :class:`CrashLoops`: failures at start carried to successors.

Pure bookkeeping on a clock in seconds. The supervisor's use of it (a job
failed after five failures of one cause, its cause on the status page) is
``test_operable.py``'s, in-process, and the operable story's, end to end.
"""

from __future__ import annotations

from spark_elastic.runtime.coordinator.changes import StartFailures
from spark_elastic.runtime.coordinator.crash_loops import CrashLoops


def test_a_successor_inherits_the_tally_and_waits_its_backoff_before_it_launches() -> None:
    loops = CrashLoops()
    loops.reported("c1", "AnalysisException: append mode not supported")
    tally = loops.failed_at_start("c1", "lease expired")  # its own cause wins
    assert tally == StartFailures(1, "AnalysisException: append mode not supported")
    loops.inherit("c2", tally, now=100.0)
    assert loops.tallies() == {"c2": tally}
    assert not loops.may_launch("c2", 100.9)  # 1 s after one failure
    assert loops.may_launch("c2", 101.0)
    again = loops.failed_at_start("c2", "AnalysisException: append mode not supported")
    assert again.count == 2
    assert loops.tallies() == {}  # handed on: the supervisor gives it to c2's successor
    # Another cause counts from one again; with no cause reported, the coordinator's account.
    assert loops.failed_at_start("c3", "its process exited") == StartFailures(
        1, "its process exited"
    )
    assert loops.causes() == {"c1": "AnalysisException: append mode not supported"}


def test_a_commit_ends_a_loop_and_a_restart_knows_who_committed() -> None:
    loops = CrashLoops()
    loops.inherit("c2", StartFailures(3, "boom"), now=0.0)
    assert loops.at_start("c2")
    loops.commit("c2")
    assert not loops.at_start("c2")
    assert loops.tallies() == {}
    restarted = CrashLoops()
    restarted.past_start(["c7"])
    assert not restarted.at_start("c7")
    assert restarted.at_start("c8")
