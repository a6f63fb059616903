"""Stateful benchmarks: bucket-checkpoint overhead, and rescale vs Spark's offline repartition.

Run: ``.venv/bin/python benchmarks/bench_stateful.py`` (``--keys``/``--records`` to resize;
``--quick`` for a smoke run). Everything runs on the embedded log, local[2].

1. Overhead: the same running-count processor over the same records, with and
   without per-bucket checkpoints (``with_task_state(..., bucket_checkpoints=False)``),
   runs alternated, best of N.
2. Rescale: a checkpoint holding ``--keys`` keys of state at factor 2 (4 state
   partitions) is rescaled to 8 state partitions, side by side on copies of the
   same checkpoint: ``spark_elastic.rescale`` to factor 4, and Spark's own
   offline repartition (``spark._streamingCheckpointManager.repartition``, Spark
   4.2+, private, RocksDB only, which moves a virtual task's state as one piece
   and cannot change the factor). Each runs in its own process; peak memory is
   that process's Python plus its JVM. Our seed is loaded by the new query's
   first micro-batch, timed separately.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd

PARTITIONS = 2
TOPIC = "events"


def processors() -> tuple[Any, Any]:
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

    class LastOffset(TaskProcessor):
        """Writes state without reading it: the cheapest way to build many keys."""

        state_schema = "last_offset long"
        output_schema = "n long"

        def process(self, task: TaskState, rows: pd.DataFrame) -> pd.DataFrame:
            for key, offset in zip(rows["key"], rows["offset"], strict=True):
                task.put(key, (int(offset),))
            return pd.DataFrame({"n": [len(rows)]})

    return Counter, LastOffset


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
                    jvm = max(jvm, int(line.split()[1]) / 1024)
        except OSError:
            continue
    return own + jvm


def session() -> Any:
    from spark_elastic import register_log_source
    from spark_elastic.dataplane.session import local_session

    spark = local_session("bench-stateful", conf={"spark.driver.memory": "4g"})
    register_log_source(spark)
    return spark


def run_query(
    spark: Any,
    log_dir: Path,
    checkpoint: Path,
    processor: Any,
    factor: int,
    max_per_trigger: int,
    bucket_checkpoints: bool = True,
) -> float:
    from spark_elastic import starting_offsets, with_task_state

    events = (
        spark.readStream.format("elastic-log")
        .option("path", str(log_dir))
        .option("subscribe", TOPIC)
        .option("startingOffsets", starting_offsets(checkpoint))
        .option("maxOffsetsPerTrigger", max_per_trigger)
        .load()
    )
    out = events.transform(
        with_task_state(
            processor,
            job="bench",
            checkpoint_location=checkpoint,
            elasticity_factor=factor,
            partitions={TOPIC: PARTITIONS},
            bucket_checkpoints=bucket_checkpoints,
        )
    )
    started = time.perf_counter()
    query = (
        out.writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return time.perf_counter() - started


def produce(log_dir: Path, records: int, keys: int) -> None:
    from spark_elastic import EmbeddedLog

    log = EmbeddedLog(log_dir, fsync=False)
    log.create_topic(TOPIC, PARTITIONS)
    with log.producer(TOPIC) as producer:
        for start in range(0, records, 100_000):
            count = min(100_000, records - start)
            batch = [f"key-{(start + i) % keys}".encode() for i in range(count)]
            producer.send_many(batch, [b"v"] * count)


def overhead(work: Path, records: int, keys: int, runs: int) -> None:
    counter, _ = processors()
    log_dir = work / "overhead-log"
    produce(log_dir, records, keys)
    spark = session()
    times: dict[bool, list[float]] = {True: [], False: []}
    for i in range(runs):
        # ABBA: the variant that runs first in a round alternates, so a machine that
        # warms up (or slows down) over a round does not favour one of them.
        for with_checkpoints in (True, False) if i % 2 == 0 else (False, True):
            checkpoint = work / f"overhead-{with_checkpoints}-{i}"
            times[with_checkpoints].append(
                run_query(spark, log_dir, checkpoint, counter(), 2, records // 10, with_checkpoints)
            )
    spark.stop()
    print(
        f"\n### Bucket-checkpoint overhead ({records:,} records, {keys:,} keys, "
        "4 virtual tasks, 10 micro-batches, runs in ABBA order)\n"
    )
    print(f"| running count | best of {runs} (s) | median (s) | records/s (best) |")
    print("|---|---:|---:|---:|")
    for label, variant in (("without", False), ("with", True)):
        best, middle = min(times[variant]), statistics.median(times[variant])
        print(f"| {label} bucket checkpoints | {best:.1f} | {middle:.1f} | {records / best:,.0f} |")
    ratio = statistics.median(times[True]) / statistics.median(times[False])
    print(f"\noverhead (medians): {100 * (ratio - 1):+.1f}%")


def build_state(work: Path, keys: int) -> tuple[Path, Path]:
    _, last_offset = processors()
    log_dir = work / "rescale-log"
    produce(log_dir, keys, keys)
    spark = session()
    checkpoint = work / "state-f2"
    seconds = run_query(spark, log_dir, checkpoint, last_offset(), 2, keys)
    spark.stop()
    print(f"\nbuilt {keys:,} keys of state at factor 2 (4 state partitions) in {seconds:.0f} s")
    return log_dir, checkpoint


def child(argv: list[str]) -> dict[str, float]:
    result = subprocess.run(
        [sys.executable, __file__, *argv], capture_output=True, text=True, check=False
    )
    if result.returncode:
        raise SystemExit(f"{argv[0]} failed:\n{result.stderr[-3000:]}")
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def rescale_benchmark(work: Path, keys: int) -> None:
    log_dir, source = build_state(work, keys)
    ours_target = work / "ours-f4"
    spark_copy = work / "spark-copy"
    shutil.copytree(source, spark_copy)
    ours = child(["_ours", str(source), str(ours_target)])
    spark_side = child(["_spark", str(spark_copy)])
    load = child(["_load", str(log_dir), str(ours_target)])
    print(f"\n### Rescale {keys:,} keys of state, 4 -> 8 state partitions\n")
    print("| | offline (s) | peak memory (MiB) | first batch after (s) |")
    print("|---|---:|---:|---:|")
    print(
        f"| Spark `repartition(ckpt, 8)` (factor unchanged) | {spark_side['seconds']:.1f} | "
        f"{spark_side['peak_mb']:,.0f} | - |"
    )
    print(
        f"| `spark_elastic.rescale` factor 2 -> 4 | {ours['seconds']:.1f} | "
        f"{ours['peak_mb']:,.0f} | {load['seconds']:.1f} (loads the seed) |"
    )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1].startswith("_"):
        return private(sys.argv[1], sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--overhead-keys", type=int, default=10_000)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--skip-overhead", action="store_true")
    parser.add_argument("--skip-rescale", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.records, args.overhead_keys, args.keys, args.runs = 20_000, 1_000, 20_000, 1
    work = Path(tempfile.mkdtemp(prefix="bench-stateful-"))
    try:
        if not args.skip_overhead:
            overhead(work, args.records, args.overhead_keys, args.runs)
        if not args.skip_rescale:
            rescale_benchmark(work, args.keys)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def private(command: str, argv: list[str]) -> None:
    """The measured side of one comparison, in a fresh process."""
    spark = session()
    started = time.perf_counter()
    if command == "_ours":
        from spark_elastic import rescale

        rescale(argv[0], argv[1], 4, spark)
    elif command == "_spark":
        spark._streamingCheckpointManager.repartition(argv[0], 8)
    elif command == "_load":
        _, last_offset = processors()
        started = time.perf_counter()
        run_query(spark, Path(argv[0]), Path(argv[1]), last_offset(), 4, 1_000_000)
    seconds = time.perf_counter() - started
    print(json.dumps({"seconds": seconds, "peak_mb": peak_memory_mb()}))
    spark.stop()


if __name__ == "__main__":
    main()
