"""What a task's records look like while they cross into the stateful operator's Python worker.

pyspark hands ``transformWithStateInPandas`` its input row by row: the
worker turns each Arrow batch into pandas, walks it with ``itertuples`` to
regroup the rows by grouping key, and builds a DataFrame again from those
rows (``pyspark/worker.py``, since SPARK-53361 packed several keys into one
Arrow batch). What a record costs there grows with its columns, and most
with a timestamp: each becomes a ``pandas.Timestamp`` object and is inferred
back into a column (4-5 µs of about 10 a record, docs/benchmarks.md, "A
record's path"). So the records cross as cheaply as they can, and are made
what the processor is promised again in the task, before anything reads them:

- a ``timestamp`` column (Spark's ``TimestampType``) crosses as its
  microseconds since the epoch (``unix_micros``, exact), and is made the
  naive datetime in the session's time zone that pyspark would have given;
- ``virtual_task`` (one string per record) and ``key_bucket`` do not
  cross: they are the same for all of a task's records, and the task knows
  its name and bucket; nor does a column the query knows is the same for
  every record (the topic of a job that reads one), given as a constant.

Columns come back in their order. Nothing is stored this way: state,
checkpoints and output are as before.

:func:`crossing` runs on the driver, once per query; :meth:`Crossing.restore`
on executors, once per task and micro-batch (the :class:`Crossing` is
pickled with the processor: strings only). May import what
:mod:`spark_elastic.state` may; pyspark and pandas inside functions only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from spark_elastic.dataplane.columns import quoted

if TYPE_CHECKING:
    from collections.abc import Mapping

    import pandas as pd
    from pyspark.sql import DataFrame

__all__ = ["BUCKET_COLUMN", "TASK_COLUMN", "Crossing", "crossing"]

TASK_COLUMN = "virtual_task"
"""The column each record names its virtual task in (``with_virtual_tasks``)."""
BUCKET_COLUMN = "key_bucket"
"""The column each record names its key bucket in (``with_virtual_tasks``)."""


@dataclass(frozen=True)
class Crossing:
    """How a query's records cross into its stateful operator, and how to restore them.

    Attributes
    ----------
    columns
        The records' columns, in order, before crossing.
    timestamps
        Those that cross as microseconds since the epoch.
    timezone
        The session's time zone, in which pyspark gives timestamps to pandas.
    constants
        ``(column, value)`` of string columns that hold one value in every
        record: they do not cross, and are restored as that value.
    """

    columns: tuple[str, ...] = ()
    timestamps: tuple[str, ...] = ()
    timezone: str = "UTC"
    constants: tuple[tuple[str, str], ...] = ()

    def restore(self, batch: pd.DataFrame, task: str, bucket: int = 0) -> pd.DataFrame:
        """``batch`` as pyspark would have given it uncrossed (executor, per task and batch).

        Parameters
        ----------
        batch
            One task's records as they crossed.
        task
            The task's name, for ``virtual_task``.
        bucket
            The task's key bucket, for ``key_bucket``.

        Returns
        -------
        pandas.DataFrame
            The records with every column of :attr:`columns`, in order.
        """
        import numpy as np
        import pandas as pd

        for name in self.timestamps:
            # Nulls come as NaN or None; both become NaT, as pyspark gives them.
            micros = pd.to_numeric(batch[name], errors="raise")
            utc = pd.to_datetime(micros, unit="us", utc=True)
            batch[name] = utc.dt.tz_convert(self.timezone).dt.tz_localize(None)
        # In the order they were, so each goes back to its place; int64 and str, as
        # pyspark's worker gives them after regrouping rows.
        values: dict[str, object] = dict(self.constants)
        values.update({BUCKET_COLUMN: np.int64(bucket), TASK_COLUMN: task})
        for place, name in enumerate(self.columns):
            if name in values and name not in batch.columns:
                batch.insert(place, name, values[name])
        return batch


def crossing(
    df: DataFrame, constants: Mapping[str, str] | None = None
) -> tuple[DataFrame, Crossing]:
    """``df`` as its records cross into the stateful operator, and how to restore them.

    Runs on the driver, once per query. ``constants`` names string columns of
    ``df`` and the one value each holds in every record (the caller knows it:
    a query of one topic); they are dropped and restored.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, TimestampType

    columns = tuple(df.columns)
    timestamps = tuple(f.name for f in df.schema.fields if isinstance(f.dataType, TimestampType))
    texts = {f.name for f in df.schema.fields if isinstance(f.dataType, StringType)}
    fixed = tuple((name, value) for name, value in (constants or {}).items() if name in texts)
    dropped = (TASK_COLUMN, BUCKET_COLUMN, *(name for name, _ in fixed))
    out = df.drop(*(c for c in dropped if c in columns))
    for name in timestamps:
        out = out.withColumn(name, F.unix_micros(F.col(quoted(name))))
    timezone = df.sparkSession.conf.get("spark.sql.session.timeZone") or "UTC"
    return out, Crossing(columns, timestamps, timezone, fixed)
