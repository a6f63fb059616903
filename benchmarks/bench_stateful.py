"""Stateful benchmarks: steady-state speed against Spark, checkpoint overhead, rescale downtime.

Run: ``.venv/bin/python benchmarks/bench_stateful.py`` (``--quick`` for a smoke run,
``--only steady,large,overhead,rescale`` for some sections, ``--variants`` to leave
some out). Everything runs on the embedded log, local[2], RocksDB, 2 topic
partitions and 4 state partitions, noop sink; runs of one section alternate
their variants (the first of a round rotates), medians reported.

1. steady: a running count over ``--records`` records of ``--keys-small`` keys
   in 10 micro-batches: Spark's native ``groupBy("key").count()`` (no Python),
   ``with_task_state`` (ours), and ``transformWithStateInPandas`` grouped by
   the record key with one ValueState per key (what a user writes without us).
2. large: the same running count with ``--keys`` keys of state already built,
   then 5 micro-batches of 20,000 records: native against ours (a state layout
   that rewrote a task's whole state each batch would lose here).
3. overhead: ours with and without per-bucket checkpoints.
4. rescale: ``--keys`` keys of state at factor 2 split to factor 4, then merged
   back to 2. Downtime = the offline ``rescale`` plus the new query's first
   micro-batch (20,000 new records), timed one after the other in a fresh
   process after its SparkSession started (as a container that rescales its
   checkpoint and restarts its query would); against Spark's own offline
   repartition (4.2+, private, RocksDB only, cannot change the factor) of the
   same checkpoint, in a fresh process too; and the ``spark-elastic rescale``
   command's split, start to exit, with its own JVM options. ``--class-archive``: those fresh
   processes map a class archive as containers do
   (:mod:`spark_elastic.runtime.container.class_archive`; the one that builds
   the state records it when the host has none); ``--c1``: they compile with C1
   only, as containers do (:mod:`spark_elastic.runtime.container.compiler`).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

PARTITIONS = 2
TOPIC = "events"
BATCH = 20_000


def counter_processor() -> Any:
    from spark_elastic import TaskProcessor, TaskState

    class Counter(TaskProcessor):
        state_schema = "count long"
        output_schema = "key binary, count long"

        def process(self, task: TaskState, rows: pd.DataFrame) -> pd.DataFrame:
            counts = []
            for key in rows["key"]:
                (count,) = task.get(key, (0,))  # type: ignore[misc]
                task.put(key, (count + 1,))
                counts.append(count + 1)
            return pd.DataFrame({"key": rows["key"], "count": counts})

    return Counter()


def vectorized_processor() -> Any:
    """``counter_processor``'s count as a ``BatchProcessor``: a task's batch at once."""
    from spark_elastic import BatchProcessor, TaskBatch, TaskUpdate

    class VectorCounter(BatchProcessor):
        state_schema = "count long"
        output_schema = "key binary, count long"

        def process_batch(self, batch: TaskBatch) -> TaskUpdate:
            before = batch.state(default=(0,))["count"].to_numpy()
            return TaskUpdate(
                state=pd.DataFrame({"count": before + batch.key_counts()}),
                output=pd.DataFrame(
                    {
                        "key": batch.rows["key"],
                        "count": before[batch.key_index] + batch.occurrence + 1,
                    }
                ),
            )

    return VectorCounter()


def per_key_processor() -> Any:
    """What a user writes without spark-elastic: group by the key, one ValueState per key."""
    from pyspark.sql.streaming import StatefulProcessor

    class PerKeyCount(StatefulProcessor):  # type: ignore[misc]
        def init(self, handle: Any) -> None:
            self.count = handle.getValueState("count", "count long")

        def handleInputRows(self, key: Any, rows: Any, timer_values: Any) -> Any:
            frame = pd.concat(list(rows), ignore_index=True)
            start = self.count.get()[0] if self.count.exists() else 0
            n = len(frame)
            self.count.update((start + n,))
            yield pd.DataFrame({"key": frame["key"], "count": range(start + 1, start + n + 1)})

        def close(self) -> None:
            pass

    return PerKeyCount()


def peak_memory_mb() -> float:
    """Peak RSS of this process plus its JVM child (VmHWM), in MiB."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    jvm = 0.0
    me = str(Path("/proc/self").resolve().name)
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text().split()
            if stat[3] != me:
                continue
            for line in (proc / "status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    jvm += int(line.split()[1]) / 1024
        except OSError:
            continue
    return own + jvm


ARCHIVE_ENV = "BENCH_CLASS_ARCHIVE"
"""Set by ``--class-archive`` for the fresh processes: they map a class archive as containers do."""
C1_ENV = "BENCH_C1"
"""Set by ``--c1`` for the fresh processes: they compile with C1 only, as containers do."""


def session() -> Any:
    from spark_elastic import register_log_source
    from spark_elastic.dataplane.session import _DEFAULT_CONF, local_session

    conf = {"spark.driver.memory": "4g"}
    if os.environ.get(C1_ENV) == "1":
        from spark_elastic.runtime.container.compiler import with_compiler

        conf = with_compiler({**_DEFAULT_CONF, **conf})
    if os.environ.get(ARCHIVE_ENV) == "1":
        from spark_elastic.dataplane.session import find_java
        from spark_elastic.dataplane.spark_home import own_spark_home
        from spark_elastic.runtime.container.class_archive import with_class_archive

        conf = {**_DEFAULT_CONF, **conf}
        # The home local_session starts the JVM from: its class path goes through it.
        conf = with_class_archive(conf, find_java(), own_spark_home("local[2]", conf))
    spark = local_session("bench-stateful", conf=conf)
    register_log_source(spark)
    return spark


def stop(spark: Any) -> None:
    """Stop a fresh process's session; one that recorded a class archive writes it now."""
    from spark_elastic.runtime.container.class_archive import finish

    spark.stop()
    finish(spark.sparkContext._gateway.proc)


def events(spark: Any, log_dir: Path, checkpoint: Path, max_per_trigger: int) -> Any:
    from spark_elastic import starting_offsets

    return (
        spark.readStream.format("elastic-log")
        .option("path", str(log_dir))
        .option("subscribe", TOPIC)
        .option("startingOffsets", starting_offsets(checkpoint))
        .option("maxOffsetsPerTrigger", max_per_trigger)
        .load()
    )


def start_noop(df: Any, checkpoint: Path, output_mode: str = "append") -> Any:
    """Start ``df`` into the noop sink, to the end of the log (``availableNow``)."""
    return (
        df.writeStream.format("noop")
        .outputMode(output_mode)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )


def run(df: Any, checkpoint: Path, output_mode: str = "append") -> float:
    """Seconds from start to the end of an ``availableNow`` run of ``df``."""
    started = time.perf_counter()
    query = start_noop(df, checkpoint, output_mode)
    query.awaitTermination()
    if query.exception() is not None:
        raise SystemExit(f"query failed: {query.exception()}")
    return time.perf_counter() - started


def counted(
    spark: Any,
    log_dir: Path,
    checkpoint: Path,
    factor: int,
    max_per_trigger: int,
    bucket_checkpoints: bool = True,
    vectorized: bool = False,
) -> Any:
    """The running count of ours on the embedded log, as a streaming DataFrame."""
    from spark_elastic import with_task_state

    return events(spark, log_dir, checkpoint, max_per_trigger).transform(
        with_task_state(
            vectorized_processor() if vectorized else counter_processor(),
            job="bench",
            checkpoint_location=checkpoint,
            elasticity_factor=factor,
            partitions={TOPIC: PARTITIONS},
            bucket_checkpoints=bucket_checkpoints,
        )
    )


def ours(
    spark: Any,
    log_dir: Path,
    checkpoint: Path,
    factor: int,
    max_per_trigger: int,
    bucket_checkpoints: bool = True,
    vectorized: bool = False,
) -> float:
    out = counted(
        spark, log_dir, checkpoint, factor, max_per_trigger, bucket_checkpoints, vectorized
    )
    return run(out, checkpoint)


def native(spark: Any, log_dir: Path, checkpoint: Path, max_per_trigger: int) -> float:
    counts = events(spark, log_dir, checkpoint, max_per_trigger).groupBy("key").count()
    return run(counts, checkpoint, "update")


def per_key(spark: Any, log_dir: Path, checkpoint: Path, max_per_trigger: int) -> float:
    counts = (
        events(spark, log_dir, checkpoint, max_per_trigger)
        .select("key")
        .groupBy("key")
        .transformWithStateInPandas(per_key_processor(), "key binary, count long", "Append", "None")
    )
    return run(counts, checkpoint)


def produce(log_dir: Path, records: int, keys: int, seed: int | None = None) -> None:
    """``records`` records over ``keys`` keys: round-robin, or random with ``seed``."""
    from spark_elastic import EmbeddedLog

    log = EmbeddedLog(log_dir, fsync=False)
    if TOPIC not in log.partition_counts():
        log.create_topic(TOPIC, PARTITIONS)
    rng = random.Random(seed)
    with log.producer(TOPIC) as producer:
        for start in range(0, records, 100_000):
            count = min(100_000, records - start)
            ids = (
                [(start + i) % keys for i in range(count)]
                if seed is None
                else [rng.randrange(keys) for _ in range(count)]
            )
            producer.send_many([f"key-{i}".encode() for i in ids], [b"v"] * count)


Variant = Callable[[Path], float]


def alternate(variants: dict[str, Variant], runs: int, work: Path) -> dict[str, list[float]]:
    """Each variant ``runs`` times; the first of a round rotates so drift favours none."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for i in range(runs):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            # By the variant's place: two variants may share a first word.
            checkpoint = work / f"variant-{names.index(name)}-{i}"
            times[name].append(variants[name](checkpoint))
            print(f"  {name} run {i}: {times[name][-1]:.1f} s", file=sys.stderr)
    return times


def table(title: str, times: dict[str, list[float]], records: int) -> None:
    print(f"\n### {title}\n")
    print("| variant | median (s) | records/s |")
    print("|---|---:|---:|")
    for name, samples in times.items():
        middle = statistics.median(samples)
        print(f"| {name} | {middle:.1f} | {records / middle:,.0f} |")


def warm_up(spark: Any, work: Path) -> None:
    """One small untimed run of each kind of query: the JVM's JIT and Python workers warm up."""
    log_dir = work / "warm-up-log"
    produce(log_dir, 2_000, 100)
    native(spark, log_dir, work / "warm-up-native", 1_000)
    ours(spark, log_dir, work / "warm-up-ours", 2, 1_000)


def steady(work: Path, records: int, keys: int, runs: int, chosen: set[str]) -> None:
    log_dir = work / "steady-log"
    produce(log_dir, records, keys)
    spark = session()
    warm_up(spark, work)
    per_trigger = records // 10
    variants: dict[str, Variant] = {
        'native `groupBy("key").count()`': lambda cp: native(spark, log_dir, cp, per_trigger),
        "`with_task_state` (ours)": lambda cp: ours(spark, log_dir, cp, 2, per_trigger),
        "`with_task_state` vectorized (ours, `BatchProcessor`)": lambda cp: ours(
            spark, log_dir, cp, 2, per_trigger, vectorized=True
        ),
        "`transformWithStateInPandas` per key": lambda cp: per_key(spark, log_dir, cp, per_trigger),
    }
    picked = {n: v for n, v in variants.items() if n.split()[0].strip("`") in chosen}
    times = alternate(picked, runs, work / "steady")
    spark.stop()
    table(
        f"Running count: {records:,} records of {keys:,} keys in 10 micro-batches",
        times,
        records,
    )


def large(work: Path, keys: int, runs: int, chosen: set[str]) -> None:
    """Build ``keys`` keys of state per variant once, then time 5 batches of 20,000 on top."""
    spark = session()
    warm_up(spark, work)
    variants: dict[str, Callable[[Path, Path, int], float]] = {
        'native `groupBy("key").count()`': lambda log, cp, n: native(spark, log, cp, n),
        "`with_task_state` (ours)": lambda log, cp, n: ours(spark, log, cp, 2, n),
    }
    picked = {n: v for n, v in variants.items() if n.split()[0].strip("`") in chosen}
    times: dict[str, list[float]] = {name: [] for name in picked}
    for i in range(runs):
        log_dir = work / f"large-log-{i}"
        produce(log_dir, keys, keys)
        built = {}
        for name, variant in picked.items():
            checkpoint = work / f"large-{name.split()[0].strip('`')}-{i}"
            built[name] = variant(log_dir, checkpoint, keys)
            print(f"  {name} built {keys:,} keys in {built[name]:.0f} s", file=sys.stderr)
        produce(log_dir, 5 * BATCH, keys, seed=i)
        names = list(picked)
        for name in names[i % len(names) :] + names[: i % len(names)]:
            checkpoint = work / f"large-{name.split()[0].strip('`')}-{i}"
            times[name].append(picked[name](log_dir, checkpoint, BATCH))
            print(f"  {name} run {i}: {times[name][-1]:.1f} s", file=sys.stderr)
    spark.stop()
    table(
        f"Running count on {keys:,} keys of state: 5 micro-batches of {BATCH:,} records",
        times,
        5 * BATCH,
    )


def overhead(work: Path, records: int, keys: int, runs: int) -> None:
    log_dir = work / "overhead-log"
    produce(log_dir, records, keys)
    spark = session()
    warm_up(spark, work)
    per_trigger = records // 10
    times = alternate(
        {
            "with bucket checkpoints": lambda cp: ours(spark, log_dir, cp, 2, per_trigger, True),
            "without bucket checkpoints": lambda cp: ours(
                spark, log_dir, cp, 2, per_trigger, False
            ),
        },
        runs,
        work / "overhead",
    )
    spark.stop()
    table(f"Bucket-checkpoint overhead ({records:,} records, {keys:,} keys)", times, records)
    ratio = statistics.median(times["with bucket checkpoints"]) / statistics.median(
        times["without bucket checkpoints"]
    )
    print(f"\noverhead (medians): {100 * (ratio - 1):+.1f}%")


def child(argv: list[str]) -> dict[str, float]:
    result = subprocess.run(
        [sys.executable, __file__, *argv], capture_output=True, text=True, check=False
    )
    if result.returncode:
        raise SystemExit(f"{argv[0]} failed:\n{result.stderr[-3000:]}")
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def rescale_benchmark(work: Path, keys: int) -> None:
    log_dir = work / "rescale-log"
    produce(log_dir, keys, keys)
    source = work / "state-f2"
    built = child(["_run", str(log_dir), str(source), "2", str(keys)])
    print(f"  built {keys:,} keys at factor 2 in {built['seconds']:.0f} s", file=sys.stderr)
    spark_copy = work / "spark-copy"
    shutil.copytree(source, spark_copy)
    spark_side = child(["_spark", str(spark_copy)])
    command = _command_seconds(source, work / "state-f4-command", 4, cwd=work)
    rows = []
    for label, old, new, factor in (
        ("split 2 -> 4", source, work / "state-f4", 4),
        ("merge 4 -> 2", work / "state-f4", work / "state-f2-again", 2),
    ):
        produce(log_dir, BATCH, keys, seed=factor)
        timed = child(["_rescale_run", str(old), str(new), str(factor), str(log_dir)])
        rows.append((label, timed))
        print(f"  {label}: {timed['offline']:.1f} s + {timed['first']:.1f} s", file=sys.stderr)
    print(f"\n### Rescale {keys:,} keys of state (downtime = offline + first micro-batch)\n")
    print("| | offline (s) | first micro-batch (s) | downtime (s) | peak memory (MiB) |")
    print("|---|---:|---:|---:|---:|")
    print(
        f"| Spark `repartition(ckpt, 8)` (factor unchanged) | {spark_side['seconds']:.1f} | - | - "
        f"| {spark_side['peak_mb']:,.0f} |"
    )
    for label, timed in rows:
        print(
            f"| `spark_elastic.rescale` {label} | {timed['offline']:.1f} | "
            f"{timed['first']:.1f} | {timed['offline'] + timed['first']:.1f} | "
            f"{timed['peak_mb']:,.0f} |"
        )
    print(
        f"| `spark-elastic rescale` split 2 -> 4, the whole command | {command:.1f} | - | - | - |"
    )


def _command_seconds(source: Path, target: Path, factor: int, cwd: Path) -> float:
    """The ``spark-elastic rescale`` command, start to exit, as a user runs it (its own JVM
    options). From ``cwd``: ``python -m`` puts the current directory first on the path."""
    argv = [sys.executable, "-m", "spark_elastic", "rescale", "--from", str(source)]
    argv += ["--to", str(target), "--elasticity-factor", str(factor)]
    started = time.perf_counter()
    result = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, check=False)
    if result.returncode:
        raise SystemExit(f"spark-elastic rescale failed:\n{result.stderr[-3000:]}")
    return time.perf_counter() - started


