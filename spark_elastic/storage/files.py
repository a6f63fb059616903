"""What a file system must do for a job, and the local disk doing it.

:class:`Storage` is the contract: small files read and written whole, listed by
directory, and above all :meth:`Storage.create`, a create-if-absent whose
content becomes visible at once or not at all. Publishing never renames a
directory into place (S3's rename is a copy and a delete, neither fast nor
atomic): data goes under names never written twice, and one created object
makes it visible (:mod:`.commits`).

:class:`LocalStorage` keeps the local disk as fast as plain files: a file is
written beside its name and hard-linked into place (``link`` fails when the
name exists, so two writers cannot both win, and a reader never sees half a
file). It also has the local disk's own steps (``link``, ``link_tree``,
``move``, ``discard``), which forks and snapshots between local paths use:
nothing outside this package renames, links or copies a job's files.
:func:`~spark_elastic.storage.resolve.open_storage` picks it for plain
paths and ``file:`` URIs, and the Hadoop file system Spark itself uses for
every other scheme.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import os
import shutil
import uuid
from abc import ABC, abstractmethod
from pathlib import Path

from spark_elastic.errors import StorageError

__all__ = ["LocalStorage", "Storage", "is_local", "local_path", "scheme_of"]


def scheme_of(uri: str) -> str:
    """The URI's scheme (``hdfs``, ``s3a``), or ``file`` for a plain path."""
    head, sep, _ = uri.partition(":")
    # A scheme is a letter then letters, digits, +, - or . (RFC 3986); `C:` or a path
    # with a colon further on is no scheme.
    if (
        sep
        and len(head) > 1
        and head[0].isalpha()
        and head.replace("+", "").replace("-", "").replace(".", "").isalnum()
        and "/" not in head
    ):
        return head.lower()
    return "file"


def is_local(uri: str) -> bool:
    """Whether ``uri`` is a plain path or a ``file:`` URI (the local disk)."""
    return scheme_of(uri) == "file"


def local_path(uri: str) -> str:
    """The path of a local URI: ``file:///a/b`` and ``file:/a/b`` are ``/a/b``."""
    if uri.startswith("file://"):
        return uri[len("file://") :] or "/"
    if uri.startswith("file:"):
        return uri[len("file:") :]
    return uri


class Storage(ABC):
    """A file system as the library writes to it: whole small files, directories, commits.

    Paths are URIs (or plain paths for the local disk) as Spark names them.
    Every method runs on the driver (a container's, or the CLI's); executors
    read nothing through it. Failures other than the ones each method names
    raise :class:`~spark_elastic.errors.StorageError` with one line naming the
    path, what was being done and the file system's own words.
    """

    scheme: str
    """``file``, ``hdfs``, ``s3a``...: what :meth:`create` relies on differs by scheme."""

    @abstractmethod
    def create(self, path: str, data: bytes) -> bool:
        """Write ``data`` as ``path`` only if nothing is there yet, visible whole or not at all.

        Returns
        -------
        bool
            True if this call created it; False if ``path`` already existed (another
            writer won, and its content stands).
        """

    @abstractmethod
    def put(self, path: str, data: bytes) -> None:
        """Write ``data`` as ``path``, replacing what was there, visible whole or not at all.

        For files one writer owns (its own progress, a snapshot of its own): two
        writers racing on one name must use :meth:`create`.
        """

    @abstractmethod
    def read(self, path: str) -> bytes | None:
        """``path``'s content, or None if there is no such file."""

    @abstractmethod
    def list(self, directory: str) -> list[str]:
        """The names (not paths) in ``directory``, sorted; empty if it does not exist.

        A file where the directory should be is a :class:`StorageError`, not empty.
        """

    @abstractmethod
    def files(self, directory: str) -> builtins.list[tuple[str, int]]:
        """Every file under ``directory``: its path relative to it (``a/b/c``) and its size,
        sorted; empty if it does not exist."""

    @abstractmethod
    def exists(self, path: str) -> bool:
        """Whether a file or directory is at ``path``."""

    @abstractmethod
    def delete(self, path: str) -> None:
        """Remove ``path`` and everything under it; nothing there is no error."""

    @abstractmethod
    def copy(self, source: str, target: str) -> bool:
        """Copy the file ``source`` to ``target`` (replacing it), e.g. a fork's files.

        Returns False, copying nothing, if there is no file ``source`` (it may
        have been deleted since it was listed).
        """

    @abstractmethod
    def download(self, path: str, local: str) -> bool:
        """Copy the file ``path`` to the local file ``local`` (made, or replaced).

        Returns False, copying nothing, if there is no file ``path``.
        """

    @abstractmethod
    def upload(self, local: str, path: str) -> None:
        """Copy the local file ``local`` to ``path`` (replacing it)."""

    @abstractmethod
    def modified(self, path: str) -> float | None:
        """When ``path`` was last written (seconds since the epoch), or None if absent."""

    def join(self, base: str, *names: str) -> str:
        """``base/name/...`` (URIs join with ``/`` whatever the platform)."""
        return "/".join([base.rstrip("/"), *(n.strip("/") for n in names)])


