"""The file layer: every file the library writes for a job, on any file system Spark opens.

Owns how a job's files reach a file system (:mod:`.files`: the contract and
the local disk; :mod:`.hadoop`: HDFS, S3A and the rest through the driver's
JVM; :mod:`.resolve`: which of them a URI is on) and how output becomes
visible without a rename (:mod:`.commits`: numbered commit logs written
create-if-absent, which a successor seals so a zombie's late commit fails in
the storage itself).

May import :mod:`spark_elastic.errors`; pyspark and py4j only inside
:mod:`.hadoop`'s functions, so a coordinator that touches only local paths
loads neither.
"""

from spark_elastic.storage.commits import Commit, CommitLog
from spark_elastic.storage.files import LocalStorage, Storage, is_local, scheme_of
from spark_elastic.storage.hadoop import COMMIT_SCHEMES
from spark_elastic.storage.resolve import open_storage, storage_for

__all__ = [
    "COMMIT_SCHEMES",
    "Commit",
    "CommitLog",
    "LocalStorage",
    "Storage",
    "is_local",
    "open_storage",
    "scheme_of",
    "storage_for",
]
