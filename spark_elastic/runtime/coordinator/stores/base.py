"""The coordinator store's interface, and the SQL both implementations share.

:class:`Store` is what the coordinator sees: transactions, so a change of
the job model, the container rows it implies and the event that explains it
are written together or not at all; and an *epoch*, taken by
:meth:`Store.claim` and checked inside every write transaction, so a
coordinator whose store was claimed by another writes nothing more. How a
transaction begins, how the epoch is locked while it is read, and how
ownership is taken are each implementation's (:mod:`.sqlite`,
:mod:`.postgresql`); the tables and every statement on them are here,
written once in SQL both SQLite and PostgreSQL run (``?`` placeholders,
``ON CONFLICT`` upserts, columns qualified where PostgreSQL needs it).

What is *not* stored: container lease renewal times. They are
monotonic-clock readings, meaningless to another process; a coordinator
that takes a store over gives every container it knows a fresh lease
instead (see :mod:`..supervisor`).

Tables::

    meta(key, value)            job name, job spec, shape, epoch, next generation
    models(version, json, at)   every job model version, as served
    containers(id, generation, state, pid, spark_app, tasks, checkpoint,
               sources, launched_at, registered_at, ended_at)
                                (pid: the launcher's handle, a string)
    events(id, at, kind, container, detail)
    progress(container, task, batch, offsets, lag, at)
    throughput(container, batch, records_read, records_processed, at)
    enforced(container, total)  records processed without waiting (time order)

Runs in the coordinator process only, on its event-loop thread.

May import: :mod:`.records`, :mod:`spark_elastic.runtime.protocol`,
:mod:`spark_elastic.errors` and the standard library.
"""

from __future__ import annotations

import abc
import contextlib
import json
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from spark_elastic.errors import ArgumentError, StoreError, StoreFencedError
from spark_elastic.runtime.coordinator.stores.records import ContainerRecord, Event
from spark_elastic.runtime.protocol import JobModel, ProgressReport

__all__ = ["SCHEMA", "Store", "error_line"]


def error_line(error: BaseException) -> str:
    """A driver's message in one line: what failed, without libpq's framing around it
    (``connection to server at ... failed:`` before, a hint on the lines after)."""
    lines = [" ".join(line.split()) for line in str(error).splitlines() if line.strip()]
    line = lines[0] if lines else type(error).__name__
    if line.startswith("connection failed:") and "failed: " in line:
        line = line.rsplit("failed: ", 1)[1]
    return line.removeprefix("FATAL: ")


SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS models (
    version INTEGER PRIMARY KEY, json TEXT NOT NULL, at {real} NOT NULL);
CREATE TABLE IF NOT EXISTS containers (
    id TEXT PRIMARY KEY, generation INTEGER NOT NULL, state TEXT NOT NULL,
    pid TEXT, spark_app TEXT NOT NULL DEFAULT '', tasks TEXT NOT NULL,
    checkpoint TEXT NOT NULL, sources TEXT NOT NULL, launched_at {real},
    registered_at {real}, ended_at {real});
