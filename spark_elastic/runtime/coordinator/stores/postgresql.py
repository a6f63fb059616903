"""A coordinator store that coordinators on several hosts share: PostgreSQL.

Chosen over ZooKeeper because the fence a deposed coordinator must meet is
a *transaction*: the job model, the container rows it implies and their
event are written together, and the same transaction must fail if another
coordinator has taken the store since. PostgreSQL checks that inside the
transaction (the epoch row is read ``FOR SHARE``, so a claim's update of it
waits for every transaction that read it, and every transaction after the
claim sees the new epoch); ZooKeeper would need its multi-op
``check(version)`` beside every write and a second system for the rows.

Leadership is a row with a lease on the *database's* clock: a coordinator
claims the store when no other holds an unexpired lease (a new epoch), and
renews it (:meth:`PostgreSQLStore.renew`); a standby's claim succeeds once
the leader's lease has run out. No coordinator's clock is compared with
another's: each measures what it holds from the moment it *sent* a claim
or renewal (:meth:`PostgreSQLStore.held_for`), which can only be shorter
than what the database granted.

Connections use ``psycopg`` 3 (synchronous, like ``sqlite3``: the store is
called on the coordinator's event-loop thread, one statement at a time,
each a loopback or LAN round trip), with a connect timeout, a statement and
lock timeout, and TCP keepalives, so no call waits without a deadline; a
broken connection is opened again at the next call.

May import: :mod:`.base`, :mod:`spark_elastic.errors`, ``psycopg`` (loaded
when a store is opened) and the standard library.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from spark_elastic.errors import StoreError, StoreFencedError, StoreOwnedError
from spark_elastic.runtime.coordinator.stores.base import SCHEMA, Store, error_line

__all__ = ["PostgreSQLStore", "owned", "redacted"]

_LEADER = """
CREATE TABLE IF NOT EXISTS leader (
    id INTEGER PRIMARY KEY CHECK (id = 1), epoch BIGINT NOT NULL, url TEXT NOT NULL,
    host TEXT NOT NULL, pid INTEGER NOT NULL, since DOUBLE PRECISION NOT NULL,
    lease_until TIMESTAMPTZ NOT NULL);
CREATE TABLE IF NOT EXISTS standbys (
    url TEXT PRIMARY KEY, host TEXT NOT NULL, pid INTEGER NOT NULL,
    since DOUBLE PRECISION NOT NULL, seen TIMESTAMPTZ NOT NULL)
"""

_CLAIMS_LOCK = 0x5E1A571C
"""The advisory lock that orders claims (the leader row may not exist yet to lock)."""

CALL_TIMEOUT_S = 3
"""The longest a connection, a statement or a wait for a lock may take before it fails:
store calls run on the coordinator's event loop, so this bounds how long a store out of
reach holds the heartbeats."""


_LEADER_ROW = (
    "SELECT url, host, pid, epoch, since, lease_until > now(),"
    " extract(epoch FROM lease_until - now()) FROM leader WHERE id = 1"
)
"""The leader's row, with whether its lease is live and how long it runs (the database's now)."""


def _owner(row: Sequence[Any]) -> dict[str, Any]:
    url, host, pid, epoch, since, live, left = row
    return {
        "url": url,
        "host": host,
        "pid": pid,
        "epoch": epoch,
        "since": since,
        "live": live,
        "leftS": float(left),
    }


def owned(location: str, owner: dict[str, Any]) -> StoreOwnedError:
    """The refusal of a coordinator while ``owner`` (:meth:`PostgreSQLStore.owner`) leads."""
    return StoreOwnedError(
        f"--store: {location} is led by the coordinator at {owner['url']} (host "
        f"{owner['host']}, pid {owner['pid']}, epoch {owner['epoch']}), whose lease runs "
        f"{owner['leftS']:.1f} s more unless renewed; one leader per job: stop that one first, "
        "or stand by"
    )


def redacted(url: str) -> str:
    """A PostgreSQL URL without its password, as messages show it."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


