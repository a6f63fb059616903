"""The autoscaler in a running coordinator: its settings, its memory and its actions.

:mod:`.autoscaler` is the policy, pure: an observation in, a decision out.
This module is what the supervisor (:mod:`.supervisor`) runs it with: the
settings kept in the store (so a restarted coordinator keeps a pin), the
policy's state between ticks, the containers' progress reports as received
(their processing rates), what the policy sees each tick
(:meth:`Autoscaling.observe`), and the decision carried out through the
supervisor's own ``scale`` and ``change_factor`` (:class:`Scaler`), a
refusal turned into a hold that is told once.

May import: :mod:`.autoscaler`, :mod:`.placement`, :mod:`.stores`, the
shared runtime modules, :mod:`spark_elastic.errors` and the standard library.
Never :mod:`.supervisor`: it hands itself in as a :class:`Scaler`.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable, Container, Mapping
from typing import Any, Protocol

from spark_elastic.errors import ArgumentError, ChangeRefusedError
from spark_elastic.runtime.coordinator.autoscaler import (
    HOLD,
    AutoscalerConfig,
    ContainerLoad,
    Decision,
    Observation,
    PolicyState,
    TaskLoad,
    acted,
    evaluate,
    processing_rate,
)
from spark_elastic.runtime.coordinator.placement import locality_key, task_share
from spark_elastic.runtime.coordinator.stores import Store
from spark_elastic.runtime.protocol import JobModel, ProgressReport

__all__ = ["HOLD_EVENTS_EVERY_S", "RATE_HISTORY_S", "Autoscaling", "Scaler"]

HOLD_EVENTS_EVERY_S = 30.0
"""The autoscaler records a hold whose rule changed at most this often (actions always)."""
RATE_HISTORY_S = 300.0
"""How far back progress reports are kept for processing rates (at least the rate window)."""


class Scaler(Protocol):
    """How the autoscaler acts: the calls a person's ``job scale`` makes too."""

    def scale(self, containers: int, reason: str = "") -> str:
        """Run the job on ``containers`` containers; raises ChangeRefusedError when busy."""
        ...

    def change_factor(self, factor: int, reason: str = "") -> str:
        """Run the job at elasticity factor ``factor``; raises ChangeRefusedError when busy."""
        ...


