"""The default coordinator store: a SQLite file on the coordinator's host.

The standard library's ``sqlite3``, WAL journal: one file, no server. A
coordinator killed at any point restarts from the last committed
transaction. One coordinator per store: :meth:`SQLiteStore.claim` takes an
exclusive ``flock`` on ``<store>.owner`` (released when the process exits,
however it exits) and bumps the store's epoch; every transaction then
checks that the epoch is still its own, so a coordinator whose store was
claimed by another (a lock lost on a network file system, say) writes
nothing more. A coordinator on another host cannot share it: that is
:mod:`.postgresql`'s.

May import: :mod:`.base`, :mod:`spark_elastic.errors` and the standard library.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sqlite3
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from spark_elastic.errors import ArgumentError, StoreOwnedError
from spark_elastic.runtime.coordinator.stores.base import SCHEMA, Store

__all__ = ["SQLiteStore"]


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


class SQLiteStore(Store):
    """The coordinator's SQLite file.

    Parameters
    ----------
    path
        The database file; created with its directory if missing.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.location = str(self.path)
        self._owner_fd: int | None = None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(
                SCHEMA.format(
                    serial="INTEGER PRIMARY KEY AUTOINCREMENT", real="REAL", big="INTEGER"
                )
            )
        except sqlite3.DatabaseError as exc:
            raise ArgumentError.invalid(
                "--store", "a spark-elastic coordinator store (SQLite)", f"{self.path} ({exc})"
            ) from None

    def _execute(self, db: Any, sql: str, params: Sequence[Any] = ()) -> Any:
        return db.execute(sql, params)

    def _connection(self) -> Any:
        return self._db

    @contextlib.contextmanager
    def _begin(self) -> Iterator[Any]:
        # IMMEDIATE: the write lock is taken before the epoch is read, not at the first write.
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _stored_epoch(self, db: Any) -> str | None:
        row = db.execute("SELECT value FROM meta WHERE key = 'epoch'").fetchone()
        return None if row is None else str(row[0])

    def _driver_errors(self) -> tuple[type[BaseException], ...]:
        return (sqlite3.Error,)

    def close(self) -> None:
        """Close the database and give up its ownership."""
        self._db.close()
        self.release()

    def release(self) -> None:
        """Give up the ownership :meth:`claim` took (nothing if none)."""
        if self._owner_fd is not None:
            os.close(self._owner_fd)  # releases the flock
            self._owner_fd = None

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
        """Own the store for this process: one coordinator per job (see :meth:`Store.claim`)."""
        fd = os.open(self.owner_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise _owned(self.path, self.owner_path) from None
        try:
            with self.transaction() as db:
                epoch = self._next_epoch(db)
            record = {"url": url, "pid": os.getpid(), "epoch": epoch, "since": time.time()}
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(record).encode(), 0)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        self._owner_fd, self._epoch = fd, epoch
        return epoch
