"""Specification of :class:`Retiring`: retired containers their successors wait for.

Pure bookkeeping on a clock in seconds; leases of 6 s.
"""

from __future__ import annotations

from spark_elastic.runtime.coordinator.retiring import Retiring


def test_a_retired_container_keeps_its_lease_for_one_batch_then_no_heartbeat_renews_it() -> None:
    retiring = Retiring(lease_s=6.0)
    retiring.retire("c1", renewed_at=9.0, now=10.0)
    assert retiring.heard("c1", 15.9)  # finishing its batch in flight: renewed
    assert retiring.renewed_at("c1") == 15.9
    assert not retiring.heard("c1", 16.0)  # its batch's time is over
    assert retiring.renewed_at("c1") == 15.9
    assert not retiring.heard("c2", 11.0)  # never retired


def test_one_that_said_its_query_stopped_may_no_longer_write_until_it_is_gone() -> None:
    retiring = Retiring(lease_s=6.0)
    retiring.retire("c1", 10.0, 10.0)
    retiring.retire("c2", 10.0, 10.0)
    retiring.said_stopped("c1")
    retiring.said_stopped("c9")  # not retired: nothing to say
    assert retiring.may_write() == ["c2"]
    assert list(retiring) == ["c1", "c2"]  # its process may still be on its way out
    retiring.forget("c1")
    assert "c1" not in retiring
    assert len(retiring) == 1


def test_time_the_coordinator_could_not_listen_counts_against_no_retired_lease() -> None:
    retiring = Retiring(lease_s=6.0)
    retiring.retire("old", 2.0, 4.0)  # renewed before the stall began
    retiring.retire("new", 9.0, 9.0)  # heard after it began
    retiring.deaf_for(began=5.0, seconds=3.0)
    assert retiring.renewed_at("old") == 5.0
    assert retiring.renewed_at("new") == 9.0
    assert retiring.heard("old", 12.9)  # its batch's time moved 3 s later too (10 -> 13)
    retiring.serving(now=20.0)  # a restarted coordinator listens from 20: a fresh batch's time
    assert retiring.renewed_at("new") == 20.0
    assert retiring.heard("new", 25.9)
    retiring.clear()
    assert len(retiring) == 0
