"""Vectorized task processors: a task's records, and the state of the keys they name, as columns.

Owns :class:`BatchProcessor` (the user's class), :class:`TaskBatch` (what it
is given) and :class:`TaskUpdate` (what it returns). A ``BatchProcessor``
sees one virtual task's new records of a micro-batch at once, with one row
of state per distinct key they name, and returns the keys' new state and its
output as columns: a running count or a sum is a few numpy operations, not
a ``get`` and a ``put`` per record in a Python loop.

It is a :class:`~spark_elastic.state.processor.TaskProcessor` whose
``process`` reads the batch's keys from the task's state, calls
:meth:`BatchProcessor.process_batch` and writes the update back, so
everything ``with_task_state`` guarantees of ``process`` holds unchanged:
records in order, bucket checkpoints, output fences, hold-back, rescale.

Runs on executors, inside Python workers; pure numpy here, pandas imported
inside functions. May import what :mod:`spark_elastic.state` may.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from spark_elastic.errors import ArgumentError, ArgumentTypeError
from spark_elastic.state.processor import (
    _INT_BITS,
    StateField,
    TaskProcessor,
    TaskState,
    _fits,
    _state_key,
)

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["BatchProcessor", "TaskBatch", "TaskUpdate"]


@dataclass(frozen=True)
class TaskUpdate:
    """What :meth:`BatchProcessor.process_batch` returns: the keys' new state and the output.

    Attributes
    ----------
    state
        One row per key of :attr:`TaskBatch.keys`, in that order, with the
        columns of ``state_schema``; ``None`` leaves every key's state as it was.
    output
        Output rows with the columns of ``output_schema``, or ``None``.
    delete
        Booleans, one per key of :attr:`TaskBatch.keys`: forget that key's
        state (its row of ``state`` is not stored); ``None`` forgets none.
    """

    state: pd.DataFrame | None = None
    output: pd.DataFrame | None = None
    delete: Any = None


class TaskBatch:
    """One virtual task's new records of a micro-batch, with their keys' state, as columns.

    Built by :class:`BatchProcessor` on an executor, once per call of
    ``process``; valid during :meth:`BatchProcessor.process_batch` only.

    Attributes
    ----------
    name, key_bucket, elasticity_factor
        The virtual task, as on :class:`~spark_elastic.TaskState`.
    rows
        The records, as ``process`` gets them: in order, with the Kafka
        columns plus ``key_bucket`` and ``virtual_task``.
    keys
        The distinct record keys (``bytes``), in order of first appearance.
        Records without a key name none (their :attr:`key_index` is -1; only
        a processor with ``null_keys = True`` is given such records).
    key_index
        Per record, the index of its key in :attr:`keys` (int64; -1 for a
        record without a key).
    occurrence
        Per record, how many earlier records of the batch have its key
        (int64, from 0; -1 for a record without a key): a record's running
        count within the batch.
    has_state
        Per key, whether it had state before this batch.
    """

    def __init__(
        self,
        task: TaskState,
        rows: pd.DataFrame,
        key_column: str,
        fields: Sequence[StateField],
        null_keys: bool = False,
    ) -> None:
        import pandas as pd

        self.name = task.name
        self.key_bucket = task.key_bucket
        self.elasticity_factor = task.elasticity_factor
        self.rows = rows
        codes, uniques = pd.factorize(rows[key_column], use_na_sentinel=True)
        self.key_index = np.asarray(codes, dtype=np.int64)
        if not null_keys and (self.key_index < 0).any():
            first = int(np.flatnonzero(self.key_index < 0)[0])
            raise ArgumentTypeError(
                f"virtual task {task.name}: record {first} of the batch has no {key_column!r}, "
                "and keyed state needs one (its key_index would be -1, which numpy reads as "
                "the last key); set null_keys = True on the processor to be given such records"
            )
        self.keys = np.array([_state_key(k) for k in uniques], dtype=object)
        self.occurrence = _occurrence(self.key_index)
        self._fields = tuple(fields)
        self._values = [task.get(k) for k in self.keys]
        self.has_state = np.fromiter(
            (v is not None for v in self._values), dtype=bool, count=len(self._values)
        )

    def key_counts(self) -> Any:
        """How many records of the batch have each key.

        Returns
        -------
        numpy.ndarray
            int64, one per key of :attr:`keys`.
        """
        return np.bincount(self.key_index[self.key_index >= 0], minlength=len(self.keys))

    def state(self, default: Sequence[Any] | None = None) -> pd.DataFrame:
        """The state of every key of :attr:`keys` before this batch, one row each, in order.

        Parameters
        ----------
        default
            The value of a key without state, in the order of
            ``state_schema``, e.g. ``(0,)`` for a count; without it such a
            key's fields are missing (``None``, or NaN in a numeric column).

        Returns
        -------
        pandas.DataFrame
            The columns of ``state_schema``.
        """
        import pandas as pd

        names = [f.name for f in self._fields]
        if default is not None and len(tuple(default)) != len(names):
            raise ArgumentError.invalid(
                "default", f"{len(names)} fields ({', '.join(names)}) as in state_schema", default
            )
        fill = tuple(default) if default is not None else (None,) * len(names)
        values = [fill if v is None else v for v in self._values]
        if not values:
            return pd.DataFrame({n: pd.Series([], dtype=object) for n in names})
        return pd.DataFrame.from_records(values, columns=names)


class BatchProcessor(TaskProcessor):
    """A virtual task's logic over a whole batch of its records at once (vectorized).

    Subclass it, set ``state_schema`` and ``output_schema`` as for
    :class:`~spark_elastic.TaskProcessor`, and implement :meth:`process_batch`.
    It runs wherever a ``TaskProcessor`` does, with the same guarantees.
    Keep :class:`~spark_elastic.TaskProcessor` for logic that must look at
    each record in turn with its key's latest state (a record's output
    depending on the previous record's in a way columns cannot say).

    Notes
    -----
    The instance is pickled to the executors: keep it small and picklable.
    State is keyed by the records' own keys, as with ``TaskState``.
    """

    key_column = "key"
    """The column whose values key the state (the record key)."""
    null_keys = False
    """Whether records without a key are given (key index -1) rather than refused."""

    @abc.abstractmethod
    def process_batch(self, batch: TaskBatch) -> TaskUpdate:
        """Apply one virtual task's new records of a micro-batch, all at once.

        Runs on an executor, in a Python worker, once per virtual task with
        new records per micro-batch (more than once when some of them
        replay output an earlier owner published: then in order, each call
        seeing the state the last one left).

        Parameters
        ----------
        batch
            The records, their keys and the keys' state.

        Returns
        -------
        TaskUpdate
            The keys' new state and the output rows.
        """

    def process(self, task: TaskState, rows: pd.DataFrame) -> pd.DataFrame | None:
        """Read the batch's keys' state, run :meth:`process_batch`, write its update back.

        Runs on an executor, once per call of the library; not meant to be overridden.

        Parameters
        ----------
        task
            The task's keyed state.
        rows
            The task's records, as for :meth:`TaskProcessor.process`.

        Returns
        -------
        pandas.DataFrame or None
            The output of :meth:`process_batch`.
        """
        fields = task._fields or ()
        batch = TaskBatch(task, rows, self.key_column, fields, self.null_keys)
        update = self.process_batch(batch)
        if not isinstance(update, TaskUpdate):
            raise ArgumentTypeError.wrong_type(
                f"{type(self).__name__}.process_batch() result", "a TaskUpdate", update
            )
        _write(task, batch, update, fields)
        return update.output


def _occurrence(codes: Any) -> Any:
    """Per element, how many earlier elements have its code (-1 for code -1); stable, O(n log n)."""
    n = len(codes)
    out = np.full(n, -1, dtype=np.int64)
    if not n:
        return out
    order = np.argsort(codes, kind="stable")
    sorted_codes = codes[order]
    starts = np.flatnonzero(np.r_[True, sorted_codes[1:] != sorted_codes[:-1]])
    run_start = np.repeat(starts, np.diff(np.r_[starts, n]))
    out[order] = np.arange(n) - run_start
    out[codes < 0] = -1
    return out


def _write(
    task: TaskState, batch: TaskBatch, update: TaskUpdate, fields: Sequence[StateField]
) -> None:
    """Store ``update`` in ``task``: checked whole first, so a bad column writes nothing."""
    count = len(batch.keys)
    delete = np.zeros(count, dtype=bool)
    if update.delete is not None:
        delete = np.asarray(update.delete, dtype=bool)
        if delete.shape != (count,):
            raise ArgumentError.invalid(
                "TaskUpdate.delete", f"{count} booleans, one per key of the batch", delete.shape
            )
    columns = None
    if update.state is not None:
        state = update.state
        names = [f.name for f in fields]
        missing = [n for n in names if n not in getattr(state, "columns", ())]
        if missing or len(state) != count:
            raise ArgumentError.invalid(
                "TaskUpdate.state",
                f"a DataFrame of {count} rows (one per key of the batch) with the "
                f"state_schema columns {names}",
                f"{len(state)} rows, columns {list(getattr(state, 'columns', []))}",
            )
        columns = [_column_values(state[f.name], f) for f in fields]
    for gone in np.flatnonzero(delete).tolist():
        task.delete(batch.keys[gone])
    if columns is None:
        return
    for i, values in enumerate(zip(*columns, strict=True)):
        if not delete[i]:
            task._put_checked(batch.keys[i], values)


def _column_values(column: Any, field: StateField) -> list[Any]:
    """A state column as Python values its field can store, or one line saying why not."""
    dtype = column.dtype
    # Only numpy's own dtypes take the fast path: a nullable extension column (Int64,
    # boolean) holds pd.NA, which is no value the state can store; it is read as None.
    kind = dtype.kind if isinstance(dtype, np.dtype) else "O"
    fast = (
        (field.kind == "int" and kind in "iu")
        or (field.kind == "float" and kind in "iuf")
        or (field.kind == "bool" and kind == "b")
    )
    if fast:
        values: list[Any] = column.tolist()
        if not (field.kind == "int" and _out_of_range(column, field)):
            return values
    else:
        values = column.astype(object).where(column.notna(), None).tolist()
    if field.kind == "other":
        return values
    for value in values:
        if value is None or _fits(value, field):
            continue
        raise ArgumentTypeError(
            f"TaskUpdate.state: column {field.name!r} of state_schema expects {field.type}, "
            f"found {type(value).__name__} {value!r} (a {dtype} column); nothing was written"
        )
    return values


def _out_of_range(column: Any, field: StateField) -> bool:
    bits = _INT_BITS.get(field.type, 64)
    if not len(column):
        return False
    low, high = int(column.min()), int(column.max())
    return low < -(1 << (bits - 1)) or high >= (1 << (bits - 1))
