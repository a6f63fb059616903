"""The container's side of the coordinator's HTTP API, and the heartbeat loop.

:class:`CoordinatorClient` makes the calls (stdlib ``urllib``, one at a
time); :func:`first_line` puts an error in the one line the coordinator
shows; ``_Heartbeats`` is Samza's heartbeat loop on a thread, renewing the
container's lease with each reply.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from spark_elastic.errors import ProtocolError
from spark_elastic.runtime.container.console import _log
from spark_elastic.runtime.container.settings import ContainerSettings
from spark_elastic.runtime.lease import ContainerLease, gives_up
from spark_elastic.runtime.protocol import (
    FailureReport,
    HeartbeatReply,
    JobModel,
    ProgressReport,
    Registration,
)

__all__ = ["CoordinatorClient", "first_line"]


_RAISED = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)): (.+)$")
"""A traceback's line naming what was raised: ``package.module.SinkError: message``."""


def _leader_named(error: urllib.error.HTTPError) -> str | None:
    """The leader a standby coordinator's 409 names, or None for any other refusal."""
    if error.code != 409:
        return None
    try:
        leader = json.loads(error.read()).get("leader")
    except (ValueError, AttributeError, OSError):
        return None
    return leader.rstrip("/") if isinstance(leader, str) and leader.startswith("http") else None


def first_line(error: BaseException | str) -> str:
    """An error in one line, as the coordinator shows it: ``Type: first line of message``.

    Parameters
    ----------
    error
        An exception, or a line already.

    Returns
    -------
    str
        At most :attr:`FailureReport.MAX_ERROR` characters.
    """
    if isinstance(error, str):
        text = error
    else:
        # Spark appends the query's state and plan after what failed.
        message = str(error).split("=== Streaming Query ===")[0]
        lines = [line.strip() for line in message.splitlines() if line.strip()]
        head = lines[0] if lines else ""
        if "Traceback (most recent call last)" in message:
            # A query that died in Python code of its own (foreachBatch: the sink) carries
            # that code's traceback; its first line says only that. What the Python code
            # raised, outermost last, is the cause.
            raised = [m for line in lines if (m := _RAISED.match(line))]
            if raised:
                head = f"{raised[-1].group(1).rsplit('.', 1)[-1]}: {raised[-1].group(2)}"
        text = f"{type(error).__name__}: {head}".rstrip(": ")
    text = " ".join(text.split()) or "unknown error"
    return text[: FailureReport.MAX_ERROR]


