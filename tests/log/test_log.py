"""Specification of the embedded log's storage and producer (no Spark)."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from spark_elastic.errors import ArgumentError, ArgumentTypeError, LogError
from spark_elastic.log.embedded import EmbeddedLog
from spark_elastic.log.producer import SendResult
from spark_elastic.log.storage import HEADER_SIZE, encode_frames, index_path, log_path
from udfs import kafka_partitions


@pytest.fixture
def log(tmp_path: Path) -> EmbeddedLog:
    return EmbeddedLog(tmp_path / "log")


def all_records(log: EmbeddedLog, topic: str) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for partition in range(log.partition_count(topic)):
        rows.extend(log.read(topic, partition).to_pylist())
    return rows


def run_child(script: str, *args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # type: ignore[call-overload, no-any-return]
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        **kwargs,
    )


# -- topics -------------------------------------------------------------------------------------


def test_a_new_topic_has_empty_partitions_and_is_listed(log: EmbeddedLog) -> None:
    described = log.create_topic("clicks", 3)
    log.create_topic("alpha", 1)

    assert described.topic == "clicks"
    assert described.end_offsets == (0, 0, 0)
    assert log.topics() == ["alpha", "clicks"]
    assert log.partition_count("clicks") == 3
    assert log.end_offsets("clicks") == {0: 0, 1: 0, 2: 0}
    assert log.describe("clicks").to_json() == {
        "topic": "clicks",
        "partitions": 3,
        "end_offsets": {"0": 0, "1": 0, "2": 0},
        "records": 0,
    }


def test_topic_refusals(log: EmbeddedLog, tmp_path: Path) -> None:
    log.create_topic("t", 2)
    with pytest.raises(LogError, match="already exists"):
        log.create_topic("t", 2)
    with pytest.raises(LogError, match=r"no topic 'nope' .*topics: t\)"):
        log.describe("nope")
    with pytest.raises(ArgumentError, match="Kafka topic name"):
        log.create_topic("a/b", 1)
    with pytest.raises(ArgumentError, match="Kafka topic name"):
        log.create_topic("..", 1)
    with pytest.raises(ArgumentError, match="partition count from 1"):
        log.create_topic("zero", 0)
    with pytest.raises(ArgumentTypeError, match="int partition count"):
        log.create_topic("text", "3")  # type: ignore[arg-type]
    with pytest.raises(LogError, match="no embedded log"):
        EmbeddedLog(tmp_path / "missing", create=False)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("x")
    with pytest.raises(LogError, match="not empty and is not an embedded log"):
        EmbeddedLog(tmp_path / "other")


def test_concurrent_creates_of_one_topic_make_it_once(log: EmbeddedLog) -> None:
    outcomes: list[str] = []

    def create() -> None:
        try:
            log.create_topic("race", 4)
            outcomes.append("created")
        except LogError:
            outcomes.append("refused")

    threads = [threading.Thread(target=create) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(outcomes) == ["created"] + ["refused"] * 5
    assert log.topics() == ["race"]
    assert sorted(p.name for p in log.path.iterdir()) == ["elastic-log.json", "race"]


def test_grow_adds_empty_partitions_and_never_shrinks(log: EmbeddedLog) -> None:
    log.create_topic("t", 2)
    with log.producer("t") as producer:
        producer.send_many([None] * 4, [b"v"] * 4)
        grown = log.grow("t", 5)
        assert grown.end_offsets == (2, 2, 0, 0, 0)
        assert log.grow("t", 5) == grown  # the same count again is a no-op
        with pytest.raises(LogError, match="cannot shrink to 3"):
            log.grow("t", 3)
        # The producer picks the new count up on its next send.
        keys = [f"k{i}".encode() for i in range(50)]
        sent = producer.send_many(keys, [b"v"] * 50)
    np.testing.assert_array_equal(sent.partitions, kafka_partitions(keys, 5))
    assert log.partition_count("t") == 5
    with pytest.raises(LogError, match="no topic"):
        log.grow("other", 3)


# -- producing and reading ----------------------------------------------------------------------


def test_offsets_are_dense_per_partition_and_records_read_back_exactly(log: EmbeddedLog) -> None:
    log.create_topic("t", 3)
    with log.producer("t") as producer:
        first = producer.send(b"k", b"v1", timestamp=1_000)
        second = producer.send("k", "v2", timestamp=2_000)
        other = (first.partition + 1) % 3
        empty = producer.send(b"", b"", timestamp=3_000, partition=other)
        nulls = producer.send(None, None, timestamp=4_000, partition=other)

    assert first == SendResult(first.partition, 0)
    assert second == SendResult(first.partition, 1)  # same key, same partition
    assert (empty, nulls) == ((other, 0), (other, 1))
    rows = log.read("t", other).to_pylist()
    assert [(r["key"], r["value"], r["offset"]) for r in rows] == [(b"", b"", 0), (None, None, 1)]
    assert rows[1]["timestamp"].timestamp() == 4.0
    assert {r["topic"] for r in rows} == {"t"}
    assert {r["partition"] for r in rows} == {other}
    assert {r["timestampType"] for r in rows} == {0}
    keyed = log.read("t", first.partition, 1, 2).to_pylist()
    assert [(r["key"], r["value"], r["offset"]) for r in keyed] == [(b"k", b"v2", 1)]


def test_read_returns_the_kafka_source_arrow_schema(log: EmbeddedLog) -> None:
    log.create_topic("t", 1)
    batch = log.read("t", 0)
    assert batch.num_rows == 0
    assert batch.schema == pa.schema(
        [
            ("key", pa.binary()),
            ("value", pa.binary()),
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("timestamp", pa.timestamp("us", tz="UTC")),
            ("timestampType", pa.int32()),
        ]
    )


def test_keys_are_partitioned_like_kafka_and_null_keys_round_robin(log: EmbeddedLog) -> None:
    log.create_topic("t", 7)
    keys: list[bytes | str | None] = [f"user-{i}" for i in range(300)]
    keys[::10] = [None] * 30
    with log.producer("t") as producer:
        sent = producer.send_many(keys, [str(i) for i in range(300)])

    keyed = [k is not None for k in keys]
    expected = kafka_partitions([k for k in keys if k is not None], 7)
    np.testing.assert_array_equal(sent.partitions[keyed], expected)
    np.testing.assert_array_equal(sent.partitions[::10], np.arange(30) % 7)
    # Each record is where the acknowledgement says, and offsets are dense per partition.
    for partition in range(7):
        mine = np.flatnonzero(sent.partitions == partition)
        np.testing.assert_array_equal(sent.offsets[mine], np.arange(len(mine)))
        values = log.read("t", partition).column("value").to_pylist()
        assert values == [str(i).encode() for i in mine]


def test_large_ranges_read_in_bounded_batches(log: EmbeddedLog) -> None:
    log.create_topic("t", 1)
    with log.producer("t") as producer:
        producer.send_many([b"k"] * 1000, [bytes([i % 256]) * 1000 for i in range(1000)])
        producer.send(b"big", b"x" * 150_000, partition=0)

    batches = list(log.read_batches("t", 0, 10, 1001, max_bytes=100_000))
    assert [b.num_rows for b in batches] == [96] * 10 + [30, 1]
    offsets = pa.Table.from_batches(batches).column("offset").to_pylist()
    assert offsets == list(range(10, 1001))
    assert log.read("t", 0, 999, 1001).column("value").to_pylist()[1] == b"x" * 150_000


def test_records_survive_reopening_and_appends_continue(tmp_path: Path) -> None:
    first = EmbeddedLog(tmp_path / "log")
    first.create_topic("t", 2)
    with first.producer("t") as producer:
        producer.send_many([None] * 6, [f"a{i}" for i in range(6)])

    again = EmbeddedLog(tmp_path / "log", create=False)
    with again.producer("t") as producer:
        assert producer.send(None, "b", partition=1) == (1, 3)
    assert again.end_offsets("t") == {0: 3, 1: 4}
    assert [r["value"] for r in all_records(again, "t")] == [
        b"a0",
        b"a2",
        b"a4",
        b"a1",
        b"a3",
        b"a5",
        b"b",
    ]


def test_producer_and_read_refusals(log: EmbeddedLog) -> None:
    log.create_topic("t", 2)
    producer = log.producer("t")
    with pytest.raises(ArgumentError, match="partition of 't', 0 to 1"):
        producer.send(b"k", b"v", partition=2)
    with pytest.raises(ArgumentTypeError, match="bytes, str or None"):
        producer.send(3, b"v")  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="epoch milliseconds"):
        producer.send(b"k", b"v", timestamp=-5)
    with pytest.raises(ArgumentError, match="as many values as keys"):
        producer.send_many([b"a", b"b"], [b"v"])
    with pytest.raises(ArgumentError, match="as many timestamps as keys"):
        producer.send_many([b"a"], [b"v"], timestamps=[1, 2])
    producer.close()
    with pytest.raises(LogError, match="closed"):
        producer.send(b"k", b"v")
    with pytest.raises(LogError, match="no partition 2"):
        log.read("t", 2)
    with pytest.raises(LogError, match=r"offsets \[0, 1\) are outside .* holds \[0, 0\)"):
        log.read("t", 0, 0, 1)
    with pytest.raises(LogError, match="no topic"):
        log.producer("missing")
    assert log.end_offsets("t") == {0: 0, 1: 0}


# -- crashes and damage -------------------------------------------------------------------------


def test_a_torn_tail_is_invisible_and_cut_off_by_the_next_append(log: EmbeddedLog) -> None:
    log.create_topic("t", 1)
    with log.producer("t") as producer:
        producer.send_many([b"k"] * 3, [b"one", b"two", b"three"])
    topic_dir = log.topic_dir("t")
    committed = log_path(topic_dir, 0).stat().st_size
    # A crashed writer: one whole frame that was never committed, half of the next
    # frame, and 3 bytes of its index entry.
    frames, _ = encode_frames(3, [b"k", b"k"], [b"lost", b"torn"], [0, 0])
    with open(log_path(topic_dir, 0), "ab") as out:
        out.write(frames[: len(frames) - 5])
    with open(index_path(topic_dir, 0), "ab") as out:
        out.write(b"\x01\x02\x03")

    assert log.end_offsets("t") == {0: 3}
    assert log.read("t", 0).column("value").to_pylist() == [b"one", b"two", b"three"]

    with log.producer("t") as producer:
        assert producer.send(b"k", b"four", partition=0) == (0, 3)
    assert log.read("t", 0).column("value").to_pylist() == [b"one", b"two", b"three", b"four"]
    assert index_path(topic_dir, 0).stat().st_size == 4 * 8
    assert log_path(topic_dir, 0).stat().st_size == committed + HEADER_SIZE + len(b"kfour")


def test_a_writer_killed_mid_frame_loses_only_unacknowledged_records(tmp_path: Path) -> None:
    log = EmbeddedLog(tmp_path / "log")
    log.create_topic("t", 1)
    limit = 100_000
    # RLIMIT_FSIZE makes the kernel cut the child's write at `limit` bytes and
    # kill it with SIGXFSZ on the next: a real crash in the middle of a frame.
    child = run_child(
        """
