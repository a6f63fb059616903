"""Stateful virtual tasks on real streaming queries: checkpoints, failures, split and merge.

The processor keeps a running count and the last offset per key and emits
one row per record, so loss (a missing count), duplication (a repeated
count) and reordering (offsets not increasing with the count) are visible.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from chispa import assert_df_equality
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from stateful_job import PARTITIONS, TOPIC, Job, RunningCount, final_state

from spark_elastic import (
    LOG_SOURCE_FORMAT,
    read_checkpoint,
    read_keyed_state,
    rescale,
    starting_offsets,
    with_task_state,
)
from spark_elastic.errors import ArgumentError, CheckpointError
from spark_elastic.state.checkpoint_dir import SEED_SCHEMA, OwnerLock
from spark_elastic.state.rescale import (
    CHUNK_ROWS,
    _check_unchanged,
    _ChunkMover,
    _local_rows,
    _moved_whole,
    _no_chunks,
    _whole_keys,
    stopped_source,
)

# Slow (left out by `pytest -m "not slow"`): streaming queries, processes holding checkpoints.
pytestmark = pytest.mark.slow


def assert_applied_in_offset_order(output: DataFrame, seed: int) -> None:
    per_key: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for row in output.collect():
        per_key.setdefault((row.key, row.partition), []).append((row["count"], row.offset))
    for (key, _), applied in per_key.items():
        applied.sort()
        assert [c for c, _ in applied] == list(range(1, len(applied) + 1)), f"seed={seed} {key}"
        offsets = [o for _, o in applied]
        assert offsets == sorted(offsets), f"seed={seed} {key} applied out of offset order"


def assert_same_as(reference: Job, job: Job, checkpoint: Path) -> None:
    """The job's output and its last checkpoint's state equal the reference run's."""
    assert_df_equality(
        job.output(), reference.output(), ignore_row_order=True, ignore_nullable=True
    )
    assert_df_equality(
        final_state(job.spark, checkpoint),
        final_state(reference.spark, reference.root / "cp"),
        ignore_row_order=True,
        ignore_nullable=True,
    )


@pytest.fixture
def seed() -> int:
    value = random.randrange(2**32)
    print(f"seed={value}")
    return value


def reference_run(spark: SparkSession, tmp_path: Path, seed: int, sizes: list[int]) -> Job:
    """The same records through one query at factor 1, with no rescale."""
    reference = Job(spark, tmp_path / "reference", random.Random(seed))
    for size in sizes:
        reference.produce(size)
    reference.run(tmp_path / "reference" / "cp", 1, max_per_trigger=10_000)
    return reference


def test_rescale_1_2_4_2_1_with_failures_equals_a_single_run(
    spark: SparkSession, tmp_path: Path, seed: int
) -> None:
    sizes = [300, 200, 200, 200, 100]
    job = Job(spark, tmp_path / "job", random.Random(seed))
    checkpoints = [tmp_path / f"cp-{i}-f{f}" for i, f in enumerate((1, 2, 4, 2, 1))]
    factors = [1, 2, 4, 2, 1]
    for step, (checkpoint, factor, size) in enumerate(
        zip(checkpoints, factors, sizes, strict=True)
    ):
        if step:
            result = rescale(checkpoints[step - 1], checkpoint, factor, spark)
            assert result.task_count == PARTITIONS * factor
        job.produce(size)
        job.run(checkpoint, factor, fail=step in (0, 2))
    reference = reference_run(spark, tmp_path, seed, sizes)

    assert_same_as(reference, job, checkpoints[-1])
    assert_applied_in_offset_order(job.output(), seed)


