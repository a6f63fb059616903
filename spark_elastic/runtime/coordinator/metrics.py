"""The coordinator's Prometheus metrics (``GET /metrics``).

Names follow Prometheus' conventions: a unit suffix (``_seconds``,
``_records``), ``_total`` on counters, labels for what varies
(``container``, ``task``, ``kind``). What to chart (rates, lag, batch time,
changes in flight) is in ``docs/monitoring.md`` and its Grafana dashboard.

May import: :mod:`.history`, :mod:`.input_health`, prometheus_client and the
standard library.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from spark_elastic.runtime.coordinator.history import KINDS, History
from spark_elastic.runtime.coordinator.input_health import CHECK, GROUP

__all__ = ["Metrics"]

_LIVE = ("launching", "warm", "running")


class Metrics:
    """The coordinator's Prometheus metrics, in a registry of its own.

    Counters of what the server sees (heartbeats, failovers ...) are kept
    here; what the store counts (records, enforced records) is read from the
    status at each scrape (:class:`_FromStatus`), so it survives a
    coordinator restart as the store does.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.heartbeats = Counter(
            "spark_elastic_heartbeats", "Heartbeats answered, by answer", ["alive"], registry=r
        )
        self.expired_heartbeats = Counter(
            "spark_elastic_expired_heartbeats",
            "Heartbeats from containers the coordinator no longer considers valid (Samza's metric)",
            registry=r,
        )
        self.failovers = Counter(
            "spark_elastic_failovers", "Containers replaced after their lease expired", registry=r
        )
        self.stalls = Counter(
            "spark_elastic_coordinator_stalls",
            "Times the coordinator's loop ran more than 0.5 s late (a loaded machine): the "
            "time it could not hear heartbeats was charged to no lease",
            registry=r,
        )
        self.partition_change_refused = Gauge(
            "spark_elastic_partition_change_refused",
            "1 while the inputs' partition counts changed in a way the job does not follow "
            "(a shrink, or a count that is not a multiple of the planned one)",
            registry=r,
        )
        self.partition_growths = Counter(
            "spark_elastic_partition_growths",
            "Input partition growths taken up (SEP-5)",
            registry=r,
        )
        self.autoscaler_actions = Counter(
            "spark_elastic_autoscaler_actions",
            "Changes the autoscaler made (container count or elasticity factor), by action",
            ["action"],
            registry=r,
        )
        self.autoscaler_mode = Gauge(
            "spark_elastic_autoscaler_mode",
            "1 for the autoscaler's current mode (off, on, pinned)",
            ["mode"],
            registry=r,
        )
        self.input_up = Gauge(
            "spark_elastic_input_up",
            "1 while every call of the coordinator to its input (partition check, consumer "
            "group commit) answers, 0 while one fails (a broker unreachable)",
            registry=r,
        )
        self.input_failing = Gauge(
            "spark_elastic_input_failing_seconds",
            "How long a call of the coordinator to its input has been failing (0 when none is)",
            registry=r,
        )
        self.input_failing_calls = Gauge(
            "spark_elastic_input_call_failing",
            "1 while this call of the coordinator to its input fails",
            ["call"],
            registry=r,
        )
        self.input_client_restarts = Counter(
            "spark_elastic_input_client_restarts",
            "Times the input's client process was started again after it died or hung",
            registry=r,
        )
        self._restarts_counted = 0  # of the status's clientRestarts, added to the counter
        self.model_version = Gauge(
            "spark_elastic_job_model_version", "The current job model version", registry=r
        )
        self.containers = Gauge(
            "spark_elastic_containers", "Containers by state", ["state"], registry=r
        )
        self.lag = Gauge(
            "spark_elastic_task_lag_records",
            "Unread records of a task's partitions",
            ["task"],
            registry=r,
        )
        self.amplification = Gauge(
            "spark_elastic_read_amplification",
            "Records a container read per record of its own tasks",
            ["container"],
            registry=r,
        )
        self._from_status = _FromStatus()
        r.register(self._from_status)

    def refresh(self, status: dict[str, Any], history: History) -> None:
        """Take in the status and the history of the moment (before each scrape)."""
        self._from_status.status = status
        self._from_status.history = history
        self.model_version.set(status["jobModelVersion"])
        health = status["input"]
        self.input_up.set(0 if health["state"] == "failing" else 1)
        self.input_failing.set(health["failingForS"] or 0)
        for call in (CHECK, GROUP):
            self.input_failing_calls.labels(call).set(int(call in health["failing"]))
        restarts = health["clientRestarts"] - self._restarts_counted
        if restarts > 0:
            self.input_client_restarts.inc(restarts)
            self._restarts_counted += restarts
        for mode in ("off", "on", "pinned"):
            self.autoscaler_mode.labels(mode).set(int(status["autoscaler"]["mode"] == mode))
        self.partition_change_refused.set(1 if status["partitionMonitor"]["refused"] else 0)
        states: dict[str, int] = {}
        for c in status["containers"]:
            states[c["state"]] = states.get(c["state"], 0) + 1
            if c["state"] in _LIVE and c["readAmplification"] is not None:
                self.amplification.labels(c["containerId"]).set(c["readAmplification"])
            else:  # ended: its series goes, as the container did
                with contextlib.suppress(KeyError):
                    self.amplification.remove(c["containerId"])
        for state in ("launching", "warm", "running", "expired", "retired", "stopped"):
            self.containers.labels(state).set(states.get(state, 0))
        for task in status["tasks"]:
            if task["lag"] >= 0:
                self.lag.labels(task["task"]).set(task["lag"])
            else:  # its owner has not reported yet: no figure rather than a stale one
                with contextlib.suppress(KeyError):
                    self.lag.remove(task["task"])


