"""The job's input, asked from a child process that the coordinator restarts when it dies.

A Kafka input's calls (partition counts, end offsets, consumer group
commits) go through librdkafka, a C library: an assertion inside it aborts
the whole process, and no Python ``try`` catches that (librdkafka 2.16 does so
for requests to a group's coordinator when the broker restarts under them).
The coordinator therefore never loads the client itself: :class:`InputProcess`
runs the input's calls in a child Python process (``python -m`` this module)
that keeps one client per purpose for as long as it lives. Each call has a
deadline; a call past it, or a child that died, ends in an
:class:`~spark_elastic.errors.InputError` naming why, and the next call starts
a new child, after a backoff that grows while children keep dying. The child
exits when the coordinator closes its end of the pipe, also when the
coordinator itself was killed.

The wire is length-prefixed pickles on the child's stdin and stdout (two
processes of the same installation, one trusting the other); the child's
stderr is the coordinator's, so what librdkafka prints as it aborts lands in
the coordinator's log.

May import: :mod:`spark_elastic.errors` and the standard library; the input
itself is unpickled in the child (:mod:`spark_elastic.runtime.inputs`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any, BinaryIO

from spark_elastic.errors import InputError

__all__ = ["InputProcess"]

_HEADER = struct.Struct(">I")
_FIRST_BACKOFF_S = 1.0
_MAX_BACKOFF_S = 30.0
_START_S = 30.0  # the child's own start (a Python and librdkafka import) before any call


class InputProcess:
    """A job input whose calls run in a child process (see the module's docstring).

    Runs in the coordinator, called from worker threads off its loop (one
    call at a time: a lock orders them). The input must be picklable.

    Parameters
    ----------
    job_input
        The job's input (:class:`~spark_elastic.runtime.inputs.KafkaInput`).
    call_s
        Each call's deadline, in seconds; by default the input's own
        ``timeout_s`` once per topic and once more, plus 10 s (its own
        timeouts end a call first; this one bounds a child that hangs).

    Attributes
    ----------
    restarts
        Children started after the first (each after one died or hung).
    last_death
        Why the last child ended before it was closed ("" if none did).
    """

    def __init__(self, job_input: Any, call_s: float | None = None) -> None:
        self.input = job_input
        topics = len(getattr(job_input, "topics", ()))
        timeout_s = float(getattr(job_input, "timeout_s", 10.0))
        self.call_s = call_s if call_s is not None else timeout_s * (topics + 1) + 10.0
        self.restarts = 0
        self.last_death = ""
        self._lock = threading.Lock()
        self._child: subprocess.Popen[bytes] | None = None
        self._started = 0
        self._backoff_s = 0.0
        self._restart_at = 0.0
        self._closed = False

    @property
    def group_view(self) -> bool:
        """Whether the input shows progress as a consumer group (Kafka: yes)."""
        return hasattr(self.input, "commit_group_offsets")

    @property
    def pid(self) -> int | None:
        """The running child's pid, or None."""
        child = self._child
        return child.pid if child is not None and child.poll() is None else None

    def partition_counts(self) -> dict[str, int]:
        """``{topic: partitions}`` now (:meth:`KafkaInput.partition_counts`, in the child)."""
        return dict(self.call("partition_counts"))

    def end_offsets(self, topic: str) -> dict[int, int]:
        """``{partition: end offset}`` of ``topic`` now, in the child."""
        return dict(self.call("end_offsets", topic))

    def commit_group_offsets(self, group: str, offsets: Mapping[str, Mapping[int, int]]) -> None:
        """Commit the job's progress as consumer group ``group``'s offsets, in the child."""
        self.call("commit_group_offsets", group, {t: dict(ps) for t, ps in offsets.items()})

    def call(self, method: str, *args: Any) -> Any:
        """Run ``job_input.<method>(*args)`` in the child and return what it returned.

        Raises
        ------
        InputError
            The input's own failure (its line), or the child died, hung past
            :attr:`call_s`, or waits out its restart backoff.
        """
        with self._lock:
            if self._closed:
                raise InputError("the input's client process is closed: the coordinator stops")
            child = self._running_child()
            deadline = time.monotonic() + self.call_s
            try:
                requests, replies = _pipes(child)
                _write(requests, pickle.dumps((method, args)))
                ok, value = pickle.loads(_read(replies, deadline))
            except TimeoutError:
                self._lost(child, f"no answer to {method} within {self.call_s:g} s")
                raise InputError(
                    f"the input's client process gave no answer to {method} within "
                    f"{self.call_s:g} s; it was stopped and a new one starts on the next call"
                ) from None
            except (OSError, EOFError, pickle.UnpicklingError):
                self._lost(child, "")
                raise InputError(
                    f"the input's client process died during {method} ({self.last_death}); "
                    f"a new one starts in {self._backoff_s:g} s"
                ) from None
            self._backoff_s = 0.0
            if not ok:
                kind, line = value
                raise InputError(line if kind == "InputError" else f"{kind}: {line}")
            return value

    def close(self) -> None:
        """Stop the child at once, also during a call (which then fails); no call after."""
        self._closed = True
        child = self._child
        if child is not None and child.poll() is None:
            child.kill()  # a call in flight holds the lock: it sees the pipe close and ends
        with self._lock:
            child, self._child = self._child, None
        if child is not None:
            _stop(child, kill=True)

    def _running_child(self) -> subprocess.Popen[bytes]:
        child = self._child
        if child is not None and child.poll() is None:
            return child
        if child is not None:
            self._lost(child, "")
        left = self._restart_at - time.monotonic()
        if left > 0:
            raise InputError(
                f"the input's client process died ({self.last_death}); a new one starts in "
                f"{left:.0f} s"
            )
        child = subprocess.Popen(
            [sys.executable, "-m", __name__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
        )
        try:
            requests, replies = _pipes(child)
            _write(requests, pickle.dumps(self.input))
            _read(replies, time.monotonic() + _START_S)  # its "ready"
        except (OSError, EOFError, TimeoutError):
            self._lost(child, "")
            raise InputError(
                f"the input's client process did not start ({self.last_death})"
            ) from None
        if self._started:
            self.restarts += 1
        self._started += 1
        self._child = child
        return child

    def _lost(self, child: subprocess.Popen[bytes], why: str) -> None:
        """``child`` died or hung: stop it, say why, and back off before the next one."""
        _stop(child, kill=bool(why))
        self.last_death = why or _exit_text(child.returncode)
        if self._child is child:
            self._child = None
        self._backoff_s = min(max(self._backoff_s * 2, _FIRST_BACKOFF_S), _MAX_BACKOFF_S)
        self._restart_at = time.monotonic() + self._backoff_s


def _pipes(child: subprocess.Popen[bytes]) -> tuple[BinaryIO, BinaryIO]:
    """The child's stdin and stdout (always there: it is started with both piped)."""
    if child.stdin is None or child.stdout is None:
        raise OSError("the input's client process has no pipes")
    return child.stdin, child.stdout  # type: ignore[return-value]


def _exit_text(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exit code {code}"


def _stop(child: subprocess.Popen[bytes], kill: bool = False) -> None:
    """Close its pipes (it exits on the EOF) and reap it; SIGKILL if told to or it lingers."""
    if kill and child.poll() is None:
        child.kill()
    for pipe in (child.stdin, child.stdout):
        with contextlib.suppress(OSError):
            if pipe is not None:
                pipe.close()
    try:
        child.wait(timeout=2)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def _write(pipe: BinaryIO, body: bytes) -> None:
    pipe.write(_HEADER.pack(len(body)) + body)
    pipe.flush()


def _read(pipe: BinaryIO, deadline: float | None) -> bytes:
    """One frame from ``pipe``, read from its descriptor so that the deadline (monotonic;
    None: none) holds."""
    fd = pipe.fileno()

    def exactly(count: int) -> bytes:
        chunks, got = [], 0
        while got < count:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([fd], [], [], left)[0]:
                    raise TimeoutError
            chunk = os.read(fd, count - got)
            if not chunk:
                raise EOFError
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    (size,) = _HEADER.unpack(exactly(_HEADER.size))
    return exactly(size)


def _serve(requests: BinaryIO, replies: BinaryIO) -> None:
    """The child's loop: the input, then one call per frame, until the pipe closes."""
    job_input = pickle.loads(_read(requests, None))
    _write(replies, pickle.dumps("ready"))
    while True:
        try:
            method, args = pickle.loads(_read(requests, None))
        except EOFError:
            return  # the coordinator closed its end, or died
        try:
            reply: tuple[bool, Any] = (True, getattr(job_input, method)(*args))
        except Exception as exc:  # sent back: the coordinator says it where operators look
            reply = (False, (type(exc).__name__, str(exc)))
        _write(replies, pickle.dumps(reply))


if __name__ == "__main__":
    # Ctrl-C at the coordinator's terminal reaches the whole group: the coordinator decides.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # librdkafka says each refused connection (several a second while a broker is away);
    # the calls' own failures reach the coordinator, which says them once, where operators
    # look.
    logging.getLogger("spark_elastic.kafka").setLevel(logging.CRITICAL)
    # Nothing the input prints may land in the replies.
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    _serve(sys.stdin.buffer, replies)
