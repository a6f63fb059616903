"""The example two-stream job's processor and records for the specs of time order (#26).

``examples/jobs/enriched_clicks.py`` enriches each click with its user's
latest profile update; ``test_time_order.py`` and ``test_hold_back.py`` run
its processor under ``with_task_state``, and ``tests/runtime/test_exactly_once.py``
in a job's containers, and compare with single passes in time order
(:func:`reference`) over the records :func:`produce` wrote.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from spark_elastic import EmbeddedLog, TaskProcessor
from spark_elastic.runtime.job import load_job_and_module

ENRICHED = "user string, click_offset long, partition int, profile string"
"""The processor's output schema."""
PARTITIONS = 2
"""Of each topic, ``clicks`` and ``profiles``."""
START = 1_700_000_000_000
Record = tuple[str, int, int, int, str, str]  # topic, partition, offset, time, user, value
EXAMPLE = Path(__file__).parents[2] / "examples" / "jobs" / "enriched_clicks.py"


def example_processor() -> TaskProcessor:
    """``examples/jobs/enriched_clicks.py``'s processor, pickled by value as containers do."""
    from pyspark import cloudpickle

    job, module = load_job_and_module(str(EXAMPLE) + ":job")
    cloudpickle.register_pickle_by_value(module)
    assert job.processor is not None
    return job.processor


def produce(
    log: EmbeddedLog, rng: random.Random, count: int, first: int, only: str | None = None
) -> list[Record]:
    """``count`` clicks and profile updates of 8 users, 10 ms apart from ``first``; profile
    updates come in runs, so a batch often holds one topic's records only. ``only``: that
    topic's records alone (the other stream runs dry)."""
    records = []
    with log.producer("clicks") as clicks, log.producer("profiles") as profiles:
        topic = only or "clicks"
        for i in range(first, first + count):
            if only is None and rng.random() < 0.25:
                topic = "profiles" if topic == "clicks" else "clicks"
            user, time = f"u{rng.randrange(8)}", START + 10 * i
            value = f"p{i}" if topic == "profiles" else "click"
            sent = (profiles if topic == "profiles" else clicks).send(user, value, time)
            records.append((topic, sent.partition, sent.offset, time, user, value))
    return records


def end_every_partition(log: EmbeddedLog) -> None:
    """One record at a later time than any other on every partition of both topics."""
    for topic in ("clicks", "profiles"):
        with log.producer(topic) as producer:
            for partition in range(PARTITIONS):
                producer.send("~end", "end", START + 10**9, partition=partition)


def reference(records: list[Record]) -> list[Any]:
    """One pass in time order (a user's records are all in one task, so its order is theirs)."""
    profile: dict[str, str] = {}
    rows = []
    for topic, partition, offset, _, user, value in sorted(records, key=lambda r: r[3]):
        if topic == "profiles":
            profile[user] = value
        else:
            rows.append((user, offset, partition, profile.get(user, "-")))
    return rows


def new_log(path: Path) -> EmbeddedLog:
    log = EmbeddedLog(path)
    for topic in ("clicks", "profiles"):
        log.create_topic(topic, PARTITIONS)
    return log


def seeded() -> random.Random:
    """A random generator of a fresh seed, printed (pytest shows it with a failure)."""
    seed = random.randrange(2**32)
    print(f"seed={seed}")
    return random.Random(seed)


def end_every_task(log: EmbeddedLog, factor: int) -> None:
    """One record later than any other for every key bucket (at ``factor``, and so at its
    divisors) of every partition of both topics: a task at those factors holds nothing real
    back once it has read them (its keys are ``~end...``)."""
    every_task(log, factor, "~end", START + 10**9, ("clicks", "profiles"))


def every_task(
    log: EmbeddedLog, factor: int, prefix: str, time: int, topics: tuple[str, ...]
) -> None:
    """One record at ``time`` for every key bucket (at ``factor``, and so at its divisors) of
    every partition of ``topics``, keyed ``<prefix><n>`` (no user's key)."""
    from spark_elastic.dataplane.buckets import bucket_of_key

    keys: dict[int, str] = {}
    for i in range(10 * factor):
        keys.setdefault(bucket_of_key(f"{prefix}{i}".encode(), factor), f"{prefix}{i}")
    assert len(keys) == factor, keys
    for topic in topics:
        with log.producer(topic) as producer:
            for partition in range(PARTITIONS):
                for key in keys.values():
                    producer.send(key, "end", time, partition=partition)
