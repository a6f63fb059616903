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
``GET /`` (status page; ``?fragment=1``: its live parts as JSON), ``GET /status.json``,
``GET /history.json?window=S`` (the last 300 or 1800 s of rates, lag, batch times and
changes: :mod:`.history`), ``GET /metrics`` (Prometheus text: :mod:`.metrics`),
``GET /static/NAME`` (the page's script and its vendored chart library).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import generate_latest
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
from spark_elastic.runtime.coordinator.history import WINDOWS_S
from spark_elastic.runtime.coordinator.input_health import CHECK, GROUP
from spark_elastic.runtime.coordinator.metrics import Metrics
from spark_elastic.runtime.coordinator.page import render_fragment, render_page
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
_VIEWS = frozenset({"/", "/status.json", "/metrics", "/history.json"})
STATIC = Path(__file__).with_name("static")
_STATIC_TYPES = {".js": "text/javascript", ".css": "text/css", ".txt": "text/plain"}


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


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


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
    url
        The URL containers and peers reach it at (default: the socket's
        address): a pod's address or a Service's name on Kubernetes, where
        it listens on ``0.0.0.0``.
    """

    def __init__(
        self,
        make_supervisor: Callable[[str], Supervisor],
        sock: socket.socket,
        token: str | None = None,
        url: str | None = None,
    ) -> None:
        host, port = sock.getsockname()[:2]
        if not is_loopback(host) and not token:
            raise ArgumentError.invalid(
                "--token", f"a shared token when binding {host} (not a loopback address)", None
            )
        self.host = host
        self.port = port
        self.url = url or url_of(sock)
        self._sock = sock
        self._token = token
        self.supervisor = make_supervisor(self.url)
        self.metrics = Metrics()
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
        app.router.add_get("/history.json", self._history)
        app.router.add_get("/static/{name}", self._static)
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
        self.metrics.refresh(self.supervisor.status(), self.supervisor.history)
        return web.Response(
            body=generate_latest(self.metrics.registry),
            headers={"Content-Type": CONTENT_TYPE_LATEST},
        )

    async def _page(self, request: web.Request) -> web.Response:
        status = self.supervisor.status()
        if request.query.get("fragment"):
            return web.json_response(render_fragment(status))
        return web.Response(text=render_page(status), content_type="text/html")

    async def _history(self, request: web.Request) -> web.Response:
        text = request.query.get("window", str(WINDOWS_S[0]))
        if not text.isdigit() or int(text) not in WINDOWS_S:
            raise ArgumentError.invalid("window", f"one of {list(WINDOWS_S)} (seconds)", text)
        return web.json_response(self.supervisor.history.read(int(text)))

    async def _static(self, request: web.Request) -> web.StreamResponse:
        # Only the files shipped beside this module: a name never walks out of it.
        name = request.match_info["name"]
        path = STATIC / name
        if "/" in name or name.startswith(".") or not path.is_file():
            return _error(404, f"no static file {name!r}")
        return web.Response(
            body=path.read_bytes(),
            content_type=_STATIC_TYPES.get(path.suffix, "application/octet-stream"),
            headers={"Cache-Control": "max-age=3600"},
        )

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