class LocalStorage(Storage):
    """The local disk: create-if-absent by ``link``, replace by ``rename``, both atomic."""

    scheme = "file"

    def create(self, path: str, data: bytes) -> bool:
        target = local_path(path)
        staged = self._staged(target, data)
        try:
            os.link(staged, target)
        except FileExistsError:
            return False
        except OSError as exc:
            raise _local_error(target, "create", exc) from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(staged)
        return True

    def put(self, path: str, data: bytes) -> None:
        target = local_path(path)
        staged = self._staged(target, data)
        try:
            os.replace(staged, target)
        except OSError as exc:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(staged)
            raise _local_error(target, "write", exc) from None

    def read(self, path: str) -> bytes | None:
        try:
            return Path(local_path(path)).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _local_error(local_path(path), "read", exc) from None

    def list(self, directory: str) -> list[str]:
        try:
            return sorted(os.listdir(local_path(directory)))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise _local_error(local_path(directory), "list", exc) from None

    def files(self, directory: str) -> builtins.list[tuple[str, int]]:
        root = local_path(directory)
        found: builtins.list[tuple[str, int]] = []
        for folder, _, names in os.walk(root):
            base = os.path.relpath(folder, root)
            for name in names:
                with contextlib.suppress(FileNotFoundError):  # deleted since the walk saw it
                    size = os.stat(os.path.join(folder, name)).st_size
                    found.append((name if base == "." else f"{base}/{name}", size))
        return sorted(found)

    def exists(self, path: str) -> bool:
        return os.path.lexists(local_path(path))

    def delete(self, path: str) -> None:
        target = local_path(path)
        try:
            if os.path.isdir(target) and not os.path.islink(target):
                shutil.rmtree(target)
            else:
                os.unlink(target)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise _local_error(target, "delete", exc) from None

    def copy(self, source: str, target: str) -> bool:
        dst = local_path(target)
        try:
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copyfile(local_path(source), dst)
        except FileNotFoundError as exc:
            if os.path.exists(local_path(source)):
                raise _local_error(local_path(source), f"copy to {dst}", exc) from None
            return False
        except OSError as exc:
            raise _local_error(local_path(source), f"copy to {dst}", exc) from None
        return True

    def download(self, path: str, local: str) -> bool:
        return self.copy(path, local)

    def upload(self, local: str, path: str) -> None:
        if not self.copy(local, path):
            raise StorageError(f"{local}: cannot upload to {path} (no such file)")

    def modified(self, path: str) -> float | None:
        try:
            return os.stat(local_path(path)).st_mtime
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _local_error(local_path(path), "look up", exc) from None

    # The local disk's own fast steps: no other file system has them, so callers use them on
    # paths they know are local (a fork between two local checkpoints, a host's scratch).

    def link(self, source: str, target: str) -> bool:
        """Hard-link ``source`` at ``target`` (a copy across devices), making its parents.

        Returns ``False`` when ``source`` is gone (deleted by a running query).
        """
        src, dst = local_path(source), local_path(target)
        try:
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            try:
                os.link(src, dst)
            except OSError as exc:
                # Another device, or a file system without hard links: a copy does.
                if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                    raise
                shutil.copy2(src, dst)
        except FileNotFoundError:
            if os.path.exists(src):
                raise _local_error(src, f"link to {dst}", FileNotFoundError()) from None
            return False
        except OSError as exc:
            raise _local_error(src, f"link to {dst}", exc) from None
        return True

    def link_tree(self, source: str, target: str) -> None:
        """Hard-link every file of the directory ``source`` under a new ``target``."""
        try:
            shutil.copytree(local_path(source), local_path(target), copy_function=os.link)
        except (OSError, shutil.Error) as exc:
            raise StorageError(f"{local_path(source)}: cannot link to {target} ({exc})") from None

    def move(self, source: str, target: str) -> None:
        """Rename ``source`` to ``target`` (absent, or an empty directory) in one atomic step.

        How the local disk publishes a directory whole. Object stores have no
        such step: :mod:`.commits` publishes there.
        """
        try:
            os.replace(local_path(source), local_path(target))
        except OSError as exc:
            raise _local_error(local_path(source), f"move to {target}", exc) from None

    def discard(self, path: str) -> None:
        """Delete ``path`` (a file or a directory tree) if it is there, ignoring errors.

        For scratch and staging directories, whose leftovers nothing reads.
        """
        with contextlib.suppress(StorageError):
            self.delete(path)

    @staticmethod
    def _staged(target: str, data: bytes) -> str:
        """``data`` in a new file beside ``target``, on disk (so a crash leaves whole files)."""
        directory, name = os.path.split(target)
        staged = os.path.join(directory, f".{name}.{uuid.uuid4().hex}.tmp")
        try:
            os.makedirs(directory or ".", exist_ok=True)
            fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(staged)
            raise _local_error(target, "write", exc) from None
        return staged


def _local_error(path: str, doing: str, exc: OSError) -> StorageError:
    reason = exc.strerror or errno.errorcode.get(exc.errno or 0, type(exc).__name__)
    return StorageError(f"{path}: cannot {doing} ({reason})")