@pytest.mark.long  # `make test-all`; `make test` runs the 1-2-4-2-1 rescale
def test_rescaled_query_restarts_after_its_first_commit(
    spark: SparkSession, tmp_path: Path, seed: int
) -> None:
    # The seed goes in as initialState only until a batch commits, so the restarts after
    # that run a different plan on the same checkpoint; they must neither reload nor lose it.
    job = Job(spark, tmp_path / "job", random.Random(seed), scramble=True)
    first, split = tmp_path / "cp", tmp_path / "cp-split"
    job.produce(200)
    job.run(first, 1)
    rescale(first, split, 2, spark)
    job.produce(200)
    job.run(split, 2)  # commits batches on the rescaled checkpoint
    job.produce(200)
    job.run(split, 2, fail=True)  # restarts, dies mid-batch, restarts again
    reference = reference_run(spark, tmp_path, seed, [200, 200, 200])

    assert_same_as(reference, job, split)
    assert_applied_in_offset_order(job.output(), seed)


def test_tasks_without_records_in_the_rescaled_first_batch_keep_their_seeded_state(
    spark: SparkSession, tmp_path: Path, seed: int
) -> None:
    # A seeded task's step writes its seed with what the step changed; a task that gets no
    # records in that batch has no step, and its seed is written as the partition closes.
    job = Job(spark, tmp_path / "job", random.Random(seed))
    first, split = tmp_path / "cp", tmp_path / "cp-split"
    job.produce(300)
    job.run(first, 1)
    before = {row.key: row["count"] for row in final_state(spark, first).collect()}
    assert len(before) == 25  # spread over all four tasks of the split
    rescale(first, split, 2, spark)
    job.produce(20, key=b"user-3")  # records for one task of four
    job.run(split, 2)

    after = {row.key: row["count"] for row in final_state(spark, split).collect()}
    assert after == before | {"user-3": before["user-3"] + 20}


@pytest.mark.long  # `make test-all`; `make test` runs the 1-2-4-2-1 rescale
def test_two_queries_owning_halves_merge_into_one(
    spark: SparkSession, tmp_path: Path, seed: int
) -> None:
    job = Job(spark, tmp_path / "job", random.Random(seed))
    evens = [f"Partition {p}_0_2" for p in range(PARTITIONS)]
    odds = [f"Partition {p}_1_2" for p in range(PARTITIONS)]
    first, second, merged = tmp_path / "cp-evens", tmp_path / "cp-odds", tmp_path / "cp-merged"
    job.produce(250)
    job.run(first, 2, tasks=evens)  # stopped at the first 250 records
    job.produce(150)
    job.run(second, 2, tasks=odds)  # stopped at 400
    result = rescale([first, second], merged, 1, spark)
    assert result.starting_offsets == json.loads(starting_offsets(merged))
    job.produce(100)
    job.run(merged, 1)
    reference = reference_run(spark, tmp_path, seed, [250, 150, 100])

    assert_same_as(reference, job, merged)


# An old task (routing key) at factor 2 -> its base task and bucket, and its chunks' depth.
OLD_BASES, OLD_BUCKETS, OLD_DEPTHS = {100: 0, 101: 0}, {100: 0, 101: 1}, {100: 3, 101: 3}
NEW_KEYS = [200, 201, 202, 203]  # the four tasks of the same base at factor 4


def test_a_split_moves_every_chunk_whole_where_the_new_tasks_keep_its_depth() -> None:
    assert _whole_keys(OLD_BASES, OLD_BUCKETS, OLD_DEPTHS, [3, 3, 3, 3], 4, 2) == {100, 101}
    # Task 1 (bucket 1 of 4) is deeper: key 101's chunks are re-chunked for it and task 3.
    assert _whole_keys(OLD_BASES, OLD_BUCKETS, OLD_DEPTHS, [3, 4, 3, 3], 4, 2) == {100}
    # At log2(8) a chunk still holds one new task's keys; below it, several: it is
    # decoded and split.
    assert _whole_keys(OLD_BASES, OLD_BUCKETS, OLD_DEPTHS, [3] * 8, 8, 2) == {100, 101}
    assert _whole_keys(OLD_BASES, OLD_BUCKETS, {100: 2, 101: 2}, [3] * 8, 8, 2) == set()
    # A task without a layout never stored a key: not taken as whole.
    assert _whole_keys(OLD_BASES, OLD_BUCKETS, {100: 3}, [3, 3, 3, 3], 4, 2) == {100}


