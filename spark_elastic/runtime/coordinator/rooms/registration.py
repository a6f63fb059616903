"""Registration, heartbeats and progress: the leases (SAMZA-871).

A live container's registration, heartbeat or progress report renews its
lease (nested in the coordinator's hold on its store, :mod:`..leadership`);
anything from a container that is not live gets ``alive: false``; a
container that says why it failed is failed over at once.

May import what :mod:`..supervisor` may.
"""

from __future__ import annotations

import time

from spark_elastic.errors import ProtocolError
from spark_elastic.runtime.coordinator.rooms.base import SupervisorBase
from spark_elastic.runtime.protocol import HeartbeatReply, ProgressReport, Registration


class RegistrationRoom(SupervisorBase):
    """Registration, heartbeats, progress reports and reported failures."""

    def _reply(self, container_id: str) -> HeartbeatReply:
        live = self._live.get(container_id)
        now = self.clock()
        if live is None and self.retiring.heard(container_id, now):
            # Retired and finishing its batch in flight: its lease holds until it exits
            # (its successor waits for that) or its time to finish runs out.
            self.count("heartbeats_alive")
            return HeartbeatReply(True, self._granted_ms(), self.model.version)
        if live is None:
            self.count("heartbeats_invalid")
            return HeartbeatReply(False, 0, self.model.version)
        live.renewed_at = now
        live.last_valid_beat = now
        self.count("heartbeats_alive")
        return HeartbeatReply(True, self._granted_ms(), self.model.version)

    def _granted_ms(self) -> int:
        """A container lease, nested in this coordinator's hold on its store."""
        return int(self.leadership.grant(self.terms.lease_s) * 1000)

    def heartbeat(
        self, container_id: str, caught_up: bool = False, stopped: bool = False
    ) -> HeartbeatReply:
        """Answer SAMZA-871's heartbeat; renew the lease of a live container.

        Parameters
        ----------
        container_id
            The id from ``executionContainerId``.
        caught_up
            A warm-up says it has applied everything its stopping old owners
            committed (``caughtUp=true``): its query waits at its gate, so
            its first batch as owner will publish.
        stopped
            A retired container says its query has stopped (``stopped=true``):
            it writes nothing any more, so its successors need not wait for
            its process to exit.

        Returns
        -------
        HeartbeatReply
            ``alive`` and the lease, or ``alive: false`` (counted) for a
            container that is not live.
        """
        reply = self._reply(container_id)
        if reply.alive and caught_up and self.model.warmup(container_id) is not None:
            self.moves.caught_up(container_id)
        if reply.alive and stopped:
            self.retiring.said_stopped(container_id)
        return reply

    def register(self, registration: Registration) -> HeartbeatReply:
        """A launched container announces its process; grants its first lease.

        Parameters
        ----------
        registration
            Its id, PID and Spark application id.

        Returns
        -------
        HeartbeatReply
            As for a heartbeat.
        """
        reply = self._reply(registration.container_id)
        if reply.alive:
            cid = registration.container_id
            self._live[cid].registered = True
            # A warm-up registers once its Spark application is up: ready for the move.
            warmup = self.model.warmup(cid)
            state = "warm" if warmup is not None else "running"
            # The launcher's handle stays the container's: the PID it reports is its own,
            # on a host the coordinator may not share.
            handle = self.records[cid].handle
            handle = str(registration.pid) if handle is None else handle
            with self.store.transaction() as db:
                self.store.update_container(
                    db,
                    cid,
                    state=state,
                    handle=handle,
                    spark_app=registration.spark_app_id,
                    registered_at=time.time(),
                )
                if warmup is not None:
                    self.store.add_event(
                        db,
                        "warm",
                        cid,
                        f"pid {registration.pid}: ready to take {len(warmup.tasks)} tasks",
                    )
                else:
                    self.store.add_event(db, "register", cid, f"pid {registration.pid}")
                # A successor's failover (a warm-up's too) ends as it registers.
                self.history.end(db, f"failover:{cid}", "registered")
            self.set_record(cid, state=state, handle=handle, registered_at=time.time())
        return reply

    def progress(self, report: ProgressReport) -> HeartbeatReply:
        """Keep a container's committed positions; renews its lease too.

        Parameters
        ----------
        report
            The container's last committed batch.

        Returns
        -------
        HeartbeatReply
            As for a heartbeat.
        """
        reply = self._reply(report.container_id)
        if reply.alive:
            mine = set(self.records[report.container_id].tasks)
            strangers = [t.task for t in report.tasks if t.task not in mine]
            if strangers:
                raise ProtocolError(
                    f"progress: container {report.container_id!r} reported task "
                    f"{strangers[0]!r}, which it does not own"
                )
            self.store.save_progress(report)
            self.history.batch(report.container_id, report.batch_duration_ms)
            self.autoscaling.keep_report(report, self._live)
            self.crash_loops.commit(report.container_id)
        return reply

    def report_failure(self, container_id: str, cause: str) -> HeartbeatReply:
        """A container says why it failed, before it exits (its query has stopped).

        Its tasks move at once, as after an expired lease (nothing of it
        writes any more), and the cause shows in the events and the status.

        Parameters
        ----------
        container_id
            The failed container.
        cause
            The exception's first line.

        Returns
        -------
        HeartbeatReply
            ``alive: false``.
        """
        cause = " ".join(cause.split())[:500] or "unknown"
        self.crash_loops.reported(container_id, cause)
        if container_id in self.records:
            self.store.event("fail", container_id, cause)
        if container_id in self._live and self._job_state["state"] == "running":
            self.fail_over(container_id, f"it failed: {cause}")
        return HeartbeatReply(False, 0, self.model.version)
