"""The coordinator's HTTP server: the job model, SAMZA-871 heartbeats, a status page, metrics.

aiohttp on one asyncio loop: every request is handled on that loop's thread,
one at a time against the :class:`~.supervisor.Supervisor`, so the state
machine needs no locks. Thousands of idle heartbeat connections cost a
coroutine each, not a thread.

Bounds: request bodies up to 64 KiB (413 beyond), at most 512 requests in
flight (503 beyond), the views that build the whole status (``/``,
``/status.json``, ``/metrics``) at most 50 a second with bursts of 50 (429
beyond: they read the store, so a client polling them in a loop must not take
the loop from heartbeats), headers and bodies read under aiohttp's limits,
and a slow client holds only its own connection. Bound to a loopback address by
default; bound to any other address, every request needs
``Authorization: Bearer <token>`` and the server refuses to start without a
token. Errors are JSON: ``{"error": "one line"}``.

Endpoints: ``GET /jobModel``, ``GET /containerHeartbeat?executionContainerId=ID``,
``POST /containers/register``, ``POST /containers/progress``,
``POST /containers/failure`` (``{"containerId", "error"}``: why a container fails),
``POST /scale`` (``{"containers": N}`` or ``{"elasticityFactor": F}``; 409 while
another change is under way; ``{"cancel": true}`` rolls the change in flight back,
409 when it can no longer be),
``POST /autoscaler`` (``{"enabled": b}``, ``{"pinned": N}``, bounds
``{"minContainers": A, "maxContainers": B}``, and the policy's other settings),
``GET /`` (status page), ``GET /status.json``, ``GET /metrics`` (Prometheus text).
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import ipaddress
import json
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from spark_elastic.errors import (
    ArgumentError,
    ArgumentTypeError,
    ChangeRefusedError,
    ProtocolError,
    SparkElasticError,
    StoreError,
    StoreFencedError,
)
from spark_elastic.runtime.coordinator.input_health import CHECK, GROUP
from spark_elastic.runtime.coordinator.status import coordinator_line
from spark_elastic.runtime.coordinator.supervisor import Supervisor
from spark_elastic.runtime.protocol import (
    FailureReport,
    ProgressReport,
    Registration,
    validate_container_id,
)

__all__ = ["CoordinatorServer", "bind", "is_loopback"]

MAX_BODY = 64 * 1024
MAX_IN_FLIGHT = 512
VIEWS_PER_S = 50.0
TICK_S = 0.2
# A tick this late means the loop (or the process) stalled: see Supervisor.deaf_for.
DEAF_S = 0.5

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_VIEWS = frozenset({"/", "/status.json", "/metrics"})


class _TokenBucket:
    """``rate`` requests a second on average, ``burst`` at once (the loop's thread only)."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float]) -> None:
        self.rate, self.burst, self.clock = rate, burst, clock
        self.tokens, self.at = burst, clock()

    def take(self) -> bool:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address or ``localhost``.

    Parameters
    ----------
    host
        A host name or IP address.

    Returns
    -------
    bool
        True for 127.0.0.0/8, ::1 and ``localhost``.
    """
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (port 0: any free port), or one clear error.

    Parameters
    ----------
    host
        The address to bind.
    port
        The port, 0 for any free one.

    Returns
    -------
    socket.socket
        The bound, listening socket.

    Raises
    ------
    ArgumentError
        The port is in use or the address cannot be bound.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        reason = "the port is in use" if exc.errno == 98 else exc.strerror
        raise ArgumentError.invalid(
            "--port", "a free port to listen on", f"{host}:{port} ({reason})"
        ) from None
    sock.listen(1024)
    sock.setblocking(False)
    return sock


def _monitor_line(monitor: dict[str, Any]) -> str:
    e = html.escape
    unread = ""
    if monitor["unread"]:
        records = sum(end for ends in monitor["unread"].values() for end in ends.values())
        unread = (
            f" Not read by any task yet: {e(json.dumps(monitor['unread']))} ({records:,} "
            "records, counted in the input lag)."
        )
    if monitor["growth"] is not None:
        growth = monitor["growth"]
        return (
            f"<p class='growth'>Partition growth to {e(json.dumps(growth['counts']))}: old "
            f"partitions drain to {e(json.dumps(growth['barrier']))} first.{unread}</p>"
        )
    if monitor["growthWaiting"] is not None:
        return (
            f"<p class='growth'>Partition growth to "
            f"{e(json.dumps(monitor['growthWaiting']['counts']))} waits for the change in "
            f"flight, which can no longer be rolled back, to end.{unread}</p>"
        )
    if monitor["refused"]:
        return f"<p class='refused'>Partition change not followed: {e(monitor['refused'])}</p>"
    if monitor["checkEveryS"] is None:
        return "<p>Partition monitor off.</p>"
    return (
        f"<p>Partition monitor: every {monitor['checkEveryS']:g} s; tasks planned for "
        f"{e(json.dumps(monitor['plannedPartitions']))}.</p>"
    )


def _input_line(health: dict[str, Any]) -> str:
    """Whether the input answers the coordinator: an outage as what it is, during a change too."""
    e = html.escape
    if health["state"] == "failing":
        since = time.strftime("%H:%M:%S", time.localtime(health["failingSince"]))
        failing = "; ".join(f"{call}: {detail}" for call, detail in health["failing"].items())
        line = (
            f"<p class='input failing'>Input failing since {since} "
            f"({health['failingForS']:.0f} s): {e(failing)}."
        )
    elif health["state"] == "answering":
        at = time.strftime("%H:%M:%S", time.localtime(health["lastAnswerAt"]))
        line = f"<p class='input'>Input answering (last answer {at})."
    else:
        line = "<p class='input'>Input not asked yet."
    if health["clientRestarts"]:
        line += (
            f" Its client process was started again {health['clientRestarts']} times "
            f"(last: {e(health['clientLastDeath'])})."
        )
    return line + "</p>"


def _autoscaler_line(autoscaler: dict[str, Any]) -> str:
    e = html.escape
    line = f"<p class='autoscaler'>Autoscaler {e(autoscaler['summary'])}."
    last = autoscaler["lastDecision"]
    if last is not None:
        at = time.strftime("%H:%M:%S", time.localtime(last["at"]))
        line += (
            f" Last decision ({at}): {e(last['action'])} at {last['target']} "
            f"({e(last['rule'])}): {e(last['reason'])}"
        )
    return line + "</p>"


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


class _Metrics:
    """The coordinator's Prometheus metrics, in a registry of its own."""

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
        self.enforced = Gauge(
            "spark_elastic_records_enforced",
            "Records time-ordered tasks processed without waiting for their other partitions"
            " (Kafka Streams' enforced-processing-total), over the job's containers",
            registry=r,
        )

    def refresh(self, status: dict[str, Any]) -> None:
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
        if status.get("recordsEnforced") is not None:
            self.enforced.set(status["recordsEnforced"])
        states: dict[str, int] = {}
        for c in status["containers"]:
            states[c["state"]] = states.get(c["state"], 0) + 1
            if c["readAmplification"] is not None:
                self.amplification.labels(c["containerId"]).set(c["readAmplification"])
        for state in ("launching", "warm", "running", "expired", "retired", "stopped"):
            self.containers.labels(state).set(states.get(state, 0))
        for task in status["tasks"]:
            if task["lag"] >= 0:
                self.lag.labels(task["task"]).set(task["lag"])
            else:  # its owner has not reported yet: no figure rather than a stale one
                with contextlib.suppress(KeyError):
                    self.lag.remove(task["task"])


def url_of(sock: socket.socket) -> str:
    """The URL of a coordinator listening on ``sock`` (:func:`bind`)."""
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


class CoordinatorServer:
    """The coordinator: a :class:`Supervisor` behind an aiohttp server, on its own loop.

    Parameters
    ----------
    make_supervisor
        Builds the supervisor once the URL is known (containers need it).
    sock
        A bound socket (:func:`bind`).
    token
        The shared token; required when the socket is not on loopback.
    """

    def __init__(
        self,
        make_supervisor: Callable[[str], Supervisor],
        sock: socket.socket,
        token: str | None = None,
    ) -> None:
        host, port = sock.getsockname()[:2]
        if not is_loopback(host) and not token:
            raise ArgumentError.invalid(
                "--token", f"a shared token when binding {host} (not a loopback address)", None
            )
        self.host = host
        self.port = port
        self.url = url_of(sock)
        self._sock = sock
        self._token = token
        self.supervisor = make_supervisor(self.url)
        self.metrics = _Metrics()
        self._in_flight = 0
        self._views = _TokenBucket(VIEWS_PER_S, VIEWS_PER_S, time.monotonic)
        self._runner: web.AppRunner | None = None
        self._stopping = asyncio.Event()
        self.exit_code = 0
        """0 once stopped as asked; 1 when its loop failed (the traceback is on stderr)."""
        self.failure: str | None = None
        """Why the loop failed, in one line, or None."""
        self._failed_with: BaseException | None = None
        self._leave_running = False
        # The input's calls under way beside the ticks (None: none yet).
        self._checking: asyncio.Task[None] | None = None
        self._committing: asyncio.Task[None] | None = None

    # HTTP

    def app(self) -> web.Application:
        """The aiohttp application."""
        app = web.Application(client_max_size=MAX_BODY, middlewares=[self._guard])
        app.router.add_get("/", self._page)
        app.router.add_get("/jobModel", self._job_model)
        app.router.add_get("/containerHeartbeat", self._heartbeat)
        app.router.add_post("/containers/register", self._register)
        app.router.add_post("/containers/progress", self._progress)
        app.router.add_post("/containers/failure", self._failure)
        app.router.add_post("/scale", self._scale)
        app.router.add_post("/autoscaler", self._autoscaler)
        app.router.add_get("/status.json", self._status)
        app.router.add_get("/metrics", self._metrics)
        return app

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if (
            self._token is not None
            and request.headers.get("Authorization") != f"Bearer {self._token}"
        ):
            return _error(401, "missing or wrong bearer token")
        if self._in_flight >= MAX_IN_FLIGHT:
            return _error(503, "too many requests in flight; retry")
        if request.path in _VIEWS and not self._views.take():
            return _error(429, f"status views over {VIEWS_PER_S:.0f} a second; retry")
        self._in_flight += 1
        try:
            return await handler(request)
        except web.HTTPRequestEntityTooLarge:
            return _error(413, f"request body over {MAX_BODY} bytes")
        except (ProtocolError, ArgumentError, ArgumentTypeError) as exc:
            return _error(400, str(exc))
        except ChangeRefusedError as exc:
            return _error(409, str(exc))
        except StoreError as exc:
            if not isinstance(exc, StoreFencedError) and self.supervisor.store.lease_s is not None:
                # A shared store out of reach: the request is refused, to be sent again,
                # while the coordinator's hold on the store (and the leases it grants) runs
                # down; another coordinator taking the store over fences this one.
                return _error(503, f"the coordinator's store is out of reach; retry: {exc}")
            # The store is lost to this coordinator: it cannot go on answering as if alive.
            self._fail(exc)
            return _error(503, f"the coordinator is stopping: {type(exc).__name__}: {exc}")
        except web.HTTPException as exc:
            return _error(exc.status, exc.reason)
        finally:
            self._in_flight -= 1

    async def _json_body(self, request: web.Request) -> Any:
        if request.content_length is not None and request.content_length > MAX_BODY:
            raise web.HTTPRequestEntityTooLarge(
                max_size=MAX_BODY, actual_size=request.content_length
            )
        text = await request.text()
        try:
            return json.loads(text)
        except ValueError:
            raise ProtocolError(f"{request.path}: the body is not JSON") from None

    async def _heartbeat(self, request: web.Request) -> web.Response:
        values = request.query.getall("executionContainerId", [])
        if len(values) != 1:
            raise ProtocolError(
                "executionContainerId: expected exactly one container id query parameter"
            )
        caught_up = request.query.getall("caughtUp", [])
        if caught_up not in ([], ["true"]):
            raise ProtocolError(f"caughtUp: expected true or nothing, found {caught_up!r}")
        stopped = request.query.getall("stopped", [])
        if stopped not in ([], ["true"]):
            raise ProtocolError(f"stopped: expected true or nothing, found {stopped!r}")
        reply = self.supervisor.heartbeat(
            validate_container_id(values[0]), bool(caught_up), bool(stopped)
        )
        self.metrics.heartbeats.labels(str(reply.alive).lower()).inc()
        if not reply.alive:
            self.metrics.expired_heartbeats.inc()
        return web.json_response(reply.to_json())

    async def _register(self, request: web.Request) -> web.Response:
        registration = Registration.from_json(await self._json_body(request))
        return web.json_response(self.supervisor.register(registration).to_json())

    async def _progress(self, request: web.Request) -> web.Response:
        report = ProgressReport.from_json(await self._json_body(request))
        return web.json_response(self.supervisor.progress(report).to_json())

    async def _failure(self, request: web.Request) -> web.Response:
        report = FailureReport.from_json(await self._json_body(request))
        reply = self.supervisor.report_failure(report.container_id, report.error)
        return web.json_response(reply.to_json())

    async def _scale(self, request: web.Request) -> web.Response:
        body = await self._json_body(request)
        shapes = ({"containers"}, {"elasticityFactor"}, {"cancel"})
        if (
            not isinstance(body, dict)
            or set(body) not in shapes
            or body.get("cancel", True) is not True
        ):
            raise ProtocolError(
                '/scale: expected {"containers": N}, {"elasticityFactor": F} or {"cancel": true}'
            )
        if "cancel" in body:
            summary = self.supervisor.cancel_change()
        elif "containers" in body:
            summary = self.supervisor.scale(body["containers"])
        else:
            summary = self.supervisor.change_factor(body["elasticityFactor"])
        return web.json_response(
            {"summary": summary, "jobModelVersion": self.supervisor.model.version}
        )

    async def _autoscaler(self, request: web.Request) -> web.Response:
        body = await self._json_body(request)
        if not isinstance(body, dict):
            raise ProtocolError('/autoscaler: expected a JSON object such as {"enabled": true}')
        summary = self.supervisor.configure_autoscaler(body)
        return web.json_response({"summary": summary})

    async def _job_model(self, request: web.Request) -> web.Response:
        return web.json_response(self.supervisor.model.to_json())

    async def _status(self, request: web.Request) -> web.Response:
        return web.json_response(self.supervisor.status())

    async def _metrics(self, request: web.Request) -> web.Response:
        self.metrics.refresh(self.supervisor.status())
        return web.Response(
            body=generate_latest(self.metrics.registry),
            headers={"Content-Type": CONTENT_TYPE_LATEST},
        )

    async def _page(self, request: web.Request) -> web.Response:
        return web.Response(text=render_page(self.supervisor.status()), content_type="text/html")

    # life cycle

    def _count_into_metrics(self, seen: dict[str, int]) -> None:
        """Add what the supervisor counted since the last tick to the Prometheus counters."""
        counters = {
            "failovers": self.metrics.failovers,
            "stalls": self.metrics.stalls,
            **{
                f"autoscaler_{action}": self.metrics.autoscaler_actions.labels(action)
                for action in ("scale-out", "scale-in", "split", "merge")
            },
        }
        for name, counter in counters.items():
            now = self.supervisor.counters.get(name, 0)
            if now > seen.get(name, 0):
                counter.inc(now - seen.get(name, 0))
                seen[name] = now

    async def _tick_forever(self) -> None:
        seen: dict[str, int] = {}
        loop = asyncio.get_running_loop()
        due = loop.time()
        while not self._stopping.is_set():
            try:
                # Woken late, or held by a slow tick, the loop heard no one meanwhile: the
                # heartbeats still queued must not be judged missing (Supervisor.deaf_for).
                late = loop.time() - due
                if late > DEAF_S:
                    self.supervisor.deaf_for(late)
                started = loop.time()
                self.supervisor.tick()
                held = loop.time() - started
                if held > DEAF_S:
                    self.supervisor.deaf_for(held)
                self._count_into_metrics(seen)
                self._ask_input()
            except Exception as exc:
                # A dead state machine must not go on answering heartbeats as if it were
                # alive: the coordinator stops (its containers too) and exits non-zero.
                self._fail(exc)
                return
            due = loop.time() + TICK_S
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), TICK_S)

    def _ask_input(self) -> None:
        """Start the partition check and the group commit when due, each beside the ticks.

        A broker that does not answer holds a call for its whole timeout: the
        ticks (leases, failovers, changes) go on meanwhile, and a call is not
        started again while the last one is still out.
        """
        if _idle(self._checking) and self.supervisor.partition_check_due():
            self._checking = self._beside(self._check_partitions())
        if _idle(self._committing):
            offsets = self.supervisor.group_offsets_due()
            if offsets is not None:
                self._committing = self._beside(self._show_group_offsets(offsets))

    def _beside(self, call: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """``call`` as a task beside the ticks; what it cannot handle fails the loop as a
        tick would."""
        task = asyncio.ensure_future(call)

        def done(task: asyncio.Task[None]) -> None:
            if not task.cancelled() and task.exception() is not None and self.failure is None:
                self._fail(task.exception())  # type: ignore[arg-type]

        task.add_done_callback(done)
        return task

    def _fail(self, exc: BaseException) -> None:
        """The loop failed: say why on stderr (the coordinator's log) and stop."""
        self.failure = f"{type(exc).__name__}: {exc}"
        self._failed_with = exc
        self.exit_code = 1
        print(
            f"spark-elastic coordinator: its loop failed; stopping: {self.failure}",
            file=sys.stderr,
        )
        traceback.print_exception(exc, file=sys.stderr)
        sys.stderr.flush()
        self._stopping.set()

    async def _check_partitions(self) -> None:
        watch = self.supervisor.watch
        assert watch is not None  # noqa: S101 - partition_check_due says so

        def look() -> tuple[dict[str, int], dict[str, dict[int, int]]]:
            # Off the loop: a Kafka metadata request may take its whole timeout.
            counts = dict(watch.partition_counts())
            return counts, {t: dict(watch.end_offsets(t)) for t in counts}

        health = self.supervisor.input_health
        try:
            counts, ends = await asyncio.to_thread(look)
        except Exception as exc:  # outside I/O (a broker, a disk) must never stop the ticks
            # Said once per cause, not once per check: a broker down for an hour is one
            # event, and its return another.
            health.failed(CHECK, f"check failed: {type(exc).__name__}: {exc}")
            return
        health.answered(CHECK)
        if self.supervisor.observe_partitions(counts, ends) == "growth":
            self.metrics.partition_growths.inc()

    async def _show_group_offsets(self, offsets: dict[str, dict[int, int]]) -> None:
        """Commit the job's progress to its consumer group (a view; the checkpoints rule)."""
        watch = self.supervisor.watch
        assert watch is not None  # noqa: S101 - group_offsets_due says so
        group = self.supervisor.shape.name
        health = self.supervisor.input_health
        try:
            # Off the loop: an OffsetCommit may take the client's whole timeout.
            await asyncio.to_thread(watch.commit_group_offsets, group, offsets)
        except Exception as exc:  # a view must never stop the ticks; said once per cause
            detail = f"consumer group {group!r} not updated: {type(exc).__name__}: {exc}"
            health.failed(GROUP, detail)
            return
        health.answered(GROUP)
        self.supervisor.group_offsets_shown(offsets)

    async def serve(self, ready: Callable[[], None] | None = None) -> None:
        """Serve until :meth:`request_stop` or a failure; then stop the containers and the server.

        The containers are stopped whatever ended the loop, except a store
        claimed by another coordinator (they are that one's now).
        """
        self._stopping = asyncio.Event()
        runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        ticker: asyncio.Future[None] | None = None
        try:
            await runner.setup()
            await web.SockSite(runner, self._sock).start()
            self._runner = runner
            self.supervisor.serving()
            self.supervisor.launch_pending()
            ticker = asyncio.ensure_future(self._tick_forever())
            if ready is not None:
                ready()
            await self._stopping.wait()
            await ticker
            await self._input_calls_ended()
        except Exception as exc:
            if self.failure is None:
                self._fail(exc)
            if ticker is not None:
                ticker.cancel()
        try:
            if not self._leave_running and not isinstance(self._failed_with, StoreFencedError):
                # Containers stop with the server still answering (their last reports land),
                # on this loop's thread like every other call into the supervisor.
                await self._stop_containers()
        finally:
            await runner.cleanup()
            self.supervisor.store.close()

    async def _input_calls_ended(self) -> None:
        """Stop the input's client (a call in flight ends at once) and wait for its calls."""
        close = getattr(self.supervisor.watch, "close", None)
        if close is not None:
            await asyncio.to_thread(close)
        for task in (self._checking, self._committing):
            if task is not None:
                with contextlib.suppress(Exception):
                    await task

    async def _stop_containers(self, timeout_s: float = 60.0) -> None:
        try:
            stopping = self.supervisor.stop_begin()
            deadline = time.monotonic() + timeout_s
            while self.supervisor.stop_pending(stopping) and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            self.supervisor.stop_end(stopping, failed=self.failure)
        except Exception as exc:
            # Even then, every process it launched is killed: nothing outlives its coordinator.
            self.supervisor.kill_all()
            if self.failure is None:
                self._fail(exc)

    def leave_containers_running(self) -> None:
        """When it stops, stop serving only: the containers keep running, as after a crash.

        For specs and benchmarks of a coordinator restart; a real stop always
        stops the containers.
        """
        self._leave_running = True

    def request_stop(self) -> None:
        """Ask :meth:`serve` to stop (from the loop's thread or a signal handler)."""
        self._stopping.set()

    def run_forever(self, ready: Callable[[], None] | None = None) -> int:
        """Serve on this thread until SIGINT or SIGTERM, or until its loop fails.

        Returns
        -------
        int
            The process exit code: 0, or 1 when the loop failed.
        """
        loop = asyncio.new_event_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.request_stop)
        try:
            loop.run_until_complete(self.serve(ready))
        finally:
            loop.close()
        return self.exit_code

    @contextlib.contextmanager
    def running_in_thread(self) -> Iterator[CoordinatorServer]:
        """Serve on a background thread for the body (tests and benchmarks)."""
        loop = asyncio.new_event_loop()
        started = threading.Event()
        thread = threading.Thread(
            target=lambda: loop.run_until_complete(self.serve(started.set)), daemon=True
        )
        thread.start()
        if not started.wait(30):
            raise SparkElasticError("the coordinator did not start within 30 s")
        try:
            yield self
        finally:
            loop.call_soon_threadsafe(self.request_stop)
            thread.join(120)