def test_whole_chunks_move_in_spark_s_sql_as_the_python_mover_moves_them(
    spark: SparkSession,
) -> None:
    depths = [3, 3, 3, 3]
    chunks = pd.DataFrame(
        {
            "routing_key": [100, 100, 100, 101, 101, 101],
            "chunk": [0, 2, 6, 1, 3, 7],
            "entries": [5, 1, 2, 3, 4, 9],
            "data": [bytes([i]) * (i + 1) for i in range(6)],
        }
    )
    mover = _ChunkMover(OLD_BASES, OLD_DEPTHS, depths, 4, NEW_KEYS)
    expected = pd.concat(list(mover(iter([chunks]))), ignore_index=True)
    assert sorted(expected["routing_key"]) == [200, 201, 202, 202, 203, 203]  # chunk % 4
    moved = _moved_whole(spark.createDataFrame(chunks, CHUNK_ROWS), OLD_BASES, 4, NEW_KEYS)
    assert_df_equality(
        moved,
        spark.createDataFrame(expected, CHUNK_ROWS),
        ignore_row_order=True,
        ignore_nullable=True,
    )


def test_a_chunk_of_a_task_the_plan_does_not_have_fails_the_move_rather_than_losing_its_task(
    spark: SparkSession,
) -> None:
    stray = pd.DataFrame({"routing_key": [999], "chunk": [0], "entries": [1], "data": [b"x"]})
    moved = _moved_whole(spark.createDataFrame(stray, CHUNK_ROWS), OLD_BASES, 4, NEW_KEYS)
    with pytest.raises(Exception, match="routing key 999, which is no task"):
        moved.collect()


def python_scans(df: DataFrame) -> list[str]:
    """The scans of ``df``'s physical plan that Python workers would have to feed."""
    plan = df._jdf.queryExecution().executedPlan().toString()
    return [line for line in plan.splitlines() if "ExistingRDD" in line or "Python" in line]


def test_a_seeds_own_rows_are_the_rows_given_and_need_no_python_worker(
    spark: SparkSession,
) -> None:
    # A rescale whose chunks all move in SQL runs no Python: its layout, checkpoint and held
    # rows, and a seed with no chunk at all, are planned in the JVM (a Python RDD, which
    # `createDataFrame(list)` makes, would start Python workers to be read).
    rows = [
        (3, "layout", None, None, None, 9, 250_000, None, None, None, None, None, None),
        (3, "checkpoint", None, None, None, None, None, "events", 1, 3, 4, 2**40, None),
        (5, "held", None, None, b"\x00held\xff", None, None, None, None, None, None, None, "{}"),
    ]
    given = _local_rows(spark, rows, SEED_SCHEMA)
    assert python_scans(given) == []
    listed = spark.createDataFrame(rows, SEED_SCHEMA)
    assert python_scans(listed), "a list's DataFrame is a Python RDD (what this spec rules out)"
    assert_df_equality(given, listed, ignore_nullable=True)
    none = _no_chunks(spark)
    assert python_scans(none) == []
    assert none.collect() == []
    assert none.schema.simpleString() == spark.createDataFrame([], CHUNK_ROWS).schema.simpleString()


