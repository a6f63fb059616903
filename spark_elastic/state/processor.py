"""Stateful virtual tasks: keyed state per virtual task, with per-key-bucket checkpoints.

The user writes a :class:`TaskProcessor`; :func:`with_task_state` runs it with
``transformWithStateInPandas`` grouped by ``routing_key``, so each call sees
one virtual task's new records of a micro-batch, in offset order per stream
partition. A task's state is keyed by its routing key, not placed by its
number: a query has as many state partitions as it can run at once (the
tasks it owns, at most the session's default parallelism), so a micro-batch
opens and commits that many RocksDB stores whatever the job's task count
(no extra shuffle: the rows are hash-partitioned by ``routing_key`` into that
many partitions, as the stateful operator needs).

Beside the user's keyed state, the same StateStore (and so the same commit)
keeps the task's *bucket checkpoints*: per (stream, partition, key bucket,
factor) the next offset to apply. A record below a checkpoint of its key is
skipped and counted, never handed to the user, so a replay, or a start below
what a bucket needs (after a rescale), changes no state and emits nothing
twice.

A checkpoint may also hold *output fences* of the same shape
(``_spark_elastic/fences.json``, written by a warm-up that replays its old
owners' records): a record not applied yet but below its key's fence was
published by an earlier owner, so it is applied to state with the output of
that call dropped. This relies on what replays after a rescale rely on
already: ``process`` gives the same state for a key's records in the same
order, however they are split into micro-batches.
"""

from __future__ import annotations

import abc
import itertools
import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from spark_elastic.dataplane.buckets import SLOTS, HashMode, bucket_of_key, key_slot
from spark_elastic.dataplane.columns import KafkaColumns, quoted
from spark_elastic.dataplane.ordered import (
    check_order,
    check_timestamp_column,
    frames_of,
    in_order,
)
from spark_elastic.dataplane.transforms import (
    PartitionCounts,
    VirtualTaskRouting,
    _plan_for,
    _resolve_factor,
    _stream_inputs,
    check_known_counts,
    streaming_sources,
    with_virtual_tasks,
)
from spark_elastic.errors import ArgumentError, ArgumentTypeError, CheckpointError, StorageError
from spark_elastic.model.groupers import plan_job
from spark_elastic.model.plan import Grouper, JobPlan, StreamInput
from spark_elastic.state.checkpoint_dir import (
    Fence,
    JobSpec,
    OwnerLock,
    fences_of,
    has_seed,
    is_fresh,
    last_batch,
    never_committed,
    pinned_conf,
    read_job,
    read_seed,
    write_bootstrap,
    write_job,
)
from spark_elastic.state.checkpoint_dir import checkpoint_location as checkpoint_location_of
from spark_elastic.state.chunks import (
    LAYOUT_VERSION,
    Entries,
    Layout,
    chunk_count,
    chunk_of,
    decode,
    depth_for,
    encode,
    min_depth,
    regroup,
    should_grow,
    target_keys,
)
from spark_elastic.state.crossing import BUCKET_COLUMN, TASK_COLUMN, Crossing, crossing
from spark_elastic.state.holdback import (
    HELD_SCHEMA,
    HELD_STATE,
    check_idle,
    decode_held,
    encode_held,
    held_from,
    release,
    unplaced,
)
from spark_elastic.state.query_settings import (
    SHUFFLE_PARTITIONS_KEY,
    STATE_PARTITIONS_METRIC,
    install_start_hook,
)
from spark_elastic.state.shipped import Shipped, ship_bootstrap, ship_fences
from spark_elastic.storage import storage_for

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "CHECKPOINT_STATE",
    "LAYOUT_STATE",
    "METRICS_NAME",
    "OLD_USER_STATE",
    "USER_STATE",
    "StateField",
    "TaskProcessor",
    "TaskState",
    "with_task_state",
]

USER_STATE = "user_state_chunks"
"""Name of the MapState holding the user's keyed state in chunks (see :mod:`.chunks`)."""
LAYOUT_STATE = "user_state_layout"
"""Name of the ValueState holding a task's chunk depth and key count."""
OLD_USER_STATE = "user_state"
"""Layout 1's MapState: one entry per key (key binary -> state_schema)."""
CHECKPOINT_STATE = "bucket_checkpoints"
"""Name of the MapState holding the task's bucket checkpoints."""
METRICS_NAME = "spark_elastic"
"""The observation name under ``lastProgress["observedMetrics"]``."""

CHECKPOINT_KEY_SCHEMA = "stream string, partition int, key_bucket int, factor int"
CHECKPOINT_VALUE_SCHEMA = "next_offset long"
CHUNK_KEY_SCHEMA = "chunk int"
CHUNK_VALUE_SCHEMA = "entries int, data binary"
LAYOUT_SCHEMA = "depth int, keys long"
# No leading underscores: pandas conversion renames such columns positionally.
BUCKET_HASH = "spark_elastic_bucket_hash"
_KIND = "spark_elastic_kind"
"""Derived in the JVM for a holding query's marks: ``"metrics"`` where :data:`_METRICS`
is set, else ``"row"`` (a column the Python worker would convert row by row)."""
_METRICS = "spark_elastic_metrics"
"""A task step's figures, comma-separated in :data:`_METRIC_NAMES` order, on a copy of
its last output row (a row of their own when it has none; see ``_tagged``); null on
output rows (a column of null strings converts to Arrow at a fifth of the cost of null
arrays)."""
_METRIC_NAMES = (
    "records_processed",
    "records_skipped",
    "key_bucket_ns",
    "checkpoint_resolve_ns",
    "records_held",
    "records_enforced",
)
_TASK = "spark_elastic_task"
_HELD_FROM = "spark_elastic_held_from"
MARK_COLUMNS = (_KIND, _TASK, _HELD_FROM)
"""The columns a holding query's marks come in, with ``_marks=True`` (a running job's
container): rows of kind ``"metrics"`` name their task (its id in the plan) and where its
held records start (:func:`~spark_elastic.state.holdback.held_from`); the others are
output (``"row"``)."""
_INTERNAL_INPUT = ("routing_key", BUCKET_HASH)
_BOOTSTRAP_LOOK_MS = 1_000
"""While its bootstrap streams are being read, how often a task holding records looks
whether they are read (one file read per task per look)."""


class TaskProcessor(abc.ABC):
    """A virtual task's logic: subclass it, set the two schemas, implement :meth:`process`.

    Attributes
    ----------
    state_schema
        DDL of the per-key state value, e.g. ``"count long, last_offset long"``.
    output_schema
        DDL of the rows :meth:`process` returns.
    input_columns
        The record columns :meth:`process` reads, or None (the default) for
        all of them. The others are dropped before the shuffle, so they are
        neither moved, sorted nor converted to pandas: a job that reads
        three of a record's columns pays for three. The key, topic,
        partition and offset columns, ``virtual_task`` and ``key_bucket``
        (and the timestamp, in time order) are given whatever it says.

    Notes
    -----
    The instance is pickled to the executors: keep it small and picklable
    (configuration only; state lives in :class:`TaskState`).
    """

    state_schema: ClassVar[str]
    output_schema: ClassVar[str]
    input_columns: ClassVar[Sequence[str] | None] = None

    @abc.abstractmethod
    def process(
        self, task: TaskState, rows: pd.DataFrame
    ) -> pd.DataFrame | Iterable[pd.DataFrame] | None:
        """Apply one virtual task's new records of a micro-batch.

        Runs on an executor, in a Python worker, once per virtual task with
        new records per micro-batch.

        Parameters
        ----------
        task
            The task's name and keyed state.
        rows
            The task's records not applied before, sorted by topic, partition
            and offset, with the Kafka columns plus ``key_bucket`` and
            ``virtual_task`` (only those :attr:`input_columns` keeps, if set).

        Returns
        -------
        pandas.DataFrame, iterable of them, or None
            Output rows matching :attr:`output_schema`.
        """