import signal, sys
from spark_elastic.log.embedded import EmbeddedLog
signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python ignores it by default
producer = EmbeddedLog(sys.argv[1], create=False).producer("t")
for i in range(10_000):
    producer.send(b"key", b"%06d" % i + b"." * 994, partition=0)
    print(i, flush=True)
""",
        str(tmp_path / "log"),
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)),
    )
    assert child.returncode == -signal.SIGXFSZ, child.stderr
    acknowledged = len(child.stdout.split())
    assert acknowledged > 50
    assert log_path(log.topic_dir("t"), 0).stat().st_size == limit  # the torn frame is there

    assert log.end_offsets("t") == {0: acknowledged}
    values = log.read("t", 0).column("value").to_pylist()
    assert [v[:6] for v in values] == [b"%06d" % i for i in range(acknowledged)]
    with log.producer("t") as producer:
        assert producer.send(b"key", b"after", partition=0) == (0, acknowledged)
    assert log.read("t", 0, acknowledged).column("value").to_pylist() == [b"after"]


def test_a_writer_killed_at_any_moment_keeps_every_acknowledged_record(tmp_path: Path) -> None:
    log = EmbeddedLog(tmp_path / "log", fsync=False)
    log.create_topic("t", 3)
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            """
import sys
from spark_elastic.log.embedded import EmbeddedLog
producer = EmbeddedLog(sys.argv[1], create=False, fsync=False).producer("t")
for batch in range(1_000_000):
    keys = [b"%d" % (batch * 500 + i) for i in range(500)]
    producer.send_many(keys, keys)
    print(batch, flush=True)