@pytest.mark.long  # `make test-all`; `make test` runs the 1-2-4-2-1 rescale
def test_a_share_of_the_tasks_rescales_alone_and_the_shares_add_up_to_a_single_run(
    spark: SparkSession, tmp_path: Path, seed: int
) -> None:
    # What a container does when a job is scaled: it takes some tasks of stopped owners,
    # at the same factor or a new one; other tasks' keys stay out of its checkpoint.
    job = Job(spark, tmp_path / "job", random.Random(seed))
    evens = [f"Partition {p}_0_2" for p in range(PARTITIONS)]
    odds = [f"Partition {p}_1_2" for p in range(PARTITIONS)]
    job.produce(250)
    job.run(tmp_path / "cp-all", 2)
    shares = [
        rescale(tmp_path / "cp-all", tmp_path / "cp-evens", 2, spark, tasks=evens),
        rescale(tmp_path / "cp-all", tmp_path / "cp-odds", 2, spark, tasks=odds),
    ]
    assert sum(r.keys for r in shares) == read_keyed_state(tmp_path / "cp-all", spark).count()
    assert all(r.starting_offsets == json.loads(starting_offsets(r.target)) for r in shares)
    assert {str(r.target.name): read_checkpoint(r.target, spark).job.tasks for r in shares} == {
        "cp-evens": tuple(evens),
        "cp-odds": tuple(odds),
    }

    job.produce(150)
    job.run(tmp_path / "cp-evens", 2, tasks=evens)
    job.run(tmp_path / "cp-odds", 2, tasks=odds)
    # A share whose sources do not own all its keys, or a task the job does not have.
    with pytest.raises(CheckpointError, match=r"not cover the target's tasks.*Partition 0_1_2"):
        rescale(tmp_path / "cp-evens", tmp_path / "bad", 2, spark, tasks=odds)
    with pytest.raises(ArgumentError, match=r"^tasks: expected names of the job's 4 virtual"):
        rescale(tmp_path / "cp-all", tmp_path / "bad", 2, spark, tasks=["Partition 0_0_8"])
    assert not (tmp_path / "bad").exists()
    # Split to factor 4 in two shares, each made from both sources.
    low = [f"Partition {p}_{b}_4" for p in range(PARTITIONS) for b in (0, 1)]
    high = [f"Partition {p}_{b}_4" for p in range(PARTITIONS) for b in (2, 3)]
    both = [tmp_path / "cp-evens", tmp_path / "cp-odds"]
    rescale(both, tmp_path / "cp-low", 4, spark, tasks=low)
    rescale(both, tmp_path / "cp-high", 4, spark, tasks=high)
    job.produce(100)
    job.run(tmp_path / "cp-low", 4, tasks=low)
    job.run(tmp_path / "cp-high", 4, tasks=high)
    reference = reference_run(spark, tmp_path, seed, [250, 150, 100])

    assert_df_equality(
        job.output(), reference.output(), ignore_row_order=True, ignore_nullable=True
    )
    assert_df_equality(
        final_state(spark, tmp_path / "cp-low").unionByName(
            final_state(spark, tmp_path / "cp-high")
        ),
        final_state(spark, reference.root / "cp"),
        ignore_row_order=True,
        ignore_nullable=True,
    )


