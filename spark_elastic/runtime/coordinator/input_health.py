"""Whether the job's input answers the coordinator: an outage as what it is, whatever else runs.

The coordinator asks its input two things on its own cadence: the partition
check (counts and end offsets, every ``partition_check_s``, during a change
too) and the consumer group commit (every few seconds while progress moves).
Each call's outcome goes to :class:`InputHealth`, which says once when a call
starts failing and once when it answers again (events on the status page), and
what is failing since when (the status page, ``job status``, ``/metrics``).

May import: the standard library only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["CHECK", "GROUP", "InputHealth"]

CHECK = "partitions"
"""The partition check's call (counts and end offsets); also its events' kind."""
GROUP = "group"
"""The consumer group commit's call; also its events' kind."""


class InputHealth:
    """The outcome of the coordinator's last calls to its input, and since when they fail.

    Runs in the coordinator, on its loop's thread, once per call.

    Parameters
    ----------
    event
        Records an event ``(kind, detail)`` where the operator looks.
    now
        Wall-clock seconds (what the status page shows).
    """

    def __init__(self, event: Callable[[str, str], None], now: Callable[[], float] = time.time):
        self._event = event
        self._now = now
        self._failing: dict[str, str] = {}
        self._since: dict[str, float] = {}  # each failing call's first failure
        self._last_answer: float | None = None

    @property
    def answering(self) -> bool:
        """Whether no call is failing now."""
        return not self._failing

    def failed(self, call: str, detail: str) -> None:
        """``call`` failed with ``detail`` (one line): said once per call and cause."""
        self._since.setdefault(call, self._now())
        if self._failing.get(call) != detail:
            self._event(call, detail)
        self._failing[call] = detail

    def answered(self, call: str) -> None:
        """``call`` answered: said once if it was failing."""
        self._last_answer = self._now()
        if self._failing.pop(call, None) is None:
            return
        since = self._since.pop(call)
        back = (
            "the input answers again"
            if call == CHECK
            else "the consumer group takes the job's progress again"
        )
        self._event(call, f"{back} ({self._last_answer - since:.0f} s after its first failure)")

    @property
    def _failing_since(self) -> float | None:
        """When the oldest failure under way began (wall-clock seconds), or None."""
        return min(self._since.values(), default=None)

    def status(self, client: Any = None) -> dict[str, Any]:
        """What ``/status.json`` shows of the input.

        Parameters
        ----------
        client
            The coordinator's view of the input; if it runs the calls in a child
            process (:class:`.input_process.InputProcess`), its restarts show too.

        Returns
        -------
        dict
            ``state`` (``answering``, ``failing``, or ``unknown`` before any
            call), ``failingSince`` and ``lastAnswerAt`` (wall-clock seconds
            or None), ``failingForS``, ``failing`` (``{call: its last
            failure}``), ``clientRestarts`` and ``clientLastDeath``.
        """
        now = self._now()
        if self._failing:
            state = "failing"
        elif self._last_answer is None:
            state = "unknown"
        else:
            state = "answering"
        return {
            "state": state,
            "failingSince": self._failing_since,
            "failingForS": None
            if self._failing_since is None
            else round(now - self._failing_since, 1),
            "failing": dict(self._failing),
            "lastAnswerAt": self._last_answer,
            "clientRestarts": getattr(client, "restarts", 0),
            "clientLastDeath": getattr(client, "last_death", ""),
        }
