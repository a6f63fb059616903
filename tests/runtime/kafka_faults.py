"""A seeded schedule of faults in combination for the click count on Kafka, and its runner.

:func:`plan_faults` is pure: a seed gives the same schedule every time, and
each schedule starts with one of the combinations that broke or held back
jobs before (:data:`COMBINATIONS`: a growth during a scale, a broker restart
during a move, a coordinator kill during a growth, two broker restarts in a
row), then goes on with faults drawn from everything the README says a job
survives. :class:`FaultRun` applies a schedule to a running job
(``kafka_clicks.start_on_kafka``) while records arrive, waits after each step
for the job to settle and every record to be applied, and checks that the
coordinator never died by itself. ``test_kafka_faults.py`` holds the specs;
``make kafka-faults SEEDS="1 2 3"`` runs chosen seeds.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kafka_jvm
from cli_runner import run_cli
from jobs import APPLY_DEADLINE_S, CHANGE_DEADLINE_S, RunningJob, wait_until
from kafka_clicks import OPTIONS, Clicks, grow
from standins import alive

CHANGES = ("scale", "factor", "grow")
"""Faults that are changes of the job: another fault may fall while one is in flight."""
FAULTS = ("kill", "pause", "coordinator", "broker", "brokers")
"""Faults that fall on a job: a container SIGKILLed or paused past its lease (SIGSTOP), the
coordinator SIGKILLed and started again, the broker SIGKILLed and restarted, once or twice."""
COMBINATIONS = (
    ("scale", "grow"),
    ("scale", "broker"),
    ("factor", "broker"),
    ("grow", "coordinator"),
    ("brokers", None),
)
"""What each schedule starts with: a change and what falls during it (``brokers``: two
broker restarts in a row)."""


@dataclass(frozen=True)
class Fault:
    """One step of a schedule.

    Attributes
    ----------
    kind
        One of :data:`CHANGES` or :data:`FAULTS`.
    arg
        ``scale``: the container count; ``factor``: the elasticity factor;
        ``kill``, ``pause``: which running container (an index, modulo their
        number); ``broker``, ``brokers``: seconds the broker stays away once
        the coordinator says it fails; else 0.
    during
        A fault that falls while this change is in flight, or None.
    """

    kind: str
    arg: int = 0
    during: Fault | None = None

    def __str__(self) -> str:
        text = self.kind if not self.arg else f"{self.kind} {self.arg}"
        return text if self.during is None else f"{text} during which {self.during}"


@dataclass(frozen=True)
class Shape:
    """What a schedule knows of the job as it goes: its containers, factor, whether grown."""

    containers: int = 2
    factor: int = 2
    grown: bool = False

    def after(self, fault: Fault) -> Shape:
        """The job's shape once ``fault`` (and what fell during it) settled."""
        shape = self
        if fault.kind == "scale":
            shape = Shape(fault.arg, shape.factor, shape.grown)
        elif fault.kind == "factor":
            shape = Shape(shape.containers, fault.arg, shape.grown)
        elif fault.kind == "grow":
            shape = Shape(shape.containers, shape.factor, True)
        return shape if fault.during is None else shape.after(fault.during)


def plan_faults(seed: int, steps: int) -> tuple[Fault, ...]:
    """The schedule of ``seed``: a combination of :data:`COMBINATIONS`, then ``steps - 1``
    faults drawn from the valid ones (a scale to another count of 1 to 3 containers, a
    factor change 2 <-> 4, one growth 4 -> 8 at most), half the changes with a fault
    during them.

    Parameters
    ----------
    seed
        The schedule's seed (printed by the runner: a failing one is replayed by it).
    steps
        How many steps, at least 1.

    Returns
    -------
    tuple of Fault
        The steps, in order.
    """
    rng = random.Random(seed)
    shape = Shape()
    first = rng.choice(COMBINATIONS)
    schedule = [_combination(rng, shape, *first)]
    shape = shape.after(schedule[0])
    while len(schedule) < steps:
        kinds = [k for k in CHANGES + FAULTS if k != "grow" or not shape.grown]
        fault = _fault(rng, shape, rng.choice(kinds))
        if fault.kind in CHANGES and rng.random() < 0.5:
            inner = [k for k in (*FAULTS, "grow") if k != "grow" or not shape.after(fault).grown]
            fault = Fault(fault.kind, fault.arg, _fault(rng, shape.after(fault), rng.choice(inner)))
        schedule.append(fault)
        shape = shape.after(fault)
    return tuple(schedule)


def _combination(rng: random.Random, shape: Shape, kind: str, during: str | None) -> Fault:
    fault = _fault(rng, shape, kind)
    if during is None:
        return fault
    return Fault(fault.kind, fault.arg, _fault(rng, shape.after(fault), during))


def _fault(rng: random.Random, shape: Shape, kind: str) -> Fault:
    if kind == "scale":
        return Fault(kind, rng.choice([n for n in (1, 2, 3) if n != shape.containers]))
    if kind == "factor":
        return Fault(kind, 4 if shape.factor == 2 else 2)
    if kind in ("kill", "pause"):
        return Fault(kind, rng.randrange(3))
    if kind in ("broker", "brokers"):
        return Fault(kind, rng.choice((0, 5, 15)))
    return Fault(kind)