class CoordinatorClient:
    """The container's side of the coordinator's HTTP API (stdlib ``urllib``; one call at a time).

    Parameters
    ----------
    url
        The coordinator's base URL.
    token
        Bearer token, if the coordinator requires one.
    timeout_s
        Per-request timeout.
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout_s: float = 5.0,
        others: tuple[str, ...] = (),
    ) -> None:
        self._url = url.rstrip("/")
        self._token = token
        self._timeout = timeout_s
        self._candidates = tuple(dict.fromkeys([self._url, *(u.rstrip("/") for u in others)]))

    @property
    def url(self) -> str:
        """The coordinator this client talks to now (the leader, as far as it knows)."""
        return self._url

    def _call(self, path: str, body: Mapping[str, Any] | None = None) -> Any:
        """One call to the leader: a standby's 409 names it, and a coordinator that does not
        answer gives way to the next candidate (each tried once per call)."""
        data = None if body is None else json.dumps(body).encode()
        first = self._url
        order = [first, *(u for u in self._candidates if u != first)]
        failure: BaseException = ProtocolError("no coordinator URL to call")
        for url in order:
            try:
                return self._call_at(url, path, data)
            except urllib.error.HTTPError as exc:
                leader = _leader_named(exc)
                if leader is None:
                    raise
                if leader != url:
                    return self._call_at(leader, path, data)
                failure = exc  # a standby that names itself: it is taking over; try on
            except OSError as exc:  # refused, unreachable, timed out: the next candidate
                failure = exc
                if len(order) == 1:
                    raise
        raise failure

    def _call_at(self, url: str, path: str, data: bytes | None) -> Any:
        request = urllib.request.Request(url + path, data=data)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self._token:
            request.add_header("Authorization", f"Bearer {self._token}")
        with urllib.request.urlopen(request, timeout=self._timeout) as response:
            answer = json.loads(response.read())
        if url != self._url:
            _log(f"the job's coordinator is now {url} (was {self._url})")
            self._url = url
        return answer

    def heartbeat(
        self, container_id: str, caught_up: bool = False, stopped: bool = False
    ) -> HeartbeatReply:
        """``GET /containerHeartbeat?executionContainerId=ID``.

        Parameters
        ----------
        container_id
            This container's id.
        caught_up
            A warm-up whose old owners are stopping says it has caught up
            with them (``&caughtUp=true``).
        stopped
            A container asked to stop says its query has stopped: it writes
            nothing any more, though its process is still on its way out
            (``&stopped=true``).

        Returns
        -------
        HeartbeatReply
            Whether the coordinator considers the container alive, and its lease.
        """
        params = {"executionContainerId": container_id}
        if caught_up:
            params["caughtUp"] = "true"
        if stopped:
            params["stopped"] = "true"
        query = urllib.parse.urlencode(params)
        return HeartbeatReply.from_json(self._call(f"/containerHeartbeat?{query}"))

    def register(self, registration: Registration) -> HeartbeatReply:
        """``POST /containers/register``.

        Parameters
        ----------
        registration
            This container's id and process.

        Returns
        -------
        HeartbeatReply
            The first lease, or ``alive: false`` for an id the coordinator did not issue.
        """
        return HeartbeatReply.from_json(self._call("/containers/register", registration.to_json()))

    def progress(self, report: ProgressReport) -> HeartbeatReply:
        """``POST /containers/progress``.

        Parameters
        ----------
        report
            The last committed batch and per-task positions.

        Returns
        -------
        HeartbeatReply
            As for a heartbeat (a report renews the lease too).
        """
        return HeartbeatReply.from_json(self._call("/containers/progress", report.to_json()))

    def report_failure(self, container_id: str, error: BaseException | str) -> None:
        """``POST /containers/failure``: why this container fails, before it exits.

        Best effort: a coordinator out of reach learns of it from the lease.

        Parameters
        ----------
        container_id
            This container's id.
        error
            The exception (its type and first line are sent) or a line.
        """
        report = FailureReport(container_id, first_line(error))
        with contextlib.suppress(OSError, ValueError, ProtocolError):
            self._call("/containers/failure", report.to_json())

    def job_model(self) -> JobModel:
        """``GET /jobModel``.

        Returns
        -------
        JobModel
            The current job model.
        """
        return JobModel.from_json(self._call("/jobModel"))


class _Heartbeats(threading.Thread):
    """Samza's heartbeat loop, plus lease renewal: runs until told to stop or the container dies.

    The container's one heartbeat loop, from its registration (before it, the
    coordinator bounds a container's start-up from its launch, and a warm-up's
    readiness by its change's deadline, whatever it sends). A warm-up says
    through it that it has caught up (:meth:`say_caught_up`).
    """

    def __init__(
        self,
        client: CoordinatorClient,
        settings: ContainerSettings,
        lease: ContainerLease,
        on_dead: threading.Event,
    ) -> None:
        super().__init__(name="spark-elastic-heartbeat", daemon=True)
        self._client = client
        self._settings = settings
        self._lease = lease
        self._dead = on_dead
        self.stopping = threading.Event()
        self.model_version = 0
        self.lease_s = 0.0
        self._caught_up = False
        self._wake = threading.Event()

    def say_caught_up(self) -> None:
        """Say in this beat and every later one that this warm-up has caught up with its
        stopping old owners (the handover's first phase); beats at once."""
        if not self._caught_up:
            self._caught_up = True
            self._wake.set()

    def stop(self) -> None:
        """End the loop (it sends no more beats once its call in flight returns)."""
        self.stopping.set()
        self._wake.set()

    def _pause(self, seconds: float) -> None:
        self._wake.wait(seconds)
        self._wake.clear()

    def run(self) -> None:
        failures = 0
        while not self.stopping.is_set():
            sent = time.monotonic()
            try:
                reply = self._client.heartbeat(
                    self._settings.container_id, caught_up=self._caught_up
                )
            except (OSError, ValueError, ProtocolError) as exc:
                failures += 1
                # Samza gives up after its retries; we also wait a while past the lease's end,
                # so a coordinator restart of up to RESTART_TOLERANCE_S stops nothing.
                if gives_up(
                    failures,
                    self._settings.heartbeat_retries,
                    self._lease.remaining(),
                    self.lease_s,
                ):
                    _log(f"coordinator unreachable after {failures} heartbeats ({exc}); stopping")
                    self._dead.set()
                    return
                # Backoff, capped at the interval: the lease keeps running meanwhile.
                self._pause(min(self._settings.heartbeat_s, 0.1 * 2**failures))
                continue
            failures = 0
            if not reply.alive:
                _log("the coordinator says this container is no longer valid; stopping")
                self._lease.revoke()
                self._dead.set()
                return
            self._lease.renew(sent, reply.lease_ms)
            self.lease_s = reply.lease_ms / 1000
            self.model_version = max(self.model_version, reply.job_model_version)
            self._pause(self._settings.heartbeat_s)