def _idle(task: asyncio.Task[None] | None) -> bool:
    return task is None or task.done()


def _move_section(move: dict[str, Any] | None) -> str:
    """A pending stateful move (KIP-441): its phase and each warm-up's tasks and old owners."""
    if move is None:
        return "<p>No move pending.</p>"
    e = html.escape
    rows = "".join(
        f"<tr><td>{e(w['containerId'])}</td><td>{e(w['state'])}</td>"
        f"<td>{e(', '.join(w['tasks']))}</td><td>{e(', '.join(w['from']))}</td></tr>"
        for w in move["warmups"]
    )
    return (
        f"<p>Pending move: {e(move['phase'])}. The old owners keep their tasks until every "
        "warm-up is ready.</p>"
        "<table><tr><th>warm-up</th><th>state</th><th>tasks it will take</th>"
        f"<th>from</th></tr>{rows}</table>"
    )


_LIVE = ("launching", "warm", "running")


def _job_line(status: dict[str, Any]) -> str:
    """The job's state and the change in flight, with its target: what an operator asks first."""
    e = html.escape
    state = status["jobState"]
    line = f"<p class='job {e(state['state'])}'>Job {e(state['state'])}"
    if state["state"] != "running" and state["why"]:
        line += f": {e(state['why'])}"
    lag = status["inputLag"]
    line += f". Input lag: {'unknown' if lag is None else f'{lag:,} records'}."
    enforced = status.get("recordsEnforced")
    if enforced is not None:
        # Kafka Streams' enforced-processing: placed in time without their other partitions.
        line += f" Records processed without waiting (enforced): {enforced:,}."
    line += "</p>"
    change = status["change"]
    if change is not None:
        deadline = (
            ""
            if change["deadlineS"] is None
            else f" (deadline {change['deadlineS']:.0f} s, then {change['atDeadline']})"
        )
        cancel = " It can be cancelled (job scale URL --cancel)." if change["cancellable"] else ""
        line += (
            f"<p class='change'>Change in flight: {e(change['description'])}, "
            f"{change['inPhaseS']:.0f} s in this phase{deadline}.{cancel}</p>"
        )
    return line


