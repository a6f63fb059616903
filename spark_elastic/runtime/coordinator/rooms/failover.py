"""Failover: a container whose lease ran out is replaced in a new generation.

Each expired container (its lease plus the margin, or its start-up bound)
is replaced by one that takes exactly its tasks from its committed
checkpoint, in one transaction with the new job model and the events; too
many failures of one cause before a first commit fail the job, saying why
(:mod:`..crash_loops`). Retired containers that stopped, or whose lease
ran out, are reaped here too.

May import what :mod:`..supervisor` may.
"""

from __future__ import annotations

import time

from spark_elastic.runtime.coordinator.changes import (
    CATCHING_UP,
    WARMING,
    StartFailures,
    backoff_s,
    refuse_cancel,
)
from spark_elastic.runtime.coordinator.rooms.base import SupervisorBase, cause_of


class FailoverRoom(SupervisorBase):
    """Expiry, failover into a new generation, and a job failed by a crash loop."""

    def _expired(self, container_id: str, now: float) -> str | None:
        """Why a live container's tasks may move now, or None."""
        live = self._live[container_id]
        record = self.records[container_id]
        if live.registered:
            if now > self.terms.reassignable_at(live.renewed_at):
                late = now - self.terms.coordinator_expiry(live.renewed_at)
                return f"lease expired {late:.1f} s ago (margin {self.terms.margin_s:.1f} s)"
            return None
        # Not registered: it never held a lease, so it cannot have written anything.
        if record.handle is not None and not self.processes.alive(record.handle, container_id):
            return f"its process exited before it registered{self._said(record.handle)}"
        # A warm-up's readiness is bounded by its change's deadline (it may take long to
        # follow its old owners); anything else must register within the start-up bound,
        # counted from its launch whatever it heartbeats meanwhile.
        if self.model.warmup(container_id) is None and now > live.launched_at + self.startup_s:
            bound = f"it did not register within {self.startup_s:.0f} s of its launch"
            return f"{bound}{self._said(record.handle)}"
        return None

    def _said(self, handle: str | None) -> str:
        """What its platform says of a container that is not running (a pod's ErrImagePull),
        as a suffix of the failover's reason: the cause the operator needs, in the event and
        in a job failed by a crash loop. Asked only of a container that is failing over."""
        why = self.processes.why(handle)
        return f" ({why})" if why else ""

    def _reap_retired(self) -> None:
        """Forget retired containers that stopped; kill those whose lease and margin ran
        out by this clock (they write nothing any more). The rest may still write.

        A container that stopped has stopped its query: what is left of its
        process group (its JVM on the way out) is killed, so nothing of it can
        commit once its successor reads its final offsets. One killed at its
        lease's end is forgotten only once its process is seen gone, at a later
        tick: SIGKILL takes effect asynchronously, and no successor is launched
        beside a process still on its way out."""
        for old_id in self.retiring:
            old = self.records[old_id]
            stopped = not self.processes.alive(old.handle, old_id)
            if stopped or self.clock() > self.terms.reassignable_at(
                self.retiring.renewed_at(old_id)
            ):
                self.processes.kill(old.handle, old_id)
            if stopped:
                self.retiring.forget(old_id)

    def fail_over(self, old_id: str, reason: str) -> None:
        """Replace a live container by a new one of the next generation that takes its tasks
        (a warm-up by another warm-up), or end a crash loop (:mod:`.crash_loops`)."""
        old = self.records[old_id]
        warming = self.model.warmup(old_id) is not None
        # A container that never committed failed at start: its successor inherits the
        # tally, waits its backoff, and too many of one cause fail the job.
        at_start = self.crash_loops.at_start(old_id)
        tally = StartFailures()
        if at_start:
            tally = self.crash_loops.failed_at_start(old_id, cause_of(reason))
            if tally.count >= self.max_start_failures:
                change = self.change
                if warming and change is not None and refuse_cancel(change) is None:
                    self.store.event("expire", old_id, reason)
                    self.flight.roll_back(
                        self,
                        f"{tally.count} warm-ups in a row failed before they were ready: "
                        f"{tally.cause}",
                        "rollback",
                    )
                else:
                    self._fail_job(old_id, reason, tally)
                return
            reason = f"{reason} (failure {tally.count} at start; its successor waits " + (
                f"{backoff_s(tally.count):.0f} s)"
            )
        # The new generation starts from the old one's committed prefix; a warm-up that
        # failed is replaced by another (it owned nothing yet).
        warming = self.model.warmup(old_id) is not None
        # A failover calls off a handover's first phase (its group is no longer ready): the
        # owners listed as stopping that still run go on, and their warm-ups follow again.
        stopping = tuple(c for c in self.model.stopping if self.records[c].state == "retired")
        with self.store.transaction() as db:
            new = self.new_container(db, old.tasks, () if warming else self.sources_of(old))
            if warming:
                warmups = [w for w in self.model.warmups if w.container_id != old_id]
                model = self.next_model(db, warmups=[*warmups, new], stopping=stopping)
            else:
                containers = [c for c in self.model.containers if c.container_id != old_id]
                model = self.next_model(db, containers=[*containers, new], stopping=stopping)
            self.store.update_container(db, old_id, state="expired", ended_at=time.time())
            self.store.add_event(db, "expire", old_id, reason)
            # Until the successor registers (or is itself replaced).
            self.history.end(db, f"failover:{old_id}", "replaced", f"replaced in turn: {reason}")
            self.history.begin(
                db, f"failover:{new.container_id}", "failover", f"{old_id} -> {new.container_id}"
            )
            self.store.add_event(
                db,
                "failover",
                new.container_id,
                f"takes {len(old.tasks)} tasks of {old_id} in generation {new.generation}, "
                f"job model {model.version}",
            )
        self.set_record(old_id, state="expired", ended_at=time.time())
        del self._live[old_id]
        self.model = model
        if at_start:
            self.crash_loops.inherit(new.container_id, tally, self.clock())
        if self.change is not None and self.change.phase == CATCHING_UP and not model.stopping:
            # A failover calls the catching-up phase off: the group is no longer ready.
            with self.store.transaction() as db:
                self.flight.enter(db, WARMING)
        self.count("failovers")
        # Fenced already (its lease is over); killing it just frees its resources.
        self.processes.kill(old.handle, old_id)

    def _fail_job(self, old_id: str, reason: str, tally: StartFailures) -> None:
        """Too many failures at start: every container stops, the job is failed, saying why."""
        who = (
            "a container failed before its"
            if tally.count == 1
            else f"{tally.count} containers in a row failed before their"
        )
        why = f"{who} first commit: {tally.cause}"
        others = [r.id for r in self.records.values() if r.live and r.id != old_id]
        with self.store.transaction() as db:
            self.store.update_container(db, old_id, state="failed", ended_at=time.time())
            for container_id in others:
                self.store.update_container(db, container_id, state="stopped", ended_at=time.time())
            self.store.add_event(db, "expire", old_id, reason)
            self.store.add_event(
                db, "failed", detail=f"job failed: {why}; `job run` again resumes it once fixed"
            )
            self._set_job_state(db, "failed", why)
            if self.change is not None:
                self.flight.save(db, None, "job failed", f"cut short: the job failed: {why}")
            self.history.end_all(db, "failover", "job failed")
        self.doom(old_id, "failed")
        for container_id in others:
            self.doom(container_id, "stopped")
        self.count("failovers")
