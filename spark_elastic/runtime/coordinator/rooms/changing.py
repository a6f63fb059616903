"""Changes of a running job: scale, factor changes, growth's turn, the autoscaler.

Each change is refused while another is in flight; a stateful one moves
through warm-ups (:mod:`..moves`), a stateless one hands over at once; a
growth goes first, and the change it rolled back is asked again after it.

May import what :mod:`..supervisor` may.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from spark_elastic.errors import ArgumentError, ChangeRefusedError
from spark_elastic.model.names import TaskKind, validate_elasticity_factor
from spark_elastic.runtime.coordinator.autoscaler import AutoscalerConfig, Decision, Observation
from spark_elastic.runtime.coordinator.changes import refuse_cancel
from spark_elastic.runtime.coordinator.moves import MovePlan, factor_move, scale_move
from spark_elastic.runtime.coordinator.placement import scale_assignment
from spark_elastic.runtime.coordinator.rooms.base import AFTER_GROWTH, SupervisorBase
from spark_elastic.runtime.keys import parsed


class ChangingRoom(SupervisorBase):
    """Scale, factor changes, their refusals and cancel, growth's turn, autoscaler settings."""

    def observe_partitions(
        self, counts: Mapping[str, int], ends: Mapping[str, Mapping[int, int]]
    ) -> str:
        """Take in what the monitor saw: start a growth, or report a change it refuses.

        Parameters
        ----------
        counts
            ``{topic: partitions}`` now.
        ends
            ``{topic: {partition: end offset}}`` now, read right after the counts.

        Returns
        -------
        str
            The verdict: ``"same"``, ``"growth"`` (one began), ``"growing"``
            (the growth under way), ``"refused"``, or ``"waits"``: the inputs
            grew during a change that can no longer be rolled back, and the
            growth starts once it ends.
        """
        verdict = self.partitions.observe(counts, ends)
        change = self.change
        if verdict != "waits" or change is None or refuse_cancel(change) is not None:
            return verdict
        # A growth is never held hostage by a change: one that can still be undone is,
        # and asked again once the growth is done (the new partitions are read meanwhile).
        self.flight.roll_back(
            self,
            f"the inputs grew to {dict(counts)}; the growth goes first, then the change is "
            "asked again",
            "partitions",
        )
        # Kept in the store: a coordinator restarted meanwhile asks for it too. (Killed
        # between the roll back and this, it does not: the operator asks again.)
        self._after_growth = dict(change.target)
        with self.store.transaction() as db:
            self.store.set_meta(db, AFTER_GROWTH, json.dumps(change.target, sort_keys=True))
        self.partitions.begin_waiting()
        return "growth"

    def _ask_again_after_growth(self) -> None:
        """Ask again for the change a growth rolled back, once nothing else is in flight."""
        target = self._after_growth
        if not target or self.change is not None or self.partitions.waiting is not None:
            return
        try:
            if "containers" in target:
                summary = self.scale(int(target["containers"]))
            else:
                summary = self.change_factor(int(target["elasticityFactor"]))
        except ChangeRefusedError:
            return  # containers still starting, say: the next tick asks again
        except ArgumentError as exc:  # the grown job cannot take it: said, not retried
            summary = f"not taken: {exc}"
        self._after_growth = None
        with self.store.transaction() as db:
            self.store.set_meta(db, AFTER_GROWTH, "")
            self.store.add_event(
                db, "partitions", detail=f"the change rolled back for the growth: {summary}"
            )

    def cancel_change(self) -> str:
        """Roll the change in flight back, as the operator asks: its warm-ups stop, the old
        owners keep their tasks. Returns the event's line; raises
        :class:`~spark_elastic.errors.ChangeRefusedError` saying why when it cannot
        (:meth:`.in_flight.InFlight.cancel`)."""
        return self.flight.cancel(self)

    def scale(self, containers: int, reason: str = "") -> str:
        """Run the job's tasks on ``containers`` containers from now on (KIP-441 moves).

        The assignor plans the moves, sticky: a container whose tasks stay the
        same keeps running. Every other one hands over to a successor, like a
        growth handover: the successor starts once its predecessors stopped
        (or their leases ran out), a stateless one from the offsets they
        committed (the lowest where two read one partition: output is
        at-least-once).

        A stateful job moves as KIP-441 does: the successors are launched
        first, as *warm-ups* (``JobModel.warmups``), while the old owners keep
        running every task. Once every warm-up is ready, the probing move
        (:meth:`.moves.Mover.advance`, on the ticks) stops the old owners at a batch
        boundary and then hands each warm-up its tasks, with their committed
        state (a subset :func:`~spark_elastic.rescale` of the old owners'
        checkpoints, in the warm-up's own Spark application).

        Parameters
        ----------
        containers
            The new container count, from 1 to the job's task count.
        reason
            Why, when the autoscaler asks: the change's event is then an
            ``autoscale`` event that starts with it (else a ``scale`` event).

        Returns
        -------
        str
            What changed, in one line.

        Raises
        ------
        ArgumentError
            ``containers`` out of range.
        ChangeRefusedError
            Another change (a growth, a handover, a move) is under way.
        """
        tasks = [t for c in self.model.containers for t in c.tasks]
        if isinstance(containers, bool) or not isinstance(containers, int) or containers < 1:
            raise ArgumentError.invalid("containers", "a whole number >= 1", containers)
        if containers > len(tasks):
            raise ArgumentError.invalid(
                "containers", f"at most the job's {len(tasks)} virtual tasks", containers
            )
        self._refuse_if_busy()
        current = list(self.model.containers)
        if containers == len(current):
            return f"already {containers} containers: nothing to do"
        plan = scale_assignment(tasks, current, containers)
        kept = [c for c in current if c.tasks in plan]
        moved = [c for c in current if c.tasks not in plan]
        new_sets = [t for t in plan if t not in {c.tasks for c in kept}]
        if self.shape.stateful:
            return self._start_move(
                scale_move(len(current), containers, new_sets, len(kept), len(moved)), reason
            )
        summary = self.moves.hand_over(
            scale_move(len(current), containers, new_sets, len(kept), len(moved), warm_ups=False),
            kept,
            moved,
            reason,
        )
        # Any change of the count, a person's too, starts the autoscaler's cool-down.
        self.autoscaling.start_cool_down()
        return summary

    def _start_move(self, plan: MovePlan, reason: str) -> str:
        summary = self.moves.start(plan, reason)
        # Any change, a person's too, starts the autoscaler's cool-down.
        self.autoscaling.start_cool_down()
        return summary

    def change_factor(self, factor: int, reason: str = "") -> str:
        """Run the job at elasticity factor ``factor`` from now on, one container at a time.

        Each container gets a warm-up that will own its keys at the new factor
        (a split gives it its tasks' children; a merge gives each parent to
        the first container, by generation, that holds one of its children).
        The move then goes group by group (:meth:`.moves.Mover.advance`): a group's
        old owners stop at a batch boundary, and its warm-ups rescale their
        committed checkpoints to the new factor and start, while the rest of
        the job keeps running. Between groups the job runs at both factors,
        each key in exactly one task.

        Parameters
        ----------
        factor
            The new factor, a power of two from 1 to 1024.
        reason
            Why, when the autoscaler asks (see :meth:`scale`).

        Returns
        -------
        str
            What will change, in one line.

        Raises
        ------
        ArgumentError
            Not a power of two from 1 to 1024, or the job's tasks have no key buckets.
        ChangeRefusedError
            Another change is under way.
        """
        factor = validate_elasticity_factor(factor, "elasticity_factor")
        current = list(self.model.containers)
        names = [parsed(t) for c in current for t in c.tasks]
        if names and names[0].kind is TaskKind.SINGLE:
            raise ArgumentError.invalid(
                "elasticity_factor",
                "a job whose grouper has key buckets (AllSspToSingleTask has one task)",
                factor,
            )
        self._refuse_if_busy()
        old = self.model.elasticity_factor
        if factor == old:
            return f"already at elasticity factor {factor}: nothing to do"
        return self._start_move(factor_move(old, factor, current), reason)

    def _refuse_if_busy(self) -> None:
        if self._job_state["state"] != "running":
            raise ChangeRefusedError(
                f"the job is {self._job_state['state']} ({self._job_state['why']}); "
                "`job run` resumes it"
            )
        self.flight.settle(self)  # one that is done since the last tick is over now
        if self.change is not None:
            raise ChangeRefusedError(
                f"a change is under way ({self.change.describe()}); retry after it, or cancel "
                "it (job scale URL --cancel)"
            )
        grown = self.partitions.waiting
        if grown is not None:
            raise ChangeRefusedError(
                f"the inputs grew to {grown['counts']} and that growth goes first; retry after it"
            )
        waiting = sorted(r.id for r in self.records.values() if r.state == "launching")
        if waiting:
            raise ChangeRefusedError(
                f"containers {waiting} are still starting; retry once they run"
            )

    @property
    def autoscaler(self) -> AutoscalerConfig:
        """The autoscaler's settings in force (:class:`.autoscaling.Autoscaling` keeps them)."""
        return self.autoscaling.config

    @property
    def decision(self) -> Decision | None:
        """The autoscaler's last decision, or None before its first."""
        return self.autoscaling.decision

    def configure_autoscaler(self, changes: Mapping[str, Any]) -> str:
        """Turn the autoscaler on or off, pin it, or change its bounds (``POST /autoscaler``).

        Parameters
        ----------
        changes
            Some of :meth:`AutoscalerConfig.to_json`'s keys: ``{"enabled": b}``,
            ``{"pinned": N}``, ``{"minContainers": A, "maxContainers": B}``...

        Returns
        -------
        str
            The new settings, in one line.

        Raises
        ------
        ArgumentError, ArgumentTypeError
            An unknown key, a bad value, or bounds that contradict each other
            or the task count; nothing is changed.
        """
        return self.autoscaling.configure(changes, self._task_count())

    def observe_load(self) -> Observation:
        """What the autoscaler sees now: each task's lag, each container's rate.

        Returns
        -------
        Observation
            Containers oldest generation first (a scale-in retires the
            newest), tasks in (partition, bucket) order.
        """
        return self.autoscaling.observe(self.model, self._task_lags(), self.shape.elasticity_factor)
