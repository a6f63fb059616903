"""DataFrame transforms: key buckets, virtual tasks, and exact routing of each task.

Each public function returns a ``DataFrame -> DataFrame`` callable for
``df.transform(...)`` (quinn's pattern); ``df.withVirtualTasks(...)`` is the
same transform registered as a DataFrame method. Everything here runs on the
driver and builds Spark expressions; per-row work happens in the JVM (or, for
``hash="java"``, in an Arrow UDF on the executors).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spark_elastic.dataplane.buckets import HashMode, key_bucket
from spark_elastic.dataplane.columns import KafkaColumns, quoted
from spark_elastic.dataplane.routing import routing_keys
from spark_elastic.errors import ArgumentError, ArgumentTypeError, PlanError
from spark_elastic.model.groupers import plan_job
from spark_elastic.model.names import validate_elasticity_factor
from spark_elastic.model.plan import Grouper, JobPlan, StreamInput

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = [
    "PartitionCounter",
    "PartitionCounts",
    "VirtualTaskRouting",
    "cogroup",
    "known_partition_counts",
    "register_partition_counter",
    "streaming_sources",
    "with_virtual_tasks",
]

PartitionCounts = Mapping[str, int] | Iterable[StreamInput | str]
"""Partition counts of the input topics: ``{"topic": 8}`` or ``["kafka.topic:8"]``."""

Transform = Callable[["DataFrame"], "DataFrame"]

PartitionCounter = Callable[[Mapping[str, str]], Mapping[str, int] | None]
"""Given a streaming source's options, its topics' partition counts now (or ``None``)."""

_COUNTERS: dict[str, PartitionCounter] = {}


def register_partition_counter(source: str, counter: PartitionCounter) -> None:
    """Teach the transforms how to count the partitions of a streaming source's topics.

    Runs on the driver. With a counter for a DataFrame's source, the
    transforms refuse partition counts that disagree with the topics' real
    ones (more: virtual tasks that never get a record; fewer: a query that
    fails at the first record of a partition it was not told of). The
    embedded log registers one (``spark_elastic`` does, on import); Kafka's
    counts are not known without a client.

    Parameters
    ----------
    source
        The source's format name, e.g. ``"elastic-log"``.
    counter
        Called with the source's options; returns ``{topic: count}`` or ``None``.
    """
    _COUNTERS[source] = counter


def known_partition_counts(df: DataFrame) -> tuple[str, dict[str, int]] | None:
    """The real partition counts of a streaming DataFrame's topics, where a counter knows them.

    Runs on the driver, once per transform: walks the analyzed plan (a few
    py4j calls per node) for streaming relations of registered sources.

    Parameters
    ----------
    df
        A DataFrame (streaming or not; classic pyspark).

    Returns
    -------
    tuple[str, dict[str, int]] or None
        The source (format and path) and ``{topic: count}``, or ``None``
        when no registered source is read.
    """
    if not _COUNTERS:
        return None
    found: dict[str, int] = {}
    where: list[str] = []
    for source, options in streaming_sources(df):
        counts = _COUNTERS[source](options) if source in _COUNTERS else None
        if counts:
            found.update(counts)
            where.append(f"{source} at {options.get('path', '?')}")
    return (", ".join(sorted(set(where))), found) if found else None


def streaming_sources(df: DataFrame) -> list[tuple[str, dict[str, str]]]:
    """The format name and options of every streaming source a DataFrame reads.

    Runs on the driver: reads the analyzed plan's leaves, a few py4j calls
    each (walking every node and each option an entry at a time was about
    200 calls for a container's query). Empty for DataFrames that are not
    classic pyspark ones.

    Parameters
    ----------
    df
        A DataFrame.

    Returns
    -------
    list[tuple[str, dict[str, str]]]
        ``(format, options)`` per streaming relation, e.g.
        ``("kafka", {"subscribe": "clicks", "startingOffsets": "earliest"})``.
    """
    jdf = getattr(df, "_jdf", None)
    if jdf is None:
        return []
    found = []
    # Streaming relations are leaves of the plan; their options cross as one JSON string
    # (Jackson is Spark's), not an entry at a time.
    mapper = None
    leaves = jdf.queryExecution().analyzed().collectLeaves()
    for i in range(leaves.size()):
        node = leaves.apply(i)
        kind = node.nodeName()
        if kind in ("StreamingRelationV2", "StreamingRelation"):
            options: dict[str, str] = {}
            if kind == "StreamingRelationV2":
                if mapper is None:
                    mapper = df.sparkSession._jvm.com.fasterxml.jackson.databind.ObjectMapper()
                text = mapper.writeValueAsString(node.extraOptions().asCaseSensitiveMap())
                options = {str(k): str(v) for k, v in json.loads(text).items()}
            found.append((str(node.sourceName()), options))
    return found


def check_known_counts(df: DataFrame, plan: JobPlan, system: str) -> None:
    """Refuse a plan whose partition counts disagree with the topics' real ones, when known.

    Runs on the driver, once per transform.

    Parameters
    ----------
    df
        The input DataFrame.
    plan
        The plan about to route it.
    system
        The system name of the DataFrame's topics in the plan.

    Raises
    ------
    ArgumentError
        A topic has fewer or more partitions than the plan says.
    """
    known = known_partition_counts(df)
    if known is None:
        return
    where, counts = known
    planned = {s.stream: s.partition_count for s in plan.inputs if s.system == system}
    for topic, count in sorted(planned.items()):
        real = counts.get(topic)
        if real is None or real == count:
            continue
        if real < count:
            consequence = (
                f"{(count - real) * plan.elasticity_factor} virtual tasks would never get a record"
            )
        else:
            consequence = (
                f"the first record of partitions {count} to {real - 1} would fail the query"
            )
        raise ArgumentError(
            f"partitions: topic {topic!r} has {real} partitions ({where}), but the plan says "
            f"{count}: {consequence}; pass the real counts, e.g. "
            f"partitions=log.partition_counts([{topic!r}])"
        )


@dataclass(frozen=True)
class VirtualTaskRouting:
    """How rows of a plan's virtual tasks are placed in Spark partitions.

    ``repartition(task_count, "routing_key")`` puts task ``t`` alone in
    partition ``t``; so does a stateful operator grouped by ``routing_key``
    when ``spark.sql.shuffle.partitions`` equals :attr:`task_count`, with no
    extra shuffle.

    Attributes
    ----------
    plan
        The job plan the routing is for.
    routing_keys
        ``routing_keys[t]`` is the int whose Spark hash lands in partition ``t``.
    """

    plan: JobPlan
    routing_keys: tuple[int, ...]

    @classmethod
    def of(cls, plan: JobPlan) -> VirtualTaskRouting:
        """The routing of ``plan``: one routing key per task id.

        Runs on the driver, once per plan.

        Parameters
        ----------
        plan
            A plan of the ``partition``, ``ssp`` or ``cogroup`` grouper.

        Returns
        -------
        VirtualTaskRouting

        Raises
        ------
        PlanError
            The plan is of the ``single`` grouper.
        ArgumentError
            The plan has more than 1,048,576 tasks (see :func:`routing_keys`).
        """
        if plan.grouper is Grouper.SINGLE:
            raise PlanError(
                "routing: the 'single' grouper gives every task every partition, so rows cannot "
                "be routed by partition; use 'partition', 'ssp' or 'cogroup'"
            )
        return cls(plan, tuple(int(k) for k in routing_keys(plan.task_count)))

    @property
    def task_count(self) -> int:
        """Number of virtual tasks, and of Spark partitions after routing."""
        return self.plan.task_count


def with_virtual_tasks(
    elasticity_factor: int | None = None,
    grouper: Grouper | str = Grouper.PARTITION,
    *,
    partitions: PartitionCounts | None = None,
    plan: JobPlan | None = None,
    hash: HashMode = "spark",
    system: str = "kafka",
    columns: KafkaColumns | Mapping[str, str] | None = None,
    route: bool = True,
) -> Transform:
    """Add ``key_bucket``, ``virtual_task`` and ``routing_key``; route each virtual task alone.

    After the transform every Spark partition holds exactly one virtual task
    and every virtual task exactly one partition (partition ``t`` holds task
    id ``t``), so work is key-ordered and parallel beyond the input's
    partition count (SEP-32).

    Parameters
    ----------
    elasticity_factor
        Virtual tasks per task: a power of two from 1 to 1024. May be left out
        when ``plan`` is given.
    grouper
        ``"partition"`` (default), ``"ssp"`` or ``"cogroup"``.
    partitions
        Partition counts of the input topics (``{"topic": 8}``, or
        ``["kafka.topic:8"]``; the embedded log's ``partition_counts()``).
        Required for streaming DataFrames unless ``plan`` is given; a batch
        DataFrame without it derives them from the data (max partition + 1),
        except under the ``cogroup`` grouper, which always needs them.
    plan
        An explicit :class:`JobPlan` (for example one made with a previous
        plan, so grown topics keep their task names).
    hash
        ``"spark"`` (native Murmur3, default) or ``"java"`` (Samza's
        ``String.hashCode``).
    system
        The system name of the rows' topics in the plan (default ``"kafka"``).
    columns
        Names of the Kafka columns, if not ``key``, ``topic``, ``partition``,
        ``offset``.
    route
        Repartition by ``routing_key`` (default). ``False`` only adds the columns.

    Returns
    -------
    Callable[[DataFrame], DataFrame]
        The transform, for ``df.transform(...)``.

    Raises
    ------
    ArgumentError
        Bad factor, grouper, hash mode, partition counts, or a plan whose factor
        disagrees with ``elasticity_factor``.
    ColumnError
        A Kafka column is missing or mistyped, or an output column exists.

    Notes
    -----
    A record whose topic or partition is not in the plan fails the query with
    a message naming them: it is never routed to a wrong task.
    """
    cols = KafkaColumns.of(columns)
    kind = Grouper.of(grouper)
    if kind is Grouper.SINGLE or (plan is not None and plan.grouper is Grouper.SINGLE):
        raise ArgumentError.invalid(
            "grouper",
            "a grouper that maps partitions to tasks (the 'single' grouper gives every task "
            "every partition, so rows cannot be routed)",
            Grouper.SINGLE.value,
            [Grouper.PARTITION.value, Grouper.SSP.value, Grouper.COGROUP.value],
        )
    factor = _resolve_factor(elasticity_factor, plan)
    _check_system(system)
    if partitions is not None:
        _stream_inputs(partitions, system)  # refuse a bad argument now, not when applied

    def transform(df: DataFrame) -> DataFrame:
        cols.validate(df)
        cols.check_no_output_clash(df)
        job = plan if plan is not None else _plan_for(df, kind, factor, partitions, system, cols)
        check_known_counts(df, job, system)
        return _apply(df, VirtualTaskRouting.of(job), system, hash, cols, route)

    return transform


def cogroup(
    *dfs: DataFrame,
    partition_counts: PartitionCounts | None = None,
    elasticity_factor: int = 1,
    hash: HashMode = "spark",
    system: str = "kafka",
    columns: KafkaColumns | Mapping[str, str] | None = None,
) -> DataFrame:
    """Align streams with different partition counts by gcd (SAMZA-71) and route them together.

    The union of ``dfs`` gets ``key_bucket``, ``virtual_task`` and
    ``routing_key``; partition ``p`` of every stream belongs to task
    ``p mod gcd(partition counts)``, so a task (and, with a factor, a virtual
    task) sees every record of its keys from every stream, provided the
    streams are partitioned by the same key hash modulo their counts (Kafka's
    default partitioner is).

    Parameters
    ----------
    *dfs
        Kafka-shaped DataFrames, batch or streaming (not mixed).
    partition_counts
        Every input topic's partition count (``{"views": 8, "clicks": 12}``,
        ``["kafka.views:8", ...]``, or the embedded log's
        ``log.partition_counts(["views", "clicks"])``). Required, for batch
        inputs too: counts derived from the data would be too low for a topic
        whose last partitions hold no records, and a wrong gcd sends a key's
        records from different streams to different tasks without an error.
    elasticity_factor, hash, system, columns
        As for :func:`with_virtual_tasks`.

    Returns
    -------
    DataFrame
        The union, with ``key_bucket``, ``virtual_task`` and ``routing_key``,
        repartitioned so that partition ``t`` holds virtual task ``t`` alone.

    Raises
    ------
    ArgumentError
        No DataFrames, no partition counts, a zero count, or counts whose
        gcd groups cannot be formed. A record of a topic or partition not in
        the counts fails the query when it is read (never a silent misroute).
    """
    if not dfs:
        raise ArgumentError.invalid("dfs", "at least one DataFrame to cogroup", ())
    if partition_counts is None:
        raise _cogroup_counts_missing("partition_counts")
    union = dfs[0]
    for df in dfs[1:]:
        union = union.unionByName(df, allowMissingColumns=True)
    return union.transform(
        with_virtual_tasks(
            elasticity_factor,
            Grouper.COGROUP,
            partitions=partition_counts,
            hash=hash,
            system=system,
            columns=columns,
        )
    )


# -- steps -------------------------------------------------------------------------------------


def _resolve_factor(elasticity_factor: int | None, plan: JobPlan | None) -> int:
    if plan is not None and not isinstance(plan, JobPlan):
        raise ArgumentTypeError.wrong_type("plan", "a JobPlan (from plan_job)", plan)
    if elasticity_factor is None:
        if plan is None:
            raise ArgumentError.invalid(
                "elasticity_factor", "a power of two from 1 to 1024 (or a plan)", None
            )
        return plan.elasticity_factor
    factor = validate_elasticity_factor(elasticity_factor)
    if plan is not None and plan.elasticity_factor != factor:
        raise ArgumentError.invalid(
            "elasticity_factor",
            f"the plan's factor {plan.elasticity_factor} (or leave it out)",
            factor,
        )
    return factor


def _check_system(system: object) -> None:
    if not isinstance(system, str) or not system:
        raise ArgumentError.invalid("system", "a system name such as 'kafka'", system)


def _plan_for(
    df: DataFrame,
    kind: Grouper,
    factor: int,
    partitions: PartitionCounts | None,
    system: str,
    cols: KafkaColumns,
) -> JobPlan:
    if partitions is None:
        if kind is Grouper.COGROUP:
            raise _cogroup_counts_missing("partitions")
        if df.isStreaming:
            raise ArgumentError.invalid(
                "partitions",
                "the input topics' partition counts for a streaming DataFrame, e.g. "
                "partitions={'events': 8} or partitions=log.partition_counts(['events']) "
                "(or plan=...)",
                None,
            )
        partitions = _partition_counts_in(df, cols)
    return plan_job(_stream_inputs(partitions, system), kind, factor)


def _cogroup_counts_missing(name: str) -> ArgumentError:
    return ArgumentError.invalid(
        name,
        "every input topic's partition count, e.g. {'views': 8, 'clicks': 12} or "
        "log.partition_counts(['views', 'clicks']); cogroup does not derive them from the "
        "data, where a topic whose last partitions are empty would get too low a count and "
        "a wrong gcd",
        None,
    )


def _stream_inputs(partitions: PartitionCounts, system: str) -> list[StreamInput]:
    if isinstance(partitions, Mapping):
        return [StreamInput(system, str(topic), count) for topic, count in partitions.items()]
    if isinstance(partitions, str):
        partitions = [partitions]
    if not isinstance(partitions, Iterable):
        raise ArgumentTypeError.wrong_type(
            "partitions",
            "the input topics' partition counts: a {topic: count} mapping such as "
            "{'clicks': 4}, or 'system.topic:count' items",
            partitions,
        )
    inputs = [StreamInput.parse(p) if isinstance(p, str) else p for p in partitions]
    for stream in inputs:
        if not isinstance(stream, StreamInput):
            raise ArgumentTypeError.wrong_type(
                "partitions", "a {topic: count} mapping or 'system.topic:count' items", stream
            )
    return inputs


def _partition_counts_in(df: DataFrame, cols: KafkaColumns) -> dict[str, int]:
    """A batch DataFrame's topics and partition counts (max partition + 1), sorted by topic."""
    from pyspark.sql import functions as F

    rows = df.groupBy(cols.topic).agg(F.max(cols.partition).alias("p")).collect()
    counts = {str(r[0]): int(r[1]) + 1 for r in rows if r[0] is not None}
    return dict(sorted(counts.items()))


def _sql_array(values: Iterable[Any]) -> str:
    items = []
    for value in values:
        if isinstance(value, str):
            escaped = value.replace("\\", "\\\\").replace("'", "\\'")
            items.append(f"'{escaped}'")
        else:
            items.append(str(int(value)))
    return f"array({', '.join(items)})"


def _sql_text(value: str) -> str:
    """``value`` as a Spark SQL string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _task_id_column(routing: VirtualTaskRouting, system: str, cols: KafkaColumns) -> Column:
    """Per row: ``base task index * factor + key bucket``, or an error outside the plan.

    Built as SQL text: a column function at a time was about 230 py4j calls for
    one stream (a query built in a warm session took 0.52-0.65 s with these and the
    key hash's, 0.36-0.38 s without; docs/benchmarks.md, session 44).
    """
    from pyspark.sql import functions as F

    plan = routing.plan
    topic, partition = quoted(cols.topic), f"CAST({quoted(cols.partition)} AS INT)"
    cases = []
    offset = 0
    for stream in plan.inputs:
        count = stream.partition_count
        if stream.system == system:
            bases = plan.ssp_base[offset : offset + count].tolist()
            condition = (
                f"{topic} = {_sql_text(stream.stream)} AND {partition} >= 0 "
                f"AND {partition} < {count}"
            )
            if bases == list(range(bases[0], bases[0] + count)):
                # Most plans number a stream's tasks consecutively: arithmetic, no lookup.
                base = f"({partition} + {bases[0]})"
            else:
                base = f"element_at({_sql_array(bases)}, {partition} + 1)"
            cases.append(f"WHEN {condition} THEN {base} * {plan.elasticity_factor} + `key_bucket`")
        offset += count
    if not cases:
        raise ArgumentError.invalid(
            "system", f"a system of the plan's inputs ({plan.inputs[0].system!r})", system
        )
    known = ", ".join(f"{s.stream} (partitions 0-{s.partition_count - 1})" for s in plan.inputs)
    message = _sql_text(
        f" is outside the virtual-task plan (topics: {known}); re-plan after a topic "
        "grows (pass plan= made with the previous plan) instead of misrouting it"
    )
    head, middle = _sql_text("spark-elastic: record of topic '"), _sql_text("' partition ")
    outside = (
        f"raise_error(concat({head}, coalesce({topic}, '<null>'), {middle}, "
        f"coalesce(CAST({partition} AS STRING), '<null>'), {message}))"
    )
    return F.expr(f"CASE {' '.join(cases)} ELSE CAST({outside} AS INT) END")


def _apply(
    df: DataFrame,
    routing: VirtualTaskRouting,
    system: str,
    hash: HashMode,
    cols: KafkaColumns,
    route: bool,
) -> DataFrame:
    from pyspark.sql import functions as F

    plan = routing.plan
    columns = [*df.columns, "key_bucket", "virtual_task", "routing_key"]
    out = df.withColumn("key_bucket", key_bucket(plan.elasticity_factor, hash, cols))
    task_id = _task_id_column(routing, system, cols)
    out = out.withColumn(
        "routing_key",
        F.element_at(F.expr(_sql_array(routing.routing_keys)), task_id + 1).cast("int"),
    )
    if route:
        out = out.repartition(routing.task_count, "routing_key")
    # Named after the shuffle, so only a 4-byte key crosses it, not the task name.
    names = F.expr(
        f"map_from_arrays({_sql_array(routing.routing_keys)}, {_sql_array(plan.task_names())})"
    )
    return out.withColumn("virtual_task", F.element_at(names, F.col("routing_key"))).select(
        *columns
    )