CREATE TABLE IF NOT EXISTS events (
    id {serial}, at {real} NOT NULL, kind TEXT NOT NULL,
    container TEXT NOT NULL DEFAULT '', detail TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS progress (
    container TEXT NOT NULL, task TEXT NOT NULL, batch {big} NOT NULL,
    offsets TEXT NOT NULL, lag {big} NOT NULL, at {real} NOT NULL,
    PRIMARY KEY (container, task));
CREATE TABLE IF NOT EXISTS throughput (
    container TEXT PRIMARY KEY, batch {big} NOT NULL, records_read {big} NOT NULL,
    records_processed {big} NOT NULL, total_read {big} NOT NULL,
    total_processed {big} NOT NULL, at {real} NOT NULL);
CREATE TABLE IF NOT EXISTS enforced (
    container TEXT PRIMARY KEY, total {big} NOT NULL);
CREATE TABLE IF NOT EXISTS samples (at {real} PRIMARY KEY, doc TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS spans (
    id TEXT PRIMARY KEY, started_at {real} NOT NULL, ended_at {real}, doc TEXT NOT NULL)
"""
"""The tables, with each implementation's words for an auto-numbered key (``serial``),
a double (``real``) and a 64-bit integer (``big``)."""


_COLUMNS = {"handle": "pid"}
"""Fields whose column has another name (kept, so stores written before still open)."""


class Store(abc.ABC):
    """A coordinator's store: one job's models, containers, events and progress.

    Implementations: :class:`~.sqlite.SQLiteStore` (a file, one host) and
    :class:`~.postgresql.PostgreSQLStore` (a server that coordinators on
    several hosts share, a leader and its standbys).
    """

    location: str
    """Where the store is, as messages show it (a path, or a URL without its password)."""

    _epoch: int | None = None

    # What each implementation provides.

    @abc.abstractmethod
    def _execute(self, db: Any, sql: str, params: Sequence[Any] = ()) -> Any:
        """Run one statement written with ``?`` placeholders; returns a cursor."""

    @abc.abstractmethod
    def _connection(self) -> Any:
        """The connection reads run on (outside transactions, each statement on its own)."""

    @abc.abstractmethod
    def _begin(self) -> contextlib.AbstractContextManager[Any]:
        """A write transaction: yields the connection, commits at the end, rolls back on
        an exception; at most one writer at a time."""

    @abc.abstractmethod
    def _stored_epoch(self, db: Any) -> str | None:
        """The stored epoch, read inside a write transaction and held until it ends, so a
        claim by another coordinator waits for it or it sees the claim."""

    @abc.abstractmethod
    def _driver_errors(self) -> tuple[type[BaseException], ...]:
        """The driver's exceptions, which :meth:`_translated` turns into :class:`StoreError`."""

    @abc.abstractmethod
    def claim(self, url: str) -> int:
        """Own the store for this coordinator: one coordinator per job.

        Parameters
        ----------
        url
            This coordinator's URL, shown to another coordinator that is refused.

        Returns
        -------
        int
            The new epoch; every later transaction checks it.

        Raises
        ------
        StoreOwnedError
            Another live coordinator owns the store; nothing was changed.
        """

    @abc.abstractmethod
    def owner(self) -> dict[str, Any] | None:
        """What the owning coordinator wrote of itself (url, pid, epoch, since), if any."""

    @abc.abstractmethod
    def release(self) -> None:
        """Give up the ownership :meth:`claim` took (nothing if none)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close the store and give up its ownership."""

    # Leadership: what a store whose ownership expires overrides.

    lease_s: float | None = None
    """How long a claim or renewal holds the store; None for one held until released."""

    def renew(self) -> None:
        """Extend this coordinator's hold on the store (nothing for one held until released).

        Raises
        ------
        StoreFencedError
            Another coordinator has claimed the store since.
        """
        return

    def held_for(self) -> float:
        """Seconds this coordinator surely still owns the store (infinite when held until
        released)."""
        return math.inf

    def stand_by(self, url: str) -> None:
        """Say that a standby coordinator at ``url`` waits to lead (nothing on a store only
        one host can reach: no other coordinator can wait for it)."""
        del url

    def standbys(self) -> list[dict[str, Any]]:
        """The standbys that said so within a lease: ``[{url, host, pid, since}]``."""
        return []

    def leave(self, url: str) -> None:
        """A standby at ``url`` stops waiting."""
        del url

    # Shared by both.

    @property
    def epoch(self) -> int | None:
        """The epoch this store object claimed, or None before :meth:`claim`."""
        return self._epoch

    @contextlib.contextmanager
    def _translated(self) -> Iterator[None]:
        """The driver's errors as :class:`StoreError`, naming the store."""
        try:
            yield
        except self._driver_errors() as exc:
            self._after_error()
            raise StoreError(f"the store {self.location}: {error_line(exc)}") from exc

    def _after_error(self) -> None:
        """What the driver's error leaves to do (a broken connection to drop, say)."""
        return

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        with self._translated():
            return list(self._execute(self._connection(), sql, params).fetchall())

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Any]:
        """All writes inside commit together, or none do.

        Raises
        ------
        StoreFencedError
            The store was claimed since by another coordinator (a newer epoch).
        StoreError
            The store failed (unreachable, say); nothing of the transaction was written.
        """
        with self._translated(), self._begin() as db:
            if self._epoch is not None:
                found = self._stored_epoch(db)
                if found is None or int(found) != self._epoch:
                    raise StoreFencedError(
                        f"the store {self.location} was claimed by another coordinator (epoch "
                        f"{found}, this one's {self._epoch}): this coordinator writes nothing more"
                    )
            yield db

    def _next_epoch(self, db: Any) -> int:
        """Bump the stored epoch (inside the claim's transaction)."""
        epoch = int(self._stored_epoch(db) or 0) + 1
        self.set_meta(db, "epoch", str(epoch))
        return epoch

    # meta

    def meta(self, key: str) -> str | None:
        """A stored setting, or None."""
        rows = self._rows("SELECT value FROM meta WHERE key = ?", (key,))
        return str(rows[0][0]) if rows else None

    def set_meta(self, db: Any, key: str, value: str) -> None:
        """Set a setting (inside a transaction)."""
        self._execute(
            db,
            "INSERT INTO meta (key, value) VALUES (?, ?)"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, value),
        )

    def next_generation(self, db: Any) -> int:
        """Take the next checkpoint generation number (inside a transaction)."""
        current = int(self.meta("next_generation") or "1")
        self.set_meta(db, "next_generation", str(current + 1))
        return current

    # models

    def save_model(self, db: Any, model: JobModel) -> None:
        """Store a job model version (inside a transaction)."""
        self._execute(
            db,
            "INSERT INTO models (version, json, at) VALUES (?, ?, ?)",
            (model.version, json.dumps(model.to_json()), time.time()),
        )

    def latest_model(self) -> JobModel | None:
        """The newest job model, or None for a new store."""
        rows = self._rows("SELECT json FROM models ORDER BY version DESC LIMIT 1")
        return JobModel.from_json(json.loads(rows[0][0])) if rows else None

    def model(self, version: int) -> JobModel | None:
        """A stored job model version, or None if there is no such version."""
        rows = self._rows("SELECT json FROM models WHERE version = ?", (version,))
        return JobModel.from_json(json.loads(rows[0][0])) if rows else None

    def model_versions(self) -> list[int]:
        """Every stored job model version, ascending."""
        return [int(r[0]) for r in self._rows("SELECT version FROM models ORDER BY version")]

    # containers

    def add_container(self, db: Any, record: ContainerRecord) -> None:
        """Insert a container (inside a transaction)."""
        self._execute(
            db,
            "INSERT INTO containers (id, generation, state, pid, spark_app, tasks, checkpoint,"
            " sources, launched_at, registered_at, ended_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (
                record.id,
                record.generation,
                record.state,
                record.handle,
                record.spark_app,
                json.dumps(list(record.tasks)),
                record.checkpoint,
                json.dumps(list(record.sources)),
                record.launched_at,
                record.registered_at,
                record.ended_at,
            ),
        )

    def update_container(self, db: Any, container_id: str, **fields: Any) -> None:
        """Change some of a container's columns (inside a transaction)."""
        allowed = {"state", "handle", "spark_app", "launched_at", "registered_at", "ended_at"}
        if "sources" in fields:  # set when a warm-up takes its tasks over
            fields = {**fields, "sources": json.dumps(list(fields["sources"]))}
            allowed.add("sources")
        unknown = set(fields) - allowed
        if unknown:
            raise ArgumentError.invalid("fields", f"columns among {sorted(allowed)}", unknown)
        # The handle's column is still named for the PIDs it held first.
        assignments = ", ".join(f"{_COLUMNS.get(name, name)} = ?" for name in fields)
        self._execute(
            db,
            # Column names come from the allowed set above, never from the caller.
            f"UPDATE containers SET {assignments} WHERE id = ?",
            (*fields.values(), container_id),
        )

    def containers(self) -> list[ContainerRecord]:
        """Every container ever issued, oldest generation first."""
        rows = self._rows(
            "SELECT id, generation, state, pid, spark_app, tasks, checkpoint, sources,"
            " launched_at, registered_at, ended_at FROM containers ORDER BY generation"
        )
        return [
            ContainerRecord(
                r[0],
                r[1],
                r[2],
                None if r[3] is None else str(r[3]),
                r[4],
                tuple(json.loads(r[5])),
                r[6],
                tuple(json.loads(r[7])),
                r[8],
                r[9],
                r[10],
            )
            for r in rows
        ]

    # events

    def add_event(self, db: Any, kind: str, container: str = "", detail: str = "") -> None:
        """Record an event (inside a transaction)."""
        self._execute(
            db,
            "INSERT INTO events (at, kind, container, detail) VALUES (?, ?, ?, ?)",
            (time.time(), kind, container, detail),
        )

    def event(self, kind: str, container: str = "", detail: str = "") -> None:
        """Record an event on its own."""
        with self.transaction() as db:
            self.add_event(db, kind, container, detail)

    def events(self, limit: int = 50) -> list[Event]:
        """The newest events, newest first."""
        rows = self._rows(
            "SELECT at, kind, container, detail FROM events ORDER BY id DESC LIMIT ?", (limit,)
        )
        return [Event(*row) for row in rows]

    # history (:mod:`..history`)

    def add_sample(self, db: Any, at: float, doc: Mapping[str, Any], forget_before: float) -> None:
        """Keep one sample of the job's history (inside a transaction), and forget the
        samples taken and the spans ended before ``forget_before``."""
        self._execute(db, "DELETE FROM samples WHERE at < ?", (forget_before,))
        self._execute(db, "DELETE FROM spans WHERE ended_at < ?", (forget_before,))
        self._execute(
            db,
            "INSERT INTO samples (at, doc) VALUES (?, ?) ON CONFLICT (at) DO NOTHING",
            (at, json.dumps(doc, separators=(",", ":"))),
        )

    def samples(self, since: float) -> list[dict[str, Any]]:
        """The samples taken since ``since``, oldest first."""
        rows = self._rows("SELECT doc FROM samples WHERE at >= ? ORDER BY at", (since,))
        return [json.loads(r[0]) for r in rows]

    def put_span(self, db: Any, span_id: str, started_at: float, doc: Mapping[str, Any]) -> None:
        """Keep a change's span as it begins and again as it ends (inside a transaction)."""
        self._execute(
            db,
            "INSERT INTO spans (id, started_at, ended_at, doc) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (id) DO UPDATE SET ended_at = excluded.ended_at, doc = excluded.doc",
            (span_id, started_at, doc.get("endedAt"), json.dumps(doc, separators=(",", ":"))),
        )

    def spans(self, since: float) -> list[dict[str, Any]]:
        """The spans still lasting or ended since ``since``, oldest first."""
        rows = self._rows(
            "SELECT doc FROM spans WHERE ended_at IS NULL OR ended_at >= ? ORDER BY started_at, id",
            (since,),
        )
        return [json.loads(r[0]) for r in rows]

    # progress

    def save_progress(self, report: ProgressReport) -> None:
        """Keep a container's latest per-task positions and its read/processed counts."""
        now = time.time()
        with self.transaction() as db:
            for task in report.tasks:
                offsets = {t: {str(p): o for p, o in ps.items()} for t, ps in task.offsets.items()}
                self._execute(
                    db,
                    "INSERT INTO progress (container, task, batch, offsets, lag, at)"
                    " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (container, task) DO UPDATE SET"
                    " batch = excluded.batch, offsets = excluded.offsets, lag = excluded.lag,"
                    " at = excluded.at",
                    (
                        report.container_id,
                        task.task,
                        report.batch_id,
                        json.dumps(offsets),
                        task.lag,
                        now,
                    ),
                )
            self._execute(
                db,
                "INSERT INTO throughput (container, batch, records_read, records_processed,"
                " total_read, total_processed, at) VALUES (?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (container) DO UPDATE SET batch = excluded.batch,"
                " records_read = excluded.records_read,"
                " records_processed = excluded.records_processed,"
                " total_read = throughput.total_read + excluded.records_read,"
                " total_processed = throughput.total_processed + excluded.records_processed,"
                " at = excluded.at",
                (
                    report.container_id,
                    report.batch_id,
                    report.records_read,
                    report.records_processed,
                    report.records_read,
                    report.records_processed,
                    now,
                ),
            )
            if report.records_enforced:
                self._execute(
                    db,
                    "INSERT INTO enforced (container, total) VALUES (?, ?)"
                    " ON CONFLICT (container) DO UPDATE SET"
                    " total = enforced.total + excluded.total",
                    (report.container_id, report.records_enforced),
                )

    def progress(self) -> dict[str, dict[str, Any]]:
        """``{task: {container, batch, offsets, lag, at}}``: each task's latest report."""
        rows = self._rows(
            "SELECT container, task, batch, offsets, lag, at FROM progress ORDER BY at"
        )
        return {
            r[1]: {
                "container": r[0],
                "batch": r[2],
                "offsets": json.loads(r[3]),
                "lag": r[4],
                "at": r[5],
            }
            for r in rows
        }

    def throughput(self) -> dict[str, Mapping[str, int]]:
        """``{container: {batch, totalRead, totalProcessed}}`` from progress reports."""
        rows = self._rows("SELECT container, batch, total_read, total_processed FROM throughput")
        return {r[0]: {"batch": r[1], "totalRead": r[2], "totalProcessed": r[3]} for r in rows}

    def enforced(self) -> dict[str, int]:
        """``{container: records its tasks processed without waiting}``, of every container
        that reported any (ended ones too: the job's total is their sum)."""
        return {r[0]: int(r[1]) for r in self._rows("SELECT container, total FROM enforced")}
