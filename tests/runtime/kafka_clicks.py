"""The end-to-end specs' clicks on a Kafka broker: produced as the embedded log's, read back.

Keys and values are those of :func:`jobs.produce` (``user-N``, ``click-N``),
partitioned by librdkafka's ``murmur2_random``, which is Java's producer's
partitioner; :func:`records_on` reads what the broker holds for the single
key-ordered pass the stories compare with.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jobs import USERS, wait_until

if TYPE_CHECKING:
    from confluent_kafka import Producer

TIMEOUT = 30.0


def producer(bootstrap: str) -> Producer:
    """A producer that partitions keys as Kafka's Java producer does."""
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random"})


def produce(bootstrap: str | Producer, topic: str, start: int, count: int) -> None:
    """Clicks ``start .. start+count-1`` to ``topic``, through ``bootstrap``'s broker (or
    a producer of :func:`producer`), flushed before it returns."""
    sender = producer(bootstrap) if isinstance(bootstrap, str) else bootstrap
    for i in range(start, start + count):
        sender.produce(topic, key=f"user-{(i * 7919) % USERS}".encode(), value=f"click-{i}")
    assert sender.flush(TIMEOUT) == 0


def records_on(bootstrap: str, topic: str, count: int) -> list[tuple[bytes, int, int]]:
    """``(key, partition, offset)`` of the topic's ``count`` records, read back from the broker."""
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    partitions = admin.list_topics(topic, timeout=TIMEOUT).topics[topic].partitions
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "spec-reads", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    found: dict[tuple[int, int], bytes] = {}

    def read() -> bool:
        for message in consumer.consume(num_messages=count, timeout=0.5):
            if message.error() is None:
                found[message.partition(), message.offset()] = message.key()
        return len(found) >= count

    try:
        wait_until(f"{count} records read back from the broker", read)
    finally:
        consumer.close()
    return [(key, partition, offset) for (partition, offset), key in found.items()]
