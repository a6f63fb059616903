"""The change in flight, kept: its phase and the phase's clock, its end, its deadline, its undoing.

One change (a growth, a scale, a factor change; :mod:`.changes` says what
one is, purely) is in flight at a time. :class:`InFlight` keeps it in the
store (``meta.change``) and runs its life around the steps that
:mod:`.moves` and :mod:`.partitions` take:

- **begun, and each new phase** (and a resumed job's) written with the step that starts it, in the
  step's transaction; the phase's clock restarts then, on the coordinator's
  monotonic clock (re-based on how long the phase had lasted when a
  restarted coordinator loads it);
- **done** once nothing of it is left (the host says so): it ends with an
  event saying how long it took;
- **at its deadline** (:func:`.changes.deadline_outcome`), rolled back, or,
  once a group has moved, gone on with its late warm-ups started again;
- **rolled back** by the operator (:meth:`InFlight.cancel`), by the deadline
  or by a crash loop of its warm-ups: the warm-ups stop and the old owners
  keep their tasks, in one transaction with the next job model version.

What it needs of the supervisor, which it never imports, is a
:class:`FlightHost`.

Each change, and each group's warm-ups, is also a span of :mod:`.history`
(begun and ended in the transactions that begin and end them).

May import: :mod:`.changes`, :mod:`.history`, :mod:`.stores`, the shared
runtime modules and the standard library.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Protocol

from spark_elastic.errors import ChangeRefusedError
from spark_elastic.runtime.coordinator.changes import (
    CATCHING_UP,
    WARMING,
    Change,
    deadline_outcome,
    refuse_cancel,
)
from spark_elastic.runtime.coordinator.history import History
from spark_elastic.runtime.coordinator.stores import ContainerRecord, Store
from spark_elastic.runtime.protocol import JobModel

__all__ = ["FlightHost", "InFlight"]


class FlightHost(Protocol):
    """What settling and undoing a change needs of the supervisor, which is one."""

    model: JobModel

    @property
    def records(self) -> Mapping[str, ContainerRecord]:
        """Every container the coordinator knows, by id."""
        ...

    def next_model(self, db: Any, base: JobModel | None = None, **changes: Any) -> JobModel:
        """The job model's next version, saved in ``db`` (the one writer of versions)."""
        ...

    def nothing_left(self) -> bool:
        """Nothing of the change in flight is left: no warm-up, no drain, no predecessor
        still stopping, and every container of the job model runs."""
        ...

    def is_live(self, container_id: str) -> bool:
        """Whether the container holds a lease (or is starting to)."""
        ...

    def fail_over(self, container_id: str, reason: str) -> None:
        """Replace a live container by a new one that takes its tasks."""
        ...

    def doom(self, container_id: str, state: str) -> None:
        """No lease any more: stopped now, killed a lease later unless it exited."""
        ...

    def call_off_moves(self) -> None:
        """The move was rolled back: nothing of it is catching up any more."""
        ...


