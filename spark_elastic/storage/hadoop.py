"""The file systems Spark's Hadoop opens (HDFS, S3A, ...), through the driver's JVM.

A URI means here what it means to Spark: the same ``FileSystem`` classes, the
same ``spark.hadoop.*`` settings and credentials, reached over py4j from the
container's (or the CLI's) driver. Nothing here runs on an executor.

Create-if-absent is the file system's own atomic step, by scheme:

- ``hdfs``, ``viewfs``, ``abfs``, ``abfss``: the file is written under a hidden
  name, then ``FileContext.rename`` without overwrite (atomic at the NameNode,
  and on ABFS with a hierarchical namespace) moves it into place; the rename
  of the loser fails.
- ``s3a``: a conditional PUT (``If-None-Match: *``, S3A's
  ``fs.option.create.conditional.overwrite``, HADOOP-19256); the object is
  visible whole when the upload completes, and the loser's completes with 412.
- ``gs``: ``create`` without overwrite (the connector's generation-0
  precondition), visible at close.

Other schemes are refused when the storage is opened, in one line.
"""

from __future__ import annotations

import builtins
import uuid
from typing import TYPE_CHECKING, Any

from spark_elastic.errors import StorageError
from spark_elastic.storage.files import Storage, scheme_of

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "COMMIT_SCHEMES",
    "CONDITIONAL_CREATE",
    "HadoopStorage",
    "PUT_SCHEMES",
    "RENAME_SCHEMES",
]

RENAME_SCHEMES = frozenset({"hdfs", "viewfs", "abfs", "abfss"})
"""Schemes whose rename without overwrite is atomic: create-if-absent is write + rename."""
PUT_SCHEMES = frozenset({"s3a", "gs"})
"""Schemes whose objects appear whole at close: create-if-absent is a conditional put."""
COMMIT_SCHEMES = RENAME_SCHEMES | PUT_SCHEMES | {"file"}
"""Every scheme spark-elastic can publish to without overwriting (``file`` is the local disk)."""
CONDITIONAL_CREATE = "fs.option.create.conditional.overwrite"
"""S3A's create option (and path capability) for a put only if no object has the key."""

# What a Java exception's class says about a create that lost: the name was taken.
_EXISTS = frozenset(
    {
        "org.apache.hadoop.fs.FileAlreadyExistsException",
        "org.apache.hadoop.fs.s3a.RemoteFileChangedException",
    }
)
_MISSING = frozenset({"java.io.FileNotFoundException"})


