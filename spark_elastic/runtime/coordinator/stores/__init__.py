"""The coordinator's stores: where a job's models, containers and events live.

Owns: :mod:`.base` (the :class:`Store` interface: transactions fenced by
an epoch, and the SQL both implementations share), :mod:`.sqlite` (the
default: a file on the coordinator's host, owned through a ``flock``),
:mod:`.postgresql` (a database coordinators on several hosts share, led
through a lease on the database's clock) and :mod:`.records` (what a
store holds, as values). :func:`open_store` picks one by the ``--store``
the user gave.

May import: :mod:`spark_elastic.runtime.protocol`, :mod:`spark_elastic.errors`,
the standard library and (when a PostgreSQL store is opened) ``psycopg``.
Nothing of the coordinator above it.
"""

from __future__ import annotations

import os

from spark_elastic.runtime.coordinator.stores.base import Store
from spark_elastic.runtime.coordinator.stores.records import LIVE_STATES, ContainerRecord, Event
from spark_elastic.runtime.coordinator.stores.sqlite import SQLiteStore

__all__ = [
    "LIVE_STATES",
    "ContainerRecord",
    "Event",
    "SQLiteStore",
    "Store",
    "is_networked",
    "open_store",
    "refuse_if_owned",
]

_SCHEMES = ("postgresql://", "postgres://")


def is_networked(location: str | os.PathLike[str]) -> bool:
    """Whether ``location`` names a store coordinators on other hosts can share."""
    return str(location).startswith(_SCHEMES)


def open_store(location: str | os.PathLike[str], lease_s: float = 15.0) -> Store:
    """The store at ``location``: a PostgreSQL URL, or a SQLite file's path.

    Parameters
    ----------
    location
        ``postgresql://user:password@host:port/database``, or a path.
    lease_s
        How long a PostgreSQL store's leadership lasts without renewal.

    Raises
    ------
    StoreError
        The store cannot be opened; nothing was written.
    """
    if is_networked(location):
        from spark_elastic.runtime.coordinator.stores.postgresql import PostgreSQLStore

        return PostgreSQLStore(str(location), lease_s)
    return SQLiteStore(location)


def refuse_if_owned(location: str | os.PathLike[str], lease_s: float = 15.0) -> None:
    """Raise :class:`~spark_elastic.errors.StoreOwnedError` if a live coordinator owns the
    store at ``location``: checked before a coordinator binds a port or writes anything.

    A SQLite store is checked without opening it (a missing one is owned by
    nobody); a PostgreSQL store by its leader's lease.
    """
    if not is_networked(location):
        SQLiteStore.refuse_if_owned(location)
        return
    from spark_elastic.runtime.coordinator.stores.postgresql import owned

    store = open_store(location, lease_s)
    try:
        owner = store.owner()
        if owner is not None and owner["live"]:
            raise owned(store.location, owner)
    finally:
        store.close()
