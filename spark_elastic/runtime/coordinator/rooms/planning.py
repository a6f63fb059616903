"""Plan once, or take up a stored job: the supervisor's first room.

A new store gets the job model (the KIP-441 assignor's contiguous runs); a
store that has one keeps it, if the job definition still matches it, and
its containers are taken up with fresh leases: stopped ones by successors
from their commits (:meth:`Planning._resume`).

May import what :mod:`..supervisor` may.
"""

from __future__ import annotations

from spark_elastic.errors import ArgumentError
from spark_elastic.runtime.coordinator.placement import initial_assignment
from spark_elastic.runtime.coordinator.rooms.base import LiveLease, SupervisorBase
from spark_elastic.runtime.growth import judge_counts
from spark_elastic.runtime.protocol import ContainerModel, JobModel


class PlanningRoom(SupervisorBase):
    """Plan once, resume a stored job, and the coordinator's first moments (serving, deafness)."""

    def _load_or_plan(self, containers: int) -> JobModel:
        stored = self.store.latest_model()
        if stored is None:
            return self._plan(containers)
        self._check_same_job(stored)
        now = self.clock()
        for record in self.store.containers():
            self.records[record.id] = record
            if record.live:
                # Renewal times died with the previous coordinator: a fresh lease from now.
                self._live[record.id] = LiveLease(
                    now, record.state in ("running", "warm"), launched_at=now
                )
            elif record.state == "retired" and record.handle is not None:
                # It may still be stopping: its successor waits for it as for a live lease.
                self.retiring.retire(record.id, now, now)
        self.store.event("start", detail=f"coordinator restarted on job model {stored.version}")
        return self._resume(stored)

    def _resume(self, model: JobModel) -> JobModel:
        """A stopped (or failed) job runs again: each stopped container's tasks go to a
        successor that starts from its last commits, as after a failover.

        A stop in the middle of a move stopped its warm-ups too: each gets a
        fresh successor (a warm-up owns nothing yet), and the move goes on.
        """

        def stopped(c: ContainerModel) -> bool:
            # A failed job's containers are stopped, the one that failed last is "failed".
            return self.records[c.container_id].state in ("stopped", "failed")

        owners = [c for c in model.containers if stopped(c)]
        warmups = [w for w in model.warmups if stopped(w)]
        if not owners and not warmups and self.job_state()["state"] == "running":
            return model
        with self.store.transaction() as db:
            heirs = {
                c.container_id: self.new_container(
                    db, c.tasks, self.sources_of(self.records[c.container_id])
                )
                for c in owners
            }
            heirs.update({w.container_id: self.new_container(db, w.tasks, ()) for w in warmups})
            resumed = self.next_model(
                db,
                model,
                containers=[heirs.get(c.container_id, c) for c in model.containers],
                warmups=[heirs.get(w.container_id, w) for w in model.warmups],
                stopping=tuple(c for c in model.stopping if c not in heirs),
            )
            self._set_job_state(db, "running", "resumed")
            self.flight.resume(db)
            self.history.end_all(db, "stop", "resumed")
            self.store.add_event(
                db,
                "resume",
                detail=f"job resumed: {len(owners)} containers' tasks go to successors that "
                f"start from their last commits"
                + (f", {len(warmups)} warm-ups start again" if warmups else "")
                + f" (job model {resumed.version})",
            )
        return resumed

    def serving(self) -> None:
        """The coordinator now answers heartbeats: every lease it knows starts from now.

        Called once its server listens. A restarted coordinator gave its
        containers fresh leases when it read its store; however long it then
        took to listen (loading the job, a loaded machine) must not count
        against them, or it would fail over containers that could not reach it.
        """
        now = self.clock()
        for live in self._live.values():
            live.renewed_at = max(live.renewed_at, now)
            live.launched_at = max(live.launched_at, now)
        self.retiring.serving(now)

    def deaf_for(self, seconds: float) -> None:
        """The coordinator heard no one for the last ``seconds``: no lease is charged for them.

        Called by the server when its loop was held (the process descheduled
        on a loaded machine, a slow step): heartbeats sent meanwhile are still
        queued, and judging leases before reading them would fail over
        containers that did renew. So leases count only the time the
        coordinator could listen: every renewal (and launch) from before the
        stall moves later by its length; one heard since is not moved. A
        container that is really gone still fails over, after a lease and its
        margin of listening. Moving a lease later only delays a failover,
        never lets two owners write (a container's own lease counts from the
        renewal it last had answered), as :meth:`serving` does for a restart.

        Parameters
        ----------
        seconds
            How long the loop could not serve requests, up to now.
        """
        if seconds <= 0:
            return
        began = self.clock() - seconds
        for live in self._live.values():
            if live.renewed_at <= began:
                live.renewed_at += seconds
            if live.launched_at <= began:
                live.launched_at += seconds
        self.retiring.deaf_for(began, seconds)
        self.count("stalls")

    def _check_same_job(self, stored: JobModel) -> None:
        shape = self.shape
        # Inputs that grew (SEP-5) since the store was written are the same job: the
        # monitor takes the growth up; anything else would remap keys.
        grown = judge_counts(stored.planned, stored.partitions, shape.partitions)
        # A live factor change makes the model's factor the job's; the definition may
        # still say the one it was planned at.
        factors = {stored.elasticity_factor, int(self.store.meta("plannedFactor") or 0)}
        if (
            stored.job != shape.name
            or shape.elasticity_factor not in factors
            or grown.verdict == "refused"
        ):
            raise ArgumentError.invalid(
                "--store",
                f"the store of job {shape.name!r} with partitions {dict(shape.partitions)} and "
                f"factor {shape.elasticity_factor} (a restart must not remap keys; use a new "
                "store or a rescale)",
                f"job {stored.job!r} with partitions {dict(stored.partitions)} and factor "
                f"{stored.elasticity_factor} in {self.store.location}",
            )

    def _plan(self, containers: int) -> JobModel:
        chunks = initial_assignment(self.shape.tasks, containers)
        entries = []
        with self.store.transaction() as db:
            self.store.set_meta(db, "job", self.shape.name)
            self.store.set_meta(db, "spec", self.shape.spec)
            self.store.set_meta(db, "plannedFactor", str(self.shape.elasticity_factor))
            for tasks in chunks:
                entries.append(self.new_container(db, tasks, ()))
            # Version 1 follows an empty version 0, which is never stored.
            empty = JobModel(
                0, self.shape.name, self.shape.elasticity_factor, dict(self.shape.partitions)
            )
            model = self.next_model(db, empty, containers=entries)
            self.store.add_event(
                db,
                "start",
                detail=f"job model 1: {len(self.shape.tasks)} tasks in {containers} containers",
            )
        return model
