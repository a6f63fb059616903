"""The lease: a container writes only while it holds one, and loses it before the coordinator."""

from __future__ import annotations

import threading
import time

import pytest

from spark_elastic.errors import ArgumentError, FencedError
from spark_elastic.runtime.lease import ContainerLease, LeaseTerms


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


TERMS = LeaseTerms(lease_s=10.0, margin_s=4.0, write_budget_s=3.0, max_drift=0.001)


def test_a_container_without_a_lease_may_not_write() -> None:
    lease = ContainerLease(TERMS, FakeClock())
    with pytest.raises(FencedError, match="lease"):
        lease.check_write("batch 0")


def test_a_write_may_start_while_the_budget_remains_and_not_after() -> None:
    clock = FakeClock()
    lease = ContainerLease(TERMS, clock)
    lease.renew(sent_at=clock.now, lease_ms=10_000)
    clock.now += 6.9  # 10 s * (1 - 0.001) - 6.9 = 3.09 s left
    lease.check_write("batch 1")
    clock.now += 0.2
    with pytest.raises(FencedError, match=r"batch 2 refused: 2\.89"):
        lease.check_write("batch 2")


def test_the_lease_counts_from_when_the_request_was_sent_not_when_the_reply_came() -> None:
    clock = FakeClock()
    lease = ContainerLease(TERMS, clock)
    sent = clock.now
    clock.now += 2.0  # a slow reply
    lease.renew(sent_at=sent, lease_ms=10_000)
    assert lease.remaining() == pytest.approx(10.0 * 0.999 - 2.0)


def test_the_container_lease_always_ends_before_the_coordinator_may_reassign() -> None:
    # Coordinator receives the renewal `delay` after the container sent it; the container's
    # clock runs slower by max_drift (the worst case). Its last write must end (budget) before
    # the coordinator's reassignment time.
    for delay in (0.0, 0.5, 3.0):
        clock = FakeClock()
        lease = ContainerLease(TERMS, clock)
        sent = clock.now
        lease.renew(sent_at=sent, lease_ms=int(TERMS.lease_s * 1000))
        coordinator_reassigns = (sent + delay) + TERMS.lease_s + TERMS.margin_s
        last_write_start_container = sent + lease.remaining() - TERMS.write_budget_s
        # Convert container seconds to coordinator seconds at the worst rate difference.
        elapsed = (last_write_start_container - sent) / (1 - TERMS.max_drift)
        last_write_end = sent + elapsed + TERMS.write_budget_s
        assert last_write_end < coordinator_reassigns


def test_revocation_is_final() -> None:
    clock = FakeClock()
    lease = ContainerLease(TERMS, clock)
    lease.revoke()
    lease.renew(sent_at=clock.now, lease_ms=10_000)
    assert lease.revoked
    with pytest.raises(FencedError, match="no longer considers this container valid"):
        lease.check_write()


def test_renewals_never_shorten_a_lease() -> None:
    clock = FakeClock()
    lease = ContainerLease(TERMS, clock)
    lease.renew(sent_at=clock.now, lease_ms=10_000)
    lease.renew(sent_at=clock.now - 5, lease_ms=1_000)  # a late reply to an old request
    assert lease.remaining() == pytest.approx(9.99)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"lease_s": 0}, "lease_s"),
        ({"write_budget_s": 10.0}, "write_budget_s"),
        ({"margin_s": 1.0}, "margin_s"),
        ({"max_drift": 0.5}, "max_drift"),
    ],
)
def test_inconsistent_terms_are_refused(kwargs: dict[str, float], name: str) -> None:
    with pytest.raises(ArgumentError, match=f"^{name}: expected"):
        LeaseTerms(**kwargs)


def test_reassignment_waits_for_expiry_plus_margin() -> None:
    assert TERMS.coordinator_expiry(50.0) == 60.0
    assert TERMS.reassignable_at(50.0) == 64.0


def test_a_write_waits_for_a_renewal_and_goes_ahead_when_it_comes() -> None:
    lease = ContainerLease(TERMS)
    renewer = threading.Timer(0.2, lambda: lease.renew(time.monotonic(), 10_000))
    renewer.start()
    started = time.monotonic()
    lease.await_write("batch 3", timeout_s=30)
    assert time.monotonic() - started < 29  # it went ahead on the renewal, not the deadline


def test_a_waiting_write_fails_at_once_when_the_lease_is_revoked() -> None:
    lease = ContainerLease(TERMS)
    threading.Timer(0.2, lease.revoke).start()
    with pytest.raises(FencedError, match="no longer considers"):
        lease.await_write("batch 3", timeout_s=30)


def test_a_waiting_write_fails_at_its_deadline() -> None:
    clock = FakeClock()
    lease = ContainerLease(TERMS, clock)
    clock.now += 1  # the wait's deadline passes on the first check
    with pytest.raises(FencedError, match="batch 4 refused"):
        lease.await_write("batch 4", timeout_s=0)
