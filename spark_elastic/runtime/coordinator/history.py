"""The job's recent history: rates, lag and batch times sampled, and each change as a span.

What the status page charts and ``job status --history`` prints. The
coordinator samples every :data:`SAMPLE_S` what its store already counts
(each container's records read and processed since it started, each task's
committed offsets and lag) plus the longest micro-batch each container
reported since the last sample, and keeps :data:`KEEP_S` of samples. A
sample keeps counts, not rates, so a sample missed (a stalled loop) or a
coordinator restart costs resolution, never a wrong figure: rates are
derived when the history is read, between neighbouring samples, and a gap
longer than :data:`GAP_S` shows as a gap.

A *span* is one change from its start to its end with its outcome: a scale,
a factor change or a growth (with its warm-up phases as spans of their own),
a failover (until the successor registers), a stop (until the job resumes).
Samples and spans are written to the store as they are taken (one small row
each), so a restarted coordinator, or a standby taking over, shows what its
predecessor saw; memory stays bounded by :data:`KEEP_S` either way.

:func:`series` is pure: it turns samples and spans into the columns a chart
draws (uPlot's data layout: one x array, then one y array per line, ``None``
for a gap).

May import: :mod:`.stores` and the standard library.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from spark_elastic.runtime.coordinator.stores import Store

__all__ = [
    "GAP_S",
    "KEEP_S",
    "KINDS",
    "RESULTS",
    "SAMPLE_S",
    "WINDOWS_S",
    "History",
    "Sample",
    "Span",
    "series",
]

SAMPLE_S = 2.0
"""How often the coordinator samples (the page polls as often)."""
KEEP_S = 1800.0
"""How far back the history goes (the page's longest window)."""
WINDOWS_S = (300, 1800)
"""The windows the page and ``job status --history`` offer."""
GAP_S = 3 * SAMPLE_S
"""Neighbouring samples further apart than this have no rate between them (a gap)."""
KINDS = ("scale", "factor", "growth", "warm-up", "failover", "stop")
"""What a span can be: a change (:data:`.changes.KINDS`), a group's warm-ups, a failover,
a stop."""
RESULTS = (
    "done",
    "rolled back",
    "ready",
    "started again",
    "registered",
    "replaced",
    "resumed",
    "job failed",
    "job stopped",
    "cut short",
)
"""How a span can end: a change done or rolled back; warm-ups ready, started again (a
failover or a resume), or ended with their change; a failover's successor registered,
replaced in turn, or ended before it registered (cut short; a warm-up rolled back with its
move); a stop resumed; anything cut short by the job failing or stopping."""
MAX_POINTS = 300
"""A chart's most points: a longer window is thinned (every second, third ... sample), so
the 30-minute window costs the coordinator and the page what the 5-minute one does."""
TOP_TASKS = 8
"""The tasks whose lag the job's chart draws one by one (the largest now); the rest are
in the total and each on its own chart."""


@dataclass(frozen=True)
class Sample:
    """What the store counted at one moment.

    Attributes
    ----------
    at
        Wall-clock seconds.
    read, processed
        Per container that may still commit (live, or retiring with its last
        batch), the records it read and processed since it started (the
        store's running totals).
    batch_ms
        Per container, its longest micro-batch reported since the sample
        before (only containers that reported one).
    lag
        Per task, the unread records of its partitions (-1: unknown).
    committed
        Per task, its committed offsets summed over its partitions.
    input_lag
        The job's input lag (unread partitions included), or None when unknown.
    """

    at: float
    read: Mapping[str, int] = field(default_factory=dict)
    processed: Mapping[str, int] = field(default_factory=dict)
    batch_ms: Mapping[str, int] = field(default_factory=dict)
    lag: Mapping[str, int] = field(default_factory=dict)
    committed: Mapping[str, int] = field(default_factory=dict)
    input_lag: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The stored form."""
        return {
            "at": self.at,
            "read": dict(self.read),
            "processed": dict(self.processed),
            "batchMs": dict(self.batch_ms),
            "lag": dict(self.lag),
            "committed": dict(self.committed),
            "inputLag": self.input_lag,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Sample:
        """Read the stored form back."""
        return cls(
            float(doc["at"]),
            dict(doc["read"]),
            dict(doc["processed"]),
            dict(doc["batchMs"]),
            dict(doc["lag"]),
            dict(doc["committed"]),
            doc["inputLag"],
        )


@dataclass(frozen=True)
class Span:
    """One change to the job, from its start to its end.

    Attributes
    ----------
    id
        Unique and stable (a restarted coordinator ends the span its predecessor began).
    kind
        ``scale``, ``factor``, ``growth``, ``warm-up``, ``failover`` or ``stop``.
    label
        What it does, in words.
    started_at, ended_at
        Wall-clock seconds; ``ended_at`` is None while it lasts.
    result
        How it ended, in a word or two (one of :data:`RESULTS`); empty while it lasts.
    outcome
        How it ended, in words (``rolled back: its warm-ups were not ready
        within 600 s``); empty while it lasts.
    """

    id: str
    kind: str
    label: str
    started_at: float
    ended_at: float | None = None
    result: str = ""
    outcome: str = ""

    def to_json(self) -> dict[str, Any]:
        """The stored and served form."""
        return {
            "id": self.id,
            "kind": self.kind,
            "label": self.label,
            "startedAt": self.started_at,
            "endedAt": self.ended_at,
            "result": self.result,
            "outcome": self.outcome,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Span:
        """Read the stored form back."""
        return cls(
            doc["id"],
            doc["kind"],
            doc["label"],
            doc["startedAt"],
            doc["endedAt"],
            doc["result"],
            doc["outcome"],
        )


class History:
    """The samples and spans of the last :data:`KEEP_S`, kept in memory and in the store.

    Runs on the coordinator's event-loop thread, as the supervisor does.

    Parameters
    ----------
    store
        Where samples and spans are written, and read back at start.
    wall
        Wall-clock time (tests pass their own).
    """

    def __init__(self, store: Store, wall: Callable[[], float] = time.time) -> None:
        self.store = store
        now = wall()
        self.samples: collections.deque[Sample] = collections.deque(
            (Sample.from_json(d) for d in store.samples(now - KEEP_S)),
            maxlen=int(KEEP_S / SAMPLE_S) + 1,
        )
        # A predecessor whose clock ran ahead of this one's (another host's): this history's
        # time goes on from its last sample, never back, so samples stay in order.
        ahead = self.samples[-1].at - now + SAMPLE_S if self.samples else 0.0
        self.wall = wall if ahead <= 0 else (lambda: wall() + ahead)
        self.spans: dict[str, Span] = {
            d["id"]: Span.from_json(d) for d in store.spans(now - KEEP_S)
        }
        self._batches: dict[str, int] = {}
        self.last_batch_ms: dict[str, int] = {}
        """Each container's last micro-batch, as it reported it."""
        self.ended: collections.Counter[tuple[str, str]] = collections.Counter()
        """Spans ended since this coordinator started, by (kind, result)."""

    # what the supervisor tells it

    def batch(self, container_id: str, duration_ms: int) -> None:
        """A container reported a micro-batch that took ``duration_ms`` (-1: not said)."""
        if duration_ms >= 0:
            self._batches[container_id] = max(self._batches.get(container_id, 0), duration_ms)
            self.last_batch_ms[container_id] = duration_ms

    def due(self) -> bool:
        """Whether a sample is due (:data:`SAMPLE_S` since the last)."""
        return not self.samples or self.wall() - self.samples[-1].at >= SAMPLE_S

    def sample(
        self,
        throughput: Mapping[str, Mapping[str, int]],
        lags: Mapping[str, int],
        offsets: Mapping[str, Mapping[str, Mapping[int, int]]],
        input_lag: int | None,
    ) -> Sample:
        """Take a sample and write it to the store.

        Parameters
        ----------
        throughput
            :meth:`Store.throughput`: the running totals of each container that
            may still commit.
        lags
            Each task's lag (-1: unknown).
        offsets
            Each task's committed offsets ``{task: {stream: {partition: offset}}}``.
        input_lag
            The job's input lag, or None.
        """
        now = self.wall()
        taken = Sample(
            now,
            {c: int(t["totalRead"]) for c, t in throughput.items()},
            {c: int(t["totalProcessed"]) for c, t in throughput.items()},
            dict(self._batches),
            dict(lags),
            {task: sum(sum(p.values()) for p in o.values()) for task, o in offsets.items()},
            input_lag,
        )
        with self.store.transaction() as db:
            self.store.add_sample(db, now, taken.to_json(), now - KEEP_S)
        self.samples.append(taken)
        self._batches.clear()
        return taken

    def begin(self, db: Any, span_id: str, kind: str, label: str) -> None:
        """A change begins (written in ``db``, the transaction that begins it); a span
        already begun under this id (a resumed change) is kept."""
        if span_id in self.spans:
            return
        if kind not in KINDS:
            raise ValueError(f"span kind: expected one of {KINDS}, found {kind!r}")
        span = Span(span_id, kind, label, self.wall())
        self.store.put_span(db, span.id, span.started_at, span.to_json())
        self.spans[span_id] = span

    def end(self, db: Any, span_id: str, result: str, outcome: str = "") -> None:
        """A change ends with ``result`` (:data:`RESULTS`), said as ``outcome`` (the
        result itself by default); no-op for a span not begun or already ended."""
        if result not in RESULTS:
            raise ValueError(f"span result: expected one of {RESULTS}, found {result!r}")
        span = self.spans.get(span_id)
        if span is None or span.ended_at is not None:
            return
        ended = replace(span, ended_at=self.wall(), result=result, outcome=outcome or result)
        self.store.put_span(db, ended.id, ended.started_at, ended.to_json())
        self.spans[span_id] = ended
        self.ended[(ended.kind, result)] += 1
        self._forget(ended.ended_at or 0.0)

    def end_all(self, db: Any, kind: str, result: str) -> None:
        """Every span of ``kind`` still lasting ends with ``result``."""
        for span in list(self.spans.values()):
            if span.kind == kind and span.ended_at is None:
                self.end(db, span.id, result)

    def open_spans(self, kind: str) -> list[Span]:
        """The spans of ``kind`` still lasting."""
        return [s for s in self.spans.values() if s.kind == kind and s.ended_at is None]

    def _forget(self, now: float) -> None:
        for span_id, span in list(self.spans.items()):
            if span.ended_at is not None and span.ended_at < now - KEEP_S:
                del self.spans[span_id]

    # what the page reads

    def read(self, window_s: float) -> dict[str, Any]:
        """The last ``window_s`` as chart columns (:func:`series`)."""
        return series(list(self.samples), list(self.spans.values()), window_s, self.wall())


def _rate(
    before: Sample | None,
    after: Sample,
    pick: Callable[[Sample], Mapping[str, int]],
    key: str,
    gap: float = GAP_S,
    from_zero: bool = True,
) -> float | None:
    """Records a second of ``key`` between two neighbouring samples, or None (a gap, or
    ``key`` not counted in ``after``, or, unless ``from_zero``, not in ``before``)."""
    now = pick(after).get(key)
    if before is None or now is None or not 0 < after.at - before.at <= gap:
        return None
    # A container's first sample counts from 0: its totals started with it. A task's
    # committed offsets did not: its first sample has no rate.
    then = pick(before).get(key, 0 if from_zero else None)
    if then is None:
        return None
    return max(now - then, 0) / (after.at - before.at)


def _total_rate(
    before: Sample | None,
    after: Sample,
    pick: Callable[[Sample], Mapping[str, int]],
    gap: float = GAP_S,
) -> float | None:
    if before is None or not 0 < after.at - before.at <= gap:
        return None
    counted = sum(pick(after).values()) - sum(
        v for k, v in pick(before).items() if k in pick(after)
    )
    return max(counted, 0) / (after.at - before.at)


def _thinned(samples: Sequence[Sample], step: int) -> list[Sample]:
    """The newest sample of each interval of ``step`` samples' time (intervals fixed in
    time, so a chart polled again keeps its points), each with the longest batches of the
    samples it stands for."""
    width = SAMPLE_S * step
    kept: list[Sample] = []
    longest: dict[str, int] = {}
    for i, sample in enumerate(samples):
        for c, ms in sample.batch_ms.items():
            longest[c] = max(longest.get(c, 0), ms)
        last = i == len(samples) - 1
        if last or samples[i + 1].at // width != sample.at // width:
            kept.append(replace(sample, batch_ms=longest))
            longest = {}
    return kept


def _lag(value: int | None) -> int | None:
    return None if value is None or value < 0 else value


def _rounded(values: Iterable[float | None]) -> list[float | None]:
    return [None if v is None else round(v, 1) for v in values]


def series(
    samples: Sequence[Sample], spans: Iterable[Span], window_s: float, now: float
) -> dict[str, Any]:
    """The last ``window_s`` of the history as the columns charts draw.

    Pure. Rates are between each sample and the one before it.

    Parameters
    ----------
    samples
        Oldest first.
    spans
        Any order.
    window_s
        How far back from ``now``.
    now
        Wall-clock seconds.

    Returns
    -------
    dict
        ``{"windowS", "now", "t": [seconds], "job": {"read", "processed",
        "lag", "batchMs"}, "containers": {id: {"read", "processed",
        "batchMs"}}, "tasks": {task: {"lag", "rate"}}, "topTasks": [task],
        "spans": [span]}``, each list as long as ``t``; ``None`` where there
        is no figure. ``job.batchMs`` is the longest batch of any container
        in each interval; ``tasks.rate`` is the records of a task's partitions
        committed per second; ``topTasks`` the tasks with most lag now. A
        window of more than :data:`MAX_POINTS` samples is thinned to at most
        that many (rates then over the longer intervals, batch times the
        longest of each).
    """
    since = now - window_s
    first = next((i for i, s in enumerate(samples) if s.at >= since), len(samples))
    shown = samples[first:]
    step = max(1, -(-len(shown) // MAX_POINTS))
    before = samples[first - 1] if first > 0 else None
    if step > 1:  # thinned: the first point has no rate (its interval began before the window)
        shown, before = _thinned(shown, step), None
    gap = GAP_S * step
    befores: list[Sample | None] = [before, *shown[:-1]]
    pairs = list(zip(befores, shown, strict=False))  # none when nothing is shown
    containers = sorted({c for s in shown for c in (*s.read, *s.batch_ms)})
    tasks = sorted({t for s in shown for t in s.lag})

    def read(s: Sample) -> Mapping[str, int]:
        return s.read

    def processed(s: Sample) -> Mapping[str, int]:
        return s.processed

    def committed(s: Sample) -> Mapping[str, int]:
        return s.committed

    last = shown[-1] if shown else None
    top = sorted(
        (t for t in tasks if last is not None and last.lag.get(t, -1) > 0),
        key=lambda t: (-(last.lag[t] if last else 0), t),
    )[:TOP_TASKS]
    return {
        "windowS": window_s,
        "now": now,
        "t": [round(s.at, 3) for s in shown],
        "job": {
            "read": _rounded(_total_rate(b, a, read, gap) for b, a in pairs),
            "processed": _rounded(_total_rate(b, a, processed, gap) for b, a in pairs),
            "lag": [
                _lag(s.input_lag)
                if s.input_lag is not None
                else (sum(s.lag.values()) if s.lag and min(s.lag.values()) >= 0 else None)
                for s in shown
            ],
            "batchMs": [max(s.batch_ms.values(), default=None) for s in shown],
        },
        "containers": {
            c: {
                "read": _rounded(_rate(b, a, read, c, gap) for b, a in pairs),
                "processed": _rounded(_rate(b, a, processed, c, gap) for b, a in pairs),
                "batchMs": [s.batch_ms.get(c) for s in shown],
            }
            for c in containers
        },
        "tasks": {
            t: {
                "lag": [_lag(s.lag.get(t)) for s in shown],
                "rate": _rounded(_rate(b, a, committed, t, gap, False) for b, a in pairs),
            }
            for t in tasks
        },
        "topTasks": top,
        "spans": [
            s.to_json()
            for s in sorted(spans, key=lambda s: (s.started_at, s.id))
            if s.ended_at is None or s.ended_at >= since
        ],
    }


def _median(values: Iterable[float | None]) -> float | None:
    known = sorted(v for v in values if v is not None)
    return known[len(known) // 2] if known else None


def summary_lines(history: Mapping[str, Any]) -> list[str]:
    """What ``job status --history`` prints of :func:`series`' document: the job's rate,
    lag and batch times over the window, then each change with its outcome.

    Pure: local times, one line each.
    """
    job = history["job"]
    minutes = f"{history['windowS'] / 60:g} min"
    if not history["t"]:
        return [f"last {minutes}: no samples yet"]
    rate = _median(job["processed"])
    peak = max((v for v in job["processed"] if v is not None), default=None)
    lags = [v for v in job["lag"] if v is not None]
    batches = [v for v in job["batchMs"] if v is not None]
    parts = [
        "records processed: "
        + ("unknown" if rate is None else f"{rate:,.0f}/s median, {peak or 0:,.0f}/s peak"),
        "input lag: " + (f"{lags[0]:,} -> {lags[-1]:,} records" if lags else "unknown"),
        "micro-batches: " + (f"up to {max(batches) / 1000:.2f} s" if batches else "none reported"),
    ]
    lines = [f"last {minutes}: " + "; ".join(parts)]

    def clock(at: float) -> str:
        return time.strftime("%H:%M:%S", time.localtime(at))

    for span in history["spans"]:
        what = f"{span['kind']} {span['label']}"
        if span["endedAt"] is None:
            lines.append(f"  {what}: under way since {clock(span['startedAt'])}")
        else:
            took = span["endedAt"] - span["startedAt"]
            lines.append(
                f"  {what}: {clock(span['startedAt'])}-{clock(span['endedAt'])} "
                f"({took:.0f} s), {span['outcome']}"
            )
    return lines