class TaskState:
    """One virtual task's name and keyed state, valid during one :meth:`TaskProcessor.process`.

    Values are tuples in the order of ``state_schema``. Writes are buffered;
    they reach the StateStore when ``process`` returns, and commit with the
    micro-batch.

    State is keyed by the records' own keys (the ``key`` column): a rescale
    sends each state entry to the virtual task that its key hashes to, so a
    state key that is not a record key of this task (say, a field of the
    value) would land on some other task after a split.

    Notes
    -----
    Keys are stored in chunks (:mod:`spark_elastic.state.chunks`): the first
    access to a chunk in a call is one StateStore round trip, and so is
    writing it back; a call that touches most of a task's chunks reads them
    all in a few paged round trips instead.
    """

    def __init__(
        self,
        name: str,
        key_bucket: int,
        elasticity_factor: int,
        store: Any,
        *,
        fields: tuple[StateField, ...] | None = None,
        hash: HashMode = "spark",
        known_hashes: Mapping[bytes, int] | None = None,
        layout: Layout | None = None,
        seeded: Mapping[int, bytes] | None = None,
        unstored: Mapping[int, int] | None = None,
    ) -> None:
        self.name = name
        """The virtual task's name, e.g. ``Partition 0_1_2``."""
        self.key_bucket = key_bucket
        self.elasticity_factor = elasticity_factor
        self._store = store
        self._fields = fields
        self._hash: HashMode = hash
        # Key slots Spark already computed for this batch's records: most keys need no hashing.
        self._known_slots = dict(known_hashes or {})
        # No stored layout: a task that never wrote state (or a stand-in store); chunks are read.
        self._stored_layout = layout
        self._layout = layout or Layout(min_depth(elasticity_factor), 0)
        self._chunks: dict[int, Entries] = {}
        self._loaded_sizes: dict[int, int] = {}
        self._dirty: set[int] = set()
        self._all_loaded = False
        # The task's whole state as its seed gave it (a rescaled checkpoint's first batch):
        # chunks come from here, not from the StateStore.
        self._seeded = seeded
        # Seeded chunks not in the StateStore yet (chunk -> its key count): flush writes each
        # once, as the step left it, instead of the seed writing it and the step again.
        self._unstored = dict(unstored or {})

    def get(
        self, key: bytes | str, default: tuple[Any, ...] | None = None
    ) -> tuple[Any, ...] | None:
        """The state of ``key``, or ``default`` if it has none.

        Runs on an executor, inside :meth:`TaskProcessor.process`; the first
        read of a key's chunk in a call is one round trip to the StateStore,
        later reads of its keys are in memory.

        Parameters
        ----------
        key
            A record key (``bytes``, or ``str`` read as its UTF-8 bytes).
        default
            Returned when the key has no state.

        Returns
        -------
        tuple or None
            The value, in the order of ``state_schema``.
        """
        k = _state_key(key)
        entry = self._chunk(self._slot(k)).get(k)
        return default if entry is None else entry[1]

    def put(self, key: bytes | str, value: Iterable[Any]) -> None:
        """Set the state of ``key``, a record key of this task (see the class notes).

        Parameters
        ----------
        key
            A record key (``bytes``, or ``str`` read as its UTF-8 bytes).
        value
            The new value, in the order of ``state_schema``; buffered until
            ``process`` returns, committed with the micro-batch.

        Raises
        ------
        ArgumentTypeError
            A field's value does not have the field's type (Arrow would store
            it as null); the message names the key, field, type and value.
        ArgumentError
            The value has the wrong number of fields, or the key's bucket is
            not this task's: state is keyed by the task's record keys, and a
            rescale would move any other key to another task or lose it.
        """
        k = _state_key(key)
        values = tuple(_native(v) for v in value)
        if self._fields is not None:
            _check_value(k, values, self._fields)
        slot = self._slot(k)
        self._check_owned(k, slot)
        self._chunk(slot)[k] = (slot, values)
        self._dirty.add(chunk_of(slot, self._layout.depth))

    def _put_checked(self, key: bytes, values: tuple[Any, ...]) -> None:
        """:meth:`put` of a value its caller checked against the fields already."""
        slot = self._slot(key)
        self._check_owned(key, slot)
        self._chunk(slot)[key] = (slot, values)
        self._dirty.add(chunk_of(slot, self._layout.depth))

    def _check_owned(self, key: bytes, slot: int) -> None:
        if self.elasticity_factor == 1:
            return
        bucket = slot % self.elasticity_factor
        if bucket != self.key_bucket:
            raise ArgumentError(
                f"task.put({key!r}): the key is in bucket {bucket} of {self.elasticity_factor}, "
                f"not in this virtual task's ({self.name}, bucket {self.key_bucket}); state is "
                "keyed by record keys (the rows' key column), because a rescale moves each "
                "entry to the task its key hashes to, so a key of another task, such as a "
                "shared counter, would be lost or split at the next rescale"
            )

    def delete(self, key: bytes | str) -> None:
        """Forget ``key`` (buffered like :meth:`put`).

        Parameters
        ----------
        key
            A record key (``bytes``, or ``str`` read as its UTF-8 bytes).
        """
        k = _state_key(key)
        slot = self._slot(k)
        if self._chunk(slot).pop(k, None) is not None:
            self._dirty.add(chunk_of(slot, self._layout.depth))

    def flush(self) -> Layout:
        """Write changed chunks to the StateStore (called by the library); the new layout.

        Doubles the task's chunks first when they average more than
        :data:`~spark_elastic.state.chunks.GROW_AT` keys, or fewer large ones
        (:func:`~spark_elastic.state.chunks.target_keys` of the key size the
        changed chunks show), reading all of them once, so the chunks a batch
        rewrites stay small as state grows.

        Returns
        -------
        Layout
            The task's chunk depth and key count after the writes.
        """
        keys = self._layout.keys + sum(
            len(self._chunks[c]) - self._loaded_sizes[c] for c in self._dirty
        )
        layout = Layout(self._layout.depth, keys)
        # Encoded before deciding: the changed chunks' size per key sets how many keys fit.
        encoded = {c: encode(e) for c in self._dirty if (e := self._chunks.get(c))}
        sized = sum(len(self._chunks[c]) for c in encoded)
        target = target_keys(sum(map(len, encoded.values())) / sized if sized else None)
        if should_grow(layout, self.elasticity_factor, target):
            self._load_all()
            layout = Layout(depth_for(keys, self.elasticity_factor, target), keys)
            old = set(self._chunks)
            self._chunks = regroup(self._chunks.values(), layout.depth)
            self._dirty = old | set(self._chunks)
            for c in self._chunks:
                self._loaded_sizes.setdefault(c, 0)
            encoded = {}  # regrouped: every chunk is encoded anew
        for c in sorted(self._dirty):
            entries = self._chunks.get(c, {})
            if entries:
                data = encoded.get(c)
                self._store.updateValue((c,), (len(entries), data or encode(entries)))
            elif self._loaded_sizes.get(c, 0) and c not in self._unstored:
                self._store.removeKey((c,))
            self._loaded_sizes[c] = len(entries)
        if self._unstored and self._seeded is not None:
            for c in sorted(self._unstored.keys() - self._dirty):  # untouched: as seeded
                self._store.updateValue((c,), (self._unstored[c], self._seeded[c]))
            self._unstored = {}
        self._dirty.clear()
        self._layout = layout
        return layout

    # -- chunks ---------------------------------------------------------------------------------

    def _slot(self, key: bytes) -> int:
        known = self._known_slots.get(key)
        return known if known is not None else bucket_of_key(key, SLOTS, self._hash)

    def _chunk(self, slot: int) -> Entries:
        c = chunk_of(slot, self._layout.depth)
        entries = self._chunks.get(c)
        if entries is None:
            data = self._read(c)
            entries = {} if data is None else decode(data)
            self._chunks[c] = entries
            self._loaded_sizes[c] = len(entries)
        return entries

    def _read(self, chunk: int) -> bytes | None:
        """The stored bytes of a chunk not read yet, or None if it holds no key."""
        if self._seeded is not None:
            return self._seeded.get(chunk)
        if self._all_loaded:
            return None
        value = self._store.getValue((chunk,))
        return None if value is None else value[1]  # type: ignore[no-any-return]

    def _load_all(self) -> None:
        """Read every chunk not read yet: a few paged round trips, whatever the chunk count."""
        if self._all_loaded:
            return
        stored = (
            self._seeded.items()
            if self._seeded is not None
            else ((c, data) for (c,), (_, data) in self._store.iterator())
        )
        for c, data in stored:
            if c not in self._chunks:
                entries = decode(data)
                self._chunks[c] = entries
                self._loaded_sizes[c] = len(entries)
        self._all_loaded = True

    def _prefetch(self, slots: Any) -> None:
        """Read all chunks at once when this batch's keys touch a quarter of them or more."""
        depth = self._layout.depth
        if self._seeded is not None:
            return  # in memory already: each chunk is decoded when first touched
        if self._stored_layout is not None and self._stored_layout.keys == 0:
            self._all_loaded = True  # the layout says no chunk holds a key
            return
        touched = np.unique(np.asarray(slots, dtype=np.int64) & ((1 << depth) - 1)).size
        if 4 * touched >= chunk_count(depth, self.elasticity_factor):
            self._load_all()


def _state_key(key: bytes | str) -> bytes:
    if isinstance(key, str):
        return key.encode()
    if isinstance(key, bytes | bytearray):
        return bytes(key)
    raise ArgumentTypeError.wrong_type(
        "key", "the record's key (bytes or str); null-key records have no keyed state", key
    )


