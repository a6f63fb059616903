"""A warm-up follows its old owner's committed state while the owner's query runs (KIP-441)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from key_counts import Count, counts, produce
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from spark_elastic import EmbeddedLog, Job, LogInput, ParquetSink, rescale
from spark_elastic.dataplane.buckets import bucket_of_key
from spark_elastic.model.groupers import Grouper
from spark_elastic.runtime.container import ContainerSettings
from spark_elastic.runtime.container.follow import (
    follow,
    holder_batches,
    holders_idle,
    own_scratch,
    read_all_it_could,
    scratch_for,
    snapshot_dir,
    source_fences,
    take_snapshot,
)
from spark_elastic.runtime.container.generations import last_committed_batch
from spark_elastic.runtime.container.query import _offsets_of
from spark_elastic.runtime.container.scratch import sweep
from spark_elastic.runtime.container.warmups import _rehearse, _Replayer
from spark_elastic.runtime.growth import grown_plan
from spark_elastic.runtime.lease import ContainerLease, LeaseTerms
from spark_elastic.runtime.protocol import ContainerModel, JobModel
from spark_elastic.state.checkpoint_dir import (
    JobSpec,
    StreamInput,
    seed_dir,
    write_fences,
    write_job,
)

pytestmark = pytest.mark.slow

ALL = ("Partition 0_0_2", "Partition 0_1_2", "Partition 1_0_2", "Partition 1_1_2")
# A split's share: the children at factor 4 of two of the owner's four tasks.
WANTED = ("Partition 0_1_4", "Partition 0_3_4", "Partition 1_0_4", "Partition 1_2_4")


def start_owner(spark: SparkSession, log: EmbeddedLog, checkpoint: Path) -> StreamingQuery:
    """The old owner: a running query over every task, at factor 2."""
    return (
        counts(spark, log, checkpoint)
        .writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="100 milliseconds")
        .start()
    )


@pytest.fixture
def log(tmp_path: Path) -> EmbeddedLog:
    log = EmbeddedLog(tmp_path / "log")
    log.create_topic("clicks", 2)
    return log


@pytest.fixture
def owner(spark: SparkSession, log: EmbeddedLog, tmp_path: Path) -> Iterator[StreamingQuery]:
    produce(log, 0, 100)
    query = start_owner(spark, log, tmp_path / "gen-1")
    query.processAllAvailable()
    yield query
    query.stop()


def seed_rows(checkpoint: Path) -> set[tuple[object, ...]]:
    table = pq.read_table(seed_dir(checkpoint))
    return {tuple(row.values()) for row in table.to_pylist()}


def model_with_warmup(owner_checkpoint: Path, warm_checkpoint: Path) -> JobModel:
    return JobModel(
        2,
        "forks",
        2,
        {"clicks": 2},
        (ContainerModel("c1", ALL, 1, str(owner_checkpoint)),),
        warmups=(ContainerModel("w2", WANTED, 2, str(warm_checkpoint)),),
    )


def click_job(log: EmbeddedLog, root: Path) -> Job:
    """The owner's query as a container runs it (the rehearsal builds it from the job)."""
    return Job(
        "forks",
        LogInput(str(log.path), ("clicks",), max_records_per_batch=40),
        2,
        str(root / "checkpoints"),
        ParquetSink(str(root / "out")),
        processor=Count(),
    )


def test_a_warm_up_follows_a_running_owner_and_takes_the_snapshot_when_nothing_committed_since(
    spark: SparkSession,
    log: EmbeddedLog,
    tmp_path: Path,
    owner: StreamingQuery,
    capfd: pytest.CaptureFixture[str],
) -> None:
    old, new = tmp_path / "gen-1", tmp_path / "gen-2"
    model = model_with_warmup(old, new)
    warm = model.warmups[0]
    assert holder_batches(model, warm.tasks) == {str(old): last_committed_batch(old)}

    first = follow(spark, model, warm, 4)
    assert first is not None
    assert owner.isActive  # the snapshot was made while the owner's query ran
    assert first.sources == {str(old): last_committed_batch(old)}
    assert follow(spark, model, warm, 4) is None  # the owner committed nothing since

    produce(log, 100, 60)
    owner.processAllAvailable()
    newer = follow(spark, model, warm, 4)
    assert newer is not None
    assert newer.sources[str(old)] > first.sources[str(old)]

    # The warm-up rehearses the new owner's first micro-batch on a throwaway copy.
    files = sorted(p.relative_to(newer.path) for p in newer.path.rglob("*"))
    _rehearse(
        spark,
        click_job(log, tmp_path),
        grown_plan("partition", 4, *[{"clicks": 2}] * 2),
        warm,
        newer.path,
    )
    assert "rehearsed a first micro-batch" in capfd.readouterr().err
    assert sorted(p.relative_to(newer.path) for p in newer.path.rglob("*")) == files
    assert not (tmp_path / "out").exists()  # the job's sink saw nothing
    assert not list(tmp_path.glob(".rehearsal.*"))

    # The handover: the owner stops at a batch boundary without committing again.
    owner.stop()
    direct = rescale(old, tmp_path / "direct", 4, spark, tasks=WANTED)
    taken = take_snapshot(new, [str(old)])
    assert taken is not None
    assert taken.keys == direct.keys > 0
    assert seed_rows(new) == seed_rows(tmp_path / "direct")
    assert not snapshot_dir(new).exists()


