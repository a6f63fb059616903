"""The stop sequence: every container asked to stop, then killed, the job stopped.

May import what :mod:`..supervisor` may.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from spark_elastic.runtime.coordinator.rooms.base import SupervisorBase
from spark_elastic.runtime.coordinator.stores import ContainerRecord


class StoppingRoom(SupervisorBase):
    """Stop the job: SIGTERM, wait, SIGKILL what is left, record it as stopped."""

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop every live container: SIGTERM, then SIGKILL after ``timeout_s``.

        Blocks its thread while they stop; the coordinator's server uses the
        three steps below instead, so it keeps answering their last heartbeats
        and reports on its own thread meanwhile.

        Parameters
        ----------
        timeout_s
            How long containers get to stop gracefully.
        """
        stopping = self.stop_begin()
        deadline = time.monotonic() + timeout_s
        while self.stop_pending(stopping) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.stop_end(stopping)

    def stop_begin(self) -> list[ContainerRecord]:
        """SIGTERM to every live container with a process; returns them, and those retiring.

        Returns
        -------
        list of ContainerRecord
            Every container whose process may still run (pass to the next two steps).
        """
        live = [r for r in self.records.values() if r.live]
        for record in live:
            self.processes.stop(record.handle, record.id)
        retiring = [self.records[c] for c in self.retiring if self.records[c].handle is not None]
        # Those never launched stop too (as "stopped"): a resume treats every container alike.
        return [*live, *retiring]

    def stop_pending(self, stopping: Sequence[ContainerRecord]) -> bool:
        """Whether any of ``stopping`` still runs.

        Parameters
        ----------
        stopping
            What :meth:`stop_begin` returned.

        Returns
        -------
        bool
            True while one of their processes is alive.
        """
        return any(self.processes.alive(r.handle, r.id) for r in stopping)

    def stop_end(self, stopping: Sequence[ContainerRecord], failed: str | None = None) -> None:
        """SIGKILL what is left, and record the job as stopped (``job run`` resumes it).

        Parameters
        ----------
        stopping
            What :meth:`stop_begin` returned.
        failed
            Why the coordinator stops, when it failed (recorded in the event).
        """
        for record in stopping:
            self.processes.kill(record.handle, record.id)
        live = [r for r in stopping if r.live]
        with self.store.transaction() as db:
            for record in live:
                self.store.update_container(db, record.id, state="stopped", ended_at=time.time())
            detail = f"stopped {len(live)} containers"
            if failed:
                detail += f": the coordinator failed ({failed})"
            self.store.add_event(db, "stop", detail=detail)
            self.history.end_all(db, "failover", "job stopped")
            self.history.begin(db, f"stop:{time.time():.6f}", "stop", detail)
            if self.job_state()["state"] != "failed":
                self._set_job_state(
                    db, "stopped", "the coordinator stopped" + (f": {failed}" if failed else "")
                )
        for record in live:
            self.set_record(record.id, state="stopped")
            self._live.pop(record.id, None)
        self.retiring.clear()

    def kill_all(self) -> None:
        """SIGKILL every process this coordinator knows of (the last resort of a failed stop)."""
        for record in self.records.values():
            if record.live or record.id in self.retiring:
                self.processes.kill(record.handle, record.id)
