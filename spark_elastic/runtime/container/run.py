"""A container's life, from its registration to its exit code: :func:`run_container`.

In order: register (which grants the first lease), fetch the job model, fork
its checkpoint generation from the previous owner's committed prefix if the
model says so (:mod:`.generations`), or, taking tasks from several owners or
some of one owner's, rescale their committed checkpoints to its share
(:func:`~spark_elastic.rescale` with ``tasks``), start the query, then heartbeat on a
thread while the main thread reports each committed batch. The query writes
through ``foreachBatch``, which checks the lease right before the job's sink
is called, and the sink checks it again right before it publishes. With the
lease lapsed (by the container's own clock, even with the coordinator
unreachable) the write waits for a renewal; a revoked lease, or no renewal
within the stop limit, fails the batch before anything is published, so the
batch never commits. ``{"alive": false}``, or failed heartbeats (Samza's
retries, with the lease over for another lease's length), stop the query
and exit 1; SIGTERM stops it at a batch boundary (the batch in flight
commits first, while the lease lasts) and exits 0; a stop that hangs past
the limit is cut short by ``os._exit(1)``, as Samza does.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from spark_elastic.errors import ProtocolError
from spark_elastic.runtime.container.class_archive import finish as finish_class_archive
from spark_elastic.runtime.container.class_archive import gateway_process
from spark_elastic.runtime.container.client import CoordinatorClient, _Heartbeats, first_line
from spark_elastic.runtime.container.console import EXIT_FENCED, EXIT_OK, _log
from spark_elastic.runtime.container.follow import scratch_for
from spark_elastic.runtime.container.query import (
    _factor_of,
    _progress_json,
    _stop_within,
    build_report,
    progress_since,
)
from spark_elastic.runtime.container.scratch import sweep
from spark_elastic.runtime.container.settings import ContainerSettings
from spark_elastic.runtime.container.warmups import _await_tasks, warm_up_for
from spark_elastic.runtime.growth import grown_plan
from spark_elastic.runtime.job import Job, load_job_and_module
from spark_elastic.runtime.lease import ContainerLease, LeaseTerms
from spark_elastic.runtime.protocol import ContainerModel, Registration
from spark_elastic.storage import LocalStorage, is_local

if TYPE_CHECKING:
    from pyspark.sql.streaming import StreamingQuery

    from spark_elastic.model.plan import JobPlan

__all__ = ["run_container"]

_LOCAL = LocalStorage()


def run_container(settings: ContainerSettings) -> int:
    """Run a container until it is stopped, fenced, or its query fails.

    Runs in the container's own process, on its driver; returns the exit code
    (0: stopped by SIGTERM or removed from the job model; 1: fenced, gave up
    on the coordinator, or the query failed).

    Parameters
    ----------
    settings
        Where the coordinator is, which job, and the heartbeat settings.

    Returns
    -------
    int
        The process exit code.
    """
    timeout = settings.heartbeat_timeout_s or min(5.0, max(1.0, 2 * settings.heartbeat_s))
    client = CoordinatorClient(
        settings.coordinator_url, settings.token, timeout, settings.coordinator_urls
    )
    started: list[StreamingQuery] = []
    try:
        return _run_container(settings, client, started)
    except Exception as exc:
        # Why it fails goes where the operator looks (the coordinator's events and status),
        # not only into this log, but only once nothing of it can write: its query stopped.
        _log(f"failed: {first_line(exc)}")
        for query in started:
            _stop_within(query, settings.shutdown_s)
        client.report_failure(settings.container_id, exc)
        raise
    finally:
        finish_class_archive(gateway_process())


def _run_container(
    settings: ContainerSettings, client: CoordinatorClient, started: list[StreamingQuery]
) -> int:
    """:func:`run_container`'s life; every query it starts is put in ``started`` at once."""
    job, module = load_job_and_module(settings.job)
    # On this side only the write budget and the drift allowance matter; the lease's length
    # comes with every reply, and the margin is the coordinator's.
    terms = LeaseTerms(
        lease_s=max(settings.write_budget_s * 2, 1.0),
        margin_s=settings.write_budget_s,
        write_budget_s=settings.write_budget_s,
    )
    lease = ContainerLease(terms)
    # KIP-441: a warm-up gets going while the old owners still run its tasks; it registers
    # (holds a lease) only once it is ready, and writes nothing before it owns them.
    warm_up = warm_up_for(job, module, settings, lease, client.job_model())
    if not warm_up.prepare(client):
        failed = warm_up.failure() is not None
        warm_up.discard()
        return EXIT_FENCED if failed else EXIT_OK
    sent = time.monotonic()
    reply = client.register(Registration(settings.container_id, os.getpid()))
    if not reply.alive:
        _log(f"the coordinator did not issue container id {settings.container_id!r}")
        warm_up.discard()
        return EXIT_FENCED
    lease.renew(sent, reply.lease_ms)
    # Housekeeping of the host, once the coordinator has owned this container (one it never
    # issued touches nothing): what containers killed here left behind.
    swept = sweep()
    if swept:
        _log(
            f"deleted the scratch of {len(swept)} container(s) gone from this host "
            f"({swept[0].parent}: {', '.join(p.name for p in swept)})"
        )

    dead = threading.Event()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    beats = _Heartbeats(client, settings, lease, dead)
    beats.lease_s = reply.lease_ms / 1000
    beats.start()
    model = client.job_model()
    warm = model.warmup(settings.container_id)
    if warm is not None:
        _log(f"warm: waiting for tasks {', '.join(warm.tasks)}")
        awaited = _await_tasks(client, settings.container_id, stop, dead, beats, warm_up)
        if awaited is None:
            warm_up.discard()
            beats.stop()
            return EXIT_FENCED if dead.is_set() else EXIT_OK
        model = awaited
    mine = model.container(settings.container_id)
    if mine is None:
        beats.stop()
        _log(f"job model {model.version} has no container {settings.container_id!r}")
        return EXIT_FENCED

    # The tasks are those planned for the planned counts; after SEP-5 growth a new
    # partition joins the tasks of its partition modulo the planned count.
    plan = grown_plan(job.grouper, _factor_of(mine, job), model.planned, model.partitions)
    # From here to the first commit is this container's share of a moved task's stall.
    given = time.monotonic()
    taken = warm_up.take_over(mine, model, plan)
    query = taken.query
    started.append(query)
    steps = "".join(f"; {step} {seconds:.1f} s" for step, seconds in taken.steps)
    _log(
        f"running tasks {', '.join(mine.tasks)} in generation {mine.generation} "
        f"({time.monotonic() - given:.1f} s after they were given{steps})"
    )
    code = _supervise(query, job, plan, mine, client, stop, dead, given, taken.since)
    if stop.is_set() and not dead.is_set():
        # Asked to stop (a handover, or the job's stop): the heartbeats go on renewing the
        # lease while the batch in flight commits, so its records are published here
        # rather than replayed by a successor.
        _finish_batch(query, settings.shutdown_s, dead)
    beats.stop()
    _stop_within(query, settings.shutdown_s)
    if not is_local(mine.checkpoint):
        # This host's files of a checkpoint on HDFS or S3 (a replaying warm-up's gate): only
        # its stopped query read them. A killed container leaves them in the temp dir.
        _LOCAL.discard(str(scratch_for(mine.checkpoint)))
    if stop.is_set() and not dead.is_set():
        # Its successor may start now rather than once this process (a JVM on its way
        # out) has exited: the query has stopped, so nothing more is written.
        with contextlib.suppress(OSError, ValueError, ProtocolError):
            client.heartbeat(settings.container_id, stopped=True)
    return code