class InFlight:
    """The change in flight, in the store and in memory.

    Runs on the coordinator, on its event loop's thread (as the supervisor does).

    Parameters
    ----------
    store
        The coordinator's store, whose ``meta.change`` it loads now.
    clock
        The coordinator's monotonic clock (the phases' deadlines run on it).
    warm_up_deadline_s
        How long a move's warm-ups may take to be ready (its warming phase).
    history
        Where each change and each group's warm-ups begin and end as spans.
    """

    def __init__(
        self,
        store: Store,
        clock: Callable[[], float],
        warm_up_deadline_s: float,
        history: History,
    ) -> None:
        self.store = store
        self.history = history
        self.clock = clock
        self.warm_up_deadline_s = warm_up_deadline_s
        self._phase_started = clock()
        self.change = self._load()
        """The change in flight (growth, scale, factor change), or None."""

    def _load(self) -> Change | None:
        text = self.store.meta("change")
        if not text:
            return None
        change = Change.from_json(json.loads(text))
        # Deadlines run on the monotonic clock: re-based on how long the phase has lasted.
        self._phase_started = self.clock() - max(0.0, time.time() - change.phase_since)
        return change

    @property
    def in_phase_s(self) -> float:
        """How long the change has been in its phase (the coordinator's clock)."""
        return self.clock() - self._phase_started

    def save(self, db: Any, change: Change | None, result: str = "done", outcome: str = "") -> None:
        """Persist the change in flight (None: none, the last one ended with ``result``,
        in words ``outcome``: :meth:`.history.History.end`); its phase's clock restarts on
        a new phase."""
        old = self.change
        if change is not None and (
            old is None or (change.phase, change.moved) != (old.phase, old.moved)
        ):
            self._phase_started = self.clock()
        self.store.set_meta(
            db, "change", "" if change is None else json.dumps(change.to_json(), sort_keys=True)
        )
        self._spans(db, old, change, result, outcome)
        self.change = change

    def open_span_ids(self) -> set[str]:
        """The spans of :mod:`.history` the change in flight keeps open: its own, and its
        warm-ups' while they warm up."""
        change = self.change
        if change is None:
            return set()
        ids = {_change_id(change)}
        if _warming(change) is not None:
            ids.add(_warm_up_id(change))
        return ids

    def _spans(
        self, db: Any, old: Change | None, new: Change | None, result: str, outcome: str
    ) -> None:
        """Begin and end the spans of a change and of its groups' warm-ups."""
        if old is not None and _warming(old) != _warming(new):
            if new is None:
                ended = result  # the change's own end: done, rolled back
            else:
                ended = "started again" if _warming(new) is not None else "ready"
            self.history.end(db, _warm_up_id(old), ended)
        if old is not None and (new is None or new.started_at != old.started_at):
            self.history.end(db, _change_id(old), result, outcome)
        if new is not None:
            self.history.begin(db, _change_id(new), new.kind, new.summary)
            if _warming(new) is not None and _warming(new) != _warming(old):
                group = f"group {new.moved + 1} of {new.groups}" if new.groups > 1 else "warm-ups"
                self.history.begin(
                    db, _warm_up_id(new), "warm-up", f"{new.summary}: {group} warming up"
                )

    def begin(
        self, db: Any, kind: str, summary: str, target: dict[str, Any], phase: str, groups: int = 1
    ) -> None:
        """A new change in flight, saved in ``db``."""
        now = time.time()
        self.save(db, Change(kind, summary, target, phase, now, now, groups))

    def enter(self, db: Any, phase: str) -> None:
        """The change in flight (if any) enters ``phase``, saved in ``db``."""
        if self.change is not None:
            self.save(db, self.change.at(phase, time.time()))

    def resume(self, db: Any) -> None:
        """The job runs again after a stop: the change (if any) goes on, its phase starting
        again now (the time the job was stopped counts for nothing), and a group that was
        catching up warms up again (its old owners and warm-ups are new processes)."""
        change = self.change
        if change is not None:
            phase = WARMING if change.phase == CATCHING_UP else change.phase
            self.save(db, replace(change, phase=phase, phase_since=time.time()))
            self._phase_started = self.clock()

    def settle(self, host: FlightHost) -> None:
        """End the change if it is done; else apply its phase's deadline (:mod:`.changes`)."""
        change = self.change
        if change is None:
            return
        if host.nothing_left():
            took = time.time() - change.started_at
            with self.store.transaction() as db:
                self.save(db, None, "done", f"done in {took:.0f} s")
                self.store.add_event(db, "change", detail=f"{change.summary}: done in {took:.0f} s")
            return
        outcome = deadline_outcome(change, self.in_phase_s, self.warm_up_deadline_s)
        if outcome == "roll back":
            why = f"its warm-ups were not ready within {self.warm_up_deadline_s:.0f} s"
            self.roll_back(host, why, "deadline")
        elif outcome == "go on":
            late = [
                w.container_id
                for w in host.model.warmups
                if host.records[w.container_id].state == "launching"
            ]
            self.store.event(
                "deadline",
                detail=f"{change.describe()}: warm-ups {late} not ready within "
                f"{self.warm_up_deadline_s:.0f} s; a group has moved already, so the change "
                "goes on and they start again",
            )
            for container_id in late:
                if host.is_live(container_id):
                    host.fail_over(container_id, "not ready within its change's deadline")
            self._phase_started = self.clock()

    def cancel(self, host: FlightHost) -> str:
        """Roll the change in flight back, as the operator asks (``job scale URL --cancel``).

        Returns
        -------
        str
            What was rolled back, in one line.

        Raises
        ------
        ChangeRefusedError
            No change is under way, or it can no longer be rolled back
            (:func:`.changes.refuse_cancel` says why).
        """
        refusal = refuse_cancel(self.change)
        if refusal is not None:
            raise ChangeRefusedError(refusal)
        return self.roll_back(host, "cancelled by the operator", "cancel")

    def roll_back(self, host: FlightHost, why: str, kind: str) -> str:
        """Undo the change in flight, which can be (:func:`.changes.can_roll_back`): its
        warm-ups stop, the old owners keep their tasks; a ``kind`` event says ``why``.

        Returns
        -------
        str
            The event's text.
        """
        change = self.change
        assert change is not None  # noqa: S101 - callers checked
        warmups = [w.container_id for w in host.model.warmups]
        with self.store.transaction() as db:
            for container_id in warmups:
                self.store.update_container(
                    db, container_id, state="cancelled", ended_at=time.time()
                )
            model = host.next_model(db, warmups=(), stopping=())
            self.save(db, None, "rolled back", f"rolled back: {why}")
            summary = (
                f"{change.summary} rolled back: {why}; warm-ups {', '.join(warmups)} stop, "
                f"the old owners keep their tasks (job model {model.version})"
            )
            self.store.add_event(db, kind, detail=summary)
        for container_id in warmups:
            host.doom(container_id, "cancelled")
        host.call_off_moves()
        host.model = model
        return summary


def _change_id(change: Change) -> str:
    return f"{change.kind}:{change.started_at:.6f}"


def _warming(change: Change | None) -> tuple[float, int, float] | None:
    """Which warm-ups are warming up (the change's start, the group, since when), or None
    (none: also once the last group has moved, as the change ends)."""
    if change is None or change.phase != WARMING or change.moved >= change.groups:
        return None
    return (change.started_at, change.moved, change.phase_since)


def _warm_up_id(change: Change) -> str:
    return f"warm-up:{change.started_at:.6f}:{change.moved}:{change.phase_since:.6f}"