@pytest.mark.long  # `make test-all`; `make test` runs the 1-2-4-2-1 rescale
def test_replay_from_lower_offsets_is_skipped_and_counted(
    spark: SparkSession, tmp_path: Path, seed: int
) -> None:
    job = Job(spark, tmp_path / "job", random.Random(seed))
    job.produce(120)
    first, split = tmp_path / "cp", tmp_path / "cp-split"
    job.run(first, 1)
    rescale(first, split, 2, spark)
    # Start the split query from the very beginning instead of its starting offsets.
    events = (
        spark.readStream.format(LOG_SOURCE_FORMAT)
        .option("path", str(job.log.path))
        .option("subscribe", TOPIC)
        .option("startingOffsets", "earliest")
        .load()
    )
    out = events.transform(
        with_task_state(
            RunningCount(),
            job="running-count",
            checkpoint_location=split,
            elasticity_factor=2,
            partitions={TOPIC: PARTITIONS},
        )
    )
    query = (
        out.writeStream.format("parquet")
        .option("path", str(tmp_path / "replayed"))
        .option("checkpointLocation", str(split))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    metrics = query.lastProgress["observedMetrics"]["spark_elastic"]
    assert metrics["records_skipped"] == 120, f"seed={seed}"
    assert metrics["records_processed"] == 0
    assert metrics["task_count"] == 4
    assert 1 <= metrics["active_tasks"] <= 4
    assert metrics["key_bucket_ns"] > 0  # every record was compared with the seeded checkpoints
    assert metrics["checkpoint_resolve_ns"] >= 0
    assert spark.read.parquet(str(tmp_path / "replayed")).count() == 0


def test_checkpoint_show_reports_bucket_offsets_and_lag(
    spark: SparkSession, tmp_path: Path, seed: int
) -> None:
    job = Job(spark, tmp_path / "job", random.Random(seed))
    job.produce(200)
    job.run(tmp_path / "cp", 2)
    report = read_checkpoint(tmp_path / "cp", spark)
    assert report.committed
    ends = job.log.end_offsets(TOPIC)
    assert report.offsets == {TOPIC: {str(p): o for p, o in ends.items()}}
    tasks = {b.virtual_task for b in report.buckets}
    assert tasks == {f"Partition {p}_{b}_2" for p in range(2) for b in range(2)}
    for bucket in report.buckets:
        assert 0 < bucket.next_offset <= ends[bucket.partition]
        assert bucket.behind == ends[bucket.partition] - bucket.next_offset
    # every partition's last record is some bucket's last record: lag 0 for one of them
    for partition in range(PARTITIONS):
        assert min(b.behind for b in report.buckets if b.partition == partition) == 0


@pytest.mark.long  # `make test-all`; `make test` runs the 1-2-4-2-1 rescale
def test_stateful_query_has_one_exchange(
    stopped_once: Path, spark: SparkSession, tmp_path: Path, seed: int
) -> None:
    job = Job(spark, tmp_path / "job", random.Random(seed))
    job.produce(50)
    query = job.start(tmp_path / "cp", 4, None, str(tmp_path / "no-marker"), tmp_path / "o", 100)
    query.awaitTermination()
    plan = query._jsq.streamingQuery().lastExecution().executedPlan().toString()
    assert plan.count("Exchange ") == 1, plan


# -- refusals ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stopped_once(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A job's log and the checkpoint of one run of it to the log's end, made once: the
    refusals below each take a copy (a run is a Spark query, about 10 s)."""
    seed = random.randrange(2**32)
    print(f"stopped job's seed={seed}")
    root = tmp_path_factory.mktemp("stopped")
    job = Job(spark, root / "job", random.Random(seed))
    job.produce(40)
    job.run(root / "cp", 1)
    return root


def stopped_job(
    stopped_once: Path, spark: SparkSession, tmp_path: Path, seed: int
) -> tuple[Job, Path]:
    """A copy of :func:`stopped_once`'s job in ``tmp_path``: its log and stopped checkpoint."""
    for name in ("job", "cp"):
        shutil.copytree(stopped_once / name, tmp_path / name)
    return Job(spark, tmp_path / "job", random.Random(seed)), tmp_path / "cp"


def test_rescale_refuses_bad_factor_and_nonempty_target_writing_nothing(
    stopped_once: Path, spark: SparkSession, tmp_path: Path, seed: int
) -> None:
    _, checkpoint = stopped_job(stopped_once, spark, tmp_path, seed)
    before = sorted(p.relative_to(checkpoint) for p in checkpoint.rglob("*"))
    with pytest.raises(ArgumentError, match="elasticity_factor"):
        rescale(checkpoint, tmp_path / "new", 3, spark)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "file").touch()
    with pytest.raises(ArgumentError, match="not empty"):
        rescale(checkpoint, tmp_path / "busy", 2, spark)
    assert not (tmp_path / "new").exists()
    assert sorted(p.relative_to(checkpoint) for p in checkpoint.rglob("*")) == before


def test_rescale_leaves_its_sources_untouched(
    stopped_once: Path, spark: SparkSession, tmp_path: Path, seed: int
) -> None:
    _, checkpoint = stopped_job(stopped_once, spark, tmp_path, seed)

    def files() -> dict[Path, tuple[int, int]]:
        return {
            p.relative_to(checkpoint): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in checkpoint.rglob("*")
            if p.is_file()
        }

    before = files()
    rescale(checkpoint, tmp_path / "new", 2, spark)
    assert files() == before