def test_a_snapshot_the_owner_committed_past_is_dropped_at_the_handover(
    spark: SparkSession, log: EmbeddedLog, tmp_path: Path, owner: StreamingQuery
) -> None:
    old, new = tmp_path / "gen-1", tmp_path / "gen-2"
    model = model_with_warmup(old, new)
    assert follow(spark, model, model.warmups[0], 4) is not None
    produce(log, 100, 10)
    owner.processAllAvailable()  # one more commit after the snapshot, then the stop
    owner.stop()
    assert take_snapshot(new, [str(old)]) is None
    assert not new.exists()
    assert not snapshot_dir(new).exists()


def test_a_warm_up_has_nothing_to_follow_before_its_owners_first_commit(
    spark: SparkSession, tmp_path: Path
) -> None:
    model = model_with_warmup(tmp_path / "never-ran", tmp_path / "gen-2")
    assert holder_batches(model, WANTED) is None
    assert follow(spark, model, model.warmups[0], 4) is None
    assert not snapshot_dir(tmp_path / "gen-2").exists()


def owner_to_parquet(
    spark: SparkSession, log: EmbeddedLog, checkpoint: Path, out: Path
) -> StreamingQuery:
    """The old owner, publishing exactly once per committed batch (Spark's file sink)."""
    return (
        counts(spark, log, checkpoint)
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="100 milliseconds")
        .start()
    )


def read_offsets(query: StreamingQuery) -> dict[str, dict[int, int]]:
    """Where a query's last batch ended (its committed offsets)."""
    return _offsets_of(json.loads(query.lastProgress.json))


def wanted_keys(spark: SparkSession, log: EmbeddedLog) -> dict[str, int]:
    """Each key of WANTED's tasks, with how many records it has in the log."""
    taken = {(int(t.split()[1].split("_")[0]), int(t.split("_")[1])) for t in WANTED}
    rows = (
        spark.read.format("elastic-log")
        .option("path", str(log.path))
        .option("subscribe", "clicks")
        .load()
        .groupBy("key", "partition")
        .count()
        .collect()
    )
    return {
        bytes(r["key"]).decode(): int(r["count"])
        for r in rows
        if (int(r["partition"]), bucket_of_key(bytes(r["key"]), 4)) in taken
    }


