"""Process each virtual task's rows in offset order, the way a Samza task sees its input.

Sorting is not allowed on streaming DataFrames, so ordering happens inside a
``mapInPandas`` after routing: each Spark partition holds one virtual task's
rows of the micro-batch, which are sorted by (topic, partition, offset)
before the user's function sees them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from spark_elastic.dataplane.columns import KafkaColumns
from spark_elastic.errors import ArgumentTypeError, ColumnError

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

__all__ = ["TaskFunction", "map_tasks_in_pandas"]

TaskFunction = Callable[[str, "pd.DataFrame"], "pd.DataFrame | Iterable[pd.DataFrame]"]
"""``func(virtual_task, rows) -> DataFrame(s)``: one call per virtual task per micro-batch."""


def map_tasks_in_pandas(
    func: TaskFunction,
    schema: StructType | str,
    columns: KafkaColumns | Mapping[str, str] | None = None,
) -> Callable[[DataFrame], DataFrame]:
    """Call ``func`` once per virtual task with that task's rows in offset order.

    Apply to a DataFrame that went through :func:`with_virtual_tasks`:
    ``df.withVirtualTasks(8, ...).transform(map_tasks_in_pandas(func, schema))``.

    Parameters
    ----------
    func
        ``func(virtual_task, rows)``: ``rows`` is a pandas DataFrame of the
        task's records in this micro-batch (or batch), sorted by topic,
        partition and offset, with every input column; return a pandas
        DataFrame (or an iterable of them) matching ``schema``. Runs on
        executors, in a Python worker, once per virtual task per micro-batch;
        it must be picklable (module-level functions and their closures are).
    schema
        The output schema, as for ``DataFrame.mapInPandas``.
    columns
        Names of the Kafka columns used for ordering, if not the defaults.

    Returns
    -------
    Callable[[DataFrame], DataFrame]
        The transform, for ``df.transform(...)``; streaming-safe (no sort on
        the DataFrame itself).
    """
    if not callable(func):
        raise ArgumentTypeError.wrong_type("func", "a callable func(virtual_task, rows)", func)
    cols = KafkaColumns.of(columns)
    order = [cols.topic, cols.partition, cols.offset]

    def transform(df: DataFrame) -> DataFrame:
        if "virtual_task" not in df.columns:
            raise ColumnError(
                "column 'virtual_task': missing; apply withVirtualTasks(...) before "
                f"map_tasks_in_pandas, found columns {sorted(df.columns)}"
            )
        return df.mapInPandas(_in_task_order(func, order), schema)

    return transform


def _in_task_order(
    func: TaskFunction, order: list[str]
) -> Callable[[Iterator[pd.DataFrame]], Iterator[pd.DataFrame]]:
    """The per-partition function ``mapInPandas`` runs on executors (must be picklable)."""

    def run(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        import pandas as pd

        # The whole partition is needed before sorting: one task's rows of one micro-batch.
        frames = [batch for batch in batches if len(batch)]
        if not frames:
            return
        rows = pd.concat(frames, ignore_index=True)
        # Routing gives one task per partition; grouping keeps this correct without routing.
        for task, group in rows.groupby("virtual_task", sort=True):
            ordered = group.sort_values(order, kind="stable").reset_index(drop=True)
            yield from frames_of(func(str(task), ordered))

    return run


def frames_of(result: Any) -> Iterator[pd.DataFrame]:
    """A user function's result as DataFrames: one, an iterable of them, or None."""
    import pandas as pd

    if isinstance(result, pd.DataFrame):
        yield result
    elif result is not None:
        yield from result