def _native(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


@dataclass(frozen=True)
class StateField:
    """One field of ``state_schema``: name, Spark type and how Python values are checked.

    Built on the driver, pickled to executors with the processor.

    Attributes
    ----------
    name
        The field's name.
    type
        Its Spark type, e.g. ``"bigint"``.
    kind
        ``"int"``, ``"float"``, ``"bool"``, ``"str"``, ``"bytes"`` or ``"other"``
        (not checked: dates, decimals, nested types).
    """

    name: str
    type: str
    kind: str


_INT_BITS = {"tinyint": 8, "smallint": 16, "int": 32, "bigint": 64}


def _check_value(key: bytes, values: tuple[Any, ...], fields: tuple[StateField, ...]) -> None:
    """Refuse a value Arrow would store as null or mangle (runs on an executor, per put)."""
    if len(values) != len(fields):
        raise ArgumentError(
            f"task.put({key!r}, value): expected {len(fields)} fields "
            f"({', '.join(f.name for f in fields)}) as in state_schema, found {len(values)}: "
            f"{values!r}"
        )
    for field_, value in zip(fields, values, strict=True):
        if value is None or _fits(value, field_):
            continue
        raise ArgumentTypeError(
            f"task.put({key!r}, value): field {field_.name!r} of state_schema expects "
            f"{field_.type}, found {type(value).__name__} {value!r}; nothing was written"
        )


def _fits(value: Any, field_: StateField) -> bool:
    kind = field_.kind
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            return False
        bits = _INT_BITS.get(field_.type, 64)
        return -(1 << (bits - 1)) <= value < (1 << (bits - 1))
    if kind == "float":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "str":
        return isinstance(value, str)
    if kind == "bytes":
        return isinstance(value, bytes | bytearray)
    return True


def _as_kind(value: Any, kind: str) -> Any:
    """A seed value as the Python type its state field needs (``kind`` from :func:`_kind_of`)."""
    value = _native(value)
    if value is None or (isinstance(value, float) and value != value):  # NaN: a null
        return None
    if kind == "int":
        return int(value)
    if kind == "float":
        return float(value)
    if kind == "bool":
        return bool(value)
    return value


def _kind_of(data_type: Any) -> str:
    """How a state field's values convert back from pandas (runs on the driver)."""
    from pyspark.sql import types as T

    if isinstance(data_type, T.IntegralType):
        return "int"
    if isinstance(data_type, T.FractionalType) and not isinstance(data_type, T.DecimalType):
        return "float"
    if isinstance(data_type, T.BooleanType):
        return "bool"
    if isinstance(data_type, T.StringType):
        return "str"
    if isinstance(data_type, T.BinaryType):
        return "bytes"
    return "other"


@dataclass(frozen=True)
class _TaskRoute:
    name: str
    key_bucket: int
    task_id: int
    partitions: tuple[tuple[str, int], ...] = ()


_SEEDS_KEPT_BYTES = 128 << 20
"""The most seed bytes one Python worker keeps for its tasks' first steps; beyond, they read."""


@dataclass
class _Seed:
    """What one task's seed gave it in this micro-batch (executor, per seeded task).

    A seed is the task's whole state (a seeded checkpoint starts empty), so
    the task's first step reads it from here instead of reading back what
    was just written: at a million keys that read was a third of a rescaled
    query's first batch. ``whole`` is false once chunks were left out (the
    worker kept :data:`_SEEDS_KEPT_BYTES` already): then the step reads.

    ``stored`` is false while the chunks in hand are not in the StateStore:
    the task's step writes each once, as it leaves it (most chunks of a
    rescaled task change in its first batch, and each write is a round
    trip), and :meth:`_ElasticProcessor.close` writes those of a task that
    had no step, under ``key``.
    """

    key: tuple[Any, ...] = ()
    chunks: dict[int, bytes] = field(default_factory=dict)
    entries: dict[int, int] = field(default_factory=dict)
    layout: Layout | None = None
    checkpoints: dict[tuple[Any, ...], int] = field(default_factory=dict)
    whole: bool = True
    size: int = 0
    stored: bool = True


class _ElasticProcessor:
    """The ``StatefulProcessor`` spark-elastic runs: checkpoints around the user's processor.

    Pickled to executors with the user's processor and the routing table.
    """

    def __init__(
        self,
        user: TaskProcessor,
        routes: Mapping[int, _TaskRoute],
        elasticity_factor: int,
        state_schema: str,
        state_fields: tuple[StateField, ...],
        output_columns: tuple[str, ...],
        bucket_checkpoints: bool = True,
        hash: HashMode = "spark",
        key_column: str = "key",
        fences: Shipped | None = None,
        order: tuple[str, str] = ("offset", "timestamp"),
        idle_ms: int = 0,
        bootstrap: tuple[str, ...] = (),
        bootstrap_done: Shipped | None = None,
        crossing: Crossing | None = None,
    ) -> None:
        self.user = user
        self.crossing = crossing or Crossing()
        self.fences = fences
        self.order, self.timestamp = order
        # Hold-back (Kafka Streams' max.task.idle.ms, Samza's bootstrap streams) only when
        # asked: a query without it keeps the state variables and time mode checkpoints made
        # before it had.
        self.idle_ms = idle_ms
        self.bootstrap, self.bootstrap_done = bootstrap, bootstrap_done
        self.holds = idle_ms > 0 or bool(bootstrap)
        self.routes = dict(routes)
        self.factor = elasticity_factor
        self.state_schema = state_schema
        self.state_fields = state_fields
        self.hash: HashMode = hash
        self.key_column = key_column
        self.bucket_checkpoints = bucket_checkpoints
        self.output_columns = output_columns
        # pyspark's worker regroups a partition's rows by task across Arrow batches, and seeds
        # and records come in batches of their own: it may hand over every seed of a partition
        # before any task's records, each in a call of its own. Each is kept until its task's
        # step.
        self._seeds: dict[int, _Seed] = {}
        self._seeds_size = 0
        # pyspark's client to the state server, to write a seed in close() under its task's
        # key; without it (another pyspark), each seed is written as it comes.
        self._client: Any = None

    # -- Spark hooks (names fixed by StatefulProcessor) -----------------------------------------

    def state_variables(self) -> tuple[tuple[str, str, tuple[Any, ...]], ...]:
        """The state variables ``init`` is given: (``"map"`` or ``"value"``, name, schemas).

        Runs on the driver, once a query is built; the schemas are pyspark ``StructType``s.
        """
        variables: list[tuple[str, str, tuple[Any, ...]]] = [
            ("map", USER_STATE, (struct_of(CHUNK_KEY_SCHEMA), struct_of(CHUNK_VALUE_SCHEMA))),
            ("value", LAYOUT_STATE, (struct_of(LAYOUT_SCHEMA),)),
            (
                "map",
                CHECKPOINT_STATE,
                (struct_of(CHECKPOINT_KEY_SCHEMA), struct_of(CHECKPOINT_VALUE_SCHEMA)),
            ),
        ]
        if self.holds:
            variables.append(("value", HELD_STATE, (struct_of(HELD_SCHEMA),)))
        return tuple(variables)

    def init(self, handle: Any, states: Mapping[str, Any]) -> None:
        """Take the state variables of :meth:`state_variables`, registered on ``handle``."""
        _freeze_worker_heap()
        client = getattr(handle, "_statefulProcessorApiClient", None)
        if all(hasattr(client, m) for m in ("set_implicit_key", "remove_implicit_key")):
            self._client = client
        self.state = states[USER_STATE]
        self.layout = states[LAYOUT_STATE]
        self.checkpoints = states[CHECKPOINT_STATE]
        if self.holds:
            self.handle = handle
            self.held = states[HELD_STATE]

    def handleInitialState(
        self, key: tuple[Any, ...], seed: pd.DataFrame, timer_values: Any
    ) -> None:
        # One round trip per chunk (a seed holds whole chunks), not per key; none at all for
        # the chunks kept for the task's step, which writes them.
        kept = self._seeds.get(int(key[0]))
        if kept is None:
            kept = _Seed(key=tuple(key), stored=self._client is None)
            self._seeds[int(key[0])] = kept
        for row in seed.itertuples(index=False):
            if row.kind == "chunk":
                chunk, entries, data = int(row.chunk), int(row.entries), bytes(row.data)
                if not self._keep(kept, chunk, entries, data) or kept.stored:
                    self.state.updateValue((chunk,), (entries, data))
            elif row.kind == "layout":
                kept.layout = Layout(int(row.depth), int(row.keys))
                self.layout.update((kept.layout.depth, kept.layout.keys))
            elif row.kind == "held":
                if self.holds:
                    self.held.update((bytes(row.data), str(row.clocks)))
                else:
                    raise CheckpointError(
                        f"virtual task {self.routes[int(key[0])].name}: its seed holds records "
                        "held back in time order (max_task_idle_ms), but this query does not "
                        "hold records back; start it with max_task_idle_ms > 0"
                    )
            else:
                entry = (str(row.stream), int(row.partition), int(row.key_bucket), int(row.factor))
                self.checkpoints.updateValue(entry, (int(row.next_offset),))
                kept.checkpoints[entry] = int(row.next_offset)

    def handleInputRows(
        self, key: tuple[Any, ...], rows: Iterator[pd.DataFrame], timer_values: Any
    ) -> Iterator[pd.DataFrame]:
        import pandas as pd

        (routing_key,) = key
        route = self.routes[int(routing_key)]
        seed = self._seeds.pop(int(routing_key), None)
        if seed is not None:
            self._seeds_size -= seed.size
            seed = seed if seed.whole else None  # one not whole is in the store
        frames = [frame for frame in rows if len(frame)]
        if not frames:
            self._store_seed(seed)
            return
        batch = self.crossing.restore(
            pd.concat(frames, ignore_index=True), route.name, route.key_bucket
        )
        if not self.holds:
            batch = in_order(batch, self.order, KafkaColumns(), self.timestamp)

        started = time.perf_counter_ns()
        if not self.bucket_checkpoints:
            entries = []
        elif seed is not None:
            entries = list(seed.checkpoints.items())
        else:
            entries = [(tuple(k), int(v[0])) for k, v in self.checkpoints.iterator()]
        bucket_started = time.perf_counter_ns()
        skip = _covered(batch, entries)
        bucket_ns = time.perf_counter_ns() - bucket_started
        fresh = batch[~skip]
        if self.bucket_checkpoints:
            self._advance(fresh, entries, route.key_bucket)
        resolve_ns = time.perf_counter_ns() - started - bucket_ns
        ready, held, enforced, mark = fresh, 0, 0, None
        if self.holds:
            ready, held, enforced, mark = self._hold_back(route, fresh, _now_ms(timer_values))
        elif self.order == "timestamp":
            enforced = unplaced(fresh, route.partitions)
        figures = (len(fresh), int(skip.sum()), bucket_ns, resolve_ns, held, enforced)
        yield from self._tagged(self._apply(route, ready, seed), figures, route, mark)
        self._store_seed(seed)  # no records to apply (all skipped or held): the seed as it is

    def handleExpiredTimer(
        self, key: tuple[Any, ...], timer_values: Any, expired_timer_info: Any
    ) -> Iterator[pd.DataFrame]:
        """A held task's wait is over: release what it holds (executor, per timer)."""
        (routing_key,) = key
        route = self.routes[int(routing_key)]
        if not self.holds:
            return
        now = max(_now_ms(timer_values), int(expired_timer_info.getExpiryTimeInMs()))
        ready, held, enforced, mark = self._hold_back(route, None, now, timer=True)
        figures = (0, 0, 0, 0, held, enforced)
        yield from self._tagged(self._apply(route, ready), figures, route, mark)

    def _hold_back(
        self, route: _TaskRoute, fresh: pd.DataFrame | None, now_ms: int, timer: bool = False
    ) -> tuple[pd.DataFrame, int, int, str]:
        """Merge what the task held with what is new; keep what cannot be placed yet.

        Returns the records to apply now, how many stay held, how many were
        released without waiting (:func:`~spark_elastic.state.holdback.release`),
        and the task's mark (:func:`~spark_elastic.state.holdback.held_from`).
        """
        import pandas as pd

        stored = self.held.get()
        held, clocks = (None, {}) if stored is None else decode_held(stored[0], stored[1])
        if held is not None and self.crossing.columns:
            held = self._as_crossed(route, held)
        parts = [f for f in (held, fresh) if f is not None and len(f)]
        if not parts:
            return pd.DataFrame(), 0, 0, held_from(None, timer)
        buffer = pd.concat(parts, ignore_index=True)
        if "virtual_task" in buffer.columns:
            # Held across a split or merge, a record names the task that first read it.
            buffer["virtual_task"] = route.name
        reading = self.bootstrap and not _bootstrapped(self.bootstrap_done)
        first = frozenset(self.bootstrap) if reading else frozenset()
        step = release(
            buffer, route.partitions, clocks, now_ms, self.idle_ms, self.timestamp, first
        )
        for when in self.handle.listTimers():
            self.handle.deleteTimer(when)
        if len(step.held):
            self.held.update(encode_held(step.held, step.clocks))
            # Bootstrapping, the driver says when it is over: look again in a while.
            wake = now_ms + _BOOTSTRAP_LOOK_MS if first else step.wake_at_ms
            if wake is not None:
                self.handle.registerTimer(wake)
        else:
            self.held.update(encode_held(buffer.iloc[:0], step.clocks))
        return step.ready, len(step.held), step.enforced, held_from(step.held, timer)

    def _as_crossed(self, route: _TaskRoute, held: pd.DataFrame) -> pd.DataFrame:
        """Held records with this query's columns: a column the processor no longer reads
        is dropped; one it now reads that they lack cannot be made up."""
        lacking = [c for c in self.crossing.columns if c not in held.columns]
        if lacking and not len(held):
            return held  # nothing held: nothing to make up
        if lacking:
            raise CheckpointError(
                f"virtual task {route.name}: the records it holds back were read without "
                f"columns {lacking}, which input_columns now names; start the query with the "
                "input_columns they were held with until they are released"
            )
        return held[list(self.crossing.columns)]

    def _apply(
        self, route: _TaskRoute, fresh: pd.DataFrame, seed: _Seed | None = None
    ) -> Iterator[pd.DataFrame]:
        """Apply records in order to the task's state and yield the processor's output.

        Records below the checkpoint's output fences were published by an
        earlier owner: they go into the state and their output is dropped.
        ``seed``: what the task's seed wrote just before (its whole state).
        """
        if not len(fresh):
            return
        fences = _fences(self.fences)
        quiet = _covered(fresh, fences) if fences else np.zeros(len(fresh), dtype=bool)
        if seed is not None:
            layout = seed.layout
        else:
            stored = self.layout.get()
            layout = None if stored is None else Layout(int(stored[0]), int(stored[1]))
        state = TaskState(
            route.name,
            route.key_bucket,
            self.factor,
            self.state,
            fields=self.state_fields,
            hash=self.hash,
            known_hashes=_key_hashes(fresh[self.key_column], fresh[BUCKET_HASH]),
            layout=layout,
            seeded=None if seed is None else seed.chunks,
            unstored=None if seed is None or seed.stored else seed.entries,
        )
        state._prefetch(fresh[BUCKET_HASH].to_numpy())
        user_rows = fresh.drop(columns=list(_INTERNAL_INPUT)).reset_index(drop=True)
        if quiet.any() and self.order == "timestamp":
            # In time order the quiet records of one partition interleave with the new
            # ones of another: each run goes through in turn, a quiet run's output dropped.
            for is_quiet, run in _runs(quiet):
                part = user_rows.iloc[run].reset_index(drop=True)
                for out in frames_of(self.user.process(state, part)):
                    checked = self._checked(out)  # a quiet run's output is checked too
                    if not is_quiet:
                        yield checked
            user_rows = user_rows.iloc[:0]
        elif quiet.any():
            # Published by an earlier owner: into the state, not the output. A key's
            # quiet records all come before its others, so its order holds.
            replayed = user_rows[quiet].reset_index(drop=True)
            for out in frames_of(self.user.process(state, replayed)):
                self._checked(out)  # still checked, as every output is
            user_rows = user_rows[~quiet].reset_index(drop=True)
        if len(user_rows):
            for out in frames_of(self.user.process(state, user_rows)):
                yield self._checked(out)
        written = state.flush()
        if seed is not None:
            seed.stored = True  # flush wrote every seeded chunk
        if written != layout:
            self.layout.update((written.depth, written.keys))

    def close(self) -> None:
        """Write the seeds of tasks that had no step (executor, once per partition)."""
        try:
            pending = [s for _, s in sorted(self._seeds.items()) if not s.stored]
            for seed in pending:
                # pyspark removed the last task's key before calling close.
                self._client.set_implicit_key(seed.key)
                self._store_seed(seed)
            if pending:
                self._client.remove_implicit_key()
        finally:
            self._seeds.clear()
            self._seeds_size = 0

    # -- steps ----------------------------------------------------------------------------------

    def _keep(self, seed: _Seed, chunk: int, entries: int, data: bytes) -> bool:
        """Keep a seeded chunk for the task's first step, within the worker's bound.

        Returns whether it was kept. A seed that would cross the bound keeps
        nothing (a step uses a whole seed or none): what it kept so far is
        written now, in the seed's own call, under its task's key.
        """
        if not seed.whole:
            return False
        grows = len(data) - len(seed.chunks.get(chunk, b""))  # a chunk seeded again replaces
        if self._seeds_size + grows > _SEEDS_KEPT_BYTES:
            self._store_seed(seed)
            self._seeds_size -= seed.size
            seed.chunks, seed.entries, seed.size, seed.whole = {}, {}, 0, False
            return False
        seed.chunks[chunk] = data
        seed.entries[chunk] = entries
        seed.size += grows
        self._seeds_size += grows
        return True

    def _store_seed(self, seed: _Seed | None) -> None:
        """Write a seed's chunks not in the StateStore yet (its task's key must be set)."""
        if seed is None or seed.stored:
            return
        for c in sorted(seed.chunks):
            self.state.updateValue((c,), (seed.entries[c], seed.chunks[c]))
        seed.stored = True

    def _advance(
        self, fresh: pd.DataFrame, entries: list[tuple[tuple[Any, ...], int]], bucket: int
    ) -> None:
        """Raise the task's own checkpoints past the records just applied; drop overtaken ones."""
        if not len(fresh):
            return
        current = dict(entries)
        for (topic, partition), last in _last_offsets(fresh):
            own = (str(topic), int(partition), bucket, self.factor)
            next_offset = max(int(last) + 1, current.get(own, 0))
            self.checkpoints.updateValue(own, (next_offset,))
            for entry, offset in entries:
                same_partition = entry[:2] == own[:2]
                if same_partition and entry != own and offset <= next_offset:
                    self.checkpoints.removeKey(entry)

    def _checked(self, out: pd.DataFrame) -> pd.DataFrame:
        """The processor's output in ``output_schema`` order, refused if a column is missing."""
        missing = [c for c in self.output_columns if c not in out.columns]
        if missing:
            raise ArgumentError.invalid(
                "process() result",
                f"a DataFrame with the output_schema columns {list(self.output_columns)}",
                f"columns {list(out.columns)} (missing {missing})",
            )
        return out[list(self.output_columns)]

    def _tagged(
        self,
        frames: Iterator[pd.DataFrame],
        figures: tuple[int, int, int, int, int, int],
        route: _TaskRoute,
        mark: str | None,
    ) -> Iterator[pd.DataFrame]:
        """A task step's output frames, then its figures: on one more row of the last frame.

        Every frame pyspark converts to Arrow pays about a millisecond whatever
        its size, so the figures ride on the last output frame, as a copy of its
        last row (whose values convert, being the processor's own) that only
        :data:`_METRICS` tells apart; a step without output yields them alone.
        """
        last = None
        for frame in frames:
            if not len(frame):
                continue
            if last is not None:
                yield self._as_output(last)
            last = frame
        yield self._with_figures(last, figures, route, mark)

    def _as_output(self, rows: pd.DataFrame) -> pd.DataFrame:
        rows = rows.copy()
        rows[_METRICS] = None
        if self.holds:
            rows[_TASK] = None
            rows[_HELD_FROM] = None
        return rows

    def _with_figures(
        self,
        rows: pd.DataFrame | None,
        figures: tuple[int, ...],
        route: _TaskRoute,
        mark: str | None,
    ) -> pd.DataFrame:
        """``rows`` and one more, a copy of their last (or, without rows, one of nulls)
        carrying the step's figures and, in a holding query, its task and mark."""
        import pandas as pd

        if rows is None:
            out = pd.DataFrame({c: [None] for c in self.output_columns})
        else:
            out = rows.take(np.r_[0 : len(rows), len(rows) - 1])
            out.index = pd.RangeIndex(len(out))
        nulls = len(out) - 1
        out[_METRICS] = _at_end(nulls, _figures_text(figures))
        if self.holds:
            out[_TASK] = _at_end(nulls, route.task_id)
            out[_HELD_FROM] = _at_end(nulls, mark)
        return out


def _figures_text(figures: tuple[int, ...]) -> str:
    """A step's figures as :data:`_METRICS` carries them (summed in the JVM by position)."""
    return ",".join(str(int(f)) for f in figures)


def _at_end(count: int, value: Any) -> np.ndarray:
    """A column of ``count`` nulls and then ``value``."""
    column = np.full(count + 1, None, dtype=object)
    column[count] = value
    return column


_STRUCT_TYPES = {
    "string": "StringType",
    "int": "IntegerType",
    "long": "LongType",
    "binary": "BinaryType",
}
_STRUCTS: dict[str, Any] = {}


def struct_of(ddl: str) -> Any:
    """The ``StructType`` of one of the library's own state schemas (``"a int, b long"``).

    Runs in a Python worker, at each task's ``init``; built once per process.
    Given a DDL string, pyspark asks the JVM to parse it, a state-server round
    trip per schema per task; a ``StructType`` goes as it is. Fields are
    nullable, as a parsed DDL's are, so the state schema Spark stored in a
    checkpoint is the same whichever way it came.
    """
    struct = _STRUCTS.get(ddl)
    if struct is None:
        from pyspark.sql import types as T

        fields = []
        for part in ddl.split(","):
            name, kind = part.split()
            fields.append(T.StructField(name, getattr(T, _STRUCT_TYPES[kind])(), True))
        struct = _STRUCTS[ddl] = T.StructType(fields)
    return struct


_FROZEN: list[bool] = []


def _freeze_worker_heap() -> None:
    """Leave what a Python worker has loaded out of its later garbage collections.

    Runs on an executor, in a Python worker, at the first task that runs a
    spark-elastic processor; once per process. PySpark's daemon runs a full
    ``gc.collect()`` in a reused worker after every task, which walks every
    object pandas, pyarrow and pyspark made at import: tens of milliseconds
    a task, most of a small stateful batch's Python time. ``gc.freeze()``
    moves those objects to the permanent generation, so each collection
    walks only what later tasks made (the collection after each task stays,
    and so does what it frees). No Spark setting turns that collection off
    (pyspark/daemon.py, ``worker`` loop).
    """
    if _FROZEN:
        return
    import gc

    gc.collect()
    gc.freeze()
    _FROZEN.append(True)


_FENCES_SEEN: dict[int, tuple[Any, list[Fence]]] = {}
"""Per Python worker: the fences of the last shipped document seen, per document object."""


def _fences(shipped: Shipped | None) -> list[Fence]:
    """The query's output fences as last shipped (executor, once per task per batch)."""
    if shipped is None:
        return []
    document = shipped.latest()
    seen = _FENCES_SEEN.get(id(document))
    if seen is None or seen[0] is not document:
        seen = (document, fences_of(document))
        _FENCES_SEEN.clear()  # one query's document at a time is the common case
        _FENCES_SEEN[id(document)] = seen
    return seen[1]


def _bootstrapped(shipped: Shipped | None) -> bool:
    """Whether the driver has shipped that the bootstrap streams are read (executor)."""
    return shipped is not None and bool(shipped.latest().get("done"))


def _now_ms(timer_values: Any) -> int:
    """The batch's processing time (ProcessingTime mode), else the executor's clock."""
    batch_time = int(timer_values.getCurrentProcessingTimeInMs())
    return batch_time if batch_time > 0 else int(time.time() * 1000)


def _runs(flags: Any) -> list[tuple[bool, slice]]:
    """Maximal runs of equal flags, in order: ``[(flag, slice), ...]``."""
    changes = np.flatnonzero(np.diff(flags.astype(np.int8))) + 1
    bounds = [0, *changes.tolist(), len(flags)]
    return [(bool(flags[a]), slice(a, b)) for a, b in itertools.pairwise(bounds)]


def _key_hashes(keys: pd.Series, hashes: pd.Series) -> dict[bytes, int]:
    """Each key's hash, from its first record (a key's records all have the same).

    A step's records share few keys: pandas finds the first of each in C, and
    only those go through Python (0.13 ms against 0.78 ms for 1,250 records of
    62 keys).
    """
    first = ~keys.duplicated().to_numpy()
    return {
        _state_key(k): int(b)
        for k, b in zip(keys.to_numpy()[first], hashes.to_numpy()[first], strict=True)
        if k is not None
    }


def _last_offsets(records: pd.DataFrame) -> list[tuple[tuple[Any, Any], Any]]:
    """The highest offset of each ``(topic, partition)`` among ``records``, in that order.

    A task's step mostly holds one partition's records: that case is two numpy
    comparisons, not a pandas group-by (0.02 ms against 0.5 ms for 125 records).
    """
    topics = records["topic"].to_numpy()
    partitions = records["partition"].to_numpy()
    if (topics == topics[0]).all() and (partitions == partitions[0]).all():
        return [((topics[0], partitions[0]), records["offset"].to_numpy().max())]
    reached = records.groupby(["topic", "partition"], sort=True)["offset"].max()
    return list(reached.items())


def _covered(batch: pd.DataFrame, entries: Iterable[tuple[tuple[Any, ...], int]]) -> Any:
    """Per row: is it below a checkpoint of its key (applied already)?"""
    skip = np.zeros(len(batch), dtype=bool)
    if not entries:
        return skip
    topics = batch["topic"].to_numpy()
    partitions = batch["partition"].to_numpy()
    offsets = batch["offset"].to_numpy()
    bucket_hash = batch[BUCKET_HASH].to_numpy()
    for (stream, partition, bucket, factor), next_offset in entries:
        skip |= (
            (topics == stream)
            & (partitions == partition)
            & (bucket_hash % factor == bucket)
            & (offsets < next_offset)
        )
    return skip


# -- the transform ---------------------------------------------------------------------------


def with_task_state(
    processor: TaskProcessor,
    *,
    job: str,
    checkpoint_location: str | os.PathLike[str],
    elasticity_factor: int | None = None,
    grouper: Grouper | str = Grouper.PARTITION,
    partitions: PartitionCounts | None = None,
    plan: JobPlan | None = None,
    tasks: Iterable[str] | None = None,
    hash: HashMode = "spark",
    system: str = "kafka",
    columns: KafkaColumns | Mapping[str, str] | None = None,
    bucket_checkpoints: bool = True,
    order: str | None = None,
    timestamp: str = "timestamp",
    max_task_idle_ms: int = 0,
    bootstrap: Sequence[str] = (),
    state_partitions: int | None = None,
    _marks: bool = False,
) -> Callable[[DataFrame], DataFrame]:
    """Run ``processor`` per virtual task with keyed state and per-bucket checkpoints.

    Returns a transform for a streaming Kafka-shaped DataFrame; its result is
    the processor's output rows. Start it with the same checkpoint location::

        out = events.transform(with_task_state(Counter(), job="counts",
                                               checkpoint_location=cp,
                                               elasticity_factor=4, partitions={"clicks": 2}))
        out.writeStream.option("checkpointLocation", cp).format("parquet")...start()

    Runs on the driver: it records the job in ``<checkpoint>/_spark_elastic``,
    refuses a checkpoint made for another job or factor (``rescale`` it
    instead), holds the checkpoint's owner lock while the query lives, and
    loads a ``rescale`` seed in the first micro-batch. The session is not
    changed: the query gets its state partition count and the
    RocksDB state store for itself when it starts (pyspark's ``start()`` and
    ``toTable()`` are wrapped for that; see
    :mod:`spark_elastic.state.query_settings`), so several stateful jobs
    and unrelated queries share a session. Metrics are observed as
    ``lastProgress["observedMetrics"]["spark_elastic"]``: ``state_partitions``
    (the query's), ``task_count`` (the tasks it owns),
    ``active_tasks``, ``records_processed``, ``records_skipped``,
    ``key_bucket_ns`` (deriving each record's bucket at every checkpointed
    factor from its key hash and comparing its offset with that bucket's
    checkpoint; the hash itself is computed in the JVM by the routing
    projection) and
    ``checkpoint_resolve_ns``.

    Parameters
    ----------
    processor
        The user's :class:`TaskProcessor`.
    job
        The job's name: checkpoints of different jobs are never mixed.
    checkpoint_location
        The query's checkpoint directory, as given to ``checkpointLocation``:
        a local path, a ``file:`` URI, or a URI of a file system that can
        create a file only if absent (``hdfs:``, ``s3a:``, ``gs:``,
        ``abfs[s]:``), reached with the session's ``spark.hadoop.*``
        settings; other schemes are refused.
    elasticity_factor, grouper, partitions, plan, hash, system, columns
        As for :func:`~spark_elastic.with_virtual_tasks`.
    tasks
        Names of the virtual tasks this query owns (default: all). Rows of
        other tasks are dropped before the shuffle; another query owns them.
    bucket_checkpoints
        Keep per-bucket checkpoints (default). ``False`` exists to measure
        their cost: without them a replay is not skipped and the checkpoint
        cannot be rescaled correctly.
    order
        The order of a task's records within a micro-batch: ``"offset"``
        (by topic, partition, offset) or ``"timestamp"`` (the task's
        partitions merged by each one's next record's timestamp, as Kafka
        Streams' ``PartitionGroup`` does with ``max.task.idle.ms`` 0; see
        :func:`~spark_elastic.dataplane.ordered.timestamp_order`). Default:
        ``"timestamp"`` for a job of several input streams (co-grouped),
        ``"offset"`` for one.
    timestamp
        The timestamp column ``"timestamp"`` order reads (Spark's Kafka
        source and the embedded log name it so).
    max_task_idle_ms
        Kafka Streams' ``max.task.idle.ms``, for ``"timestamp"`` order: how
        long a task holds back records it cannot yet place in time, because
        another of its partitions has nothing buffered, waiting for that
        partition to deliver. Held records stay in the task's state across
        micro-batches, restarts and ``rescale`` (they move with their keys);
        when the wait is over a processing-time timer releases them, and
        records released without waiting are counted
        (``records_enforced``). 0 (the default, as in Kafka Streams) never
        holds back: each micro-batch is merged on its own. A value above 0
        runs the query in processing-time mode, with a micro-batch on every
        trigger even without new records (that is how timers fire), and
        fixes it for the checkpoint. See docs/stateful.md, "Holding records back".
    bootstrap
        Samza's bootstrap streams, for ``"timestamp"`` order: input streams
        each task reads to their end offsets as of the query's start before
        it processes any record of its other streams, which it holds back in
        its state meanwhile (a table a task must know before it joins, such
        as a profile topic). The driver sees the end offsets in the query's
        first progress and tells the tasks once its committed offsets pass
        them (``_spark_elastic/bootstrap.json``); it does so again each time
        the transform is applied to start a query. Like ``max_task_idle_ms``,
        runs the query in processing-time mode.
    state_partitions
        How many state partitions a new checkpoint gets: each micro-batch
        opens and commits one RocksDB store per partition, and several tasks
        share one (each keyed by its routing key). Default: the tasks the
        query owns, at most the session's ``defaultParallelism``, so a batch
        costs as many stores as it can run at once, whatever the job's task
        count. A checkpoint keeps the count it first ran with (Spark pins
        it); asking for another one for it is refused.
    _marks
        Internal, for a running job's containers: a query that holds records
        back also returns each task step's mark (:data:`MARK_COLUMNS`), from
        which the container says what its published output covers.

    Returns
    -------
    Callable[[DataFrame], DataFrame]
        The transform, for ``df.transform(...)``: it returns the processor's
        output rows (``output_schema``) as a streaming DataFrame.

    Raises
    ------
    ArgumentTypeError
        ``processor`` is not a :class:`TaskProcessor`.
    ArgumentError
        A schema attribute is not a DDL string, an empty ``job``, a bad
        factor, grouper, hash or column names, or (when the transform is
        applied) no partition counts for a streaming DataFrame.
    CheckpointError
        The checkpoint belongs to another job, factor or task set, or another
        process is running a query on it.
    """
    if not isinstance(processor, TaskProcessor):
        raise ArgumentTypeError.wrong_type("processor", "a TaskProcessor instance", processor)
    for attribute in ("state_schema", "output_schema"):
        if not isinstance(getattr(processor, attribute, None), str):
            raise ArgumentError.invalid(
                f"{type(processor).__name__}.{attribute}",
                "a DDL schema string such as 'count long'",
                getattr(processor, attribute, None),
            )
    if not isinstance(job, str) or not job:
        raise ArgumentError.invalid("job", "a non-empty job name", job)
    wanted = _input_columns(processor)
    cols = KafkaColumns.of(columns)
    check_order("order", order, timestamp, default=True)
    idle_ms = check_idle("max_task_idle_ms", max_task_idle_ms)
    first = _bootstrap_streams(bootstrap, order)
    if idle_ms and order == "offset":
        raise ArgumentError.invalid(
            "max_task_idle_ms",
            "0 with order='offset' (records are held back only to merge them in time order)",
            idle_ms,
        )
    kind = Grouper.of(grouper)
    factor = _resolve_factor(elasticity_factor, plan)
    if partitions is not None:
        _stream_inputs(partitions, system)  # refuse a bad argument now, not when applied
    owned = None if tasks is None else tuple(sorted(set(tasks)))
    checkpoint = checkpoint_location_of(checkpoint_location, "checkpoint_location")
    if state_partitions is not None and (
        isinstance(state_partitions, bool)
        or not isinstance(state_partitions, int)
        or state_partitions < 1
    ):
        raise ArgumentError.invalid(
            "state_partitions", "a positive int (or None for the default)", state_partitions
        )

    def transform(df: DataFrame) -> DataFrame:
        spark = df.sparkSession
        job_plan = (
            plan if plan is not None else _plan_for(df, kind, factor, partitions, system, cols)
        )
        spec = JobSpec(
            name=job,
            inputs=job_plan.inputs,
            grouper=job_plan.grouper,
            elasticity_factor=job_plan.elasticity_factor,
            hash=hash,
            system=system,
            state_schema=processor.state_schema,
            tasks=owned,
            holds_back=idle_ms > 0 or bool(first),
        )
        _check_owned(job_plan, owned)
        in_order = order or ("timestamp" if len(job_plan.inputs) > 1 else "offset")
        if idle_ms and in_order != "timestamp":
            raise ArgumentError.invalid(
                "max_task_idle_ms",
                "0 for one input stream in offset order (records are held back only to merge "
                "several partitions in time order; pass order='timestamp')",
                idle_ms,
            )
        if in_order == "timestamp":
            check_timestamp_column(df, timestamp, defaulted=order is None)
        kept = _kept_columns(processor, wanted, df.columns, cols, in_order, timestamp)
        _check_bootstrap_inputs(first, job_plan, in_order)
        check_known_counts(df, job_plan, system)  # before anything is written
        _check_starting_offsets(df, checkpoint)
        spec, job_plan = _claim(spark, checkpoint, spec, job_plan, explicit=plan is not None)
        routing = VirtualTaskRouting.of(job_plan)
        store_partitions = _state_partitions(
            spark,
            checkpoint,
            job_plan.task_count if owned is None else len(owned),
            state_partitions,
        )
        if first:
            # Before the query starts, so no batch of it reads an earlier query's "done".
            write_bootstrap(checkpoint, first, done=False)
            _BootstrapWatch.watch(spark, checkpoint, first)
        # The state partition count, for this query only: set while it starts (see
        # query_settings), never on the session, so other queries keep their own.
        install_start_hook(METRICS_NAME)
        routed = df.transform(
            with_virtual_tasks(plan=job_plan, hash=hash, system=system, columns=cols, route=False)
        ).withColumn(BUCKET_HASH, key_slot(hash, cols))
        if owned is not None:
            from pyspark.sql import functions as F

            routed = routed.filter(F.col("virtual_task").isin(list(owned)))
        if kept is not None:
            routed = routed.select(*(quoted(c) for c in routed.columns if c in kept))
        # A query of one stream: every record that reaches the operator has its topic.
        streams = [s.stream for s in job_plan.inputs if s.system == system]
        routed, crossed = crossing(routed, {cols.topic: streams[0]} if len(streams) == 1 else {})
        # The stateful operator's own distribution, so Spark adds no second shuffle.
        routed = routed.repartition(store_partitions, "routing_key")
        return _run(
            spark,
            processor,
            routed,
            routing,
            checkpoint,
            spec,
            bucket_checkpoints,
            cols.key,
            (in_order, timestamp),
            idle_ms,
            first,
            _marks,
            store_partitions,
            crossed,
        )

    return transform


def _input_columns(processor: TaskProcessor) -> tuple[str, ...] | None:
    """The processor's ``input_columns``, or one clear line (driver, when defined)."""
    wanted = getattr(processor, "input_columns", None)
    if wanted is None:
        return None
    where = f"{type(processor).__name__}.input_columns"
    if isinstance(wanted, str | bytes) or not isinstance(wanted, Sequence):
        raise ArgumentTypeError.wrong_type(
            where, "a sequence of column names such as ('value',), or None", wanted
        )
    if not all(isinstance(c, str) and c for c in wanted):
        raise ArgumentTypeError.wrong_type(where, "column names (non-empty strings)", wanted)
    return tuple(wanted)


def _kept_columns(
    processor: TaskProcessor,
    wanted: tuple[str, ...] | None,
    present: Sequence[str],
    cols: KafkaColumns,
    in_order: str,
    timestamp: str,
) -> frozenset[str] | None:
    """The columns a query's records keep into its stateful operator (None: all of them).

    Runs on the driver, when the transform is applied, before anything is written.
    """
    if wanted is None:
        return None
    missing = [c for c in wanted if c not in present]
    if missing:
        raise ArgumentError.invalid(
            f"{type(processor).__name__}.input_columns",
            f"columns of the records ({', '.join(present)})",
            missing,
        )
    own = {cols.key, cols.topic, cols.partition, cols.offset, TASK_COLUMN, BUCKET_COLUMN}
    state_key = getattr(processor, "key_column", None)  # a BatchProcessor's
    if isinstance(state_key, str):
        own.add(state_key)
    if in_order == "timestamp":
        own.add(timestamp)
    return frozenset({*wanted, *own, "routing_key", BUCKET_HASH})


def _bootstrap_streams(bootstrap: object, order: str | None) -> tuple[str, ...]:
    """``bootstrap`` as a tuple of stream names, or one clear line (driver, when defined)."""
    if isinstance(bootstrap, str) or not isinstance(bootstrap, Sequence | frozenset | set):
        raise ArgumentTypeError.wrong_type(
            "bootstrap", "a sequence of input stream names, such as ('profiles',)", bootstrap
        )
    names = tuple(bootstrap)
    if not all(isinstance(n, str) and n for n in names):
        raise ArgumentTypeError.wrong_type("bootstrap", "stream names (non-empty strings)", names)
    if names and order == "offset":
        raise ArgumentError.invalid(
            "bootstrap",
            "no streams with order='offset' (bootstrap streams are read first in time order)",
            list(names),
        )
    return tuple(sorted(set(names)))


def _check_bootstrap_inputs(first: tuple[str, ...], plan: JobPlan, in_order: str) -> None:
    """Bootstrap streams must be inputs of the job, and some other input must remain."""
    if not first:
        return
    streams = [s.stream for s in plan.inputs]
    unknown = [name for name in first if name not in streams]
    if unknown:
        raise ArgumentError.invalid("bootstrap", f"input streams of the job {streams}", unknown)
    if len(first) == len(set(streams)) or in_order != "timestamp":
        raise ArgumentError.invalid(
            "bootstrap",
            "some but not all input streams, merged in time order (order='timestamp')",
            f"{list(first)} of {streams}, order {in_order!r}",
        )


def _check_owned(plan: JobPlan, owned: tuple[str, ...] | None) -> None:
    if owned is None:
        return
    names = set(plan.task_names())
    unknown = [t for t in owned if t not in names]
    if unknown or not owned:
        raise ArgumentError.invalid(
            "tasks", f"names of this plan's {plan.task_count} virtual tasks", unknown or []
        )


def _claim(
    spark: SparkSession, checkpoint: str, spec: JobSpec, plan: JobPlan, explicit: bool
) -> tuple[JobSpec, JobPlan]:
    """Lock the checkpoint for this driver and make sure it belongs to this job and shape.

    Returns the job as the checkpoint continues it, and its plan: a job whose
    topics grew to multiples of their counts keeps its virtual tasks (SEP-5),
    and ``job.json`` records the grown counts.
    """
    OwnerLock.acquire(checkpoint)
    _release_lock_when_query_ends(spark)
    existing = read_job(checkpoint)
    if existing is None:
        if has_seed(checkpoint) is not None:
            # Off the local disk a rescale writes its seed in place and job.json last.
            raise CheckpointError(
                f"checkpoint {str(checkpoint)!r} holds a rescale's seed but no job file: the "
                "rescale that made it did not finish; delete it and rescale again"
            )
        if not is_fresh(checkpoint):
            raise CheckpointError(
                f"checkpoint {str(checkpoint)!r} was made by a query spark-elastic did not start"
            )
        spec = replace(spec, task_inputs=_task_inputs_of(plan, str(checkpoint)))
        write_job(checkpoint, spec)
        return spec, plan
    if existing.state_layout != LAYOUT_VERSION:
        raise CheckpointError(
            f"checkpoint {str(checkpoint)!r} stores keyed state one entry per key (state layout "
            f"{existing.state_layout}, spark-elastic before 0.2); this version stores it in "
            f"chunks (layout {LAYOUT_VERSION}). Stop its query and convert it: "
            f"`spark-elastic rescale {checkpoint} --to NEW_CHECKPOINT --elasticity-factor "
            f"{existing.elasticity_factor}`, then run on NEW_CHECKPOINT"
        )
    if not existing.same_job_but_counts(spec):
        raise CheckpointError(
            f"checkpoint {str(checkpoint)!r} belongs to job {existing.name!r} "
            f"(inputs {', '.join(map(str, existing.inputs))}, state {existing.state_schema!r}); "
            f"this query is job {spec.name!r} (inputs {', '.join(map(str, spec.inputs))}, "
            f"state {spec.state_schema!r})"
        )
    if existing.holds_back != spec.holds_back:
        held = "holds records back" if existing.holds_back else "never held records back"
        raise CheckpointError(
            f"checkpoint {str(checkpoint)!r} {held} (max_task_idle_ms "
            f"{'above 0' if existing.holds_back else '0'}); this query asks for max_task_idle_ms "
            f"{'above 0' if spec.holds_back else '0'}, and a checkpoint keeps its time mode "
            "(held records would be lost); keep the setting, or start on a new checkpoint"
        )
    if existing.elasticity_factor != spec.elasticity_factor or existing.tasks != spec.tasks:
        raise CheckpointError(
            f"checkpoint {str(checkpoint)!r} runs elasticity factor {existing.elasticity_factor} "
            f"with tasks {'all' if existing.tasks is None else list(existing.tasks)}; this query "
            f"asks for factor {spec.elasticity_factor} with tasks "
            f"{'all' if spec.tasks is None else list(spec.tasks)}: use `spark-elastic rescale` "
            "to make a checkpoint for the new shape"
        )
    continued = existing.grown_to(spec.inputs, str(checkpoint))
    continued_plan = continued.plan()
    if continued_plan.task_count != existing.plan().task_count:
        raise CheckpointError(
            f"checkpoint {str(checkpoint)!r}: under the {existing.grouper.value!r} grouper the "
            f"grown inputs ({', '.join(map(str, spec.inputs))}) add virtual tasks, and a "
            "checkpoint's state partitions are fixed; start the job afresh on a new checkpoint"
        )
    if explicit and (
        plan.task_names() != continued_plan.task_names()
        or plan.ssp_base.tolist() != continued_plan.ssp_base.tolist()
    ):
        raise CheckpointError(
            f"checkpoint {str(checkpoint)!r}: plan= gives tasks {plan.task_names()[:4]}... for "
            f"inputs {', '.join(map(str, spec.inputs))}, but the checkpoint's job keeps its "
            f"{continued_plan.task_count} virtual tasks as SEP-5 grows them; pass the plan made "
            "with previous= the job's earlier plan, or partitions= instead of plan="
        )
    _check_owned(continued_plan, spec.tasks)
    if continued != existing:
        write_job(checkpoint, replace(continued, starting_offsets=existing.starting_offsets))
    return continued, continued_plan


def _state_partitions(spark: SparkSession, checkpoint: str, owned: int, asked: int | None) -> int:
    """The query's state partition count: its checkpoint's, else ``asked``, else the default.

    Runs on the driver, once per transform. The default is the tasks the
    query owns, at most the session's default parallelism: each state
    partition costs a RocksDB open and commit per micro-batch, and more
    partitions than the query runs at once buy nothing.
    """
    pinned = pinned_conf(checkpoint).get(SHUFFLE_PARTITIONS_KEY)
    if pinned is not None:
        if asked is not None and asked != int(pinned):
            raise CheckpointError(
                f"checkpoint {str(checkpoint)!r} runs {pinned} state partitions (Spark pins "
                f"them at the first start); state_partitions={asked} would need a new "
                "checkpoint: leave it out, or rescale to a new one"
            )
        return int(pinned)
    if asked is not None:
        return asked
    return max(1, min(owned, int(spark.sparkContext.defaultParallelism)))


_KAFKA_LIKE = ("subscribe", "assign", "subscribepattern")


def _check_starting_offsets(df: DataFrame, checkpoint: str) -> None:
    """Refuse a rescaled checkpoint's first start above the offsets its buckets need.

    Runs on the driver, once per transform. Starting lower is safe (bucket
    checkpoints skip what the state holds); starting higher, as Kafka's
    default ``latest`` does, would skip records no state has applied.
    """
    job = read_job(checkpoint)
    if job is None or job.starting_offsets is None or last_batch(checkpoint) is not None:
        return
    for _, options in streaming_sources(df):
        lowered = {k.lower(): v for k, v in options.items()}
        if not any(k in lowered for k in _KAFKA_LIKE):
            continue
        given = lowered.get("startingoffsets", "latest")
        if given.strip() == "earliest":
            continue
        try:
            parsed = json.loads(given) if given.strip() != "latest" else {}
        except ValueError:
            continue  # the source reports its own option errors
        too_high = [
            f"{topic}:{partition}"
            for topic, partitions in job.starting_offsets.items()
            for partition, needed in partitions.items()
            if (offset := parsed.get(topic, {}).get(partition)) is None
            or offset == -1
            or offset > needed
        ]
        if too_high:
            raise CheckpointError(
                f"checkpoint {str(checkpoint)!r} was made by rescale and its query has not "
                f"started: its buckets need records from {json.dumps(job.starting_offsets)}, "
                f"but the source starts at {given!r}, past them for {', '.join(too_high[:4])}; "
                'read with .option("startingOffsets", starting_offsets(checkpoint))'
            )


def _task_inputs_of(plan: JobPlan, checkpoint: str) -> tuple[StreamInput, ...] | None:
    """The counts a plan's tasks were made for, if it was grown from them (SEP-5), else ``None``.

    A plan made with ``previous=`` keeps each stream partition in the task of
    ``p mod`` the old count; ``job.json`` records those counts so a restart
    rebuilds the same tasks.
    """

    def same(a: JobPlan, b: JobPlan) -> bool:
        return a.task_names() == b.task_names() and a.ssp_base.tolist() == b.ssp_base.tolist()

    if same(plan, plan_job(plan.inputs, plan.grouper, plan.elasticity_factor)):
        return None
    bases = plan.ssp_base.tolist()
    counts, start = [], 0
    for stream in plan.inputs:
        tasks = len(set(bases[start : start + stream.partition_count]))
        counts.append(StreamInput(stream.system, stream.stream, tasks))
        start += stream.partition_count
    task_inputs = tuple(counts)
    previous = plan_job(task_inputs, plan.grouper, plan.elasticity_factor)
    if same(plan, plan_job(plan.inputs, plan.grouper, plan.elasticity_factor, previous=previous)):
        return task_inputs
    raise CheckpointError(
        f"checkpoint {checkpoint!r}: plan= is neither a plan of its inputs nor one grown from "
        "fewer partitions of them (SEP-5), so its tasks could not be rebuilt on restart"
    )


def _run(
    spark: SparkSession,
    processor: TaskProcessor,
    routed: DataFrame,
    routing: VirtualTaskRouting,
    checkpoint: str,
    spec: JobSpec,
    bucket_checkpoints: bool,
    key_column: str = "key",
    order: tuple[str, str] = ("offset", "timestamp"),
    idle_ms: int = 0,
    bootstrap: tuple[str, ...] = (),
    marks: bool = False,
    partitions: int | None = None,
    crossed: Crossing | None = None,
) -> DataFrame:
    from pyspark.sql import functions as F

    output = spark.createDataFrame([], processor.output_schema).schema
    state = spark.createDataFrame([], processor.state_schema).schema
    internal = f"{_METRICS} string"
    holds = idle_ms > 0 or bool(bootstrap)
    if holds:
        internal += f", {_TASK} long, {_HELD_FROM} string"
    out_ddl = ", ".join(
        [f"`{f.name}` {f.dataType.simpleString()}" for f in output.fields] + [internal]
    )
    plan = routing.plan
    routes = {
        key: _TaskRoute(
            name,
            task_id % plan.elasticity_factor,
            task_id,
            tuple((ssp.stream, ssp.partition) for ssp in plan.task(task_id).partitions),
        )
        for task_id, (key, name) in enumerate(
            zip(routing.routing_keys, plan.task_names(), strict=True)
        )
        # Pickled to every task of every batch: the query's own tasks, not the job's.
        if spec.tasks is None or name in spec.tasks
    }
    stateful = _ElasticProcessor(
        processor,
        routes,
        plan.elasticity_factor,
        ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in state.fields),
        tuple(
            StateField(f.name, f.dataType.simpleString(), _kind_of(f.dataType))
            for f in state.fields
        ),
        tuple(output.fieldNames()),
        bucket_checkpoints,
        spec.hash,  # type: ignore[arg-type]
        key_column,
        ship_fences(spark, checkpoint),
        order=order,
        idle_ms=idle_ms,
        bootstrap=bootstrap,
        bootstrap_done=ship_bootstrap(spark, checkpoint) if bootstrap else None,
        crossing=crossed,
    )
    initial = None
    # A failed batch 0 is re-run from empty state: the seed must come along again.
    seed = has_seed(checkpoint) if never_committed(checkpoint) else None
    if seed is not None:
        initial = read_seed(spark, seed).groupBy("routing_key")
    result = routed.groupBy("routing_key").transformWithStateInPandas(
        _as_stateful_processor(stateful),
        out_ddl,
        "Append",
        "ProcessingTime" if stateful.holds else "None",
        initialState=initial,
    )
    figures = F.col(_METRICS)
    # As SQL text: each column function is several py4j calls, and these were a fifth
    # of the calls that build a container's query (see transforms._task_id_column).
    observed = result.observe(
        METRICS_NAME,
        # Read back when the query starts: the state partitions it needs (query_settings).
        F.expr(f"{int(partitions or routing.task_count)} AS {STATE_PARTITIONS_METRIC}"),
        F.expr(
            f"max({int(routing.task_count if spec.tasks is None else len(spec.tasks))}) "
            "AS task_count"
        ),
        F.expr(f"count({_METRICS}) AS active_tasks"),
        *(
            F.expr(f"coalesce(sum(CAST(split({_METRICS}, ',')[{i}] AS BIGINT)), 0) AS {name}")
            for i, name in enumerate(_METRIC_NAMES)
        ),
    )
    if marks and holds:
        kind = F.when(figures.isNull(), F.lit("row")).otherwise(F.lit("metrics"))
        return observed.withColumn(_KIND, kind).drop(_METRICS)
    return observed.filter(figures.isNull()).drop(_METRICS, *((_TASK, _HELD_FROM) if holds else ()))