def _durations(progress: Mapping[str, Any]) -> str:
    """Where a batch's time went, as Spark's progress says (for the first batch's log line)."""
    durations = progress.get("durationMs")
    if not isinstance(durations, Mapping):
        return ""
    parts = [
        f"{name} {ms / 1000:.1f} s"
        for name, ms in durations.items()
        if name != "triggerExecution" and isinstance(ms, int | float) and ms >= 50
    ]
    return f" ({'; '.join(parts)})" if parts else ""


def _finish_batch(query: StreamingQuery, limit_s: float, dead: threading.Event) -> None:
    """Wait until the query's micro-batch in flight has committed (or none runs).

    Runs on the container's driver, once, when the container is asked to
    stop. Spark has no stop at a batch boundary for Structured Streaming
    (``query.stop()`` interrupts the batch), so this watches the query's
    status: no trigger active, or a newer progress than when it was asked.
    Gives up after ``limit_s`` or once the lease is lost (``dead``): the
    batch is then abandoned, uncommitted, as a crash would leave it.
    """

    def last() -> str:
        return str(_progress_json(query.lastProgress).get("timestamp", ""))

    asked, before = time.monotonic(), last()
    while time.monotonic() < asked + limit_s and not dead.is_set() and query.isActive:
        if not query.status.get("isTriggerActive") or last() != before:
            _log(f"stopping at a batch boundary ({time.monotonic() - asked:.1f} s after asked)")
            return
        time.sleep(0.05)
    _log("stopping mid-batch: the batch in flight is abandoned")


def _supervise(
    query: StreamingQuery,
    job: Job,
    plan: JobPlan,
    mine: ContainerModel,
    client: CoordinatorClient,
    stop: threading.Event,
    dead: threading.Event,
    given: float,
    since: str = "",
) -> int:
    """Report committed batches until asked to stop, fenced, or the query ends.

    Progress from before ``since`` (a trigger timestamp) is not reported.
    """
    # Spark also reports idle triggers, under the id of the batch that has not run yet; the
    # batch itself reports again under that id when it runs. Progress events are therefore
    # told apart by their trigger timestamp (ISO 8601, so they order as strings), and each
    # is reported once: the coordinator adds the counts up.
    reported = since
    first = True
    while True:
        if stop.is_set():
            return EXIT_OK
        if dead.is_set():
            return EXIT_FENCED
        if not query.isActive:
            error = query.exception()
            fenced = error is not None and "FencedError" in str(error)
            _log("fenced: stopped before writing" if fenced else f"query ended: {error}")
            if not fenced:
                # Its query has ended: nothing of this container writes any more.
                client.report_failure(
                    mine.container_id,
                    first_line(error) if error is not None else "the query stopped by itself",
                )
            return EXIT_FENCED
        for progress in progress_since(query, reported):
            batch, at = progress.get("batchId"), progress.get("timestamp")
            if not isinstance(batch, int) or not isinstance(at, str) or at <= reported:
                continue
            if first:
                first = False
                _log(
                    f"first batch {batch} done {time.monotonic() - given:.1f} s after the tasks "
                    f"were given{_durations(progress)}"
                )
            reported = at
            try:
                reply = client.progress(build_report(job, plan, mine, progress))
            except (OSError, ValueError, ProtocolError) as exc:
                _log(f"progress report of batch {batch} failed ({exc})")
            else:
                if not reply.alive:
                    dead.set()
        stop.wait(0.2)