def test_rescale_refuses_overlapping_sources(
    stopped_once: Path, spark: SparkSession, tmp_path: Path, seed: int
) -> None:
    _, checkpoint = stopped_job(stopped_once, spark, tmp_path, seed)
    copy = tmp_path / "copy"
    shutil.copytree(checkpoint, copy)
    with pytest.raises(CheckpointError, match="sources overlap"):
        rescale([checkpoint, copy], tmp_path / "new", 2, spark)
    assert not (tmp_path / "new").exists()


def test_rescale_refuses_sources_that_do_not_cover_the_job(
    spark: SparkSession, tmp_path: Path, seed: int
) -> None:
    # Only the even halves ran here: the odd ones would start again from offset 0.
    job = Job(spark, tmp_path / "job", random.Random(seed))
    job.produce(40)
    evens = tmp_path / "cp-evens"
    job.run(evens, 2, tasks=[f"Partition {p}_0_2" for p in range(PARTITIONS)])
    with pytest.raises(CheckpointError, match=r"do not cover the whole job.*Partition 0"):
        rescale(evens, tmp_path / "new", 1, spark)
    assert not (tmp_path / "new").exists()


def test_rescale_refuses_a_target_inside_a_source(
    stopped_once: Path, spark: SparkSession, tmp_path: Path, seed: int
) -> None:
    _, checkpoint = stopped_job(stopped_once, spark, tmp_path, seed)
    with pytest.raises(ArgumentError, match="neither inside one"):
        rescale(checkpoint, checkpoint / "rescaled", 2, spark)
    assert not (checkpoint / "rescaled").exists()


def test_rescale_refuses_a_source_that_ran_a_batch_after_its_checks(
    stopped_once: Path, spark: SparkSession, tmp_path: Path, seed: int
) -> None:
    # What rescale re-checks once it holds the sources' locks: the offset log it planned from.
    _, checkpoint = stopped_job(stopped_once, spark, tmp_path, seed)
    source = stopped_source(checkpoint, spark)
    last = source.batch.batch_id
    shutil.copy(checkpoint / "offsets" / str(last), checkpoint / "offsets" / str(last + 1))
    with pytest.raises(CheckpointError, match="ran another micro-batch while being rescaled"):
        _check_unchanged(source)


def test_rescale_refuses_uncommitted_last_batch(
    stopped_once: Path, spark: SparkSession, tmp_path: Path, seed: int
) -> None:
    job, checkpoint = stopped_job(stopped_once, spark, tmp_path, seed)
    job.produce(40)
    (job.root / "fail-once").touch()
    query = job.start(checkpoint, 1, None, str(job.root / "fail-once"), tmp_path / "o2", 100)
    with pytest.raises(StreamingQueryException):
        query.awaitTermination()
    with pytest.raises(CheckpointError, match="did not commit"):
        rescale(checkpoint, tmp_path / "new", 2, spark)


def test_rescale_refuses_a_running_query(
    stopped_once: Path, spark: SparkSession, tmp_path: Path, seed: int
) -> None:
    job, checkpoint = stopped_job(stopped_once, spark, tmp_path, seed)
    query = job.start(checkpoint, 1, None, "", tmp_path / "o2", 100, available_now=False)
    try:
        query.processAllAvailable()
        with pytest.raises(CheckpointError, match="running query"):
            rescale(checkpoint, tmp_path / "new", 2, spark)
    finally:
        query.stop()
    rescale(checkpoint, tmp_path / "new", 2, spark)  # stopped: now allowed