""",
            str(tmp_path / "log"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    acknowledged = [int(child.stdout.readline()) for _ in range(20)]
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    acknowledged += [int(line) for line in child.stdout.read().split()]

    records = all_records(log, "t")
    values = Counter(r["value"] for r in records)
    assert max(values.values()) == 1
    for batch in acknowledged:
        assert all(values[b"%d" % (batch * 500 + i)] == 1 for i in range(500))
    with log.producer("t") as producer:
        producer.send_many([b"x", b"y", b"z"], [b"1", b"2", b"3"])
    for partition, end in log.end_offsets("t").items():
        offsets = log.read("t", partition).column("offset").to_pylist()
        assert offsets == list(range(end))


def test_a_damaged_committed_frame_is_refused_not_returned(log: EmbeddedLog) -> None:
    log.create_topic("t", 1)
    with log.producer("t") as producer:
        producer.send_many([b"k"] * 3, [b"aaaa", b"bbbb", b"cccc"])
    path = log_path(log.topic_dir("t"), 0)
    data = bytearray(path.read_bytes())
    data[-2] ^= 0xFF
    path.write_bytes(bytes(data))

    assert log.read("t", 0, 0, 2).column("value").to_pylist() == [b"aaaa", b"bbbb"]
    with pytest.raises(LogError, match="CRC mismatch in the record at offset 2"):
        log.read("t", 0)
    path.write_bytes(bytes(data[:-10]))  # the index now commits bytes the log lacks
    with pytest.raises(LogError, match=r"expected \d+ bytes"):
        log.read("t", 0)
    with log.producer("t") as producer, pytest.raises(LogError, match="is damaged"):
        producer.send(b"k", b"v")


# -- concurrency --------------------------------------------------------------------------------


def check_exactly_once(log: EmbeddedLog, acks: dict[bytes, tuple[int, int]]) -> None:
    """Every acknowledged value is in the log once, at the acknowledged place."""
    records = all_records(log, "t")
    assert len(records) == len(acks)
    for record in records:
        assert acks[record["value"]] == (record["partition"], record["offset"])  # type: ignore[index]


def test_threads_sharing_and_not_sharing_producers_lose_and_duplicate_nothing(
    log: EmbeddedLog,
) -> None:
    log.create_topic("t", 3)
    shared = log.producer("t")
    acks: dict[bytes, tuple[int, int]] = {}
    lock = threading.Lock()

    def produce(name: str, own: bool) -> None:
        producer = log.producer("t") if own else shared
        for i in range(0, 200, 5):
            values = [f"{name}-{j}".encode() for j in range(i, i + 5)]
            sent = producer.send_many([v[-1:] for v in values], values)
            with lock:
                for value, p, o in zip(values, sent.partitions, sent.offsets, strict=True):
                    acks[value] = (int(p), int(o))
            one = f"{name}-single-{i}".encode()
            result = producer.send(None, one)
            with lock:
                acks[one] = tuple(result)  # type: ignore[assignment]
        if own:
            producer.close()

    threads = [threading.Thread(target=produce, args=(f"t{n}", n % 2 == 0)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    shared.close()

    assert len(acks) == 6 * 240
    check_exactly_once(log, acks)


def test_processes_appending_at_once_lose_and_duplicate_nothing_while_read(tmp_path: Path) -> None:
    log = EmbeddedLog(tmp_path / "log")
    log.create_topic("t", 2)
    script = """
