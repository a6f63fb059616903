"""The ``elastic-kafka`` source's own reading loop, without Spark: the profile behind
docs/benchmarks.md's note on its read.

Run: ``.venv/bin/python benchmarks/profile_kafka_read.py [RECORDS]`` (default 300,000;
needs ``make jars``). A real Kafka broker (KRaft, loopback; stopped by its PID)
gets ``RECORDS`` records of 100 bytes (keys ``user-N``) in one partition; the
source's ``_read`` (what a Spark task runs in its Python worker) reads them
into Arrow batches three times: cold (the first consumer of the process), warm
(its consumer reused, as a Python worker reuses it), and warm under
``cProfile``, whose top entries it prints. What it leaves out, Spark's side of
a Python data source (the Arrow batches handed to the JVM, per-batch
planning), is the rest of ``bench_kafka_source.py``'s figure.
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # kafka_jvm: the broker the specs start

TOPIC = "profile-read"


def main(records: int) -> None:
    import kafka_jvm  # type: ignore[import-not-found]
    from bench_kafka_source import produce  # type: ignore[import-not-found]

    from spark_elastic.log.kafka_source import _Options, _read
    from spark_elastic.log.source import _LogPartition

    with kafka_jvm.running_kafka() as broker:
        kafka_jvm.create_topics(broker.bootstrap, {TOPIC: 1})
        produce(broker.bootstrap, records, 100, 10_000, TOPIC)
        options = _Options.parse(
            {
                "kafka.bootstrap.servers": broker.bootstrap,
                "subscribe": TOPIC,
                "kafka.isolation.level": "read_uncommitted",
            }
        )
        task = _LogPartition(TOPIC, 0, 0, records)
        for label in ("cold", "warm"):
            started = time.perf_counter()
            rows = sum(batch.num_rows for batch in _read(options, task))
            took = time.perf_counter() - started
            print(
                f"{label}: {rows:,} records in {took:.2f} s: {rows / took:,.0f} records/s, "
                f"{took / rows * 1e6:.2f} us a record",
                flush=True,
            )
        profile = cProfile.Profile()
        profile.enable()
        sum(batch.num_rows for batch in _read(options, task))
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 300_000)