def test_a_lock_this_process_is_releasing_is_not_taken_for_another_process_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A rescale right after a query's stop probes the lock while Spark's listener frees it:
    # the probe waits for the release, it does not find the lock "in another process".
    import fcntl
    import threading

    checkpoint = tmp_path / "cp"
    checkpoint.mkdir()
    OwnerLock.acquire(checkpoint)
    unlocking, go = threading.Event(), threading.Event()
    real = fcntl.flock

    def slow_unlock(fd: int, operation: int) -> None:
        if operation == fcntl.LOCK_UN:
            unlocking.set()
            go.wait(30)
        real(fd, operation)

    monkeypatch.setattr(fcntl, "flock", slow_unlock)
    releasing = threading.Thread(target=OwnerLock.release, args=(checkpoint,))
    releasing.start()
    assert unlocking.wait(30)
    outcome: list[object] = []

    def probe() -> None:
        try:
            with OwnerLock.probe(checkpoint):
                outcome.append("probed")
        except CheckpointError as exc:
            outcome.append(exc)

    prober = threading.Thread(target=probe)
    prober.start()
    prober.join(2)  # it must still be waiting for the release (or have failed, before)
    go.set()
    releasing.join(30)
    prober.join(30)
    assert outcome == ["probed"]
    assert not OwnerLock.held_here(checkpoint)


LOCK_HOLDER = (
    "import sys; from spark_elastic.state.checkpoint_dir import OwnerLock; "
    "OwnerLock.acquire(sys.argv[1]); print('locked', flush=True); sys.stdin.read()"
)


def test_rescale_refuses_a_query_running_in_another_process(
    stopped_once: Path, spark: SparkSession, tmp_path: Path, seed: int
) -> None:
    _, checkpoint = stopped_job(stopped_once, spark, tmp_path, seed)
    # This process frees the lock when Spark's listener bus reports the run terminated,
    # a moment after the query stopped; only then can another process take it.
    deadline = time.monotonic() + 60
    while OwnerLock.held_here(checkpoint):
        assert time.monotonic() < deadline, "the stopped query's lock was never released"
        time.sleep(0.05)
    holder = subprocess.Popen(
        [sys.executable, "-c", LOCK_HOLDER, str(checkpoint)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(CheckpointError, match="another process"):
            rescale(checkpoint, tmp_path / "new", 2, spark)
    finally:
        holder.communicate("", timeout=30)
    assert not (tmp_path / "new").exists()


def test_rescale_refuses_checkpoints_of_different_jobs(
    stopped_once: Path, spark: SparkSession, tmp_path: Path, seed: int
) -> None:
    _, checkpoint = stopped_job(stopped_once, spark, tmp_path, seed)
    other = tmp_path / "other"
    shutil.copytree(checkpoint, other)
    job_file = other / "_spark_elastic" / "job.json"
    document = json.loads(job_file.read_text())
    document["name"] = "another-job"
    job_file.write_text(json.dumps(document))
    with pytest.raises(CheckpointError, match="different jobs"):
        rescale([checkpoint, other], tmp_path / "new", 2, spark)


def test_query_refuses_checkpoint_of_another_factor(
    stopped_once: Path, spark: SparkSession, tmp_path: Path, seed: int
) -> None:
    job, checkpoint = stopped_job(stopped_once, spark, tmp_path, seed)
    with pytest.raises(CheckpointError, match="rescale"):
        job.start(checkpoint, 2, None, "", tmp_path / "o2", 100)


def test_checkpoint_show_reads_a_running_query(
    stopped_once: Path, spark: SparkSession, tmp_path: Path, seed: int
) -> None:
    job, checkpoint = stopped_job(stopped_once, spark, tmp_path, seed)
    query = job.start(checkpoint, 1, None, "", tmp_path / "o2", 100, available_now=False)
    try:
        query.processAllAvailable()
        assert query.isActive
        report = read_checkpoint(checkpoint, spark)
    finally:
        query.stop()
    ends = job.log.end_offsets(TOPIC)
    assert report.committed
    assert report.offsets == {TOPIC: {str(p): o for p, o in ends.items()}}
    assert {b.virtual_task for b in report.buckets} == {f"Partition {p}" for p in range(2)}
