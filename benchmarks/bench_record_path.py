"""Where a record's microseconds go: the stateful query's path, one stage added at a time.

Run: ``.venv/bin/python benchmarks/bench_record_path.py`` (``--sizes 2000,20000``,
``--batches 6``, ``--runs 2``, ``--factor 4``, ``--variant NAME`` to run only some).
Nothing else should run beside it.

One SparkSession on ``local[2]`` (a container's default), the embedded log
(4 partitions, 1,000 keys), a query owning every task of the job at
``--factor``, into Spark's noop sink. Each variant adds one stage of a
container's stateful query to the one before:

1. ``read``: the source alone (the embedded log's Spark source);
2. ``+ route``: each record's virtual task, routing key and key slot
   (``with_virtual_tasks``, ``key_slot``), and the shuffle into the query's 2
   state partitions by routing key, as ``with_task_state`` does;
3. ``+ state, per key``: ``with_task_state`` with a per-key ``TaskProcessor``
   (a running count, ``task.get``/``task.put`` per record, one output row
   per record): Arrow to pandas, bucket checkpoints, the processor, chunked
   state, pandas to Arrow;
4. ``+ state, vectorized``: the same with a ``BatchProcessor``;
5. ``+ collect``: 4 with its output collected to the driver as Arrow
   (``toArrow`` in ``foreachBatch``), as the ``KafkaSink`` does before
   producing (the producing itself is in ``bench_sinks.py``).

For each variant and each batch size of ``--sizes``: after two warm-up
batches, the median time of a batch's records (Spark's ``triggerExecution``
of the batches they took: see ``bench_batch_cost.step_seconds``) and the
machine's CPU-seconds per batch (``/proc/stat``). A least-squares line over
the sizes splits each into a fixed part per batch and a part per record;
the difference between consecutive variants is what that stage costs.
Variants alternate within a round; medians over rounds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from bench_batch_cost import TOPIC_PARTITIONS, timed_steps
from bench_stateful import TOPIC, counter_processor, events, vectorized_processor

VARIANTS = ("read", "+ route", "+ state, per key", "+ state, vectorized", "+ collect")


def build(spark: Any, variant: str, source: Any, checkpoint: Path, factor: int) -> Any:
    """The variant's streaming DataFrame (driver, once per query)."""
    from spark_elastic import with_task_state, with_virtual_tasks
    from spark_elastic.dataplane.buckets import key_slot

    if variant == "read":
        return source
    if variant == "+ route":
        routed = source.transform(
            with_virtual_tasks(factor, partitions={TOPIC: TOPIC_PARTITIONS}, route=False)
        ).withColumn("slot", key_slot())
        return routed.repartition(2, "routing_key")
    processor = counter_processor() if variant == "+ state, per key" else vectorized_processor()
    return source.transform(
        with_task_state(
            processor,
            job="bench",
            checkpoint_location=checkpoint,
            elasticity_factor=factor,
            partitions={TOPIC: TOPIC_PARTITIONS},
        )
    )


def one(
    spark: Any, work: Path, variant: str, factor: int, records: int, batches: int
) -> dict[str, float]:
    """One query from a fresh checkpoint: per-batch figures after two warm-up batches."""
    from spark_elastic import EmbeddedLog

    root = Path(tempfile.mkdtemp(dir=work))
    log = EmbeddedLog(root / "log", fsync=False)
    log.create_topic(TOPIC, TOPIC_PARTITIONS)
    source = events(spark, log.path, root / "cp", records)
    out = build(spark, variant, source, root / "cp", factor)
    writer = out.writeStream.option("checkpointLocation", str(root / "cp"))
    if variant == "+ collect":
        writer = writer.foreachBatch(lambda batch, _: batch.toArrow())
    else:
        writer = writer.format("noop")
    query = writer.trigger(processingTime="0 seconds").start()
    try:
        figures = timed_steps(query, log, records, batches)
    finally:
        query.stop()
    return {"batch_s": figures["batch_s"], "cpu_s": figures["cpu_s"]}


def line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares ``y = fixed + per_record * x``: ``(fixed, per_record)``."""
    xs = np.array([p[0] for p in points], dtype=float)
    ys = np.array([p[1] for p in points], dtype=float)
    per_record, fixed = np.polyfit(xs, ys, 1)
    return float(fixed), float(per_record)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2000,20000", help="records a batch, e.g. 2000,20000")
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--factor", type=int, default=4)
    parser.add_argument(
        "--variant", action="append", choices=VARIANTS, help="run this one (repeat; all by default)"
    )
    args = parser.parse_args()
    variants = tuple(args.variant or VARIANTS)
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        parser.error(f"--sizes: expected record counts such as 2000,20000, found {args.sizes!r}")
    if len(sizes) < 2 or min(sizes) < 1:
        parser.error(f"--sizes: expected two or more positive counts, found {args.sizes!r}")

    from spark_elastic import register_log_source
    from spark_elastic.dataplane.session import local_session

    spark = local_session("bench-record-path", conf={"spark.sql.shuffle.partitions": "2"})
    spark.sparkContext.setLogLevel("ERROR")
    register_log_source(spark)
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-record-path-") as tmp:
        for run in range(args.runs):
            for size in sizes:
                order = variants[run % len(variants) :] + variants[: run % len(variants)]
                for variant in order:
                    figures = one(spark, Path(tmp), variant, args.factor, size, args.batches)
                    results.setdefault((variant, size), []).append(figures)
                    print(f"run {run + 1}, {size} records, {variant}: {figures}", file=sys.stderr)
    spark.stop()
    load = Path("/proc/loadavg").read_text().split()[:3]
    print(f"local[2], factor {args.factor}, load average after: {' '.join(load)}")
    header = " | ".join(f"batch of {s:,}" for s in sizes)
    print(
        f"| variant | {header} | fixed per batch | per record | CPU fixed per batch "
        "| CPU per record |"
    )
    print("|---|" + "---:|" * (len(sizes) + 4))
    for variant in variants:
        med = {
            s: {
                k: statistics.median(r[k] for r in results[(variant, s)])
                for k in ("batch_s", "cpu_s")
            }
            for s in sizes
        }
        fixed, per = line([(s, med[s]["batch_s"]) for s in sizes])
        cpu_fixed, cpu_per = line([(s, med[s]["cpu_s"]) for s in sizes])
        cells = " | ".join(f"{med[s]['batch_s']:.2f} s" for s in sizes)
        print(
            f"| {variant} | {cells} | {fixed:.2f} s | {per * 1e6:.1f} µs | {cpu_fixed:.2f} s "
            f"| {cpu_per * 1e6:.1f} µs |"
        )


if __name__ == "__main__":
    started = time.perf_counter()
    main()
    print(f"({time.perf_counter() - started:.0f} s in all)", file=sys.stderr)
