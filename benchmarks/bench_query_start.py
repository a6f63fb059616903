"""A stateful query's start in a warm session: spark-elastic against Spark's own.

Run: ``.venv/bin/python benchmarks/bench_query_start.py`` (``--starts 6``, ``--runs 2``,
``--records 2000``; about 3 minutes). Nothing else should run beside it.

Every start of a stateful query pays before its first record: building the
DataFrame, the query's start, and Spark's planning of its first batch. For
transform-with-state, that planning starts a fresh Python process on the
driver that unpickles the processor only to call its ``init`` and learn its
state variables (``processor._as_stateful_processor`` keeps that process
from loading spark-elastic or the user's code). A container pays this at
its start, each warm-up and rehearsal at theirs, every restart again.

One SparkSession on ``local[2]`` (a container's default); each start reads a
fresh embedded-log topic of ``--records`` records (1,000 keys, 4 partitions)
from a fresh checkpoint, ``availableNow``, into the noop sink. Variants,
alternating start by start:

- ``Spark groupBy count``: ``groupBy("key").count()``, update mode;
- ``transformWithStateInPandas``: pyspark's own, a per-key running count;
- ``with_task_state``: spark-elastic's vectorized running count, the query
  owning all 16 tasks of a job at factor 4.

Per variant, medians over the starts after each run's first (which warms
the session): seconds to build the DataFrame, Spark's ``queryPlanning`` of
the first batch, its ``addBatch``, and the query from ``start()`` to its end.
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
from bench_batch_cost import TOPIC_PARTITIONS, owned_tasks
from bench_stateful import TOPIC, events, per_key_processor, start_noop, vectorized_processor

VARIANTS = ("Spark groupBy count", "transformWithStateInPandas", "with_task_state")


def build(spark: Any, variant: str, log: Path, checkpoint: Path, records: int) -> tuple[Any, str]:
    """The variant's query on a fresh checkpoint, and its output mode."""
    from spark_elastic import with_task_state

    source = events(spark, log, checkpoint, records)
    if variant == VARIANTS[0]:
        return source.groupBy("key").count(), "update"
    if variant == VARIANTS[1]:
        counts = (
            source.select("key")
            .groupBy("key")
            .transformWithStateInPandas(
                per_key_processor(), "key binary, count long", "Append", "None"
            )
        )
        return counts, "append"
    counted = source.transform(
        with_task_state(
            vectorized_processor(),
            job="bench",
            checkpoint_location=checkpoint,
            elasticity_factor=4,
            partitions={TOPIC: TOPIC_PARTITIONS},
            tasks=owned_tasks(4),
        )
    )
    return counted, "append"


def one_start(spark: Any, work: Path, variant: str, records: int) -> dict[str, float]:
    """One start from a fresh topic and checkpoint: its figures in seconds."""
    from spark_elastic import EmbeddedLog

    root = Path(tempfile.mkdtemp(dir=work))
    log = EmbeddedLog(root / "log", fsync=False)
    log.create_topic(TOPIC, TOPIC_PARTITIONS)
    keys = np.random.default_rng(1).integers(0, 1000, records)
    with log.producer(TOPIC) as producer:
        producer.send_many([f"user-{k}".encode() for k in keys], [b"v"] * records)
    began = time.perf_counter()
    df, mode = build(spark, variant, log.path, root / "cp", records)
    built = time.perf_counter()
    query = start_noop(df, root / "cp", mode)
    query.awaitTermination()
    ended = time.perf_counter()
    durations = query.recentProgress[0]["durationMs"]
    return {
        "build": built - began,
        "planning": durations["queryPlanning"] / 1000,
        "add_batch": durations["addBatch"] / 1000,
        "start_to_end": ended - built,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=6, help="starts of each variant a run")
    parser.add_argument("--runs", type=int, default=2, help="sessions, one after another")
    parser.add_argument("--records", type=int, default=2_000, help="records a start reads")
    args = parser.parse_args()
    for name in ("starts", "runs", "records"):
        if getattr(args, name) < (2 if name == "starts" else 1):
            parser.error(f"--{name}: expected at least {2 if name == 'starts' else 1}")

    from spark_elastic import register_log_source
    from spark_elastic.dataplane.session import local_session

    results: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="bench-query-start-") as tmp:
        for run in range(args.runs):
            spark = local_session(f"bench-query-start-{run}", conf={"spark.master": "local[2]"})
            spark.sparkContext.setLogLevel("ERROR")
            register_log_source(spark)
            for start in range(args.starts):
                for variant in VARIANTS[start % 3 :] + VARIANTS[: start % 3]:
                    figures = one_start(spark, Path(tmp), variant, args.records)
                    step = f"run {run + 1}, start {start + 1}, {variant}"
                    print(f"{step}: {figures}", file=sys.stderr)
                    if start:  # the first start of a run warms the session
                        results[variant].append(figures)
            spark.stop()
    load = Path("/proc/loadavg").read_text().split()[:3]
    print(f"load average after: {' '.join(load)}; medians of {len(results[VARIANTS[0]])} starts")
    print("| variant | build | `queryPlanning` | `addBatch` | `start()` to end |")
    print("|---|---:|---:|---:|---:|")
    for variant, rows in results.items():
        cells = [statistics.median(r[k] for r in rows) for k in rows[0]]
        print(f"| {variant} | " + " | ".join(f"{c:.2f} s" for c in cells) + " |")


if __name__ == "__main__":
    main()
