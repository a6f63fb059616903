"""Reading Kafka: spark-elastic's gated sources against Spark's ``kafka``, side by side.

Run: ``.venv/bin/python benchmarks/bench_kafka_source.py`` (``--quick`` for a
smoke run). Needs ``make jars``: a real Apache Kafka broker (KRaft, loopback)
is started for the run and stopped by its PID, and Spark's own Kafka
connector is given to the session (``spark.jars``).

``--records`` records (keys ``user-N``, values of ``--value-bytes`` bytes)
are produced once to a topic of 4 partitions. Each variant then reads the
whole topic in one streaming query (``Trigger.AvailableNow``, micro-batches
of ``--batch`` offsets, ``maxOffsetsPerTrigger``) on ``local[2]``, into two
sinks a job would have:

- ``noop``: Spark's ``noop`` sink, which consumes every row: the read alone;
- ``count``: ``foreachBatch`` counting rows per key (a shuffle), the shape
  of a keyed job's first stage;
- ``job``: the click-count job itself (keyed state at factor 2, 8 virtual
  tasks, into a ``ParquetSink``), run as a container runs it
  (``benchmarks/bench_sinks.py: run_variant``), on ``--job-records`` records
  of another topic in micro-batches of 10,000: what a stateful job's
  throughput is with each reader. Its figure counts the batches after the
  first, as ``bench_sinks`` does.

Variants: ``spark-kafka`` (Spark's source, the Java client,
``read_uncommitted``, its default), ``elastic-kafka`` (ours, librdkafka,
``read_uncommitted`` here too so all read the same offsets) and
``gated-kafka`` (Spark's source held at a gate file by the project's jar,
``java/``). The two gated sources read through a gate file at the topic's
end, as a replaying warm-up's query does (read each trigger). Rounds
rotate the variants; each figure is the median over rounds of records
per second from the query's start to its end, start-up included.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # kafka_jvm: the broker the specs start
sys.path.insert(0, str(ROOT / "benchmarks"))  # bench_sinks: the job as a container runs it

TOPIC = "bench-clicks"
JOB_TOPIC = "bench-job"
PARTITIONS = 4


def produce(bootstrap: str, records: int, value_bytes: int, users: int, topic: str = TOPIC) -> None:
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "partitioner": "murmur2_random",
            "linger.ms": 20,
            "batch.num.messages": 10_000,
        }
    )
    value = b"x" * value_bytes
    for i in range(records):
        while True:
            try:
                producer.produce(topic, key=f"user-{(i * 7919) % users}".encode(), value=value)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0


def run(spark: Any, source: str, options: dict[str, str], sink: str, root: Path) -> float:
    """Seconds from the query's start to its end, reading the whole topic."""
    from pyspark.sql import functions as F

    frame = spark.readStream.format(source).options(**options).load()
    writer = frame.writeStream.option("checkpointLocation", str(root)).trigger(availableNow=True)
    if sink == "noop":
        writer = writer.format("noop")
    else:
        counted: list[int] = []

        def count(batch: Any, _batch_id: int) -> None:
            counted.append(batch.groupBy("key").agg(F.count("*")).count())

        writer = writer.foreachBatch(count)
    began = time.perf_counter()
    query = writer.start()
    query.awaitTermination()
    elapsed = time.perf_counter() - began
    rows = sum(p["numInputRows"] for p in query.recentProgress)
    return elapsed if rows else float("nan")


def run_job(spark: Any, bootstrap: str, reader: str, root: Path) -> float:
    """The click-count job's records per second through ``reader``'s source."""
    import bench_sinks

    from spark_elastic import KafkaInput, ParquetSink

    root.mkdir(parents=True)
    source = KafkaInput(
        bootstrap,
        (JOB_TOPIC,),
        max_records_per_batch=10_000,
        reader=reader.removesuffix("-kafka"),
    )
    result = bench_sinks.run_variant(spark, source, root, ParquetSink(str(root / "out")))
    return float(result["records_per_s"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--job-records", type=int, default=60_000)
    parser.add_argument("--quick", action="store_true", help="100,000 records, 1 round")
    args = parser.parse_args()
    if args.quick:
        args.records, args.batch, args.rounds, args.job_records = 100_000, 20_000, 1, 20_000

    import kafka_jvm  # type: ignore[import-not-found]

    from spark_elastic.dataplane.session import local_session
    from spark_elastic.log.gate import write_gate
    from spark_elastic.log.kafka_source import KAFKA_SOURCE_FORMAT, register_kafka_source
    from spark_elastic.runtime.inputs import GATED_KAFKA_FORMAT

    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-kafka-")))
        broker = stack.enter_context(kafka_jvm.running_kafka())
        kafka_jvm.create_topics(broker.bootstrap, {TOPIC: PARTITIONS, JOB_TOPIC: PARTITIONS})
        began = time.perf_counter()
        produce(broker.bootstrap, args.records, args.value_bytes, args.users)
        produce(broker.bootstrap, args.job_records, 5, 1_000, JOB_TOPIC)
        print(f"produced {args.records:,} records in {time.perf_counter() - began:.1f} s")
        spark = local_session(
            "bench-kafka-source",
            conf={
                "spark.driver.memory": "4g",
                "spark.jars": ",".join(kafka_jvm.spark_kafka_jars()),
            },
        )
        register_kafka_source(spark)
        gate = tmp / "gate.json"
        write_gate(str(gate), {TOPIC: dict.fromkeys(map(str, range(PARTITIONS)), args.records)})
        shared = {
            "kafka.bootstrap.servers": broker.bootstrap,
            "subscribe": TOPIC,
            "startingOffsets": "earliest",
            "maxOffsetsPerTrigger": str(args.batch),
        }
        variants = {
            "spark-kafka": ("kafka", shared),
            "elastic-kafka": (
                KAFKA_SOURCE_FORMAT,
                {**shared, "kafka.isolation.level": "read_uncommitted", "gate": str(gate)},
            ),
            "gated-kafka": (GATED_KAFKA_FORMAT, {**shared, "gate": str(gate)}),
        }
        names = list(variants)
        sinks = ("noop", "count", "job")
        results: dict[tuple[str, str], list[float]] = {}
        for round_ in range(args.rounds):
            order = names[round_ % len(names) :] + names[: round_ % len(names)]
            for sink in sinks:
                for name in order:
                    source, options = variants[name]
                    root = tmp / f"{name}-{sink}-{round_}"
                    if sink == "job":
                        rate = run_job(spark, broker.bootstrap, name, root)
                        seconds = args.job_records / rate
                    else:
                        seconds = run(spark, source, options, sink, root)
                        rate = args.records / seconds
                    results.setdefault((name, sink), []).append(rate)
                    print(
                        f"round {round_ + 1} {name} -> {sink}: {rate:,.0f} records/s "
                        f"({seconds:.1f} s)",
                        flush=True,
                    )
        print(
            f"\n{args.records:,} records of {args.value_bytes} bytes, {PARTITIONS} partitions, "
            f"{args.batch:,} a batch, local[2]; median of {args.rounds} rounds"
        )
        print(
            f"{'sink':<8}" + "".join(f"{name:>15}" for name in names) + "  (ratio to spark-kafka)"
        )
        for sink in sinks:
            theirs = statistics.median(results["spark-kafka", sink])
            cells = []
            for name in names:
                rate = statistics.median(results[name, sink])
                cells.append(f"{rate:>9,.0f} {rate / theirs:4.2f}x")
            print(f"{sink:<8}" + "".join(f"{cell:>15}" for cell in cells))
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
