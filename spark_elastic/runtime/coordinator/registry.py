"""The coordinator's embedded store: job model versions, containers, generations, events.

SQLite (the standard library's ``sqlite3``, WAL journal): one file, no server,
and transactions, so a change of the job model, the container rows it
implies and the event that explains it are written together or not at all.
A coordinator killed at any point restarts from the last committed
transaction.

What is *not* stored: lease renewal times. They are monotonic-clock readings,
meaningless to another process; a restarted coordinator gives every
container it knows a fresh lease instead (see :mod:`.supervisor`).

Tables::

    meta(key, value)            job name, job spec, shape, next generation
    models(version, json, at)   every job model version, as served
    containers(id, generation, state, pid, spark_app, tasks, checkpoint,
               sources, launched_at, registered_at, ended_at)
    events(id, at, kind, container, detail)
    progress(container, task, batch, offsets, lag, at)
    throughput(container, batch, records_read, records_processed, at)
    enforced(container, total)  records processed without waiting (time order)

One coordinator per store: :meth:`Store.claim` takes an exclusive
``flock`` on ``<store>.owner`` (released when the process exits, however it
exits) and bumps the store's *epoch*; every transaction then checks that the
epoch is still its own, so a coordinator whose store was claimed by another
(a lock lost on a network file system, say) writes nothing more.

Runs in the coordinator process only, on its event-loop thread.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sqlite3
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spark_elastic.errors import ArgumentError, StoreFencedError, StoreOwnedError
from spark_elastic.runtime.protocol import JobModel, ProgressReport

__all__ = ["ContainerRecord", "Event", "Store"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS models (
    version INTEGER PRIMARY KEY, json TEXT NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS containers (
    id TEXT PRIMARY KEY, generation INTEGER NOT NULL, state TEXT NOT NULL,
    pid INTEGER, spark_app TEXT NOT NULL DEFAULT '', tasks TEXT NOT NULL,
    checkpoint TEXT NOT NULL, sources TEXT NOT NULL, launched_at REAL,
    registered_at REAL, ended_at REAL);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, kind TEXT NOT NULL,
    container TEXT NOT NULL DEFAULT '', detail TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS progress (
    container TEXT NOT NULL, task TEXT NOT NULL, batch INTEGER NOT NULL,
    offsets TEXT NOT NULL, lag INTEGER NOT NULL, at REAL NOT NULL,
    PRIMARY KEY (container, task));
CREATE TABLE IF NOT EXISTS throughput (
    container TEXT PRIMARY KEY, batch INTEGER NOT NULL, records_read INTEGER NOT NULL,
    records_processed INTEGER NOT NULL, total_read INTEGER NOT NULL,
    total_processed INTEGER NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS enforced (
    container TEXT PRIMARY KEY, total INTEGER NOT NULL);
"""

LIVE_STATES = ("launching", "warm", "running")
"""States of containers the coordinator considers valid (their heartbeats renew a lease)."""


@dataclass(frozen=True)
class ContainerRecord:
    """One container as stored.

    Attributes
    ----------
    id
        The container id.
    generation
        Its checkpoint generation.
    state
        ``launching`` (started, not registered), ``warm`` (a warm-up that
        registered: ready to take its tasks), ``running``, ``expired`` (lease
        ran out; replaced), ``retired`` (handed its tasks over) or ``stopped``.
    pid
        Its process id, once known.
    spark_app
        Its Spark application id, once reported.
    tasks
        Its virtual tasks.
    checkpoint
        Its generation's checkpoint.
    sources
        Checkpoints it forks from.
    launched_at, registered_at, ended_at
        Wall-clock times (for people; decisions use the monotonic clock).
    """

    id: str
    generation: int
    state: str
    pid: int | None
    spark_app: str
    tasks: tuple[str, ...]
    checkpoint: str
    sources: tuple[str, ...]
    launched_at: float | None
    registered_at: float | None
    ended_at: float | None

    @property
    def live(self) -> bool:
        """Whether the coordinator considers it valid."""
        return self.state in LIVE_STATES


@dataclass(frozen=True)
class Event:
    """Something the coordinator did, for the status page.

    Attributes
    ----------
    at
        Wall-clock time.
    kind
        ``start``, ``launch``, ``register``, ``expire``, ``failover``,
        ``fence``, ``exit``, ``stop``.
    container
        The container concerned ("" for the job).
    detail
        One line of explanation.
    """

    at: float
    kind: str
    container: str
    detail: str