class HadoopStorage(Storage):
    """A Hadoop ``FileSystem`` of the driver's JVM (one per root URI's scheme and authority).

    Build it with :meth:`open`, which checks the scheme can create a file only
    if absent and that the file system answers.
    """

    def __init__(self, root: str, spark: SparkSession) -> None:
        self.root = root
        self.scheme = scheme_of(root)
        self._jvm: Any = spark._jvm  # type: ignore[attr-defined]
        self._gateway: Any = spark.sparkContext._gateway  # type: ignore[attr-defined]
        self._conf: Any = spark._jsc.hadoopConfiguration()  # type: ignore[attr-defined]
        fs_package = self._jvm.org.apache.hadoop.fs
        self._Path: Any = fs_package.Path
        root_path = self._Path(root)
        self._fs: Any = self._call(
            root, "open the file system", root_path.getFileSystem, self._conf
        )
        self._fc: Any = None
        if self.scheme in RENAME_SCHEMES:
            self._fc = self._call(
                root,
                "open the file system",
                fs_package.FileContext.getFileContext,
                root_path.toUri(),
                self._conf,
            )
            rename = getattr(fs_package, "Options$Rename")
            self._no_overwrite = self._options(rename, rename.NONE)
            self._overwrite = self._options(rename, rename.OVERWRITE)

    @classmethod
    def open(cls, uri: str, spark: SparkSession | None = None) -> HadoopStorage:
        """The storage for ``uri``, checked: its scheme creates only-if-absent, it answers.

        Raises
        ------
        StorageError
            An unsupported scheme, a file system without conditional writes, no
            session, or one that does not answer (one line naming the URI).
        """
        scheme = scheme_of(uri)
        if scheme not in RENAME_SCHEMES | PUT_SCHEMES:
            supported = ", ".join(f"{s}:" for s in sorted(COMMIT_SCHEMES))
            raise StorageError(
                f"{uri}: expected a file system that can create a file only if absent "
                f"({supported}), found scheme {scheme}:, which spark-elastic cannot "
                "publish to without overwriting"
            )
        if spark is None:
            from pyspark.sql import SparkSession

            spark = SparkSession.getActiveSession()
            if spark is None:
                raise StorageError(
                    f"{uri}: reaching a {scheme}: file system needs a SparkSession (its "
                    "JVM's Hadoop), and none is active in this process"
                )
        storage = cls(uri, spark)
        storage._check()
        return storage

    def _check(self) -> None:
        """Fail now, in one line, if the file system cannot do what publishing needs."""
        root = self._Path(self.root)
        if self.scheme == "s3a" and not self._call(
            self.root,
            "ask for conditional writes",
            self._fs.hasPathCapability,
            root,
            CONDITIONAL_CREATE,
        ):
            raise StorageError(
                f"{self.root}: expected an S3 store with conditional writes (If-None-Match), "
                "found them off in S3A (fs.s3a.create.conditional.enabled is false); "
                "spark-elastic cannot publish without overwriting there"
            )
        # Reachable, with credentials: a missing root is fine (it is made on first write).
        self._call(self.root, "reach the file system", self._fs.exists, root)

    def create(self, path: str, data: bytes) -> bool:
        target = self._Path(path)
        try:
            if self.scheme in RENAME_SCHEMES:
                staged = self._Path(self._staged_name(path))
                self._write(staged, data, overwrite=False)
                try:
                    self._fc.rename(staged, target, self._no_overwrite)
                except Exception as exc:
                    self._fs.delete(staged, False)
                    raise exc
            elif self.scheme == "s3a":
                builder = self._fs.createFile(target).overwrite(False)
                stream = builder.must(CONDITIONAL_CREATE, True).build()
                self._finish(stream, data)
            else:
                self._write(target, data, overwrite=False)
        except Exception as exc:
            if _java_class(exc) in _EXISTS:
                return False
            raise _error(path, "create", exc) from None
        return True

    def put(self, path: str, data: bytes) -> None:
        target = self._Path(path)
        try:
            if self.scheme in RENAME_SCHEMES:
                staged = self._Path(self._staged_name(path))
                self._write(staged, data, overwrite=False)
                self._fc.rename(staged, target, self._overwrite)
            else:
                self._write(target, data, overwrite=True)
        except Exception as exc:
            raise _error(path, "write", exc) from None

    def read(self, path: str) -> bytes | None:
        try:
            stream = self._fs.open(self._Path(path))
            try:
                return bytes(self._jvm.org.apache.hadoop.io.IOUtils.readFullyToByteArray(stream))
            finally:
                stream.close()
        except Exception as exc:
            if _java_class(exc) in _MISSING:
                return None
            raise _error(path, "read", exc) from None

    def list(self, directory: str) -> list[str]:
        try:
            statuses = self._fs.listStatus(self._Path(directory))
        except Exception as exc:
            if _java_class(exc) in _MISSING:
                return []
            raise _error(directory, "list", exc) from None
        if len(statuses) == 1 and statuses[0].isFile():
            # Hadoop lists a file as itself: a file where the directory should be.
            listed = self._Path(directory)
            if self._call(directory, "look up", self._fs.getFileStatus, listed).isFile():
                raise StorageError(f"{directory}: cannot list (it is a file, not a directory)")
        return sorted(str(status.getPath().getName()) for status in statuses)

    def files(self, directory: str) -> builtins.list[tuple[str, int]]:
        base = self._Path(directory)
        try:
            # One flat listing on an object store, a walk on HDFS: Hadoop picks.
            found = self._fs.listFiles(base, True)
            prefix = str(self._fs.makeQualified(base).toUri().getPath()).rstrip("/") + "/"
            names = []
            while found.hasNext():
                status = found.next()
                path = str(status.getPath().toUri().getPath())
                relative = path[len(prefix) :] if path.startswith(prefix) else path
                names.append((relative, int(status.getLen())))
        except Exception as exc:
            if _java_class(exc) in _MISSING:
                return []
            raise _error(directory, "list", exc) from None
        return sorted(names)

    def exists(self, path: str) -> bool:
        return bool(self._call(path, "look up", self._fs.exists, self._Path(path)))

    def delete(self, path: str) -> None:
        self._call(path, "delete", self._fs.delete, self._Path(path), True)

    def copy(self, source: str, target: str) -> bool:
        src, dst = self._Path(source), self._Path(target)
        try:
            return bool(
                self._jvm.org.apache.hadoop.fs.FileUtil.copy(
                    self._fs, src, self._fs, dst, False, True, self._conf
                )
            )
        except Exception as exc:
            if _java_class(exc) in _MISSING and not self.exists(source):
                return False
            raise _error(source, f"copy to {target}", exc) from None

    def download(self, path: str, local: str) -> bool:
        try:
            # Hadoop's own copy (no checksum file beside it), not bytes through py4j.
            self._fs.copyToLocalFile(False, self._Path(path), self._Path(f"file://{local}"), True)
        except Exception as exc:
            if _java_class(exc) in _MISSING:
                return False
            raise _error(path, f"download to {local}", exc) from None
        return True

    def upload(self, local: str, path: str) -> None:
        self._call(
            path,
            f"upload from {local}",
            self._fs.copyFromLocalFile,
            False,
            True,
            self._Path(f"file://{local}"),
            self._Path(path),
        )

    def modified(self, path: str) -> float | None:
        try:
            return int(self._fs.getFileStatus(self._Path(path)).getModificationTime()) / 1000
        except Exception as exc:
            if _java_class(exc) in _MISSING:
                return None
            raise _error(path, "look up", exc) from None

    def _write(self, path: Any, data: bytes, overwrite: bool) -> None:
        self._finish(self._fs.create(path, overwrite), data)

    @staticmethod
    def _finish(stream: Any, data: bytes) -> None:
        try:
            if data:
                stream.write(bytearray(data))
        finally:
            # An object store makes the object visible here (and a conditional put
            # that lost fails here), so close is not cleanup: its error is the outcome.
            stream.close()

    @staticmethod
    def _staged_name(path: str) -> str:
        directory, _, name = path.rstrip("/").rpartition("/")
        return f"{directory}/.{name}.{uuid.uuid4().hex}.tmp"

    def _options(self, enum: Any, value: Any) -> Any:
        options = self._gateway.new_array(enum, 1)
        options[0] = value
        return options

    @staticmethod
    def _call(path: str, doing: str, method: Any, *args: Any) -> Any:
        try:
            return method(*args)
        except Exception as exc:
            raise _error(path, doing, exc) from None


def _java_class(exc: BaseException) -> str:
    """The class name of the Java exception behind a py4j error ('' for a Python one)."""
    java = getattr(exc, "java_exception", None)
    if java is None:
        return ""
    try:
        return str(java.getClass().getName())
    except Exception:  # the gateway is gone
        return ""


def _error(path: str, doing: str, exc: BaseException) -> StorageError:
    """One line: the path, what failed, and the file system's own first words."""
    java = getattr(exc, "java_exception", None)
    if java is not None:
        name = _java_class(exc).rpartition(".")[2] or "error"
        try:
            message = str(java.getMessage() or "")
        except Exception:
            message = ""
    else:
        name, message = type(exc).__name__, str(exc)
    first = message.strip().splitlines()[0] if message.strip() else ""
    return StorageError(f"{path}: cannot {doing} ({name}{': ' if first else ''}{first[:300]})")