class FaultRun:
    """A schedule applied to the click count on Kafka while records arrive.

    Parameters
    ----------
    kafka
        The session's broker (SIGKILLed and restarted by broker faults).
    start_job
        Starts ``job run`` (the ``start_job`` fixture), for a coordinator's restart.
    clicks
        The job's files (its store is ``coordinator.db`` there).
    job, records
        What ``kafka_clicks.start_on_kafka`` returned.
    out
        The output topic.
    """

    def __init__(
        self,
        kafka: kafka_jvm.KafkaBroker,
        start_job: Callable[..., RunningJob],
        clicks: Path,
        job: RunningJob,
        records: Clicks,
        out: str,
    ) -> None:
        self.kafka, self.start_job, self.clicks = kafka, start_job, clicks
        self.job, self.records, self.out = job, records, out
        self.topic = records.topic
        self.shape = Shape()
        """The job's shape after the last step run."""

    def run(self, schedule: tuple[Fault, ...]) -> None:
        """Each step while records arrive; after it, the job settled, every record applied
        and its coordinator alive."""
        shape = self.shape = Shape()
        for number, fault in enumerate(schedule, start=1):
            print(f"{time.strftime('%H:%M:%S')} step {number}: {fault}", flush=True)
            began = time.time()
            self.records.produce(500)
            self.apply(fault)
            shape = self.shape = shape.after(fault)
            self.settled(shape)
            print(f"    settled {time.time() - began:.0f} s after the step began", flush=True)
            self.records.produce(500)
            wait_until(
                f"every record applied after step {number} ({fault})",
                self.records.applied(self.out),
                APPLY_DEADLINE_S,
            )
            self.coordinator_alive()
            # What the coordinator made of the step, for a reader of a failed seed's output.
            for event in reversed(self.job.status()["events"]):
                if event["at"] >= began:
                    print(f"    {event['kind']} {event['container']} {event['detail']}")

    def apply(self, fault: Fault) -> None:
        """``fault``, and what falls during it once it is in flight."""
        if fault.kind == "scale":
            self._change("--containers", fault.arg)
        elif fault.kind == "factor":
            self._change("--elasticity-factor", fault.arg)
        elif fault.kind == "grow":
            grow(self.kafka.bootstrap, 8, self.topic)
            if fault.during is not None:
                wait_until(
                    "the growth seen",
                    lambda: self.job.status()["partitionMonitor"]["seen"].get(self.topic) == 8,
                    timeout=60,
                )
        elif fault.kind in ("kill", "pause"):
            self._container(fault.kind, fault.arg)
        elif fault.kind == "coordinator":
            self._coordinator()
        elif fault.kind in ("broker", "brokers"):
            for _ in range(2 if fault.kind == "brokers" else 1):
                self._broker(fault.arg)
        else:
            raise ValueError(f"no such fault: {fault.kind!r}")
        if fault.during is not None:
            self.apply(fault.during)

    def settled(self, shape: Shape) -> dict[str, Any]:
        """Wait until nothing is in flight and the job has ``shape``; the job model."""

        def done() -> dict[str, Any] | None:
            status, model = self.job.status(), self.job.job_model()
            partitions = 8 if shape.grown else 4
            ok = (
                status["change"] is None
                and model["warmups"] == []
                and len(model["containers"]) == shape.containers
                and model["elasticityFactor"] == shape.factor
                and model["partitions"] == {self.topic: partitions}
                and len(self.job.running_containers()) == shape.containers
            )
            return model if ok else None

        model: dict[str, Any] = wait_until(
            f"the job settled at {shape}", done, timeout=CHANGE_DEADLINE_S
        )
        return model

    def coordinator_alive(self) -> None:
        """The coordinator never dies by itself (only a fault of the schedule kills it)."""
        code = self.job.process.poll()
        assert code is None, f"the coordinator exited by itself with {code}"

    def _change(self, option: str, value: int) -> None:
        changed = run_cli("job", "scale", self.job.url, option, str(value))
        # A growth that waits for nothing refuses no change; one seen during a change that
        # cannot be rolled back does, until it starts: ask again.
        deadline = time.monotonic() + CHANGE_DEADLINE_S
        while changed.returncode != 0 and "growth goes first" in changed.stderr:
            assert time.monotonic() < deadline, changed.stderr
            time.sleep(1)
            changed = run_cli("job", "scale", self.job.url, option, str(value))
        assert changed.returncode == 0, changed.stderr

    def _container(self, kind: str, index: int) -> None:
        running = sorted(self.job.running_containers().items())
        victim, pid = running[index % len(running)]
        if kind == "kill":
            os.kill(pid, signal.SIGKILL)
            wait_until(
                f"{victim}'s tasks handed to a new generation",
                lambda: victim not in self._model_containers(),
            )
            return
        os.kill(pid, signal.SIGSTOP)
        try:
            wait_until(
                f"paused {victim}'s tasks handed to a new generation",
                lambda: victim not in self._model_containers(),
            )
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        wait_until(f"the fenced {victim} to exit", lambda: not alive(pid), timeout=60)

    def _coordinator(self) -> None:
        self.job.process.send_signal(signal.SIGKILL)
        self.job.process.wait(30)
        port = int(self.job.url.rsplit(":", 1)[1])
        again = self.start_job(2, self.clicks / "coordinator.db", port, *OPTIONS)
        again.pids.update(self.job.pids)
        self.job = again

    def _broker(self, away_s: int) -> None:
        self.kafka.kill()
        try:
            failing = wait_until(
                "the broker's loss on the status page",
                lambda: (s := self.job.status()["input"])["state"] == "failing" and s,
                timeout=60,
            )
            wait_until(
                f"the broker away {away_s} s more",
                lambda: (
                    (self.job.status()["input"]["failingForS"] or 0)
                    >= failing["failingForS"] + away_s
                ),
                timeout=away_s + 60,
            )
        finally:
            self.kafka.restart()
        wait_until(
            "the input answering again",
            lambda: self.job.status()["input"]["state"] == "answering",
            timeout=120,
        )

    def _model_containers(self) -> set[str]:
        return {c["containerId"] for c in self.job.job_model()["containers"]}