def _as_stateful_processor(inner: _ElasticProcessor) -> Any:
    """Wrap ``inner`` in a real ``StatefulProcessor`` subclass (pyspark imported lazily).

    Runs on the driver, once a query is built. The wrapper is what Spark pickles: by value,
    with ``inner`` inside as bytes of its own and the state variables as plain data. To plan
    a query's first batch, Spark starts a fresh Python process on the driver that unpickles
    the wrapper only to call ``init`` and learn the state variables, at every start of every
    stateful query. There the wrapper registers them and loads nothing else: unpickling
    ``inner`` would import spark-elastic, the user's processor and what its code refers to
    (pandas alone is 0.4-0.5 s). In a Python worker, ``inner`` is unpickled at the task's
    ``init`` and given the variables registered.
    """
    from pyspark import cloudpickle
    from pyspark.sql.streaming import StatefulProcessor

    # No method refers to this module's globals: cloudpickle ships those by reference, and
    # unpickling one would import spark-elastic in the planning pass.
    class ElasticStatefulProcessor(StatefulProcessor):  # type: ignore[misc]
        def __init__(self, pickled: bytes, variables: tuple[Any, ...]) -> None:
            self.pickled = pickled
            self.variables = variables
            self.wrapped: Any = None

        def init(self, handle: Any) -> None:
            states = {
                name: (handle.getMapState if kind == "map" else handle.getValueState)(
                    name, *schemas
                )
                for kind, name, schemas in self.variables
            }
            client = getattr(handle, "_statefulProcessorApiClient", None)
            if getattr(getattr(client, "handle_state", None), "name", None) == "PRE_INIT":
                return  # the planning pass: the variables are all it asks for
            import pickle  # cloudpickle's bytes: plain pickle reads them, as pyspark's worker does

            self.wrapped = pickle.loads(self.pickled)
            self.wrapped.init(handle, states)

        def handleInputRows(self, key: Any, rows: Any, timer_values: Any) -> Any:
            return self.wrapped.handleInputRows(key, rows, timer_values)

        def handleInitialState(self, key: Any, initial_state: Any, timer_values: Any) -> None:
            self.wrapped.handleInitialState(key, initial_state, timer_values)

        # Spark passes these by keyword: the names are its own.
        def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Any:  # noqa: N803
            return self.wrapped.handleExpiredTimer(key, timerValues, expiredTimerInfo)

        def close(self) -> None:
            if self.wrapped is not None:
                self.wrapped.close()

    try:
        pickled = cloudpickle.dumps(inner)
    except Exception as error:  # pickle's refusals come as TypeError, PicklingError and more
        raise ArgumentTypeError(
            "processor: expected an object that can be pickled to Python workers, found "
            f"{type(inner.user).__name__} that cannot: {error}"
        ) from error
    return ElasticStatefulProcessor(pickled, inner.state_variables())