SECTIONS = ("steady", "large", "overhead", "rescale")
VARIANTS = ("native", "with_task_state", "transformWithStateInPandas")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1].startswith("_"):
        return private(sys.argv[1], sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--keys-small", type=int, default=10_000)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--only", default=",".join(SECTIONS))
    parser.add_argument(
        "--class-archive",
        action="store_true",
        help="rescale's fresh processes map a class archive as containers do (the first records)",
    )
    parser.add_argument(
        "--c1",
        action="store_true",
        help="rescale's fresh processes compile with C1 only, as containers do",
    )
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.class_archive:
        os.environ[ARCHIVE_ENV] = "1"  # for the fresh processes (child() passes the environment)
    if args.c1:
        os.environ[C1_ENV] = "1"
    only = set(args.only.split(","))
    chosen = set(args.variants.split(","))
    for name, given, allowed in (("--only", only, SECTIONS), ("--variants", chosen, VARIANTS)):
        if not given <= set(allowed):
            parser.error(f"{name}: expected some of {','.join(allowed)}, found {sorted(given)}")
    if args.quick:
        args.records, args.keys_small, args.keys, args.runs = 20_000, 1_000, 40_000, 1
    work = Path(tempfile.mkdtemp(prefix="bench-stateful-"))
    try:
        if "steady" in only:
            steady(work, args.records, args.keys_small, args.runs, chosen)
        if "large" in only:
            large(work, args.keys, args.runs, chosen)
        if "overhead" in only:
            overhead(work, args.records, args.keys_small, args.runs)
        if "rescale" in only:
            rescale_benchmark(work, args.keys)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def private(command: str, argv: list[str]) -> None:
    """The measured side of one comparison, in a fresh process (after Spark started)."""
    spark = session()
    started = time.perf_counter()
    if command == "_rescale_run":
        # Like a container that rescales its checkpoint and restarts its query: one process.
        from spark_elastic import rescale

        rescale(argv[0], argv[1], int(argv[2]), spark)
        offline = time.perf_counter() - started
        first = ours(spark, Path(argv[3]), Path(argv[1]), int(argv[2]), BATCH)
        print(json.dumps({"offline": offline, "first": first, "peak_mb": peak_memory_mb()}))
        stop(spark)
        return
    if command == "_spark":
        spark._streamingCheckpointManager.repartition(argv[0], 8)
    elif command == "_run":
        ours(spark, Path(argv[0]), Path(argv[1]), int(argv[2]), int(argv[3]))
    seconds = time.perf_counter() - started
    print(json.dumps({"seconds": seconds, "peak_mb": peak_memory_mb()}))
    stop(spark)


if __name__ == "__main__":
    main()