class _FromStatus(Collector):
    """What the store counts and the history keeps, as of the last status: records read and
    processed per container, the job's input lag, batch durations, changes."""

    def __init__(self) -> None:
        self.status: dict[str, Any] | None = None
        self.history: History | None = None

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        status, history = self.status, self.history
        if status is None or history is None:
            return
        read = CounterMetricFamily(
            "spark_elastic_records_read",
            "Records a running container's query read (its tasks' partitions, other buckets "
            "included)",
            labels=["container"],
        )
        processed = CounterMetricFamily(
            "spark_elastic_records_processed",
            "Records of its own tasks a running container processed",
            labels=["container"],
        )
        batch = GaugeMetricFamily(
            "spark_elastic_batch_duration_seconds",
            "A running container's last micro-batch, from its trigger to its commit",
            labels=["container"],
        )
        # Live containers only: every failover or scale makes new ones, and an ended one's
        # series would stay forever (its last increments are in the scrapes before it ended).
        for c in status["containers"]:
            if c["state"] not in _LIVE:
                continue
            read.add_metric([c["containerId"]], c["recordsRead"])
            processed.add_metric([c["containerId"]], c["recordsProcessed"])
            if c.get("lastBatchMs") is not None:
                batch.add_metric([c["containerId"]], c["lastBatchMs"] / 1000)
        yield read
        yield processed
        yield batch
        if status.get("inputLag") is not None:
            yield GaugeMetricFamily(
                "spark_elastic_input_lag_records",
                "Records of the job's input not yet read (each partition once, at its slowest "
                "task; partitions no task reads yet whole)",
                value=status["inputLag"],
            )
        if status.get("recordsEnforced") is not None:
            yield CounterMetricFamily(
                "spark_elastic_records_enforced",
                "Records time-ordered tasks processed without waiting for their other "
                "partitions (Kafka Streams' enforced-processing-total), over the job's containers",
                value=status["recordsEnforced"],
            )
        in_flight = GaugeMetricFamily(
            "spark_elastic_changes_in_flight",
            "Changes under way, by kind (scale, factor, growth, warm-up, failover, stop)",
            labels=["kind"],
        )
        for kind in KINDS:
            in_flight.add_metric([kind], len(history.open_spans(kind)))
        yield in_flight
        ended = CounterMetricFamily(
            "spark_elastic_changes",
            "Changes ended since the coordinator started, by kind and result",
            labels=["kind", "result"],
        )
        for (kind, result), count in sorted(history.ended.items()):
            ended.add_metric([kind, result], count)
        yield ended