def test_a_replaying_warm_up_applies_what_its_owner_published_quietly_then_publishes_the_rest(
    spark: SparkSession, log: EmbeddedLog, tmp_path: Path
) -> None:
    old, new = tmp_path / "gen-1", tmp_path / "gen-2"
    produce(log, 0, 100)
    owner = owner_to_parquet(spark, log, old, tmp_path / "owner-out")
    replayer: _Replayer | None = None
    try:
        owner.processAllAvailable()
        model = model_with_warmup(old, new)
        stopping = replace(model, version=3, stopping=("c1",))
        # The lease is not the subject here: one that outlasts the spec on a loaded machine.
        lease = ContainerLease(LeaseTerms(lease_s=3600.0, margin_s=1.0, write_budget_s=1.0))
        lease.renew(time.monotonic(), 3_600_000)
        settings = ContainerSettings("w2", "http://127.0.0.1:1", "unused")
        replayer = _Replayer(
            spark, click_job(log, tmp_path), settings, lease, model.warmups[0], model
        )
        assert replayer.start(model)
        assert replayer.query is not None
        gate = Path(replayer.gate)

        # While the owner runs: the warm-up reads no further than the owner committed,
        # and everything it applies is quiet.
        produce(log, 100, 30)  # one batch (at most 40 records each)
        owner.processAllAvailable()
        replayer(model, "w2")
        replayer.query.processAllAvailable()
        assert replayer.lag() == 0
        # ... and it follows the owner: it has read what the owner committed.
        assert read_offsets(replayer.query) == read_offsets(owner)
        assert sum(read_offsets(owner)["clicks"].values()) == 130
        assert not (tmp_path / "out").exists()  # the job's sink got nothing
        assert not replayer.caught_up(model, "w2")  # the owner is not stopping

        # Its query ends before it owns the tasks (on a loaded machine, most often at start:
        # a Python worker too slow for Spark's 10 s to connect back). It starts it again on
        # its checkpoint, up to RESTARTS times, and goes on replaying; nothing is published
        # twice (the output is compared at the end).
        for _ in range(_Replayer.RESTARTS):
            ended = replayer.query
            ended.stop()
            replayer(model, "w2")
            assert replayer.query is not ended
            assert replayer.query.isActive
            assert replayer.failure() is None

        # The owner is listed as stopping and commits more: the warm-up follows it, but
        # does not hold its gate before its query has run WARM_BATCHES batches that read
        # records (the first after a snapshot are slow ones, not for a new owner).
        assert replayer.read_batches() < _Replayer.WARM_BATCHES
        start = 130
        while replayer.read_batches() < _Replayer.WARM_BATCHES:
            produce(log, start, 20)
            start += 20
            owner.processAllAvailable()
            replayer(stopping, "w2")
            one_batch = gate.read_text()
            assert not replayer.caught_up(stopping, "w2")
            replayer.query.processAllAvailable()
        # Within one commit of the owner from then on, its gate stays: what the owner
        # commits later is for its first batch as owner.
        produce(log, start, 10)
        owner.processAllAvailable()
        replayer(stopping, "w2")
        held = gate.read_text()
        assert held != one_batch  # it followed once more
        assert not replayer.caught_up(stopping, "w2")  # it has yet to apply that commit
        produce(log, start + 10, 5)
        owner.processAllAvailable()
        replayer(stopping, "w2")
        assert gate.read_text() == held
        # It has caught up once its query applied what is below the gate, and stays so.
        replayer.query.processAllAvailable()
        assert replayer.caught_up(stopping, "w2")
        assert replayer.caught_up(stopping, "w2")
        # Unless the phase is called off (a failover unlisted the owner): it follows again.
        replayer(model, "w2")
        assert gate.read_text() != held
        assert not replayer.caught_up(model, "w2")
        replayer.query.processAllAvailable()

        # The handover: more records than the owner may have got to before it stopped.
        produce(log, start + 15, 30)
        owner.stop()
        mine = replace(model.warmups[0], sources=(str(old),))
        replayer.take_over(mine, model)
        produce(log, start + 45, 50)
        replayer.query.processAllAvailable()
        # Its restarts used up, a query that ends is the warm-up's failure.
        replayer.query.stop()
        replayer(model, "w2")
        assert not replayer.query.isActive
        assert replayer.failure() == "the replaying query ended: stopped"
    finally:
        owner.stop()
        if replayer is not None and replayer.query is not None:
            replayer.query.stop()

    published = [
        (r["key"], r["n"]) for r in spark.read.parquet(str(tmp_path / "owner-out")).collect()
    ] + [(r["key"], r["n"]) for r in ParquetSink(str(tmp_path / "out")).read(spark).collect()]
    wanted = wanted_keys(spark, log)
    assert wanted
    # Each of the warm-up's keys: every running count exactly once, old owner then new.
    for key, records in wanted.items():
        assert sorted(n for k, n in published if k == key) == list(range(1, records + 1)), key
    assert {r["key"] for r in ParquetSink(str(tmp_path / "out")).read(spark).collect()} <= set(
        wanted
    )


def commits_at(checkpoint: Path, *times: float) -> None:
    """Commit files 0, 1, ... of ``checkpoint`` written at ``times``."""
    (checkpoint / "commits").mkdir(parents=True)
    for batch, at in enumerate(times):
        (checkpoint / "commits" / str(batch)).write_text("v1\n{}")
        os.utime(checkpoint / "commits" / str(batch), (at, at))


@pytest.mark.parametrize(
    ("commits", "idle"),
    [
        ((-12.0, -10.0), True),  # 10 s since the last, commits 2 s apart: no records flow
        ((-3.0, -1.0), False),  # committed a second ago
        ((-40.0, -20.0), False),  # 20 s ago, but its commits came 20 s apart
        ((-50.0, -45.0), True),  # 45 s ago, its commits 5 s apart
        ((-5.0,), True),  # one commit, 5 s ago
    ],
)
def test_holders_are_idle_when_their_last_commit_is_long_ago_for_their_pace(
    tmp_path: Path, commits: tuple[float, ...], idle: bool
) -> None:
    old = tmp_path / "gen-1"
    now = time.time()
    commits_at(old, *(now + t for t in commits))
    model = model_with_warmup(old, tmp_path / "gen-2")
    assert holders_idle(model, WANTED, now, floor_s=3.0) is idle