def _or_dash(value: object) -> str:
    return "-" if value is None else str(value)


def _age(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f} s"


def render_page(status: dict[str, Any]) -> str:
    """The status page: containers, warm-ups, tasks, leases, lag, read amplification, autoscaler,
    events.

    Parameters
    ----------
    status
        :meth:`Supervisor.status`.

    Returns
    -------
    str
        A self-contained HTML page (no scripts or external assets); it
        refreshes itself every 2 s.
    """
    e = html.escape
    rows = []
    ended: dict[str, int] = {}
    for c in status["containers"]:
        if c["state"] not in _LIVE:
            ended[c["state"]] = ended.get(c["state"], 0) + 1
            if not c.get("cause"):
                continue  # folded away: counted below the table
        lease = c["leaseLeftS"]
        lease_state = "-" if lease is None else ("valid" if lease > 0 else "expired")
        if lease is None and c.get("startupLeftS") is not None:
            lease_state = f"starting ({c['startupLeftS']:.0f} s left to register)"
        elif c.get("cause"):
            lease_state = f"failed: {c['cause']}"
        amplification = c["readAmplification"]
        rows.append(
            f"<tr class='{e(c['state'])}'><td>{e(c['containerId'])}</td><td>{e(c['state'])}</td>"
            f"<td>{c['pid'] or '-'}</td><td>{c['generation']}</td>"
            f"<td>{e(', '.join(c['tasks']))}</td><td>{_age(c['heartbeatAgeS'])}</td>"
            f"<td>{e(lease_state)}{'' if lease is None else f' ({_age(lease)})'}</td>"
            f"<td>{_or_dash(c['lastBatch'])}</td>"
            f"<td>{'-' if amplification is None else f'{amplification:.2f}'}</td></tr>"
        )
    tasks = "".join(
        f"<tr><td>{e(t['task'])}</td><td>{e(t['container'] or '-')}</td>"
        f"<td>{e(json.dumps(t['offsets']))}</td><td>{t['lag'] if t['lag'] >= 0 else '-'}</td></tr>"
        for t in status["tasks"]
    )
    events = "".join(
        f"<tr><td>{time.strftime('%H:%M:%S', time.localtime(ev['at']))}</td>"
        f"<td>{e(ev['kind'])}</td><td>{e(ev['container'])}</td><td>{e(ev['detail'])}</td></tr>"
        for ev in status["events"]
    )
    folded = ", ".join(f"{n} {state}" for state, n in sorted(ended.items()))
    lease = status["lease"]
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="2">
<title>spark-elastic: {e(status["job"])}</title>
<style>
body {{ font: 14px system-ui, sans-serif; margin: 1.5em; color: #222; }}
table {{ border-collapse: collapse; margin-bottom: 1.5em; }}
td, th {{ border: 1px solid #ccc; padding: 3px 8px; text-align: left; vertical-align: top; }}
th {{ background: #f0f0f0; }} tr.expired td, tr.retired td {{ color: #999; }}
p.job.failed, p.input.failing, p.coordinator.failing {{ color: #b00; font-weight: bold; }}
p.change {{ color: #a60; }}
tr.running td:nth-child(2) {{ color: #070; }} tr.warm td:nth-child(2) {{ color: #a60; }}
h1 {{ font-size: 20px; }} h2 {{ font-size: 16px; }}
</style></head><body>
<h1>Job {e(status["job"])}: job model {status["jobModelVersion"]},
elasticity factor {status["elasticityFactor"]}</h1>
{_job_line(status)}
<p class="coordinator{" failing" if status["coordinator"]["storeError"] else ""}">{
        e(coordinator_line(status["coordinator"]))
    }</p>
<p>Partitions: {e(json.dumps(status["partitions"]))}. Lease {lease["leaseS"]} s,
margin {lease["marginS"]} s, write budget {lease["writeBudgetS"]} s.</p>
{"" if status["partitionMonitor"]["checkEveryS"] is None else _input_line(status["input"])}
{_monitor_line(status["partitionMonitor"])}
{_autoscaler_line(status["autoscaler"])}
<h2>Containers</h2>
<table><tr><th>container</th><th>state</th><th>pid</th><th>generation</th><th>virtual tasks</th>
<th>heartbeat age</th><th>lease</th><th>last batch</th><th>read amplification</th></tr>
{"".join(rows)}</table>
<p>Ended containers (not shown unless they failed): {folded or "none"}.</p>
<h2>Warm-ups and pending moves</h2>
{_move_section(status["move"])}
<h2>Tasks</h2>
<table><tr><th>task</th><th>container</th><th>committed offsets</th><th>input lag</th></tr>
{tasks}</table>
<h2>Recent events</h2>
<table><tr><th>time</th><th>event</th><th>container</th><th>detail</th></tr>{events}</table>
</body></html>
"""