_LISTENING: set[int] = set()


def _release_lock_when_query_ends(spark: SparkSession) -> None:
    """Tie each held owner lock to the run that starts on its checkpoint, and release it after.

    Listener events arrive late and in order; a query keeps its id across
    restarts, so a lock is matched to a run id when that run starts, and only
    that run's termination releases it.
    """
    if id(spark) in _LISTENING:
        return
    try:
        from pyspark.sql.streaming import StreamingQueryListener
        from pyspark.sql.streaming.listener import JStreamingQueryListener
    except ImportError:  # pragma: no cover
        return

    class _Events(JStreamingQueryListener):  # type: ignore[misc]
        # pyspark turns every progress event into Python objects field by field before a
        # listener sees it: about fifty py4j round trips a micro-batch, each observed
        # metric's row looked up by class name through every jar on the class path (a
        # fifth of a container's JVM time in a profile of its batches). The progress is
        # wanted only while a bootstrap stream is watched, and then as one JSON document.
        def onQueryProgress(self, jevent: Any) -> None:
            if _BootstrapWatch.watching():
                _BootstrapWatch.progress(json.loads(jevent.progress().json()))

    class _Release(StreamingQueryListener):  # type: ignore[misc]
        def onQueryStarted(self, event: Any) -> None:
            OwnerLock.bind_run(str(event.id), str(event.runId), _query_id)

        def onQueryProgress(self, event: Any) -> None:
            # Called only where pyspark does not use _jlistener below (a listener it runs
            # elsewhere, as Spark Connect does): _Events takes progress otherwise.
            if _BootstrapWatch.watching():
                _BootstrapWatch.progress(json.loads(event.progress.json))

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            OwnerLock.release_run(str(event.runId))

        @property
        def _jlistener(self) -> Any:
            # pyspark's own property, with _Events in place of its JStreamingQueryListener.
            if not hasattr(self, "_jlistenerobj"):
                from pyspark import SparkContext

                jvm = SparkContext._jvm
                self._jlistenerobj = jvm.PythonStreamingQueryListenerWrapper(_Events(self))
            return self._jlistenerobj

    try:
        spark.streams.addListener(_Release())
    except Exception:
        return
    _LISTENING.add(id(spark))


