"""Numbered commit logs, one per writer generation, that a successor seals.

A lease bounds when a container *decides* to publish, not when its write lands:
an HTTP PUT in flight or retried by S3A, a process frozen between its lease
check and its write. So the storage itself must refuse a zombie. Each
generation appends commits ``<directory>/<generation>/<sequence>.json`` at
sequences 0, 1, 2..., each written create-if-absent (:meth:`.Storage.create`),
and a writer only writes ``n + 1`` after its own ``n`` succeeded. A successor
*seals* a generation by writing the next free sequence itself; from then on
the old writer's next commit finds its name taken and fails
(:class:`~spark_elastic.errors.FencedError`). Whoever loses the race on a
sequence learns it: a zombie's commit fails, or the successor sees the
zombie's commit and seals the one after it, so what the successor reads after
sealing is exactly what was ever committed (BookKeeper's fencing, Delta's
mutual exclusion, with the file system's create-if-absent as the arbiter).

Runs on a driver; a log's files are small JSON documents.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from spark_elastic.errors import FencedError, StorageError
from spark_elastic.storage.files import Storage

__all__ = ["Commit", "CommitLog"]

_SUFFIX = ".json"
_SEAL_ATTEMPTS = 1000
"""Sequences a seal tries before it gives up. Safety never depends on it (a zombie commits
nothing after the seal), only the seal's progress: a zombie commits at most once per batch,
each batch first passes its lease check, and a successor seals once that lease has run
out, so a live race is a write or two in flight."""


@dataclass(frozen=True)
class Commit:
    """One entry of a generation's log: a writer's commit, or the seal that ends the log."""

    generation: int
    sequence: int
    payload: Mapping[str, Any] = field(default_factory=dict)
    """What the writer committed (empty for a seal)."""
    sealed_by: str | None = None
    """Who sealed the log (a successor's name), or None for a writer's commit."""

    @property
    def is_seal(self) -> bool:
        """Whether this entry is the seal: no commit of this generation follows it."""
        return self.sealed_by is not None

    def to_bytes(self) -> bytes:
        document: dict[str, Any] = {"generation": self.generation, "sequence": self.sequence}
        if self.sealed_by is not None:
            document["sealedBy"] = self.sealed_by
        else:
            document["payload"] = dict(self.payload)
        return json.dumps(document, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> Commit:
        try:
            document = json.loads(data)
            return cls(
                int(document["generation"]),
                int(document["sequence"]),
                dict(document.get("payload", {})),
                document.get("sealedBy"),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise StorageError(f"{where}: expected a commit (JSON), found {exc}") from None


class CommitLog:
    """The commit logs of every generation under ``directory``.

    Parameters
    ----------
    storage
        The file system, whose :meth:`~.Storage.create` arbitrates each sequence.
    directory
        Where the logs live: one directory per generation.
    """

    def __init__(self, storage: Storage, directory: str) -> None:
        self.storage = storage
        self.directory = directory.rstrip("/")

    def path(self, generation: int, sequence: int) -> str:
        return self.storage.join(self.directory, str(generation), f"{sequence:012d}{_SUFFIX}")

    def generations(self) -> list[int]:
        """Every generation with a log, ascending."""
        return sorted(int(n) for n in self.storage.list(self.directory) if n.isdigit())

    def sequences(self, generation: int) -> list[int]:
        """The sequences written in ``generation``'s log, ascending."""
        names = self.storage.list(self.storage.join(self.directory, str(generation)))
        return sorted(
            int(n[: -len(_SUFFIX)])
            for n in names
            if n.endswith(_SUFFIX) and n[: -len(_SUFFIX)].isdigit()
        )

    def entry(self, generation: int, sequence: int) -> Commit | None:
        path = self.path(generation, sequence)
        data = self.storage.read(path)
        return None if data is None else Commit.from_bytes(data, path)

    def next_sequence(self, generation: int) -> int:
        """Where a writer of ``generation`` appends next.

        Raises
        ------
        FencedError
            The log is sealed: the generation may commit nothing more.
        """
        sequences = self.sequences(generation)
        if not sequences:
            return 0
        last = self.entry(generation, sequences[-1])
        if last is not None and last.is_seal:
            raise FencedError(self._sealed(generation, last))
        return sequences[-1] + 1

    def append(self, generation: int, sequence: int, payload: Mapping[str, Any]) -> Commit:
        """Commit ``payload`` at ``sequence`` of ``generation``'s log (a writer, per publish).

        Raises
        ------
        FencedError
            The sequence is taken: a successor sealed the log (or another writer
            of the generation committed there). Nothing of this call is visible.
        """
        commit = Commit(generation, sequence, dict(payload))
        if self.storage.create(self.path(generation, sequence), commit.to_bytes()):
            return commit
        there = self.entry(generation, sequence)
        if there is not None and there.is_seal:
            raise FencedError(self._sealed(generation, there))
        if there == commit:
            # This very commit, written by an attempt whose answer was lost (an S3 client
            # retrying a PUT that had landed): it stands.
            return commit
        raise FencedError(
            f"{self.path(generation, sequence)}: generation {generation}'s commit "
            f"{sequence} was already written; this writer's commits are not its own"
        )

    def seal(self, generation: int, by: str) -> Commit:
        """Seal ``generation``'s log (a successor, before it reads what was published).

        Returns
        -------
        Commit
            The seal, written by this call or found already there: every commit of
            the generation has a lower sequence, and none can follow.

        Raises
        ------
        StorageError
            A writer still committing after :data:`_SEAL_ATTEMPTS` sequences.
        """
        sequences = self.sequences(generation)
        sequence = sequences[-1] + 1 if sequences else 0
        if sequences:
            last = self.entry(generation, sequences[-1])
            if last is not None and last.is_seal:
                return last
        for attempt in range(1, _SEAL_ATTEMPTS + 1):
            path = self.path(generation, sequence)
            # A sequence already taken is passed by asking, not by a create that fails: on
            # a Hadoop file system a lost create is a Java exception through the gateway,
            # several times a writer's successful commit, and a seal slower than the writer
            # never caught up with it. Nor is what took it read: a step of the seal is one
            # request, quicker than a writer's (its create and its batch).
            if not self.storage.exists(path):
                seal = Commit(generation, sequence, sealed_by=by)
                if self.storage.create(path, seal.to_bytes()):
                    # Right above another successor's seal (or this one's, written by an
                    # attempt whose answer was lost), the first seal is the log's end.
                    below = self.entry(generation, sequence - 1) if sequence else None
                    return below if below is not None and below.is_seal else seal
            # Taken: by the old writer's commit, which counts, and the seal goes right
            # after it (never further: a gap below the seal would be a sequence the writer
            # could still commit unseen); or by a seal, which the next listing finds, or
            # the check above once this seal lands. A writer that got several ahead
            # meanwhile is caught up with by listing again, now and then (a listing costs
            # more than a step).
            sequence += 1
            if attempt % 8 == 0:
                sequences = self.sequences(generation)
                last = self.entry(generation, sequences[-1]) if sequences else None
                if last is not None and last.is_seal:
                    return last
                sequence = max([sequence - 1, *sequences]) + 1
        raise StorageError(
            f"{self.storage.join(self.directory, str(generation))}: still committing after "
            f"{_SEAL_ATTEMPTS} sequences, cannot seal it"
        )

    def commits(self, generation: int) -> list[Commit]:
        """``generation``'s commits in order, up to its seal (seals left out)."""
        found = []
        for sequence in self.sequences(generation):
            entry = self.entry(generation, sequence)
            if entry is None:
                continue
            if entry.is_seal:
                break
            found.append(entry)
        return found

    def last_commit(self, generation: int) -> Commit | None:
        """``generation``'s newest commit, reading from the end (a seal is only ever last)."""
        for sequence in reversed(self.sequences(generation)):
            entry = self.entry(generation, sequence)
            if entry is not None and not entry.is_seal:
                return entry
        return None

    def _sealed(self, generation: int, seal: Commit) -> str:
        return (
            f"{self.path(generation, seal.sequence)}: generation {generation}'s commits were "
            f"sealed by {seal.sealed_by} at {seal.sequence}: a successor owns its work now"
        )
