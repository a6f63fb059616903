"""What exactly-once output costs: each sink exactly-once against at-least-once, side by side.

Run: ``.venv/bin/python benchmarks/bench_sinks.py`` (``--quick`` for a smoke run;
``--no-kafka`` without a broker). Needs ``make jars`` for the Kafka variants: a
real Apache Kafka broker (KRaft, loopback) is started for the run and stopped
by its PID.

The click-count job (a running count per user, keyed state at factor 2, 4
input partitions: 8 virtual tasks) runs as a container runs it (its query
built by ``runtime/container/query.py``, ``foreachBatch`` into the job's
sink), on ``--records`` records of the embedded log in micro-batches of
``--batch`` records, in one process on ``local[2]``. Variants:

- ``parquet-exactly-once``: ``ParquetSink()`` (default): each batch's
  directory also holds what it covers, read from Spark's offset log;
- ``parquet-at-least-once``: ``ParquetSink(guarantee="at-least-once")``;
- ``kafka-exactly-once``: ``KafkaSink()`` (default): a progress record in
  each batch's transaction, a transactional id of the tasks;
- ``kafka-at-least-once``: ``KafkaSink(guarantee="at-least-once")``: the
  same transaction per batch, without the progress record.

Rounds alternate the variants (the first of a round rotates); each figure is
the median over rounds. Throughput counts the batches after the first (the
first pays the Python workers' start); latency is Spark's
``triggerExecution`` per batch. A new owner's one-off read of what was
published (``published()``) is timed apart.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # kafka_jvm: the broker the specs start
sys.path.insert(0, str(ROOT / "examples" / "jobs"))  # the example job's processor

import click_counts  # noqa: E402
from pyspark import cloudpickle  # noqa: E402

from spark_elastic import EmbeddedLog, Job, KafkaSink, LogInput, ParquetSink  # noqa: E402

# Spark's Python workers get the processor by value, as a container ships its job file.
cloudpickle.register_pickle_by_value(click_counts)

PARTITIONS = 4
FACTOR = 2
TASKS = tuple(f"Partition {p}_{b}_{FACTOR}" for p in range(PARTITIONS) for b in range(FACTOR))


def run_variant(spark: Any, source: Any, root: Path, sink: Any) -> dict[str, float]:
    """One run of the job on ``source`` (a ``LogInput`` or ``KafkaInput`` of one topic of 4
    partitions) on a fresh checkpoint: throughput and batch latencies."""
    from spark_elastic.runtime.container import ContainerSettings
    from spark_elastic.runtime.container.query import _progress_json, _start_query
    from spark_elastic.runtime.growth import grown_plan
    from spark_elastic.runtime.lease import ContainerLease, LeaseTerms
    from spark_elastic.runtime.protocol import ContainerModel

    job = Job(
        "bench",
        source,
        FACTOR,
        str(root / "checkpoints"),
        sink,
        processor=click_counts.ClickCount(),
        trigger_interval="0 seconds",
    )
    counts = {source.topics[0]: PARTITIONS}
    plan = grown_plan(job.grouper, FACTOR, counts, counts)
    mine = ContainerModel("c1", TASKS, 1, str(root / f"checkpoint-{uuid.uuid4().hex[:8]}"))
    lease = ContainerLease(LeaseTerms(lease_s=3600.0, margin_s=1.0, write_budget_s=1.0))
    lease.renew(time.monotonic(), 3_600_000)
    settings = ContainerSettings("c1", "http://127.0.0.1:1", "unused")
    query = _start_query(spark, job, plan, mine, lease, settings)
    try:
        query.processAllAvailable()
        progress = [_progress_json(p) for p in query.recentProgress]
    finally:
        query.stop()
    batches = [p for p in progress if p.get("numInputRows", 0) > 0]
    steady = batches[1:]
    rows = sum(p["numInputRows"] for p in steady)
    seconds = sum(p["durationMs"]["triggerExecution"] for p in steady) / 1000
    latencies = sorted(p["durationMs"]["triggerExecution"] for p in steady)
    started = time.perf_counter()
    if hasattr(sink, "published") and sink.guarantee == "transactional":
        sink.published(job.name, TASKS)
    return {
        "records_per_s": rows / seconds if seconds else 0.0,
        "median_ms": statistics.median(latencies),
        "max_ms": latencies[-1],
        "published_ms": (time.perf_counter() - started) * 1000,
        "batches": len(batches),
    }


@contextmanager
def broker(enabled: bool) -> Iterator[Any]:
    if not enabled:
        yield None
        return
    import kafka_jvm  # type: ignore[import-not-found]

    with kafka_jvm.running_kafka() as running:
        yield running


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=60_000)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--users", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="20,000 records, 1 round")
    parser.add_argument("--no-kafka", action="store_true", help="the Parquet variants only")
    args = parser.parse_args()
    if args.quick:
        args.records, args.batch, args.rounds = 20_000, 4_000, 1

    from spark_elastic import register_log_source
    from spark_elastic.dataplane.session import local_session

    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-sinks-")))
        kafka = stack.enter_context(broker(not args.no_kafka))
        spark = local_session("bench-sinks", conf={"spark.driver.memory": "4g"})
        register_log_source(spark)
        log = EmbeddedLog(tmp / "log")
        log.create_topic("clicks", PARTITIONS)
        with log.producer("clicks") as producer:
            keys = [f"user-{(i * 7919) % args.users}".encode() for i in range(args.records)]
            producer.send_many(keys, [b"click"] * args.records)

        def kafka_sink(guarantee: str) -> Callable[[Path], Any]:
            def make(root: Path) -> Any:
                import kafka_jvm  # type: ignore[import-not-found]

                topic = f"counts-{root.name}"
                kafka_jvm.create_topics(kafka.bootstrap, {topic: PARTITIONS})
                return KafkaSink(kafka.bootstrap, topic, key="user", guarantee=guarantee)

            return make

        variants: dict[str, Callable[[Path], Any]] = {
            "parquet-exactly-once": lambda root: ParquetSink(str(root / "out")),
            "parquet-at-least-once": lambda root: ParquetSink(
                str(root / "out"), guarantee="at-least-once"
            ),
        }
        if kafka is not None:
            variants["kafka-exactly-once"] = kafka_sink("transactional")
            variants["kafka-at-least-once"] = kafka_sink("at-least-once")
        names = list(variants)
        results: dict[str, list[dict[str, float]]] = {name: [] for name in names}
        for round_ in range(args.rounds):
            order = names[round_ % len(names) :] + names[: round_ % len(names)]
            for name in order:
                root = tmp / f"{name}-{round_}"
                root.mkdir()
                source = LogInput(str(log.path), ("clicks",), max_records_per_batch=args.batch)
                result = run_variant(spark, source, root, variants[name](root))
                results[name].append(result)
                print(
                    f"round {round_ + 1} {name}: {result['records_per_s']:,.0f} records/s, "
                    f"median batch {result['median_ms']:,.0f} ms",
                    flush=True,
                )
        print(
            f"\n{args.records:,} records, {args.batch:,} a batch, {args.users:,} users, "
            f"{PARTITIONS} partitions x factor {FACTOR}, local[2]; median of {args.rounds} rounds"
        )
        print(
            f"{'variant':<24}{'records/s':>12}{'vs at-least-once':>18}"
            f"{'median batch ms':>17}{'max batch ms':>14}{'published() ms':>16}"
        )
        for name in names:
            rate = statistics.median(r["records_per_s"] for r in results[name])
            base_name = name.replace("exactly-once", "at-least-once")
            base = statistics.median(r["records_per_s"] for r in results[base_name])
            ratio = f"{rate / base:.2f}x" if base else "-"
            print(
                f"{name:<24}{rate:>12,.0f}{ratio:>18}"
                f"{statistics.median(r['median_ms'] for r in results[name]):>17,.0f}"
                f"{statistics.median(r['max_ms'] for r in results[name]):>14,.0f}"
                f"{statistics.median(r['published_ms'] for r in results[name]):>16,.1f}"
            )
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