def _owner_of(owner_path: Path) -> dict[str, Any] | None:
    try:
        found = json.loads(owner_path.read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _owned(path: Path, owner_path: Path) -> StoreOwnedError:
    owner = _owner_of(owner_path) or {}
    return StoreOwnedError(
        f"--store: {path} is owned by the running coordinator at {owner.get('url', '?')} "
        f"(pid {owner.get('pid', '?')}); one coordinator per job: stop that one first, or "
        "give this job another store"
    )


class Store:
    """The coordinator's SQLite file.

    Parameters
    ----------
    path
        The database file; created with its directory if missing.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._owner_fd: int | None = None
        self._epoch: int | None = None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
        except sqlite3.DatabaseError as exc:
            raise ArgumentError.invalid(
                "--store", "a spark-elastic coordinator store (SQLite)", f"{self.path} ({exc})"
            ) from None

    def close(self) -> None:
        """Close the database and give up its ownership."""
        self._db.close()
        self.release()

    def release(self) -> None:
        """Give up the ownership :meth:`claim` took (nothing if none)."""
        if self._owner_fd is not None:
            os.close(self._owner_fd)  # releases the flock
            self._owner_fd = None

    # ownership

    @property
    def owner_path(self) -> Path:
        """The file whose lock says which coordinator owns the store."""
        return self.path.with_name(self.path.name + ".owner")

    def owner(self) -> dict[str, Any] | None:
        """What the owning coordinator wrote of itself (url, pid, epoch, since), if anything."""
        return _owner_of(self.owner_path)

    @staticmethod
    def refuse_if_owned(path: str | os.PathLike[str]) -> None:
        """Raise :class:`StoreOwnedError` if a running coordinator owns the store at ``path``.

        Parameters
        ----------
        path
            The store's file; a missing one is owned by nobody.
        """
        owner_path = Path(path).with_name(Path(path).name + ".owner")
        if not owner_path.exists():
            return
        fd = os.open(owner_path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _owned(Path(path), owner_path) from None
        finally:
            os.close(fd)

    def claim(self, url: str) -> int:
        """Own the store for this process: one coordinator per job.

        Parameters
        ----------
        url
            This coordinator's URL, shown to a second coordinator that is refused.

        Returns
        -------
        int
            The new epoch; every later transaction checks it.

        Raises
        ------
        StoreOwnedError
            Another live coordinator owns the store; nothing was changed.
        """
        fd = os.open(self.owner_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise _owned(self.path, self.owner_path) from None
        try:
            with self.transaction() as db:
                epoch = int(self.meta("epoch") or 0) + 1
                self.set_meta(db, "epoch", str(epoch))
            record = {"url": url, "pid": os.getpid(), "epoch": epoch, "since": time.time()}
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(record).encode(), 0)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        self._owner_fd, self._epoch = fd, epoch
        return epoch

    @property
    def epoch(self) -> int | None:
        """The epoch this store object claimed, or None before :meth:`claim`."""
        return self._epoch

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """All writes inside commit together, or none do.

        Raises
        ------
        StoreFencedError
            The store was claimed since by another coordinator (a newer epoch).
        """
        self._db.execute("BEGIN IMMEDIATE")
        if self._epoch is not None:
            row = self._db.execute("SELECT value FROM meta WHERE key = 'epoch'").fetchone()
            if row is None or int(row[0]) != self._epoch:
                self._db.execute("ROLLBACK")
                raise StoreFencedError(
                    f"the store {self.path} was claimed by another coordinator (epoch "
                    f"{None if row is None else row[0]}, this one's {self._epoch}): "
                    "this coordinator writes nothing more"
                )
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # meta

    def meta(self, key: str) -> str | None:
        """A stored setting, or None."""
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, db: sqlite3.Connection, key: str, value: str) -> None:
        """Set a setting (inside a transaction)."""
        db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    def next_generation(self, db: sqlite3.Connection) -> int:
        """Take the next checkpoint generation number (inside a transaction)."""
        current = int(self.meta("next_generation") or "1")
        self.set_meta(db, "next_generation", str(current + 1))
        return current

    # models

    def save_model(self, db: sqlite3.Connection, model: JobModel) -> None:
        """Store a job model version (inside a transaction)."""
        db.execute(
            "INSERT INTO models (version, json, at) VALUES (?, ?, ?)",
            (model.version, json.dumps(model.to_json()), time.time()),
        )

    def latest_model(self) -> JobModel | None:
        """The newest job model, or None for a new store."""
        row = self._db.execute("SELECT json FROM models ORDER BY version DESC LIMIT 1").fetchone()
        return None if row is None else JobModel.from_json(json.loads(row[0]))

    def model(self, version: int) -> JobModel | None:
        """A stored job model version, or None if there is no such version."""
        row = self._db.execute("SELECT json FROM models WHERE version = ?", (version,)).fetchone()
        return None if row is None else JobModel.from_json(json.loads(row[0]))

    def model_versions(self) -> list[int]:
        """Every stored job model version, ascending."""
        return [int(r[0]) for r in self._db.execute("SELECT version FROM models ORDER BY version")]

    # containers

    def add_container(self, db: sqlite3.Connection, record: ContainerRecord) -> None:
        """Insert a container (inside a transaction)."""
        db.execute(
            "INSERT INTO containers (id, generation, state, pid, spark_app, tasks, checkpoint,"
            " sources, launched_at, registered_at, ended_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (
                record.id,
                record.generation,
                record.state,
                record.pid,
                record.spark_app,
                json.dumps(list(record.tasks)),
                record.checkpoint,
                json.dumps(list(record.sources)),
                record.launched_at,
                record.registered_at,
                record.ended_at,
            ),
        )

    def update_container(self, db: sqlite3.Connection, container_id: str, **fields: Any) -> None:
        """Change some of a container's columns (inside a transaction)."""
        allowed = {"state", "pid", "spark_app", "launched_at", "registered_at", "ended_at"}
        if "sources" in fields:  # set when a warm-up takes its tasks over
            fields = {**fields, "sources": json.dumps(list(fields["sources"]))}
            allowed.add("sources")
        unknown = set(fields) - allowed
        if unknown:
            raise ArgumentError.invalid("fields", f"columns among {sorted(allowed)}", unknown)
        assignments = ", ".join(f"{name} = ?" for name in fields)
        db.execute(
            # Column names come from the allowed set above, never from the caller.
            f"UPDATE containers SET {assignments} WHERE id = ?",
            (*fields.values(), container_id),
        )

    def containers(self) -> list[ContainerRecord]:
        """Every container ever issued, oldest generation first."""
        rows = self._db.execute(
            "SELECT id, generation, state, pid, spark_app, tasks, checkpoint, sources,"
            " launched_at, registered_at, ended_at FROM containers ORDER BY generation"
        ).fetchall()
        return [
            ContainerRecord(
                r[0],
                r[1],
                r[2],
                r[3],
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

    def add_event(
        self, db: sqlite3.Connection, kind: str, container: str = "", detail: str = ""
    ) -> None:
        """Record an event (inside a transaction)."""
        db.execute(
            "INSERT INTO events (at, kind, container, detail) VALUES (?, ?, ?, ?)",
            (time.time(), kind, container, detail),
        )

    def event(self, kind: str, container: str = "", detail: str = "") -> None:
        """Record an event on its own."""
        with self.transaction() as db:
            self.add_event(db, kind, container, detail)

    def events(self, limit: int = 50) -> list[Event]:
        """The newest events, newest first."""
        rows = self._db.execute(
            "SELECT at, kind, container, detail FROM events ORDER BY id DESC LIMIT ?", (limit,)
        ).fetchall()
        return [Event(*row) for row in rows]

    # progress

    def save_progress(self, report: ProgressReport) -> None:
        """Keep a container's latest per-task positions and its read/processed counts."""
        now = time.time()
        with self.transaction() as db:
            for task in report.tasks:
                offsets = {t: {str(p): o for p, o in ps.items()} for t, ps in task.offsets.items()}
                db.execute(
                    "INSERT OR REPLACE INTO progress (container, task, batch, offsets, lag, at)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        report.container_id,
                        task.task,
                        report.batch_id,
                        json.dumps(offsets),
                        task.lag,
                        now,
                    ),
                )
            db.execute(
                "INSERT INTO throughput (container, batch, records_read, records_processed,"
                " total_read, total_processed, at) VALUES (?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT(container) DO UPDATE SET batch = excluded.batch,"
                " records_read = excluded.records_read,"
                " records_processed = excluded.records_processed,"
                " total_read = total_read + excluded.records_read,"
                " total_processed = total_processed + excluded.records_processed,"
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
                db.execute(
                    "INSERT INTO enforced (container, total) VALUES (?, ?)"
                    " ON CONFLICT(container) DO UPDATE SET total = total + excluded.total",
                    (report.container_id, report.records_enforced),
                )

    def progress(self) -> dict[str, dict[str, Any]]:
        """``{task: {container, batch, offsets, lag, at}}``: each task's latest report."""
        rows = self._db.execute(
            "SELECT container, task, batch, offsets, lag, at FROM progress ORDER BY at"
        ).fetchall()
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
        rows = self._db.execute(
            "SELECT container, batch, total_read, total_processed FROM throughput"
        ).fetchall()
        return {r[0]: {"batch": r[1], "totalRead": r[2], "totalProcessed": r[3]} for r in rows}

    def enforced(self) -> dict[str, int]:
        """``{container: records its tasks processed without waiting}``, of every container
        that reported any (ended ones too: the job's total is their sum)."""
        return dict(self._db.execute("SELECT container, total FROM enforced").fetchall())