class Autoscaling:
    """The autoscaler of one coordinator: settings, policy state, rates and decisions.

    Parameters
    ----------
    store
        The coordinator's store, where the settings are kept and events told.
    clock
        The coordinator's monotonic clock.
    config
        The settings in force (see :meth:`load`).

    Attributes
    ----------
    config
        The settings in force.
    policy
        The policy's state between ticks (its wish, cool-down and capacity estimate).
    decision
        The last decision, or None before the first.
    decided_at
        When it was taken (wall-clock seconds), or None.
    """

    def __init__(self, store: Store, clock: Callable[[], float], config: AutoscalerConfig) -> None:
        self.store = store
        self.clock = clock
        self.config = config
        self.policy = PolicyState()
        self.decision: Decision | None = None
        self.decided_at: float | None = None
        self._hold_logged: tuple[str, float] | None = None
        # Progress reports as received: container -> (monotonic time, records processed).
        self._reports: dict[str, deque[tuple[float, int]]] = {}
        self._first_report: dict[str, float] = {}

    @classmethod
    def load(
        cls,
        store: Store,
        clock: Callable[[], float],
        given: AutoscalerConfig | None,
        task_count: int,
    ) -> Autoscaling:
        """The autoscaler with the given settings, else the store's (off for a new store).

        Parameters
        ----------
        store
            The coordinator's store.
        clock
            The coordinator's monotonic clock.
        given
            Settings from the command line, saved when they differ from the store's;
            None keeps the store's.
        task_count
            The job's task count, which the settings are checked against.

        Returns
        -------
        Autoscaling
            With a fresh policy state and no decision yet.

        Raises
        ------
        ArgumentError
            ``given`` contradicts the task count.
        """
        text = store.meta("autoscaler")
        stored = AutoscalerConfig.from_json(json.loads(text)) if text else None
        if given is None:
            return cls(store, clock, stored or AutoscalerConfig())
        given.check_against(task_count)
        if given != stored:
            _save(store, given, task_count)
        return cls(store, clock, given)

    def configure(self, changes: Mapping[str, Any], task_count: int) -> str:
        """Change the settings, as :meth:`.Supervisor.configure_autoscaler` says (its errors too).

        A change saves the new settings, and starts the policy's wishes over
        (keeping its cool-down and capacity estimate).

        Parameters
        ----------
        changes
            Some of :meth:`AutoscalerConfig.to_json`'s keys.
        task_count
            The job's task count.

        Returns
        -------
        str
            The new settings, in one line.
        """
        if not changes:
            raise ArgumentError.invalid(
                "autoscaler", "at least one setting to change", dict(changes)
            )
        config = self.config.updated(changes, task_count=task_count)
        if config != self.config:
            _save(self.store, config, task_count)
            self.config = config
            # A new mode or new bounds: wishes start over and the next hold is told.
            self.policy = PolicyState(
                last_action_at=self.policy.last_action_at, capacity=self.policy.capacity
            )
            self._hold_logged = None
        return config.describe(task_count)

    def keep_report(self, report: ProgressReport, live: Container[str]) -> None:
        """Keep a progress report as received, for its container's processing rate.

        Parameters
        ----------
        report
            A live container's progress report.
        live
            The live containers' ids: the reports of any other are forgotten.
        """
        now = self.clock()
        for gone in [c for c in self._reports if c not in live]:
            del self._reports[gone]
            self._first_report.pop(gone, None)
        self._first_report.setdefault(report.container_id, now)
        reports = self._reports.setdefault(report.container_id, deque())
        reports.append((now, report.records_processed))
        horizon = now - max(RATE_HISTORY_S, self.config.rate_window_s)
        while reports and reports[0][0] < horizon:
            reports.popleft()

    def rate(self, container_id: str, now: float) -> float | None:
        """A container's processing rate over the rate window (records/s), None while unknown."""
        return processing_rate(
            self._first_report.get(container_id),
            tuple(self._reports.get(container_id, ())),
            now,
            self.config.rate_window_s,
        )

    def observe(self, model: JobModel, lags: Mapping[str, int], planned_factor: int) -> Observation:
        """What the policy sees now: each task's lag, each container's rate.

        Parameters
        ----------
        model
            The current job model.
        lags
            Each task's lag as its current owner reported it; -1 until it did.
        planned_factor
            The elasticity factor the job was defined with.

        Returns
        -------
        Observation
            Containers oldest generation first (a scale-in retires the
            newest), tasks in (partition, bucket) order.
        """
        now = self.clock()
        owner = model.owner_of()
        return Observation(
            now,
            tuple(
                ContainerLoad(c.container_id, self.rate(c.container_id, now))
                for c in sorted(model.containers, key=lambda c: c.generation)
            ),
            tuple(
                TaskLoad(t, owner[t], lags[t], task_share(t))
                for t in sorted(owner, key=locality_key)
            ),
            model.elasticity_factor,
            planned_factor,
        )

    def start_cool_down(self) -> None:
        """The container count or factor changed (a person's change too): cool down from now."""
        self.policy = acted(self.policy, self.clock())

    def decide(
        self, observation: Observation, scaler: Scaler, count: Callable[[str], None]
    ) -> None:
        """One tick of the autoscaler: judge ``observation`` and carry out the decision.

        Parameters
        ----------
        observation
            What :meth:`observe` saw.
        scaler
            Carries out an action; a refusal (another change under way)
            becomes a hold that says why.
        count
            Counts an action taken (``autoscaler_<action>``).
        """
        evaluation = evaluate(self.config, self.policy, observation)
        self.policy = evaluation.state
        decision = evaluation.decision
        if decision.acts:
            to = f"factor {decision.factor}" if decision.factor is not None else decision.target
            wanted = f"autoscaler {decision.action} to {to}: {decision.reason}"
            try:
                if decision.factor is not None:
                    scaler.change_factor(decision.factor, reason=wanted)
                else:
                    scaler.scale(decision.target, reason=wanted)
            except ChangeRefusedError as exc:
                # Not an error loop: a hold that says why, told once (the rule stays "refused").
                decision = Decision(
                    HOLD,
                    len(observation.containers),
                    "refused",
                    f"{decision.action} to {to} wanted ({decision.reason}); refused: {exc}",
                )
            else:
                count(f"autoscaler_{decision.action}")
                self._hold_logged = None
        self.decision, self.decided_at = decision, time.time()
        if not decision.acts:
            self._tell_hold(decision, observation.at)

    def failed(self, exc: Exception, containers: int) -> None:
        """A tick of the autoscaler failed: a hold that says why (leases go on regardless).

        Parameters
        ----------
        exc
            What it raised.
        containers
            The job's container count now.
        """
        decision = Decision(HOLD, containers, "error", f"failed: {exc!r}")
        self.decision, self.decided_at = decision, time.time()
        self._tell_hold(decision, self.clock())

    def _tell_hold(self, decision: Decision, now: float) -> None:
        """An event for a hold whose rule changed, at most every HOLD_EVENTS_EVERY_S."""
        last = self._hold_logged
        if last is not None and (last[0] == decision.rule or now - last[1] < HOLD_EVENTS_EVERY_S):
            return
        self.store.event(
            "autoscale", detail=f"hold at {decision.target} ({decision.rule}): {decision.reason}"
        )
        self._hold_logged = (decision.rule, now)


def _save(store: Store, config: AutoscalerConfig, task_count: int) -> None:
    with store.transaction() as db:
        store.set_meta(db, "autoscaler", json.dumps(config.to_json(), sort_keys=True))
        store.add_event(db, "autoscale", detail=f"autoscaler {config.describe(task_count)}")