# The gate rose at t=10 (to 100 and 80), t=13 (130, 95) and t=16 (160, 120): its owners
# commit every 3 s, while the warm-up's batches take longer.
GATES = [
    (10.0, {"clicks": {"0": 100, "1": 80}}),
    (13.0, {"clicks": {"0": 130, "1": 95}}),
    (16.0, {"clicks": {"0": 160, "1": 120}}),
]


@pytest.mark.parametrize(
    ("started", "committed", "kept_pace"),
    [
        (13.5, {0: 130, 1: 95}, True),  # read all the gate held at its start (two commits ago)
        (13.5, {0: 130, 1: 90}, False),  # a row limit left records below that gate: a backlog
        (13.0, {0: 130, 1: 95}, True),  # the gate written as it started counts
        (12.0, {0: 100, 1: 80}, True),  # started before the second rise: the first gate
        (9.0, {0: 100, 1: 80}, False),  # no gate known when it started
        (17.0, {0: 130, 1: 95}, False),  # behind the gate in force at its start
    ],
)
def test_a_warm_up_keeps_pace_when_its_batch_read_all_its_gate_held_as_it_started(
    started: float, committed: dict[int, int], kept_pace: bool
) -> None:
    assert read_all_it_could(GATES, started, {"clicks": committed}) is kept_pace


def committed_at(checkpoint: Path, factor: int, offsets: dict[int, int]) -> None:
    """A checkpoint of the click job at ``factor`` whose batch 0 committed ``offsets``."""
    write_job(
        checkpoint,
        JobSpec(
            "forks",
            (StreamInput("kafka", "clicks", 2),),
            Grouper.PARTITION,
            factor,
            "spark",
            "kafka",
            "n long",
        ),
    )
    (checkpoint / "offsets").mkdir()
    (checkpoint / "offsets" / "0").write_text(
        'v1\n{"conf": {}}\n' + json.dumps({"clicks": {str(p): o for p, o in offsets.items()}})
    )
    (checkpoint / "commits").mkdir()
    (checkpoint / "commits" / "0").write_text("v1\n{}")


def test_an_owner_s_own_fences_count_only_until_it_has_read_past_them(tmp_path: Path) -> None:
    # A new owner at factor 4 that replayed its keys once: its fences (factor 2) say
    # where its old owner had published up to. It has read past them in partition 0 only.
    owner = tmp_path / "gen-2"
    committed_at(owner, 4, {0: 50, 1: 20})
    write_fences(owner, [(("clicks", 0, 1, 2), 40), (("clicks", 1, 1, 2), 30)])
    fences = source_fences(
        [str(owner)], lambda f: grown_plan("partition", f, {"clicks": 2}, {"clicks": 2})
    )
    assert (("clicks", 0, 1, 2), 40) not in fences  # passed: it would pin a gate at 40
    assert (("clicks", 1, 1, 2), 30) in fences  # not yet passed: its keys published to 30
    # Its own commits fence every bucket of its tasks.
    assert {key for key, offset in fences if key[3] == 4} == {
        ("clicks", p, b, 4) for p in (0, 1) for b in range(4)
    }
    assert all(offset == (50 if key[1] == 0 else 20) for key, offset in fences if key[3] == 4)


def test_a_container_starting_deletes_the_host_scratch_of_containers_gone_from_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A warm-up of a checkpoint on HDFS or S3 keeps its gate and snapshots on its host.

    A container killed there cannot delete them; the next one to start on the
    host does, once their process is gone, and leaves those of live ones.
    """
    import subprocess
    import sys
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    dead = own_scratch("s3a://jobs/clicks/generations/000003-clicks-c3")
    (dead / "000003-clicks-c3.gate.json").write_text("null")
    (dead / "owner.pid").write_text(gone.stdout.strip())  # as if that process had made it
    live = own_scratch("hdfs://nn:8020/clicks/generations/000004-clicks-c4")
    unmarked = scratch_for("s3a://jobs/clicks/generations/000005-clicks-c5")
    unmarked.mkdir(parents=True)

    assert sweep() == [dead]
    assert not dead.exists()
    assert live.exists(), "this process is alive"
    assert unmarked.exists(), "no mark: not known to be anyone's"
    assert sweep() == []
    assert scratch_for(tmp_path / "generations" / "000006-c6") == tmp_path / "generations", (
        "a local checkpoint's scratch is its parent, never swept"
    )