class _BootstrapWatch:
    """Tells a query's tasks when its bootstrap streams are read (driver, listener thread).

    The end offsets "as of the start" are the bootstrap streams' latest
    offsets in the first progress of the query (Spark's Kafka source and the
    embedded log report them); once a progress's end offsets reach them, the
    checkpoint's bootstrap file says done and the tasks release what they held.
    """

    _watched: ClassVar[
        dict[str, tuple[SparkSession, tuple[str, ...], dict[tuple[str, str], int] | None]]
    ] = {}
    _mutex: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def watch(cls, spark: SparkSession, checkpoint: str, streams: tuple[str, ...]) -> None:
        _release_lock_when_query_ends(spark)  # registers the listener that calls progress()
        with cls._mutex:
            cls._watched[checkpoint] = (spark, streams, None)

    @classmethod
    def watching(cls) -> bool:
        """Whether any checkpoint is watched (a listener's progress is wanted at all)."""
        with cls._mutex:
            return bool(cls._watched)

    @classmethod
    def progress(cls, progress: Mapping[str, Any]) -> None:
        """Take one progress of a query (its JSON document, parsed)."""
        with cls._mutex:
            watched = [
                (c, w) for c, w in cls._watched.items() if _query_id(c) == str(progress.get("id"))
            ]
        for checkpoint, (spark, streams, targets) in watched:
            if targets is None:
                targets = _offsets_in(progress, "latestOffset", streams)
                with cls._mutex:
                    cls._watched[checkpoint] = (spark, streams, targets)
            reached = _offsets_in(progress, "endOffset", streams)
            if all(reached.get(p, -1) >= o for p, o in targets.items()):
                write_bootstrap(checkpoint, streams, done=True)
                ship_bootstrap(spark, checkpoint)
                with cls._mutex:
                    cls._watched.pop(checkpoint, None)


def _offsets_in(
    progress: Mapping[str, Any], field: str, streams: tuple[str, ...]
) -> dict[tuple[str, str], int]:
    """One offsets field of a progress's sources, for ``streams``: ``{(stream, partition): n}``.

    Spark's progress JSON holds a source's offsets as a document when they
    parse as one, and as text otherwise.
    """
    found: dict[tuple[str, str], int] = {}
    for source in progress.get("sources", ()):
        document = source.get(field)
        if isinstance(document, str):
            try:
                document = json.loads(document)
            except ValueError:
                continue
        for stream, partitions in document.items() if isinstance(document, dict) else ():
            if stream in streams and isinstance(partitions, dict):
                for partition, offset in partitions.items():
                    found[(stream, str(partition))] = int(offset)
    return found


def _query_id(checkpoint: str) -> str | None:
    """The id in Spark's ``metadata`` file of the checkpoint (driver, once per query start)."""
    try:
        storage = storage_for(checkpoint)
        data = storage.read(storage.join(checkpoint, "metadata"))
        return None if data is None else str(json.loads(data)["id"])
    except (StorageError, ValueError, KeyError):
        return None