import json, sys
from spark_elastic.log.embedded import EmbeddedLog
name = sys.argv[2]
acks = {}
with EmbeddedLog(sys.argv[1], create=False).producer("t") as producer:
    for i in range(0, 300, 3):
        values = [f"{name}-{j}" for j in range(i, i + 3)]
        sent = producer.send_many([name] * 2 + [None], values)
        acks.update(zip(values, zip(sent.partitions.tolist(), sent.offsets.tolist())))
        acks[f"{name}-one-{i}"] = list(producer.send(str(i), f"{name}-one-{i}"))
print(json.dumps(acks))
"""
    children = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(tmp_path / "log"), f"p{n}"],
            stdout=subprocess.PIPE,
            text=True,
        )
        for n in range(4)
    ]
    # Meanwhile a reader, taking no lock, sees only whole records, densely numbered.
    reads = 0
    while any(child.poll() is None for child in children) or reads == 0:
        for partition, end in log.end_offsets("t").items():
            batch = log.read("t", partition, 0, end)
            assert batch.column("offset").to_pylist() == list(range(end))
            assert all(v.startswith(b"p") for v in batch.column("value").to_pylist())
        reads += 1
    acks: dict[bytes, tuple[int, int]] = {}
    for child in children:
        out, _ = child.communicate(timeout=120)
        assert child.returncode == 0
        acks.update({k.encode(): (p, o) for k, (p, o) in json.loads(out).items()})

    assert len(acks) == 4 * 400
    check_exactly_once(log, acks)


def test_the_log_directory_holds_only_documented_files(log: EmbeddedLog) -> None:
    log.create_topic("t", 2)
    log.grow("t", 3)
    assert sorted(os.listdir(log.topic_dir("t"))) == [
        "0.idx",
        "0.log",
        "1.idx",
        "1.log",
        "2.idx",
        "2.log",
        "topic.json",
    ]
    assert json.loads((log.topic_dir("t") / "topic.json").read_text()) == {
        "topic": "t",
        "partitions": 3,
    }


def test_source_partition_counts_are_those_of_subscribed_topics_only(
    log: EmbeddedLog, tmp_path: Path
) -> None:
    from spark_elastic.log.embedded import source_partition_counts

    log.create_topic("a", 4)
    log.create_topic("b", 2)
    path = str(log.path)
    assert source_partition_counts({"path": path, "subscribe": "a, b"}) == {"a": 4, "b": 2}
    # assign reads chosen partitions on purpose; a pattern's topics are known only later
    assert source_partition_counts({"path": path, "assign": '{"a": [0]}'}) is None
    assert source_partition_counts({"path": path, "subscribePattern": "a.*"}) is None
    assert source_partition_counts({"path": path, "subscribe": "missing"}) is None
    assert source_partition_counts({"path": str(tmp_path / "none"), "subscribe": "a"}) is None
