"""Create the ``clicks`` topic on a Kafka broker and produce keyed clicks for the example job.

    python examples/kafka_clicks.py --bootstrap 127.0.0.1:9092 --partitions 4 --records 20000

Records are keyed ``user-N`` and partitioned by murmur2 as Kafka's Java
producer does (librdkafka's ``murmur2_random``), so the job's virtual tasks
split each partition's keys the way the embedded log's producer would. The
topic is created when it is missing and left as it is when it exists. Then
run the click-count job on it (README, "Running on Kafka")::

    CLICKS_KAFKA=127.0.0.1:9092 CLICKS_ROOT=/tmp/clicks-on-kafka \\
        spark-elastic job run examples/jobs/click_counts.py:job \\
        --containers 2 --conf spark.jars=$(ls .cache/jars/spark-kafka/*.jar | paste -sd,)
"""

from __future__ import annotations

import argparse
import sys

USERS = 97


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092", help="host:port of a broker")
    parser.add_argument("--topic", default="clicks")
    parser.add_argument("--partitions", type=int, default=4, help="if the topic is created")
    parser.add_argument("--records", type=int, default=20000)
    parser.add_argument("--start", type=int, default=0, help="the first click's number")
    args = parser.parse_args(argv)
    if args.partitions < 1 or args.records < 0 or args.start < 0:
        parser.error(
            "--partitions: expected at least 1, --records and --start: at least 0; found "
            f"{args.partitions}, {args.records}, {args.start}"
        )

    from confluent_kafka import KafkaException, Producer
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    try:
        topics = admin.list_topics(timeout=10).topics
        if args.topic not in topics:
            for future in admin.create_topics([NewTopic(args.topic, args.partitions, 1)]).values():
                future.result(timeout=30)
            print(f"created {args.topic!r} with {args.partitions} partitions")
        producer = Producer({"bootstrap.servers": args.bootstrap, "partitioner": "murmur2_random"})
        for i in range(args.start, args.start + args.records):
            while True:
                try:
                    key = f"user-{(i * 7919) % USERS}"
                    producer.produce(args.topic, key=key, value=f"click-{i}")
                    break
                except BufferError:
                    producer.poll(0.1)
        unsent = producer.flush(60)
    except KafkaException as exc:
        print(f"kafka_clicks: {args.bootstrap}: {exc.args[0]}", file=sys.stderr)
        return 1
    if unsent:
        print(f"kafka_clicks: {unsent} clicks not sent to {args.bootstrap}", file=sys.stderr)
        return 1
    print(f"produced {args.records} clicks to {args.topic!r} on {args.bootstrap}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