class PostgreSQLStore(Store):
    """The coordinator's store in a PostgreSQL database, one job per database.

    Parameters
    ----------
    url
        ``postgresql://user:password@host:port/database`` (libpq's URI; its
        query parameters, ``sslmode`` say, are passed on).
    lease_s
        How long a claim or renewal holds the store.
    clock
        Monotonic clock, for what this coordinator holds.

    Raises
    ------
    StoreError
        psycopg is not installed, or the database cannot be reached or refuses
        the credentials; nothing was written.
    """

    def __init__(
        self, url: str, lease_s: float = 15.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        try:
            import psycopg
        except ModuleNotFoundError:
            raise StoreError(
                "--store: a PostgreSQL store needs psycopg: pip install 'spark-elastic[postgresql]'"
            ) from None
        self._psycopg = psycopg
        self.url = url
        self.location = redacted(url)
        self.lease_s: float = lease_s
        self._clock = clock
        self._held_until = float("-inf")
        self._conn: Any = None
        try:
            db = self._connection()
            with db.transaction():
                # Two coordinators starting on a new database would race to create the tables.
                db.execute("SELECT pg_advisory_xact_lock(%s)", (_CLAIMS_LOCK,))
                schema = SCHEMA.format(
                    serial="BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
                    real="DOUBLE PRECISION",
                    big="BIGINT",
                )
                for statement in [*schema.split(";"), *_LEADER.split(";")]:
                    db.execute(statement)
        except psycopg.Error as exc:
            raise StoreError(
                f"--store: expected a PostgreSQL database this coordinator can use, found "
                f"{self.location} ({error_line(exc)})"
            ) from None

    def _after_error(self) -> None:
        if self._conn is not None and self._conn.broken:
            self._conn = None  # opened again at the next call

    def _connection(self) -> Any:
        if self._conn is None or self._conn.closed:
            self._conn = self._psycopg.connect(
                self.url,
                autocommit=True,
                connect_timeout=CALL_TIMEOUT_S,
                application_name="spark-elastic coordinator",
                options=f"-c statement_timeout={CALL_TIMEOUT_S * 1000}"
                f" -c lock_timeout={CALL_TIMEOUT_S * 1000}",
                keepalives_idle=5,
                keepalives_interval=2,
                keepalives_count=3,
                tcp_user_timeout=CALL_TIMEOUT_S * 1000,
            )
        return self._conn

    def _execute(self, db: Any, sql: str, params: Sequence[Any] = ()) -> Any:
        # The shared statements use sqlite3's placeholders; none has a literal "?".
        return db.execute(sql.replace("?", "%s"), params)

    @contextlib.contextmanager
    def _begin(self) -> Iterator[Any]:
        db = self._connection()
        with db.transaction():
            yield db

    def _stored_epoch(self, db: Any) -> str | None:
        row = db.execute("SELECT value FROM meta WHERE key = 'epoch' FOR SHARE").fetchone()
        return None if row is None else str(row[0])

    def _driver_errors(self) -> tuple[type[BaseException], ...]:
        return (self._psycopg.Error,)

    # leadership

    def claim(self, url: str) -> int:
        """Lead the job (see :meth:`Store.claim`): a new epoch, if no other coordinator holds
        an unexpired lease; this one's then runs :attr:`lease_s` from the database's now."""
        sent = self._clock()
        with self._translated(), self._begin() as db:
            db.execute("SELECT pg_advisory_xact_lock(%s)", (_CLAIMS_LOCK,))
            row = db.execute(f"{_LEADER_ROW} FOR UPDATE").fetchone()
            if row is not None and row[5]:
                raise owned(self.location, _owner(row))
            epoch = self._next_epoch(db)
            db.execute(
                "INSERT INTO leader (id, epoch, url, host, pid, since, lease_until)"
                " VALUES (1, %s, %s, %s, %s, %s, now() + make_interval(secs => %s))"
                " ON CONFLICT (id) DO UPDATE SET epoch = excluded.epoch, url = excluded.url,"
                " host = excluded.host, pid = excluded.pid, since = excluded.since,"
                " lease_until = excluded.lease_until",
                (epoch, url, socket.gethostname(), os.getpid(), time.time(), self.lease_s),
            )
        self._epoch, self._held_until = epoch, sent + self.lease_s
        return epoch

    def renew(self) -> None:
        """Extend this coordinator's lease by :attr:`lease_s` from now (the database's now).

        Raises
        ------
        StoreFencedError
            Another coordinator has claimed the store since.
        StoreError
            The database cannot be reached; the lease runs on meanwhile.
        """
        if self._epoch is None:
            return
        sent = self._clock()
        with self._translated():
            row = (
                self._connection()
                .execute(
                    "UPDATE leader SET lease_until = now() + make_interval(secs => %s)"
                    " WHERE id = 1 AND epoch = %s RETURNING epoch",
                    (self.lease_s, self._epoch),
                )
                .fetchone()
            )
        if row is None:
            raise StoreFencedError(
                f"the store {self.location} was claimed by another coordinator (this one's "
                f"epoch {self._epoch}): this coordinator writes nothing more"
            )
        self._held_until = sent + self.lease_s

    def held_for(self) -> float:
        """Seconds this coordinator surely still leads (0 once its lease may have run out)."""
        return max(0.0, self._held_until - self._clock())

    def stand_by(self, url: str) -> None:
        """Say (again) that a standby coordinator at ``url`` waits to lead."""
        with self._translated():
            self._connection().execute(
                "INSERT INTO standbys (url, host, pid, since, seen) VALUES (%s, %s, %s, %s, now())"
                " ON CONFLICT (url) DO UPDATE SET host = excluded.host, pid = excluded.pid,"
                " seen = excluded.seen",
                (url, socket.gethostname(), os.getpid(), time.time()),
            )

    def standbys(self) -> list[dict[str, Any]]:
        """The standbys that said so within a lease, oldest first."""
        rows = self._rows(
            "SELECT url, host, pid, since FROM standbys"
            " WHERE seen > now() - make_interval(secs => ?) ORDER BY since",
            (self.lease_s,),
        )
        return [{"url": r[0], "host": r[1], "pid": r[2], "since": r[3]} for r in rows]

    def leave(self, url: str) -> None:
        """A standby at ``url`` stops waiting (it leads now, or it stopped)."""
        with self._translated():
            self._connection().execute("DELETE FROM standbys WHERE url = %s", (url,))

    def owner(self) -> dict[str, Any] | None:
        """The leader as it wrote itself (url, host, pid, epoch, since), whether its lease is
        live and how long it runs (leftS), or None if no coordinator ever led."""
        rows = self._rows(_LEADER_ROW)
        return _owner(rows[0]) if rows else None

    def release(self) -> None:
        """End this coordinator's lease now, so a standby need not wait for it."""
        if self._epoch is None:
            return
        epoch, self._epoch, self._held_until = self._epoch, None, float("-inf")
        with contextlib.suppress(StoreError), self._translated():
            self._connection().execute(
                "UPDATE leader SET lease_until = now() WHERE id = 1 AND epoch = %s", (epoch,)
            )

    def close(self) -> None:
        """Give up the lease and close the connection."""
        self.release()
        if self._conn is not None:
            self._conn.close()
            self._conn = None
